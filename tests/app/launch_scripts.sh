#!/usr/bin/env bash
# The launch scripts (issue #7): every one parses (and passes shellcheck where it is installed);
# launch/mpirun-train.sh turns a SIGTERM into a clean stop with a checkpoint, and a second run
# resumes from it and completes; launch/slurm/train.sbatch, with stand-ins for srun and
# scontrol, forwards its USR1 to the ranks and requeues itself after it or after the
# SLURM_JOB_END_TIME deadline, and not after a SIGTERM (scancel) or a completed run.
# launch/mptrain-run (issue #9) under mpirun: 2 ranks train with one layout line each, SIGTERM
# stops them with a checkpoint, a GPU per rank from MPTRAIN_GPUS_PER_NODE, the binding options,
# bad input refused with exit 2; under a stand-in srun that runs the tasks with srun's SLURM_*
# variables: the binding flags, the layout lines (2 nodes x 2), the GPUs from nvidia-smi or
# CUDA_VISIBLE_DEVICES. The templates in launch/slurm/ (single-node, multi-node, sweep-array):
# their variables at the top, a run of each through mptrain-run, a USR1 to the batch shell.
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
# A Slurm job around the test must not lend its deadline, tasks or ids to these runs; nor a GPU
# machine its GPUs (the tests that want GPUs fake them).
unset "${!SLURM_@}" CUDA_VISIBLE_DEVICES MPTRAIN_SRUN_ARGS MPTRAIN_MPIRUN_ARGS
export MPTRAIN_GPUS_PER_NODE=0

# --- 1. every launch script parses ---------------------------------------------------------------
lint_scripts "$REPO" launch/ "$REPO"/launch/*.sh "$REPO"/launch/mptrain-run "$REPO"/launch/lib/*.sh \
  "$REPO"/launch/slurm/*.sbatch

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
# Stand-in for srun: appends its arguments to $SRUN_LOG and runs --ntasks (else SLURM_NTASKS, else
# 1) tasks here. FAKE_SRUN_MPI=1: as MPI ranks under mpiexec (exec keeps the pid, so a USR1 sent
# to "srun" reaches mpiexec, which forwards it to the ranks, as srun would). Otherwise as plain
# processes with srun's variables, on FAKE_SRUN_NODES (default 1) pretend nodes.
echo "$*" >>"$SRUN_LOG"
n=${SLURM_NTASKS:-1}
while [[ "${1:-}" == -* ]]; do
  case "$1" in --ntasks=*) n=${1#*=} ;; esac
  shift
done
[[ "${FAKE_SRUN_MPI:-0}" != 1 ]] || exec "$MPIEXEC" -n "$n" --oversubscribe "$@" </dev/null
nodes=${FAKE_SRUN_NODES:-1}
per=$((n / nodes))
per_node=$per
((nodes == 1)) || per_node="$per(x$nodes)"
pids=()
for ((i = 0; i < n; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$((i % per)) SLURM_NODEID=$((i / per)) SLURM_STEP_NUM_TASKS=$n \
    SLURM_STEP_TASKS_PER_NODE=$per_node "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"
EOF
cat >"$TMP/bin/scontrol" <<'EOF'
#!/usr/bin/env bash
echo "$*" >>"$SCONTROL_LOG"
EOF
chmod +x "$TMP/bin/srun" "$TMP/bin/scontrol"
export SCONTROL_LOG="$TMP/scontrol.log" SRUN_LOG="$TMP/srun.log" MPIEXEC
: >"$SCONTROL_LOG"
: >"$SRUN_LOG"
run_batch() {  # run_batch LOG [VAR=VALUE...]: the batch script in the background; pid in $batch
  local log=$1
  shift
  env "$@" PATH="$TMP/bin:$PATH" SLURM_JOB_ID=4242 SLURM_SUBMIT_DIR="$TMP" CONFIG="" \
    SLURM_NTASKS=2 FAKE_SRUN_MPI=1 MPTRAIN_RUN="$REPO/launch/mptrain-run" \
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
grep -q -- "--cpu-bind=cores .*launch/mptrain-run --rank-exec $MPTRAIN train" "$SRUN_LOG" &&
  [ "$(grep -c '^layout: rank' "$TMP/batch1.log")" -eq 2 ] &&
  pass "train.sbatch starts the ranks through mptrain-run (srun --cpu-bind=cores, 2 layout lines)" ||
  { fail "train.sbatch: no 'srun --cpu-bind=cores ... mptrain-run --rank-exec' or not 2 layout lines";
    cat "$SRUN_LOG" >&2; }

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
# --- 4. launch/mptrain-run ------------------------------------------------------------------------
RUN="$REPO/launch/mptrain-run"
SHORT_ARGS=(--data.train="$D/train.h5" "--model.layers=dense:32,relu,dense:10" --train.batch-size=16
  --train.max-steps=20 --train.log-every=10)
# layout_ranks LOG: the "R/N" of every layout line, sorted.
layout_ranks() { sed -n 's/^layout: rank \([0-9?]*\/[0-9?]*\) .*/\1/p' "$1" | sort; }

