// The shared data-file writer (layout, chunking, attributes of docs/data-format.md) and the
// Fashion-MNIST preparation that drives convert_idx for the train and test splits.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <system_error>

#include "core/error.hpp"
#include "data/data.hpp"
#include "data/internal.hpp"

namespace mpt::data {
namespace detail {

namespace fs = std::filesystem;

Hdf5Handle float16_type() {
  auto lock = hdf5_lock();
  Hdf5Handle type(H5Tcopy(H5T_IEEE_F32LE));
  MPT_CHECK_HDF5(type.get());
  MPT_CHECK_HDF5(H5Tset_fields(type.get(), 15, 10, 5, 0, 10));
  MPT_CHECK_HDF5(H5Tset_size(type.get(), 2));
  MPT_CHECK_HDF5(H5Tset_ebias(type.get(), 15));
  return type;
}

hid_t memory_type_of(DType dtype, hid_t float16) {
  switch (dtype) {
    case DType::u8: return H5T_NATIVE_UINT8;
    case DType::f32: return H5T_NATIVE_FLOAT;
    case DType::f16: return float16;
    default: abort_job(std::string("memory_type_of: no data-file dtype ") + dtype_name(dtype));
  }
}

DataFileWriter::DataFileWriter(std::string path, std::int64_t num_samples, Shape sample_shape,
                               DType sample_dtype)
    : path_(std::move(path)),
      temporary_path_(path_ + ".tmp"),
      num_samples_(num_samples),
      sample_shape_(std::move(sample_shape)),
      sample_dtype_(sample_dtype),
      sample_elements_(shape_numel(sample_shape_)),
      float16_(float16_type()) {
  if (num_samples_ <= 0 || sample_shape_.empty() || sample_elements_ <= 0)
    abort_job("DataFileWriter: empty data set or sample shape for '" + path_ + "'");
  if (sample_dtype_ != DType::u8 && sample_dtype_ != DType::f32 && sample_dtype_ != DType::f16)
    abort_job("DataFileWriter: unsupported sample dtype for '" + path_ + "'");
  // A chunk holds one sample at least, and HDF5 chunks hold fewer than 2^32 elements and 4 GiB.
  constexpr std::int64_t kChunkLimit = std::int64_t{1} << 32;
  MPT_REQUIRE(sample_elements_ < kChunkLimit / static_cast<std::int64_t>(dtype_size(sample_dtype_)),
              "data file '" + path_ + "': samples of shape " + shape_to_string(sample_shape_) +
                  " are too large for one HDF5 chunk (4 GiB)",
              "check the input's declared shape, or store smaller samples (--shape)");
  auto lock = hdf5_lock();
  hdf5_quiet();
  // The 1.8 format: all metadata carries checksums, so a damaged file fails HDF5's checks at open
  // rather than reaching the decoders that crash on it (docs/reliability.md, "Fuzzing").
  Hdf5Handle access(H5Pcreate(H5P_FILE_ACCESS));
  MPT_CHECK_HDF5(access.get());
  MPT_CHECK_HDF5(H5Pset_libver_bounds(access.get(), H5F_LIBVER_V18, H5F_LIBVER_V18));
  const hid_t file = H5Fcreate(temporary_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get());
  MPT_REQUIRE(file >= 0, "cannot create data file '" + temporary_path_ + "': " + hdf5_last_error(),
              "check that the output directory is writable and has free space");
  file_.reset(file);

  // Chunks hold whole samples, as many as fit in ~16 KiB, so a random sample costs one chunk.
  const auto sample_bytes = static_cast<std::size_t>(sample_elements_) * dtype_size(sample_dtype_);
  const std::int64_t per_chunk = std::clamp<std::int64_t>(
      static_cast<std::int64_t>(kChunkTargetBytes / sample_bytes), 1, num_samples_);
  std::vector<hsize_t> dims{static_cast<hsize_t>(num_samples_)};
  std::vector<hsize_t> chunk{static_cast<hsize_t>(per_chunk)};
  for (auto extent : sample_shape_) {
    dims.push_back(static_cast<hsize_t>(extent));
    chunk.push_back(static_cast<hsize_t>(extent));
  }
  Hdf5Handle samples_space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  MPT_CHECK_HDF5(samples_space.get());
  Hdf5Handle samples_properties(H5Pcreate(H5P_DATASET_CREATE));
  MPT_CHECK_HDF5(samples_properties.get());
  MPT_CHECK_HDF5(
      H5Pset_chunk(samples_properties.get(), static_cast<int>(chunk.size()), chunk.data()));
  const hid_t file_type = sample_dtype_ == DType::u8    ? H5T_STD_U8LE
                          : sample_dtype_ == DType::f32 ? H5T_IEEE_F32LE
                                                        : float16_.get();
  samples_.reset(H5Dcreate2(file_.get(), "samples", file_type, samples_space.get(), H5P_DEFAULT,
                            samples_properties.get(), H5P_DEFAULT));
  MPT_CHECK_HDF5(samples_.get());

  const hsize_t label_dims = static_cast<hsize_t>(num_samples_);
  const hsize_t label_chunk = std::min<hsize_t>(kChunkTargetBytes / 4, label_dims);
  Hdf5Handle labels_space(H5Screate_simple(1, &label_dims, nullptr));
  MPT_CHECK_HDF5(labels_space.get());
  Hdf5Handle labels_properties(H5Pcreate(H5P_DATASET_CREATE));
  MPT_CHECK_HDF5(labels_properties.get());
  MPT_CHECK_HDF5(H5Pset_chunk(labels_properties.get(), 1, &label_chunk));
  labels_.reset(H5Dcreate2(file_.get(), "labels", H5T_STD_I32LE, labels_space.get(), H5P_DEFAULT,
                           labels_properties.get(), H5P_DEFAULT));
  MPT_CHECK_HDF5(labels_.get());
}

DataFileWriter::~DataFileWriter() {
  if (!file_.valid()) return;
  samples_.reset();
  labels_.reset();
  file_.reset();
  std::error_code ignored;
  fs::remove(temporary_path_, ignored);
}

void DataFileWriter::append(const void* samples, DType memory_dtype, const std::int32_t* labels,
                            std::int64_t count) {
  if (count <= 0) return;
  if (written_ + count > num_samples_)
    abort_job("DataFileWriter: more samples appended than declared for '" + path_ + "'");
  auto lock = hdf5_lock();
  const int rank = static_cast<int>(sample_shape_.size()) + 1;
  std::vector<hsize_t> start(static_cast<std::size_t>(rank), 0);
  std::vector<hsize_t> block{static_cast<hsize_t>(count)};
  for (auto extent : sample_shape_) block.push_back(static_cast<hsize_t>(extent));
  start[0] = static_cast<hsize_t>(written_);

  Hdf5Handle file_space(H5Dget_space(samples_.get()));
  MPT_CHECK_HDF5(file_space.get());
  MPT_CHECK_HDF5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                     block.data(), nullptr));
  Hdf5Handle memory_space(H5Screate_simple(rank, block.data(), nullptr));
  MPT_CHECK_HDF5(memory_space.get());
  MPT_CHECK_HDF5(H5Dwrite(samples_.get(), memory_type_of(memory_dtype, float16_.get()),
                          memory_space.get(), file_space.get(), H5P_DEFAULT, samples));

