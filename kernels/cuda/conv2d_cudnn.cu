// Convolution through cuDNN's legacy API (see CudnnConv2d in kernels/conv2d.hpp). Algorithms come
// from the cudnnGet*_v7 heuristics, not from cudnnFind*: the heuristics are a pure function of
// the shape, the GPU and the cuDNN version, so every rank and every resumed run picks the same
// algorithms and gets the same bits, and planning neither runs kernels nor allocates trial
// workspaces. Of the heuristics' ranked list the first deterministic algorithm whose workspace
// fits wins (the non-deterministic ones add with atomics and would break bitwise resume).
// Math: tensor cores for f16/bf16 (CUDNN_TENSOR_OP_MATH, FP32 accumulate); plain FP32 FMA for
// f32 (CUDNN_FMA_MATH: no TF32, as cuBLASLt's CUBLAS_COMPUTE_32F), so f32 stays f32.
// The bias, its gradient and the fused ReLU are small passes of ours: the bias gradient is a
// per-channel f32 sum in a fixed order (deterministic, rounded once; the legacy
// cudnnConvolutionBackwardBias documents no bf16 support), the bias and ReLU one pass over y.
#include <algorithm>
#include <climits>
#include <cstddef>
#include <vector>

#include "kernels/conv2d.hpp"
#include "kernels/cuda/cudnn.cuh"

