// Checkpoint writing and loading. The write order (tmp file, flush, close, fsync, rename, fsync
// directory, then 'latest' the same way) means a kill at any point leaves either the previous
// checkpoint or the new one complete, never a torn file under a real name. Every dataset carries
// a checksum of its bytes (CRC-32C from format 2, zlib's CRC-32 in format 1), verified on load.
#include "ckpt/ckpt.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "core/build_info.hpp"
#include "core/crc32c.hpp"
#include "core/error.hpp"
#include "core/hdf5.hpp"
#include "core/sha256.hpp"

namespace mpt::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "mptrain-checkpoint";
constexpr std::int32_t kFormatVersion = 2;  // 2: CRC-32C checksums and the training state
constexpr const char* kWeightsGroup = "weights";
constexpr const char* kBuffersGroup = "buffers";
constexpr const char* kOptimizerGroup = "optimizer";
constexpr const char* kScalerGroup = "loss_scaler";
constexpr const char* kCursorGroup = "data_cursor";
constexpr const char* kRngGroup = "rng";
constexpr const char* kLatestName = "latest";

constexpr const char* kDamagedHint =
    "the checkpoint is truncated or damaged; load an older one (ckpt-STEP.h5 in the same "
    "directory)";
constexpr const char* kWriteHint =
    "the file system may be full or failing (check `df` and the quota); free space or choose "
    "another --checkpoint.dir. The previous checkpoints are untouched";
// The same for the other files written atomically (export, predictions).
constexpr const char* kOtherWriteHint =
    "the file system may be full or failing (check `df` and the quota); free space or write the "
    "file elsewhere";

// A write of more than this is split into pieces (of whole rows), and hdf5_lock() released
// between them, so that the prefetcher's reads are not held up for a whole large tensor by an
// async checkpoint. Pieces of a few MB are also faster: a single 100 MB pwrite() ran at a third
// of the speed of 8 MB ones into the page cache on the test VM.
constexpr std::size_t kWritePieceBytes = std::size_t{8} << 20;

// The documented checksum is over little-endian float32 bytes; on such hosts that is memory order.
static_assert(std::endian::native == std::endian::little, "checkpoint CRC assumes little-endian");

std::uint32_t zlib_crc32_of(const void* data, std::size_t bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* cursor = static_cast<const Bytef*>(data);
  // zlib takes uInt lengths; feed large tensors in pieces.
  while (bytes > 0) {
    const auto piece = static_cast<uInt>(std::min<std::size_t>(bytes, 1u << 30));
    crc = crc32(crc, cursor, piece);
    cursor += piece;
    bytes -= piece;
  }
  return static_cast<std::uint32_t>(crc);
}

std::uint32_t crc32c_of(const void* data, std::size_t bytes) { return crc32c(data, bytes); }

// The per-dataset checksum of a format version: its attribute and its function.
struct Checksum {
  const char* attribute;
  const char* label;  // for messages
  std::uint32_t (*of)(const void*, std::size_t);
};

Checksum checksum_of_version(std::int64_t version) {
  if (version <= 1) return {"crc32", "CRC32", &zlib_crc32_of};
  return {"crc32c", "CRC32C", &crc32c_of};
}

std::string hex32(std::uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof(text), "0x%08x", value);
  return text;
}

// Why a write failed, in a few words: the system's message when HDF5 quotes one ("File too
// large", "No space left on device"), else HDF5's innermost message.
std::string write_failure_reason() {
  const std::string message = hdf5_last_error();
  const std::string marker = "error message = '";
  const std::size_t begin = message.find(marker);
  if (begin != std::string::npos) {
    const std::size_t end = message.find('\'', begin + marker.size());
    if (end != std::string::npos)
      return message.substr(begin + marker.size(), end - begin - marker.size());
  }
  return message;
}

void fsync_path(const std::string& path, bool directory, const char* failure_hint) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  MPT_REQUIRE(fd >= 0, "cannot open '" + path + "' to fsync it: " + std::strerror(errno),
              "check that the checkpoint directory is writable");
  const int status = ::fsync(fd);
  const int saved_errno = errno;
  ::close(fd);
  MPT_REQUIRE(status == 0, "fsync of '" + path + "' failed: " + std::strerror(saved_errno),
              failure_hint);
}

void rename_durably(const std::string& from, const std::string& to, const std::string& dir,
                    const char* failure_hint) {
  std::error_code error;
  fs::rename(from, to, error);
  MPT_REQUIRE(!error, "cannot rename '" + from + "' to '" + to + "': " + error.message(),
              "check that the checkpoint directory is writable");
  fsync_path(dir, /*directory=*/true, failure_hint);
}

