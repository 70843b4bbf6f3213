#!/usr/bin/env bash
# --device (issue #8): the choice is agreed by every rank and logged once as a rank -> host:device
# map; --device=cuda where no rank can train on CUDA ends every rank within seconds, with one
# line that names --device. On a machine with a GPU the refusal cases are skipped: there the
# outcome depends on the build (docs/gpu.md), and perf/gpu_check.sh covers it.
source "$(dirname "$0")/common.sh"

"$MPTRAIN" prepare synthetic --out "$TMP/data" --train-samples 512 --test-samples 128 >/dev/null
D="$TMP/data"
HOST=$(hostname)
have_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then have_gpu=1; fi

train_args=(train --data.train="$D/train.h5" --data.test="$D/test.h5" --train.max-steps=3
            --train.batch-size=32 --output.progress=lines)

# --device=cuda without a usable device: every rank stops, one error line naming --device.
refused() {  # refused NAME NP ARGS...
  local name=$1 np=$2; shift 2
  local rc=0 start=$SECONDS
  timeout 60 "$MPIEXEC" -n "$np" --oversubscribe "$MPTRAIN" "$@" >"$TMP/out" 2>"$TMP/err" || rc=$?
  local took=$((SECONDS - start)) lines
  lines=$(grep -c '^mptrain: error:' "$TMP/err" || true)
  if [ "$rc" -eq 0 ]; then fail "$name: exit code 0"; return; fi
  if [ "$rc" -eq 124 ]; then fail "$name: timed out (a rank hung)"; return; fi
  if [ "$rc" -ne 2 ]; then fail "$name: exit $rc, expected 2 (user error)"; cat "$TMP/err" >&2; return; fi
  if [ "$took" -gt 20 ]; then fail "$name: took ${took}s"; return; fi
  if [ "$lines" -ne 1 ]; then fail "$name: $lines error lines, expected 1"; cat "$TMP/err" >&2; return; fi
  local line
  line=$(grep '^mptrain: error:' "$TMP/err")
  case "$line" in
    *--device*hint:*) pass "$name (exit $rc, ${took}s): $line" ;;
    *) fail "$name: the error does not name --device with a hint: $line" ;;
  esac
  if grep -q '^device:' "$TMP/out"; then fail "$name: a device map was printed before the refusal"; fi
}

if [ "$have_gpu" -eq 0 ]; then
  for np in 1 2; do
    refused "--device=cuda without a GPU np$np" "$np" "${train_args[@]}" --device=cuda --output.dir="$TMP/c$np"
  done
  # Why there is none: the CUDA runtime's own words, or a build without CUDA.
  if grep -Eq '^mptrain: error:.*(no CUDA device visible on .* \(cudaGetDeviceCount: [^)]+\)|this build has no CUDA)' "$TMP/err"; then
    pass "the refusal says why: $(grep -Eo 'cudaGetDeviceCount: [^)]+|this build has no CUDA' "$TMP/err")"
  else
    fail "the refusal does not say why there is no device: $(cat "$TMP/err")"
  fi
  # The environment cannot conjure a device either.
  CUDA_VISIBLE_DEVICES=0 refused "--device=cuda with CUDA_VISIBLE_DEVICES=0, np2" 2 \
    "${train_args[@]}" --device=cuda --output.dir="$TMP/cv"
else
  echo "note: a GPU is visible; the --device=cuda refusal cases are skipped"
fi
refused "eval --device=cuda np2" 2 eval --data.test="$D/test.h5" --checkpoint="$TMP/none" --device=cuda
rc=0
timeout 60 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" "${train_args[@]}" --device=tpu \
  >"$TMP/out" 2>"$TMP/err" || rc=$?
if [ "$rc" -eq 2 ] && [ "$(grep -c '^mptrain: error:.*unknown device .tpu. (--device)' "$TMP/err")" -eq 1 ]; then
  pass "--device=tpu refused once"
else
  fail "--device=tpu: exit $rc"; cat "$TMP/err" >&2
fi

