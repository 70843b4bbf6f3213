// Conversion of raw uint8 samples to normalised f32 inputs, used by the data loader.
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
void normalize_u8(const Tensor& in, Tensor& out, float scale, float shift);
}  // namespace host
// The CUDA twins (kernels/cuda/normalize.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void normalize_u8(const Tensor& in, Tensor& out, float scale, float shift);
}  // namespace cuda

// out = in * scale + shift, elementwise. IN is u8, OUT is f32 with the same number of elements
// (shapes may differ). For mean/std normalisation: scale = 1/(255*std), shift = -mean/std.
inline void normalize_u8(const Tensor& in, Tensor& out, float scale, float shift) {
  detail::require_disjoint("kernels::normalize_u8", "out must not overlap in", in, out);
  MPT_DISPATCH_CUDA(in, normalize_u8, in, out, scale, shift);
  host::normalize_u8(in, out, scale, shift);
}

}  // namespace mpt::kernels
