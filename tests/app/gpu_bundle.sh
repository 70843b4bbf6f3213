#!/usr/bin/env bash
# perf/gpu_bundle.sh (issue #8): the archive that carries the full CUDA trainer to a GPU machine
# without Boost, Kokkos, parallel HDF5 or Open MPI. Packs this build, unpacks it, and checks
# that under its env.sh every library the binaries and Open MPI's components load resolves
# inside the bundle (or is glibc's or CUDA's, which the GPU machine provides), that Open MPI
# is moved to the bundle, and that the bundled mpiexec and mptrain train two ranks to the same
# loss as this build's own binary. Registered only in CUDA builds with NCCL.
source "$(dirname "$0")/common.sh"
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$(dirname "$MPTRAIN")

# Its own errors: one line naming what is wrong, exit 2 for an option and 1 for a build
# folder that cannot make a bundle (a GPU-only one here).
rc=0
bash "$repo/perf/gpu_bundle.sh" --level x > "$TMP/err" 2>&1 || rc=$?
if [ "$rc" -eq 2 ] && grep -q "^gpu_bundle.sh: --level must be 0-9, not 'x'" "$TMP/err"; then
  pass "--level x: exit 2, $(head -1 "$TMP/err")"
else
  fail "--level x: exit $rc: $(head -2 "$TMP/err")"
fi
mkdir -p "$TMP/gpu-only"
echo "MPTRAIN_GPU_ONLY_BUILD:INTERNAL=ON" > "$TMP/gpu-only/CMakeCache.txt"
rc=0
bash "$repo/perf/gpu_bundle.sh" --build-dir "$TMP/gpu-only" --out "$TMP/none" > "$TMP/err" 2>&1 || rc=$?
if [ "$rc" -eq 1 ] && grep -q "is not a full CUDA build with NCCL; hint:" "$TMP/err" && [ ! -e "$TMP/none" ]; then
  pass "a GPU-only build folder: exit 1, $(head -1 "$TMP/err")"
else
  fail "a GPU-only build folder: exit $rc: $(head -2 "$TMP/err")"
fi

rc=0
bash "$repo/perf/gpu_bundle.sh" --build-dir "$build" --out "$TMP/out" --no-build --level 0 \
  > "$TMP/pack.log" 2>&1 || rc=$?
if [ "$rc" -ne 0 ] || [ ! -f "$TMP/out/mptrain-bundle.tar.xz" ]; then
  fail "gpu_bundle.sh exited $rc: $(tail -3 "$TMP/pack.log")"
  finish
  exit 1
fi
pass "packed: $(tail -1 "$TMP/pack.log")"
mkdir -p "$TMP/unpacked"
tar -C "$TMP/unpacked" -xJf "$TMP/out/mptrain-bundle.tar.xz"
b=$TMP/unpacked/mptrain-bundle
for file in bin/mptrain bin/gpu_prefetcher bin/gpu_nccl_allreduce bin/gpu_world_refusal \
  openmpi/bin/mpiexec env.sh MANIFEST; do
  [ -e "$b/$file" ] || fail "the bundle has no $file"
done
grep -q "^mptrain bundle from commit " "$b/MANIFEST" && pass "MANIFEST: $(head -1 "$b/MANIFEST")" \
  || fail "MANIFEST does not name the commit"

# in_bundle CMD...: CMD in the bundle's environment, as perf/gpu_check.sh runs it.
in_bundle() { (source "$b/env.sh" && "$@"); }

