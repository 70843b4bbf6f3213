// Batch normalisation kernels over [N, C, S] batches (S = H*W, or 1 for BatchNorm1d) stored in
// f32, f16 or bf16; per-channel quantities are f32 [C] and every reduction accumulates in double,
// so the statistics are FP32 (or better) whatever the storage. The layer (nn/batchnorm.cpp)
// turns the sums into means, variances and coefficients.
#pragma once

#include <cstdint>

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
void batchnorm_sums(const Tensor& x, std::int64_t channels, Tensor& sums);
void batchnorm_apply(const Tensor& x, std::int64_t channels, const Tensor& scale,
                     const Tensor& shift, Tensor& y);
void batchnorm_backward_sums(const Tensor& x, const Tensor& dy, std::int64_t channels,
                             const Tensor& mean, const Tensor& invstd, Tensor& sums);
void batchnorm_backward_dx(const Tensor& x, const Tensor& dy, std::int64_t channels,
                           const Tensor& mean, const Tensor& dy_coef, const Tensor& x_coef,
                           const Tensor& bias, Tensor& dx);
}  // namespace host
// The CUDA twins (kernels/cuda/batchnorm.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void batchnorm_sums(const Tensor& x, std::int64_t channels, Tensor& sums);
void batchnorm_apply(const Tensor& x, std::int64_t channels, const Tensor& scale,
                     const Tensor& shift, Tensor& y);
void batchnorm_backward_sums(const Tensor& x, const Tensor& dy, std::int64_t channels,
                             const Tensor& mean, const Tensor& invstd, Tensor& sums);
void batchnorm_backward_dx(const Tensor& x, const Tensor& dy, std::int64_t channels,
                           const Tensor& mean, const Tensor& dy_coef, const Tensor& x_coef,
                           const Tensor& bias, Tensor& dx);
}  // namespace cuda

// SUMS (f32, at least 2C) := per channel c: SUMS[c] = sum of x, SUMS[C + c] = sum of x^2, over
// the batch and the plane. X holds [N, C, S] for any N; its element count fixes N*S.
inline void batchnorm_sums(const Tensor& x, std::int64_t channels, Tensor& sums) {
  MPT_DISPATCH_CUDA(x, batchnorm_sums, x, channels, sums);
  host::batchnorm_sums(x, channels, sums);
}

// Y = X * SCALE[c] + SHIFT[c]. X and Y may have different storage dtypes, and may alias.
inline void batchnorm_apply(const Tensor& x, std::int64_t channels, const Tensor& scale,
                            const Tensor& shift, Tensor& y) {
  MPT_DISPATCH_CUDA(x, batchnorm_apply, x, channels, scale, shift, y);
  host::batchnorm_apply(x, channels, scale, shift, y);
}

// SUMS (f32, at least 2C) := per channel: SUMS[c] = sum of dy, SUMS[C + c] = sum of dy * xhat,
// with xhat = (x - MEAN[c]) * INVSTD[c].
inline void batchnorm_backward_sums(const Tensor& x, const Tensor& dy, std::int64_t channels,
                                    const Tensor& mean, const Tensor& invstd, Tensor& sums) {
  MPT_DISPATCH_CUDA(x, batchnorm_backward_sums, x, dy, channels, mean, invstd, sums);
  host::batchnorm_backward_sums(x, dy, channels, mean, invstd, sums);
}

// DX = DY_COEF[c] * dy + X_COEF[c] * (x - MEAN[c]) + BIAS[c]: the input gradient of batch
// normalisation once the per-channel sums are known. DX may alias DY.
inline void batchnorm_backward_dx(const Tensor& x, const Tensor& dy, std::int64_t channels,
                                  const Tensor& mean, const Tensor& dy_coef, const Tensor& x_coef,
                                  const Tensor& bias, Tensor& dx) {
  MPT_DISPATCH_CUDA(x, batchnorm_backward_dx, x, dy, channels, mean, dy_coef, x_coef, bias, dx);
  host::batchnorm_backward_dx(x, dy, channels, mean, dy_coef, x_coef, bias, dx);
}

}  // namespace mpt::kernels
