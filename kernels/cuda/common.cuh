// Private to the CUDA kernels: error checks, the launch configuration, 16-bit conversions on the
// device, and a reduction scratch buffer allocated once. Every launcher validates its tensors
// (all on the cuda device), launches on the compute stream, and checks the launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <string>

#include "core/device_memory.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"
#include "kernels/check.hpp"
#include "kernels/step_state.hpp"

// The blocking compute stream orders itself after the legacy default stream (and the reverse):
// nvcc's --default-stream per-thread would break that without a word.
#ifdef CUDA_API_PER_THREAD_DEFAULT_STREAM
#error "mptrain needs the legacy default stream: build without --default-stream per-thread"
#endif

namespace mpt::kernels::cuda {

inline bool cuda_ok(cudaError_t status) { return status == cudaSuccess; }
std::string cuda_error_text(cudaError_t status);

#define MPT_CHECK_CUDA(call) \
  MPT_CHECK_GEN("CUDA", call, ::mpt::kernels::cuda::cuda_ok, ::mpt::kernels::cuda::cuda_error_text)

// Aborts naming OP when the last launch failed (bad configuration, no device, ...).
void check_launch(const char* op);
// The compute stream: every kernel, cuBLASLt and cuDNN call of kernels/cuda. One stream per
// process, made by cudaStreamCreate on the first call, on the device current then (a process
// drives one device, chosen before its first launch), and never destroyed. Not the legacy
// default stream, because CUDA graphs (kernels/graph.hpp) cannot capture that one; but a
// BLOCKING stream, which synchronises implicitly with the legacy stream. So whatever src/ queues
// on the legacy stream stays ordered after every kernel launched here before it, and before
// every kernel launched after it: the synchronous cudaMemcpy and cudaMemset of
// core/device_memory.cpp (Tensor::to, kernels::copy, Tensor::zero, arena allocation), the
// host reads of reduction results (read_scratch), ComputeMark's and Readback's events and
// copies, and the nccl backend's event on cudaStreamLegacy. While a graph is being captured,
// nothing may touch the legacy stream (any thread): that invalidates the capture.
// MPTRAIN_CUDA_LEGACY_STREAM=1 in the environment makes it the legacy default stream (nullptr)
// again, for comparisons; graphs_supported() is then false.
cudaStream_t stream();
// True when MPTRAIN_CUDA_LEGACY_STREAM=1 selected the legacy default stream (read once). Needs
// no device and creates nothing.
bool legacy_stream_selected();

// Zeroes T on the compute stream: Tensor::zero() goes through the legacy stream and waits,
// which a launcher inside the step must not do (and which would invalidate a graph capture).
inline void zero_on_stream(Tensor& t) {
  if (t.numel() > 0) MPT_CHECK_CUDA(cudaMemsetAsync(t.raw(), 0, t.size_bytes(), stream()));
}

inline constexpr int kThreads = 256;
// Blocks for a grid-stride loop over N elements: enough to fill the device, never more than N needs.
int blocks_for(std::int64_t n);

// Device scratch for reduction results (at least 256 bytes, allocated on first use and kept),
// and a host copy helper that waits for the result.
void* reduction_scratch();
void read_scratch(void* host, std::size_t bytes);

// A defined tensor of DTYPE on the cuda device.
inline void require_cuda(const char* op, const char* what, const Tensor& t, DType dtype) {
  detail::require(t.defined() && t.dtype() == dtype && t.device() == Device::cuda, op, what, t);
}
inline bool is_float_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16;
}

// The optional recast targets of a fused optimizer update, validated against PARAMS: ROUNDED
// (f16 or bf16, as long as the params) and WIDENED (f32, only with ROUNDED). Null pointers for
// a target not given; on the device WIDENED is optional, since cuBLASLt reads the 16-bit copy.
struct RecastTargets {
  std::uint16_t* out16 = nullptr;
  float* out32 = nullptr;
  bool f16 = true;  // ROUNDED is f16 (else bf16)
};
inline RecastTargets recast_targets(const char* op, const Tensor& params, Tensor* rounded,
                                    Tensor* widened) {
  const std::int64_t n = params.numel();
  RecastTargets targets;
  if (rounded) {
    detail::require(rounded->defined() && rounded->device() == Device::cuda &&
                        (rounded->dtype() == DType::f16 || rounded->dtype() == DType::bf16) &&
                        rounded->numel() == n,
                    op, "rounded must be f16 or bf16 on the cuda device, as long as params",
                    *rounded);
    targets.out16 = static_cast<std::uint16_t*>(rounded->raw());
    targets.f16 = rounded->dtype() == DType::f16;
  }
  if (widened) {
    detail::require(rounded != nullptr, op, "widened needs rounded", *widened);
    require_cuda(op, "widened must be f32 on the cuda device", *widened, DType::f32);
    detail::require_pair(widened->numel() == n, op, "widened must hold as many elements as params",
                         params, *widened);
    targets.out32 = widened->data<float>();
  }
  return targets;
}

