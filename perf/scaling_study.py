#!/usr/bin/env python3
"""Weak and strong scaling of `mptrain train` over a list of rank counts (issue #9).

Runs the trainer once per (mode, rank count, repeat), interleaving the repeats across rank counts
so that a slow moment of a shared machine lands on every rank count rather than on one, then
collects each run's metrics.jsonl / summary.json and writes, in --out:

  scaling.csv       one row per mode x rank count: throughput (median over repeats), per rank,
                    efficiency, and the step-time breakdown in ms per step
  scaling.md        the same as Markdown tables, with the command line that produced them
  throughput.png    samples/s against ranks (log2 x axis), the ideal line drawn in
  efficiency.png    efficiency against ranks, the ideal 1.0 drawn in

Weak scaling keeps the batch per rank fixed (--batch-per-rank); strong scaling keeps the global
batch fixed (--global-batch, divided evenly among the ranks). Efficiency at N ranks is
throughput_N / (N / N0 * throughput_N0), N0 the smallest rank count: 1.0 is perfect scaling.

Warm-up: the first steps allocate and first-touch memory. Throughput and the breakdown come from
the logged windows (metrics.jsonl) that end after --warmup-steps (default: the first window),
not from summary.json's whole-run totals; --collect-only falls back to summary.json, marked
"whole run", for runs without metrics.jsonl.

--collect-only DIR skips the runs and collects the summary.json files already under DIR (the
driver's own DIR/runs/<mode>-n<N>-r<R>/, or a Slurm job array's runs/<name>-<i>/ from
launch/slurm/sweep-array.sbatch; --match 'name-*' picks one sweep's folders). A run's mode
comes from its directory name when that contains "weak" or "strong", else from the shapes: a
global batch shared by several world sizes is strong scaling, a batch per rank shared by
several world sizes is weak.

Needs python3 with matplotlib (Debian: python3-matplotlib) for the plots; nothing else.
"""

import argparse
import csv
import fnmatch
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

PROG = "scaling_study"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Breakdown parts: metrics.jsonl / summary.json key -> CSV column (ms per step).
PARTS = [("data_wait_s", "data_wait"), ("forward_s", "forward"), ("backward_s", "backward"),
         ("comm_time_s", "comm"), ("exposed_comm_time_s", "exposed_comm"),
         ("optimizer_s", "optimizer"), ("other_s", "other")]
COLUMNS = (["mode", "ranks", "nodes", "batch_per_rank", "global_batch", "samples_per_s",
            "samples_per_s_per_rank", "efficiency", "step_ms"] +
           [f"{name}_ms" for _, name in PARTS] +
           ["repeats", "samples_per_s_min", "samples_per_s_max", "spread", "measured"])
# Options the driver sets itself; passing them after `--` would be given twice.
DRIVER_OWNED = {
    "--train.batch-size": "--batch-per-rank / --global-batch",
    "--train.max-steps": "--steps",
    "--train.log-every": "--log-every",
    "--output.dir": "--out",
    "--train.threads": "--threads",
    "--comm.ranks-per-node": "--ranks-per-node",
}


class UserError(Exception):
    """A bad option or input: one line on stderr, exit 2."""


class RunError(Exception):
    """A run that failed or a result that cannot be read: one line on stderr, exit 1."""


