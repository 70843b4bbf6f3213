// MPI test (mpiexec -n 2 and -n 4): every rank's ShardPlan shards are disjoint and cover the
// epoch, and ranks reading their shards of one file concurrently get what a 1-rank run reads.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "data/data.hpp"
#include "tests/test_util.hpp"

namespace mpt::data {
namespace {

using test::world_rank;
using test::world_size;

TEST(ShardMpi, EpochShardsAreDisjointAndCoverTheEpoch) {
  const int rank = world_rank(), size = world_size();
  const std::int64_t n = 1003, batch = 16;
  for (std::int64_t epoch : {0, 3}) {
    ShardPlan plan(n, batch, size, rank, 123);
    std::vector<std::int64_t> mine, step_indices;
    for (std::int64_t step = 0; step < plan.steps_per_epoch(); ++step) {
      plan.batch_indices(epoch, step, step_indices);
      mine.insert(mine.end(), step_indices.begin(), step_indices.end());
    }
    std::vector<std::int64_t> gathered(rank == 0 ? mine.size() * static_cast<std::size_t>(size)
                                                 : 0);
    MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_INT64_T, gathered.data(),
               static_cast<int>(mine.size()), MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      const std::set<std::int64_t> unique(gathered.begin(), gathered.end());
      EXPECT_EQ(unique.size(), gathered.size()) << "ranks' shards overlap";
      const std::int64_t used = plan.steps_per_epoch() * plan.global_batch();
      EXPECT_EQ(static_cast<std::int64_t>(gathered.size()), used);
      // Covered = the first `used` entries of the epoch's permutation; the rest is dropped.
      const auto permutation = ShardPlan::epoch_permutation(n, 123, epoch);
      const std::set<std::int64_t> expected(permutation.begin(), permutation.begin() + used);
      EXPECT_EQ(unique, expected);
    }
  }
}

TEST(ShardMpi, ConcurrentReadsOfOwnShardMatchASingleRankRead) {
  const int rank = world_rank(), size = world_size();
  // One directory for the whole job, named after rank 0's pid.
  long long pid = rank == 0 ? static_cast<long long>(::getpid()) : 0;
  MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  const std::string dir = "/tmp/mpt-test-shard-mpi-" + std::to_string(pid);
  int prepared = 1;
  if (rank == 0) {
    try {
      SyntheticSpec spec;
      spec.train_samples = 640;
      spec.test_samples = 8;
      prepare_synthetic(spec, dir);
    } catch (const std::exception& error) {
      ADD_FAILURE() << error.what();
      prepared = 0;
    }
  }
  MPI_Bcast(&prepared, 1, MPI_INT, 0, MPI_COMM_WORLD);
  ASSERT_TRUE(prepared);

  const std::int64_t batch = 8, steps = 4, elements = 784;
  DatasetReader reader(dir + "/train.h5", {});
  ShardPlan plan(reader.info().num_samples, batch, size, rank, 77);
  std::vector<std::int64_t> indices;
  Tensor samples({batch, 1, 28, 28}, DType::f32), labels({batch}, DType::i32);
  std::vector<double> sums;  // per sample: label and pixel sum, a fingerprint to compare
  for (std::int64_t step = 0; step < steps; ++step) {
    plan.batch_indices(1, step, indices);
    reader.read_batch(indices, samples, labels);
    for (std::int64_t i = 0; i < batch; ++i) {
      double sum = 0;
      for (std::int64_t e = 0; e < elements; ++e) sum += samples.data<float>()[i * elements + e];
      sums.push_back(labels.data<std::int32_t>()[i]);
      sums.push_back(sum);
    }
  }
  std::vector<double> gathered(rank == 0 ? sums.size() * static_cast<std::size_t>(size) : 0);
  MPI_Gather(sums.data(), static_cast<int>(sums.size()), MPI_DOUBLE, gathered.data(),
             static_cast<int>(sums.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    // Rank r's step s sample i sits at gathered[r][s][i]; the 1-rank plan's step s sample
    // r*B + i must be the same sample.
    ShardPlan single(reader.info().num_samples, batch * size, 1, 0, 77);
    Tensor all_samples({batch * size, 1, 28, 28}, DType::f32),
        all_labels({batch * size}, DType::i32);
    for (std::int64_t step = 0; step < steps; ++step) {
      single.batch_indices(1, step, indices);
      reader.read_batch(indices, all_samples, all_labels);
      for (int r = 0; r < size; ++r) {
        for (std::int64_t i = 0; i < batch; ++i) {
          const std::int64_t global = r * batch + i;
          double sum = 0;
          for (std::int64_t e = 0; e < elements; ++e)
            sum += all_samples.data<float>()[global * elements + e];
          const std::size_t at = static_cast<std::size_t>(((r * steps + step) * batch + i) * 2);
          EXPECT_EQ(gathered[at], all_labels.data<std::int32_t>()[global]);
          EXPECT_EQ(gathered[at + 1], sum);
        }
      }
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace mpt::data
