#!/usr/bin/env bash
# Checkpoint, stop and resume end to end (issue #7), on 2 ranks unless said otherwise:
#  - bit-exact resume: 2S steps in one run against S, a stop, and a resume, in fp32 (SGD with
#    momentum, cosine schedule, dropout) and fp16 (AdamW, a loss scale that moves), stopped
#    mid-epoch by a signal on one rank: the same per-step losses and the same final weights,
#    optimizer state and loss scale, bit for bit;
#  - resume on another world size (2 -> 4 and 4 -> 2): the run continues and still learns;
#  - kill -9 while a checkpoint is being written, at two points: the previous one loads and
#    --resume=auto takes it;
#  - a checkpoint with bytes flipped inside a weight: auto warns, names it, falls back;
#  - SIGTERM to every rank, or to one: all stop at one step, rank 0 checkpoints, every rank
#    exits 0 within a bound, and the resume finishes;
#  - a full disk (a small tmpfs): a clear error, the previous checkpoint intact, no
#    partial file under a checkpoint's name.
source "$(dirname "$0")/common.sh"
PY=/usr/bin/python3
D="$TMP/data"
"$MPTRAIN" prepare synthetic --out "$D" --train-samples 640 --test-samples 256 --shape 1,16,16 \
  --classes 10 --seed 5 >"$TMP/prepare.log"
# 640 samples, 2 ranks x 32: 10 steps per epoch.
COMMON=(--data.train="$D/train.h5" --data.test="$D/test.h5" --train.batch-size=32
        --train.log-every=1 --model.layers=dense:64,relu,dropout:0.1,dense:10)

train() {  # train NP OUT_DIR ARGS... (stdout and stderr to OUT_DIR/log)
  local np=$1 out=$2; shift 2
  mkdir -p "$out"
  timeout 300 "$MPIEXEC" -n "$np" --oversubscribe "$MPTRAIN" train "${COMMON[@]}" \
    --output.dir="$out" "$@" >"$out/log" 2>&1
}

# losses FILE FIRST LAST: the loss of every step in [FIRST, LAST] from metrics.jsonl, one per
# line, exactly as written.
losses() {
  $PY - "$1" "$2" "$3" <<'PY'
import json, sys
path, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for line in open(path):
    record = json.loads(line)
    if "loss" in record and first <= record["step"] <= last and "test_loss" not in record:
        print(record["step"], repr(record["loss"]))
PY
}

# same_state A.h5 B.h5: every weight, buffer and optimizer dataset bitwise equal, and the loss
# scaler's attributes equal.
same_state() {
  $PY - "$1" "$2" <<'PY'
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
a.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
assert any(n.startswith("optimizer/") for n in names), names
for n in names:
    x, y = np.asarray(a[n]), np.asarray(b[n])
    assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), n
for group in [a] + [a[g] for g in a if isinstance(a[g], h5py.Group)]:
    for k, v in group.attrs.items():
        if any(word in k for word in ("wall", "time", "date", "git", "version", "host")):
            continue  # when and by what it was written
        other = b[group.name].attrs[k]
        assert np.array_equal(np.asarray(v), np.asarray(other)), (group.name, k, v, other)
print("identical:", len(names), "datasets")
PY
}

