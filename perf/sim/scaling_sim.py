#!/usr/bin/python3
"""Weak-scaling projection of mptrain's all-reduce and training step under SimGrid SMPI.

Runs perf/sim/allreduce_sim (the algorithms of src/comm built with smpicxx) under smpirun on the
platforms of perf/sim/platforms/, sweeping node counts, gradient sizes, algorithms and wire
dtypes, and writes OUT/sim.csv, OUT/sim.md (the tables of docs/scaling.md) and OUT/sim-*.png.

  perf/sim/scaling_sim.py                         # 8-512 GPUs, 3 platforms (~1 h on a loaded 2-core VM)
  perf/sim/scaling_sim.py --quick                 # 8, 64, 512 GPUs
  perf/sim/scaling_sim.py --validate-models       # flat all-reduce vs the alpha-beta models
  perf/sim/scaling_sim.py --validate-here DIR     # vs `mptrain bench allreduce --json DIR/n<N>.json`
  perf/sim/scaling_sim.py --extrapolate           # the alpha-beta step model to 8,192 GPUs
  perf/sim/scaling_sim.py --check-scaling         # payload scaling: S = 1 against S > 1
Every command line of docs/scaling.md's figures is listed there. A 1,024-GPU point takes minutes,
4,096 more than this machine had (docs/scaling.md).

Payload scaling. SMPI's collectives hold a temporary buffer per rank, so thousands of ranks x
100 MB do not fit in memory, and every byte costs the simulator a page fault. The simulated time
of a message is lat + bytes / bw with the flow model used here (SMPI network model with bw and
lat factors 1), so dividing every payload and every bandwidth by the same factor S leaves every
time unchanged: the driver runs COUNT / S elements on a copy of the platform with bw / S.
The collective algorithms are fixed (not chosen by message size), so S changes no algorithm;
--check-scaling runs the same point at S = 1 and S > 1 to show it.
"""
import argparse
import csv
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

# Gradient sizes (parameters).
MODELS = {"resnet50": 25.6e6, "gpt2-small": 124e6, "bert-large": 340e6, "resnet101": 44.5e6,
          "vgg16": 138e6}

# Platforms: GPUs per node, the GPU, and the compute seconds per step of each model on it
# (forward + backward on one GPU, what a measurement on the real device would pass in). Sources
# and arithmetic in docs/scaling.md ("Step model"): ResNet at MLPerf-class images/s per GPU,
# transformers as 6 x params x tokens flops at an achieved rate.
PLATFORMS = {
    "ndr8": {"gpus": 8, "gpu": "H100",
             "compute": {"resnet50": 0.085, "gpt2-small": 0.041, "bert-large": 0.11,
                         "resnet101": 0.15, "vgg16": 0.20}},
    "slingshot4": {"gpus": 4, "gpu": "A100",
                   "compute": {"resnet50": 0.10, "gpt2-small": 0.10, "bert-large": 0.27,
                               "resnet101": 0.18, "vgg16": 0.30}},
    "eth25": {"gpus": 4, "gpu": "P100",
              "compute": {"resnet50": 0.29, "gpt2-small": 1.5, "bert-large": 4.1,
                          "resnet101": 0.46, "vgg16": 0.64}},
}

# The collective algorithms SMPI runs for the MPI calls of src/comm (documented in
# docs/scaling.md): flat-mpi's MPI_Allreduce and the rails' = Rabenseifner (reduce-scatter by
# recursive halving, all-gather by recursive doubling); hierarchical's intra-node
# MPI_Reduce_scatter(_block) and MPI_Allgather(v) = rings.
COLLECTIVES = ["smpi/allreduce:rab_rdb", "smpi/reduce_scatter:ompi_ring",
               "smpi/allgather:ring", "smpi/allgatherv:ring"]
# Every message rendezvous (no eager threshold), so that a message's protocol does not depend
# on its size, which payload scaling changes.
SIM_CFG = ["smpi/simulate-computation:no", "smpi/bw-factor:0:1", "smpi/lat-factor:0:1",
           "network/crosstraffic:0", "network/weight-S:0", "contexts/stack-size:256", "smpi/send-is-detached-thresh:0",
           "smpi/async-small-thresh:0"]

