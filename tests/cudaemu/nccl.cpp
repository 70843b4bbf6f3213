// The CUDA emulator's NCCL: the calls src/comm/nccl_allreduce.cpp makes (a communicator from a
// unique id, AllReduce, ReduceScatter, AllGather, Reduce and Broadcast with ncclSum, groups,
// abort and the asynchronous error), between the ranks' processes on this host, as NCCL's
// shared-memory transport joins the GPUs of a node. A communicator is a POSIX shared-memory
// segment named by its unique id: a barrier and one slot per rank. A collective is queued on
// its stream like a kernel and, when it runs, goes through the data a slot-sized chunk at a
// time: each rank copies its chunk in, all meet, each computes its own output from every rank's
// chunk (sums in rank order, 16-bit sums rounded after each addition, as each hop of NCCL's
// ring rounds; so every rank gets the same bits), all meet again.
//
// A GPU runs a queued collective whatever its host does next. Here queued work runs when a
// host thread needs it (deferred streams), so a rank whose host is busy elsewhere (in MPI, with
// a peer that waits in the collective) would never join: once a peer waits in a collective, a
// progress thread of the process runs the collective's stream up to it, as the GPU would have.
// Until then it stays queued, as late as deferred streams allow: a missing event wait before a
// collective, or after it (a stream that reads its result without waiting), still reads stale
// memory.
//
// It checks what NCCL checks: the rank and count at init, one device per rank ("duplicate
// GPU"), buffers in device memory of the communicator's device, the stream's device, types and
// operations; and one rule NCCL states but does not check: a collective is graph-captured on
// every rank or on none (a mix ends the process naming both ranks). Buffers, counts and roots that disagree across ranks are not detected (NCCL
// does not either: it hangs or computes garbage).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <nccl.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "tests/cudaemu/emulator.hpp"

namespace {

constexpr int kMaxRanks = 64;
constexpr std::size_t kSlotBytes = std::size_t{1} << 20;

// The shared segment: written by every rank of the communicator.
struct Shared {
  std::atomic<int> joined;
  std::atomic<int> aborted;  // a rank called ncclCommAbort: waiters give up
  std::atomic<unsigned> arrived;
  std::atomic<unsigned> generation;
  int device[kMaxRanks];  // each rank's device index, for the duplicate-GPU check
  // Whether each rank's collective now running came from a graph launch: written before a
  // collective's first barrier, read after it (NCCL requires all ranks or none to capture it).
  std::atomic<int> captured[kMaxRanks];
};
static_assert(std::atomic<int>::is_always_lock_free && std::atomic<unsigned>::is_always_lock_free);

std::size_t segment_bytes(int nranks) {
  return (sizeof(Shared) + 4095) / 4096 * 4096 + static_cast<std::size_t>(nranks) * kSlotBytes;
}

thread_local std::string last_error;
ncclResult_t failure(ncclResult_t result, const std::string& why) {
  last_error = why;
  return result;
}

}  // namespace

struct ncclComm {
  int rank = 0, nranks = 1, device = 0;
  std::string name;
  Shared* shared = nullptr;
  std::byte* slots = nullptr;
  std::size_t bytes = 0;
  std::atomic<bool> aborted{false};
  std::atomic<int> async_error{ncclSuccess};
  std::uint64_t issued = 0;                 // collectives queued (the host thread's count)
  std::atomic<std::uint64_t> completed{0};  // collectives run

  std::byte* slot(int r) const { return slots + static_cast<std::size_t>(r) * kSlotBytes; }

