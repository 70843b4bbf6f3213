// Test helper: fills f32 tensors with reproducible uniform values from the project's RNG.
#pragma once

#include <cstdint>

#include "core/random.hpp"
#include "core/tensor.hpp"

namespace mpt::test {

inline Tensor random_tensor(Shape shape, std::uint64_t seed, float low = -1.f, float high = 1.f) {
  Tensor tensor(std::move(shape), DType::f32);
  const CounterRng rng(seed, 0);
  float* data = tensor.data<float>();
  for (std::int64_t i = 0; i < tensor.numel(); ++i)
    data[i] = low + (high - low) * rng.uniform(static_cast<std::uint64_t>(i));
  return tensor;
}

}  // namespace mpt::test
