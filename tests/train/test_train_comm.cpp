// Training through comm::GradientReducer, under mpiexec -n 2, 3 and 4: hierarchical and flat-mpi
// all-reduces, bucketed or not, reach the same weights; gradient accumulation over K
// micro-batches equals one K-times larger batch; sync BN's reductions share the reducer thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/comm.hpp"
#include "data/data.hpp"
#include "tests/train/suite_data.hpp"
#include "train/train.hpp"

namespace mpt::train {
namespace {

// A small learnable dataset that rank 0 writes once into a directory all ranks share.
class TrainComm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = suite::make_suite_data("mpt-train-comm-", 64, 7); }
  static void TearDownTestSuite() { suite::remove_suite_data(dir_); }
  static RunConfig config(std::int64_t batch, std::int64_t steps) {
    RunConfig c;
    c.data.train_path = dir_ + "/train.h5";
    c.data.shuffle = "none";  // accumulation compares runs that must see the same samples
    c.model.layers = "dense:32,relu,dense:16,relu,dense:4";
    c.loop.batch_size = batch;
    c.loop.max_steps = steps;
    c.loop.epochs = 100;
    c.loop.seed = 3;
    c.loop.log_every = 1000;
    c.optimizer.lr = 0.1;
    c.optimizer.momentum = 0.9;
    c.output_dir = "";
    // Tiny buckets: every parameter of this model is its own bucket, so overlap is exercised.
    c.comm.bucket_mb = 1e-6;
    c.comm.first_bucket_mb = 1e-6;
    return c;
  }
  static inline std::string dir_;
};

// max |a - b| relative to max(1, max |b|).
double relative_difference(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 1;
  for (std::int64_t i = 0; i < b.numel(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a.data<float>()[i] - b.data<float>()[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b.data<float>()[i])));
  }
  return diff / scale;
}

bool identical_on_every_rank(const Tensor& params, const comm::World& world) {
  Tensor root_copy({static_cast<std::int64_t>(params.size_bytes())}, DType::u8);
  std::memcpy(root_copy.raw(), params.raw(), params.size_bytes());
  world.broadcast(root_copy, 0);
  int same = std::memcmp(root_copy.raw(), params.raw(), params.size_bytes()) == 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, world.handle());
  return all == 1;
}

TEST_F(TrainComm, HierarchicalEqualsFlatMpi) {
  comm::World world;
  RunConfig flat_config = config(8, 20);
  flat_config.comm.allreduce = "flat-mpi";
  flat_config.comm.bucket_mb = 0;  // the reference: one bucket after backward
  Trainer flat(flat_config, world);
  const auto flat_summary = flat.run();
  if (world.size() > 1) {
    EXPECT_GT(flat_summary.comm_time_s, 0);
  }
  // K = 1 (one rank per node: all inter-node), K = 2 (uneven on 3 ranks: nodes of 2 and 1),
  // each with both intra-node backends and with one and two micro-batches per step.
  for (int ranks_per_node : {1, 2}) {
    for (const char* intra : {"shm", "mpi"}) {
      RunConfig c = config(8, 20);
      c.comm.allreduce = "hierarchical";
      c.comm.intra = intra;
      c.comm.ranks_per_node = ranks_per_node;
      Trainer hierarchical(c, world);
      const auto summary = hierarchical.run();
      EXPECT_EQ(summary.steps, 20);
      EXPECT_TRUE(identical_on_every_rank(hierarchical.params(), world)) << intra << ranks_per_node;
      // Only the summation order differs: a few fp32 ulps after 20 momentum steps.
      EXPECT_LT(relative_difference(hierarchical.params(), flat.params()), 1e-5)
          << "K=" << ranks_per_node << " intra " << intra;
      EXPECT_GE(summary.comm_time_s, 0);
      EXPECT_GE(summary.exposed_comm_time_s, 0);
    }
  }
  // Another run with a different batch differs, so the comparisons above can fail.
  Trainer other(config(9, 20), world);
  other.run();
  EXPECT_GT(relative_difference(other.params(), flat.params()), 1e-3);
}

TEST_F(TrainComm, AccumulationEqualsALargerBatch) {
  // accumulate=2 at batch b = accumulate=1 at batch 2b: with shuffle none, optimizer step s
  // covers the same 2bN samples either way, and the loss gradient carries 1/(2bN) in both.
  comm::World world;
  for (const char* allreduce : {"flat-mpi", "hierarchical"}) {
    RunConfig large = config(16, 12);
    large.comm.allreduce = allreduce;
    Trainer reference(large, world);
    reference.run();
    RunConfig micro = config(8, 12);
    micro.comm.allreduce = allreduce;
    micro.loop.accumulate = 2;
    Trainer accumulated(micro, world);
    const auto summary = accumulated.run();
    EXPECT_EQ(summary.steps, 12);
    EXPECT_EQ(summary.optimizer_steps, 12);
    EXPECT_TRUE(identical_on_every_rank(accumulated.params(), world));
    EXPECT_LT(relative_difference(accumulated.params(), reference.params()), 1e-5) << allreduce;
    // One micro-batch per step at batch b is a different run.
    Trainer small(config(8, 12), world);
    small.run();
    EXPECT_GT(relative_difference(small.params(), reference.params()), 1e-3);
  }
}

