// Data-parallel training invariants, under mpiexec -n 2 and -n 4: every rank holds the same
// weights after K steps, and an N-rank run equals a 1-rank run with the same global batch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "comm/comm.hpp"
#include "data/data.hpp"
#include "optim/optim.hpp"
#include "tests/train/suite_data.hpp"
#include "train/train.hpp"

namespace mpt::train {
namespace {

// A small learnable dataset that rank 0 writes once into a directory all ranks share.
class TrainMpi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = suite::make_suite_data("mpt-train-", 256, 5); }
  static void TearDownTestSuite() { suite::remove_suite_data(dir_); }
  static RunConfig config(std::int64_t batch, std::int64_t steps) {
    RunConfig c;
    c.data.train_path = dir_ + "/train.h5";
    c.model.layers = "dense:32,relu,dense:4";
    c.loop.batch_size = batch;
    c.loop.max_steps = steps;
    c.loop.epochs = 100;
    c.loop.seed = 11;
    c.loop.log_every = 1000;
    c.optimizer.lr = 0.1;
    c.optimizer.momentum = 0.9;
    c.optimizer.weight_decay = 1e-4;
    c.output_dir = "";
    return c;
  }
  static inline std::string dir_;
};

TEST_F(TrainMpi, WeightsStayIdenticalAcrossRanks) {
  comm::World world;
  Trainer trainer(config(8, 25), world);
  const auto summary = trainer.run();
  EXPECT_EQ(summary.steps, 25);
  const Tensor& params = trainer.params();
  Tensor min_params({params.numel()}, DType::f32), max_params({params.numel()}, DType::f32);
  MPI_Allreduce(params.raw(), min_params.raw(), static_cast<int>(params.numel()), MPI_FLOAT, MPI_MIN, world.handle());
  MPI_Allreduce(params.raw(), max_params.raw(), static_cast<int>(params.numel()), MPI_FLOAT, MPI_MAX, world.handle());
  std::int64_t differing = 0;
  for (std::int64_t i = 0; i < params.numel(); ++i)
    differing += min_params.data<float>()[i] != max_params.data<float>()[i];
  EXPECT_EQ(differing, 0) << "weights differ across ranks after 25 steps";
  // And training really moved them: the loss is finite and the weights are not all zero.
  EXPECT_TRUE(std::isfinite(summary.final_train_loss));
}

TEST_F(TrainMpi, NRanksEqualOneRankWithTheSameGlobalBatch) {
  comm::World world;
  const std::int64_t per_rank = 8, steps = 30;
  Trainer parallel(config(per_rank, steps), world);
  parallel.run();
  if (world.rank() == 0) {
    comm::World alone(MPI_COMM_SELF);
    Trainer serial(config(per_rank * world.size(), steps), alone);
    serial.run();
    const float* a = parallel.params().data<float>();
    const float* b = serial.params().data<float>();
    double max_diff = 0, max_abs = 0;
    for (std::int64_t i = 0; i < serial.params().numel(); ++i) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(a[i] - b[i])));
      max_abs = std::max(max_abs, static_cast<double>(std::fabs(b[i])));
    }
    // Only the summation order of the gradients differs (per-rank partial sums, then the
    // all-reduce), so after 30 steps the weights agree to a few fp32 ulps of their size.
    EXPECT_LT(max_diff, 1e-5 * std::max(1.0, max_abs)) << "max |w_N - w_1| = " << max_diff;
    // A different global batch must give different weights, or this test could not fail.
    Trainer other(config(per_rank * world.size() + 1, steps), alone);
    other.run();
    double other_diff = 0;
    for (std::int64_t i = 0; i < other.params().numel(); ++i)
      other_diff = std::max(other_diff, static_cast<double>(std::fabs(other.params().data<float>()[i] - b[i])));
    EXPECT_GT(other_diff, 1e-3);
  }
  world.barrier();
}