# --cuda.graphs where the run trains on the cpu (auto resolves to cpu without a GPU): every
# rank stops with one line naming --cuda.graphs (the GPU check runs it on a device).
if [ "$have_gpu" -eq 0 ]; then
  for dev in auto cpu; do
    rc=0
    timeout 60 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" "${train_args[@]}" --device=$dev \
      --cuda.graphs --output.dir="$TMP/g$dev" >"$TMP/out" 2>"$TMP/err" || rc=$?
    if [ "$rc" -eq 2 ] &&
        [ "$(grep -c '^mptrain: error:.*--cuda.graphs needs the cuda device.*hint: pass --device=cuda' "$TMP/err")" -eq 1 ]; then
      pass "--cuda.graphs --device=$dev refused on the cpu: $(grep '^mptrain: error' "$TMP/err")"
    else
      fail "--cuda.graphs --device=$dev: exit $rc"; cat "$TMP/err" >&2
    fi
  done
fi

# auto (the default) and cpu train on the host where no GPU is visible, and rank 0 logs the map
# once: "device: rank 0 -> HOST:cpu, rank 1 -> HOST:cpu".
for np in 1 2; do
  for device in auto cpu; do
    [ "$device" = auto ] && [ "$have_gpu" -eq 1 ] && continue
    out="$TMP/run-$device-$np"
    rc=0
    timeout 120 "$MPIEXEC" -n "$np" --oversubscribe "$MPTRAIN" "${train_args[@]}" --device="$device" \
      --output.dir="$out" >"$TMP/out" 2>"$TMP/err" || rc=$?
    if [ "$rc" -ne 0 ]; then fail "--device=$device np$np: exit $rc"; cat "$TMP/err" >&2; continue; fi
    want="device:"
    for ((r = 0; r < np; r++)); do
      if [ "$r" -gt 0 ]; then want+=","; fi
      want+=" rank $r -> $HOST:cpu"
    done
    maps=$(grep -c '^device:' "$TMP/out" || true)
    if [ "$maps" -ne 1 ]; then fail "--device=$device np$np: $maps device map lines, expected 1"; continue; fi
    got=$(grep '^device:' "$TMP/out")
    if [ "$got" != "$want" ]; then fail "--device=$device np$np: map '$got', expected '$want'"; continue; fi
    if ! grep -q '"step": *3' "$out/metrics.jsonl" 2>/dev/null && ! grep -q '"step":3' "$out/metrics.jsonl" 2>/dev/null; then
      fail "--device=$device np$np: no step 3 in metrics.jsonl"; continue
    fi
    pass "--device=$device np$np trains, map: $got"
  done
done

# --data.normalize (issue #8): device ships the stored uint8 bytes and the training device turns
# them into inputs (kernels::normalize_u8; on the cpu its host twin, on the training thread).
# It must train on exactly the reader's inputs: the same final loss, to the digits summary.json keeps, as reader, on
# 2 ranks with prefetch (auto is reader on the cpu). An unknown value is one line naming it.
declare -A final_loss
for normalize in reader device; do
  out="$TMP/norm-$normalize"
  rc=0
  timeout 120 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" "${train_args[@]}" --device=cpu \
    --data.prefetch=3 --data.io-threads=2 --data.normalize=$normalize --output.dir="$out" \
    >"$TMP/out" 2>"$TMP/err" || rc=$?
  if [ "$rc" -ne 0 ]; then fail "--data.normalize=$normalize: exit $rc"; cat "$TMP/err" >&2; continue; fi
  final_loss[$normalize]=$(python3 -c 'import json, sys; print(repr(json.load(open(sys.argv[1]))["final_train_loss"]))' "$out/summary.json")
done
if [ -n "${final_loss[reader]:-}" ] && [ "${final_loss[reader]}" = "${final_loss[device]:-}" ]; then
  pass "--data.normalize=device trains on the reader's inputs: final loss ${final_loss[device]} both"
else
  fail "--data.normalize: final loss reader=${final_loss[reader]:-none} device=${final_loss[device]:-none}"
fi
rc=0
timeout 60 "$MPIEXEC" -n 2 --oversubscribe "$MPTRAIN" "${train_args[@]}" --data.normalize=gpu \
  --output.dir="$TMP/norm-bad" >"$TMP/out" 2>"$TMP/err" || rc=$?
if [ "$rc" -eq 2 ] && [ "$(grep -c "^mptrain: error:.*--data.normalize: unknown value 'gpu'.*hint: use auto" "$TMP/err")" -eq 1 ]; then
  pass "--data.normalize=gpu refused once"
else
  fail "--data.normalize=gpu: exit $rc"; cat "$TMP/err" >&2
fi

finish
