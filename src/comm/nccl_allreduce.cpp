// The nccl backend (see nccl_allreduce.hpp), on device memory and one dedicated comm stream:
//   flat-nccl     ncclAllReduce over the world;
//   hierarchical  1. ncclReduceScatter inside the node (the remainder by ncclReduce),
//                 2. each owned shard copied to pinned host memory, all-reduced with MPI on its
//                    rail (the project's wire types and ops), and copied back,
//                 3. ncclAllGather inside the node (the remainder by ncclBroadcast).
// MPI never touches device memory (no CUDA-aware path), so MPI and NCCL never share a buffer.
// Pre- and postscale are this file's scale-and-convert kernel (nccl_convert.cu), not ncclAvg or
// ncclRedOpCreatePreMulSum: the arithmetic of the host backends, and nothing at all for 1.
#include "comm/nccl_allreduce.hpp"

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.hpp"
#include "comm/half_sum.hpp"
#include "comm/nccl_convert.hpp"
#include "comm/watchdog.hpp"
#include "core/device_memory.hpp"
#include "core/error.hpp"

namespace mpt::comm {
namespace detail {
namespace {

// Every NCCL communicator this process holds, so that a failed check can abort them all.
std::mutex live_mutex;
std::vector<ncclComm_t>& live_communicators() {
  static std::vector<ncclComm_t> live;
  return live;
}

// Before a failed check ends the job (check_failed aborts every rank), this rank's
// communicators are aborted: ncclCommAbort stops their kernels and proxy threads instead of
// leaving them spinning on a peer while the job goes down.
void abort_live_communicators() {
  std::vector<ncclComm_t> live;
  {
    const std::lock_guard<std::mutex> lock(live_mutex);
    live.swap(live_communicators());
  }
  for (ncclComm_t comm : live) ncclCommAbort(comm);
}

bool nccl_ok(ncclResult_t result) { return result == ncclSuccess; }
std::string nccl_failure(ncclResult_t result) {
  // The detail first: aborting may replace NCCL's last error.
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += std::string(" (") + last + ")";
  abort_live_communicators();
  return text + " (hint: NCCL_DEBUG=INFO shows why, docs/gpu.md)";
}
bool cuda_ok(cudaError_t status) { return status == cudaSuccess; }
std::string cuda_failure(cudaError_t status) {
  abort_live_communicators();
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

// The checks of this file: the failing call as text, file:line, rank, host and device, then the
// whole job ends (core/error.hpp's generator), after this rank's NCCL communicators are aborted.
#define MPT_CHECK_NCCL(call) \
  MPT_CHECK_GEN("NCCL", call, ::mpt::comm::detail::nccl_ok, ::mpt::comm::detail::nccl_failure)
#define MPT_CHECK_CUDA(call) \
  MPT_CHECK_GEN("CUDA", call, ::mpt::comm::detail::cuda_ok, ::mpt::comm::detail::cuda_failure)

// Elements per MPI call: MPI counts are int. Every rank of a rail cuts a shard at the same places.
constexpr std::int64_t kMaxMpiCount = std::int64_t{1} << 30;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return ncclFloat32;
    case DType::f16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    default:
      abort_job(std::string("comm: NCCL cannot reduce ") + dtype_name(dtype));
  }
}

std::uint8_t* at(void* data, std::int64_t elements, std::size_t element_size) {
  return static_cast<std::uint8_t*>(data) + static_cast<std::size_t>(elements) * element_size;
}

class NcclBackend final : public NcclAllreduce {
 public:
  NcclBackend(const Topology& topology, const AllreduceConfig& config);
  ~NcclBackend() override;
  NcclBackend(const NcclBackend&) = delete;
  NcclBackend& operator=(const NcclBackend&) = delete;