// The kernels::StepState in STATE (u8 on the cuda device, sizeof(StepState) bytes), as a device
// pointer for kernels to read and write; the host never dereferences it.
inline void require_step_state(const char* op, const Tensor& state) {
  detail::require(
      state.defined() && state.dtype() == DType::u8 && state.device() == Device::cuda &&
          state.numel() == static_cast<std::int64_t>(sizeof(StepState)),
      op, "the step state must be a u8 tensor of sizeof(StepState) bytes on the cuda device",
      state);
}
inline StepState* step_state_on_device(const char* op, Tensor& state) {
  require_step_state(op, state);
  return static_cast<StepState*>(state.raw());
}
inline const StepState* step_state_on_device(const char* op, const Tensor& state) {
  require_step_state(op, state);
  return static_cast<const StepState*>(state.raw());
}

// Launchers that an op's file shares with step_state.cu, so that the step's variant runs the
// very kernel of the plain op. Each launches on stream() and checks the launch; its callers
// validate the tensors first with its check_ twin, before they touch the device (clearing a
// flag or the scratch), so a bad tensor ends the job with no device call and no partial launch.
//
// softmax_xent.cu: a warp per row of LOGITS, adding the rows' loss into LOSS_SUM (through
// block_sums_scratch, in a fixed order), their hits into CORRECT_COUNT or CORRECT_SUM
// (whichever is not null), and atomicMin-ing a bad label's row into FIRST_BAD_ROW. With
// LOSS_SCALE the gradient scale is GRAD_SCALE * float(*LOSS_SCALE), the product taken in f32 on
// the device.
struct XentTargets {
  double* loss_sum = nullptr;
  unsigned long long* correct_count = nullptr;
  double* correct_sum = nullptr;
  unsigned long long* first_bad_row = nullptr;
  const double* loss_scale = nullptr;
};
void launch_softmax_xent(const char* op, const Tensor& logits, const Tensor& labels,
                         Tensor* dlogits, float grad_scale, const XentTargets& targets);
// launch_softmax_xent's checks (no device call).
void check_softmax_xent(const char* op, const Tensor& logits, const Tensor& labels,
                        const Tensor* dlogits);
// unscale_check.cu: OUTPUTS[i] = INPUTS[i] * INV_SCALE, or * float(1.0 / *LOSS_SCALE) when
// LOSS_SCALE is given; any non-finite input stores 1 into FLAG (never 0: the caller clears it).
void launch_unscale_check(const char* op, std::span<const Tensor> inputs, std::span<Tensor> outputs,
                          float inv_scale, const double* loss_scale, int* flag);
// launch_unscale_check's checks, every bucket (no device call).
void check_unscale_check(const char* op, std::span<const Tensor> inputs, std::span<Tensor> outputs);
// norm.cu: adds the sum of squares of VALUES[0, N) in double into *TOTAL (which the caller
// zeroes), in an order fixed by N and the device; with SKIP, nothing when *SKIP != 0 (read on
// the device).
void launch_sum_of_squares(const char* op, const float* values, std::int64_t n, double* total,
                           const std::int32_t* skip);
// norm.cu: the deterministic two-pass sum that launch_sum_of_squares and launch_softmax_xent
// share. A kernel of at most blocks_for's cap blocks writes one double per block into
// block_sums_scratch(); launch_add_block_sums then adds slots [0, BLOCKS) in index order with
// one block and adds that to *TOTAL (nothing when SKIP is given and *SKIP != 0). No atomics:
// the same inputs give the same bits on every run.
double* block_sums_scratch();
void launch_add_block_sums(const char* op, const double* block_sums, int blocks, double* total,
                           const std::int32_t* skip);

// SUM over every thread of a block of kThreads threads, in a fixed order (warp shuffles, then
// the warps' sums in warp order); valid in thread 0. Every thread of the block must call it, at
// most once per kernel: its shared slots have no barrier after the final read.
__device__ inline double block_sum(double sum) {
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  __shared__ double warp_sums[kThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    sum = lane < kThreads / 32 ? warp_sums[lane] : 0;
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xffffffffu, sum, offset);
  }
  return sum;
}