std::string parent_dir(const std::string& path) {
  std::string dir = fs::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

// Closes FILE after a failed write. HDF5 1.10 cannot close a file whose flush fails: H5Fclose
// then frees it but keeps its id, and the library crashes on that id when it shuts down (at
// MPI_Finalize). So HDF5's descriptor is first pointed at an empty in-memory file, where the
// writes of the close succeed and go nowhere; the .tmp on disk is deleted by the caller. A
// file-size limit (ulimit -f) applies to that file too, so its soft limit is lifted to the hard
// one for the moment of the close.
void close_abandoned_file(Hdf5Handle& file) {
  auto lock = hdf5_lock();
  if (!file.valid()) return;
  Hdf5Handle access(H5Fget_access_plist(file.get()));
  void* handle = nullptr;
  if (access.valid() && H5Fget_vfd_handle(file.get(), access.get(), &handle) >= 0 && handle) {
    const int sink = ::memfd_create("mptrain-abandoned-write", 0);
    if (sink >= 0) {
      ::dup2(sink, *static_cast<int*>(handle));  // the sec2 driver's descriptor
      ::close(sink);
    }
  }
  rlimit size_limit{};
  bool lifted = false;
  if (::getrlimit(RLIMIT_FSIZE, &size_limit) == 0 && size_limit.rlim_cur != size_limit.rlim_max) {
    const rlimit hard{size_limit.rlim_max, size_limit.rlim_max};
    lifted = ::setrlimit(RLIMIT_FSIZE, &hard) == 0;
  }
  H5Fclose(file.release());  // nothing more can be done if even this fails
  if (lifted) ::setrlimit(RLIMIT_FSIZE, &size_limit);
  hdf5_last_error();  // clears the stack
}

// Claims the space HDF5's flush and close will write into, past the file's end of allocation plus
// kFlushSlack (the flush allocates a little more: free-space and superblock-extension messages,
// about 1 KiB in a checkpoint of ours). Blocks are reserved without changing the file's size
// (fallocate KEEP_SIZE: HDF5's driver tracks the size itself), and a file-size limit (ulimit -f),
// which such a reservation does not meet, is checked against. Returns 0, or the errno of the
// refusal; a file system without fallocate is left to the flush.
constexpr haddr_t kFlushSlack = 64 << 10;
int reserve_flush_space(hid_t file) {
  auto lock = hdf5_lock();
  haddr_t end = 0;
  Hdf5Handle access(H5Fget_access_plist(file));
  void* handle = nullptr;
  if (H5Fget_eoa(file, &end) < 0 || !access.valid() ||
      H5Fget_vfd_handle(file, access.get(), &handle) < 0 || handle == nullptr) {
    hdf5_last_error();  // clears the stack
    return 0;           // not the sec2 driver: leave it to the flush
  }
  end += kFlushSlack;
  rlimit size_limit{};
  if (::getrlimit(RLIMIT_FSIZE, &size_limit) == 0 && size_limit.rlim_cur != RLIM_INFINITY &&
      end > size_limit.rlim_cur)
    return EFBIG;
  const int descriptor = *static_cast<int*>(handle);
  if (::fallocate(descriptor, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(end)) == 0) return 0;
  return errno == EOPNOTSUPP ? 0 : errno;
}

// How write_atomically() runs FILL.
enum class FillMode {
  // FILL runs under hdf5_lock() (export and prediction files: small, written by the main thread).
  kLocked,
  // FILL takes hdf5_lock() itself around each group of HDF5 calls (checkpoints, which a
  // background thread may write while the prefetcher reads). The file uses HDF5's 1.8 format,
  // whose object headers carry HDF5's own checksums, so that flipped bits in the attributes
  // (the training state) are detected on open as the datasets' are by their crc32c.
  kUnlockedChecksummedMetadata,
};

// Creates PATH.tmp, lets FILL write it, then flushes, closes, fsyncs and renames it. Any failure
// removes PATH.tmp and rethrows.
void write_atomically(const std::string& path, const std::string& what,
                      const std::function<void(hid_t root)>& fill, FillMode mode) {
  const std::string temporary_path = path + ".tmp";
  const bool hold_lock_throughout = mode == FillMode::kLocked;
  // A .tmp left by a killed write is debris; were it a link, H5Fcreate would write through it.
  std::error_code stale;
  fs::remove(temporary_path, stale);
  const char* failure_hint = hold_lock_throughout ? kOtherWriteHint : kWriteHint;  // see FillMode
  try {
    {
      auto lock = hdf5_lock();
      hdf5_quiet();
      Hdf5Handle access(H5Pcreate(H5P_FILE_ACCESS));
      MPT_CHECK_HDF5(access.get());
      // The 1.8 format for every file written here (checkpoints, exports, predictions): all its
      // metadata carries checksums, so damage fails HDF5's checks rather than reaching the
      // decoders that crash on it (docs/reliability.md, "Fuzzing").
      MPT_CHECK_HDF5(H5Pset_libver_bounds(access.get(), H5F_LIBVER_V18, H5F_LIBVER_V18));
      Hdf5Handle file(H5Fcreate(temporary_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get()));
      MPT_REQUIRE(file.valid(),
                  "cannot create " + what + " '" + temporary_path + "': " + write_failure_reason(),
                  "check that the directory exists, is writable and has free space");
      try {
        if (!hold_lock_throughout) lock.unlock();
        fill(file.get());
        if (!lock.owns_lock()) lock.lock();
        // HDF5 1.10 cannot survive a flush or close that fails half-way (see
        // close_abandoned_file), so the space its metadata still needs is claimed first, where a
        // refusal (a full disk, a quota, a file-size limit) is a failed write like any other.
        const int reserve_error = reserve_flush_space(file.get());
        MPT_REQUIRE(reserve_error == 0,
                    "cannot write " + what + " '" + temporary_path + "': " +
                        std::strerror(reserve_error),
                    failure_hint);
        // A full disk often shows only here, when HDF5 writes its metadata and sieve buffer.
        MPT_REQUIRE(H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0,
                    "cannot write " + what + " '" + temporary_path + "': " + write_failure_reason(),
                    failure_hint);
      } catch (...) {
        close_abandoned_file(file);
        throw;
      }
      // Flushed and full length: what the close still writes lies inside the file.
      MPT_REQUIRE(H5Fclose(file.release()) >= 0,
                  "cannot write " + what + " '" + temporary_path + "': " + write_failure_reason(),
                  failure_hint);
    }
    fsync_path(temporary_path, /*directory=*/false, failure_hint);
    rename_durably(temporary_path, path, parent_dir(path), failure_hint);
  } catch (...) {
    // The handle's destructor has closed the file (quietly) by now; what is left is debris.
    std::error_code ignored;
    fs::remove(temporary_path, ignored);
    throw;
  }
}

// Scalar attributes of widths the core helpers do not write (float64, uint64).
void write_scalar_attribute(hid_t object, const char* name, hid_t file_type, hid_t memory_type,
                            const void* value) {
  auto lock = hdf5_lock();
  Hdf5Handle space(H5Screate(H5S_SCALAR));
  MPT_CHECK_HDF5(space.get());
  Hdf5Handle attribute(H5Acreate2(object, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  MPT_CHECK_HDF5(attribute.get());
  MPT_CHECK_HDF5(H5Awrite(attribute.get(), memory_type, value));
}
void write_double_attribute(hid_t object, const char* name, double value) {
  write_scalar_attribute(object, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}
void write_uint64_attribute(hid_t object, const char* name, std::uint64_t value) {
  write_scalar_attribute(object, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}

std::optional<std::uint64_t> read_uint64_attribute(hid_t object, const char* name) {
  auto lock = hdf5_lock();
  if (!hdf5_has_attribute(object, name)) return std::nullopt;
  Hdf5Handle attribute(H5Aopen(object, name, H5P_DEFAULT));
  Hdf5Handle type(attribute.valid() ? H5Aget_type(attribute.get()) : H5I_INVALID_HID);
  Hdf5Handle space(attribute.valid() ? H5Aget_space(attribute.get()) : H5I_INVALID_HID);
  if (!type.valid() || !space.valid() || H5Tget_class(type.get()) != H5T_INTEGER ||
      H5Sget_simple_extent_npoints(space.get()) != 1)
    return std::nullopt;
  std::uint64_t value = 0;
  if (H5Aread(attribute.get(), H5T_NATIVE_UINT64, &value) < 0) return std::nullopt;
  return value;
}

// Writes TENSOR as LOCATION/<name> (float32, contiguous, intermediate groups created) with the
// crc32c attribute of its bytes. Takes hdf5_lock() per piece of data, not for the whole tensor.
void write_tensor(hid_t location, const std::string& group_name, const NamedTensor& tensor,
                  const std::string& file_path) {
  const std::string dataset_path = group_name + "/" + tensor.name;
  // Outside the lock: the checksum is pure CPU work.
  const std::uint32_t checksum = crc32c(tensor.value.raw(), tensor.value.size_bytes());
  auto fail = [&](const char* doing) {
    throw_user_error("cannot " + std::string(doing) + " '/" + dataset_path + "' in checkpoint '" +
                         file_path + "': " + write_failure_reason(),
                     kWriteHint);
  };
  const Shape& shape = tensor.value.shape();
  const std::vector<hsize_t> dims(shape.begin(), shape.end());
  Hdf5Handle dataset, file_space;
  {
    auto lock = hdf5_lock();
    file_space.reset(shape.empty()
                         ? H5Screate(H5S_SCALAR)
                         : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
    MPT_CHECK_HDF5(file_space.get());
    Hdf5Handle link_properties(H5Pcreate(H5P_LINK_CREATE));
    MPT_CHECK_HDF5(link_properties.get());
    MPT_CHECK_HDF5(H5Pset_create_intermediate_group(link_properties.get(), 1));
    Hdf5Handle create_properties(H5Pcreate(H5P_DATASET_CREATE));
    MPT_CHECK_HDF5(create_properties.get());
    // Every element is written next; a fill would only write the file twice.
    MPT_CHECK_HDF5(H5Pset_fill_time(create_properties.get(), H5D_FILL_TIME_NEVER));
    dataset.reset(H5Dcreate2(location, dataset_path.c_str(), H5T_IEEE_F32LE, file_space.get(),
                             link_properties.get(), create_properties.get(), H5P_DEFAULT));
    if (!dataset.valid()) fail("create");
  }
  const std::int64_t numel = tensor.value.numel();
  if (numel > 0) {
    // Rows of the first dimension per piece (the whole tensor for a scalar or a small one).
    const std::int64_t rows = shape.empty() ? 1 : shape[0];
    const std::size_t row_bytes = tensor.value.size_bytes() / static_cast<std::size_t>(rows);
    const std::int64_t rows_per_piece =
        std::max<std::int64_t>(1, static_cast<std::int64_t>(kWritePieceBytes / row_bytes));
    for (std::int64_t row = 0; row < rows; row += rows_per_piece) {
      const std::int64_t count = std::min(rows_per_piece, rows - row);
      const auto* data =
          static_cast<const char*>(tensor.value.raw()) + static_cast<std::size_t>(row) * row_bytes;
      auto lock = hdf5_lock();
      if (count == rows) {
        if (H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
          fail("write");
        continue;
      }
      std::vector<hsize_t> start(dims.size(), 0), extent = dims;
      start[0] = static_cast<hsize_t>(row);
      extent[0] = static_cast<hsize_t>(count);
      MPT_CHECK_HDF5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr,
                                         extent.data(), nullptr));
      Hdf5Handle memory_space(
          H5Screate_simple(static_cast<int>(extent.size()), extent.data(), nullptr));
      MPT_CHECK_HDF5(memory_space.get());
      if (H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, memory_space.get(), file_space.get(),
                   H5P_DEFAULT, data) < 0)
        fail("write");
    }
  }
  auto lock = hdf5_lock();
  hdf5_write_attribute(dataset.get(), "crc32c", checksum);
}

// Writes TENSORS under ROOT/GROUP_NAME, and their names, in order, as the attribute
// NAMES_ATTRIBUTE of NAMES_OWNER (the root, or the group itself).
void write_tensor_group(hid_t root, const char* group_name, hid_t names_owner,
                        const char* names_attribute, const std::vector<NamedTensor>& tensors,
                        const std::string& file_path, int pause_ms) {
  {
    auto lock = hdf5_lock();
    std::vector<std::string> names;
    for (const auto& tensor : tensors) names.push_back(tensor.name);
    hdf5_write_attribute(names_owner, names_attribute, names);
  }
  for (const auto& tensor : tensors) {
    write_tensor(root, group_name, tensor, file_path);
    if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
}

void check_tensors(const std::vector<NamedTensor>& tensors, const char* kind) {
  std::set<std::string> seen;
  for (const auto& tensor : tensors) {
    if (!valid_tensor_name(tensor.name) || !seen.insert(tensor.name).second)
      abort_job("save_checkpoint: invalid or duplicate " + std::string(kind) + " name '" +
                tensor.name + "'");
    if (tensor.value.dtype() != DType::f32 || tensor.value.device() != Device::cpu ||
        !tensor.value.defined())
      abort_job("save_checkpoint: " + std::string(kind) + " '" + tensor.name + "' is " +
                tensor.value.describe() + ", expected f32 on the cpu");
  }
}

// The root attributes every checkpoint has (format 2).
void write_meta(hid_t root, const CheckpointMeta& meta) {
  auto lock = hdf5_lock();
  hdf5_write_attribute(root, "mptrain_format", kFormat);
  hdf5_write_attribute(root, "format_version", kFormatVersion);
  hdf5_write_attribute(root, "model_spec", meta.model_spec);
  hdf5_write_attribute(root, "model_spec_sha256", sha256_hex(meta.model_spec));
  hdf5_write_attribute(root, "sample_shape", std::vector<std::int64_t>(meta.sample_shape));
  hdf5_write_attribute(root, "num_classes", static_cast<std::int32_t>(meta.num_classes));
  hdf5_write_attribute(root, "step", meta.step);
  hdf5_write_attribute(root, "epoch", meta.epoch);
  hdf5_write_attribute(root, "world_size", static_cast<std::int32_t>(meta.world_size));
  hdf5_write_attribute(root, "global_batch", meta.global_batch);
  hdf5_write_attribute(root, "precision", meta.precision);
  hdf5_write_attribute(
      root, "mptrain_version",
      meta.mptrain_version.empty() ? std::string(MPTRAIN_VERSION) : meta.mptrain_version);
  hdf5_write_attribute(root, "git_hash",
                       meta.git_hash.empty() ? std::string(git_hash()) : meta.git_hash);
  // Unknown normalisation is simply not written; readers then see it as absent.
  if (!std::isnan(meta.input_mean) && !std::isnan(meta.input_std)) {
    hdf5_write_attribute(root, "input_mean", static_cast<float>(meta.input_mean));
    hdf5_write_attribute(root, "input_std", static_cast<float>(meta.input_std));
  }
}

hid_t create_group(hid_t root, const char* name) {
  const hid_t group = H5Gcreate2(root, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  MPT_CHECK_HDF5(group);
  return group;
}

// The attributes of the training state (docs/checkpoint-format.md, "Training state").
void write_state_attributes(hid_t root, const TrainingState& state) {
  auto lock = hdf5_lock();
  write_double_attribute(root, "training_time_s", state.wall_time_s);
  Hdf5Handle optimizer(create_group(root, kOptimizerGroup));
  hdf5_write_attribute(optimizer.get(), "name", state.optimizer);
  hdf5_write_attribute(optimizer.get(), "steps", state.optimizer_steps);
  hdf5_write_attribute(optimizer.get(), "schedule_steps", state.schedule_steps);
  Hdf5Handle scaler(create_group(root, kScalerGroup));
  write_double_attribute(scaler.get(), "scale", state.loss_scale);
  hdf5_write_attribute(scaler.get(), "growth_tracker", state.scaler_growth_tracker);
  hdf5_write_attribute(scaler.get(), "hysteresis_tracker", state.scaler_hysteresis_tracker);
  hdf5_write_attribute(scaler.get(), "skipped_steps", state.scaler_skipped_steps);
  Hdf5Handle cursor(create_group(root, kCursorGroup));
  hdf5_write_attribute(cursor.get(), "epoch", state.epoch);
  hdf5_write_attribute(cursor.get(), "epoch_step", state.epoch_step);
  hdf5_write_attribute(cursor.get(), "epoch_samples", state.epoch_samples);
  hdf5_write_attribute(cursor.get(), "batch_per_rank", state.batch_per_rank);
  hdf5_write_attribute(cursor.get(), "accumulate", state.accumulate);
  Hdf5Handle rng(create_group(root, kRngGroup));
  write_uint64_attribute(rng.get(), "seed", state.seed);
  hdf5_write_attribute(rng.get(), "micro_step", state.micro_step);
}

// Writes DIR/ckpt-<step>.h5 atomically (STATE: optional training state); returns its path and
// file name. Does not touch 'latest'.
std::pair<std::string, std::string> write_checkpoint_file(
    const std::string& dir, const CheckpointMeta& meta, const std::vector<NamedTensor>& weights,
    const std::vector<NamedTensor>& buffers, const TrainingState* state, int pause_ms) {
  check_tensors(weights, "weight");
  check_tensors(buffers, "buffer");
  if (state) check_tensors(state->optimizer_tensors, "optimizer tensor");
  std::error_code error;
  fs::create_directories(dir, error);
  MPT_REQUIRE(
      !error && fs::is_directory(dir),
      "cannot create checkpoint directory '" + dir + "'" + (error ? ": " + error.message() : ""),
      "choose a writable checkpoint directory");

  const std::string name = "ckpt-" + std::to_string(meta.step) + ".h5";
  const std::string final_path = (fs::path(dir) / name).string();
  const std::string temporary_path = final_path + ".tmp";
  write_atomically(
      final_path, "checkpoint",
      [&](hid_t root) {
        write_meta(root, meta);
        if (state) write_state_attributes(root, *state);
        write_tensor_group(root, kWeightsGroup, root, "weight_names", weights, temporary_path,
                           pause_ms);
        // A model without buffers gets neither the attribute nor the group.
        if (!buffers.empty())
          write_tensor_group(root, kBuffersGroup, root, "buffer_names", buffers, temporary_path,
                             pause_ms);
        // An optimizer without state tensors (SGD without momentum) gets no tensor_names.
        if (state && !state->optimizer_tensors.empty()) {
          Hdf5Handle optimizer;
          {
            auto lock = hdf5_lock();
            optimizer.reset(H5Gopen2(root, kOptimizerGroup, H5P_DEFAULT));
            MPT_CHECK_HDF5(optimizer.get());
          }
          write_tensor_group(root, kOptimizerGroup, optimizer.get(), "tensor_names",
                             state->optimizer_tensors, temporary_path, pause_ms);
        }
      },
      FillMode::kUnlockedChecksummedMetadata);
  return {final_path, name};
}

// Points DIR/latest at NAME, durably (latest.tmp, fsync, rename, fsync DIR).
void update_latest(const std::string& dir, const std::string& name) {
  const std::string latest_path = (fs::path(dir) / kLatestName).string();
  const std::string latest_temporary = latest_path + ".tmp";
  try {
    {
      std::error_code stale;
      fs::remove(latest_temporary, stale);  // debris, or a link: never written through
      std::ofstream latest(latest_temporary, std::ios::trunc);
      latest << name << '\n';
      latest.close();
      MPT_REQUIRE(latest.good(), "cannot write '" + latest_temporary + "'", kWriteHint);
    }
    fsync_path(latest_temporary, /*directory=*/false, kWriteHint);
    rename_durably(latest_temporary, latest_path, dir, kWriteHint);
  } catch (...) {
    std::error_code ignored;
    fs::remove(latest_temporary, ignored);
    throw;
  }
}

// The step of a file named ckpt-<digits>.h5 (SUFFIX ".h5") or ckpt-<digits>.h5.tmp; nullopt for
// any other name.
std::optional<std::int64_t> step_of_file_name(const std::string& name, const std::string& suffix) {
  const std::string prefix = "ckpt-";
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  const char* begin = name.data() + prefix.size();
  const char* end = name.data() + name.size() - suffix.size();
  if (!std::all_of(begin, end, [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  std::int64_t step = 0;
  const auto parsed = std::from_chars(begin, end, step);
  if (parsed.ec != std::errc() || parsed.ptr != end) return std::nullopt;
  return step;
}

struct CheckpointFile {
  std::int64_t step;
  std::string path;
};

// True for a regular file itself, not a link to one: what pruning may delete.
bool is_plain_file(const fs::directory_entry& entry) {
  std::error_code ignored;  // an entry that vanished meanwhile is simply not a checkpoint
  return fs::is_regular_file(entry.symlink_status(ignored));
}

// Every ckpt-<step>.h5 (a regular file, not a link) in DIR, newest step first. ERROR: why DIR
// could not be listed (the list is then empty).
std::vector<CheckpointFile> list_checkpoints(const std::string& dir, std::error_code& error) {
  std::vector<CheckpointFile> files;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    if (!is_plain_file(entry)) continue;
    if (auto step = step_of_file_name(entry.path().filename().string(), ".h5"))
      files.push_back({*step, entry.path().string()});
  }
  std::sort(files.begin(), files.end(),
            [](const CheckpointFile& a, const CheckpointFile& b) { return a.step > b.step; });
  return files;
}

// The file name DIR/latest holds, or "" when there is none.
std::string latest_name(const std::string& dir) {
  std::ifstream latest(fs::path(dir) / kLatestName);
  std::string name;
  std::getline(latest, name);
  while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
  return name;
}

// Deletes what OPTIONS does not keep, and ckpt-*.h5.tmp debris of interrupted writes: regular
// files directly in DIR only, never a link or what it points to. Failures to delete are
// ignored: pruning is housekeeping, and the next checkpoint tries again.
void prune(const std::string& dir, const SaveOptions& options) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error))
    if (step_of_file_name(entry.path().filename().string(), ".h5.tmp") && is_plain_file(entry))
      fs::remove(entry.path(), error);
  const std::string protected_name = latest_name(dir);
  const auto files = list_checkpoints(dir, error);
  for (std::size_t i = 0; i < files.size(); ++i) {
    const bool newest = i < static_cast<std::size_t>(options.keep);
    const bool milestone = options.keep_every > 0 && files[i].step % options.keep_every == 0;
    const bool is_latest = fs::path(files[i].path).filename() == protected_name;
    if (!newest && !milestone && !is_latest) fs::remove(files[i].path, error);
  }
}

// Checks the dataset DATASET_PATH of ROOT against its stored checksum, reading it into OUT
// (float32) when OUT is given. Returns what is wrong, in words, or "" when it verifies.
std::string read_verified(hid_t root, const std::string& dataset_path, const Checksum& checksum,
                          Tensor* out) {
  const std::string shown = "'/" + dataset_path + "'";
  if (!hdf5_has_link(root, dataset_path)) return "it lacks the dataset " + shown;
  Hdf5Handle dataset(H5Dopen2(root, dataset_path.c_str(), H5P_DEFAULT));
  if (!dataset.valid()) return "cannot open " + shown + ": " + hdf5_last_error();
  Tensor value(hdf5_dataset_shape(dataset.get()), DType::f32);
  if (hdf5_read_dataset(dataset.get(), H5T_NATIVE_FLOAT, value.raw()) < 0)
    return "cannot read " + shown + ": " + hdf5_last_error();
  const auto stored = hdf5_read_int_attribute(dataset.get(), checksum.attribute);
  if (!stored) return shown + " has no " + checksum.attribute + " attribute";
  const std::uint32_t actual = checksum.of(value.raw(), value.size_bytes());
  if (static_cast<std::uint32_t>(*stored) != actual)
    return "checksum mismatch: " + shown + " has " + checksum.label + " " + hex32(actual) +
           " but " + hex32(static_cast<std::uint32_t>(*stored)) + " was stored";
  if (out) *out = std::move(value);
  return "";
}

// Reads GROUP/<name> for every name in NAMES, verifying each dataset's checksum.
std::vector<NamedTensor> read_tensor_group(hid_t root, const std::string& group_name,
                                           const std::vector<std::string>& names,
                                           const Checksum& checksum, const std::string& path) {
  std::vector<NamedTensor> tensors;
  for (const auto& name : names) {
    Tensor value;
    const std::string problem = read_verified(root, group_name + "/" + name, checksum, &value);
    MPT_REQUIRE(problem.empty(), "checkpoint '" + path + "' is damaged: " + problem, kDamagedHint);
    tensors.push_back({name, std::move(value)});
  }
  return tensors;
}

// The training state of a format-2 file, if it has one (the /optimizer group marks it).
std::optional<TrainingState> read_training_state(hid_t root, const Checksum& checksum,
                                                 const std::string& path) {
  if (!hdf5_has_link(root, kOptimizerGroup)) return std::nullopt;
  auto open_group = [&](const char* name) {
    MPT_REQUIRE(hdf5_has_link(root, name),
                "checkpoint '" + path + "' has an /optimizer group but no /" + name, kDamagedHint);
    Hdf5Handle group(H5Gopen2(root, name, H5P_DEFAULT));
    MPT_REQUIRE(
        group.valid(),
        "cannot open /" + std::string(name) + " in checkpoint '" + path + "': " + hdf5_last_error(),
        kDamagedHint);
    return group;
  };
  auto missing = [&](const char* group, const char* name) {
    throw_user_error("checkpoint '" + path + "' lacks the attribute '" + name + "' of /" + group,
                     kDamagedHint);
  };
  auto require_int = [&](hid_t object, const char* group, const char* name) {
    const auto value = hdf5_read_int_attribute(object, name);
    if (!value) missing(group, name);
    return *value;
  };
  auto require_double = [&](hid_t object, const char* group, const char* name) {
    const auto value = hdf5_read_float_attribute(object, name);
    if (!value) missing(group, name);
    return *value;
  };
  TrainingState state;
  state.wall_time_s = hdf5_read_float_attribute(root, "training_time_s").value_or(0.0);
  {
    Hdf5Handle group = open_group(kOptimizerGroup);
    const auto name = hdf5_read_string_attribute(group.get(), "name");
    if (!name) missing(kOptimizerGroup, "name");
    state.optimizer = *name;
    state.optimizer_steps = require_int(group.get(), kOptimizerGroup, "steps");
    // Absent in files written before resumes could change the shape of a step: the same.
    state.schedule_steps =
        hdf5_read_int_attribute(group.get(), "schedule_steps").value_or(state.optimizer_steps);
    // No tensor_names: an optimizer without state tensors (SGD without momentum).
    if (const auto names = hdf5_read_string_array_attribute(group.get(), "tensor_names"))
      state.optimizer_tensors = read_tensor_group(root, kOptimizerGroup, *names, checksum, path);
  }
  {
    Hdf5Handle group = open_group(kScalerGroup);
    state.loss_scale = require_double(group.get(), kScalerGroup, "scale");
    state.scaler_growth_tracker = require_int(group.get(), kScalerGroup, "growth_tracker");
    state.scaler_hysteresis_tracker = require_int(group.get(), kScalerGroup, "hysteresis_tracker");
    state.scaler_skipped_steps = require_int(group.get(), kScalerGroup, "skipped_steps");
  }
  {
    Hdf5Handle group = open_group(kCursorGroup);
    state.epoch = require_int(group.get(), kCursorGroup, "epoch");
    state.epoch_step = require_int(group.get(), kCursorGroup, "epoch_step");
    state.epoch_samples = require_int(group.get(), kCursorGroup, "epoch_samples");
    state.batch_per_rank = require_int(group.get(), kCursorGroup, "batch_per_rank");
    state.accumulate = require_int(group.get(), kCursorGroup, "accumulate");
  }
  {
    Hdf5Handle group = open_group(kRngGroup);
    const auto seed = read_uint64_attribute(group.get(), "seed");
    if (!seed) missing(kRngGroup, "seed");
    state.seed = *seed;
    state.micro_step = require_int(group.get(), kRngGroup, "micro_step");
  }
  return state;
}

}  // namespace

bool valid_tensor_name(const std::string& name) {
  if (name.empty() || name.front() == '/' || name.back() == '/' ||
      name.find("..") != std::string::npos || name.find("//") != std::string::npos)
    return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/' ||
          c == '-'))
      return false;
  return true;
}

void write_hdf5_atomically(const std::string& path, const std::string& what,
                           const std::function<void(hid_t root)>& fill) {
  write_atomically(path, what, fill, FillMode::kLocked);
}

std::string save_weights(const std::string& dir, const CheckpointMeta& meta,
                         const std::vector<NamedTensor>& weights,
                         const std::vector<NamedTensor>& buffers) {
  const auto [path, name] = write_checkpoint_file(dir, meta, weights, buffers, nullptr, 0);
  // 'latest' names the newest complete checkpoint; updated only after that file is durable.
  update_latest(dir, name);
  return path;
}

std::string save_checkpoint(const std::string& dir, const CheckpointMeta& meta,
                            const std::vector<NamedTensor>& weights,
                            const std::vector<NamedTensor>& buffers, const TrainingState& state,
                            const SaveOptions& options) {
  MPT_REQUIRE(options.keep >= 1,
              "--checkpoint.keep=" + std::to_string(options.keep) + " keeps no checkpoint",
              "keep at least 1 (the default is 3)");
  MPT_REQUIRE(options.keep_every >= 0,
              "--checkpoint.keep-every=" + std::to_string(options.keep_every) + " is negative",
              "give a step count, or 0 to keep no checkpoint for good");
  MPT_REQUIRE(
      options.debug_pause_ms >= 0,
      "--checkpoint.debug-pause-ms=" + std::to_string(options.debug_pause_ms) + " is negative",
      "give milliseconds, or 0 for no pause");
  const auto [path, name] =
      write_checkpoint_file(dir, meta, weights, buffers, &state, options.debug_pause_ms);
  update_latest(dir, name);
  prune(dir, options);
  return path;
}

std::optional<std::string> describe_checkpoint(const std::string& path) {
  auto lock = hdf5_lock();
  hdf5_quiet();
  if (H5Fis_hdf5(path.c_str()) <= 0) return std::nullopt;
  const auto damaged_metadata = hdf5_probe_file(path);
  MPT_REQUIRE(!damaged_metadata,
              "'" + path + "' is damaged: HDF5 cannot read " + damaged_metadata.value_or(""),
              kDamagedHint);
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file.valid()) {
    hdf5_last_error();  // clear the stack
    return std::nullopt;
  }
  const hid_t root = file.get();
  if (hdf5_read_string_attribute(root, "mptrain_format") != std::string(kFormat))
    return std::nullopt;

  auto text = [&](hid_t object, const char* name) {
    return hdf5_read_string_attribute(object, name).value_or("(missing)");
  };
  auto integer = [&](hid_t object, const char* name) {
    const auto value = hdf5_read_int_attribute(object, name);
    return value ? std::to_string(*value) : std::string("(missing)");
  };
  auto number = [&](hid_t object, const char* name) {
    const auto value = hdf5_read_float_attribute(object, name);
    if (!value) return std::string("(missing)");
    std::ostringstream out;
    out << *value;
    return out.str();
  };
  const std::int64_t version = hdf5_read_int_attribute(root, "format_version").value_or(0);
  std::ostringstream out;
  out << "checkpoint summary:\n";
  out << "  step: " << integer(root, "step") << '\n';
  out << "  epochs completed: " << integer(root, "epoch") << '\n';
  const auto sample_shape = hdf5_read_int_array_attribute(root, "sample_shape");
  out << "  model: " << text(root, "model_spec") << " ("
      << (sample_shape ? shape_to_string(Shape(sample_shape->begin(), sample_shape->end()))
                       : std::string("(missing)"))
      << " -> " << integer(root, "num_classes") << " classes)\n";
  out << "  world size: " << integer(root, "world_size") << '\n';
  out << "  global batch: " << integer(root, "global_batch") << '\n';
  out << "  precision: " << text(root, "precision") << '\n';

  std::vector<std::pair<std::string, std::vector<std::string>>> groups;  // group, dataset names
  groups.emplace_back(
      kWeightsGroup,
      hdf5_read_string_array_attribute(root, "weight_names").value_or(std::vector<std::string>{}));
  groups.emplace_back(
      kBuffersGroup,
      hdf5_read_string_array_attribute(root, "buffer_names").value_or(std::vector<std::string>{}));
  if (version >= 2 && hdf5_has_link(root, kOptimizerGroup)) {
    Hdf5Handle optimizer(H5Gopen2(root, kOptimizerGroup, H5P_DEFAULT));
    Hdf5Handle scaler(hdf5_has_link(root, kScalerGroup) ? H5Gopen2(root, kScalerGroup, H5P_DEFAULT)
                                                        : H5I_INVALID_HID);
    Hdf5Handle cursor(hdf5_has_link(root, kCursorGroup) ? H5Gopen2(root, kCursorGroup, H5P_DEFAULT)
                                                        : H5I_INVALID_HID);
    Hdf5Handle rng(hdf5_has_link(root, kRngGroup) ? H5Gopen2(root, kRngGroup, H5P_DEFAULT)
                                                  : H5I_INVALID_HID);
    const auto tensor_names =
        optimizer.valid() ? hdf5_read_string_array_attribute(optimizer.get(), "tensor_names")
                          : std::nullopt;
    if (scaler.valid())
      out << "  loss scale: " << number(scaler.get(), "scale") << " (growth tracker "
          << integer(scaler.get(), "growth_tracker") << ", hysteresis tracker "
          << integer(scaler.get(), "hysteresis_tracker") << ", skipped steps "
          << integer(scaler.get(), "skipped_steps") << ")\n";
    else
      out << "  loss scale: (missing: no /" << kScalerGroup << " group)\n";
    if (optimizer.valid()) {
      out << "  optimizer: " << text(optimizer.get(), "name") << ", "
          << integer(optimizer.get(), "steps") << " steps applied (LR schedule at step "
          << integer(optimizer.get(), "schedule_steps") << "), state tensors ";
      if (!tensor_names || tensor_names->empty()) out << "none";
      for (std::size_t i = 0; tensor_names && i < tensor_names->size(); ++i)
        out << (i ? ", " : "") << (*tensor_names)[i];
      out << '\n';
      groups.emplace_back(kOptimizerGroup, tensor_names.value_or(std::vector<std::string>{}));
    }
    if (cursor.valid())
      out << "  data cursor: epoch " << integer(cursor.get(), "epoch") << ", step "
          << integer(cursor.get(), "epoch_step") << " of it, "
          << integer(cursor.get(), "epoch_samples") << " samples into it (batch per rank "
          << integer(cursor.get(), "batch_per_rank") << ", accumulate "
          << integer(cursor.get(), "accumulate") << ")\n";
    else
      out << "  data cursor: (missing: no /" << kCursorGroup << " group)\n";
    if (rng.valid()) {
      const auto seed = read_uint64_attribute(rng.get(), "seed");
      out << "  rng: seed " << (seed ? std::to_string(*seed) : std::string("(missing)"))
          << ", micro step " << integer(rng.get(), "micro_step") << '\n';
    } else {
      out << "  rng: (missing: no /" << kRngGroup << " group)\n";
    }
    out << "  training time: " << number(root, "training_time_s") << " s\n";
  } else {
    out << "  training state: none (weights only: a resume from it restarts the optimizer, the "
           "loss scaler and the data order)\n";
  }
  out << "  format version: " << version << '\n';
  out << "  written by: mptrain " << text(root, "mptrain_version") << ", git "
      << text(root, "git_hash") << '\n';

  if (version < 1 || version > kFormatVersion) {
    out << "  checksums: not checked (format_version " << version
        << " is unknown to this mptrain)\n";
    return out.str();
  }
  const Checksum checksum = checksum_of_version(version);
  std::size_t verified = 0, damaged = 0;
  std::string first_problem;
  for (const auto& [group, names] : groups)
    for (const auto& name : names) {
      const std::string problem = read_verified(root, group + "/" + name, checksum, nullptr);
      if (problem.empty()) {
        ++verified;
      } else if (damaged++ == 0) {
        first_problem = problem;
      }
    }
  if (damaged == 0) {
    out << "  checksums: verified (" << verified << " datasets, " << checksum.label << ")\n";
  } else {
    // Name the first damaged dataset at the start of the line, where nobody can miss it.
    std::string where = first_problem;
    const std::size_t quote = first_problem.find("'/");
    if (quote != std::string::npos)
      where = first_problem.substr(quote + 1, first_problem.find('\'', quote + 1) - quote - 1);
    out << "  checksums: MISMATCH in " << where << " (" << first_problem << "); " << damaged
        << " of " << verified + damaged << " datasets damaged: this checkpoint will not load\n";
  }
  return out.str();
}

std::string resolve_checkpoint_path(const std::string& path_or_dir) {
  std::string path = path_or_dir;
  if (fs::is_directory(path_or_dir)) {
    const std::string latest_path = (fs::path(path_or_dir) / kLatestName).string();
    std::ifstream latest(latest_path);
    MPT_REQUIRE(latest.good(),
                "checkpoint directory '" + path_or_dir + "' has no '" + kLatestName + "' file",
                "pass a checkpoint file (DIR/ckpt-STEP.h5) or a directory written by mptrain");
    const std::string name = latest_name(path_or_dir);
    // A bare file name in the directory: 'latest' must not lead a resume (or pruning's
    // protection) anywhere else.
    MPT_REQUIRE(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
                "'" + latest_path + "' does not name a checkpoint file in '" + path_or_dir +
                    "' (it holds '" + name + "')",
                "write the file name of the checkpoint to load into it, or pass the file");
    path = (fs::path(path_or_dir) / name).string();
    std::error_code error;
    if (fs::is_symlink(fs::symlink_status(path, error))) {
      const fs::path target = fs::weakly_canonical(path, error);
      const fs::path inside = fs::weakly_canonical(path_or_dir, error);
      MPT_REQUIRE(!error && target.parent_path() == inside,
                  "'" + path + "' is a link to '" + target.string() +
                      "', outside the checkpoint directory '" + path_or_dir + "' ('" +
                      latest_path + "' names it)",
                  "pass that checkpoint file itself as --resume=PATH (or --checkpoint), or "
                  "write the name of a checkpoint in the directory into 'latest'");
    }
  }
  return path;
}

std::vector<std::string> checkpoint_files(const std::string& dir) {
  std::error_code error;
  std::vector<std::string> paths;
  for (const auto& file : list_checkpoints(dir, error)) paths.push_back(file.path);
  return paths;
}

void remove_checkpoints(const std::string& dir) {
  std::error_code error;
  std::vector<fs::path> doomed;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    const bool ours = step_of_file_name(name, ".h5") || step_of_file_name(name, ".h5.tmp") ||
                      name == kLatestName || name == std::string(kLatestName) + ".tmp";
    std::error_code ignored;
    const auto status = entry.symlink_status(ignored);
    // A link by such a name is removed itself (it is in DIR); what it points to is not touched.
    if (ours && (fs::is_regular_file(status) || fs::is_symlink(status)))
      doomed.push_back(entry.path());
  }
  for (const auto& path : doomed) {
    fs::remove(path, error);
    MPT_REQUIRE(!error,
                "cannot remove '" + path.string() + "' (--output.overwrite): " + error.message(),
                "check the permissions of --checkpoint.dir, or choose another --checkpoint.dir");
  }
}

