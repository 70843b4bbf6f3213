#!/usr/bin/env bash
# train -> eval -> export -> predict -> numpy on small synthetic sets, for an MLP, a CNN, a
# BatchNorm ResNet (fp32) and a GELU+BN MLP (fp16): eval is the same on 1 and 2 ranks (top-1,
# top-5, confusion matrix), predict reproduces eval exactly, docs/predict_numpy.py reproduces
# predict's logits, and modified, mismatched, foreign and missing model files are refused with
# exit code 2 and one clear line.
source "$(dirname "$0")/common.sh"
PY=${PYTHON_H5PY:-/usr/bin/python3}
NUMPY_REF="$(dirname "$0")/../../docs/predict_numpy.py"
D="$TMP/data"

"$MPTRAIN" prepare synthetic --out "$D" --train-samples 1024 --test-samples 300 --shape 1,12,12 \
  --classes 10 --seed 5 >"$TMP/prepare.log"

# expect_reject NAME "expected substring" ARGS...: exit 2, one error line holding the text.
expect_reject() {
  local name=$1 expected=$2; shift 2
  local rc=0
  timeout 60 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  local lines
  lines=$(grep -c '^mptrain: error:' "$TMP/err" || true)
  if [ "$rc" -ne 2 ]; then fail "$name: exit code $rc, expected 2"; cat "$TMP/err" >&2; return; fi
  if ! grep -qF -- "$expected" "$TMP/err"; then
    fail "$name: stderr lacks '$expected':"; sed 's/^/    /' "$TMP/err" >&2; return
  fi
  if [ "$lines" -ne 1 ]; then fail "$name: $lines error lines, expected 1"; cat "$TMP/err" >&2; return; fi
  pass "$name: $(grep '^mptrain: error:' "$TMP/err")"
}

# The metric part of an eval/predict line: "accuracy A  top5 B  loss C  samples N".
metrics_of() { sed -n 's/^\(eval\|predict\): \(accuracy .* samples [0-9]*\).*/\2/p' "$1"; }