# mpirun (no Slurm job: auto picks it), 2 ranks, a short run.
status=0
"$RUN" -n 2 train "${SHORT_ARGS[@]}" --output.dir="$TMP/mr" >"$TMP/mr.log" 2>&1 || status=$?
if [ "$status" -eq 0 ] && [ "$(layout_ranks "$TMP/mr.log" | tr '\n' ' ')" = "0/2 1/2 " ] &&
  [ "$(json_get "$TMP/mr/summary.json" world_size)" = 2 ] &&
  [ "$(json_get "$TMP/mr/summary.json" steps)" = 20 ]; then
  pass "mptrain-run -n 2 (mpirun): exit 0, layout lines of ranks 0/2 and 1/2, 20 steps on 2 ranks"
else
  fail "mptrain-run -n 2 train: status $status, layout '$(layout_ranks "$TMP/mr.log" | tr '\n' ' ')'"
  cat "$TMP/mr.log" >&2
fi
grep -Eq '^layout: rank 0/2 host [^ ]+ local 0/2 cores [0-9][0-9,-]* gpu none threads 1$' "$TMP/mr.log" &&
  [ "$(grep -c '^+ ' "$TMP/mr.log")" -eq 1 ] &&
  grep -q "^+ $MPIEXEC -np 2 -x OMP_NUM_THREADS .*launch/mptrain-run --rank-exec $MPTRAIN train" "$TMP/mr.log" &&
  pass "mptrain-run prints the mpirun command once and a full layout line per rank" ||
  { fail "mptrain-run: no single '+ mpirun -np 2 ... --rank-exec' line or a layout line lacks a field";
    cat "$TMP/mr.log" >&2; }

# SIGTERM to mptrain-run: SIGUSR1 to mpirun, the ranks checkpoint and exit 0.
"$RUN" -n 2 train "${TRAIN_ARGS[@]}" --checkpoint.dir="$TMP/mr-ckpt" --output.dir="$TMP/mr-sig" \
  >"$TMP/mr-sig.log" 2>&1 &
run_pid=$!
wait_for_step "$TMP/mr-sig.log" "$run_pid" && kill -TERM "$run_pid"
status=0
wait "$run_pid" || status=$?
steps=$(json_get "$TMP/mr-sig/summary.json" steps 2>/dev/null || true)
if [ "$status" -eq 0 ] && [ "$(json_get "$TMP/mr-sig/summary.json" stop_reason 2>/dev/null)" = signal ] &&
  [[ "$steps" =~ ^[0-9]+$ ]] && ((steps < MAX_STEPS)) && grep -q "stopped by signal at step" "$TMP/mr-sig.log"; then
  pass "mptrain-run: SIGTERM -> the ranks stop at step $steps with a checkpoint, exit 0, stop_reason signal"
else
  fail "mptrain-run after SIGTERM: status $status, steps '$steps'"
  cat "$TMP/mr-sig.log" >&2
fi

# A GPU per rank: MPTRAIN_GPUS_PER_NODE=2 fakes two; each rank sees its local rank's.
status=0
MPTRAIN_GPUS_PER_NODE=2 "$RUN" -n 2 -- sh -c 'echo "cvd $OMPI_COMM_WORLD_LOCAL_RANK=$CUDA_VISIBLE_DEVICES"' \
  >"$TMP/gpu.log" 2>&1 || status=$?
