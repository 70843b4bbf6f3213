// Device memory for Tensor (see device_memory.hpp). The CUDA runtime is used only here and in
// kernels/cuda, so core stays free of cudart in CPU-only builds.
#include "core/device_memory.hpp"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/error.hpp"

#ifdef MPTRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>
// The streams are ordered through the legacy default stream (ComputeMark, Readback, copy(), the
// allocation's memset): nvcc's --default-stream per-thread would turn each of those into a stream
// that the blocking compute stream does not wait for, silently.
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "mptrain needs the legacy default stream: build without --default-stream per-thread"
#endif
#endif

namespace mpt::device_memory {

#ifdef MPTRAIN_HAVE_CUDA

namespace {
bool cuda_ok(cudaError_t status) { return status == cudaSuccess; }
std::string cuda_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}
#define MPT_CHECK_CUDA_RT(call) MPT_CHECK_GEN("CUDA", call, cuda_ok, cuda_text)

// Every Tensor on the device lives in one arena (core/arena.hpp): cudaMalloc is called for a
// slab now and then while a run plans its buffers, never per tensor, and never once the plan
// is complete (the trainer checks that its steps took no new slab). 256 MiB slabs keep the
// count small; a larger tensor gets a slab of its own size. Never destroyed: at exit the
// context may already be gone, and the driver takes the memory back anyway.
constexpr std::size_t kSlabBytes = std::size_t{256} << 20;
std::mutex arena_mutex;
BlockArena& arena() {
  static BlockArena* const instance = new BlockArena(
      SlabSource{[](std::size_t bytes) -> void* {
                   void* pointer = nullptr;
                   if (cudaMalloc(&pointer, bytes) == cudaSuccess) return pointer;
                   cudaGetLastError();  // out of memory is not sticky: the caller reports it
                   return nullptr;
                 },
                 [](void* pointer) { cudaFree(pointer); }},
      kSlabBytes);
  return *instance;
}

cudaMemcpyKind copy_kind(Device dst, Device src) {
  if (src == Device::cpu) return dst == Device::cpu ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice;
  return dst == Device::cpu ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
}
}  // namespace

bool cuda_built() { return true; }

namespace {
// The visible devices into COUNT (0 on failure), and cudaGetDeviceCount's status: no driver, a
// driver older than this runtime, no device visible...
cudaError_t count_devices(int& count) {
  count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error for later calls
    count = 0;
  }
  return status;
}
}  // namespace

int cuda_device_count() {
  int count = 0;
  count_devices(count);
  return count;
}

std::string cuda_device_description() {
  int count = 0;
  if (const cudaError_t status = count_devices(count); status != cudaSuccess)
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status);
  if (count == 0) return "cudaGetDeviceCount: 0 devices";
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess)
    return "unknown CUDA device";
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
         ", " + std::to_string(prop.totalGlobalMem >> 30) + " GiB)";
}

void set_cuda_device(int device) {
  const cudaError_t status = cudaSetDevice(device);
  if (status != cudaSuccess) {
    cudaGetLastError();  // not sticky: later calls report their own errors
    throw_user_error("--device=cuda: cannot use CUDA device " + std::to_string(device) + " (" +
                         cuda_text(status) + ")",
                     "check nvidia-smi and CUDA_VISIBLE_DEVICES (a device in exclusive mode serves "
                     "one process), or use --device=cpu");
  }
}

void* allocate_cuda(std::size_t bytes) {
  void* pointer = nullptr;
  {
    const std::lock_guard<std::mutex> lock(arena_mutex);
    pointer = arena().allocate(bytes);
  }
  if (pointer == nullptr) {
    std::size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    cudaGetLastError();
    abort_job("Tensor: no device memory for " + std::to_string(bytes) + " bytes (" +
              std::to_string(free_bytes >> 20) + " MiB free of " + std::to_string(total_bytes >> 20) +
              " MiB; is a CUDA device visible? see CUDA_VISIBLE_DEVICES, or lower --data.batch-size)");
  }
  // Zero for every stream when this returns, also for a non-blocking one (the prefetcher's copy
  // streams, the nccl comm stream) that does not order itself after the legacy stream's memset.
  // Allocation happens while planning, so the wait costs nothing in a step.
  MPT_CHECK_CUDA_RT(cudaMemset(pointer, 0, bytes));
  MPT_CHECK_CUDA_RT(cudaStreamSynchronize(cudaStreamLegacy));
  return pointer;
}

