#!/usr/bin/env bash
# Packs the full CUDA trainer, built here, for a GPU machine that cannot build it (issue #8):
# the project's check machine has the CUDA toolkit, cuDNN, NCCL and PyTorch but no Boost, Kokkos,
# parallel HDF5 or oneDNN, and no package registry, so perf/gpu_check.sh would build only the
# GPU-only subset there and skip every trainer run. This writes one archive holding mptrain,
# gpu_prefetcher, gpu_nccl_allreduce and gpu_world_refusal, every shared library they load except glibc's and
# CUDA's (those come from the GPU machine), and a relocatable Open MPI runtime (mpiexec, its
# components and help files, moved with OPAL_PREFIX). gpu_check.sh unpacks it when its own build
# lacks the trainer. Run here, on Debian with the stack installed (launch/install-deps.sh), then
# carry the output folder to the GPU machine.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: perf/gpu_bundle.sh [--build-dir DIR] [--out DIR] [--archs LIST] [--jobs J] [--level N] [--no-build]
  --build-dir D  CUDA build folder, configured here if it is not (default build/gpu-bundle)
  --out D        where the archive goes (default .gpu-bundle, ignored by git)
  --archs LIST   CMAKE_CUDA_ARCHITECTURES for a new build folder (default 90: the H200)
  --jobs J       build jobs (default: all cores)
  --level N      xz preset, 0-9 (default 6: about 25 MB; 0 is faster and larger)
  --no-build     pack the binaries as they are (tests/app/gpu_bundle.sh)
Writes OUT/mptrain-bundle.tar.xz. perf/gpu_check.sh finds it there by default.
USAGE
}

build=build/gpu-bundle
out=.gpu-bundle
archs=90
jobs=$(nproc 2>/dev/null || echo 2)
level=6
build_step=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --archs) archs=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --level) level=$2; shift 2 ;;
    --no-build) build_step=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_bundle.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

[[ $level =~ ^[0-9]$ ]] || { echo "gpu_bundle.sh: --level must be 0-9, not '$level'" >&2; exit 2; }

cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/cuda/bin
command -v nvcc >/dev/null || { echo "gpu_bundle.sh: nvcc not found; hint: install the CUDA toolkit" >&2; exit 1; }
ompi_pkglibdir=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n "s/^path:pkglibdir://p")
[[ -n $ompi_pkglibdir ]] || { echo "gpu_bundle.sh: ompi_info not found; hint: bash launch/install-deps.sh" >&2; exit 1; }

if [[ ! -f $build/CMakeCache.txt ]]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DMPTRAIN_ENABLE_CUDA=ON \
    "-DCMAKE_CUDA_ARCHITECTURES=$archs" -DMPTRAIN_ENABLE_BENCHMARKS=OFF > "$build.configure.log"
fi
if ! grep -q '^MPTRAIN_GPU_ONLY_BUILD:INTERNAL=OFF' "$build/CMakeCache.txt" \
    || ! grep -q '^MPTRAIN_NCCL_BUILD:INTERNAL=ON' "$build/CMakeCache.txt"; then
  echo "gpu_bundle.sh: $build is not a full CUDA build with NCCL; hint: bash launch/install-deps.sh," \
       "then remove $build" >&2
  exit 1
fi
binaries=(mptrain gpu_prefetcher gpu_nccl_allreduce gpu_world_refusal)
if (( build_step )); then
  cmake --build "$build" -j "$jobs" --target "${binaries[@]}"
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/mptrain-bundle
mkdir -p "$root/bin" "$root/lib/fallback"
cp "$build/mptrain" "$build/tests/gpu/gpu_prefetcher" "$build/tests/gpu/gpu_nccl_allreduce" \
  "$build/tests/gpu/gpu_world_refusal" "$root/bin/"

