#!/usr/bin/env bash
# Mixed precision end to end: fp16 reaches the fp32 test accuracy on Fashion-MNIST within 0.5
# points (same seed and epochs), eval reproduces it from the FP32 master weights, and a
# non-finite loss is an error naming the rank, step and layer, or a logged skip on request.
source "$(dirname "$0")/common.sh"
PY=${PYTHON_H5PY:-/usr/bin/python3}
FMNIST=${FMNIST_SOURCE:-/usr/share/datasets/fashion-mnist}

"$MPTRAIN" prepare fashion-mnist --source "$FMNIST" --out "$TMP/fm" >/dev/null
for precision in fp32 fp16; do
  timeout 300 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" train --data.train="$TMP/fm/train.h5" \
    --data.test="$TMP/fm/test.h5" --train.epochs=2 --train.batch-size=64 --train.log-every=200 \
    --train.precision=$precision --output.dir="$TMP/$precision" --checkpoint.dir="$TMP/$precision/ckpt" \
    >"$TMP/$precision.log" 2>&1 || { fail "train $precision"; cat "$TMP/$precision.log" >&2; finish; }
done
python3 - "$TMP" <<'PYEOF' && pass "fp16 within 0.5 points of fp32" || fail "fp16 accuracy"
import json, sys
s32 = json.load(open(f"{sys.argv[1]}/fp32/summary.json"))
s16 = json.load(open(f"{sys.argv[1]}/fp16/summary.json"))
print(f"fp32 {s32['test_accuracy']:.4f}  fp16 {s16['test_accuracy']:.4f}  loss scale {s16['loss_scale']}  skipped {s16['skipped_steps']}")
assert s16["precision"] == "fp16" and s32["precision"] == "fp32"
assert s32["test_accuracy"] >= 0.85, s32
assert abs(s16["test_accuracy"] - s32["test_accuracy"]) <= 0.005, (s16, s32)
steps = [json.loads(l) for l in open(f"{sys.argv[1]}/fp16/metrics.jsonl") if '"loss"' in l]
assert all("loss_scale" in s and "skipped_steps" in s for s in steps)
PYEOF

timeout 120 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" eval --checkpoint="$TMP/fp16/ckpt" \
  --data.test="$TMP/fm/test.h5" >"$TMP/eval.log" 2>&1 || fail "eval fp16 checkpoint"
want=$(python3 -c "import json;print('%.4f' % json.load(open('$TMP/fp16/summary.json'))['test_accuracy'])")
got=$(sed -n 's/^eval: accuracy \([0-9.]*\).*/\1/p' "$TMP/eval.log")
[ "$want" = "$got" ] && pass "eval of the fp16 checkpoint gives $got" || fail "eval '$got' != '$want'"

# A float sample of 1e6 overflows fp16 in the first layer: the loss goes non-finite.
"$MPTRAIN" prepare synthetic --out "$TMP/syn" --train-samples 512 --test-samples 64 --dtype float32 >/dev/null
"$PY" - "$TMP/syn/train.h5" <<'PYEOF'
import sys, h5py
with h5py.File(sys.argv[1], "r+") as f:
    f["samples"][100] = 1e6
PYEOF
rc=0
timeout 60 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" train --data.train="$TMP/syn/train.h5" \
  --train.precision=fp16 --train.batch-size=16 --output.dir="$TMP/o" >"$TMP/nf.out" 2>"$TMP/nf.err" || rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "non-finite loss at step .* layer dense0" "$TMP/nf.err" &&
  grep -q "mptrain: error: \[rank [01] on" "$TMP/nf.err"; then
  pass "non-finite loss is an error: $(grep '^mptrain: error' "$TMP/nf.err")"
else
  fail "non-finite loss error (exit $rc)"; cat "$TMP/nf.err" >&2
fi
timeout 60 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" train --data.train="$TMP/syn/train.h5" \
  --train.precision=fp16 --train.batch-size=16 --amp.on-nonfinite-loss=skip --output.dir="$TMP/skip" \
  >"$TMP/skip.log" 2>&1 || fail "skip mode exited non-zero"
python3 -c "import json,sys; s=json.load(open('$TMP/skip/summary.json')); assert s['skipped_steps'] >= 1, s" &&
  grep -q "non-finite loss on rank" "$TMP/skip.log" && pass "--amp.on-nonfinite-loss=skip logs and skips" ||
  fail "skip mode summary"

# The same with the cuda pipeline's late reports (MPTRAIN_REPORT_LAG=1): the host never reads
# the loss inside a step, so the device poisons the gradients of a non-finite loss (the step
# is skipped, the weights kept) and the host reports it a step later: an error naming the
# step, or the skip line.
rc=0
MPTRAIN_REPORT_LAG=1 timeout 60 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" train \
  --data.train="$TMP/syn/train.h5" --train.precision=fp16 --train.batch-size=16 \
  --output.dir="$TMP/o-late" >"$TMP/nf-late.out" 2>"$TMP/nf-late.err" || rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] &&
    grep -q "mptrain: error: \[rank [01] on .*non-finite loss at step [0-9]* (seen on the device; the step was skipped" "$TMP/nf-late.err"; then
  pass "late reports: a non-finite loss is an error: $(grep '^mptrain: error' "$TMP/nf-late.err")"
