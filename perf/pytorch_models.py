#!/usr/bin/python3
"""PyTorch peer for perf/compare_pytorch.sh: trains mptrain's built-in models on the same HDF5 file.

The models match src/nn/spec.cpp layer for layer (shapes, padding, biases, BatchNorm, init):
  mlp          784-1024-1024-10, ReLU
  cnn          conv5x5(32,pad2)-relu-maxpool2-conv5x5(64,pad2)-relu-maxpool2-dense512-relu-dense10
  resnet-mini  conv3x3(16)-bn-relu, resblocks of 16, 32 (stride 2) and 64 (stride 2) channels,
               global average pooling, dense10
SGD with momentum, mean cross-entropy, fp32 or bf16 autocast (torch.autocast('cpu',
dtype=torch.bfloat16) around the forward pass and the loss, in its default configuration).
Runs on one process, or data-parallel (DDP, gloo) when launched under mpirun or torchrun.
Prints one JSON line on rank 0; samples_per_s counts the samples of all ranks together.
Run it with Debian's /usr/bin/python3, which has torch and h5py.
"""

import argparse
import json
import math
import os
import sys
import time

MODELS = ("mlp", "cnn", "resnet-mini")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="mlp", help="built-in model (default mlp)")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="fp32, or bf16 autocast (default fp32)")
    p.add_argument("--data", default="data/fashion-mnist/train.h5",
                   help="HDF5 file: /samples (N,C,H,W) uint8, /labels (N,), attrs mean, std")
    p.add_argument("--batch-size", type=int, default=128, help="samples per rank per step")
    p.add_argument("--steps", type=int, default=300, help="timed steps")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before the timed ones")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, nargs="+", default=[1024, 1024],
                   help="hidden layer widths of the mlp")
    p.add_argument("--set-to-none", action="store_true",
                   help="optimizer.zero_grad(set_to_none=True): free the gradients every step "
                        "(PyTorch 1.13's default is to zero them in place)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--port", type=int, default=None,
                   help="MASTER_PORT for DDP (default: $MASTER_PORT or 29500)")
    args = p.parse_args()
    for name in ("batch_size", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer")
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    return args


def world_from_env():
    """(rank, size) from Open MPI's or torchrun's environment; (0, 1) when run alone."""
    for rank_var, size_var in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                               ("PMI_RANK", "PMI_SIZE"),
                               ("RANK", "WORLD_SIZE")):
        if rank_var in os.environ and size_var in os.environ:
            return int(os.environ[rank_var]), int(os.environ[size_var])
    return 0, 1


def load_data(path, rank, size, flat):
    """Reads the whole file once and normalises it: x = (u8 / 255 - mean) / std.

    FLAT: (N, C*H*W) for the mlp; otherwise (N, C, H, W), as mptrain's spatial layers see it."""
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
        sys.exit(f"pytorch_models: {path}: /samples must be uint8, found {samples.dtype}")
    n = samples.shape[0]
    if samples.ndim == 3:
        samples = samples[:, None]  # (N,H,W): one channel, as mptrain
    if samples.ndim != 4:
        sys.exit(f"pytorch_models: {path}: /samples must be (N,C,H,W) or (N,H,W), "
                 f"found {samples.shape}")
    channels = samples.shape[1]
    x = samples.astype(np.float32).reshape(n, channels, -1) / 255.0
    if mean.size == channels and channels > 1:
        x = (x - mean[None, :, None]) / std[None, :, None]
    else:
        x = (x - mean[0]) / std[0]
    x = x.reshape((n, -1) if flat else samples.shape)
    x = torch.from_numpy(np.ascontiguousarray(x))
    y = torch.from_numpy(labels.astype(np.int64))
    # Each rank trains on its own contiguous shard, like mptrain's ShardPlan.
    per_rank = n // size
    shard = slice(rank * per_rank, (rank + 1) * per_rank)
    if classes is None:
        classes = int(labels.max()) + 1
    return x[shard].contiguous(), y[shard].contiguous(), classes