# ---- bit-exact resume -----------------------------------------------------------------------
bitwise_case() {  # bitwise_case NAME STOP_RANK STOP_STEP TOTAL ARGS...
  local name=$1 rank=$2 stop=$3 total=$4; shift 4
  local w="$TMP/bit-$name"
  if ! train 2 "$w/whole" --train.max-steps="$total" --train.epochs=9 --checkpoint.dir="$w/ckpt-whole" "$@"; then
    fail "$name: uninterrupted run failed"; cat "$w/whole/log" >&2; return
  fi
  if ! MPTRAIN_FAULT="stop-signal:$rank:$stop" train 2 "$w/first" --train.max-steps="$total" --train.epochs=9 \
      --checkpoint.dir="$w/ckpt" "$@"; then
    fail "$name: the stopped run did not exit 0"; cat "$w/first/log" >&2; return
  fi
  if ! grep -q "^stopped by signal at step $stop, checkpoint $w/ckpt/ckpt-$stop.h5$" "$w/first/log"; then
    fail "$name: no 'stopped by signal at step $stop' line"; cat "$w/first/log" >&2; return
  fi
  if ! train 2 "$w/second" --train.max-steps="$total" --train.epochs=9 --checkpoint.dir="$w/ckpt" \
      --resume=auto "$@"; then
    fail "$name: the resumed run failed"; cat "$w/second/log" >&2; return
  fi
  if ! grep -q "^resumed from $w/ckpt/ckpt-$stop.h5: step $stop" "$w/second/log"; then
    fail "$name: no 'resumed from ckpt-$stop.h5' line"; cat "$w/second/log" >&2; return
  fi
  losses "$w/whole/metrics.jsonl" 1 "$total" >"$w/whole.losses"
  { losses "$w/first/metrics.jsonl" 1 "$stop"; losses "$w/second/metrics.jsonl" $((stop + 1)) "$total"; } >"$w/split.losses"
  if [ "$(wc -l <"$w/whole.losses")" -ne "$total" ] || ! cmp -s "$w/whole.losses" "$w/split.losses"; then
    fail "$name: per-step losses differ"; diff "$w/whole.losses" "$w/split.losses" | head >&2; return
  fi
  if ! same_state "$w/ckpt-whole/ckpt-$total.h5" "$w/ckpt/ckpt-$total.h5" >"$w/same.log" 2>&1; then
    fail "$name: final checkpoints differ"; cat "$w/same.log" >&2; return
  fi
  pass "$name: $total losses and the final state bitwise equal across a stop at step $stop ($(cat "$w/same.log"))"
}

bitwise_case fp32-sgd 1 7 16 --optimizer.momentum=0.9 --schedule.name=cosine --optimizer.lr=0.05
bitwise_case fp16-adamw 0 13 18 --train.precision=fp16 --optimizer.name=adamw --optimizer.lr=0.002 \
  --amp.growth-interval=3 --schedule.name=cosine

# The same with the writes on a background thread, every 3 steps, keeping 2 and every 6th.
bitwise_case fp32-async 1 8 16 --optimizer.momentum=0.9 --schedule.name=cosine \
  --checkpoint.async --checkpoint.every-steps=3 --checkpoint.keep=2 --checkpoint.keep-every=6
kept=$(cd "$TMP/bit-fp32-async/ckpt" && ls ckpt-*.h5 | sort -t- -k2 -n | tr '\n' ' ')
# First run: 3, 6, 8 (the stop); second: 9, 12, 15, 16 (the end). Kept: the newest 2, and 6, 12.
if [ "$kept" = "ckpt-6.h5 ckpt-12.h5 ckpt-15.h5 ckpt-16.h5 " ] &&
    grep -q "^checkpoint: wrote .*ckpt-9.h5 (.*, async)$" "$TMP/bit-fp32-async/second/log"; then
  pass "async writes, --checkpoint.keep=2 --checkpoint.keep-every=6: kept $kept"
else
  fail "async/keep: kept '$kept'"; cat "$TMP/bit-fp32-async/second/log" >&2
fi

