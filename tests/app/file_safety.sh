#!/usr/bin/env bash
# Safe file handling (issue #11): a fresh run refuses an --output.dir holding an earlier run's
# files, or a --checkpoint.dir holding its checkpoints, naming the file, and leaves them intact;
# --output.overwrite replaces them all (old timelines, TensorBoard events, checkpoints); a run
# that continues from a checkpoint appends to metrics.jsonl; output files that are symbolic
# links are refused or replaced, never written through; a 'latest' that leaves its directory is
# refused on resume; every file and directory follows the umask (027 and 002).
source "$(dirname "$0")/common.sh"
PY=/usr/bin/python3
D="$TMP/data"
"$MPTRAIN" prepare synthetic --out "$D" --train-samples 256 --test-samples 32 --shape 1,4,4 \
  --classes 4 --seed 3 >/dev/null
COMMON=(--data.train="$D/train.h5" --model.layers=dense:8,relu,dense:4 --train.batch-size=16
        --train.log-every=2 --train.epochs=100)

train() {  # train NP LOG ARGS...: exit status of mptrain, output in LOG
  local np=$1 log=$2
  shift 2
  timeout 60 "$MPIEXEC" -n "$np" --oversubscribe "$MPTRAIN" train "${COMMON[@]}" "$@" >"$log" 2>&1
}
# refused NAME LOG EXPECTED: the run exited 2 with one error line holding EXPECTED and a hint.
refused() {
  local name=$1 log=$2 expected=$3 rc=$4
  if [ "$rc" -ne 2 ]; then fail "$name: exit $rc, expected 2"; cat "$log" >&2; return 1; fi
  if ! grep '^mptrain: error:' "$log" | grep -qF -- "$expected"; then
    fail "$name: no error line with '$expected'"; cat "$log" >&2; return 1
  fi
  if [ "$(grep -c '^mptrain: error:' "$log")" -ne 1 ] || ! grep '^mptrain: error:' "$log" | grep -q 'hint: '; then
    fail "$name: not one error line with a hint"; cat "$log" >&2; return 1
  fi
  return 0
}
steps_of() {  # steps_of METRICS: the steps of its windows, space separated
  $PY -c 'import json,sys; print(" ".join(str(r["step"]) for r in map(json.loads, open(sys.argv[1])) if "loss" in r))' "$1"
}

# ---- an earlier run's outputs -----------------------------------------------------------------
A="$TMP/a"
train 1 "$TMP/a1.log" --train.max-steps=6 --output.dir="$A" || { fail "first run"; cat "$TMP/a1.log" >&2; }
before=$(md5sum <"$A/metrics.jsonl")
rc=0; train 1 "$TMP/a2.log" --train.max-steps=4 --output.dir="$A" || rc=$?
if refused "a second fresh run into the same --output.dir" "$TMP/a2.log" \
    "--output.dir '$A' holds an earlier run's files ('$A/metrics.jsonl') and this run starts fresh (--resume=none)" $rc &&
    grep -q -- "--output.overwrite" "$TMP/a2.log" && [ "$(md5sum <"$A/metrics.jsonl")" = "$before" ]; then
  pass "a second fresh run is refused, metrics.jsonl untouched: $(grep -m1 -o 'error:.*' "$TMP/a2.log")"
fi
rc=0; train 1 "$TMP/a3.log" --train.max-steps=4 --output.dir="$A" --checkpoint.dir="$TMP/empty-ckpt" --resume=auto || rc=$?
refused "--resume=auto that finds nothing" "$TMP/a3.log" \
  "(--resume=auto found no checkpoint in '$TMP/empty-ckpt')" $rc && pass "--resume=auto with no checkpoint: refused, saying so"
if train 1 "$TMP/a4.log" --train.max-steps=4 --output.dir="$A" --output.overwrite &&
    [ "$(steps_of "$A/metrics.jsonl")" = "2 4" ] && grep -q '"steps": 4' "$A/summary.json"; then
  pass "--output.overwrite replaces metrics.jsonl and summary.json: windows $(steps_of "$A/metrics.jsonl")"
else
  fail "--output.overwrite"; cat "$TMP/a4.log" >&2
