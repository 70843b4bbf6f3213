#!/usr/bin/env bash
# All-reduce bandwidth: `mptrain bench allreduce` (nccl-tests style) for flat-mpi (Open MPI's
# MPI_Allreduce), hierarchical-shm (staged through the window), hierarchical-shm-reg (the data in
# a registered shared buffer, as the trainer's gradients are) and hierarchical-mpi on 2 and 4
# ranks, as one node and as emulated nodes (--ranks-per-node), then the Markdown tables of
# docs/perf.md: busbw per size, the ratios to flat-mpi, and the registered path's busbw as a
# share of the same run's memcpy bandwidth. A second table sets each shm path on emulated nodes
# against one node in the same run (`-a hierarchical-shm,hierarchical-shm@K,...`: interleaved
# rounds, so the ratio is side by side).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: perf/allreduce.sh [options] [BUILD_DIR]

  -b, --min-bytes S   smallest message (default 4K)
  -e, --max-bytes S   largest message (default 256M)
  -c, --configs "..." rank-count:ranks-per-node pairs (default "2:0 2:1 4:0 4:2 4:1";
                      ranks-per-node 0 = one node, as MPI reports it)
  -E, --emulated "..." rank-count:ranks-per-node pairs for the side-by-side table of emulated
                      nodes against one node (default "2:1 4:2"; "" skips it)
  -t, --row-seconds T time budget per row (default 0.5)
  -o, --out DIR       keep the JSON of every configuration here (default a temporary directory)
  -h, --help          show this help
BUILD_DIR defaults to build/release (the mptrain binary sits at its top).
USAGE
}

min_bytes=4K
max_bytes=256M
configs="2:0 2:1 4:0 4:2 4:1"
emulated="2:1 4:2"
row_seconds=0.5
out=""
build=build/release
need() { [[ $2 -ge 2 ]] || { echo "allreduce.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    -b|--min-bytes) need "$1" $#; min_bytes=$2; shift 2 ;;
    -e|--max-bytes) need "$1" $#; max_bytes=$2; shift 2 ;;
    -c|--configs) need "$1" $#; configs=$2; shift 2 ;;
    -E|--emulated) need "$1" $#; emulated=$2; shift 2 ;;
    -t|--row-seconds) need "$1" $#; row_seconds=$2; shift 2 ;;
    -o|--out) need "$1" $#; out=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "allreduce.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done
bin=$build/mptrain
[[ -x $bin ]] || { echo "allreduce.sh: no binary at $bin (hint: cmake --build --preset release, or pass BUILD_DIR)" >&2; exit 2; }
[[ -n $out ]] || out=$(mktemp -d)
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}

