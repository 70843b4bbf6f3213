#!/usr/bin/env bash
# End-to-end throughput of mptrain against PyTorch (the peer) on the same MLP, data, batch and
# threads, measured in the same run, alternating, and reported as a ratio (STYLE.md rule 9).
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: perf/compare_pytorch.sh [options]

Trains the Fashion-MNIST MLP (784-1024-1024-10) with mptrain and with PyTorch
(perf/pytorch_mlp.py, DDP/gloo for more than one rank), alternating the two, REPS times for
each rank count, and prints a Markdown table of samples/s (median [min-max]) and their ratio.

  -r, --reps R        repetitions per rank count (default 3)
  -n, --ranks "K..."  rank counts (default "1 2")
  -b, --batch B       samples per rank per step (default 128)
  -t, --threads T     threads per rank: OMP_NUM_THREADS and torch.set_num_threads (default 1)
  -s, --steps S       training steps per run (default 300)
  -w, --warmup W      untimed PyTorch steps before the S timed ones (default 0: like
                      mptrain's samples_per_s, which counts every step of the run)
  -c, --config FILE   mptrain config (default inputs/fashion-mnist-mlp.ini)
  -o, --out FILE      also write the table to FILE
  -k, --keep          keep the temporary folder with every run's log and summary
  -h, --help          show this help

Needs build/release/mptrain (cmake --build --preset release) and python3-torch
(launch/install-deps.sh without --no-torch). Prepares data/fashion-mnist if it is missing.
EOF
}

reps=3
ranks="1 2"
batch=128
threads=1
steps=300
warmup=0
config=inputs/fashion-mnist-mlp.ini
out=""
keep=0
need() { [[ $2 -ge 2 ]] || { echo "compare_pytorch: $1 needs a value" >&2; exit 2; }; }
while (($#)); do
  case "$1" in
    -r | --reps) need "$1" $#; reps=$2; shift ;;
    -n | --ranks) need "$1" $#; ranks=$2; shift ;;
    -b | --batch) need "$1" $#; batch=$2; shift ;;
    -t | --threads) need "$1" $#; threads=$2; shift ;;
    -s | --steps) need "$1" $#; steps=$2; shift ;;
    -w | --warmup) need "$1" $#; warmup=$2; shift ;;
    -c | --config) need "$1" $#; config=$2; shift ;;
    -o | --out) need "$1" $#; out=$2; shift ;;
    -k | --keep) keep=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare_pytorch: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
# shellcheck disable=SC2086  # $ranks is a list on purpose
for value in "$reps" "$batch" "$threads" "$steps" $ranks; do
  [[ "$value" =~ ^[1-9][0-9]*$ ]] || { echo "compare_pytorch: '$value' is not a positive integer" >&2; exit 2; }
done
[[ "$warmup" =~ ^[0-9]+$ ]] || { echo "compare_pytorch: --warmup must be an integer >= 0" >&2; exit 2; }

