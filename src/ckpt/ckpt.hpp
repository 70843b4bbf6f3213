// Checkpoints: one HDF5 file per checkpoint, written atomically (tmp, fsync, rename, fsync dir)
// with a CRC32 per dataset; docs/checkpoint-format.md specifies the layout for h5py readers.
// For now it holds the FP32 weights; optimizer, scaler, RNG and data cursor come as new groups.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace mpt::ckpt {

struct CheckpointMeta {
  std::string model_spec;
  Shape sample_shape;
  int num_classes = 0;
  std::int64_t step = 0;
  std::int64_t epoch = 0;
  int world_size = 1;
  std::int64_t global_batch = 0;
  std::string precision = "fp32";
  std::string mptrain_version;  // empty: filled with this build's version by save_weights
  std::string git_hash;         // empty: filled with this build's git hash by save_weights
};

struct NamedTensor {
  std::string name;  // "dense0/weight": layer/param, stored as /weights/dense0/weight
  Tensor value;      // f32, cpu
};

// Call on one rank only (rank 0): the file is written by plain serial HDF5.
// Writes DIR/ckpt-<step>.h5 (creating DIR) atomically and points DIR/latest at it. Returns the
// path written. Names must be unique, non-empty, and made of [A-Za-z0-9_./-] without "..".
std::string save_weights(const std::string& dir, const CheckpointMeta& meta,
                         const std::vector<NamedTensor>& weights);

struct LoadedCheckpoint {
  CheckpointMeta meta;
  std::vector<NamedTensor> weights;  // in the order they were saved
};

// Loads a checkpoint file, or, given a directory, the file its 'latest' names. Verifies the
// format, version and every dataset's CRC32; throws UserError naming the file otherwise.
LoadedCheckpoint load_weights(const std::string& path_or_dir);

}  // namespace mpt::ckpt
