// Tests of export files: checkpoint -> export -> load round trip with the documented digest, and
// the rejections a user meets: a modified weight (SHA-256), a spec that does not match the
// weights (naming the layer), a checkpoint or data file passed as a model, a missing file, and a
// model with buffers restored from a file without them.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "ckpt/ckpt.hpp"
#include "core/error.hpp"
#include "core/hdf5.hpp"
#include "core/sha256.hpp"
#include "export/export.hpp"
#include "nn/nn.hpp"
#include "tests/test_util.hpp"

namespace mpt::exported {
namespace {

using test::TempDir;
using test::user_error_text;

constexpr const char* kSpec = "dense:8,relu,dense:3";

// A checkpoint of a small MLP with seeded weights; returns its path.
std::string write_checkpoint(const TempDir& dir, const std::string& spec = kSpec,
                             bool normalisation = true) {
  nn::Model model = nn::Model::build(spec, {1, 4, 4}, 3);
  model.init_params(7);
  ckpt::CheckpointMeta meta;
  meta.model_spec = model.spec();
  meta.sample_shape = {1, 4, 4};
  meta.num_classes = 3;
  meta.step = 12;
  if (normalisation) {
    meta.input_mean = 0.25;
    meta.input_std = 0.5;
  }
  std::vector<ckpt::NamedTensor> weights, buffers;
  for (const auto& p : model.named_params()) weights.push_back({p.name, p.value});
  for (const auto& b : model.named_buffers()) buffers.push_back({b.name, b.value});
  return ckpt::save_weights(dir.file("ckpt"), meta, weights, buffers);
}

haddr_t dataset_offset(const std::string& path, const std::string& dataset) {
  auto lock = hdf5_lock();
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  Hdf5Handle handle(H5Dopen2(file.get(), dataset.c_str(), H5P_DEFAULT));
  return H5Dget_offset(handle.get());
}

void set_string_attribute(const std::string& path, const std::string& name,
                          const std::string& value) {
  auto lock = hdf5_lock();
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT));
  hdf5_write_attribute(file.get(), name, value);
}

TEST(Export, RoundTripKeepsWeightsAndDigest) {
  TempDir dir("export-roundtrip");
  const std::string checkpoint = write_checkpoint(dir);
  const std::string out = dir.file("model.h5");
  const ModelFile written = export_checkpoint(dir.file("ckpt"), out);  // via 'latest'
  EXPECT_EQ(written.source_checkpoint, checkpoint);
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));
  const ModelFile loaded = load_model_file(out);
  EXPECT_EQ(loaded.model_spec, kSpec);
  EXPECT_EQ(loaded.sample_shape, (Shape{1, 4, 4}));
  EXPECT_EQ(loaded.num_classes, 3);
  EXPECT_EQ(loaded.input_mean, 0.25f);
  EXPECT_EQ(loaded.input_std, 0.5f);
  EXPECT_EQ(loaded.precision, "fp32");
  EXPECT_EQ(loaded.sha256, written.sha256);
  EXPECT_EQ(loaded.sha256.size(), 64u);
  const ckpt::LoadedCheckpoint source = ckpt::load_weights(checkpoint);
  ASSERT_EQ(loaded.weights.size(), source.weights.size());
  for (std::size_t i = 0; i < loaded.weights.size(); ++i) {
    EXPECT_EQ(loaded.weights[i].name, source.weights[i].name);
    EXPECT_EQ(std::memcmp(loaded.weights[i].value.raw(), source.weights[i].value.raw(),
                          source.weights[i].value.size_bytes()),
              0);
  }
  // The digest is the documented one: weights' bytes in order, then the spec and metadata.
  Sha256 hash;
  for (const auto& w : source.weights) hash.update(w.value.raw(), w.value.size_bytes());
  hash.update(std::string(kSpec));
  const char nul = 0;
  hash.update(&nul, 1);
  for (std::int64_t e : {1, 4, 4, 3}) hash.update(&e, 8);
  const float mean = 0.25f, std = 0.5f;
  hash.update(&mean, 4);
  hash.update(&std, 4);
  EXPECT_EQ(hash.hex_digest(), loaded.sha256);
  // The model built from the file computes with the checkpoint's weights.
  nn::Model model = build_model(loaded, DType::f32);
  EXPECT_EQ(std::memcmp(model.master_params().raw(), source.weights[0].value.raw(),
                        source.weights[0].value.size_bytes()),
            0);
}