  // All ranks meet; false once the communicator is aborted, here or by a peer.
  bool barrier() {
    const unsigned generation = shared->generation.load(std::memory_order_acquire);
    if (shared->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 ==
        static_cast<unsigned>(nranks)) {
      shared->arrived.store(0, std::memory_order_relaxed);
      shared->generation.fetch_add(1, std::memory_order_acq_rel);
      return !shared->aborted.load();
    }
    for (int spins = 0; shared->generation.load(std::memory_order_acquire) == generation; ++spins) {
      if (shared->aborted.load() || aborted.load()) return false;
      if (spins < 64)
        sched_yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return !shared->aborted.load();
  }
};

namespace {

// ---- the progress thread --------------------------------------------------------------------

// Runs a queued collective's stream up to it (an event recorded right after it) once a peer
// waits in it, as the GPU would run it whatever this rank's host does; until then it stays
// queued, as late as deferred streams allow (so a stream that should wait for the collective
// and does not reads what was there before).
class Progress {
 public:
  static Progress& instance() {
    static Progress* const progress = new Progress;  // never destroyed: its thread lives on
    return *progress;
  }
  void push(ncclComm* comm, std::uint64_t seq, cudaEvent_t done) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      work_.push_back({comm, seq, done});
    }
    ready_.notify_one();
  }
  // Drops COMM's entries and waits until the thread is not running one of them (before a
  // destroy: the stream and its events go next).
  void forget(ncclComm* comm) {
    std::unique_lock<std::mutex> lock(mutex_);
    std::erase_if(work_, [&](const Entry& e) {
      if (e.comm != comm) return false;
      cudaEventDestroy(e.done);
      return true;
    });
    idle_.wait(lock, [&] { return running_ != comm; });
  }

 private:
  struct Entry {
    ncclComm* comm;
    std::uint64_t seq;  // the collective's number on its communicator
    cudaEvent_t done;
  };
  Progress() {
    std::thread([this] { loop(); }).detach();
  }
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      ready_.wait(lock, [&] { return !work_.empty(); });
      bool ran = false;
      for (auto it = work_.begin(); it != work_.end();) {
        ncclComm* comm = it->comm;
        if (comm->completed.load() >= it->seq) {  // run by a host synchronisation already
          cudaEventDestroy(it->done);
          it = work_.erase(it);
          continue;
        }
        if (comm->shared->arrived.load() == 0 && !comm->aborted.load()) {
          ++it;  // nobody waits in a collective of this communicator yet
          continue;
        }
        const Entry entry = *it;
        work_.erase(it);
        running_ = comm;
        lock.unlock();
        cudaSetDevice(comm->device);
        cudaEventSynchronize(entry.done);
        cudaEventDestroy(entry.done);
        cudaGetLastError();
        lock.lock();
        running_ = nullptr;
        idle_.notify_all();
        ran = true;
        break;  // the list may have changed meanwhile
      }
      if (!ran && !work_.empty()) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        lock.lock();
      }
    }
  }
  std::mutex mutex_;
  std::condition_variable ready_, idle_;
  std::deque<Entry> work_;
  ncclComm* running_ = nullptr;
};

// ---- arithmetic -----------------------------------------------------------------------------

std::size_t element_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclFloat32:
      return 4;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    default:
      return 0;
  }
}
float load(const std::byte* base, std::size_t i, ncclDataType_t type) {
  if (type == ncclFloat32) {
    float v;
    std::memcpy(&v, base + i * 4, 4);
    return v;
  }
  std::uint16_t bits;
  std::memcpy(&bits, base + i * 2, 2);
  return type == ncclFloat16 ? __half2float(__ushort_as_half(bits))
                             : __bfloat162float(__ushort_as_bfloat16(bits));
}
void store(std::byte* base, std::size_t i, ncclDataType_t type, float value) {
  if (type == ncclFloat32) {
    std::memcpy(base + i * 4, &value, 4);
    return;
  }
  const std::uint16_t bits = type == ncclFloat16 ? __half_as_ushort(__float2half_rn(value))
                                                 : __bfloat16_as_ushort(__float2bfloat16_rn(value));
  std::memcpy(base + i * 2, &bits, 2);
}
// The value in TYPE's precision (each hop's rounding).
float rounded(float value, ncclDataType_t type) {
  std::byte bits[4];
  store(bits, 0, type, value);
  return load(bits, 0, type);
}

// ---- collectives ----------------------------------------------------------------------------

enum class Kind { all_reduce, reduce_scatter, all_gather, reduce, broadcast };