void free_cuda(void* pointer) {
  if (pointer == nullptr) return;
  const std::lock_guard<std::mutex> lock(arena_mutex);
  arena().release(pointer);  // back to the arena: no cudaFree in a run
}

bool reserve_cuda(std::size_t bytes) {
  const std::lock_guard<std::mutex> lock(arena_mutex);
  return arena().reserve(bytes);
}

ArenaStats cuda_arena_stats() {
  const std::lock_guard<std::mutex> lock(arena_mutex);
  return arena().stats();
}

void zero_cuda(void* pointer, std::size_t bytes) { MPT_CHECK_CUDA_RT(cudaMemset(pointer, 0, bytes)); }

void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (bytes == 0) return;
  if (dst_device == Device::cpu && src_device == Device::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
  MPT_CHECK_CUDA_RT(cudaMemcpy(dst, src, bytes, copy_kind(dst_device, src_device)));
}

void synchronize() { MPT_CHECK_CUDA_RT(cudaDeviceSynchronize()); }

Tensor pinned_host_tensor(const Shape& shape, DType dtype, const char* hint) {
  const std::size_t bytes =
      static_cast<std::size_t>(std::max<std::int64_t>(shape_numel(shape), 1)) * dtype_size(dtype);
  void* pointer = nullptr;
  const cudaError_t status = cudaHostAlloc(&pointer, bytes, cudaHostAllocPortable);
  if (status != cudaSuccess)
    abort_job("pinned host buffer: cudaHostAlloc of " + std::to_string(bytes) + " bytes failed: " +
              cuda_text(status) + " (" + hint + ")");
  std::memset(pointer, 0, bytes);
  // Page-aligned, as Tensor::adopt requires; the tensor and its views keep the owner alive.
  std::shared_ptr<void> owner(pointer, [](void* p) { cudaFreeHost(p); });
  return Tensor::adopt(pointer, shape, dtype, std::move(owner));
}

ComputeMark::~ComputeMark() {
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));  // may be after shutdown
}

void ComputeMark::record() {
  if (!event_) {
    cudaEvent_t event = nullptr;
    MPT_CHECK_CUDA_RT(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    event_ = event;
  }
  // On the legacy default stream: it comes after every kernel queued before on the blocking
  // compute stream, and before every later one (kernels/cuda/common.cuh).
  MPT_CHECK_CUDA_RT(cudaEventRecord(static_cast<cudaEvent_t>(event_), cudaStreamLegacy));
}

CopyQueue::CopyQueue() {
  MPT_CHECK_CUDA_RT(cudaGetDevice(&device_));
  cudaStream_t stream = nullptr;
  MPT_CHECK_CUDA_RT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
}

CopyQueue::~CopyQueue() {
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void CopyQueue::wait(const ComputeMark& mark) {
  if (!mark.event_) return;  // never recorded: nothing to wait for
  MPT_CHECK_CUDA_RT(cudaSetDevice(device_));
  MPT_CHECK_CUDA_RT(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_),
                                        static_cast<cudaEvent_t>(mark.event_), 0));
}

void CopyQueue::to_device(void* device_dst, const void* pinned_src, std::size_t bytes) {
  if (bytes == 0) return;
  MPT_CHECK_CUDA_RT(cudaSetDevice(device_));
  MPT_CHECK_CUDA_RT(cudaMemcpyAsync(device_dst, pinned_src, bytes, cudaMemcpyHostToDevice,
                                    static_cast<cudaStream_t>(stream_)));
}

