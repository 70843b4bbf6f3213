// The cuDNN handle and shared scratch per device (see cudnn.cuh).
#include <map>
#include <mutex>

#include "kernels/cuda/cudnn.cuh"

namespace mpt::kernels::cuda {
namespace {

struct DeviceCudnn {
  cudnnHandle_t handle = nullptr;
  void* scratch = nullptr;
  std::size_t scratch_bytes = 0;
};

// Handles live until exit and are never destroyed: a static destructor could run after the
// CUDA runtime's own teardown (the order depends on which was first used), and the driver frees
// them with the process anyway (as the arena's slabs).
class CudnnRegistry {
 public:
  static CudnnRegistry& instance() {
    static CudnnRegistry* const registry = new CudnnRegistry;
    return *registry;
  }
  DeviceCudnn& current() {
    int device = 0;
    MPT_CHECK_CUDA(cudaGetDevice(&device));
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceCudnn& state = devices_[device];
    if (!state.handle) MPT_CHECK_CUDNN(cudnnCreate(&state.handle));
    return state;
  }

 private:
  std::mutex mutex_;
  std::map<int, DeviceCudnn> devices_;
};

}  // namespace

std::string cudnn_error_text(cudnnStatus_t status) {
  return std::string(cudnnGetErrorString(status)) + " (status " +
         std::to_string(static_cast<int>(status)) + ")";
}

cudnnHandle_t cudnn_handle() {
  const cudnnHandle_t handle = CudnnRegistry::instance().current().handle;
  // On every call (a field store, no synchronisation), so cuDNN follows stream() if it changes.
  MPT_CHECK_CUDNN(cudnnSetStream(handle, stream()));
  return handle;
}

void reserve_cudnn_scratch(std::size_t bytes) {
  DeviceCudnn& state = CudnnRegistry::instance().current();
  if (bytes <= state.scratch_bytes) return;
  // Plan time only. The arena may hand the old block to a later tensor, so the work that may
  // still read it finishes first (a synchronisation, outside the training step).
  if (state.scratch) {
    MPT_CHECK_CUDA(cudaDeviceSynchronize());
    device_memory::note_scratch_replaced();
    device_memory::free_cuda(state.scratch);
  }
  state.scratch = device_memory::allocate_cuda(bytes);
  state.scratch_bytes = bytes;
}

void* cudnn_scratch() { return CudnnRegistry::instance().current().scratch; }
std::size_t cudnn_scratch_bytes() { return CudnnRegistry::instance().current().scratch_bytes; }

cudnnDataType_t cudnn_data_type(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      break;
  }
  abort_job(std::string("kernels::cuda: cuDNN gets f32, f16 or bf16 tensors, not ") +
            dtype_name(dtype));
}

}  // namespace mpt::kernels::cuda
