// Private to the CUDA kernels: the cuDNN pieces shared by the convolution and pooling plans: the
// check macro, one handle per device (created on first use, on the compute stream, destroyed at
// exit) and one scratch buffer per device that plans reserve at plan time and share.
#pragma once

#include <cudnn.h>

#include <cstddef>
#include <string>

#include "kernels/cuda/common.cuh"

namespace mpt::kernels::cuda {

inline bool cudnn_ok(cudnnStatus_t status) { return status == CUDNN_STATUS_SUCCESS; }
std::string cudnn_error_text(cudnnStatus_t status);

// Aborts the job with the call as text, its status from cudnnGetErrorString, file:line, rank,
// host and device (the project's MPT_CHECK_* generator).
#define MPT_CHECK_CUDNN(call)                                  \
  MPT_CHECK_GEN("cuDNN", call, ::mpt::kernels::cuda::cudnn_ok, \
                ::mpt::kernels::cuda::cudnn_error_text)

// The current device's handle (created on first use; one per device), bound to stream() on
// every call.
cudnnHandle_t cudnn_handle();

// The current device's shared cuDNN scratch: grown to at least BYTES (at plan time only: the
// old buffer goes back to the arena, after the work queued on it) and never shrunk.
void reserve_cudnn_scratch(std::size_t bytes);
// Its address and size now. Every plan reads them per call, since a later plan may grow it.
void* cudnn_scratch();
std::size_t cudnn_scratch_bytes();

// CUDNN_DATA_FLOAT, _HALF or _BFLOAT16 for f32, f16 or bf16.
cudnnDataType_t cudnn_data_type(DType dtype);

// BYTES rounded up to a multiple of 256, the alignment of every region of the scratch.
inline std::size_t cudnn_align(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace mpt::kernels::cuda