  void allreduce(void* data, std::int64_t count, DType dtype) override;
  void plan_slots(int slots, std::int64_t max_count, DType dtype) override;
  void mark(int slot) override;
  void allreduce_queued(int slot, void* data, std::int64_t count, DType dtype) override;
  void join() override;
  double finish(int keep) override;
  bool sums_world() const override { return flat_ || topology_.num_nodes() == 1; }
  void sum_queued(float* data, std::int64_t count) override;
  bool captures() const override { return sums_world() && graph_mixing_; }
  bool captures_buckets() const override {
    return captures() && (flat_ || (topology_.num_nodes() == 1 && !config_.nccl_stage_one_node));
  }
  void capture_on(void* stream) override;
  int next_join_slot() const override { return (oldest_join_ + outstanding_joins_) % 2; }
  void replayed(int slot) override;

 private:
  // Makes the communicator's device current on the calling thread (GradientReducer's thread, or
  // the training thread, may not have it current; streams and launches belong to it) and
  // checks that DATA is device memory.
  void select_device();
  void require_device_data(const void* data);
  // Aborts naming CALL while the calling thread captures (capture_on()).
  void refuse_in_capture(const char* call) const;
  // SLOT's mark event; aborts naming CALL for a slot that was not planned.
  cudaEvent_t slot_event(const char* call, int slot) const;
  // Queues the all-reduce of DATA on the comm stream (after what the stream already waits for).
  void enqueue(void* data, std::int64_t count, DType dtype);
  // Phases 1-3 of the hierarchical algorithm on WIRE (N elements of the wire dtype, device),
  // with the postscale on this rank's region before the gather when SCALE_REGION.
  void hierarchical(void* wire, std::int64_t n, bool scale_region);
  // Phase 2: this rank's region of WIRE through pinned host memory and MPI, shard by shard (or
  // MPI on the device memory itself: AllreduceConfig::mpi_on_device).
  void rails(void* wire, std::int64_t n, Range mine);
  // The rail all-reduces of the shards this rank owns, in place on BASE, which holds the
  // elements from BASE_ELEMENT on (host staging or device memory).
  void rail_calls(void* base, std::int64_t n, std::int64_t base_element);
  // Waits for the comm stream, or for EVENT (see the definition for why it polls).
  void wait();
  void wait(cudaEvent_t event);
  // A device buffer of at least BYTES (DEVICE_SCRATCH) or pinned host memory (HOST_STAGING),
  // grown when a bucket needs more than any before (after the comm stream has drained the old
  // one) and reused by the others.
  void* device_scratch(std::size_t bytes);
  void* host_staging(std::size_t bytes);

