// Device memory for Tensor (see device_memory.hpp). The CUDA runtime is used only here and in
// kernels/cuda, so core stays free of cudart in CPU-only builds.
#include "core/device_memory.hpp"

#include <cstring>

#include "core/error.hpp"

#ifdef MPTRAIN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mpt::device_memory {

#ifdef MPTRAIN_HAVE_CUDA

namespace {
bool cuda_ok(cudaError_t status) { return status == cudaSuccess; }
std::string cuda_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}
#define MPT_CHECK_CUDA_RT(call) MPT_CHECK_GEN("CUDA", call, cuda_ok, cuda_text)

cudaMemcpyKind copy_kind(Device dst, Device src) {
  if (src == Device::cpu) return dst == Device::cpu ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice;
  return dst == Device::cpu ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
}
}  // namespace

bool cuda_built() { return true; }

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error for later calls
    return 0;
  }
  return count;
}

std::string cuda_device_description() {
  if (cuda_device_count() == 0) return "no CUDA device";
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
  const cudaError_t status = cudaMalloc(&pointer, bytes);
  if (status != cudaSuccess)
    abort_job("Tensor: cudaMalloc of " + std::to_string(bytes) + " bytes failed: " +
              cuda_text(status) + " (is a CUDA device visible? see CUDA_VISIBLE_DEVICES)");
  MPT_CHECK_CUDA_RT(cudaMemset(pointer, 0, bytes));
  return pointer;
}

void free_cuda(void* pointer) {
  if (pointer) cudaFree(pointer);  // at exit the context may be gone: ignore the status
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
void zero_cuda(void*, std::size_t) { no_cuda("Tensor::zero on the cuda device"); }
void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes) {
  if (dst_device != Device::cpu || src_device != Device::cpu) no_cuda("copy to or from the cuda device");
  if (bytes) std::memcpy(dst, src, bytes);
}
void synchronize() {}

#endif

}  // namespace mpt::device_memory