run_model() {  # run_model NAME SPEC [PRECISION]
  local name=$1 spec=$2 precision=${3:-fp32} dir="$TMP/$1"
  mkdir -p "$dir"
  if ! timeout 300 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" train --data.train="$D/train.h5" \
      --data.test="$D/test.h5" --model.layers="$spec" --train.epochs=1 --train.batch-size=32 \
      --optimizer.lr=0.05 --train.precision="$precision" --output.dir="$dir/run" \
      --checkpoint.dir="$dir/ckpt" >"$dir/train.log" 2>&1; then
    fail "$name: train exited non-zero"; cat "$dir/train.log" >&2; return
  fi
  grep -q "test_top5" "$dir/train.log" && pass "$name: periodic evaluation reports top-5" ||
    fail "$name: no test_top5 in the training log"

  # eval on 1 and 2 ranks: the same metrics and the same confusion matrix.
  for np in 1 2; do
    timeout 120 "$MPIEXEC" -n $np --oversubscribe "$MPTRAIN" eval --checkpoint="$dir/ckpt" \
      --data.test="$D/test.h5" --eval.confusion="$dir/confusion$np.csv" >"$dir/eval$np.log" 2>&1 ||
      { fail "$name: eval np$np exited non-zero"; cat "$dir/eval$np.log" >&2; return; }
  done
  local e1 e2
  e1=$(metrics_of "$dir/eval1.log"); e2=$(metrics_of "$dir/eval2.log")
  [ -n "$e1" ] && [ "$e1" = "$e2" ] && pass "$name: eval np1 = np2 ($e1)" ||
    fail "$name: eval np1 '$e1' != np2 '$e2'"
  # The periodic evaluation is the same code: the training run's last figures are eval's.
  local t
  t=$("$PY" -c "import json,sys; s=json.load(open(sys.argv[1])); print('accuracy %.4f  top5 %.4f  loss %.4f' % (s['test_accuracy'], s['test_top5_accuracy'], s['test_loss']))" "$dir/run/summary.json")
  [ "$t  samples 300" = "$e2" ] && pass "$name: periodic evaluation = eval ($t)" ||
    fail "$name: training's evaluation '$t' != eval '$e2'"
  cmp -s "$dir/confusion1.csv" "$dir/confusion2.csv" && pass "$name: confusion np1 = np2" ||
    fail "$name: confusion matrices differ between 1 and 2 ranks"
  "$PY" - "$dir/confusion2.csv" "$dir/eval2.log" <<'PYEOF' && pass "$name: confusion matrix adds up" || fail "$name: confusion matrix"
import re, sys
rows = [l.strip().split(",") for l in open(sys.argv[1])]
assert rows[0] == ["true/pred"] + [str(c) for c in range(10)], rows[0]
m = [[int(v) for v in r[1:]] for r in rows[1:]]
assert [r[0] for r in rows[1:]] == [str(c) for c in range(10)]
line = open(sys.argv[2]).read()
acc = float(re.search(r"accuracy ([0-9.]+)", line).group(1))
n = int(re.search(r"samples ([0-9]+)", line).group(1))
assert sum(map(sum, m)) == n == 300, (sum(map(sum, m)), n)
assert abs(sum(m[i][i] for i in range(10)) / n - acc) < 6e-5, acc
PYEOF

  timeout 120 "$MPTRAIN" export --checkpoint="$dir/ckpt" --out="$dir/model.h5" >"$dir/export.log" 2>&1 &&
    [ -f "$dir/model.h5" ] && [ ! -e "$dir/model.h5.tmp" ] && pass "$name: export" ||
    { fail "$name: export"; cat "$dir/export.log" >&2; return; }

  timeout 120 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" predict --model="$dir/model.h5" \
    --data="$D/test.h5" --out="$dir/preds.h5" >"$dir/predict.log" 2>&1 ||
    { fail "$name: predict exited non-zero"; cat "$dir/predict.log" >&2; return; }
  local p
  p=$(metrics_of "$dir/predict.log")
  [ -n "$p" ] && [ "$p" = "$e2" ] && pass "$name: predict = eval exactly ($p)" ||
    fail "$name: predict '$p' != eval '$e2'"
  # inspect names both files it did not write as data or checkpoints.
  "$MPTRAIN" inspect "$dir/model.h5" 2>&1 | head -1 | grep -q ": mptrain exported model" &&
    "$MPTRAIN" inspect "$dir/preds.h5" 2>&1 | head -1 | grep -q ": mptrain predictions" &&
    pass "$name: inspect recognises the export and predictions files" ||
    fail "$name: inspect does not recognise model.h5 or preds.h5"

  # numpy computes in fp32: a 16-bit model is compared with predict in fp32 (same weights).
  if [ "$precision" != fp32 ]; then
    timeout 120 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" predict --model="$dir/model.h5" \
      --data="$D/test.h5" --precision=fp32 --out="$dir/preds.h5" >"$dir/predict32.log" 2>&1 ||
      { fail "$name: predict --precision=fp32 exited non-zero"; cat "$dir/predict32.log" >&2; return; }
  fi
  "$PY" "$NUMPY_REF" "$dir/model.h5" "$D/test.h5" --out "$dir/numpy.npz" >"$dir/numpy.log" 2>&1 ||
    { fail "$name: predict_numpy.py failed"; cat "$dir/numpy.log" >&2; return; }
  "$PY" - "$dir/preds.h5" "$dir/numpy.npz" <<'PYEOF' && pass "$name: numpy reference = predict" || fail "$name: numpy reference differs"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    pred, logits = np.asarray(f["predictions"]), np.asarray(f["logits"])
ref = np.load(sys.argv[2])
rp, rl = ref["predictions"], ref["logits"]
assert logits.shape == rl.shape, (logits.shape, rl.shape)
scale = max(1.0, float(np.abs(rl).max()))
err = float(np.abs(logits - rl).max())
assert err <= 1e-4 * scale, f"max logit difference {err} (scale {scale})"
# The same class everywhere, except where numpy's own top two are tied within that tolerance.
top2 = np.sort(rl, axis=1)[:, -2:]
tied = (top2[:, 1] - top2[:, 0]) <= 2e-4 * scale
assert np.all((pred == rp) | tied), np.nonzero(pred != rp)
print(f"max logit difference {err:.2e}, {int(np.sum(pred != rp))} tie(s) resolved differently")
PYEOF
}

