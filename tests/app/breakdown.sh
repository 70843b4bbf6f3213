#!/usr/bin/env bash
# The step-time breakdown (issue #9): every logged window carries data_wait, forward, backward,
# comm (total and exposed), optimizer and checkpoint; on every rank those parts explain its
# window within 5 %; a rank made slower (MPTRAIN_FAULT=slow-rank) is named as the straggler;
# summary.json carries the run's totals.
source "$(dirname "$0")/common.sh"
PY=/usr/bin/python3
D="$TMP/data"
"$MPTRAIN" prepare synthetic --out "$D" --train-samples 2048 --test-samples 64 --shape 1,16,16 \
  --classes 10 --seed 9 >"$TMP/prepare.log"
COMMON=(--data.train="$D/train.h5" --model.layers=dense:1024,relu,dense:1024,relu,dense:10
        --train.batch-size=32 --train.log-every=10)

# check_windows DIR: every window's fields present and non-negative, parts within 5 % of it.
check_windows() {
  $PY - "$1/metrics.jsonl" "$1/summary.json" <<'PY'
import json, sys
parts = ["data_wait_s", "forward_s", "backward_s", "exposed_comm_time_s", "optimizer_s", "checkpoint_s"]
windows = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
assert len(windows) >= 3, len(windows)
for r in windows:
    for key in parts + ["comm_time_s", "window_s", "other_s", "accounted_fraction", "straggler_rank"]:
        assert key in r, (key, r)
    for key in parts:
        assert r[key] >= 0, (key, r)
    assert r["forward_s"] > 0 and r["backward_s"] > 0 and r["optimizer_s"] > 0, r
    assert 0.95 <= r["accounted_fraction"] <= 1.0 + 1e-9, r
summary = json.load(open(sys.argv[2]))
for key in ["forward_s", "backward_s", "optimizer_s", "data_wait_s", "exposed_comm_time_s"]:
    assert summary[key] >= 0, (key, summary)
assert summary["forward_s"] > 0 and summary["backward_s"] > 0, summary
print(f"{len(windows)} windows, worst accounted {min(r['accounted_fraction'] for r in windows):.3f}")
PY
}

for np in 1 2; do
  out="$TMP/np$np"
  if "$MPIEXEC" -n "$np" --oversubscribe "$MPTRAIN" train "${COMMON[@]}" --train.max-steps=40 \
      --checkpoint.dir="$out/ckpt" --checkpoint.every-steps=15 --output.dir="$out" >"$out.log" 2>&1 &&
      result=$(check_windows "$out" 2>&1) && grep -q "ms/step: data [0-9.]* fwd [0-9.]* bwd [0-9.]* exposed [0-9.]* opt [0-9.]* ckpt [0-9.]* other" "$out.log"; then
    pass "$np rank(s): $result; the log line carries ms/step per part"
  else
    fail "$np rank(s): breakdown"; echo "$result" >&2; tail -5 "$out.log" >&2
  fi
done

# The parts are measured, not derived: a checkpoint every window shows up in checkpoint_s.
if $PY -c 'import json,sys; rs=[r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]; sys.exit(0 if any(r["checkpoint_s"] > 0 for r in rs) else 1)' "$TMP/np2/metrics.jsonl"; then
  pass "checkpoints appear in checkpoint_s"
else
  fail "checkpoint_s stays 0 with --checkpoint.every-steps=15"
fi

# A straggler: rank 1 sleeps 40 ms in every forward.
out="$TMP/slow"
if MPTRAIN_FAULT=slow-rank:1:40 "$MPIEXEC" -n 2 "$MPTRAIN" train "${COMMON[@]}" --train.max-steps=20 \
    --output.dir="$out" >"$out.log" 2>&1 &&
    grep -q "^straggler: rank 1 busy" "$out.log" &&
    $PY -c 'import json,sys; rs=[r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]; sys.exit(0 if all(r["straggler_rank"] == 1 and r["straggler_ratio"] > 1.2 for r in rs) else 1)' "$out/metrics.jsonl"; then
  pass "a rank 40 ms slower per step: $(grep -m1 '^straggler' "$out.log")"
else
  fail "slow rank not named"; cat "$out.log" >&2
fi

finish
