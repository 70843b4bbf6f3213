// Copies between tensors on any devices (host <-> cuda, and within one), for staging data and
// checking results. Synchronous; not for the training step's hot path.
#pragma once

#include "core/device_memory.hpp"
#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

// DST = SRC bytewise. Same dtype and number of elements; the shapes may differ.
inline void copy(const Tensor& src, Tensor& dst) {
  detail::require_pair(src.defined() && dst.defined() && src.dtype() == dst.dtype() &&
                           src.numel() == dst.numel(),
                       "kernels::copy", "src and dst must share dtype and element count", src, dst);
  device_memory::copy(dst.raw(), dst.device(), src.raw(), src.device(), src.size_bytes());
}

}  // namespace mpt::kernels