  const Topology& topology_;
  const AllreduceConfig& config_;
  const bool flat_;
  const std::size_t wire_size_;
  const ncclDataType_t wire_type_;
  int device_ = 0;           // the cuda device the communicator was built on
  int rank_ = 0, size_ = 1;  // in the NCCL communicator (node or world; the MPI rank there)
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;       // the comm stream: every NCCL call, copy and kernel here
  cudaEvent_t compute_done_ = nullptr;  // where the compute stream was when a call began
  std::vector<cudaEvent_t> marks_;      // queued form: per slot, the compute stream at mark()
  // Queued form: each join()'s points, timed (the compute stream's idle wait is the time from
  // COMPUTE_END to COMM_DONE), in a ring of the two that may be outstanding.
  struct Join {
    cudaEvent_t compute_end = nullptr;  // the compute work queued before the join
    cudaEvent_t comm_done = nullptr;    // the comm stream after every call queued before it
  };
  Join joins_[2];
  int oldest_join_ = 0, outstanding_joins_ = 0;
  // sum_queued(): the compute stream before the call, and the comm stream after it.
  cudaEvent_t stats_ready_ = nullptr, stats_done_ = nullptr;
  // The stream the compute work is ordered by: the legacy stream (every blocking stream's work,
  // the compute stream's included), or, while capturing, the captured compute stream itself.
  cudaStream_t origin_ = cudaStreamLegacy;
  bool capturing_ = false;
  // NCCL_GRAPH_MIXING_SUPPORT (NCCL's, default 1): 0 forbids captured and eager calls of one
  // communicator outstanding together, which a graph between eager steps has.
  const bool graph_mixing_ = [] {
    const char* value = std::getenv("NCCL_GRAPH_MIXING_SUPPORT");
    return value == nullptr || std::string(value) != "0";
  }();
  // A captured join(): the comm stream forked from the compute stream's end of backward (so
  // that it is in the graph even with no call), and joined back.
  cudaEvent_t capture_fork_ = nullptr, capture_join_ = nullptr;
  SumOps ops_;                          // the MPI types and sums of the wire dtypes, for the rails
  IntraPlan plan_;
  void* scratch_ = nullptr;
  std::size_t scratch_bytes_ = 0;
  void* staging_ = nullptr;
  std::size_t staging_bytes_ = 0;
};

NcclBackend::NcclBackend(const Topology& topology, const AllreduceConfig& config)
    : topology_(topology),
      config_(config),
      flat_(config.algorithm == Algorithm::flat_nccl),
      wire_size_(dtype_size(config.wire)),
      wire_type_(nccl_type(config.wire)) {
  MPT_CHECK_CUDA(cudaGetDevice(&device_));
  // The communicator's members and ranks are the MPI communicator's: the node (so rank is the
  // local rank, as the shard ownership assumes) or the world.
  const MPI_Comm group = flat_ ? topology.world() : topology.node();
  MPT_CHECK_MPI(MPI_Comm_rank(group, &rank_));
  MPT_CHECK_MPI(MPI_Comm_size(group, &size_));
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank_ == 0) MPT_CHECK_NCCL(ncclGetUniqueId(&id));
  {
    // Both calls wait for every member; a peer that never joins (NCCL_SOCKET_IFNAME pointing
    // nowhere, a rank stuck bringing up its GPU) is the watchdog's to name, as in a step.
    const CollectiveScope scope(Collective::communicator_setup);
    MPT_CHECK_MPI(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, group));
    // Blocks until every member has joined (each node builds its own at the same time).
    MPT_CHECK_NCCL(ncclCommInitRank(&comm_, size_, id, rank_));
  }
  {
    const std::lock_guard<std::mutex> lock(live_mutex);
    live_communicators().push_back(comm_);
  }
  // Any fatal failure of this rank (a kernel's check, a capture, abort_job), not only this
  // file's checks, aborts the communicators before MPI_Abort ends the job.
  set_abort_hook(&abort_live_communicators);
  // Non-blocking: no implicit order with the legacy default stream either way; allreduce()
  // orders itself after the compute stream with an event, and the host waits for its end.
  MPT_CHECK_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MPT_CHECK_CUDA(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
  for (Join& join : joins_) {
    MPT_CHECK_CUDA(cudaEventCreateWithFlags(&join.compute_end, cudaEventDefault));
    MPT_CHECK_CUDA(cudaEventCreateWithFlags(&join.comm_done, cudaEventDefault));
  }
  for (cudaEvent_t* event : {&stats_ready_, &stats_done_, &capture_fork_, &capture_join_})
    MPT_CHECK_CUDA(cudaEventCreateWithFlags(event, cudaEventDisableTiming));
}

NcclBackend::~NcclBackend() {
  {
    const std::lock_guard<std::mutex> lock(live_mutex);
    auto& live = live_communicators();
    live.erase(std::remove(live.begin(), live.end(), comm_), live.end());
  }
  // Errors are not checked here: a destructor reports nothing, and the job is ending if any.
  if (comm_ != nullptr) {
    // ncclCommDestroy waits for the peers (it finalizes first); while an exception unwinds on
    // this rank alone they may never come, so the communicator is aborted instead.
    if (std::uncaught_exceptions() > 0) {
      ncclCommAbort(comm_);
    } else {
      cudaStreamSynchronize(stream_);
      ncclCommDestroy(comm_);
    }
  }
  if (compute_done_ != nullptr) cudaEventDestroy(compute_done_);
  for (cudaEvent_t event : {stats_ready_, stats_done_, capture_fork_, capture_join_})
    if (event != nullptr) cudaEventDestroy(event);
  for (const Join& join : joins_)
    for (cudaEvent_t event : {join.compute_end, join.comm_done})
      if (event != nullptr) cudaEventDestroy(event);
  for (cudaEvent_t event : marks_) cudaEventDestroy(event);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  device_memory::free_cuda(scratch_);
  if (staging_ != nullptr) cudaFreeHost(staging_);
}

void* NcclBackend::device_scratch(std::size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  if (scratch_ != nullptr) {
    MPT_CHECK_CUDA(cudaStreamSynchronize(stream_));  // nothing queued may still use the old one
    device_memory::free_cuda(scratch_);
  }
  // From the device arena, as every tensor: no cudaMalloc of its own (docs/architecture.md,
  // "Planned memory"); zero-filled and ready for any stream when it returns.
  scratch_ = device_memory::allocate_cuda(bytes);
  scratch_bytes_ = bytes;
  return scratch_;
}

void* NcclBackend::host_staging(std::size_t bytes) {
  if (bytes <= staging_bytes_) return staging_;
  if (staging_ != nullptr) {
    // A larger bucket than any before (the first is capped by --comm.first-bucket-mb): the
    // previous bucket's copy back out of the old buffer may still be queued on the stream.
    wait();
    MPT_CHECK_CUDA(cudaFreeHost(staging_));
  }
  // Pinned: the copies run at full PCIe speed and truly asynchronously on the comm stream.
  MPT_CHECK_CUDA(cudaHostAlloc(&staging_, bytes, cudaHostAllocDefault));
  staging_bytes_ = bytes;
  return staging_;
}

void NcclBackend::wait() { wait(nullptr); }

void NcclBackend::wait(cudaEvent_t event) {
  // Polls rather than cudaStreamSynchronize: a peer that failed leaves this rank's NCCL kernel
  // waiting forever, and NCCL reports what it detects (a remote error, a broken connection) only
  // through ncclCommGetAsyncError. Then this rank aborts its communicator and the job. A silent
  // hang is the comm watchdog's: this wait lies inside the bucket's CollectiveScope, so after
  // --comm.stall-timeout it names the late ranks and MPI_Abort ends every process (the driver
  // frees their GPUs and communicators with them).
  for (;;) {
    const cudaError_t status = event != nullptr ? cudaEventQuery(event) : cudaStreamQuery(stream_);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady)
      ::mpt::detail::check_failed("CUDA",
                                  event != nullptr ? "cudaEventQuery(a join of the comm stream)"
                                                   : "cudaStreamQuery(comm stream)",
                                  cuda_failure(status), __FILE__, __LINE__);
    // "Not ready" is also this thread's last error now; cleared, or the next launch check on
    // this thread (the optimizer's first kernel, a wire conversion) would report it as a failure.
    (void)cudaGetLastError();
    ncclResult_t async = ncclSuccess;
    MPT_CHECK_NCCL(ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress)
      ::mpt::detail::check_failed("NCCL", "a queued collective (ncclCommGetAsyncError)",
                                  nccl_failure(async), __FILE__, __LINE__);
    std::this_thread::yield();
  }
}

