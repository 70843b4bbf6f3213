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
  for (ShuffleMode mode : {ShuffleMode::global, ShuffleMode::window, ShuffleMode::none}) {
    ShardOptions options;
    options.shuffle = mode;
    options.shuffle_window = 100;
    const std::int64_t n = 1000, batch = 32;
    const int world = 3;
    std::vector<std::int64_t> all;
    for (int rank = 0; rank < world; ++rank) {
      ShardPlan plan(n, batch, world, rank, 9, options);
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
    // The dropped samples are exactly the order's tail.
    const auto order = ShardPlan::epoch_order(n, 9, 4, options);
    for (std::int64_t k = 960; k < n; ++k)
      EXPECT_EQ(unique.count(order[static_cast<std::size_t>(k)]), 0u);
  }
}

// Every (N in 1..8, world, batch, mode, drop_last): the ranks' shards are equal in length,
// disjoint within an epoch where nothing wraps, and cover the order (all of it without
// drop_last, less the tail with it); the union of a step's batches is the 1-rank batch.
TEST(ShardPlan, SmallSizesAllModesAndDropLastBothWays) {
  for (std::int64_t n = 1; n <= 8; ++n)
    for (int world : {1, 2, 3})
      for (std::int64_t batch : {1, 2, 3})
        for (ShuffleMode mode : {ShuffleMode::global, ShuffleMode::window, ShuffleMode::none})
          for (bool drop_last : {true, false}) {
            if (batch * world > n) continue;  // a user error, tested below
            SCOPED_TRACE(::testing::Message() << "n " << n << " world " << world << " batch "
                                              << batch << " mode " << shuffle_mode_name(mode)
                                              << " drop_last " << drop_last);
            ShardOptions options;
            options.shuffle = mode;
            options.shuffle_window = 3;
            options.drop_last = drop_last;
            const std::int64_t g = batch * world;
            const std::int64_t steps = drop_last ? n / g : (n + g - 1) / g;
            const auto order = ShardPlan::epoch_order(n, 5, 1, options);
            std::vector<std::int64_t> sorted_order = order;
            std::sort(sorted_order.begin(), sorted_order.end());
            std::vector<std::int64_t> identity(static_cast<std::size_t>(n));
            std::iota(identity.begin(), identity.end(), 0);
            ASSERT_EQ(sorted_order, identity) << "not a permutation";
            ShardPlan single(n, g, 1, 0, 5, options);
            ASSERT_EQ(single.steps_per_epoch(), steps);
            std::vector<std::multiset<std::int64_t>> per_rank(static_cast<std::size_t>(world));
            std::vector<std::int64_t> expected, part;
            for (std::int64_t step = 0; step < steps; ++step) {
              single.batch_indices(1, step, expected);
              std::vector<std::int64_t> joined;
              for (int rank = 0; rank < world; ++rank) {
                ShardPlan plan(n, batch, world, rank, 5, options);
                ASSERT_EQ(plan.steps_per_epoch(), steps);
                plan.batch_indices(1, step, part);
                ASSERT_EQ(static_cast<std::int64_t>(part.size()), batch);
                per_rank[static_cast<std::size_t>(rank)].insert(part.begin(), part.end());
                joined.insert(joined.end(), part.begin(), part.end());
              }
              ASSERT_EQ(joined, expected);
              // Position p of the epoch reads order[p mod n].
              for (std::int64_t j = 0; j < g; ++j)
                ASSERT_EQ(joined[static_cast<std::size_t>(j)],
                          order[static_cast<std::size_t>((step * g + j) % n)]);
            }
            std::multiset<std::int64_t> all;
            for (const auto& shard : per_rank) {
              EXPECT_EQ(static_cast<std::int64_t>(shard.size()), steps * batch);
              all.insert(shard.begin(), shard.end());
            }
            const std::set<std::int64_t> unique(all.begin(), all.end());
            if (drop_last) {
              EXPECT_EQ(unique.size(), all.size()) << "shards overlap";
              EXPECT_EQ(static_cast<std::int64_t>(all.size()), (n / g) * g);
            } else {
              EXPECT_EQ(static_cast<std::int64_t>(unique.size()), n) << "not every sample read";
              // Only the wrapped padding repeats: steps * g - n of them.
              EXPECT_EQ(static_cast<std::int64_t>(all.size() - unique.size()), steps * g - n);
            }
          }
}

