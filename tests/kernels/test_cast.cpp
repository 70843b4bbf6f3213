// fp16 and bf16 conversion: the scalar converters against independent references (GCC's
// _Float16 for fp16, a nearest-value search over all 65536 bf16 values for bf16), and the bulk
// kernel (F16C where available) against the scalar converters, including subnormals, Inf, NaN.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/half.hpp"
#include "core/random.hpp"
#include "kernels/cast.hpp"

namespace mpt {
namespace {

// Floats that exercise rounding: every fp16 value, the midpoints between neighbours and one
// float ulp either side of them, powers of two across the whole exponent range, random bits.
std::vector<float> probe_values() {
  std::vector<float> values;
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const float h = half_bits_to_float(static_cast<std::uint16_t>(bits));
    values.push_back(h);
    const float next = half_bits_to_float(static_cast<std::uint16_t>(bits + 1));
    if (std::isfinite(h) && std::isfinite(next) && (bits & 0x7fffu) != 0x7fffu) {
      const float mid = static_cast<float>((static_cast<double>(h) + next) / 2);
      values.push_back(mid);
      values.push_back(std::nextafter(mid, 0.f));
      values.push_back(std::nextafter(mid, std::numeric_limits<float>::infinity()));
      values.push_back(std::nextafter(mid, -std::numeric_limits<float>::infinity()));
    }
  }
  for (int e = -149; e <= 127; ++e) values.push_back(std::ldexp(1.0f, e));
  CounterRng rng(7, 7);
  for (std::uint64_t i = 0; i < 200000; ++i) values.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(rng.bits(i))));
  values.push_back(std::numeric_limits<float>::infinity());
  values.push_back(-std::numeric_limits<float>::infinity());
  values.push_back(65504.f);
  values.push_back(65519.99f);
  values.push_back(65520.f);
  values.push_back(std::numeric_limits<float>::max());
  return values;
}

bool same_bits_or_both_nan(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

TEST(Half, DecodesEveryBitPatternLikeFloat16) {
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    _Float16 reference;
    const auto b16 = static_cast<std::uint16_t>(bits);
    std::memcpy(&reference, &b16, 2);
    ASSERT_TRUE(same_bits_or_both_nan(half_bits_to_float(b16), static_cast<float>(reference)))
        << std::hex << bits;
  }
}

TEST(Half, EncodesWithRoundToNearestEvenLikeFloat16) {
  for (const float value : probe_values()) {
    const _Float16 reference = static_cast<_Float16>(value);
    std::uint16_t reference_bits;
    std::memcpy(&reference_bits, &reference, 2);
    const std::uint16_t bits = float_to_half_bits(value);
    if (std::isnan(value)) {
      ASSERT_EQ(bits & 0x7c00u, 0x7c00u);
      ASSERT_NE(bits & 0x3ffu, 0u);
    } else {
      ASSERT_EQ(bits, reference_bits) << value;
    }
  }
  EXPECT_EQ(float_to_half_bits(1e-8f), 0u);                  // underflow to zero
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.f, -24)), 1u);   // smallest subnormal
  EXPECT_EQ(float_to_half_bits(70000.f), 0x7c00u);           // overflow to Inf
  EXPECT_EQ(float_to_half_bits(-0.f), 0x8000u);
}

// bf16 reference: the nearest of all finite bf16 values in double arithmetic, ties to the
// value with an even last bit, and anything beyond max + half an ulp to Inf.
std::uint16_t bf16_reference(float value) {
  static const std::vector<std::pair<double, std::uint16_t>> table = [] {
    std::vector<std::pair<double, std::uint16_t>> t;
    for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
      const float v = bf16_bits_to_float(static_cast<std::uint16_t>(bits));
      if (std::isfinite(v) && !(v == 0 && std::signbit(v))) t.emplace_back(v, static_cast<std::uint16_t>(bits));
    }
    std::sort(t.begin(), t.end());
    return t;
  }();
  const double x = value;
  const double max = table.back().first;
  const double max_half_ulp = (max - table[table.size() - 2].first) / 2;
  if (x >= max + max_half_ulp) return 0x7f80u;
  if (x <= -(max + max_half_ulp)) return 0xff80u;
  auto upper = std::lower_bound(table.begin(), table.end(), std::make_pair(x, std::uint16_t{0}));
  if (upper == table.end()) return table.back().second;
  if (upper->first == x || upper == table.begin()) {
    if (x == 0) return std::signbit(value) ? 0x8000u : 0u;
    return upper->second;
  }
  const auto lower = upper - 1;
  const double below = x - lower->first, above = upper->first - x;
  std::uint16_t bits;
  if (below < above) bits = lower->second;
  else if (above < below) bits = upper->second;
  else bits = (lower->second & 1u) ? upper->second : lower->second;
  // A negative value that rounds to zero keeps its sign.
  if (bf16_bits_to_float(bits) == 0 && std::signbit(value)) bits = 0x8000u;
  return bits;
}

