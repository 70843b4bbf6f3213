// Checkpoints: one HDF5 file per checkpoint, written atomically (tmp, fsync, rename, fsync dir)
// with a CRC-32C per dataset; docs/checkpoint-format.md specifies the layout for h5py readers.
// It holds the FP32 weights, the model's buffers (BatchNorm running statistics) and, from
// format 2, the training state: optimizer, loss scaler, data cursor and RNG counters.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
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

// Everything beyond the weights that a run needs to continue bit for bit (format_version 2).
// A checkpoint without it (format 1, written before #7) still loads, for eval/export/predict,
// and resumes as weights only. A new field needs its attribute in ckpt.cpp
// (write_state_attributes, read_training_state, describe_checkpoint), in the round-trip test and
// in docs/checkpoint-format.md.
struct TrainingState {
  // The optimizer: its name, its applied updates (the LR schedule's position: a skipped step
  // does not count) and its FP32 state tensors (optim::Optimizer::state(): "momentum_buffer"
  // for SGD, "exp_avg" and "exp_avg_sq" for AdamW; none for SGD without momentum), stored as
  // /optimizer/<name>.
  std::string optimizer;
  std::int64_t optimizer_steps = 0;
  // The LR schedule's position: optimizer_steps, re-expressed when a run resumed on another
  // world size or batch (so a cosine keeps its shape over the samples, not the steps).
  std::int64_t schedule_steps = 0;
  std::vector<NamedTensor> optimizer_tensors;
  // The dynamic loss scaler (amp::LossScalerState, field by field).
  double loss_scale = 1;
  std::int64_t scaler_growth_tracker = 0;
  std::int64_t scaler_hysteresis_tracker = 1;
  std::int64_t scaler_skipped_steps = 0;
  // The data cursor: the epoch in progress and how far into it the run got, in optimizer steps
  // of this run's shape and in global samples (what a run of another world size resumes from).
  std::int64_t epoch = 0;
  std::int64_t epoch_step = 0;
  std::int64_t epoch_samples = 0;
  // The RNG streams are counters under the run's seed: the shuffle is a function of (seed,
  // epoch), and dropout masks of (seed, layer, micro-batch, sample), so the seed and the
  // micro-batches run so far restore both.
  std::uint64_t seed = 0;
  std::int64_t micro_step = 0;
  // The shape of a step when written (a resume with another shape re-expresses the cursor).
  std::int64_t batch_per_rank = 0;
  std::int64_t accumulate = 1;
  double wall_time_s = 0;  // training time so far (informational)
};

// How save_checkpoint() writes and prunes.
struct SaveOptions {
  int keep = 3;                // keep the newest KEEP checkpoints (>= 1) ...
  std::int64_t keep_every = 0;  // ... and, for good, every one whose step is a multiple (0: none)
  int debug_pause_ms = 0;      // testing aid: sleep this long after each dataset written
};

// Call on one rank only (rank 0): the file is written by plain serial HDF5.
// Writes DIR/ckpt-<step>.h5 (creating DIR, format 2 without training state: for eval, export and
// weights-only use) atomically and points DIR/latest at it; prunes nothing. Returns the
// path written. Names must be unique, non-empty, and made of [A-Za-z0-9_./-] without "..".
// BUFFERS are the model's non-trainable state ("bn3/running_mean"), stored under /buffers.
std::string save_weights(const std::string& dir, const CheckpointMeta& meta,
                         const std::vector<NamedTensor>& weights,
                         const std::vector<NamedTensor>& buffers = {});

// save_weights plus the training state (format 2), then pruning per OPTIONS: older ckpt-*.h5
// beyond the newest KEEP (by step) are deleted unless their step is a multiple of KEEP_EVERY or
// 'latest' names them, and so are stale ckpt-*.h5.tmp files of interrupted writes. On any
// failure (a full disk, an I/O error) the .tmp is removed, 'latest' and every earlier checkpoint
// are untouched, and UserError names the file. Takes hdf5_lock() per dataset piece, not for the
// whole write, so a background writer lets the prefetcher read in between.
std::string save_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                            const std::vector<NamedTensor>& weights,
                            const std::vector<NamedTensor>& buffers, const TrainingState& state,
                            const SaveOptions& options);

struct LoadedCheckpoint {
  std::string path;  // the file read (a directory resolved through 'latest')
  CheckpointMeta meta;
  std::vector<NamedTensor> weights;  // in the order they were saved
  std::vector<NamedTensor> buffers;  // likewise; empty for a model without buffers
  std::optional<TrainingState> state;  // absent: a weights-only checkpoint (format 1)
};

// Loads a checkpoint file, or, given a directory, the file its 'latest' names. Verifies the
// format, version and every dataset's checksum (CRC-32C; zlib CRC-32 in format 1 files); throws
// UserError naming the file and, for damage, the dataset otherwise.
LoadedCheckpoint load_weights(const std::string& path_or_dir);

// --resume=auto: the newest checkpoint in DIR (by the step in ckpt-<step>.h5, whatever 'latest'
// says) that loads and whose checksums verify. A damaged newer one is reported through WARN
// (one line naming the file and the reason) and skipped. nullopt: DIR is missing or holds no
// checkpoint (a fresh start); UserError when it holds checkpoints and none verifies.
std::optional<LoadedCheckpoint> load_newest_valid(
    const std::string& dir, const std::function<void(const std::string&)>& warn);

// A resume must restore every parameter: UserError naming the first parameter of EXPECTED
// (name and shape, in model order) that CHECKPOINT lacks or holds with another shape, or the
// first checkpoint weight the model does not have.
void check_weights_match(const LoadedCheckpoint& checkpoint,
                         const std::vector<NamedTensor>& expected);

// `mptrain inspect` of a checkpoint: the run state it holds (step, epoch, loss scale, world size,
// optimizer, data cursor, writer) as "key: value" lines, and "checksums: verified (N datasets)"
// or "checksums: MISMATCH in /weights/...". nullopt when PATH is not an mptrain checkpoint.
// Damaged data is reported in the text, not thrown, so that a broken checkpoint can still be
// looked at; only HDF5 metadata that fails to read (its own checksums) is a UserError.
std::optional<std::string> describe_checkpoint(const std::string& path);

// The file a checkpoint argument names: PATH_OR_DIR itself, or the file a directory's 'latest'
// names. UserError when the directory has no usable 'latest'.
std::string resolve_checkpoint_path(const std::string& path_or_dir);

// Writes PATH atomically, as checkpoints are written: FILL writes the HDF5 file (open as ROOT)
// under PATH.tmp, which is then flushed, closed, fsynced and renamed over PATH, and the
// directory is fsynced. WHAT names the file kind in messages ("export file"). Holds hdf5_lock().
void write_hdf5_atomically(const std::string& path, const std::string& what,
                           const std::function<void(hid_t root)>& fill);

// The checkpoints in DIR: regular files (not links) named ckpt-<step>.h5 directly inside it,
// newest step first; empty when DIR is missing.
std::vector<std::string> checkpoint_files(const std::string& dir);

// --output.overwrite of a fresh run: deletes DIR's ckpt-<step>.h5, their .tmp debris and
// 'latest', regular files directly inside DIR only (a link by such a name is removed, what it
// points to never). UserError naming a file that cannot be removed.
void remove_checkpoints(const std::string& dir);

// True for names save_weights accepts ([A-Za-z0-9_./-], no "..", "//" or leading/trailing '/').
bool valid_tensor_name(const std::string& name);

}  // namespace mpt::ckpt