struct Call {
  std::uint64_t seq;  // 1, 2, ... on its communicator
  Kind kind;
  const void* send;
  void* recv;
  std::size_t count;  // elements per rank's input (sendcount; recvcount of a reduce-scatter)
  ncclDataType_t type;
  int root;
  bool captured = false;  // queued by a graph's launch
};

// The collective, run when its stream reaches it. Every rank's input is COUNT elements (the
// reduce-scatter's COUNT * nranks): chunk by chunk, each rank's slot holds its chunk of it.
void run(ncclComm* comm, const Call& c) {
  struct Done {
    ncclComm* comm;
    std::uint64_t seq;
    ~Done() { comm->completed.store(seq); }
  } done{comm, c.seq};
  if (comm->aborted.load()) return;
  const std::size_t e = element_bytes(c.type);
  const std::size_t per_rank = c.kind == Kind::reduce_scatter ? c.count * comm->nranks : c.count;
  const std::size_t chunk = kSlotBytes / e;
  const auto* send = static_cast<const std::byte*>(c.send);
  auto* recv = static_cast<std::byte*>(c.recv);
  comm->shared->captured[comm->rank].store(c.captured ? 1 : 0);
  for (std::size_t begin = 0; begin < per_rank; begin += chunk) {
    const std::size_t n = std::min(chunk, per_rank - begin);
    const bool contributes = c.kind != Kind::broadcast || comm->rank == c.root;
    if (contributes) std::memcpy(comm->slot(comm->rank), send + begin * e, n * e);
    if (!comm->barrier()) break;
    if (begin == 0)
      for (int r = 0; r < comm->nranks; ++r)
        if (comm->shared->captured[r].load() != (c.captured ? 1 : 0)) {
          std::fprintf(stderr,
                       "cudaemu: NCCL collective #%llu is graph-captured on rank %d and not on "
                       "rank %d: NCCL requires a collective to be captured on all ranks or on "
                       "none (docs.nvidia.com, \"Using NCCL with CUDA Graphs\")\n",
                       static_cast<unsigned long long>(c.seq), c.captured ? comm->rank : r,
                       c.captured ? r : comm->rank);
          std::fflush(stderr);
          std::abort();
        }
    const auto sum_into = [&](std::size_t from, std::size_t to, std::size_t out_begin) {
      for (std::size_t i = from; i < to; ++i) {
        float sum = load(comm->slot(0), i, c.type);
        for (int r = 1; r < comm->nranks; ++r)
          sum = rounded(sum + load(comm->slot(r), i, c.type), c.type);
        store(recv, out_begin + (i - from), c.type, sum);
      }
    };
    switch (c.kind) {
      case Kind::all_reduce:
        sum_into(0, n, begin);
        break;
      case Kind::reduce:
        if (comm->rank == c.root) sum_into(0, n, begin);
        break;
      case Kind::reduce_scatter: {
        // This rank's output is input elements [rank * count, (rank + 1) * count).
        const std::size_t lo = static_cast<std::size_t>(comm->rank) * c.count, hi = lo + c.count;
        const std::size_t from = std::max(lo, begin), to = std::min(hi, begin + n);
        if (from < to) sum_into(from - begin, to - begin, from - lo);
        break;
      }
      case Kind::all_gather:
        for (int r = 0; r < comm->nranks; ++r)
          std::memcpy(recv + (static_cast<std::size_t>(r) * c.count + begin) * e, comm->slot(r),
                      n * e);
        break;
      case Kind::broadcast:
        std::memcpy(recv + begin * e, comm->slot(c.root), n * e);
        break;
    }
    if (!comm->barrier()) break;
  }
  if (comm->shared->aborted.load() && !comm->aborted.load())
    comm->async_error.store(ncclRemoteError);
}

ncclResult_t check_buffer(const ncclComm* comm, const void* buffer, std::size_t bytes,
                          const char* name) {
  if (bytes == 0) return ncclSuccess;
  const int owner = mpt::cudaemu::device_memory_owner(buffer, bytes);
  if (owner < 0) return failure(ncclInvalidArgument, std::string(name) + " is not device memory");
  if (owner != comm->device)
    return failure(ncclInvalidArgument, std::string(name) + " is memory of device " +
                                            std::to_string(owner) + ", the communicator's is " +
                                            std::to_string(comm->device));
  return ncclSuccess;
}

