#!/usr/bin/env python3
"""Checks a soak run (issue #11): every rank's resident set and open file descriptors stay flat.

`mptrain train` logs, in every window of metrics.jsonl, each rank's resident set ("rss_mb": VmRSS
of /proc/self/status, MiB) and open file descriptors ("open_fds": entries of /proc/self/fd), in
rank order. This script splits the windows into the phases given (a phase is a step range of
one process: a resumed run is a new process with its own warm-up), and for each phase and rank:

  warm-up   the first quarter of the phase's windows is warm-up: allocators, HDF5's chunk cache
            and free lists, MPI's connections and the page tables of buffers touched late fill
            up there. The baseline is the value of the window at 25 % of the phase.
  RSS       every later window's RSS is at most baseline + RSS_TOLERANCE_MB + RSS_TOLERANCE_FRACTION
            x baseline. The absolute part covers glibc's arenas breathing (a thread's arena
            trims and regrows by up to a few MB between windows; measured: see docs/reliability.md);
            the relative part scales it to bigger models. A leak of one 4 KiB page per step is
            12 MB over 3,000 steps and 80 MB over 20,000: well past it.
  fds       in a phase of synchronous checkpoints, every later window has exactly the baseline's
            descriptors (nothing is open between steps but the data files, the logs and MPI's
            own). With --checkpoint.async a write may be in flight while the window is logged,
            holding its .tmp file (and the directory, for its fsync) open: up to FD_IN_FLIGHT
            more are allowed, but the lowest count of the last quarter must equal the lowest of
            the second quarter, so a descriptor left behind by each write still shows.

Prints a Markdown table (one row per phase and rank) and exits 1 when a check fails, naming it.

usage: soak_check.py METRICS_JSONL --phase NAME:FIRST_STEP:LAST_STEP[:async] [--phase ...]
"""

import argparse
import json
import sys

RSS_TOLERANCE_MB = 2.0
RSS_TOLERANCE_FRACTION = 0.01
FD_IN_FLIGHT = 2


def parse_phase(text):
    parts = text.split(":")
    if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] != "async"):
        raise argparse.ArgumentTypeError(f"phase '{text}' is not NAME:FIRST:LAST[:async]")
    return {"name": parts[0], "first": int(parts[1]), "last": int(parts[2]),
            "async": len(parts) == 4}


def check_rank(windows, rank, phase):
    """One table row and the list of failures for RANK's series in PHASE's WINDOWS."""
    rss = [w["rss_mb"][rank] for w in windows]
    fds = [w["open_fds"][rank] for w in windows]
    warm = len(windows) // 4
    base_rss, base_fds = rss[warm], fds[warm]
    after_rss, after_fds = rss[warm:], fds[warm:]
    tolerance = RSS_TOLERANCE_MB + RSS_TOLERANCE_FRACTION * base_rss
    growth = max(after_rss) - base_rss
    failures = []
    where = f"{phase['name']} rank {rank}"
    if growth > tolerance:
        peak = warm + after_rss.index(max(after_rss))
        failures.append(f"{where}: RSS grew {growth:.1f} MB after the warm-up (from {base_rss:.1f} "
                        f"at step {windows[warm]['step']} to {max(after_rss):.1f} at step "
                        f"{windows[peak]['step']}), tolerance {tolerance:.1f} MB")
    if phase["async"]:
        quarter = max(1, len(windows) // 4)
        second = min(fds[warm:warm + quarter])
        last = min(fds[-quarter:])
        if last != second or max(after_fds) - min(after_fds) > FD_IN_FLIGHT:
            failures.append(f"{where}: open fds not flat: lowest {second} in the second quarter, "
                            f"{last} in the last, range {min(after_fds)}..{max(after_fds)} after "
                            f"the warm-up (allowed: {FD_IN_FLIGHT} for writes in flight)")
    elif any(f != base_fds for f in after_fds):
        bad = next(i for i in range(warm, len(fds)) if fds[i] != base_fds)
        failures.append(f"{where}: open fds changed from {base_fds} (step {windows[warm]['step']}) "
                        f"to {fds[bad]} at step {windows[bad]['step']}")
    row = (f"| {phase['name']} | {rank} | {len(windows)} | {windows[warm]['step']} | "
           f"{rss[0]:.1f} | {base_rss:.1f} | {max(after_rss):.1f} | {rss[-1]:.1f} | "
           f"{growth:+.1f} | {tolerance:.1f} | {base_fds} | {min(after_fds)}..{max(after_fds)} | "
           f"{'ok' if not failures else 'FAIL'} |")
    return row, failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("metrics")
    parser.add_argument("--phase", type=parse_phase, action="append", required=True)
    args = parser.parse_args()
    records = [json.loads(line) for line in open(args.metrics) if line.strip()]
    windows = [r for r in records if "loss" in r]
    missing = [r["step"] for r in windows if "rss_mb" not in r or "open_fds" not in r]
    if missing:
        sys.exit(f"soak_check: windows without rss_mb/open_fds (steps {missing[:5]}): "
                 "a binary without issue #11's soak instrumentation?")
    print("| phase | rank | windows | warm-up ends (step) | RSS first (MB) | RSS at 25 % | "
          "RSS max after | RSS last | growth | tolerance | fds at 25 % | fds after | verdict |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    failures = []
    for phase in args.phase:
        selected = [w for w in windows if phase["first"] <= w["step"] <= phase["last"]]
        if len(selected) < 8:
            failures.append(f"{phase['name']}: {len(selected)} windows in steps "
                            f"{phase['first']}..{phase['last']}, need at least 8")
            continue
        ranks = len(selected[0]["rss_mb"])
        for w in selected:
            if len(w["rss_mb"]) != ranks or len(w["open_fds"]) != ranks:
                sys.exit(f"soak_check: step {w['step']} has {len(w['rss_mb'])} RSS values, "
                         f"the phase's first window {ranks}")
        for rank in range(ranks):
            row, rank_failures = check_rank(selected, rank, phase)
            print(row)
            failures += rank_failures
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