  Hdf5Handle label_file_space(H5Dget_space(labels_.get()));
  MPT_CHECK_HDF5(label_file_space.get());
  MPT_CHECK_HDF5(H5Sselect_hyperslab(label_file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                     block.data(), nullptr));
  Hdf5Handle label_memory_space(H5Screate_simple(1, block.data(), nullptr));
  MPT_CHECK_HDF5(label_memory_space.get());
  MPT_CHECK_HDF5(H5Dwrite(labels_.get(), H5T_NATIVE_INT32, label_memory_space.get(),
                          label_file_space.get(), H5P_DEFAULT, labels));
  written_ += count;
}

void DataFileWriter::finish(const DataFileAttributes& attributes) {
  if (written_ != num_samples_)
    abort_job("DataFileWriter: '" + path_ + "' finished with " + std::to_string(written_) + " of " +
              std::to_string(num_samples_) + " samples");
  auto lock = hdf5_lock();
  const hid_t root = file_.get();
  hdf5_write_attribute(root, "mptrain_format", kDataFormat);
  hdf5_write_attribute(root, "format_version", kDataFormatVersion);
  hdf5_write_attribute(root, "samples_dataset", "samples");
  hdf5_write_attribute(root, "labels_dataset", "labels");
  hdf5_write_attribute(root, "num_classes", static_cast<std::int32_t>(attributes.num_classes));
  hdf5_write_attribute(root, "num_samples", num_samples_);
  hdf5_write_attribute(root, "sample_shape", std::vector<std::int64_t>(sample_shape_));
  hdf5_write_attribute(root, "mean", attributes.mean);
  hdf5_write_attribute(root, "std", attributes.std);
  hdf5_write_attribute(root, "source", attributes.source);
  if (!attributes.class_names.empty())
    hdf5_write_attribute(root, "class_names", attributes.class_names);
  hdf5_write_attribute(samples_.get(), "description",
                       sample_dtype_ == DType::u8
                           ? "uint8 pixels, one sample per row; normalise as (x/255 - mean)/std "
                             "with the root attributes mean and std"
                           : "float samples, one per row, used as they are (mean and std are not "
                             "applied)");
  hdf5_write_attribute(labels_.get(), "description",
                       "int32 class index of each sample, in [0, num_classes)");

  samples_.reset();
  labels_.reset();
  MPT_CHECK_HDF5(H5Fclose(file_.release()));
  std::error_code error;
  fs::rename(temporary_path_, path_, error);
  MPT_REQUIRE(!error,
              "cannot rename '" + temporary_path_ + "' to '" + path_ + "': " + error.message(),
              "check that the output directory is writable");
}