def parse_args(argv):
    trainer_args = []
    if "--" in argv:
        at = argv.index("--")
        argv, trainer_args = argv[:at], argv[at + 1:]
    parser = argparse.ArgumentParser(
        prog="perf/scaling_study.py",
        description="Weak and strong scaling of mptrain train over rank counts: scaling.csv, "
                    "scaling.md, throughput.png and efficiency.png in --out.",
        epilog="Everything after `--` goes to `mptrain train` unchanged (e.g. --data.train=... "
               "--model.name=mlp). Example: perf/scaling_study.py --ranks 1,2,4 --mode both "
               "--batch-per-rank 64 --global-batch 256 --steps 300 --repeats 3 --out runs/scaling "
               "-- --data.train=data/fashion-mnist/train.h5 --model.name=mlp. With a --config "
               "that sets data.test or checkpoint.dir, add --data.test= --checkpoint.dir= after "
               "`--`: every run would evaluate and checkpoint into the same folder.")
    parser.add_argument("--ranks", default="1,2,4",
                        help="comma-separated rank counts (default 1,2,4)")
    parser.add_argument("--mode", choices=["weak", "strong", "both"], default="both",
                        help="weak: batch per rank fixed; strong: global batch fixed "
                             "(default both)")
    parser.add_argument("--batch-per-rank", type=int, default=64,
                        help="weak scaling: samples per rank per step (default 64)")
    parser.add_argument("--global-batch", type=int, default=0,
                        help="strong scaling: samples per step over all ranks; must divide by "
                             "every rank count (default: batch-per-rank x the largest rank count)")
    parser.add_argument("--steps", type=int, default=200,
                        help="training steps per run (default 200)")
    parser.add_argument("--log-every", type=int, default=0,
                        help="steps per logged window (default: steps / 10, at least 1)")
    parser.add_argument("--warmup-steps", type=int, default=-1,
                        help="leave out the windows that end at or before this step "
                             "(default: the first window)")
    parser.add_argument("--threads", type=int, default=1,
                        help="compute threads per rank, --train.threads (default 1, so that the "
                             "work per rank is the same at every rank count; 0: the trainer's "
                             "default)")
    parser.add_argument("--config", help="INI file passed to mptrain train as --config")
    parser.add_argument("--trainer-args", default="",
                        help="extra mptrain train options as one string (same as after `--`)")
    parser.add_argument("--ranks-per-node", type=int, default=0,
                        help="emulate nodes of K ranks (--comm.ranks-per-node=K; default 0: as MPI "
                             "reports); with --collect-only it only fills the nodes column "
                             "(ceil(N/K))")
    parser.add_argument("--launcher", choices=["auto", "mpirun", "srun"], default="auto",
                        help="auto: srun inside a Slurm allocation, else mpirun (default auto)")
    parser.add_argument("--mpiexec", default=os.environ.get("MPIEXEC", "mpirun"),
                        help="mpirun executable (default $MPIEXEC, else mpirun)")
    parser.add_argument("--launcher-args", default="",
                        help="extra launcher options as one string, e.g. '--cpu-bind=cores'")
    default_mptrain = os.path.join(REPO, "build/release/mptrain")
    parser.add_argument("--mptrain", default=os.environ.get("MPTRAIN", default_mptrain),
                        help="the mptrain binary (default $MPTRAIN, else build/release/mptrain)")
    parser.add_argument("--out",
                        help="output directory (runs under OUT/runs; default runs/scaling)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs per mode and rank count, interleaved; the median is reported "
                             "(default 1)")
    parser.add_argument("--collect-only", metavar="DIR",
                        help="run nothing: collect the summary.json files under DIR")
    parser.add_argument("--cores", type=int, default=0,
                        help="cores of the one machine all runs shared: the plots shade the "
                             "oversubscribed rank counts and draw the time-slicing ceiling "
                             "(default: this machine's with --launcher mpirun, none with srun or "
                             "--collect-only)")
    parser.add_argument("--match", default="*",
                        help="--collect-only: only run folders whose name matches this glob, "
                             "e.g. 'mlp-weak-*' (default *)")
    parser.add_argument("--timeout", type=float, default=0,
                        help="seconds one run may take before it counts as failed "
                             "(default 0: none)")
    args = parser.parse_args(argv)
    args.trainer_args = shlex.split(args.trainer_args) + trainer_args
    passed = ["--"] + trainer_args if trainer_args else []
    args.command_line = shlex.join(["perf/scaling_study.py"] + argv + passed)
    return args


def rank_counts(text):
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise UserError(f"--ranks '{text}' is not a comma-separated list of integers "
                        "(hint: --ranks 1,2,4)")
    if not counts or counts[0] < 1:
        raise UserError(f"--ranks '{text}' needs rank counts >= 1 (hint: --ranks 1,2,4)")
    return counts


