#!/usr/bin/env bash
# A rank that fails in the middle of the gradient all-reduce (MPTRAIN_FAULT=comm-error: a
# clean abort with a message; comm-crash: SIGKILL, no message) while its peers wait for it inside
# a bucket's collective: every rank must exit non-zero within seconds, for flat-mpi and for
# hierarchical with shm and mpi, on one node and on emulated nodes.
source "$(dirname "$0")/common.sh"
D="$TMP/data"
"$MPTRAIN" prepare synthetic --out "$D" --train-samples 2048 --test-samples 64 --shape 1,16,16 \
  --classes 10 --seed 3 >"$TMP/prepare.log"
LIMIT=30  # seconds: a hang shows as the timeout's 124

# expect_comm_fault NAME KIND NP ARGS...
expect_comm_fault() {
  local name=$1 kind=$2 np=$3; shift 3
  local rc=0 start=$SECONDS
  MPTRAIN_FAULT="$kind:1:3" timeout $((LIMIT * 2)) "$MPIEXEC" -n "$np" --oversubscribe "$MPTRAIN" train \
    --data.train="$D/train.h5" --model.layers=dense:256,relu,dense:256,relu,dense:10 \
    --train.batch-size=16 --train.max-steps=20 --comm.bucket-mb=0.1 --comm.first-bucket-mb=0.01 \
    --output.dir="$TMP/o" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  local took=$((SECONDS - start))
  if [ "$rc" -eq 0 ]; then fail "$name: exit code 0"; return; fi
  if [ "$rc" -eq 124 ] || [ "$took" -gt "$LIMIT" ]; then fail "$name: took ${took}s (rc $rc): a rank hung"; return; fi
  if grep -q '^done:' "$TMP/out"; then fail "$name: a rank finished training"; return; fi
  if [ "$kind" = comm-error ]; then
    local lines
    lines=$(grep -c 'injected failure in the gradient all-reduce at step 3' "$TMP/err" || true)
    if [ "$lines" -ne 1 ]; then fail "$name: $lines injected-failure lines, expected 1"; cat "$TMP/err" >&2; return; fi
    if ! grep -q 'rank 1 on' "$TMP/err"; then fail "$name: the message does not name rank 1"; cat "$TMP/err" >&2; return; fi
  fi
  pass "$name: exit $rc after ${took}s"
}

for kind in comm-error comm-crash; do
  expect_comm_fault "$kind, 2 ranks, flat-mpi" $kind 2 --comm.allreduce=flat-mpi --comm.overlap=on
  expect_comm_fault "$kind, 4 ranks, hierarchical shm, 2 nodes" $kind 4 --comm.allreduce=hierarchical \
    --comm.intra=shm --comm.ranks-per-node=2 --comm.overlap=on
  expect_comm_fault "$kind, 3 ranks, hierarchical mpi, uneven nodes" $kind 3 --comm.allreduce=hierarchical \
    --comm.intra=mpi --comm.ranks-per-node=2 --comm.overlap=on
done
# Without overlap the buckets go out after backward; the fault strikes after the first one.
expect_comm_fault "comm-error, 2 ranks, hierarchical shm, one node, fp16 wire, overlap off" comm-error 2 \
  --comm.allreduce=hierarchical --comm.wire-dtype=fp16 --comm.overlap=off
expect_comm_fault "comm-crash, 4 ranks, hierarchical shm, 2 nodes, overlap off" comm-crash 4 \
  --comm.allreduce=hierarchical --comm.ranks-per-node=2 --comm.overlap=off

finish