if [ "$status" -eq 0 ] && [ "$(grep '^cvd ' "$TMP/gpu.log" | sort | tr '\n' ' ')" = "cvd 0=0 cvd 1=1 " ] &&
  grep -q '^layout: rank 1/2 .* gpu 1 threads 1$' "$TMP/gpu.log"; then
  pass "mptrain-run: MPTRAIN_GPUS_PER_NODE=2 -> CUDA_VISIBLE_DEVICES 0 and 1, in the layout lines"
else
  fail "mptrain-run GPU assignment: status $status"
  cat "$TMP/gpu.log" >&2
fi
# The default rank count: one per GPU; else the cores / OMP_NUM_THREADS. The binding: --bind-to
# core while the ranks fit the cores, --map-by slot:PE=T for T threads, else oversubscribed.
cores=$(env -u OMP_NUM_THREADS nproc)
dry() { "$RUN" --dry-run "$@" -- true 2>&1; }
out_gpu=$(MPTRAIN_GPUS_PER_NODE=3 dry)
out_cores=$(dry)
out_fit=$(dry -n 1)
out_over=$(dry -n $((cores + 1)))
out_pe=$(OMP_NUM_THREADS=2 dry -n 1)
if [[ "$out_gpu" == *" -np 3 "* && "$out_cores" == *" -np $cores "* &&
  "$out_fit" == *" -np 1 "*" --bind-to core "* && "$out_fit" != *oversubscribe* &&
  "$out_over" == *" --oversubscribe --bind-to none "* ]]; then
  pass "mptrain-run --dry-run: -np 3 for 3 GPUs, -np $cores for $cores cores, --bind-to core, oversubscribe"
else
  fail "mptrain-run --dry-run: '$out_gpu' / '$out_cores' / '$out_fit' / '$out_over'"
fi
if ((cores >= 2)); then
  [[ "$out_pe" == *" --map-by slot:PE=2 --bind-to core "* ]] &&
    pass "mptrain-run: OMP_NUM_THREADS=2 -> --map-by slot:PE=2 --bind-to core" ||
    fail "mptrain-run with OMP_NUM_THREADS=2: '$out_pe'"
fi
status=0
"$RUN" --dry-run -n 2 -- touch "$TMP/dry-ran" >/dev/null 2>&1 || status=$?
[ "$status" -eq 0 ] && [ ! -e "$TMP/dry-ran" ] && pass "mptrain-run --dry-run exits 0 and runs nothing" ||
  fail "mptrain-run --dry-run: status $status, or it ran the command"

# Bad input: one line on stderr naming the problem, exit 2, nothing run.
bad_input() {  # bad_input WHAT EXPECTED-PATTERN [VAR=VALUE...] -- ARGS...
  local what=$1 pattern=$2 envs=() status=0 err
  shift 2
  while [[ "$1" != -- ]]; do envs+=("$1"); shift; done
  shift
  env ${envs[@]+"${envs[@]}"} "$RUN" "$@" >"$TMP/bad.out" 2>"$TMP/bad.err" || status=$?
  err=$(cat "$TMP/bad.err")
  if [ "$status" -eq 2 ] && [ "$(wc -l <"$TMP/bad.err")" -eq 1 ] && [[ "$err" == mptrain-run:*$pattern* ]] &&
    [ ! -s "$TMP/bad.out" ]; then
    pass "mptrain-run $what: exit 2, '$err'"
  else
    fail "mptrain-run $what: status $status, stderr '$err' (wanted one line with '$pattern')"
  fi
}
bad_input "unknown option" "unknown option '--bogus'" -- --bogus train
bad_input "-n 0" "positive integer, got '0'" -- -n 0 -- true
bad_input "-n two" "positive integer, got 'two'" -- -n two -- true
bad_input "-n without a value" "-n needs" -- -n
bad_input "--launcher pbs" "auto, srun or mpirun, got 'pbs'" -- --launcher pbs -- true
bad_input "missing binary" "'$TMP/no-mptrain' not found" MPTRAIN_BIN="$TMP/no-mptrain" -- train
bad_input "missing command" "'no-such-command-x' not found" -- -- no-such-command-x
bad_input "nothing after --" "nothing to run after --" -- --
bad_input "MPTRAIN_GPUS_PER_NODE=-1" "MPTRAIN_GPUS_PER_NODE" MPTRAIN_GPUS_PER_NODE=-1 -- -- true
bad_input "OMP_NUM_THREADS=0" "OMP_NUM_THREADS must be a positive integer" OMP_NUM_THREADS=0 -- -- true