def check_args(args):
    args.rank_list = rank_counts(args.ranks)
    args.modes = ["weak", "strong"] if args.mode == "both" else [args.mode]
    if args.collect_only:
        if not os.path.isdir(args.collect_only):
            raise UserError(f"--collect-only {args.collect_only}: no such directory")
        args.out = args.out or args.collect_only
        return
    args.out = args.out or os.path.join("runs", "scaling")
    for name in ["steps", "batch_per_rank", "repeats"]:
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, not {getattr(args, name)}")
    if args.threads < 0 or args.ranks_per_node < 0 or args.log_every < 0:
        raise UserError("--threads, --ranks-per-node and --log-every must be >= 0 (0: the default)")
    if "strong" in args.modes:
        if args.global_batch == 0:
            args.global_batch = args.batch_per_rank * args.rank_list[-1]
        bad = [n for n in args.rank_list if args.global_batch % n]
        if args.global_batch < 1 or bad:
            lcm = math.lcm(*args.rank_list)
            raise UserError(f"--global-batch {args.global_batch} does not divide by "
                            f"{', '.join(map(str, bad or args.rank_list))} rank(s) "
                            f"(hint: a multiple of {lcm}, e.g. {lcm * 64})")
    args.log_every = args.log_every or max(1, args.steps // 10)
    if args.warmup_steps < 0:
        args.warmup_steps = args.log_every
    if args.warmup_steps + args.log_every > args.steps:
        raise UserError(f"--steps {args.steps} leaves no logged window after --warmup-steps "
                        f"{args.warmup_steps} (windows of {args.log_every} steps; hint: more "
                        "--steps or a smaller --warmup-steps)")
    for arg in args.trainer_args:
        option = arg.split("=", 1)[0]
        if option in DRIVER_OWNED:
            raise UserError(f"trainer option {option} is set by the driver (hint: use "
                            f"{DRIVER_OWNED[option]})")
    if not (os.path.isfile(args.mptrain) and os.access(args.mptrain, os.X_OK)):
        raise UserError(f"--mptrain {args.mptrain}: not an executable file (hint: build it, or "
                        "pass --mptrain PATH / set MPTRAIN)")
    if args.config and not os.path.isfile(args.config):
        raise UserError(f"--config {args.config}: no such file")
    if args.launcher == "auto":
        in_slurm = os.environ.get("SLURM_JOB_ID") and shutil.which("srun")
        args.launcher = "srun" if in_slurm else "mpirun"
    launcher = args.mpiexec if args.launcher == "mpirun" else "srun"
    if not shutil.which(launcher):
        raise UserError(f"--launcher {args.launcher}: '{launcher}' not found on PATH "
                        "(hint: --mpiexec PATH, or --launcher srun inside a Slurm allocation)")


def cores():
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def batch_per_rank(args, mode, ranks):
    return args.batch_per_rank if mode == "weak" else args.global_batch // ranks


def run_command(args, mode, ranks, run_dir):
    if args.launcher == "srun":
        launch = ["srun", "-n", str(ranks)]
    else:
        launch = [args.mpiexec, "-n", str(ranks)]
        if ranks > cores():
            launch.append("--oversubscribe")
    launch += shlex.split(args.launcher_args)
    train = [args.mptrain, "train"]
    if args.config:
        train += ["--config", args.config]
    train += [f"--train.batch-size={batch_per_rank(args, mode, ranks)}",
              f"--train.max-steps={args.steps}", f"--train.log-every={args.log_every}",
              f"--output.dir={run_dir}",
              # A rerun of the study replaces its runs (mptrain refuses that without it).
              "--output.overwrite"]
    if args.threads:
        train.append(f"--train.threads={args.threads}")
    if args.ranks_per_node:
        train.append(f"--comm.ranks-per-node={args.ranks_per_node}")
    if not any(a.split("=", 1)[0] == "--train.epochs" for a in args.trainer_args):
        # --train.max-steps alone decides the length, whatever the data set's size.
        train.append("--train.epochs=1000000")
    return launch + train + args.trainer_args


def last_error_line(log_path):
    try:
        lines = [l.strip() for l in open(log_path, errors="replace") if l.strip()]
    except OSError:
        return ""
    for line in reversed(lines):
        if "error" in line.lower():
            return line
    return lines[-1] if lines else ""


def run_all(args):
    env = dict(os.environ)
    if args.launcher == "mpirun" and os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    runs_dir = os.path.join(args.out, "runs")
    os.makedirs(runs_dir, exist_ok=True)
    plan = [(repeat, mode, ranks) for repeat in range(1, args.repeats + 1)
            for mode in args.modes for ranks in args.rank_list]
    first_command, run_dirs = None, []
    args.loads = []  # the machine's load before each run: how shared it was
    for index, (repeat, mode, ranks) in enumerate(plan, 1):
        name = f"{mode}-n{ranks}-r{repeat}"
        run_dir = os.path.abspath(os.path.join(runs_dir, name))
        shutil.rmtree(run_dir, ignore_errors=True)
        os.makedirs(run_dir)
        command = run_command(args, mode, ranks, run_dir)
        first_command = first_command or command
        run_dirs.append(run_dir)
        log_path = os.path.join(run_dir, "train.log")
        with open(log_path, "w") as log:
            load = os.getloadavg()[0]
            args.loads.append(load)
            log.write(f"# {shlex.join(command)}\n# load average (1 min) at the start: {load:.2f}\n")
            log.flush()
            start = time.monotonic()
            try:
                code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      timeout=args.timeout or None).returncode
            except subprocess.TimeoutExpired:
                raise RunError(f"run {name} took over --timeout {args.timeout:g} s; "
                               f"log: {log_path}")
        if code != 0:
            detail = last_error_line(log_path)
            detail = f": {detail}" if detail else ""
            raise RunError(f"run {name} failed (exit {code}){detail}; log: {log_path}")
        summary = read_json(os.path.join(run_dir, "summary.json"), name)
        if summary.get("steps") != args.steps or summary.get("stop_reason") != "completed":
            raise RunError(f"run {name} stopped after {summary.get('steps')} of {args.steps} steps "
                           f"({summary.get('stop_reason')}); log: {log_path}")
        print(f"[{index}/{len(plan)}] {name}: {summary['samples_per_s']:.0f} samples/s "
              f"(whole run), {time.monotonic() - start:.1f} s", flush=True)
    return first_command, run_dirs