# --out is relative to the caller's directory, everything else to the repository.
[[ -z "$out" || "$out" == /* ]] || out="$PWD/$out"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

python=/usr/bin/python3  # Debian's python has torch and h5py; a pyenv python3 on PATH may not
mptrain=${MPTRAIN_BIN:-build/release/mptrain}
[[ -x "$mptrain" || -n "${MPTRAIN_BIN:-}" || ! -x build/release/src/app/mptrain ]] ||
  mptrain=build/release/src/app/mptrain
if [[ ! -x "$mptrain" ]]; then
  echo "compare_pytorch: $mptrain not found." >&2
  echo "hint: cmake --preset release && cmake --build --preset release -j\$(nproc)" >&2
  exit 1
fi
if ! "$python" -c 'import torch, h5py' 2>/dev/null; then
  echo "compare_pytorch: $python cannot import torch and h5py." >&2
  echo "hint: launch/install-deps.sh (without --no-torch) installs python3-torch and python3-h5py" >&2
  exit 1
fi
[[ -f "$config" ]] || { echo "compare_pytorch: config '$config' not found" >&2; exit 2; }

data_dir=data/fashion-mnist
if [[ ! -f "$data_dir/train.h5" || ! -f "$data_dir/test.h5" ]]; then
  echo "compare_pytorch: preparing Fashion-MNIST in $data_dir"
  "$mptrain" prepare fashion-mnist --source /usr/share/datasets/fashion-mnist --out "$data_dir"
fi

cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # before OMP_NUM_THREADS is exported: GNU nproc reports it when set
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mptrain-compare.XXXXXX")
if ((keep)); then
  echo "compare_pytorch: keeping runs in $tmp" >&2
else
  trap 'rm -rf "$tmp"' EXIT
fi
export OMP_NUM_THREADS=$threads
[[ "$mptrain" == /* ]] || mptrain=$repo_root/$mptrain
export MPTRAIN_BIN=$mptrain  # launch/mpirun.sh runs this one
results=$tmp/results.tsv  # framework <TAB> ranks <TAB> samples_per_s
: >"$results"

# run_or_show LOG COMMAND...: runs COMMAND with its output in LOG; on failure shows LOG's tail.
run_or_show() {
  local log=$1
  shift
  if ! "$@" >"$log" 2>&1; then
    echo "compare_pytorch: failed: $*" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
}

run_mptrain() {  # K I
  local k=$1 i=$2 dir=$tmp/mpt-$1-$2
  run_or_show "$dir.log" launch/mpirun.sh "$k" train --config "$config" \
    --train.batch-size="$batch" --train.max-steps="$steps" --train.epochs=1 \
    --optimizer.nesterov=false --optimizer.weight-decay=0 --schedule.name=constant \
    --schedule.warmup-steps=0 --output.dir="$dir" --checkpoint.dir=
  local sps
  sps=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["samples_per_s"])' \
    "$dir/summary.json") || { echo "compare_pytorch: no samples_per_s in $dir/summary.json" >&2; exit 1; }
  printf 'mptrain\t%s\t%s\n' "$k" "$sps" >>"$results"
  echo "  rep $i, $k rank(s): mptrain  $sps samples/s" >&2
}

run_pytorch() {  # K I
  local k=$1 i=$2 log=$tmp/pt-$1-$2.log
  # A fresh port per run, so that a socket still in TIME_WAIT never blocks the next one.
  run_or_show "$log" launch/mpirun.sh "$k" -- "$python" perf/pytorch_mlp.py \
    --data "$data_dir/train.h5" --batch-size "$batch" --steps "$steps" --warmup "$warmup" \
    --threads "$threads" --port $((29500 + 10 * i + k))
  local sps
  sps=$(grep '^{' "$log" | tail -n 1 | "$python" -c 'import json, sys; print(json.load(sys.stdin)["samples_per_s"])') ||
    { echo "compare_pytorch: no JSON line in $log" >&2; exit 1; }
  printf 'pytorch\t%s\t%s\n' "$k" "$sps" >>"$results"
  echo "  rep $i, $k rank(s): pytorch  $sps samples/s" >&2
}

echo "compare_pytorch: $reps reps x ranks {$ranks}, batch $batch/rank, $threads thread(s)/rank," \
  "$steps steps" >&2
start=$SECONDS
for ((i = 1; i <= reps; i++)); do
  for k in $ranks; do
    # Alternate which framework goes first, so that drift (thermal, page cache) hits both alike.
    if ((i % 2)); then
      run_mptrain "$k" "$i"
      run_pytorch "$k" "$i"
    else
      run_pytorch "$k" "$i"
      run_mptrain "$k" "$i"
    fi
  done
done

table=$("$python" - "$results" "$batch" "$threads" "$steps" "$reps" "$cores" <<'EOF'
import statistics, sys
path, batch, threads, steps, reps, cores = sys.argv[1:]
runs = {}
for line in open(path):
    framework, ranks, sps = line.split("\t")
    runs.setdefault((int(ranks), framework), []).append(float(sps))
def cell(values):
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}\u2013{max(values):,.0f}]"
print(f"MLP 784-1024-1024-10, fp32 SGD, batch {batch} per rank, {threads} thread(s) per rank, "
      f"{steps} steps, median [min\u2013max] of {reps} alternating runs, {cores} cores.")
print()
print("| model | ranks | mptrain samples/s | PyTorch samples/s | mptrain / PyTorch |")
print("| --- | ---: | ---: | ---: | ---: |")
for ranks in sorted({r for r, _ in runs}):
    m, p = runs[(ranks, "mptrain")], runs[(ranks, "pytorch")]
    ratio = statistics.median(m) / statistics.median(p)
    print(f"| mlp | {ranks} | {cell(m)} | {cell(p)} | {ratio:.2f} |")
EOF
)
echo "$table"
if [[ -n "$out" ]]; then
  mkdir -p "$(dirname "$out")"
  printf '%s\n' "$table" >"$out"
  echo "compare_pytorch: wrote $out" >&2
fi
echo "compare_pytorch: done in $((SECONDS - start)) s" >&2
