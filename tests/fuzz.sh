#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan + UBSan), makes their seed corpora
# with the real binary (fuzz/make_seeds.sh) and runs every target for a share of SECONDS_TOTAL.
# Exits non-zero when any target finds a crash, naming the reproducer. CI runs `tests/fuzz.sh 60`
# after tests/run.sh; docs/testing.md ("Fuzzing") says how to run longer and keep what is found.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: tests/fuzz.sh [SECONDS_TOTAL] [TARGET...]

Configures and builds the `fuzz` preset (build/fuzz), makes seeds with an mptrain binary, then
runs each fuzz target (all nine, or those named) for SECONDS_TOTAL / targets seconds (default
total 60), each input limited to 10 s and the process to 2048 MB. Installs nothing: clang and
libclang-rt-14-dev come from launch/install-deps.sh.

Environment:
  MPTRAIN=PATH                 the mptrain binary that makes the seeds (default: build/release/
                               mptrain, built with the release preset when missing)
  MPTRAIN_FUZZ_ARTIFACTS=DIR   where crash reproducers go (default build/fuzz/artifacts)
  MPTRAIN_FUZZ_CORPUS=DIR      keep the grown corpora here (default: a temporary directory)
  MPTRAIN_FUZZ_ARGS="..."      extra libFuzzer flags for every target, e.g. "-jobs=2 -workers=2"
  MPTRAIN_FUZZ_BUILD=DIR       the build directory of the fuzz preset (default build/fuzz)
EOF
}

targets_all=(fuzz_data_file fuzz_inspect fuzz_checkpoint fuzz_export fuzz_config fuzz_model_spec
             fuzz_idx fuzz_npy fuzz_csv)
total=60
targets=()
for arg in "$@"; do
  case "$arg" in
    -h | --help) usage; exit 0 ;;
    '' | *[!0-9]*)
      if [[ " ${targets_all[*]} " == *" $arg "* ]]; then
        targets+=("$arg")
      else
        echo "tests/fuzz.sh: unknown target or bad SECONDS_TOTAL '$arg'" >&2
        usage >&2
        exit 2
      fi
      ;;
    *) total=$arg ;;
  esac
done
((${#targets[@]})) || targets=("${targets_all[@]}")

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
start=$SECONDS
current=setup
trap 'status=$?; ((status == 0)) || echo "tests/fuzz.sh: FAILED in $current (exit $status, $((SECONDS - start)) s)"' EXIT

for tool in clang clang++; do
  command -v "$tool" >/dev/null ||
    { echo "tests/fuzz.sh: $tool not found (hint: launch/install-deps.sh installs clang and libclang-rt-14-dev)" >&2; exit 2; }
done

current=build
build_dir=${MPTRAIN_FUZZ_BUILD:-build/fuzz}
cmake --preset fuzz -B "$build_dir" >/dev/null
cmake --build "$build_dir" -j"$cores" --target mpt_fuzz_all
echo "tests/fuzz.sh: build done in $((SECONDS - start)) s"

current=seeds
mptrain=${MPTRAIN:-build/release/mptrain}
if [[ ! -x "$mptrain" ]]; then
  echo "tests/fuzz.sh: no $mptrain: building it with the release preset"
  cmake --preset release >/dev/null
  cmake --build --preset release -j"$cores" --target mptrain
  mptrain=build/release/mptrain
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/mptrain-fuzz.XXXXXX")
trap 'status=$?; rm -rf "$work"; ((status == 0)) || echo "tests/fuzz.sh: FAILED in $current (exit $status, $((SECONDS - start)) s)"' EXIT
fuzz/make_seeds.sh "$mptrain" "$work/seeds"

current=fuzzing
artifacts=${MPTRAIN_FUZZ_ARTIFACTS:-$build_dir/artifacts}
corpus_root=${MPTRAIN_FUZZ_CORPUS:-$work/corpus}
mkdir -p "$artifacts" "$corpus_root"
share=$((total / ${#targets[@]}))
((share >= 1)) || share=1
# Leak checks stay on, less one leak inside libhdf5 (fuzz/lsan.supp). The suppression names a
# libhdf5 function, so allocation stacks are unwound in full (libhdf5 has no frame pointers).
# The fuzzer aborts on any UBSan report (-fno-sanitize-recover).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_odr_violation=0:fast_unwind_on_malloc=0}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$repo_root/fuzz/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
export TMPDIR=$work  # the targets' scratch directories
failed=()
# True when the first frame of the fatal report (the last "ERROR:" in the log: a leak or warning
# report of an earlier input may come before it) outside the sanitizer and libc runtimes lies
# in libhdf5. Such a crash still fails the run: hdf5_probe_file() meets HDF5's crashes on damaged
# metadata in a child process, so one that reaches the target happened past the probe, where it
# would crash a training job too.
# (The frame is taken into a variable: under pipefail, `head -n 1 | grep -q` in a pipeline lets
# the writers upstream die of SIGPIPE, which made the verdict depend on timing.)
inside_libhdf5() {
  local frame
  frame=$(awk '/ERROR: / { report = "" } { report = report $0 "\n" } END { printf "%s", report }' "$1" |
    grep -E '^ +#[0-9]+ ' |
    grep -vE '__interceptor_|__sanitizer|__asan|__ubsan|fuzzer::|libc\.so|(^| )(malloc|calloc|realloc|free) ' |
    head -n 1) || true
  [[ "$frame" == *libhdf5* ]]
}
printf '%-16s %8s %10s %8s %7s  %s\n' target seconds execs exec/s corpus result
for target in "${targets[@]}"; do
  corpus="$corpus_root/$target"
  mkdir -p "$corpus"
  # The regressions are not mutated here (CTest replays them): several are damaged files of the
  # old HDF5 format, whose mutations reach known libhdf5 crashes within seconds.
  seed_dirs=("$work/seeds/$target")
  [[ -d fuzz/seeds-static/$target ]] && seed_dirs+=("fuzz/seeds-static/$target")
  log="$work/$target.log"
  status=0
  # shellcheck disable=SC2086  # MPTRAIN_FUZZ_ARGS is a list of flags
  "$build_dir/fuzz/$target" -max_total_time="$share" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$target-" ${MPTRAIN_FUZZ_ARGS:-} \
    "$corpus" "${seed_dirs[@]}" >"$log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  files=$(find "$corpus" -type f | wc -l)
  if ((status == 0)); then
    printf '%-16s %8s %10s %8s %7s  %s\n' "$target" "$share" "${execs:-?}" "${rate:-?}" "$files" ok
  else
    reproducer=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
    kind="CRASH (exit $status)"
    inside_libhdf5 "$log" && kind="CRASH inside libhdf5, past the probe (exit $status)"
    failed+=("$target")
    printf '%-16s %8s %10s %8s %7s  %s\n' "$target" "$share" "${execs:-?}" "${rate:-?}" "$files" "$kind"
    echo "---- $target: the end of its log ($log) ----"
    tail -n 60 "$log"
    echo "---- reproducer: ${reproducer:-none written}; replay it with $build_dir/fuzz/$target FILE ----"
  fi
done
current=report
if ((${#failed[@]})); then
  echo "tests/fuzz.sh: ${#failed[@]} target(s) crashed: ${failed[*]} (reproducers in $artifacts)"
  exit 1
fi
echo "tests/fuzz.sh: PASSED (${#targets[@]} targets, ${share} s each, $((SECONDS - start)) s total)"
