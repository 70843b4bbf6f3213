// The data module: preparing HDF5 data files (Fashion-MNIST from IDX, synthetic), reading random
// batches from them, and deciding which rank reads which samples. The file layout is specified
// in docs/data-format.md.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/hdf5.hpp"
#include "core/tensor.hpp"

namespace mpt::data {

// ---- preparing data files ----------------------------------------------------------------------

// Writes OUT_DIR/train.h5 and OUT_DIR/test.h5 (creating OUT_DIR) from the four IDX files of
// Fashion-MNIST in SOURCE_DIR (gzip, or uncompressed without the .gz suffix). Debian's
// dataset-fashion-mnist package installs them in /usr/share/datasets/fashion-mnist. mean and std
// come from the training set and are written to both files.
void prepare_fashion_mnist(const std::string& source_dir, const std::string& out_dir);

struct IdxConvertOptions {
  int num_classes = 10;
  std::string class_names;  // comma separated; empty = none written
  std::string source;       // free text stored in the 'source' attribute
  // Normalisation written to the file, for pixel values scaled to [0, 1]. NaN means: compute it
  // from this file's pixels (what the training set does; the test set reuses the result).
  float mean = std::numeric_limits<float>::quiet_NaN();
  float std = std::numeric_limits<float>::quiet_NaN();
};

// Converts one pair of IDX files (images: magic 0x00000803, labels: 0x00000801; gzip or raw) to
// an mptrain data file at OUT_PATH. Throws UserError naming the file for a missing, truncated or
// malformed input, a count mismatch or a label >= num_classes.
void convert_idx(const std::string& images_path, const std::string& labels_path,
                 const std::string& out_path, const IdxConvertOptions& options);

// A learnable synthetic data set: each class has a fixed random uint8 prototype, and each sample
// is its class prototype blended with per-sample noise. Everything is a pure function of the
// seed, so any rank can regenerate it; written in slabs, so N may be in the millions.
struct SyntheticSpec {
  std::int64_t train_samples = 8192;
  std::int64_t test_samples = 2048;
  Shape sample_shape{1, 28, 28};
  int num_classes = 10;
  std::uint64_t seed = 1;
  float noise = 0.35f;  // weight of the noise in the blend, in [0, 1]
};

// Writes OUT_DIR/train.h5 and OUT_DIR/test.h5 (creating OUT_DIR).
void prepare_synthetic(const SyntheticSpec& spec, const std::string& out_dir);

// ---- reading ----------------------------------------------------------------------------------

struct DatasetInfo {
  std::string path;
  std::int64_t num_samples = 0;
  Shape sample_shape;              // without the leading N
  DType sample_dtype = DType::u8;  // as stored: u8, f32 or f16
  int num_classes = 0;
  float mean = 0.0f;  // of the [0,1]-scaled values; used for uint8 samples only
  float std = 1.0f;
  std::string samples_name;
  std::string labels_name;
};

struct ReaderOptions {
  std::string samples_name = "samples";
  std::string labels_name = "labels";
  std::size_t chunk_cache_bytes = 64u << 20;   // HDF5 chunk cache of the samples dataset
  std::string option_prefix = "--data.train";  // the option that named the file, for messages
};

// Reads batches of samples by global index from one data file. Not for concurrent use by two
// threads (it owns scratch buffers); any number of readers may exist, since every HDF5 call
// goes through hdf5_lock().
class DatasetReader {
 public:
  // Opens and validates PATH completely (layout, dtype, attributes, every label in range);
  // throws UserError naming the file and the option for anything wrong.
  DatasetReader(const std::string& path, const ReaderOptions& options);
  ~DatasetReader();
  DatasetReader(const DatasetReader&) = delete;
  DatasetReader& operator=(const DatasetReader&) = delete;

  const DatasetInfo& info() const { return info_; }

  // Reads the samples INDICES (any order, duplicates allowed, each in [0, N)) into rows
  // 0..indices.size()-1 of SAMPLES (f32 [n, sample_shape...], n >= indices.size(), caller-owned)
  // and their labels into LABELS (i32 [n]). uint8 samples become (x/255 - mean)/std; float
  // samples are copied and must be finite. Indices are sorted and consecutive ones coalesced
  // into one hyperslab read each; no allocation once the scratch buffers have grown to the
  // largest batch.
  void read_batch(std::span<const std::int64_t> indices, Tensor& samples, Tensor& labels);

