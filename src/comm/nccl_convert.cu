// The nccl backend's scale-and-convert kernel (see nccl_convert.hpp): how the pre- and postscale
// of AllreduceConfig, and a wire dtype other than the data's, reach device buffers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "comm/nccl_convert.hpp"

namespace mpt::comm::detail {
namespace {

constexpr int kThreads = 256;

__device__ float widen(const void* data, int type, std::int64_t i) {
  if (type == 0) return static_cast<const float*>(data)[i];
  const unsigned short bits = static_cast<const unsigned short*>(data)[i];
  return type == 1 ? __half2float(__ushort_as_half(bits))
                   : __uint_as_float(static_cast<unsigned int>(bits) << 16);
}

__device__ void store(void* data, int type, std::int64_t i, float value) {
  if (type == 0) {
    static_cast<float*>(data)[i] = value;
  } else {
    static_cast<unsigned short*>(data)[i] = type == 1
                                                ? __half_as_ushort(__float2half_rn(value))
                                                : __bfloat16_as_ushort(__float2bfloat16_rn(value));
  }
}

// 0: f32, 1: f16, 2: bf16 (the caller passes only these).
int code(DType dtype) { return dtype == DType::f32 ? 0 : dtype == DType::f16 ? 1 : 2; }

__global__ void convert_scaled_kernel(const void* src, int from, void* dst, int to, std::int64_t n,
                                      float scale) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    store(dst, to, i, __fmul_rn(widen(src, from, i), scale));  // no FMA: one product, one rounding
}

}  // namespace

cudaError_t convert_scaled_cuda(const void* src, DType from, void* dst, DType to, std::int64_t n,
                                float scale, cudaStream_t stream) {
  if (n <= 0 || (src == dst && from == to && scale == 1.f)) return cudaSuccess;
  if (from == to && scale == 1.f)
    return cudaMemcpyAsync(dst, src, static_cast<std::size_t>(n) * dtype_size(from),
                           cudaMemcpyDeviceToDevice, stream);
  // A grid-stride loop: enough blocks to fill any device, never more than N needs.
  const std::int64_t wanted = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(wanted < 4096 ? wanted : 4096);
  convert_scaled_kernel<<<blocks, kThreads, 0, stream>>>(src, code(from), dst, code(to), n, scale);
  return cudaGetLastError();
}

}  // namespace mpt::comm::detail