void NcclBackend::select_device() {
  int current = -1;
  MPT_CHECK_CUDA(cudaGetDevice(&current));
  if (current != device_) MPT_CHECK_CUDA(cudaSetDevice(device_));
}

void NcclBackend::require_device_data(const void* data) {
  cudaPointerAttributes attributes{};
  MPT_CHECK_CUDA(cudaPointerGetAttributes(&attributes, data));
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged)
    abort_job(
        "comm::Allreducer: the nccl backend reduces device memory, and this buffer is "
        "host memory (stage it, or resolve with Device::cuda only for device data)");
}

void NcclBackend::refuse_in_capture(const char* call) const {
  if (capturing_)
    abort_job(std::string("comm::Allreducer::") + call +
              ": the host waits for the device here, which a CUDA graph's capture cannot hold");
}

void NcclBackend::allreduce(void* data, std::int64_t count, DType dtype) {
  refuse_in_capture("allreduce");
  if (count <= 0) return;
  select_device();
  require_device_data(data);
  // The kernels that wrote DATA were queued on the compute stream before this call. It is a
  // blocking stream (kernels/cuda/common.cuh), so an event on the legacy stream comes after
  // them: the comm stream waits for them, nothing more.
  MPT_CHECK_CUDA(cudaEventRecord(compute_done_, cudaStreamLegacy));
  MPT_CHECK_CUDA(cudaStreamWaitEvent(stream_, compute_done_, 0));
  enqueue(data, count, dtype);
  // The Allreducer's contract is synchronous (the caller reads or overwrites DATA next), so the
  // host waits here once.
  wait();
}