TEST_F(TrainMpi, InputPipelineOptionsDoNotChangeTheWeights) {
  // Synchronous reads, read-ahead on two threads, and a memory cache over 3 epochs (1024 / 8 /
  // ranks steps each) must feed the same batches, so the weights agree bit for bit.
  comm::World world;
  const std::int64_t steps = 3 * (1024 / (16 * world.size()));
  RunConfig sync_config = config(16, steps);
  sync_config.data.prefetch = 0;
  Trainer sync(sync_config, world);
  const auto sync_summary = sync.run();
  RunConfig async_config = config(16, steps);
  async_config.data.prefetch = 3;
  async_config.data.io_threads = 2;
  async_config.data.cache = "memory";
  async_config.data.debug_read_delay_ms = 1;
  Trainer async(async_config, world);
  const auto async_summary = async.run();
  ASSERT_EQ(sync_summary.steps, steps);
  ASSERT_EQ(async_summary.steps, steps);
  EXPECT_EQ(std::memcmp(sync.params().raw(), async.params().raw(), sync.params().size_bytes()), 0)
      << "the input pipeline changed what was trained on";
  for (const auto& summary : {sync_summary, async_summary}) {
    EXPECT_GE(summary.data_wait_s, 0);
    EXPECT_GE(summary.data_wait_fraction, 0);
    EXPECT_LE(summary.data_wait_fraction, 1);
  }
}

TEST_F(TrainMpi, CacheOptionIsCheckedInTheAgreedSetup) {
  comm::World world;
  RunConfig c = config(8, 5);
  c.data.cache = "memory";
  c.data.cache_limit_mb = 0;  // the node's memory: fits
  EXPECT_NO_THROW(Trainer(c, world));
  // Unknown mode: every rank fails together (the message is printed once, by rank 0).
  c.data.cache = "disk";
  EXPECT_THROW(Trainer(c, world), comm::ReportedFailure);
}

}  // namespace
}  // namespace mpt::train

namespace mpt::train {
namespace {

// The overflow path of mixed precision: an Inf/NaN in ONE rank's local gradients reaches every
// rank through the all-reduce; every rank skips that step, the loss scale halves, and the
// weights equal those of a run that stopped one step earlier.
TEST_F(TrainMpi, OverflowOnOneRankSkipsTheStepEverywhere) {
  comm::World world;
  const std::int64_t fault_step = 6;
  RunConfig before = config(8, fault_step - 1);
  before.amp.precision = "fp16";
  Trainer reference(before, world);
  const auto reference_summary = reference.run();
  EXPECT_EQ(reference_summary.skipped_steps, 0);
  EXPECT_EQ(reference_summary.loss_scale, 65536.0);

  RunConfig faulty = before;
  faulty.loop.max_steps = fault_step;
  faulty.fault = "nan-grad:" + std::to_string(world.size() - 1) + ":" + std::to_string(fault_step);
  Trainer trainer(faulty, world);
  const auto summary = trainer.run();
  EXPECT_EQ(summary.skipped_steps, 1);
  EXPECT_EQ(summary.loss_scale, 32768.0);
  const Tensor& a = reference.params();
  const Tensor& b = trainer.params();
  ASSERT_EQ(a.size_bytes(), b.size_bytes());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.size_bytes()), 0) << "a skipped step changed the weights";

  // Without the fault the same step does change them, so the comparison above can fail.
  RunConfig clean = faulty;
  clean.fault.clear();
  Trainer moved(clean, world);
  moved.run();
  EXPECT_NE(std::memcmp(a.raw(), moved.params().raw(), a.size_bytes()), 0);
}

TEST_F(TrainMpi, SixteenBitTrainingKeepsRanksIdenticalAndLearns) {
  comm::World world;
  for (const char* precision : {"fp16", "bf16"}) {
    RunConfig c = config(8, 40);
    c.amp.precision = precision;
    Trainer trainer(c, world);
    const auto summary = trainer.run();
    EXPECT_TRUE(std::isfinite(summary.final_train_loss)) << precision;
    const Tensor& params = trainer.params();
    Tensor root_copy({static_cast<std::int64_t>(params.size_bytes())}, DType::u8);
    std::memcpy(root_copy.raw(), params.raw(), params.size_bytes());
    world.broadcast(root_copy, 0);
    EXPECT_EQ(std::memcmp(root_copy.raw(), params.raw(), params.size_bytes()), 0) << precision;
  }
}