# ---- the cuda pipeline on the host ----------------------------------------------------------
# The step's state read back late (src/train/step_reports.hpp): with MPTRAIN_REPORT_LAG=2 the
# host reads each step's verdict two steps late and never the loss inside a step. It must train
# bit for bit as lag 0 does: fp16 AdamW with clipping, accumulation, warmup and a loss scale
# that starts far too high (overflow skips, hysteresis, backoff, growth), and SGD with
# Nesterov in bf16; the second is also stopped and resumed under the lag.
# The gradients staged through a host twin, bucket by bucket, as on cuda under the MPI backends
# (kernels/staging.hpp, MPTRAIN_STAGE_GRADIENTS=1), with the late reports: the same, with many
# buckets overlapping backward, a rank's NaN carried through the staged buckets, and sync BN's
# collectives queued between them.
pipeline_case() {  # pipeline_case NAME "VAR=VALUE ..." STOP_RANK STOP_STEP TOTAL ARGS...
  local name=$1 envs=$2 rank=$3 stop=$4 total=$5; shift 5
  local w="$TMP/pipeline-$name" args=(--train.max-steps="$total" --train.epochs=9) arg
  # A step line drains the reports: log every 5 steps, so that the lag is a lag between them.
  local COMMON=("${COMMON[@]/--train.log-every=1/--train.log-every=5}")
  for arg in "$@"; do  # a model of the case's own replaces the common one
    case $arg in
      --model.layers=*) COMMON=("${COMMON[@]/--model.layers=*/$arg}") ;;
      *) args+=("$arg") ;;
    esac
  done
  # shellcheck disable=SC2086  # ENVS is a list of assignments
  if ! train 2 "$w/now" "${args[@]}" --checkpoint.dir="$w/ckpt-now" ||
      ! (export $envs; train 2 "$w/late" "${args[@]}" --checkpoint.dir="$w/ckpt-late"); then
    fail "$name: a run failed"; cat "$w/now/log" "$w/late/log" >&2; return
  fi
  local records
  if ! records=$($PY - "$w/now" "$w/late" <<'PY'
import json, sys
def load(d):
    keep = ("step", "loss", "train_accuracy", "lr", "loss_scale", "skipped_steps", "grad_norm")
    return [{k: r.get(k) for k in keep} for r in map(json.loads, open(d + "/metrics.jsonl"))
            if "loss" in r and "test_loss" not in r]
now, late = load(sys.argv[1]), load(sys.argv[2])
assert now == late and len(now) >= 3, (now, late)
s = [json.load(open(d + "/summary.json")) for d in sys.argv[1:]]
for k in ("steps", "final_train_loss", "loss_scale", "skipped_steps", "test_loss", "test_accuracy"):
    assert s[0][k] == s[1][k], (k, s[0][k], s[1][k])
print(len(now), "step records,", s[0]["skipped_steps"], "skipped steps")
PY
  ); then
    fail "$name: the step records differ with $envs"; return
  fi
  if ! cmp -s <(grep "gradient overflow" "$w/now/log") <(grep "gradient overflow" "$w/late/log"); then
    fail "$name: the overflow lines differ"; diff <(grep overflow "$w/now/log") <(grep overflow "$w/late/log") >&2
    return
  fi
  if ! same_state "$w/ckpt-now/ckpt-$total.h5" "$w/ckpt-late/ckpt-$total.h5" >"$w/same.log" 2>&1; then
    fail "$name: the final checkpoints differ with $envs"; cat "$w/same.log" >&2; return
  fi
  if [ "$stop" -gt 0 ]; then
    # shellcheck disable=SC2086
    if ! (export $envs; MPTRAIN_FAULT="stop-signal:$rank:$stop" train 2 "$w/first" "${args[@]}" --checkpoint.dir="$w/ckpt") ||
        ! (export $envs; train 2 "$w/second" "${args[@]}" --checkpoint.dir="$w/ckpt" --resume=auto) ||
        ! same_state "$w/ckpt-now/ckpt-$total.h5" "$w/ckpt/ckpt-$total.h5" >"$w/same-split.log" 2>&1; then
      fail "$name: stopped at $stop and resumed under $envs, the final state differs"
      cat "$w/first/log" "$w/second/log" "$w/same-split.log" >&2; return
    fi
  fi
  pass "$name: $envs trains as without ($records, $(grep -c "gradient overflow" "$w/now/log") overflow lines; $(cat "$w/same.log"))"
}
pipeline_case fp16-adamw-clip MPTRAIN_REPORT_LAG=2 0 0 20 --train.precision=fp16 \
  --optimizer.name=adamw --optimizer.lr=0.002 --optimizer.clip-norm=0.5 --train.accumulate=2 \
  --schedule.name=cosine --schedule.warmup-steps=4 --amp.init-scale=1e12 --amp.max-scale=1e12 \
  --amp.backoff-factor=0.01 --amp.hysteresis=2 --amp.growth-interval=3