WIRE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
BW_RE = re.compile(r'((?:loopback_)?bw)="([0-9.]+)GBps"')


def platform_params(name):
    """(node bw GB/s, per-link lat s, loopback bw GB/s, loopback lat s) from the XML."""
    text = open(os.path.join(HERE, "platforms", name + ".xml")).read()
    attrs = dict(re.findall(r'\b(bw|lat|loopback_bw|loopback_lat)="([0-9.]+)(?:GBps|us)"', text))
    return (float(attrs["bw"]), float(attrs["lat"]) * 1e-6, float(attrs["loopback_bw"]),
            float(attrs["loopback_lat"]) * 1e-6)


def scaled_platform(name, scale, workdir):
    """A copy of platforms/NAME.xml with every bandwidth divided by SCALE."""
    src = os.path.join(HERE, "platforms", name + ".xml")
    if scale == 1:
        return src
    dst = os.path.join(workdir, f"{name}_s{scale}.xml")
    if not os.path.exists(dst):
        text = open(src).read()
        text = BW_RE.sub(lambda m: f'{m.group(1)}="{float(m.group(2)) / scale:.9g}GBps"', text)
        open(dst, "w").write(text)
    return dst


def hostfile(nodes, gpus, workdir):
    path = os.path.join(workdir, f"hosts_{nodes}x{gpus}")
    if not os.path.exists(path):
        with open(path, "w") as f:
            for node in range(nodes):
                f.write(f"node-{node}\n" * gpus)
    return path


def run_sim(binary, platform_xml, hosts, ranks, args, timeout, extra_cfg=()):
    cmd = ["smpirun", "-no-privatize", "-np", str(ranks), "-platform", platform_xml,
           "-hostfile", hosts, "--log=root.thres:warning", "--log=smpi_colls.thres:error"]
    for cfg in SIM_CFG + COLLECTIVES + list(extra_cfg):
        cmd.append("--cfg=" + cfg)
    cmd += [binary] + args
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    wall = time.time() - start
    lines = [l for l in proc.stdout.splitlines() if l.startswith("mode=")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"smpirun failed ({proc.returncode}): {' '.join(cmd)}\n"
                           f"{proc.stderr[-2000:]}")
    result = dict(kv.split("=", 1) for kv in lines[-1].split())
    result["wall_s"] = f"{wall:.1f}"
    return result


def payload_scale(ranks, wire_bytes, max_scale):
    """The payload divisor S: the largest power of two (at most MAX_SCALE) that leaves every
    rank at least 4 elements of the smallest bucket (1 MB), so that no collective sees fewer
    elements than ranks (SMPI's algorithms change shape there)."""
    first_bucket = 1e6 / wire_bytes
    scale = 1
    while scale * 2 <= max_scale and first_bucket / (scale * 2) >= 4 * ranks:
        scale *= 2
    return scale


# ---- analytic alpha-beta models (docs/scaling.md, "Validation") --------------------------------