fi
# An empty metrics.jsonl (a run that died before its first window) holds nothing to protect.
E="$TMP/empty"; mkdir -p "$E"; : >"$E/metrics.jsonl"
train 1 "$TMP/e.log" --train.max-steps=2 --output.dir="$E" && pass "an empty metrics.jsonl is no earlier run" ||
  { fail "an empty metrics.jsonl was refused"; cat "$TMP/e.log" >&2; }

# --output.overwrite also removes what this run would not replace: a rank's timeline it does not
# have, and the earlier TensorBoard event files.
T="$TMP/t"
train 2 "$TMP/t1.log" --train.max-steps=4 --output.dir="$T" --output.timeline --output.tensorboard ||
  { fail "2-rank run with timeline"; cat "$TMP/t1.log" >&2; }
sleep 1  # a new event file name (it carries the time in seconds)
if train 1 "$TMP/t2.log" --train.max-steps=4 --output.dir="$T" --output.timeline --output.tensorboard --output.overwrite &&
    [ -f "$T/timeline-rank0.json" ] && [ ! -e "$T/timeline-rank1.json" ] &&
    [ "$(find "$T/tensorboard" -name 'events.out.tfevents.*' | wc -l)" -eq 1 ] &&
    grep -q "^output: --output.overwrite removed" "$TMP/t2.log"; then
  pass "--output.overwrite: the old rank 1 timeline and event file are gone, one event file left"
else
  fail "--output.overwrite of timelines and events"; ls -R "$T" >&2; cat "$TMP/t2.log" >&2
fi

# ---- continuing appends; an earlier run's checkpoints ------------------------------------------
C="$TMP/c"
train 2 "$TMP/c1.log" --train.max-steps=6 --output.dir="$C" --checkpoint.dir="$C/ckpt" ||
  { fail "run with checkpoints"; cat "$TMP/c1.log" >&2; }
if train 2 "$TMP/c2.log" --train.max-steps=10 --output.dir="$C" --checkpoint.dir="$C/ckpt" --resume=auto &&
    grep -q "^resumed from $C/ckpt/ckpt-6.h5" "$TMP/c2.log" && [ "$(steps_of "$C/metrics.jsonl")" = "2 4 6 8 10" ]; then
  pass "a continued run appends to metrics.jsonl: windows $(steps_of "$C/metrics.jsonl")"
else
  fail "continue and append"; cat "$TMP/c2.log" >&2
fi
ls "$C/ckpt" >"$TMP/ckpt-before"
rc=0; train 2 "$TMP/c3.log" --train.max-steps=4 --output.dir="$TMP/fresh" --checkpoint.dir="$C/ckpt" || rc=$?
if refused "a fresh run into a --checkpoint.dir with checkpoints" "$TMP/c3.log" \
    "--checkpoint.dir '$C/ckpt' holds an earlier run's checkpoints ('$C/ckpt/ckpt-10.h5')" $rc &&
    ls "$C/ckpt" | cmp -s - "$TMP/ckpt-before" && [ ! -e "$TMP/fresh/metrics.jsonl" ]; then
  pass "a fresh run into a checkpoint dir with checkpoints is refused, nothing changed"
fi
if train 2 "$TMP/c4.log" --train.max-steps=4 --output.dir="$TMP/fresh" --checkpoint.dir="$C/ckpt" --output.overwrite &&
    [ "$(ls "$C/ckpt" | tr '\n' ' ')" = "ckpt-4.h5 latest " ] && [ "$(cat "$C/ckpt/latest")" = "ckpt-4.h5" ]; then
  pass "--output.overwrite deletes the earlier checkpoints: $(ls "$C/ckpt" | tr '\n' ' ')"
else
  fail "--output.overwrite of checkpoints: $(ls "$C/ckpt" | tr '\n' ' ')"; cat "$TMP/c4.log" >&2
fi

# ---- links and 'latest' ----------------------------------------------------------------------
S="$TMP/s"; mkdir -p "$S"
echo "precious" >"$TMP/outside.txt"
ln -s "$TMP/outside.txt" "$S/metrics.jsonl"
rc=0; train 1 "$TMP/s1.log" --train.max-steps=2 --output.dir="$S" || rc=$?
refused "metrics.jsonl a link, fresh run" "$TMP/s1.log" "holds an earlier run's files ('$S/metrics.jsonl')" $rc &&
  pass "a link named metrics.jsonl counts as an earlier run's file"
