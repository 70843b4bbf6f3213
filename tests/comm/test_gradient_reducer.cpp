// comm::GradientReducer: the bucket plan (parameter boundaries, reverse order, sizes) and the
// overlap engine (bucketed, threaded reduction = one flat all-reduce, for any bucket size and
// with collectives interleaved), under mpiexec -n 1, 2, 3 and 4.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "comm/gradient_reducer.hpp"
#include "comm/nccl_allreduce.hpp"
#include "comm/shared_buffer.hpp"
#include "comm/topology.hpp"
#include "core/half.hpp"

namespace mpt::comm {
namespace {

// Parameters of 10, 3, 100, 1, 7 and 50 elements, densely packed: offsets 0, 10, 13, 113, 114, 121.
const std::vector<std::int64_t> kOffsets{0, 10, 13, 113, 114, 121};
constexpr std::int64_t kCount = 171;

// WHOLE_PARAMETERS: every bucket must also start on a parameter boundary (no limit reaches
// kMinSplitBucketBytes, so no parameter may be cut).
void expect_tiles_in_reverse(const std::vector<Range>& buckets, std::int64_t count,
                             const std::vector<std::int64_t>& offsets,
                             bool whole_parameters = true) {
  ASSERT_FALSE(buckets.empty());
  EXPECT_EQ(buckets.front().end, count);
  EXPECT_EQ(buckets.back().begin, 0);
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    EXPECT_LT(buckets[i].begin, buckets[i].end) << "bucket " << i << " is empty";
    if (i > 0) {
      EXPECT_EQ(buckets[i].end, buckets[i - 1].begin) << "buckets must tile, last first";
    }
    if (!whole_parameters) continue;
    bool on_boundary = false;
    for (auto offset : offsets) on_boundary = on_boundary || offset == buckets[i].begin;
    EXPECT_TRUE(on_boundary) << "bucket " << i << " starts inside a parameter at "
                             << buckets[i].begin;
  }
}

TEST(PlanBuckets, TinyBucketsHoldOneParameterEach) {
  const auto buckets = plan_buckets(kCount, 4, kOffsets, 1, 1);
  ASSERT_EQ(buckets.size(), kOffsets.size());
  expect_tiles_in_reverse(buckets, kCount, kOffsets);
  for (std::size_t i = 0; i < buckets.size(); ++i)
    EXPECT_EQ(buckets[i].begin, kOffsets[kOffsets.size() - 1 - i]);
}

TEST(PlanBuckets, ZeroOrHugeIsOneBucket) {
  for (std::int64_t bytes : {std::int64_t{0}, std::int64_t{1} << 40}) {
    const auto buckets = plan_buckets(kCount, 4, kOffsets, bytes, bytes);
    ASSERT_EQ(buckets.size(), 1u) << bytes;
    EXPECT_EQ(buckets[0].begin, 0);
    EXPECT_EQ(buckets[0].end, kCount);
  }
  EXPECT_TRUE(plan_buckets(0, 4, {}, 100, 10).empty());
  EXPECT_EQ(plan_buckets(5, 2, {}, 1, 1).size(), 1u);  // no parameter list: one bucket
}

TEST(PlanBuckets, LimitsHoldExceptForOversizedParameters) {
  // First bucket <= 60 bytes (15 f32), then <= 200 bytes (50 f32); the 100-element parameter
  // is larger than a bucket and is a bucket of its own.
  const auto buckets = plan_buckets(kCount, 4, kOffsets, 200, 60);
  expect_tiles_in_reverse(buckets, kCount, kOffsets);
  // Last parameter (50 elements) alone exceeds 60 bytes: its own first bucket. Then 7 + 1
  // (8 elements, 32 bytes; adding 100 would exceed 200), then 100 alone, then 3 + 10.
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets[0].begin, 121);
  EXPECT_EQ(buckets[1].begin, 113);
  EXPECT_EQ(buckets[2].begin, 13);
  EXPECT_EQ(buckets[3].begin, 0);
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    const std::int64_t limit = i == 0 ? 60 : 200;
    std::int64_t params_inside = 0;
    for (auto offset : kOffsets)
      params_inside += offset >= buckets[i].begin && offset < buckets[i].end;
    if (params_inside > 1) {
      EXPECT_LE(buckets[i].size() * 4, limit) << "bucket " << i;
    }
  }
  // 16-bit gradients: the same byte limits hold twice the elements, so fewer buckets.
  const auto f32 = plan_buckets(kCount, 4, kOffsets, 240, 120);
  const auto half = plan_buckets(kCount, 2, kOffsets, 240, 120);
  expect_tiles_in_reverse(half, kCount, kOffsets);
  EXPECT_EQ(f32.size(), 4u);
  EXPECT_EQ(half.size(), 2u);
}

// Parameters of 1000, 200000, 50, 300000 and 100 elements: two larger than a bucket.
const std::vector<std::int64_t> kLargeOffsets{0, 1000, 201000, 201050, 501050};
constexpr std::int64_t kLargeCount = 501150;

