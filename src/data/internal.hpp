// Private to the data module: the writer every data-file producer shares (so all of them agree on
// layout, chunking and attributes), pixel statistics, and HDF5 traversal used by reader/inspect.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/hdf5.hpp"
#include "core/tensor.hpp"

namespace mpt::data::detail {

inline constexpr const char* kDataFormat = "mptrain-data";
inline constexpr const char* kCheckpointFormat = "mptrain-checkpoint";
inline constexpr std::int32_t kDataFormatVersion = 1;
// Target size of one chunk of /samples: small enough that a random batch reads little beyond the
// samples it wants, large enough that the chunk index stays small.
inline constexpr std::size_t kChunkTargetBytes = 16u << 10;

struct DataFileAttributes {
  int num_classes = 0;
  float mean = 0.0f;
  float std = 1.0f;
  std::string source;
  std::string class_names;  // comma separated, may be empty
};

// Writes an mptrain data file of uint8 samples slab by slab. The file is written as PATH.tmp and
// renamed to PATH by finish(), so a crash never leaves a half-written file under the real name.
class DataFileWriter {
 public:
  DataFileWriter(std::string path, std::int64_t num_samples, Shape sample_shape);
  ~DataFileWriter();  // removes the .tmp file when finish() was not reached
  DataFileWriter(const DataFileWriter&) = delete;
  DataFileWriter& operator=(const DataFileWriter&) = delete;

  // Appends COUNT samples (COUNT * numel(sample_shape) bytes) and their labels.
  void append(const std::uint8_t* samples, const std::int32_t* labels, std::int64_t count);
  std::int64_t written() const { return written_; }
  // Writes the attributes, closes the file and renames it into place. All samples must be in.
  void finish(const DataFileAttributes& attributes);

 private:
  std::string path_;
  std::string temporary_path_;
  std::int64_t num_samples_;
  Shape sample_shape_;
  std::int64_t sample_elements_;
  std::int64_t written_ = 0;
  Hdf5Handle file_;
  Hdf5Handle samples_;
  Hdf5Handle labels_;
};

// Population mean and standard deviation of uint8 pixels scaled to [0, 1], accumulated exactly
// in integers so the result does not depend on slab size.
class PixelStatistics {
 public:
  void add(const std::uint8_t* pixels, std::size_t count);
  float mean() const;
  float std() const;

 private:
  std::uint64_t count_ = 0;
  std::uint64_t sum_ = 0;
  unsigned __int128 sum_of_squares_ = 0;
};

// Paths (without the leading '/') of every dataset in the file, in name order at each level.
std::vector<std::string> list_datasets(hid_t file);
// The same for groups (the root excluded).
std::vector<std::string> list_groups(hid_t file);

// Creates DIR and its parents; UserError naming DIR and OPTION when that fails.
void create_directory(const std::string& dir, const std::string& option);

}  // namespace mpt::data::detail
