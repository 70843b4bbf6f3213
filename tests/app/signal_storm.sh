#!/usr/bin/env bash
# Stop signals never land on a computing thread (train/checkpointing.hpp). Debian's oneDNN 2.x
# points rsp into the heap inside its generated GEMM kernels (oneDNN issue 4845), so a signal
# handled on a thread in one writes its frame over the heap. CI once lost a graceful SIGTERM
# stop to it ("oneDNN status 2" in a matmul just after the signal). Here SIGUSR1 arrives every
# 0.2 ms for 0.4 s while the trainer runs GEMM-bound steps through oneDNN. The run must stop by
# the signal and exit 0; a later signal of the storm may end it by the default action once the
# stop scope has closed (exit 138), but it must never abort on a corrupted heap or crash. With
# the signals handled on the training thread, 7 of 8 such runs aborted on heap corruption.
# Last, the routing thread outside that scope: an ignored SIGINT stays ignored, SIGTERM kills.
source "$(dirname "$0")/common.sh"

"$MPTRAIN" prepare synthetic --out "$TMP/data" --train-samples 1024 --test-samples 64 --seed 2 >/dev/null

storm() {  # storm PID SECONDS: SIGUSR1 to PID every 0.2 ms for SECONDS, or until it is gone
  python3 - "$1" "$2" <<'PY'
import os, signal, sys, time
pid, seconds = int(sys.argv[1]), float(sys.argv[2])
end = time.time() + seconds
while time.time() < end:
    try:
        os.kill(pid, signal.SIGUSR1)
    except ProcessLookupError:
        break
    time.sleep(0.0002)
PY
}

for run in 1 2 3; do
  log="$TMP/run$run.log"
  "$MPTRAIN" train --data.train="$TMP/data/train.h5" --kernels.matmul=onednn \
    "--model.layers=dense:2048,relu,dense:2048,relu,dense:10" --train.batch-size=256 \
    --train.epochs=1000 --train.max-steps=100000 --train.log-every=1 \
    --output.dir="$TMP/out$run" --output.progress=lines >"$log" 2>&1 &
  pid=$!
  # A few steps first, so that the signals meet the GEMMs of the loop, not the start-up.
  for _ in $(seq 300); do grep -q "^step 3/" "$log" && break; sleep 0.1; done
  storm "$pid" 0.4
  rc=0
  timeout 60 tail --pid="$pid" -f /dev/null || kill -9 "$pid" 2>/dev/null  # never wait forever
  wait "$pid" || rc=$?
  if { [ "$rc" -eq 0 ] && grep -q "stopped by signal at step" "$log"; } || [ "$rc" -eq 138 ]; then
    pass "run $run under a SIGUSR1 storm: exit $rc ($(grep -m1 -o 'stopped by signal at step [0-9]*' "$log" || echo 'ended by a later signal'))"
  else
    fail "run $run under a SIGUSR1 storm: exit $rc: $(grep -m1 -E 'corrupted|fatal|free\(\)|double|Segmentation' "$log")"
  fi
done

# Outside the trainer's stop scope the routing thread does what the disposition says, as if
# nothing were blocked. A background job of this (non-interactive) shell starts with SIGINT
# ignored: it must keep running. SIGTERM keeps its default action: the process ends by it (143)
# at once, long before the 2M-sample prepare would finish.
"$MPTRAIN" prepare synthetic --out "$TMP/big" --train-samples 2000000 --test-samples 64 \
  --seed 3 >"$TMP/prepare.log" 2>&1 &
pid=$!
sleep 1
kill -INT "$pid"
sleep 0.5
kill -0 "$pid" 2>/dev/null && pass "prepare keeps running after an ignored SIGINT" ||
  fail "prepare ended on a SIGINT its shell had set to be ignored"
kill -TERM "$pid"
rc=0
timeout 20 tail --pid="$pid" -f /dev/null || kill -9 "$pid" 2>/dev/null
wait "$pid" || rc=$?
[ "$rc" -eq 143 ] && pass "prepare ended by SIGTERM's default action (exit 143)" ||
  fail "prepare after SIGTERM: exit $rc, want 143 (the default action)"
rm -rf "$TMP/big"
finish