TEST(PlanBuckets, ParametersLargerThanABucketAreCut) {
  // f32, first bucket 64 KiB (16384 elements), then 256 KiB (65536 elements).
  const std::int64_t first = 64 << 10, size = 256 << 10;
  const auto buckets = plan_buckets(kLargeCount, 4, kLargeOffsets, size, first);
  expect_tiles_in_reverse(buckets, kLargeCount, kLargeOffsets, /*whole_parameters=*/false);
  for (std::size_t i = 0; i < buckets.size(); ++i)
    EXPECT_LE(buckets[i].size() * 4, i == 0 ? first : size) << "bucket " << i;
  // The last parameter (100) and the tail of the 300000 fill the first bucket; four full
  // buckets of the 300000 follow, and its head (21572) opens the next, which the 50 and the
  // tail of the 200000 fill. Two more full buckets of the 200000, then its head (25014) and
  // the first parameter (1000) share the last bucket.
  const std::vector<std::int64_t> begins{
      kLargeCount - 16384, 419230, 353694, 288158, 222622, 157086, 91550, 26014, 0};
  ASSERT_EQ(buckets.size(), begins.size());
  for (std::size_t i = 0; i < begins.size(); ++i) {
    EXPECT_EQ(buckets[i].begin, begins[i]) << "bucket " << i;
    // Cutting leaves no bucket short but the one holding the first parameter.
    if (i + 1 < begins.size()) {
      EXPECT_EQ(buckets[i].size(), i == 0 ? 16384 : 65536) << "bucket " << i;
    }
  }
  // A parameter that a fresh bucket holds is not cut: it closes the open bucket instead. With
  // 1.25 MiB buckets (327680 elements) each large parameter fits in one, but not both together.
  const auto roomy = plan_buckets(kLargeCount, 4, kLargeOffsets, 5 << 18, 64 << 10);
  expect_tiles_in_reverse(roomy, kLargeCount, kLargeOffsets);
  ASSERT_EQ(roomy.size(), 3u);
  EXPECT_EQ(roomy[0].begin, 501050);  // the 100 alone: the 300000 does not fit in 64 KiB
  EXPECT_EQ(roomy[1].begin, 201000);  // the 300000 and the 50
  EXPECT_EQ(roomy[2].begin, 0);       // the 200000 and the 1000
  // Under kMinSplitBucketBytes nothing is cut, as the small-layout tests above check.
  const std::int64_t tiny = kMinSplitBucketBytes - 4;
  expect_tiles_in_reverse(plan_buckets(kLargeCount, 4, kLargeOffsets, tiny, tiny), kLargeCount,
                          kLargeOffsets);
}

TEST(PlanBuckets, MlpWeightsAreCutIntoMebibyteBuckets) {
  // The 784-1024-1024-10 MLP, f32, --comm.bucket-mb=1 (first 1 MiB as well): no bucket may
  // exceed 1 MiB, so both large weight gradients (3.1 and 4 MiB) are spread over buckets.
  const std::vector<std::int64_t> offsets{0, 802816, 803840, 1852416, 1853440, 1863680};
  const std::int64_t count = 1863690, mib = 1 << 20;
  const auto buckets = plan_buckets(count, 4, offsets, mib, mib);
  expect_tiles_in_reverse(buckets, count, offsets, /*whole_parameters=*/false);
  int in_dense0_weight = 0, in_dense2_weight = 0;
  for (const Range& bucket : buckets) {
    EXPECT_LE(bucket.size() * 4, mib);
    in_dense0_weight += bucket.begin < offsets[1];
    in_dense2_weight += bucket.begin >= offsets[2] && bucket.begin < offsets[3];
  }
  EXPECT_GE(in_dense0_weight, 3);  // 3.06 MiB
  EXPECT_GE(in_dense2_weight, 4);  // 4 MiB
  // 16-bit gradients: the same bytes hold twice the elements, so about half the buckets.
  EXPECT_LT(plan_buckets(count, 2, offsets, mib, mib).size(), buckets.size());
}

// Rank r's gradient element i: small integers, so every summation order gives the same sum
// and the bucketed result must equal the flat one bit for bit.
float local_value(int rank, std::int64_t i) {
  return static_cast<float>((i * 7 + rank * 13) % 23) - 11.0f;
}

struct Case {
  Algorithm algorithm;
  int ranks_per_node;
  bool registered = false;  // the gradients in a SharedBuffer that the all-reduce reads
  bool staged = false;      // reduced in a host twin (DeferredStaging), as for cuda gradients
  bool queued = false;      // the queued form of the nccl backend (QueuedStandIn)
};

