#!/usr/bin/env bash
# Every user-facing error: a one-line message that names the file or option, a hint, a
# non-zero exit on every rank, and no hang (each case runs under a timeout).
source "$(dirname "$0")/common.sh"
PY=${PYTHON_H5PY:-/usr/bin/python3}

"$MPTRAIN" prepare synthetic --out "$TMP/data" --train-samples 512 --test-samples 128 >/dev/null

# expect_error NAME NP "expected substring" ARGS...
expect_error() {
  local name=$1 np=$2 expected=$3; shift 3
  local rc=0
  timeout 60 "$MPIEXEC" -n "$np" --oversubscribe "$MPTRAIN" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  local lines
  lines=$(grep -c '^mptrain: error:' "$TMP/err" || true)
  if [ "$rc" -eq 0 ]; then fail "$name: exit code 0"; return; fi
  if [ "$rc" -eq 124 ]; then fail "$name: timed out (a rank hung)"; return; fi
  if ! grep -qF -- "$expected" "$TMP/err"; then
    fail "$name: stderr lacks '$expected':"; sed 's/^/    /' "$TMP/err" >&2; return
  fi
  if ! grep '^mptrain: error:' "$TMP/err" | grep -q 'hint: '; then fail "$name: no hint"; return; fi
  if [ "$lines" -ne 1 ]; then fail "$name: $lines error lines, expected 1"; cat "$TMP/err" >&2; return; fi
  pass "$name (exit $rc): $(grep '^mptrain: error:' "$TMP/err")"
}

D="$TMP/data"
for np in 1 2; do
  expect_error "missing data file np$np" $np "'$TMP/none.h5'" \
    train --data.train="$TMP/none.h5" --output.dir="$TMP/o"
  expect_error "wrong samples dataset name np$np" $np "images" \
    train --data.train="$D/train.h5" --data.samples=images --output.dir="$TMP/o"
  expect_error "unknown option np$np" $np "unknown option '--optimizer.lrr'" \
    train --data.train="$D/train.h5" --optimizer.lrr=0.1
done

printf '[train]\nepocs = 2\n' >"$TMP/bad.ini"
expect_error "unknown option in config file" 2 "'train.epocs' in config file '$TMP/bad.ini'" \
  train --config "$TMP/bad.ini"
expect_error "missing config file" 2 "config file '$TMP/nope.ini' not found" train --config "$TMP/nope.ini"
expect_error "bad option value" 2 "train.batch-size" train --data.train="$D/train.h5" --train.batch-size=-4
expect_error "batch larger than dataset" 2 "--train.batch-size" \
  train --data.train="$D/train.h5" --train.batch-size=100000 --output.dir="$TMP/o"
expect_error "bad model spec" 2 "--model.layers" \
  train --data.train="$D/train.h5" --model.layers=dense:10,sigmoid,dense:10 --output.dir="$TMP/o"
expect_error "unknown command" 2 "unknown command 'trian'" trian
expect_error "unknown prepare kind" 1 "unknown dataset 'cifar'" prepare cifar --out "$TMP/x"
expect_error "missing fashion-mnist source" 1 "$TMP/nosrc" prepare fashion-mnist --source "$TMP/nosrc" --out "$TMP/x"

echo "this is not HDF5" >"$TMP/text.h5"
expect_error "not an HDF5 file" 2 "$TMP/text.h5" train --data.train="$TMP/text.h5" --output.dir="$TMP/o"
expect_error "inspect missing file" 1 "$TMP/none.h5" inspect "$TMP/none.h5"
expect_error "eval corrupt checkpoint" 2 "$TMP/text.h5" eval --checkpoint="$TMP/text.h5" --data.test="$D/test.h5"
expect_error "eval missing checkpoint" 2 "$TMP/nockpt" eval --checkpoint="$TMP/nockpt" --data.test="$D/test.h5"

# Labels out of range need a file written by another tool; h5py is one users have.
if "$PY" -c 'import h5py, numpy' 2>/dev/null; then
  "$PY" - "$D/train.h5" "$TMP/badlabels.h5" <<'PYEOF'
import shutil, sys, h5py
shutil.copy(sys.argv[1], sys.argv[2])
with h5py.File(sys.argv[2], "r+") as f:
    f["labels"][7] = 10   # the file says num_classes = 10, so 10 is out of range
PYEOF
  expect_error "labels out of range" 2 "$TMP/badlabels.h5" \
    train --data.train="$TMP/badlabels.h5" --output.dir="$TMP/o"
  grep -q "10" "$TMP/err" || fail "labels out of range: the bad value is not reported"
  # NaN in the middle of a float dataset is found when a rank reads that batch, mid-training:
  # that rank reports it and the job is aborted, so no rank waits forever in the all-reduce.
  "$PY" - "$D/train.h5" "$TMP/nan.h5" <<'PYEOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as src, h5py.File(sys.argv[2], "w") as dst:
    x = src["samples"][...].astype(np.float32) / 255.0
    x[300, 0, 5, 5] = np.nan
    dst.create_dataset("samples", data=x, chunks=(16,) + x.shape[1:])
    dst.create_dataset("labels", data=src["labels"][...])
    for key, value in src.attrs.items():
        dst.attrs[key] = value
PYEOF
  expect_error "NaN in float samples mid-run" 2 "$TMP/nan.h5" \
    train --data.train="$TMP/nan.h5" --train.batch-size=16 --train.epochs=2 --output.dir="$TMP/o"
else
  fail "labels out of range: $PY has no h5py (launch/install-deps.sh installs python3-h5py)"
fi

finish