def build_model(name, in_shape, classes, hidden):
    """mptrain's built-in model NAME (src/nn/spec.cpp) with mptrain's initialisation."""
    import torch.nn as nn

    def conv(c_in, c_out, kernel, stride=1, pad=0):
        # nn::Conv2d: He uniform U(±sqrt(6 / fan_in)) weights, zero bias (bias on, even before BN).
        layer = nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=pad, bias=True)
        nn.init.kaiming_uniform_(layer.weight, nonlinearity="relu")
        nn.init.zeros_(layer.bias)
        return layer

    # nn::Dense uses nn.Linear's own init; nn::BatchNorm is BatchNorm2d's (momentum 0.1, eps 1e-5).
    class ResBlock(nn.Module):
        """nn::ResBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), where the shortcut
        is a 1x1 conv + BN when the channels or the stride change."""

        def __init__(self, c_in, c_out, stride):
            super().__init__()
            self.conv1 = conv(c_in, c_out, 3, stride, 1)
            self.bn1 = nn.BatchNorm2d(c_out)
            self.relu = nn.ReLU()
            self.conv2 = conv(c_out, c_out, 3, 1, 1)
            self.bn2 = nn.BatchNorm2d(c_out)
            self.proj = None
            if c_in != c_out or stride != 1:
                self.proj = nn.Sequential(conv(c_in, c_out, 1, stride, 0), nn.BatchNorm2d(c_out))

        def forward(self, x):
            y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            return self.relu(y + (self.proj(x) if self.proj is not None else x))

    if name == "mlp":
        widths = [math.prod(in_shape)] + hidden
        layers = [nn.Flatten()]
        for fan_in, fan_out in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        return nn.Sequential(*layers, nn.Linear(widths[-1], classes))
    c, h, w = in_shape
    if name == "cnn":
        flat = 64 * (h // 4) * (w // 4)
        return nn.Sequential(
            conv(c, 32, 5, pad=2), nn.ReLU(), nn.MaxPool2d(2),
            conv(32, 64, 5, pad=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(flat, 512), nn.ReLU(), nn.Linear(512, classes))
    return nn.Sequential(
        conv(c, 16, 3, pad=1), nn.BatchNorm2d(16), nn.ReLU(),
        ResBlock(16, 16, 1), ResBlock(16, 32, 2), ResBlock(32, 64, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes))


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

    x_all, y_all, classes = load_data(args.data, rank, size, flat=args.model == "mlp")
    n = x_all.shape[0]
    sample_shape = tuple(x_all.shape[1:])
    batch = args.batch_size
    if n < batch:
        sys.exit(f"pytorch_models: rank {rank} has {n} samples, fewer than one batch of {batch}")

    model = build_model(args.model, sample_shape, classes, args.hidden)
    model.train()
    if size > 1:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()
    bf16 = args.precision == "bf16"

    # One preallocated batch, filled in place every step; a seeded permutation per epoch.
    xb = torch.empty((batch,) + sample_shape)
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
        if args.set_to_none:
            optimizer.zero_grad(set_to_none=True)
        else:
            optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
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
    if not torch.isfinite(loss.detach().float()):
        print(f"pytorch_models: rank {rank}: the loss is not finite", file=sys.stderr)

    if rank == 0:
        print(json.dumps({
            "framework": "pytorch",
            "torch": torch.__version__,
            "model": args.model,
            "precision": args.precision,
            "ranks": size,
            "batch_per_rank": batch,
            "threads": args.threads,
            "steps": args.steps,
            "params": sum(p.numel() for p in model.parameters()),
            "final_loss": round(float(loss.detach()), 4),
            "samples_per_s": round(size * batch * args.steps / wall, 1) if wall > 0 else 0.0,
            "wall_s": round(wall, 3),
        }), flush=True)
    if size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