// A staging that behaves as a device's does (kernels::HostStaging on cuda), on host memory, and
// checks the order of the reducer's calls. A download lands only when it is waited for, and an
// upload only at join(): a bucket reduced before its copy landed reads the twin's NaN, and a
// step that never joins keeps the local values, so either shows as a wrong sum. After a join the
// twin is NaN again, so no step can live on the last one's copies.
class DeferredStaging final : public device_memory::Staging {
 public:
  DeferredStaging(Tensor& data, const GradientReducer& reducer)
      : data_(static_cast<unsigned char*>(data.raw())),
        element_(dtype_size(data.dtype())),
        twin_(static_cast<std::size_t>(data.numel()) * element_),
        reducer_(reducer),
        state_(static_cast<std::size_t>(reducer.num_buckets()), State::idle) {
    poison_twin();
  }
  void* host() override { return twin_.data(); }
  void download(int slot, std::int64_t begin, std::int64_t end) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    ASSERT_TRUE(slot >= 0 && slot < reducer_.num_buckets()) << slot;
    EXPECT_EQ(begin, reducer_.bucket(slot).begin);
    EXPECT_EQ(end, reducer_.bucket(slot).end);
    EXPECT_EQ(state_[static_cast<std::size_t>(slot)], State::idle) << "bucket " << slot << " downloaded twice";
    state_[static_cast<std::size_t>(slot)] = State::downloading;
  }
  void wait_downloaded(int slot) override {
    if (slot == delayed_slot_) std::this_thread::sleep_for(std::chrono::duration<double>(delay_seconds_));
    const std::lock_guard<std::mutex> lock(mutex_);
    ASSERT_TRUE(slot >= 0 && slot < reducer_.num_buckets()) << slot;
    EXPECT_EQ(state_[static_cast<std::size_t>(slot)], State::downloading)
        << "bucket " << slot << " waited for without a download";
    const Range& range = reducer_.bucket(slot);
    std::memcpy(twin_.data() + offset(range.begin), data_ + offset(range.begin), offset(range.size()));
    state_[static_cast<std::size_t>(slot)] = State::downloaded;
  }
  void upload(std::int64_t begin, std::int64_t end) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    int slot = -1;
    for (int b = 0; b < reducer_.num_buckets(); ++b)
      if (reducer_.bucket(b).begin == begin && reducer_.bucket(b).end == end) slot = b;
    ASSERT_GE(slot, 0) << "upload of [" << begin << ", " << end << "), not a bucket";
    EXPECT_EQ(state_[static_cast<std::size_t>(slot)], State::downloaded)
        << "bucket " << slot << " uploaded before its download landed";
    state_[static_cast<std::size_t>(slot)] = State::uploaded;
  }
  void join() override {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (int b = 0; b < reducer_.num_buckets(); ++b) {
      EXPECT_EQ(state_[static_cast<std::size_t>(b)], State::uploaded) << "join before bucket " << b;
      const Range& range = reducer_.bucket(b);
      std::memcpy(data_ + offset(range.begin), twin_.data() + offset(range.begin), offset(range.size()));
      state_[static_cast<std::size_t>(b)] = State::idle;
    }
    poison_twin();
    ++joins_;
  }
  int joins() const { return joins_; }
  // The wait for SLOT's copy takes SECONDS more, as when the device is still writing the bucket.
  void delay(int slot, double seconds) {
    delayed_slot_ = slot;
    delay_seconds_ = seconds;
  }

 private:
  enum class State { idle, downloading, downloaded, uploaded };
  std::size_t offset(std::int64_t elements) const { return static_cast<std::size_t>(elements) * element_; }
  void poison_twin() { std::memset(twin_.data(), 0xff, twin_.size()); }  // NaN in f32 and f16

  unsigned char* data_;
  std::size_t element_;
  std::vector<unsigned char> twin_;
  const GradientReducer& reducer_;
  std::mutex mutex_;
  std::vector<State> state_;
  int joins_ = 0;
  int delayed_slot_ = -1;
  double delay_seconds_ = 0;
};

