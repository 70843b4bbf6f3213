// detail::DataFile: one HDF5 data file of a (possibly multi-file) dataset, validated at open and
// read by runs of consecutive samples, with pread() straight into the caller's buffer when the
// bytes on disk are already what the caller wants.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.hpp"
#include "data/data.hpp"
#include "data/internal.hpp"

namespace mpt::data::detail {
namespace {

std::size_t next_prime(std::size_t n) {
  auto is_prime = [](std::size_t v) {
    if (v < 2) return false;
    for (std::size_t d = 2; d * d <= v; ++d)
      if (v % d == 0) return false;
    return true;
  };
  while (!is_prime(n)) ++n;
  return n;
}

std::string join(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text.empty() ? "(none)" : text;
}

constexpr const char* kTruncatedHint =
    "the file is truncated or damaged (an interrupted copy or download?); copy or re-create it";

}  // namespace

DataFile::DataFile(std::string path, const ReaderOptions& options)
    : path_(std::move(path)),
      description_("data file '" + path_ + "' (option " + options.option_prefix + ")"),
      samples_name_(options.samples_name.empty() ? "samples" : options.samples_name),
      labels_name_(options.labels_name.empty() ? "labels" : options.labels_name),
      allow_direct_(options.direct_reads) {
  open_and_validate(options);
}

DataFile::~DataFile() {
  if (descriptor_ >= 0) ::close(descriptor_);
  auto lock = hdf5_lock();
  memory_space_.reset();
  file_space_.reset();
  samples_dataset_.reset();
  file_.reset();
}

std::string DataFile::samples_description() const {
  return "dataset '" + samples_name_ + "' of " + description_;
}
std::string DataFile::labels_description() const {
  return "dataset '" + labels_name_ + "' of " + description_;
}

void DataFile::open_and_validate(const ReaderOptions& options) {
  namespace fs = std::filesystem;
  const std::string& file_text = description_;
  const std::string wanted =
      "; it should hold the datasets '" + samples_name_ + "' and '" + labels_name_ + "'";
  MPT_REQUIRE(fs::exists(path_),
              "data file '" + path_ + "' not found (option " + options.option_prefix + ")" + wanted,
              "run `mptrain prepare fashion-mnist --out DIR` or check the path");
  MPT_REQUIRE(!fs::is_directory(path_), file_text + " is a directory" + wanted,
              "name the .h5 file itself, e.g. DIR/train.h5");

  auto lock = hdf5_lock();
  hdf5_quiet();
  MPT_REQUIRE(H5Fis_hdf5(path_.c_str()) > 0,
              file_text + " is not an HDF5 file (or is truncated before its header)" + wanted,
              "mptrain reads HDF5 data files written by `mptrain prepare` (see "
              "docs/data-format.md)");
  // Every object header must read before the helpers below touch it: they abort the job on a
  // failure of the library, and a damaged file is the user's to fix, not a crash.
  if (const auto damaged = hdf5_probe_file(path_))
    throw_user_error(file_text + " is damaged: HDF5 cannot read " + *damaged + wanted, kTruncatedHint);
  file_.reset(H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file_.valid()) {
    // HDF5 compares the file's size with the end address its superblock records, so a file cut
    // short (`truncate -s`, an interrupted copy) fails here, before any data is read.
    const std::string reason = hdf5_last_error();
    const bool truncated = reason.find("truncated") != std::string::npos;
    throw_user_error("cannot open " + file_text + wanted + ": " + reason,
                     truncated ? kTruncatedHint
                               : "check its permissions; on Lustre or NFS set "
                                 "HDF5_USE_FILE_LOCKING=FALSE");
  }
  const hid_t root = file_.get();
  // A name the options leave empty comes from the file's own attribute, if it has one.
  if (options.samples_name.empty())
    samples_name_ = hdf5_read_string_attribute(root, "samples_dataset").value_or(samples_name_);
  if (options.labels_name.empty())
    labels_name_ = hdf5_read_string_attribute(root, "labels_dataset").value_or(labels_name_);

  if (auto format = hdf5_read_string_attribute(root, "mptrain_format")) {
    MPT_REQUIRE(*format == kDataFormat,
                file_text + " is an '" + *format + "' file, not an mptrain data file",
                "pass a data file (train.h5 / test.h5 from `mptrain prepare`)");
  }
  if (auto version = hdf5_read_int_attribute(root, "format_version")) {
    MPT_REQUIRE(*version <= kDataFormatVersion,
                file_text + " has format_version " + std::to_string(*version) +
                    ", newer than this mptrain reads (" + std::to_string(kDataFormatVersion) + ")",
                "upgrade mptrain or re-create the file with this version's `mptrain prepare`");
  }

  // The two datasets: present, of a supported type and consistent shapes.
  auto require_dataset = [&](const std::string& name, const char* option) {
    const bool found = hdf5_has_link(root, name) && [&] {
      Hdf5Handle object(H5Oopen(root, name.c_str(), H5P_DEFAULT));
      return object.valid() && H5Iget_type(object.get()) == H5I_DATASET;
    }();
    MPT_REQUIRE(found,
                file_text + " has no dataset '" + name + "'; it has: " + join(list_datasets(root)),
                std::string("name the dataset with ") + option + "=NAME");
    Hdf5Handle dataset(H5Dopen2(root, name.c_str(), H5P_DEFAULT));
    MPT_REQUIRE(dataset.valid(),
                "cannot open dataset '" + name + "' of " + file_text + ": " + hdf5_last_error(),
                kTruncatedHint);
    return dataset;
  };
  Hdf5Handle samples = require_dataset(samples_name_, "--data.samples");
  Hdf5Handle labels_dataset = require_dataset(labels_name_, "--data.labels");
  const std::string samples_text = samples_description();
  const std::string labels_text = labels_description();

  const Shape samples_shape = hdf5_dataset_shape(samples.get());
  MPT_REQUIRE(samples_shape.size() >= 2,
              samples_text + " has shape " + shape_to_string(samples_shape) +
                  " but must have at least 2 dimensions, (N, D) or (N, C, H, W)",
              "store one sample per row along the first dimension");
  num_samples_ = samples_shape[0];
  stored_sample_shape_.assign(samples_shape.begin() + 1, samples_shape.end());
  MPT_REQUIRE(num_samples_ > 0, samples_text + " holds no samples (N = 0)",
              "use a non-empty data file");
  const std::int64_t sample_elements = shape_numel(stored_sample_shape_);
  MPT_REQUIRE(sample_elements > 0,
              samples_text + " has empty samples " + shape_to_string(stored_sample_shape_),
              "every sample needs at least one element");

  Hdf5Handle samples_type(H5Dget_type(samples.get()));
  MPT_CHECK_HDF5(samples_type.get());
  {
    const H5T_class_t type_class = H5Tget_class(samples_type.get());
    const std::size_t size = H5Tget_size(samples_type.get());
    if (type_class == H5T_INTEGER && size == 1 && H5Tget_sign(samples_type.get()) == H5T_SGN_NONE) {
      sample_dtype_ = DType::u8;
      memory_type_ = H5T_NATIVE_UINT8;
      staged_sample_bytes_ = static_cast<std::size_t>(sample_elements);
    } else if (type_class == H5T_FLOAT && (size == 4 || size == 2)) {
      // HDF5 converts float16 to float32 while reading (a soft conversion), so both read as f32.
      sample_dtype_ = size == 4 ? DType::f32 : DType::f16;
      memory_type_ = H5T_NATIVE_FLOAT;
      staged_sample_bytes_ = static_cast<std::size_t>(sample_elements) * sizeof(float);
    } else {
      throw_user_error(samples_text + " has unsupported dtype " + hdf5_type_name(samples_type.get()),
                       "store samples as uint8, float32 or float16");
    }
  }

  const Shape labels_shape = hdf5_dataset_shape(labels_dataset.get());
  MPT_REQUIRE(labels_shape.size() == 1,
              labels_text + " has shape " + shape_to_string(labels_shape) +
                  " but must be one-dimensional, (N,)",
              "store one integer class index per sample");
  MPT_REQUIRE(labels_shape[0] == num_samples_,
              labels_text + " has " + std::to_string(labels_shape[0]) + " labels but '" +
                  samples_name_ + "' has " + std::to_string(num_samples_) + " samples",
              "samples and labels must have the same length N");
  {
    Hdf5Handle type(H5Dget_type(labels_dataset.get()));
    MPT_CHECK_HDF5(type.get());
    MPT_REQUIRE(H5Tget_class(type.get()) == H5T_INTEGER,
                labels_text + " has dtype " + hdf5_type_name(type.get()) + ", not an integer type",
                "store labels as int32 class indices");
  }

  // Root attributes; what they must agree with is decided by the DatasetReader.
  num_classes_attribute = hdf5_read_int_attribute(root, "num_classes");
  if (auto declared = hdf5_read_int_array_attribute(root, "sample_shape"))
    sample_shape_attribute = Shape(declared->begin(), declared->end());
  mean_attribute = hdf5_read_float_attribute(root, "mean");
  std_attribute = hdf5_read_float_attribute(root, "std");

  // All labels, once: N * 4 bytes, and every later batch's labels come from memory.
  labels.resize(static_cast<std::size_t>(num_samples_));
  MPT_REQUIRE(hdf5_read_dataset(labels_dataset.get(), H5T_NATIVE_INT32, labels.data()) >= 0,
              "cannot read " + labels_text + ": " + hdf5_last_error(), kTruncatedHint);

  // Reopen the samples with a chunk cache sized as asked. HDF5 wants the slot count to be a
  // prime well above the number of chunks that fit in the cache (its docs say 10-100x).
  Hdf5Handle create_properties(H5Dget_create_plist(samples.get()));
  MPT_CHECK_HDF5(create_properties.get());
  std::size_t chunk_bytes = staged_sample_bytes_;
  if (H5Pget_layout(create_properties.get()) == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(samples_shape.size());
    MPT_CHECK_HDF5(
        H5Pget_chunk(create_properties.get(), static_cast<int>(chunk.size()), chunk.data()));
    chunk_bytes = H5Tget_size(samples_type.get());
    for (auto extent : chunk) chunk_bytes *= extent;
  }
  const std::size_t chunks_in_cache =
      std::max<std::size_t>(1, options.chunk_cache_bytes / chunk_bytes);
  const std::size_t slots =
      next_prime(std::min<std::size_t>(std::max<std::size_t>(521, 10 * chunks_in_cache), 1u << 22));
  Hdf5Handle access_properties(H5Pcreate(H5P_DATASET_ACCESS));
  MPT_CHECK_HDF5(access_properties.get());
  MPT_CHECK_HDF5(H5Pset_chunk_cache(access_properties.get(), slots, options.chunk_cache_bytes,
                                    H5D_CHUNK_CACHE_W0_DEFAULT));
  samples.reset();
  samples_dataset_.reset(H5Dopen2(root, samples_name_.c_str(), access_properties.get()));
  MPT_CHECK_HDF5(samples_dataset_.get());
  file_space_.reset(H5Dget_space(samples_dataset_.get()));
  MPT_CHECK_HDF5(file_space_.get());
  hyperslab_start_.assign(samples_shape.size(), 0);
  hyperslab_count_.assign(samples_shape.begin(), samples_shape.end());
  memory_space_.reset(H5Screate_simple(static_cast<int>(hyperslab_count_.size()),
                                       hyperslab_count_.data(), nullptr));
  MPT_CHECK_HDF5(memory_space_.get());
  plan_direct_reads(create_properties.get(), samples_type.get());
}

void DataFile::plan_direct_reads(hid_t create_properties, hid_t file_type) {
  // Only when the bytes on disk are the staged bytes: no filter (compression), and the file
  // type equal to the memory type read into (uint8, or float32 in the host's byte order).
  if (!allow_direct_) return;
  if (H5Pget_nfilters(create_properties) != 0) return;
  if (H5Tequal(file_type, memory_type_) <= 0) return;
  {
    Hdf5Handle file_creation(H5Fget_create_plist(file_.get()));
    hsize_t userblock = 0;
    if (!file_creation.valid() || H5Pget_userblock(file_creation.get(), &userblock) < 0) return;
    userblock_bytes_ = static_cast<std::int64_t>(userblock);
  }
  const H5D_layout_t layout = H5Pget_layout(create_properties);
  if (layout == H5D_CONTIGUOUS) {
    const haddr_t offset = H5Dget_offset(samples_dataset_.get());
    if (offset == HADDR_UNDEF) return;  // never written: HDF5 supplies fill values
    contiguous_offset_ = static_cast<std::int64_t>(offset) + userblock_bytes_;
  } else if (layout == H5D_CHUNKED) {
    // Whole samples per chunk (what mptrain and h5py's chunks=(k,)+shape write): sample s then
    // lives in chunk s / k at byte (s mod k) * sample_bytes of it.
    std::vector<hsize_t> chunk(stored_sample_shape_.size() + 1);
    if (H5Pget_chunk(create_properties, static_cast<int>(chunk.size()), chunk.data()) < 0) return;
    for (std::size_t d = 1; d < chunk.size(); ++d)
      if (static_cast<std::int64_t>(chunk[d]) != stored_sample_shape_[d - 1]) return;
    samples_per_chunk_ = static_cast<std::int64_t>(chunk[0]);
    if (samples_per_chunk_ <= 0) return;
    chunk_offsets_.assign(
        static_cast<std::size_t>((num_samples_ + samples_per_chunk_ - 1) / samples_per_chunk_), -2);
  } else {
    return;
  }
  descriptor_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  direct_ = descriptor_ >= 0;
}

std::int64_t DataFile::chunk_address(std::int64_t chunk) {
  std::int64_t& offset = chunk_offsets_[static_cast<std::size_t>(chunk)];
  if (offset != -2) return offset;
  std::vector<hsize_t> coordinates(stored_sample_shape_.size() + 1, 0);
  coordinates[0] = static_cast<hsize_t>(chunk * samples_per_chunk_);
  unsigned filter_mask = 0;
  haddr_t address = HADDR_UNDEF;
  hsize_t size = 0;
  auto lock = hdf5_lock();
  if (H5Dget_chunk_info_by_coord(samples_dataset_.get(), coordinates.data(), &filter_mask,
                                 &address, &size) < 0 ||
      address == HADDR_UNDEF) {
    hdf5_last_error();  // clears the stack
    offset = -1;
  } else {
    offset = static_cast<std::int64_t>(address) + userblock_bytes_;
  }
  return offset;
}

void DataFile::read(std::int64_t begin, std::int64_t count, std::byte* out) {
  if (begin < 0 || count < 0 || begin + count > num_samples_)
    abort_job("DataFile::read: samples [" + std::to_string(begin) + ", " +
              std::to_string(begin + count) + ") outside [0, " + std::to_string(num_samples_) +
              ") of '" + path_ + "'");
  if (count == 0) return;
  if (direct_ && read_direct(begin, count, out)) return;
  read_hdf5(begin, count, out);
}

bool DataFile::read_direct(std::int64_t begin, std::int64_t count, std::byte* out) {
  const auto sample_bytes = static_cast<std::int64_t>(staged_sample_bytes_);
  // Byte ranges of the file to copy, merged while they are adjacent on disk.
  std::int64_t pending_offset = -1, pending_bytes = 0;
  std::byte* pending_out = out;
  auto flush = [&]() {
    std::int64_t done = 0;
    while (done < pending_bytes) {
      const ssize_t got = ::pread(descriptor_, pending_out + done,
                                  static_cast<std::size_t>(pending_bytes - done),
                                  static_cast<off_t>(pending_offset + done));
      if (got < 0 && errno == EINTR) continue;
      MPT_REQUIRE(got > 0,
                  "cannot read " + samples_description() + " at byte " +
                      std::to_string(pending_offset + done) + ": " +
                      (got < 0 ? std::string(std::strerror(errno))
                               : std::string("the file ends there (truncated after it was opened?)")),
                  kTruncatedHint);
      done += got;
    }
  };
  if (contiguous_offset_ >= 0) {
    pending_offset = contiguous_offset_ + begin * sample_bytes;
    pending_bytes = count * sample_bytes;
    flush();
    direct_reads_ += count;
    return true;
  }
  // Chunked: look every chunk up first, so that an unallocated one sends the whole run to HDF5
  // before anything was read.
  const std::int64_t first_chunk = begin / samples_per_chunk_;
  const std::int64_t last_chunk = (begin + count - 1) / samples_per_chunk_;
  for (std::int64_t c = first_chunk; c <= last_chunk; ++c)
    if (chunk_address(c) < 0) return false;
  std::byte* cursor = out;
  for (std::int64_t c = first_chunk; c <= last_chunk; ++c) {
    const std::int64_t chunk_begin = c * samples_per_chunk_;
    const std::int64_t from = std::max(begin, chunk_begin);
    const std::int64_t to = std::min(begin + count, chunk_begin + samples_per_chunk_);
    const std::int64_t offset = chunk_address(c) + (from - chunk_begin) * sample_bytes;
    const std::int64_t bytes = (to - from) * sample_bytes;
    if (pending_offset >= 0 && pending_offset + pending_bytes == offset) {
      pending_bytes += bytes;
    } else {
      if (pending_offset >= 0) flush();
      pending_offset = offset;
      pending_bytes = bytes;
      pending_out = cursor;
    }
    cursor += bytes;
  }
  flush();
  direct_reads_ += count;
  return true;
}

void DataFile::read_hdf5(std::int64_t begin, std::int64_t count, std::byte* out) {
  // A run's memory space has the same shape as its file block, which keeps HDF5 on its fast
  // same-shape path.
  auto lock = hdf5_lock();
  hyperslab_start_[0] = static_cast<hsize_t>(begin);
  hyperslab_count_[0] = static_cast<hsize_t>(count);
  MPT_CHECK_HDF5(H5Sselect_hyperslab(file_space_.get(), H5S_SELECT_SET, hyperslab_start_.data(),
                                     nullptr, hyperslab_count_.data(), nullptr));
  MPT_CHECK_HDF5(H5Sset_extent_simple(memory_space_.get(),
                                      static_cast<int>(hyperslab_count_.size()),
                                      hyperslab_count_.data(), nullptr));
  MPT_REQUIRE(H5Dread(samples_dataset_.get(), memory_type_, memory_space_.get(), file_space_.get(),
                      H5P_DEFAULT, out) >= 0,
              "cannot read samples " + std::to_string(begin) + ".." +
                  std::to_string(begin + count - 1) + " of " + samples_description() + ": " +
                  hdf5_last_error(),
              kTruncatedHint);
  hdf5_reads_ += count;
}

}  // namespace mpt::data::detail