def read_json(path, name):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise RunError(f"run {name}: cannot read {path}: {e}")


def measure(run_dir, summary, warmup_steps):
    """Throughput and ms per step of one run: the windows after warm-up, else the whole run."""
    metrics = os.path.join(run_dir, "metrics.jsonl")
    windows = []
    if os.path.isfile(metrics):
        with open(metrics) as f:
            records = [json.loads(line) for line in f if line.strip()]
        windows = [r for r in records if "window_s" in r and "loss" in r]
        if warmup_steps is None:  # --collect-only: drop the first window
            windows = windows[1:]
        else:
            windows = [r for r in windows if r["step"] > warmup_steps]
    if windows:
        steps = sum(r["window_steps"] for r in windows)
        # Checkpoint stalls are left out of throughput, as the trainer does.
        seconds = sum(r["window_s"] - r.get("checkpoint_s", 0) for r in windows)
        parts = {name: sum(r.get(key, 0) for r in windows) for key, name in PARTS}
        first = windows[0]["step"] - windows[0]["window_steps"] + 1
        measured = f"steps {first}-{windows[-1]['step']}"
    else:
        steps = summary["steps"]
        seconds = summary["train_s"]
        parts = {name: summary.get(key, 0) for key, name in PARTS}
        accounted = sum(v for k, v in parts.items() if k not in ("comm", "other"))
        parts["other"] = max(0.0, seconds - accounted)
        measured = "whole run"
    if steps <= 0 or seconds <= 0:
        raise RunError(f"run {os.path.basename(run_dir)}: no measured steps in {run_dir}")
    result = {"samples_per_s": steps * summary["global_batch"] / seconds,
              "step_ms": 1000 * seconds / steps, "measured": measured}
    result.update({f"{name}_ms": 1000 * value / steps for name, value in parts.items()})
    return result


