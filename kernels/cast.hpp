// Conversion between the floating-point storage types: f32 <-> f16 / bf16 (and f16 <-> bf16
// through f32). Used to recast the working weights from the FP32 masters and to widen 16-bit
// activations for FP32 computation.
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
void cast(const Tensor& src, Tensor& dst);
}  // namespace host

// DST = SRC converted to DST's dtype, round to nearest even; Inf and NaN are preserved and
// values beyond fp16's range become Inf. SRC and DST must hold the same number of elements and
// must not overlap, unless they are the same tensor (same dtype: a no-op).
inline void cast(const Tensor& src, Tensor& dst) {
  if (src.device() != Device::cpu) detail::built_without_cuda("kernels::cast");
  host::cast(src, dst);
}

}  // namespace mpt::kernels
