// Host casts between f32, f16 and bf16. fp16 uses the F16C instructions and bf16 AVX2 integer
// rounding where the CPU has them (checked once at run time, so the binary still runs on CPUs
// without; the portable loops are the scalar converters of core/half.hpp).
#include "kernels/cast.hpp"

#include <cpuid.h>
#include <immintrin.h>

#include <cstring>

#include "core/half.hpp"
#include "kernels/host/convert.hpp"
#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {
namespace {

bool cpu_has_f16c() {
  // CPUID leaf 1, ECX bit 29, rather than __builtin_cpu_supports("f16c"), which clang 14 (the
  // fuzz build's compiler) does not know.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
           (ecx & bit_F16C) != 0;
  }();
  return has;
}

__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* in, std::uint16_t* out,
                                                         std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(in + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
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

__attribute__((target("avx,f16c"))) void f32_to_f16_and_back_f16c(const float* in,
                                                                  std::uint16_t* rounded,
                                                                  float* widened, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(rounded + i), h);
    _mm256_storeu_ps(widened + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) {
    rounded[i] = float_to_half_bits(in[i]);
    widened[i] = half_bits_to_float(rounded[i]);
  }
}

void f32_to_f16(const float* in, std::uint16_t* out, std::int64_t n) {
  if (cpu_has_f16c()) return f32_to_f16_f16c(in, out, n);
  for (std::int64_t i = 0; i < n; ++i) out[i] = float_to_half_bits(in[i]);
}

void f16_to_f32(const std::uint16_t* in, float* out, std::int64_t n) {
  if (cpu_has_f16c()) return f16_to_f32_f16c(in, out, n);
  for (std::int64_t i = 0; i < n; ++i) out[i] = half_bits_to_float(in[i]);
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// 8 floats (as bits) to bf16 bits in the low 16 of each 32-bit lane: round to nearest even,
// NaN kept quiet; the same rule as float_to_bf16_bits.
__attribute__((target("avx2"))) inline __m256i round_to_bf16_lanes(__m256i x) {
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i magnitude = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, is_nan);
}

// The low 16 bits of 8 lanes (each <= 0xffff) packed into 8 consecutive uint16.
__attribute__((target("avx2"))) inline __m128i pack_lanes(__m256i lanes) {
  const __m256i packed = _mm256_packus_epi32(lanes, lanes);  // per 128-bit half
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float* in, std::uint16_t* out,
                                                      std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), pack_lanes(round_to_bf16_lanes(x)));
  }
  for (; i < n; ++i) out[i] = float_to_bf16_bits(in[i]);
}

__attribute__((target("avx2"))) void bf16_to_f32_avx2(const std::uint16_t* in, float* out,
                                                      std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i h =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_slli_epi32(h, 16));
  }
  for (; i < n; ++i) out[i] = bf16_bits_to_float(in[i]);
}

__attribute__((target("avx2"))) void f32_to_bf16_and_back_avx2(const float* in,
                                                               std::uint16_t* rounded,
                                                               float* widened, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i bits =
        round_to_bf16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(rounded + i), pack_lanes(bits));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(widened + i), _mm256_slli_epi32(bits, 16));
  }
  for (; i < n; ++i) {
    rounded[i] = float_to_bf16_bits(in[i]);
    widened[i] = bf16_bits_to_float(rounded[i]);
  }
}

void f32_to_bf16(const float* __restrict in, std::uint16_t* __restrict out, std::int64_t n) {
  if (cpu_has_avx2()) return f32_to_bf16_avx2(in, out, n);
  for (std::int64_t i = 0; i < n; ++i) out[i] = float_to_bf16_bits(in[i]);
}

void bf16_to_f32(const std::uint16_t* __restrict in, float* __restrict out, std::int64_t n) {
  if (cpu_has_avx2()) return bf16_to_f32_avx2(in, out, n);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &bits, sizeof(float));
  }
}

void f32_to_bf16_and_back(const float* __restrict in, std::uint16_t* __restrict rounded,
                          float* __restrict widened, std::int64_t n) {
  if (cpu_has_avx2()) return f32_to_bf16_and_back_avx2(in, rounded, widened, n);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint16_t bits = float_to_bf16_bits(in[i]);
    rounded[i] = bits;
    const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
    std::memcpy(widened + i, &wide, sizeof(float));
  }
}

// Converts elements [begin, end) from SRC's to DST's dtype, through a small f32 buffer when
// neither side is f32.
void cast_range(const void* src, DType from, void* dst, DType to, std::int64_t begin,
                std::int64_t end) {
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

void widen_to_f32(const std::uint16_t* in, DType from, float* out, std::int64_t n) {
  (from == DType::f16 ? f16_to_f32 : bf16_to_f32)(in, out, n);
}

void round_from_f32(const float* in, DType to, std::uint16_t* out, std::int64_t n) {
  (to == DType::f16 ? f32_to_f16 : f32_to_bf16)(in, out, n);
}

void round_and_widen_f32(const float* in, DType to, std::uint16_t* rounded, float* widened,
                         std::int64_t n) {
  if (to == DType::bf16) return f32_to_bf16_and_back(in, rounded, widened, n);
  if (cpu_has_f16c()) return f32_to_f16_and_back_f16c(in, rounded, widened, n);
  for (std::int64_t i = 0; i < n; ++i) {
    rounded[i] = float_to_half_bits(in[i]);
    widened[i] = half_bits_to_float(rounded[i]);
  }
}

void round_and_widen(const Tensor& src, Tensor& rounded, Tensor& widened) {
  static const std::string label = "kernels::round_and_widen";
  constexpr const char* op = "kernels::round_and_widen";
  detail::require_host_f32(op, "src must be f32 on the host", src);
  detail::require_host_f32(op, "widened must be f32 on the host", widened);
  detail::require(rounded.defined() && rounded.device() == Device::cpu &&
                      (rounded.dtype() == DType::f16 || rounded.dtype() == DType::bf16),
                  op, "rounded must be f16 or bf16 on the host", rounded);
  detail::require_pair(src.numel() == rounded.numel(), op,
                       "src and rounded must have the same number of elements", src, rounded);
  detail::require_pair(src.numel() == widened.numel(), op,
                       "src and widened must have the same number of elements", src, widened);
  const float* in = src.data<float>();
  auto* out16 = static_cast<std::uint16_t*>(rounded.raw());
  float* out32 = widened.data<float>();
  const DType to = rounded.dtype();
  parallel_chunks(label, src.numel(), [=](std::int64_t begin, std::int64_t end) {
    round_and_widen_f32(in + begin, to, out16 + begin, out32 + begin, end - begin);
  });
}

void cast(const Tensor& src, Tensor& dst) {
  static const std::string label = "kernels::cast";
  detail::require(src.defined() && is_float_storage(src.dtype()) && src.device() == Device::cpu,
                  "kernels::cast", "src must be f32, f16 or bf16 on the host", src);
  detail::require(dst.defined() && is_float_storage(dst.dtype()), "kernels::cast",
                  "dst must be f32, f16 or bf16", dst);
  // Dispatch follows src: a device dst here would be written through a host pointer.
  detail::require(dst.device() == Device::cpu, "kernels::cast",
                  "dst must be on the host, as src is (move tensors with Tensor::to)", dst);
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
