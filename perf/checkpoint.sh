#!/usr/bin/env bash
# Checkpoint benchmarks (issue #7): (a) write bandwidth of an mptrain checkpoint against a raw
# `dd ... conv=fsync` of the same byte count to the same file system (target >= 0.7x), and (b)
# the training stall per checkpoint, synchronous against --checkpoint.async, for a model whose
# checkpoint is >= 100 MB. Rounds interleave dd, a sync run and an async run, so that load from
# elsewhere on the machine hits them alike. A run writes several checkpoints a few hundred ms
# apart, and a disk (here a VM's) slows down under writes back to back, so dd writes as many
# files, as far apart, and checkpoint k is compared with dd's file k.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: perf/checkpoint.sh [options] [BUILD_DIR]

A warm-up run gives the checkpoint's byte count, the checkpoints per run (N) and the time
between two of them (G: EVERY steps at the run's speed without its stalls). Each round, after
2 s of rest: dd writes N files of that byte count (bs=1M, conv=fsync, from a random file in
memory), G apart; then a training run of STEPS steps with --checkpoint.every-steps=EVERY,
synchronous; then the same run with --checkpoint.async=true. Prints two Markdown tables, from
the runs' "checkpoint: wrote PATH (BYTES bytes, write W s, stall S s, async|sync)" lines and
their summary.json:
  (a) dd's seconds per file and the sync run's write seconds per checkpoint, the bandwidth
      ratio mptrain / dd of each pair, and of the sums;
  (b) stall per checkpoint and checkpoint_stall_s, sync against async, with the run's wall_s.

  -o, --out DIR        where checkpoints, dd's file and the logs go: the file system measured
                       (default: a temporary directory in $TMPDIR or /tmp, removed at the end)
  -r, --rounds R       rounds (default 5)
  -n, --ranks N        ranks (default 2)
  -m, --model SPEC     --model.layers (default dense:4096,relu,dense:4096,relu,dense:10: 20.0 M
                       parameters, 80 MB of FP32 weights, about 160 MB with SGD momentum)
  -s, --steps S        steps per run (default 12)
  -e, --every E        --checkpoint.every-steps (default 4)
  -b, --batch B        samples per rank per step (default 16)
  -x, --extra "ARGS"   more `mptrain train` options for every run
  -h, --help           show this help

BUILD_DIR holds the mptrain binary (default build/release). Runs under `nice -n 5`.
MB = 10^6 bytes.
EOF
}

out=""
rounds=5
ranks=2
model=dense:4096,relu,dense:4096,relu,dense:10
steps=12
every=4
batch=16
extra=""
build=build/release
need() { [[ $2 -ge 2 ]] || { echo "checkpoint.sh: $1 needs a value" >&2; exit 2; }; }
while (($#)); do
  case "$1" in
    -o | --out) need "$1" $#; out=$2; shift ;;
    -r | --rounds) need "$1" $#; rounds=$2; shift ;;
    -n | --ranks) need "$1" $#; ranks=$2; shift ;;
    -m | --model) need "$1" $#; model=$2; shift ;;
    -s | --steps) need "$1" $#; steps=$2; shift ;;
    -e | --every) need "$1" $#; every=$2; shift ;;
    -b | --batch) need "$1" $#; batch=$2; shift ;;
    -x | --extra) need "$1" $#; extra=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "checkpoint.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) build=$1 ;;
  esac
  shift
