#!/usr/bin/env python3
"""Reference inference for mptrain export files with numpy and h5py only (docs/export-format.md).

    python3 docs/predict_numpy.py model.h5 data.h5 [--out preds.npz] [--limit N] [--batch 256]

Checks the file's format and SHA-256, normalises the samples as mptrain does, runs every layer
of docs/model-spec.md in float32 and prints top-1 accuracy when the data has labels. --out
writes predictions (int64 [N]) and logits (float32 [N, C]) to an .npz file.
"""
import argparse
import hashlib
import sys

import h5py
import numpy as np

FORMAT, VERSION = "mptrain-model", 1
BN_EPS = 1e-5


def erf(x):
    # Abramowitz & Stegun 7.1.26: |error| < 1.5e-7, below float32 resolution of GELU's output.
    a1, a2, a3, a4, a5, p = 0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429, 0.3275911
    s = np.sign(x)
    z = np.abs(x).astype(np.float64)
    t = 1.0 / (1.0 + p * z)
    y = 1.0 - (((((a5 * t + a4) * t) + a3) * t + a2) * t + a1) * t * np.exp(-z * z)
    return (s * y).astype(x.dtype)


def conv2d(x, w, b, stride, pad):
    """PyTorch Conv2d (cross-correlation, zero padding) on x (N, C, H, W), w (O, C, K, K)."""
    n, c, h, wd = x.shape
    o, _, k, _ = w.shape
    if pad:
        x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (h + 2 * pad - k) // stride + 1
    ow = (wd + 2 * pad - k) // stride + 1
    # cols[n, c, i, j, oh, ow] = x[n, c, oh*stride + i, ow*stride + j]
    sn, sc, sh, sw = x.strides
    cols = np.lib.stride_tricks.as_strided(
        x, (n, c, k, k, oh, ow), (sn, sc, sh, sw, sh * stride, sw * stride), writeable=False)
    y = np.tensordot(w, cols, axes=([1, 2, 3], [1, 2, 3]))  # (O, N, OH, OW)
    return np.ascontiguousarray(y.transpose(1, 0, 2, 3)) + b.reshape(1, o, 1, 1)


def pool2d(x, k, stride, reduce):
    """Max or average pooling without padding; windows past the edge are dropped (floor)."""
    n, c, h, w = x.shape
    oh, ow = (h - k) // stride + 1, (w - k) // stride + 1
    sn, sc, sh, sw = x.strides
    win = np.lib.stride_tricks.as_strided(
        x, (n, c, oh, ow, k, k), (sn, sc, sh * stride, sw * stride, sh, sw), writeable=False)
    return win.max(axis=(4, 5)) if reduce == "max" else win.mean(axis=(4, 5), dtype=np.float32)


def batchnorm(x, t, name):
    """Inference mode: running statistics, per channel (axis 1)."""
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = t[name + "/running_mean"].reshape(shape), t[name + "/running_var"].reshape(shape)
    gamma, beta = t[name + "/gamma"].reshape(shape), t[name + "/beta"].reshape(shape)
    return ((x - mean) / np.sqrt(var + np.float32(BN_EPS)) * gamma + beta).astype(np.float32)


def parse_spec(spec):
    """[(kind, args dict)] from a canonical spec such as 'conv:32:5:pad=2,relu,maxpool:2'."""
    layers = []
    for item in spec.split(","):
        fields = [f.strip() for f in item.strip().split(":")]
        kind, args, positional = fields[0], {}, []
        for f in fields[1:]:
            if "=" in f:
                key, value = f.split("=", 1)
                args[key] = value
            else:
                positional.append(f)
        args["positional"] = positional
        layers.append((kind, args))
    return layers


def resblock(x, t, name, channels, stride):
    h = conv2d(x, t[name + "/conv1/weight"], t[name + "/conv1/bias"], stride, 1)
    h = np.maximum(batchnorm(h, t, name + "/bn1"), 0)
    h = batchnorm(conv2d(h, t[name + "/conv2/weight"], t[name + "/conv2/bias"], 1, 1), t, name + "/bn2")
    if x.shape[1] != channels or stride != 1:
        skip = batchnorm(conv2d(x, t[name + "/proj/weight"], t[name + "/proj/bias"], stride, 0), t,
                         name + "/proj_bn")
    else:
        skip = x
    return np.maximum(h + skip, 0)


SPATIAL = {"conv", "maxpool", "avgpool", "gap", "resblock"}


