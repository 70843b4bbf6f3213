#!/usr/bin/env bash
# End-to-end throughput of mptrain against PyTorch (the peer) on the same built-in models, data,
# batch, precision and threads, measured in the same run, alternating, and reported as a ratio
# (STYLE.md rule 9), with mptrain's achieved GFLOP/s beside the best single-core GEMM rate of
# the available libraries (oneDNN, OpenBLAS), also measured in the same run.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: perf/compare_pytorch.sh [options]

Trains mptrain's built-in models on Fashion-MNIST with mptrain and with PyTorch
(perf/pytorch_models.py: the same layers, init, loss and SGD; DDP/gloo for more than one
rank), alternating the two, REPS times for each (model, precision, ranks, threads), and prints
a Markdown table of samples/s (median [min-max]), their ratio, and mptrain's GFLOP/s per core
(3 x the forward FLOPs of --model.print per sample) against the best single-core GEMM GFLOP/s
of oneDNN and OpenBLAS on the MLP's shapes (bench_kernels, run once per repetition).

  -m, --models "M..."      models: mlp, cnn, resnet-mini (default "mlp cnn resnet-mini")
  -p, --precisions "P..."  fp32 and/or bf16 (default "fp32 bf16"); bf16 is mptrain's
                           --train.precision=bf16 and PyTorch's torch.autocast('cpu',
                           dtype=torch.bfloat16) in its default configuration
  -r, --reps R             repetitions (default 3)
  -n, --ranks "K..."       rank counts (default "1 2")
  -t, --threads "T..."     threads per rank: OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and
                           torch.set_num_threads (default 1)
  -b, --batch B            samples per rank per step (default 128)
  -s, --steps "S..."       training steps per run: S for every model and precision, MODEL=S,
                           MODEL:PRECISION=S (default "mlp=300 cnn=60 resnet-mini=40
                           mlp:bf16=30 cnn:bf16=6 resnet-mini:bf16=8": PyTorch's bf16 runs
                           oneDNN's reference kernels on CPUs without AVX512-BF16, 20-50x slower)
  -w, --warmup W           untimed PyTorch steps before the S timed ones (default 0: like
                           mptrain's samples_per_s, which counts every step of the run)
  -d, --data DIR           folder with train.h5 of (C,H,W) or (H,W) samples (default
                           data/fashion-mnist, prepared from /usr/share/datasets if missing)
  -c, --config FILE        mptrain config for every model, which --model.name then selects
                           (default inputs/fashion-mnist-MODEL.ini)
      --mptrain PATH       the mptrain binary (default $MPTRAIN_BIN, else build/release/mptrain)
      --gemm-bench PATH    the bench_kernels binary, or "none" to skip the GEMM ceiling
                           (default $BENCH_KERNELS_BIN, else perf/bench_kernels beside mptrain)
  -o, --out FILE           also write the tables to FILE
  -k, --keep               keep the temporary folder with every run's log and summary
  -h, --help               show this help

Needs a release build of mptrain (cmake --build --preset release) and python3-torch
(launch/install-deps.sh without --no-torch). Prepares data/fashion-mnist if it is missing.
Example: perf/compare_pytorch.sh -m "mlp cnn" -p fp32 -n "1 2" -t 1 -r 3 -o /tmp/compare.md
USAGE
}

models="mlp cnn resnet-mini"
precisions="fp32 bf16"
reps=3
ranks="1 2"
threads_list=1
batch=128
steps_spec=""
warmup=0
data_dir=""
config=""
mptrain_opt=""
gemm_opt=""
out=""
keep=0
die() { echo "compare_pytorch: $1" >&2; [[ -z "${2:-}" ]] || echo "hint: $2" >&2; exit 2; }
need() { [[ $2 -ge 2 ]] || die "$1 needs a value" "see perf/compare_pytorch.sh --help"; }
while (($#)); do
  case "$1" in
    -m | --models) need "$1" $#; models=$2; shift ;;
    -p | --precisions) need "$1" $#; precisions=$2; shift ;;
    -r | --reps) need "$1" $#; reps=$2; shift ;;
    -n | --ranks) need "$1" $#; ranks=$2; shift ;;
    -t | --threads) need "$1" $#; threads_list=$2; shift ;;
    -b | --batch) need "$1" $#; batch=$2; shift ;;
    -s | --steps) need "$1" $#; steps_spec=$2; shift ;;
    -w | --warmup) need "$1" $#; warmup=$2; shift ;;
    -d | --data) need "$1" $#; data_dir=$2; shift ;;
    -c | --config) need "$1" $#; config=$2; shift ;;
    --mptrain) need "$1" $#; mptrain_opt=$2; shift ;;
    --gemm-bench) need "$1" $#; gemm_opt=$2; shift ;;
    -o | --out) need "$1" $#; out=$2; shift ;;
    -k | --keep) keep=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "compare_pytorch: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done

