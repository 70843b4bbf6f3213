// ShardPlan and eval_shard: which samples each rank reads. Everything is a pure function of
// (seed, epoch, world size, rank), so a resumed or re-sized run replays the same global order.
#include <algorithm>
#include <numeric>

#include "core/error.hpp"
#include "core/random.hpp"
#include "data/data.hpp"

namespace mpt::data {

namespace {
constexpr std::uint64_t kShuffleStream = 0x5348554646ull;  // "SHUFF"
}

ShardPlan::ShardPlan(std::int64_t num_samples, std::int64_t batch_per_rank, int world_size,
                     int rank, std::uint64_t seed, bool shuffle)
    : num_samples_(num_samples),
      batch_per_rank_(batch_per_rank),
      world_size_(world_size),
      rank_(rank),
      seed_(seed),
      shuffle_(shuffle) {
  if (world_size <= 0 || rank < 0 || rank >= world_size)
    abort_job("ShardPlan: rank " + std::to_string(rank) + " of world size " +
              std::to_string(world_size));
  MPT_REQUIRE(num_samples > 0, "the training set is empty (0 samples)",
              "check the data file given with --data.train");
  MPT_REQUIRE(batch_per_rank > 0,
              "--train.batch-size gives " + std::to_string(batch_per_rank) +
                  " samples per rank; it must be positive",
              "use e.g. --train.batch-size=64");
  steps_per_epoch_ = num_samples / global_batch();
  MPT_REQUIRE(steps_per_epoch_ > 0,
              "the global batch of " + std::to_string(global_batch()) + " samples (" +
                  std::to_string(batch_per_rank) + " per rank x " + std::to_string(world_size) +
                  " ranks, option --train.batch-size) is larger than the training set of " +
                  std::to_string(num_samples) + " samples",
              "lower --train.batch-size to at most " + std::to_string(num_samples / world_size) +
                  " or use fewer ranks");
}

void ShardPlan::batch_indices(std::int64_t epoch, std::int64_t step,
                              std::vector<std::int64_t>& out) const {
  if (epoch < 0 || step < 0 || step >= steps_per_epoch_)
    abort_job("ShardPlan::batch_indices: epoch " + std::to_string(epoch) + " step " +
              std::to_string(step) + " outside [0, " + std::to_string(steps_per_epoch_) + ")");
  const std::int64_t first = step * global_batch() + rank_ * batch_per_rank_;
  out.resize(static_cast<std::size_t>(batch_per_rank_));
  if (!shuffle_) {
    std::iota(out.begin(), out.end(), first);
    return;
  }
  if (cached_epoch_ != epoch) {
    permutation_ = epoch_permutation(num_samples_, seed_, epoch);
    cached_epoch_ = epoch;
  }
  std::copy_n(permutation_.begin() + first, batch_per_rank_, out.begin());
}

std::vector<std::int64_t> ShardPlan::epoch_permutation(std::int64_t n, std::uint64_t seed,
                                                       std::int64_t epoch) {
  std::vector<std::int64_t> permutation(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  std::iota(permutation.begin(), permutation.end(), 0);
  const CounterRng rng(seed, kShuffleStream ^ static_cast<std::uint64_t>(epoch));
  for (std::int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(
        rng.below(static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(i + 1)));
    std::swap(permutation[static_cast<std::size_t>(i)], permutation[static_cast<std::size_t>(j)]);
  }
  return permutation;
}

std::pair<std::int64_t, std::int64_t> eval_shard(std::int64_t n, int world_size, int rank) {
  if (n < 0 || world_size <= 0 || rank < 0 || rank >= world_size)
    abort_job("eval_shard: n " + std::to_string(n) + ", rank " + std::to_string(rank) + " of " +
              std::to_string(world_size));
  // The first n mod W ranks take one extra sample.
  const std::int64_t base = n / world_size, extra = n % world_size;
  const std::int64_t begin = rank * base + std::min<std::int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

}  // namespace mpt::data
