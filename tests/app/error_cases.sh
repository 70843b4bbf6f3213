#!/usr/bin/env bash
# Every user-facing error: a one-line message that names the file or option, a hint, a
# non-zero exit on every rank, and no hang (each case runs under a timeout).
source "$(dirname "$0")/common.sh"
PY=${PYTHON_H5PY:-/usr/bin/python3}
# Every case here ends in a non-zero exit, after which Open MPI 4.1's mpiexec takes 1-2 s to
# return even when every process has already exited: the grace of odls_base_sigkill_timeout
# (1 s) between the SIGTERM and the SIGKILL it sends the job. That was over half of this
# script's time. The checks (exit status, one error line, no hang) do not rest on the grace.
export OMPI_MCA_odls_base_sigkill_timeout=0

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
expect_error "unknown weight init" 2 "--model.init" \
  train --data.train="$D/train.h5" --model.init=glorot --output.dir="$TMP/o"
expect_error "unknown model name" 2 "--model.name" \
  train --data.train="$D/train.h5" --model.name=resnet-huge --output.dir="$TMP/o"
expect_error "unknown optimizer" 2 "unknown optimizer 'adam' (--optimizer.name)" \
  train --data.train="$D/train.h5" --optimizer.name=adam --output.dir="$TMP/o"
expect_error "unknown schedule" 2 "unknown schedule 'cosin' (--schedule.name)" \
  train --data.train="$D/train.h5" --schedule.name=cosin --output.dir="$TMP/o"
expect_error "unknown command" 2 "unknown command 'trian'" trian
expect_error "unknown prepare kind" 1 "unknown dataset 'cifar'" prepare cifar --out "$TMP/x"
expect_error "missing fashion-mnist source" 1 "$TMP/nosrc" prepare fashion-mnist --source "$TMP/nosrc" --out "$TMP/x"

echo "this is not HDF5" >"$TMP/text.h5"
expect_error "not an HDF5 file" 2 "$TMP/text.h5" train --data.train="$TMP/text.h5" --output.dir="$TMP/o"
# A data file cut in half (an interrupted copy): a clean error at open on every rank.
cp "$D/train.h5" "$TMP/half.h5"
truncate -s $(( $(stat -c %s "$TMP/half.h5") / 2 )) "$TMP/half.h5"
for np in 1 2; do
  expect_error "truncated data file np$np" $np "cannot open data file '$TMP/half.h5' (option --data.train); it should hold the datasets 'samples' and 'labels': truncated file" \
    train --data.train="$TMP/half.h5" --output.dir="$TMP/o"
done
expect_error "truncated file in a multi-file dataset" 2 "'$TMP/half.h5'" \
  train --data.train="$D/train.h5,$TMP/half.h5" --output.dir="$TMP/o"
expect_error "glob matching nothing" 2 "no data file matches '$TMP/part-*.h5' (option --data.train)" \
  train --data.train="$TMP/part-*.h5" --output.dir="$TMP/o"
"$MPTRAIN" prepare synthetic --out "$TMP/badshape" --shape 1,8,8 --train-samples 64 --test-samples 8 >/dev/null
expect_error "files that disagree" 2 "data file '$TMP/badshape/train.h5' (option --data.train) does not match" \
  train --data.train="$D/train.h5,$TMP/badshape/train.h5" --output.dir="$TMP/o"
# The conv path is read from the environment at the first conv's plan(): a bad value is one
# line naming the variable, on every rank.
MPTRAIN_HOST_CONV=gemm expect_error "bad MPTRAIN_HOST_CONV" 2 "MPTRAIN_HOST_CONV='gemm' is not a host conv path" \
  train --data.train="$TMP/badshape/train.h5" --model.name=cnn --train.batch-size=16 --output.dir="$TMP/o"
expect_error "bad shuffle mode" 2 "--data.shuffle" train --data.train="$D/train.h5" --data.shuffle=random --output.dir="$TMP/o"
expect_error "bad on-nonfinite" 2 "--data.on-nonfinite" train --data.train="$D/train.h5" --data.on-nonfinite=drop --output.dir="$TMP/o"
printf 'label,a,b\n1,2,3\n0,x,5\n' >"$TMP/bad.csv"
expect_error "csv with a non-number" 1 "CSV file '$TMP/bad.csv' line 3, column 1" prepare csv --input "$TMP/bad.csv" --out "$TMP/csv.h5"
printf 'not numpy' >"$TMP/bad.npy"
expect_error "npy that is not NPY" 1 "'$TMP/bad.npy' is not an NPY file" prepare npy --samples "$TMP/bad.npy" --labels "$TMP/bad.npy" --out "$TMP/npy.h5"
expect_error "inspect missing file" 1 "$TMP/none.h5" inspect "$TMP/none.h5"
expect_error "eval corrupt checkpoint" 2 "$TMP/text.h5" eval --checkpoint="$TMP/text.h5" --data.test="$D/test.h5"
expect_error "eval missing checkpoint" 2 "$TMP/nockpt" eval --checkpoint="$TMP/nockpt" --data.test="$D/test.h5"

