#!/usr/bin/env bash
# Overlap of input I/O with compute: step time and data_wait_fraction with --data.prefetch=0
# (reads in the step) and =2 (background reads), for injected read delays below and above the
# compute time per step. Expected: step ≈ io + compute without prefetch, ≈ max(io, compute) with.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: perf/overlap.sh [options] [BUILD_DIR]

Prepares a synthetic dataset (28x28 uint8, 10 classes), measures the compute time per step of
the MLP (prefetch 2, no delay), then trains STEPS steps for every combination of rank count,
--data.debug-read-delay-ms (fractions of the measured compute time) and --data.prefetch 0 / 2,
and prints a Markdown table of step time and data_wait_fraction from summary.json.

  -n, --ranks "K..."   rank counts (default "1 2")
  -b, --batch B        samples per rank per step (default 128)
  -s, --steps S        training steps per run (default 200)
  -f, --fractions "F"  read delays as fractions of compute per step (default "0.25 0.5 0.8 1.5")
  -o, --out FILE       also write the table to FILE
  -h, --help           show this help

BUILD_DIR holds the mptrain binary (default build/release). One compute thread per rank.
EOF
}

ranks="1 2"
batch=128
steps=200
fractions="0.25 0.5 0.8 1.5"
out=""
build=build/release
need() { [[ $2 -ge 2 ]] || { echo "overlap: $1 needs a value" >&2; exit 2; }; }
while (($#)); do
  case "$1" in
    -n | --ranks) need "$1" $#; ranks=$2; shift ;;
    -b | --batch) need "$1" $#; batch=$2; shift ;;
    -s | --steps) need "$1" $#; steps=$2; shift ;;
    -f | --fractions) need "$1" $#; fractions=$2; shift ;;
    -o | --out) need "$1" $#; out=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "overlap: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) build=$1 ;;
  esac
  shift
done
[[ -z "$out" || "$out" == /* ]] || out="$PWD/$out"
[[ "$build" == /* ]] || build="$PWD/$build"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

mptrain=$build/mptrain
[[ -x "$mptrain" ]] || mptrain=$build/src/app/mptrain
if [[ ! -x "$mptrain" ]]; then
  echo "overlap: no mptrain binary in $build" >&2
  echo "hint: cmake --preset release && cmake --build --preset release, or pass a build dir" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
work=$(mktemp -d /tmp/mpt-overlap.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$mptrain" prepare synthetic --out "$work/data" --train-samples 32768 --test-samples 16 >/dev/null

# run RANKS PREFETCH DELAY_MS -> "step_ms data_wait_fraction"
run() {
  local dir="$work/run-$1-$2-$3"
  mpiexec -n "$1" --oversubscribe "$mptrain" train --data.train="$work/data/train.h5" \
    --train.batch-size="$batch" --train.max-steps="$steps" --train.epochs=100 \
    --train.log-every="$steps" --train.threads=1 --data.prefetch="$2" \
    --data.debug-read-delay-ms="$3" --output.dir="$dir" --checkpoint.dir= >"$dir.log" 2>&1 ||
    { echo "overlap: run failed, see below" >&2; cat "$dir.log" >&2; exit 1; }
  python3 - "$dir/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{1000 * s['train_s'] / s['steps']:.1f} {s['data_wait_fraction']:.4f}")
PY
}

table="| ranks | compute ms/step | read delay ms | prefetch 0: step ms | io + compute | prefetch 2: step ms | max(io, compute) | data_wait prefetch 0 | data_wait prefetch 2 |
| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for n in $ranks; do
  read -r compute _ < <(run "$n" 2 0)
  for fraction in $fractions; do
    delay=$(python3 -c "print(max(1, round($fraction * $compute)))")
    read -r sync_ms sync_wait < <(run "$n" 0 "$delay")
    read -r async_ms async_wait < <(run "$n" 2 "$delay")
    row=$(python3 -c "
c, d = $compute, $delay
print(f'| $n | {c:.1f} | {d} | $sync_ms | {c + d:.1f} | $async_ms | {max(c, d):.1f} | '
      f'{100 * $sync_wait:.1f} % | {100 * $async_wait:.1f} % |')")
    table+=$'\n'"$row"
    echo "$row" >&2
  done
done
echo "$table"
[[ -z "$out" ]] || echo "$table" >"$out"
