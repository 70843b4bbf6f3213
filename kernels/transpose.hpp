// 2-D transpose of (a band of columns of) an f32 matrix, for a layer that needs columns of an
// operand as contiguous rows (nn::Dense's weight gradient in row blocks).
#pragma once

#include <cstdint>

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
void transpose_columns(const Tensor& a, std::int64_t column_begin, Tensor& at);
}  // namespace host
// The CUDA twin (kernels/cuda/transpose.cu), same contract, both tensors on the cuda device.
namespace cuda {
void transpose_columns(const Tensor& a, std::int64_t column_begin, Tensor& at);
}  // namespace cuda

// AT[j, i] = A[i, COLUMN_BEGIN + j]: the K columns from COLUMN_BEGIN on of A [m, n] become the
// rows of AT [K, m] (COLUMN_BEGIN 0 and K = n: all of Aᵀ). Contiguous f32 tensors owned by the
// caller, not overlapping.
inline void transpose_columns(const Tensor& a, std::int64_t column_begin, Tensor& at) {
  detail::require_disjoint("kernels::transpose_columns", "at must not overlap a", a, at);
  MPT_DISPATCH_CUDA(a, transpose_columns, a, column_begin, at);
  host::transpose_columns(a, column_begin, at);
}

}  // namespace mpt::kernels
