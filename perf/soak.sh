#!/usr/bin/env bash
# Soak (issue #11): a long run of small steps with frequent checkpoints and evaluations, after
# which every rank's resident set and open file descriptors must have stayed flat
# (perf/soak_check.py states the tolerances). tests/app/soak.sh runs it reduced in CI.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: perf/soak.sh [options] [BUILD_DIR]

Two phases of one training run on NP ranks (a small MLP on synthetic 8x8 samples, 32 steps per
epoch, an evaluation on 64 test samples after every epoch, a metrics window every LOG steps,
TensorBoard events on):
  1. steps 1 .. STEPS/2, a synchronous checkpoint every EVERY steps (--checkpoint.keep=2);
  2. --resume=auto (a new process) to STEPS, the checkpoints written by --checkpoint.async.
Then perf/soak_check.py checks each phase's windows in metrics.jsonl (rss_mb, open_fds per rank)
and prints a Markdown table; the script exits 1 when a check fails.

  -s, --steps N        optimizer steps in all (default 20000)
  -n, --ranks NP       ranks (default 2)
  -e, --every E        --checkpoint.every-steps (default 50)
  -l, --log-every L    --train.log-every (default 10)
  -o, --out DIR        where data, checkpoints and outputs go (default: a temporary directory,
                       removed at the end)
  --mptrain PATH       the binary (default BUILD_DIR/mptrain)
  -h, --help           show this help

BUILD_DIR holds the mptrain binary (default build/release). Runs under `nice -n 5`.
EOF
}

steps=20000
ranks=2
every=50
log_every=10
out=""
mptrain=""
build=build/release
need() { [[ $2 -ge 2 ]] || { echo "soak.sh: $1 needs a value" >&2; exit 2; }; }
while (($#)); do
  case "$1" in
    -s | --steps) need "$1" $#; steps=$2; shift ;;
    -n | --ranks) need "$1" $#; ranks=$2; shift ;;
    -e | --every) need "$1" $#; every=$2; shift ;;
    -l | --log-every) need "$1" $#; log_every=$2; shift ;;
    -o | --out) need "$1" $#; out=$2; shift ;;
    --mptrain) need "$1" $#; mptrain=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "soak.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) build=$1 ;;
  esac
  shift
done
for value in "$steps" "$ranks" "$every" "$log_every"; do
  [[ "$value" =~ ^[1-9][0-9]*$ ]] || { echo "soak.sh: '$value' is not a positive count" >&2; exit 2; }
done
((steps >= 16 * log_every)) || {
  echo "soak.sh: --steps $steps gives fewer than 8 windows per phase of $log_every steps" >&2
  exit 2
}
mptrain=${mptrain:-$build/mptrain}
[[ -x "$mptrain" ]] || { echo "soak.sh: no mptrain binary at '$mptrain' (hint: build it, or pass --mptrain PATH)" >&2; exit 2; }
checker="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/soak_check.py"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MPIEXEC=${MPIEXEC:-mpiexec}

if [[ -z "$out" ]]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/mpt-soak.XXXXXX")
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
"$mptrain" prepare synthetic --out "$out/data" --train-samples 512 --test-samples 64 \
  --shape 1,8,8 --classes 10 --seed 11 >/dev/null
half=$((steps / 2))
run() {  # run PHASE MAX_STEPS [OPTIONS...]
  local phase=$1 max=$2 start=$SECONDS
  shift 2
  if ! nice -n 5 "$MPIEXEC" -n "$ranks" --oversubscribe "$mptrain" train \
      --data.train="$out/data/train.h5" --data.test="$out/data/test.h5" \
      --model.layers=dense:64,relu,dense:10 --train.batch-size=8 --train.epochs=1000000 \
      --train.max-steps="$max" --train.log-every="$log_every" --checkpoint.dir="$out/ckpt" \
      --checkpoint.every-steps="$every" --checkpoint.keep=2 --output.tensorboard \
      --output.dir="$out/run" "$@" >"$out/$phase.log" 2>&1; then
    echo "soak.sh: phase $phase failed, its log:" >&2
    tail -n 20 "$out/$phase.log" >&2
    exit 1
  fi
  echo "soak.sh: phase $phase: $(grep -c '^checkpoint: wrote' "$out/$phase.log") checkpoints," \
    "$(grep -c '^epoch .* done' "$out/$phase.log") evaluations, $((SECONDS - start)) s" >&2
}
run sync "$half" --output.overwrite
run async "$steps" --resume=auto --checkpoint.async
grep -q "^resumed from $out/ckpt/ckpt-$half.h5" "$out/async.log" || {
  echo "soak.sh: phase async did not resume from ckpt-$half.h5" >&2
  exit 1
}
echo "soak: $steps steps on $ranks ranks, a checkpoint every $every steps, a window every $log_every"
/usr/bin/python3 "$checker" "$out/run/metrics.jsonl" --phase "sync:1:$half" \
  --phase "async:$((half + 1)):$steps:async"