void PixelStatistics::add(const std::uint8_t* pixels, std::size_t count) {
  std::uint64_t sum = 0, sum_of_squares = 0;
  for (std::size_t i = 0; i < count; ++i) {
    sum += pixels[i];
    sum_of_squares += static_cast<std::uint64_t>(pixels[i]) * pixels[i];
  }
  count_ += count;
  sum_ += sum;
  sum_of_squares_ += sum_of_squares;
}

float PixelStatistics::mean() const {
  if (count_ == 0) return 0.0f;
  return static_cast<float>(static_cast<double>(sum_) / static_cast<double>(count_) / 255.0);
}

float PixelStatistics::std() const {
  if (count_ == 0) return 1.0f;
  const double n = static_cast<double>(count_);
  const double mean = static_cast<double>(sum_) / n;
  const double variance = static_cast<double>(sum_of_squares_) / n - mean * mean;
  const double deviation = std::sqrt(std::max(variance, 0.0)) / 255.0;
  // A constant image set would divide by zero when normalising; 1 leaves it merely centred.
  return deviation > 0 ? static_cast<float>(deviation) : 1.0f;
}

Shape converted_sample_shape(const Shape& stored, const Shape& requested,
                             const std::string& what) {
  if (requested.empty()) return stored;
  MPT_REQUIRE(shape_numel(requested) == shape_numel(stored),
              "--shape " + shape_to_string(requested) + " has " +
                  std::to_string(shape_numel(requested)) + " elements but the samples of " + what +
                  " have " + std::to_string(shape_numel(stored)) + " (shape " +
                  shape_to_string(stored) + ")",
              "--shape may only regroup a sample's elements, e.g. 784 as 1,28,28");
  return requested;
}