# Checkpoint, resume and stop options (issue #7).
expect_error "resume auto without a dir" 2 "--resume=auto needs --checkpoint.dir" \
  train --data.train="$D/train.h5" --resume=auto --output.dir="$TMP/o"
expect_error "resume a missing file" 2 "checkpoint file '$TMP/nockpt.h5' not found" \
  train --data.train="$D/train.h5" --resume="$TMP/nockpt.h5" --output.dir="$TMP/o"
expect_error "periodic checkpoints without a dir" 2 "--checkpoint.every-steps" \
  train --data.train="$D/train.h5" --checkpoint.every-steps=5 --output.dir="$TMP/o"
expect_error "keep zero" 2 "--checkpoint.keep must be >= 1" \
  train --data.train="$D/train.h5" --checkpoint.dir="$TMP/ck0" --checkpoint.keep=0 --output.dir="$TMP/o"
expect_error "bad time limit" 2 "--train.time-limit has a bad duration '1h'" \
  train --data.train="$D/train.h5" --train.time-limit=1h --output.dir="$TMP/o"
expect_error "time limit inside the margin" 2 "--train.time-limit (60 s) is not longer than --train.stop-margin (120 s)" \
  train --data.train="$D/train.h5" --train.time-limit=00:01:00 --output.dir="$TMP/o"
expect_error "timeline without an output dir" 2 "--output.timeline needs --output.dir" \
  train --data.train="$D/train.h5" --output.timeline --output.dir=
expect_error "tensorboard without an output dir" 2 "--output.tensorboard needs --output.dir" \
  train --data.train="$D/train.h5" --output.tensorboard --output.dir=
SLURM_JOB_END_TIME=soon expect_error "bad SLURM_JOB_END_TIME" 2 "SLURM_JOB_END_TIME='soon'" \
  train --data.train="$D/train.h5" --output.dir="$TMP/o"
# A checkpoint of one model does not resume another: the message names the first parameter.
"$MPIEXEC" -n 1 "$MPTRAIN" train --data.train="$D/train.h5" --model.layers=dense:32,relu,dense:10 \
  --train.max-steps=2 --checkpoint.dir="$TMP/ck-small" --output.dir="$TMP/o-small" >/dev/null 2>&1
expect_error "resume another model" 2 "dense0/weight" \
  train --data.train="$D/train.h5" --model.layers=dense:48,relu,dense:10 --checkpoint.dir="$TMP/ck-small" \
  --resume=auto --output.dir="$TMP/o"
expect_error "resume another network with the same weights" 2 \
  "was written for the model 'dense:32,relu,dense:10', this run builds 'dense:32,gelu,dense:10'" \
  train --data.train="$D/train.h5" --model.layers=dense:32,gelu,dense:10 --checkpoint.dir="$TMP/ck-small" \
  --resume=auto --output.dir="$TMP/o"
expect_error "resume with another optimizer" 2 "--optimizer.name=sgd, this run uses adamw" \
  train --data.train="$D/train.h5" --model.layers=dense:32,relu,dense:10 --checkpoint.dir="$TMP/ck-small" \
  --resume=auto --optimizer.name=adamw --output.dir="$TMP/o"

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

  # Malformed files a user's own tools produce; each error names the file and the dataset.
  "$PY" - "$TMP" <<'PYEOF'
import sys, h5py, numpy as np
d = sys.argv[1]
x = np.zeros((64, 1, 4, 4), np.uint8)
y = np.arange(64, dtype=np.int32) % 10
def write(name, samples, labels, classes=10):
    with h5py.File(f"{d}/{name}", "w") as f:
        f["samples"], f["labels"] = samples, labels
        if classes:
            f.attrs["num_classes"] = classes
