// Tests of the Prefetcher and the memory cache: exact batches in plan order under random read
// delays for every depth and I/O thread count, clean shutdown mid-epoch, I/O errors rethrown on
// the trainer's thread with the reader's message, and a warm cache that reads no file.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "core/hdf5.hpp"
#include "data/data.hpp"
#include "tests/data/prefetch_test_util.hpp"
#include "tests/test_util.hpp"

namespace mpt::data {
namespace {

using test::expect_same_batches;
using test::jitter_hook;

// A small synthetic dataset shared by the tests of this file: 256 samples of 1x4x4, 4 classes.
class PrefetcherTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir("prefetcher");
    SyntheticSpec spec;
    spec.train_samples = 256;
    spec.test_samples = 16;
    spec.sample_shape = {1, 4, 4};
    spec.num_classes = 4;
    spec.seed = 3;
    prepare_synthetic(spec, dir_->path());
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static std::string path() { return dir_->file("train.h5"); }
  static inline test::TempDir* dir_ = nullptr;
};

double seconds_of(const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  body();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST_F(PrefetcherTest, DeliversExactlyThePlannedBatchesInOrderUnderRandomDelays) {
  DatasetReader reference(path(), {});
  const ShardPlan plan(256, 12, 1, 0, 7);  // 21 steps per epoch, 4 samples dropped
  struct Case {
    int depth, io_threads;
  };
  for (const Case c : {Case{0, 1}, Case{1, 1}, Case{2, 1}, Case{2, 2}, Case{4, 1}, Case{4, 2}}) {
    SCOPED_TRACE("prefetch " + std::to_string(c.depth) + ", io-threads " +
                 std::to_string(c.io_threads));
    DatasetReader first(path(), {}), second(path(), {});
    PrefetchOptions options;
    options.depth = c.depth;
    options.io_threads = c.io_threads;
    options.before_read = jitter_hook(3);
    Prefetcher prefetcher({&first, &second}, plan, options);
    // From the middle of epoch 1 across two epoch boundaries; the trainer is sometimes slower,
    // sometimes faster than the reads.
    prefetcher.start(1, 15, 40);
    expect_same_batches(prefetcher, reference, plan, 1, 15, 40, /*consumer_jitter_ms=*/2);
    // And it restarts: a second sequence on the same object.
    prefetcher.start(0, 0, 5);
    expect_same_batches(prefetcher, reference, plan, 0, 0, 5, 0);
  }
}

// deliver_to(cpu, raw_u8): the ring's batches hold the stored bytes of the planned samples.
TEST_F(PrefetcherTest, RawUint8DeliveryHandsOutTheStoredBytesInPlanOrder) {
  DatasetReader reference(path(), {});
  const ShardPlan plan(256, 12, 1, 0, 7);
  DatasetReader first(path(), {}), second(path(), {});
  PrefetchOptions options;
  options.depth = 3;
  options.io_threads = 2;
  options.before_read = jitter_hook(2);
  Prefetcher prefetcher({&first, &second}, plan, options);
  prefetcher.deliver_to(Device::cpu, /*raw_u8=*/true);
  prefetcher.start(0, 18, 8);  // across the epoch boundary
  Tensor expected({12, 1, 4, 4}, DType::u8), expected_labels({12}, DType::i32);
  std::vector<std::int64_t> indices;
  for (std::int64_t k = 0; k < 8; ++k) {
    const std::int64_t epoch = (18 + k) / plan.steps_per_epoch(), step = (18 + k) % plan.steps_per_epoch();
    const Batch& batch = prefetcher.next();
    ASSERT_EQ(batch.samples.dtype(), DType::u8);
    ASSERT_EQ(batch.samples.shape(), (Shape{12, 1, 4, 4}));
    EXPECT_EQ(batch.epoch, epoch);
    EXPECT_EQ(batch.step, step);
    plan.batch_indices(epoch, step, indices);
    reference.read_batch(indices, expected, expected_labels);
    EXPECT_EQ(std::memcmp(batch.samples.raw(), expected.raw(), expected.size_bytes()), 0) << "batch " << k;
    EXPECT_EQ(std::memcmp(batch.labels.raw(), expected_labels.raw(), expected_labels.size_bytes()), 0);
    prefetcher.release();
  }
}

TEST_F(PrefetcherTest, ShutdownMidEpochJoinsCleanly) {
  const ShardPlan plan(256, 16, 1, 0, 7);
  DatasetReader first(path(), {}), second(path(), {});
  // The ring full: take a few, give the I/O threads time to fill every slot, destroy.
  for (int io_threads : {1, 2}) {
    PrefetchOptions options;
    options.depth = 4;
    options.io_threads = io_threads;
    auto prefetcher =
        std::make_unique<Prefetcher>(std::vector<DatasetReader*>{&first, &second}, plan, options);
    prefetcher->start(0, 0, 100);
    for (int i = 0; i < 3; ++i) {
      prefetcher->next();
      prefetcher->release();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_LT(seconds_of([&] { prefetcher.reset(); }), 1.0);
  }
  // A batch still held by the trainer when it stops (an exception between next and release).
  {
    Prefetcher prefetcher({&first}, plan, {});
    prefetcher.start(0, 0, 10);
    prefetcher.next();
    EXPECT_LT(seconds_of([&] { prefetcher.stop(); }), 1.0);
  }
  // The I/O thread inside a slow read: the debug delay is interruptible, so stopping does not
  // sit it out.
  {
    PrefetchOptions options;
    options.read_delay_ms = 5000;
    auto prefetcher =
        std::make_unique<Prefetcher>(std::vector<DatasetReader*>{&first}, plan, options);
    prefetcher->start(0, 3, 10);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_LT(seconds_of([&] { prefetcher.reset(); }), 1.0);
  }
  // A read that cannot be interrupted (the hook stands for a slow H5Dread): stop waits for it to
  // end, then joins.
  {
    PrefetchOptions options;
    options.depth = 2;
    options.io_threads = 2;
    options.before_read = [](std::int64_t, std::int64_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    };
    auto prefetcher =
        std::make_unique<Prefetcher>(std::vector<DatasetReader*>{&first, &second}, plan, options);
    prefetcher->start(0, 0, 10);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const double seconds = seconds_of([&] { prefetcher.reset(); });
    EXPECT_GT(seconds, 0.1);
    EXPECT_LT(seconds, 2.0);
  }
  // Destroyed without ever being started.
  { Prefetcher never_started({&first}, plan, {}); }
}

// A float32 file whose sample BAD_INDEX holds a NaN: the reader rejects any batch with it.
void write_float_file_with_nan(const std::string& path, std::int64_t n, std::int64_t bad_index) {
  auto lock = hdf5_lock();
  Hdf5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT));
  ASSERT_TRUE(file.valid());
  std::vector<float> samples(static_cast<std::size_t>(n * 3));
  for (std::size_t i = 0; i < samples.size(); ++i) samples[i] = static_cast<float>(i % 17) / 17;
  samples[static_cast<std::size_t>(bad_index * 3 + 1)] = std::nanf("");
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 2);
  hdf5_write_dataset(file.get(), "samples", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, {n, 3},
                     samples.data());
  hdf5_write_dataset(file.get(), "labels", H5T_STD_I32LE, H5T_NATIVE_INT32, {n}, labels.data());
  hdf5_write_attribute(file.get(), "num_classes", std::int32_t{2});
}