// A host stand-in for the nccl backend's queued form (detail::NcclAllreduce). A queued call
// runs only at join(), through a flat MPI all-reduce (as the device runs the calls before the
// compute work queued after the join), so a step that ended without join() keeps its local
// gradients; and every call checks its order within a step: each slot marked, then queued,
// once; join() after every slot is queued, with at most one join outstanding before it;
// finish(KEEP) completes the oldest joins until KEEP are outstanding, and counts them.
class QueuedStandIn final : public detail::NcclAllreduce {
 public:
  QueuedStandIn(const Topology& topology, DType wire) : host_(topology, flat_config(wire)) {}
  void allreduce(void* data, std::int64_t count, DType dtype) override {
    host_.allreduce(data, count, dtype);
  }
  void plan_slots(int slots, std::int64_t max_count, DType dtype) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    planned_max_count_ = max_count;
    planned_dtype_ = dtype;
    state_.assign(static_cast<std::size_t>(slots), State::idle);
  }
  void mark(int slot) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    check_thread();
    ASSERT_TRUE(slot >= 0 && static_cast<std::size_t>(slot) < state_.size()) << slot;
    EXPECT_EQ(state_[static_cast<std::size_t>(slot)], State::idle) << "slot " << slot << " marked twice";
    state_[static_cast<std::size_t>(slot)] = State::marked;
  }
  void allreduce_queued(int slot, void* data, std::int64_t count, DType dtype) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    check_thread();
    ASSERT_TRUE(slot >= 0 && static_cast<std::size_t>(slot) < state_.size()) << slot;
    EXPECT_EQ(state_[static_cast<std::size_t>(slot)], State::marked)
        << "slot " << slot << " queued before its mark";
    state_[static_cast<std::size_t>(slot)] = State::queued;
    // Its buffers were taken for the planned largest call: none may be larger, nor of another
    // dtype.
    EXPECT_LE(count, planned_max_count_) << "slot " << slot << " larger than planned";
    EXPECT_EQ(dtype, planned_dtype_) << "slot " << slot;
    pending_.push_back({data, count, dtype});
  }
  void join() override {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (std::size_t b = 0; b < state_.size(); ++b)
      EXPECT_EQ(state_[b], State::queued) << "join before slot " << b << " was queued";
    EXPECT_LE(outstanding_, 1) << "a third join before finish(1)";
    state_.assign(state_.size(), State::idle);
    if (capturing_) {
      // The graph of this join slot: its calls run at each replayed(), on the buffers named now.
      graphs_[static_cast<std::size_t>(next_slot())] = std::move(pending_);
      pending_.clear();
      return;
    }
    for (const Pending& call : pending_) host_.allreduce(call.data, call.count, call.dtype);
    pending_.clear();
    ++outstanding_;
  }
  double finish(int keep) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    EXPECT_FALSE(capturing_) << "finish() while capturing: a host wait inside the graph";
    EXPECT_TRUE(keep == 0 || keep == 1) << keep;
    EXPECT_TRUE(pending_.empty()) << "finish with calls queued after the last join";
    while (outstanding_ > keep) {
      --outstanding_;
      ++completed_;
    }
    return 0;
  }
  // Sync BN's sums: an f32 MPI sum at once (the device would run it before the compute work
  // queued after it). The host tests hand sum_stats() host data, which never comes here.
  bool sums_world() const override { return true; }
  void sum_queued(float* data, std::int64_t count) override {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (capturing_) {  // a node of the graph, in order with the buckets
        pending_.push_back({data, count, DType::f32});
        return;
      }
    }
    MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  // CUDA graphs: while capturing, calls are recorded, and join() ends the graph of its slot;
  // replayed(SLOT) runs that graph's calls (in capture order) and makes its join outstanding.
  bool captures() const override { return true; }
  bool captures_buckets() const override { return true; }
  void capture_on(void* stream) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    EXPECT_NE(capturing_, stream != nullptr) << "capture_on() twice alike";
    capturing_ = stream != nullptr;
    if (capturing_) {
      EXPECT_EQ(capturing_thread_, std::thread::id()) << "one capture at a time";
      capturing_thread_ = std::this_thread::get_id();
    } else {
      capturing_thread_ = {};
      EXPECT_TRUE(pending_.empty()) << "calls captured after the graph's join";
    }
  }
  int next_join_slot() const override {
    const std::lock_guard<std::mutex> lock(mutex_);
    return next_slot();
  }
  void replayed(int slot) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    EXPECT_FALSE(capturing_);
    EXPECT_EQ(slot, next_slot()) << "a graph launched out of its slot's turn";
    EXPECT_LE(outstanding_, 1) << "a third join before finish(1)";
    const std::vector<Pending>& graph = graphs_[static_cast<std::size_t>(slot)];
    EXPECT_FALSE(graph.empty()) << "slot " << slot << " has no graph";
    for (const Pending& call : graph) host_.allreduce(call.data, call.count, call.dtype);
    ++outstanding_;
    ++replays_;
  }
  int completed_joins() const { return completed_; }
  int replays() const { return replays_; }
  int queued_calls() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(pending_.size());
  }
  // Calls made by a thread other than the capturing one while a capture is on (the reducer's
  // communication thread must stay out of a capture).
  int foreign_captured_calls() const { return foreign_; }
  std::int64_t planned_max_count() const { return planned_max_count_; }

 private:
  enum class State { idle, marked, queued };
  struct Pending {
    void* data;
    std::int64_t count;
    DType dtype;
  };
  static AllreduceConfig flat_config(DType wire) {
    AllreduceConfig config;
    config.algorithm = Algorithm::flat_mpi;
    config.wire = wire;
    return config;
  }
  int next_slot() const { return (completed_ + outstanding_) % 2; }  // mutex_ held
  void check_thread() {  // mutex_ held
    if (capturing_ && std::this_thread::get_id() != capturing_thread_) ++foreign_;
  }

  Allreducer host_;
  mutable std::mutex mutex_;
  std::vector<State> state_;
  std::vector<Pending> pending_;
  std::vector<Pending> graphs_[2];
  bool capturing_ = false;
  std::thread::id capturing_thread_;
  int outstanding_ = 0, completed_ = 0, replays_ = 0, foreign_ = 0;
  std::int64_t planned_max_count_ = 0;
  DType planned_dtype_ = DType::f32;
};