if train 1 "$TMP/s2.log" --train.max-steps=2 --output.dir="$S" --output.overwrite &&
    [ "$(cat "$TMP/outside.txt")" = "precious" ] && [ -f "$S/metrics.jsonl" ] && [ ! -L "$S/metrics.jsonl" ]; then
  pass "--output.overwrite replaces the link by a file; its target is untouched"
else
  fail "overwrite of a linked metrics.jsonl"; cat "$TMP/s2.log" >&2
fi
train 1 "$TMP/s3.log" --train.max-steps=2 --output.dir="$TMP/s3" --checkpoint.dir="$TMP/s3/ckpt" >/dev/null ||
  fail "run for the link case"
rm "$TMP/s3/metrics.jsonl"; ln -s "$TMP/outside.txt" "$TMP/s3/metrics.jsonl"
rc=0; train 1 "$TMP/s4.log" --train.max-steps=4 --output.dir="$TMP/s3" --checkpoint.dir="$TMP/s3/ckpt" --resume=auto || rc=$?
refused "continuing into a linked metrics.jsonl" "$TMP/s4.log" \
  "'$TMP/s3/metrics.jsonl' is a symbolic link; mptrain writes only regular files inside --output.dir" $rc &&
  [ "$(cat "$TMP/outside.txt")" = "precious" ] && pass "a continued run refuses a linked metrics.jsonl; its target untouched"

echo "../c/ckpt/ckpt-4.h5" >"$TMP/s3/ckpt/latest"
rc=0; train 1 "$TMP/l1.log" --train.max-steps=4 --output.dir="$TMP/l1" --resume="$TMP/s3/ckpt" || rc=$?
refused "'latest' naming ../" "$TMP/l1.log" "'$TMP/s3/ckpt/latest' does not name a checkpoint file in '$TMP/s3/ckpt'" $rc &&
  pass "--resume=DIR whose 'latest' names ../: refused"
ln -s "$C/ckpt/ckpt-4.h5" "$TMP/s3/ckpt/ckpt-99.h5"; echo "ckpt-99.h5" >"$TMP/s3/ckpt/latest"
rc=0; train 1 "$TMP/l2.log" --train.max-steps=4 --output.dir="$TMP/l2" --resume="$TMP/s3/ckpt" || rc=$?
refused "'latest' naming a link outside" "$TMP/l2.log" "outside the checkpoint directory" $rc &&
  pass "--resume=DIR whose 'latest' names a link out of the directory: refused"

# ---- the umask ---------------------------------------------------------------------------------
for mask in 027 002; do
  U="$TMP/umask$mask"
  if ! (umask "$mask" && train 2 "$TMP/u$mask.log" --train.max-steps=4 --output.dir="$U/out" \
      --checkpoint.dir="$U/ckpt" --output.timeline --output.tensorboard &&
      "$MPTRAIN" export --checkpoint="$U/ckpt" --out="$U/model.h5" >/dev/null); then
    fail "umask $mask: run"; cat "$TMP/u$mask.log" >&2; continue
  fi
  want_dir=$(printf '%o' $((0777 & ~8#$mask))) want_file=$(printf '%o' $((0666 & ~8#$mask)))
  wrong=""
  for path in "$U" "$U/out" "$U/out/tensorboard" "$U/ckpt"; do
    [ "$(stat -c %a "$path")" = "$want_dir" ] || wrong+=" $path:$(stat -c %a "$path")"
  done
  for path in "$U/out/metrics.jsonl" "$U/out/summary.json" "$U/out/timeline-rank0.json" \
      "$U/out/timeline-rank1.json" "$U"/out/tensorboard/events.out.tfevents.* "$U/ckpt/ckpt-4.h5" \
      "$U/ckpt/latest" "$U/model.h5"; do
    [ "$(stat -c %a "$path")" = "$want_file" ] || wrong+=" $path:$(stat -c %a "$path")"
  done
  [ -z "$wrong" ] && pass "umask $mask: directories $want_dir, files $want_file" ||
    fail "umask $mask: modes other than $want_dir/$want_file:$wrong"
done
finish
