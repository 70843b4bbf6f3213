#!/usr/bin/env bash
# One-shot GPU check for a bare GPU machine (issue #8): configure, build, run tests/gpu and
# perf/gpu/gpu_bench (the mlp, then the cnn with cuDNN and with im2col convolutions, then both
# with each step replayed as one CUDA graph), run the
# same models in PyTorch AMP (perf/pytorch_gpu.py) and a PyTorch GEMM peer, run the trainer
# where there is one, and last, if time is left, gpu_kernels under compute-sanitizer's memcheck
# and racecheck; print a table of mptrain/PyTorch ratios and the verdicts
# (also to $OUT/gpu_check.txt when $OUT is set). Needs: the CUDA toolkit (nvcc), CMake >= 3.25,
# a C++20 compiler, python3 with torch.
# Builds the GPU-only subset unless MPI, HDF5, Boost and Kokkos are all present; the trainer
# stages then run the prebuilt trainer of perf/gpu_bundle.sh where its archive was carried
# along (.gpu-bundle/mptrain-bundle.tar.xz, or --bundle). Aims to finish well inside 8 minutes
# on one H200 (62 s on 2026-11-29, when it did far less; not yet timed since). The device tool
# kills a command at its limit with no chance to clean up, so the check never relies on reaching
# its end: every command's timeout is capped by --deadline, the optional last stages are skipped
# after --budget seconds, a failed configure or build skips only what needs it, and each stage
# first rewrites the summary table and the log archive in $OUT with what is known so far.
set -uo pipefail

usage() {
  cat <<'USAGE'
Usage: perf/gpu_check.sh [--steps N] [--batch B] [--build-dir DIR] [--jobs J] [--bundle FILE]
                         [--budget S] [--deadline S] [--summary-only]
  --steps N      timed training steps per precision (default 200)
  --batch B      samples per step (default 256)
  --build-dir D  build folder (default build/gpu-check)
  --jobs J       build jobs (default: all cores)
  --bundle F     perf/gpu_bundle.sh's archive, used where this machine cannot build the
                 trainer (default .gpu-bundle/mptrain-bundle.tar.xz, if present)
  --budget S     seconds after which the last, optional stages (the GPU-bound batch, its
                 ncu profile, compute-sanitizer) are skipped, so that the summary is written
                 (default 420)
  --deadline S   seconds the whole check must end within: every command's timeout is cut to
                 what is left of it, less 15 s for the summary, and a command with under 5 s
                 left is skipped; keep it below the device tool's timeout (default 500)
  --summary-only only rewrite the summary table from the logs in --build-dir (for example an
                 unpacked gpu_check_logs.tar.gz) and print it; builds and runs nothing
USAGE
}

steps=200
batch=256
build=build/gpu-check
jobs=$(nproc 2>/dev/null || echo 4)
bundle_archive=.gpu-bundle/mptrain-bundle.tar.xz
bundle_given=0
summary_only=0
budget=420
deadline=500
# A user error: one line naming the option, exit 2, before anything is built or run.
usage_error() { echo "gpu_check.sh: $* (see --help)" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps|--batch|--build-dir|--jobs|--bundle|--budget|--deadline)
      [[ $# -ge 2 && -n $2 ]] || usage_error "$1 needs a value"
      case "$1" in
        --steps) steps=$2 ;;
        --batch) batch=$2 ;;
        --build-dir) build=$2 ;;
        --jobs) jobs=$2 ;;
        --bundle) bundle_archive=$(realpath -m -- "$2"); bundle_given=1 ;;
        --budget) budget=$2 ;;
        --deadline) deadline=$2 ;;
      esac
      shift 2 ;;
    --summary-only) summary_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage_error "unknown option $1" ;;
  esac
done
for option in steps batch jobs; do
  [[ ${!option} =~ ^[1-9][0-9]*$ ]] || usage_error "--$option takes a positive whole number, not '${!option}'"
done
[[ $budget =~ ^[0-9]+$ ]] || usage_error "--budget takes whole seconds, not '$budget'"
[[ $deadline =~ ^[1-9][0-9]*$ ]] || usage_error "--deadline takes whole seconds, not '$deadline'"
# The default archive is optional; one named with --bundle must be there.
[[ $bundle_given == 0 || -f $bundle_archive ]] ||
  usage_error "--bundle $bundle_archive: no such file; hint: make it with perf/gpu_bundle.sh"

cd "$(dirname "$0")/.." || exit 1
start=$(date +%s)
if ((summary_only)); then
  [[ -d $build ]] || usage_error "--summary-only: no build folder '$build'; hint: name the folder" \
    "that holds the check's logs with --build-dir"
else
  mkdir -p "$build" || exit 1
  # What the summary reads, so that it can be written from the first stage on.
  for log in deadline configure build ctest prefetcher gpu_bench gpu_bench_graphs pytorch trainer \
    nccl gpu_bench_big pytorch_big sanitizer; do
    : > "$build/$log.log"
  done
  : > "$build/ncu.txt"
  rm -f "$build"/sanitizer-*.log
fi
gpu_name=
arch=
tests_line=
ctest_rc=0
trainer_source=none
trainer_looked=0
bundle=
current_stage=start
completed=0
# Seconds left before --deadline, less the 15 s that the summary and the logs' archive need.
seconds_left() { echo $(( deadline - 15 - ($(date +%s) - start) )); }
# tmo SECONDS COMMAND...: timeout(1) with SECONDS cut to what is left before the deadline; with
# under 5 s left the command is not started: exit 125, one line on stderr and in deadline.log
# (a file, since tmo often runs inside a pipeline's subshell), which the summary counts.
tmo() {
  local want=$1 left
  shift
  left=$(seconds_left)
  if (( left < 5 )); then
    echo "gpu_check.sh: --deadline $deadline reached, not started: ${*:1:6}" | tee -a "$build/deadline.log" >&2
    return 125
  fi
  timeout $(( want < left ? want : left )) "$@"
}
# Every stage first saves the logs so far and the summary so far to $OUT (the device tool's
# return folder, at most 8 files), so that a run killed at the tool's limit still brings them
# back. Each is written beside its final name and renamed, so a kill mid-write leaves the last.
save_logs() {
  [[ -n ${OUT:-} && -d $build ]] || return 0
  (cd "$build" && find . -maxdepth 2 \( -name '*.log' -o -name 'CMakeConfigureLog.yaml' \) -print0 \
    | tar --null -czf "$OUT/.gpu_check_logs.tar.gz" -T - && mv -f "$OUT/.gpu_check_logs.tar.gz" \
      "$OUT/gpu_check_logs.tar.gz") 2>/dev/null || true
}
stage() {
  current_stage=$*
  save_logs
  write_summary
  echo
  echo "== [$(( $(date +%s) - start ))s] $*"
}
# On any exit (a normal end, or an early exit below): the last logs and the summary, printed.
# shellcheck disable=SC2317  # invoked by the EXIT trap
finish_check() {
  save_logs
  write_summary
  cat "$build/gpu_check.txt"
}
trap finish_check EXIT
# over_budget WHAT: true (and says so) once --budget seconds have passed.
over_budget() {
  local elapsed=$(( $(date +%s) - start ))
  (( elapsed > budget )) || return 1
  echo "gpu_check.sh: ${elapsed} s gone, over the --budget of ${budget} s: skipping $1"
}
# The first Python that has torch (python3 on PATH, else the system one).
python=python3
for candidate in python3 /usr/bin/python3 python; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
    python=$candidate
    break
  fi
