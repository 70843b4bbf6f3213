// comm::Topology and every all-reduce algorithm and intra-node backend (flat-mpi,
// hierarchical-mpi, hierarchical-shm), under mpiexec -n 1..8: nodes of K consecutive ranks for
// K in {1, 2, 3, N} (uneven ones included), sizes {0, 1, 7, 1000, 1M+3}, f32 data with f32, f16
// or bf16 on the wire and 16-bit data with its own wire type, plain sums and averages. Results
// are checked against a float64 sum and for identical bits on every rank.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/allreduce.hpp"
#include "comm/shared_buffer.hpp"
#include "comm/topology.hpp"
#include "core/half.hpp"
#include "tests/comm/allreduce_values.hpp"
#include "tests/test_util.hpp"

namespace mpt::comm {
namespace {

using test::world_rank;
using test::world_size;

// ---- values ------------------------------------------------------------------------------------

using test::contribution;
using test::identical_on_every_rank;
using test::store;
using test::ExpectedSum;
using test::expected_sum;
using test::widen;

// The ranks per node of the emulated topologies: {1, 2, 3, N} without duplicates.
std::vector<int> ranks_per_node_cases() {
  std::vector<int> ks = {1, 2, 3, world_size()};
  std::sort(ks.begin(), ks.end());
  ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
  return ks;
}

using test::kTypes;
using test::Types;

// A sum (1, 1), an average prescaled by 1/N (how 16-bit wires avoid overflow) or an average
// postscaled by 1/N (fused into the last pass).
struct Scales {
  float prescale, postscale;
};

// COUNT elements of DTYPE: a fresh tensor, or with SHARED (registered with the Allreducer) a
// view of it at an offset that varies with COUNT (the same on every rank).
Tensor data_for(std::int64_t count, DType dtype, const std::shared_ptr<SharedBuffer>& shared) {
  if (!shared) return Tensor({count}, dtype);
  const std::int64_t capacity = static_cast<std::int64_t>(shared->size() / dtype_size(dtype));
  const std::int64_t at = std::min<std::int64_t>(count % 5, capacity - count);
  return Tensor::view(Tensor::adopt(shared->data(), {capacity}, dtype, shared), at, {count});
}

// Reduces COUNT elements with ALLREDUCER and checks them against the float64 sum.
void check_allreduce(Allreducer& allreducer, std::int64_t count, DType dtype,
                     const std::shared_ptr<SharedBuffer>& shared = nullptr) {
  const AllreduceConfig& config = allreducer.config();
  const int n = world_size();
  SCOPED_TRACE("count " + std::to_string(count) + ", data " + dtype_name(dtype) + ", wire " +
               dtype_name(config.wire) + ", prescale " + std::to_string(config.prescale) +
               ", postscale " + std::to_string(config.postscale) +
               (shared ? ", registered buffer" : ""));
  Tensor data = data_for(count, dtype, shared);
  for (std::int64_t i = 0; i < count; ++i)
    store(dtype, data.raw(), i, contribution(dtype, world_rank(), i));
  allreducer.allreduce(data);
  // The exact sum and its error bound: expected_sum() in allreduce_values.hpp.
  const double scale = static_cast<double>(config.prescale) * config.postscale;
  for (std::int64_t i = 0; i < count; ++i) {
    const ExpectedSum want = expected_sum(dtype, config.wire, n, i, scale);
    const double got = widen(dtype, data.raw(), i);
    ASSERT_LE(std::fabs(got - want.value), want.tolerance)
        << "index " << i << " of " << count << ": got " << got << ", want " << want.value;
  }
  EXPECT_TRUE(identical_on_every_rank(data.raw(), data.size_bytes()));
}

constexpr std::int64_t kLarge = (std::int64_t{1} << 20) + 3;

// Runs every dtype pair through ALGORITHM / INTRA on nodes of K ranks for every K. Each case
// reduces {0, 1, 7, 1000}; one dtype pair per K adds 1M+3 (with 256 KiB shm segments: several
// segments). Scalings rotate over the cases, and so do the shm segment sizes (256 bytes: every
// chunk of 1000 elements a separate segment; the 1 MiB default: one segment) and the rail
// batches (a few chunks, or the default). REGISTERED: the data lies in a SharedBuffer registered
// with the Allreducer (where the data dtype is the wire's, the shm backend reads peers' data).
void check_algorithm(Algorithm algorithm, IntraBackend intra, const std::vector<int>& ks,
                     bool registered = false) {
  const float inverse = 1.f / static_cast<float>(world_size());
  const Scales scalings[] = {{1.f, 1.f}, {inverse, 1.f}, {1.f, inverse}};
  int case_index = 0;
  for (std::size_t k = 0; k < ks.size(); ++k) {
    SCOPED_TRACE("ranks per node " + std::to_string(ks[k]));
    const Topology topology(MPI_COMM_WORLD, ks[k]);
    for (std::size_t t = 0; t < std::size(kTypes); ++t, ++case_index) {
      const bool large = t == k % std::size(kTypes);
      AllreduceConfig config;
      config.algorithm = algorithm;
      config.intra = intra;
      config.wire = kTypes[t].wire;
      config.prescale = scalings[case_index % 3].prescale;
      config.postscale = scalings[case_index % 3].postscale;
      if (large) {
        config.shm_segment_bytes = 256 << 10;
      } else if (case_index % 2 == 1) {
        config.shm_segment_bytes = 256;
      }
      // Across nodes, rail batches of a few chunks (the last batch short) on two cases in three,
      // the default (one batch here) on the third.
      if (case_index % 3 != 0) config.rail_batch_bytes = large ? (1 << 20) + 5 : 1000;
      Allreducer allreducer(topology, config);
      std::shared_ptr<SharedBuffer> shared;
      if (registered) {
        shared = std::make_shared<SharedBuffer>(topology, (kLarge + 8) * sizeof(float));
        allreducer.register_buffer(shared);
      }
      for (const std::int64_t count : {0L, 1L, 7L, 1000L})
        check_allreduce(allreducer, count, kTypes[t].data, shared);
      if (large) check_allreduce(allreducer, kLarge, kTypes[t].data, shared);
      if (testing::Test::HasFatalFailure()) return;
    }
  }
}

TEST(AllreduceAlgorithms, FlatMpiMatchesTheFloat64Sum) {
  // flat-mpi ignores the nodes: one topology is enough.
  check_algorithm(Algorithm::flat_mpi, IntraBackend::mpi, {1});
}

TEST(AllreduceAlgorithms, HierarchicalMpiMatchesTheFloat64Sum) {
  check_algorithm(Algorithm::hierarchical, IntraBackend::mpi, ranks_per_node_cases());
}

TEST(AllreduceAlgorithms, HierarchicalShmMatchesTheFloat64Sum) {
  check_algorithm(Algorithm::hierarchical, IntraBackend::shm, ranks_per_node_cases());
}

TEST(AllreduceAlgorithms, HierarchicalShmOnRegisteredBuffersMatchesTheFloat64Sum) {
  check_algorithm(Algorithm::hierarchical, IntraBackend::shm, ranks_per_node_cases(),
                  /*registered=*/true);
}

TEST(AllreduceAlgorithms, InfOnOneRankReachesEveryRank) {
  // AMP's overflow test relies on it, whatever the algorithm and wire.
  const Topology topology(MPI_COMM_WORLD, 2);
  for (const auto& [algorithm, intra] : {std::pair{Algorithm::flat_mpi, IntraBackend::mpi},
                                         {Algorithm::hierarchical, IntraBackend::mpi},
                                         {Algorithm::hierarchical, IntraBackend::shm}}) {
    for (const DType wire : {DType::f32, DType::f16, DType::bf16}) {
      SCOPED_TRACE(std::string(algorithm_name(algorithm)) + "/" + intra_name(intra) + " wire " +
                   dtype_name(wire));
      AllreduceConfig config;
      config.algorithm = algorithm;
      config.intra = intra;
      config.wire = wire;
      Allreducer allreducer(topology, config);
      Tensor data({50}, DType::f32);
      std::fill_n(data.data<float>(), 50, 1.f);
      if (world_rank() == world_size() - 1) data.data<float>()[17] = INFINITY;
      allreducer.allreduce(data);
      EXPECT_TRUE(std::isinf(data.data<float>()[17]));
      EXPECT_EQ(data.data<float>()[16], static_cast<float>(world_size()));
    }
  }
}

TEST(AllreduceAlgorithms, RepeatedCallsReuseTheShmSlotsSafely) {
  // Successive calls of different sizes alternate the two halves of each segment without a
  // trailing barrier; a race would show as a wrong or rank-dependent result.
  const Topology topology(MPI_COMM_WORLD, 0);
  AllreduceConfig config;
  config.algorithm = Algorithm::hierarchical;
  config.intra = IntraBackend::shm;
  config.shm_segment_bytes = 512;
  Allreducer allreducer(topology, config);
  for (int round = 0; round < 20; ++round) {
    const std::int64_t count = 1 + (round * 37) % 300;
    Tensor data({count}, DType::f32);
    for (std::int64_t i = 0; i < count; ++i)
      data.data<float>()[i] = static_cast<float>((world_rank() + 1) * (i + round));
    allreducer.allreduce(data);
    const float ranks = static_cast<float>(world_size());
    for (std::int64_t i = 0; i < count; ++i)
      ASSERT_EQ(data.data<float>()[i], ranks * (ranks + 1) / 2 * static_cast<float>(i + round))
          << "round " << round << " index " << i;
  }
}

TEST(AllreduceAlgorithms, RegisteredBuffersCanBeRewrittenAsSoonAsACallReturns) {
  // Each rank overwrites its data the moment allreduce() returns, as backward does with the
  // gradients of the next step, and a slow rank delays its reads: without the closing barrier
  // a peer would still be gathering from data that has changed. Rank 0 stalls between calls so
  // that the others run ahead; nodes of 2 (rails too) and one node.
  for (const int k : {0, 2}) {
    SCOPED_TRACE("ranks per node " + std::to_string(k));
    const Topology topology(MPI_COMM_WORLD, k);
    AllreduceConfig config;
    config.algorithm = Algorithm::hierarchical;
    config.intra = IntraBackend::shm;
    config.shm_segment_bytes = 512;
    config.rail_batch_bytes = 1024;
    Allreducer allreducer(topology, config);
    const std::int64_t capacity = 4000;
    auto shared = std::make_shared<SharedBuffer>(topology, capacity * sizeof(float));
    allreducer.register_buffer(shared);
    Tensor all = Tensor::adopt(shared->data(), {capacity}, DType::f32, shared);
    const float ranks = static_cast<float>(world_size());
    for (int round = 0; round < 30; ++round) {
      const std::int64_t count = 1 + (round * 397) % capacity;
      Tensor data = Tensor::view(all, 0, {count});
      for (std::int64_t i = 0; i < count; ++i)
        data.data<float>()[i] = static_cast<float>((world_rank() + 1) * (i % 97 + round));
      allreducer.allreduce(data);
      for (std::int64_t i = 0; i < count; ++i)
        ASSERT_EQ(data.data<float>()[i],
                  ranks * (ranks + 1) / 2 * static_cast<float>(i % 97 + round))
            << "round " << round << " index " << i;
      // Poison at once; rank 0 lingers first on every other round.
      if (world_rank() == 0 && round % 2 == 0) {
        const double until = MPI_Wtime() + 0.002;
        while (MPI_Wtime() < until) {
        }
      }
      std::fill_n(data.data<float>(), count, -1e30f);
    }
  }
}

TEST(AllreduceAlgorithms, NodeBarriersWakeSleepingAndYieldingWaiters) {
  // Rank 0 comes late to every call, so the other ranks wait past their spin in its node
  // barriers: under sleep they sleep on rank 0's counter and its arrival must wake them, under
  // yield they yield until it comes. Sums are checked every call, on registered data too. A
  // lost wake-up costs the sleeper's 200 ms safety timeout: one per call would take 8 s here,
  // where the whole loop needs well under one.
  for (const BarrierWait wait : {BarrierWait::sleep, BarrierWait::yield}) {
    SCOPED_TRACE(wait == BarrierWait::sleep ? "sleep" : "yield");
    const Topology topology(MPI_COMM_WORLD, 0);
    AllreduceConfig config;
    config.algorithm = Algorithm::hierarchical;
    config.intra = IntraBackend::shm;
    config.shm_segment_bytes = 512;
    config.barrier_wait = wait;
    Allreducer allreducer(topology, config);
    const std::int64_t capacity = 2000;
    auto shared = std::make_shared<SharedBuffer>(topology, capacity * sizeof(float));
    Tensor registered = Tensor::adopt(shared->data(), {capacity}, DType::f32, shared);
    allreducer.register_buffer(shared);
    const float ranks = static_cast<float>(world_size());
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    for (int call = 0; call < 40; ++call) {
      const std::int64_t count = 1 + (call * 97) % capacity;
      Tensor private_data({count}, DType::f32);
      Tensor data = call % 2 ? Tensor::view(registered, 0, {count}) : private_data;
      for (std::int64_t i = 0; i < count; ++i)
        data.data<float>()[i] = static_cast<float>((world_rank() + 1) * (i % 89 + call));
      if (world_rank() == 0) {
        const double until = MPI_Wtime() + 0.001;
        while (MPI_Wtime() < until) {
        }
      }
      allreducer.allreduce(data);
      for (std::int64_t i = 0; i < count; ++i)
        ASSERT_EQ(data.data<float>()[i], ranks * (ranks + 1) / 2 * static_cast<float>(i % 89 + call))
            << "call " << call << " index " << i;
    }
    EXPECT_LT(MPI_Wtime() - start, 6.0) << "node barriers waited out their safety timeout";
  }
}

TEST(SharedBuffer, EveryRankSeesEveryPartOfItsNode) {
  const Topology topology(MPI_COMM_WORLD, 2);
  SharedBuffer shared(topology, 100 * sizeof(int));
  auto* mine = reinterpret_cast<int*>(shared.data());
  for (int i = 0; i < 100; ++i) EXPECT_EQ(mine[i], 0) << "zero-filled";
  for (int i = 0; i < 100; ++i) mine[i] = world_rank() * 1000 + i;
  MPI_Barrier(topology.node());
  for (int local = 0; local < topology.local_size(); ++local) {
    const auto* part = reinterpret_cast<const int*>(shared.part(local));
    const int owner = topology.rank() - topology.local_rank() + local;  // consecutive ranks
    EXPECT_EQ(part[0], owner * 1000);
    EXPECT_EQ(part[99], owner * 1000 + 99);
  }
  EXPECT_TRUE(shared.holds(mine, 100 * sizeof(int)));
  EXPECT_TRUE(shared.holds(mine + 99, sizeof(int)));
  EXPECT_FALSE(shared.holds(mine + 99, 2 * sizeof(int)));
  EXPECT_FALSE(shared.holds(mine - 1, sizeof(int)));
  std::string why;
  EXPECT_TRUE(SharedBuffer::fits(topology, 1 << 20, &why)) << why;
  EXPECT_FALSE(SharedBuffer::fits(topology, std::size_t{1} << 50, &why));
  EXPECT_NE(why.find("/dev/shm"), std::string::npos) << why;
  // The directory Open MPI backs its windows in, when the environment moves it.
  ASSERT_EQ(setenv("OMPI_MCA_osc_sm_backing_directory", "/nonexistent-shm-dir", 1), 0);
  EXPECT_FALSE(SharedBuffer::fits(topology, 64, &why));
  unsetenv("OMPI_MCA_osc_sm_backing_directory");
  EXPECT_NE(why.find("/nonexistent-shm-dir is not there"), std::string::npos) << why;
  MPI_Barrier(topology.node());  // no rank frees before every peer has read
}

// ---- topology ----------------------------------------------------------------------------------

TEST(ShardRange, PartitionsAnyCountIntoNearlyEqualBlocks) {
  for (const std::int64_t count : {0L, 1L, 5L, 10L, 1000003L})
    for (const int parts : {1, 2, 3, 7, 8}) {
      std::int64_t next = 0;
      for (int j = 0; j < parts; ++j) {
        const Range range = shard_range(count, parts, j);
        EXPECT_EQ(range.begin, next) << count << "/" << parts << " shard " << j;
        EXPECT_EQ(range.size(), count / parts + (j < count % parts ? 1 : 0));
        next = range.end;
      }
      EXPECT_EQ(next, count);
    }
}

TEST(OwnedShards, EveryShardHasExactlyOneOwnerAndEveryRankOne) {
  for (int parts = 1; parts <= 8; ++parts)
    for (int local_size = 1; local_size <= parts; ++local_size) {
      int next = 0;
      for (int local = 0; local < local_size; ++local) {
        const Range owned = owned_shards(local_size, parts, local);
        EXPECT_EQ(owned.begin, next) << "L " << local_size << " P " << parts << " l " << local;
        EXPECT_GE(owned.size(), 1);
        for (auto j = owned.begin; j < owned.end; ++j) EXPECT_EQ(j * local_size / parts, local);
        next = static_cast<int>(owned.end);
      }
      EXPECT_EQ(next, parts);
    }
}

TEST(Topology, NodesOfKConsecutiveRanksWithShardsAndRails) {
  const int n = world_size(), rank = world_rank();
  std::vector<int> ks = ranks_per_node_cases();
  ks.push_back(n + 1);  // larger than the world: one node
  for (const int k : ks) {
    SCOPED_TRACE("ranks per node " + std::to_string(k));
    const Topology topology(MPI_COMM_WORLD, k);
    const int nodes = (n + k - 1) / k, node = rank / k;
    const auto node_size = [&](int i) { return std::min(k, n - i * k); };
    const int parts = std::min(k, n);
    EXPECT_EQ(topology.rank(), rank);
    EXPECT_EQ(topology.size(), n);
    EXPECT_EQ(topology.node_index(), node);
    EXPECT_EQ(topology.num_nodes(), nodes);
    EXPECT_EQ(topology.local_rank(), rank % k);
    EXPECT_EQ(topology.local_size(), node_size(node));
    EXPECT_EQ(topology.num_shards(), parts);
    EXPECT_EQ(topology.uniform(), n % k == 0 || k >= n);
    EXPECT_EQ(topology.device_rank(), rank);  // every rank of the test runs on one host
    EXPECT_TRUE(topology.shm_capable());
    int node_comm_size = 0;
    MPI_Comm_size(topology.node(), &node_comm_size);
    EXPECT_EQ(node_comm_size, topology.local_size());

    // Every shard has exactly one owner on every node.
    const int mine[3] = {topology.node_index(), topology.first_shard(), topology.end_shard()};
    std::vector<int> all(3 * static_cast<std::size_t>(n));
    MPI_Allgather(mine, 3, MPI_INT, all.data(), 3, MPI_INT, MPI_COMM_WORLD);
    std::vector<int> owners(static_cast<std::size_t>(nodes * parts), 0);
    for (int r = 0; r < n; ++r)
      for (int j = all[3 * r + 1]; j < all[3 * r + 2]; ++j) ++owners[all[3 * r] * parts + j];
    for (int i = 0; i < nodes * parts; ++i)
      EXPECT_EQ(owners[i], 1) << "node " << i / parts << " shard " << i % parts;

    // Rail j: the owner of j on every node, in node order.
    for (int j = topology.first_shard(); j < topology.end_shard(); ++j) {
      int rail_rank = -1, rail_size = 0;
      MPI_Comm_rank(topology.rail(j), &rail_rank);
      MPI_Comm_size(topology.rail(j), &rail_size);
      EXPECT_EQ(rail_size, nodes);
      EXPECT_EQ(rail_rank, node);
      std::vector<int> members(static_cast<std::size_t>(rail_size));
      MPI_Allgather(&rank, 1, MPI_INT, members.data(), 1, MPI_INT, topology.rail(j));
      for (int i = 0; i < rail_size; ++i)
        EXPECT_EQ(members[i], i * k + j * node_size(i) / parts) << "shard " << j << " node " << i;
    }
  }
}

TEST(Topology, FiveRanksWithKTwoGiveNodesOfTwoTwoAndOne) {
  if (world_size() != 5) GTEST_SKIP() << "needs mpiexec -n 5";
  const Topology topology(MPI_COMM_WORLD, 2);
  const int expected_sizes[] = {2, 2, 2, 2, 1};
  EXPECT_EQ(topology.local_size(), expected_sizes[world_rank()]);
  EXPECT_EQ(topology.num_nodes(), 3);
  EXPECT_EQ(topology.num_shards(), 2);
  EXPECT_FALSE(topology.uniform());
  if (world_rank() == 4) {  // alone on its node: owns both shards, on both rails
    EXPECT_EQ(topology.first_shard(), 0);
    EXPECT_EQ(topology.end_shard(), 2);
  } else {
    EXPECT_EQ(topology.first_shard(), world_rank() % 2);
    EXPECT_EQ(topology.end_shard(), world_rank() % 2 + 1);
  }
}

TEST(Topology, SharedMemoryDomainsByDefault) {
  const Topology topology(MPI_COMM_WORLD);
  // mpiexec puts every rank of the test on this host.
  EXPECT_EQ(topology.local_size(), world_size());
  EXPECT_EQ(topology.local_rank(), world_rank());
  EXPECT_EQ(topology.device_rank(), topology.local_rank());
  EXPECT_EQ(topology.num_nodes(), 1);
  EXPECT_TRUE(topology.shm_capable());
  EXPECT_TRUE(topology.uniform());
}

TEST(Topology, NegativeRanksPerNodeIsAUserError) {
  const std::string text = test::user_error_text([] { Topology topology(MPI_COMM_WORLD, -1); });
  EXPECT_NE(text.find("--comm.ranks-per-node must be >= 0"), std::string::npos) << text;
}

// ---- option resolution
// ---------------------------------------------------------------------------

TEST(ResolveAllreduce, AutoPicksHierarchicalShmOnSeveralRanksAndTheGradientDtype) {
  const Topology topology(MPI_COMM_WORLD, 2);
  const AllreduceConfig config = resolve_allreduce(CommOptions{}, topology, DType::bf16);
  EXPECT_EQ(config.algorithm, world_size() > 1 ? Algorithm::hierarchical : Algorithm::flat_mpi);
  EXPECT_EQ(config.intra, IntraBackend::shm);
  EXPECT_EQ(config.wire, DType::bf16);
  // The trainer folds 1/global_batch into the gradients: the plain sum is wanted.
  EXPECT_EQ(config.prescale, 1.f);
  EXPECT_EQ(config.postscale, 1.f);
}

TEST(ResolveAllreduce, ExplicitNamesAreHonoured) {
  const Topology topology(MPI_COMM_WORLD, 0);
  CommOptions options;
  options.allreduce = "hierarchical";
  options.intra = "mpi";
  options.wire_dtype = "fp16";
  AllreduceConfig config = resolve_allreduce(options, topology, DType::f32);
  EXPECT_EQ(config.algorithm, Algorithm::hierarchical);
  EXPECT_EQ(config.intra, IntraBackend::mpi);
  EXPECT_EQ(config.wire, DType::f16);
  options.allreduce = "flat-mpi";
  options.wire_dtype = "fp32";
  config = resolve_allreduce(options, topology, DType::f16);
  EXPECT_EQ(config.algorithm, Algorithm::flat_mpi);
  EXPECT_EQ(config.wire, DType::f32);
  EXPECT_STREQ(algorithm_name(Algorithm::flat_mpi), "flat-mpi");
  EXPECT_STREQ(algorithm_name(Algorithm::hierarchical), "hierarchical");
  EXPECT_STREQ(intra_name(IntraBackend::shm), "shm");
  EXPECT_STREQ(intra_name(IntraBackend::mpi), "mpi");
  EXPECT_STREQ(algorithm_name(Algorithm::flat_nccl), "flat-nccl");
  EXPECT_STREQ(intra_name(IntraBackend::nccl), "nccl");
}

TEST(ResolveAllreduce, AutoTakesNcclOnCudaWhereBuiltAndEveryRankHasItsGpu) {
  // Arithmetic on the options only: no GPU is touched, so this runs on the CPU machine too.
  const Topology topology(MPI_COMM_WORLD, 0);
  const CommOptions options;
  AllreduceConfig config = resolve_allreduce(options, topology, DType::f16, Device::cuda);
  EXPECT_EQ(uses_nccl(config), nccl_built());
  if (nccl_built()) {
    EXPECT_EQ(config.algorithm, Algorithm::hierarchical) << "even on one rank";
    EXPECT_EQ(config.intra, IntraBackend::nccl);
  }
  // Ranks of a node on one GPU: auto keeps the host backends (staged gradients).
  SharedGpus shared;
  shared.in_node = shared.in_world = "ranks 0 and 1 share the GPU 0000:01:00.0 on host";
  config = resolve_allreduce(options, topology, DType::f16, Device::cuda, shared);
  EXPECT_FALSE(uses_nccl(config));
  EXPECT_NE(config.intra, IntraBackend::nccl);
  // On the cpu, never.
  config = resolve_allreduce(options, topology, DType::f32, Device::cpu);
  EXPECT_FALSE(uses_nccl(config));
  if (!nccl_built()) return;
  // Explicit choices where NCCL can run.
  CommOptions explicit_options;
  explicit_options.allreduce = "flat-nccl";
  config = resolve_allreduce(explicit_options, topology, DType::bf16, Device::cuda);
  EXPECT_EQ(config.algorithm, Algorithm::flat_nccl);
  EXPECT_TRUE(uses_nccl(config));
  explicit_options.allreduce = "hierarchical";
  explicit_options.intra = "nccl";
  config = resolve_allreduce(explicit_options, topology, DType::f32, Device::cuda);
  EXPECT_EQ(config.intra, IntraBackend::nccl);
  EXPECT_TRUE(uses_nccl(config));
  explicit_options.allreduce = "flat-mpi";  // intra is hierarchical's: flat-mpi stays on MPI
  config = resolve_allreduce(explicit_options, topology, DType::f32, Device::cuda);
  EXPECT_FALSE(uses_nccl(config));
}

TEST(ResolveAllreduce, NcclWhereItCannotRunIsAUserErrorNamingTheOption) {
  const Topology topology(MPI_COMM_WORLD, 0);
  const auto error_for = [&](CommOptions options, Device device, SharedGpus shared = {}) {
    return test::user_error_text(
        [&] { resolve_allreduce(options, topology, DType::f32, device, shared); });
  };
  // The reason depends on the build: no NCCL in it, or the gradients on the cpu.
  const std::string why_cpu =
      nccl_built() ? ": the gradients are on the cpu, NCCL reduces GPU memory (hint: train with "
                     "--device=cuda (one GPU per rank), or use --comm.intra=auto, shm or mpi and "
                     "--comm.allreduce=auto, flat-mpi or hierarchical)"
                   : ": this build has no NCCL (hint: rebuild with -DMPTRAIN_ENABLE_CUDA=ON where "
                     "NCCL is found (docs/gpu.md), or use --comm.intra=auto, shm or mpi and "
                     "--comm.allreduce=auto, flat-mpi or hierarchical)";
  CommOptions options;
  options.intra = "nccl";
  EXPECT_EQ(error_for(options, Device::cpu), "--comm.intra=nccl" + why_cpu);
  options = CommOptions{};
  options.allreduce = "flat-nccl";
  EXPECT_EQ(error_for(options, Device::cpu), "--comm.allreduce=flat-nccl" + why_cpu);
  if (!nccl_built()) return;
  SharedGpus shared;
  shared.in_world = "ranks 2 and 5 share the GPU 0000:01:00.0 on b";
  EXPECT_EQ(error_for(options, Device::cuda, shared),
            "--comm.allreduce=flat-nccl: ranks 2 and 5 share the GPU 0000:01:00.0 on b, and NCCL "
            "needs a GPU per rank (hint: run at most one rank per GPU, or use --comm.intra=shm or "
            "mpi (--comm.allreduce=flat-mpi), which stage the gradients through host memory)");
  options = CommOptions{};
  options.intra = "nccl";
  // Two ranks on one GPU in different nodes: each node's communicator is fine.
  EXPECT_EQ(resolve_allreduce(options, topology, DType::f32, Device::cuda, shared).intra,
            IntraBackend::nccl);
  shared.in_node = "ranks 0 and 1 share the GPU 0000:01:00.0 on a";
  EXPECT_NE(error_for(options, Device::cuda, shared).find("--comm.intra=nccl: ranks 0 and 1 share"),
            std::string::npos);
}

TEST(ResolveAllreduce, UnknownNamesAreUserErrorsNamingTheOption) {
  const Topology topology(MPI_COMM_WORLD, 0);
  const auto error_for = [&](CommOptions options) {
    return test::user_error_text([&] { resolve_allreduce(options, topology, DType::f32); });
  };
  CommOptions options;
  options.allreduce = "ring";
  EXPECT_EQ(error_for(options),
            "--comm.allreduce: unknown algorithm 'ring' (hint: use auto, flat-mpi, flat-nccl or "
            "hierarchical)");
  options = CommOptions{};
  options.intra = "nvlink";
  EXPECT_EQ(error_for(options),
            "--comm.intra: unknown backend 'nvlink' (hint: use auto, shm, mpi or nccl)");
  options = CommOptions{};
  options.wire_dtype = "fp8";
  EXPECT_EQ(error_for(options),
            "--comm.wire-dtype: unknown dtype 'fp8' (hint: use auto (the gradients' dtype), fp32, "
            "fp16 or bf16)");
  options = CommOptions{};
  options.cuda_aware_mpi = "yes";
  EXPECT_EQ(error_for(options),
            "--comm.cuda-aware-mpi: unknown value 'yes' (hint: use auto (MPI on device memory "
            "where it says it can) or off)");
}

// --comm.overlap=auto: on for a cuda model (its host thread only queues kernels), and on the
// host only where every rank has a spare core; on and off are taken as given.
TEST(OverlapBuckets, AutoIsOnForCudaModelsAndOnTheHostOnlyWithSpareCores) {
  CommOptions options;
  EXPECT_TRUE(overlap_buckets(options, false)) << "a library caller's default: on";
  EXPECT_TRUE(overlap_buckets(options, true));
  options.spare_core_everywhere = false;
  EXPECT_FALSE(overlap_buckets(options, false)) << "ranks fill their cores: after backward";
  EXPECT_TRUE(overlap_buckets(options, true)) << "cuda: the cores are free while kernels run";
  options.overlap = "on";
  EXPECT_TRUE(overlap_buckets(options, false));
  options.overlap = "off";
  options.spare_core_everywhere = true;
  EXPECT_FALSE(overlap_buckets(options, false));
  EXPECT_FALSE(overlap_buckets(options, true));
  options.overlap = "sometimes";
  EXPECT_EQ(test::user_error_text([&] { overlap_buckets(options, true); }),
            "--comm.overlap: unknown value 'sometimes' (hint: use auto, on or off)");
}

TEST(ResolveAllreduce, MpiGetsDeviceMemoryOnlyFromNcclWithAnF32WireWhereItIsCudaAware) {
  const Topology topology(MPI_COMM_WORLD, 0);
  CommOptions options;
  // The host backends reduce host memory, whatever MPI can do.
  EXPECT_FALSE(resolve_allreduce(options, topology, DType::f32).mpi_on_device);
  options.intra = "mpi";  // on cuda too: the caller stages the gradients through host memory
  EXPECT_FALSE(resolve_allreduce(options, topology, DType::f32, Device::cuda).mpi_on_device);
  if (!nccl_built()) return;  // (the rest resolves the nccl backend, which needs a build with it)
  options.intra = "nccl";
  EXPECT_EQ(resolve_allreduce(options, topology, DType::f32, Device::cuda).mpi_on_device,
            cuda_aware_mpi());
  // A 16-bit wire is summed by this project's MPI ops, which read host memory.
  EXPECT_FALSE(resolve_allreduce(options, topology, DType::f16, Device::cuda).mpi_on_device);
  options.wire_dtype = "bf16";
  EXPECT_FALSE(resolve_allreduce(options, topology, DType::f32, Device::cuda).mpi_on_device);
  options.wire_dtype = "auto";
  options.cuda_aware_mpi = "off";
  EXPECT_FALSE(resolve_allreduce(options, topology, DType::f32, Device::cuda).mpi_on_device);
  options.cuda_aware_mpi = "auto";
  options.allreduce = "flat-nccl";  // one ncclAllReduce: no MPI at all
  EXPECT_FALSE(resolve_allreduce(options, topology, DType::f32, Device::cuda).mpi_on_device);
}

}  // namespace
}  // namespace mpt::comm
