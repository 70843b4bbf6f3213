// Tests of checkpoint files: round trip (weights, buffers and the training state), atomic write
// ('latest', no .tmp left), format-1 files, rejection of corrupted, truncated, foreign and
// missing files with messages that name the file and dataset, --resume=auto's fallback past
// damaged checkpoints, pruning, a full disk and a kill mid-write, and the model match check.
#include <gtest/gtest.h>
#include <mpi.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <fstream>
#include <functional>
#include <limits>
#include <thread>

#include "ckpt/ckpt.hpp"
#include "core/build_info.hpp"
#include "core/error.hpp"
#include "core/hdf5.hpp"
#include "data/data.hpp"
#include "tests/test_util.hpp"

namespace mpt::ckpt {
namespace {

namespace fs = std::filesystem;

using test::TempDir;
using test::user_error_text;

// The CRC-32C the format documents, bit by bit (independent of core/crc32c).
std::uint32_t crc32c_reference(const Tensor& tensor) {
  const auto* bytes = static_cast<const unsigned char*>(tensor.raw());
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < tensor.size_bytes(); ++i) {
    crc ^= bytes[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
  }
  return ~crc;
}

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
    EXPECT_EQ(loaded.meta.git_hash, git_hash());
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
        "crc32c = ", "weight_names = [\"dense0/weight\"", "format_version 2"})
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
    EXPECT_TRUE(hdf5_read_int_attribute(dataset.get(), "crc32c").has_value());
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

// ---- format 2: training state, fallback, pruning, failures (issue #7) ----------------------

// Every field differs from its default, so a field that does not round-trip fails the test.
TrainingState sample_state() {
  TrainingState state;
  state.optimizer = "adamw";
  state.optimizer_steps = 117;
  state.schedule_steps = 234;
  state.optimizer_tensors = {{"exp_avg", filled({1000}, 0.25f)},
                             {"exp_avg_sq", filled({1000}, 1e-30f)}};
  // Bit patterns a float round trip through another type would not keep.
  float* odd = state.optimizer_tensors[1].value.data<float>();
  odd[0] = -0.0f;
  odd[1] = std::numeric_limits<float>::denorm_min();
  odd[2] = std::numeric_limits<float>::infinity();
  state.loss_scale = 49152.0;
  state.scaler_growth_tracker = 1234;
  state.scaler_hysteresis_tracker = 2;
  state.scaler_skipped_steps = 7;
  state.epoch = 4;
  state.epoch_step = 17;
  state.epoch_samples = 4352;
  state.seed = 0xFEDCBA9876543210ull;  // above INT64_MAX: must not pass through a signed type
  state.micro_step = 987654321012;
  state.batch_per_rank = 64;
  state.accumulate = 3;
  state.wall_time_s = 123.456789;
  return state;
}

std::string save_step(const TempDir& dir, std::int64_t step, SaveOptions options = {}) {
  options.keep = std::max(options.keep, 1);
  return save_checkpoint(dir.path(), sample_meta(step), sample_weights(), {}, sample_state(),
                         options);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.size_bytes()) == 0;
}

// Overwrites bytes at AT inside the data of DATASET (found with H5Dget_offset).
void flip_bytes_in_dataset(const std::string& path, const std::string& dataset_path,
                           std::size_t at) {
  haddr_t offset = 0;
  {
    auto lock = hdf5_lock();
    Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    Hdf5Handle dataset(H5Dopen2(file.get(), dataset_path.c_str(), H5P_DEFAULT));
    offset = H5Dget_offset(dataset.get());
    ASSERT_NE(offset, HADDR_UNDEF) << dataset_path;
  }
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(static_cast<std::streamoff>(offset + at));
  char byte = 0;
  file.read(&byte, 1);
  file.seekp(static_cast<std::streamoff>(offset + at));
  byte = static_cast<char>(byte ^ 0x5a);
  file.write(&byte, 1);
}

std::string read_latest(const TempDir& dir) {
  std::ifstream latest(dir.file("latest"));
  std::string name;
  std::getline(latest, name);
  return name;
}

