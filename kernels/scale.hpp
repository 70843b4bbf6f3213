// In-place scaling of a tensor by a constant (gradient averaging, loss-scale removal).
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
void scale_inplace(Tensor& x, float factor);
}  // namespace host

// x *= factor, elementwise over any shape. f32 only.
inline void scale_inplace(Tensor& x, float factor) {
  if (x.device() != Device::cpu) detail::built_without_cuda("kernels::scale_inplace");
  host::scale_inplace(x, factor);
}

}  // namespace mpt::kernels