void NcclBackend::plan_slots(int slots, std::int64_t max_count, DType dtype) {
  select_device();
  for (cudaEvent_t event : marks_) MPT_CHECK_CUDA(cudaEventDestroy(event));
  marks_.assign(static_cast<std::size_t>(slots), nullptr);
  for (cudaEvent_t& event : marks_)
    MPT_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  if (max_count <= 0) return;
  // The buffers the largest call needs, now rather than in step 1 (where the scratch's
  // allocation would also wait for the compute stream, from the communication thread).
  if (dtype != config_.wire) device_scratch(static_cast<std::size_t>(max_count) * wire_size_);
  if (!flat_ && !config_.mpi_on_device &&
      (topology_.num_nodes() > 1 || config_.nccl_stage_one_node)) {
    // A region is whole shards of n / parts elements, the last also takes the remainder (under
    // PARTS elements): for any smaller call at most PARTS more than for the largest.
    const int parts = topology_.num_shards();
    plan_intra(max_count, size_, parts, plan_);
    const Range mine = plan_.regions[static_cast<std::size_t>(rank_)];
    host_staging(static_cast<std::size_t>(mine.size() + parts) * wire_size_);
  }
}

cudaEvent_t NcclBackend::slot_event(const char* call, int slot) const {
  if (slot < 0 || static_cast<std::size_t>(slot) >= marks_.size())
    abort_job(std::string("comm::Allreducer::") + call + ": slot " + std::to_string(slot) +
              " of " + std::to_string(marks_.size()) + " planned");
  return marks_[static_cast<std::size_t>(slot)];
}

void NcclBackend::mark(int slot) {
  select_device();
  // On the legacy stream, as compute_done_: after every kernel queued so far on the compute
  // stream, and nothing later. Captured: on the compute stream itself, a point of the graph.
  MPT_CHECK_CUDA(cudaEventRecord(slot_event("mark", slot), origin_));
}

void NcclBackend::allreduce_queued(int slot, void* data, std::int64_t count, DType dtype) {
  if (capturing_ && !captures_buckets())
    abort_job("comm::Allreducer::allreduce_queued: this all-reduce has a phase through the host "
              "(across nodes), which a CUDA graph's capture cannot hold (capture the buckets only "
              "with flat-nccl or on one node)");
  if (count <= 0) return;
  select_device();
  // Checked where it is safe (the eager steps before a capture pass the same buffers): CUDA does
  // not list cudaPointerGetAttributes among the calls a capture allows.
  if (!capturing_) require_device_data(data);
  // Only the compute work that wrote this slot's data, not whatever the training thread has
  // queued since (backward's next layers): the call overlaps them on the device.
  MPT_CHECK_CUDA(cudaStreamWaitEvent(stream_, slot_event("allreduce_queued", slot), 0));
  enqueue(data, count, dtype);
}

void NcclBackend::join() {
  select_device();
  if (outstanding_joins_ == 2)
    abort_job("comm::Allreducer::join: two joins are outstanding already (finish(1) first)");
  const Join& join = joins_[next_join_slot()];
  if (capturing_) {
    // Nodes of the graph: each launch records the two timing points, and the compute stream
    // waits for the comm stream before the graph's end (CUDA refuses a capture whose fork is
    // not joined back). Outstanding once a launch is queued (replayed()).
    MPT_CHECK_CUDA(cudaEventRecord(capture_fork_, origin_));
    MPT_CHECK_CUDA(cudaStreamWaitEvent(stream_, capture_fork_, 0));
    MPT_CHECK_CUDA(cudaEventRecordWithFlags(join.compute_end, origin_, cudaEventRecordExternal));
    MPT_CHECK_CUDA(cudaEventRecordWithFlags(join.comm_done, stream_, cudaEventRecordExternal));
    MPT_CHECK_CUDA(cudaEventRecord(capture_join_, stream_));
    MPT_CHECK_CUDA(cudaStreamWaitEvent(origin_, capture_join_, 0));
    return;
  }
  ++outstanding_joins_;
  // Where the compute stream is: every kernel of the step before the optimizer's. The step's
  // last bucket was marked here too, so the comm stream's end comes after it.
  MPT_CHECK_CUDA(cudaEventRecord(join.compute_end, cudaStreamLegacy));
  MPT_CHECK_CUDA(cudaEventRecord(join.comm_done, stream_));
  // A wait queued on the legacy stream makes every blocking stream's later work wait too (the
  // CUDA runtime's legacy-stream semantics), so the compute stream's next kernels (the
  // optimizer's) follow the step's all-reduce, and the host goes on.
  MPT_CHECK_CUDA(cudaStreamWaitEvent(cudaStreamLegacy, join.comm_done, 0));
}