std::vector<std::string> files_in(const TempDir& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path()))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Checkpoint, TrainingStateRoundTripsBitForBit) {
  TempDir dir("ckpt-state");
  const TrainingState state = sample_state();
  const std::vector<NamedTensor> buffers = {{"bn1/running_mean", filled({16}, 0.1f)}};
  const std::string path =
      save_checkpoint(dir.path(), sample_meta(50), sample_weights(), buffers, state, {});
  EXPECT_EQ(path, dir.file("ckpt-50.h5"));
  EXPECT_EQ(read_latest(dir), "ckpt-50.h5");
  const LoadedCheckpoint loaded = load_weights(dir.path());
  ASSERT_TRUE(loaded.state.has_value());
  const TrainingState& back = *loaded.state;
  EXPECT_EQ(back.optimizer, "adamw");
  EXPECT_EQ(back.optimizer_steps, 117);
  EXPECT_EQ(back.schedule_steps, 234);
  EXPECT_EQ(back.loss_scale, 49152.0);
  EXPECT_EQ(back.scaler_growth_tracker, 1234);
  EXPECT_EQ(back.scaler_hysteresis_tracker, 2);
  EXPECT_EQ(back.scaler_skipped_steps, 7);
  EXPECT_EQ(back.epoch, 4);
  EXPECT_EQ(back.epoch_step, 17);
  EXPECT_EQ(back.epoch_samples, 4352);
  EXPECT_EQ(back.seed, 0xFEDCBA9876543210ull);
  EXPECT_EQ(back.micro_step, 987654321012);
  EXPECT_EQ(back.batch_per_rank, 64);
  EXPECT_EQ(back.accumulate, 3);
  EXPECT_EQ(back.wall_time_s, 123.456789);
  ASSERT_EQ(back.optimizer_tensors.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(back.optimizer_tensors[i].name, state.optimizer_tensors[i].name);
    EXPECT_TRUE(same_bits(back.optimizer_tensors[i].value, state.optimizer_tensors[i].value))
        << state.optimizer_tensors[i].name;
  }
  ASSERT_EQ(loaded.weights.size(), 4u);
  EXPECT_TRUE(same_bits(loaded.weights[0].value, sample_weights()[0].value));
  ASSERT_EQ(loaded.buffers.size(), 1u);

  // The layout docs/checkpoint-format.md promises to h5py readers.
  auto lock = hdf5_lock();
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  EXPECT_EQ(hdf5_read_int_attribute(file.get(), "format_version"), 2);
  Hdf5Handle moment(H5Dopen2(file.get(), "optimizer/exp_avg", H5P_DEFAULT));
  ASSERT_TRUE(moment.valid());
  EXPECT_EQ(static_cast<std::uint32_t>(*hdf5_read_int_attribute(moment.get(), "crc32c")),
            crc32c_reference(state.optimizer_tensors[0].value));
  Hdf5Handle scaler(H5Gopen2(file.get(), "loss_scaler", H5P_DEFAULT));
  EXPECT_EQ(hdf5_read_float_attribute(scaler.get(), "scale"), 49152.0);
  Hdf5Handle cursor(H5Gopen2(file.get(), "data_cursor", H5P_DEFAULT));
  EXPECT_EQ(hdf5_read_int_attribute(cursor.get(), "epoch_samples"), 4352);
}

// Tensors above 8 MB are written in pieces of whole rows (hdf5_lock() is released between
// them); an uneven last piece must land in the right place.
TEST(Checkpoint, LargeTensorsWrittenInPiecesRoundTrip) {
  TempDir dir("ckpt-pieces");
  std::vector<NamedTensor> weights = {{"big/weight", filled({3001, 1000}, -1.0f)},
                                      {"flat/weight", filled({3'000'001}, 2.0f)}};
  TrainingState state = sample_state();
  state.optimizer_tensors = {{"exp_avg", filled({2'500'007}, 7.0f)}};
  save_checkpoint(dir.path(), sample_meta(1), weights, {}, state, {});
  const LoadedCheckpoint loaded = load_weights(dir.path());
  ASSERT_EQ(loaded.weights.size(), 2u);
  EXPECT_TRUE(same_bits(loaded.weights[0].value, weights[0].value));
  EXPECT_TRUE(same_bits(loaded.weights[1].value, weights[1].value));
  EXPECT_TRUE(
      same_bits(loaded.state->optimizer_tensors[0].value, state.optimizer_tensors[0].value));
}