if [ "$(grep -c "gradient overflow" "$TMP/pipeline-fp16-adamw-clip/late/log" || true)" -lt 2 ]; then
  fail "fp16-adamw-clip: expected overflow skips from a loss scale of 1e12"
fi
pipeline_case bf16-sgd-resume MPTRAIN_REPORT_LAG=2 1 9 16 --train.precision=bf16 \
  --optimizer.momentum=0.9 --optimizer.nesterov --schedule.name=step --schedule.step-size=5 \
  --optimizer.lr=0.05
# 17 KiB buckets: 5 of them for the 66 KiB of f32 gradients, 9 for a 16-bit wire's.
STAGED=(--comm.bucket-mb=0.016 --comm.first-bucket-mb=0.008 --comm.overlap=on)
pipeline_case staged-fp16 "MPTRAIN_STAGE_GRADIENTS=1 MPTRAIN_REPORT_LAG=1" 0 8 16 "${STAGED[@]}" \
  --train.precision=fp16 --optimizer.name=adamw --optimizer.lr=0.002 --optimizer.clip-norm=0.5 \
  --train.accumulate=2 --amp.init-scale=1e9 --amp.growth-interval=3
if ! grep -q "bucket(s) staged through a host twin" "$TMP/pipeline-staged-fp16/late/log" ||
    grep -q "staged through" "$TMP/pipeline-staged-fp16/now/log" ||
    ! grep -q '"gradient_path": *"staged"' "$TMP/pipeline-staged-fp16/late/summary.json" ||
    ! grep -q '"gradient_path": *"host"' "$TMP/pipeline-staged-fp16/now/summary.json"; then
  fail "staged-fp16: the run line or summary.json does not say which run staged its gradients"
fi
MPTRAIN_FAULT=nan-grad:1:5 pipeline_case staged-nan "MPTRAIN_STAGE_GRADIENTS=1" 0 0 12 \
  "${STAGED[@]}" --comm.wire-dtype=fp16 --optimizer.momentum=0.9
if ! grep -q '"skipped_steps": 1' "$TMP/pipeline-staged-nan/late/summary.json"; then
  fail "staged-nan: rank 1's NaN at step 5 did not skip one step everywhere"
fi
pipeline_case staged-syncbn "MPTRAIN_STAGE_GRADIENTS=1" 0 0 15 "${STAGED[@]}" \
  --model.layers=conv:8:3:pad=1,bn,relu,maxpool:2,flatten,dense:10 --model.sync-bn=true
rc=0
MPTRAIN_STAGE_GRADIENTS=yes train 2 "$TMP/stage-bad" --train.max-steps=2 || rc=$?
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] &&
    [ "$(grep -c "error: .*MPTRAIN_STAGE_GRADIENTS is 'yes', but must be 0 or 1" "$TMP/stage-bad/log")" -ge 1 ]; then
  pass "a bad MPTRAIN_STAGE_GRADIENTS is one error line (exit $rc)"
else
  fail "bad MPTRAIN_STAGE_GRADIENTS (exit $rc)"; cat "$TMP/stage-bad/log" >&2
fi

# ---- timed stops and checkpoints ----------------------------------------------------------------
timed_case() {  # timed_case NAME EXPECTED_LINE ARGS... (a slow run: 30 ms per batch read)
  local name=$1 expected=$2 w="$TMP/timed-$1"; shift 2
  local start=$SECONDS rc=0
  train 2 "$w/run" --train.epochs=50 --data.debug-read-delay-ms=30 --checkpoint.dir="$w/ckpt" "$@" || rc=$?
  local took=$((SECONDS - start))
  if [ "$rc" -eq 0 ] && [ "$took" -le 30 ] && grep -q "$expected" "$w/run/log" &&
      grep -q '"stop_reason": *"time-limit"' "$w/run/summary.json"; then
    pass "$name: exit 0 after ${took}s, $(grep -m1 "$expected" "$w/run/log")"
  else
    fail "$name: rc $rc after ${took}s"; tail -5 "$w/run/log" >&2
  fi
}
timed_case "--train.time-limit" "^stopped for the time limit at step [0-9]*, checkpoint .*ckpt-[0-9]*.h5$" \
  --train.time-limit=00:00:04 --train.stop-margin=00:00:01
