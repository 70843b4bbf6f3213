// Tests of checkpoint files: round trip, atomic write ('latest', no .tmp left), and rejection of
// corrupted, truncated, foreign and missing files with messages that name the file.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "ckpt/ckpt.hpp"
#include "core/error.hpp"
#include "core/hdf5.hpp"
#include "data/data.hpp"
#include "tests/test_util.hpp"

namespace mpt::ckpt {
namespace {

namespace fs = std::filesystem;

using test::TempDir;
using test::user_error_text;

Tensor filled(Shape shape, float base) {
  Tensor tensor(std::move(shape), DType::f32);
  for (std::int64_t i = 0; i < tensor.numel(); ++i)
    tensor.data<float>()[i] = base + 0.001f * static_cast<float>(i);
  return tensor;
}

CheckpointMeta sample_meta(std::int64_t step) {
  CheckpointMeta meta;
  meta.model_spec = "mlp:784-256-10";
  meta.sample_shape = {1, 28, 28};
  meta.num_classes = 10;
  meta.step = step;
  meta.epoch = 3;
  meta.world_size = 4;
  meta.global_batch = 256;
  return meta;
}

std::vector<NamedTensor> sample_weights() {
  // The first tensor is large (256 KiB) so that the middle of the file is inside its data.
  return {{"dense0/weight", filled({256, 256}, 1.0f)},
          {"dense0/bias", filled({256}, -2.0f)},
          {"dense1/weight", filled({10, 256}, 3.0f)},
          {"dense1/bias", filled({10}, 0.5f)}};
}

TEST(Checkpoint, RoundTripAndLatest) {
  TempDir dir("ckpt-roundtrip");
  const auto weights = sample_weights();
  const std::string path = save_weights(dir.path(), sample_meta(100), weights);
  EXPECT_EQ(path, dir.file("ckpt-100.h5"));
  EXPECT_TRUE(fs::exists(path));

  for (const std::string& source : {path, dir.path()}) {
    const LoadedCheckpoint loaded = load_weights(source);
    EXPECT_EQ(loaded.meta.model_spec, "mlp:784-256-10");
    EXPECT_EQ(loaded.meta.sample_shape, (Shape{1, 28, 28}));
    EXPECT_EQ(loaded.meta.num_classes, 10);
    EXPECT_EQ(loaded.meta.step, 100);
    EXPECT_EQ(loaded.meta.epoch, 3);
    EXPECT_EQ(loaded.meta.world_size, 4);
    EXPECT_EQ(loaded.meta.global_batch, 256);
    EXPECT_EQ(loaded.meta.precision, "fp32");
    EXPECT_EQ(loaded.meta.mptrain_version, MPTRAIN_VERSION);  // filled in when left empty
    EXPECT_EQ(loaded.meta.git_hash, MPTRAIN_GIT_HASH);
    ASSERT_EQ(loaded.weights.size(), weights.size());
    for (std::size_t i = 0; i < weights.size(); ++i) {
      EXPECT_EQ(loaded.weights[i].name, weights[i].name);  // saved order, not HDF5's name order
      EXPECT_EQ(loaded.weights[i].value.shape(), weights[i].value.shape());
      EXPECT_EQ(std::memcmp(loaded.weights[i].value.raw(), weights[i].value.raw(),
                            weights[i].value.size_bytes()),
                0);
    }
  }
}

TEST(Checkpoint, AtomicWriteLeavesNoTemporaryAndUpdatesLatest) {
  TempDir dir("ckpt-atomic");
  save_weights(dir.path(), sample_meta(10), sample_weights());
  save_weights(dir.path(), sample_meta(20), sample_weights());
  std::ifstream latest(dir.file("latest"));
  std::string name;
  std::getline(latest, name);
  EXPECT_EQ(name, "ckpt-20.h5");
  for (const auto& entry : fs::directory_iterator(dir.path()))
    EXPECT_NE(entry.path().extension(), ".tmp") << entry.path();
  EXPECT_TRUE(fs::exists(dir.file("ckpt-10.h5")));  // older checkpoints stay
  EXPECT_EQ(load_weights(dir.path()).meta.step, 20);
}

TEST(Checkpoint, FlippedBytesInAWeightAreDetected) {
  TempDir dir("ckpt-flip");
  const std::string path = save_weights(dir.path(), sample_meta(5), sample_weights());
  haddr_t offset = 0;
  {
    auto lock = hdf5_lock();
    Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    Hdf5Handle dataset(H5Dopen2(file.get(), "weights/dense0/weight", H5P_DEFAULT));
    offset = H5Dget_offset(dataset.get());
    ASSERT_NE(offset, HADDR_UNDEF);
  }
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(offset + 1000));
    const char garbage[4] = {'\x7f', '\x01', '\x55', '\x2a'};
    file.write(garbage, sizeof(garbage));
  }
  const std::string text = user_error_text([&] { load_weights(path); });
  EXPECT_NE(text.find(path), std::string::npos) << text;
  EXPECT_NE(text.find("checksum mismatch"), std::string::npos) << text;
  EXPECT_NE(text.find("dense0/weight"), std::string::npos) << text;
  EXPECT_NE(text.find("older one"), std::string::npos) << text;
}

TEST(Checkpoint, TruncatedFileIsRejected) {
  TempDir dir("ckpt-truncate");
  const std::string path = save_weights(dir.path(), sample_meta(5), sample_weights());
  fs::resize_file(path, fs::file_size(path) / 2);
  const std::string text = user_error_text([&] { load_weights(dir.path()); });
  EXPECT_NE(text.find(path), std::string::npos) << text;
  EXPECT_NE(text.find("truncated or damaged"), std::string::npos) << text;
}

