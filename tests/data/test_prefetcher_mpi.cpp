// MPI test (mpiexec -n 2 and -n 4): every rank's Prefetcher, reading its own shard of one file
// with random read delays while the other ranks do the same, hands out exactly the planned
// batches in order, and the ranks' batches together are the 1-rank run's global batches.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "data/data.hpp"
#include "tests/test_util.hpp"
#include "tests/data/prefetch_test_util.hpp"

namespace mpt::data {
namespace {

using test::world_rank;
using test::world_size;

// One dataset for the whole job, written by rank 0 into a directory named after its pid.
class PrefetcherMpi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    long long pid = world_rank() == 0 ? static_cast<long long>(::getpid()) : 0;
    MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    dir_ = "/tmp/mpt-test-prefetcher-mpi-" + std::to_string(pid);
    int prepared = 1;
    if (world_rank() == 0) {
      try {
        SyntheticSpec spec;
        spec.train_samples = 700;
        spec.test_samples = 8;
        spec.sample_shape = {1, 6, 6};
        spec.num_classes = 5;
        prepare_synthetic(spec, dir_);
      } catch (const std::exception& error) {
        ADD_FAILURE() << error.what();
        prepared = 0;
      }
    }
    MPI_Bcast(&prepared, 1, MPI_INT, 0, MPI_COMM_WORLD);
    prepared_ = prepared != 0;
  }
  static void TearDownTestSuite() {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::filesystem::remove_all(dir_);
  }
  static inline std::string dir_;
  static inline bool prepared_ = false;
};

TEST_F(PrefetcherMpi, EveryRankGetsExactlyItsPlannedBatchesInOrder) {
  ASSERT_TRUE(prepared_);
  const int rank = world_rank(), size = world_size();
  const std::string path = dir_ + "/train.h5";
  DatasetReader reference(path, {});
  const ShardPlan plan(reference.info().num_samples, 10, size, rank, 21);
  struct Case {
    int depth, io_threads;
  };
  for (const Case c : {Case{0, 1}, Case{1, 1}, Case{2, 1}, Case{2, 2}, Case{4, 1}, Case{4, 2}}) {
    SCOPED_TRACE("rank " + std::to_string(rank) + ", prefetch " + std::to_string(c.depth) +
                 ", io-threads " + std::to_string(c.io_threads));
    DatasetReader first(path, {}), second(path, {});
    PrefetchOptions options;
    options.depth = c.depth;
    options.io_threads = c.io_threads;
    // Each rank draws different delays, so the ranks' I/O interleaves differently every run.
    options.before_read = [rank](std::int64_t epoch, std::int64_t step) {
      std::this_thread::sleep_for(std::chrono::milliseconds(
          test::jitter_ms(epoch, step, 100 + static_cast<unsigned>(rank), 3)));
    };
    Prefetcher prefetcher({&first, &second}, plan, options);
    const std::int64_t total = plan.steps_per_epoch() + 5;  // across an epoch boundary
    prefetcher.start(0, 2, total);
    test::expect_same_batches(prefetcher, reference, plan, 0, 2, total, 2);
  }
}

TEST_F(PrefetcherMpi, RanksTogetherReadTheOneRankGlobalBatches) {
  ASSERT_TRUE(prepared_);
  const int rank = world_rank(), size = world_size();
  const std::string path = dir_ + "/train.h5";
  DatasetReader reader(path, {});
  const std::int64_t batch = 6, steps = 8;
  const ShardPlan plan(reader.info().num_samples, batch, size, rank, 5);
  PrefetchOptions options;
  options.before_read = test::jitter_hook(2);
  Prefetcher prefetcher({&reader}, plan, options);
  prefetcher.start(1, 0, steps);
  const std::int64_t elements = 36;
  std::vector<float> mine;  // per step: the samples then the labels (as floats)
  for (std::int64_t step = 0; step < steps; ++step) {
    const Batch& got = prefetcher.next();
    mine.insert(mine.end(), got.samples.data<float>(),
                got.samples.data<float>() + batch * elements);
    for (std::int64_t i = 0; i < batch; ++i)
      mine.push_back(static_cast<float>(got.labels.data<std::int32_t>()[i]));
    prefetcher.release();
  }
  std::vector<float> gathered(rank == 0 ? mine.size() * static_cast<std::size_t>(size) : 0);
  MPI_Gather(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, gathered.data(),
             static_cast<int>(mine.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
  if (rank != 0) return;
  DatasetReader single_reader(path, {});
  const ShardPlan single(reader.info().num_samples, batch * size, 1, 0, 5);
  Tensor samples({batch * size, 1, 6, 6}, DType::f32), labels({batch * size}, DType::i32);
  std::vector<std::int64_t> indices;
  const std::size_t per_step = static_cast<std::size_t>(batch * (elements + 1));
  for (std::int64_t step = 0; step < steps; ++step) {
    single.batch_indices(1, step, indices);
    single_reader.read_batch(indices, samples, labels);
    for (int r = 0; r < size; ++r) {
      const float* block = gathered.data() + static_cast<std::size_t>(r) * mine.size() +
                           static_cast<std::size_t>(step) * per_step;
      EXPECT_EQ(std::memcmp(block, samples.data<float>() + r * batch * elements,
                            static_cast<std::size_t>(batch * elements) * sizeof(float)),
                0)
          << "rank " << r << " step " << step;
      for (std::int64_t i = 0; i < batch; ++i)
        EXPECT_EQ(block[batch * elements + i],
                  static_cast<float>(labels.data<std::int32_t>()[r * batch + i]));
    }
  }
}

}  // namespace
}  // namespace mpt::data
