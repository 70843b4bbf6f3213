// Pooling through cuDNN (see CudnnPool2d in kernels/pool2d.hpp): one pooling descriptor per
// plan and a pair of tensor descriptors per batch size, made the first time that size is seen.
#include <climits>
#include <vector>

#include "kernels/cuda/cudnn.cuh"
#include "kernels/pool2d.hpp"

namespace mpt::kernels::cuda {
namespace {

constexpr const char* kOp = "kernels::cuda::CudnnPool2d";

int as_int(std::int64_t v) {
  if (v > INT_MAX) abort_job(std::string(kOp) + ": a dimension does not fit cuDNN's int");
  return static_cast<int>(v);
}

struct BatchDescriptors {
  std::int64_t batch = 0;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
};

}  // namespace

struct CudnnPool2d::State {
  Pool2dGeometry geometry;
  std::int64_t channels = 0;
  DType dtype = DType::f32;
  cudnnPoolingDescriptor_t pooling = nullptr;
  std::vector<BatchDescriptors> batches;

  ~State() {
    for (BatchDescriptors& b : batches) {
      if (b.x) cudnnDestroyTensorDescriptor(b.x);
      if (b.y) cudnnDestroyTensorDescriptor(b.y);
    }
    if (pooling) cudnnDestroyPoolingDescriptor(pooling);
  }

  const BatchDescriptors& descriptors(std::int64_t batch) {
    for (const BatchDescriptors& b : batches)
      if (b.batch == batch) return b;
    const Pool2dGeometry& g = geometry;
    const cudnnDataType_t type = cudnn_data_type(dtype);
    BatchDescriptors b;
    b.batch = batch;
    MPT_CHECK_CUDNN(cudnnCreateTensorDescriptor(&b.x));
    MPT_CHECK_CUDNN(cudnnCreateTensorDescriptor(&b.y));
    batches.push_back(b);  // owned from here, so a failure below leaks nothing
    MPT_CHECK_CUDNN(cudnnSetTensor4dDescriptor(b.x, CUDNN_TENSOR_NCHW, type, as_int(batch),
                                               as_int(channels), as_int(g.height),
                                               as_int(g.width)));
    MPT_CHECK_CUDNN(cudnnSetTensor4dDescriptor(b.y, CUDNN_TENSOR_NCHW, type, as_int(batch),
                                               as_int(channels), as_int(g.out_height()),
                                               as_int(g.out_width())));
    int n = 0, c = 0, h = 0, w = 0;
    MPT_CHECK_CUDNN(cudnnGetPooling2dForwardOutputDim(pooling, b.x, &n, &c, &h, &w));
    if (n != batch || c != channels || h != g.out_height() || w != g.out_width())
      abort_job(std::string(kOp) + ": cuDNN's output shape differs from Pool2dGeometry's");
    return batches.back();
  }

  void check(const char* op, const char* what, const Tensor& t, std::int64_t per_sample,
             std::int64_t batch) const {
    require_cuda(op, what, t, dtype);
    detail::require(t.numel() == batch * per_sample, op, what, t);
  }
};

CudnnPool2d::CudnnPool2d() = default;
CudnnPool2d::~CudnnPool2d() = default;
CudnnPool2d::CudnnPool2d(CudnnPool2d&&) noexcept = default;
CudnnPool2d& CudnnPool2d::operator=(CudnnPool2d&&) noexcept = default;

void CudnnPool2d::plan(const Pool2dGeometry& g, std::int64_t channels, DType dtype, bool max) {
  if (!is_float_dtype(dtype) || channels < 1)
    abort_job(std::string(kOp) + "::plan: needs f32, f16 or bf16 and channels");
  state_ = std::make_unique<State>();
  State& s = *state_;
  s.geometry = g;
  s.channels = channels;
  s.dtype = dtype;
  cudnn_handle();  // created now, at plan time
  MPT_CHECK_CUDNN(cudnnCreatePoolingDescriptor(&s.pooling));
  // No padding; average over the whole window (there is no padding to exclude). The
  // deterministic max mode: plain CUDNN_POOLING_MAX adds gradients with atomics.
  MPT_CHECK_CUDNN(cudnnSetPooling2dDescriptor(
      s.pooling,
      max ? CUDNN_POOLING_MAX_DETERMINISTIC : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
      CUDNN_PROPAGATE_NAN, as_int(g.kernel_h), as_int(g.kernel_w), 0, 0, as_int(g.stride),
      as_int(g.stride)));
}

bool CudnnPool2d::planned() const { return state_ != nullptr; }

void CudnnPool2d::forward(const Tensor& x, Tensor& y) {
  constexpr const char* op = "kernels::cuda::CudnnPool2d::forward";
  if (!planned()) abort_job(std::string(op) + ": plan() first");
  State& s = *state_;
  const Pool2dGeometry& g = s.geometry;
  const std::int64_t n = x.defined() && x.rank() > 0 ? x.dim(0) : 0;
  s.check(op, "x must be [n, C, H, W] in the planned dtype on the cuda device", x,
          s.channels * g.height * g.width, n);
  s.check(op, "y must be [n, C, OH, OW] in the planned dtype on the cuda device", y,
          s.channels * g.out_height() * g.out_width(), n);
  detail::require_disjoint(op, "y must not overlap x", x, y);
  if (n == 0) return;
  const BatchDescriptors& d = s.descriptors(n);
  const float one = 1.f, zero = 0.f;  // float scaling factors for f32, f16 and bf16 tensors
  MPT_CHECK_CUDNN(
      cudnnPoolingForward(cudnn_handle(), s.pooling, &one, d.x, x.raw(), &zero, d.y, y.raw()));
}

void CudnnPool2d::backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) {
  constexpr const char* op = "kernels::cuda::CudnnPool2d::backward";
  if (!planned()) abort_job(std::string(op) + ": plan() first");
  State& s = *state_;
  const Pool2dGeometry& g = s.geometry;
  const std::int64_t n = x.defined() && x.rank() > 0 ? x.dim(0) : 0;
  const std::int64_t in = s.channels * g.height * g.width;
  const std::int64_t out = s.channels * g.out_height() * g.out_width();
  s.check(op, "x must be [n, C, H, W] in the planned dtype on the cuda device", x, in, n);
  s.check(op, "y must be the forward's output, in the planned dtype", y, out, n);
  s.check(op, "dy must be shaped like y, in the planned dtype", dy, out, n);
  s.check(op, "dx must be shaped like x, in the planned dtype", dx, in, n);
  detail::require_disjoint(op, "dx must not overlap x", x, dx);
  detail::require_disjoint(op, "dx must not overlap y", y, dx);
  detail::require_disjoint(op, "dx must not overlap dy", dy, dx);
  if (n == 0) return;
  const BatchDescriptors& d = s.descriptors(n);
  const float one = 1.f, zero = 0.f;
  MPT_CHECK_CUDNN(cudnnPoolingBackward(cudnn_handle(), s.pooling, &one, d.y, y.raw(), d.y, dy.raw(),
                                       d.x, x.raw(), &zero, d.x, dx.raw()));
}

}  // namespace mpt::kernels::cuda