# srun: in a Slurm job (SLURM_JOB_ID set, srun on PATH), the stand-in srun runs 4 tasks on 2
# pretend nodes; nvidia-smi (a stand-in too) lists 2 GPUs.
cat >"$TMP/bin/nvidia-smi" <<'EOF'
#!/bin/sh
echo "GPU 0: Fake GPU (UUID: GPU-0)"
echo "GPU 1: Fake GPU (UUID: GPU-1)"
EOF
chmod +x "$TMP/bin/nvidia-smi"
in_slurm() {  # in_slurm VAR=VALUE... -- ARGS...: mptrain-run as in a Slurm job of 4 tasks, 2 per node
  local envs=()
  while [[ "$1" != -- ]]; do envs+=("$1"); shift; done
  shift
  env -u MPTRAIN_GPUS_PER_NODE PATH="$TMP/bin:$PATH" SLURM_JOB_ID=77 SLURM_NTASKS=4 SLURM_CPUS_PER_TASK=2 FAKE_SRUN_NODES=2 \
    ${envs[@]+"${envs[@]}"} "$RUN" "$@"
}
PRINT_CVD='echo "cvd $SLURM_PROCID=$CUDA_VISIBLE_DEVICES threads $OMP_NUM_THREADS"'
: >"$SRUN_LOG"
status=0
in_slurm -- -- sh -c "$PRINT_CVD" >"$TMP/srun1.log" 2>&1 || status=$?
layouts=$(sed -n 's/^layout: rank \([0-9/]*\) host [^ ]* local \([0-9/]*\) cores [^ ]* gpu \([^ ]*\) threads \([0-9]*\)$/\1 \2 \3 \4/p' \
  "$TMP/srun1.log" | sort | tr '\n' ',')
if [ "$status" -eq 0 ] && [ "$layouts" = "0/4 0/2 0 2,1/4 1/2 1 2,2/4 0/2 0 2,3/4 1/2 1 2," ] &&
  [ "$(grep '^cvd ' "$TMP/srun1.log" | sort | tr '\n' ',')" = "cvd 0=0 threads 2,cvd 1=1 threads 2,cvd 2=0 threads 2,cvd 3=1 threads 2," ]; then
  pass "mptrain-run under srun: 4 layout lines (rank, local rank of 2 per node, gpu from nvidia-smi, 2 threads)"
else
  fail "mptrain-run under srun: status $status, layouts '$layouts'"
  cat "$TMP/srun1.log" >&2
fi
if [ "$(wc -l <"$SRUN_LOG")" -eq 1 ] &&
  grep -qx -- "--cpu-bind=cores --kill-on-bad-exit=1 --cpus-per-task=2 $RUN --rank-exec sh -c $PRINT_CVD" "$SRUN_LOG" &&
  grep -q "^+ srun --cpu-bind=cores --kill-on-bad-exit=1 --cpus-per-task=2 " "$TMP/srun1.log"; then
  pass "mptrain-run under srun: srun --cpu-bind=cores --kill-on-bad-exit=1 --cpus-per-task=2, printed"
else
  fail "mptrain-run under srun: srun got '$(cat "$SRUN_LOG")'"