else
  fail "late reports: non-finite loss error (exit $rc)"; cat "$TMP/nf-late.err" >&2
fi
MPTRAIN_REPORT_LAG=1 timeout 60 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" train \
  --data.train="$TMP/syn/train.h5" --train.precision=fp16 --train.batch-size=16 \
  --amp.on-nonfinite-loss=skip --output.dir="$TMP/skip-late" >"$TMP/skip-late.log" 2>&1 ||
  fail "late reports: skip mode exited non-zero"
python3 - "$TMP/skip" "$TMP/skip-late" <<'PYEOF' && grep -q "non-finite loss on rank" "$TMP/skip-late.log" &&
import json, sys
now, late = (json.load(open(d + "/summary.json")) for d in sys.argv[1:])
for k in ("skipped_steps", "final_train_loss", "loss_scale", "steps"):
    assert now[k] == late[k], (k, now[k], late[k])
assert late["skipped_steps"] >= 1, late
PYEOF
  pass "late reports: --amp.on-nonfinite-loss=skip skips the same steps as lag 0" ||
  fail "late reports: skip mode differs from lag 0"
# --amp.fail-at-min-scale: an overflow at the minimum scale ends the run on every rank with one
# line naming the option, from the step's report, read at once (lag 0) or a step late (lag 1).
for lag in 0 1; do
  rc=0
  MPTRAIN_REPORT_LAG=$lag timeout 60 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" train \
    --data.train="$TMP/fm/train.h5" --train.precision=fp16 --train.batch-size=32 --train.max-steps=5 \
    --amp.init-scale=1e30 --amp.min-scale=1e30 --amp.max-scale=1e30 --amp.fail-at-min-scale \
    --output.dir="$TMP/minscale$lag" >"$TMP/minscale$lag.out" 2>"$TMP/minscale$lag.err" || rc=$?
  if [ "$rc" -eq 2 ] &&
      [ "$(grep -c '^mptrain: error:.*gradients overflow even at the minimum loss scale .*(--amp.fail-at-min-scale)' "$TMP/minscale$lag.err")" -ge 1 ]; then
    pass "lag $lag: an overflow at the minimum scale ends the run: $(grep -m1 '^mptrain: error' "$TMP/minscale$lag.err")"
  else
    fail "lag $lag: --amp.fail-at-min-scale (exit $rc)"; cat "$TMP/minscale$lag.err" >&2
  fi
done
rc=0
MPTRAIN_REPORT_LAG=x timeout 60 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" train \
  --data.train="$TMP/syn/train.h5" --output.dir="$TMP/badlag" >"$TMP/badlag.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "MPTRAIN_REPORT_LAG is 'x'" "$TMP/badlag.log" &&
  pass "a bad MPTRAIN_REPORT_LAG is one error line" || { fail "bad MPTRAIN_REPORT_LAG (exit $rc)"; cat "$TMP/badlag.log" >&2; }

# Whether the 16-bit GEMMs take their operands or widen them: the start line and summary.json's
# gemm_operands say the same. fp16 on the host always widens (oneDNN 2.6 has no CPU fp16
# matmul), bf16 through BLAS too; bf16 through oneDNN takes them where the CPU has AMX or
# AVX512-BF16 (docs/perf.md), which this checks only for agreement.
gemm_case() {  # gemm_case NAME WANT(bf16|fp32|any) LOG SUMMARY
  local name=$1 want=$2 log=$3 summary=$4 got said
  got=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['gemm_operands'])" "$summary")
  said=$(grep -c "GEMMs: 16-bit operands, f32 sums" "$log" || true)
  if { [ "$want" = any ] || [ "$got" = "$want" ]; } &&
      { { [ "$got" = fp32 ] && [ "$said" -eq 0 ] && grep -q "GEMMs: widened to f32" "$log"; } ||
        { [ "$got" != fp32 ] && [ "$said" -ge 1 ]; }; }; then
    pass "$name: gemm_operands $got, as the start line says"
  else
    fail "$name: gemm_operands '$got' (want $want), start line: $(grep 'GEMMs:' "$log")"
  fi
}
gemm_case "fp16 on the host" fp32 "$TMP/fp16.log" "$TMP/fp16/summary.json"
for matmul in blas auto; do
  timeout 60 "$MPIEXEC" -n 1 "$MPTRAIN" train --data.train="$TMP/syn/train.h5" --train.max-steps=3 \
    --schedule.warmup-steps=0 --train.precision=bf16 --kernels.matmul=$matmul \
    --output.dir="$TMP/gemm-$matmul" >"$TMP/gemm-$matmul.log" 2>&1 || fail "bf16 with --kernels.matmul=$matmul"
done
gemm_case "bf16 through BLAS" fp32 "$TMP/gemm-blas.log" "$TMP/gemm-blas/summary.json"
gemm_case "bf16 through oneDNN" any "$TMP/gemm-auto.log" "$TMP/gemm-auto/summary.json"
finish
