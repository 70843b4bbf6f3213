// comm::GradientReducer: the overlap engine. The flat gradient buffer is cut into buckets in
// reverse layer order (on parameter boundaries, or inside a parameter larger than a bucket); each
// bucket's all-reduce runs on one persistent communication thread as soon as backward has
// written it, while backward goes on.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/allreduce.hpp"
#include "comm/topology.hpp"
#include "core/device_memory.hpp"
#include "core/tensor.hpp"

namespace mpt::comm {

// Bucket limits below this never cut a parameter: pieces that small would cost more in per-call
// latency than they could hide (and tiny limits are how tests get one bucket per parameter).
inline constexpr std::int64_t kMinSplitBucketBytes = 64 << 10;

// The buckets of a flat buffer of COUNT elements of ELEMENT_BYTES each, in launch order (the
// last elements first, as backward writes the last layer first). PARAM_OFFSETS are the
// ascending element offsets of the parameters (the first 0). The first bucket never exceeds
// FIRST_BUCKET_BYTES, the others BUCKET_BYTES: a bucket closes before a parameter that does
// not fit, and a parameter larger than a whole bucket is cut instead (element ranges; backward
// reports a large weight gradient final in row blocks, see nn::StepContext): its tail fills
// the open bucket, full buckets follow, and its head opens the next bucket. Under a limit of
// less than kMinSplitBucketBytes such a parameter is a bucket of its own instead.
// BUCKET_BYTES = 0, or no PARAM_OFFSETS: one bucket of everything. COUNT = 0: no bucket.
std::vector<Range> plan_buckets(std::int64_t count, std::int64_t element_bytes,
                                const std::vector<std::int64_t>& param_offsets,
                                std::int64_t bucket_bytes, std::int64_t first_bucket_bytes);

// Reduces GRADS (sum over ranks, the AllreduceConfig's pre- and post-scaling applied) bucket by
// bucket on a communication thread. A step is begin(), then ready_from() as backward finishes
// layers, then wait(); drain() comes before the host reads what a step wrote on the device.
// Between begin() and wait() the calling thread must make no MPI call of its own: collectives
// it needs (sync BN's statistics) go through run_collective(), so that only one thread is ever
// inside MPI (MPI_THREAD_SERIALIZED suffices).
// Every rank must construct it collectively with the same layout and make the same sequence of
// calls: buckets and run_collective() calls reach MPI in the order they were issued.
class GradientReducer {
 public:
  // Collective over TOPOLOGY's world (it builds the Allreducer). GRADS (not owned, outliving
  // this object) is the flat gradient buffer, f32, f16 or bf16; PARAM_OFFSETS, BUCKET_BYTES and
  // FIRST_BUCKET_BYTES as plan_buckets(). SHARED, when given, holds GRADS (its storage is
  // this rank's part of the node's shared window): the all-reduce reads the peers' gradients
  // from there (Allreducer::register_buffer). Starts the communication thread.
  GradientReducer(const Topology& topology, const AllreduceConfig& config, Tensor& grads,
                  const std::vector<std::int64_t>& param_offsets, std::int64_t bucket_bytes,
                  std::int64_t first_bucket_bytes,
                  std::shared_ptr<SharedBuffer> shared = nullptr);
  // Joins the communication thread after the buckets already launched are done.
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // From now on the buckets are reduced in STAGING's host twin of GRADS, not in GRADS (device
  // memory): a bucket's download is queued when it is launched, the communication thread waits
  // for that copy alone, reduces the bucket in host memory and queues its upload, and wait()
  // ends with STAGING's join(). STAGING must tell num_buckets() slots apart. Call before the
  // first begin(). (A SHARED buffer then goes unused: the twin is not in it.)
  void set_staging(std::unique_ptr<device_memory::Staging> staging);
  bool staged() const { return staging_ != nullptr; }
  // Tests: BACKEND stands in for the nccl backend (Allreducer::set_device_backend), and the
  // buckets go the queued way. Before the first begin().
  void set_device_backend(std::unique_ptr<detail::NcclAllreduce> backend);

