// CUDA unscale-and-check (see kernels/unscale_check.hpp): a multi-tensor launch. Up to
// kMaxBuckets buckets travel in the kernel's parameters; each block owns one chunk of one
// bucket, finds its bucket by a scan of the (few) descriptors, scales, and raises a shared
// flag on Inf or NaN. More buckets take more launches onto the same flag, read once at the end.
// kernels::cuda::unscale_and_check_step (step_state.cu) runs the same kernel with the inverse
// scale taken from the StepState on the device and the flag in it.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/unscale_check.hpp"

namespace mpt::kernels::cuda {
namespace {

constexpr int kMaxBuckets = 48;  // 48 x 40 bytes of descriptors stay well inside 4 KiB of params
constexpr std::int64_t kChunk = kThreads * 16;

struct Bucket {
  const void* in;
  float* out;
  std::int64_t n;
  std::int64_t first_block;
  int from;  // 0 f32, 1 f16, 2 bf16
};
struct Buckets {
  Bucket bucket[kMaxBuckets];
  int count;
};

__global__ void unscale_check_kernel(Buckets buckets, float inv_scale, const double* loss_scale,
                                     int* flag) {
  if (loss_scale) inv_scale = static_cast<float>(1.0 / *loss_scale);
  int b = 0;
  while (b + 1 < buckets.count && buckets.bucket[b + 1].first_block <= blockIdx.x) ++b;
  const Bucket& bucket = buckets.bucket[b];
  const std::int64_t begin = (blockIdx.x - bucket.first_block) * kChunk;
  const std::int64_t end = min(bucket.n, begin + kChunk);
  bool bad = false;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    float x;
    if (bucket.from == 0)
      x = static_cast<const float*>(bucket.in)[i];
    else
      x = widen16(static_cast<const std::uint16_t*>(bucket.in)[i], bucket.from == 1);
    bad |= (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
    bucket.out[i] = x * inv_scale;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

}  // namespace

void check_unscale_check(const char* op, std::span<const Tensor> inputs,
                         std::span<Tensor> outputs) {
  if (inputs.size() != outputs.size())
    abort_job(std::string(op) + ": " + std::to_string(inputs.size()) + " inputs but " +
              std::to_string(outputs.size()) + " outputs");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& input = inputs[i];
    const Tensor& output = outputs[i];
    require_cuda(op, "outputs must be f32 on the cuda device", output, DType::f32);
    detail::require(input.defined() && input.device() == Device::cuda && is_float_dtype(input.dtype()),
                    op, "inputs must be f32, f16 or bf16 on the cuda device", input);
    detail::require_pair(input.numel() == output.numel(), op,
                         "each output must hold as many elements as its input", input, output);
  }
}

void launch_unscale_check(const char* op, std::span<const Tensor> inputs, std::span<Tensor> outputs,
                          float inv_scale, const double* loss_scale, int* flag) {
  Buckets pack{};
  std::int64_t blocks = 0;
  const auto flush = [&] {
    if (pack.count > 0 && blocks > 0) {
      unscale_check_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream()>>>(
          pack, inv_scale, loss_scale, flag);
      check_launch(op);
    }
    pack.count = 0;
    blocks = 0;
  };
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& input = inputs[i];
    Tensor& output = outputs[i];
    if (input.numel() == 0) continue;
    if (pack.count == kMaxBuckets) flush();
    const int from = input.dtype() == DType::f32 ? 0 : input.dtype() == DType::f16 ? 1 : 2;
    pack.bucket[pack.count++] = Bucket{input.raw(), output.data<float>(), input.numel(), blocks, from};
    blocks += (input.numel() + kChunk - 1) / kChunk;
  }
  flush();
}

bool unscale_and_check(std::span<const Tensor> inputs, std::span<Tensor> outputs, float inv_scale) {
  constexpr const char* op = "kernels::cuda::unscale_and_check";
  check_unscale_check(op, inputs, outputs);
  auto* flag = static_cast<int*>(reduction_scratch());
  MPT_CHECK_CUDA(cudaMemsetAsync(flag, 0, sizeof(int), stream()));
  launch_unscale_check(op, inputs, outputs, inv_scale, nullptr, flag);
  int bad = 0;
  read_scratch(&bad, sizeof bad);
  return bad == 0;
}

}  // namespace mpt::kernels::cuda
