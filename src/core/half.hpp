// 16-bit floating-point storage types: IEEE binary16 (fp16) and bfloat16 (bf16). Values are
// stored as bits and converted to and from float with round-to-nearest-even; all arithmetic
// happens in float. Bulk conversion with F16C lives in kernels/cast.hpp.
#pragma once

#include <bit>
#include <cstdint>

#include "core/tensor.hpp"

namespace mpt {

struct Half {
  std::uint16_t bits;
};
struct BFloat16 {
  std::uint16_t bits;
};

template <> constexpr DType dtype_of<Half>() { return DType::f16; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::bf16; }

// float -> binary16, round to nearest even; overflow gives Inf, NaN stays a (quiet) NaN, and
// values below the smallest subnormal (2^-24) round to zero with their sign.
constexpr std::uint16_t float_to_half_bits(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65520
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): shift the full significand into place with RNE.
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25: rounds to 0
    const std::uint32_t exponent = abs >> 23;
    const std::uint32_t significand = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // 14..24
    const std::uint32_t kept = significand >> shift;
    const std::uint32_t rest = significand & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    const std::uint32_t round = (rest > halfway || (rest == halfway && (kept & 1u))) ? 1u : 0u;
    return static_cast<std::uint16_t>(sign | (kept + round));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  const std::uint32_t rebased = abs - 0x38000000u;
  const std::uint32_t round = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rebased + round) >> 13));
}

constexpr float half_bits_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu;
  std::uint32_t significand = bits & 0x3ffu;
  if (exponent == 0x1fu) return std::bit_cast<float>(sign | 0x7f800000u | (significand << 13));
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (significand << 13));
  if (significand == 0) return std::bit_cast<float>(sign);
  // Subnormal: normalise the significand.
  std::uint32_t e = 113u;
  while (!(significand & 0x400u)) {
    significand <<= 1;
    --e;
  }
  return std::bit_cast<float>(sign | (e << 23) | ((significand & 0x3ffu) << 13));
}

// float -> bfloat16: the top 16 bits, rounded to nearest even; NaN stays a quiet NaN.
constexpr std::uint16_t float_to_bf16_bits(float value) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

constexpr float bf16_bits_to_float(std::uint16_t bits) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

inline Half to_half(float value) { return Half{float_to_half_bits(value)}; }
inline float to_float(Half value) { return half_bits_to_float(value.bits); }
inline BFloat16 to_bf16(float value) { return BFloat16{float_to_bf16_bits(value)}; }
inline float to_float(BFloat16 value) { return bf16_bits_to_float(value.bits); }

}  // namespace mpt
