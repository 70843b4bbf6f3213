// In-place scaling of a tensor by a constant (gradient averaging, loss-scale removal).
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
void scale_inplace(Tensor& x, float factor);
}  // namespace host
// The CUDA twins (kernels/cuda/scale.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void scale_inplace(Tensor& x, float factor);
}  // namespace cuda

// x *= factor, elementwise over any shape. f32 only.
inline void scale_inplace(Tensor& x, float factor) {
  MPT_DISPATCH_CUDA(x, scale_inplace, x, factor);
  host::scale_inplace(x, factor);
}

}  // namespace mpt::kernels
