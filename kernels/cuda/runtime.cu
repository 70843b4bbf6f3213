// Shared pieces of the CUDA kernels (see common.cuh).
#include <mutex>

#include "kernels/cuda/common.cuh"

namespace mpt::kernels::cuda {

std::string cuda_error_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

void check_launch(const char* op) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    abort_job(std::string(op) + ": kernel launch failed: " + cuda_error_text(status));
}

int blocks_for(std::int64_t n) {
  static const int max_blocks = [] {
    int device = 0, sms = 0;
    MPT_CHECK_CUDA(cudaGetDevice(&device));
    MPT_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms * 8;  // 8 resident blocks of 256 threads per SM covers the latency
  }();
  const std::int64_t needed = (n + kThreads - 1) / kThreads;
  return static_cast<int>(needed < max_blocks ? needed : max_blocks);
}

void* reduction_scratch() {
  static void* scratch = device_memory::allocate_cuda(256);  // the arena's: see device_memory.hpp
  return scratch;
}

void read_scratch(void* host, std::size_t bytes) {
  MPT_CHECK_CUDA(cudaMemcpy(host, reduction_scratch(), bytes, cudaMemcpyDeviceToHost));
}

}  // namespace mpt::kernels::cuda