namespace mpt::kernels::cuda {
namespace {

constexpr const char* kOp = "kernels::cuda::CudnnConv2d";
// The most workspace one algorithm may ask for; faster ones that want more are passed over.
constexpr std::size_t kMaxAlgorithmWorkspace = std::size_t{256} << 20;

// Descriptors and algorithms for one batch size.
struct BatchPlan {
  std::int64_t batch = 0;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  // One convolution descriptor per direction: each carries the math type of its algorithm.
  cudnnConvolutionDescriptor_t forward = nullptr, backward_data = nullptr,
                               backward_filter = nullptr;
  cudnnConvolutionFwdAlgo_t forward_algo{};
  cudnnConvolutionBwdDataAlgo_t backward_data_algo{};
  cudnnConvolutionBwdFilterAlgo_t backward_filter_algo{};
  std::size_t workspace = 0;  // the most any of the three needs
};

// Unchecked, like every cuDNN destroy call here: destructors never abort.
void destroy(BatchPlan& plan) {
  if (plan.x) cudnnDestroyTensorDescriptor(plan.x);
  if (plan.y) cudnnDestroyTensorDescriptor(plan.y);
  for (auto* conv : {plan.forward, plan.backward_data, plan.backward_filter})
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
  plan = BatchPlan{};
}

const char* forward_algo_name(cudnnConvolutionFwdAlgo_t algo) {
  switch (algo) {
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM:
      return "IMPLICIT_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM:
      return "IMPLICIT_PRECOMP_GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_GEMM:
      return "GEMM";
    case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT:
      return "DIRECT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT:
      return "FFT";
    case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING:
      return "FFT_TILING";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD:
      return "WINOGRAD";
    case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED:
      return "WINOGRAD_NONFUSED";
    default:
      return "?";
  }
}
const char* backward_data_algo_name(cudnnConvolutionBwdDataAlgo_t algo) {
  switch (algo) {
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0:
      return "ALGO_0";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1:
      return "ALGO_1";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT:
      return "FFT";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING:
      return "FFT_TILING";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD:
      return "WINOGRAD";
    case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED:
      return "WINOGRAD_NONFUSED";
    default:
      return "?";
  }
}
const char* backward_filter_algo_name(cudnnConvolutionBwdFilterAlgo_t algo) {
  switch (algo) {
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0:
      return "ALGO_0";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1:
      return "ALGO_1";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT:
      return "FFT";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3:
      return "ALGO_3";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED:
      return "WINOGRAD_NONFUSED";
    case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING:
      return "FFT_TILING";
    default:
      return "?";
  }
}

bool is_transform(cudnnConvolutionFwdAlgo_t algo) {
  return algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT || algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD ||
         algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
bool is_transform(cudnnConvolutionBwdDataAlgo_t algo) {
  return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT ||
         algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
         algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
bool is_transform(cudnnConvolutionBwdFilterAlgo_t algo) {
  return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT ||
         algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
         algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}

// The first of COUNT ranked heuristic results (best first) that succeeded, is deterministic and
// whose workspace, asked of cuDNN by WORKSPACE_OF, is at most LIMIT bytes; its index, or -1.
// Under 16-bit storage CONV takes each result's math type (tensor cores or not) before the
// query, and ends with the chosen one's; under f32 (FMA_ONLY) it keeps CUDNN_FMA_MATH, since a
// result's DEFAULT_MATH would let cuDNN use TF32 on Ampere and later.
// Under f32 the transform algorithms (FFT, Winograd) are passed over too: their rounding error
// grows with the transform, and f32 is the precision the others are checked against; under
// 16-bit storage they compute in f32, far below the 16-bit rounding.
template <class Perf, class WorkspaceOf>
int choose(const std::vector<Perf>& results, int count, cudnnConvolutionDescriptor_t conv,
           bool fma_only, std::size_t limit, WorkspaceOf workspace_of, std::size_t& bytes) {
  for (int i = 0; i < count; ++i) {
    const Perf& r = results[static_cast<std::size_t>(i)];
    if (r.status != CUDNN_STATUS_SUCCESS || r.determinism != CUDNN_DETERMINISTIC) continue;
    if (fma_only && is_transform(r.algo)) continue;
    // A result ranked for tensor-op math may not run under the descriptor's FMA math; skipping
    // it here keeps the planned fallback (the next result, or im2col) instead of an abort later.
    if (fma_only &&
        (r.mathType == CUDNN_TENSOR_OP_MATH || r.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION))
      continue;
    if (!fma_only) MPT_CHECK_CUDNN(cudnnSetConvolutionMathType(conv, r.mathType));
    std::size_t size = 0;
    if (workspace_of(r.algo, size) != CUDNN_STATUS_SUCCESS || size > limit) continue;
    bytes = size;
    return i;
  }
  return -1;
}

// The bias gradient: per channel, SLICES blocks each sum a contiguous part of the (sample,
// position) pairs in f32 (a fixed order: a tree over the block's lanes), then one thread per
// channel adds its slices in order. The slicing depends on the shape only, so the bits do not
// change from run to run or GPU to GPU.
constexpr int kMaxBiasSlices = 64;

int bias_slices(std::int64_t samples, std::int64_t positions) {
  const std::int64_t slices = samples * positions / 4096;
  return static_cast<int>(std::clamp<std::int64_t>(slices, 1, kMaxBiasSlices));
}

template <class Load>
__global__ void channel_sum_partials(Load load, std::int64_t channels, std::int64_t positions,
                                     std::int64_t total, int slices, float* partials) {
  const std::int64_t channel = blockIdx.x;
  const SliceRange range = slice_range(total, slices);
  float sum = 0.f;
  for_channel_slice(channel, channels, positions, range.begin, range.end,
                    [&](std::int64_t i) { sum += load(i); });
  __shared__ float lanes[kThreads];
  lanes[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) lanes[threadIdx.x] += lanes[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[channel * slices + blockIdx.y] = lanes[0];
}

template <class Store>
__global__ void channel_sum_finish(const float* partials, std::int64_t channels, int slices,
                                   Store store) {
  const std::int64_t channel = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (channel >= channels) return;
  float sum = 0.f;
  for (int i = 0; i < slices; ++i) sum += partials[channel * slices + i];
  store(channel, sum);
}

bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

int as_int(std::int64_t v) {
  if (v > INT_MAX) abort_job(std::string(kOp) + ": a dimension does not fit cuDNN's int");
  return static_cast<int>(v);
}

}  // namespace

struct CudnnConv2d::State {
  Conv2dGeometry geometry;
  std::int64_t out_channels = 0, max_batch = 0;
  DType dtype = DType::f32;
  bool relu = false;
  cudnnHandle_t handle = nullptr;
  cudnnFilterDescriptor_t weight = nullptr;
  std::vector<BatchPlan> plans;  // plans[0] is the planned batch's
  // The shared scratch, from the front (each region 256-byte aligned): X rounded to DTYPE (when
  // X comes in f32; later an f32 dx before widening), DY masked by the ReLU, the bias sums'
  // partials, an aligned copy of the weight and of its gradient (used only when the model's
  // flat parameter buffers put them off a 16-byte boundary, which cuDNN's vectorised kernels
  // may not accept), then the algorithms' workspace.
  std::size_t x_offset = 0, dy_offset = 0, partials_offset = 0, weight_offset = 0,
              weight_grad_offset = 0, workspace_offset = 0, reserved = 0;
  std::string why_not;

  ~State() {
    for (BatchPlan& plan : plans) destroy(plan);
    if (weight) cudnnDestroyFilterDescriptor(weight);
  }

  // Descriptors and algorithms for BATCH samples, each algorithm's workspace at most LIMIT
  // bytes; false (with why_not) when cuDNN has no algorithm for one of the three directions.
  bool make_plan(std::int64_t batch, std::size_t limit, BatchPlan& plan) {
    const Conv2dGeometry& g = geometry;
    const cudnnDataType_t type = cudnn_data_type(dtype);
    plan.batch = batch;
    MPT_CHECK_CUDNN(cudnnCreateTensorDescriptor(&plan.x));
    MPT_CHECK_CUDNN(cudnnSetTensor4dDescriptor(plan.x, CUDNN_TENSOR_NCHW, type, as_int(batch),
                                               as_int(g.channels), as_int(g.height),
                                               as_int(g.width)));
    MPT_CHECK_CUDNN(cudnnCreateTensorDescriptor(&plan.y));
    MPT_CHECK_CUDNN(cudnnSetTensor4dDescriptor(plan.y, CUDNN_TENSOR_NCHW, type, as_int(batch),
                                               as_int(out_channels), as_int(g.out_height()),
                                               as_int(g.out_width())));
    // Cross-correlation (no kernel flip), as PyTorch's Conv2d and the im2col path; FP32 compute
    // for every storage dtype (cuDNN's PSEUDO_HALF / PSEUDO_BFLOAT16 configurations).
    const cudnnMathType_t math = dtype == DType::f32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
    for (auto* conv : {&plan.forward, &plan.backward_data, &plan.backward_filter}) {
      MPT_CHECK_CUDNN(cudnnCreateConvolutionDescriptor(conv));
      MPT_CHECK_CUDNN(cudnnSetConvolution2dDescriptor(*conv, as_int(g.pad), as_int(g.pad),
                                                      as_int(g.stride), as_int(g.stride), 1, 1,
                                                      CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      MPT_CHECK_CUDNN(cudnnSetConvolutionMathType(*conv, math));
    }
    int n = 0, c = 0, h = 0, w = 0;
    MPT_CHECK_CUDNN(
        cudnnGetConvolution2dForwardOutputDim(plan.forward, plan.x, weight, &n, &c, &h, &w));
    if (n != batch || c != out_channels || h != g.out_height() || w != g.out_width())
      abort_job(std::string(kOp) + ": cuDNN's output shape differs from Conv2dGeometry's");

    std::size_t forward_bytes = 0, data_bytes = 0, filter_bytes = 0;
    {
      int max_count = 0, count = 0;
      MPT_CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> results(static_cast<std::size_t>(max_count));
      MPT_CHECK_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(
          handle, plan.x, weight, plan.forward, plan.y, max_count, &count, results.data()));
      const int chosen = choose(
          results, count, plan.forward, dtype == DType::f32, limit,
          [&](cudnnConvolutionFwdAlgo_t algo, std::size_t& size) {
            return cudnnGetConvolutionForwardWorkspaceSize(handle, plan.x, weight, plan.forward,
                                                           plan.y, algo, &size);
          },
          forward_bytes);
      if (chosen < 0) return fail("forward", batch);
      plan.forward_algo = results[static_cast<std::size_t>(chosen)].algo;
    }
    {
      int max_count = 0, count = 0;
      MPT_CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> results(static_cast<std::size_t>(max_count));
      MPT_CHECK_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7(
          handle, weight, plan.y, plan.backward_data, plan.x, max_count, &count, results.data()));
      const int chosen = choose(
          results, count, plan.backward_data, dtype == DType::f32, limit,
          [&](cudnnConvolutionBwdDataAlgo_t algo, std::size_t& size) {
            return cudnnGetConvolutionBackwardDataWorkspaceSize(
                handle, weight, plan.y, plan.backward_data, plan.x, algo, &size);
          },
          data_bytes);
      if (chosen < 0) return fail("backward data", batch);
      plan.backward_data_algo = results[static_cast<std::size_t>(chosen)].algo;
    }
    {
      int max_count = 0, count = 0;
      MPT_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> results(static_cast<std::size_t>(max_count));
      MPT_CHECK_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
          handle, plan.x, plan.y, plan.backward_filter, weight, max_count, &count, results.data()));
      const int chosen = choose(
          results, count, plan.backward_filter, dtype == DType::f32, limit,
          [&](cudnnConvolutionBwdFilterAlgo_t algo, std::size_t& size) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(
                handle, plan.x, plan.y, plan.backward_filter, weight, algo, &size);
          },
          filter_bytes);
      if (chosen < 0) return fail("backward filter", batch);
      plan.backward_filter_algo = results[static_cast<std::size_t>(chosen)].algo;
    }
    plan.workspace = std::max({forward_bytes, data_bytes, filter_bytes});
    return true;
  }

