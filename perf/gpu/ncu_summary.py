#!/usr/bin/env python3
"""Where a profiled step spends its GPU time: ncu's CSV (one metric, gpu__time_duration.sum,
per kernel launch) totalled per kernel, largest first, as a markdown table.

perf/gpu_check.sh profiles one timed nn::Model step of gpu_bench (its profiler range) with
  ncu --csv --print-units base --print-kernel-base function --profile-from-start off \\
      --metrics gpu__time_duration.sum perf/gpu/gpu_bench ... --steps 1
and feeds the output here. Lines that are not CSV (the program's own, ncu's ==PROF==) are
skipped. Usage: ncu_summary.py LOG [--label TEXT] [--top N] [--steps S]
"""
import argparse
import csv
import sys

# ncu prints durations in the unit it chose unless --print-units base; accept any of them.
UNIT_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3,
              "ms": 1e3, "second": 1e6, "s": 1e6}


def kernel_times(lines):
    """[(kernel name, microseconds)] for every gpu__time_duration.sum row of ncu's CSV."""
    rows = csv.reader(line for line in lines if line.startswith('"'))
    header = next(rows, None)
    if header is None:
        return []
    try:
        name_at, metric_at = header.index("Kernel Name"), header.index("Metric Name")
        unit_at, value_at = header.index("Metric Unit"), header.index("Metric Value")
    except ValueError as missing:
        raise SystemExit(f"ncu_summary.py: not ncu's --csv output ({missing}); "
                         "hint: run ncu with --csv --metrics gpu__time_duration.sum")
    times = []
    for row in rows:
        if len(row) <= max(name_at, metric_at, unit_at, value_at) or row == header:
            continue
        if row[metric_at] != "gpu__time_duration.sum":
            continue
        unit = row[unit_at].strip()
        if unit not in UNIT_TO_US:
            raise SystemExit(f"ncu_summary.py: unknown time unit '{unit}' in the CSV")
        value = float(row[value_at].replace(",", ""))
        times.append((row[name_at], value * UNIT_TO_US[unit]))
    return times


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("--label", default="profiled step")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--steps", type=int, default=1, help="steps in the profiled range")
    args = parser.parse_args()
    with open(args.log, errors="replace") as f:
        times = kernel_times(f)
    if not times:
        print(f"{args.label}: no kernel times in {args.log}")
        return 1
    totals = {}
    for name, us in times:
        calls, total = totals.get(name, (0, 0.0))
        totals[name] = (calls + 1, total + us)
    step_us = sum(us for _, us in times) / args.steps
    print(f"{args.label}: {len(times) // args.steps} kernels, {step_us:.1f} us of GPU time per step")
    print()
    print("| kernel | calls/step | us/step | share |")
    print("|---|---:|---:|---:|")
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])
    for name, (calls, total) in ranked[:args.top]:
        share = 100.0 * total / args.steps / step_us
        print(f"| {name[:90]} | {calls / args.steps:g} | {total / args.steps:.1f} | {share:.1f} % |")
    rest = ranked[args.top:]
    if rest:
        rest_us = sum(total for _, (_, total) in rest) / args.steps
        print(f"| ({len(rest)} more kernels) | | {rest_us:.1f} | {100.0 * rest_us / step_us:.1f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
