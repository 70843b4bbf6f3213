// The fused unscale-and-check of mixed-precision training: one pass over every gradient bucket
// multiplies by 1/S and detects any non-finite value (an overflow of the scaled loss).
#pragma once

#include <span>

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
bool unscale_and_check(std::span<const Tensor> inputs, std::span<Tensor> outputs, float inv_scale);
}  // namespace host
// The CUDA twin (kernels/cuda/unscale_check.cu): every bucket in one multi-tensor launch.
namespace cuda {
bool unscale_and_check(std::span<const Tensor> inputs, std::span<Tensor> outputs, float inv_scale);
}  // namespace cuda

// OUTPUTS[i] (f32) = INPUTS[i] (f32, f16 or bf16) * INV_SCALE, for every bucket i, in one pass.
// Returns true when every value of every input is finite. Each output must hold as many
// elements as its input; an output may be its own input (f32, in place). Run after the
// all-reduce, it sees the same reduced gradients on every rank, so every rank returns the same
// answer and takes the same skip decision without another collective.
inline bool unscale_and_check(std::span<const Tensor> inputs, std::span<Tensor> outputs,
                              float inv_scale) {
  if (!inputs.empty()) {
    MPT_DISPATCH_CUDA(inputs[0], unscale_and_check, inputs, outputs, inv_scale);
  }
  return host::unscale_and_check(inputs, outputs, inv_scale);
}

}  // namespace mpt::kernels