LoadedCheckpoint load_weights(const std::string& path_or_dir) {
  const std::string path = resolve_checkpoint_path(path_or_dir);
  MPT_REQUIRE(fs::exists(path), "checkpoint file '" + path + "' not found",
              "check the path; a directory's 'latest' must name an existing file");

  auto lock = hdf5_lock();
  hdf5_quiet();
  MPT_REQUIRE(H5Fis_hdf5(path.c_str()) > 0, "checkpoint file '" + path + "' is not an HDF5 file",
              kDamagedHint);
  // Before any attribute is read: the HDF5 checksums of the object headers (the attributes).
  const auto damaged = hdf5_probe_file(path);
  MPT_REQUIRE(!damaged,
              "checkpoint '" + path + "' is damaged: HDF5 cannot read " + damaged.value_or(""),
              kDamagedHint);
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  MPT_REQUIRE(file.valid(), "cannot open checkpoint file '" + path + "': " + hdf5_last_error(),
              kDamagedHint);
  const hid_t root = file.get();
  const auto format = hdf5_read_string_attribute(root, "mptrain_format");
  MPT_REQUIRE(format == kFormat,
              "'" + path + "' is not an mptrain checkpoint (mptrain_format is '" +
                  format.value_or("missing") + "')",
              "pass a checkpoint written by mptrain (ckpt-STEP.h5)");
  const auto version = hdf5_read_int_attribute(root, "format_version");
  MPT_REQUIRE(version && *version >= 1 && *version <= kFormatVersion,
              "checkpoint '" + path + "' has format_version " +
                  (version ? std::to_string(*version) : std::string("missing")) +
                  "; this mptrain reads versions 1 to " + std::to_string(kFormatVersion),
              "load it with the mptrain version that wrote it");
  const Checksum checksum = checksum_of_version(*version);

  auto require_string = [&](const char* name) {
    auto value = hdf5_read_string_attribute(root, name);
    MPT_REQUIRE(value.has_value(), "checkpoint '" + path + "' lacks the attribute '" + name + "'",
                kDamagedHint);
    return *value;
  };
  auto require_int = [&](const char* name) {
    auto value = hdf5_read_int_attribute(root, name);
    MPT_REQUIRE(value.has_value(), "checkpoint '" + path + "' lacks the attribute '" + name + "'",
                kDamagedHint);
    return *value;
  };
  LoadedCheckpoint loaded;
  loaded.path = path;
  CheckpointMeta& meta = loaded.meta;
  meta.model_spec = require_string("model_spec");
  // Format 2 adds the spec's digest: a spec that does not match it was damaged.
  if (const auto digest = hdf5_read_string_attribute(root, "model_spec_sha256"))
    MPT_REQUIRE(*digest == sha256_hex(meta.model_spec),
                "checkpoint '" + path + "': the model_spec attribute does not match its model_spec_sha256",
                kDamagedHint);
  const auto sample_shape = hdf5_read_int_array_attribute(root, "sample_shape");
  MPT_REQUIRE(sample_shape.has_value(),
              "checkpoint '" + path + "' lacks the attribute 'sample_shape'", kDamagedHint);
  meta.sample_shape.assign(sample_shape->begin(), sample_shape->end());
  meta.num_classes = static_cast<int>(require_int("num_classes"));
  meta.step = require_int("step");
  meta.epoch = require_int("epoch");
  meta.world_size = static_cast<int>(require_int("world_size"));
  meta.global_batch = require_int("global_batch");
  meta.precision = require_string("precision");
  meta.mptrain_version = require_string("mptrain_version");
  meta.git_hash = require_string("git_hash");
  const auto names = hdf5_read_string_array_attribute(root, "weight_names");
  MPT_REQUIRE(names.has_value(), "checkpoint '" + path + "' lacks the attribute 'weight_names'",
              kDamagedHint);

  if (const auto mean = hdf5_read_float_attribute(root, "input_mean")) meta.input_mean = *mean;
  if (const auto std = hdf5_read_float_attribute(root, "input_std")) meta.input_std = *std;
  loaded.weights = read_tensor_group(root, kWeightsGroup, *names, checksum, path);
  // No buffer_names: a model without buffers (or a checkpoint from before they were saved).
  if (const auto buffer_names = hdf5_read_string_array_attribute(root, "buffer_names"))
    loaded.buffers = read_tensor_group(root, kBuffersGroup, *buffer_names, checksum, path);
  if (*version >= 2) loaded.state = read_training_state(root, checksum, path);
  return loaded;
}

