// Shared pieces of the CUDA kernels (see common.cuh).
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "kernels/cuda/common.cuh"

namespace mpt::kernels::cuda {

std::string cuda_error_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}

bool legacy_stream_selected() {
  static const bool legacy = [] {
    const char* value = std::getenv("MPTRAIN_CUDA_LEGACY_STREAM");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  return legacy;
}

cudaStream_t stream() {
  // A function-local static: made once, thread-safely, by the first launch of any thread.
  static const cudaStream_t compute = []() -> cudaStream_t {
    if (legacy_stream_selected()) return nullptr;
    cudaStream_t created = nullptr;
    // cudaStreamCreate, not ...WithFlags(cudaStreamNonBlocking): the implicit order with the
    // legacy stream is what keeps src/'s synchronous copies and events correct (common.cuh).
    MPT_CHECK_CUDA(cudaStreamCreate(&created));
    return created;
  }();
  return compute;
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
