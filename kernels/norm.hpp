// Reductions for gradient clipping by global norm: the sum of squares of a flat buffer in
// double, so that a large model's norm does not lose the small gradients to f32 rounding.
#pragma once

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

namespace host {
double sum_of_squares(const Tensor& x);
}  // namespace host
// The CUDA twins (kernels/cuda/norm.cu), same contracts, every tensor on the cuda device.
namespace cuda {
double sum_of_squares(const Tensor& x);
}  // namespace cuda

// sum_i x_i^2 over an f32 tensor of any shape, accumulated in double (per chunk, then across
// chunks with a Kokkos parallel_reduce). The L2 norm is its square root.
inline double sum_of_squares(const Tensor& x) {
  MPT_DISPATCH_CUDA(x, sum_of_squares, x);
  return host::sum_of_squares(x);
}

}  // namespace mpt::kernels
