// The overlap engine (see gradient_reducer.hpp): a bucket plan fixed at construction, and one
// communication thread that reduces launched buckets in order. Nothing is allocated per step.
#include "comm/gradient_reducer.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "comm/nccl_allreduce.hpp"
#include "comm/watchdog.hpp"
#include "core/error.hpp"

namespace mpt::comm {
namespace {

double seconds_between(std::chrono::steady_clock::time_point start,
                       std::chrono::steady_clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

}  // namespace

std::vector<Range> plan_buckets(std::int64_t count, std::int64_t element_bytes,
                                const std::vector<std::int64_t>& param_offsets,
                                std::int64_t bucket_bytes, std::int64_t first_bucket_bytes) {
  std::vector<Range> buckets;
  if (count <= 0) return buckets;
  for (std::size_t i = 0; i < param_offsets.size(); ++i) {
    const bool ordered = i == 0 ? param_offsets[0] == 0 : param_offsets[i] >= param_offsets[i - 1];
    if (!ordered || param_offsets[i] > count)
      abort_job("comm::plan_buckets: parameter offsets must ascend from 0 within the buffer");
  }
  if (bucket_bytes <= 0 || param_offsets.empty()) return {Range{0, count}};
  // Walk the parameters from the last; [begin, end) is the open bucket, and [offset, begin) what
  // is left of the parameter being placed.
  std::int64_t begin = count, end = count;
  const auto close = [&] {
    buckets.push_back({begin, end});
    end = begin;
  };
  for (std::size_t i = param_offsets.size(); i-- > 0;) {
    const std::int64_t offset = param_offsets[i];
    while (begin > offset) {
      const std::int64_t limit = buckets.empty() ? first_bucket_bytes : bucket_bytes;
      const std::int64_t capacity = limit / element_bytes;  // elements
      if (end - offset <= capacity) {  // the rest of the parameter fits in the open bucket
        begin = offset;
        break;
      }
      const bool open = begin < end;
      const bool splits = limit >= kMinSplitBucketBytes;
      // A parameter that a fresh bucket would hold starts one (parameter boundaries are kept
      // where they can be), and so does any parameter under a limit too small to split at.
      if (open && (!splits || begin - offset <= bucket_bytes / element_bytes)) {
        close();
        continue;
      }
      if (!splits) {  // an empty bucket takes the parameter whatever its size
        begin = offset;
        break;
      }
      // Larger than a whole bucket: its tail fills the open bucket to the limit, and the loop
      // cuts the rest into full buckets until what is left fits in one.
      begin = end - std::max<std::int64_t>(1, capacity);
      close();
    }
  }
  if (begin < end) close();  // begin is 0: the first parameter's offset
  return buckets;
}

GradientReducer::GradientReducer(const Topology& topology, const AllreduceConfig& config,
                                 Tensor& grads, const std::vector<std::int64_t>& param_offsets,
                                 std::int64_t bucket_bytes, std::int64_t first_bucket_bytes,
                                 std::shared_ptr<SharedBuffer> shared)
    : grads_(grads),
      buckets_(plan_buckets(grads.numel(), static_cast<std::int64_t>(dtype_size(grads.dtype())),
                            param_offsets, bucket_bytes, first_bucket_bytes)),
      allreducer_(std::make_unique<Allreducer>(topology, config)) {
  const DType dtype = grads.dtype();
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16)
    abort_job(std::string("comm::GradientReducer: gradients must be f32, f16 or bf16, not ") +
              dtype_name(dtype));
  if (shared) {
    if (!shared->holds(grads.raw(), grads.size_bytes()))
      abort_job("comm::GradientReducer: the shared buffer does not hold the gradients");
    allreducer_->register_buffer(std::move(shared));
  }
  spans_.resize(buckets_.size());
  stats_on_host_ = [this] {
    const CollectiveScope scope(Collective::allreduce);
    MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, stats_data_, static_cast<int>(stats_count_),
                                MPI_FLOAT, MPI_SUM, allreducer_->topology().world()));
  };
  stats_on_device_ = [this] { allreducer_->sum_queued(stats_data_, stats_count_); };
  // Device gradients under the nccl backend: the queued form, one slot per bucket.
  queued_ = allreducer_->queues();
  if (queued_) plan_slots();
  thread_ = std::thread([this] { thread_main(); });
}

GradientReducer::~GradientReducer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GradientReducer::set_staging(std::unique_ptr<device_memory::Staging> staging) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (launched_ != 0 || finished_ != 0)
    abort_job("comm::GradientReducer::set_staging: must come before the first step");
  if (queued_)
    abort_job("comm::GradientReducer::set_staging: the nccl backend reduces device memory itself");
  staging_ = std::move(staging);
}

