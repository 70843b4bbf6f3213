// The nccl backend's partition and intra-node call plan (comm/nccl_allreduce.hpp), on the CPU:
// the NCCL calls themselves run only on a GPU (tests/gpu/gpu_nccl_allreduce.cpp), but which
// elements each call covers, where each rank's block lands (NCCL's in-place rules) and who owns
// what afterwards is arithmetic, checked here for every node size, shard count and awkward count.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "comm/nccl_allreduce.hpp"

namespace mpt::comm::detail {
namespace {

const std::int64_t kCounts[] = {0, 1, 2, 7, 8, 1000, 1009, (std::int64_t{1} << 20) + 3};

TEST(NcclShard, CutsEqualShardsAndGivesTheRemainderToTheLast) {
  for (const std::int64_t n : kCounts)
    for (int parts = 1; parts <= 8; ++parts) {
      std::int64_t next = 0;
      for (int j = 0; j < parts; ++j) {
        const Range shard = nccl_shard(n, parts, j);
        EXPECT_EQ(shard.begin, next) << n << "/" << parts << " shard " << j;
        EXPECT_EQ(shard.size(), n / parts + (j == parts - 1 ? n % parts : 0));
        next = shard.end;
      }
      EXPECT_EQ(next, n);
    }
}

// Simulates one node's phase 1 on N elements: every call's in-place layout is legal, and each
// element is reduced exactly once, to the local rank whose region holds it.
void check_plan(std::int64_t n, int local_size, int parts) {
  SCOPED_TRACE("n " + std::to_string(n) + ", local size " + std::to_string(local_size) +
               ", parts " + std::to_string(parts));
  IntraPlan plan;
  plan_intra(n, local_size, parts, plan);
  ASSERT_EQ(plan.regions.size(), static_cast<std::size_t>(local_size));
  // The regions: contiguous, in local rank order, covering [0, n), each the union of the
  // nccl shards its rank owns (so that the rails of every node carry the same elements).
  std::int64_t next = 0;
  for (int local = 0; local < local_size; ++local) {
    const Range region = plan.regions[static_cast<std::size_t>(local)];
    const Range owned = owned_shards(local_size, parts, local);
    EXPECT_EQ(region.begin, next);
    EXPECT_EQ(region.begin, nccl_shard(n, parts, static_cast<int>(owned.begin)).begin);
    EXPECT_EQ(region.end, nccl_shard(n, parts, static_cast<int>(owned.end) - 1).end);
    next = region.end;
  }
  EXPECT_EQ(next, n);
  // Who ends up with each element's node sum: -1 nobody yet.
  std::vector<int> reduced_to(static_cast<std::size_t>(n), -1);
  const auto reduce = [&](std::int64_t begin, std::int64_t end, int root) {
    for (std::int64_t i = begin; i < end; ++i) {
      EXPECT_EQ(reduced_to[static_cast<std::size_t>(i)], -1) << "element " << i << " reduced twice";
      reduced_to[static_cast<std::size_t>(i)] = root;
    }
  };
  if (plan.block > 0) {
    // ncclReduceScatter needs LOCAL_SIZE equal blocks: a full node only. In place, local rank l
    // receives at sendbuff + l * recvcount, which must be the start of its region.
    EXPECT_EQ(local_size, parts);
    EXPECT_LE(plan.block * local_size, n);
    for (int local = 0; local < local_size; ++local) {
      EXPECT_EQ(plan.regions[static_cast<std::size_t>(local)].begin, local * plan.block);
      reduce(local * plan.block, (local + 1) * plan.block, local);
    }
  }
  for (const IntraPlan::Piece& piece : plan.pieces) {
    EXPECT_GT(piece.range.size(), 0) << "an empty call";
    ASSERT_GE(piece.root, 0);
    ASSERT_LT(piece.root, local_size);
    reduce(piece.range.begin, piece.range.end, piece.root);
  }
  // Every element reduced, to its region's owner; the pieces few (a remainder, or one per rank).
  for (int local = 0; local < local_size; ++local) {
    const Range region = plan.regions[static_cast<std::size_t>(local)];
    for (std::int64_t i = region.begin; i < region.end; ++i)
      ASSERT_EQ(reduced_to[static_cast<std::size_t>(i)], local) << "element " << i;
  }
  EXPECT_LE(plan.pieces.size(), static_cast<std::size_t>(local_size));
  if (local_size == parts) {
    EXPECT_LE(plan.pieces.size(), 1u) << "a full node: the remainder only";
  }
}

TEST(NcclIntraPlan, EveryElementIsReducedOnceToItsRegionsOwner) {
  for (const std::int64_t n : kCounts)
    for (int parts = 1; parts <= 8; ++parts)
      for (int local_size = 1; local_size <= parts; ++local_size) {
        check_plan(n, local_size, parts);
        if (testing::Test::HasFatalFailure()) return;
      }
}

TEST(NcclIntraPlan, AFullNodeUsesOneReduceScatterOfEqualBlocks) {
  IntraPlan plan;
  plan_intra(1000, 4, 4, plan);  // divisible: no remainder call
  EXPECT_EQ(plan.block, 250);
  EXPECT_TRUE(plan.pieces.empty());
  plan_intra(1003, 4, 4, plan);  // the remainder of 3 to the last rank, after its block
  EXPECT_EQ(plan.block, 250);
  ASSERT_EQ(plan.pieces.size(), 1u);
  EXPECT_EQ(plan.pieces[0].root, 3);
  EXPECT_EQ(plan.pieces[0].range.begin, 1000);
  EXPECT_EQ(plan.pieces[0].range.end, 1003);
  EXPECT_EQ(plan.regions[3].begin, 750);
  EXPECT_EQ(plan.regions[3].end, 1003);
  plan_intra(3, 4, 4, plan);  // fewer elements than ranks: all of it to the last rank
  EXPECT_EQ(plan.block, 0);
  ASSERT_EQ(plan.pieces.size(), 1u);
  EXPECT_EQ(plan.pieces[0].root, 3);
}

}  // namespace
}  // namespace mpt::comm::detail
