# The h5py peer of perf/bench_reader: reads the batches bench_reader dumped (--dump-order), with
# the same sorting and coalescing into runs (one f["samples"][a:b] per run), and converts uint8 to
# normalised float32 with numpy, as mptrain does. Prints the same one-line summary.
#   python3 bench_reader_h5py.py FILE ORDER.bin BATCH LABEL [REPS]
import sys
import time

import h5py
import numpy as np


def main():
    path, order_path, batch, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    reps = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    order = np.fromfile(order_path, dtype=np.int64).reshape(-1, batch)
    with h5py.File(path, "r") as f:
        samples = f["samples"]
        mean, std = float(f.attrs.get("mean", 0.0)), float(f.attrs.get("std", 1.0))
        scale, shift = np.float32(1 / (255 * std)), np.float32(-mean / std)
        sample_bytes = samples.dtype.itemsize * int(np.prod(samples.shape[1:]))
        out = np.empty((batch,) + samples.shape[1:], np.float32)
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            for indices in order:
                positions = np.argsort(indices, kind="stable")
                sorted_indices = indices[positions]
                # Runs of consecutive indices, each read as one hyperslab.
                breaks = np.flatnonzero(np.diff(sorted_indices) != 1) + 1
                pieces = [samples[run[0]:run[-1] + 1] for run in np.split(sorted_indices, breaks)]
                staged = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
                out[positions] = staged * scale + shift
            best = min(best, time.perf_counter() - start)
    n = order.size
    print(f"h5py    {label:<6} batch {batch}: {n} samples in {best:.3f} s = "
          f"{n * sample_bytes / best / 1e6:.1f} MB/s, {n / best:.0f} samples/s")


if __name__ == "__main__":
    main()
