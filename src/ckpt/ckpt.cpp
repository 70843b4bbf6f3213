// Checkpoint writing and loading. The write order (tmp file, flush, close, fsync, rename, fsync
// directory, then 'latest' the same way) means a kill at any point leaves either the previous
// checkpoint or the new one complete, never a torn file under a real name.
#include "ckpt/ckpt.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.hpp"
#include "core/hdf5.hpp"

namespace mpt::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "mptrain-checkpoint";
constexpr std::int32_t kFormatVersion = 1;
constexpr const char* kWeightsGroup = "weights";
constexpr const char* kBuffersGroup = "buffers";
constexpr const char* kLatestName = "latest";

// The documented checksum is over little-endian float32 bytes; on such hosts that is memory order.
static_assert(std::endian::native == std::endian::little, "checkpoint CRC assumes little-endian");

std::uint32_t crc32_of(const void* data, std::size_t bytes) {
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

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  MPT_REQUIRE(fd >= 0, "cannot open '" + path + "' to fsync it: " + std::strerror(errno),
              "check that the checkpoint directory is writable");
  const int status = ::fsync(fd);
  const int saved_errno = errno;
  ::close(fd);
  MPT_REQUIRE(status == 0, "fsync of '" + path + "' failed: " + std::strerror(saved_errno),
              "the file system may be full or failing; choose another checkpoint directory");
}

void rename_durably(const std::string& from, const std::string& to, const std::string& dir) {
  std::error_code error;
  fs::rename(from, to, error);
  MPT_REQUIRE(!error, "cannot rename '" + from + "' to '" + to + "': " + error.message(),
              "check that the checkpoint directory is writable");
  fsync_path(dir, /*directory=*/true);
}

