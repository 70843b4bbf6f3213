#!/usr/bin/env bash
# CTest sim_allreduce_check: the all-reduce algorithms of src/comm, built with SimGrid's smpicxx
# (perf/sim), sum correctly under SMPI on 16 simulated ranks: flat-mpi and hierarchical (mpi
# intra backend), fp32/fp16/bf16 wire, several sizes, against a float64 reference; nodes of 4
# (uniform) and of 3 (the last node smaller), under SMPI's default collectives and under the
# ones perf/sim/scaling_sim.py uses. Exits 77 (CTest: skipped) when SimGrid is not installed.
# Usage: sim_allreduce_check.sh SOURCE_DIR SIM_BUILD_DIR
set -euo pipefail
src=$1
build=$2
if ! command -v smpicxx > /dev/null || ! command -v smpirun > /dev/null; then
  echo "sim_allreduce_check: SKIPPED: smpicxx/smpirun not found (SimGrid; apt-get install simgrid libsimgrid-dev)"
  exit 77
fi
if [[ ! -x $build/allreduce_sim ]]; then
  cmake -S "$src/perf/sim" -B "$build" -DCMAKE_CXX_COMPILER=smpicxx -DCMAKE_BUILD_TYPE=Release > /dev/null
fi
cmake --build "$build" -j2 > /dev/null  # a no-op when up to date
platform=$build/check16.xml
cat > "$platform" <<'XML'
<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <zone id="world" routing="Full">
    <cluster id="c" prefix="node-" suffix="" radical="0-3" speed="1Gf" core="4" bw="10GBps"
             lat="1us" loopback_bw="100GBps" loopback_lat="0.5us"/>
  </zone>
</platform>
XML
hosts=$build/check16.hosts
for node in 0 1 2 3; do printf 'node-%d\n' $node $node $node $node; done > "$hosts"
sim_colls=(--cfg=smpi/allreduce:rab_rdb --cfg=smpi/reduce_scatter:ompi_ring
           --cfg=smpi/allgather:ring --cfg=smpi/allgatherv:ring)
status=0
for per_node in 4 3; do
  for colls in default sim; do
    extra=()
    [[ $colls == sim ]] && extra=("${sim_colls[@]}")
    # shared-malloc off: every rank keeps its own scratch (the sums are read back).
    out=$(smpirun -np 16 -platform "$platform" -hostfile "$hosts" --log=root.thres:warning \
            --cfg=smpi/shared-malloc:off "${extra[@]}" \
            "$build/allreduce_sim" check --ranks-per-node $per_node 2>&1) || true
    summary=$(grep '^check ranks=' <<< "$out" || true)
    echo "nodes of $per_node, $colls collectives: ${summary:-no summary}"
    if [[ $summary != *PASSED* ]]; then
      grep -E 'FAIL|rror' <<< "$out" | head -20 || true
      status=1
    fi
  done
done
exit $status