def nodes_of(run_dir, summary, ranks, ranks_per_node):
    if "nodes" in summary:
        return summary["nodes"]
    if ranks_per_node or ranks == 1:
        return math.ceil(ranks / max(ranks_per_node, 1))
    try:
        with open(os.path.join(run_dir, "train.log"), errors="replace") as f:
            found = re.search(r"(\d+) node\(s\)", f.read())
        return int(found.group(1)) if found else ""
    except OSError:
        return ""


def find_runs(root, pattern):
    runs = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        if "summary.json" in filenames and fnmatch.fnmatch(os.path.basename(dirpath), pattern):
            runs.append(dirpath)
    return runs


def infer_modes(runs):
    """Mode of each run: from its directory name, else from shapes shared by several world sizes."""
    def groups(key):
        seen = {}
        for run in runs:
            seen.setdefault(run["summary"][key], set()).add(run["summary"]["world_size"])
        return seen
    by_global, by_per_rank = groups("global_batch"), groups("batch_per_rank")
    best_strong = max(by_global, key=lambda g: (len(by_global[g]), g))
    best_weak = max(by_per_rank, key=lambda b: (len(by_per_rank[b]), b))
    tagged = []
    for run in runs:
        name = os.path.basename(run["dir"]).lower()
        if "weak" in name or "strong" in name:
            tagged.append(dict(run, mode="weak" if "weak" in name else "strong"))
            continue
        s = run["summary"]
        if len(by_per_rank[best_weak]) > 1 and s["batch_per_rank"] == best_weak:
            tagged.append(dict(run, mode="weak"))
        if len(by_global[best_strong]) > 1 and s["global_batch"] == best_strong:
            tagged.append(dict(run, mode="strong"))
    return tagged


def collect(args, run_dirs):
    """One row per mode x rank count from run_dirs (this study's runs), else --collect-only's."""
    root = args.collect_only or os.path.join(args.out, "runs")
    runs = []
    for run_dir in run_dirs or find_runs(root, args.match):
        summary = read_json(os.path.join(run_dir, "summary.json"), os.path.basename(run_dir))
        for key in ["world_size", "batch_per_rank", "global_batch", "steps", "train_s",
                    "samples_per_s"]:
            if key not in summary:
                raise RunError(f"{run_dir}/summary.json has no '{key}' "
                               "(not an mptrain train summary?)")
        runs.append({"dir": run_dir, "summary": summary})
    if not runs:
        raise UserError(f"no summary.json under {root} in folders matching '{args.match}' "
                        "(hint: the runs' --output.dir folders)")
    runs = infer_modes(runs) if args.collect_only else [
        dict(r, mode=os.path.basename(r["dir"]).split("-")[0]) for r in runs]
    if not runs:
        raise UserError(f"cannot tell weak from strong runs under {root}: name the run folders "
                        "weak-* / strong-*, or vary the rank count at a fixed batch")
    warmup = args.warmup_steps if args.warmup_steps >= 0 else None  # None: drop the first window
    rows = []
    for mode in ["weak", "strong"]:
        mine = [r for r in runs if r["mode"] == mode]
        by_ranks = {}
        for run in mine:
            by_ranks.setdefault(run["summary"]["world_size"], []).append(run)
        for ranks in sorted(by_ranks):
            group = by_ranks[ranks]
            shapes = {(r["summary"]["batch_per_rank"], r["summary"]["global_batch"]) for r in group}
            if len(shapes) > 1:
                raise UserError(f"{mode} scaling on {ranks} rank(s) mixes batch shapes "
                                f"{sorted(shapes)} under {root} (hint: one study per folder)")
            measured = [measure(r["dir"], r["summary"], warmup) for r in group]
            first = group[0]
            rates = [m["samples_per_s"] for m in measured]
            median = statistics.median(rates)
            row = {"mode": mode, "ranks": ranks,
                   "nodes": nodes_of(first["dir"], first["summary"], ranks, args.ranks_per_node),
                   "batch_per_rank": first["summary"]["batch_per_rank"],
                   "global_batch": first["summary"]["global_batch"],
                   "samples_per_s": median, "samples_per_s_per_rank": median / ranks,
                   "repeats": len(group), "samples_per_s_min": min(rates),
                   "samples_per_s_max": max(rates),
                   "spread": (max(rates) - min(rates)) / median,
                   "measured": measured[0]["measured"]}
            for column in ["step_ms"] + [f"{name}_ms" for _, name in PARTS]:
                row[column] = statistics.median(m[column] for m in measured)
            rows.append(row)
        base = [r for r in rows if r["mode"] == mode]
        for row in base:  # throughput_N / (N / N0 x throughput_N0)
            ideal = row["ranks"] / base[0]["ranks"] * base[0]["samples_per_s"]
            row["efficiency"] = row["samples_per_s"] / ideal
    return rows


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v
                             for k, v in row.items()})


