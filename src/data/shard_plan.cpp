// ShardPlan and eval_shard: which samples each rank reads. Everything is a pure function of
// (seed, epoch, world size, rank), so a resumed or re-sized run replays the same global order.
#include <algorithm>
#include <numeric>

#include "core/error.hpp"
#include "core/random.hpp"
#include "data/data.hpp"

namespace mpt::data {

namespace {
constexpr std::uint64_t kShuffleStream = 0x5348554646ull;            // "SHUFF"
constexpr std::uint64_t kWindowOrderStream = 0x57494E444F57ull;      // "WINDOW"
constexpr std::uint64_t kWindowShuffleStream = 0x57534855464Cull;    // "WSHUFL"
constexpr std::int64_t kMaxWindow = std::int64_t{1} << 32;           // local counters fit 32 bits

// Fisher-Yates over P[0..m), draw i taken from RNG at counter COUNTER_BASE + i.
void fisher_yates(std::int64_t* p, std::int64_t m, const CounterRng& rng,
                  std::uint64_t counter_base) {
  for (std::int64_t i = m - 1; i > 0; --i) {
    const auto j = static_cast<std::int64_t>(rng.below(counter_base + static_cast<std::uint64_t>(i),
                                                       static_cast<std::uint64_t>(i + 1)));
    std::swap(p[i], p[j]);
  }
}

}  // namespace

ShuffleMode parse_shuffle_mode(const std::string& text) {
  if (text == "global") return ShuffleMode::global;
  if (text == "window") return ShuffleMode::window;
  if (text == "none") return ShuffleMode::none;
  throw_user_error("unknown shuffle mode '" + text + "' (--data.shuffle)",
                   "use --data.shuffle=global, window or none");
}

const char* shuffle_mode_name(ShuffleMode mode) {
  switch (mode) {
    case ShuffleMode::global: return "global";
    case ShuffleMode::window: return "window";
    case ShuffleMode::none: return "none";
  }
  return "?";
}

ShardPlan::ShardPlan(std::int64_t num_samples, std::int64_t batch_per_rank, int world_size,
                     int rank, std::uint64_t seed, const ShardOptions& options)
    : num_samples_(num_samples),
      batch_per_rank_(batch_per_rank),
      world_size_(world_size),
      rank_(rank),
      seed_(seed),
      options_(options) {
  if (world_size <= 0 || rank < 0 || rank >= world_size)
    abort_job("ShardPlan: rank " + std::to_string(rank) + " of world size " +
              std::to_string(world_size));
  const std::string& data = options.data_description;
  MPT_REQUIRE(num_samples > 0, data + " is empty (0 samples)",
              "check the data file given with --data.train");
  MPT_REQUIRE(batch_per_rank > 0,
              "--train.batch-size gives " + std::to_string(batch_per_rank) +
                  " samples per rank; it must be positive",
              "use e.g. --train.batch-size=64");
  MPT_REQUIRE(options.shuffle != ShuffleMode::window ||
                  (options.shuffle_window >= 1 && options.shuffle_window <= kMaxWindow),
              "--data.shuffle-window is " + std::to_string(options.shuffle_window) +
                  "; it must be in [1, 2^32] samples",
              "use e.g. --data.shuffle-window=65536, or --data.shuffle=global");
  // Even with wrap-around padding, a global batch larger than the data would read samples twice
  // in one step; that is a configuration mistake, not something to pad silently.
  MPT_REQUIRE(num_samples >= global_batch(),
              "the global batch of " + std::to_string(global_batch()) + " samples (" +
                  std::to_string(batch_per_rank) + " per rank x " + std::to_string(world_size) +
                  " ranks, option --train.batch-size) is larger than " + data + " of " +
                  std::to_string(num_samples) + " samples",
              "lower --train.batch-size to at most " + std::to_string(num_samples / world_size) +
                  " or use fewer ranks");
  steps_per_epoch_ = options.drop_last ? num_samples / global_batch()
                                       : (num_samples + global_batch() - 1) / global_batch();
}

void ShardPlan::batch_indices(std::int64_t epoch, std::int64_t step,
                              std::vector<std::int64_t>& out) const {
  if (epoch < 0 || step < 0 || step >= steps_per_epoch_)
    abort_job("ShardPlan::batch_indices: epoch " + std::to_string(epoch) + " step " +
              std::to_string(step) + " outside [0, " + std::to_string(steps_per_epoch_) + ")");
  const std::int64_t first = step * global_batch() + rank_ * batch_per_rank_;
  out.resize(static_cast<std::size_t>(batch_per_rank_));
  // Positions past N (only without drop_last) wrap to the start of the same epoch's order.
  auto wrap = [n = num_samples_](std::int64_t position) {
    return position < n ? position : position - n;
  };
  if (options_.shuffle == ShuffleMode::none) {
    for (std::int64_t j = 0; j < batch_per_rank_; ++j)
      out[static_cast<std::size_t>(j)] = wrap(first + j);
    return;
  }
  if (cached_epoch_ != epoch) {
    permutation_ = epoch_order(num_samples_, seed_, epoch, options_);
    cached_epoch_ = epoch;
  }
  for (std::int64_t j = 0; j < batch_per_rank_; ++j)
    out[static_cast<std::size_t>(j)] = permutation_[static_cast<std::size_t>(wrap(first + j))];
}

std::vector<std::int64_t> ShardPlan::epoch_order(std::int64_t n, std::uint64_t seed,
                                                 std::int64_t epoch,
                                                 const ShardOptions& options) {
  if (options.shuffle == ShuffleMode::global) return epoch_permutation(n, seed, epoch);
  std::vector<std::int64_t> order(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  if (options.shuffle == ShuffleMode::none || n == 0) {
    std::iota(order.begin(), order.end(), 0);
    return order;
  }
  const std::int64_t window = std::clamp<std::int64_t>(options.shuffle_window, 1, kMaxWindow);
  const std::int64_t windows = (n + window - 1) / window;
  std::vector<std::int64_t> window_order(static_cast<std::size_t>(windows));
  std::iota(window_order.begin(), window_order.end(), 0);
  const auto epoch_bits = static_cast<std::uint64_t>(epoch);
  fisher_yates(window_order.data(), windows, CounterRng(seed, kWindowOrderStream ^ epoch_bits), 0);
  const CounterRng within(seed, kWindowShuffleStream ^ epoch_bits);
  std::int64_t* cursor = order.data();
  for (const std::int64_t k : window_order) {
    const std::int64_t begin = k * window, length = std::min(window, n - begin);
    std::iota(cursor, cursor + length, begin);
    fisher_yates(cursor, length, within, static_cast<std::uint64_t>(k) << 32);
    cursor += length;
  }
  return order;
}

std::vector<std::int64_t> ShardPlan::epoch_permutation(std::int64_t n, std::uint64_t seed,
                                                       std::int64_t epoch) {
  std::vector<std::int64_t> permutation(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)));
  std::iota(permutation.begin(), permutation.end(), 0);
  fisher_yates(permutation.data(), n,
               CounterRng(seed, kShuffleStream ^ static_cast<std::uint64_t>(epoch)), 0);
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