TEST(Checkpoint, SgdWithoutMomentumHasNoOptimizerTensors) {
  TempDir dir("ckpt-sgd");
  TrainingState state = sample_state();
  state.optimizer = "sgd";
  state.optimizer_tensors.clear();
  save_checkpoint(dir.path(), sample_meta(3), sample_weights(), {}, state, {});
  const LoadedCheckpoint loaded = load_weights(dir.path());
  ASSERT_TRUE(loaded.state.has_value());
  EXPECT_EQ(loaded.state->optimizer, "sgd");
  EXPECT_TRUE(loaded.state->optimizer_tensors.empty());
}

TEST(Checkpoint, WeightsOnlyCheckpointHasNoStateAndUsesCrc32c) {
  TempDir dir("ckpt-weights-only");
  const std::string path = save_weights(dir.path(), sample_meta(4), sample_weights());
  EXPECT_FALSE(load_weights(path).state.has_value());
  auto lock = hdf5_lock();
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  EXPECT_EQ(hdf5_read_int_attribute(file.get(), "format_version"), 2);
  Hdf5Handle dataset(H5Dopen2(file.get(), "weights/dense0/bias", H5P_DEFAULT));
  EXPECT_EQ(static_cast<std::uint32_t>(*hdf5_read_int_attribute(dataset.get(), "crc32c")),
            crc32c_reference(sample_weights()[1].value));
  EXPECT_FALSE(hdf5_has_attribute(dataset.get(), "crc32"));
}

// A format-1 file as mptrain wrote it before #7: zlib crc32 per dataset, no training state.
std::string write_version1_file(const TempDir& dir, bool good_checksum) {
  const std::string path = dir.file("ckpt-7.h5");
  auto lock = hdf5_lock();
  Hdf5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  const hid_t root = file.get();
  hdf5_write_attribute(root, "mptrain_format", "mptrain-checkpoint");
  hdf5_write_attribute(root, "format_version", std::int32_t{1});
  hdf5_write_attribute(root, "model_spec", "mlp:784-256-10");
  hdf5_write_attribute(root, "sample_shape", std::vector<std::int64_t>{1, 28, 28});
  hdf5_write_attribute(root, "num_classes", std::int32_t{10});
  hdf5_write_attribute(root, "step", std::int64_t{7});
  hdf5_write_attribute(root, "epoch", std::int64_t{1});
  hdf5_write_attribute(root, "world_size", std::int32_t{2});
  hdf5_write_attribute(root, "global_batch", std::int64_t{128});
  hdf5_write_attribute(root, "precision", "fp16");
  hdf5_write_attribute(root, "mptrain_version", "0.3.0");
  hdf5_write_attribute(root, "git_hash", "abc1234");
  std::vector<std::string> names;
  for (const auto& weight : sample_weights()) {
    names.push_back(weight.name);
    Hdf5Handle dataset =
        hdf5_write_dataset(root, "weights/" + weight.name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                           weight.value.shape(), weight.value.raw());
    auto crc = static_cast<std::uint32_t>(crc32(0, static_cast<const Bytef*>(weight.value.raw()),
                                                static_cast<uInt>(weight.value.size_bytes())));
    if (!good_checksum && weight.name == "dense1/bias") crc ^= 1u;
    hdf5_write_attribute(dataset.get(), "crc32", crc);
  }
  hdf5_write_attribute(root, "weight_names", names);
  return path;
}

TEST(Checkpoint, Version1FilesStillLoadAndVerify) {
  TempDir dir("ckpt-v1");
  const std::string path = write_version1_file(dir, /*good_checksum=*/true);
  const LoadedCheckpoint loaded = load_weights(path);
  EXPECT_EQ(loaded.meta.step, 7);
  EXPECT_EQ(loaded.meta.precision, "fp16");
  EXPECT_FALSE(loaded.state.has_value());
  ASSERT_EQ(loaded.weights.size(), 4u);
  EXPECT_TRUE(same_bits(loaded.weights[2].value, sample_weights()[2].value));
  EXPECT_NE(describe_checkpoint(path)->find("checksums: verified (4 datasets, CRC32)"),
            std::string::npos)
      << *describe_checkpoint(path);

  write_version1_file(dir, /*good_checksum=*/false);
  const std::string text = user_error_text([&] { load_weights(path); });
  EXPECT_NE(text.find("checksum mismatch"), std::string::npos) << text;
  EXPECT_NE(text.find("'/weights/dense1/bias' has CRC32 "), std::string::npos) << text;
}