TEST(ShardPlan, DropLastFalsePadsFromTheStartOfTheSameEpoch) {
  ShardOptions options;
  options.drop_last = false;
  ShardPlan plan(10, 2, 2, 1, 3, options);  // G = 4: steps 0..2, step 2 needs positions 8..11
  EXPECT_EQ(plan.steps_per_epoch(), 3);
  const auto order = ShardPlan::epoch_permutation(10, 3, 6);
  std::vector<std::int64_t> indices;
  plan.batch_indices(6, 2, indices);  // rank 1 takes positions 10, 11 -> order[0], order[1]
  EXPECT_EQ(indices, (std::vector<std::int64_t>{order[0], order[1]}));
}

TEST(ShardPlan, GlobalModeIsTodaysPermutationAndNoneIsFileOrder) {
  ShardOptions options;
  EXPECT_EQ(ShardPlan::epoch_order(333, 8, 2, options), ShardPlan::epoch_permutation(333, 8, 2));
  options.shuffle = ShuffleMode::none;
  std::vector<std::int64_t> identity(333);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(ShardPlan::epoch_order(333, 8, 2, options), identity);
  ShardPlan plan(333, 10, 2, 1, 8, options);
  std::vector<std::int64_t> indices;
  plan.batch_indices(0, 3, indices);
  EXPECT_EQ(indices.front(), 3 * 20 + 10);
  EXPECT_EQ(indices.back(), 3 * 20 + 19);
}

TEST(ShardPlan, WindowModeKeepsWindowsTogetherAndShufflesBoth) {
  ShardOptions options;
  options.shuffle = ShuffleMode::window;
  options.shuffle_window = 100;
  const std::int64_t n = 1050;  // 11 windows, the last of 50
  const auto order = ShardPlan::epoch_order(n, 4, 0, options);
  // Each block of the order is one whole window, in some order of the windows.
  std::vector<std::int64_t> window_sequence;
  std::size_t at = 0;
  bool some_window_shuffled = false;
  while (at < order.size()) {
    const std::int64_t window = order[at] / 100;
    const std::int64_t length = std::min<std::int64_t>(100, n - window * 100);
    std::vector<std::int64_t> block(order.begin() + static_cast<std::ptrdiff_t>(at),
                                    order.begin() + static_cast<std::ptrdiff_t>(at) + length);
    std::vector<std::int64_t> sorted = block;
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::int64_t> expected(static_cast<std::size_t>(length));
    std::iota(expected.begin(), expected.end(), window * 100);
    ASSERT_EQ(sorted, expected) << "block at " << at << " is not window " << window;
    some_window_shuffled |= block != sorted;
    window_sequence.push_back(window);
    at += static_cast<std::size_t>(length);
  }
  EXPECT_TRUE(some_window_shuffled);
  std::vector<std::int64_t> in_file_order(11);
  std::iota(in_file_order.begin(), in_file_order.end(), 0);
  EXPECT_NE(window_sequence, in_file_order) << "the windows' order is not shuffled";
  // Reproducible, and different in another epoch and with another seed.
  EXPECT_EQ(order, ShardPlan::epoch_order(n, 4, 0, options));
  EXPECT_NE(order, ShardPlan::epoch_order(n, 4, 1, options));
  EXPECT_NE(order, ShardPlan::epoch_order(n, 5, 0, options));
  // A window at least N is the same as one global shuffle of a single window, but not global's.
  options.shuffle_window = 1 << 20;
  const auto one_window = ShardPlan::epoch_order(n, 4, 0, options);
  std::vector<std::int64_t> sorted = one_window;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::int64_t> identity(static_cast<std::size_t>(n));
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
}

TEST(ShardPlan, BadWindowAndShuffleModeAreUserErrors) {
  ShardOptions options;
  options.shuffle = ShuffleMode::window;
  options.shuffle_window = 0;
  EXPECT_NE(test::user_error_text([&] { ShardPlan plan(100, 4, 1, 0, 1, options); })
                .find("--data.shuffle-window"),
            std::string::npos);
  EXPECT_NE(test::user_error_text([] { parse_shuffle_mode("random"); }).find("--data.shuffle"),
            std::string::npos);
  EXPECT_EQ(parse_shuffle_mode("window"), ShuffleMode::window);
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
  ShardOptions named;
  named.data_description = "the training set 'x.h5' (dataset 'samples')";
  named.drop_last = false;  // padding does not make a too-large batch acceptable
  EXPECT_NE(test::user_error_text([&] { ShardPlan plan(100, 64, 2, 0, 1, named); })
                .find("the training set 'x.h5' (dataset 'samples') of 100 samples"),
            std::string::npos);
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
