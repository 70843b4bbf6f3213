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
void batchnorm_forward_coefs(const Tensor& sums, double plane, bool training, const Tensor& gamma,
                             const Tensor& beta, Tensor& running_mean, Tensor& running_var,
                             double momentum, double epsilon, Tensor& mean, Tensor& invstd,
                             Tensor& scale, Tensor& shift);
void batchnorm_backward_coefs(const Tensor& sums, double plane, const Tensor& gamma,
                              const Tensor& invstd, Tensor& dy_coef, Tensor& x_coef, Tensor& bias);
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
void batchnorm_forward_coefs(const Tensor& sums, double plane, bool training, const Tensor& gamma,
                             const Tensor& beta, Tensor& running_mean, Tensor& running_var,
                             double momentum, double epsilon, Tensor& mean, Tensor& invstd,
                             Tensor& scale, Tensor& shift);
void batchnorm_backward_coefs(const Tensor& sums, double plane, const Tensor& gamma,
                              const Tensor& invstd, Tensor& dy_coef, Tensor& x_coef, Tensor& bias);
}  // namespace cuda

// SUMS (f32, at least 2C + 1) := per channel c: SUMS[c] = sum of x, SUMS[C + c] = sum of x^2,
// over the batch and the plane, and SUMS[2C] = N (the samples, exact in f32 below 2^24). X holds
// [N, C, S] for any N; its element count fixes N*S. The sample count rides with the sums, so
// that a sum over ranks (sync BN) sums it too and the coefficients read it where they run: the
// host never needs the global batch.
inline void batchnorm_sums(const Tensor& x, std::int64_t channels, Tensor& sums) {
  detail::require_disjoint("kernels::batchnorm_sums", "sums must not overlap x", x, sums);
  MPT_DISPATCH_CUDA(x, batchnorm_sums, x, channels, sums);
  host::batchnorm_sums(x, channels, sums);
}

// Y = X * SCALE[c] + SHIFT[c]. X and Y may have different storage dtypes, or Y may be X itself.
inline void batchnorm_apply(const Tensor& x, std::int64_t channels, const Tensor& scale,
                            const Tensor& shift, Tensor& y) {
  detail::require_same_or_disjoint("kernels::batchnorm_apply", "y must be x or not overlap it", x,
                                   y);
  MPT_DISPATCH_CUDA(x, batchnorm_apply, x, channels, scale, shift, y);
  host::batchnorm_apply(x, channels, scale, shift, y);
}

// SUMS (f32, at least 2C) := per channel: SUMS[c] = sum of dy, SUMS[C + c] = sum of dy * xhat,
// with xhat = (x - MEAN[c]) * INVSTD[c]. SUMS[2C] and beyond are left as they were (the
// forward's sample count, which batchnorm_backward_coefs reads).
inline void batchnorm_backward_sums(const Tensor& x, const Tensor& dy, std::int64_t channels,
                                    const Tensor& mean, const Tensor& invstd, Tensor& sums) {
  detail::require_disjoint("kernels::batchnorm_backward_sums", "sums must not overlap x", x, sums);
  detail::require_disjoint("kernels::batchnorm_backward_sums", "sums must not overlap dy", dy,
                           sums);
  MPT_DISPATCH_CUDA(x, batchnorm_backward_sums, x, dy, channels, mean, invstd, sums);
  host::batchnorm_backward_sums(x, dy, channels, mean, invstd, sums);
}

// DX = DY_COEF[c] * dy + X_COEF[c] * (x - MEAN[c]) + BIAS[c]: the input gradient of batch
// normalisation once the per-channel sums are known. DX may alias DY.
inline void batchnorm_backward_dx(const Tensor& x, const Tensor& dy, std::int64_t channels,
                                  const Tensor& mean, const Tensor& dy_coef, const Tensor& x_coef,
                                  const Tensor& bias, Tensor& dx) {
  detail::require_same_or_disjoint("kernels::batchnorm_backward_dx",
                                   "dx must be dy or not overlap it", dy, dx);
  detail::require_same_or_disjoint("kernels::batchnorm_backward_dx",
                                   "dx must be x or not overlap it", x, dx);
  MPT_DISPATCH_CUDA(x, batchnorm_backward_dx, x, dy, channels, mean, dy_coef, x_coef, bias, dx);
  host::batchnorm_backward_dx(x, dy, channels, mean, dy_coef, x_coef, bias, dx);
}

// The per-channel arithmetic between the passes above, for C = GAMMA's channels, in double with
// each result rounded to f32 once; every tensor f32 [C] (SUMS: at least 2C + 1), where the other
// kernels run, so that a layer on the cuda device needs no host copy and no synchronisation.
// COUNT = SUMS[2C] * PLANE is the values per channel (samples, from batchnorm_sums or their sum
// over ranks, times the plane's elements).
// TRAINING with COUNT > 0: from SUMS (sum x, sum x^2; batchnorm_sums),
//   m = sum / COUNT, var = max(0, sum x^2 / COUNT - m^2), MEAN = m, INVSTD = 1 / sqrt(var + EPSILON),
//   RUNNING_MEAN = (1 - MOMENTUM) RUNNING_MEAN + MOMENTUM m,
//   RUNNING_VAR = (1 - MOMENTUM) RUNNING_VAR + MOMENTUM var COUNT / (COUNT - 1) (no factor for
//   COUNT = 1), as PyTorch;
// else (evaluation, or a batch without a sample, which leaves the running statistics as they
// are) MEAN = RUNNING_MEAN, INVSTD = 1 / sqrt(RUNNING_VAR + EPSILON); SUMS unread in evaluation.
// Then s = GAMMA * INVSTD, SCALE = s, SHIFT = BETA - MEAN s, so that y = x SCALE + SHIFT.
inline void batchnorm_forward_coefs(const Tensor& sums, double plane, bool training,
                                    const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                                    Tensor& running_var, double momentum, double epsilon,
                                    Tensor& mean, Tensor& invstd, Tensor& scale, Tensor& shift) {
  MPT_DISPATCH_CUDA(gamma, batchnorm_forward_coefs, sums, plane, training, gamma, beta,
                    running_mean, running_var, momentum, epsilon, mean, invstd, scale, shift);
  host::batchnorm_forward_coefs(sums, plane, training, gamma, beta, running_mean, running_var,
                                momentum, epsilon, mean, invstd, scale, shift);
}

// The coefficients of batchnorm_backward_dx from SUMS (sum dy, sum dy xhat; 
// batchnorm_backward_sums): g = GAMMA * INVSTD, DY_COEF = g; with PLANE > 0 (the gradient
// flows through a training forward's batch statistics) and COUNT = SUMS[2C] * PLANE > 0 (the
// forward's sample count, still in SUMS: SUMS then holds at least 2C + 1)
// X_COEF = -g INVSTD (sum dy xhat) / COUNT and BIAS = -g (sum dy) / COUNT, else both 0.
inline void batchnorm_backward_coefs(const Tensor& sums, double plane, const Tensor& gamma,
                                     const Tensor& invstd, Tensor& dy_coef, Tensor& x_coef,
                                     Tensor& bias) {
  MPT_DISPATCH_CUDA(gamma, batchnorm_backward_coefs, sums, plane, gamma, invstd, dy_coef, x_coef,
                    bias);
  host::batchnorm_backward_coefs(sums, plane, gamma, invstd, dy_coef, x_coef, bias);
}

}  // namespace mpt::kernels