# Lists are space-separated words; an empty list is a mistake, not "nothing to do".
[[ -n "${models// /}" ]] || die "--models is empty" "use -m \"mlp cnn resnet-mini\""
[[ -n "${precisions// /}" ]] || die "--precisions is empty" "use -p \"fp32 bf16\""
[[ -n "${ranks// /}" ]] || die "--ranks is empty" "use -n \"1 2\""
[[ -n "${threads_list// /}" ]] || die "--threads is empty" "use -t 1"
for model in $models; do
  [[ "$model" =~ ^(mlp|cnn|resnet-mini)$ ]] ||
    die "--models: unknown model '$model'" "use mlp, cnn and/or resnet-mini, as in -m \"mlp cnn\""
done
for precision in $precisions; do
  [[ "$precision" =~ ^(fp32|bf16)$ ]] ||
    die "--precisions: unknown precision '$precision'" "use fp32 and/or bf16, as in -p \"fp32 bf16\""
done
# shellcheck disable=SC2086  # $ranks and $threads_list are lists on purpose
for value in "$reps" "$batch" $ranks $threads_list; do
  [[ "$value" =~ ^[1-9][0-9]*$ ]] || die "'$value' is not a positive integer" \
    "--reps, --batch, --ranks and --threads take positive integers"
done
[[ "$warmup" =~ ^[0-9]+$ ]] || die "--warmup must be an integer >= 0"

# Steps per (model, precision): the defaults, then a bare S, then MODEL=S, then MODEL:PREC=S,
# so that the more specific entry wins whatever the order on the command line.
declare -A steps_of=([mlp:fp32]=300 [cnn:fp32]=60 [resnet-mini:fp32]=40
                     [mlp:bf16]=30 [cnn:bf16]=6 [resnet-mini:bf16]=8)
steps_usage="use S, MODEL=S or MODEL:PRECISION=S with S >= 1, as in -s \"mlp=300 cnn:bf16=6\""
for pass in 1 2 3; do
  for entry in $steps_spec; do
    if [[ "$entry" =~ ^[1-9][0-9]*$ ]]; then
      ((pass == 1)) && for key in "${!steps_of[@]}"; do steps_of[$key]=$entry; done
    elif [[ "$entry" =~ ^(mlp|cnn|resnet-mini)=([1-9][0-9]*)$ ]]; then
      ((pass == 2)) && steps_of[${BASH_REMATCH[1]}:fp32]=${BASH_REMATCH[2]} &&
        steps_of[${BASH_REMATCH[1]}:bf16]=${BASH_REMATCH[2]}
    elif [[ "$entry" =~ ^(mlp|cnn|resnet-mini):(fp32|bf16)=([1-9][0-9]*)$ ]]; then
      ((pass == 3)) && steps_of[${BASH_REMATCH[1]}:${BASH_REMATCH[2]}]=${BASH_REMATCH[3]}
    else
      die "--steps: bad entry '$entry'" "$steps_usage"
    fi
    true
  done
done