  // Starts a step: no bucket launched yet. Call before backward.
  void begin();
  // GRADS[OFFSET, end) are final for this step: launches every bucket inside that range that is
  // not launched yet. Cheap (a lock and a notify); call it from backward's per-layer hook.
  void ready_from(std::int64_t offset);
  // Launches the remaining buckets and blocks until every bucket of the step is reduced (staged:
  // until every bucket is queued for its upload, which the compute stream then waits for;
  // queued on the device (nccl): until every call is queued and joined, so that the optimizer's
  // kernels follow them on the device, and the device has run the previous step's calls: the
  // host never waits for this step's work, and reads the gradients only after drain()). When
  // the communication thread has not started on the remaining buckets yet (it is asleep, or has
  // not got a core since it was woken), the calling thread reduces them itself: the tail of a
  // step then pays no hand-off to another thread (serialized with the thread: MPI is still
  // entered by one thread at a time).
  void wait();
  // Runs FN on the communication thread, after the buckets launched so far, and blocks until it
  // returned: how the main thread makes a collective call between begin() and wait().
  void run_collective(const std::function<void()>& fn);
  // Sync BN's statistics: SUMS (f32) <- its sum over the world, in place, through
  // run_collective() (in order with the buckets). Host data: an MPI_Allreduce, done on return.
  // Device data, where sums_on_device(): queued on the comm stream after the compute work that
  // wrote it, and compute work queued after the return waits for it on the device; the host
  // does not wait (Allreducer::sum_queued). Other device data goes through plan_stats()'s host
  // copy (the host waits for the device on the way out, and the sum is on the device again on
  // return); unplanned, or larger than planned, it aborts.
  void sum_stats(Tensor& sums);
  bool sums_on_device() const { return queued_ && allreducer_->sums_on_device(); }
  // Before the first sum_stats(): statistics of at most MAX_VALUES floats will live on DEVICE.
  // Where sum_stats() cannot sum them in place (device data without sums_on_device()), the
  // host copy it needs is allocated here, so that no step allocates.
  void plan_stats(Device device, std::int64_t max_values);
  // Where sum_stats() sums the planned statistics: "host" (host data, MPI), "staged" (device
  // data through the host copy) or "device" (NCCL's stream, no host wait); "off" unplanned.
  const char* stats_path() const;
  // --cuda.graphs. While STREAM (a cudaStream_t: the compute stream, which the calling thread is
  // capturing into a graph) is set, every call of the communicator is made by the calling
  // thread, at once, into the graph (Allreducer::capture_on: the comm stream forks from the
  // compute stream and joins it again): sum_stats() queues each sum there, and a step begun
  // inside the capture queues each bucket as ready_from() launches it, so that the replays
  // overlap the all-reduce with backward; its wait() ends with the graph's join and waits for
  // nothing. nullptr ends that. Needs the "device" statistics path (flat-nccl, or nccl on one
  // node), buckets captures_buckets(), and the communication thread idle: between a wait() and
  // the next begin().
  void capture_on(void* stream);
  // Whether a step's buckets can be captured (the nccl backend with no phase through the host).
  bool captures_buckets() const { return queued_ && allreducer_->captures_buckets(); }
  // The join slot (0 or 1) that a step captured now would hold, and so the graph to launch for
  // the next step whose buckets are in a graph: one graph per slot, alternating.
  int next_join_slot() const { return allreducer_->next_join_slot(); }
  // A launch of the graph captured with join slot SLOT (its step begun and waited for inside
  // the capture) was queued: ends that step as wait() would, without a host wait for it (the
  // host waits for the previous step's calls), and sets the last_*() figures: the comm and
  // exposed time are the device's, as for every queued step; last_bucket_spans() is left as
  // it was (no host thread reduced a bucket): a timeline leaves such a step's buckets out.
  void replayed(int slot);
  // After wait(): blocks until the device has run every call queued so far (the nccl backend;
  // nothing otherwise), polling NCCL's errors inside a collective scope. Call it before the host
  // reads what the step wrote on the device (a logged loss, a checkpoint, evaluation) and at the
  // end. The last_*() figures then describe what it completed (zero for the host backends):
  // add them to the step's.
  void drain();

