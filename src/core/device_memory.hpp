// Raw device memory for Tensor storage and copies between devices. In a CUDA build
// (MPTRAIN_HAVE_CUDA) this wraps cudaMalloc, cudaMemset and cudaMemcpy; otherwise every cuda
// request aborts with a message that says the build has no CUDA, and the device count is 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/arena.hpp"
#include "core/tensor.hpp"

namespace mpt::device_memory {

// True when this build was compiled with CUDA.
bool cuda_built();
// The number of CUDA devices this process can see; 0 without CUDA, a driver or a device (never
// aborts: callers use it to skip GPU work).
int cuda_device_count();
// "NVIDIA H200 (sm_90, 139 GiB)" for the current device, or why there is none
// ("cudaGetDeviceCount: <the runtime's error>", "no CUDA in this build").
std::string cuda_device_description();
// Makes DEVICE (0 <= DEVICE < cuda_device_count()) this process's current cuda device, for every
// later allocation and launch. Throws UserError naming --device when it cannot (a build without
// CUDA, a busy or missing device), so that a caller inside an agreed phase ends every rank.
void set_cuda_device(int device);

// BYTES of zero-filled memory on the cuda device, out of the process's device arena
// (core/arena.hpp: cudaMalloc only when a new slab is needed); aborts on failure, naming the size.
void* allocate_cuda(std::size_t bytes);
// Back to the arena, not to the driver. Never aborts: called from destructors.
// The block may be handed out again at once. The next allocate_cuda zeroes it on the legacy
// stream and synchronises, which orders the reuse after every blocking stream (compute), but
// not after the non-blocking ones (the prefetcher's copy queue, staging, NCCL): an owner whose
// memory such a stream may still touch synchronises that stream before freeing (CopyQueue::finish,
// staging_destroy).
void free_cuda(void* pointer);
// How many times a planned device scratch buffer (shared by kernels, grown on demand) was
// replaced by a larger one, its old block going back to the arena. A CUDA graph keeps the
// addresses it captured, so kernels::StepGraph refuses to replay across a replacement.
std::uint64_t scratch_generation();
void note_scratch_replaced();
// Takes a slab for BYTES now unless one fits already (false: no CUDA, or out of memory).
bool reserve_cuda(std::size_t bytes);
// The arena's counters: slabs are its cudaMalloc calls; all zero without CUDA.
ArenaStats cuda_arena_stats();
void zero_cuda(void* pointer, std::size_t bytes);
// A zero-filled host tensor in page-locked memory (cudaHostAlloc): the device copies from it
// asynchronously and at full bus speed, so the prefetcher's batches live there on cuda runs, and
// the staged gradients' host twin. Aborts on failure, with HINT (what to lower) in the message,
// and in a build without CUDA.
Tensor pinned_host_tensor(const Shape& shape, DType dtype,
                          const char* hint = "lower --data.prefetch or --train.batch-size");

// A point in the compute stream's work (an event recorded after the launches that read some
// buffer), which a CopyQueue can wait for on the device, with no host synchronisation. Made
// once, recorded again and again; a mark never recorded is waited for as already passed.
// Without CUDA every call is a no-op.
class ComputeMark {
 public:
  ComputeMark() = default;
  ~ComputeMark();
  ComputeMark(const ComputeMark&) = delete;
  ComputeMark& operator=(const ComputeMark&) = delete;
  void record();  // on the compute stream, from the thread that launches on it
 private:
  friend class CopyQueue;
  void* event_ = nullptr;  // cudaEvent_t, made on the first record()
};

// Host->device copies on a stream of their own, created non-blocking so that they run beside
// the compute stream's kernels (the legacy default stream would serialise them). Used by one
// thread at a time; every call first makes the device that was current at construction current
// on the calling thread (an I/O thread starts on device 0). Aborts in a build without CUDA.
class CopyQueue {
 public:
  CopyQueue();
  ~CopyQueue();
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;
  // Later copies start only once the compute work before MARK's last record() is done.
  void wait(const ComputeMark& mark);
  void to_device(void* device_dst, const void* pinned_src, std::size_t bytes);
  // The calling thread blocks until every queued copy has landed.
  void finish();

 private:
  void* stream_ = nullptr;  // cudaStream_t
  int device_ = 0;
};

// A device buffer's twin in host memory, for an all-reduce that runs on the host (the MPI
// backends under a cuda model), moved range by range (comm::GradientReducer's buckets) so that
// the copies overlap the compute and the other ranges' all-reduce. Ranges are element ranges
// [BEGIN, END) of the buffer; slots name a download for wait_downloaded() (0 <= SLOT < the
// implementation's slot count). The contract, which a device implementation meets with two
// copy streams and events (kernels/staging.hpp), and a host one with copies at once:
class Staging {
 public:
  virtual ~Staging() = default;
  // The host twin, laid out as the buffer.
  virtual void* host() = 0;
  // Queues the range's copy into host() after the compute work queued so far (which wrote it),
  // without the host waiting. From the thread that queues that work.
  virtual void download(int slot, std::int64_t begin, std::int64_t end) = 0;
  // Blocks until SLOT's last download has landed in host(). Any thread.
  virtual void wait_downloaded(int slot) = 0;
  // Queues the range's copy from host() back into the buffer. Any thread, once the range's
  // download was waited for; the host may not write the range of host() again before join().
  virtual void upload(std::int64_t begin, std::int64_t end) = 0;
  // Compute work queued from now on runs after every upload issued before this call (which must
  // happen-before it), without the host waiting; later downloads come after them too. From the
  // thread that queues the compute work.
  virtual void join() = 0;
};

// A small result read back without stalling the device (the training step's state): start()
// queues a copy of BYTES into page-locked host memory on the compute stream, after the work
// launched so far, and records an event after it; wait() blocks only until that copy landed.
// From a host source, start() copies at once. A cuda source aborts in a build without CUDA.
// SOURCE cuda takes the page-locked buffer and the event now (cudaHostAlloc waits for the whole
// device), so that no step pays for them; otherwise the first cuda start() does.
class Readback {
 public:
  explicit Readback(std::size_t bytes, Device source = Device::cpu);
  ~Readback();
  Readback(const Readback&) = delete;
  Readback& operator=(const Readback&) = delete;
  void start(const void* src, Device src_device);
  // The bytes of the last start(), once they are there.
  const void* wait();

 private:
  std::size_t bytes_;
  Device from_ = Device::cpu;
  void* host_ = nullptr;   // BYTES: malloc'ed, or cudaHostAlloc'ed for a cuda source
  bool pinned_ = false;
  void make_pinned();
  void* event_ = nullptr;  // cudaEvent_t
};

// Copies BYTES between any two devices (cudaMemcpy on the legacy stream). To the host, it has
// landed when this returns; to the device, it is ordered before later work on the blocking
// compute stream (and the legacy stream), but the host may return first (a device-to-device
// copy, or pageable host memory once staged), so work on a non-blocking stream must wait for
// an event recorded after it.
void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes);
// Waits for all work queued on the current cuda device (no-op without CUDA).
void synchronize();

}  // namespace mpt::device_memory