// Writes TENSORS as GROUP/<name> of ROOT, each with the crc32 attribute of its bytes.
void write_tensor_group(hid_t root, const char* group_name,
                        const std::vector<NamedTensor>& tensors) {
  Hdf5Handle group(H5Gcreate2(root, group_name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  MPT_CHECK_HDF5(group.get());
  for (const auto& tensor : tensors) {
    Hdf5Handle dataset =
        hdf5_write_dataset(group.get(), tensor.name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                           tensor.value.shape(), tensor.value.raw());
    hdf5_write_attribute(dataset.get(), "crc32",
                         crc32_of(tensor.value.raw(), tensor.value.size_bytes()));
  }
}

// Reads GROUP/<name> for every name in NAMES, verifying each dataset's CRC32.
std::vector<NamedTensor> read_tensor_group(hid_t root, const std::string& group_name,
                                           const std::vector<std::string>& names,
                                           const std::string& path,
                                           const std::string& damaged_hint) {
  std::vector<NamedTensor> tensors;
  for (const auto& name : names) {
    const std::string dataset_path = group_name + "/" + name;
    MPT_REQUIRE(hdf5_has_link(root, dataset_path),
                "checkpoint '" + path + "' lacks the dataset '/" + dataset_path + "'",
                damaged_hint);
    Hdf5Handle dataset(H5Dopen2(root, dataset_path.c_str(), H5P_DEFAULT));
    MPT_REQUIRE(
        dataset.valid(),
        "cannot open '/" + dataset_path + "' in checkpoint '" + path + "': " + hdf5_last_error(),
        damaged_hint);
    Tensor value(hdf5_dataset_shape(dataset.get()), DType::f32);
    MPT_REQUIRE(
        hdf5_read_dataset(dataset.get(), H5T_NATIVE_FLOAT, value.raw()) >= 0,
        "cannot read '/" + dataset_path + "' in checkpoint '" + path + "': " + hdf5_last_error(),
        damaged_hint);
    const auto stored_crc = hdf5_read_int_attribute(dataset.get(), "crc32");
    MPT_REQUIRE(stored_crc.has_value(),
                "'/" + dataset_path + "' in checkpoint '" + path + "' has no crc32 attribute",
                damaged_hint);
    const std::uint32_t actual_crc = crc32_of(value.raw(), value.size_bytes());
    MPT_REQUIRE(static_cast<std::uint32_t>(*stored_crc) == actual_crc,
                "checksum mismatch in checkpoint '" + path + "': '/" + dataset_path +
                    "' has CRC32 " + std::to_string(actual_crc) + " but " +
                    std::to_string(*stored_crc) + " was stored",
                damaged_hint);
    tensors.push_back({name, std::move(value)});
  }
  return tensors;
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
  const std::string temporary_path = path + ".tmp";
  std::string dir = fs::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  {
    auto lock = hdf5_lock();
    hdf5_quiet();
    Hdf5Handle file(H5Fcreate(temporary_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
    MPT_REQUIRE(file.valid(),
                "cannot create " + what + " '" + temporary_path + "': " + hdf5_last_error(),
                "check that the directory exists, is writable and has free space");
    fill(file.get());
    MPT_CHECK_HDF5(H5Fflush(file.get(), H5F_SCOPE_GLOBAL));
    MPT_CHECK_HDF5(H5Fclose(file.release()));
  }
  fsync_path(temporary_path, /*directory=*/false);
  rename_durably(temporary_path, path, dir);
}

std::string save_weights(const std::string& dir, const CheckpointMeta& meta,
                         const std::vector<NamedTensor>& weights,
                         const std::vector<NamedTensor>& buffers) {
  std::set<std::string> seen;
  for (const auto* group : {&weights, &buffers}) {
    seen.clear();
    for (const auto& weight : *group) {
      if (!valid_tensor_name(weight.name) || !seen.insert(weight.name).second)
        abort_job("save_weights: invalid or duplicate tensor name '" + weight.name + "'");
      if (weight.value.dtype() != DType::f32 || weight.value.device() != Device::cpu ||
          !weight.value.defined())
        abort_job("save_weights: tensor '" + weight.name + "' is " + weight.value.describe() +
                  ", expected f32 on the cpu");
    }
  }
  std::error_code error;
  fs::create_directories(dir, error);
  MPT_REQUIRE(
      !error && fs::is_directory(dir),
      "cannot create checkpoint directory '" + dir + "'" + (error ? ": " + error.message() : ""),
      "choose a writable checkpoint directory");

  const std::string name = "ckpt-" + std::to_string(meta.step) + ".h5";
  const std::string final_path = (fs::path(dir) / name).string();
  write_hdf5_atomically(final_path, "checkpoint", [&](hid_t root) {
    hdf5_write_attribute(root, "mptrain_format", kFormat);
    hdf5_write_attribute(root, "format_version", kFormatVersion);
    hdf5_write_attribute(root, "model_spec", meta.model_spec);
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
                         meta.git_hash.empty() ? std::string(MPTRAIN_GIT_HASH) : meta.git_hash);
    // Unknown normalisation is simply not written; readers then see it as absent.
    if (!std::isnan(meta.input_mean) && !std::isnan(meta.input_std)) {
      hdf5_write_attribute(root, "input_mean", static_cast<float>(meta.input_mean));
      hdf5_write_attribute(root, "input_std", static_cast<float>(meta.input_std));
    }
    std::vector<std::string> names;
    for (const auto& weight : weights) names.push_back(weight.name);
    hdf5_write_attribute(root, "weight_names", names);
    write_tensor_group(root, kWeightsGroup, weights);
    // A model without buffers gets neither the attribute nor the group, as before buffers existed.
    if (!buffers.empty()) {
      names.clear();
      for (const auto& buffer : buffers) names.push_back(buffer.name);
      hdf5_write_attribute(root, "buffer_names", names);
      write_tensor_group(root, kBuffersGroup, buffers);
    }
  });

  // 'latest' names the newest complete checkpoint; updated only after that file is durable.
  const std::string latest_path = (fs::path(dir) / kLatestName).string();
  const std::string latest_temporary = latest_path + ".tmp";
  {
    std::ofstream latest(latest_temporary, std::ios::trunc);
    latest << name << '\n';
    latest.close();
    MPT_REQUIRE(latest.good(), "cannot write '" + latest_temporary + "'",
                "check that the checkpoint directory is writable and has free space");
  }
  fsync_path(latest_temporary, /*directory=*/false);
  rename_durably(latest_temporary, latest_path, dir);
  return final_path;
}

std::string resolve_checkpoint_path(const std::string& path_or_dir) {
  std::string path = path_or_dir;
  if (fs::is_directory(path_or_dir)) {
    const std::string latest_path = (fs::path(path_or_dir) / kLatestName).string();
    std::ifstream latest(latest_path);
    MPT_REQUIRE(latest.good(),
                "checkpoint directory '" + path_or_dir + "' has no '" + kLatestName + "' file",
                "pass a checkpoint file (DIR/ckpt-STEP.h5) or a directory written by mptrain");
    std::string name;
    std::getline(latest, name);
    while (!name.empty() && std::isspace(static_cast<unsigned char>(name.back()))) name.pop_back();
    MPT_REQUIRE(!name.empty() && name.find('/') == std::string::npos,
                "'" + latest_path + "' does not name a checkpoint file (it holds '" + name + "')",
                "write the file name of the checkpoint to load into it, or pass the file");
    path = (fs::path(path_or_dir) / name).string();
  }
  return path;
}

LoadedCheckpoint load_weights(const std::string& path_or_dir) {
  const std::string path = resolve_checkpoint_path(path_or_dir);
  MPT_REQUIRE(fs::exists(path), "checkpoint file '" + path + "' not found",
              "check the path; a directory's 'latest' must name an existing file");

  auto lock = hdf5_lock();
  hdf5_quiet();
  const std::string damaged_hint =
      "the checkpoint is truncated or damaged; load an older one (ckpt-STEP.h5 in the same "
      "directory)";
  MPT_REQUIRE(H5Fis_hdf5(path.c_str()) > 0, "checkpoint file '" + path + "' is not an HDF5 file",
              damaged_hint);
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  MPT_REQUIRE(file.valid(), "cannot open checkpoint file '" + path + "': " + hdf5_last_error(),
              damaged_hint);
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
                  "; this mptrain reads version " + std::to_string(kFormatVersion),
              "load it with the mptrain version that wrote it");

  auto require_string = [&](const char* name) {
    auto value = hdf5_read_string_attribute(root, name);
    MPT_REQUIRE(value.has_value(), "checkpoint '" + path + "' lacks the attribute '" + name + "'",
                damaged_hint);
    return *value;
  };
  auto require_int = [&](const char* name) {
    auto value = hdf5_read_int_attribute(root, name);
    MPT_REQUIRE(value.has_value(), "checkpoint '" + path + "' lacks the attribute '" + name + "'",
                damaged_hint);
    return *value;
  };
  LoadedCheckpoint loaded;
  loaded.path = path;
  CheckpointMeta& meta = loaded.meta;
  meta.model_spec = require_string("model_spec");
  const auto sample_shape = hdf5_read_int_array_attribute(root, "sample_shape");
  MPT_REQUIRE(sample_shape.has_value(),
              "checkpoint '" + path + "' lacks the attribute 'sample_shape'", damaged_hint);
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
              damaged_hint);

  if (const auto mean = hdf5_read_float_attribute(root, "input_mean")) meta.input_mean = *mean;
  if (const auto std = hdf5_read_float_attribute(root, "input_std")) meta.input_std = *std;
  loaded.weights = read_tensor_group(root, kWeightsGroup, *names, path, damaged_hint);
  // No buffer_names: a model without buffers (or a checkpoint from before they were saved).
  if (const auto buffer_names = hdf5_read_string_array_attribute(root, "buffer_names"))
    loaded.buffers = read_tensor_group(root, kBuffersGroup, *buffer_names, path, damaged_hint);
  return loaded;
}

}  // namespace mpt::ckpt
