// BlockArena (the device memory arena's logic, on host slabs here) and the Tensor memory
// counters that the trainer reads to show that its steps allocate nothing.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "core/arena.hpp"
#include "core/tensor.hpp"

namespace mpt {
namespace {

// Host slabs that count what the arena asks for and gives back; LIMIT caps the total.
struct CountingSource {
  int allocations = 0, releases = 0;
  std::size_t held = 0, limit = std::size_t{1} << 30;
  std::set<void*> live;
  SlabSource source() {
    return {[this](std::size_t bytes) -> void* {
              if (held + bytes > limit) return nullptr;
              void* p = std::aligned_alloc(BlockArena::kAlignment, bytes);
              ++allocations;
              held += bytes;
              live.insert(p);
              return p;
            },
            [this](void* p) {
              ++releases;
              live.erase(p);
              std::free(p);
            }};
  }
};

constexpr std::size_t kMiB = std::size_t{1} << 20;

TEST(BlockArena, OneSlabServesManyBlocksAligned) {
  CountingSource counting;
  BlockArena arena(counting.source(), 4 * kMiB);
  std::vector<void*> blocks;
  for (std::size_t bytes : {1, 100, 256, 257, 4096, 1000000}) {
    void* p = arena.allocate(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % BlockArena::kAlignment, 0u) << bytes;
    blocks.push_back(p);
  }
  EXPECT_EQ(counting.allocations, 1);
  EXPECT_EQ(arena.stats().slabs, 1);
  EXPECT_EQ(arena.stats().blocks, 6);
  // 256 + 256 + 256 + 512 + 4096 + 1000192: each rounded up to the alignment.
  EXPECT_EQ(arena.stats().in_use_bytes, 256 + 256 + 256 + 512 + 4096 + 1000192);
  std::set<void*> distinct(blocks.begin(), blocks.end());
  EXPECT_EQ(distinct.size(), blocks.size());
  for (void* p : blocks) EXPECT_TRUE(arena.release(p));
  EXPECT_EQ(arena.stats().in_use_bytes, 0);
  EXPECT_EQ(arena.stats().blocks, 0);
}

TEST(BlockArena, FreedBlocksAreReusedWithoutNewSlabs) {
  CountingSource counting;
  BlockArena arena(counting.source(), 8 * kMiB);
  // A training run's pattern: plan, free a few temporaries, plan again; steps then allocate
  // and free the same sizes. Only the first slab is ever taken.
  for (int round = 0; round < 50; ++round) {
    void* a = arena.allocate(3 * kMiB);
    void* b = arena.allocate(2 * kMiB);
    void* c = arena.allocate(kMiB + 17);
    ASSERT_TRUE(a && b && c);
    arena.release(b);
    arena.release(a);
    arena.release(c);
  }
  EXPECT_EQ(counting.allocations, 1);
  EXPECT_EQ(arena.stats().peak_in_use_bytes, static_cast<std::int64_t>(6 * kMiB + 256));
}

TEST(BlockArena, NeighboursMergeSoALargeBlockFitsAgain) {
  CountingSource counting;
  BlockArena arena(counting.source(), 4 * kMiB);
  void* a = arena.allocate(kMiB);
  void* b = arena.allocate(kMiB);
  void* c = arena.allocate(kMiB);
  void* d = arena.allocate(kMiB);
  ASSERT_TRUE(a && b && c && d);
  EXPECT_EQ(counting.allocations, 1);
  // Free in an order that needs both merges (with the next block and with the previous one).
  arena.release(b);
  arena.release(d);
  arena.release(c);  // merges with b before it and d after it
  arena.release(a);
  void* whole = arena.allocate(4 * kMiB);
  EXPECT_EQ(whole, a) << "the four blocks did not merge back into the slab";
  EXPECT_EQ(counting.allocations, 1);
}

TEST(BlockArena, BestFitPrefersTheSmallestHole) {
  CountingSource counting;
  BlockArena arena(counting.source(), 16 * kMiB);
  void* big = arena.allocate(4 * kMiB);
  void* fence1 = arena.allocate(256);
  void* small = arena.allocate(kMiB);
  void* fence2 = arena.allocate(256);
  ASSERT_TRUE(big && fence1 && small && fence2);
  arena.release(big);
  arena.release(small);
  EXPECT_EQ(arena.allocate(kMiB), small);  // the 1 MiB hole, not the 4 MiB one
  EXPECT_EQ(arena.allocate(3 * kMiB), big);
}

TEST(BlockArena, LargeRequestsGetTheirOwnSlabAndBlocksNeverSpanSlabs) {
  CountingSource counting;
  BlockArena arena(counting.source(), kMiB);
  void* a = arena.allocate(kMiB);  // fills the first slab
  void* b = arena.allocate(kMiB);  // a second slab, maybe adjacent in memory
  void* c = arena.allocate(5 * kMiB);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(counting.allocations, 3);
  EXPECT_EQ(arena.stats().reserved_bytes, static_cast<std::int64_t>(7 * kMiB));
  arena.release(a);
  arena.release(b);
  // Two free 1 MiB slabs do not make one 2 MiB block, even if the source placed them side by side.
  void* d = arena.allocate(2 * kMiB);
  ASSERT_NE(d, nullptr);
  EXPECT_NE(d, a);
  EXPECT_EQ(counting.allocations, 4);
}

TEST(BlockArena, ReserveTakesThePlanUpFront) {
  CountingSource counting;
  BlockArena arena(counting.source(), kMiB);
  ASSERT_TRUE(arena.reserve(64 * kMiB));
  EXPECT_EQ(counting.allocations, 1);
  EXPECT_TRUE(arena.reserve(32 * kMiB));  // fits already
  EXPECT_EQ(counting.allocations, 1);
  for (int i = 0; i < 64; ++i) ASSERT_NE(arena.allocate(kMiB - 300), nullptr);
  EXPECT_EQ(counting.allocations, 1);
}

TEST(BlockArena, OutOfMemoryIsANullAndForeignPointersAreRefused) {
  CountingSource counting;
  counting.limit = 2 * kMiB;
  BlockArena arena(counting.source(), kMiB);
  EXPECT_EQ(arena.allocate(3 * kMiB), nullptr);
  void* a = arena.allocate(100);
  ASSERT_NE(a, nullptr);
  int local = 0;
  EXPECT_FALSE(arena.release(&local));
  EXPECT_FALSE(arena.release(static_cast<char*>(a) + 256));  // inside a block, not its start
  EXPECT_TRUE(arena.release(a));
  EXPECT_FALSE(arena.release(a));  // twice
  EXPECT_TRUE(arena.release(nullptr));
  EXPECT_EQ(arena.stats().blocks, 0);
}

TEST(BlockArena, RandomTrafficKeepsBlocksDisjointAndReturnsEverySlab) {
  CountingSource counting;
  {
    BlockArena arena(counting.source(), 2 * kMiB);
    std::mt19937 rng(7);
    std::vector<std::pair<char*, std::size_t>> live;
    for (int i = 0; i < 3000; ++i) {
      if (live.empty() || rng() % 3 != 0) {
        const std::size_t bytes = 1 + rng() % (300 * 1024);
        char* p = static_cast<char*>(arena.allocate(bytes));
        ASSERT_NE(p, nullptr);
        for (const auto& [q, n] : live) ASSERT_TRUE(p + bytes <= q || q + n <= p) << "overlap";
        live.emplace_back(p, bytes);
      } else {
        const std::size_t k = rng() % live.size();
        ASSERT_TRUE(arena.release(live[k].first));
        live[k] = live.back();
        live.pop_back();
      }
    }
    for (const auto& [p, n] : live) ASSERT_TRUE(arena.release(p));
    EXPECT_EQ(arena.stats().in_use_bytes, 0);
    // Everything merged back: each slab is one free block again, so a slab-sized block fits
    // without a new slab.
    const int slabs = counting.allocations;
    ASSERT_NE(arena.allocate(2 * kMiB), nullptr);
    EXPECT_EQ(counting.allocations, slabs);
  }
  EXPECT_EQ(counting.releases, counting.allocations);
  EXPECT_TRUE(counting.live.empty());
}

TEST(TensorMemory, CountsThisThreadsBuffersAndTheLiveBytes) {
  const std::int64_t before = tensor_allocations_on_this_thread();
  const TensorMemoryStats start = tensor_memory_stats(Device::cpu);
  {
    Tensor a({1000}, DType::f32);
    Tensor view = Tensor::view(a, 10, {5});  // a view allocates nothing
    Tensor copy = a;                         // nor does a copy of the handle
    Tensor reshaped = a.reshaped({10, 100});
    EXPECT_EQ(tensor_allocations_on_this_thread() - before, 1);
    EXPECT_EQ(tensor_memory_stats(Device::cpu).live_bytes - start.live_bytes, 4000);
    EXPECT_GE(tensor_memory_stats(Device::cpu).peak_bytes, start.live_bytes + 4000);
    Tensor b({10}, DType::f64);
    EXPECT_EQ(tensor_allocations_on_this_thread() - before, 2);
  }
  EXPECT_EQ(tensor_memory_stats(Device::cpu).live_bytes, start.live_bytes);
  EXPECT_EQ(tensor_memory_stats(Device::cpu).allocations - start.allocations, 2);
  // Another thread's buffers count in the totals, not in this thread's count.
  std::thread([] { Tensor other({16}, DType::u8); }).join();
  EXPECT_EQ(tensor_allocations_on_this_thread() - before, 2);
  EXPECT_EQ(tensor_memory_stats(Device::cpu).allocations - start.allocations, 3);
}

}  // namespace
}  // namespace mpt
