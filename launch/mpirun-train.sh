#!/usr/bin/env bash
# The plain-mpirun twin of launch/slurm/train.sbatch: trains with --resume=auto into a checkpoint
# directory, and turns a SIGTERM, SIGINT or SIGUSR1 sent to this script into a clean stop (every
# rank checkpoints and exits 0). Run the same command again to continue where it stopped.
set -euo pipefail

# ---- What to change (or set in the environment) -------------------------------------------------
# Ranks: one per GPU, or one per group of OMP_NUM_THREADS cores (launch/mpirun.sh binds them).
NP=${NP:-2}
# Training config (empty: none); options given to this script are appended and win over it.
CONFIG=${CONFIG-inputs/fashion-mnist-mlp.ini}
# Checkpoints (ckpt-<step>.h5 and `latest`): keep it between runs, or the next run starts afresh.
CHECKPOINT_DIR=${CHECKPOINT_DIR:-checkpoints/mptrain}
# metrics.jsonl and summary.json; summary.json's "stop_reason" says whether to run again.
OUTPUT_DIR=${OUTPUT_DIR:-runs/mptrain}
# The binary (default: launch/mpirun.sh's, build/release/mptrain).
export MPTRAIN_BIN=${MPTRAIN_BIN:-}
# -------------------------------------------------------------------------------------------------

usage() {
  cat <<'EOF'
Usage: [NP=N] [CONFIG=FILE] [CHECKPOINT_DIR=DIR] [OUTPUT_DIR=DIR] [MPTRAIN_BIN=PATH]
       launch/mpirun-train.sh [mptrain train options...]

Runs, through launch/mpirun.sh (root permission, core binding, OMP_NUM_THREADS):
  mptrain train [--config CONFIG] --checkpoint.dir=CHECKPOINT_DIR --output.dir=OUTPUT_DIR
                --resume=auto [options...]
and prints the mpirun command line first. --resume=auto starts afresh when CHECKPOINT_DIR holds
no checkpoint, else from the newest one whose checksums verify.

SIGTERM, SIGINT (Ctrl-C) or SIGUSR1 to this script: it sends SIGUSR1 to mpirun, which forwards it
to every rank; the ranks agree on a stop at the next step, rank 0 writes a checkpoint, and all
exit 0 ("stopped by signal at step S, checkpoint PATH"). The script then exits with mpirun's
status. (mpirun itself answers SIGTERM and SIGINT by killing the ranks, hence the USR1.)

Defaults: NP=2, CONFIG=inputs/fashion-mnist-mlp.ini (CONFIG= for none), CHECKPOINT_DIR=checkpoints/mptrain,
OUTPUT_DIR=runs/mptrain. Example, stopping after 10 minutes with a 30 s margin:
  NP=4 launch/mpirun-train.sh --train.time-limit=00:10:00 --train.stop-margin=30
EOF
}

if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then
  usage
  exit 0
fi
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if ! [[ "$NP" =~ ^[1-9][0-9]*$ ]]; then
  echo "mpirun-train: NP must be a positive integer, got '$NP'" >&2
  exit 2
fi
[[ -z "$CONFIG" || -f "$CONFIG" ]] || {
  echo "mpirun-train: config file '$CONFIG' not found (hint: set CONFIG=FILE, or CONFIG= for none)" >&2
  exit 2
}
[[ -n "$MPTRAIN_BIN" ]] || unset MPTRAIN_BIN

# stop_reason FILE: "stop_reason" of a summary.json ("completed", "signal", "time-limit"), or "".
stop_reason() {
  [[ -f "$1" ]] || return 0
  sed -n 's/.*"stop_reason": *"\([a-z-]*\)".*/\1/p' "$1" | head -n 1
}

# A summary.json left by an earlier run must not speak for this one.
rm -f "$OUTPUT_DIR/summary.json"

config=()
[[ -z "$CONFIG" ]] || config=(--config "$CONFIG")
train=(train ${config[@]+"${config[@]}"} --checkpoint.dir="$CHECKPOINT_DIR" --output.dir="$OUTPUT_DIR"
  --resume=auto "$@")
echo "mpirun-train: $NP ranks, checkpoints in $CHECKPOINT_DIR, outputs in $OUTPUT_DIR"

# mpirun goes into a session of its own (setsid), so that a Ctrl-C on the terminal reaches only
# this script, which asks for a clean stop, and not mpirun, which would kill the ranks.
# Its stdin is /dev/null: a process outside the terminal's foreground group must not read it.
detach=()
command -v setsid >/dev/null && detach=(setsid)
MPTRAIN_ECHO=1 ${detach[@]+"${detach[@]}"} "$repo_root/launch/mpirun.sh" "$NP" "${train[@]}" </dev/null &
mpirun_pid=$!

got_signal=0
# shellcheck disable=SC2317  # called from the traps below
forward() {  # forward NAME: ask the ranks, through mpirun, to checkpoint and stop
  got_signal=1
  echo "mpirun-train: got SIG$1, asking the ranks to checkpoint and stop" >&2
  kill -USR1 "$mpirun_pid" 2>/dev/null || true
}
trap 'forward TERM' TERM
trap 'forward INT' INT
trap 'forward USR1' USR1

# `wait` returns early when a trapped signal arrives: wait again until mpirun has exited.
while :; do
  got_signal=0
  status=0
  wait "$mpirun_pid" || status=$?
  ((got_signal)) || break
done

reason=$(stop_reason "$OUTPUT_DIR/summary.json")
case "$status:$reason" in
  0:completed) echo "mpirun-train: training completed ($OUTPUT_DIR/summary.json)" ;;
  0:signal | 0:time-limit)
    echo "mpirun-train: stopped ($reason) after a checkpoint in $CHECKPOINT_DIR;" \
      "run the same command again to resume" ;;
  *) echo "mpirun-train: mpirun exited with status $status (stop_reason '${reason:-none}')" >&2 ;;
esac
exit "$status"
