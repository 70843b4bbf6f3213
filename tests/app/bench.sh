#!/usr/bin/env bash
# `mptrain bench allreduce` end to end: the nccl-tests columns, a correct result in every row for
# every algorithm (3 ranks as uneven emulated nodes, 2 ranks as two nodes), fp16 on the wire,
# registered buffers, the --json file.
source "$(dirname "$0")/common.sh"

# run_bench NAME NP ARGS...: passes when the run exits 0, prints a row per size and algorithm,
# reports 0 wrong elements and the average bus bandwidth of every algorithm.
run_bench() {
  local name=$1 np=$2; shift 2
  if ! timeout 120 "$MPIEXEC" -n "$np" --oversubscribe "$MPTRAIN" bench allreduce "$@" \
      >"$TMP/out" 2>"$TMP/err"; then
    fail "$name: exit code non-zero"; cat "$TMP/out" "$TMP/err" >&2; return
  fi
  if ! grep -q '^# *size *count *type *algo *time_us *algbw(GB/s) *busbw(GB/s) *#wrong$' "$TMP/out"; then
    fail "$name: no nccl-tests header"; cat "$TMP/out" >&2; return
  fi
  local rows wrong
  rows=$(grep -cE '^ +[0-9]+ +[0-9]+ +(fp32|fp16|bf16) +[a-z@0-9-]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +0$' "$TMP/out" || true)
  wrong=$(awk '/^ +[0-9]/ && $NF != 0' "$TMP/out" | wc -l)
  if [ "$wrong" -ne 0 ] || [ "$rows" -ne "$EXPECTED_ROWS" ]; then
    fail "$name: $rows correct rows (expected $EXPECTED_ROWS), $wrong wrong"; cat "$TMP/out" >&2; return
  fi
  if ! grep -q '^# Out of bounds values : 0 OK' "$TMP/out" || [ "$(grep -c '^# Avg bus bandwidth' "$TMP/out")" -lt 1 ]; then
    fail "$name: summary lines missing"; cat "$TMP/out" >&2; return
  fi
  pass "$name ($rows rows)"
}

# 8 B .. 1 MiB by 16: 8, 128, 2K, 32K, 512K = 5 sizes; three algorithms.
EXPECTED_ROWS=15
run_bench "3 ranks, uneven nodes (K=2), fp32" 3 -b 8 -e 1M -f 16 -n 3 -w 1 -K 2 --json "$TMP/bench.json"
run_bench "2 ranks, two nodes (K=1), fp16" 2 -b 8 -e 1M -f 16 -n 3 -w 1 -K 1 -d fp16
run_bench "4 ranks, one node, bf16" 4 -b 8 -e 1M -f 16 -n 3 -w 1 -d bf16
EXPECTED_ROWS=5
run_bench "1 rank, flat-mpi only" 1 -b 8 -e 1M -f 16 -n 3 -w 1 -a flat-mpi
# One node and emulated nodes side by side (ALGO@K), with rail batches of a few chunks.
EXPECTED_ROWS=10
run_bench "4 ranks, one node and uneven nodes (3, 1) in one run" 4 -b 8 -e 1M -f 16 -n 3 -w 1 \
  -a hierarchical-shm,hierarchical-shm@3 --shm-segment 64K --rail-batch 100K
if grep -qE '^ +524288 +131072 +fp32 +hierarchical-shm@3 ' "$TMP/out"; then
  pass "bench ALGO@K rows are labelled with their nodes"
else
  fail "bench ALGO@K rows are labelled with their nodes"; cat "$TMP/out" >&2
fi
# The registered path (the data in a shared buffer, as the trainer's gradients): one node and
# uneven emulated nodes with several rail batches, fp32 and bf16.
EXPECTED_ROWS=10
run_bench "3 ranks, registered buffers, one node and nodes of 2" 3 -b 8 -e 1M -f 16 -n 3 -w 1 \
  -a hierarchical-shm-reg,hierarchical-shm-reg@2 --shm-segment 64K --rail-batch 100K
run_bench "2 ranks, registered buffers, bf16" 2 -b 8 -e 1M -f 16 -n 3 -w 1 -d bf16 \
  -a hierarchical-shm-reg,hierarchical-shm-reg@1

# The JSON holds every row with its bus bandwidth and the memcpy reference.
if /usr/bin/python3 - "$TMP/bench.json" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
assert run["ranks"] == 3 and run["nodes"] == 2, run
assert run["memcpy_gbps_alone"] > 0, run
rows = run["rows"]
assert len(rows) == 15, len(rows)
assert {r["algo"] for r in rows} == {"flat-mpi", "hierarchical-shm", "hierarchical-mpi"}
for r in rows:
    assert r["wrong"] == 0 and r["time_us"] > 0, r
    # busbw = algbw * 2(N-1)/N
    assert abs(r["busbw"] - r["algbw"] * 4 / 3) <= 1e-9 + 1e-6 * r["busbw"], r
PY
then pass "bench --json rows"; else fail "bench --json rows"; fi

finish
