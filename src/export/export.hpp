// Exported model files: a standalone inference file (spec, FP32 weights and buffers, input
// normalisation, class count, SHA-256) that `mptrain predict` and numpy can run without the
// training state; docs/export-format.md specifies the layout.
#pragma once

#include <string>
#include <vector>

#include "ckpt/ckpt.hpp"
#include "core/tensor.hpp"
#include "nn/nn.hpp"

namespace mpt::exported {

struct ModelFile {
  std::string path;
  std::string model_spec;  // canonical (nn::Model::spec())
  Shape sample_shape;
  int num_classes = 0;
  float input_mean = 0;  // uint8 samples become (x/255 - mean)/std; float samples are used as is
  float input_std = 1;
  std::string precision = "fp32";  // the training run's storage precision (weights are FP32)
  std::vector<ckpt::NamedTensor> weights;  // f32, in model order
  std::vector<ckpt::NamedTensor> buffers;  // f32, in model order; empty without BN
  std::string sha256;                      // hex, of weights_digest()
  std::string source_checkpoint;           // provenance
  std::int64_t source_step = 0;
};

// The SHA-256 (hex) an export file carries: over every weight's float32 little-endian bytes in
// WEIGHTS order, then every buffer's in BUFFERS order, then the UTF-8 model spec, a NUL byte,
// the sample shape and class count as int64 LE, and mean and std as float32 LE.
std::string weights_digest(const ModelFile& file);

// Copies WEIGHTS into MODEL's FP32 masters and BUFFERS into its buffers, by name and shape, and
// recasts the working copy. SOURCE names the file in messages. UserError naming the layer when a
// tensor is missing, extra or of the wrong shape (a missing buffer group is its own message).
void load_into(nn::Model& model, const std::vector<ckpt::NamedTensor>& weights,
               const std::vector<ckpt::NamedTensor>& buffers, const std::string& source);

// Builds the model FILE describes in PRECISION and loads its tensors; UserError naming FILE's
// path when the spec does not build or does not match the weights.
nn::Model build_model(const ModelFile& file, DType precision);

// Reads CHECKPOINT (a file, or a directory with `latest`), checks that its spec builds and
// matches its weights, and writes OUT atomically. Call on one rank; returns what was written.
ModelFile export_checkpoint(const std::string& checkpoint, const std::string& out);

// Opens and verifies an export file: format and version, metadata, spec against weights (naming
// the layer), then the SHA-256. Throws UserError naming PATH for each failure.
ModelFile load_model_file(const std::string& path);

}  // namespace mpt::exported