// AdamW with decoupled decay (biases undecayed), a warmed-up cosine schedule and clipping by
// global norm: every rank applies the same update, so the weights stay bit-identical.
TEST_F(TrainMpi, AdamwCosineClippingKeepsRanksIdentical) {
  comm::World world;
  RunConfig c = config(8, 20);
  c.optimizer.name = "adamw";
  c.optimizer.lr = 1e-2;
  c.optimizer.weight_decay = 0.05;
  c.optimizer.clip_norm = 0.05;  // small enough to clip on this data
  c.schedule.name = "cosine";
  c.schedule.warmup_steps = 5;
  c.schedule.min_lr = 1e-3;
  Trainer trainer(c, world);
  const auto summary = trainer.run();
  EXPECT_EQ(summary.optimizer_steps, 20);
  EXPECT_TRUE(std::isfinite(summary.final_train_loss));
  EXPECT_GT(summary.grad_norm, 0);
  optim::ScheduleOptions o;
  o.name = "cosine";
  o.warmup_steps = 5;
  o.min_lr = 1e-3;
  EXPECT_DOUBLE_EQ(summary.last_lr, optim::Schedule(o, 1e-2, 20).lr(19));
  const Tensor& params = trainer.params();
  Tensor root_copy({static_cast<std::int64_t>(params.size_bytes())}, DType::u8);
  std::memcpy(root_copy.raw(), params.raw(), params.size_bytes());
  world.broadcast(root_copy, 0);
  EXPECT_EQ(std::memcmp(root_copy.raw(), params.raw(), params.size_bytes()), 0);
}

// A step skipped for a gradient overflow does not advance the schedule: after 10 steps with one
// skipped, the last update used the LR of applied step 8, not 9.
TEST_F(TrainMpi, SkippedStepDoesNotAdvanceTheSchedule) {
  comm::World world;
  RunConfig c = config(8, 10);
  c.amp.precision = "fp16";
  c.optimizer.name = "adamw";
  c.optimizer.lr = 1e-2;
  c.schedule.name = "cosine";
  optim::ScheduleOptions o;
  o.name = "cosine";
  const optim::Schedule schedule(o, 1e-2, 10);
  Trainer clean(c, world);
  const auto clean_summary = clean.run();
  ASSERT_GE(clean_summary.optimizer_steps, 2);
  EXPECT_EQ(clean_summary.optimizer_steps, 10 - clean_summary.skipped_steps);
  EXPECT_DOUBLE_EQ(clean_summary.last_lr, schedule.lr(clean_summary.optimizer_steps - 1));

  c.fault = "nan-grad:" + std::to_string(world.size() - 1) + ":4";
  Trainer faulty(c, world);
  const auto summary = faulty.run();
  EXPECT_EQ(summary.skipped_steps, clean_summary.skipped_steps + 1);
  EXPECT_EQ(summary.optimizer_steps, clean_summary.optimizer_steps - 1);
  EXPECT_DOUBLE_EQ(summary.last_lr, schedule.lr(summary.optimizer_steps - 1));
  EXPECT_NE(summary.last_lr, clean_summary.last_lr);
}

TEST_F(TrainMpi, LinearLrScalingUsesTheGlobalBatch) {
  comm::World world;
  RunConfig c = config(8, 2);
  c.optimizer.lr_scaling = "linear";
  c.optimizer.reference_batch = 4;
  Trainer trainer(c, world);
  const auto summary = trainer.run();
  EXPECT_DOUBLE_EQ(summary.base_lr, 0.1 * 8 * world.size() / 4);
  EXPECT_DOUBLE_EQ(summary.last_lr, summary.base_lr);  // constant schedule
}

}  // namespace
}  // namespace mpt::train
