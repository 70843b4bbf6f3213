// Host finite test (see kernels/finite.hpp). f32 folds (x - x) into a sum, as unscale_and_check
// does; 16-bit storage compares the magnitude bits with those of Inf. Both stay branch-free.
#include "kernels/finite.hpp"

#include <cstdint>

#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

bool all_finite(const Tensor& x) {
  static const std::string label = "kernels::all_finite";
  const DType dtype = x.dtype();
  detail::require(x.defined() && x.device() == Device::cpu &&
                      (dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16),
                  "kernels::all_finite", "x must be f32, f16 or bf16 on the host", x);
  const std::int64_t n = x.numel();
  const std::int64_t chunks = (n + kChunkElements - 1) / kChunkElements;
  if (dtype == DType::f32) {
    const float* in = x.data<float>();
    float poison = 0.f;
    parallel_reduce(
        label, chunks,
        [=](const std::int64_t chunk, float& sum) {
          const std::int64_t begin = chunk * kChunkElements;
          const std::int64_t end = std::min(n, begin + kChunkElements);
          float local = 0.f;
          for (std::int64_t i = begin; i < end; ++i) local += in[i] - in[i];
          sum += local;
        },
        poison);
    return poison == 0.f;
  }
  const auto* in = static_cast<const std::uint16_t*>(x.raw());
  const std::uint16_t inf = dtype == DType::f16 ? 0x7c00u : 0x7f80u;
  std::int64_t bad = 0;
  parallel_reduce(
      label, chunks,
      [=](const std::int64_t chunk, std::int64_t& count) {
        const std::int64_t begin = chunk * kChunkElements;
        const std::int64_t end = std::min(n, begin + kChunkElements);
        std::int64_t local = 0;
        for (std::int64_t i = begin; i < end; ++i) local += (in[i] & 0x7fffu) >= inf;
        count += local;
      },
      bad);
  return bad == 0;
}

}  // namespace mpt::kernels::host
