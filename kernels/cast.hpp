// Conversion between the floating-point storage types: f32 <-> f16 / bf16 (and f16 <-> bf16
// through f32). Used to recast the working weights from the FP32 masters and to widen 16-bit
// activations for FP32 computation.
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
void cast(const Tensor& src, Tensor& dst);
void round_and_widen(const Tensor& src, Tensor& rounded, Tensor& widened);
}  // namespace host
// The CUDA twins (kernels/cuda/cast.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void cast(const Tensor& src, Tensor& dst);
void round_and_widen(const Tensor& src, Tensor& rounded, Tensor& widened);
}  // namespace cuda

// DST = SRC converted to DST's dtype, round to nearest even; Inf and NaN are preserved and
// values beyond fp16's range become Inf. SRC and DST must hold the same number of elements and
// must not overlap, unless they are the same tensor (same dtype: a no-op).
inline void cast(const Tensor& src, Tensor& dst) {
  detail::require_same_or_disjoint(
      "kernels::cast", "src and dst must not overlap unless they are one tensor", src, dst);
  MPT_DISPATCH_CUDA(src, cast, src, dst);
  host::cast(src, dst);
}

// ROUNDED (f16 or bf16) = SRC (f32) rounded to nearest even, and WIDENED (f32) = ROUNDED exactly,
// in one pass: how a model recasts its 16-bit working weights and the f32 copy it computes
// with from the FP32 masters. All three hold the same number of elements and do not overlap.
inline void round_and_widen(const Tensor& src, Tensor& rounded, Tensor& widened) {
  detail::require_disjoint("kernels::round_and_widen", "rounded must not overlap src", src,
                           rounded);
  detail::require_disjoint("kernels::round_and_widen", "widened must not overlap src", src,
                           widened);
  detail::require_disjoint("kernels::round_and_widen", "widened must not overlap rounded",
                           rounded, widened);
  MPT_DISPATCH_CUDA(src, round_and_widen, src, rounded, widened);
  host::round_and_widen(src, rounded, widened);
}

}  // namespace mpt::kernels