void GradientReducer::set_device_backend(std::unique_ptr<detail::NcclAllreduce> backend) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (launched_ != 0 || finished_ != 0)
    abort_job("comm::GradientReducer::set_device_backend: must come before the first step");
  if (staging_)
    abort_job("comm::GradientReducer::set_device_backend: the gradients are staged to the host");
  allreducer_->set_device_backend(std::move(backend));
  queued_ = true;
  plan_slots();
}

void GradientReducer::plan_slots() {
  if (num_buckets() == 0) return;
  std::int64_t largest = 0;
  for (const Range& range : buckets_) largest = std::max(largest, range.size());
  allreducer_->plan_slots(num_buckets(), largest, grads_.dtype());
}

bool GradientReducer::launch_until(int count) {
  // launched_ is written only here and in begin(), both on the main thread: reading it
  // unlocked is safe. The downloads are queued before the count is published, so the
  // communication thread never waits for a copy that was not queued yet.
  const int from = launched_;
  if (count <= from) return false;
  for (int b = from; b < count; ++b) {
    const Range& range = buckets_[static_cast<std::size_t>(b)];
    if (staging_) staging_->download(b, range.begin, range.end);
    if (queued_) allreducer_->mark(b);  // the compute stream's point: the bucket is written
  }
  std::lock_guard<std::mutex> lock(mutex_);
  launched_ = count;
  return true;
}

void GradientReducer::begin() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (finished_ != launched_)
    abort_job("comm::GradientReducer::begin: the previous step's buckets were not waited for");
  launched_ = 0;
  finished_ = 0;
  in_step_ = true;
  comm_seconds_ = 0;
  exposed_seconds_ = 0;
  exposed_peer_wait_seconds_ = 0;
  peer_wait_seconds_ = 0;
  all_launched_ = false;
}

void GradientReducer::ready_from(std::int64_t offset) {
  int launched = launched_;  // the main thread's own (launch_until)
  while (launched < num_buckets() && buckets_[static_cast<std::size_t>(launched)].begin >= offset)
    ++launched;
  if (!launch_until(launched)) return;
  if (capture_stream_ != nullptr) {
    // Captured: into the graph now, from this thread (the communication thread stays out).
    std::unique_lock<std::mutex> lock(mutex_);
    while (finished_ < launched_) reduce_next(lock);
    return;
  }
  if (launched == num_buckets()) {
    // Every gradient is final: backward has ended, and what remains is exposed.
    std::lock_guard<std::mutex> lock(mutex_);
    all_launched_ = true;
    all_launched_at_ = std::chrono::steady_clock::now();
  }
  work_.notify_one();
}

void GradientReducer::wait() {
  auto start = std::chrono::steady_clock::now();
  launch_until(num_buckets());
  std::unique_lock<std::mutex> lock(mutex_);
  if (capture_stream_ != nullptr) {
    // Captured: the remaining buckets and the join go into the graph; the host waits for
    // nothing (replayed() ends the step once a launch is queued).
    while (finished_ < num_buckets()) reduce_next(lock);
    if (num_buckets() > 0) allreducer_->join();
    in_step_ = false;
    return;
  }
  // Exposed time counts from the end of backward (the last ready_from, when that launched the
  // last bucket), not from this call: on a machine with no core to spare, the woken
  // communication thread can take the main thread's core in between, and that delay is
  // communication too.
  if (all_launched_) start = all_launched_at_;
  if (!busy_ && collective_ == nullptr && finished_ < launched_) {
    caller_reduces_ = true;
    while (finished_ < num_buckets()) reduce_next(lock);
    caller_reduces_ = false;
  }
  done_.wait(lock, [&] { return finished_ == num_buckets(); });
  in_step_ = false;
  // Every upload was queued before the last bucket counted as finished (under the lock).
  if (staging_) staging_->join();
  if (queued_) {
    // The optimizer's kernels follow the all-reduce on the device (the communication thread is
    // idle: the lock keeps nothing waiting). The figures are the device's, for the previous
    // step's calls (finish_queued).
    if (num_buckets() > 0) allreducer_->join();
    exposed_seconds_ = num_buckets() > 0 ? finish_queued(lock, /*keep=*/1) : 0;
    exposed_peer_wait_seconds_ = peer_wait_seconds_ = 0;
    return;
  }
  // Staged, backward has ended when the device has written the last bucket (which holds the
  // first layer's gradients), not when the host queued it: exposed time counts from the later,
  // where the wait for that bucket's copy shows it (reduce_next).
  if (staging_) start = std::max(start, last_landed_at_);
  const auto end = std::chrono::steady_clock::now();
  exposed_seconds_ = seconds_between(start, end);
  // The buckets' waits for late peers, where they fall inside the exposed interval.
  double peer_wait = 0;
  peer_wait_seconds_ = 0;
  for (const BucketSpan& span : spans_) {
    if (!span.peer_wait.measured) continue;
    peer_wait_seconds_ += seconds_between(span.peer_wait.start, span.peer_wait.end);
    const auto from = std::max(span.peer_wait.start, start);
    const auto to = std::min(span.peer_wait.end, end);
    if (to > from) peer_wait += seconds_between(from, to);
  }
  exposed_peer_wait_seconds_ = peer_wait;
}