void CopyQueue::finish() {
  MPT_CHECK_CUDA_RT(cudaSetDevice(device_));
  MPT_CHECK_CUDA_RT(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
}

Readback::Readback(std::size_t bytes, Device source)
    : bytes_(bytes), host_(std::malloc(std::max<std::size_t>(bytes, 1))) {
  if (!host_) abort_job("Readback: out of host memory");
  if (source == Device::cuda) make_pinned();
}

void Readback::make_pinned() {
  void* pinned = nullptr;
  MPT_CHECK_CUDA_RT(cudaHostAlloc(&pinned, std::max<std::size_t>(bytes_, 1), cudaHostAllocPortable));
  std::free(host_);
  host_ = pinned;
  pinned_ = true;
  cudaEvent_t event = nullptr;
  MPT_CHECK_CUDA_RT(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  event_ = event;
}

Readback::~Readback() {
  // May run after the CUDA runtime shut down: errors are ignored.
  if (pinned_) cudaFreeHost(host_);
  else std::free(host_);
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

void Readback::start(const void* src, Device src_device) {
  from_ = src_device;
  if (src_device == Device::cpu) {
    std::memcpy(host_, src, bytes_);
    return;
  }
  // Made at construction for a cuda source; here only for one that was not declared so.
  if (!pinned_) make_pinned();
  // On the legacy default stream: it comes after every kernel queued before on the blocking
  // compute stream, and before every later one (kernels/cuda/common.cuh).
  MPT_CHECK_CUDA_RT(cudaMemcpyAsync(host_, src, bytes_, cudaMemcpyDeviceToHost, cudaStreamLegacy));
  MPT_CHECK_CUDA_RT(cudaEventRecord(static_cast<cudaEvent_t>(event_), cudaStreamLegacy));
}

const void* Readback::wait() {
  if (from_ != Device::cpu) MPT_CHECK_CUDA_RT(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
  return host_;
}

#else  // !MPTRAIN_HAVE_CUDA

namespace {
[[noreturn]] void no_cuda(const char* what) {
  abort_job(std::string(what) + ": this build has no CUDA (configure with MPTRAIN_ENABLE_CUDA=ON)");
}
}  // namespace

bool cuda_built() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_device_description() { return "no CUDA in this build"; }
void set_cuda_device(int device) {
  throw_user_error("--device=cuda: this build has no CUDA (cannot use device " +
                       std::to_string(device) + ")",
                   "rebuild with -DMPTRAIN_ENABLE_CUDA=ON, or use --device=cpu");
}
void* allocate_cuda(std::size_t) { no_cuda("Tensor on the cuda device"); }
void free_cuda(void*) {}
bool reserve_cuda(std::size_t) { return false; }
ArenaStats cuda_arena_stats() { return {}; }
void zero_cuda(void*, std::size_t) { no_cuda("Tensor::zero on the cuda device"); }
void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (dst_device != Device::cpu || src_device != Device::cpu) no_cuda("copy to or from the cuda device");
  if (bytes) std::memcpy(dst, src, bytes);
}
void synchronize() {}
Tensor pinned_host_tensor(const Shape&, DType, const char*) { no_cuda("pinned host buffer"); }
ComputeMark::~ComputeMark() = default;
void ComputeMark::record() {}
CopyQueue::CopyQueue() { no_cuda("host->device copy queue"); }
CopyQueue::~CopyQueue() = default;
void CopyQueue::wait(const ComputeMark&) {}
void CopyQueue::to_device(void*, const void*, std::size_t) {}
void CopyQueue::finish() {}
Readback::Readback(std::size_t bytes, Device)
    : bytes_(bytes), host_(std::malloc(std::max<std::size_t>(bytes, 1))) {
  if (!host_) abort_job("Readback: out of host memory");
}
Readback::~Readback() { std::free(host_); }
void Readback::start(const void* src, Device src_device) {
  if (src_device != Device::cpu) no_cuda("read back from the cuda device");
  std::memcpy(host_, src, bytes_);
}
const void* Readback::wait() { return host_; }

#endif

namespace {
std::atomic<std::uint64_t> g_scratch_generation{0};
}  // namespace

std::uint64_t scratch_generation() { return g_scratch_generation.load(); }
void note_scratch_replaced() { g_scratch_generation.fetch_add(1); }

}  // namespace mpt::device_memory
