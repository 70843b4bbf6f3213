#!/usr/bin/env bash
# The step-time breakdown (issue #9): every logged window carries data_wait, forward, backward,
# comm (total and exposed), optimizer and checkpoint; on every rank those parts explain its
# window within 5 %; a rank made slower (MPTRAIN_FAULT=slow-rank) is named as the straggler;
# summary.json carries the run's totals; --output.tensorboard writes them as TensorBoard reads.
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

# TensorBoard event files: every record's framing and masked CRC-32C, the file version first,
# then scalars whose tags and values match metrics.jsonl (float32). A minimal TFRecord and
# protobuf reader ships here; TensorBoard's own loader checks the file too where it is installed.
out="$TMP/tb"
if "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" train "${COMMON[@]}" --train.max-steps=30 \
    --data.test="$D/test.h5" --output.tensorboard --output.dir="$out" >"$out.log" 2>&1 &&
    result=$($PY - "$out" <<'PY' 2>&1
import glob, json, struct, sys
out = sys.argv[1]
files = glob.glob(out + "/tensorboard/events.out.tfevents.*")
assert len(files) == 1, files

def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF

def masked(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF

def varint(buf, at):
    value = shift = 0
    while True:
        byte = buf[at]; at += 1
        value |= (byte & 0x7F) << shift; shift += 7
        if byte < 0x80:
            return value, at

def fields(buf):
    at = 0
    while at < len(buf):
        key, at = varint(buf, at)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, at = varint(buf, at)
        elif kind == 1:
            value = buf[at:at + 8]; at += 8
        elif kind == 5:
            value = buf[at:at + 4]; at += 4
        elif kind == 2:
            size, at = varint(buf, at)
            value = buf[at:at + size]; at += size
        else:
            raise AssertionError(f"wire type {kind}")
        yield number, value

data = open(files[0], "rb").read()
at, events = 0, []
while at < len(data):
    header = data[at:at + 8]
    (length,) = struct.unpack("<Q", header)
    assert struct.unpack("<I", data[at + 8:at + 12])[0] == masked(header), "length CRC"
    payload = data[at + 12:at + 12 + length]
    assert struct.unpack("<I", data[at + 12 + length:at + 16 + length])[0] == masked(payload), "data CRC"
    at += 16 + length
    events.append(dict((n, v) for n, v in fields(payload)))
assert events[0][3] == b"brain.Event:2", events[0]
scalars = {}
for event in events[1:]:
    step = event[2]
    assert struct.unpack("<d", event[1])[0] > 1.6e9  # a wall time
    for number, value in fields(event[5]):
        parts = dict(fields(value))
        scalars[(parts[1].decode(), step)] = struct.unpack("<f", parts[2])[0]
metrics = [json.loads(line) for line in open(out + "/metrics.jsonl")]
checked = 0
for record in metrics:
    pairs = [("train/loss", "loss"), ("train/lr", "lr"), ("train/samples_per_s", "samples_per_s")] if "loss" in record else \
            [("test/accuracy", "test_accuracy")] if "test_accuracy" in record else []
    for tag, key in pairs:
        got = scalars[(tag, record["step"])]
        want = struct.unpack("<f", struct.pack("<f", record[key]))[0]
        assert got == want, (tag, record["step"], got, want)
        checked += 1
tags = {tag for tag, _ in scalars}
for tag in ["train/accuracy", "train/loss_scale", "step_time_ms/forward", "step_time_ms/backward",
            "step_time_ms/exposed_comm", "step_time_ms/optimizer", "step_time_ms/data_wait",
            "step_time_ms/checkpoint", "step_time_ms/comm", "test/loss"]:
    assert tag in tags, (tag, sorted(tags))
try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    loaded = EventAccumulator(out + "/tensorboard"); loaded.Reload()
    assert "train/loss" in loaded.Tags()["scalars"]
    by_tensorboard = " (TensorBoard's loader agrees)"
except ImportError:
    by_tensorboard = " (tensorboard not installed: the reader here only)"
print(f"{len(events)} events, {len(tags)} tags, {checked} values equal metrics.jsonl{by_tensorboard}")
PY
); then
  pass "--output.tensorboard: $result"
else
  fail "--output.tensorboard"; echo "$result" >&2; tail -3 "$out.log" >&2
fi

# The Chrome-trace timeline: valid JSON per rank, each step's phases on the training thread and
# each bucket's all-reduce on the communication thread (or on the training thread inside wait(),
# for a tail the thread had not started), every bucket inside its step, each bucket's wait for
# the late peer inside it.
out="$TMP/timeline"
if "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" train "${COMMON[@]}" --train.max-steps=12 \
    --comm.bucket-mb=1 --comm.first-bucket-mb=0.5 --comm.overlap=on --output.timeline \
    --output.dir="$out" >"$out.log" 2>&1 &&
    buckets=$(sed -n 's/.*wire [a-z0-9]*, \([0-9]*\) bucket(s).*/\1/p' "$out.log") &&
    result=$($PY - "$out" 12 "$buckets" <<'PY' 2>&1
import json, sys
out, steps, buckets = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
assert buckets >= 2, buckets
for rank in (0, 1):
    events = json.load(open(f"{out}/timeline-rank{rank}.json"))
    spans = [e for e in events if e["ph"] == "X"]
    assert all(e["pid"] == rank and e["dur"] >= 0 for e in spans)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] != "clock_origin"}
    assert names == {f"rank {rank}", "training", "communication"}, names
    origin = [e["args"]["steady_clock_ns"] for e in events if e["name"] == "clock_origin"]
    assert len(origin) == 1 and isinstance(origin[0], int) and origin[0] > 0, origin
    for phase in ["data_wait", "forward", "backward", "allreduce_wait", "optimizer"]:
        got = sorted(e["args"]["step"] for e in spans if e["name"] == phase and e["tid"] == 0)
        assert got == list(range(1, steps + 1)), (rank, phase, got)
    for step in range(1, steps + 1):
        mine = {e["name"]: e for e in spans if e["args"]["step"] == step and e["tid"] == 0}
        reduced = [e for e in spans if e["args"]["step"] == step and e["name"] == "allreduce_bucket"]
        assert len(reduced) == buckets, (step, len(reduced))
        begin, end = mine["backward"]["ts"], mine["allreduce_wait"]["ts"] + mine["allreduce_wait"]["dur"]
        for e in reduced:
            assert begin <= e["ts"] and e["ts"] + e["dur"] <= end + 1, (step, e, begin, end)
            # The step's tail may run inside wait() on the training thread: then within it.
            if e["tid"] == 0:
                assert mine["allreduce_wait"]["ts"] <= e["ts"] + 1, (step, e, mine["allreduce_wait"])
            else:
                assert e["tid"] == 1, e
        # shm on one node measures each bucket's wait for the late peer: inside its bucket.
        waits = [e for e in spans if e["args"]["step"] == step and e["name"] == "peer_wait"]
        assert len(waits) == buckets, (step, len(waits))
        for w in waits:
            assert any(b["tid"] == w["tid"] and b["ts"] <= w["ts"] + 1 and
                       w["ts"] + w["dur"] <= b["ts"] + b["dur"] + 1 for b in reduced), (step, w)
