// Private to the data module: the writer every data-file producer shares (so all of them agree on
// layout, chunking and attributes), pixel statistics, and HDF5 traversal used by reader/inspect.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/hdf5.hpp"
#include "core/tensor.hpp"
#include "data/data.hpp"

namespace mpt::data::detail {

inline constexpr const char* kDataFormat = "mptrain-data";
inline constexpr const char* kCheckpointFormat = "mptrain-checkpoint";
// Written by src/export (export and predict); named here only so that inspect can say what
// the file is (data does not depend on export).
inline constexpr const char* kModelFormat = "mptrain-model";
inline constexpr const char* kPredictionsFormat = "mptrain-predictions";
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

// One HDF5 data file, opened and validated for reading as one part of a DatasetReader. What the
// file itself can get wrong (not HDF5, truncated, missing or malformed datasets) is checked here;
// what depends on the options or on the other files (classes, normalisation, label range,
// agreement between files) is the DatasetReader's job.
class DataFile {
 public:
  DataFile(std::string path, const ReaderOptions& options);
  ~DataFile();
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& samples_name() const { return samples_name_; }
  const std::string& labels_name() const { return labels_name_; }
  // "data file 'PATH' (option --data.train)", the start of every message about it.
  const std::string& description() const { return description_; }
  // "dataset 'samples' of data file 'PATH' (option --data.train)".
  std::string samples_description() const;
  std::string labels_description() const;

  std::int64_t num_samples() const { return num_samples_; }
  const Shape& stored_sample_shape() const { return stored_sample_shape_; }  // without N
  DType sample_dtype() const { return sample_dtype_; }  // u8, f32 or f16 as stored
  // Bytes per sample as read(): 1 per element for uint8, 4 for float32 and float16.
  std::size_t staged_sample_bytes() const { return staged_sample_bytes_; }
  // Root attributes, absent when the file lacks them.
  std::optional<std::int64_t> num_classes_attribute;
  std::optional<Shape> sample_shape_attribute;
  std::optional<double> mean_attribute, std_attribute;
  // Every label, read at open (4 bytes per sample), not yet checked against the class count.
  std::vector<std::int32_t> labels;

  // Reads COUNT samples from BEGIN (indices of this file) into OUT, staged_sample_bytes() each,
  // uint8 or float. Takes hdf5_lock() where it calls HDF5. A read that fails (the file was
  // damaged or truncated after it was opened) is a UserError naming the file and dataset.
  void read(std::int64_t begin, std::int64_t count, std::byte* out);
  // Samples read with pread() past HDF5, and with H5Dread (for tests and the benchmark).
  std::int64_t direct_reads() const { return direct_reads_; }
  std::int64_t hdf5_reads() const { return hdf5_reads_; }

 private:
  void open_and_validate(const ReaderOptions& options);
  void plan_direct_reads(hid_t create_properties, hid_t file_type);
  bool read_direct(std::int64_t begin, std::int64_t count, std::byte* out);
  void read_hdf5(std::int64_t begin, std::int64_t count, std::byte* out);
  std::int64_t chunk_address(std::int64_t chunk);  // byte offset in the file, or -1

  std::string path_;
  std::string description_;
  std::string samples_name_;
  std::string labels_name_;
  std::int64_t num_samples_ = 0;
  Shape stored_sample_shape_;
  DType sample_dtype_ = DType::u8;
  std::size_t staged_sample_bytes_ = 0;
  Hdf5Handle file_;
  Hdf5Handle samples_dataset_;
  Hdf5Handle file_space_;    // the samples' dataspace, reselected by every read
  Hdf5Handle memory_space_;  // reshaped to each run's block
  std::vector<hsize_t> hyperslab_start_;
  std::vector<hsize_t> hyperslab_count_;
  hid_t memory_type_ = H5I_INVALID_HID;  // predefined (not owned): native uchar or float
  // Direct reads: for uncompressed samples stored exactly as staged (uint8, or little-endian
  // float32 on a little-endian host), a run of samples is one or a few pread() calls straight
  // into the staging buffer, with no HDF5 chunk-cache copy. Contiguous datasets have one base
  // offset; chunked ones (whole samples per chunk) look each chunk's offset up once.
  bool allow_direct_ = true;
  int descriptor_ = -1;
  bool direct_ = false;
  std::int64_t contiguous_offset_ = -1;    // contiguous layout: where sample 0 starts
  std::int64_t samples_per_chunk_ = 0;     // chunked layout
  std::int64_t userblock_bytes_ = 0;       // HDF5 addresses are relative to the user block
  std::vector<std::int64_t> chunk_offsets_;  // -2: not looked up yet, -1: not allocated
  std::int64_t direct_reads_ = 0;
  std::int64_t hdf5_reads_ = 0;
};

// IEEE binary16, little-endian, as HDF5 describes it (what h5py writes for numpy.float16).
Hdf5Handle float16_type();
// The HDF5 memory type of DTYPE's host representation: u8, f32 or f16 (raw binary16 bits).
hid_t memory_type_of(DType dtype, hid_t float16);

// Writes an mptrain data file of uint8, float32 or float16 samples slab by slab. The file is
// written as PATH.tmp and renamed to PATH by finish(), so a crash never leaves a half-written
// file under the real name.
class DataFileWriter {
 public:
  DataFileWriter(std::string path, std::int64_t num_samples, Shape sample_shape,
                 DType sample_dtype = DType::u8);
  ~DataFileWriter();  // removes the .tmp file when finish() was not reached
  DataFileWriter(const DataFileWriter&) = delete;
  DataFileWriter& operator=(const DataFileWriter&) = delete;

  // Appends COUNT samples (COUNT * numel(sample_shape) elements of MEMORY_DTYPE, converted by
  // HDF5 to the file's dtype: u8 for uint8 files; f32, or f16 as raw bits, for float files) and
  // their labels.
  void append(const void* samples, DType memory_dtype, const std::int32_t* labels,
              std::int64_t count);
  void append(const std::uint8_t* samples, const std::int32_t* labels, std::int64_t count) {
    append(samples, DType::u8, labels, count);
  }
  std::int64_t written() const { return written_; }
  // Writes the attributes, closes the file and renames it into place. All samples must be in.
  void finish(const DataFileAttributes& attributes);

 private:
  std::string path_;
  std::string temporary_path_;
  std::int64_t num_samples_;
  Shape sample_shape_;
  DType sample_dtype_;
  std::int64_t sample_elements_;
  std::int64_t written_ = 0;
  Hdf5Handle float16_;
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

// For the array converters: STORED reshaped to REQUESTED (empty: STORED), which must have the
// same number of elements; UserError naming WHAT (the input file) and --shape otherwise.
Shape converted_sample_shape(const Shape& stored, const Shape& requested, const std::string& what);
// The attributes of a converted file: classes from the options or MAX_LABEL + 1 (UserError when
// a label is >= --classes), normalisation from options.stats_from or STATISTICS (uint8 only).
DataFileAttributes converted_attributes(const ArrayConvertOptions& options, std::int64_t max_label,
                                        DType dtype, const PixelStatistics& statistics,
                                        const std::string& source);
// Creates the directory that will hold OUT_PATH, when it does not exist.
void create_parent_directory(const std::string& out_path);

// Creates DIR and its parents; UserError naming DIR and OPTION when that fails.
void create_directory(const std::string& dir, const std::string& option);

}  // namespace mpt::data::detail