  bool fail(const char* direction, std::int64_t batch) {
    why_not = std::string("cuDNN has no deterministic ") + direction + " algorithm for batch " +
              std::to_string(batch) + " in " + dtype_name(dtype);
    return false;
  }

  // The plan for BATCH samples: the planned one, or one made now within the workspace already
  // reserved (a short last batch; made once, then kept).
  const BatchPlan& plan_for(std::int64_t batch) {
    for (const BatchPlan& plan : plans)
      if (plan.batch == batch) return plan;
    BatchPlan plan;
    const std::size_t scratch = cudnn_scratch_bytes();
    const std::size_t limit = scratch > workspace_offset ? scratch - workspace_offset : 0;
    if (!make_plan(batch, std::min(limit, kMaxAlgorithmWorkspace), plan)) {
      destroy(plan);
      abort_job(std::string(kOp) + ": " + why_not + " within the " + std::to_string(limit) +
                " bytes of workspace planned for batch " + std::to_string(max_batch));
    }
    plans.push_back(plan);
    return plans.back();
  }
};

CudnnConv2d::CudnnConv2d() = default;
CudnnConv2d::~CudnnConv2d() = default;
CudnnConv2d::CudnnConv2d(CudnnConv2d&&) noexcept = default;
CudnnConv2d& CudnnConv2d::operator=(CudnnConv2d&&) noexcept = default;

bool CudnnConv2d::plan(const Conv2dGeometry& g, std::int64_t out_channels, std::int64_t max_batch,
                       DType dtype, bool relu) {
  if (!is_float_dtype(dtype) || max_batch < 1 || out_channels < 1)
    abort_job(std::string(kOp) + "::plan: needs f32, f16 or bf16, a positive batch and channels");
  state_ = std::make_unique<State>();
  State& s = *state_;
  s.handle = cudnn_handle();
  s.geometry = g;
  s.out_channels = out_channels;
  s.max_batch = max_batch;
  s.dtype = dtype;
  s.relu = relu;
  const cudnnDataType_t type = cudnn_data_type(dtype);
  MPT_CHECK_CUDNN(cudnnCreateFilterDescriptor(&s.weight));
  MPT_CHECK_CUDNN(cudnnSetFilter4dDescriptor(s.weight, type, CUDNN_TENSOR_NCHW,
                                             as_int(out_channels), as_int(g.channels),
                                             as_int(g.kernel), as_int(g.kernel)));
  const std::size_t element = dtype_size(dtype);
  const auto bytes = [&](std::int64_t elements) {
    return cudnn_align(static_cast<std::size_t>(elements) * element);
  };
  const std::int64_t in = g.channels * g.height * g.width;
  const std::int64_t out = out_channels * g.col_columns();
  // cuDNN's convolution kernels index a tensor with 32-bit integers: a larger batch keeps the
  // im2col path (as PyTorch splits such a batch).
  if (max_batch * std::max(in, out) > INT_MAX) {
    s.why_not = "a batch of " + std::to_string(max_batch) + " has over 2^31 elements in a tensor";
    return false;
  }
  s.x_offset = 0;
  s.dy_offset = s.x_offset + (dtype == DType::f32 ? 0 : bytes(max_batch * in));
  s.partials_offset = s.dy_offset + (relu ? bytes(max_batch * out) : 0);
  s.weight_offset = s.partials_offset + cudnn_align(static_cast<std::size_t>(out_channels) *
                                                    kMaxBiasSlices * sizeof(float));
  s.weight_grad_offset = s.weight_offset + bytes(out_channels * g.col_rows());
  s.workspace_offset = s.weight_grad_offset + bytes(out_channels * g.col_rows());
  BatchPlan plan;
  if (!s.make_plan(max_batch, kMaxAlgorithmWorkspace, plan)) {
    destroy(plan);  // no plan kept: planned() is false and describe() says why
    return false;
  }
  s.plans.push_back(plan);
  s.reserved = s.workspace_offset + cudnn_align(plan.workspace);
  reserve_cudnn_scratch(s.reserved);
  return true;
}

bool CudnnConv2d::planned() const { return state_ && !state_->plans.empty(); }

namespace {

// X rounded from f32 to the 16-bit DTYPE into DST (the model's f32 input under 16-bit
// storage, as autocast rounds it).
const void* round_input(const char* op, const Tensor& x, DType dtype, std::byte* dst) {
  const float* src = x.data<float>();
  auto* out = reinterpret_cast<std::uint16_t*>(dst);
  const bool f16 = dtype == DType::f16;
  launch_elementwise(op, x.numel(),
                     [=] __device__(std::int64_t i) { out[i] = round16(src[i], f16); });
  return out;
}

}  // namespace

void CudnnConv2d::validate(const char* op, const Tensor& x, const Tensor& weight) const {
  if (!planned()) abort_job(std::string(op) + ": plan() first (" + describe() + ")");
  const State& s = *state_;
  const Conv2dGeometry& g = s.geometry;
  const std::int64_t in = g.channels * g.height * g.width;
  detail::require(x.defined() && x.device() == Device::cuda && x.rank() > 0 &&
                      (x.dtype() == s.dtype || x.dtype() == DType::f32) &&
                      x.numel() == x.dim(0) * in && x.dim(0) <= s.max_batch,
                  op,
                  "x must be [n <= planned batch, C, H, W] on the cuda device, in the planned "
                  "dtype or f32",
                  x);
  require_cuda(op, "weight must be in the planned dtype on the cuda device", weight, s.dtype);
  detail::require(weight.numel() == s.out_channels * g.col_rows(), op,
                  "weight must hold K*C*k*k elements", weight);
}

void CudnnConv2d::forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y) {
  constexpr const char* op = "kernels::cuda::CudnnConv2d::forward";
  validate(op, x, weight);
  State& s = *state_;
  const std::int64_t n = x.dim(0), positions = s.geometry.col_columns();
  const std::int64_t out = s.out_channels * positions;
  require_cuda(op, "bias must be f32 [K] on the cuda device", bias, DType::f32);
  detail::require(bias.numel() == s.out_channels, op, "bias must hold K elements", bias);
  require_cuda(op, "y must be in the planned dtype on the cuda device", y, s.dtype);
  detail::require_pair(y.numel() == n * out, op, "y must be [n, K, OH, OW] for x's n", x, y);
  detail::require_disjoint(op, "y must not overlap x", x, y);
  detail::require_disjoint(op, "y must not overlap weight", weight, y);
  if (n == 0) return;
  const BatchPlan& plan = s.plan_for(n);
  const cudnnHandle_t handle = cudnn_handle();  // bound to stream() on every call
  auto* scratch = static_cast<std::byte*>(cudnn_scratch());
  const void* x_data =
      x.dtype() == s.dtype ? x.raw() : round_input(op, x, s.dtype, scratch + s.x_offset);
  const void* w_data = weight.raw();
  if (!aligned16(w_data)) {
    MPT_CHECK_CUDA(cudaMemcpyAsync(scratch + s.weight_offset, w_data, weight.size_bytes(),
                                   cudaMemcpyDeviceToDevice, stream()));
    w_data = scratch + s.weight_offset;
  }
  const float one = 1.f, zero = 0.f;  // float scaling factors for f32, f16 and bf16 tensors
  MPT_CHECK_CUDNN(cudnnConvolutionForward(
      handle, &one, plan.x, x_data, s.weight, w_data, plan.forward, plan.forward_algo,
      scratch + s.workspace_offset, plan.workspace, &zero, plan.y, y.raw()));
  // The bias (and the ReLU: v < 0 ? 0 : v, so a NaN stays) in one pass over y, in f32.
  const float* b = bias.data<float>();
  const std::int64_t channels = s.out_channels;
  const bool relu = s.relu, f16 = s.dtype == DType::f16;
  if (s.dtype == DType::f32) {
    float* out_data = y.data<float>();
    launch_channel_elementwise(op, n * out, positions, channels,
                               [=] __device__(std::int64_t i, std::int64_t c) {
                                 const float v = out_data[i] + b[c];
                                 out_data[i] = relu && v < 0.f ? 0.f : v;
                               });
  } else {
    auto* out_data = static_cast<std::uint16_t*>(y.raw());
    launch_channel_elementwise(op, n * out, positions, channels,
                               [=] __device__(std::int64_t i, std::int64_t c) {
                                 const float v = widen16(out_data[i], f16) + b[c];
                                 out_data[i] = round16(relu && v < 0.f ? 0.f : v, f16);
                               });
  }
}