std::optional<LoadedCheckpoint> load_newest_valid(
    const std::string& dir, const std::function<void(const std::string&)>& warn) {
  if (!fs::exists(dir)) return std::nullopt;
  MPT_REQUIRE(fs::is_directory(dir), "checkpoint directory '" + dir + "' is not a directory",
              "give --checkpoint.dir a directory, or pass the file as --resume=PATH");
  std::error_code error;
  const auto files = list_checkpoints(dir, error);
  MPT_REQUIRE(!error, "cannot list checkpoint directory '" + dir + "': " + error.message(),
              "check its permissions; --resume=auto must see every checkpoint to pick the "
              "newest");
  if (files.empty()) return std::nullopt;
  std::string newest_problem;
  for (std::size_t i = 0; i < files.size(); ++i) {
    try {
      return load_weights(files[i].path);
    } catch (const UserError& error) {
      if (newest_problem.empty()) newest_problem = error.what();
      if (warn)
        warn("checkpoint '" + files[i].path + "' is damaged (" + error.what() + "); " +
             (i + 1 < files.size() ? "falling back to the previous one, '" + files[i + 1].path + "'"
                                   : std::string("no older checkpoint is left")));
    }
  }
  throw_user_error("none of the " + std::to_string(files.size()) + " checkpoints in '" + dir +
                       "' verifies (the newest: " + newest_problem + ")",
                   "resume from an intact copy with --resume=PATH, or start fresh with "
                   "--resume=none (move the damaged files away first)");
}

