// Host unscale-and-check over many buckets. The finite test is folded into the scaling loop as
// a reduction of (x - x), which is 0 for finite x and NaN for Inf or NaN, so the loop stays
// branch-free and vectorised.
#include <cmath>
#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/cast.hpp"
#include "kernels/host/parallel.hpp"
#include "kernels/unscale_check.hpp"

namespace mpt::kernels::host {
namespace {

// Scales [begin, end) of IN into OUT and returns the sum of (x - x) over it: 0 when all finite.
float scale_range(const float* in, float* out, std::int64_t begin, std::int64_t end, float factor) {
  float poison = 0.f;
  for (std::int64_t i = begin; i < end; ++i) {
    const float x = in[i];
    poison += x - x;
    out[i] = x * factor;
  }
  return poison;
}

}  // namespace

bool unscale_and_check(std::span<const Tensor> inputs, std::span<Tensor> outputs, float inv_scale) {
  static const std::string label = "kernels::unscale_and_check";
  if (inputs.size() != outputs.size())
    abort_job("kernels::unscale_and_check: " + std::to_string(inputs.size()) + " inputs but " +
              std::to_string(outputs.size()) + " outputs");
  bool all_finite = true;
  for (std::size_t b = 0; b < inputs.size(); ++b) {
    const Tensor& input = inputs[b];
    Tensor& output = outputs[b];
    detail::require_host_f32("kernels::unscale_and_check", "outputs must be f32 on the host", output);
    detail::require_pair(input.numel() == output.numel(), "kernels::unscale_and_check",
                         "each output must hold as many elements as its input", input, output);
    if (input.dtype() != DType::f32) cast(input, output);  // widen, then scale in place
    const float* in = input.dtype() == DType::f32 ? input.data<float>() : output.data<float>();
    float* out = output.data<float>();
    float poison = 0.f;
    const std::int64_t n = input.numel();
    const std::int64_t chunks = (n + kChunkElements - 1) / kChunkElements;
    Kokkos::parallel_reduce(
        label, HostRange(0, chunks),
        [=](const std::int64_t chunk, float& sum) {
          const std::int64_t begin = chunk * kChunkElements;
          sum += scale_range(in, out, begin, std::min(n, begin + kChunkElements), inv_scale);
        },
        poison);
    all_finite = all_finite && poison == 0.f;
  }
  return all_finite;
}

}  // namespace mpt::kernels::host