SLURM_JOB_END_TIME=$(( $(date +%s) + 5 )) timed_case "SLURM_JOB_END_TIME" \
  "^stopped for the time limit at step" --train.stop-margin=2
w="$TMP/minutes"
if train 2 "$w/run" --train.max-steps=90 --train.epochs=50 --data.debug-read-delay-ms=30 \
    --checkpoint.dir="$w/ckpt" --checkpoint.every-minutes=0.01 --checkpoint.keep=100 &&
    [ "$(ls "$w/ckpt" | grep -c '^ckpt-.*\.h5$')" -ge 4 ]; then
  pass "--checkpoint.every-minutes=0.01: $(ls "$w/ckpt" | grep -c '^ckpt-.*\.h5$') checkpoints in 90 slow steps (one at the end)"
else
  fail "--checkpoint.every-minutes"; ls "$w/ckpt" >&2
fi

# ---- another world size -----------------------------------------------------------------------
resize_case() {  # resize_case FROM TO
  local from=$1 to=$2 w="$TMP/resize-$1-$2"
  MPTRAIN_FAULT="stop-signal:0:6" train "$from" "$w/first" --train.epochs=3 --checkpoint.dir="$w/ckpt" \
    --optimizer.lr=0.05 || { fail "$from -> $to: first run failed"; cat "$w/first/log" >&2; return; }
  if ! train "$to" "$w/second" --train.epochs=3 --checkpoint.dir="$w/ckpt" --resume=auto --optimizer.lr=0.05; then
    fail "$from -> $to: resumed run failed"; cat "$w/second/log" >&2; return
  fi
  if ! grep -q "written by $from rank(s) x batch 32 x accumulate 1: continues at sample" "$w/second/log"; then
    fail "$from -> $to: the resume does not say how it re-expressed the cursor"; cat "$w/second/log" >&2; return
  fi
  local acc
  acc=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["test_accuracy"])' "$w/second/summary.json")
  if ! $PY -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0.5 else 1)' "$acc"; then
    fail "$from -> $to: test accuracy $acc after the resume"; cat "$w/second/log" >&2; return
  fi
  pass "$from -> $to ranks: resumed and finished, test accuracy $acc"
}
resize_case 2 4
resize_case 4 2

# ---- kill -9 during a write -------------------------------------------------------------------
kill_case() {  # kill_case NAME WAIT_S: kill every rank WAIT_S after ckpt-10.h5.tmp appears
  local name=$1 wait_s=$2 w="$TMP/kill-$1"
  mkdir -p "$w/run"
  "$MPIEXEC" -n 2 "$MPTRAIN" train "${COMMON[@]}" --output.dir="$w/run" --train.epochs=5 \
    --checkpoint.dir="$w/ckpt" --checkpoint.every-steps=5 --checkpoint.debug-pause-ms=150 \
    >"$w/run/log" 2>&1 &
  local launcher=$! waited=0
  until [ -e "$w/ckpt/ckpt-10.h5.tmp" ] || [ $waited -ge 600 ]; do sleep 0.05; waited=$((waited + 1)); done
  sleep "$wait_s"
  pkill -9 -f -- "--checkpoint.dir=$w/ckpt" || true
  wait "$launcher" 2>/dev/null || true
  if [ ! -e "$w/ckpt/ckpt-5.h5" ] || [ -e "$w/ckpt/ckpt-10.h5" ]; then
    fail "$name: expected ckpt-5.h5 and no complete ckpt-10.h5"; ls -la "$w/ckpt" >&2; return
  fi
  if ! "$MPTRAIN" inspect "$w/ckpt/ckpt-5.h5" >"$w/inspect.log" 2>&1 || ! grep -qi "checksums: verified" "$w/inspect.log"; then
    fail "$name: ckpt-5.h5 does not verify"; cat "$w/inspect.log" >&2; return
  fi
  if ! train 2 "$w/resume" --train.epochs=2 --checkpoint.dir="$w/ckpt" --resume=auto ||
      ! grep -q "^resumed from $w/ckpt/ckpt-5.h5: step 5" "$w/resume/log"; then
    fail "$name: --resume=auto did not take ckpt-5.h5"; cat "$w/resume/log" >&2; return
  fi
  pass "$name: killed mid-write, ckpt-5.h5 verifies and --resume=auto took it"
}
kill_case "kill -9 at the first dataset" 0
kill_case "kill -9 a few datasets in" 0.4