// The training state lives in attributes, which HDF5's own object-header checksums guard (the
// file is written in HDF5's 1.8 format): flipped bits there are caught on open too.
TEST(Checkpoint, FlippedBytesInTheStateAttributesAreDetected) {
  TempDir dir("ckpt-attr-flip");
  for (const std::string attribute : {"hysteresis_tracker", "micro_step", "global_batch"}) {
    const std::string path = save_step(dir, 8);
    std::string bytes;
    {
      std::ifstream in(path, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const std::size_t at = bytes.find(attribute);
    ASSERT_NE(at, std::string::npos) << attribute;
    bytes[at + 2] = static_cast<char>(bytes[at + 2] ^ 0x01);
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    const std::string text = user_error_text([&] { load_weights(path); });
    EXPECT_NE(text.find(path), std::string::npos) << attribute << ": " << text;
    EXPECT_NE(text.find("damaged"), std::string::npos) << attribute << ": " << text;
  }
}

TEST(Checkpoint, AModelSpecThatDoesNotMatchItsDigestIsRefused) {
  TempDir dir("ckpt-spec-digest");
  const std::string path = save_step(dir, 4);
  {
    const auto loaded = load_weights(path);
    EXPECT_FALSE(loaded.meta.model_spec.empty());
  }
  {
    // Rewritten through HDF5 (its own header checksums stay valid): only the digest can tell.
    Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
    ASSERT_TRUE(file.valid());
    ASSERT_GE(H5Adelete(file.get(), "model_spec"), 0);
    hdf5_write_attribute(file.get(), "model_spec", std::string("dense:99,relu,dense:10"));
  }
  const std::string text = user_error_text([&] { load_weights(path); });
  EXPECT_NE(text.find("model_spec_sha256"), std::string::npos) << text;
  EXPECT_NE(text.find(path), std::string::npos) << text;
}

TEST(Checkpoint, NewestValidFallsBackPastDamagedCheckpoints) {
  TempDir dir("ckpt-fallback");
  SaveOptions options;
  options.keep = 10;
  for (std::int64_t step : {10, 20, 30, 40}) save_step(dir, step, options);
  flip_bytes_in_dataset(dir.file("ckpt-40.h5"), "weights/dense0/weight", 5000);
  fs::resize_file(dir.file("ckpt-30.h5"), fs::file_size(dir.file("ckpt-30.h5")) / 2);
  flip_bytes_in_dataset(dir.file("ckpt-20.h5"), "optimizer/exp_avg_sq", 100);

  std::vector<std::string> warnings;
  const auto loaded =
      load_newest_valid(dir.path(), [&](const std::string& line) { warnings.push_back(line); });
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->meta.step, 10);
  EXPECT_EQ(loaded->path, dir.file("ckpt-10.h5"));
  ASSERT_TRUE(loaded->state.has_value());
  ASSERT_EQ(warnings.size(), 3u);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"ckpt-40.h5", "/weights/dense0/weight"},
      {"ckpt-30.h5", "truncated"},
      {"ckpt-20.h5", "/optimizer/exp_avg_sq"}};
  for (std::size_t i = 0; i < warnings.size(); ++i) {
    EXPECT_NE(warnings[i].find("checkpoint '" + dir.file(expected[i].first) + "' is damaged"),
              std::string::npos)
        << warnings[i];
    EXPECT_NE(warnings[i].find(expected[i].second), std::string::npos) << warnings[i];
    EXPECT_NE(warnings[i].find("falling back to the previous one"), std::string::npos)
        << warnings[i];
    EXPECT_EQ(warnings[i].find('\n'), std::string::npos) << "one line: " << warnings[i];
  }

  // Nothing verifies: an error naming the directory, not a silent fresh start.
  flip_bytes_in_dataset(dir.file("ckpt-10.h5"), "weights/dense1/weight", 8);
  warnings.clear();
  const std::string text = user_error_text([&] {
    load_newest_valid(dir.path(), [&](const std::string& line) { warnings.push_back(line); });
  });
  EXPECT_NE(text.find("none of the 4 checkpoints in '" + dir.path() + "' verifies"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("--resume=none"), std::string::npos) << text;
  ASSERT_EQ(warnings.size(), 4u);
  EXPECT_NE(warnings[3].find("no older checkpoint is left"), std::string::npos) << warnings[3];
}

