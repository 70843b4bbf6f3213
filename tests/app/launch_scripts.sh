#!/usr/bin/env bash
# The launch scripts (issue #7): every one parses (and passes shellcheck where it is installed);
# launch/mpirun-train.sh turns a SIGTERM into a clean stop with a checkpoint, and a second run
# resumes from it and completes; launch/slurm/train.sbatch, with stand-ins for srun and
# scontrol, forwards its USR1 to the ranks and requeues itself after it or after the
# SLURM_JOB_END_TIME deadline, and not after a SIGTERM (scancel) or a completed run.
source "$(dirname "$0")/common.sh"
REPO=$(cd "$(dirname "$0")/../.." && pwd)
D="$TMP/data"
MAX_STEPS=400
# Each batch read sleeps 20 ms, so a run of MAX_STEPS steps lasts about 8 s: long enough to be
# interrupted, short enough to complete. Log every 10 steps: the first logged step after a
# resume shows where the run started.
TRAIN_ARGS=(--data.train="$D/train.h5" "--model.layers=dense:32,relu,dense:10" --train.epochs=100
  --train.batch-size=16 --train.max-steps="$MAX_STEPS" --train.log-every=10
  --data.debug-read-delay-ms=20 --checkpoint.every-steps=100)
# A Slurm job around the test must not lend its deadline to these runs.
unset SLURM_JOB_END_TIME SLURM_JOB_ID SLURM_RESTART_COUNT

