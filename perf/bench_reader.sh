#!/usr/bin/env bash
# Raw reader throughput (issue 3): one epoch of mptrain's DatasetReader over a synthetic uint8 file,
# warm page cache, against `cat FILE > /dev/null` and against h5py reading the same hyperslabs.
# Figures are file bytes per second, best of --reps; the sides alternate within each round.
#   perf/bench_reader.sh [--build DIR] [--samples N] [--batch B] [--rounds R] [--reps R]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=${BUILD:-$HERE/../build/release}
SAMPLES=400000
BATCH=256
ROUNDS=3
REPS=3
PY=${PYTHON_H5PY:-/usr/bin/python3}
while [ $# -gt 0 ]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --samples) SAMPLES=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
DATA=${DATA:-/tmp/mpt-bench-reader}
FILE=$DATA/train.h5
if [ ! -f "$FILE" ] || [ "$("$PY" -c "import h5py; print(len(h5py.File('$FILE')['samples']))")" != "$SAMPLES" ]; then
  "$BUILD/mptrain" prepare synthetic --out "$DATA" --train-samples "$SAMPLES" --test-samples 16 >/dev/null
fi
BYTES=$(stat -c %s "$FILE")
echo "file $FILE: $SAMPLES samples of 1x28x28 uint8, $BYTES bytes; batch $BATCH"
cat "$FILE" >/dev/null; cat "$FILE" >/dev/null  # warm the page cache

cat_once() {
  local best=1e30
  for _ in $(seq "$REPS"); do
    local start end
    start=$(date +%s.%N); cat "$FILE" >/dev/null; end=$(date +%s.%N)
    best=$(echo "$end $start $best" | awk '{t = $1 - $2; print (t < $3 ? t : $3)}')
  done
  echo "$best $BYTES" | awk '{printf "cat                           : %.3f s = %.1f MB/s\n", $1, $2 / $1 / 1e6}'
}

for round in $(seq "$ROUNDS"); do
  echo "--- round $round"
  cat_once
  for mode in none window global; do
    "$BUILD/perf/bench_reader" "$FILE" --shuffle $mode --batch "$BATCH" --reps "$REPS" \
      --dump-order "$DATA/order-$mode.bin"
    "$BUILD/perf/bench_reader" "$FILE" --shuffle $mode --batch "$BATCH" --reps "$REPS" --raw 1
    if [ "$mode" = none ]; then
      "$BUILD/perf/bench_reader" "$FILE" --shuffle $mode --batch "$BATCH" --reps "$REPS" --direct 0
    fi
    "$PY" "$HERE/bench_reader_h5py.py" "$FILE" "$DATA/order-$mode.bin" "$BATCH" $mode "$REPS"
  done
done