// Numbers CALL and queues it on STREAM, with the progress thread told to run it; CAPTURED: by
// a graph's launch.
ncclResult_t queue(ncclComm* comm, cudaStream_t stream, Call call, bool captured) {
  if (comm->aborted.load()) return failure(ncclInvalidUsage, "the communicator was aborted");
  call.seq = ++comm->issued;
  call.captured = captured;
  if (mpt::cudaemu::run_on_stream(stream, [comm, call] { run(comm, call); }) != cudaSuccess)
    return failure(ncclUnhandledCudaError, "queueing on the stream failed");
  cudaEvent_t done = nullptr;
  if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventRecord(done, stream) != cudaSuccess)
    return failure(ncclUnhandledCudaError, "an event after the collective");
  Progress::instance().push(comm, call.seq, done);
  return ncclSuccess;
}

// Checks CALL and queues it on STREAM (or records it into STREAM's capture).
ncclResult_t enqueue(ncclComm* comm, ncclRedOp_t op, cudaStream_t stream, Call call) {
  if (comm == nullptr) return failure(ncclInvalidArgument, "null communicator");
  if (comm->aborted.load()) return failure(ncclInvalidUsage, "the communicator was aborted");
  const std::size_t e = element_bytes(call.type);
  if (e == 0) return failure(ncclInvalidArgument, "a data type the emulator does not model");
  if (op != ncclSum) mpt::cudaemu::emulator_limit("NCCL reductions other than ncclSum");
  if ((call.kind == Kind::reduce || call.kind == Kind::broadcast) &&
      (call.root < 0 || call.root >= comm->nranks))
    return failure(ncclInvalidArgument, "root " + std::to_string(call.root) + " out of range");
  if (mpt::cudaemu::stream_device(stream) != comm->device)
    return failure(ncclInvalidArgument, "the stream belongs to another device");
  const std::size_t in = call.kind == Kind::reduce_scatter ? call.count * comm->nranks : call.count;
  const std::size_t out = call.kind == Kind::all_gather ? call.count * comm->nranks : call.count;
  const bool reads = call.kind != Kind::broadcast || comm->rank == call.root;
  const bool writes = call.kind != Kind::reduce || comm->rank == call.root;
  if (reads)
    if (const ncclResult_t r = check_buffer(comm, call.send, in * e, "sendbuff"); r != ncclSuccess)
      return r;
  if (writes)
    if (const ncclResult_t r = check_buffer(comm, call.recv, out * e, "recvbuff"); r != ncclSuccess)
      return r;
  if (in == 0 && out == 0) return ncclSuccess;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &capturing);
  if (capturing != cudaStreamCaptureStatusNone) {
    // Captured into a graph (NCCL 2.9+ captures its kernels): each launch numbers and queues
    // the collective anew, in the graph's stream order, as the replayed kernel would join its
    // peers then. Checked once, here, as NCCL checks at capture.
    const cudaError_t recorded = mpt::cudaemu::capture_host_action(stream, [comm, call](cudaStream_t s) {
      return queue(comm, s, call, /*captured=*/true) == ncclSuccess ? cudaSuccess
                                                                     : cudaErrorLaunchFailure;
    });
    return recorded == cudaSuccess ? ncclSuccess
                                   : failure(ncclInvalidUsage, "recording into the capture failed");
  }
  return queue(comm, stream, call, /*captured=*/false);
}

// ncclGroupStart/End, per thread as NCCL's: each call of a group still runs in call order (every
// rank calls in the same order, so no grouping is needed to avoid a deadlock here).
thread_local int group_depth = 0;

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (emulator)";
    case ncclSystemError:
      return "unhandled system error (emulator)";
    case ncclInternalError:
      return "internal error (emulator)";
    case ncclInvalidArgument:
      return "invalid argument (emulator)";
    case ncclInvalidUsage:
      return "invalid usage (emulator)";
    case ncclRemoteError:
      return "remote process exited or there was a network error (emulator)";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return last_error.c_str(); }