// Hands REDUCER a QueuedStandIn for the gradients' DTYPE when case C asks; returns it (or null)
// to count the finishes.
QueuedStandIn* queue_if(const Case& c, GradientReducer& reducer, const Topology& topology,
                        DType dtype) {
  if (!c.queued) return nullptr;
  auto backend = std::make_unique<QueuedStandIn>(topology, dtype);
  QueuedStandIn* raw = backend.get();
  reducer.set_device_backend(std::move(backend));
  return raw;
}

// Stages REDUCER's buckets through a DeferredStaging of GRADS when case C asks; returns it (or
// null) to count the joins.
DeferredStaging* stage_if(const Case& c, GradientReducer& reducer, Tensor& grads) {
  if (!c.staged) return nullptr;
  auto staging = std::make_unique<DeferredStaging>(grads, reducer);
  DeferredStaging* raw = staging.get();
  reducer.set_staging(std::move(staging));
  return raw;
}

// The case's algorithm over TOPOLOGY, with shm inside nodes where the ranks share memory.
AllreduceConfig config_for(const Case& c, const Topology& topology) {
  AllreduceConfig config;
  config.algorithm = c.algorithm;
  config.intra = topology.shm_capable() ? IntraBackend::shm : IntraBackend::mpi;
  return config;
}

// COUNT gradients of DTYPE for case C: a plain tensor, or this rank's part of a SharedBuffer
// over TOPOLOGY's node (kept in SHARED, for the reducer to register).
Tensor gradients_for(const Case& c, const Topology& topology, std::int64_t count, DType dtype,
                     std::shared_ptr<SharedBuffer>& shared) {
  if (!c.registered) return Tensor({count}, dtype);
  shared = std::make_shared<SharedBuffer>(topology, static_cast<std::size_t>(count) * dtype_size(dtype));
  return Tensor::adopt(shared->data(), {count}, dtype, shared);
}

// A case's world: this rank, its topology and config, and COUNT f32 gradients laid out as the
// case asks (SHARED holds them when registered).
struct CaseWorld {
  explicit CaseWorld(const Case& c, std::int64_t count = kCount)
      : topology(MPI_COMM_WORLD, c.ranks_per_node),
        config(config_for(c, topology)),
        grads(gradients_for(c, topology, count, DType::f32, shared)) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  int rank = 0;
  Topology topology;
  AllreduceConfig config;
  std::shared_ptr<SharedBuffer> shared;
  Tensor grads;
};

class ReducerCases : public ::testing::TestWithParam<Case> {};

