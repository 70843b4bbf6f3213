#!/usr/bin/env bash
# Builds mptrain and runs the whole CTest suite: the one command CI (.ci/run) and developers use.
# Works from any directory and from a fresh clone; exits with CTest's status.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: tests/run.sh [--asan] [--preset NAME] [--e2e|--no-e2e] [--cuda-emu|--no-cuda-emu] [--help]
                    [-- CTEST_ARGS...]

Installs missing Debian packages (launch/install-deps.sh --no-torch), configures and builds
with a CMake preset, then runs CTest: serial tests (label 'unit') two at a time, MPI tests
(label 'mpi', which oversubscribe the cores) one at a time.

  --asan          use the debug-asan preset (AddressSanitizer + LeakSanitizer + UBSan, leaks
                  of the MPI stack suppressed: tests/sanitizers/lsan.supp) instead of release;
                  runs the unit and MPI GoogleTest suites, not the end-to-end scripts
  --e2e, --no-e2e run (or skip) the end-to-end scripts (label 'e2e'); default: run them,
                  except with --asan
  --cuda-emu, --no-cuda-emu
                  then build the cuda-emu preset (the CUDA kernels as host C++ on the emulator
                  in tests/cudaemu) and run its 'gpu' label: every CUDA kernel against its host
                  twin, the models and mptrain train --device=cuda on the emulated device
                  (docs/testing.md); default: with the release preset, where the CUDA
                  toolkit's headers are found
  --preset NAME   use any preset from CMakePresets.json (release, debug, debug-asan, cpu-only)
  -- ARGS         pass the remaining arguments to both ctest calls, e.g. -- -R json

Environment:
  MPTRAIN_SKIP_INSTALL=1   do not call launch/install-deps.sh (clusters: load modules instead)
  MPTRAIN_TEST_JOBS=N      parallel serial tests (default 2); MPI tests always run one at a time
EOF
}

preset=release
e2e=""
cuda_emu=""
ctest_args=()
while (($#)); do
  case "$1" in
    --asan) preset=debug-asan ;;
    --preset)
      [[ $# -ge 2 ]] || { echo "tests/run.sh: --preset needs a name" >&2; exit 2; }
      preset=$2
      shift
      ;;
    --preset=*) preset=${1#--preset=} ;;
    --e2e) e2e=1 ;;
    --no-e2e) e2e=0 ;;
    --cuda-emu) cuda_emu=1 ;;
    --no-cuda-emu) cuda_emu=0 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; ctest_args=("$@"); break ;;
    *) echo "tests/run.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

# Open MPI refuses to start as root without these; CI and the dev containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE may be set on purpose by the environment: leave them be.

# GNU nproc reports OMP_NUM_THREADS when it is set; the build wants the real core count.
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
start=$SECONDS
phase_start=$SECONDS
current=setup
phase() {
  echo "tests/run.sh: $current done in $((SECONDS - phase_start)) s"
  phase_start=$SECONDS
  current=$1
}
# A clear last line whatever fails: dependencies, configure, build or tests.
# shellcheck disable=SC2317  # invoked by the EXIT trap
finish() {
  local status=$?
  if ((status == 0)); then
    echo "tests/run.sh: PASSED (preset $preset, $((SECONDS - start)) s total)"
  else
    echo "tests/run.sh: FAILED in $current (preset $preset, exit $status, $((SECONDS - start)) s total)"
  fi
}
trap finish EXIT

echo "tests/run.sh: preset=$preset, $cores cores, repo $repo_root${CI:+ (CI)}"
if [[ -n "${CI:-}" ]]; then
  cmake --version | head -n 1
  mpirun --version 2>/dev/null | head -n 1 || true
  env | grep -E '^(OPENBLAS_|OMP_)' || true
fi
if [[ "${MPTRAIN_SKIP_INSTALL:-0}" != 1 ]]; then
  current=dependencies
  launch/install-deps.sh --no-torch
  phase configure
else
  current=configure
fi

cmake --preset "$preset"
phase build
cmake --build --preset "$preset" -j"$cores"
phase tests

jobs=${MPTRAIN_TEST_JOBS:-2}
status=0
echo "tests/run.sh: serial tests (-j$jobs)"
ctest --preset "$preset" -LE mpi -j"$jobs" ${ctest_args[@]+"${ctest_args[@]}"} || status=$?
[[ -n "$e2e" ]] || { [[ "$preset" == debug-asan ]] && e2e=0 || e2e=1; }
mpi_filter=(-L mpi)
((e2e)) || mpi_filter+=(-LE e2e)
echo "tests/run.sh: MPI tests (-j1)$( ((e2e)) || echo ', end-to-end scripts skipped')"
ctest --preset "$preset" "${mpi_filter[@]}" -j1 ${ctest_args[@]+"${ctest_args[@]}"} || { rc=$?; ((status)) || status=$rc; }
echo "tests/run.sh: tests done in $((SECONDS - phase_start)) s"

# The CUDA code on the emulator (cmake/MptrainCudaEmulation.cmake): needs the toolkit's headers
# only, no GPU and no nvcc run. Where they are missing, say so: that is a skip, not a pass.
[[ -n "$cuda_emu" ]] || { [[ "$preset" == release ]] && cuda_emu=1 || cuda_emu=0; }
if ((cuda_emu)); then
  cuda_include=""
  for dir in ${CUDA_HOME:+"$CUDA_HOME/include"} /usr/local/cuda/include /usr/include; do
    [[ -f "$dir/cuda_runtime_api.h" && -f "$dir/cublasLt.h" ]] && { cuda_include=$dir; break; }
  done
  if [[ -z "$cuda_include" ]]; then
    echo "tests/run.sh: CUDA emulator SKIPPED: no CUDA toolkit headers (cuda_runtime_api.h, cublasLt.h)"
  else
    current="cuda-emu build"
    phase_start=$SECONDS
    echo "tests/run.sh: the CUDA kernels on the emulator (preset cuda-emu, headers in $cuda_include)"
    cmake --preset cuda-emu >/dev/null
    cmake --build --preset cuda-emu -j"$cores"
    phase "cuda-emu tests"
    ctest --preset cuda-emu -L gpu ${ctest_args[@]+"${ctest_args[@]}"} || { rc=$?; ((status)) || status=$rc; }
    echo "tests/run.sh: cuda-emu done in $((SECONDS - phase_start)) s"
  fi
fi
exit "$status"
