// Inverted dropout with counter-based masks: element e of a call is kept when a Philox4x32-10
// draw keyed by (seed, stream) at counter e exceeds the drop probability, so forward and
// backward regenerate the same mask without storing it, and a resumed run draws the same masks.
#pragma once

#include <cstdint>

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

// Which mask: Philox key SEED, counter (element index / 4, STREAM), lane element index % 4;
// element index = FIRST_ELEMENT + position in the tensor. Element e is kept when its 32-bit
// draw is >= P * 2^32 (so P = 0 keeps all).
struct DropoutKey {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;
  std::uint64_t first_element = 0;
};

namespace host {
void dropout_forward(const Tensor& x, float p, const DropoutKey& key, Tensor& y);
void dropout_backward(const Tensor& dy, float p, const DropoutKey& key, Tensor& dx);
bool dropout_keeps(float p, const DropoutKey& key, std::uint64_t element);
}  // namespace host
// The CUDA twins (kernels/cuda/dropout.cu), same contracts and the same masks, every tensor on
// the cuda device. dropout_keeps stays on the host: it is the reference the tests draw from.
namespace cuda {
void dropout_forward(const Tensor& x, float p, const DropoutKey& key, Tensor& y);
void dropout_backward(const Tensor& dy, float p, const DropoutKey& key, Tensor& dx);
}  // namespace cuda

// Y = X / (1 - P) where kept, else 0, for 0 <= P < 1. X and Y (same element count) may differ
// in storage dtype (f32, f16, bf16), or Y may be X itself.
inline void dropout_forward(const Tensor& x, float p, const DropoutKey& key, Tensor& y) {
  detail::require_same_or_disjoint("kernels::dropout_forward", "y must be x or not overlap it", x,
                                   y);
  MPT_DISPATCH_CUDA(x, dropout_forward, x, p, key, y);
  host::dropout_forward(x, p, key, y);
}

// DX = DY / (1 - P) where the forward with the same P and KEY kept, else 0. DX may alias DY.
inline void dropout_backward(const Tensor& dy, float p, const DropoutKey& key, Tensor& dx) {
  detail::require_same_or_disjoint("kernels::dropout_backward", "dx must be dy or not overlap it",
                                   dy, dx);
  MPT_DISPATCH_CUDA(dy, dropout_backward, dy, p, key, dx);
  host::dropout_backward(dy, p, key, dx);
}

// Whether ELEMENT (a position in the tensor) is kept under P and KEY: for tests and references.
inline bool dropout_keeps(float p, const DropoutKey& key, std::uint64_t element) {
  return host::dropout_keeps(p, key, element);
}

}  // namespace mpt::kernels
