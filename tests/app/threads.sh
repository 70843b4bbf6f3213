#!/usr/bin/env bash
# Compute threads per rank: rank 0 warns, naming the figures, when a node's ranks x threads
# exceed the cores their affinity sets cover, and stays silent with the default threads.
source "$(dirname "$0")/common.sh"
D="$TMP/data"
"$MPTRAIN" prepare synthetic --out "$D" --train-samples 256 --test-samples 64 >/dev/null
# The CPUs this process may run on (sched_getaffinity), which the ranks inherit; nproc would
# report OMP_NUM_THREADS instead, which common.sh sets.
CORES=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)

train() {  # train LOG NP [mpiexec env/options...] -- [train options...]
  local log=$1 np=$2; shift 2
  local launch=()
  while [ "$1" != "--" ]; do launch+=("$1"); shift; done; shift
  timeout 120 "$MPIEXEC" -n "$np" --oversubscribe --bind-to none "${launch[@]}" "$MPTRAIN" train \
    --data.train="$D/train.h5" --model.layers=dense:16,relu,dense:10 --train.batch-size=32 \
    --train.max-steps=2 --output.dir="$log.run" --checkpoint.dir= "$@" >"$log" 2>&1
}

over=$((CORES + 1))
if train "$TMP/omp.log" 1 -x OMP_NUM_THREADS=$over -- &&
   grep -q "warning: 1 rank(s) on a node x $over compute thread(s) = $over threads on $CORES core(s): oversubscribed.*hint: set OMP_NUM_THREADS or --train.threads" "$TMP/omp.log"; then
  pass "OMP_NUM_THREADS=$over on $CORES core(s): warned with the figures, trained"
else
  fail "OMP_NUM_THREADS=$over: no warning naming the figures"; cat "$TMP/omp.log" >&2
fi

if train "$TMP/opt.log" 2 -- --train.threads=$CORES &&
   [ "$(grep -c "warning: 2 rank(s) on a node x $CORES compute thread(s) = $((2 * CORES)) threads on $CORES core(s)" "$TMP/opt.log")" -eq 1 ]; then
  pass "2 ranks x --train.threads=$CORES: one warning (rank 0)"
else
  fail "2 ranks x --train.threads=$CORES: expected exactly one warning"; cat "$TMP/opt.log" >&2
fi

if [ "$CORES" -ge 2 ]; then
  # The default: OMP_NUM_THREADS unset, so each rank takes its share of the cores.
  if (unset OMP_NUM_THREADS; train "$TMP/default.log" 2 --) &&
     ! grep -q "oversubscribed" "$TMP/default.log"; then
    pass "2 ranks with the default threads on $CORES cores: no warning"
  else
    fail "default threads: warned or failed"; cat "$TMP/default.log" >&2
  fi
fi
finish