void NcclBackend::capture_on(void* stream) {
  if (stream != nullptr && !sums_world())
    abort_job("comm::Allreducer::capture_on: the nccl communicator is this node's only, and the "
              "sum across nodes goes through the host, which a CUDA graph cannot capture");
  if (stream != nullptr && !graph_mixing_)
    abort_job("comm::Allreducer::capture_on: NCCL_GRAPH_MIXING_SUPPORT=0 forbids a graph's NCCL "
              "calls and eager ones outstanding together, as the eager steps around a replayed "
              "graph have them (unset it, or run without --cuda.graphs)");
  capturing_ = stream != nullptr;
  origin_ = capturing_ ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy;
}

void NcclBackend::replayed(int slot) {
  if (capturing_ || outstanding_joins_ == 2 || slot != next_join_slot())
    abort_job("comm::Allreducer::replayed: the graph of join slot " + std::to_string(slot) +
              " was launched where the next join is slot " + std::to_string(next_join_slot()) +
              " with " + std::to_string(outstanding_joins_) +
              " outstanding (finish(1) first; alternate the two slots' graphs)");
  ++outstanding_joins_;
}

double NcclBackend::finish(int keep) {
  refuse_in_capture("finish");
  select_device();
  double waited = 0;
  while (outstanding_joins_ > keep) {
    const Join& join = joins_[oldest_join_];
    wait(join.comm_done);
    wait(join.compute_end);  // before it in practice; ElapsedTime needs both complete
    float ms = 0;
    MPT_CHECK_CUDA(cudaEventElapsedTime(&ms, join.compute_end, join.comm_done));
    waited += std::max(0.f, ms) / 1e3;
    oldest_join_ = (oldest_join_ + 1) % 2;
    --outstanding_joins_;
  }
  if (keep == 0) wait();  // and anything queued without a join
  return waited;
}

void NcclBackend::sum_queued(float* data, std::int64_t count) {
  if (!sums_world())
    abort_job("comm::Allreducer::sum_queued: the nccl communicator is this node's only; sum "
              "across nodes through the host");
  if (count <= 0) return;
  select_device();
  if (!capturing_) require_device_data(data);  // as in allreduce_queued()
  // After the kernels that wrote DATA (everything on the compute stream so far: the caller
  // waits in run_collective while this runs, or captures) and after the buckets queued before
  // it: one communicator, one stream, one order of calls on every rank. The plain f32 sum, never
  // the gradients' wire dtype or scaling: counts and sums of squares.
  MPT_CHECK_CUDA(cudaEventRecord(stats_ready_, origin_));
  MPT_CHECK_CUDA(cudaStreamWaitEvent(stream_, stats_ready_, 0));
  MPT_CHECK_NCCL(ncclAllReduce(data, data, static_cast<std::size_t>(count), ncclFloat32, ncclSum,
                               comm_, stream_));
  // As join(): a wait queued on the legacy stream holds every later kernel of the compute
  // stream (the layer's coefficients next) until the sum is in, and the host goes on; captured,
  // the compute stream's own wait.
  MPT_CHECK_CUDA(cudaEventRecord(stats_done_, stream_));
  MPT_CHECK_CUDA(cudaStreamWaitEvent(origin_, stats_done_, 0));
}