  // Seconds the communication thread spent reducing the last step's buckets (staged: from each
  // bucket's landed download to its queued upload; queued on the device: the queueing, plus the
  // compute stream's wait for the calls of the join that wait() or drain() completed, the
  // previous step's in wait(), measured on the device, since the rest ran beside backward).
  double last_comm_seconds() const { return comm_seconds_; }
  // Seconds from the end of backward (the ready_from() that launched the last bucket, else the
  // wait() call; staged, the landing of the last bucket's download when the communication
  // thread had to wait for it, as the device ends backward after the host queued it) until
  // every bucket was reduced: the communication backward did not hide. Queued on the device:
  // the compute stream's wait for the calls, of the previous step in wait() (one step late) and
  // of the last in drain().
  double last_exposed_seconds() const { return exposed_seconds_; }
  // The part of last_exposed_seconds() in which a bucket's all-reduce had started and this rank
  // waited for a node peer to arrive at it (Allreducer::PeerWait): the ranks' skew, not data
  // moving. 0 where the all-reduce does not measure it (measures_peer_wait()).
  double last_exposed_peer_wait_seconds() const { return exposed_peer_wait_seconds_; }
  // Every bucket's wait for late peers in the last step, exposed or not: the part of
  // last_comm_seconds() that was skew.
  double last_peer_wait_seconds() const { return peer_wait_seconds_; }
  bool measures_peer_wait() const { return allreducer_->measures_peer_wait(); }
  // When each bucket's all-reduce of the last step began and ended on the communication thread
  // (for the timeline), in launch order, with its wait for late peers; read after wait().
  struct BucketSpan {
    std::chrono::steady_clock::time_point start, end;
    Allreducer::PeerWait peer_wait;
    bool by_caller = false;  // reduced by wait()'s caller, not by the communication thread
  };
  const std::vector<BucketSpan>& last_bucket_spans() const { return spans_; }
  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Bucket I's element range in GRADS, in launch order.
  const Range& bucket(int i) const { return buckets_[static_cast<std::size_t>(i)]; }
  const Allreducer& allreducer() const { return *allreducer_; }

 private:
  // Plans the queued backend's slots, one per bucket, and its buffers for the largest bucket.
  void plan_slots();
  void thread_main();
  // The end of a step in the queued form (allreducer_->queues()), after the join: waits until at
  // most KEEP joins are outstanding (1 in wait(), 0 in drain()). Returns the compute stream's
  // wait for the completed joins' calls (added to the comm time). LOCK held on entry and on
  // return.
  double finish_queued(std::unique_lock<std::mutex>& lock, int keep);
  // Makes buckets [launched_, COUNT) launched: their downloads first (staged), then, under the
  // lock, the count the communication thread reads. Only the main thread calls it. True when
  // it launched any.
  bool launch_until(int count);
  // Reduces bucket finished_ (LOCK held on entry and on return, released around the call) and
  // counts it finished.
  void reduce_next(std::unique_lock<std::mutex>& lock);

  Tensor grads_;  // a handle on the caller's buffer (shares its storage)
  std::vector<Range> buckets_;
  std::unique_ptr<Allreducer> allreducer_;  // built on the constructing thread, used on thread_
  std::unique_ptr<device_memory::Staging> staging_;  // null: the buckets are reduced in grads_
  // Device gradients under the nccl backend: buckets are marked at launch, queued on the comm
  // stream by the thread, and the step's end waits for the previous step's (Allreducer's queued
  // form).
  bool queued_ = false;

  std::mutex mutex_;
  std::condition_variable work_;                       // the communication thread waits here
  std::condition_variable done_;                       // wait() and run_collective() wait here
  int launched_ = 0;                                   // buckets handed to the thread this step
  int finished_ = 0;                                   // buckets it has reduced
  const std::function<void()>* collective_ = nullptr;  // pending run_collective(), not owned
  int collective_after_ = 0;  // ... to run once this many buckets are finished
  // sum_stats()'s call, built once (a std::function per call could allocate) over these.
  float* stats_data_ = nullptr;
  std::int64_t stats_count_ = 0;
  std::function<void()> stats_on_host_, stats_on_device_;
  bool stats_planned_ = false;
  Device stats_device_ = Device::cpu;
  Tensor stats_staging_;  // plan_stats()'s host copy, where device statistics need one
  void* capture_stream_ = nullptr;  // capture_on()'s
  bool in_step_ = false;            // between begin() and the end of wait()
  bool collective_done_ = false;
  bool stopping_ = false;
  bool busy_ = false;          // the thread is reducing a bucket or running a collective
  bool caller_reduces_ = false;  // wait() took the remaining buckets: the thread leaves them
  bool all_launched_ = false;  // ready_from() launched the step's last bucket ...
  std::chrono::steady_clock::time_point all_launched_at_;  // ... at this time
  // Staged: when the last bucket's download landed (the device's backward was done), where the
  // wait for it blocked; else the epoch (it had landed before anyone asked).
  std::chrono::steady_clock::time_point last_landed_at_;

  double comm_seconds_ = 0;  // written by the thread under mutex_, read after wait()
  std::vector<BucketSpan> spans_;  // one per bucket, sized once; likewise
  double exposed_seconds_ = 0;
  double exposed_peer_wait_seconds_ = 0;
  double peer_wait_seconds_ = 0;
  std::thread thread_;  // last: started once every member above exists
};

}  // namespace mpt::comm
