// Elementwise sum of two tensors, the residual Add of a ResNet block (forward: the two branches;
// backward: the two gradients meeting at the block's input). Any mix of f32, f16 and bf16.
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
void add(const Tensor& a, const Tensor& b, Tensor& y);
}
// The CUDA twin (kernels/cuda/add.cu), same contract, every tensor on the cuda device.
namespace cuda {
void add(const Tensor& a, const Tensor& b, Tensor& y);
}

// Y = A + B, computed in f32 and rounded once into Y's storage. All three hold the same number of
// elements; Y may alias A or B. Also the gradient accumulation of --train.accumulate.
inline void add(const Tensor& a, const Tensor& b, Tensor& y) {
  detail::require_same_or_disjoint("kernels::add", "y must be a or not overlap it", a, y);
  detail::require_same_or_disjoint("kernels::add", "y must be b or not overlap it", b, y);
  MPT_DISPATCH_CUDA(a, add, a, b, y);
  host::add(a, b, y);
}

}  // namespace mpt::kernels
