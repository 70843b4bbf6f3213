// Checkpoints: one HDF5 file per checkpoint, written atomically (tmp, fsync, rename, fsync dir)
// with a CRC32 per dataset; docs/checkpoint-format.md specifies the layout for h5py readers.
// It holds the FP32 weights and the model's buffers (BatchNorm running statistics); optimizer,
// scaler, RNG and data cursor come as new groups.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/hdf5.hpp"
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
  // The input normalisation of uint8 samples the model was trained with, (x/255 - mean)/std
  // (data::DatasetInfo). NaN: unknown (a checkpoint written before mptrain recorded it).
  double input_mean = std::numeric_limits<double>::quiet_NaN();
  double input_std = std::numeric_limits<double>::quiet_NaN();
};

struct NamedTensor {
  std::string name;  // "dense0/weight": layer/param, stored as /weights/dense0/weight
  Tensor value;      // f32, cpu
};

// Call on one rank only (rank 0): the file is written by plain serial HDF5.
// Writes DIR/ckpt-<step>.h5 (creating DIR) atomically and points DIR/latest at it. Returns the
// path written. Names must be unique, non-empty, and made of [A-Za-z0-9_./-] without "..".
// BUFFERS are the model's non-trainable state ("bn3/running_mean"), stored under /buffers.
std::string save_weights(const std::string& dir, const CheckpointMeta& meta,
                         const std::vector<NamedTensor>& weights,
                         const std::vector<NamedTensor>& buffers = {});

struct LoadedCheckpoint {
  std::string path;  // the file read (a directory resolved through 'latest')
  CheckpointMeta meta;
  std::vector<NamedTensor> weights;  // in the order they were saved
  std::vector<NamedTensor> buffers;  // likewise; empty for a model without buffers
};

// Loads a checkpoint file, or, given a directory, the file its 'latest' names. Verifies the
// format, version and every dataset's CRC32; throws UserError naming the file otherwise.
LoadedCheckpoint load_weights(const std::string& path_or_dir);

// The file a checkpoint argument names: PATH_OR_DIR itself, or the file a directory's 'latest'
// names. UserError when the directory has no usable 'latest'.
std::string resolve_checkpoint_path(const std::string& path_or_dir);

// Writes PATH atomically, as checkpoints are written: FILL writes the HDF5 file (open as ROOT)
// under PATH.tmp, which is then flushed, closed, fsynced and renamed over PATH, and the
// directory is fsynced. WHAT names the file kind in messages ("export file"). Holds hdf5_lock().
void write_hdf5_atomically(const std::string& path, const std::string& what,
                           const std::function<void(hid_t root)>& fill);

// True for names save_weights accepts ([A-Za-z0-9_./-], no "..", "//" or leading/trailing '/').
bool valid_tensor_name(const std::string& name);

}  // namespace mpt::ckpt