# Self-contained: each library resolves inside the bundle, or is one the GPU machine brings.
# (libstdc++ and libgcc_s are the machine's too, unless older than the bundle's fallback copies.)
system='^(linux-vdso|ld-linux-x86-64|libc|libm|libpthread|librt|libdl|libresolv|libutil|libanl|libstdc\+\+|libgcc_s)\.so'
cuda='^(libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnccl|libnvidia-[a-z-]*|libnvrtc|libnvJitLink)\.so'
mapfile -t elves < <(find "$b/bin" "$b/openmpi" "$b/pmix" -type f \( -name '*.so' -o -perm -u+x \) 2>/dev/null)
outside=0
checked=0
while read -r soname arrow path _; do
  [ "$arrow" = "=>" ] || continue
  checked=$((checked + 1))
  [[ $path == "$b"/* || $soname =~ $system || $soname =~ $cuda ]] && continue
  outside=$((outside + 1))
  echo "  outside the bundle: $soname => $path" >&2
done < <(in_bundle ldd "${elves[@]}" 2>/dev/null | sort -u)
if [ "$checked" -gt 100 ] && [ "$outside" -eq 0 ]; then
  pass "all $checked resolved libraries of ${#elves[@]} files are the bundle's, glibc's or CUDA's"
else
  fail "$outside of $checked resolved libraries come from this machine, not the bundle"
fi

prefix=$(in_bundle ompi_info --path prefix --parsable | sed -n 's/^path:prefix://p')
[ "$prefix" = "$b/openmpi" ] && pass "Open MPI moved: prefix $prefix" \
  || fail "ompi_info in the bundle says prefix '$prefix', expected $b/openmpi"
launcher=$(in_bundle bash -c 'command -v mpiexec')
[ "$launcher" = "$b/openmpi/bin/mpiexec" ] && pass "mpiexec is the bundle's" \
  || fail "mpiexec in the bundle's environment is $launcher"

# Two ranks under the bundled launcher, then under this build's: the same binary, data and seed.
"$MPTRAIN" prepare synthetic --out "$TMP/data" --train-samples 512 --test-samples 128 --seed 3 >/dev/null
train=(train --data.train="$TMP/data/train.h5" --model.name=mlp --train.max-steps=6
       --train.batch-size=32 --device=cpu --output.progress=lines --output.overwrite)
rc=0
in_bundle timeout 120 mpiexec -n 2 --oversubscribe "$b/bin/mptrain" "${train[@]}" \
  --output.dir="$TMP/bundled" > "$TMP/bundled.log" 2>&1 || rc=$?
mpirun_n 2 "$MPTRAIN" "${train[@]}" --output.dir="$TMP/built" > "$TMP/built.log" 2>&1
loss() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["final_train_loss"])' "$1"; }
if [ "$rc" -ne 0 ] || [ ! -f "$TMP/bundled/summary.json" ]; then
  fail "bundled mpiexec -n 2 mptrain train exited $rc: $(grep -m3 -i -E 'error|fail' "$TMP/bundled.log")"
elif [ "$(loss "$TMP/bundled/summary.json")" = "$(loss "$TMP/built/summary.json")" ]; then
  pass "bundled 2-rank training: final loss $(loss "$TMP/bundled/summary.json"), as built"
else
  fail "bundled loss $(loss "$TMP/bundled/summary.json") != built $(loss "$TMP/built/summary.json")"
fi

# The GPU tests start under the bundled launcher: they run, or skip (exit 77) without a GPU.
# gpu_world_refusal as perf/gpu_check.sh runs it: 2 ranks, and on a GPU it ends the job.
for test in gpu_prefetcher gpu_nccl_allreduce gpu_world_refusal; do
  command=(mpiexec -n 1 "$b/bin/$test")
  [[ $test == gpu_world_refusal ]] && command=(mpiexec -n 2 --oversubscribe "$b/bin/$test" allreduce)
  rc=0
  in_bundle timeout 120 "${command[@]}" > "$TMP/$test.log" 2>&1 || rc=$?
  if { [ "$rc" -eq 77 ] && grep -q "^SKIPPED: " "$TMP/$test.log"; } \
      || { [ "$rc" -eq 0 ] && grep -q " passed, 0 failed" "$TMP/$test.log"; } \
      || { [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "needs a host tensor" "$TMP/$test.log"; }; then
    pass "bundled $test: exit $rc, $(grep -m1 -E '^SKIPPED|passed, 0 failed|needs a host tensor' "$TMP/$test.log")"
  else
    fail "bundled $test: exit $rc: $(grep -v '^-\|^$' "$TMP/$test.log" | head -3)"
  fi
done
finish
