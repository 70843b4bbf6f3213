#!/usr/bin/env python3
"""Where a profiled step spends its GPU time: ncu's CSV (gpu__time_duration.sum per kernel
launch) totalled per kernel, largest first, as a markdown table.

perf/gpu_check.sh profiles one timed nn::Model step of gpu_bench (its profiler range) with
  ncu --csv --print-units base --print-kernel-base function --profile-from-start off \\
      --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\\
sm__throughput.avg.pct_of_peak_sustained_elapsed perf/gpu/gpu_bench ... --steps 1
and feeds the output here. Where the two throughput metrics are there, the table has a column
for each: the kernel's percentage of the peak DRAM and SM throughput, averaged over its calls
weighted by their time. A kernel low in both is bound by latency (too few loads in flight), one
high in SM and low in DRAM by arithmetic, one near the DRAM peak by memory. Lines that are not
CSV (the program's own, ncu's ==PROF==) are skipped. Usage: ncu_summary.py LOG [--label TEXT]
[--top N] [--steps S]
"""
import argparse
import csv
import sys

# ncu prints durations in the unit it chose unless --print-units base; accept any of them.
UNIT_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3,
              "ms": 1e3, "second": 1e6, "s": 1e6}


TIME = "gpu__time_duration.sum"
# The optional throughput metrics, in percent of the peak, and their columns.
PERCENTS = {"dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM %",
            "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM %"}


def kernel_times(lines):
    """[(kernel name, microseconds, {metric: percent})] for every launch (ncu's ID) with a
    gpu__time_duration.sum row of ncu's CSV, with its throughput percentages where given."""
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
    id_at = header.index("ID") if "ID" in header else None
    launches = {}  # ID (or row number) -> [name, us or None, {metric: percent}]
    for number, row in enumerate(rows):
        if len(row) <= max(name_at, metric_at, unit_at, value_at) or row == header:
            continue
        metric = row[metric_at]
        if metric != TIME and metric not in PERCENTS:
            continue
        launch = launches.setdefault(row[id_at] if id_at is not None else number,
                                     [row[name_at], None, {}])
        unit = row[unit_at].strip()
        value = float(row[value_at].replace(",", ""))
        if metric == TIME:
            if unit not in UNIT_TO_US:
                raise SystemExit(f"ncu_summary.py: unknown time unit '{unit}' in the CSV")
            launch[1] = value * UNIT_TO_US[unit]
        else:
            if unit != "%":
                raise SystemExit(f"ncu_summary.py: {metric} in '{unit}', not '%'")
            launch[2][metric] = value
    return [(name, us, percents) for name, us, percents in launches.values() if us is not None]


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
    shown = [metric for metric in PERCENTS if any(metric in p for _, _, p in times)]
    totals = {}  # name -> [calls, us, {metric: (sum of percent * us, us with the metric)}]
    for name, us, percents in times:
        total = totals.setdefault(name, [0, 0.0, {}])
        total[0] += 1
        total[1] += us
        for metric, percent in percents.items():
            weighted, timed = total[2].get(metric, (0.0, 0.0))
            total[2][metric] = (weighted + percent * us, timed + us)
    step_us = sum(us for _, us, _ in times) / args.steps
    print(f"{args.label}: {len(times) // args.steps} kernels, {step_us:.1f} us of GPU time per step")
    print()
    columns = "".join(f" {PERCENTS[metric]} |" for metric in shown)
    print(f"| kernel | calls/step | us/step | share |{columns}")
    print("|---|---:|---:|---:|" + "---:|" * len(shown))
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])
    for name, (calls, total, percents) in ranked[:args.top]:
        share = 100.0 * total / args.steps / step_us
        cells = ""
        for metric in shown:
            weighted, timed = percents.get(metric, (0.0, 0.0))
            cells += f" {weighted / timed:.0f} |" if timed > 0 else " |"
        print(f"| {name[:90]} | {calls / args.steps:g} | {total / args.steps:.1f} | {share:.1f} % |"
              f"{cells}")
    rest = ranked[args.top:]
    if rest:
        rest_us = sum(total for _, (_, total, _) in rest) / args.steps
        print(f"| ({len(rest)} more kernels) | | {rest_us:.1f} | {100.0 * rest_us / step_us:.1f} % |"
              + " |" * len(shown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
