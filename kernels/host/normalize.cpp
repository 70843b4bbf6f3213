// Host uint8 -> f32 normalisation (see kernels/normalize.hpp).
#include "kernels/normalize.hpp"

#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

void normalize_u8(const Tensor& in, Tensor& out, float scale, float shift) {
  static const std::string label = "kernels::normalize_u8";
  detail::require(in.defined() && in.dtype() == DType::u8 && in.device() == Device::cpu,
                  "kernels::normalize_u8", "in must be uint8 on the host", in);
  detail::require_host_f32("kernels::normalize_u8", "out must be f32 on the host", out);
  detail::require_pair(in.numel() == out.numel(), "kernels::normalize_u8",
                       "in and out must have the same number of elements", in, out);
  const std::uint8_t* __restrict source = in.data<std::uint8_t>();
  float* __restrict target = out.data<float>();
  parallel_chunks(label, in.numel(), [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i)
      target[i] = static_cast<float>(source[i]) * scale + shift;
  });
}

}  // namespace mpt::kernels::host