TEST(Checkpoint, NewestValidGoesByStepNumberNotByLatestOrName) {
  TempDir dir("ckpt-newest");
  SaveOptions options;
  options.keep = 10;
  save_step(dir, 9, options);
  save_step(dir, 100, options);
  save_step(dir, 10, options);  // 'latest' now names ckpt-10.h5
  EXPECT_EQ(read_latest(dir), "ckpt-10.h5");
  int warnings = 0;
  const auto loaded = load_newest_valid(dir.path(), [&](const std::string&) { ++warnings; });
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->meta.step, 100);  // not 9 ("ckpt-9" sorts last by name), not 'latest'
  EXPECT_EQ(warnings, 0);
}

TEST(Checkpoint, NewestValidStartsFreshWithoutCheckpoints) {
  TempDir dir("ckpt-fresh");
  auto warn = [](const std::string& line) { ADD_FAILURE() << "unexpected warning: " << line; };
  EXPECT_FALSE(load_newest_valid(dir.file("absent"), warn).has_value());
  EXPECT_FALSE(load_newest_valid(dir.path(), warn).has_value());  // empty
  // Debris and other files are not checkpoints.
  std::ofstream(dir.file("ckpt-5.h5.tmp")) << "half";
  std::ofstream(dir.file("ckpt-x.h5")) << "x";
  std::ofstream(dir.file("ckpt-.h5")) << "x";
  std::ofstream(dir.file("notes.h5")) << "x";
  std::ofstream(dir.file("latest")) << "ckpt-5.h5\n";
  EXPECT_FALSE(load_newest_valid(dir.path(), warn).has_value());
  // A file where the directory should be.
  const std::string text = user_error_text([&] { load_newest_valid(dir.file("notes.h5"), warn); });
  EXPECT_NE(text.find(dir.file("notes.h5")), std::string::npos) << text;
}

TEST(Checkpoint, PruningKeepsTheNewestAndTheMilestones) {
  TempDir dir("ckpt-prune");
  std::ofstream(dir.file("ckpt-55.h5.tmp")) << "an interrupted write";
  std::ofstream(dir.file("notes.txt")) << "not ours";
  SaveOptions options;
  options.keep = 2;
  options.keep_every = 30;
  for (std::int64_t step = 10; step <= 100; step += 10) save_step(dir, step, options);
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"ckpt-100.h5", "ckpt-30.h5", "ckpt-60.h5",
                                                     "ckpt-90.h5", "latest", "notes.txt"}));
  EXPECT_EQ(read_latest(dir), "ckpt-100.h5");

  // keep-every off: only the newest KEEP stay.
  options.keep = 1;
  options.keep_every = 0;
  save_step(dir, 110, options);
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"ckpt-110.h5", "latest", "notes.txt"}));
}

TEST(Checkpoint, PruningNeverDeletesWhatLatestNames) {
  TempDir dir("ckpt-prune-latest");
  SaveOptions options;
  options.keep = 10;
  save_step(dir, 400, options);
  save_step(dir, 500, options);
  // A run restarted from scratch in the same directory writes lower steps than the old files.
  options.keep = 1;
  save_step(dir, 20, options);
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"ckpt-20.h5", "ckpt-500.h5", "latest"}));
  EXPECT_EQ(read_latest(dir), "ckpt-20.h5");
}

