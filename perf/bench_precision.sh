#!/usr/bin/env bash
# Mixed precision on the host, end to end for the MLP: step time of fp16 and bf16 against fp32
# (one process, alternating) and peak resident memory at a large batch (one process per
# precision), printed as the Markdown of docs/perf.md. Targets: step <= 1.1x, memory <= 0.6x.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: perf/bench_precision.sh [options]

  -B, --bin PATH        the bench_precision binary (default build/release/perf/bench_precision)
  -b, --batch B         batch of the step-time comparison (default 128)
  -m, --memory-batch M  batch of the memory comparison (default 16384)
  -r, --reps R          step-time repetitions per precision (default 15)
  -s, --steps S         steps per repetition (default 5)
  -t, --threads T       OMP_NUM_THREADS (default 1)
  -h, --help            show this help
USAGE
}

bin=build/release/perf/bench_precision
batch=128
memory_batch=16384
reps=15
steps=5
threads=1
need() { [[ $2 -ge 2 ]] || { echo "bench_precision: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    -B|--bin) need "$1" $#; bin=$2; shift 2 ;;
    -b|--batch) need "$1" $#; batch=$2; shift 2 ;;
    -m|--memory-batch) need "$1" $#; memory_batch=$2; shift 2 ;;
    -r|--reps) need "$1" $#; reps=$2; shift 2 ;;
    -s|--steps) need "$1" $#; steps=$2; shift 2 ;;
    -t|--threads) need "$1" $#; threads=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "bench_precision: unknown option '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
[[ -x $bin ]] || { echo "bench_precision: no binary at $bin (hint: cmake --build --preset release --target bench_precision, or pass --bin)" >&2; exit 2; }
export OMP_NUM_THREADS=$threads

echo "### Step time"
echo
"$bin" step --batch "$batch" --reps "$reps" --steps "$steps"
echo
echo "### Peak resident memory, batch $memory_batch"
echo
# Each precision in its own process: VmHWM is a per-process high-water mark.
declare -A peak with_input activation
for precision in fp32 fp16 bf16; do
  line=$("$bin" memory --precision "$precision" --batch "$memory_batch")
  value() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$line"; }
  peak[$precision]=$(value peak_minus_baseline_mib)
  with_input[$precision]=$(value peak_with_input_mib)
  activation[$precision]=$(value activation_mib)
done
echo "| precision | peak - baseline MiB | ratio | with the f32 input batch MiB | ratio | planned activations MiB |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
for precision in fp32 fp16 bf16; do
  awk -v p="$precision" -v a="${peak[$precision]}" -v a0="${peak[fp32]}" -v b="${with_input[$precision]}" \
      -v b0="${with_input[fp32]}" -v c="${activation[$precision]}" \
      'BEGIN { printf "| %s | %.1f | %.3f | %.1f | %.3f | %.1f |\n", p, a, a / a0, b, b / b0, c }'
done
