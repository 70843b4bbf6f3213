// Counter-based RNG: known-answer test against the Random123 Philox4x32-10 vectors, purity,
// and rough uniformity.
#include <gtest/gtest.h>

#include <cmath>

#include "core/random.hpp"

namespace mpt {
namespace {

TEST(Philox, MatchesRandom123KnownAnswers) {
  // Known-answer vectors published with Random123 (kat_vectors, philox4x32 10 rounds).
  auto zero = philox4x32({0, 0, 0, 0}, {0, 0});
  EXPECT_EQ(zero[0], 0x6627e8d5u);
  EXPECT_EQ(zero[1], 0xe169c58du);
  EXPECT_EQ(zero[2], 0xbc57ac4cu);
  EXPECT_EQ(zero[3], 0x9b00dbd8u);
  auto ones = philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu});
  EXPECT_EQ(ones[0], 0x408f276du);
  EXPECT_EQ(ones[1], 0x41c83b0eu);
  EXPECT_EQ(ones[2], 0xa20bc7c6u);
  EXPECT_EQ(ones[3], 0x6d5451fdu);
}

TEST(CounterRng, IsAPureFunctionOfSeedStreamAndCounter) {
  CounterRng a(42, 7), b(42, 7), c(43, 7), d(42, 8);
  EXPECT_EQ(a.bits(123), b.bits(123));
  EXPECT_NE(a.bits(123), c.bits(123));
  EXPECT_NE(a.bits(123), d.bits(123));
}

TEST(CounterRng, UniformHasMeanAndVarianceOfU01) {
  CounterRng rng(1, 2);
  const int n = 200000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < n; ++i) {
    const double u = rng.uniform(static_cast<std::uint64_t>(i));
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum_sq += u * u;
  }
  const double mean = sum / n, var = sum_sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.5, 0.005);
  EXPECT_NEAR(var, 1.0 / 12.0, 0.002);
}

TEST(CounterRng, BelowStaysInRangeAndCoversIt) {
  CounterRng rng(3, 4);
  int counts[7] = {};
  for (int i = 0; i < 70000; ++i) {
    auto v = rng.below(static_cast<std::uint64_t>(i), 7);
    ASSERT_LT(v, 7u);
    counts[v]++;
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
}

}  // namespace
}  // namespace mpt