fi
# -n under srun becomes --ntasks; a GPU list given (a per-node request) is shared out by local
# rank; a single GPU given by Slurm (--gpus-per-task=1) is kept; --launcher mpirun wins over auto.
: >"$SRUN_LOG"
status=0
in_slurm CUDA_VISIBLE_DEVICES=5,7 FAKE_SRUN_NODES=1 -- -n 2 -- sh -c "$PRINT_CVD" >"$TMP/srun2.log" 2>&1 || status=$?
grep -q -- "--ntasks=2 " "$SRUN_LOG" && [ "$status" -eq 0 ] &&
  [ "$(grep '^cvd ' "$TMP/srun2.log" | sort | tr '\n' ',')" = "cvd 0=5 threads 2,cvd 1=7 threads 2," ] &&
  pass "mptrain-run -n 2 under srun: --ntasks=2; CUDA_VISIBLE_DEVICES=5,7 -> 5 and 7 by local rank" ||
  { fail "mptrain-run -n 2 under srun with CUDA_VISIBLE_DEVICES=5,7: status $status, srun '$(cat "$SRUN_LOG")'";
    cat "$TMP/srun2.log" >&2; }
status=0
in_slurm CUDA_VISIBLE_DEVICES=3 -- -- sh -c "$PRINT_CVD" >"$TMP/srun3.log" 2>&1 || status=$?
[ "$status" -eq 0 ] && [ "$(grep -c '^cvd [0-3]=3 ' "$TMP/srun3.log")" -eq 4 ] &&
  [ "$(grep -c '^layout: .* gpu 3 threads 2$' "$TMP/srun3.log")" -eq 4 ] &&
  pass "mptrain-run under srun: a single CUDA_VISIBLE_DEVICES (Slurm's) is kept" ||
  { fail "mptrain-run with CUDA_VISIBLE_DEVICES=3: status $status"; cat "$TMP/srun3.log" >&2; }
out=$(in_slurm -- --launcher mpirun --dry-run -n 2 -- true 2>&1)
[[ "$out" == *"+ $MPIEXEC -np 2 "* ]] && pass "mptrain-run --launcher mpirun in a Slurm job uses mpirun" ||
  fail "mptrain-run --launcher mpirun: '$out'"