write("short_labels.h5", x, y[:60])
write("rank1.h5", np.zeros(64, np.uint8), y)
write("int16.h5", x.astype(np.int16), y)
write("empty.h5", x[:0], y[:0])
write("plain.h5", np.random.default_rng(0).integers(0, 255, (64, 16), dtype=np.uint8), y, classes=0)
PYEOF
  for np in 1 2; do
    expect_error "samples/labels length mismatch np$np" $np "dataset 'labels' of data file '$TMP/short_labels.h5'" \
      train --data.train="$TMP/short_labels.h5" --output.dir="$TMP/o"
  done
  expect_error "samples of rank 1" 2 "dataset 'samples' of data file '$TMP/rank1.h5'" \
    train --data.train="$TMP/rank1.h5" --output.dir="$TMP/o"
  expect_error "samples of dtype int16" 2 "dataset 'samples' of data file '$TMP/int16.h5' (option --data.train) has unsupported dtype int16" \
    train --data.train="$TMP/int16.h5" --output.dir="$TMP/o"
  expect_error "empty dataset" 2 "dataset 'samples' of data file '$TMP/empty.h5' (option --data.train) holds no samples" \
    train --data.train="$TMP/empty.h5" --output.dir="$TMP/o"
  expect_error "plain h5py file without num_classes" 2 "--data.num-classes" \
    train --data.train="$TMP/plain.h5" --output.dir="$TMP/o"
  expect_error "fewer samples than ranks x batch" 2 "the training set '$TMP/plain.h5' (dataset 'samples') of 64 samples" \
    train --data.train="$TMP/plain.h5" --data.num-classes=10 --train.batch-size=40 --output.dir="$TMP/o"
  # The same plain file trains once the class count is given.
  if timeout 60 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" train --data.train="$TMP/plain.h5" \
      --data.num-classes=10 --train.batch-size=8 --model.layers=dense:8,relu,dense:10 \
      --output.dir="$TMP/o-plain" >"$TMP/out" 2>"$TMP/err"; then
    pass "plain h5py file trains with --data.num-classes"
  else
    fail "plain h5py file with --data.num-classes:"; cat "$TMP/err" >&2
  fi
else
  fail "labels out of range: $PY has no h5py (launch/install-deps.sh installs python3-h5py)"
fi

MPTRAIN_FAULT=bogus expect_error "malformed MPTRAIN_FAULT" 2 "MPTRAIN_FAULT='bogus'" \
  train --data.train="$D/train.h5" --output.dir="$TMP/o"
expect_error "unknown precision" 2 "--train.precision 'fp8'" \
  train --data.train="$D/train.h5" --train.precision=fp8 --output.dir="$TMP/o"

# [comm] options and `mptrain bench`.
expect_error "unknown all-reduce algorithm" 2 "--comm.allreduce" \
  train --data.train="$D/train.h5" --comm.allreduce=ring --output.dir="$TMP/o"
expect_error "unknown intra-node backend" 2 "--comm.intra" \
  train --data.train="$D/train.h5" --comm.intra=nvlink --output.dir="$TMP/o"
expect_error "unknown wire dtype" 2 "--comm.wire-dtype" \
  train --data.train="$D/train.h5" --comm.wire-dtype=fp8 --output.dir="$TMP/o"
expect_error "unknown cuda-aware-mpi value" 2 "--comm.cuda-aware-mpi: unknown value 'maybe'" \
  train --data.train="$D/train.h5" --comm.cuda-aware-mpi=maybe --output.dir="$TMP/o"
expect_error "negative ranks per node" 2 "--comm.ranks-per-node must be >= 0" \
  train --data.train="$D/train.h5" --comm.ranks-per-node=-1 --output.dir="$TMP/o"
expect_error "negative bucket size" 2 "--comm.bucket-mb" \
  train --data.train="$D/train.h5" --comm.bucket-mb=-1 --output.dir="$TMP/o"
expect_error "unknown overlap value" 2 "--comm.overlap: unknown value 'maybe'" \
  train --data.train="$D/train.h5" --comm.overlap=maybe --output.dir="$TMP/o"
expect_error "accumulate zero" 2 "--train.accumulate must be >= 1" \
  train --data.train="$D/train.h5" --train.accumulate=0 --output.dir="$TMP/o"
expect_error "unknown benchmark" 2 "unknown benchmark 'alltoall'" bench alltoall
expect_error "bad bench size" 2 "--max-bytes (-e) has a bad size '12Q'" bench allreduce -e 12Q
expect_error "unknown bench algorithm" 2 "--algos (-a) has unknown algorithm 'ring'" bench allreduce -a flat-mpi,ring
expect_error "bench ALGO@K without K" 2 "--algos (-a) entry 'flat-mpi@' has no ranks per node after '@'" bench allreduce -a flat-mpi@
expect_error "unknown bench option" 2 "unknown option '--sizes'" bench allreduce --sizes=4

finish
