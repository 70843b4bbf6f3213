#!/usr/bin/env python3
"""PyTorch peer for perf/gpu_check.sh: trains mptrain's built-in models on one GPU.

The models match mptrain's layer for layer (src/nn/model.cpp):
  mlp: 784-1024-1024-10 with ReLU;
  cnn: conv5x5(32, pad 2)-relu-maxpool2-conv5x5(64, pad 2)-relu-maxpool2-dense512-relu-dense10.
Data are synthetic, already on the device (so this measures the training step, not a loader),
the optimizer is SGD with momentum, the loss mean cross-entropy. Precision fp32 is true fp32, as
mptrain's is (CUBLAS_COMPUTE_32F, CUDNN_FMA_MATH): TF32 is turned off for matmul and for cuDNN,
whose default would otherwise run fp32 convolutions on tensor cores; fp16 is autocast +
GradScaler, bf16 autocast alone (PyTorch's documented AMP recipes).
Prints one line per run, easy to grep:
  pytorch model=mlp precision=fp16 batch=256 steps=200 samples_per_s=123456.7
"""

import argparse
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--precision", choices=["fp32", "fp16", "bf16"], default="fp16")
    p.add_argument("--batch", type=int, default=256, help="samples per step")
    p.add_argument("--steps", type=int, default=200, help="timed steps")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps before the timed ones")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args()


def build(name, classes):
    import torch.nn as nn

    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(),
                             nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, classes))
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Linear(512, classes))


def main():
    args = parse_args()
    import torch
    import torch.nn as nn

    if not torch.cuda.is_available():
        print("pytorch_gpu: SKIPPED: no CUDA device", file=sys.stderr)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    device = torch.device("cuda")
    classes = 10
    model = build(args.model, classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()
    dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[args.precision]
    scaler = torch.amp.GradScaler("cuda", enabled=args.precision == "fp16")

    # A ring of 8 synthetic batches on the device: real-looking inputs without a loader.
    ring = [(torch.randn(args.batch, 1, 28, 28, device=device),
             torch.randint(0, classes, (args.batch,), device=device)) for _ in range(8)]

    def step(i):
        x, y = ring[i % len(ring)]
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss

    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for i in range(args.steps):
        loss = step(i)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    if not torch.isfinite(loss.detach()).item():
        print("pytorch_gpu: the loss is not finite", file=sys.stderr)
        return 1
    print(f"pytorch model={args.model} precision={args.precision} batch={args.batch} "
          f"steps={args.steps} samples_per_s={args.batch * args.steps / wall:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
