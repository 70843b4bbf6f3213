// Host unscale-and-check over many buckets. The finite test is folded into the scaling loop as
// an OR over the exponent bits (all ones for Inf and NaN): an integer OR reduction vectorises,
// where a float sum of (x - x) would not (float addition may not be reordered), and it ran at
// a third of memory speed. 16-bit inputs are widened chunk by chunk, so the scaling pass reads
// the f32 output while it is still in cache.
#include "kernels/unscale_check.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/host/convert.hpp"
#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {
namespace {

// Scales [begin, end) of IN into OUT; returns 1 when any value there is Inf or NaN, else 0.
float scale_range(const float* in, float* out, std::int64_t begin, std::int64_t end, float factor) {
  std::uint32_t non_finite = 0;
  for (std::int64_t i = begin; i < end; ++i) {
    const float x = in[i];
    const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
    non_finite |= static_cast<std::uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    out[i] = x * factor;
  }
  return static_cast<float>(non_finite);
}

}  // namespace

bool unscale_and_check(std::span<const Tensor> inputs, std::span<Tensor> outputs, float inv_scale) {
  static const std::string label = "kernels::unscale_and_check";
  if (inputs.size() != outputs.size())
    abort_job("kernels::unscale_and_check: " + std::to_string(inputs.size()) + " inputs but " +
              std::to_string(outputs.size()) + " outputs");
  // Every bucket checked before any is written, as on the device: a bad bucket ends the job
  // with the earlier outputs untouched.
  for (std::size_t b = 0; b < inputs.size(); ++b) {
    const Tensor& input = inputs[b];
    const Tensor& output = outputs[b];
    detail::require_host_f32("kernels::unscale_and_check", "outputs must be f32 on the host",
                             output);
    detail::require_pair(input.numel() == output.numel(), "kernels::unscale_and_check",
                         "each output must hold as many elements as its input", input, output);
    const DType from = input.dtype();
    // Dispatch follows inputs[0]: every other input must be on the host too.
    detail::require((from == DType::f32 || from == DType::f16 || from == DType::bf16) &&
                        input.device() == Device::cpu,
                    "kernels::unscale_and_check", "inputs must be f32, f16 or bf16 on the host",
                    input);
  }
  bool all_finite = true;
  for (std::size_t b = 0; b < inputs.size(); ++b) {
    const Tensor& input = inputs[b];
    Tensor& output = outputs[b];
    const DType from = input.dtype();
    const auto* in16 = static_cast<const std::uint16_t*>(input.raw());
    float* out = output.data<float>();
    // A 16-bit chunk is widened into its output chunk first and then scaled there in place.
    const float* in = from == DType::f32 ? static_cast<const float*>(input.raw()) : out;
    float non_finite_chunks = 0.f;
    const std::int64_t n = input.numel();
    const std::int64_t chunks = (n + kChunkElements - 1) / kChunkElements;
    parallel_reduce(
        label, chunks,
        [=](const std::int64_t chunk, float& count) {
          const std::int64_t begin = chunk * kChunkElements;
          const std::int64_t end = std::min(n, begin + kChunkElements);
          if (from != DType::f32) widen_to_f32(in16 + begin, from, out + begin, end - begin);
          count += scale_range(in, out, begin, end, inv_scale);
        },
        non_finite_chunks);
    all_finite = all_finite && non_finite_chunks == 0.f;
  }
  return all_finite;
}

}  // namespace mpt::kernels::host