TEST(Checkpoint, KeepMustBeAtLeastOne) {
  TempDir dir("ckpt-keep0");
  SaveOptions options;
  options.keep = 0;
  const std::string text = user_error_text([&] {
    save_checkpoint(dir.path(), sample_meta(1), sample_weights(), {}, sample_state(), options);
  });
  EXPECT_NE(text.find("--checkpoint.keep=0"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(dir.file("ckpt-1.h5")));
  options.keep = 1;
  options.keep_every = -5;
  EXPECT_NE(user_error_text([&] {
              save_checkpoint(dir.path(), sample_meta(1), sample_weights(), {}, sample_state(),
                              options);
            }).find("--checkpoint.keep-every=-5"),
            std::string::npos);
}

// Runs BODY in a forked child (no MPI there) and returns its exit status.
int run_in_child(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    int code = 99;
    try {
      code = body();
    } catch (...) {
      code = 98;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  return status;
}

TEST(Checkpoint, FullDiskLeavesThePreviousCheckpointAndLatestIntact) {
  TempDir dir("ckpt-full");
  save_step(dir, 10);
  const std::uintmax_t full_size = fs::file_size(dir.file("ckpt-10.h5"));
  // A file-size limit fails the write at several depths: the first dataset, the middle of the
  // big weight, and the metadata HDF5 writes last, at flush and close.
  const std::vector<rlim_t> limits = {2048, static_cast<rlim_t>(full_size / 2),
                                      static_cast<rlim_t>(full_size - 600),
                                      static_cast<rlim_t>(full_size - 1)};
  const int status = run_in_child([&] {
    ::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of killing us
    rlimit original{};
    ::getrlimit(RLIMIT_FSIZE, &original);
    for (std::size_t i = 0; i < limits.size(); ++i) {
      std::ofstream message(dir.file("message-" + std::to_string(i)));  // before the limit
      try {
        const rlimit limit{limits[i], original.rlim_max};  // the soft limit only: no privilege
        if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 97;
        save_step(dir, 21 + static_cast<std::int64_t>(i));
        message << "no error";
      } catch (const UserError& error) {
        message << error.what() << " (hint: " << error.hint() << ")";
      }
    }
    // HDF5 1.10 keeps a half-destroyed file behind when H5Fclose fails, and crashes here (as
    // at MPI_Finalize) when the library shuts down: the failed writes must have closed cleanly.
    return H5close() < 0 ? 96 : 0;
  });
  ASSERT_TRUE(WIFEXITED(status)) << "child status " << status;
  ASSERT_EQ(WEXITSTATUS(status), 0);
  for (std::size_t i = 0; i < limits.size(); ++i) {
    std::ifstream in(dir.file("message-" + std::to_string(i)));
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string name = "ckpt-" + std::to_string(21 + i) + ".h5";
    EXPECT_NE(text.find(dir.file(name) + ".tmp"), std::string::npos)
        << "limit " << limits[i] << ": " << text;
    EXPECT_NE(text.find("file system may be full"), std::string::npos)
        << "limit " << limits[i] << ": " << text;
    EXPECT_FALSE(fs::exists(dir.file(name))) << name;
    EXPECT_FALSE(fs::exists(dir.file(name + ".tmp"))) << name << ".tmp";
    fs::remove(dir.file("message-" + std::to_string(i)));
  }
  EXPECT_EQ(read_latest(dir), "ckpt-10.h5");
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"ckpt-10.h5", "latest"}));
  const auto loaded = load_newest_valid(
      dir.path(), [](const std::string& line) { ADD_FAILURE() << "unexpected warning: " << line; });
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->meta.step, 10);
}

TEST(Checkpoint, KillDuringAWriteLeavesThePreviousCheckpoint) {
  TempDir dir("ckpt-kill");
  save_step(dir, 10);
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    SaveOptions slow;
    slow.debug_pause_ms = 2000;  // per dataset: the parent kills it long before it finishes
    try {
      save_step(dir, 20, slow);
    } catch (...) {
    }
    ::_exit(0);
  }
  // Kill it once its temporary file exists (at least one dataset is then being written).
  for (int i = 0; i < 500 && !fs::exists(dir.file("ckpt-20.h5.tmp")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_TRUE(fs::exists(dir.file("ckpt-20.h5.tmp")));
  EXPECT_FALSE(fs::exists(dir.file("ckpt-20.h5")));
  EXPECT_EQ(read_latest(dir), "ckpt-10.h5");
  const auto loaded = load_newest_valid(
      dir.path(), [](const std::string& line) { ADD_FAILURE() << "unexpected warning: " << line; });
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->meta.step, 10);
  // The next checkpoint clears the debris.
  save_step(dir, 30);
  EXPECT_EQ(files_in(dir), (std::vector<std::string>{"ckpt-10.h5", "ckpt-30.h5", "latest"}));
}

TEST(Checkpoint, DebugPauseSleepsAfterEachDataset) {
  TempDir dir("ckpt-pause");
  SaveOptions options;
  options.debug_pause_ms = 40;
  const auto start = std::chrono::steady_clock::now();
  save_step(dir, 1, options);  // 4 weights and 2 optimizer tensors
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(seconds, 6 * 0.040);
}