TEST_P(ReducerCases, BucketedEqualsOneFlatAllreduceForAnyBucketSize) {
  const Case c = GetParam();
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Topology topology(MPI_COMM_WORLD, c.ranks_per_node);
  AllreduceConfig config = config_for(c, topology);

  // The reference: one flat MPI_Allreduce of the whole buffer.
  std::vector<float> expected(kCount);
  for (std::int64_t i = 0; i < kCount; ++i) expected[i] = local_value(rank, i);
  MPI_Allreduce(MPI_IN_PLACE, expected.data(), static_cast<int>(kCount), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);

  // bytes: every parameter its own bucket, none (one after backward), small, and huge; f32
  // gradients and f16 ones (small integers are exact in f16 too).
  const std::vector<std::pair<DType, std::int64_t>> cases = {{DType::f32, 1},
                                                             {DType::f32, 0},
                                                             {DType::f32, 64},
                                                             {DType::f32, 400},
                                                             {DType::f32, std::int64_t{1} << 30},
                                                             {DType::f16, 1},
                                                             {DType::f16, 0},
                                                             {DType::f16, 64}};
  for (const auto& [dtype, bucket_bytes] : cases) {
    config.wire = dtype;
    std::shared_ptr<SharedBuffer> shared;
    Tensor grads = gradients_for(c, topology, kCount, dtype, shared);
    const auto set = [&](std::int64_t i, float value) {
      if (dtype == DType::f32)
        grads.data<float>()[i] = value;
      else
        static_cast<std::uint16_t*>(grads.raw())[i] = float_to_half_bits(value);
    };
    const auto get = [&](std::int64_t i) {
      return dtype == DType::f32 ? grads.data<float>()[i]
                                 : half_bits_to_float(static_cast<std::uint16_t*>(grads.raw())[i]);
    };
    GradientReducer reducer(topology, config, grads, kOffsets, bucket_bytes, bucket_bytes / 2,
                            shared);
    const DeferredStaging* staging = stage_if(c, reducer, grads);
    const QueuedStandIn* queued = queue_if(c, reducer, topology, dtype);
    const auto expected_buckets = plan_buckets(kCount, static_cast<std::int64_t>(dtype_size(dtype)),
                                               kOffsets, bucket_bytes, bucket_bytes / 2);
    ASSERT_EQ(reducer.num_buckets(), static_cast<int>(expected_buckets.size()));
    std::int64_t largest = 0;
    for (int b = 0; b < reducer.num_buckets(); ++b) {
      EXPECT_EQ(reducer.bucket(b).begin, expected_buckets[static_cast<std::size_t>(b)].begin);
      EXPECT_EQ(reducer.bucket(b).end, expected_buckets[static_cast<std::size_t>(b)].end);
      largest = std::max(largest, reducer.bucket(b).size());
    }
    if (queued) {
      EXPECT_EQ(queued->planned_max_count(), largest) << "the largest bucket, planned";
    }
    // The stand-in's communicator spans the world, as the nccl backend's on one node.
    EXPECT_EQ(reducer.sums_on_device(), queued != nullptr);
    EXPECT_STREQ(reducer.stats_path(), "off");
    reducer.plan_stats(Device::cpu, 3);
    EXPECT_STREQ(reducer.stats_path(), "host") << "host statistics need no copy";
    for (int step = 0; step < 3; ++step) {
      // Garbage until "backward" writes a parameter: a bucket launched too early reads NaN.
      for (std::int64_t i = 0; i < kCount; ++i) set(i, std::nanf(""));
      reducer.begin();
      std::int64_t end = kCount;
      for (std::size_t p = kOffsets.size(); p-- > 0;) {
        for (std::int64_t i = kOffsets[p]; i < end; ++i) set(i, local_value(rank, i) * (step + 1));
        end = kOffsets[p];
        reducer.ready_from(kOffsets[p]);
        if (p == 2) {
          // A collective from the main thread between buckets (how sync BN reduces).
          int value = rank + 1, sum = 0;
          reducer.run_collective(
              [&] { MPI_Allreduce(&value, &sum, 1, MPI_INT, MPI_SUM, topology.world()); });
          EXPECT_EQ(sum, size * (size + 1) / 2);
          // Sync BN's statistics in host memory: an f32 sum over the world, in place, among the
          // buckets. (Device statistics take the queued backend's sum_queued: gpu_nccl_allreduce.)
          Tensor stats({3}, DType::f32);
          for (int i = 0; i < 3; ++i) stats.data<float>()[i] = static_cast<float>(rank + 1 + i);
          reducer.sum_stats(stats);
          for (int i = 0; i < 3; ++i)
            EXPECT_EQ(stats.data<float>()[i], static_cast<float>(size * (size + 1) / 2 + size * i))
                << i;
        }
      }
      reducer.wait();
      std::int64_t wrong = 0;
      for (std::int64_t i = 0; i < kCount; ++i) wrong += get(i) != expected[i] * (step + 1);
      EXPECT_EQ(wrong, 0) << dtype_name(dtype) << ", bucket bytes " << bucket_bytes << ", step "
                          << step;
      EXPECT_GE(reducer.last_comm_seconds(), 0);
      EXPECT_GE(reducer.last_exposed_seconds(), 0);
      if (staging) {
        EXPECT_EQ(staging->joins(), step + 1);
      }
      if (queued) {
        // wait() completes the previous step's join, not its own.
        EXPECT_EQ(queued->completed_joins(), step);
      }
    }
    reducer.drain();
    if (queued) {
      EXPECT_EQ(queued->completed_joins(), 3) << "drain() completes the last step's join";
    }
  }
}

