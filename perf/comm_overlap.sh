#!/usr/bin/env bash
# Overlap of the gradient all-reduce with backward (issue #6): for the MLP and the CNN on
# Fashion-MNIST, exposed_comm_time / comm_time from summary.json with the default buckets
# (25 MiB, first 1 MiB), with small buckets, and with --comm.bucket-mb=0 (one bucket after
# backward), plus the step time, so that a better ratio can be checked against a faster step.
# Every run passes --comm.overlap=on (auto turns overlap off where ranks fill their cores).
# Where the shm backend measures it, the table also splits off the exposed time spent waiting
# for a late peer to reach a bucket's all-reduce (the ranks' skew).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: perf/comm_overlap.sh [options] [BUILD_DIR]

Trains each model for STEPS steps on RANKS ranks once per bucket size and prints a Markdown
table: buckets, comm_time_s, exposed_comm_time_s, their ratio, the exposed time spent waiting
for a late peer, the ratio with every such wait taken out of both times (shm backend only), ms
per step and samples/s.

  -n, --ranks N        ranks (default 2)
  -m, --models "M..."  models (default "mlp cnn")
  -k, --buckets "B..." --comm.bucket-mb values (default "25 1 0.25 0"; 25 is the default)
  -s, --steps S        steps per run (default 200)
  -b, --batch B        samples per rank per step (default 64)
  -r, --repeat R       runs per configuration, one row each (default 1; the machine is shared)
  -d, --data DIR       Fashion-MNIST as prepared by `mptrain prepare fashion-mnist` (default:
                       prepared into a temporary directory from /usr/share/datasets/fashion-mnist)
  -x, --extra "ARGS"   more `mptrain train` options for every run (e.g. "--comm.allreduce=flat-mpi")
  -l, --launch "ARGS"  more mpiexec options (e.g. "--bind-to none": Open MPI binds each of 2
                       ranks to one core, so a rank's communication thread shares its core)
  -h, --help           show this help

BUILD_DIR holds the mptrain binary (default build/release). Runs under `nice -n 5`.
EOF
}

ranks=2
models="mlp cnn"
buckets="25 1 0.25 0"
steps=200
batch=64
repeat=1
data=""
extra=""
launch=""
build=build/release
need() { [[ $2 -ge 2 ]] || { echo "comm_overlap: $1 needs a value" >&2; exit 2; }; }
while (($#)); do
  case "$1" in
    -n | --ranks) need "$1" $#; ranks=$2; shift ;;
    -m | --models) need "$1" $#; models=$2; shift ;;
    -k | --buckets) need "$1" $#; buckets=$2; shift ;;
    -s | --steps) need "$1" $#; steps=$2; shift ;;
    -b | --batch) need "$1" $#; batch=$2; shift ;;
    -r | --repeat) need "$1" $#; repeat=$2; shift ;;
    -d | --data) need "$1" $#; data=$2; shift ;;
    -x | --extra) need "$1" $#; extra=$2; shift ;;
    -l | --launch) need "$1" $#; launch=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "comm_overlap: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) build=$1 ;;
  esac
  shift
done
[[ "$build" == /* ]] || build="$PWD/$build"
[[ -z "$data" || "$data" == /* ]] || data="$PWD/$data"
mptrain=$build/mptrain
[[ -x "$mptrain" ]] || mptrain=$build/src/app/mptrain
if [[ ! -x "$mptrain" ]]; then
  echo "comm_overlap: no mptrain binary in $build" >&2
  echo "hint: cmake --preset release && cmake --build --preset release, or pass a build dir" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d /tmp/mpt-comm-overlap.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [[ -z "$data" ]]; then
  data=$work/data
  "$mptrain" prepare fashion-mnist --source /usr/share/datasets/fashion-mnist --out "$data" >/dev/null
fi

echo "| model | --comm.bucket-mb | buckets | comm_time_s | exposed_comm_time_s | exposed / comm | of it peer wait (s) | the same without peer waits | ms/step | samples/s |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for model in $models; do
  for run in $(seq "$repeat"); do
  for mb in $buckets; do
    dir="$work/run-$model-$mb-$run"
    # shellcheck disable=SC2086  # EXTRA and LAUNCH are lists of options
    nice -n 5 mpiexec -n "$ranks" --oversubscribe $launch "$mptrain" train --data.train="$data/train.h5" \
      --model.name="$model" --train.batch-size="$batch" --train.max-steps="$steps" \
      --train.epochs=100 --train.log-every="$steps" --comm.bucket-mb="$mb" --comm.overlap=on $extra \
      --output.dir="$dir" --checkpoint.dir= >"$dir.log" 2>&1 ||
      { echo "comm_overlap: run failed, see below" >&2; cat "$dir.log" >&2; exit 1; }
    python3 - "$dir/summary.json" "$model" "$mb" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
c, e = s["comm_time_s"], s["exposed_comm_time_s"]
# The exposed time's wait for late node peers (the ranks' skew), and the ratio with every such
# wait taken out of both times; -1 in summary.json where the all-reduce does not measure them.
p = s.get("exposed_peer_wait_s", -1)
xc, xe = s.get("comm_excluding_peer_wait_s", -1), s.get("exposed_comm_excluding_peer_wait_s", -1)
skew_free = f"{xe / xc:.2f}" if p >= 0 and xc > 0 else "n/a"
print(f"| {sys.argv[2]} | {sys.argv[3]} | {s['buckets']} | {c:.3f} | {e:.3f} | "
      f"{e / c if c > 0 else float('nan'):.2f} | {f'{p:.3f}' if p >= 0 else 'n/a'} | "
      f"{skew_free} | {1000 * s['train_s'] / s['steps']:.1f} | {s['samples_per_s']:.0f} |")
PY
  done
  done
done