TEST(Checkpoint, CheckWeightsMatchNamesTheFirstMismatch) {
  TempDir dir("ckpt-match");
  save_step(dir, 5);
  const LoadedCheckpoint loaded = load_weights(dir.path());
  std::vector<NamedTensor> model = sample_weights();
  check_weights_match(loaded, model);  // the same model: no error

  auto text_for = [&](const std::vector<NamedTensor>& expected) {
    return user_error_text([&] { check_weights_match(loaded, expected); });
  };
  const std::string file = "checkpoint '" + dir.file("ckpt-5.h5") + "' (model 'mlp:784-256-10')";
  std::vector<NamedTensor> reshaped = model;
  reshaped[2].value = filled({12, 256}, 0.0f);
  std::string text = text_for(reshaped);
  EXPECT_NE(text.find(file), std::string::npos) << text;
  EXPECT_NE(text.find("parameter 'dense1/weight' has shape (10,256) in the checkpoint but "
                      "(12,256) in the model"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("--resume=none"), std::string::npos) << text;
  EXPECT_NE(text.find("--model."), std::string::npos) << text;

  std::vector<NamedTensor> extra = model;
  extra.insert(extra.begin() + 1, {"dense0b/weight", filled({4, 4}, 0.0f)});
  text = text_for(extra);
  EXPECT_NE(text.find("it has no parameter 'dense0b/weight' (4,4)"), std::string::npos) << text;

  std::vector<NamedTensor> fewer(model.begin(), model.begin() + 2);
  text = text_for(fewer);
  EXPECT_NE(text.find("it has a parameter 'dense1/weight' (10,256) that the model lacks"),
            std::string::npos)
      << text;
}

TEST(Checkpoint, DescribeCheckpointReportsStateAndChecksums) {
  TempDir dir("ckpt-describe");
  CheckpointMeta meta = sample_meta(42);
  meta.precision = "fp16";
  const std::string path =
      save_checkpoint(dir.path(), meta, sample_weights(), {}, sample_state(), {});
  const auto text = describe_checkpoint(path);
  ASSERT_TRUE(text.has_value());
  for (const std::string& needle : std::initializer_list<std::string>{
           "step: 42\n", "epochs completed: 3\n", "world size: 4\n", "global batch: 256\n",
           "precision: fp16\n",
        "loss scale: 49152 (growth tracker 1234, hysteresis tracker 2, "
        "skipped steps 7)",
        "optimizer: adamw, 117 steps applied (LR schedule at step 234), state tensors exp_avg, "
        "exp_avg_sq",
        "data cursor: epoch 4, step 17 of it, 4352 samples into it (batch per rank 64, "
        "accumulate 3)",
        "rng: seed 18364758544493064720, micro step 987654321012", "format version: 2\n",
        std::string("written by: mptrain " MPTRAIN_VERSION ", git ") + git_hash(),
        "checksums: verified (6 datasets, CRC32C)"})
    EXPECT_NE(text->find(needle), std::string::npos) << "missing '" << needle << "' in:\n" << *text;

  flip_bytes_in_dataset(path, "weights/dense1/bias", 3);
  const auto damaged = describe_checkpoint(path);
  ASSERT_TRUE(damaged.has_value());
  EXPECT_NE(damaged->find("checksums: MISMATCH in /weights/dense1/bias ("), std::string::npos)
      << *damaged;
  EXPECT_NE(damaged->find("1 of 6 datasets damaged"), std::string::npos) << *damaged;

  // Weights only, and files that are not checkpoints.
  const std::string plain = save_weights(dir.file("plain"), sample_meta(1), sample_weights());
  EXPECT_NE(describe_checkpoint(plain)->find("training state: none"), std::string::npos);
  std::ofstream(dir.file("text.h5")) << "not hdf5";
  EXPECT_FALSE(describe_checkpoint(dir.file("text.h5")).has_value());
  data::SyntheticSpec spec;
  spec.train_samples = 10;
  spec.test_samples = 10;
  data::prepare_synthetic(spec, dir.file("data"));
  EXPECT_FALSE(describe_checkpoint(dir.file("data/train.h5")).has_value());
}

}  // namespace
}  // namespace mpt::ckpt