void check_weights_match(const LoadedCheckpoint& checkpoint,
                         const std::vector<NamedTensor>& expected) {
  const std::string source =
      "checkpoint '" + checkpoint.path + "' (model '" + checkpoint.meta.model_spec + "')";
  const std::string hint =
      "resume with the same --model.* options as the run that wrote it, or start fresh with "
      "--resume=none";
  std::set<std::string> wanted;
  for (const auto& parameter : expected) {
    wanted.insert(parameter.name);
    const auto found =
        std::find_if(checkpoint.weights.begin(), checkpoint.weights.end(),
                     [&](const NamedTensor& weight) { return weight.name == parameter.name; });
    MPT_REQUIRE(found != checkpoint.weights.end(),
                source + " does not match the model: it has no parameter '" + parameter.name +
                    "' " + shape_to_string(parameter.value.shape()),
                hint);
    MPT_REQUIRE(found->value.shape() == parameter.value.shape(),
                source + " does not match the model: parameter '" + parameter.name +
                    "' has shape " + shape_to_string(found->value.shape()) +
                    " in the checkpoint but " + shape_to_string(parameter.value.shape()) +
                    " in the model",
                hint);
  }
  for (const auto& weight : checkpoint.weights)
    MPT_REQUIRE(wanted.count(weight.name) > 0,
                source + " does not match the model: it has a parameter '" + weight.name + "' " +
                    shape_to_string(weight.value.shape()) + " that the model lacks",
                hint);
}

}  // namespace mpt::ckpt
