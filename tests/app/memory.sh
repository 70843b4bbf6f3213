#!/usr/bin/env bash
# Planned memory (issue #8 "no allocation in the step", issue #10 "no allocation, no per-step
# reshaping"): every buffer a training step touches is created before the first step. The
# trainer counts the Tensor buffers its training thread creates inside steps, and the device
# arena's new slabs (cudaMalloc calls), and reports them in summary.json; here they must be 0
# across the models, precisions and options that plan extra buffers, and the reported peak
# must be positive and below what the run could not do without.
source "$(dirname "$0")/common.sh"

"$MPTRAIN" prepare synthetic --out "$TMP/data" --train-samples 768 --test-samples 128 >/dev/null
D="$TMP/data"
base=(train --data.train="$D/train.h5" --data.test="$D/test.h5" --train.max-steps=6
      --train.batch-size=32 --train.log-every=2 --output.progress=lines)

check() {  # check NAME NP ARGS...
  local name=$1 np=$2; shift 2
  local out="$TMP/$name" rc=0
  timeout 180 "$MPIEXEC" -n "$np" --oversubscribe "$MPTRAIN" "${base[@]}" --output.dir="$out" "$@" \
    >"$TMP/out" 2>"$TMP/err" || rc=$?
  if [ "$rc" -ne 0 ]; then fail "$name: exit $rc"; tail -5 "$TMP/err" >&2; return; fi
  local verdict
  verdict=$(/usr/bin/python3 - "$out/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
problems = []
if s.get("steps") != 6: problems.append(f"steps {s.get('steps')}, expected 6")
if s.get("step_tensor_allocations") != 0:
    problems.append(f"{s.get('step_tensor_allocations')} tensor allocations inside steps")
if s.get("step_device_slabs") != 0: problems.append(f"{s.get('step_device_slabs')} cudaMalloc inside steps")
peak = s.get("tensor_peak_mb", 0)
# The weights alone (f32 masters) are a floor for the peak.
if not peak * 2**20 >= 4 * s["num_params"]: problems.append(f"tensor_peak_mb {peak} below the weights")
print("; ".join(problems) if problems else f"ok peak {peak:.1f} MiB")
PY
)
  case "$verdict" in
    ok*) pass "$name np$np: 0 allocations inside steps, $verdict" ;;
    *) fail "$name np$np: $verdict" ;;
  esac
  if ! grep -q '^memory: tensors peak .* 0 tensor allocations inside steps' "$TMP/out"; then
    fail "$name: no memory line in the log"
  fi
}

check mlp-fp32 1 --model.name=mlp
check mlp-fp16-overlap 2 --model.name=mlp --train.precision=fp16 --comm.overlap=on --comm.bucket-mb=0.5
check cnn-bf16-accumulate 2 --model.name=cnn --train.precision=bf16 --train.accumulate=2 \
  --optimizer.name=adamw --optimizer.clip-norm=1
check resnet-syncbn-ckpt 2 --model.name=resnet-mini --model.sync-bn=true \
  --checkpoint.dir="$TMP/ckpt" --checkpoint.every-steps=2
check layers-cache-nodes 2 --model.layers=conv:4:3,bn,relu,avgpool:2,dropout:0.2,flatten,dense:16,gelu,dense:10 \
  --data.cache=memory --comm.ranks-per-node=1

finish