# Open MPI laid out as Debian installs it, under a prefix that OPAL_PREFIX moves: the
# launcher, its components (dlopen'ed, so ldd of the binaries does not list them), help files
# and the site's MCA defaults.
mpi=$root/openmpi
pkglib=${ompi_pkglibdir#/usr/}
mkdir -p "$mpi/bin" "$mpi/$pkglib" "$mpi/share" "$mpi/etc"
cp "$(readlink -f "$(command -v orterun)")" "$mpi/bin/orterun"
ln -s orterun "$mpi/bin/mpiexec"
cp "$(readlink -f "$(command -v orted)")" "$mpi/bin/orted"
cp "$(readlink -f "$(command -v ompi_info)")" "$mpi/bin/ompi_info"
cp -r "/usr/$pkglib/." "$mpi/$pkglib/"
cp -r /usr/share/openmpi "$mpi/share/"
cp -r /etc/openmpi "$mpi/etc/"
# Debian's Open MPI uses the external PMIx, whose components and help files move with
# PMIX_PREFIX the same way.
libpmix=$(ldd "$mpi/$pkglib"/*.so 2>/dev/null | awk '$1 ~ /^libpmix/ && $3 ~ /^\// {print $3}' | head -1 || true)
pmix_prefix=
[[ -n $libpmix ]] && pmix_prefix=$(dirname "$(dirname "$(readlink -f "$libpmix")")")
if [[ -n $pmix_prefix && -d $pmix_prefix/lib/pmix ]]; then
  mkdir -p "$root/pmix/lib"
  cp -r "$pmix_prefix/lib/pmix" "$root/pmix/lib/"
  cp -r "$pmix_prefix/share" "$root/pmix/"
fi

# Every library the binaries and components load, resolved here, except the C library's own
# (the GPU machine's glibc is at least as new) and CUDA's (the GPU machine's toolkit, cuDNN
# and NCCL must match its driver). libstdc++ and libgcc_s go to lib/fallback: the GPU machine's
# newer ones are used unless they lack a symbol version these need (env.sh decides).
elves=("$root"/bin/* "$mpi"/bin/orterun "$mpi"/bin/orted "$mpi"/bin/ompi_info "$mpi/$pkglib"/*.so)
[[ -d $root/pmix ]] && mapfile -t -O "${#elves[@]}" elves < <(find "$root/pmix" -name '*.so')
system='^(linux-vdso|ld-linux-x86-64|libc|libm|libpthread|librt|libdl|libresolv|libutil|libanl)\.so'
cuda='^(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvidia-[a-z-]*|libnvrtc|libnvJitLink)\.so'
ldd "${elves[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r soname path; do
    [[ $soname =~ $system || $soname =~ $cuda ]] && continue
    destination=$root/lib
    [[ $soname =~ ^(libstdc\+\+|libgcc_s)\.so ]] && destination=$root/lib/fallback
    [[ -e $destination/$soname ]] || cp -L "$path" "$destination/$soname"
  done
missing=$(ldd "${elves[@]}" 2>/dev/null | grep -v -E 'libcuda|libcudart|libcublas|libcudnn|libnccl' \
  | grep "not found" || true)
[[ -z $missing ]] || { echo "gpu_bundle.sh: unresolved libraries here:" >&2; echo "$missing" >&2; exit 1; }

cat > "$root/env.sh" <<'ENV'
# Sourced by perf/gpu_check.sh (or by hand) on the GPU machine: put the bundle's binaries and
# libraries first, and move Open MPI to it. Append the GPU machine's CUDA library folders to
# LD_LIBRARY_PATH after sourcing, where they are not on the loader's default path.
bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX=$bundle/openmpi
export OPAL_SYSCONFDIR=$bundle/openmpi/etc/openmpi
# Debian's PMIx has absolute install folders: name each one it reads.
if [[ -d $bundle/pmix ]]; then
  export PMIX_PREFIX=$bundle/pmix PMIX_LIBDIR=$bundle/pmix/lib PMIX_PKGLIBDIR=$bundle/pmix/lib/pmix
  export PMIX_DATADIR=$bundle/pmix/share PMIX_PKGDATADIR=$bundle/pmix/share/pmix
fi
export PATH=$bundle/bin:$bundle/openmpi/bin:$PATH
export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The GPU machine's libstdc++ is normally newer; fall back to the bundle's where it is not.
if LD_LIBRARY_PATH=$LD_LIBRARY_PATH ldd "$bundle/bin/mptrain" 2>&1 | grep -q "version .\(GLIBCXX\|CXXABI\|GCC\)_"; then
  export LD_LIBRARY_PATH=$bundle/lib/fallback:$LD_LIBRARY_PATH
fi
# One node and maybe no ssh: mpiexec starts the ranks itself (plm isolated), and a rank started
# without mpiexec (mptrain prepare) starts no daemon. No InfiniBand or CMA in a small VM: shared
# memory with plain copies.
export OMPI_MCA_plm=isolated OMPI_MCA_ess_singleton_isolated=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ENV

{
  echo "mptrain bundle from commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo '+changes')"
  # shellcheck disable=SC1091  # the build machine's own release file
  echo "built $(date -u '+%Y-%m-%d %H:%M UTC') on $(. /etc/os-release && echo "$PRETTY_NAME"), CUDA architectures $(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")"
  echo "nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'); $(sed -n 's/^FIND_PACKAGE_MESSAGE_DETAILS_CUDNN:INTERNAL=.*\[v\(.*\)()\]/cuDNN \1/p' "$build/CMakeCache.txt"); $(sed -n 's/^FIND_PACKAGE_MESSAGE_DETAILS_NCCL:INTERNAL=.*\[v\(.*\)()\]/NCCL \1/p' "$build/CMakeCache.txt")"
} > "$root/MANIFEST"

mkdir -p "$out"
tar -C "$stage" -cf - mptrain-bundle | xz -T0 "-$level" > "$out/mptrain-bundle.tar.xz.tmp"
mv "$out/mptrain-bundle.tar.xz.tmp" "$out/mptrain-bundle.tar.xz"
cat "$root/MANIFEST"
echo "wrote $out/mptrain-bundle.tar.xz ($(du -h "$out/mptrain-bundle.tar.xz" | cut -f1); $(du -sh "$root" | cut -f1) unpacked)"