# --out is relative to the caller's directory, everything else to the repository.
[[ -z "$out" || "$out" == /* ]] || out="$PWD/$out"
[[ -z "$config" || "$config" == /* ]] || config="$PWD/$config"
[[ -z "$data_dir" || "$data_dir" == /* ]] || data_dir="$PWD/$data_dir"
[[ -z "$mptrain_opt" || "$mptrain_opt" == /* ]] || mptrain_opt="$PWD/$mptrain_opt"
[[ -z "$gemm_opt" || "$gemm_opt" == none || "$gemm_opt" == /* ]] || gemm_opt="$PWD/$gemm_opt"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

if [[ -n "$config" ]]; then
  [[ -f "$config" ]] || die "config '$config' not found" "give an existing INI file to -c"
else
  for model in $models; do
    [[ -f "inputs/fashion-mnist-$model.ini" ]] ||
      die "config 'inputs/fashion-mnist-$model.ini' not found" "give one with -c"
  done
fi

if [[ -n "$data_dir" ]]; then
  [[ -f "$data_dir/train.h5" ]] || die "--data: no $data_dir/train.h5" \
    "give a folder written by mptrain prepare, or leave --data out for Fashion-MNIST"
else
  data_dir=data/fashion-mnist
fi

python=/usr/bin/python3  # Debian's python has torch and h5py; a pyenv python3 on PATH may not
mptrain=${mptrain_opt:-${MPTRAIN_BIN:-build/release/mptrain}}
[[ -x "$mptrain" || -n "$mptrain_opt" || -n "${MPTRAIN_BIN:-}" || ! -x build/release/src/app/mptrain ]] ||
  mptrain=build/release/src/app/mptrain
if [[ ! -x "$mptrain" ]]; then
  echo "compare_pytorch: $mptrain not found." >&2
  echo "hint: cmake --preset release && cmake --build --preset release -j\$(nproc), or --mptrain PATH" >&2
  exit 1
fi
[[ "$mptrain" == /* ]] || mptrain=$repo_root/$mptrain
gemm_bench=${gemm_opt:-${BENCH_KERNELS_BIN:-$(dirname "$mptrain")/perf/bench_kernels}}
if [[ "$gemm_bench" == none ]]; then
  gemm_bench=""
elif [[ ! -x "$gemm_bench" ]]; then
  if [[ -n "$gemm_opt" || -n "${BENCH_KERNELS_BIN:-}" ]]; then
    die "--gemm-bench: $gemm_bench not found or not executable" \
      "build it (cmake --build --preset release --target bench_kernels) or pass --gemm-bench none"
  fi
  echo "compare_pytorch: $gemm_bench not found: no GEMM ceiling in this run" \
    "(build the bench_kernels target, or pass --gemm-bench PATH)" >&2
  gemm_bench=""
fi
if ! "$python" -c 'import torch, h5py' 2>/dev/null; then
  echo "compare_pytorch: $python cannot import torch and h5py." >&2
  echo "hint: launch/install-deps.sh (without --no-torch) installs python3-torch and python3-h5py" >&2
  exit 1
fi

if [[ ! -f "$data_dir/train.h5" ]]; then
  echo "compare_pytorch: preparing Fashion-MNIST in $data_dir" >&2
  "$mptrain" prepare fashion-mnist --source /usr/share/datasets/fashion-mnist --out "$data_dir" >&2
fi

cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # GNU nproc reports OMP_NUM_THREADS when set
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
vectors=$(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mptrain-compare.XXXXXX")
if ((keep)); then
  echo "compare_pytorch: keeping runs in $tmp" >&2
else
  trap 'rm -rf "$tmp"' EXIT
fi
export MPTRAIN_BIN=$mptrain  # launch/mpirun.sh runs this one
results=$tmp/results.tsv  # framework, model, precision, ranks, threads, samples_per_s
gemm_results=$tmp/gemm.tsv  # library, M, N, K, GFLOP/s
: >"$results"
: >"$gemm_results"

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

# json_field FILE KEY: one field of the last JSON object line of FILE.
json_field() {
  grep '^{' "$1" | tail -n 1 | "$python" -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"
}

run_mptrain() {  # MODEL PRECISION RANKS THREADS REP
  local model=$1 precision=$2 k=$3 t=$4 i=$5
  local dir=$tmp/mpt-$model-$precision-$k-$t-$i steps=${steps_of[$model:$precision]}
  local cfg=${config:-inputs/fashion-mnist-$model.ini}
  # The PyTorch peer's setup: plain SGD with momentum at a constant lr, no test set, no
  # checkpoints, and enough epochs that --train.max-steps alone ends the run.
  run_or_show "$dir.log" env OMP_NUM_THREADS="$t" OPENBLAS_NUM_THREADS="$t" \
    launch/mpirun.sh "$k" train --config "$cfg" --model.name="$model" --model.print \
    --train.precision="$precision" --train.batch-size="$batch" --train.max-steps="$steps" \
    --train.epochs=1000 --optimizer.name=sgd --optimizer.lr=0.05 --optimizer.momentum=0.9 \
    --optimizer.nesterov=false --optimizer.weight-decay=0 --optimizer.lr-scaling=none \
    --schedule.name=constant --schedule.warmup-steps=0 --data.train="$data_dir/train.h5" \
    --data.test= --output.dir="$dir" \
    --checkpoint.dir=
  local sps flops
  sps=$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["samples_per_s"])' \
    "$dir/summary.json") || { echo "compare_pytorch: no samples_per_s in $dir/summary.json" >&2; exit 1; }
  # --model.print's last line: "total (10) PARAMS FORWARD_FLOPS (per sample)".
  flops=$(awk '$1 == "total" && /per sample/ { print $4 }' "$dir.log")
  [[ -n "$flops" ]] || { echo "compare_pytorch: no FLOPs per sample in $dir.log" >&2; exit 1; }
  echo "$flops" >"$tmp/flops-$model"
  [[ -f "$tmp/mptrain.json" ]] || cp "$dir/summary.json" "$tmp/mptrain.json"
  printf 'mptrain\t%s\t%s\t%s\t%s\t%s\n' "$model" "$precision" "$k" "$t" "$sps" >>"$results"
  printf '  rep %s, %s %s, %sx%s: mptrain %8.0f samples/s\n' "$i" "$model" "$precision" "$k" "$t" "$sps" >&2
}

pytorch_runs=0
run_pytorch() {  # MODEL PRECISION RANKS THREADS REP
  local model=$1 precision=$2 k=$3 t=$4 i=$5
  local log=$tmp/pt-$model-$precision-$k-$t-$i.log
  pytorch_runs=$((pytorch_runs + 1))
  # A fresh port per run, so that a socket still in TIME_WAIT never blocks the next one.
  run_or_show "$log" env OMP_NUM_THREADS="$t" OPENBLAS_NUM_THREADS="$t" \
    launch/mpirun.sh "$k" -- "$python" perf/pytorch_models.py --model "$model" \
    --precision "$precision" --data "$data_dir/train.h5" --batch-size "$batch" \
    --steps "${steps_of[$model:$precision]}" --warmup "$warmup" --threads "$t" \
    --port $((29500 + pytorch_runs % 1000))
  local sps
  sps=$(json_field "$log" samples_per_s) || { echo "compare_pytorch: no JSON line in $log" >&2; exit 1; }
  [[ -f "$tmp/pytorch.log" ]] || cp "$log" "$tmp/pytorch.log"
  printf 'pytorch\t%s\t%s\t%s\t%s\t%s\n' "$model" "$precision" "$k" "$t" "$sps" >>"$results"
  printf '  rep %s, %s %s, %sx%s: pytorch %8.0f samples/s\n' "$i" "$model" "$precision" "$k" "$t" "$sps" >&2
}

# The ceiling: single-core sgemm of oneDNN and OpenBLAS on the MLP's two large forward shapes
# (128x1024x784 and 128x1024x1024), by wall time, as samples/s is; and oneDNN's bf16 GEMM on
# them where the host takes bf16 operands (AMX or AVX512-BF16), the ceiling of the bf16 rows.
run_gemm() {  # REP
  [[ -n "$gemm_bench" ]] || return 0
  local json=$tmp/gemm-$1.json before
  before=$(wc -l <"$gemm_results")
  run_or_show "$tmp/gemm-$1.log" env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$gemm_bench" \
    '--benchmark_filter=^matmul/fwd_(784|1024)to1024/' --benchmark_min_time=0.2 \
    --benchmark_out="$json" --benchmark_out_format=json
  "$python" - "$json" >>"$gemm_results" <<'PY'
import json, re, sys
scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
for run in json.load(open(sys.argv[1]))["benchmarks"]:
    found = re.fullmatch(r"matmul/fwd_(\d+)to(\d+)/(\w+)", run["name"])
    if not found or run.get("error_occurred") or run.get("run_type", "iteration") != "iteration":
        continue
    k, n, lib = int(found[1]), int(found[2]), found[3]
    seconds = run["real_time"] * scale[run.get("time_unit", "ns")]
    print(f"{ {'dnnl': 'oneDNN', 'openblas': 'OpenBLAS', 'dnnl_bf16': 'oneDNN bf16'}.get(lib, lib)}\t128\t{n}\t{k}\t"
          f"{2 * 128 * n * k / seconds / 1e9:.2f}")
PY
  echo "  rep $1, GEMM: $(awk -F'\t' -v from="$before" \
    'NR > from {printf "%s %sx%sx%s %.1f  ", $1, $2, $3, $4, $5}' "$gemm_results")GFLOP/s" >&2
}

steps_line=""
for model in $models; do
  for precision in $precisions; do steps_line+="$model $precision ${steps_of[$model:$precision]}, "; done
done
echo "compare_pytorch: $reps reps x models {$models} x precisions {$precisions} x ranks {$ranks}" \
  "x threads {$threads_list}, batch $batch/rank, steps: ${steps_line%, }" >&2
start=$SECONDS
for ((i = 1; i <= reps; i++)); do
  run_gemm "$i"
  for k in $ranks; do
    for t in $threads_list; do
      for model in $models; do
        for precision in $precisions; do
          # Alternate which framework goes first, so that drift (thermal, page cache, the
          # neighbours' load) hits both alike.
          if ((i % 2)); then
            run_mptrain "$model" "$precision" "$k" "$t" "$i"
            run_pytorch "$model" "$precision" "$k" "$t" "$i"
          else
            run_pytorch "$model" "$precision" "$k" "$t" "$i"
            run_mptrain "$model" "$precision" "$k" "$t" "$i"
          fi
        done
      done
    done
  done
done

steps_args=()
for key in "${!steps_of[@]}"; do steps_args+=("$key=${steps_of[$key]}"); done
table=$("$python" - "$tmp" "$batch" "$reps" "$cores" "$cpu" "$vectors" "${steps_args[@]}" <<'PY'
import json, os, statistics, sys
tmp, batch, reps, cores, cpu, vectors = sys.argv[1:7]
steps = dict(arg.split("=") for arg in sys.argv[7:])
cores = int(cores)
runs, order = {}, []
for line in open(os.path.join(tmp, "results.tsv")):
    framework, model, precision, ranks, threads, sps = line.rstrip("\n").split("\t")
    key = (model, precision, int(ranks), int(threads))
    if key not in order:
        order.append(key)
    runs.setdefault(key, {}).setdefault(framework, []).append(float(sps))
gemm = {}
for line in open(os.path.join(tmp, "gemm.tsv")):
    lib, m, n, k, rate = line.rstrip("\n").split("\t")
    shape = f"{m}\u00d7{n}\u00d7{k}"
    gemm.setdefault(shape, {}).setdefault(lib, []).append(float(rate))
def best_of(bf16):
    return max((max(v) for libs in gemm.values() for lib, v in libs.items()
                if lib.endswith(" bf16") == bf16), default=None)
best, best_bf16 = best_of(False), best_of(True)
summary = json.load(open(os.path.join(tmp, "mptrain.json")))
torch = json.loads([l for l in open(os.path.join(tmp, "pytorch.log")) if l.startswith("{")][-1])
flops = {m: float(open(os.path.join(tmp, f"flops-{m}")).read())
         for m in dict.fromkeys(key[0] for key in order)}

def cell(values):
    return f"{statistics.median(values):,.0f} [{min(values):,.0f}\u2013{max(values):,.0f}]"

print(f"Batch {batch} per rank, median [min\u2013max] of {reps} alternating runs; mptrain "
      f"{summary.get('mptrain_version', '?')} (`{summary.get('git_hash', '?')}`, matmul "
      f"{summary.get('matmul', '?')}), PyTorch {torch.get('torch', '?')}; {cores} cores "
      f"({cpu}; {vectors.strip() or 'no AVX2'}). Steps per run: "
      + ", ".join(f"{m} {p} {steps[m + ':' + p]}"
                  for m, p in dict.fromkeys((k[0], k[1]) for k in order)) + ".")
print()
print("| model | precision | ranks \u00d7 threads | mptrain samples/s | PyTorch samples/s "
      "| mptrain / PyTorch | mptrain GFLOP/s per core | of best 1-core GEMM |")
print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
for key in order:
    model, precision, ranks, threads = key
    m, p = runs[key]["mptrain"], runs[key]["pytorch"]
    ratio = statistics.median(m) / statistics.median(p)
    used = min(ranks * threads, cores)
    rate = 3 * flops[model] * statistics.median(m) / 1e9 / used
    # A bf16 row against the bf16 GEMM where the run measured one (the bf16 dot products).
    ceiling = best_bf16 if precision == "bf16" and best_bf16 else best
    share = f"{100 * rate / ceiling:.0f} %" if ceiling else "\u2013"
    print(f"| {model} | {precision} | {ranks} \u00d7 {threads} | {cell(m)} | {cell(p)} "
          f"| {ratio:.2f} | {rate:.1f} | {share} |")
print()
print("mptrain GFLOP/s per core = 3 \u00d7 forward FLOPs per sample (`--model.print`: "
      + ", ".join(f"{m} {flops[m] / 1e6:.4g} M" for m in flops)
      + ") \u00d7 samples/s / cores in use (ranks \u00d7 threads, at most the machine's).")
if gemm:
    print()
    print("Single-core GEMM (sgemm; oneDNN bf16: bf16 operands, f32 sums), Y = X\u00b7W\u1d40 (M\u00d7N\u00d7K, `bench_kernels`, wall time), "
          f"best [min\u2013max] GFLOP/s of {reps} runs, one per repetition above:")
    print()
    libs = sorted({lib for v in gemm.values() for lib in v})
    print("| GEMM | " + " | ".join(libs) + " |")
    print("| --- |" + " ---: |" * len(libs))
    for shape, by_lib in gemm.items():
        cells = [f"{max(v):.1f} [{min(v):.1f}\u2013{max(v):.1f}]" if (v := by_lib.get(lib))
                 else "\u2013" for lib in libs]
        print(f"| {shape} | " + " | ".join(cells) + " |")
    print()
    print(f"Best single-core GEMM in this run: {best:.1f} GFLOP/s"
          + (f" (f32); bf16 operands: {best_bf16:.1f} GFLOP/s, the bf16 rows' ceiling."
             if best_bf16 else "."))
PY
)
echo "$table"
if [[ -n "$out" ]]; then
  mkdir -p "$(dirname "$out")"
  printf '%s\n' "$table" >"$out"
  echo "compare_pytorch: wrote $out" >&2
fi
echo "compare_pytorch: done in $((SECONDS - start)) s" >&2
