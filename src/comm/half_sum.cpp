// MPI sums of fp16 and bf16 buffers (see half_sum.hpp). The addition is commutative and
// deterministic, so an MPI_Allreduce with these ops gives every rank the same bits.
#include "comm/half_sum.hpp"

#include <immintrin.h>

#include <cstdint>

#include "core/half.hpp"

namespace mpt::comm::detail {
namespace {

bool cpu_has_f16c() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}

__attribute__((target("avx,f16c"))) void sum_f16_f16c(const std::uint16_t* in, std::uint16_t* inout,
                                                      std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(inout + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(inout + i),
                     _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i)
    inout[i] = float_to_half_bits(half_bits_to_float(in[i]) + half_bits_to_float(inout[i]));
}

}  // namespace

void sum_f16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  const std::int64_t n = *len;
  if (cpu_has_f16c()) return sum_f16_f16c(a, b, n);
  for (std::int64_t i = 0; i < n; ++i)
    b[i] = float_to_half_bits(half_bits_to_float(a[i]) + half_bits_to_float(b[i]));
}

void sum_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* __restrict a = static_cast<const std::uint16_t*>(in);
  auto* __restrict b = static_cast<std::uint16_t*>(inout);
  const std::int64_t n = *len;
  // Widening is a shift and rounding a few integer ops: the compiler vectorises this loop.
  for (std::int64_t i = 0; i < n; ++i)
    b[i] = float_to_bf16_bits(bf16_bits_to_float(a[i]) + bf16_bits_to_float(b[i]));
}

}  // namespace mpt::comm::detail