TEST(Export, ModifiedWeightIsRejectedBySha) {
  TempDir dir("export-tamper");
  write_checkpoint(dir);
  const std::string out = dir.file("model.h5");
  export_checkpoint(dir.file("ckpt"), out);
  const haddr_t offset = dataset_offset(out, "weights/dense0/weight");
  ASSERT_NE(offset, HADDR_UNDEF);
  {
    std::fstream file(out, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(offset + 17));
    file.put('\x5a');
  }
  const std::string text = user_error_text([&] { load_model_file(out); });
  EXPECT_NE(text.find(out + ": weights do not match their SHA-256 (file modified or corrupt)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("re-export"), std::string::npos) << text;
}

TEST(Export, SpecThatDoesNotMatchTheWeightsNamesTheLayer) {
  TempDir dir("export-spec");
  write_checkpoint(dir);
  const std::string out = dir.file("model.h5");
  export_checkpoint(dir.file("ckpt"), out);
  set_string_attribute(out, "model_spec", "dense:16,relu,dense:3");
  std::string text = user_error_text([&] { load_model_file(out); });
  EXPECT_NE(text.find(out + ": layer dense0"), std::string::npos) << text;
  EXPECT_NE(text.find("(16,16)"), std::string::npos) << text;  // what the spec needs
  EXPECT_NE(text.find("(8,16)"), std::string::npos) << text;   // what the file holds
  // Same shapes, another layer: only the digest can tell.
  set_string_attribute(out, "model_spec", "dense:8,gelu,dense:3");
  text = user_error_text([&] { load_model_file(out); });
  EXPECT_NE(text.find("SHA-256"), std::string::npos) << text;
  // A spec that does not parse names the file, not --model.layers alone.
  set_string_attribute(out, "model_spec", "dense:8,sigmoid,dense:3");
  text = user_error_text([&] { load_model_file(out); });
  EXPECT_EQ(text.rfind(out + ": its model_spec does not build", 0), 0u) << text;
}

TEST(Export, NotAnExportFileOrMissing) {
  TempDir dir("export-kind");
  const std::string checkpoint = write_checkpoint(dir);
  std::string text = user_error_text([&] { load_model_file(checkpoint); });
  EXPECT_NE(text.find(checkpoint + ": not an mptrain export file"), std::string::npos) << text;
  EXPECT_NE(text.find("mptrain export --checkpoint"), std::string::npos) << text;
  text = user_error_text([&] { load_model_file(dir.file("none.h5")); });
  EXPECT_NE(text.find(dir.file("none.h5") + ": model file not found"), std::string::npos) << text;
  std::ofstream(dir.file("text.h5")) << "not hdf5";
  text = user_error_text([&] { load_model_file(dir.file("text.h5")); });
  EXPECT_NE(text.find(dir.file("text.h5") + ": not an HDF5 file"), std::string::npos) << text;
}

TEST(Export, CheckpointWithoutNormalisationIsRefused) {
  TempDir dir("export-nonorm");
  write_checkpoint(dir, kSpec, /*normalisation=*/false);
  const std::string text =
      user_error_text([&] { export_checkpoint(dir.file("ckpt"), dir.file("m.h5")); });
  EXPECT_NE(text.find("input normalisation"), std::string::npos) << text;
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.h5")));
}

TEST(Export, ModelWithBuffersNeedsThem) {
  nn::Model model = nn::Model::build("dense:8,bn,relu,dense:3", {16}, 3);
  ASSERT_FALSE(model.named_buffers().empty());
  std::vector<ckpt::NamedTensor> weights;
  for (const auto& p : model.named_params()) weights.push_back({p.name, p.value});
  const std::string text = user_error_text([&] { load_into(model, weights, {}, "old.h5"); });
  EXPECT_NE(text.find("old.h5: model"), std::string::npos) << text;
  EXPECT_NE(text.find("no /buffers group"), std::string::npos) << text;
  EXPECT_NE(text.find("bn1/running_mean"), std::string::npos) << text;
  // And restores them when present.
  std::vector<ckpt::NamedTensor> buffers;
  for (const auto& b : model.named_buffers()) {
    Tensor value(b.value.shape(), DType::f32);
    for (std::int64_t i = 0; i < value.numel(); ++i)
      value.data<float>()[i] = 0.5f + static_cast<float>(i);
    buffers.push_back({b.name, value});
  }
  load_into(model, weights, buffers, "new.h5");
  EXPECT_EQ(model.named_buffers()[0].value.data<float>()[1], 1.5f);
}

}  // namespace
}  // namespace mpt::exported