 private:
  void open_and_validate(const ReaderOptions& options);

  DatasetInfo info_;
  std::string option_prefix_;
  Hdf5Handle file_;
  Hdf5Handle samples_dataset_;
  Hdf5Handle file_space_;    // the samples' dataspace, reselected by every read
  Hdf5Handle memory_space_;  // reshaped to each run's block
  std::vector<hsize_t> hyperslab_start_;
  std::vector<hsize_t> hyperslab_count_;
  hid_t memory_type_ = H5I_INVALID_HID;  // predefined (not owned): native uchar or float
  std::int64_t sample_elements_ = 0;
  std::size_t sample_bytes_ = 0;  // per sample in the staging buffer
  float scale_ = 1.0f;            // uint8 -> f32: x * scale_ + shift_
  float shift_ = 0.0f;
  std::vector<std::int32_t> labels_;  // all of them, read and validated at open
  // Scratch, grown on first use and then reused.
  struct Run {
    std::int64_t begin;  // first sample index of consecutive indices
    std::int64_t length;
    std::int64_t first_slot;  // where its samples land in staging_
  };
  std::vector<Run> runs_;
  std::vector<std::pair<std::int64_t, std::int64_t>> sorted_;  // (index, batch position)
  std::vector<std::int64_t> slot_of_position_;                 // batch position -> staging slot
  std::vector<std::byte> staging_;
};

// ---- sharding ---------------------------------------------------------------------------------

// Which global sample indices rank RANK of WORLD_SIZE reads at each step. Epoch e's order is the
// permutation P_e = epoch_permutation(n, seed, e) (identity without shuffle); the global batch of
// step s is P_e[s*G, (s+1)*G) with G = batch_per_rank * world_size, and rank r takes
// P_e[s*G + r*B + j], j < B. The union over ranks is therefore exactly what a 1-rank run with
// batch G reads, which is what makes runs on different world sizes train identically. The last
// n mod G samples of each epoch are dropped.
class ShardPlan {
 public:
  // Throws UserError (naming --train.batch-size) when the global batch exceeds NUM_SAMPLES.
  ShardPlan(std::int64_t num_samples, std::int64_t batch_per_rank, int world_size, int rank,
            std::uint64_t seed, bool shuffle = true);

  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  std::int64_t global_batch() const { return batch_per_rank_ * world_size_; }
  std::int64_t batch_per_rank() const { return batch_per_rank_; }

  // This rank's batch_per_rank indices for STEP (0 <= step < steps_per_epoch) of EPOCH, into OUT
  // (resized). The epoch's permutation is computed once and cached, so this is not thread-safe.
  void batch_indices(std::int64_t epoch, std::int64_t step, std::vector<std::int64_t>& out) const;

  // Fisher-Yates: p = 0..n-1; for i = n-1 down to 1: swap(p[i], p[below_i(i+1)]) where below_i is
  // CounterRng(seed, 0x5348554646 ^ epoch).below(i, i + 1).
  static std::vector<std::int64_t> epoch_permutation(std::int64_t n, std::uint64_t seed,
                                                     std::int64_t epoch);

 private:
  std::int64_t num_samples_;
  std::int64_t batch_per_rank_;
  int world_size_;
  int rank_;
  std::uint64_t seed_;
  bool shuffle_;
  std::int64_t steps_per_epoch_;
  mutable std::int64_t cached_epoch_ = -1;
  mutable std::vector<std::int64_t> permutation_;
};

// Rank RANK's contiguous range [begin, end) of an evaluation set of N samples: the ranges cover
// all N with no drop and differ in size by at most one.
std::pair<std::int64_t, std::int64_t> eval_shard(std::int64_t n, int world_size, int rank);

// ---- inspection -------------------------------------------------------------------------------

// A human-readable description of any HDF5 file: its kind (mptrain data file, mptrain
// checkpoint or other HDF5), every dataset with shape and dtype, every attribute with its value,
// and for data files the sample count, classes and a label histogram.
std::string inspect_file(const std::string& path);

}  // namespace mpt::data