# --- 5. the templates in launch/slurm/ ------------------------------------------------------------
for t in "$REPO"/launch/slurm/*.sbatch; do
  name=${t#"$REPO"/}
  # The variables at the top: a "What to change" section before the first command, #SBATCH lines.
  first_cmd=$(grep -n -v -E '^[[:space:]]*(#|$)' "$t" | head -n 1 | cut -d: -f1)
  change=$(grep -n 'What to change' "$t" | head -n 1 | cut -d: -f1)
  if [[ -n "$change" && -n "$first_cmd" ]] && ((change < first_cmd)) && grep -q '^#SBATCH --' "$t" &&
    [ "$(grep -c 'What to change' "$t")" -ge 2 ]; then
    pass "$name: 'What to change' sections, the first before any command, and #SBATCH lines"
  else
    fail "$name: no 'What to change' section at the top (before line $first_cmd)"
  fi
  # Through mptrain-run, and srun named only in comments (code that calls srun would name it).
  if grep -q '"\$MPTRAIN_RUN"' "$t" && grep -q '^MPTRAIN_RUN=${MPTRAIN_RUN:-launch/mptrain-run}$' "$t" &&
    ! grep -v -E '^[[:space:]]*#' "$t" | grep -qw srun; then
    pass "$name: launches through launch/mptrain-run"
  else
    fail "$name: does not launch through \$MPTRAIN_RUN (launch/mptrain-run), or calls srun itself"
  fi
done

# Each template's body as sbatch would run it: the job's variables, the stand-in srun (MPI ranks).
mkdir -p "$TMP/submit"
run_template() {  # run_template TEMPLATE LOG [VAR=VALUE...]: in the background; its pid in $batch
  local t=$1 log=$2
  shift 2
  env PATH="$TMP/bin:$PATH" SLURM_JOB_ID=5151 SLURM_SUBMIT_DIR="$TMP/submit" SLURM_NTASKS=2 \
    SLURM_CPUS_PER_TASK=1 SLURM_JOB_NAME=tpl FAKE_SRUN_MPI=1 CONFIG="" MPTRAIN_BIN="$MPTRAIN" \
    MPTRAIN_RUN="$RUN" MPTRAIN_ARGS="${SHORT_ARGS[*]}" "$@" \
    bash "$REPO/launch/slurm/$t" >"$log" 2>&1 &
  batch=$!
}
for t in single-node multi-node; do
  : >"$SRUN_LOG"
  run_template $t.sbatch "$TMP/$t.log" OUTPUT_DIR="$TMP/$t" CHECKPOINT_DIR="$TMP/$t-ckpt"
  status=0
  wait "$batch" || status=$?
  if [ "$status" -eq 0 ] && [ "$(json_get "$TMP/$t/summary.json" stop_reason 2>/dev/null)" = completed ] &&
    [ "$(json_get "$TMP/$t/summary.json" world_size)" = 2 ] &&
    [ "$(layout_ranks "$TMP/$t.log" | tr '\n' ' ')" = "0/2 1/2 " ] &&
    grep -q -- "--cpu-bind=cores .*--cpus-per-task=1 $RUN --rank-exec $MPTRAIN train .*--resume=auto" "$SRUN_LOG"; then
    pass "$t.sbatch: srun through mptrain-run, 2 layout lines, training completed"
  else
    fail "$t.sbatch: status $status, srun '$(cat "$SRUN_LOG")'"
    cat "$TMP/$t.log" >&2
  fi
done
# The batch shell execs mptrain-run: Slurm's B:USR1 reaches it, and the ranks stop with a checkpoint.
run_template multi-node.sbatch "$TMP/tpl-sig.log" OUTPUT_DIR="$TMP/tpl-sig" CHECKPOINT_DIR="$TMP/tpl-sig-ckpt" \
  MPTRAIN_ARGS="${TRAIN_ARGS[*]}"
wait_for_step "$TMP/tpl-sig.log" "$batch" && kill -USR1 "$batch"
status=0
wait "$batch" || status=$?
[ "$status" -eq 0 ] && [ "$(json_get "$TMP/tpl-sig/summary.json" stop_reason 2>/dev/null)" = signal ] &&
  ls "$TMP/tpl-sig-ckpt"/ckpt-*.h5 >/dev/null 2>&1 &&
  pass "multi-node.sbatch: USR1 to the batch shell -> checkpoint, exit 0, stop_reason signal" ||
  { fail "multi-node.sbatch after USR1: status $status"; cat "$TMP/tpl-sig.log" >&2; }

# sweep-array.sbatch: index 1 is the point "2": 2 ranks, packed on 2 nodes of 1, into
# runs/<SWEEP_NAME>-1/; an index past the points is refused.
: >"$SRUN_LOG"
run_template sweep-array.sbatch "$TMP/sweep.log" SLURM_ARRAY_TASK_ID=1 SLURM_NTASKS=8 \
  SLURM_NTASKS_PER_NODE=1 SWEEP_NAME=sw
status=0
wait "$batch" || status=$?
if [ "$status" -eq 0 ] && [ "$(json_get "$TMP/submit/runs/sw-1/summary.json" world_size 2>/dev/null)" = 2 ] &&
  [ "$(json_get "$TMP/submit/runs/sw-1/summary.json" steps)" = 20 ] &&
  grep -q -- "--ntasks=2 --nodes=2 $RUN --rank-exec $MPTRAIN train" "$SRUN_LOG"; then
  pass "sweep-array.sbatch index 1: 2 ranks (srun --ntasks=2 --nodes=2) into runs/sw-1/summary.json"
else
  fail "sweep-array.sbatch index 1: status $status, srun '$(cat "$SRUN_LOG")'"
  cat "$TMP/sweep.log" >&2
fi
run_template sweep-array.sbatch "$TMP/sweep-bad.log" SLURM_ARRAY_TASK_ID=4 SWEEP_NAME=sw
status=0
wait "$batch" || status=$?
[ "$status" -eq 2 ] && grep -q "array index '4' has no point: POINTS has 4 (hint: submit with --array=0-3)" \
  "$TMP/sweep-bad.log" && pass "sweep-array.sbatch: index 4 of 4 points -> exit 2 with a hint" ||
  { fail "sweep-array.sbatch index 4: status $status"; cat "$TMP/sweep-bad.log" >&2; }
finish