def write_markdown(rows, args, example, path):
    lines = ["# Scaling study", "", "Produced by:", "", "```sh", args.command_line, "```", ""]
    if example:
        lines += ["One run (the first):", "", "```sh", shlex.join(example), "```", ""]
    warm = ("the logged windows after step %d (warm-up left out)" % args.warmup_steps
            if args.warmup_steps >= 0 else "the logged windows after the first (warm-up left out)")
    if getattr(args, "loads", None):
        lines += [f"Load average (1 min) at the start of each run: {min(args.loads):.2f}–"
                  f"{max(args.loads):.2f} (median {statistics.median(args.loads):.2f}) on "
                  f"{cores()} core(s) available to this process.", ""]
    lines += [f"Throughput is the median over repeats of the samples/s measured over {warm}; "
              "[min–max] over repeats. Efficiency at N ranks = throughput_N / (N / N0 x "
              "throughput_N0), N0 the smallest rank count of the mode (1.0 = ideal). The "
              "breakdown is ms per step, each part the slowest rank's (median over repeats); "
              "comm is the communication thread's total, overlapped or not, exposed the part "
              "the step waited for; step is the window's wall time per step.", ""]
    titles = {"weak": "Weak scaling (batch per rank fixed)",
              "strong": "Strong scaling (global batch fixed)"}
    for mode in ["weak", "strong"]:
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        lines += [f"## {titles[mode]}", "",
                  "| ranks | nodes | batch/rank | global batch | samples/s [min–max] "
                  "| per rank | "
                  "efficiency | step | data | fwd | bwd | comm | exposed | opt | other |",
                  "| ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | "
                  "---: | ---: | ---: | ---: |"]
        for r in mine:
            parts = ["step_ms"] + [f"{n}_ms" for _, n in PARTS]
            ms = " | ".join(f"{r[c]:.2f}" if r[c] >= 1 else f"{r[c]:.3f}" for c in parts)
            rate = (f"{r['samples_per_s']:.0f} [{r['samples_per_s_min']:.0f}–"
                    f"{r['samples_per_s_max']:.0f}]")
            lines.append(f"| {r['ranks']} | {r['nodes']} | {r['batch_per_rank']} | "
                         f"{r['global_batch']} | {rate} | "
                         f"{r['samples_per_s_per_rank']:.0f} | {r['efficiency']:.2f} | {ms} |")
        lines += ["", f"Repeats per row: {', '.join(str(r['repeats']) for r in mine)}; measured: "
                  f"{mine[0]['measured']}.", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def plot(rows, out, cores_shared=0):
    """throughput.png and efficiency.png; cores_shared > 0 (runs on one machine of that many
    cores) also shades the oversubscribed rank counts and draws the ceiling that time-slicing
    allows: N ranks on C < N cores do the work of C."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    modes = [m for m in ["weak", "strong"] if any(r["mode"] == m for r in rows)]
    labels = {"weak": "weak (batch per rank fixed)", "strong": "strong (global batch fixed)"}
    colors = {"weak": "tab:blue", "strong": "tab:orange"}
    ticks = sorted({r["ranks"] for r in rows})
    oversubscribed = cores_shared and ticks[-1] > cores_shared

    def ceiling(k, n0):  # the best efficiency time-slicing allows, relative to n0 ranks
        return (min(k, cores_shared) / k) / (min(n0, cores_shared) / n0)

    def axis(ax):
        if oversubscribed:
            # More ranks than cores: time-slicing, not scaling, on the right of this line.
            ax.axvspan(cores_shared, ticks[-1] * 1.25, color="red", alpha=0.07,
                       label=f"oversubscribed (> {cores_shared} cores)")
        ax.set_xscale("log", base=2)
        ax.set_xlim(ticks[0] / 1.25, ticks[-1] * 1.25)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_xlabel("ranks")
        ax.grid(True, alpha=0.3)

    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 4.2), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        mine = [r for r in rows if r["mode"] == mode]
        n = [r["ranks"] for r in mine]
        y = [r["samples_per_s"] for r in mine]
        err = [[r["samples_per_s"] - r["samples_per_s_min"] for r in mine],
               [r["samples_per_s_max"] - r["samples_per_s"] for r in mine]]
        ax.errorbar(n, y, yerr=err, marker="o", capsize=4, color=colors[mode],
                    label="measured (median, min–max)")
        dense = [n[0] * (n[-1] / n[0]) ** (i / 50) for i in range(51)]
        ax.plot(dense, [k / n[0] * y[0] for k in dense], "--", color="gray",
                label=f"ideal (linear from {n[0]} rank(s))")
        if oversubscribed:
            ax.plot(dense, [k / n[0] * y[0] * ceiling(k, n[0]) for k in dense], ":", color="red",
                    label=f"ceiling on {cores_shared} cores")
        axis(ax)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("samples/s")
        ax.set_title(labels[mode])
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "throughput.png"), dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for mode in modes:
        mine = [r for r in rows if r["mode"] == mode]
        ax.plot([r["ranks"] for r in mine], [r["efficiency"] for r in mine], marker="o",
                color=colors[mode], label=labels[mode])
    ax.axhline(1.0, linestyle="--", color="gray", label="ideal")
    if oversubscribed:
        dense = [ticks[0] * (ticks[-1] / ticks[0]) ** (i / 50) for i in range(51)]
        ax.plot(dense, [ceiling(k, ticks[0]) for k in dense], ":", color="red",
                label=f"ceiling on {cores_shared} cores")
    axis(ax)
    ax.set_ylim(0, max(1.1, max(r["efficiency"] for r in rows) * 1.1))
    ax.set_ylabel("efficiency vs the smallest rank count")
    ax.set_title("Scaling efficiency")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "efficiency.png"), dpi=110)
    plt.close(fig)


def main(argv):
    try:
        args = parse_args(argv)
        check_args(args)
        if importlib.util.find_spec("matplotlib") is None:  # before hours of runs, not after
            raise UserError(f"matplotlib is missing for {sys.executable} (hint: apt-get install "
                            "python3-matplotlib, or pip install matplotlib)")
        example, run_dirs = (None, []) if args.collect_only else run_all(args)
        rows = collect(args, run_dirs)
        os.makedirs(args.out, exist_ok=True)
        write_csv(rows, os.path.join(args.out, "scaling.csv"))
        write_markdown(rows, args, example, os.path.join(args.out, "scaling.md"))
        local = not args.collect_only and args.launcher == "mpirun"
        plot(rows, args.out, args.cores or (cores() if local else 0))
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except RunError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    outputs = ["scaling.csv", "scaling.md", "throughput.png", "efficiency.png"]
    print(f"{PROG}: wrote {', '.join(os.path.join(args.out, f) for f in outputs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