TEST_F(TrainComm, AccumulationStepsCountUpdatesAndAShortGroupEndsTheEpoch) {
  comm::World world;
  // 1024 samples at batch 8 x N ranks: B = 1024 / (8N) micro-batches per epoch; with K = 3 an
  // epoch is ceil(B / 3) optimizer steps, the last one short when 3 does not divide B.
  const std::int64_t batches = 1024 / (8 * world.size());
  RunConfig c = config(8, 0);
  c.loop.epochs = 2;
  c.loop.accumulate = 3;
  Trainer trainer(c, world);
  const auto summary = trainer.run();
  EXPECT_EQ(summary.steps, 2 * ((batches + 2) / 3));
  EXPECT_TRUE(std::isfinite(summary.final_train_loss));
  EXPECT_TRUE(identical_on_every_rank(trainer.params(), world));
}

TEST_F(TrainComm, AShortGroupAveragesOverItsRealSize) {
  // --train.accumulate far above the batches per epoch: each epoch is one short group, and its
  // update must be the mean over the epoch's samples, as one step with the epoch as its batch.
  comm::World world;
  const std::int64_t batches = 1024 / (8 * world.size());
  RunConfig micro = config(8, 0);
  micro.loop.epochs = 3;
  micro.loop.accumulate = 1000;
  Trainer accumulated(micro, world);
  const auto summary = accumulated.run();
  EXPECT_EQ(summary.steps, 3);
  RunConfig whole = config(8 * batches, 0);
  whole.loop.epochs = 3;
  Trainer reference(whole, world);
  EXPECT_EQ(reference.run().steps, 3);
  EXPECT_LT(relative_difference(accumulated.params(), reference.params()), 1e-5);
  // Three plain steps at batch 8 differ, so the comparison above can fail.
  Trainer small(config(8, 3), world);
  small.run();
  EXPECT_GT(relative_difference(small.params(), reference.params()), 1e-3);
}

TEST_F(TrainComm, NanGradFaultStillSkipsWithAccumulation) {
  // The injected NaN goes into the last micro-batch's gradients before the reduction: every
  // rank skips that step.
  comm::World world;
  RunConfig c = config(8, 6);
  c.amp.precision = "fp16";
  c.loop.accumulate = 2;
  Trainer clean(c, world);
  const auto clean_summary = clean.run();
  c.fault = "nan-grad:" + std::to_string(world.size() - 1) + ":4";
  Trainer trainer(c, world);
  const auto summary = trainer.run();
  EXPECT_EQ(summary.skipped_steps, clean_summary.skipped_steps + 1);
  EXPECT_EQ(summary.optimizer_steps, 6 - summary.skipped_steps);
  EXPECT_TRUE(identical_on_every_rank(trainer.params(), world));
}

TEST_F(TrainComm, SyncBatchNormReducesOnTheReducerThread) {
  // Sync BN's forward and backward all-reduces interleave with the buckets; the run must neither
  // hang nor let the ranks drift apart, with small buckets and without.
  comm::World world;
  for (double bucket_mb : {1e-6, 0.0}) {
    RunConfig c = config(8, 6);
    c.model.layers = "conv:4:3:pad=1,bn,relu,flatten,dense:4";
    c.model.sync_bn = true;
    c.comm.bucket_mb = bucket_mb;
    c.comm.allreduce = "hierarchical";
    c.comm.ranks_per_node = 2;
    Trainer trainer(c, world);
    const auto summary = trainer.run();
    EXPECT_EQ(summary.steps, 6);
    EXPECT_TRUE(std::isfinite(summary.final_train_loss));
    EXPECT_TRUE(identical_on_every_rank(trainer.params(), world)) << bucket_mb;
  }
  // A rank that must carry a NaN into the all-reduce writes it from the backward hook, so its
  // buckets and BN collectives keep the same order as its peers': no hang, and the step is
  // skipped everywhere.
  RunConfig c = config(8, 6);
  c.model.layers = "conv:4:3:pad=1,bn,relu,flatten,dense:4";
  c.model.sync_bn = true;
  c.amp.precision = "fp16";
  c.loop.accumulate = 2;
  Trainer clean(c, world);
  const auto clean_summary = clean.run();
  c.fault = "nan-grad:" + std::to_string(world.size() - 1) + ":3";
  Trainer faulty(c, world);
  const auto summary = faulty.run();
  EXPECT_EQ(summary.skipped_steps, clean_summary.skipped_steps + 1);
  EXPECT_TRUE(identical_on_every_rank(faulty.params(), world));
}

TEST_F(TrainComm, BadCommOptionsFailOnEveryRankInSetup) {
  comm::World world;
  RunConfig c = config(8, 2);
  c.comm.allreduce = "ring";
  EXPECT_THROW(Trainer(c, world), comm::ReportedFailure);
  c = config(8, 2);
  c.loop.accumulate = 0;
  EXPECT_THROW(Trainer(c, world), comm::ReportedFailure);
  c = config(8, 2);
  c.comm.bucket_mb = -1;
  EXPECT_THROW(Trainer(c, world), comm::ReportedFailure);
}

}  // namespace
}  // namespace mpt::train