TEST_F(PrefetcherTest, ReadErrorSurfacesOnTheTrainerThreadWithTheReadersMessage) {
  test::TempDir dir("prefetcher-error");
  const std::string bad = dir.file("nan.h5");
  const std::int64_t n = 200, bad_index = 77;
  write_float_file_with_nan(bad, n, bad_index);
  const ShardPlan plan(n, 8, 1, 0, 9);
  // Where the bad sample sits in epoch 0, and what a direct read of that batch says.
  std::int64_t bad_step = -1;
  std::vector<std::int64_t> indices;
  for (std::int64_t step = 0; step < plan.steps_per_epoch() && bad_step < 0; ++step) {
    plan.batch_indices(0, step, indices);
    if (std::find(indices.begin(), indices.end(), bad_index) != indices.end()) bad_step = step;
  }
  ASSERT_GE(bad_step, 0) << "sample " << bad_index << " is dropped in epoch 0; pick another";
  std::string expected;
  {
    DatasetReader reader(bad, {});
    Tensor samples({8, 3}, DType::f32), labels({8}, DType::i32);
    plan.batch_indices(0, bad_step, indices);
    expected = test::user_error_text([&] { reader.read_batch(indices, samples, labels); });
  }
  ASSERT_NE(expected.find("non-finite"), std::string::npos) << expected;

  for (int depth : {0, 1, 3}) {
    for (int io_threads : {1, 2}) {
      if (io_threads > std::max(depth, 1)) continue;
      SCOPED_TRACE("prefetch " + std::to_string(depth) + ", io-threads " +
                   std::to_string(io_threads));
      DatasetReader first(bad, {}), second(bad, {});
      PrefetchOptions options;
      options.depth = depth;
      options.io_threads = io_threads;
      options.before_read = jitter_hook(2);
      Prefetcher prefetcher({&first, &second}, plan, options);
      prefetcher.start(0, 0, plan.steps_per_epoch());
      // Every batch before the bad one arrives intact; the bad one throws the reader's error.
      for (std::int64_t step = 0; step < bad_step; ++step) {
        const Batch& batch = prefetcher.next();
        EXPECT_EQ(batch.step, step);
        prefetcher.release();
      }
      EXPECT_EQ(test::user_error_text([&] { prefetcher.next(); }), expected);
    }  // and the destructor joins the threads after a failure
  }
}