# ---- a corrupted checkpoint -------------------------------------------------------------------
w="$TMP/corrupt"
if train 2 "$w/run" --train.max-steps=12 --train.epochs=2 --checkpoint.dir="$w/ckpt" --checkpoint.every-steps=6; then
  $PY - "$w/ckpt/ckpt-12.h5" <<'PY'
import sys, h5py
path = sys.argv[1]
with h5py.File(path, "r") as f:
    d = f["weights/dense0/weight"]
    offset = d.id.get_offset()
    size = d.id.get_storage_size()
with open(path, "r+b") as f:
    f.seek(offset + size // 2)
    b = f.read(4)
    f.seek(offset + size // 2)
    f.write(bytes(x ^ 0xFF for x in b))
PY
  if train 2 "$w/resume" --train.max-steps=14 --train.epochs=2 --checkpoint.dir="$w/ckpt" --resume=auto &&
      grep -q "ckpt-12.h5" "$w/resume/log" && grep -qi "warning:.*ckpt-12.h5.*weights/dense0/weight" "$w/resume/log" &&
      grep -q "^resumed from $w/ckpt/ckpt-6.h5: step 6" "$w/resume/log"; then
    pass "flipped bytes in ckpt-12.h5: named in a warning, resumed from ckpt-6.h5"
  else
    fail "corrupted checkpoint not detected or no fallback"; cat "$w/resume/log" >&2
  fi
  if "$MPTRAIN" train "${COMMON[@]}" --output.dir="$w/o2" --resume="$w/ckpt/ckpt-12.h5" >"$w/explicit.log" 2>&1; then
    fail "--resume=PATH of a corrupted checkpoint exited 0"
  elif grep -q "ckpt-12.h5" "$w/explicit.log"; then
    pass "--resume=PATH of a corrupted checkpoint: an error naming it"
  else
    fail "--resume=PATH of a corrupted checkpoint: the error does not name the file"; cat "$w/explicit.log" >&2
  fi
else
  fail "corruption case: training failed"; cat "$w/run/log" >&2
fi

# ---- SIGTERM to every rank, or to one ---------------------------------------------------------
sigterm_case() {  # sigterm_case WHO: "every rank" or "one rank" (the last one started)
  local who=$1 w="$TMP/sigterm-${1// /-}"
  mkdir -p "$w/run"
  "$MPIEXEC" -n 2 "$MPTRAIN" train "${COMMON[@]}" --output.dir="$w/run" --train.epochs=50 \
    --data.debug-read-delay-ms=20 --checkpoint.dir="$w/ckpt" >"$w/run/log" 2>&1 &
  local launcher=$! waited=0
  until grep -q "^step 3/" "$w/run/log" 2>/dev/null || [ $waited -ge 600 ]; do sleep 0.05; waited=$((waited + 1)); done
  local start=$SECONDS rc=0
  # The ranks are mpiexec's children; mpiexec itself would abort the job on SIGTERM.
  if [ "$who" = "every rank" ]; then
    pkill -TERM -P "$launcher" || true
  else
    pkill -TERM -n -P "$launcher" || true
  fi
  wait "$launcher" || rc=$?
  local took=$((SECONDS - start))
  if [ "$rc" -ne 0 ] || [ "$took" -gt 20 ] ||
      ! grep -q "^stopped by signal at step [0-9]*, checkpoint $w/ckpt/ckpt-" "$w/run/log" ||
      ! grep -q '"stop_reason": *"signal"' "$w/run/summary.json"; then
    fail "SIGTERM to $who: rc $rc after ${took}s"; cat "$w/run/log" >&2; return
  fi
  local stopped
  stopped=$(sed -n 's/^stopped by signal at step \([0-9]*\),.*/\1/p' "$w/run/log")
  if train 2 "$w/resume" --train.max-steps=$((stopped + 3)) --train.epochs=50 --checkpoint.dir="$w/ckpt" --resume=auto &&
      grep -q "^resumed from $w/ckpt/ckpt-$stopped.h5: step $stopped" "$w/resume/log" &&
      grep -q "^done: $((stopped + 3)) steps" "$w/resume/log"; then
    pass "SIGTERM to $who: every rank exited 0 in ${took}s at step $stopped with a checkpoint; the resume finished"
  else
    fail "SIGTERM to $who: the resume did not continue from step $stopped"; cat "$w/resume/log" >&2
  fi
}
sigterm_case "every rank"
sigterm_case "one rank"

# ---- a full disk --------------------------------------------------------------------------------
# A 220 KiB tmpfs holds one checkpoint of this model (weights and momentum, ~147 KB) but not a
# second beside it. (A file-size limit, ulimit -f, would not do: Open MPI's own shared-memory
# files then fail first.)
w="$TMP/full"
mkdir -p "$w/ckpt"
if ! mount -t tmpfs -o size=220k mptrain-full "$w/ckpt" 2>"$w/mount.log"; then
  echo "SKIPPED: a full disk (cannot mount a small tmpfs here: $(head -1 "$w/mount.log"))"
else
  trap 'umount "$w/ckpt" 2>/dev/null || true; rm -rf "$TMP"' EXIT
  if train 2 "$w/run" --train.max-steps=4 --checkpoint.dir="$w/ckpt"; then
    rc=0
    train 2 "$w/resume" --train.max-steps=8 --checkpoint.dir="$w/ckpt" --resume=auto || rc=$?
    if [ "$rc" -eq 2 ] && grep -q "ckpt-8.h5" "$w/resume/log" && [ ! -e "$w/ckpt/ckpt-8.h5" ] &&
        ! ls "$w/ckpt"/*.tmp >/dev/null 2>&1 && [ "$(cat "$w/ckpt/latest")" = ckpt-4.h5 ] &&
        "$MPTRAIN" inspect "$w/ckpt/ckpt-4.h5" 2>&1 | grep -qi "checksums: verified"; then
      pass "a full disk: exit $rc, $(grep -m1 -o 'error:.*' "$w/resume/log" | cut -c1-160); ckpt-4.h5 intact and latest, no partial file"
    else
      fail "a full disk: rc $rc"; cat "$w/resume/log" >&2; ls -la "$w/ckpt" >&2
    fi
  else
    fail "full-disk case: first run failed"; cat "$w/run/log" >&2
  fi
  # The same with --checkpoint.async: the writer thread's failure reaches every rank at the
  # next step boundary, with the same one-line error.
  rc=0
  train 2 "$w/async" --train.max-steps=20 --train.epochs=3 --checkpoint.dir="$w/ckpt" --resume=auto \
    --checkpoint.async --checkpoint.every-steps=6 || rc=$?
  if [ "$rc" -eq 2 ] && grep -q "No space left on device" "$w/async/log" && [ ! -e "$w/ckpt/ckpt-6.h5" ] &&
      ! grep -q "^step 20/" "$w/async/log" &&
      ! ls "$w/ckpt"/*.tmp >/dev/null 2>&1 && [ "$(cat "$w/ckpt/latest")" = ckpt-4.h5 ]; then
    pass "a full disk under --checkpoint.async: exit 2 on every rank before the last step, ckpt-4.h5 still latest"
  else
    fail "a full disk under --checkpoint.async: rc $rc"; tail -5 "$w/async/log" >&2; ls -la "$w/ckpt" >&2
  fi
  umount "$w/ckpt"
fi

finish