done
[[ "$build" == /* ]] || build="$PWD/$build"
mptrain=$build/mptrain
[[ -x "$mptrain" ]] || mptrain=$build/src/app/mptrain
if [[ ! -x "$mptrain" ]]; then
  echo "checkpoint.sh: no mptrain binary in $build" >&2
  echo "hint: cmake --preset release && cmake --build --preset release, or pass a build dir" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

cleanup=()
if [[ -z "$out" ]]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/mpt-ckpt-bench.XXXXXX")
  cleanup+=("$out")
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
# dd's source: random bytes (incompressible, like weights) in memory, so that reading it costs
# next to nothing and dd measures the writes.
src_dir=/dev/shm
[[ -d "$src_dir" && -w "$src_dir" ]] || src_dir=${TMPDIR:-/tmp}
src=$(mktemp "$src_dir/mpt-ckpt-dd-src.XXXXXX")
cleanup+=("$src")
trap 'rm -rf "${cleanup[@]}"' EXIT

echo "== checkpoint.sh: writing to $out ($(df -hT "$out" | awk 'NR == 2 { print $1 ", " $2 }'))" >&2
data=$out/data
[[ -f "$data/train.h5" ]] ||
  "$mptrain" prepare synthetic --out "$data" --train-samples 2048 --test-samples 64 --seed 7 >/dev/null

# train MODE ROUND [EVERY]: one run; its log is $out/MODE-ROUND.log, its outputs
# $out/run-MODE-ROUND. EVERY=0: only the checkpoint at the end.
train() {
  local mode=$1 round=$2 every_steps=${3:-$every} async=false
  [[ "$mode" == async ]] && async=true
  local dir=$out/run-$mode-$round
  rm -rf "$dir" "$out/ckpt"
  # shellcheck disable=SC2086  # EXTRA is a list of options
  nice -n 5 mpiexec -n "$ranks" --oversubscribe "$mptrain" train --data.train="$data/train.h5" \
    --model.layers="$model" --train.batch-size="$batch" --train.max-steps="$steps" \
    --train.epochs=1000 --train.log-every="$steps" --checkpoint.dir="$out/ckpt" \
    --checkpoint.every-steps="$every_steps" --checkpoint.async="$async" $extra \
    --output.dir="$dir" >"$out/$mode-$round.log" 2>&1 ||
    { echo "checkpoint.sh: run failed, see below" >&2; cat "$out/$mode-$round.log" >&2; exit 1; }
  grep -q "^checkpoint: wrote .* bytes, write" "$out/$mode-$round.log" || {
    echo "checkpoint.sh: no 'checkpoint: wrote PATH (BYTES bytes, write W s, ...)' line in" \
      "$out/$mode-$round.log (hint: a binary without issue #7's checkpoints?)" >&2
    exit 1
  }
}
# checkpoint_bytes LOG: the byte count of the first checkpoint a run wrote.
checkpoint_bytes() { sed -n 's/^checkpoint: wrote .* (\([0-9]*\) bytes,.*/\1/p' "$1" | head -n 1; }

# A first run, untimed, with only the checkpoint at the end, gives the checkpoint's size and
# the time EVERY steps take, with no checkpoint inside the steps timed (train_s; on 2+ ranks a
# checkpoint on rank 0 would show as a longer step on the others). It also warms the page cache.
echo "== warm-up run" >&2
train sync 0 0
bytes=$(checkpoint_bytes "$out/sync-0.log")
# Checkpoints at every multiple of EVERY below STEPS, and one at the end.
count=$(((steps - 1) / every + 1))
gap=$(python3 - "$out/run-sync-0/summary.json" "$every" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{s['train_s'] / s['steps'] * int(sys.argv[2]):.2f}")
PY
)
echo "== checkpoints of $bytes bytes, $count per run, $gap s apart; $rounds rounds of" \
  "dd x $count, sync run, async run" >&2
head -c "$bytes" /dev/urandom >"$src"

for round in $(seq "$rounds"); do
  sync
  sleep 2
  : >"$out/dd-$round.log"
  for k in $(seq "$count"); do
    ((k == 1)) || sleep "$gap"
    nice -n 5 dd if="$src" of="$out/dd-$k.bin" bs=1M iflag=count_bytes count="$bytes" conv=fsync \
      2>>"$out/dd-$round.log"
  done
  rm -f "$out"/dd-*.bin
  train sync "$round"
  train async "$round"
done

python3 - "$out" "$rounds" "$bytes" <<'PY'
import json, re, statistics, sys
out, rounds, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
line = re.compile(r"^checkpoint: wrote (\S+) \((\d+) bytes, write ([\d.eE+-]+) s, stall ([\d.eE+-]+) s, (async|sync)\)")
def checkpoints(mode, r):
    found = [m for m in (line.match(l) for l in open(f"{out}/{mode}-{r}.log")) if m]
    return [(int(m[2]), float(m[3]), float(m[4])) for m in found]
def dd_seconds(r):
    found = re.findall(r"(\d+) bytes .* copied, ([\d.eE+-]+) s", open(f"{out}/dd-{r}.log").read())
    assert found and all(int(b) == nbytes for b, _ in found), f"dd round {r}: {found}"
    return [float(t) for _, t in found]
def each(values, fmt):
    return ", ".join(format(v, fmt) for v in values)
print(f"(a) write bandwidth, checkpoints of {nbytes / 1e6:.1f} MB (MB/s of the first in parentheses)")
print()
print("| round | dd s, each file | mptrain write s, each checkpoint | mptrain / dd, each | mptrain / dd, sums |")
print("| ---: | --- | --- | --- | ---: |")
ratios, firsts, all_dd, all_write = [], [], [], []
for r in range(1, rounds + 1):
    dd = dd_seconds(r)
    write = [w for _, w, _ in checkpoints("sync", r)]
    all_dd += dd
    all_write += write
    n = min(len(dd), len(write))
    pair = [dd[k] / write[k] for k in range(n)]
    ratios.append(sum(dd[:n]) / sum(write[:n]))
    firsts.append(pair[0])
    print(f"| {r} | {each(dd, '.2f')} ({nbytes / dd[0] / 1e6:.0f}) | {each(write, '.2f')} "
          f"({nbytes / write[0] / 1e6:.0f}) | {each(pair, '.2f')} | {ratios[-1]:.2f}x |")
print()
print(f"mptrain / dd, sums: {min(ratios):.2f}-{max(ratios):.2f}x, median {statistics.median(ratios):.2f}x; "
      f"first checkpoint: {min(firsts):.2f}-{max(firsts):.2f}x, median {statistics.median(firsts):.2f}x")
dd_median, write_median = statistics.median(all_dd), statistics.median(all_write)
print(f"pooled medians: dd {dd_median:.2f} s ({nbytes / dd_median / 1e6:.0f} MB/s), mptrain "
      f"{write_median:.2f} s ({nbytes / write_median / 1e6:.0f} MB/s): {dd_median / write_median:.2f}x")
print()
print("(b) training stall per checkpoint, sync against async")
print()
print("| round | mode | checkpoints | stall s, each checkpoint | checkpoint_stall_s | write s, each | wall_s |")
print("| ---: | --- | ---: | --- | ---: | --- | ---: |")
stall = {"sync": [], "async": []}
for r in range(1, rounds + 1):
    for mode in ("sync", "async"):
        ck = checkpoints(mode, r)
        s = json.load(open(f"{out}/run-{mode}-{r}/summary.json"))
        stall[mode].append(s["checkpoint_stall_s"] / max(1, s.get("checkpoints", len(ck))))
        print(f"| {r} | {mode} | {s.get('checkpoints', len(ck))} | {each([c[2] for c in ck], '.3f')} | "
              f"{s['checkpoint_stall_s']:.3f} | {each([c[1] for c in ck], '.2f')} | "
              f"{s['wall_s']:.2f} |")
print()
print(f"checkpoint_stall_s per checkpoint, median over the rounds: sync {statistics.median(stall['sync']):.3f} s, "
      f"async {statistics.median(stall['async']):.3f} s")
PY
