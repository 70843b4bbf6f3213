// Host ReLU forward and backward (see kernels/relu.hpp). On 16-bit storage the sign test reads
// the bits directly: widening, max(x, 0) and rounding back would give the same bits, since every
// 16-bit value is exact in f32 and ReLU only ever outputs its input or zero.
#include "kernels/relu.hpp"

#include <cstdint>

#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

namespace {

bool is_relu_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16;
}

// The bits of +Inf; larger magnitudes are NaN.
std::uint16_t infinity_bits(DType dtype) { return dtype == DType::f16 ? 0x7c00u : 0x7f80u; }

void check(const char* op, const char* what, const Tensor& t, DType dtype) {
  detail::require(
      t.defined() && t.device() == Device::cpu && t.dtype() == dtype && is_relu_dtype(dtype), op,
      what, t);
}

}  // namespace

void relu_forward(const Tensor& x, Tensor& y) {
  static const std::string label = "kernels::relu_forward";
  constexpr const char* op = "kernels::relu_forward";
  check(op, "x must be f32, f16 or bf16 on the host", x, x.dtype());
  check(op, "y must have x's dtype", y, x.dtype());
  detail::require_pair(x.numel() == y.numel(), op, "x and y must have the same number of elements",
                       x, y);
  if (x.dtype() != DType::f32) {
    const auto* in = static_cast<const std::uint16_t*>(x.raw());
    auto* out = static_cast<std::uint16_t*>(y.raw());
    const std::uint16_t inf = infinity_bits(x.dtype());
    parallel_chunks(label, x.numel(), [=](std::int64_t begin, std::int64_t end) {
      // Negative and not NaN: bits in [0x8001, 0x8000 + inf]. -0 and NaN pass through, as below.
      for (std::int64_t i = begin; i < end; ++i) {
        const std::uint16_t bits = in[i];
        out[i] = static_cast<std::uint16_t>(bits - 0x8001u) < inf ? std::uint16_t{0} : bits;
      }
    });
    return;
  }
  // No __restrict: x and y may alias (in-place ReLU); an elementwise loop is safe either way.
  const float* in = x.data<float>();
  float* out = y.data<float>();
  parallel_chunks(label, x.numel(), [=](std::int64_t begin, std::int64_t end) {
    // "x < 0 ? 0 : x" rather than max(x, 0): a NaN stays NaN, like PyTorch's relu.
    for (std::int64_t i = begin; i < end; ++i) out[i] = in[i] < 0.f ? 0.f : in[i];
  });
}

void relu_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  static const std::string label = "kernels::relu_backward";
  constexpr const char* op = "kernels::relu_backward";
  check(op, "y must be f32, f16 or bf16 on the host", y, y.dtype());
  check(op, "dy must have y's dtype", dy, y.dtype());
  check(op, "dx must have y's dtype", dx, y.dtype());
  detail::require_pair(y.numel() == dy.numel(), op,
                       "y and dy must have the same number of elements", y, dy);
  detail::require_pair(dy.numel() == dx.numel(), op,
                       "dy and dx must have the same number of elements", dy, dx);
  if (y.dtype() != DType::f32) {
    const auto* __restrict out = static_cast<const std::uint16_t*>(y.raw());
    const auto* grad_out = static_cast<const std::uint16_t*>(dy.raw());  // may alias dx
    auto* grad_in = static_cast<std::uint16_t*>(dx.raw());
    const std::uint16_t inf = infinity_bits(y.dtype());
    parallel_chunks(label, y.numel(), [=](std::int64_t begin, std::int64_t end) {
      // y > 0 exactly when its bits lie in [1, inf]: positive, non-zero, not NaN.
      for (std::int64_t i = begin; i < end; ++i) {
        const std::uint16_t g = grad_out[i];
        grad_in[i] = static_cast<std::uint16_t>(out[i] - 1u) < inf ? g : std::uint16_t{0};
      }
    });
    return;
  }
  const float* __restrict out = y.data<float>();
  const float* grad_out = dy.data<float>();  // may alias dx
  float* grad_in = dx.data<float>();
  parallel_chunks(label, y.numel(), [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) {
      // Load unconditionally: a load under the condition would block if-conversion to a blend.
      const float g = grad_out[i];
      grad_in[i] = out[i] > 0.f ? g : 0.f;
    }
  });
}

}  // namespace mpt::kernels::host
