#!/usr/bin/env bash
# The prepare -> train -> eval -> inspect chain on a small synthetic set, on NP ranks: the loss
# must fall, test accuracy must beat chance (0.1) by a wide margin, and eval of the saved
# checkpoint must reproduce the accuracy the training run reported.
source "$(dirname "$0")/common.sh"
NP=${1:-2}
D="$TMP/data"

"$MPTRAIN" prepare synthetic --out "$D" --train-samples 4096 --test-samples 1024 --classes 10 --seed 3 \
  >"$TMP/prepare.log"
[ -f "$D/train.h5" ] && [ -f "$D/test.h5" ] && pass "prepare wrote train.h5 and test.h5" || fail "prepare"

timeout 300 "$MPIEXEC" -n "$NP" --oversubscribe "$MPTRAIN" train \
  --data.train="$D/train.h5" --data.test="$D/test.h5" --model.layers=dense:128,relu,dense:10 \
  --train.epochs=2 --train.batch-size=32 --train.log-every=10 --optimizer.lr=0.05 \
  --output.dir="$TMP/run" --checkpoint.dir="$TMP/ckpt" >"$TMP/train.log" 2>&1 ||
  { fail "train exited non-zero"; cat "$TMP/train.log" >&2; finish; }
pass "train on $NP ranks"
# More than one rank per node: the gradients live in the node's shared window, and the shm
# all-reduce reads the peers' there (docs/architecture.md, "Registered gradients").
if [ "$NP" -gt 1 ]; then
  grep -q "intra shm on registered gradients" "$TMP/train.log" && pass "gradients registered" ||
    { fail "gradients registered"; grep allreduce "$TMP/train.log" >&2; }
fi

python3 - "$TMP/run" "$NP" <<'PYEOF' && pass "metrics.jsonl and summary.json" || fail "metrics/summary checks"
import json, sys
run, np = sys.argv[1], int(sys.argv[2])
steps = [json.loads(l) for l in open(f"{run}/metrics.jsonl") if '"loss"' in l]
for k in ("step", "epoch", "loss", "lr", "samples_per_s", "comm_time_s", "exposed_comm_time_s"):
    assert all(k in s for s in steps), k
assert all(s["comm_time_s"] >= 0 and s["exposed_comm_time_s"] >= 0 for s in steps), steps
if np > 1:  # the gradients were all-reduced, so the communication thread spent time on them
    assert sum(s["comm_time_s"] for s in steps) > 0, steps
first, last = steps[0]["loss"], steps[-1]["loss"]
assert last < 0.5 * first, (first, last)
s = json.load(open(f"{run}/summary.json"))
for k in ("world_size", "global_batch", "epochs", "steps", "final_train_loss", "test_accuracy",
          "samples_per_s", "wall_s", "comm_time_s", "exposed_comm_time_s", "exposed_comm_fraction",
          "allreduce", "buckets", "accumulate"):
    assert k in s, k
assert s["world_size"] == np and s["global_batch"] == 32 * np, s
assert s["steps"] == 2 * (4096 // (32 * np)), s
assert s["test_accuracy"] > 0.6, s
# The skew split (shm on a node of more ranks than one measures it; -1 elsewhere): consistent
# with the times it splits.
w = s["exposed_peer_wait_s"]
if np > 1:
    assert 0 <= w <= s["exposed_comm_time_s"] + 1e-9, s
    assert 0 <= s["comm_excluding_peer_wait_s"] <= s["comm_time_s"] + 1e-9, s
    assert 0 <= s["exposed_comm_excluding_peer_wait_s"] <= s["exposed_comm_time_s"] + 1e-9, s
    assert all("exposed_peer_wait_s" in r for r in steps), steps[0]
else:
    assert w == -1 and s["comm_excluding_peer_wait_s"] == -1, s
print(f"loss {first:.3f} -> {last:.3f}, test accuracy {s['test_accuracy']:.4f}")
PYEOF

timeout 120 "$MPIEXEC" -n "$NP" --oversubscribe "$MPTRAIN" eval --checkpoint="$TMP/ckpt" \
  --data.test="$D/test.h5" >"$TMP/eval.log" 2>&1 || { fail "eval exited non-zero"; cat "$TMP/eval.log" >&2; }
want=$(python3 -c "import json;print('%.4f' % json.load(open('$TMP/run/summary.json'))['test_accuracy'])")
got=$(sed -n 's/^eval: accuracy \([0-9.]*\).*/\1/p' "$TMP/eval.log")
[ "$want" = "$got" ] && pass "eval reproduces test accuracy $got" || fail "eval accuracy '$got' != train's '$want'"

"$MPTRAIN" inspect "$TMP/ckpt/$(cat "$TMP/ckpt/latest")" >"$TMP/inspect.log" 2>&1 &&
  grep -q "dense0/weight" "$TMP/inspect.log" && grep -q "^  checksums: verified" "$TMP/inspect.log" &&
  pass "inspect checkpoint" || fail "inspect checkpoint"
"$MPTRAIN" inspect "$D/train.h5" >"$TMP/inspect2.log" 2>&1 && grep -q "4096" "$TMP/inspect2.log" &&
  pass "inspect data file" || fail "inspect data file"
# Into a file first: `grep -q` on a pipe exits at the first match and, under pipefail, the
# writer's SIGPIPE would fail the check.
"$MPTRAIN" train --help >"$TMP/help.txt" && grep -q -- "--optimizer.lr" "$TMP/help.txt" &&
  pass "train --help" || fail "train --help"
finish
