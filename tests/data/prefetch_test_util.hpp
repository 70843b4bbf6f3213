// Helpers shared by the serial and the MPI prefetcher tests: deterministic random read delays,
// and a check that a Prefetcher hands out exactly what direct synchronous reads return.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "data/data.hpp"

namespace mpt::test {

// Milliseconds in [0, max_ms], a pure function of (epoch, step, salt): safe from any thread.
inline int jitter_ms(std::int64_t epoch, std::int64_t step, std::uint64_t salt, int max_ms) {
  std::uint64_t x = static_cast<std::uint64_t>(epoch) * 0x9E3779B97F4A7C15ull ^
                    static_cast<std::uint64_t>(step) * 0xBF58476D1CE4E5B9ull ^ salt;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return static_cast<int>(x % static_cast<std::uint64_t>(max_ms + 1));
}

// A before_read hook that sleeps a random 0..MAX_MS ms per batch, so reads finish out of order.
inline std::function<void(std::int64_t, std::int64_t)> jitter_hook(int max_ms) {
  return [max_ms](std::int64_t epoch, std::int64_t step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(jitter_ms(epoch, step, 1, max_ms)));
  };
}

// Takes COUNT batches from PREFETCHER (started at FIRST_EPOCH, FIRST_STEP) and compares each
// with REFERENCE's direct read of PLAN's batch at the same position: indices, labels and the
// bytes of the samples. The consumer holds each batch 0..CONSUMER_JITTER_MS ms before checking.
inline void expect_same_batches(data::Prefetcher& prefetcher, data::DatasetReader& reference,
                                const data::ShardPlan& plan, std::int64_t first_epoch,
                                std::int64_t first_step, std::int64_t count,
                                int consumer_jitter_ms) {
  const data::ShardPlan reference_plan = plan;
  const std::int64_t batch = plan.batch_per_rank();
  Shape shape{batch};
  for (auto extent : reference.info().sample_shape) shape.push_back(extent);
  Tensor samples(shape, DType::f32), labels({batch}, DType::i32);
  std::vector<std::int64_t> indices;
  for (std::int64_t k = 0; k < count; ++k) {
    const std::int64_t absolute = first_step + k;
    const std::int64_t epoch = first_epoch + absolute / plan.steps_per_epoch();
    const std::int64_t step = absolute % plan.steps_per_epoch();
    reference_plan.batch_indices(epoch, step, indices);
    reference.read_batch(indices, samples, labels);
    const data::Batch& got = prefetcher.next();
    // Hold the batch a while, as the trainer's step does, before checking it: a slot refilled
    // while still in use would show here.
    if (consumer_jitter_ms > 0)
      std::this_thread::sleep_for(
          std::chrono::milliseconds(jitter_ms(epoch, step, 2, consumer_jitter_ms)));
    ASSERT_EQ(got.epoch, epoch) << "batch " << k;
    ASSERT_EQ(got.step, step) << "batch " << k;
    EXPECT_EQ(got.indices, indices) << "batch " << k;
    EXPECT_EQ(std::memcmp(got.labels.raw(), labels.raw(), labels.size_bytes()), 0) << "batch " << k;
    EXPECT_EQ(std::memcmp(got.samples.raw(), samples.raw(), samples.size_bytes()), 0)
        << "batch " << k;
    prefetcher.release();
  }
}

}  // namespace mpt::test