void NcclBackend::enqueue(void* data, std::int64_t count, DType dtype) {
  // On the wire: DATA itself when the dtypes agree (scaled in place if prescale != 1), else a
  // device scratch with DATA converted and prescaled. Calls in flight share the scratch safely:
  // every one of them runs on the comm stream, in order.
  void* wire = data;
  if (dtype != config_.wire) wire = device_scratch(static_cast<std::size_t>(count) * wire_size_);
  MPT_CHECK_CUDA(
      convert_scaled_cuda(data, dtype, wire, config_.wire, count, config_.prescale, stream_));
  // The postscale costs 1/L of a pass on the owned region when DATA is the wire buffer; else it
  // rides on the conversion back, as in the host backends (one rounding either way).
  const bool scaled = !flat_ && wire == data;
  if (flat_) {
    MPT_CHECK_NCCL(ncclAllReduce(wire, wire, static_cast<std::size_t>(count), wire_type_, ncclSum,
                                 comm_, stream_));
  } else {
    hierarchical(wire, count, scaled);
  }
  MPT_CHECK_CUDA(convert_scaled_cuda(wire, config_.wire, data, dtype, count,
                                     scaled ? 1.f : config_.postscale, stream_));
}

void NcclBackend::hierarchical(void* wire, std::int64_t n, bool scale_region) {
  plan_intra(n, size_, topology_.num_shards(), plan_);
  const Range mine = plan_.regions[static_cast<std::size_t>(rank_)];
  const std::size_t block = static_cast<std::size_t>(plan_.block);
  // 1. Reduce-scatter, in place: rank r receives at sendbuff + r * recvcount.
  if (block > 0)
    MPT_CHECK_NCCL(ncclReduceScatter(wire, at(wire, rank_ * plan_.block, wire_size_), block,
                                     wire_type_, ncclSum, comm_, stream_));
  if (!plan_.pieces.empty()) {
    MPT_CHECK_NCCL(ncclGroupStart());
    for (const IntraPlan::Piece& piece : plan_.pieces) {
      void* range = at(wire, piece.range.begin, wire_size_);
      MPT_CHECK_NCCL(ncclReduce(range, range, static_cast<std::size_t>(piece.range.size()),
                                wire_type_, ncclSum, piece.root, comm_, stream_));
    }
    MPT_CHECK_NCCL(ncclGroupEnd());
  }
  // 2. Across nodes (or through the host anyway, when a test asks).
  if (topology_.num_nodes() > 1 || config_.nccl_stage_one_node) rails(wire, n, mine);
  if (scale_region) {
    void* region = at(wire, mine.begin, wire_size_);
    MPT_CHECK_CUDA(convert_scaled_cuda(region, config_.wire, region, config_.wire, mine.size(),
                                       config_.postscale, stream_));
  }
  // 3. All-gather, in place: rank r sends from recvbuff + r * sendcount.
  if (block > 0)
    MPT_CHECK_NCCL(ncclAllGather(at(wire, rank_ * plan_.block, wire_size_), wire, block, wire_type_,
                                 comm_, stream_));
  if (!plan_.pieces.empty()) {
    MPT_CHECK_NCCL(ncclGroupStart());
    for (const IntraPlan::Piece& piece : plan_.pieces) {
      void* range = at(wire, piece.range.begin, wire_size_);
      MPT_CHECK_NCCL(ncclBroadcast(range, range, static_cast<std::size_t>(piece.range.size()),
                                   wire_type_, piece.root, comm_, stream_));
    }
    MPT_CHECK_NCCL(ncclGroupEnd());
  }
}