done
export PATH=$PATH:/usr/local/cuda/bin

# run_line LABEL SUMMARY_JSON FIELD...: one line "LABEL NAME=VALUE ..." from a training run's
# summary.json. A FIELD is a key, or NAME=KEY to print the key under a shorter name; floats
# get 4 decimals (samples_per_s 1), and a missing or null value prints -1.
run_line() {
  "$python" - "$@" <<'PY'
import json, sys
label, path, fields = sys.argv[1], sys.argv[2], sys.argv[3:]
summary = json.load(open(path))
out = [label]
for field in fields:
    name, _, key = field.partition("=")
    value = summary.get(key or name)
    if value is None:
        value = -1
    if isinstance(value, float):
        value = f"{value:.1f}" if name == "samples_per_s" else f"{value:.4f}"
    out.append(f"{name}={value}")
print(" ".join(out))
PY
}

# The summary table (written by every stage and at the end, from the logs so far).
# The GPU-bound batch of the last stages, and the mlp that casts its input to 16 bits first.
big_batch=8192
# What ncu collects per kernel (perf/gpu/ncu_summary.py reads all three).
ncu_metrics=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
ncu_metrics+=,sm__throughput.avg.pct_of_peak_sustained_elapsed
mlp16_spec=flatten,dense:1024,relu,dense:1024,relu,dense:10
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p"; }
# ratio A B: A / B to two decimals, or n/a when either is missing or not positive.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a" }'; }
# sanitizer_verdict TOOL LOG: one line from a compute-sanitizer run over gpu_kernels: the errors
# of every process it followed (their "ERROR SUMMARY" lines), the harness's counts and the exit
# status (the line "gpu_check: exit N" that the stage appends; none while it runs or when it was
# cut short); then the first five distinct reports, each with the line that says where.
sanitizer_verdict() {
  awk -v tool="$1" '
    /ERROR SUMMARY: [0-9]+ error/ { match($0, /SUMMARY: [0-9]+/); errors += substr($0, RSTART + 9, RLENGTH - 9); processes++ }
    /[0-9]+ passed, [0-9]+ failed/ { match($0, /[0-9]+ passed, [0-9]+ failed/); counts = substr($0, RSTART, RLENGTH) }
    /^gpu_check: exit [0-9]+$/ { rc = $3 }
    function keep(report) {
      if (!(report in seen) && shown < 5) { seen[report] = 1; lines[++shown] = report }
      pending = ""
    }
    /^========= [A-Z]/ && !/SUMMARY|COMPUTE-SANITIZER/ {
      if (pending != "") keep(pending)  # a report without a location (an API error, say)
      pending = substr($0, 11)
    }
    /^=========[ ]+at / && pending != "" {
      where = $0
      sub(/^=========[ ]+at /, "", where)
      keep(pending " (at " where ")")
    }
    END {
      if (pending != "") keep(pending)
      line = "compute-sanitizer " tool " over gpu_kernels: "
      line = line (processes ? errors " errors in " processes " processes" : "no ERROR SUMMARY")
      line = line "; " (counts != "" ? counts : "no test counts")
      if (rc == "") line = line "; no exit status (running, or cut short)"
      else line = line "; exit " rc (rc == 124 ? " (timed out: the reports before it)" : rc == 125 ? " (not started: --deadline)" : "")
      print line
      for (i = 1; i <= shown; i++) print "  - " substr(lines[i], 1, 200)
    }' "$2"
}
# rate LOG KIND NAME PRECISION [CONV] [TAG]: samples/s on LOG's first line from KIND
# (mptrain-model, mptrain-kernels or pytorch) for model NAME in PRECISION, with conv=CONV and
# TAG (graphs=on) where given; nothing when there is no such line.
rate() {
  grep -F "$2 model=$3 precision=$4 " "$1" 2>/dev/null | grep -E "${5:+ conv=$5( |\$)}" \
    | grep -m1 -F -- "${6:-}" | field samples_per_s
}
summary_body() {
  local not_started fails
  if ((summary_only)); then
    echo "GPU check summary of the logs in $build, rewritten $(date -u '+%Y-%m-%d %H:%M UTC')" \
      "(--summary-only: the GPU, the tests' counts and the trainer's source are not in the logs)"
  else
    echo "GPU check $(date -u '+%Y-%m-%d %H:%M UTC') on ${gpu_name:-unknown GPU} (CUDA arch ${arch:-unknown})"
  fi
  not_started=$(wc -l < "$build/deadline.log")
  if ((summary_only)); then
    :
  elif ((completed && not_started == 0)); then
    echo "check: complete"
  elif ((completed)); then
    echo "check: ended, but $not_started commands were not started before the --deadline of $deadline s (deadline.log)"
  else
    echo "check: PARTIAL, written as the stage '$current_stage' began (the run was cut short there or later)"
  fi
  if ! ((summary_only)); then
    echo "tests/gpu: ${tests_line:-no result} (ctest exit $ctest_rc)"
    case $trainer_source in
      build) echo "trainer: built here" ;;
      bundle) echo "trainer: bundled ($(head -1 "$bundle/MANIFEST"))" ;;
      *) ((trainer_looked)) &&
           echo "trainer: none (GPU-only build, no bundle: run perf/gpu_bundle.sh on the Debian machine and carry .gpu-bundle)" ||
           echo "trainer: not yet looked for" ;;
    esac
  fi
  # The failed checks by name (a crashed or hung case among them), so that the table alone says
  # what to look at; ctest -V prefixes each line with the test's number.
  if [[ -f $build/ctest.log ]]; then
    fails=$(grep -E '^[0-9]+:   FAIL  ' "$build/ctest.log" | sed 's/^[0-9]*:   FAIL  /  - /')
    if [[ -n $fails ]]; then
      echo "tests/gpu failures ($(wc -l <<<"$fails"); the first 12, all in ctest.log):"
      head -12 <<<"$fails" | cut -c1-200
    fi
  fi
  echo
  echo "| model | precision | batch | mptrain nn::Model samples/s | mptrain-kernels samples/s | PyTorch samples/s | nn::Model / PyTorch | kernels / PyTorch |"
  echo "|---|---|---|---|---|---|---|---|"
  # The cnn once per conv path (gpu_bench's conv= field); both against the same PyTorch run.
  for row in mlp cnn:cudnn cnn:im2col; do
    name=${row%%:*}
    conv=${row#*:}
    [[ $conv == "$row" ]] && conv=
    for precision in fp32 fp16 bf16; do
      model=$(rate "$build/gpu_bench.log" mptrain-model "$name" "$precision" "$conv")
      ours=$(rate "$build/gpu_bench.log" mptrain-kernels "$name" "$precision")
      theirs=$(rate "$build/pytorch.log" pytorch "$name" "$precision")
      ratio_model=$(ratio "$model" "$theirs")
      ratio=$(ratio "$ours" "$theirs")
      echo "| $name${conv:+ (conv $conv)} | $precision | $batch | ${model:-n/a} | ${ours:-n/a} | ${theirs:-n/a} | $ratio_model | $ratio |"
    done
  done
  # The steps as CUDA graphs (gpu_bench --graphs) against the eager nn::Model rows above.
  echo
  echo "| model | precision | batch | graphs samples/s | eager nn::Model samples/s | graphs / eager | PyTorch samples/s | graphs / PyTorch |"
  echo "|---|---|---|---|---|---|---|---|"
  for row in mlp::fp32 mlp::fp16 mlp::bf16 cnn:cudnn:fp16 cnn:cudnn:fp32; do
    IFS=: read -r name conv precision <<< "$row"
    graphs=$(rate "$build/gpu_bench_graphs.log" mptrain-model "$name" "$precision" "" graphs=on)
    eager=$(rate "$build/gpu_bench.log" mptrain-model "$name" "$precision" "$conv")
    theirs=$(rate "$build/pytorch.log" pytorch "$name" "$precision")
    ratio_eager=$(ratio "$graphs" "$eager")
    ratio_torch=$(ratio "$graphs" "$theirs")
    echo "| $name (graphs)${conv:+ (conv $conv)} | $precision | $batch | ${graphs:-n/a} | ${eager:-n/a} | $ratio_eager | ${theirs:-n/a} | $ratio_torch |"
  done
  echo
  # The GPU-bound batch.
  echo "| mlp, batch $big_batch | precision | mptrain nn::Model samples/s | nn::Model, input cast first (flatten,...) | mptrain-kernels samples/s | PyTorch samples/s | nn::Model / PyTorch | cast first / PyTorch | kernels / PyTorch |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for precision in fp32 fp16 bf16; do
    model=$(rate "$build/gpu_bench_big.log" mptrain-model mlp "$precision")
    cast_first=$(rate "$build/gpu_bench_big.log" mptrain-model "$mlp16_spec" "$precision")
    ours=$(rate "$build/gpu_bench_big.log" mptrain-kernels mlp "$precision")
    theirs=$(rate "$build/pytorch_big.log" pytorch mlp "$precision")
    echo "| mlp | $precision | ${model:-n/a} | ${cast_first:-n/a} | ${ours:-n/a} | ${theirs:-n/a} | $(ratio "$model" "$theirs") | $(ratio "$cast_first" "$theirs") | $(ratio "$ours" "$theirs") |"
  done
  echo
  echo "| GEMM m=n=k | precision | mptrain cuBLASLt TFLOP/s | torch.matmul TFLOP/s | ratio |"
  echo "|---|---|---|---|---|"
  for size in 1024 4096 8192; do
    for precision in fp32 fp16 bf16; do
      ours=$(grep "^gemm precision=$precision m=n=k=$size " "$build/gpu_bench.log" | field tflops)
      theirs=$(grep "^torch-gemm precision=$precision m=n=k=$size " "$build/pytorch.log" | field tflops)
      ratio=$(ratio "$ours" "$theirs")
      echo "| $size | $precision | ${ours:-n/a} | ${theirs:-n/a} | $ratio |"
    done
  done
  if [[ -s $build/ncu.txt ]]; then
    echo
    cat "$build/ncu.txt"
  fi
  if [[ -s $build/trainer.log ]]; then
    echo
    echo "mptrain train (synthetic 1x28x28, 10 classes; one rank and 40 steps of 256 unless the line says otherwise):"
    cat "$build/trainer.log"
    # The trainer's whole step (prefetched data, the all-reduce: nccl on one rank, the step
    # reports) against gpu_bench's bare nn::Model step, same model, batch 256 and fp32: what the
    # rest of a training step costs the GPU, if anything.
    if [[ $batch == 256 ]]; then
      for row in mlp cnn:cudnn; do
        name=${row%%:*}
        conv=${row#*:}
        [[ $conv == "$row" ]] && conv=
        whole=$(grep -m1 "^trainer model=$name device=cuda prefetch=8 io_threads=4 normalize=auto " \
          "$build/trainer.log" | field samples_per_s)
        bare=$(rate "$build/gpu_bench.log" mptrain-model "$name" fp32 "$conv")
        echo "trainer model=$name (prefetch 8, 120 steps) / gpu_bench nn::Model fp32: $(ratio "$whole" "$bare")"
      done
    fi
  fi
  if [[ -s $build/nccl.log ]]; then
    echo
    echo "nccl all-reduce (gpu_nccl_allreduce; mptrain train --comm.intra=nccl, mlp, 40 steps, one rank):"
    cat "$build/nccl.log"
  fi
  if [[ -s $build/sanitizer.log || -s $build/sanitizer-memcheck.log ]]; then
    echo
    cat "$build/sanitizer.log"
    for tool in memcheck racecheck; do
      [[ ! -s $build/sanitizer-$tool.log ]] || sanitizer_verdict "$tool" "$build/sanitizer-$tool.log"
    done
  fi
  echo
  echo "total time $(( $(date +%s) - start )) s (--deadline $deadline)"
}
# write_summary: the table from the logs so far into $build/gpu_check.txt and $OUT/gpu_check.txt
# (each replaced by a rename). In a subshell, so that the table's loop variables stay its own.
write_summary() {
  local text=$build/gpu_check.txt
  (summary_body) > "$text.tmp" 2>/dev/null
  mv -f "$text.tmp" "$text"
  [[ -z ${OUT:-} ]] || { cp "$text" "$OUT/.gpu_check.txt" && mv -f "$OUT/.gpu_check.txt" "$OUT/gpu_check.txt"; }
}

if ((summary_only)); then
  trap - EXIT
  (summary_body) 2>/dev/null
  exit 0
fi

stage "GPU"
gpu_name=$(timeout 20 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv 2>/dev/null || true
echo "GPU: ${gpu_name:-none found by nvidia-smi}"
cap=$(timeout 20 nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '. ')
arch=${cap:-80;90}
nvcc --version | tail -1

# A configure or build that fails skips only what needs its binaries: the PyTorch peers and the
# bundle's stages still run, and the logs say why (configure.log, build.log).
stage "configure ($build, CUDA architectures $arch)"
generator=()
keep_going=(-k)
command -v ninja >/dev/null && { generator=(-G Ninja); keep_going=(-k 0); }
tmo 300 cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DMPTRAIN_ENABLE_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch" -DMPTRAIN_ENABLE_BENCHMARKS=OFF \
  -DCMAKE_CUDA_FLAGS=-lineinfo \
  > "$build/configure.log" 2>&1
configure_rc=$?
grep -E "mptrain|Found|GPU-only|Error|error" "$build/configure.log"
targets=()
if [[ $configure_rc -ne 0 ]] || ! grep -q "^MPTRAIN_GPU_ONLY_BUILD" "$build/CMakeCache.txt" 2>/dev/null; then
  echo "gpu_check.sh: configure failed (exit $configure_rc, log: $build/configure.log): nothing is built here" >&2
  ctest_rc=1
else
  targets=(gpu_kernels gpu_model gpu_case_table gpu_host_reference gpu_bench)
  # With MPI, HDF5, Boost and Kokkos present the full trainer is built too.
  # (and the prefetcher's device delivery test, which needs MPI and HDF5 as the trainer does).
  grep -q '^MPTRAIN_GPU_ONLY_BUILD:INTERNAL=OFF' "$build/CMakeCache.txt" &&
    targets+=(mptrain gpu_prefetcher gpu_world_refusal)
  # Where NCCL and MPI are found (the GPU-only build too, which then builds comm alone), the
  # nccl all-reduce's GPU test (its own stage below).
  grep -q '^MPTRAIN_NCCL_BUILD:INTERNAL=ON' "$build/CMakeCache.txt" && targets+=(gpu_nccl_allreduce)
fi
echo "targets: ${targets[*]:-none}"

if ((${#targets[@]})); then
  stage "build (${targets[*]}, $jobs jobs, keep going past a failed target)"
  if ! tmo 400 cmake --build "$build" -j "$jobs" --target "${targets[@]}" -- "${keep_going[@]}" \
      > "$build/build.log" 2>&1; then
    grep -E "error|FAILED" "$build/build.log" | head -40
    echo "gpu_check.sh: build failed (log: $build/build.log); the stages of what did build still run" >&2
    ctest_rc=1
  fi
  tail -1 "$build/build.log"

  stage "tests/gpu (ctest -L gpu)"
  tmo 300 ctest --test-dir "$build" -L gpu -E '^gpu_nccl_allreduce' --timeout 90 -V > "$build/ctest.log" 2>&1
  rc=$?
  ((rc == 0)) || ctest_rc=$rc
  # Every case and the failures in full; passing checks only as a count.
  grep -E "FAIL|: case |: pending |gpu_kernels on|[0-9]+ passed, [0-9]+ failed|tests passed|tests failed|Skipped|SKIPPED|Not Run|\*\*\*" \
    "$build/ctest.log" | tail -80
  tests_line=$(grep -oE "[0-9]+ passed, [0-9]+ failed" "$build/ctest.log" | tr '\n' ';')
  echo "ctest exit status: $rc"
  if [[ -n $gpu_name ]] && grep -q "SKIPPED: no CUDA device" "$build/ctest.log"; then
    echo "gpu_check.sh: nvidia-smi sees '$gpu_name' but the tests found no CUDA device" \
         "(driver older than the CUDA $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') runtime?)" >&2
    ctest_rc=1
  fi
fi
gpu_bench=$build/perf/gpu/gpu_bench

# Where the trainer comes from: this build (MPI, HDF5, Boost and Kokkos found here), else the
# archive of perf/gpu_bundle.sh (the full CUDA build made on a Debian machine, with its libraries
# and its own Open MPI), else nowhere: the trainer stages are then skipped, and say so.
# with_env runs a command in the bundle's environment; empty for this build's own trainer.
mptrain=
with_env=()
if [[ -x $build/mptrain ]]; then
  trainer_source=build
  mptrain=$build/mptrain
elif [[ -f $bundle_archive ]]; then
  stage "unpack $bundle_archive (the trainer prebuilt by perf/gpu_bundle.sh)"
  rm -rf "$build/bundle"
  mkdir -p "$build/bundle"
  # Python's tarfile where the machine has no xz program for tar.
  if tmo 120 tar -C "$build/bundle" -xJf "$bundle_archive" 2> "$build/unpack.log" ||
     tmo 120 "$python" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
       "$bundle_archive" "$build/bundle" 2>> "$build/unpack.log"; then
    bundle=$(cd "$build/bundle/mptrain-bundle" && pwd)
    cat "$bundle/MANIFEST"
    # The CUDA runtime, cuBLASLt, cuDNN and NCCL that this machine's configure found (cuDNN and
    # NCCL possibly pip's), both where the cache points and where its links lead.
    cuda_dirs=$(sed -n -E 's/^(CUDA_cudart_LIBRARY|CUDA_cublasLt_LIBRARY|CUDNN_LIBRARY|NCCL_LIBRARY):FILEPATH=//p' \
      "$build/CMakeCache.txt" | while read -r library; do
        dirname "$library"
        dirname "$(readlink -f "$library")"
      done | awk '!seen[$0]++' | paste -sd: -)
    cat > "$build/bundle-env" <<ENV
#!/usr/bin/env bash
source "$bundle/env.sh"
export LD_LIBRARY_PATH=\$LD_LIBRARY_PATH${cuda_dirs:+:$cuda_dirs}
exec "\$@"
ENV
    chmod +x "$build/bundle-env"
    with_env=("$(cd "$build" && pwd)/bundle-env")
    mptrain=$bundle/bin/mptrain
    # The bundled mptrain starts, and the bundled mpiexec launches a rank: each bounded, since an
    # Open MPI that hangs here would otherwise wait out every trainer stage's timeout below.
    if ! tmo 30 "${with_env[@]}" "$mptrain" --help > /dev/null 2> "$build/bundle-start.log"; then
      echo "gpu_check.sh: the bundled mptrain does not start here: $(grep -m2 . "$build/bundle-start.log")" >&2
    elif ! tmo 30 "${with_env[@]}" mpiexec -n 2 --oversubscribe true >> "$build/bundle-start.log" 2>&1; then
      echo "gpu_check.sh: the bundled mpiexec cannot launch 2 ranks here: $(tail -2 "$build/bundle-start.log")" >&2
    else
      trainer_source=bundle
    fi
  else
    echo "gpu_check.sh: could not unpack $bundle_archive: $(tail -1 "$build/unpack.log")" >&2
  fi
fi
trainer_looked=1
echo "trainer: $trainer_source${mptrain:+ ($mptrain)}"

# The prefetcher's device delivery test from the bundle (this build, when it has the trainer,
# ran it in ctest above).
if [[ $trainer_source == bundle ]]; then
  stage "gpu_prefetcher (bundled, mpiexec -n 1)"
  tmo 120 "${with_env[@]}" mpiexec -n 1 "$bundle/bin/gpu_prefetcher" > "$build/prefetcher.log" 2>&1
  prefetcher_rc=$?
  grep -E "FAIL|: case |SKIPPED|[0-9]+ passed, [0-9]+ failed" "$build/prefetcher.log" | tail -20
  [[ $prefetcher_rc -eq 0 || $prefetcher_rc -eq 77 ]] || ctest_rc=1
  prefetcher_line=$(grep -m1 -oE "[0-9]+ passed, [0-9]+ failed|SKIPPED" "$build/prefetcher.log")
  tests_line+="gpu_prefetcher (bundled): ${prefetcher_line:-no result, exit $prefetcher_rc};"

  # World's Tensor collectives refuse a device tensor (as ctest's gpu_world_refusal_* check in a
  # full build): rank 0 hands one over while rank 1 waits in the collective, and the job must end,
  # non-zero, within the timeout, with the line that names the call.
  stage "gpu_world_refusal (bundled, mpiexec -n 2): World's collectives refuse a device tensor"
  : > "$build/world_refusal.log"
  refusals=
  for op in allreduce broadcast; do
    call=$op
    [[ $op == allreduce ]] && call=allreduce_sum
    rc=0
    tmo 60 "${with_env[@]}" mpiexec -n 2 --oversubscribe "$bundle/bin/gpu_world_refusal" "$op" \
      > "$build/world_refusal-$op.log" 2>&1 || rc=$?
    cat "$build/world_refusal-$op.log" >> "$build/world_refusal.log"
    if [[ $rc -eq 77 ]] && grep -q "^SKIPPED: " "$build/world_refusal-$op.log"; then
      verdict=skipped
    elif [[ $rc -ne 0 && $rc -ne 124 && $rc -ne 125 ]] &&
         grep -qF "World::$call: needs a host tensor, got float32(4) cuda" "$build/world_refusal-$op.log"; then
      verdict=refused
    else
      verdict="NOT refused (exit $rc)"
      ctest_rc=1
    fi
    echo "gpu_world_refusal $op: $verdict" | tee -a "$build/world_refusal.log"
    refusals+="${refusals:+, }$op $verdict"
  done
  tests_line+="gpu_world_refusal (bundled): $refusals;"
fi

# logged LOG SECONDS COMMAND...: COMMAND under tmo, its output and errors appended to LOG and
# shown, then a line with its exit status when it failed (124: timed out; 125: not started).
logged() {
  local log=$1 seconds=$2 rc
  shift 2
  tmo "$seconds" "$@" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  ((rc == 0 || rc == 125)) || echo "${*:1:6}: exit $rc$( ((rc == 124)) && echo ' (timed out)')" | tee -a "$log"
  return "$rc"
}
# bench LOG SECONDS ARGS...: one gpu_bench run, logged; "not built" where the build made none.
bench() {
  local log=$1 seconds=$2
  shift 2
  if [[ ! -x $gpu_bench ]]; then
    echo "gpu_bench $*: not built (see build.log)" | tee -a "$log"
    return 1
  fi
  logged "$log" "$seconds" "$gpu_bench" "$@"
}

stage "gpu_bench (steps $steps, batch $batch; then --graphs)"
bench "$build/gpu_bench.log" 240 --steps "$steps" --batch "$batch"
# The cnn as nn::Model (no kernel-level step, no GEMMs); its own runs, so that a failure of the
# conv, pooling or BN device paths leaves the mlp figures above intact: convolutions through
# cuDNN (the default), then through the im2col + cuBLASLt path, each with its own timeout.
for conv in cudnn im2col; do
  bench "$build/gpu_bench.log" 150 --model cnn --conv "$conv" --no-gemm --steps "$steps" \
    --batch "$batch"
done
# The same nn::Model steps captured as one CUDA graph each and replayed (gpu_bench --graphs,
# kernels::StepGraph): the mlp in every precision, the cnn (cuDNN convolutions) in fp16 and fp32.
# Their own log and short timeouts: a capture that fails leaves the eager figures above intact.
bench "$build/gpu_bench_graphs.log" 45 --model mlp --graphs --no-gemm --steps "$steps" \
  --batch "$batch"
for precision in fp16 fp32; do
  bench "$build/gpu_bench_graphs.log" 45 --model cnn --conv cudnn --graphs --no-gemm \
    --precision "$precision" --steps "$steps" --batch "$batch"
done

stage "PyTorch peers (perf/pytorch_gpu.py and torch.matmul)"
for model in mlp cnn; do
  for precision in fp32 fp16 bf16; do
    logged "$build/pytorch.log" 120 "$python" perf/pytorch_gpu.py --model "$model" --batch "$batch" \
      --steps "$steps" --precision "$precision"
  done
done
logged "$build/pytorch.log" 120 "$python" - <<'PY'
import torch
# fp32 as mptrain's fp32 (CUBLAS_COMPUTE_32F): no TF32 tensor cores.
torch.backends.cuda.matmul.allow_tf32 = False
if torch.cuda.is_available():
    for size in (1024, 4096, 8192):
        for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
            a = torch.rand(size, size, device="cuda", dtype=dtype)
            b = torch.rand(size, size, device="cuda", dtype=dtype)
            calls = 200 if size <= 1024 else 40 if size <= 4096 else 10
            for _ in range(3):
                a @ b
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                a @ b
            stop.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(stop) / 1e3
            print(f"torch-gemm precision={name} m=n=k={size} tflops={2 * size**3 * calls / seconds / 1e12:.1f}")
PY

# The trainer itself (--device), where this build or the bundle has mptrain: a synthetic set made
# here (no Fashion-MNIST on a bare machine); first the data-wait runs (an issue #8 target), then
# mlp, cnn and resnet-mini on cpu and on cuda, one rank, then two ranks sharing the GPU.
# Each run has its own timeout and only reports: a failure here fails nothing else.
if [[ $trainer_source != none ]]; then
  stage "trainer, data waits (mptrain train --device=cuda, mlp and cnn, 120 steps of 256, prefetch on and off)"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  data=$build/trainer-data
  tmo 60 "${with_env[@]}" "$mptrain" prepare synthetic --out "$data" --train-samples 10240 \
    --test-samples 2048 --seed 7 > "$build/trainer-prepare.log" 2>&1 || tail -3 "$build/trainer-prepare.log"
  # Is the GPU ever idle waiting for data (issue #8)? The mlp (the least compute per sample, so
  # the hardest to feed) and the cnn on cuda for 120 steps (3 epochs, a window every 20 steps),
  # with prefetch on (8 batches ahead, 4 I/O threads), then off (--data.prefetch=0, each batch
  # read when the step wants it) for contrast: each run's data_wait_fraction over the run, and
  # the largest over the windows after the first (which holds the pipeline's fill). The uint8
  # samples travel as stored and the GPU normalises them (--data.normalize=auto on cuda); the
  # mlp also runs with the I/O threads converting to f32 (reader: 4x the bytes over the bus).
  for variant in mlp:8:auto mlp:8:reader mlp:0:auto cnn:8:auto cnn:0:auto; do
    IFS=: read -r model prefetch normalize <<< "$variant"
    run=$build/trainer-$model-cuda-prefetch$prefetch-$normalize
    threads=1
    (( prefetch > 0 )) && threads=4  # an I/O thread fills one read-ahead batch at a time
    rc=0
    tmo 60 "${with_env[@]}" mpiexec -n 1 "$mptrain" train --data.train="$data/train.h5" \
      --data.test="$data/test.h5" --model.name="$model" --train.max-steps=120 \
      --train.batch-size=256 --train.log-every=20 --device=cuda --data.prefetch="$prefetch" \
      --data.io-threads=$threads --data.normalize="$normalize" --output.dir="$run" \
      --output.overwrite --output.progress=lines > "$run.log" 2>&1 || rc=$?
    label="trainer model=$model device=cuda prefetch=$prefetch io_threads=$threads normalize=$normalize"
    if [[ $rc -eq 0 && -f $run/summary.json && -f $run/metrics.jsonl ]]; then
      steady=$("$python" -c 'import json, sys
fractions = [r["data_wait_fraction"] for r in map(json.loads, open(sys.argv[1])) if "data_wait_fraction" in r]
print(f"{max(fractions[1:]):.4f}" if len(fractions) > 1 else "-1")' "$run/metrics.jsonl")
      run_line "$label" "$run/summary.json" samples_per_s data_wait_fraction 2>&1 \
        | sed "s/\$/ steady_window_max_data_wait_fraction=$steady/" | tee -a "$build/trainer.log"
    else
      echo "$label failed (exit $rc): $(grep -m1 -E 'error|fatal' "$run.log")" | tee -a "$build/trainer.log"
    fi
  done
  # 40 steps of batch 256 are one epoch, so each run ends with its test evaluation.
  stage "trainer --device=cpu|cuda (mlp and cnn 40 steps = 1 epoch, resnet-mini 20 x 2, batch 256, one rank)"
  # resnet-mini: gradient accumulation and sync-BN on the device (20 steps of 2 micro-batches;
  # bn_stats_path=device: the statistics summed on NCCL's stream, one rank's communicator).
  # The mlp also as cuda+graphs: --cuda.graphs replays each step as one captured CUDA graph
  # (the mlp has no dropout; accumulate is 1), beside the eager cuda run.
  for model in mlp cnn resnet-mini; do
    extra=()
    train_steps=40
    if [[ $model == resnet-mini ]]; then
      extra=(--train.accumulate=2 --model.sync-bn=true)
      train_steps=20
    fi
    devices=(cpu cuda)
    [[ $model == mlp ]] && devices+=(cuda+graphs)
    for device in "${devices[@]}"; do
      run=$build/trainer-$model-$device
      graph_flag=()
      [[ $device == cuda+graphs ]] && graph_flag=(--cuda.graphs)
      rc=0
      tmo 45 "${with_env[@]}" mpiexec -n 1 "$mptrain" train --data.train="$data/train.h5" \
        --data.test="$data/test.h5" --model.name="$model" --train.max-steps=$train_steps \
        --train.batch-size=256 --device="${device%+graphs}" --output.dir="$run" \
        --output.overwrite --output.progress=lines "${extra[@]}" "${graph_flag[@]}" \
        > "$run.log" 2>&1 || rc=$?
      grep -E "^device:" "$run.log" | head -1
      if [[ $rc -eq 0 && -f $run/summary.json ]]; then
        run_line "trainer model=$model device=$device" "$run/summary.json" samples_per_s \
          final_train_loss test_accuracy tensor_peak_mb device_reserved_mb \
          step_allocations=step_tensor_allocations step_cudamalloc=step_device_slabs \
          data_wait_fraction gradient_path exposed_comm=exposed_comm_time_s bn_stats_path \
          graph_allreduce graph_replays 2>&1 \
          | tee -a "$build/trainer.log"
      else
        echo "trainer model=$model device=$device failed (exit $rc): $(grep -m1 -E 'error|fatal' "$run.log")" \
          | tee -a "$build/trainer.log"
      fi
    done
    # Same seed, data and fp32 on both devices: the losses should agree to a few digits (the
    # device sums in another order), and a gap says the cuda path is wrong, not slow.
    awk -v m="$model" '$2 == "model=" m && $5 ~ /^final_train_loss=/ {
        split($3, d, "="); split($5, l, "="); loss[d[2]] = l[2]
      } END {
        if (("cpu" in loss) && ("cuda" in loss) && loss["cpu"] != 0)
          printf "trainer model=%s cuda/cpu final_train_loss ratio=%.4f\n", m, loss["cuda"] / loss["cpu"]
        # The graph replays the eager step kernel for kernel: the same loss up to the order of
        # the loss sum.
        if (("cuda" in loss) && ("cuda+graphs" in loss))
          printf "trainer model=%s final_train_loss cuda=%s cuda+graphs=%s\n", m, loss["cuda"], loss["cuda+graphs"]
      }' "$build/trainer.log" | tee -a "$build/trainer.log"
  done
  # resnet-mini with sync BN under --cuda.graphs (accumulate 1, as graphs need), beside the same
  # run eager: the graph holds the statistics' and the gradient buckets' NCCL calls on the comm
  # stream, forked from the compute stream and joined back (one rank's communicator;
  # graph_allreduce=in-graph), a real NCCL captured for the first time. The replayed steps
  # should give the eager losses.
  for device in cuda cuda+graphs; do
    run=$build/trainer-resnet-syncbn-$device
    graph_flag=()
    [[ $device == cuda+graphs ]] && graph_flag=(--cuda.graphs)
    rc=0
    tmo 45 "${with_env[@]}" mpiexec -n 1 "$mptrain" train --data.train="$data/train.h5" \
      --data.test="$data/test.h5" --model.name=resnet-mini --model.sync-bn=true \
      --train.max-steps=20 --train.batch-size=256 --device=cuda --output.dir="$run" \
      --output.overwrite --output.progress=lines "${graph_flag[@]}" > "$run.log" 2>&1 || rc=$?
    if [[ $rc -eq 0 && -f $run/summary.json ]]; then
      run_line "trainer model=resnet-mini-syncbn device=$device" "$run/summary.json" samples_per_s \
        final_train_loss bn_stats_path graph_replays step_cudamalloc=step_device_slabs \
        graph_allreduce exposed_comm=exposed_comm_time_s 2>&1 \
        | tee -a "$build/trainer.log"
    else
      echo "trainer model=resnet-mini-syncbn device=$device failed (exit $rc): $(grep -m1 -E 'error|fatal' "$run.log")" \
        | tee -a "$build/trainer.log"
    fi
  done
  stage "trainer, two ranks on the one GPU (staged all-reduce) and on the cpu"
  # Two ranks on the one GPU: NCCL refuses that, so the all-reduce stays on the host backends and
  # stages the device gradients bucket by bucket through pinned memory (kernels/staging.hpp),
  # overlapping backward (1 MiB buckets: several for the mlp). Beside the same two ranks on the
  # cpu: the same data and seed, so the final losses should agree to a few digits.
  for device in cpu cuda; do
    run=$build/trainer-mlp-np2-$device
    rc=0
    tmo 60 "${with_env[@]}" mpiexec -n 2 --oversubscribe "$mptrain" train --data.train="$data/train.h5" \
      --data.test="$data/test.h5" --model.name=mlp --train.max-steps=40 --train.batch-size=128 \
      --device="$device" --comm.bucket-mb=1 --comm.overlap=on --output.dir="$run" \
      --output.overwrite --output.progress=lines > "$run.log" 2>&1 || rc=$?
    grep -m1 -E "^allreduce" "$run.log" | sed "s/^/$device-np2: /" | tee -a "$build/trainer.log"
    if [[ $rc -eq 0 && -f $run/summary.json ]]; then
      run_line "trainer model=mlp device=$device-np2" "$run/summary.json" samples_per_s \
        final_train_loss test_accuracy comm_time_s exposed_comm_time_s gradient_path overlap \
        2>&1 | tee -a "$build/trainer.log"
    else
      echo "trainer model=mlp device=$device-np2 failed (exit $rc): $(grep -m1 -E 'error|fatal' "$run.log")" \
        | tee -a "$build/trainer.log"
    fi
  done
fi

# The nccl all-reduce (issue #8), where this build or the bundle has NCCL and MPI: its GPU test
# (np 1; np 2 reports SKIPPED on a one-GPU machine, NCCL refusing two ranks on one device) and,
# where there is a trainer, one rank training the mlp with --comm.intra=nccl (the device
# gradients reduced in place, no host staging; 1 MiB buckets queued on the comm stream as
# backward launches them, one wait per step) beside the staged cuda run above. Own timeouts; a
# failure is reported and fails nothing else.
# With a bundle, its test binary under its own Open MPI (rehearsed on a bare Debian, see
# docs/gpu.md); else this build's, where it has MPI and NCCL, under this machine's mpiexec.
nccl_test=none
[[ " ${targets[*]} " == *" gpu_nccl_allreduce "* ]] && nccl_test=build
[[ $trainer_source == bundle ]] && nccl_test=bundle
if [[ $nccl_test != none ]]; then
  stage "nccl all-reduce (gpu_nccl_allreduce np 1 and 2, $nccl_test; mptrain train --comm.intra=nccl, one rank)"
  if [[ $nccl_test == build ]]; then
    tmo 150 ctest --test-dir "$build" -R '^gpu_nccl_allreduce' --timeout 70 -V > "$build/nccl-ctest.log" 2>&1
    nccl_rc=$?
  else
    # As ctest runs it (tests/gpu/CMakeLists.txt); exit 77 is a skip.
    : > "$build/nccl-ctest.log"
    nccl_rc=0
    for np in 1 2; do
      tmo 70 "${with_env[@]}" mpiexec -n $np --oversubscribe "$bundle/bin/gpu_nccl_allreduce" \
        >> "$build/nccl-ctest.log" 2>&1
      rc=$?
      echo "gpu_nccl_allreduce np $np (bundled): exit $rc" >> "$build/nccl-ctest.log"
      [[ $rc -eq 0 || $rc -eq 77 ]] || nccl_rc=$rc
    done
  fi
  grep -E "FAIL|SKIPPED|gpu_nccl_allreduce on|gpu_nccl_allreduce np|[0-9]+ passed, [0-9]+ failed|tests passed|tests failed" \
    "$build/nccl-ctest.log" | tail -30
  result=$(grep -oE '[0-9]+ passed, [0-9]+ failed' "$build/nccl-ctest.log" | head -1)
  [[ -z $result ]] && result=$(grep -m1 -oE 'SKIPPED: .{0,160}' "$build/nccl-ctest.log")
  echo "nccl test: ${result:-no result} (exit $nccl_rc)" | tee -a "$build/nccl.log"
  if [[ $trainer_source == none ]]; then
    echo "trainer model=mlp device=cuda intra=nccl: not run (GPU-only build and no bundle: no mptrain)" \
      | tee -a "$build/nccl.log"
  else
    run=$build/trainer-mlp-nccl
    rc=0
    tmo 60 "${with_env[@]}" mpiexec -n 1 "$mptrain" train --data.train="$data/train.h5" \
      --data.test="$data/test.h5" --model.name=mlp --train.max-steps=40 --train.batch-size=256 \
      --device=cuda --comm.intra=nccl --comm.bucket-mb=1 --comm.overlap=on \
      --output.dir="$run" --output.overwrite --output.progress=lines > "$run.log" 2>&1 || rc=$?
    grep -E "^allreduce" "$run.log" | head -1 | tee -a "$build/nccl.log"
    if [[ $rc -eq 0 && -f $run/summary.json ]]; then
      run_line "trainer model=mlp device=cuda" "$run/summary.json" intra=allreduce_intra \
        samples_per_s final_train_loss comm_time_s exposed_comm_time_s gradient_path overlap \
        2>&1 | tee -a "$build/nccl.log"
    else
      echo "trainer model=mlp device=cuda intra=nccl failed (exit $rc): $(grep -m1 -E 'error|fatal' "$run.log")" \
        | tee -a "$build/nccl.log"
    fi
  fi
fi

# The mlp at a GPU-bound batch (8192: about 90 GFLOP a step), where launches no longer hide
# what the GPU does: nn::Model against PyTorch AMP, side by side, 50 steps each. The 16-bit
# nn::Model was 0.54-0.61x PyTorch here on 2026-11-29; its dense layers now run one GEMM per
# operand over the whole batch on the device (Model::plan), not 16 blocks of 512 rows.
if over_budget "the GPU-bound batch and the ncu profile"; then
  echo "GPU-bound batch and ncu: skipped (over the --budget of ${budget} s)" | tee "$build/ncu.txt"
else
  stage "GPU-bound batch $big_batch: gpu_bench and PyTorch, mlp"
  bench "$build/gpu_bench_big.log" 60 --model mlp --no-gemm --steps 50 --warmup 5 \
    --batch "$big_batch"
  # The same mlp behind a flatten layer, which casts the f32 input to the 16-bit precision once
  # (as autocast does), so that the first dense layer computes in 16 bits too, not in f32.
  bench "$build/gpu_bench_big.log" 60 --model "$mlp16_spec" --model-only --no-gemm --steps 50 \
    --warmup 5 --batch "$big_batch"
  for precision in fp32 fp16 bf16; do
    logged "$build/pytorch_big.log" 60 "$python" perf/pytorch_gpu.py --model mlp --batch "$big_batch" \
      --steps 50 --precision "$precision"
  done

  # Where the GPU-bound step's time goes, kernel by kernel: one timed nn::Model step of the mlp
  # at batch 8192 under Nsight Compute (gpu_bench's timed loop is the profiler range), in fp16 and
  # fp32, and with the input cast first in fp16; then the cnn at batch $batch in fp16 and fp32
  # (its targets: fp16 >= 2x fp32 and >= 1.0x PyTorch AMP). Totalled per kernel by
  # perf/gpu/ncu_summary.py, with each kernel's DRAM and SM throughput in percent of the peak:
  # low in both is latency (too few loads in flight: the scalar 16-bit element-wise passes are
  # the suspects), high SM and low DRAM is arithmetic. The 16-bit nn::Model was slower than the
  # fp32 one here on 2026-11-29; these tables say where. Skipped where ncu is missing.
  if command -v ncu >/dev/null && [[ -x $gpu_bench ]]; then
    stage "ncu: one nn::Model step: mlp at batch $big_batch (fp16, fp32, fp16 with the input cast first), cnn at batch $batch (fp16, fp32)"
    for run in "mlp:fp16:$big_batch" "mlp:fp32:$big_batch" "$mlp16_spec:fp16:$big_batch" \
      "cnn:fp16:$batch" "cnn:fp32:$batch"; do
      # MODEL:PRECISION:BATCH, split from the right: the mlp16 spec has colons of its own.
      run_batch=${run##*:}
      model=${run%:*}
      precision=${model##*:}
      model=${model%:*}
      label=$model
      [[ $model == "$mlp16_spec" ]] && label=mlp-cast-first
      # LC_ALL=C: ncu formats values by the locale ("9,00" under a decimal comma), and the
      # summary reads a comma as a thousands separator.
      LC_ALL=C tmo 60 ncu --csv --print-units base --print-kernel-base function --clock-control none \
        --profile-from-start off --metrics "$ncu_metrics" \
        "$gpu_bench" --model "$model" --model-only --no-gemm --steps 1 --warmup 3 \
        --batch "$run_batch" --precision "$precision" > "$build/ncu-$label-$precision.log" 2>&1
      "$python" perf/gpu/ncu_summary.py "$build/ncu-$label-$precision.log" \
        --label "ncu: $label nn::Model, $precision, batch $run_batch" 2>&1 | tee -a "$build/ncu.txt"
      echo | tee -a "$build/ncu.txt"
    done
  else
    echo "ncu: not on PATH (or no gpu_bench built), no kernel profile" | tee "$build/ncu.txt"
  fi
fi

# compute-sanitizer over the kernel twins: memcheck (out-of-bounds and misaligned accesses, and
# the exceptions the GPU reports), then racecheck (shared-memory hazards: the block reductions of
# softmax-xent, BatchNorm, bias, unscale-check and transpose, and the im2col convolution, share
# memory between threads). That the twins agree within tolerance does not show that no thread
# reads past a buffer or races another; these do. gpu_kernels as ctest runs it, every case
# isolated (tests/gpu/isolation.hpp) and every process followed, each case given 120 s of
# silence (the tools are slow). Last and optional: skipped past --budget, or where the toolkit
# has no compute-sanitizer. Its verdict is reported and fails nothing else: a tool that cannot
# start on this machine is no failed kernel.
if over_budget "compute-sanitizer"; then
  echo "compute-sanitizer: skipped (over the --budget of ${budget} s)" | tee -a "$build/sanitizer.log"
else
  stage "compute-sanitizer over gpu_kernels: memcheck, then racecheck"
  sanitizer=$(command -v compute-sanitizer)
  nvcc_dir=$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")
  [[ -z $sanitizer && -x $nvcc_dir/../compute-sanitizer/compute-sanitizer ]] &&
    sanitizer=$nvcc_dir/../compute-sanitizer/compute-sanitizer
  kernels_test=$build/tests/gpu/gpu_kernels
  if [[ -z $sanitizer || ! -x $kernels_test ]]; then
    echo "compute-sanitizer: not run ($([[ -z $sanitizer ]] && echo "not on PATH nor beside nvcc" ||
      echo "no gpu_kernels built"))" | tee -a "$build/sanitizer.log"
  else
    for tool in memcheck racecheck; do
      over_budget "compute-sanitizer $tool" && break
      rc=0
      MPT_GPU_CASE_TIMEOUT_S=120 tmo 120 "$sanitizer" --tool "$tool" --target-processes all \
        --print-limit 20 "$kernels_test" > "$build/sanitizer-$tool.log" 2>&1 || rc=$?
      echo "gpu_check: exit $rc" >> "$build/sanitizer-$tool.log"
      sanitizer_verdict "$tool" "$build/sanitizer-$tool.log"
    done
  fi
fi

completed=1
exit $(( ctest_rc != 0 ))