TEST(BFloat16, EncodesWithRoundToNearestEven) {
  CounterRng rng(9, 9);
  std::vector<float> values = probe_values();
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {  // every bf16 value and its midpoints
    const float v = bf16_bits_to_float(static_cast<std::uint16_t>(bits));
    values.push_back(v);
    values.push_back(std::bit_cast<float>((bits << 16) | 0x8000u));
    values.push_back(std::bit_cast<float>((bits << 16) | 0x8001u));
    values.push_back(std::bit_cast<float>((bits << 16) | 0x7fffu));
  }
  for (const float value : values) {
    const std::uint16_t bits = float_to_bf16_bits(value);
    if (std::isnan(value)) {
      ASSERT_TRUE(std::isnan(bf16_bits_to_float(bits)));
    } else {
      ASSERT_EQ(bits, bf16_reference(value)) << value;
    }
  }
}

TEST(CastKernel, MatchesScalarConvertersBothWays) {
  auto values = probe_values();
  const auto n = static_cast<std::int64_t>(values.size());
  Tensor f32({n}, DType::f32), f16({n}, DType::f16), bf16({n}, DType::bf16), back({n}, DType::f32);
  std::copy(values.begin(), values.end(), f32.data<float>());
  kernels::cast(f32, f16);
  kernels::cast(f32, bf16);
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = values[static_cast<std::size_t>(i)];
    if (std::isnan(v)) {
      ASSERT_TRUE(std::isnan(to_float(f16.data<Half>()[i])));
      ASSERT_TRUE(std::isnan(to_float(bf16.data<BFloat16>()[i])));
      continue;
    }
    ASSERT_EQ(f16.data<Half>()[i].bits, float_to_half_bits(v)) << v;
    ASSERT_EQ(bf16.data<BFloat16>()[i].bits, float_to_bf16_bits(v)) << v;
  }
  kernels::cast(f16, back);
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_TRUE(same_bits_or_both_nan(back.data<float>()[i], to_float(f16.data<Half>()[i])));
  kernels::cast(bf16, back);
  for (std::int64_t i = 0; i < n; ++i)
    ASSERT_TRUE(same_bits_or_both_nan(back.data<float>()[i], to_float(bf16.data<BFloat16>()[i])));
  // f16 -> bf16 goes through f32 exactly.
  Tensor direct({n}, DType::bf16);
  kernels::cast(f16, direct);
  for (std::int64_t i = 0; i < n; ++i) {
    const float wide = to_float(f16.data<Half>()[i]);
    if (!std::isnan(wide)) {
      ASSERT_EQ(direct.data<BFloat16>()[i].bits, float_to_bf16_bits(wide));
    }
  }
}

TEST(CastKernel, OddLengthsAndViews) {
  for (std::int64_t n : {0, 1, 7, 8, 9, 16383, 16385}) {
    Tensor src({n + 3}, DType::f32), dst({n}, DType::f16);
    for (std::int64_t i = 0; i < n + 3; ++i) src.data<float>()[i] = 0.37f * static_cast<float>(i) - 3.f;
    Tensor view = Tensor::view(src, 3, {n});
    kernels::cast(view, dst);
    for (std::int64_t i = 0; i < n; ++i)
      ASSERT_EQ(dst.data<Half>()[i].bits, float_to_half_bits(view.data<float>()[i])) << n << " " << i;
  }
}

}  // namespace
}  // namespace mpt
