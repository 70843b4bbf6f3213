#!/usr/bin/env bash
# The stall watchdog (--comm.stall-timeout, issue #9): a rank that hangs outside any collective
# (MPTRAIN_FAULT=stall) leaves the others waiting in the gradient all-reduce; the lowest waiting
# rank prints one line naming the rank(s) that have not arrived, with their step and phase, and
# the job exits 4 within seconds of the timeout, for one node and for emulated nodes, flat and
# hierarchical. A rank busy writing a checkpoint is waited for (a warning), not aborted; 0
# turns the watchdog off.
source "$(dirname "$0")/common.sh"
D="$TMP/data"
"$MPTRAIN" prepare synthetic --out "$D" --train-samples 2048 --test-samples 64 --shape 1,16,16 \
  --classes 10 --seed 5 >"$TMP/prepare.log"
# Every run is a fresh one into the same directory: --output.overwrite says so.
COMMON=(--data.train="$D/train.h5" --model.layers=dense:128,relu,dense:10 --train.batch-size=16
        --output.dir="$TMP/o" --output.overwrite)
TIMEOUT=2
LIMIT=30  # seconds from start to exit: the timeout, the census and the abort

# expect_stall NAME NP STALLED_RANK STEP ARGS...
expect_stall() {
  local name=$1 np=$2 stalled=$3 step=$4; shift 4
  local rc=0 start=$SECONDS
  MPTRAIN_FAULT="stall:$stalled:$step" timeout $((LIMIT * 2)) "$MPIEXEC" -n "$np" --oversubscribe \
    "$MPTRAIN" train "${COMMON[@]}" --train.max-steps=30 --comm.stall-timeout=$TIMEOUT "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  local took=$((SECONDS - start)) line
  if [ "$rc" -ne 4 ]; then fail "$name: exit code $rc, expected 4"; tail -5 "$TMP/err" >&2; return; fi
  if [ "$took" -gt "$LIMIT" ]; then fail "$name: took ${took}s"; return; fi
  line=$(grep 'watchdog: waited' "$TMP/err" || true)
  if [ "$(grep -c 'watchdog: waited' "$TMP/err")" -ne 1 ]; then
    fail "$name: expected one watchdog line, got: $line"; return
  fi
  # The culprit, its step and phase; no other rank among those that have not arrived.
  local absent=${line#*not arrived: }
  absent=${absent%%; aborting*}
  if [[ "$absent" != "rank $stalled (step $step, forward, outside any collective for "* ]] ||
     [[ "$absent" == *"), rank "* ]] || [[ "$line" != *"at step $step"* ]] ||
     [[ "$line" != *"--comm.stall-timeout=$TIMEOUT"* ]]; then
    fail "$name: the line does not name rank $stalled alone at step $step: $line"; return
  fi
  if [[ "$line" == *"[rank $stalled on"* ]]; then fail "$name: the stalled rank reported itself: $line"; return; fi
  pass "$name: exit 4 after ${took}s: ${line#*watchdog: }"
}

expect_stall "2 ranks, hierarchical shm" 2 1 5
expect_stall "2 ranks, flat-mpi, rank 0 stalls" 2 0 4 --comm.allreduce=flat-mpi
expect_stall "4 ranks, 2 emulated nodes, overlap on" 4 2 3 --comm.allreduce=hierarchical \
  --comm.ranks-per-node=2 --comm.overlap=on --comm.bucket-mb=0.01 --comm.first-bucket-mb=0.01
expect_stall "3 ranks, uneven nodes, hierarchical mpi" 3 2 6 --comm.allreduce=hierarchical \
  --comm.intra=mpi --comm.ranks-per-node=2

# Rank 0 writes each checkpoint 4.5 s longer than the 2 s timeout: the others wait, warned once
# per checkpoint, and training completes with both checkpoints loadable.
rc=0
MPTRAIN_FAULT=slow-checkpoint:0:4500 timeout 120 "$MPIEXEC" -n 2 "$MPTRAIN" train "${COMMON[@]}" \
  --train.max-steps=10 --comm.stall-timeout=2 --checkpoint.dir="$TMP/ck" --checkpoint.every-steps=5 \
  >"$TMP/out" 2>"$TMP/err" || rc=$?
warnings=$(grep -c 'watchdog: waited .* for rank 0 (step [0-9]*, checkpoint, .*still waiting' "$TMP/err" || true)
if [ "$rc" -eq 0 ] && [ "$warnings" -eq 2 ] && grep -q '^done: 10 steps' "$TMP/out" &&
   "$MPTRAIN" inspect "$TMP/ck/ckpt-10.h5" >"$TMP/inspect" 2>&1; then
  pass "a checkpoint longer than the timeout: waited, $warnings warnings, completed"
else
  fail "slow checkpoint: rc $rc, $warnings warnings"; tail -5 "$TMP/err" >&2
fi

# slow_rank_run TIMEOUT: 3 steps with rank 1 1.5 s late in every forward, under
# --comm.stall-timeout=TIMEOUT; sets rc.
slow_rank_run() {
  rc=0
  MPTRAIN_FAULT=slow-rank:1:1500 timeout 120 "$MPIEXEC" -n 2 "$MPTRAIN" train "${COMMON[@]}" \
    --train.max-steps=3 --comm.stall-timeout="$1" >"$TMP/out" 2>"$TMP/err" || rc=$?
}

# 0 turns the watchdog off: a rank 1.5 s late in every forward never trips it.
slow_rank_run 0
if [ "$rc" -eq 0 ] && ! grep -q watchdog "$TMP/err"; then
  pass "--comm.stall-timeout=0: no watchdog"
else
  fail "--comm.stall-timeout=0: rc $rc"; tail -3 "$TMP/err" >&2
fi
# ... while 1 s trips on the same run, naming rank 1's slow forward.
slow_rank_run 1
if [ "$rc" -eq 4 ] && grep -q 'not arrived: rank 1 (step 1, forward' "$TMP/err"; then
  pass "--comm.stall-timeout=1 trips on a 1.5 s forward"
else
  fail "--comm.stall-timeout=1 with a 1.5 s forward: rc $rc"; tail -3 "$TMP/err" >&2
fi

# A bad value is a user error naming the option, on every rank, before any step.
for bad in -1 nan abc; do
  rc=0
  timeout 60 "$MPIEXEC" -n 2 "$MPTRAIN" train "${COMMON[@]}" --train.max-steps=3 --comm.stall-timeout=$bad \
    >"$TMP/out" 2>"$TMP/err" || rc=$?
  if [ "$rc" -eq 2 ] && [ "$(grep -c 'comm.stall-timeout' "$TMP/err")" -ge 1 ]; then
    pass "--comm.stall-timeout=$bad: exit 2, $(grep -m1 -o 'comm.stall-timeout[^(]*' "$TMP/err" | head -n 1)"
  else
    fail "--comm.stall-timeout=$bad: rc $rc"; cat "$TMP/err" >&2
  fi
done

finish
