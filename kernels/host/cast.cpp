// Host casts between f32, f16 and bf16. fp16 uses the F16C instructions where the CPU has them
// (checked once at run time, so the binary still runs on CPUs without), bf16 is a rounding
// shift that the compiler vectorises.
#include <immintrin.h>

#include <cstring>

#include "core/half.hpp"
#include "kernels/cast.hpp"
#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {
namespace {

bool cpu_has_f16c() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}

__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* in, std::uint16_t* out,
                                                          std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) out[i] = float_to_half_bits(in[i]);
}

__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const std::uint16_t* in, float* out,
                                                          std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(v));
  }
  for (; i < n; ++i) out[i] = half_bits_to_float(in[i]);
}

void f32_to_f16(const float* in, std::uint16_t* out, std::int64_t n) {
  if (cpu_has_f16c()) return f32_to_f16_f16c(in, out, n);
  for (std::int64_t i = 0; i < n; ++i) out[i] = float_to_half_bits(in[i]);
}

void f16_to_f32(const std::uint16_t* in, float* out, std::int64_t n) {
  if (cpu_has_f16c()) return f16_to_f32_f16c(in, out, n);
  for (std::int64_t i = 0; i < n; ++i) out[i] = half_bits_to_float(in[i]);
}

void f32_to_bf16(const float* __restrict in, std::uint16_t* __restrict out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = float_to_bf16_bits(in[i]);
}

void bf16_to_f32(const std::uint16_t* __restrict in, float* __restrict out, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &bits, sizeof(float));
  }
}

// Converts elements [begin, end) from SRC's to DST's dtype, through a small f32 buffer when
// neither side is f32.
void cast_range(const void* src, DType from, void* dst, DType to, std::int64_t begin, std::int64_t end) {
  const std::int64_t n = end - begin;
  auto* f32_out = static_cast<float*>(dst) + (to == DType::f32 ? begin : 0);
  auto* u16_out = static_cast<std::uint16_t*>(dst) + (to != DType::f32 ? begin : 0);
  const auto* f32_in = static_cast<const float*>(src) + (from == DType::f32 ? begin : 0);
  const auto* u16_in = static_cast<const std::uint16_t*>(src) + (from != DType::f32 ? begin : 0);
  if (from == DType::f32) {
    (to == DType::f16 ? f32_to_f16 : f32_to_bf16)(f32_in, u16_out, n);
  } else if (to == DType::f32) {
    (from == DType::f16 ? f16_to_f32 : bf16_to_f32)(u16_in, f32_out, n);
  } else {
    float widened[kChunkElements];
    (from == DType::f16 ? f16_to_f32 : bf16_to_f32)(u16_in, widened, n);
    (to == DType::f16 ? f32_to_f16 : f32_to_bf16)(widened, u16_out, n);
  }
}

bool is_float_storage(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16;
}

}  // namespace

void cast(const Tensor& src, Tensor& dst) {
  static const std::string label = "kernels::cast";
  detail::require(src.defined() && is_float_storage(src.dtype()), "kernels::cast",
                  "src must be f32, f16 or bf16", src);
  detail::require(dst.defined() && is_float_storage(dst.dtype()), "kernels::cast",
                  "dst must be f32, f16 or bf16", dst);
  detail::require_pair(src.numel() == dst.numel(), "kernels::cast",
                       "src and dst must have the same number of elements", src, dst);
  if (src.raw() == dst.raw() && src.dtype() == dst.dtype()) return;
  if (src.dtype() == dst.dtype()) {
    std::memcpy(dst.raw(), src.raw(), src.size_bytes());
    return;
  }
  const void* in = src.raw();
  void* out = dst.raw();
  const DType from = src.dtype(), to = dst.dtype();
  parallel_chunks(label, src.numel(), [=](std::int64_t begin, std::int64_t end) {
    cast_range(in, from, out, to, begin, end);
  });
}

}  // namespace mpt::kernels::host
