// Private to the nccl backend: the device twin of detail::convert_scaled (wire.hpp), on a given
// stream. Included only by the CUDA translation units of comm (nccl_allreduce.cpp,
// nccl_convert.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/tensor.hpp"

namespace mpt::comm::detail {

// DST[i] = SCALE * SRC[i] for N elements in device memory, converted from FROM to TO (each f32,
// f16 or bf16): widened to f32, multiplied in f32 and rounded to nearest even once, the host
// backends' arithmetic bit for bit. SRC and DST do not overlap, or are the same pointer with
// FROM == TO. Queued on STREAM; nothing is launched for N == 0, nor in place with SCALE == 1.
// Returns the launch's error (cudaSuccess when nothing was launched).
cudaError_t convert_scaled_cuda(const void* src, DType from, void* dst, DType to, std::int64_t n,
                                float scale, cudaStream_t stream);

}  // namespace mpt::comm::detail