def ring_model(n_bytes, p, alpha, beta):
    """Ring all-reduce: 2(p-1) steps of n/p bytes each."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n_bytes * beta if p > 1 else 0.0


def rabenseifner_model(n_bytes, p, alpha, beta):
    """Rabenseifner (p a power of two): reduce-scatter by recursive halving + all-gather by
    recursive doubling: 2 log2 p steps, the same 2(p-1)/p n bytes as the ring."""
    return 2 * math.log2(p) * alpha + 2 * (p - 1) / p * n_bytes * beta if p > 1 else 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", default="/tmp/build-sim", help="perf/sim build directory")
    parser.add_argument("--out", default=os.path.join(ROOT, "runs", "sim"),
                        help="output folder (default runs/sim, which git ignores)")
    parser.add_argument("--platforms", default="ndr8,slingshot4,eth25")
    parser.add_argument("--models", default="resnet50,gpt2-small")
    parser.add_argument("--algos", default="flat-mpi,hierarchical")
    parser.add_argument("--wires", default="fp16")
    parser.add_argument("--gpus", default="8,32,128,512",
                        help="total GPU counts (node counts = GPUs / GPUs per node)")
    parser.add_argument("--max-scale", type=int, default=4096,
                        help="payload scaling: the largest divisor S (1: no scaling)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per smpirun")
    parser.add_argument("--max-run-s", type=float, default=400,
                        help="stop a series after a run that took longer than this")
    parser.add_argument("--quick", action="store_true", help="8, 64, 512 GPUs only")
    parser.add_argument("--append", action="store_true",
                        help="keep the rows of an existing OUT/sim.csv and simulate the rest")
    parser.add_argument("--validate-models", action="store_true",
                        help="flat all-reduce vs the ring and Rabenseifner models instead")
    parser.add_argument("--check-scaling", action="store_true",
                        help="one point at S = 1 and at the default S, side by side")
    parser.add_argument("--allreduce-alg", default="rab_rdb",
                        help="SMPI's MPI_Allreduce algorithm (flat-mpi's, and the rails' of "
                             "hierarchical): rab_rdb (Rabenseifner) or lr (ring); an algo other "
                             "than rab_rdb is recorded as ALGO/ALG")
    parser.add_argument("--extrapolate", action="store_true",
                        help="alpha-beta model of the step (no simulation) to 8,192 GPUs")
    parser.add_argument("--plots-only", action="store_true", help="redraw from OUT/sim.csv")
    parser.add_argument("--validate-here", metavar="DIR",
                        help="simulate platforms/thismachine.xml at the rank counts and sizes of "
                             "the `mptrain bench allreduce --json` files DIR/n<ranks>.json and "
                             "print both side by side")
    args = parser.parse_args()

    for name, known, option in ((args.platforms, PLATFORMS, "--platforms"),
                                (args.models, MODELS, "--models"),
                                (args.wires, WIRE_BYTES, "--wires"),
                                (args.algos, ("flat-mpi", "hierarchical"), "--algos")):
        for item in name.split(","):
            if item not in known:
                print(f"scaling_sim.py: {option}: unknown '{item}' (hint: one of "
                      f"{', '.join(known)})", file=sys.stderr)
                sys.exit(2)
    binary = os.path.join(args.build, "allreduce_sim")
    if not (args.plots_only or args.extrapolate):
        if shutil.which("smpirun") is None:
            sys.exit("scaling_sim.py: smpirun not found (hint: apt-get install simgrid "
                     "libsimgrid-dev, or launch/install-deps.sh)")
        if not os.path.exists(binary):
            sys.exit(f"scaling_sim.py: no {binary} (hint: cmake -S perf/sim -B {args.build} "
                     f"-DCMAKE_CXX_COMPILER=smpicxx && cmake --build {args.build})")
    os.makedirs(args.out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="mpt-sim-")

    if args.validate_models:
        return validate_models(args, binary, workdir)
    if args.validate_here:
        return validate_here(args, binary, workdir)
    if args.extrapolate:
        return extrapolate(args)
    if args.check_scaling:
        return check_scaling(args, binary, workdir)

    csv_path = os.path.join(args.out, "sim.csv")
    fields = ["platform", "gpu", "gpus_per_node", "nodes", "gpus", "model", "params", "wire",
              "algo", "payload_scale", "buckets", "compute_s", "comm_s", "step_s", "exposed_s",
              "efficiency", "busbw_GBps", "model_rab_s", "wall_s"]
    if not args.plots_only:
        rows = []
        if args.append and os.path.exists(csv_path):
            rows = list(csv.DictReader(open(csv_path)))
        gpu_counts = [8, 64, 512] if args.quick else [int(g) for g in args.gpus.split(",")]
        for platform in args.platforms.split(","):
            info = PLATFORMS[platform]
            bw, lat, _, _ = platform_params(platform)
            for model in args.models.split(","):
                params = MODELS[model]
                for wire in args.wires.split(","):
                    for algo in args.algos.split(","):
                        for gpus in gpu_counts:
                            if gpus % info["gpus"]:
                                continue
                            nodes = gpus // info["gpus"]
                            if nodes > 1024:
                                break
                            done = {(r["platform"], r["model"], r["wire"], r["algo"],
                                     int(r["gpus"])) for r in rows}
                            label = (algo if args.allreduce_alg == "rab_rdb"
                                     else f"{algo}/{args.allreduce_alg}")
                            if (platform, model, wire, label, gpus) in done:
                                continue  # --append: simulated already
                            count = int(params)
                            scale = payload_scale(gpus, WIRE_BYTES[wire], args.max_scale)
                            compute = info["compute"][model]
                            xml = scaled_platform(platform, scale, workdir)
                            hosts = hostfile(nodes, info["gpus"], workdir)
                            print(f"== {platform} {model} {wire} {algo} {gpus} GPUs "
                                  f"({nodes} nodes), payload / {scale}", file=sys.stderr,
                                  flush=True)
                            r = run_sim(binary, xml, hosts, gpus,
                                        ["step", "--algo", algo, "--wire", wire,
                                         "--ranks-per-node", str(info["gpus"]),
                                         "--count", str(count // scale),
                                         "--bucket-mb", str(25 / scale),
                                         "--first-bucket-mb", str(1 / scale),
                                         "--align", str(gpus),
                                         "--compute-s", str(compute), "--iters", "1"],
                                        args.timeout,
                                        extra_cfg=[f"smpi/allreduce:{args.allreduce_alg}"])
                            n_bytes = count * WIRE_BYTES[wire]
                            comm = float(r["comm_s"])
                            busbw = n_bytes / comm * 2 * (gpus - 1) / gpus / 1e9 if comm else 0
                            # Flat Rabenseifner on per-rank bandwidth bw / G across nodes.
                            model_rab = rabenseifner_model(n_bytes, gpus, 4 * lat,
                                                           info["gpus"] / (bw * 1e9))
                            rows.append({
                                "platform": platform, "gpu": info["gpu"],
                                "gpus_per_node": info["gpus"], "nodes": nodes, "gpus": gpus,
                                "model": model, "params": int(params), "wire": wire,
                                "algo": algo if args.allreduce_alg == "rab_rdb"
                                        else f"{algo}/{args.allreduce_alg}",
                                "payload_scale": scale, "buckets": r["buckets"],
                                "compute_s": compute, "comm_s": r["comm_s"],
                                "step_s": r["step_s"], "exposed_s": r["exposed_s"],
                                "efficiency": r["efficiency"], "busbw_GBps": f"{busbw:.4g}",
                                "model_rab_s": f"{model_rab:.6g}", "wall_s": r["wall_s"]})
                            print(f"   step {float(r['step_s']) * 1e3:.2f} ms, efficiency "
                                  f"{float(r['efficiency']):.3f}, comm {comm * 1e3:.2f} ms, "
                                  f"wall {r['wall_s']} s", file=sys.stderr, flush=True)
                            with open(csv_path, "w", newline="") as f:
                                w = csv.DictWriter(f, fieldnames=fields)
                                w.writeheader()
                                w.writerows(rows)
                            if float(r["wall_s"]) > args.max_run_s:
                                print(f"   (stopping this series: the run took {r['wall_s']} s "
                                      f"> --max-run-s)", file=sys.stderr)
                                break
    rows = list(csv.DictReader(open(csv_path)))
    write_table(rows, os.path.join(args.out, "sim.md"))
    plot(rows, args.out)
    shutil.rmtree(workdir, ignore_errors=True)
    print(f"wrote {csv_path}, {args.out}/sim.md and {args.out}/sim-*.png", file=sys.stderr)


def write_table(rows, path):
    """Step time, efficiency (compute / step) and busbw per platform, model and GPU count, one
    column group per algorithm (flat first), and hierarchical / flat step time."""
    out = []
    key = lambda r: (r["platform"], r["model"], r["wire"])
    order = lambda a: (not a.startswith("flat"), a)
    for group in sorted({key(r) for r in rows}):
        platform, model, wire = group
        sel = [r for r in rows if key(r) == group]
        algos = sorted({r["algo"] for r in sel}, key=order)
        out.append(f"\n**{platform}** ({sel[0]['gpus_per_node']} x {sel[0]['gpu']} per node), "
                   f"{model} ({float(sel[0]['params']) / 1e6:.1f} M params, {wire} wire), "
                   f"compute {float(sel[0]['compute_s']) * 1e3:.0f} ms/step\n")
        head = "| GPUs | nodes |"
        for a in algos:
            head += f" {a} step ms | eff. | busbw GB/s |"
        pair = "flat-mpi" in algos and "hierarchical" in algos
        out.append(head + (" hier. / flat step |" if pair else ""))
        out.append("|---" * (2 + 3 * len(algos) + pair) + "|")
        for gpus in sorted({int(r["gpus"]) for r in sel}):
            by = {r["algo"]: r for r in sel if int(r["gpus"]) == gpus}
            line = f"| {gpus} | {next(iter(by.values()))['nodes']} |"
            for a in algos:
                r = by.get(a)
                line += (f" {float(r['step_s']) * 1e3:.1f} | {float(r['efficiency']) * 100:.1f} % | "
                         f"{float(r['busbw_GBps']):.1f} |" if r else " - | - | - |")
            if pair:
                f, h = by.get("flat-mpi"), by.get("hierarchical")
                line += f" {float(h['step_s']) / float(f['step_s']):.3f} |" if f and h else " - |"
            out.append(line)
    open(path, "w").write("\n".join(out).lstrip() + "\n")


def plot(rows, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("scaling_sim.py: no matplotlib in this python, no plots (hint: apt-get install "
              "python3-matplotlib and run with /usr/bin/python3)", file=sys.stderr)
        return
    key = lambda r: (r["model"], r["wire"])
    for model, wire in sorted({key(r) for r in rows}):
        sel = [r for r in rows if key(r) == (model, wire)]
        platforms = sorted({r["platform"] for r in sel})
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for i, platform in enumerate(platforms):
            styles = {"flat-mpi": "--", "hierarchical": "-", "flat-mpi/lr": ":",
                      "hierarchical/lr": "-."}
            for algo in sorted({r["algo"] for r in sel}, key=lambda a: (a not in styles, a)):
                style = styles.get(algo, ":")
                pts = sorted((int(r["gpus"]), float(r["efficiency"]), float(r["busbw_GBps"]))
                             for r in sel if r["platform"] == platform and r["algo"] == algo)
                if not pts:
                    continue
                color = f"C{i}"
                axes[0].plot([p[0] for p in pts], [100 * p[1] for p in pts], style, marker="o",
                             color=color, label=f"{platform} {algo}")
                axes[1].plot([p[0] for p in pts], [p[2] for p in pts], style, marker="o",
                             color=color, label=f"{platform} {algo}")
        axes[0].axhline(100, color="k", lw=0.8, label="ideal")
        axes[0].axhline(90, color="grey", lw=0.6, ls=":")
        axes[0].set_ylabel("weak-scaling efficiency (compute / step), %")
        axes[1].set_ylabel("all-reduce busbw of the whole gradient, GB/s")
        axes[1].set_yscale("log")
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("GPUs")
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"SimGrid SMPI projection: {model} gradients ({wire} wire), "
                     "bucketed all-reduce overlapping backward")
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"sim-{model}-{wire}.png"), dpi=110)
        plt.close(fig)


def validate_models(args, binary, workdir):
    """Flat all-reduce (one rank per node) on ndr8 vs the alpha-beta models: Rabenseifner as
    configured, and SMPI's ring (lr) against the ring model where the ring still runs fast."""
    platform = "ndr8"
    bw, lat, _, _ = platform_params(platform)
    alpha, beta = 4 * lat, 1 / (bw * 1e9)  # one rank per node: the whole NIC bandwidth
    n_bytes = int(124e6) * 2
    rows = []
    for algo_cfg, model, ps in (("rab_rdb", rabenseifner_model, [2, 8, 64, 256]),
                                ("lr", ring_model, [2, 8, 64])):
        for p in ps:
            count = n_bytes // 2
            scale = payload_scale(p, 2, args.max_scale)
            xml = scaled_platform(platform, scale, workdir)
            hosts = hostfile(p, 1, workdir)
            r = run_sim(binary, xml, hosts, p,
                        ["bench", "--algo", "flat-mpi", "--wire", "fp16", "--ranks-per-node", "1",
                         "--count", str(count // scale), "--iters", "1"], args.timeout,
                        extra_cfg=[f"smpi/allreduce:{algo_cfg}"])
            sim = float(r["time_s"])
            predicted = model(n_bytes, p, alpha, beta)
            rows.append((algo_cfg, p, sim, predicted, r["wall_s"]))
            print(f"| {algo_cfg} | {p} | {sim * 1e3:.3f} | {predicted * 1e3:.3f} | "
                  f"{sim / predicted:.3f} | {r['wall_s']} |", flush=True)
    with open(os.path.join(args.out, "validate_models.md"), "w") as f:
        f.write("| SMPI allreduce | nodes | simulated ms | model ms | sim / model | wall s |\n")
        f.write("|---|---|---|---|---|---|\n")
        for algo_cfg, p, sim, predicted, wall in rows:
            f.write(f"| {algo_cfg} | {p} | {sim * 1e3:.3f} | {predicted * 1e3:.3f} | "
                    f"{sim / predicted:.3f} | {wall} |\n")


def validate_here(args, binary, workdir):
    """Measured (`mptrain bench allreduce`, fp32, nodes of 2 ranks emulated with -K 2) against
    simulated on platforms/thismachine.xml, sizes >= 1 MiB. Open MPI's own algorithm choice is
    mimicked with SMPI's ompi selector (not the fixed collectives of the sweep)."""
    import json
    xml = os.path.join(HERE, "platforms", "thismachine.xml")
    names = {"flat-mpi": "flat-mpi", "hierarchical-mpi": "hierarchical"}
    lines = ["| ranks | emulated nodes | algo | size | measured ms | simulated ms | sim / measured |",
             "|---|---|---|---|---|---|---|"]
    for ranks in (2, 4, 8):
        path = os.path.join(args.validate_here, f"n{ranks}.json")
        if not os.path.exists(path):
            continue
        run = json.load(open(path))
        hosts = os.path.join(workdir, f"vm{ranks}")
        open(hosts, "w").write("vm\n" * ranks)
        for row in run["rows"]:
            if row["size"] < (1 << 20) or row["algo"] not in names:
                continue
            cmd = ["smpirun", "-no-privatize", "-np", str(ranks), "-platform", xml,
                   "-hostfile", hosts, "--log=root.thres:warning",
                   "--log=smpi_colls.thres:error", "--cfg=smpi/coll-selector:ompi"]
            cmd += ["--cfg=" + c for c in SIM_CFG]
            cmd += [binary, "bench", "--algo", names[row["algo"]], "--wire", "fp32",
                    "--ranks-per-node", "2", "--count", str(row["size"] // 4), "--iters", "1"]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            result = dict(kv.split("=", 1) for kv in out.stdout.split("\n")[-2].split())
            sim_ms, meas_ms = float(result["time_s"]) * 1e3, row["time_us"] / 1e3
            lines.append(f"| {ranks} | {run['nodes']} | {row['algo']} | {row['size'] >> 20} MiB | "
                         f"{meas_ms:.1f} | {sim_ms:.1f} | {sim_ms / meas_ms:.2f} |")
            print(lines[-1], flush=True)
    open(os.path.join(args.out, "validate_here.md"), "w").write("\n".join(lines) + "\n")


def model_allreduce(kind, n, nodes, gpus, plat):
    """Alpha-beta time of one all-reduce of N bytes on NODES x GPUS ranks of platform PLAT
    (block placement; intra-node steps at the loopback's rate, inter-node steps sharing the
    node's link among the node's concurrent flows)."""
    bw, lat, lbw, llat = plat
    a, b_node, b_in = 4 * lat, 1 / (bw * 1e9), 1 / (lbw * 1e9)
    g, p = gpus, nodes * gpus
    intra_rs = (g - 1) * llat + (g - 1) / g * n * b_in  # a ring inside the node, one direction
    if kind == "flat-ring":  # every hop is a link: the node's hop carries one flow, whole NIC
        return 2 * (p - 1) * (a if nodes > 1 else llat) + 2 * (p - 1) / p * n * max(
            b_node if nodes > 1 else 0, b_in)
    if kind == "flat-rab":  # log2 g steps inside the node (n/2 ... n/g), then across
        inter = (2 * math.log2(nodes) * a + 2 * (nodes - 1) / nodes * n * b_node
                 if nodes > 1 else 0)
        return 2 * math.log2(g) * llat + 2 * (g - 1) / g * n * b_in + inter
    # hierarchical: ring reduce-scatter and all-gather inside, a rail all-reduce of n/g across
    # (g rails share the node's link: n/g at b/g each = n * b_node per rail)
    rail = kind.split("-")[1]
    steps = 2 * (nodes - 1) if rail == "ring" else 2 * math.log2(nodes)
    inter = steps * a + 2 * (nodes - 1) / nodes * n * b_node if nodes > 1 else 0
    return 2 * intra_rs + inter


def model_step(kind, params, wire, nodes, platform, compute):
    """The step of allreduce_sim step, by the max-plus recurrence of the bucket pipeline."""
    info, plat = PLATFORMS[platform], platform_params(platform)
    total = params * WIRE_BYTES[wire]
    sizes, left = [min(1e6, total)], total - min(1e6, total)
    while left > 0:
        sizes.append(min(25e6, left))
        left -= sizes[-1]
    forward, backward = compute / 3, compute * 2 / 3
    done, ready = 0.0, forward
    for size in sizes:
        ready += backward * size / total
        done = max(done, ready) + model_allreduce(kind, size, nodes, info["gpus"], plat)
    return max(done, compute)


def extrapolate(args):
    """Model efficiency from 8 to 8,192 GPUs (the simulation stops at 512-1,024 here)."""
    kinds = ["flat-rab", "hier-rab", "flat-ring", "hier-ring"]
    gpu_counts = [8, 32, 128, 512, 1024, 2048, 4096, 8192]
    lines = ["| platform | model | algorithm | " + " | ".join(f"{g}" for g in gpu_counts) +
             " | first < 90 % |", "|---" * (4 + len(gpu_counts)) + "|"]
    for platform in args.platforms.split(","):
        info = PLATFORMS[platform]
        for model in args.models.split(","):
            compute = info["compute"][model]
            for kind in kinds:
                effs, below = [], "-"
                for g in gpu_counts:
                    nodes = max(1, g // info["gpus"])
                    e = compute / model_step(kind, MODELS[model], args.wires.split(",")[0],
                                             nodes, platform, compute)
                    effs.append(f"{100 * e:.1f}")
                g = info["gpus"]
                while below == "-" and g <= 1 << 20:
                    e = compute / model_step(kind, MODELS[model], args.wires.split(",")[0],
                                             g // info["gpus"], platform, compute)
                    if e < 0.9:
                        below = str(g)
                    g *= 2
                lines.append(f"| {platform} | {model} | {kind} | " + " | ".join(effs) +
                             f" | {below} |")
    text = "\n".join(lines) + "\n"
    open(os.path.join(args.out, "extrapolate.md"), "w").write(text)
    print(text)


def check_scaling(args, binary, workdir):
    """The payload-scaling argument, tested: one step at S = 1 and at the sweep's S."""
    platform, gpus, model = "ndr8", 32, "resnet50"
    info = PLATFORMS[platform]
    count = int(MODELS[model])
    big = payload_scale(gpus, 2, args.max_scale)
    print("| S | algo | comm ms | step ms | wall s |\n|---|---|---|---|---|")
    for scale in (1, big):
        for algo in ("flat-mpi", "hierarchical"):
            r = run_sim(binary, scaled_platform(platform, scale, workdir),
                        hostfile(gpus // 8, 8, workdir), gpus,
                        ["step", "--algo", algo, "--wire", "fp16", "--ranks-per-node", "8",
                         "--count", str(count // scale), "--bucket-mb", str(25 / scale),
                         "--first-bucket-mb", str(1 / scale),
                         "--align", str(gpus * big // scale),
                         "--compute-s", str(info["compute"][model]), "--iters", "1"],
                        args.timeout)
            print(f"| {scale} | {algo} | {float(r['comm_s']) * 1e3:.4f} | "
                  f"{float(r['step_s']) * 1e3:.4f} | {r['wall_s']} |", flush=True)


if __name__ == "__main__":
    main()