void CudnnConv2d::backward(const Tensor& x, const Tensor& weight, const Tensor& y, const Tensor& dy,
                           Tensor& weight_grad, Tensor& bias_grad, Tensor* dx) {
  constexpr const char* op = "kernels::cuda::CudnnConv2d::backward";
  validate(op, x, weight);
  State& s = *state_;
  const std::int64_t n = x.dim(0), positions = s.geometry.col_columns();
  const std::int64_t out = s.out_channels * positions;
  require_cuda(op, "dy must be in the planned dtype on the cuda device", dy, s.dtype);
  detail::require_pair(dy.numel() == n * out, op, "dy must be [n, K, OH, OW] for x's n", x, dy);
  if (s.relu) {
    require_cuda(op, "y (the forward's output) must be in the planned dtype", y, s.dtype);
    detail::require_pair(y.numel() == dy.numel(), op, "y and dy must have the same shape", y, dy);
  }
  require_cuda(op, "weight_grad must be in the planned dtype on the cuda device", weight_grad,
               s.dtype);
  detail::require(weight_grad.numel() == weight.numel(), op, "weight_grad must be weight's size",
                  weight_grad);
  detail::require(bias_grad.defined() && bias_grad.device() == Device::cuda &&
                      (bias_grad.dtype() == s.dtype || bias_grad.dtype() == DType::f32) &&
                      bias_grad.numel() == s.out_channels,
                  op, "bias_grad must be [K] on the cuda device, planned dtype or f32", bias_grad);
  if (dx)
    detail::require_pair(dx->defined() && dx->device() == Device::cuda &&
                             dx->dtype() == x.dtype() && dx->numel() == x.numel(),
                         op, "dx must be shaped like x, with x's dtype", x, *dx);
  detail::require_disjoint(op, "weight_grad must not overlap x", x, weight_grad);
  detail::require_disjoint(op, "weight_grad must not overlap dy", dy, weight_grad);
  detail::require_disjoint(op, "bias_grad must not overlap dy", dy, bias_grad);
  if (dx) {
    detail::require_disjoint(op, "dx must not overlap dy", dy, *dx);
    detail::require_disjoint(op, "dx must not overlap weight", weight, *dx);
    detail::require_disjoint(op, "dx must not overlap weight_grad", weight_grad, *dx);
  }
  if (n == 0) {  // sums over no samples
    zero_on_stream(weight_grad);
    zero_on_stream(bias_grad);
    return;
  }
  const BatchPlan& plan = s.plan_for(n);
  const cudnnHandle_t handle = cudnn_handle();
  auto* scratch = static_cast<std::byte*>(cudnn_scratch());
  void* workspace = scratch + s.workspace_offset;
  const bool f16 = s.dtype == DType::f16;
  const float one = 1.f, zero = 0.f;

  // With the ReLU fused, dy is the ReLU's output gradient: 0 where y is not > 0 (the bit test
  // of kernels::relu_backward on 16-bit storage: +0, negatives and NaN fail it).
  const void* dy_data = dy.raw();
  if (s.relu) {
    if (s.dtype == DType::f32) {
      const float* out_data = y.data<float>();
      const float* grad = dy.data<float>();
      auto* masked = reinterpret_cast<float*>(scratch + s.dy_offset);
      launch_elementwise(op, n * out, [=] __device__(std::int64_t i) {
        masked[i] = out_data[i] > 0.f ? grad[i] : 0.f;
      });
      dy_data = masked;
    } else {
      const auto* out_data = static_cast<const std::uint16_t*>(y.raw());
      const auto* grad = static_cast<const std::uint16_t*>(dy.raw());
      auto* masked = reinterpret_cast<std::uint16_t*>(scratch + s.dy_offset);
      const std::uint16_t inf = f16 ? 0x7c00u : 0x7f80u;
      launch_elementwise(op, n * out, [=] __device__(std::int64_t i) {
        masked[i] = static_cast<std::uint16_t>(out_data[i] - 1u) < inf ? grad[i] : std::uint16_t{0};
      });
      dy_data = masked;
    }
  }

  // db[k] = the sum of dy over samples and positions, in f32, rounded once.
  const std::int64_t channels = s.out_channels;
  const int slices = bias_slices(n, positions);
  auto* partials = reinterpret_cast<float*>(scratch + s.partials_offset);
  const dim3 grid(static_cast<unsigned>(channels), static_cast<unsigned>(slices));
  if (s.dtype == DType::f32) {
    const auto* grad = static_cast<const float*>(dy_data);
    channel_sum_partials<<<grid, kThreads, 0, stream()>>>(
        [=] __device__(std::int64_t i) { return grad[i]; }, channels, positions, n * positions,
        slices, partials);
  } else {
    const auto* grad = static_cast<const std::uint16_t*>(dy_data);
    channel_sum_partials<<<grid, kThreads, 0, stream()>>>(
        [=] __device__(std::int64_t i) { return widen16(grad[i], f16); }, channels, positions,
        n * positions, slices, partials);
  }
  check_launch(op);
  const unsigned finish_blocks = static_cast<unsigned>((channels + kThreads - 1) / kThreads);
  if (bias_grad.dtype() == DType::f32) {
    float* db = bias_grad.data<float>();
    channel_sum_finish<<<finish_blocks, kThreads, 0, stream()>>>(
        partials, channels, slices, [=] __device__(std::int64_t c, float v) { db[c] = v; });
  } else {
    auto* db = static_cast<std::uint16_t*>(bias_grad.raw());
    const bool db_f16 = bias_grad.dtype() == DType::f16;
    channel_sum_finish<<<finish_blocks, kThreads, 0, stream()>>>(
        partials, channels, slices,
        [=] __device__(std::int64_t c, float v) { db[c] = round16(v, db_f16); });
  }
  check_launch(op);

  // dW = dy ⋆ x, overwritten (beta 0): cuDNN sums over the batch in f32 and rounds once.
  const void* x_data =
      x.dtype() == s.dtype ? x.raw() : round_input(op, x, s.dtype, scratch + s.x_offset);
  const bool dw_aligned = aligned16(weight_grad.raw());
  void* dw_data = dw_aligned ? weight_grad.raw() : scratch + s.weight_grad_offset;
  MPT_CHECK_CUDNN(cudnnConvolutionBackwardFilter(
      handle, &one, plan.x, x_data, plan.y, dy_data, plan.backward_filter,
      plan.backward_filter_algo, workspace, plan.workspace, &zero, s.weight, dw_data));
  if (!dw_aligned)
    MPT_CHECK_CUDA(cudaMemcpyAsync(weight_grad.raw(), dw_data, weight_grad.size_bytes(),
                                   cudaMemcpyDeviceToDevice, stream()));
  if (!dx) return;
  const void* w_data = weight.raw();
  if (!aligned16(w_data)) {
    MPT_CHECK_CUDA(cudaMemcpyAsync(scratch + s.weight_offset, w_data, weight.size_bytes(),
                                   cudaMemcpyDeviceToDevice, stream()));
    w_data = scratch + s.weight_offset;
  }
  // An f32 dx (of an f32 x) is computed in the planned dtype where the rounded x was, then
  // widened.
  const bool widen = dx->dtype() != s.dtype;
  void* dx_data = widen ? static_cast<void*>(scratch + s.x_offset) : dx->raw();
  MPT_CHECK_CUDNN(cudnnConvolutionBackwardData(handle, &one, s.weight, w_data, plan.y, dy_data,
                                               plan.backward_data, plan.backward_data_algo,
                                               workspace, plan.workspace, &zero, plan.x, dx_data));
  if (widen) {
    const auto* src = static_cast<const std::uint16_t*>(dx_data);
    float* dst = dx->data<float>();
    launch_elementwise(op, x.numel(),
                       [=] __device__(std::int64_t i) { dst[i] = widen16(src[i], f16); });
  }
}

std::string CudnnConv2d::describe() const {
  if (!state_) return "not planned";
  if (!planned()) return state_->why_not;
  const BatchPlan& plan = state_->plans.front();
  return std::string("fwd=") + forward_algo_name(plan.forward_algo) +
         " bwd_data=" + backward_data_algo_name(plan.backward_data_algo) +
         " bwd_filter=" + backward_filter_algo_name(plan.backward_filter_algo) +
         " workspace=" + std::to_string(plan.workspace);
}

std::int64_t CudnnConv2d::scratch_bytes() const {
  return planned() ? static_cast<std::int64_t>(state_->reserved) : 0;
}

}  // namespace mpt::kernels::cuda