def forward(spec, tensors, x):
    """Logits (N, C) float32 for normalised samples x (N, *sample_shape) float32."""
    layers = parse_spec(spec)
    if any(kind in SPATIAL for kind, _ in layers):
        if x.ndim == 3:  # (N, H, W) samples are (N, 1, H, W)
            x = x[:, None]
    else:
        x = x.reshape(x.shape[0], -1)  # the MLP case: flattened first
    for index, (kind, args) in enumerate(layers):
        name = f"{kind}{index}"
        pos = args["positional"]
        if kind == "dense":
            x = x @ tensors[name + "/weight"].T + tensors[name + "/bias"]
        elif kind == "conv":
            k = int(pos[1])
            x = conv2d(x, tensors[name + "/weight"], tensors[name + "/bias"],
                       int(args.get("stride", 1)), int(args.get("pad", 0)))
            assert tensors[name + "/weight"].shape[2] == k
        elif kind in ("maxpool", "avgpool"):
            k = int(pos[0])
            x = pool2d(x, k, int(args.get("stride", k)), kind[:3])
        elif kind == "gap":
            x = x.mean(axis=(2, 3), dtype=np.float32)
        elif kind == "flatten":
            x = x.reshape(x.shape[0], -1)
        elif kind == "relu":
            x = np.maximum(x, 0)
        elif kind == "gelu":
            x = (0.5 * x * (1 + erf(x / np.float32(np.sqrt(2))))).astype(np.float32)
        elif kind == "bn":
            x = batchnorm(x, tensors, name)
        elif kind == "dropout":
            pass  # the identity in inference
        elif kind == "resblock":
            x = resblock(x, tensors, name, int(pos[0]), int(args.get("stride", 1)))
        else:
            sys.exit(f"unknown layer kind '{kind}' in spec '{spec}'")
        x = x.astype(np.float32, copy=False)
    return x


def text(value):
    """A string attribute as str: mptrain writes fixed-length UTF-8 strings, which h5py returns as
    bytes; variable-length ones (older files, other writers) come back as str."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def load_model(path):
    with h5py.File(path, "r") as f:
        a = f.attrs
        assert text(a.get("mptrain_format", "")) == FORMAT, f"{path}: not an mptrain export file"
        assert int(a["format_version"]) == VERSION, f"{path}: format_version {a['format_version']}"
        model = {
            "spec": text(a["model_spec"]), "sample_shape": tuple(int(s) for s in a["sample_shape"]),
            "num_classes": int(a["num_classes"]), "mean": np.float32(a["input_mean"]),
            "std": np.float32(a["input_std"]), "sha256": text(a["sha256"]),
        }
        weight_names = [text(n) for n in a["weight_names"]]
        buffer_names = [text(n) for n in a.get("buffer_names", [])]
        names = weight_names + buffer_names
        groups = ["weights"] * len(weight_names) + ["buffers"] * len(buffer_names)
        tensors = {n: np.asarray(f[g][n], dtype="<f4") for g, n in zip(groups, names)}
    # The documented digest: every weight, then every buffer (float32 LE, in the listed order),
    # the spec in UTF-8, a NUL, sample shape and class count as int64 LE, mean and std as float32.
    h = hashlib.sha256()
    for n in names:
        h.update(tensors[n].tobytes())
    h.update(model["spec"].encode() + b"\0")
    h.update(np.asarray(model["sample_shape"] + (model["num_classes"],), "<i8").tobytes())
    h.update(np.asarray([model["mean"], model["std"]], "<f4").tobytes())
    if h.hexdigest() != model["sha256"]:
        sys.exit(f"{path}: weights do not match their SHA-256 (file modified or corrupt); re-export it")
    model["tensors"] = tensors
    return model


def load_data(path, model):
    with h5py.File(path, "r") as f:
        samples = f[text(f.attrs.get("samples_dataset", "samples"))]
        labels_name = text(f.attrs.get("labels_dataset", "labels"))
        labels = np.asarray(f[labels_name], dtype=np.int64) if labels_name in f else None
        x = np.asarray(samples)
    n = x.shape[0]
    if x.dtype == np.uint8:
        # Exactly the reader's float32 arithmetic: x * (1 / (255 std)) + (-mean / std).
        scale = np.float32(1) / (np.float32(255) * model["std"])
        shift = -model["mean"] / model["std"]
        x = x.astype(np.float32) * scale + shift
    else:
        x = x.astype(np.float32)  # float samples are used as stored
    return x.reshape((n,) + model["sample_shape"]), labels


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("data")
    parser.add_argument("--out", help="write predictions and logits to this .npz")
    parser.add_argument("--limit", type=int, default=0, help="only the first N samples")
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    model = load_model(args.model)
    x, labels = load_data(args.data, model)
    if args.limit:
        x = x[: args.limit]
        labels = None if labels is None else labels[: args.limit]
    logits = np.concatenate([forward(model["spec"], model["tensors"], x[i:i + args.batch])
                             for i in range(0, len(x), args.batch)])
    predictions = logits.argmax(axis=1)
    if labels is not None:
        print(f"numpy: accuracy {np.mean(predictions == labels):.4f}  samples {len(x)}  model {args.model}")
    if args.out:
        np.savez(args.out, predictions=predictions, logits=logits)


if __name__ == "__main__":
    main()