TEST_F(PrefetcherTest, ErrorFromTheIoPathIsRethrownInOrder) {
  DatasetReader first(path(), {}), second(path(), {});
  const ShardPlan plan(256, 16, 1, 0, 7);
  PrefetchOptions options;
  options.depth = 4;
  options.io_threads = 2;
  options.before_read = [](std::int64_t, std::int64_t step) {
    if (step == 6) throw_user_error("injected failure at step 6", "none");
    std::this_thread::sleep_for(std::chrono::milliseconds(step % 3));
  };
  Prefetcher prefetcher({&first, &second}, plan, options);
  prefetcher.start(0, 0, 16);
  for (int step = 0; step < 6; ++step) {
    EXPECT_EQ(prefetcher.next().step, step);
    prefetcher.release();
  }
  EXPECT_EQ(test::user_error_text([&] { prefetcher.next(); }),
            "injected failure at step 6 (hint: none)");
}

TEST_F(PrefetcherTest, MemoryCacheServesLaterEpochsWithoutReadingTheFile) {
  DatasetReader reference(path(), {});
  const ShardPlan plan(256, 16, 1, 0, 7);  // 16 steps: every sample, every epoch
  for (int io_threads : {1, 2}) {
    SCOPED_TRACE("io-threads " + std::to_string(io_threads));
    DatasetReader first(path(), {}), second(path(), {});
    SampleCache cache(256, first.staged_sample_bytes(), 1 << 20, "--data.cache-limit-mb", path());
    EXPECT_EQ(cache.planned_bytes(), 256u * 16u);
    first.set_cache(&cache);
    second.set_cache(&cache);
    PrefetchOptions options;
    options.io_threads = io_threads;
    options.before_read = jitter_hook(1);
    Prefetcher prefetcher({&first, &second}, plan, options);
    prefetcher.start(0, 0, 16);
    expect_same_batches(prefetcher, reference, plan, 0, 0, 16, 0);
    const std::int64_t reads_in_epoch_0 = first.file_reads() + second.file_reads();
    EXPECT_GT(reads_in_epoch_0, 0);
    EXPECT_EQ(cache.cached_samples(), 256);
    // Epochs 1 and 2: identical batches to an uncached read, and not one more file read.
    prefetcher.start(1, 0, 32);
    expect_same_batches(prefetcher, reference, plan, 1, 0, 32, 0);
    EXPECT_EQ(first.file_reads() + second.file_reads(), reads_in_epoch_0);
  }
}

