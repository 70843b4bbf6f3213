#!/usr/bin/env bash
# gpu_bench refuses bad options before it looks for a device, so these run on any machine:
# each gets the usage-error exit status 2 and a one-line error naming the option.
# Usage: bench_args.sh GPU_BENCH
set -u
BENCH=$1
failed=0
# refused ARGS... -- MESSAGE: gpu_bench ARGS exits 2 and prints MESSAGE.
refused() {
  local args=() message out rc
  while [ "$1" != "--" ]; do args+=("$1"); shift; done
  message=$2
  out=$("$BENCH" "${args[@]}" 2>&1); rc=$?
  if [ "$rc" -eq 2 ] && grep -qF -- "$message" <<<"$out" && [ "$(wc -l <<<"$out")" -eq 1 ]; then
    echo "ok: ${args[*]}: $out"
  else
    echo "FAIL: ${args[*]}: exit $rc, wanted 2 and one line with \"$message\"; got:"; echo "$out"
    failed=1
  fi
}
refused --precision int32 -- "--precision: 'int32' is not a training precision"
refused --model "flatten,dense:64,dropout:0.5,dense:10" --graphs -- \
  "--graphs: model 'flatten,dense:64,dropout:0.5,dense:10' cannot be captured"
refused --model "flatten,dense:64,bogus:3,dense:10" -- "bogus"
refused --steps 10 --frobnicate -- "unknown option --frobnicate"
# A capturable model is not refused: without a device it is skipped, with one it runs.
out=$("$BENCH" --model "flatten,dense:64,dropout:0,dense:10" --graphs --steps 2 --warmup 1 --no-gemm 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then
  echo "ok: dropout:0 with --graphs is accepted: $(tail -1 <<<"$out")"
else
  echo "FAIL: dropout:0 with --graphs: exit $rc"; echo "$out"; failed=1
fi
exit $failed
