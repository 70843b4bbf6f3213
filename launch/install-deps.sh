#!/usr/bin/env bash
# Installs (or checks) the Debian packages that mptrain needs to build, test and benchmark.
# Idempotent: when everything is present it prints one line and exits 0 without touching apt.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch/install-deps.sh [--check] [--no-torch] [--help]

Checks the Debian 12 packages mptrain needs and installs the missing ones with apt-get.

  --check      only report what is missing; never install (exit 1 if anything is missing)
  --no-torch   skip python3-torch (large; only perf/compare_pytorch.sh needs it).
               Same as MPTRAIN_SKIP_TORCH=1. tests/run.sh and launch/quickstart.sh use it.
  -h, --help   show this help

Exit status: 0 when everything is installed (or was just installed), 1 when something is
missing and could not be installed (not root, --check, or not a Debian system).
EOF
}

check_only=0
skip_torch=0
[[ "${MPTRAIN_SKIP_TORCH:-0}" == 1 ]] && skip_torch=1
for arg in "$@"; do
  case "$arg" in
    --check) check_only=1 ;;
    --no-torch) skip_torch=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install-deps: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done

# Debian package -> how a cluster user gets the same thing (module / Spack spec).
declare -A cluster_name=(
  [build-essential]="a C++20 compiler: module load gcc (>= 11) / spack: gcc"
  [cmake]="module load cmake (>= 3.25) / spack: cmake"
  [pkg-config]="spack: pkgconf"
  [libopenmpi-dev]="module load openmpi / spack: openmpi (any MPI-3 library works)"
  [openmpi-bin]="module load openmpi / spack: openmpi (or use srun)"
  [libhdf5-openmpi-dev]="module load hdf5 (parallel build) / spack: hdf5+mpi"
  [hdf5-tools]="module load hdf5 / spack: hdf5+mpi (h5dump, h5ls)"
  [libboost-program-options-dev]="module load boost / spack: boost+program_options"
  [libtrilinos-kokkos-dev]="module load kokkos / spack: kokkos"
  [libdnnl-dev]="module load onednn / spack: onednn"
  [ocl-icd-opencl-dev]="the OpenCL headers and loader that Debian's oneDNN CMake package requires (a recommends, which --no-install-recommends skips): spack: opencl-c-headers ocl-icd"
  [libopenblas-dev]="module load openblas / spack: openblas"
  [zlib1g-dev]="spack: zlib"
  [libgtest-dev]="spack: googletest"
  [libgmock-dev]="spack: googletest"
  [googletest]="spack: googletest"
  [libbenchmark-dev]="spack: benchmark"
  [clang]="module load llvm (clang >= 14) / spack: llvm; only tests/fuzz.sh needs it"
  [libclang-rt-14-dev]="the libFuzzer and sanitizer runtimes of clang: spack: llvm (compiler-rt); only tests/fuzz.sh needs it"
  [libomp-14-dev]="clang's OpenMP runtime: spack: llvm-openmp; only tests/fuzz.sh (a clang build) needs it"
  [llvm-14]="llvm-symbolizer for readable sanitizer stack traces: spack: llvm; only tests/fuzz.sh uses it"
  [dataset-fashion-mnist]="download the four *-ubyte.gz files of github.com/zalandoresearch/fashion-mnist and pass their folder to 'mptrain prepare fashion-mnist --source DIR'"
  [xz-utils]="xz, from any package manager; only perf/gpu_bundle.sh (and its test gpu_bundle_e2e) uses it"
  [python3-h5py]="spack: py-h5py (or pip install h5py)"
  [python3-numpy]="spack: py-numpy (or pip install numpy)"
  [python3-torch]="spack: py-torch (or pip install torch); only perf/compare_pytorch.sh needs it"
  [python3-matplotlib]="spack: py-matplotlib (or pip install matplotlib); only perf/scaling_study.py and perf/sim/scaling_sim.py need it"
  [libsimgrid-dev]="spack: simgrid; only perf/sim (SMPI all-reduce simulation) and the test sim_allreduce_check need it"
  [simgrid]="spack: simgrid (smpicxx, smpirun); only perf/sim and sim_allreduce_check need it"
)

packages=(
  build-essential cmake pkg-config
  libopenmpi-dev openmpi-bin
  libhdf5-openmpi-dev hdf5-tools
  libboost-program-options-dev libtrilinos-kokkos-dev libdnnl-dev ocl-icd-opencl-dev libopenblas-dev
  zlib1g-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  clang libclang-rt-14-dev libomp-14-dev llvm-14
  dataset-fashion-mnist
  xz-utils
  python3-h5py python3-numpy python3-matplotlib
  libsimgrid-dev simgrid
)
((skip_torch)) || packages+=(python3-torch)

print_cluster_hints() {
  local pkg
  echo "On a cluster without apt, get the equivalents from modules or Spack:" >&2
  for pkg in "$@"; do
    printf '  %-30s %s\n' "$pkg" "${cluster_name[$pkg]}" >&2
  done
  echo "Then build with 'cmake --preset release' and run the tests with" >&2
  echo "'MPTRAIN_SKIP_INSTALL=1 tests/run.sh'." >&2
}

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-deps: dpkg-query not found: this is not a Debian system, so nothing can be" \
    "checked or installed here." >&2
  print_cluster_hints "${packages[@]}"
  exit 1
fi

missing=()
for pkg in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done

torch_note=""
((skip_torch)) && torch_note=" (python3-torch skipped)"
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages are installed${torch_note}."
  exit 0
fi

apt_command="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
if ((check_only)) || [[ "$(id -u)" -ne 0 ]]; then
  echo "install-deps: ${#missing[@]} of ${#packages[@]} packages are missing${torch_note}:" >&2
  echo "  ${missing[*]}" >&2
  echo "Install them as root with:" >&2
  echo "  $apt_command" >&2
  if ((!check_only)); then
    echo "(not running as root, so nothing was installed)" >&2
  fi
  print_cluster_hints "${missing[@]}"
  exit 1
fi

echo "install-deps: installing ${#missing[@]} missing packages${torch_note}: ${missing[*]}"
start=$SECONDS
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
echo "install-deps: installed ${#missing[@]} packages in $((SECONDS - start)) s."