TEST_F(PrefetcherTest, PartlyCachedBatchesSplitTheirRunsCorrectly) {
  // Half of the samples cached (the even ones), then contiguous batches: every run is cut by
  // cache hits, and the result must still equal an uncached read.
  DatasetReader reference(path(), {}), reader(path(), {});
  SampleCache cache(256, reader.staged_sample_bytes(), 1 << 20, "--data.cache-limit-mb", path());
  Tensor samples({32, 1, 4, 4}, DType::f32), labels({32}, DType::i32);
  Tensor expected_samples({32, 1, 4, 4}, DType::f32), expected_labels({32}, DType::i32);
  std::vector<std::int64_t> even;
  for (std::int64_t i = 0; i < 256; i += 2) even.push_back(i);
  reader.set_cache(&cache);
  for (std::size_t first = 0; first < even.size(); first += 32)
    reader.read_batch(std::span(even).subspan(first, 32), samples, labels);
  EXPECT_EQ(cache.cached_samples(), 128);
  std::vector<std::int64_t> indices(32);
  for (std::int64_t first = 0; first < 256; first += 32) {
    for (std::int64_t j = 0; j < 32; ++j)
      indices[static_cast<std::size_t>(j)] = (first + j * 5) % 256;
    reader.read_batch(indices, samples, labels);
    reference.read_batch(indices, expected_samples, expected_labels);
    EXPECT_EQ(std::memcmp(samples.raw(), expected_samples.raw(), samples.size_bytes()), 0);
    EXPECT_EQ(std::memcmp(labels.raw(), expected_labels.raw(), labels.size_bytes()), 0);
  }
}

TEST(SampleCache, TooBigForTheLimitIsAUserErrorNamingTheOption) {
  const std::string text = test::user_error_text([] {
    SampleCache cache(1'000'000, 784, 100u << 20, "--data.cache-limit-mb", "/data/train.h5");
  });
  EXPECT_NE(text.find("--data.cache=memory needs 748 MiB per rank"), std::string::npos) << text;
  EXPECT_NE(text.find("'/data/train.h5'"), std::string::npos) << text;
  EXPECT_NE(text.find("--data.cache-limit-mb is 100 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("hint: use --data.cache=none"), std::string::npos) << text;
  // The machine's free memory moves between readings (tests run in parallel): bracket the
  // 4-rank share by two 1-rank readings and allow 1 % of drift beyond them.
  const std::size_t before = available_memory_per_rank(1);
  const std::size_t share = available_memory_per_rank(4);
  const std::size_t after = available_memory_per_rank(1);
  EXPECT_GT(before, 0u);
  EXPECT_LE(share, std::max(before, after) / 4 + std::max(before, after) / 100);
  EXPECT_GE(share, std::min(before, after) / 4 - std::min(before, after) / 100);
}

TEST(Prefetcher, InvalidOptionsAreUserErrorsNamingTheOption) {
  auto message = [](PrefetchOptions options) {
    return test::user_error_text([&] { Prefetcher::validate(options); });
  };
  PrefetchOptions options;
  options.depth = -1;
  EXPECT_NE(message(options).find("--data.prefetch must be in [0, 64], got -1"), std::string::npos);
  options = {};
  options.io_threads = 0;
  EXPECT_NE(message(options).find("--data.io-threads must be in [1, 64], got 0"),
            std::string::npos);
  options = {};
  options.depth = 1;
  options.io_threads = 2;
  EXPECT_NE(message(options).find("--data.io-threads=2 needs --data.prefetch >= 2, got 1"),
            std::string::npos);
  options = {};
  options.read_delay_ms = -5;
  EXPECT_NE(message(options).find("--data.debug-read-delay-ms must be >= 0"), std::string::npos);
}

}  // namespace
}  // namespace mpt::data