void GradientReducer::run_collective(const std::function<void()>& fn) {
  std::unique_lock<std::mutex> lock(mutex_);
  collective_ = &fn;
  collective_after_ = launched_;
  collective_done_ = false;
  work_.notify_one();
  done_.wait(lock, [&] { return collective_done_; });
}

void GradientReducer::plan_stats(Device device, std::int64_t max_values) {
  if (max_values < 0 || max_values > INT32_MAX)
    abort_job("comm::GradientReducer::plan_stats: " + std::to_string(max_values) +
              " statistics: at most 2^31 - 1");
  stats_planned_ = true;
  stats_device_ = device;
  stats_staging_ = device != Device::cpu && !sums_on_device()
                       ? Tensor({std::max<std::int64_t>(1, max_values)}, DType::f32)
                       : Tensor();
}

const char* GradientReducer::stats_path() const {
  if (!stats_planned_) return "off";
  if (stats_device_ == Device::cpu) return "host";
  return stats_staging_.defined() ? "staged" : "device";
}

void GradientReducer::capture_on(void* stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stream != nullptr) {
    if (!queued_ || !allreducer_->sums_on_device())
      abort_job(std::string("comm::GradientReducer::capture_on: a graph can hold the "
                            "communicator's calls only where nothing goes through the host "
                            "(flat-nccl, or nccl on one node), and this reducer's statistics "
                            "path is ") +
                stats_path());
    if (in_step_ || busy_ || collective_ != nullptr || finished_ != launched_)
      abort_job("comm::GradientReducer::capture_on: a capture must start between a wait() and "
                "the next begin(), with nothing of a step in flight");
  }
  // The communication thread leaves every bucket to this thread meanwhile (bucket_due()).
  caller_reduces_ = stream != nullptr;
  capture_stream_ = stream;
  allreducer_->capture_on(stream);
}

void GradientReducer::replayed(int slot) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (capture_stream_ != nullptr || in_step_ || finished_ != launched_)
    abort_job("comm::GradientReducer::replayed: a captured step's graph is launched outside a "
              "capture and outside a step");
  allreducer_->replayed(slot);
  comm_seconds_ = exposed_peer_wait_seconds_ = peer_wait_seconds_ = 0;
  exposed_seconds_ = finish_queued(lock, /*keep=*/1);
}

void GradientReducer::sum_stats(Tensor& sums) {
  if (!sums.defined() || sums.dtype() != DType::f32 || sums.numel() > INT32_MAX)
    abort_job("comm::GradientReducer::sum_stats: the statistics must be f32, at most 2^31 - 1");
  const bool on_host = sums.device() == Device::cpu;
  if (capture_stream_ != nullptr) {
    // Into the graph, from this thread, in order with the buckets it queued (capture_on()).
    if (on_host)
      abort_job("comm::GradientReducer::sum_stats: a captured sum needs device statistics");
    allreducer_->sum_queued(sums.data<float>(), sums.numel());
    return;
  }
  if (!on_host && !sums_on_device()) {
    // Staged: the copies run on the legacy stream, so the one out waits for the compute work
    // that wrote the sums, and the compute stream's next work waits for the one back.
    if (!stats_staging_.defined() || sums.numel() > stats_staging_.numel())
      abort_job("comm::GradientReducer::sum_stats: " + std::to_string(sums.numel()) +
                " device statistics, but plan_stats() planned a host copy of " +
                std::to_string(stats_staging_.defined() ? stats_staging_.numel() : 0) +
                " (without the nccl backend on one node or flat-nccl, device statistics go "
                "through it)");
    const std::size_t bytes = sums.size_bytes();
    device_memory::copy(stats_staging_.raw(), Device::cpu, sums.raw(), sums.device(), bytes);
    stats_data_ = stats_staging_.data<float>();
    stats_count_ = sums.numel();
    run_collective(stats_on_host_);
    device_memory::copy(sums.raw(), sums.device(), stats_staging_.raw(), Device::cpu, bytes);
    return;
  }
  // Read by the communication thread inside run_collective, which orders it after these writes.
  stats_data_ = sums.data<float>();
  stats_count_ = sums.numel();
  run_collective(on_host ? stats_on_host_ : stats_on_device_);
}

