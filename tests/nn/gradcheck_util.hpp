// Helpers shared by the layer gradient checks: seeded uniform fills and a central difference
// that measures the step actually taken in f32.
#pragma once

#include <cstdint>

#include "core/random.hpp"
#include "core/tensor.hpp"

namespace mpt::nn::test {

// T (f32) := uniform in [LOW, HIGH) from CounterRng(SEED, STREAM), element i from counter i.
inline void fill_uniform(Tensor& t, std::uint64_t seed, float low, float high, std::uint64_t stream) {
  const CounterRng rng(seed, stream);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = low + (high - low) * rng.uniform(static_cast<std::uint64_t>(i));
}

// Central difference of LOSS with respect to *VALUE. The step actually taken is measured from
// the perturbed f32 values, so rounding of value +- eps does not bias the quotient.
template <class Loss>
double central_difference(float* value, float eps, const Loss& loss) {
  const float saved = *value;
  *value = saved + eps;
  const double up_arg = *value;
  const double up = loss();
  *value = saved - eps;
  const double down_arg = *value;
  const double down = loss();
  *value = saved;
  return (up - down) / (up_arg - down_arg);
}

}  // namespace mpt::nn::test
