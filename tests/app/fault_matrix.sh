#!/usr/bin/env bash
# The fault-injection rows of docs/reliability.md that no other script covers (issue #11): a rank
# that exits (exit 1, no MPI_Finalize), aborts (SIGABRT) or whose reader fails with an I/O
# error at step 5, on 2 ranks and on 4 ranks over 2 emulated nodes. Each run must end on every
# rank within LIMIT seconds, non-zero, with a line that names the failing rank, no rank may
# report a finished run, and the newest checkpoint written before the fault (step 4) must verify
# and resume. The other rows (NaN gradients, a slow or stalled rank, a failure inside the
# all-reduce, SIGKILL during a checkpoint write, stop signals) have their own scripts.
source "$(dirname "$0")/common.sh"
ulimit -c 0  # the abort row must not leave core files behind
D="$TMP/data"
"$MPTRAIN" prepare synthetic --out "$D" --train-samples 2048 --test-samples 64 --shape 1,16,16 \
  --classes 10 --seed 11 >"$TMP/prepare.log"
COMMON=(--data.train="$D/train.h5" --model.layers=dense:128,relu,dense:10 --train.batch-size=16)
LIMIT=30

# expect_fault KIND NP RANK MESSAGE_REGEX ARGS...
expect_fault() {
  local kind=$1 np=$2 rank=$3 pattern=$4; shift 4
  local name="$kind on rank $rank of $np${1:+ ($*)}" w="$TMP/$kind-$np-$rank-$#" rc=0 start=$SECONDS
  MPTRAIN_FAULT="$kind:$rank:5" timeout $((LIMIT * 2)) "$MPIEXEC" -n "$np" --oversubscribe \
    "$MPTRAIN" train "${COMMON[@]}" --train.max-steps=30 --output.dir="$w/run" \
    --checkpoint.dir="$w/ckpt" --checkpoint.every-steps=2 "$@" \
    >"$w.out" 2>"$w.err" || rc=$?
  local took=$((SECONDS - start))
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$took" -gt "$LIMIT" ]; then
    fail "$name: exit $rc after ${took}s"; tail -5 "$w.err" >&2; return
  fi
  if grep -q '^done:' "$w.out"; then fail "$name: a rank reported a finished run"; return; fi
  if ! grep -Eq "$pattern" "$w.err"; then
    fail "$name: no line matching /$pattern/"; grep -v '^-*$' "$w.err" | head -5 >&2; return
  fi
  # The newest checkpoint before the fault verifies, and the run resumes from it.
  if ! "$MPTRAIN" inspect "$w/ckpt/ckpt-4.h5" >"$w.inspect" 2>&1 ||
     ! grep -qi "checksums: verified" "$w.inspect" || [ -e "$w/ckpt/ckpt-6.h5" ]; then
    fail "$name: ckpt-4.h5 missing or not verified"; ls "$w/ckpt" >&2; return
  fi
  if ! "$MPIEXEC" -n "$np" --oversubscribe "$MPTRAIN" train "${COMMON[@]}" --train.max-steps=8 \
      --output.dir="$w/resume" --checkpoint.dir="$w/ckpt" --resume=auto "$@" >"$w.resume" 2>&1 ||
     ! grep -q "^resumed from $w/ckpt/ckpt-4.h5: step 4" "$w.resume"; then
    fail "$name: no resume from ckpt-4.h5"; tail -3 "$w.resume" >&2; return
  fi
  pass "$name: exit $rc after ${took}s, '$(grep -Eo "$pattern" "$w.err" | head -n 1)', ckpt-4.h5 resumes"
}

for np in 2 4; do
  nodes=()
  [ "$np" -eq 4 ] && nodes=(--comm.ranks-per-node=2)
  expect_fault exit "$np" 1 'rank 1 on [^]]*\] injected exit at step 5' "${nodes[@]}"
  expect_fault abort "$np" $((np - 1)) "rank $((np - 1)) on [^]]*\] injected abort at step 5" "${nodes[@]}"
  expect_fault io-error "$np" 1 "rank 1 on [^]]*\] cannot read the samples of step 5 from '[^']*train.h5': Input/output error" "${nodes[@]}"
done
# The reader's error takes the same path with several I/O threads and with prefetch off.
expect_fault io-error 2 0 "rank 0 on [^]]*\] cannot read the samples of step 5" --data.io-threads=2
rc=0
MPTRAIN_FAULT=io-error:1:5 timeout $((LIMIT * 2)) "$MPIEXEC" -n 2 "$MPTRAIN" train "${COMMON[@]}" \
  --train.max-steps=30 --data.prefetch=0 --output.dir="$TMP/sync/run" >"$TMP/sync.out" 2>"$TMP/sync.err" || rc=$?
if [ "$rc" -eq 2 ] && grep -q 'rank 1 on .*cannot read the samples of step 5' "$TMP/sync.err"; then
  pass "io-error with --data.prefetch=0: exit 2, rank 1 named"
else
  fail "io-error with --data.prefetch=0: rc $rc"; tail -3 "$TMP/sync.err" >&2
fi

finish