void GradientReducer::reduce_next(std::unique_lock<std::mutex>& lock) {
  const Range range = buckets_[static_cast<std::size_t>(finished_)];
  const int bucket = finished_;
  // Staged: the bucket is reduced in the host twin, between its download and its upload. The
  // span starts once the copy has landed: the wait for it is mostly the device still computing
  // backward (launched buckets are queued work, not done work), not communication.
  auto* const base = static_cast<unsigned char*>(staging_ ? staging_->host() : grads_.raw());
  const auto element_bytes = static_cast<std::int64_t>(dtype_size(grads_.dtype()));
  lock.unlock();
  const auto asked = std::chrono::steady_clock::now();
  if (staging_) staging_->wait_downloaded(bucket);
  const auto start = std::chrono::steady_clock::now();
  // A wait that blocked ended as the copy landed; one that returned at once says only that the
  // copy had landed before it was asked for.
  const bool blocked = start - asked > std::chrono::microseconds(20);
  if (queued_) {
    // On the device: queued after the bucket's mark, no wait (a later step's end waits).
    const CollectiveScope scope(Collective::gradient_bucket, bucket);
    allreducer_->allreduce_queued(bucket, base + range.begin * element_bytes, range.size(),
                                  grads_.dtype());
  } else {
    const CollectiveScope scope(Collective::gradient_bucket, bucket);
    allreducer_->allreduce(base + range.begin * element_bytes, range.size(), grads_.dtype());
  }
  if (staging_) staging_->upload(range.begin, range.end);
  const auto end = std::chrono::steady_clock::now();
  lock.lock();
  spans_[static_cast<std::size_t>(bucket)] = {start, end, allreducer_->last_peer_wait(),
                                               caller_reduces_};
  comm_seconds_ += seconds_between(start, end);
  if (bucket == num_buckets() - 1)
    last_landed_at_ = blocked ? start : std::chrono::steady_clock::time_point{};
  ++finished_;
}

double GradientReducer::finish_queued(std::unique_lock<std::mutex>& lock, int keep) {
  // Every bucket is queued and the communication thread idle: the training thread ends the step.
  lock.unlock();
  double waited = 0;
  {
    // The host waits for the previous step's calls only (KEEP 1): the device has this step's
    // compute queued, so it never idles while the host catches up. The wait stays, for NCCL's
    // asynchronous errors and, inside the last bucket's scope, for the watchdog (a peer that
    // never arrives shows one step later, at the latest at the step's end agreement).
    const CollectiveScope scope(Collective::gradient_bucket, num_buckets() - 1);
    waited = allreducer_->finish(keep);
  }
  lock.lock();
  // The compute stream's wait for the calls is the unhidden communication, measured on the
  // device: part of the comm time (beside the queueing) and all of the exposed time.
  comm_seconds_ += waited;
  return waited;
}

void GradientReducer::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (finished_ != launched_)
    abort_job("comm::GradientReducer::drain: a step's buckets were not waited for");
  comm_seconds_ = exposed_seconds_ = exposed_peer_wait_seconds_ = peer_wait_seconds_ = 0;
  if (queued_ && num_buckets() > 0) exposed_seconds_ = finish_queued(lock, /*keep=*/0);
}

void GradientReducer::thread_main() {
  // An exception here has no caller to reach, and the peers would wait for this rank's next
  // collective forever: end the whole job with one line instead.
  try {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      // Buckets and collectives reach MPI in the order the main thread issued them, so every
      // rank makes the same sequence of calls.
      const auto collective_due = [&] {
        return collective_ != nullptr && finished_ == collective_after_;
      };
      const auto bucket_due = [&] { return finished_ < launched_ && !caller_reduces_; };
      work_.wait(lock, [&] { return stopping_ || bucket_due() || collective_due(); });
      if (collective_due()) {
        const std::function<void()>& fn = *collective_;
        busy_ = true;
        lock.unlock();
        fn();
        lock.lock();
        busy_ = false;
        collective_ = nullptr;
        collective_done_ = true;
        done_.notify_all();
      } else if (bucket_due()) {
        busy_ = true;
        reduce_next(lock);
        busy_ = false;
        if (finished_ == num_buckets() || collective_due()) done_.notify_all();
      } else if (stopping_) {
        return;  // only once the launched buckets are done: peers may be waiting in them
      }
    }
  } catch (const std::exception& error) {
    abort_job(std::string("comm::GradientReducer: communication thread failed: ") + error.what());
  }
}

}  // namespace mpt::comm
