#!/usr/bin/env bash
# Makes the seed corpora of the fuzz targets with the real binary: small, valid inputs of every
# kind (data files, checkpoints, exported models, configs, model specs, IDX, npy and CSV files),
# one folder per target under OUT. Tiny shapes keep every seed at a few KB.
# Usage: fuzz/make_seeds.sh MPTRAIN OUT     (MPTRAIN: the mptrain binary of any build)
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: fuzz/make_seeds.sh MPTRAIN OUT" >&2
  exit 2
fi
mptrain=$(realpath "$1")
out=$2
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ -x "$mptrain" ]] || { echo "make_seeds: '$1' is not an executable mptrain" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/mptrain-seeds.XXXXXX")
trap 'rm -rf "$work"' EXIT
targets=(fuzz_data_file fuzz_inspect fuzz_checkpoint fuzz_export fuzz_config fuzz_model_spec
         fuzz_idx fuzz_npy fuzz_csv)
for t in "${targets[@]}"; do mkdir -p "$out/$t"; done
split=$'\n--MPTRAIN-FUZZ-SPLIT--\n'  # fuzz/fuzz_util.hpp kSplitMarker
quiet() { "$@" >"$work/log" 2>&1 || { cat "$work/log" >&2; echo "make_seeds: failed: $*" >&2; exit 1; }; }

# Data files: uint8, float32 and float16 samples (chunked, as prepare writes them).
for dtype in uint8 float32 float16; do
  quiet "$mptrain" prepare synthetic --out "$work/$dtype" --train-samples 12 --test-samples 4 \
    --shape 1,3,3 --classes 3 --dtype "$dtype"
  cp "$work/$dtype/train.h5" "$out/fuzz_data_file/synthetic-$dtype.h5"
done
cp "$work/uint8/train.h5" "$out/fuzz_inspect/data-uint8.h5"

# Checkpoints and exports: an MLP with SGD momentum in fp32, and a small CNN with BatchNorm
# buffers under AdamW in fp16, two steps each.
train() {  # NAME LAYERS extra options...
  local name=$1 layers=$2
  shift 2
  quiet "$mptrain" train --data.train="$work/uint8/train.h5" --model.layers="$layers" \
    --train.batch-size=4 --train.max-steps=2 --train.threads=1 --output.dir="$work/run-$name" \
    --checkpoint.dir="$work/ckpt-$name" "$@"
  local files=("$work/ckpt-$name"/ckpt-*.h5) file
  file=${files[0]}
  [[ -f "$file" ]] || { echo "make_seeds: training '$name' wrote no checkpoint" >&2; exit 1; }
  cp "$file" "$out/fuzz_checkpoint/ckpt-$name.h5"
  cp "$file" "$out/fuzz_inspect/ckpt-$name.h5"
  quiet "$mptrain" export --checkpoint "$work/ckpt-$name" --out "$work/model-$name.h5"
  cp "$work/model-$name.h5" "$out/fuzz_export/model-$name.h5"
  cp "$work/model-$name.h5" "$out/fuzz_inspect/model-$name.h5"
}
train mlp dense:6,relu,dense:3 --optimizer.name=sgd --optimizer.momentum=0.9
train cnn conv:2:3:pad=1,bn,relu,gap,dense:3 --optimizer.name=adamw --train.precision=fp16

# Configs: the first byte picks the mode (fuzz/fuzz_config.cpp).
i=0
for ini in "$repo_root"/inputs/*.ini; do
  { printf '\x00'; cat "$ini"; } >"$out/fuzz_config/train-ini-$i"
  { printf '\x01'; cat "$ini"; } >"$out/fuzz_config/eval-ini-$i"
  i=$((i + 1))
done
printf '\x02--data.train=a.h5\n--train.time-limit=1-02:03:04\n--optimizer.lr=0.1\n--model.layers=dense:8,relu,dense:10\n--checkpoint.dir=\n' \
  >"$out/fuzz_config/train-args"
printf '\x03csv\n--input=a.csv\n--out=a.h5\n--shape=1,2,2\n--label-column=-1\n' >"$out/fuzz_config/prepare-args"
printf '\x04allreduce\n-b\n8K\n-e\n1M\n-f\n4\n-a\nflat-mpi,hierarchical-mpi@2\n-d\nbf16\n' >"$out/fuzz_config/bench-args"
printf '\x05--checkpoint=runs/ckpt\n--out=model.h5\n--model=model.h5\n--data=x.h5\n' >"$out/fuzz_config/export-args"

# Model specs (the data has 10 classes).
specs=(mlp cnn resnet-mini dense:10 "dense:32,gelu,dropout:0.25,dense:10"
       "conv:4:3:stride=2:pad=1,relu,maxpool:2,flatten,dense:10"
       "conv:4:3,bn,gelu,avgpool:2:stride=1,resblock:8:stride=2,gap,dense:10")
i=0
for spec in "${specs[@]}"; do
  printf '%s' "$spec" >"$out/fuzz_model_spec/spec-$i"
  i=$((i + 1))
done

# IDX (plain and gzip), npy and CSV files, written byte by byte.
python3 - "$out" "$split" <<'EOF'
import gzip, struct, sys
out, split = sys.argv[1], sys.argv[2].encode()

def write(path, *parts):
    with open(path, "wb") as f:
        f.write(split.join(parts))

n, rows, cols = 5, 3, 2
images = struct.pack(">IIII", 0x803, n, rows, cols) + bytes((7 * i) % 256 for i in range(n * rows * cols))
labels = struct.pack(">II", 0x801, n) + bytes(i % 10 for i in range(n))
write(f"{out}/fuzz_idx/plain", images, labels)
write(f"{out}/fuzz_idx/gzip", gzip.compress(images, mtime=0), gzip.compress(labels, mtime=0))

def npy(descr, shape, data, version=1):
    shape_text = f"({shape[0]},)" if len(shape) == 1 else "(" + ", ".join(map(str, shape)) + ")"
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    length_size = 2 if version == 1 else 4
    pad = (64 - (8 + length_size + len(header) + 1) % 64) % 64
    header = header + " " * pad + "\n"
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode("latin1") + data

write(f"{out}/fuzz_npy/u1-i8", npy("|u1", (4, 1, 2, 2), bytes(range(16))),
      npy("<i8", (4,), struct.pack("<4q", 0, 1, 2, 1)))
write(f"{out}/fuzz_npy/f4-u1", npy("<f4", (3, 5), struct.pack("<15f", *[i / 7 for i in range(15)])),
      npy("|u1", (3,), bytes([2, 0, 1])))
write(f"{out}/fuzz_npy/f2-i4-v2", npy("<f2", (2, 2, 2), struct.pack("<8e", *[i / 3 for i in range(8)]), 2),
      npy("<i4", (2,), struct.pack("<2i", 1, 0), 2))

with open(f"{out}/fuzz_csv/header-bytes.csv", "w") as f:
    f.write("label,a,b,c\n0,1,2,3\n2,255,0,7\n1,4,5,6\n")
with open(f"{out}/fuzz_csv/floats.csv", "w") as f:
    f.write("0.5,-1e3,2.25,1\r\n1.5,3,+4,0\r\n\r\n2,0,0,2\r\n")
EOF
count=$(find "$out" -type f | wc -l)
bytes=$(du -sb "$out" | cut -f1)
echo "make_seeds: $count seeds, $bytes bytes, in $out"