void NcclBackend::rails(void* wire, std::int64_t n, Range mine) {
  if (mine.size() == 0) return;  // then every shard this rank owns is empty, on every node
  if (config_.mpi_on_device) {
    // CUDA-aware MPI (an f32 wire, MPI's own sum): MPI reads and writes the region in device
    // memory, once the reduce-scatter has written it; the all-gather is queued after MPI
    // returned, so NCCL and MPI never touch the buffer at the same time.
    wait();
    rail_calls(wire, n, 0);  // WIRE holds the whole buffer, from element 0
    return;
  }
  const std::size_t bytes = static_cast<std::size_t>(mine.size()) * wire_size_;
  void* host = host_staging(bytes);
  void* region = at(wire, mine.begin, wire_size_);
  MPT_CHECK_CUDA(cudaMemcpyAsync(host, region, bytes, cudaMemcpyDeviceToHost, stream_));
  // Unavoidable: MPI reads host memory, so the copy (and the reduce-scatter before it) must be
  // complete. The copy back is queued after the rail calls, on the same stream as the gather.
  wait();
  rail_calls(host, n, mine.begin);
  MPT_CHECK_CUDA(cudaMemcpyAsync(region, host, bytes, cudaMemcpyHostToDevice, stream_));
}

void NcclBackend::rail_calls(void* base, std::int64_t n, std::int64_t base_element) {
  // Increasing shard order on every rank: a rank of a smaller node owns several shards and meets
  // each rail in the order its owners on the other nodes do (as the host backends).
  const int parts = topology_.num_shards();
  for (int shard = topology_.first_shard(); shard < topology_.end_shard(); ++shard) {
    const Range range = nccl_shard(n, parts, shard);
    for (std::int64_t begin = range.begin; begin < range.end; begin += kMaxMpiCount) {
      const int count = static_cast<int>(std::min(kMaxMpiCount, range.end - begin));
      MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, at(base, begin - base_element, wire_size_), count,
                                  ops_.type(config_.wire), ops_.sum(config_.wire),
                                  topology_.rail(shard)));
    }
  }
}

}  // namespace

std::unique_ptr<NcclAllreduce> make_nccl_allreduce(const Topology& topology,
                                                   const AllreduceConfig& config) {
  return std::make_unique<NcclBackend>(topology, config);
}

}  // namespace detail

SharedGpus find_shared_gpus(const Topology& topology) {
  // Each rank's GPU as "HOST PCI-BUS-ID", gathered over the world with its node's index.
  constexpr int kKey = 160;
  struct Entry {
    char key[kKey];
    int node;
  };
  Entry mine{};
  char bus[32] = "unknown";
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetPCIBusId(bus, static_cast<int>(sizeof bus), device) != cudaSuccess) {
    cudaGetLastError();  // not sticky: no device here is the caller's to report
    std::snprintf(bus, sizeof bus, "unknown (no CUDA device)");
  }
  std::snprintf(mine.key, kKey, "%s on %s", bus, process_host().c_str());
  mine.node = topology.node_index();
  std::vector<Entry> all(static_cast<std::size_t>(topology.size()));
  MPT_CHECK_MPI(MPI_Allgather(&mine, static_cast<int>(sizeof mine), MPI_BYTE, all.data(),
                              static_cast<int>(sizeof mine), MPI_BYTE, topology.world()));
  // Ranks sorted by GPU (then by rank): the ranks of one GPU are neighbours. Every rank sorts
  // the same entries, so every rank reports the same pair.
  std::vector<int> order(all.size());
  for (std::size_t r = 0; r < order.size(); ++r) order[r] = static_cast<int>(r);
  const auto key = [&](int r) { return std::string(all[static_cast<std::size_t>(r)].key); };
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const int c = std::strncmp(all[static_cast<std::size_t>(a)].key,
                               all[static_cast<std::size_t>(b)].key, kKey);
    return c != 0 ? c < 0 : a < b;
  });
  SharedGpus shared;
  for (std::size_t i = 0; i < order.size(); ++i) {
    for (std::size_t j = i + 1; j < order.size() && key(order[j]) == key(order[i]); ++j) {
      const int a = std::min(order[i], order[j]), b = std::max(order[i], order[j]);
      const std::string line =
          "ranks " + std::to_string(a) + " and " + std::to_string(b) + " share the GPU " + key(a);
      if (shared.in_world.empty()) shared.in_world = line;
      if (shared.in_node.empty() &&
          all[static_cast<std::size_t>(a)].node == all[static_cast<std::size_t>(b)].node)
        shared.in_node = line;
      if (!shared.in_node.empty()) return shared;
    }
  }
  return shared;
}

}  // namespace mpt::comm