DataFileAttributes converted_attributes(const ArrayConvertOptions& options, std::int64_t max_label,
                                        DType dtype, const PixelStatistics& statistics,
                                        const std::string& source) {
  DataFileAttributes attributes;
  attributes.source = source;
  const std::int64_t classes = options.num_classes > 0 ? options.num_classes : max_label + 1;
  MPT_REQUIRE(max_label < classes,
              source + ": label " + std::to_string(max_label) + " is outside [0, " +
                  std::to_string(classes) + ") given by --classes",
              "raise --classes or leave it out (then it is the largest label + 1)");
  MPT_REQUIRE(classes >= 1 && classes <= (1 << 24),
              source + ": " + std::to_string(classes) + " classes", "labels must be class indices");
  attributes.num_classes = static_cast<int>(classes);
  if (dtype != DType::u8) return attributes;  // float samples are used as they are
  if (options.stats_from.empty()) {
    attributes.mean = statistics.mean();
    attributes.std = statistics.std();
    return attributes;
  }
  auto lock = hdf5_lock();
  hdf5_quiet();
  MPT_REQUIRE(fs::is_regular_file(options.stats_from) && H5Fis_hdf5(options.stats_from.c_str()) > 0,
              "--stats-from '" + options.stats_from + "' is not an HDF5 data file",
              "name the training set's .h5 file, whose mean and std the new file should reuse");
  if (const auto damaged = hdf5_probe_file(options.stats_from))
    throw_user_error("--stats-from '" + options.stats_from + "' is damaged: HDF5 cannot read " +
                         *damaged,
                     "name an intact data file, or prepare the training set again");
  Hdf5Handle file(H5Fopen(options.stats_from.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  MPT_REQUIRE(file.valid(), "cannot open --stats-from '" + options.stats_from + "': " +
                                hdf5_last_error(),
              "name a readable data file");
  const auto mean = hdf5_read_float_attribute(file.get(), "mean");
  const auto std = hdf5_read_float_attribute(file.get(), "std");
  MPT_REQUIRE(mean && std, "--stats-from '" + options.stats_from + "' has no mean/std attributes",
              "name a uint8 data file written by `mptrain prepare`");
  attributes.mean = static_cast<float>(*mean);
  attributes.std = static_cast<float>(*std);
  return attributes;
}

void create_parent_directory(const std::string& out_path) {
  const fs::path parent = fs::path(out_path).parent_path();
  if (!parent.empty()) create_directory(parent.string(), "--out");
}

void create_directory(const std::string& dir, const std::string& option) {
  std::error_code error;
  fs::create_directories(dir, error);
  MPT_REQUIRE(!error && fs::is_directory(dir),
              "cannot create directory '" + dir + "' (option " + option + ")" +
                  (error ? ": " + error.message() : ""),
              "choose a writable location");
}

}  // namespace detail

namespace {

// Finds NAME.gz or NAME in DIR.
std::string find_idx_file(const std::string& dir, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path compressed = fs::path(dir) / (name + ".gz");
  const fs::path raw = fs::path(dir) / name;
  if (fs::exists(compressed)) return compressed.string();
  if (fs::exists(raw)) return raw.string();
  throw_user_error(
      "Fashion-MNIST file '" + compressed.string() + "' not found (nor '" + raw.string() + "')",
      "install Debian's dataset-fashion-mnist or pass --source DIR");
}

}  // namespace

void prepare_fashion_mnist(const std::string& source_dir, const std::string& out_dir) {
  namespace fs = std::filesystem;
  const std::string train_images = find_idx_file(source_dir, "train-images-idx3-ubyte");
  const std::string train_labels = find_idx_file(source_dir, "train-labels-idx1-ubyte");
  const std::string test_images = find_idx_file(source_dir, "t10k-images-idx3-ubyte");
  const std::string test_labels = find_idx_file(source_dir, "t10k-labels-idx1-ubyte");
  detail::create_directory(out_dir, "--out");

  IdxConvertOptions options;
  options.num_classes = 10;
  options.class_names =
      "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot";
  options.source = "Fashion-MNIST (Xiao, Rasul and Vollgraf 2017), converted from " +
                   fs::path(train_images).parent_path().string();
  const std::string train_path = (fs::path(out_dir) / "train.h5").string();
  convert_idx(train_images, train_labels, train_path, options);

  // The test set is normalised with the training set's statistics, as at training time.
  {
    auto lock = hdf5_lock();
    Hdf5Handle file(H5Fopen(train_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    MPT_CHECK_HDF5(file.get());
    options.mean = static_cast<float>(hdf5_read_float_attribute(file.get(), "mean").value());
    options.std = static_cast<float>(hdf5_read_float_attribute(file.get(), "std").value());
  }
  convert_idx(test_images, test_labels, (fs::path(out_dir) / "test.h5").string(), options);
}

}  // namespace mpt::data