run_model mlp "dense:64,relu,dropout:0.1,dense:10"
run_model cnn "conv:8:3:pad=1,relu,maxpool:2,conv:8:3:stride=2:pad=1,gelu,avgpool:3,flatten,dense:16,relu,dense:10"
run_model resnet "conv:8:3:pad=1,bn,relu,resblock:8,resblock:16:stride=2,maxpool:2,gap,dense:10"
run_model mlp16 "dense:64,gelu,bn,dense:10" fp16
# The resnet's buffers are the trained running statistics, not their initial values.
"$PY" - "$TMP/resnet/model.h5" <<'PYEOF' && pass "resnet: export carries trained BN statistics" || fail "resnet: BN buffers"
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    names = [n.decode() for n in f.attrs["buffer_names"]]  # fixed-length strings: bytes in h5py
    assert "bn1/running_mean" in names and "resblock4/proj_bn/running_var" in names, names
    m = np.asarray(f["buffers/bn1/running_mean"])
    assert np.abs(m).max() > 1e-3, m
PYEOF

M="$TMP/mlp/model.h5"
# A modified weight: one float changed in place, nothing else.
cp "$M" "$TMP/tampered.h5"
"$PY" -c "import h5py,sys; f=h5py.File(sys.argv[1],'r+'); d=f['weights/dense0/weight']; d[0,0]=d[0,0]+0.5" "$TMP/tampered.h5"
expect_reject "modified weight" \
  "$TMP/tampered.h5: weights do not match their SHA-256 (file modified or corrupt) (hint: re-export it" \
  predict --model="$TMP/tampered.h5" --data="$D/test.h5"
# A spec that no longer matches the weights: the message names the layer.
cp "$M" "$TMP/respec.h5"
"$PY" -c "import h5py,sys; f=h5py.File(sys.argv[1],'r+'); f.attrs['model_spec']='dense:32,relu,dropout:0.1,dense:10'" "$TMP/respec.h5"
expect_reject "spec does not match weights" "$TMP/respec.h5: layer dense0 of model 'dense:32,relu,dropout:0.1,dense:10' expects 'dense0/weight' of shape (32,144) but the file holds (64,144)" \
  predict --model="$TMP/respec.h5" --data="$D/test.h5"
expect_reject "checkpoint is not an export file" "$TMP/mlp/ckpt/$(cat "$TMP/mlp/ckpt/latest"): not an mptrain export file" \
  predict --model="$TMP/mlp/ckpt/$(cat "$TMP/mlp/ckpt/latest")" --data="$D/test.h5"
expect_reject "data file is not an export file" "$D/test.h5: not an mptrain export file" \
  predict --model="$D/test.h5" --data="$D/test.h5"
expect_reject "missing model file" "$TMP/none.h5: model file not found" \
  predict --model="$TMP/none.h5" --data="$D/test.h5"
expect_reject "export of a missing checkpoint" "$TMP/nockpt" export --checkpoint="$TMP/nockpt" --out="$TMP/x.h5"
[ ! -e "$TMP/x.h5" ] && pass "no file left by a failed export" || fail "a failed export left $TMP/x.h5"
# Data prepared with other statistics would be normalised differently: refused, naming both.
"$MPTRAIN" prepare synthetic --out "$TMP/other" --train-samples 64 --test-samples 300 --shape 1,12,12 \
  --classes 10 --seed 9 >/dev/null
expect_reject "data normalised differently" "but model '$M' was trained with" \
  predict --model="$M" --data="$TMP/other/test.h5"
finish