TEST(Checkpoint, MissingFileAndDirectoryWithoutLatest) {
  TempDir dir("ckpt-missing");
  std::string text = user_error_text([&] { load_weights(dir.file("ckpt-7.h5")); });
  EXPECT_NE(text.find(dir.file("ckpt-7.h5")), std::string::npos) << text;
  EXPECT_NE(text.find("not found"), std::string::npos) << text;
  fs::create_directories(dir.path());
  text = user_error_text([&] { load_weights(dir.path()); });
  EXPECT_NE(text.find(dir.path()), std::string::npos) << text;
  EXPECT_NE(text.find("'latest'"), std::string::npos) << text;
  // 'latest' pointing at a file that has gone.
  std::ofstream(dir.file("latest")) << "ckpt-9.h5\n";
  text = user_error_text([&] { load_weights(dir.path()); });
  EXPECT_NE(text.find(dir.file("ckpt-9.h5")), std::string::npos) << text;
}

TEST(Checkpoint, DataFileIsNotACheckpoint) {
  TempDir dir("ckpt-kind");
  data::SyntheticSpec spec;
  spec.train_samples = 10;
  spec.test_samples = 10;
  data::prepare_synthetic(spec, dir.path());
  const std::string text = user_error_text([&] { load_weights(dir.file("train.h5")); });
  EXPECT_NE(text.find(dir.file("train.h5")), std::string::npos) << text;
  EXPECT_NE(text.find("mptrain-data"), std::string::npos) << text;
}

TEST(Checkpoint, InspectDescribesIt) {
  TempDir dir("ckpt-inspect");
  const std::string path = save_weights(dir.path(), sample_meta(42), sample_weights());
  const std::string text = data::inspect_file(path);
  for (const char* needle :
       {"mptrain checkpoint", "step = 42", "/weights/dense0/weight  float32 (256,256)",
        "crc32 = ", "weight_names = [\"dense0/weight\""})
    EXPECT_NE(text.find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << text;
}

TEST(Checkpoint, BuffersAndNormalisationRoundTrip) {
  TempDir dir("ckpt-buffers");
  CheckpointMeta meta = sample_meta(8);
  meta.input_mean = 0.25;
  meta.input_std = 0.5;
  const std::vector<NamedTensor> buffers = {{"bn1/running_mean", filled({16}, 0.1f)},
                                            {"bn1/running_var", filled({16}, 0.9f)}};
  const std::string path = save_weights(dir.path(), meta, sample_weights(), buffers);
  const LoadedCheckpoint loaded = load_weights(path);
  EXPECT_EQ(loaded.path, path);
  EXPECT_EQ(loaded.meta.input_mean, 0.25);
  EXPECT_EQ(loaded.meta.input_std, 0.5);
  ASSERT_EQ(loaded.buffers.size(), 2u);
  for (std::size_t i = 0; i < buffers.size(); ++i) {
    EXPECT_EQ(loaded.buffers[i].name, buffers[i].name);
    EXPECT_EQ(loaded.buffers[i].value.shape(), buffers[i].value.shape());
    EXPECT_EQ(std::memcmp(loaded.buffers[i].value.raw(), buffers[i].value.raw(),
                          buffers[i].value.size_bytes()),
              0);
  }
  {
    auto lock = hdf5_lock();
    Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    EXPECT_TRUE(hdf5_has_link(file.get(), "buffers/bn1/running_var"));
    Hdf5Handle dataset(H5Dopen2(file.get(), "buffers/bn1/running_var", H5P_DEFAULT));
    EXPECT_TRUE(hdf5_read_int_attribute(dataset.get(), "crc32").has_value());
  }
  // A model without buffers: no group, and nothing comes back; no normalisation: NaN.
  const std::string plain = save_weights(dir.path(), sample_meta(9), sample_weights());
  const LoadedCheckpoint without = load_weights(plain);
  EXPECT_TRUE(without.buffers.empty());
  EXPECT_TRUE(std::isnan(without.meta.input_mean));
  auto lock = hdf5_lock();
  Hdf5Handle file(H5Fopen(plain.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  EXPECT_FALSE(hdf5_has_link(file.get(), "buffers"));
}

TEST(Checkpoint, FlippedBytesInABufferAreDetected) {
  TempDir dir("ckpt-buffer-flip");
  const std::vector<NamedTensor> buffers = {{"bn0/running_mean", filled({4096}, 0.1f)}};
  const std::string path = save_weights(dir.path(), sample_meta(3), sample_weights(), buffers);
  haddr_t offset = 0;
  {
    auto lock = hdf5_lock();
    Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    Hdf5Handle dataset(H5Dopen2(file.get(), "buffers/bn0/running_mean", H5P_DEFAULT));
    offset = H5Dget_offset(dataset.get());
    ASSERT_NE(offset, HADDR_UNDEF);
  }
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(offset + 100));
    const char garbage[2] = {'\x7f', '\x01'};
    file.write(garbage, sizeof(garbage));
  }
  const std::string text = user_error_text([&] { load_weights(path); });
  EXPECT_NE(text.find(path), std::string::npos) << text;
  EXPECT_NE(text.find("checksum mismatch"), std::string::npos) << text;
  EXPECT_NE(text.find("/buffers/bn0/running_mean"), std::string::npos) << text;
}

}  // namespace
}  // namespace mpt::ckpt