for config in $configs; do
  ranks=${config%%:*}
  per_node=${config##*:}
  echo "== $ranks ranks, ranks-per-node $per_node" >&2
  # --oversubscribe only where it is needed: with it Open MPI binds no rank to a core, and a
  # rank that migrates loses its cache (on 2 ranks the shm path measured 2-3x slower).
  over=()
  [[ $ranks -le $(nproc) ]] || over=(--oversubscribe)
  mpiexec -n "$ranks" "${over[@]}" "$bin" bench allreduce -b "$min_bytes" -e "$max_bytes" -f 2 \
    -t "$row_seconds" -K "$per_node" \
    -a flat-mpi,hierarchical-shm,hierarchical-shm-reg,hierarchical-mpi \
    --json "$out/n${ranks}_k${per_node}.json" >&2
done

for pair in $emulated; do
  ranks=${pair%%:*}
  per_node=${pair##*:}
  echo "== $ranks ranks: one node against nodes of $per_node, side by side" >&2
  over=()
  [[ $ranks -le $(nproc) ]] || over=(--oversubscribe)
  mpiexec -n "$ranks" "${over[@]}" "$bin" bench allreduce -b "$min_bytes" -e "$max_bytes" -f 2 \
    -t "$row_seconds" -K 0 \
    -a "hierarchical-shm,hierarchical-shm@$per_node,hierarchical-shm-reg,hierarchical-shm-reg@$per_node" \
    --json "$out/e${ranks}_k${per_node}.json" >&2
done

# shellcheck disable=SC2086  # $configs is a list of "ranks:per_node" words, one argument each
python3 - "$out" "$emulated" $configs <<'PY'
import json, sys
out, emulated, configs = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n /= 1024
runs = {}
for config in configs:
    ranks, per_node = config.split(":")
    runs[config] = json.load(open(f"{out}/n{ranks}_k{per_node}.json"))
print("| ranks | nodes | size | flat-mpi busbw GB/s | hierarchical-mpi | hierarchical-shm | hierarchical-shm-reg | shm / flat-mpi | reg / flat-mpi | reg / shm | reg / memcpy |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
worst = {}
for config, run in runs.items():
    by = {}
    for row in run["rows"]:
        by.setdefault(row["size"], {})[row["algo"]] = row
    memcpy = run["memcpy_gbps_alone"]
    for size in sorted(by):
        row = by[size]
        flat, shm, reg, mpi = (row.get(a, {}).get("busbw", float("nan")) for a in
                               ("flat-mpi", "hierarchical-shm", "hierarchical-shm-reg", "hierarchical-mpi"))
        if size >= 1 << 20 and flat > 0:
            low = worst.get(config, (1e9, 1e9))
            worst[config] = (min(low[0], shm / flat), min(low[1], reg / flat))
        if size < 1 << 20 and size != 4096 and size != 65536:
            continue
        ratio = lambda a, b: f"{a / b:.2f}x" if b > 0 else "-"
        print(f"| {run['ranks']} | {run['nodes']} | {human(size)} | {flat:.2f} | {mpi:.2f} | {shm:.2f} | {reg:.2f} "
              f"| {ratio(shm, flat)} | {ratio(reg, flat)} | {ratio(reg, shm)} | {100 * reg / memcpy:.0f} % |")
print()
for config, run in runs.items():
    wrong = sum(r["wrong"] for r in run["rows"])
    print(f"- {run['ranks']} ranks, {run['nodes']} node(s): memcpy {run['memcpy_gbps_alone']:.2f} GB/s alone, "
          f"{run['memcpy_gbps_all_ranks']:.2f} GB/s per rank all at once; smallest shm/flat-mpi and "
          f"reg/flat-mpi at >= 1 MiB: {worst.get(config, (float('nan'),) * 2)[0]:.2f}x, "
          f"{worst.get(config, (float('nan'),) * 2)[1]:.2f}x; wrong elements: {wrong}")
if emulated:
    print()
    print("| ranks | nodes | size | algorithm | one node busbw GB/s | emulated nodes | emulated / one node |")
    print("|---|---|---|---|---|---|---|")
    for pair in emulated:
        ranks, per_node = pair.split(":")
        run = json.load(open(f"{out}/e{ranks}_k{per_node}.json"))
        by = {}
        for row in run["rows"]:
            by.setdefault(row["size"], {})[row["algo"]] = row["busbw"]
        nodes = -(-int(ranks) // int(per_node))
        for algo in ("hierarchical-shm", "hierarchical-shm-reg"):
            ratios = []
            for size in sorted(by):
                one, emu = by[size].get(algo, float("nan")), by[size].get(f"{algo}@{per_node}", float("nan"))
                if size < 1 << 20:
                    continue
                ratios.append(emu / one)
                print(f"| {ranks} | {nodes} of {per_node} | {human(size)} | {algo} | {one:.2f} | {emu:.2f} | {emu / one:.2f}x |")
            print(f"| {ranks} | | 1 MiB and up | {algo} | | | {min(ratios):.2f}-{max(ratios):.2f}x, "
                  f"median {sorted(ratios)[len(ratios) // 2]:.2f}x |")
PY
