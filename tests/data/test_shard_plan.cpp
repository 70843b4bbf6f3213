// Tests of ShardPlan and eval_shard: permutations, disjoint and covering shards, and the property
// the trainer relies on: the union of the ranks' batches is the 1-rank batch of the global size.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "core/random.hpp"
#include "data/data.hpp"
#include "tests/test_util.hpp"

namespace mpt::data {
namespace {

TEST(ShardPlan, EpochPermutationIsAPermutationAndAPureFunction) {
  for (std::int64_t n : {1, 2, 17, 1000}) {
    auto p = ShardPlan::epoch_permutation(n, 42, 3);
    auto sorted = p;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::int64_t> identity(static_cast<std::size_t>(n));
    std::iota(identity.begin(), identity.end(), 0);
    EXPECT_EQ(sorted, identity);
    EXPECT_EQ(p, ShardPlan::epoch_permutation(n, 42, 3));
  }
  const auto a = ShardPlan::epoch_permutation(1000, 42, 0);
  EXPECT_NE(a, ShardPlan::epoch_permutation(1000, 42, 1));  // epochs differ
  EXPECT_NE(a, ShardPlan::epoch_permutation(1000, 43, 0));  // seeds differ
}

TEST(ShardPlan, DocumentedFisherYatesConvention) {
  // The permutation is spelled out in data.hpp and docs; re-derive it here independently.
  const std::int64_t n = 50;
  const std::uint64_t seed = 7;
  const std::int64_t epoch = 2;
  std::vector<std::int64_t> expected(n);
  std::iota(expected.begin(), expected.end(), 0);
  const CounterRng rng(seed, 0x5348554646ull ^ static_cast<std::uint64_t>(epoch));
  for (std::int64_t i = n - 1; i > 0; --i)
    std::swap(
        expected[static_cast<std::size_t>(i)],
        expected[rng.below(static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(i + 1))]);
  EXPECT_EQ(ShardPlan::epoch_permutation(n, seed, epoch), expected);
}

TEST(ShardPlan, CountsAndDropLast) {
  ShardPlan plan(1000, 32, 3, 0, 1);
  EXPECT_EQ(plan.global_batch(), 96);
  EXPECT_EQ(plan.steps_per_epoch(), 10);  // 1000 / 96, remainder 40 dropped
}

TEST(ShardPlan, ShardsAreDisjointAndCoverTheEpochMinusRemainder) {
  for (bool shuffle : {true, false}) {
    const std::int64_t n = 1000, batch = 32;
    const int world = 3;
    std::vector<std::int64_t> all;
    for (int rank = 0; rank < world; ++rank) {
      ShardPlan plan(n, batch, world, rank, 9, shuffle);
      std::vector<std::int64_t> indices;
      for (std::int64_t step = 0; step < plan.steps_per_epoch(); ++step) {
        plan.batch_indices(4, step, indices);
        ASSERT_EQ(indices.size(), 32u);
        all.insert(all.end(), indices.begin(), indices.end());
      }
    }
    std::set<std::int64_t> unique(all.begin(), all.end());
    EXPECT_EQ(unique.size(), all.size()) << "shards overlap";
    EXPECT_EQ(all.size(), 960u);
    // The dropped samples are exactly the permutation's tail.
    const auto permutation = shuffle ? ShardPlan::epoch_permutation(n, 9, 4) : [&] {
      std::vector<std::int64_t> identity(n);
      std::iota(identity.begin(), identity.end(), 0);
      return identity;
    }();
    for (std::int64_t k = 960; k < n; ++k)
      EXPECT_EQ(unique.count(permutation[static_cast<std::size_t>(k)]), 0u);
  }
}

TEST(ShardPlan, UnionOfRanksEqualsOneRankWithTheGlobalBatch) {
  const std::int64_t n = 777;
  for (int world : {2, 3, 4}) {
    ShardPlan single(n, 8 * world, 1, 0, 11);
    std::vector<ShardPlan> ranks;
    for (int rank = 0; rank < world; ++rank) ranks.emplace_back(n, 8, world, rank, 11);
    ASSERT_EQ(single.steps_per_epoch(), ranks[0].steps_per_epoch());
    std::vector<std::int64_t> expected, part;
    for (std::int64_t epoch : {0, 1, 5}) {
      for (std::int64_t step = 0; step < single.steps_per_epoch(); ++step) {
        single.batch_indices(epoch, step, expected);
        std::vector<std::int64_t> joined;
        for (auto& plan : ranks) {
          plan.batch_indices(epoch, step, part);
          joined.insert(joined.end(), part.begin(), part.end());
        }
        // In rank order the concatenation is the 1-rank batch itself, element for element.
        ASSERT_EQ(joined, expected) << "world " << world << " epoch " << epoch << " step " << step;
      }
    }
  }
}

TEST(ShardPlan, PureFunctionRegardlessOfCallOrder) {
  ShardPlan a(500, 10, 2, 1, 3), b(500, 10, 2, 1, 3);
  std::vector<std::int64_t> x, y;
  a.batch_indices(2, 7, x);
  b.batch_indices(0, 1, y);  // b visits other epochs first
  b.batch_indices(5, 3, y);
  b.batch_indices(2, 7, y);
  EXPECT_EQ(x, y);
}

TEST(ShardPlan, GlobalBatchLargerThanDataIsAUserError) {
  const std::string text = test::user_error_text([] { ShardPlan plan(100, 64, 2, 0, 1); });
  EXPECT_NE(text.find("--train.batch-size"), std::string::npos) << text;
  EXPECT_NE(text.find("128"), std::string::npos) << text;
  EXPECT_NE(text.find("100 samples"), std::string::npos) << text;
  EXPECT_NE(
      test::user_error_text([] { ShardPlan plan(100, 0, 1, 0, 1); }).find("--train.batch-size"),
      std::string::npos);
}

TEST(EvalShard, CoversEverythingWithSizesDifferingByAtMostOne) {
  for (std::int64_t n : {0, 1, 5, 10, 10000, 10001}) {
    for (int world : {1, 2, 3, 4, 7}) {
      std::int64_t expected_begin = 0, smallest = n, largest = 0;
      for (int rank = 0; rank < world; ++rank) {
        const auto [begin, end] = eval_shard(n, world, rank);
        EXPECT_EQ(begin, expected_begin);
        EXPECT_LE(begin, end);
        smallest = std::min(smallest, end - begin);
        largest = std::max(largest, end - begin);
        expected_begin = end;
      }
      EXPECT_EQ(expected_begin, n);
      EXPECT_LE(largest - smallest, 1);
    }
  }
}

}  // namespace
}  // namespace mpt::data
