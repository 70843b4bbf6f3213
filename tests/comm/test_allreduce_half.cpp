// World::allreduce_sum on fp16 and bf16 buffers, under mpiexec -n 1, 2 and 4: the sums are right
// to 16-bit rounding, every rank gets the same bits, and Inf from one rank reaches every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "comm/comm.hpp"
#include "core/half.hpp"
#include "core/random.hpp"

namespace mpt::comm {
namespace {

float widen(DType dtype, std::uint16_t bits) {
  return dtype == DType::f16 ? half_bits_to_float(bits) : bf16_bits_to_float(bits);
}
std::uint16_t round_to(DType dtype, float value) {
  return dtype == DType::f16 ? float_to_half_bits(value) : float_to_bf16_bits(value);
}
// Unit roundoff of the 16-bit format: half an ulp of 1.
double unit_roundoff(DType dtype) { return dtype == DType::f16 ? 0x1p-11 : 0x1p-8; }

// Rank R's value at index I: mixed signs, magnitudes from 2^-8 to 2^8, already 16-bit.
std::uint16_t contribution(DType dtype, int rank, std::int64_t i) {
  const CounterRng rng(1234, static_cast<std::uint64_t>(rank));
  const float u = rng.uniform(static_cast<std::uint64_t>(i));
  const float magnitude = std::ldexp(1.f + u, static_cast<int>(i % 17) - 8);
  return round_to(dtype, (i + rank) % 3 == 0 ? -magnitude : magnitude);
}

// Every rank's copy of RESULT, checked against rank 0's, bit for bit.
void expect_identical_on_every_rank(const World& world, const Tensor& result) {
  const int n = static_cast<int>(result.numel());
  std::vector<std::uint16_t> all(static_cast<std::size_t>(n) * world.size());
  MPI_Allgather(result.raw(), n, MPI_UINT16_T, all.data(), n, MPI_UINT16_T, world.handle());
  for (int r = 1; r < world.size(); ++r)
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(all[static_cast<std::size_t>(r) * n + i], all[i]) << "rank " << r << " index " << i;
}

class AllreduceHalf : public testing::TestWithParam<DType> {};

TEST_P(AllreduceHalf, SumIsRightToSixteenBitRoundingAndIdenticalOnEveryRank) {
  const DType dtype = GetParam();
  World world;
  // Odd sizes, one element, and one large enough for Open MPI's segmented algorithms.
  for (const std::int64_t count : {0L, 1L, 7L, 1001L, 300001L}) {
    SCOPED_TRACE("count " + std::to_string(count));
    Tensor data({count}, dtype);
    auto* bits = static_cast<std::uint16_t*>(data.raw());
    for (std::int64_t i = 0; i < count; ++i) bits[i] = contribution(dtype, world.rank(), i);
    world.allreduce_sum(data);
    // Each of the size-1 additions rounds a partial sum whose magnitude is at most the sum of
    // magnitudes, so |error| <= (size - 1) * u * sum |x_r|; with one rank it is exact.
    const double u = unit_roundoff(dtype);
    for (std::int64_t i = 0; i < count; ++i) {
      double exact = 0, magnitudes = 0;
      for (int r = 0; r < world.size(); ++r) {
        const double v = widen(dtype, contribution(dtype, r, i));
        exact += v;
        magnitudes += std::fabs(v);
      }
      const double got = widen(dtype, bits[i]);
      ASSERT_LE(std::fabs(got - exact), (world.size() - 1) * u * magnitudes) << "index " << i;
    }
    expect_identical_on_every_rank(world, data);
  }
}

TEST_P(AllreduceHalf, ExactWhenEverySumIsRepresentable) {
  const DType dtype = GetParam();
  World world;
  Tensor data({100}, dtype);
  auto* bits = static_cast<std::uint16_t*>(data.raw());
  // Small integers: every partial sum is exact in both formats (bf16 has 8 significant bits).
  for (int i = 0; i < 100; ++i)
    bits[i] = round_to(dtype, static_cast<float>((i + world.rank()) % 9 - 4));
  world.allreduce_sum(data);
  for (int i = 0; i < 100; ++i) {
    float expected = 0;
    for (int r = 0; r < world.size(); ++r) expected += static_cast<float>((i + r) % 9 - 4);
    ASSERT_EQ(widen(dtype, bits[i]), expected) << i;
  }
}

TEST_P(AllreduceHalf, InfOnOneRankReachesEveryRank) {
  const DType dtype = GetParam();
  World world;
  Tensor data({50}, dtype);
  auto* bits = static_cast<std::uint16_t*>(data.raw());
  for (int i = 0; i < 50; ++i) bits[i] = round_to(dtype, 1.f);
  // The last rank's local gradient overflowed at index 17.
  if (world.rank() == world.size() - 1) bits[17] = round_to(dtype, INFINITY);
  world.allreduce_sum(data);
  EXPECT_TRUE(std::isinf(widen(dtype, bits[17])));
  EXPECT_EQ(widen(dtype, bits[16]), static_cast<float>(world.size()));
}

TEST_P(AllreduceHalf, BroadcastCopiesTheBits) {
  const DType dtype = GetParam();
  World world;
  Tensor data({3}, dtype);
  if (world.rank() == 0) static_cast<std::uint16_t*>(data.raw())[1] = round_to(dtype, -0.375f);
  world.broadcast(data, 0);
  EXPECT_EQ(widen(dtype, static_cast<std::uint16_t*>(data.raw())[1]), -0.375f);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AllreduceHalf, testing::Values(DType::f16, DType::bf16),
                         [](const testing::TestParamInfo<DType>& info) {
                           return std::string(info.param == DType::f16 ? "fp16" : "bf16");
                         });

}  // namespace
}  // namespace mpt::comm
