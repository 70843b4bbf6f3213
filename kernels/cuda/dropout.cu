// CUDA dropout (see kernels/dropout.hpp): the host's Philox4x32-10 masks bit for bit, one thread
// per group of four elements (one Philox call), the scale applied in f32 and rounded once.
#include "kernels/cuda/common.cuh"
#include "kernels/dropout.hpp"

namespace mpt::kernels::cuda {
namespace {

// core/random.hpp's philox4x32 on the device (that one is host-only): COUNTER becomes the four
// 32-bit draws for KEY.
__device__ inline void philox4x32(std::uint32_t (&counter)[4], std::uint32_t key0,
                                  std::uint32_t key1) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint32_t hi0 = __umulhi(kMul0, counter[0]), lo0 = kMul0 * counter[0];
    const std::uint32_t hi1 = __umulhi(kMul1, counter[2]), lo1 = kMul1 * counter[2];
    const std::uint32_t next[4] = {hi1 ^ counter[1] ^ key0, lo1, hi0 ^ counter[3] ^ key1, lo0};
    for (int lane = 0; lane < 4; ++lane) counter[lane] = next[lane];
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
}

void check(const char* op, float p, const Tensor& in, const Tensor& out) {
  detail::require(in.defined() && in.device() == Device::cuda && is_float_dtype(in.dtype()), op,
                  "input must be f32, f16 or bf16 on the cuda device", in);
  detail::require(out.defined() && out.device() == Device::cuda && is_float_dtype(out.dtype()), op,
                  "output must be f32, f16 or bf16 on the cuda device", out);
  detail::require_pair(in.numel() == out.numel(), op, "tensors must have the same element count",
                       in, out);
  detail::require(p >= 0.f && p < 1.f, op, "drop probability must be in [0, 1)", in);
}

// OUT = IN * scale where kept, else 0, over the whole tensor. Element index e = first_element +
// position; group e / 4 is one Philox call, lane e % 4 its draw, as on the host. The first and
// last groups may hold elements outside the tensor, which are skipped.
void masked_scale(const char* op, const Tensor& in_tensor, float p, const DropoutKey& key,
                  Tensor& out_tensor) {
  check(op, p, in_tensor, out_tensor);
  const std::int64_t n = in_tensor.numel();
  if (n == 0) return;
  const void* in = in_tensor.raw();
  void* out = out_tensor.raw();
  const bool in_16 = in_tensor.dtype() != DType::f32, in_f16 = in_tensor.dtype() == DType::f16;
  const bool out_16 = out_tensor.dtype() != DType::f32, out_f16 = out_tensor.dtype() == DType::f16;
  // Draws >= cut are kept: P * 2^32 in double, so that P = 0 keeps every element (the host's).
  const std::uint64_t cut = static_cast<std::uint64_t>(static_cast<double>(p) * 4294967296.0);
  const float scale = 1.f / (1.f - p);
  const std::uint64_t first = key.first_element, end = first + static_cast<std::uint64_t>(n);
  const std::uint64_t first_group = first / 4;
  const std::int64_t groups = static_cast<std::int64_t>((end - 1) / 4 - first_group + 1);
  const std::uint32_t stream0 = static_cast<std::uint32_t>(key.stream),
                      stream1 = static_cast<std::uint32_t>(key.stream >> 32);
  const std::uint32_t seed0 = static_cast<std::uint32_t>(key.seed),
                      seed1 = static_cast<std::uint32_t>(key.seed >> 32);
  launch_elementwise(op, groups, [=] __device__(std::int64_t t) {
    const std::uint64_t group = first_group + static_cast<std::uint64_t>(t);
    std::uint32_t draws[4] = {static_cast<std::uint32_t>(group),
                              static_cast<std::uint32_t>(group >> 32), stream0, stream1};
    philox4x32(draws, seed0, seed1);
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const std::uint64_t element = group * 4 + static_cast<std::uint64_t>(lane);
      if (element < first || element >= end) continue;
      const auto i = static_cast<std::int64_t>(element - first);
      const float v = in_16 ? widen16(static_cast<const std::uint16_t*>(in)[i], in_f16)
                            : static_cast<const float*>(in)[i];
      const float w = draws[lane] >= cut ? __fmul_rn(v, scale) : 0.f;
      if (out_16)
        static_cast<std::uint16_t*>(out)[i] = round16(w, out_f16);
      else
        static_cast<float*>(out)[i] = w;
    }
  });
}

}  // namespace

void dropout_forward(const Tensor& x, float p, const DropoutKey& key, Tensor& y) {
  masked_scale("kernels::cuda::dropout_forward", x, p, key, y);
}

void dropout_backward(const Tensor& dy, float p, const DropoutKey& key, Tensor& dx) {
  masked_scale("kernels::cuda::dropout_backward", dy, p, key, dx);
}

}  // namespace mpt::kernels::cuda