// A name for the shared segment: this process, a counter and a random word.
ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return ncclInvalidArgument;
  static std::atomic<unsigned> counter{0};
  std::random_device random;
  std::memset(id, 0, sizeof *id);
  std::snprintf(id->internal, sizeof id->internal, "/mpt-nccl-%d-%u-%08x",
                static_cast<int>(getpid()), counter.fetch_add(1), random());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (out == nullptr) return failure(ncclInvalidArgument, "null comm pointer");
  if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks)
    return failure(ncclInvalidArgument, "rank " + std::to_string(rank) + " of " +
                                            std::to_string(nranks) + " (the emulator takes up to " +
                                            std::to_string(kMaxRanks) + ")");
  id.internal[sizeof id.internal - 1] = '\0';
  if (std::strncmp(id.internal, "/mpt-nccl-", 10) != 0)
    return failure(ncclInvalidArgument, "not a unique id from ncclGetUniqueId");
  auto comm = std::make_unique<ncclComm>();
  comm->rank = rank;
  comm->nranks = nranks;
  cudaGetDevice(&comm->device);
  comm->name = id.internal;
  comm->bytes = segment_bytes(nranks);
  const int fd = shm_open(comm->name.c_str(), O_CREAT | O_RDWR, 0600);
  if (fd < 0)
    return failure(ncclSystemError, "shm_open " + comm->name + ": " + std::strerror(errno));
  // Every rank sizes it the same; a new segment reads as zeros (the atomics' initial values).
  if (ftruncate(fd, static_cast<off_t>(comm->bytes)) != 0) {
    close(fd);
    return failure(ncclSystemError, "ftruncate " + comm->name + ": " + std::strerror(errno));
  }
  void* memory = mmap(nullptr, comm->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (memory == MAP_FAILED)
    return failure(ncclSystemError, "mmap " + comm->name + ": " + std::strerror(errno));
  comm->shared = static_cast<Shared*>(memory);
  comm->slots = static_cast<std::byte*>(memory) + (sizeof(Shared) + 4095) / 4096 * 4096;
  comm->shared->device[rank] = comm->device;
  // Blocks until every rank has joined, as ncclCommInitRank does.
  comm->shared->joined.fetch_add(1);
  while (comm->shared->joined.load() < nranks)
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  comm->barrier();  // every rank has read JOINED: the name can go
  if (rank == 0) shm_unlink(comm->name.c_str());
  // Every rank refuses a communicator with two ranks on one GPU, as NCCL does.
  for (int a = 0; a < nranks; ++a)
    for (int b = a + 1; b < nranks; ++b)
      if (comm->shared->device[a] == comm->shared->device[b]) {
        const std::string why = "Duplicate GPU detected: rank " + std::to_string(a) + " and rank " +
                                std::to_string(b) + " both on device " +
                                std::to_string(comm->shared->device[a]);
        munmap(comm->shared, comm->bytes);
        return failure(ncclInvalidUsage, why);
      }
  *out = comm.release();
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  Progress::instance().forget(comm);
  munmap(comm->shared, comm->bytes);
  delete comm;
  return ncclSuccess;
}

// Releases the peers waiting in a collective (they report ncclRemoteError) and this rank's.
// The communicator object is kept: collectives still queued on a stream refer to it, and now
// return at once (the job is ending).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  comm->aborted.store(true);
  comm->shared->aborted.store(1);
  Progress::instance().forget(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* error) {
  if (comm == nullptr || error == nullptr) return ncclInvalidArgument;
  *error = static_cast<ncclResult_t>(comm->async_error.load());
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}
ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return failure(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  --group_depth;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, op, stream, {0, Kind::all_reduce, send, recv, count, type, 0});
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, op, stream, {0, Kind::reduce_scatter, send, recv, recvcount, type, 0});
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, ncclSum, stream, {0, Kind::all_gather, send, recv, sendcount, type, 0});
}
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, op, stream, {0, Kind::reduce, send, recv, count, type, root});
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(comm, ncclSum, stream, {0, Kind::broadcast, send, recv, count, type, root});
}

}  // extern "C"
