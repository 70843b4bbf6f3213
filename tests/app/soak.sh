#!/usr/bin/env bash
# Soak (issue #11), reduced: perf/soak.sh on 2 ranks for SOAK_STEPS steps (default 6000) with a
# checkpoint every 50 steps (synchronous, then async after a resume), an evaluation every epoch
# and a window every 10 steps: every rank's RSS and open descriptors stay flat after the
# warm-up (perf/soak_check.py), metrics.jsonl and summary.json carry them per rank, and the
# resumed phase appends to metrics.jsonl. The checker is then shown leaks it must catch.
source "$(dirname "$0")/common.sh"
PY=/usr/bin/python3
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
STEPS=${SOAK_STEPS:-6000}
HALF=$((STEPS / 2))
OUT="$TMP/soak"

if MPIEXEC="$MPIEXEC" bash "$ROOT/perf/soak.sh" --mptrain "$MPTRAIN" --steps "$STEPS" --out "$OUT" \
    >"$TMP/soak.txt" 2>"$TMP/soak.err"; then
  pass "soak of $STEPS steps: $(grep -c '| ok |' "$TMP/soak.txt") phase x rank rows flat; $(tr '\n' ';' <"$TMP/soak.err")"
else
  fail "soak of $STEPS steps"; cat "$TMP/soak.txt" "$TMP/soak.err" >&2
fi
cat "$TMP/soak.txt"
[ "$(grep -c '| ok |' "$TMP/soak.txt")" -eq 4 ] && pass "the table has 2 phases x 2 ranks, all ok" ||
  fail "the table has not 4 ok rows"

# The instrumentation itself: per-rank arrays in every window and in summary.json, plausible
# values, and both phases' windows in one metrics.jsonl (a resumed run appends).
if result=$($PY - "$OUT/run/metrics.jsonl" "$OUT/run/summary.json" "$HALF" "$STEPS" <<'PY' 2>&1
import json, sys
windows = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
summary = json.load(open(sys.argv[2]))
half, steps = int(sys.argv[3]), int(sys.argv[4])
for w in windows:
    assert len(w["rss_mb"]) == 2 and len(w["open_fds"]) == 2, w
    assert all(5 < v < 4096 for v in w["rss_mb"]), w
    assert all(isinstance(v, int) and 3 <= v < 1024 for v in w["open_fds"]), w
assert any(w["step"] == half for w in windows) and windows[-1]["step"] == steps, \
    "metrics.jsonl lacks the first phase or the last step: not appended on resume?"
assert [w["step"] for w in windows] == sorted(w["step"] for w in windows), "steps out of order"
for key in ["rss_mb_first", "rss_mb_last", "rss_mb_max", "open_fds_first", "open_fds_last", "open_fds_max"]:
    assert len(summary[key]) == 2, (key, summary.get(key))
last = windows[-1]
assert summary["rss_mb_last"] == last["rss_mb"] and summary["open_fds_last"] == last["open_fds"], summary
assert all(m >= l for m, l in zip(summary["rss_mb_max"], summary["rss_mb_last"])), summary
print(f"{len(windows)} windows; summary rss_mb_max {summary['rss_mb_max']}, open_fds_last {summary['open_fds_last']}")
PY
); then
  pass "rss_mb and open_fds per rank in every window and in summary.json: $result"
else
  fail "instrumentation: $result"
fi

# The checker must catch leaks: copies of the metrics with (a) 1 MB more RSS every 50 steps on
# rank 1, (b) one descriptor more per checkpoint on rank 0 in the synchronous phase, (c) one
# more every 400 steps in the async phase, each fail naming what and where.
leak() {  # leak KIND OUT
  $PY - "$OUT/run/metrics.jsonl" "$2" "$1" "$HALF" <<'PY'
import json, sys
source, target, kind, half = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with open(target, "w") as out:
    for line in open(source):
        r = json.loads(line)
        if "rss_mb" in r:
            if kind == "rss":
                r["rss_mb"][1] += r["step"] / 50
            elif kind == "fd-sync" and r["step"] <= half:
                r["open_fds"][0] += r["step"] // 50
            elif kind == "fd-async" and r["step"] > half:
                r["open_fds"][1] += (r["step"] - half) // 400
        out.write(json.dumps(r) + "\n")
PY
}
for case in "rss:async rank 1: RSS grew" "fd-sync:sync rank 0: open fds changed" "fd-async:async rank 1: open fds not flat"; do
  kind=${case%%:*} expected=${case#*:}
  leak "$kind" "$TMP/$kind.jsonl"
  if $PY "$ROOT/perf/soak_check.py" "$TMP/$kind.jsonl" --phase "sync:1:$HALF" \
      --phase "async:$((HALF + 1)):$STEPS:async" >/dev/null 2>"$TMP/$kind.err"; then
    fail "an injected $kind leak passed the checker"
  elif grep -q "^FAIL: $expected" "$TMP/$kind.err"; then
    pass "an injected $kind leak fails: $(head -1 "$TMP/$kind.err")"
  else
    fail "an injected $kind leak: unexpected message"; cat "$TMP/$kind.err" >&2
  fi
done
finish
