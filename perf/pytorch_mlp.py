#!/usr/bin/python3
"""PyTorch peer for perf/compare_pytorch.sh: trains the same MLP as mptrain on the same HDF5 file.

Model 784-1024-1024-10 (ReLU, nn.Linear default init), SGD with momentum, mean cross-entropy.
Runs on one process, or data-parallel (DDP, gloo) when launched under mpirun or torchrun.
Prints one JSON line on rank 0; samples_per_s counts the samples of all ranks together.
Run it with Debian's /usr/bin/python3, which has torch and h5py.
"""

import argparse
import json
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default="data/fashion-mnist/train.h5",
                   help="HDF5 file: /samples (N,C,H,W) uint8, /labels (N,), attrs mean, std")
    p.add_argument("--batch-size", type=int, default=128, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=300, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before the timed ones")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, nargs="+", default=[1024, 1024],
                   help="hidden layer widths")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--port", type=int, default=None,
                   help="MASTER_PORT for DDP (default: $MASTER_PORT or 29500)")
    return p.parse_args()


def world_from_env():
    """(rank, size) from Open MPI's or torchrun's environment; (0, 1) when run alone."""
    for rank_var, size_var in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMI_RANK", "PMI_SIZE"),
                               ("RANK", "WORLD_SIZE")):
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def load_data(path, rank, size):
    """Reads the whole file once and normalises it: x = (u8 / 255 - mean) / std, flattened."""
    import h5py
    import numpy as np
    import torch

    with h5py.File(path, "r") as f:
        samples = f["samples"][...]
        labels = f["labels"][...]
        mean = np.asarray(f.attrs["mean"], dtype=np.float32).reshape(-1)
        std = np.asarray(f.attrs["std"], dtype=np.float32).reshape(-1)
        classes = int(f.attrs["num_classes"]) if "num_classes" in f.attrs else None
    if samples.dtype != np.uint8:
        sys.exit(f"pytorch_mlp: {path}: /samples must be uint8, found {samples.dtype}")
    n = samples.shape[0]
    channels = samples.shape[1] if samples.ndim == 4 else 1
    x = samples.astype(np.float32).reshape(n, channels, -1) / 255.0
    if mean.size == channels and channels > 1:
        x = (x - mean[None, :, None]) / std[None, :, None]
    else:
        x = (x - mean[0]) / std[0]
    x = torch.from_numpy(x.reshape(n, -1).copy())
    y = torch.from_numpy(labels.astype(np.int64))
    # Each rank trains on its own contiguous shard, like mptrain's ShardPlan.
    per_rank = n // size
    shard = slice(rank * per_rank, (rank + 1) * per_rank)
    if classes is None:
        classes = int(labels.max()) + 1
    return x[shard].contiguous(), y[shard].contiguous(), classes


def main():
    args = parse_args()
    rank, size = world_from_env()

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(args.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # already set; harmless
    torch.manual_seed(args.seed)

    if size > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if args.port is not None:
            os.environ["MASTER_PORT"] = str(args.port)
        os.environ.setdefault("MASTER_PORT", "29500")
        dist.init_process_group("gloo", rank=rank, world_size=size)

    x_all, y_all, classes = load_data(args.data, rank, size)
    n, features = x_all.shape
    batch = args.batch_size
    if n < batch:
        sys.exit(f"pytorch_mlp: rank {rank} has {n} samples, fewer than one batch of {batch}")

    widths = [features] + args.hidden
    layers = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
    layers.append(nn.Linear(widths[-1], classes))
    model = nn.Sequential(*layers)
    if size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()

    # One preallocated batch, filled in place every step; a seeded permutation per epoch.
    xb = torch.empty(batch, features)
    yb = torch.empty(batch, dtype=torch.int64)
    generator = torch.Generator().manual_seed(args.seed * 1000003 + rank)
    batches_per_epoch = n // batch
    order = torch.randperm(n, generator=generator)
    cursor = 0

    def train_step():
        nonlocal order, cursor
        if cursor == batches_per_epoch:
            order = torch.randperm(n, generator=generator)
            cursor = 0
        idx = order[cursor * batch:(cursor + 1) * batch]
        cursor += 1
        torch.index_select(x_all, 0, idx, out=xb)
        torch.index_select(y_all, 0, idx, out=yb)
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(args.warmup):
        train_step()
    if size > 1:
        dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = train_step()
    if size > 1:
        dist.barrier()
    wall = time.perf_counter() - start
    if args.steps > 0 and not torch.isfinite(loss.detach()):
        print(f"pytorch_mlp: rank {rank}: the loss is not finite", file=sys.stderr)

    if rank == 0:
        print(json.dumps({
            "framework": "pytorch",
            "ranks": size,
            "batch_per_rank": batch,
            "threads": args.threads,
            "steps": args.steps,
            "samples_per_s": round(size * batch * args.steps / wall, 1) if wall > 0 else 0.0,
            "wall_s": round(wall, 3),
        }), flush=True)
    if size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