TEST_P(ReducerCases, CutParametersLaunchOnlyOnceFinal) {
  // A backward that finishes large parameters in blocks (as nn::Dense does with a hook) and
  // reports each block: buckets cut inside a parameter must not go out before all of their
  // elements are written (a NaN left in a bucket launched too early would reach the sum).
  const std::vector<std::int64_t> offsets{0, 7, 60000, 60005};
  const std::int64_t count = 100000, block = 4999;  // blocks straddle the bucket edges
  CaseWorld w(GetParam(), count);
  const int rank = w.rank;
  std::vector<float> expected(count);
  for (std::int64_t i = 0; i < count; ++i) expected[i] = local_value(rank, i);
  MPI_Allreduce(MPI_IN_PLACE, expected.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  float* g = w.grads.data<float>();
  GradientReducer reducer(w.topology, w.config, w.grads, offsets, kMinSplitBucketBytes,
                          kMinSplitBucketBytes, w.shared);
  stage_if(GetParam(), reducer, w.grads);
  queue_if(GetParam(), reducer, w.topology, DType::f32);
  ASSERT_GT(reducer.num_buckets(), 5);  // 390 KB in 64 KiB buckets
  for (int step = 0; step < 2; ++step) {
    for (std::int64_t i = 0; i < count; ++i) g[i] = std::nanf("");
    reducer.begin();
    for (std::int64_t end = count; end > 0; end -= block) {
      const std::int64_t begin = std::max<std::int64_t>(0, end - block);
      for (std::int64_t i = begin; i < end; ++i) g[i] = local_value(rank, i);
      reducer.ready_from(begin);
      // "Computing" the next block: time for the thread to reduce whatever was launched, so
      // that a bucket launched too early is reduced while it still holds NaN.
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    reducer.wait();
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < count; ++i) wrong += g[i] != expected[i];
    EXPECT_EQ(wrong, 0) << "step " << step;
  }
}

TEST_P(ReducerCases, WaitWithoutBackwardReducesEverything) {
  // A rank that skips backward (non-finite loss) launches every bucket at wait().
  CaseWorld w(GetParam());
  const int rank = w.rank;
  Tensor& grads = w.grads;
  GradientReducer reducer(w.topology, w.config, grads, kOffsets, 1, 1, w.shared);
  stage_if(GetParam(), reducer, grads);
  queue_if(GetParam(), reducer, w.topology, DType::f32);
  std::vector<float> expected(kCount);
  for (std::int64_t i = 0; i < kCount; ++i)
    grads.data<float>()[i] = expected[i] = local_value(rank, i);
  MPI_Allreduce(MPI_IN_PLACE, expected.data(), static_cast<int>(kCount), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  reducer.begin();
  if (rank % 2 == 0) reducer.ready_from(kOffsets[3]);  // some ranks launch a few early
  reducer.wait();
  for (std::int64_t i = 0; i < kCount; ++i) ASSERT_EQ(grads.data<float>()[i], expected[i]) << i;
}

TEST(QueuedReducer, CapturedStepsReplayTheirBuckets) {
  // --cuda.graphs with the buckets in the graph: a step begun and waited for inside a capture
  // queues every bucket from the capturing thread, in order, into the graph of its join slot; replayed(slot) then runs them on whatever the buffers hold at the launch,
  // and the slots' graphs alternate. Eager steps may come between. A bucket left to the
  // communication thread, a call that missed the graph, or a graph of the wrong slot gives a
  // wrong sum or a failed expectation.
  const Case c{Algorithm::flat_mpi, 0, false, false, true};
  CaseWorld w(c);
  const int rank = w.rank;
  float* g = w.grads.data<float>();
  GradientReducer reducer(w.topology, w.config, w.grads, kOffsets, 1, 1);
  QueuedStandIn* queued = queue_if(c, reducer, w.topology, DType::f32);
  ASSERT_TRUE(reducer.captures_buckets());
  ASSERT_GT(reducer.num_buckets(), 2);
  std::vector<float> expected(kCount);
  for (std::int64_t i = 0; i < kCount; ++i) expected[i] = local_value(rank, i);
  MPI_Allreduce(MPI_IN_PLACE, expected.data(), static_cast<int>(kCount), MPI_FLOAT, MPI_SUM,
                MPI_COMM_WORLD);
  const auto write_step = [&](int step) {
    for (std::int64_t i = 0; i < kCount; ++i) g[i] = local_value(rank, i) * (step + 1);
  };
  const auto check_step = [&](int step) {
    std::int64_t wrong = 0;
    for (std::int64_t i = 0; i < kCount; ++i) wrong += g[i] != expected[i] * (step + 1);
    EXPECT_EQ(wrong, 0) << "step " << step;
  };
  // Step 0 eager; steps 1 and 2 capture the graphs of slots 1 and 0 (each replayed at once);
  // step 3 eager again (its join takes slot 1); steps 4-6 replay the graphs, alternating.
  std::vector<int> slots;
  for (int step = 0; step < 7; ++step) {
    if (step == 0 || step == 3) {
      write_step(step);
      reducer.begin();
      for (std::size_t p = kOffsets.size(); p-- > 0;) reducer.ready_from(kOffsets[p]);
      reducer.wait();
      check_step(step);
      continue;
    }
    const int slot = reducer.next_join_slot();
    slots.push_back(slot);
    if (step == 1 || step == 2) {
      // The capture records calls on the buffers as they are now; nothing runs.
      for (std::int64_t i = 0; i < kCount; ++i) g[i] = std::nanf("");
      reducer.capture_on(&slots);  // any non-null handle: the stand-in keeps no stream
      reducer.begin();
      for (std::size_t p = kOffsets.size(); p-- > 0;) {
        reducer.ready_from(kOffsets[p]);
        // Time for a communication thread that wrongly took a bucket to show.
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        // Each launched bucket is in the graph already, where backward's next layers follow it.
        int launched = 0;
        for (int b = 0; b < reducer.num_buckets(); ++b) launched += reducer.bucket(b).begin >= kOffsets[p];
        EXPECT_EQ(queued->queued_calls(), launched) << "step " << step << ", offset " << kOffsets[p];
      }
      reducer.wait();
      reducer.capture_on(nullptr);
      EXPECT_TRUE(std::isnan(g[0])) << "a capture ran a call";
    }
    write_step(step);  // the batch's values, in the graph's fixed buffers
    reducer.replayed(slot);
    check_step(step);
    EXPECT_GE(reducer.last_exposed_seconds(), 0);
  }
  reducer.drain();
  EXPECT_EQ(queued->replays(), 5);
  EXPECT_EQ(queued->foreign_captured_calls(), 0)
      << "the communication thread made calls during a capture";
  EXPECT_EQ(queued->completed_joins(), 7);
  EXPECT_EQ(slots, (std::vector<int>{1, 0, 0, 1, 0}));
}

TEST(StagedReducer, TimesStartWhenTheCopyLands) {
  // Staged on a device, the host launches buckets as backward is queued, and the copy of the
  // last one lands only when the device has finished backward (here 150 ms later). That wait
  // is the device computing: neither comm time nor exposed communication.
  for (const Case& c : {Case{Algorithm::flat_mpi, 0, false, true},
                        Case{Algorithm::hierarchical, 2, false, true}}) {
    CaseWorld w(c);
    GradientReducer reducer(w.topology, w.config, w.grads, kOffsets, 1, 1, w.shared);
    DeferredStaging* staging = stage_if(c, reducer, w.grads);
    constexpr double kDeviceSeconds = 0.15;
    staging->delay(reducer.num_buckets() - 1, kDeviceSeconds);
    for (std::int64_t i = 0; i < kCount; ++i) w.grads.data<float>()[i] = local_value(w.rank, i);
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    reducer.begin();
    reducer.ready_from(0);  // backward queued: every bucket launched at once
    reducer.wait();
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const char* name = algorithm_name(c.algorithm);
    EXPECT_GE(took, kDeviceSeconds) << name;
    EXPECT_LT(reducer.last_comm_seconds(), 0.5 * kDeviceSeconds) << name;
    EXPECT_LT(reducer.last_exposed_seconds(), 0.5 * kDeviceSeconds) << name;
  }
}

TEST_P(ReducerCases, LateRankShowsAsExposedPeerWaitWhereMeasured) {
  // The last local rank ends "backward" 150 ms after the others. Where the shm backend measures
  // it (a node of more than one rank), the punctual ranks' exposed time is mostly the wait for
  // it, and the late rank's is not; elsewhere nothing is reported.
  CaseWorld w(GetParam());
  const int rank = w.rank;
  Tensor& grads = w.grads;
  GradientReducer reducer(w.topology, w.config, grads, kOffsets, 64, 64, w.shared);
  const bool measured = w.config.algorithm == Algorithm::hierarchical &&
                        w.config.intra == IntraBackend::shm && w.topology.local_size() > 1 &&
                        w.topology.size() > 1;
  EXPECT_EQ(reducer.measures_peer_wait(), measured);
  const bool late = w.topology.local_rank() == w.topology.local_size() - 1;
  constexpr double kLateSeconds = 0.15;
  for (int step = 0; step < 2; ++step) {
    for (std::int64_t i = 0; i < kCount; ++i) grads.data<float>()[i] = local_value(rank, i);
    MPI_Barrier(MPI_COMM_WORLD);
    reducer.begin();
    if (late) std::this_thread::sleep_for(std::chrono::duration<double>(kLateSeconds));
    reducer.ready_from(0);  // backward ends: every bucket at once
    reducer.wait();
    const double peer_wait = reducer.last_exposed_peer_wait_seconds();
    EXPECT_GE(peer_wait, 0);
    EXPECT_LE(peer_wait, reducer.last_exposed_seconds() + 1e-9);
    EXPECT_LE(peer_wait, reducer.last_peer_wait_seconds() + 1e-9);
    EXPECT_LE(reducer.last_peer_wait_seconds(), reducer.last_comm_seconds() + 1e-9);
    if (!measured) {
      EXPECT_EQ(peer_wait, 0);
      EXPECT_EQ(reducer.last_peer_wait_seconds(), 0);
    } else if (late) {
      EXPECT_LT(peer_wait, 0.5 * kLateSeconds) << "step " << step;
    } else {
      EXPECT_GT(peer_wait, 0.6 * kLateSeconds) << "step " << step;
      EXPECT_GT(peer_wait, 0.6 * reducer.last_exposed_seconds()) << "step " << step;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Algorithms, ReducerCases,
    ::testing::Values(Case{Algorithm::flat_mpi, 0}, Case{Algorithm::hierarchical, 0},
                      Case{Algorithm::hierarchical, 1}, Case{Algorithm::hierarchical, 2},
                      Case{Algorithm::hierarchical, 0, true}, Case{Algorithm::hierarchical, 2, true},
                      Case{Algorithm::flat_mpi, 0, false, true},
                      Case{Algorithm::hierarchical, 2, false, true},
                      Case{Algorithm::hierarchical, 2, false, false, true}),
    [](const auto& info) {
      return (std::string(algorithm_name(info.param.algorithm)) == "flat-mpi"
                  ? std::string("flat")
                  : "hierarchical_k" + std::to_string(info.param.ranks_per_node) +
                        (info.param.registered ? "_registered" : "")) +
             (info.param.staged ? "_staged" : "") + (info.param.queued ? "_queued" : "");
    });

}  // namespace
}  // namespace mpt::comm