# --- 1. every launch script parses ---------------------------------------------------------------
scripts=("$REPO"/launch/*.sh "$REPO"/launch/slurm/*.sbatch)
for s in "${scripts[@]}"; do
  bash -n "$s" && pass "bash -n ${s#"$REPO"/}" || fail "bash -n ${s#"$REPO"/}"
done
if command -v shellcheck >/dev/null; then
  shellcheck "${scripts[@]}" >"$TMP/shellcheck.log" 2>&1 && pass "shellcheck launch/" ||
    { fail "shellcheck launch/"; cat "$TMP/shellcheck.log" >&2; }
else
  echo "skip: shellcheck not installed"
fi

"$MPTRAIN" prepare synthetic --out "$D" --train-samples 2048 --test-samples 256 --classes 10 --seed 5 \
  >"$TMP/prepare.log" 2>&1 || { fail "prepare synthetic"; cat "$TMP/prepare.log" >&2; finish; }

# wait_for_step LOG PID: wait until LOG shows a logged training step (or PID has exited).
wait_for_step() {
  local _
  for _ in $(seq 600); do
    grep -Eq '^step [0-9]+/' "$1" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}
json_get() {  # json_get FILE KEY
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' "$1" "$2"
}
first_logged_step() { sed -n 's|^step \([0-9]*\)/.*|\1|p' "$1" | head -n 1; }

# --- 2. launch/mpirun-train.sh: SIGTERM, then resume ------------------------------------------------
export MPTRAIN_BIN=$MPTRAIN MPIRUN=$MPIEXEC
# No `timeout` around the background runs: it would take the signals meant for the script (and
# die of USR1). ctest's TIMEOUT bounds the test instead.
run_wrapper() {  # run_wrapper LOG: launch/mpirun-train.sh in the background; its pid in $wrapper
  NP=2 CONFIG="" CHECKPOINT_DIR="$TMP/ckpt" OUTPUT_DIR="$TMP/run" \
    "$REPO/launch/mpirun-train.sh" "${TRAIN_ARGS[@]}" >"$1" 2>&1 &
  wrapper=$!
}
run_wrapper "$TMP/wrapper1.log"
if wait_for_step "$TMP/wrapper1.log" "$wrapper"; then
  kill -TERM "$wrapper"
  pass "mpirun-train.sh reached a logged step; sent SIGTERM"
else
  fail "mpirun-train.sh logged no step before it ended"
fi
status=0
wait "$wrapper" || status=$?
[ "$status" -eq 0 ] && pass "mpirun-train.sh exited 0 after SIGTERM" ||
  { fail "mpirun-train.sh exited $status after SIGTERM"; cat "$TMP/wrapper1.log" >&2; }
grep -q "^+ .*--resume=auto" "$TMP/wrapper1.log" && pass "mpirun-train.sh prints the command it runs" ||
  fail "no '+ mpirun ... --resume=auto' line"
stop_line=$(grep -m1 "stopped by signal at step" "$TMP/wrapper1.log" || true)
stop_step=$(sed -n 's/.*stopped by signal at step \([0-9]*\).*/\1/p' <<<"$stop_line")
stop_ckpt=$(sed -n 's/.*checkpoint \(.*\)$/\1/p' <<<"$stop_line")
if [[ -n "$stop_step" && "$stop_step" -gt 0 && "$stop_step" -lt $MAX_STEPS && -f "$stop_ckpt" ]]; then
  pass "stopped by signal at step $stop_step, checkpoint $(basename "$stop_ckpt") exists"
else
  fail "no 'stopped by signal at step S, checkpoint PATH' with 0 < S < $MAX_STEPS and PATH a file"
  cat "$TMP/wrapper1.log" >&2
fi
[ "$(json_get "$TMP/run/summary.json" stop_reason 2>/dev/null)" = signal ] &&
  pass "summary.json stop_reason signal" || fail "summary.json stop_reason is not 'signal'"

run_wrapper "$TMP/wrapper2.log"
status=0
wait "$wrapper" || status=$?
[ "$status" -eq 0 ] && pass "second mpirun-train.sh run exited 0" ||
  { fail "second run exited $status"; cat "$TMP/wrapper2.log" >&2; }
if [[ -n "$stop_ckpt" ]] && grep -i "resum" "$TMP/wrapper2.log" | grep -q "$(basename "$stop_ckpt")"; then
  pass "second run says it resumed from $(basename "$stop_ckpt")"
else
  fail "second run prints no 'resum...' line naming $(basename "${stop_ckpt:-ckpt-S.h5}")"
  cat "$TMP/wrapper2.log" >&2
fi
first=$(first_logged_step "$TMP/wrapper2.log")
[[ -n "$first" && -n "$stop_step" && "$first" -gt "$stop_step" ]] &&
  pass "second run's first logged step $first comes after $stop_step" ||
  fail "second run's first logged step '$first' is not after the stop at '$stop_step'"
[ "$(json_get "$TMP/run/summary.json" stop_reason 2>/dev/null)" = completed ] &&
  [ "$(json_get "$TMP/run/summary.json" steps)" = $MAX_STEPS ] &&
  grep -q "training completed" "$TMP/wrapper2.log" &&
  pass "second run completed $MAX_STEPS steps" || fail "second run did not complete $MAX_STEPS steps"

# --- 3. launch/slurm/train.sbatch with stand-ins for srun and scontrol ------------------------------
mkdir -p "$TMP/bin"
cat >"$TMP/bin/srun" <<'EOF'
#!/usr/bin/env bash
# Stand-in for srun: drops srun's options and runs the step on 2 ranks. exec keeps the pid, so
# the batch shell's USR1 reaches mpirun, which forwards it to the ranks, as srun would.
while [[ "${1:-}" == --* ]]; do shift; done
exec "$MPIEXEC" -n 2 --oversubscribe "$@" </dev/null
EOF
cat >"$TMP/bin/scontrol" <<'EOF'
#!/usr/bin/env bash
echo "$*" >>"$SCONTROL_LOG"
EOF
chmod +x "$TMP/bin/srun" "$TMP/bin/scontrol"
export SCONTROL_LOG="$TMP/scontrol.log" MPIEXEC
: >"$SCONTROL_LOG"
run_batch() {  # run_batch LOG [VAR=VALUE...]: the batch script in the background; pid in $batch
  local log=$1
  shift
  env "$@" PATH="$TMP/bin:$PATH" SLURM_JOB_ID=4242 SLURM_SUBMIT_DIR="$TMP" CONFIG="" \
    CHECKPOINT_DIR="$TMP/sckpt" OUTPUT_DIR="$TMP/srun" MPTRAIN_BIN="$MPTRAIN" \
    MPTRAIN_ARGS="${TRAIN_ARGS[*]} --train.stop-margin=00:00:02" \
    bash "$REPO/launch/slurm/train.sbatch" >"$log" 2>&1 &
  batch=$!
}
run_batch "$TMP/batch1.log"
wait_for_step "$TMP/batch1.log" "$batch" && kill -USR1 "$batch"
status=0
wait "$batch" || status=$?
if [ "$status" -eq 0 ] && grep -q "stopped by signal at step" "$TMP/batch1.log" &&
  grep -qx "requeue 4242" "$SCONTROL_LOG"; then
  pass "train.sbatch: USR1 to the batch shell -> checkpoint, exit 0, scontrol requeue 4242"
else
  fail "train.sbatch after USR1: status $status, scontrol log '$(cat "$SCONTROL_LOG")'"
  cat "$TMP/batch1.log" >&2
fi

# SIGTERM to the batch shell without Slurm's USR1 first is `scancel`: checkpoint, no requeue.
: >"$SCONTROL_LOG"
run_batch "$TMP/batch-cancel.log" SLURM_RESTART_COUNT=1
wait_for_step "$TMP/batch-cancel.log" "$batch" && kill -TERM "$batch"
status=0
wait "$batch" || status=$?
if [ "$status" -eq 0 ] && grep -q "stopped by signal at step" "$TMP/batch-cancel.log" &&
  grep -q "not requeueing" "$TMP/batch-cancel.log" && [ ! -s "$SCONTROL_LOG" ]; then
  pass "train.sbatch: SIGTERM to the batch shell (scancel) -> checkpoint, exit 0, no requeue"
else
  fail "train.sbatch after SIGTERM: status $status, scontrol log '$(cat "$SCONTROL_LOG")'"
  cat "$TMP/batch-cancel.log" >&2
fi

# The deadline: SLURM_JOB_END_TIME 6 s away with a 2 s margin stops the run after about 4 s.
: >"$SCONTROL_LOG"
run_batch "$TMP/batch2.log" SLURM_RESTART_COUNT=2 SLURM_JOB_END_TIME=$(($(date +%s) + 6))
status=0
wait "$batch" || status=$?
if [ "$status" -eq 0 ] && grep -q "stopped for the time limit at step" "$TMP/batch2.log" &&
  grep -qx "requeue 4242" "$SCONTROL_LOG"; then
  pass "train.sbatch: SLURM_JOB_END_TIME -> stopped for the time limit, requeued"
else
  fail "train.sbatch with SLURM_JOB_END_TIME: status $status, scontrol log '$(cat "$SCONTROL_LOG")'"
  cat "$TMP/batch2.log" >&2
fi

: >"$SCONTROL_LOG"
run_batch "$TMP/batch3.log" SLURM_RESTART_COUNT=3
status=0
wait "$batch" || status=$?
if [ "$status" -eq 0 ] && grep -q "training completed" "$TMP/batch3.log" && [ ! -s "$SCONTROL_LOG" ] &&
  [ "$(json_get "$TMP/srun/summary.json" steps)" = $MAX_STEPS ]; then
  pass "train.sbatch: the resumed run completes $MAX_STEPS steps and does not requeue"
else
  fail "train.sbatch completing run: status $status, scontrol log '$(cat "$SCONTROL_LOG")'"
  cat "$TMP/batch3.log" >&2
fi
finish
