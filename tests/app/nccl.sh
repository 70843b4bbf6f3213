#!/usr/bin/env bash
# The nccl all-reduce backend (issue #8) where it cannot run: --comm.intra=nccl and
# --comm.allreduce=flat-nccl in a build without NCCL, or with the gradients on the cpu
# (--device=cpu, or auto on a machine without a GPU), end every rank within seconds with exit 2
# and one line that names the option and gives a hint; auto keeps training on the host backends.
# On a machine with a GPU the refusals are skipped (there nccl may run: perf/gpu_check.sh).
source "$(dirname "$0")/common.sh"

"$MPTRAIN" prepare synthetic --out "$TMP/data" --train-samples 256 --test-samples 64 >/dev/null
D="$TMP/data"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "note: a GPU is visible; the refusal cases are skipped"
  finish
  exit $?
fi
train_args=(train --data.train="$D/train.h5" --train.max-steps=2 --train.batch-size=32
            --output.progress=lines)

refused() {  # refused NAME NP OPTION ARGS...: exit 2, one error line naming OPTION with a hint
  local name=$1 np=$2 option=$3; shift 3
  local rc=0 start=$SECONDS
  timeout 60 "$MPIEXEC" -n "$np" --oversubscribe "$MPTRAIN" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  local took=$((SECONDS - start)) lines line
  lines=$(grep -c '^mptrain: error:' "$TMP/err" || true)
  if [ "$rc" -eq 124 ]; then fail "$name: timed out (a rank hung)"; return; fi
  if [ "$rc" -ne 2 ]; then fail "$name: exit $rc, expected 2 (user error)"; cat "$TMP/err" >&2; return; fi
  if [ "$took" -gt 20 ]; then fail "$name: took ${took}s"; return; fi
  if [ "$lines" -ne 1 ]; then fail "$name: $lines error lines, expected 1"; cat "$TMP/err" >&2; return; fi
  line=$(grep '^mptrain: error:' "$TMP/err")
  # Which reason depends on the build: no NCCL in it, or the gradients on the cpu.
  case "$line" in
    *"$option: this build has no NCCL"*hint:*|*"$option: the gradients are on the cpu"*hint:*)
      pass "$name: $line" ;;
    *) fail "$name: the error does not name $option with its reason and a hint: $line" ;;
  esac
}

for np in 1 2; do
  refused "--comm.intra=nccl np$np" "$np" --comm.intra=nccl \
    "${train_args[@]}" --comm.intra=nccl --output.dir="$TMP/a$np"
  refused "--comm.allreduce=flat-nccl np$np" "$np" --comm.allreduce=flat-nccl \
    "${train_args[@]}" --comm.allreduce=flat-nccl --output.dir="$TMP/b$np"
done
refused "--device=cpu --comm.intra=nccl np2" 2 --comm.intra=nccl \
  "${train_args[@]}" --device=cpu --comm.intra=nccl --comm.allreduce=hierarchical --output.dir="$TMP/c"
# The names nobody knows keep their one-line error, which now lists nccl.
rc=0
timeout 60 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" "${train_args[@]}" --comm.intra=nvlink \
  --output.dir="$TMP/d" >"$TMP/out" 2>"$TMP/err" || rc=$?
if [ "$rc" -eq 2 ] && [ "$(grep -c "^mptrain: error:.*--comm.intra: unknown backend 'nvlink' (hint: use auto, shm, mpi or nccl)" "$TMP/err")" -eq 1 ]; then
  pass "--comm.intra=nvlink refused once, nccl listed"
else
  fail "--comm.intra=nvlink: exit $rc"; cat "$TMP/err" >&2
fi
# auto on the cpu: the host backends, and the run log says which.
rc=0
timeout 120 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" "${train_args[@]}" --output.dir="$TMP/e" \
  >"$TMP/out" 2>"$TMP/err" || rc=$?
if [ "$rc" -ne 0 ]; then
  fail "auto np2: exit $rc"; cat "$TMP/err" >&2
elif grep -q '^allreduce hierarchical (intra shm' "$TMP/out" && ! grep -q nccl "$TMP/out"; then
  pass "auto np2 on the cpu: $(grep '^allreduce' "$TMP/out" | cut -c1-60)"
else
  fail "auto np2: unexpected backend: $(grep '^allreduce' "$TMP/out")"
fi

finish