print(f"2 ranks x {steps} steps: 5 phases per step, {buckets} bucket and peer-wait spans per step inside backward..wait")
PY
); then
  pass "--output.timeline: $result"
else
  fail "--output.timeline"; echo "$result" >&2; tail -3 "$out.log" >&2
fi

# The console: on a terminal (script(1) gives mpirun one, 90 columns wide) rank 0 redraws one
# progress line in place, never wider than the terminal, with the step lines scrolling above it;
# in a pipe (a batch log) only the step lines appear; --output.progress=bar forces the bar.
out="$TMP/tty"
bar_re='epoch 1/1 \[[#.]*\] step [0-9]*/30 *[0-9]*%  ETA [0-9hms-]*  loss [0-9.-]*  [0-9]* samples/s'
if script -qec "stty cols 90; $(printf '%q ' "$MPIEXEC" -n 2 "$MPTRAIN" train "${COMMON[@]}" --train.max-steps=30 --output.dir="$out")" \
      "$out.typescript" >/dev/null 2>&1 &&
    $PY - "$out.typescript" "$bar_re" <<'PY'
import re, sys
text = open(sys.argv[1], encoding="utf-8", errors="replace", newline="").read().replace("\r\n", "\n")
bars = [piece.split("\x1b[K")[0] for piece in text.split("\r")[1:] if piece.startswith("epoch 1/1 ")]
assert len(bars) >= 2, f"{len(bars)} bars"
assert all(re.fullmatch(sys.argv[2], bar) for bar in bars), [b for b in bars if not re.fullmatch(sys.argv[2], b)][:2]
assert max(map(len, bars)) <= 90, max(map(len, bars))
steps = [int(re.search(r"step (\d+)/", bar).group(1)) for bar in bars]
assert steps == sorted(steps) and steps[-1] == 30, steps
lines = re.findall(r"(?m)(?:^|\r)step (\d+)/30  epoch 0  loss", text.replace("\x1b[K", ""))
assert lines == ["10", "20", "30"], lines
print(f"{len(bars)} redraws up to step {steps[-1]}, widest {max(map(len, bars))} columns")
PY
then
  pass "on a terminal: a progress bar under the step lines"
else
  fail "no progress bar on a terminal"; tail -c 600 "$out.typescript" | cat -A >&2
fi
out="$TMP/pipe"
if "$MPIEXEC" -n 2 "$MPTRAIN" train "${COMMON[@]}" --train.max-steps=20 --output.dir="$out" >"$out.log" 2>&1 &&
    ! grep -q $'\r' "$out.log" && [ "$(grep -c '^step [0-9]*/20  epoch' "$out.log")" -eq 2 ] &&
    "$MPIEXEC" -n 2 "$MPTRAIN" train "${COMMON[@]}" --train.max-steps=20 --output.progress=bar \
      --output.dir="$out-bar" >"$out.bar" 2>&1 && grep -q $'\repoch 1/1 \\[' "$out.bar"; then
  pass "in a pipe: step lines only; --output.progress=bar draws anyway"
else
  fail "console in a pipe"; cat -A "$out.log" | tail -3 >&2
fi
if "$MPTRAIN" train "${COMMON[@]}" --output.progress=fancy >"$out.err" 2>&1; then
  fail "--output.progress=fancy accepted"
elif grep -q -- "--output.progress: unknown value 'fancy'" "$out.err"; then
  pass "--output.progress=fancy: $(head -n 1 "$out.err")"
else
  fail "--output.progress=fancy: $(cat "$out.err")"
fi

finish