// 16-bit storage <-> f32 on the device: exact widening, round to nearest even (Inf kept, fp16
// overflow to Inf), bit for bit what the host converters do for every number. A NaN stays a NaN
// but may come out as the canonical one, where the host keeps its sign and payload.
__device__ inline float widen16(std::uint16_t bits, bool is_f16) {
  return is_f16 ? __half2float(__ushort_as_half(bits)) : __uint_as_float(std::uint32_t{bits} << 16);
}
__device__ inline std::uint16_t round16(float value, bool is_f16) {
  return is_f16 ? __half_as_ushort(__float2half_rn(value))
                : __bfloat16_as_ushort(__float2bfloat16_rn(value));
}

template <class Body>
__global__ void elementwise_kernel(std::int64_t n, Body body) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    body(i);
}

// Runs BODY(i) for i in [0, n) on the device (BODY: a __device__ lambda capturing by value).
template <class Body>
void launch_elementwise(const char* op, std::int64_t n, Body body) {
  if (n <= 0) return;
  elementwise_kernel<<<blocks_for(n), kThreads, 0, stream()>>>(n, body);
  check_launch(op);
}

// Calls F(index) for channel C's elements [BEGIN, END) of its N*PLANE (sample-major) in an
// [N, CHANNELS, PLANE] tensor, this thread (of a block of kThreads) taking every kThreads-th
// from BEGIN + threadIdx.x: the per-channel sums of BatchNorm and of the cuDNN path's bias
// gradient. The sample and position step on without a division per element: kThreads =
// step_n * PLANE + step_at, so one carry at most per step.
template <class F>
__device__ inline void for_channel_slice(std::int64_t c, std::int64_t channels,
                                         std::int64_t plane, std::int64_t begin,
                                         std::int64_t end, F f) {
  std::int64_t e = begin + threadIdx.x;
  if (e >= end) return;
  std::int64_t n = e / plane, at = e - n * plane;
  const std::int64_t step_n = kThreads / plane, step_at = kThreads - step_n * plane;
  for (; e < end; e += kThreads) {
    f((n * channels + c) * plane + at);
    n += step_n;
    at += step_at;
    if (at >= plane) {
      at -= plane;
      ++n;
    }
  }
}

// Block (c, slice)'s elements of channel c's COUNT: slice blockIdx.y of SLICES equal parts (the
// sliced per-channel sums of BatchNorm and of the cuDNN path's bias gradient).
struct SliceRange {
  std::int64_t begin, end;
};
__device__ inline SliceRange slice_range(std::int64_t count, int slices) {
  const std::int64_t per_slice = (count + slices - 1) / slices;
  const std::int64_t begin = per_slice * blockIdx.y;
  return {begin, begin + per_slice < count ? begin + per_slice : count};
}

// BODY(i, c) for i in [0, N) of a [.., CHANNELS, PLANE] tensor, c = i / PLANE % CHANNELS: the
// per-channel elementwise passes (bias add, BatchNorm apply and dx, the conv paths' bias, with
// the cuDNN path's ReLU). A thread divides once, for its first element; then its position in
// the plane and its channel step on with the grid's stride, STEP_AT = stride % PLANE and
// STEP_C = stride / PLANE % CHANNELS, each with one carry at most (AT < PLANE and C < CHANNELS
// before the step). Two 64-bit divisions per element (nvcc tests whether the operands fit in 32
// bits, then divides in about twenty instructions, else in a 64-bit routine of many more) would
// leave a 16-bit pass bound by arithmetic rather than by memory.
template <class Body>
__global__ void channel_elementwise_kernel(std::int64_t n, std::int64_t plane,
                                           std::int64_t channels, std::int64_t step_at,
                                           std::int64_t step_c, Body body) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const std::int64_t p = i / plane;
  std::int64_t at = i - p * plane, c = p % channels;
  for (;;) {
    body(i, c);
    i += stride;
    if (i >= n) return;
    at += step_at;
    c += step_c;
    if (at >= plane) {
      at -= plane;
      ++c;
    }
    if (c >= channels) c -= channels;
  }
}

// Runs BODY(i, c) for i in [0, N), c = i / PLANE % CHANNELS, as launch_elementwise runs BODY(i).
// N is a multiple of PLANE * CHANNELS (the callers derive all three from one shape), so with
// N > 0 both are positive.
template <class Body>
void launch_channel_elementwise(const char* op, std::int64_t n, std::int64_t plane,
                                std::int64_t channels, Body body) {
  if (n <= 0) return;
  const int blocks = blocks_for(n);
  const std::int64_t stride = std::int64_t{blocks} * kThreads;
  channel_elementwise_kernel<<<blocks, kThreads, 0, stream()>>>(n, plane, channels, stride % plane,
                                                                stride / plane % channels, body);
  check_launch(op);
}

}  // namespace mpt::kernels::cuda
