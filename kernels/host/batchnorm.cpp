// Host batch normalisation kernels (see kernels/batchnorm.hpp). Reductions run one channel per
// task over its N planes, so no two tasks write the same sum; the elementwise passes run over
// blocks of whole planes. Every plane is read in blocks of kIoBlock elements as f32.
#include "kernels/batchnorm.hpp"

#include <algorithm>
#include <cmath>

#include "kernels/host/float_io.hpp"
#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

namespace {

void check_batch(const char* op, const char* what, const Tensor& t, std::int64_t channels) {
  kernels::detail::require(t.defined() && t.device() == Device::cpu && is_float_dtype(t.dtype()) &&
                               t.rank() >= 1 && channels > 0 && t.numel() % channels == 0,
                           op, what, t);
}
void check_channels(const char* op, const char* what, const Tensor& t, std::int64_t channels) {
  kernels::detail::require(
      t.defined() && t.device() == Device::cpu && t.dtype() == DType::f32 && t.numel() >= channels,
      op, what, t);
}
void check_same(const char* op, const Tensor& a, const Tensor& b) {
  kernels::detail::require_pair(a.numel() == b.numel(), op,
                                "tensors must have the same element count", a, b);
}

// The batch seen as N planes per channel: planes = N*C, plane = S. BN1d ([N, C]) has S = 1.
struct Layout {
  std::int64_t planes, plane;
};
Layout layout(const Tensor& x, std::int64_t channels) {
  const std::int64_t batch = x.dim(0);
  return {batch * channels, batch == 0 ? 0 : x.numel() / (batch * channels)};
}

// Lanes of independent f32 partial sums: a fixed association order that the compiler can keep
// in one vector register (strict IEEE forbids it to reorder a single running sum).
constexpr int kLanes = 8;

// Sum of V[i] and of V[i]^2 over N (<= kIoBlock) values, in lanes, added into SUM and SQUARES.
inline void sum_and_squares(const float* v, std::int64_t n, double& sum, double& squares) {
  float s[kLanes] = {}, q[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      s[l] += v[i + l];
      q[l] += v[i + l] * v[i + l];
    }
  for (; i < n; ++i) {
    s[0] += v[i];
    q[0] += v[i] * v[i];
  }
  for (int l = 0; l < kLanes; ++l) {
    sum += s[l];
    squares += q[l];
  }
}

// Sum of G[i] and of G[i] * (V[i] - CENTRE) over N values, in lanes.
inline void sum_and_centred(const float* v, const float* g, float centre, std::int64_t n,
                            double& sum, double& centred) {
  float s[kLanes] = {}, c[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      s[l] += g[i + l];
      c[l] += g[i + l] * (v[i + l] - centre);
    }
  for (; i < n; ++i) {
    s[0] += g[i];
    c[0] += g[i] * (v[i] - centre);
  }
  for (int l = 0; l < kLanes; ++l) {
    sum += s[l];
    centred += c[l];
  }
}

}  // namespace

void batchnorm_sums(const Tensor& x, std::int64_t channels, Tensor& sums) {
  static const std::string label = "kernels::batchnorm_sums";
  constexpr const char* op = "kernels::batchnorm_sums";
  check_batch(op, "x must be [N, C, ...] f32, f16 or bf16 on the host", x, channels);
  kernels::detail::require(
      sums.defined() && sums.dtype() == DType::f32 && sums.device() == Device::cpu &&
          sums.numel() >= 2 * channels + 1,
      op, "sums must be f32 on the host with at least 2C + 1 elements", sums);
  const Layout l = layout(x, channels);
  const std::int64_t batch = x.dim(0);
  const void* in = x.raw();
  const DType dtype = x.dtype();
  float* out = sums.data<float>();
  out[2 * channels] = static_cast<float>(batch);
  parallel_rows(label, channels, batch * l.plane, [=](std::int64_t c0, std::int64_t c1) {
    float block[kIoBlock];
    for (std::int64_t c = c0; c < c1; ++c) {
      double sum = 0, squares = 0;
      for (std::int64_t n = 0; n < batch; ++n) {
        const std::int64_t base = (n * channels + c) * l.plane;
        for (std::int64_t s = 0; s < l.plane; s += kIoBlock) {
          const std::int64_t count = std::min(kIoBlock, l.plane - s);
          // f32 partial sums over at most 256 values, then double: fast and accurate to ~1e-7.
          sum_and_squares(load_f32(in, dtype, base + s, count, block), count, sum, squares);
        }
      }
      out[c] = static_cast<float>(sum);
      out[channels + c] = static_cast<float>(squares);
    }
  });
}

void batchnorm_apply(const Tensor& x, std::int64_t channels, const Tensor& scale,
                     const Tensor& shift, Tensor& y) {
  static const std::string label = "kernels::batchnorm_apply";
  constexpr const char* op = "kernels::batchnorm_apply";
  check_batch(op, "x must be [N, C, ...] f32, f16 or bf16 on the host", x, channels);
  check_batch(op, "y must be f32, f16 or bf16 on the host", y, channels);
  check_same(op, x, y);
  check_channels(op, "scale must be f32 [C]", scale, channels);
  check_channels(op, "shift must be f32 [C]", shift, channels);
  const Layout l = layout(x, channels);
  const void* in = x.raw();
  void* out = y.raw();
  const DType in_type = x.dtype(), out_type = y.dtype();
  const float* a = scale.data<float>();
  const float* b = shift.data<float>();
  parallel_rows(label, l.planes, l.plane, [=](std::int64_t p0, std::int64_t p1) {
    float in_block[kIoBlock], out_block[kIoBlock];
    for (std::int64_t p = p0; p < p1; ++p) {
      const float k = a[p % channels], d = b[p % channels];
      for (std::int64_t s = 0; s < l.plane; s += kIoBlock) {
        const std::int64_t count = std::min(kIoBlock, l.plane - s);
        const std::int64_t at = p * l.plane + s;
        const float* v = load_f32(in, in_type, at, count, in_block);
        float* w = store_target(out, out_type, at, out_block);
        for (std::int64_t i = 0; i < count; ++i) w[i] = v[i] * k + d;
        store_f32(out, out_type, at, count, w);
      }
    }
  });
}

void batchnorm_backward_sums(const Tensor& x, const Tensor& dy, std::int64_t channels,
                             const Tensor& mean, const Tensor& invstd, Tensor& sums) {
  static const std::string label = "kernels::batchnorm_backward_sums";
  constexpr const char* op = "kernels::batchnorm_backward_sums";
  check_batch(op, "x must be [N, C, ...] f32, f16 or bf16 on the host", x, channels);
  check_batch(op, "dy must be f32, f16 or bf16 on the host", dy, channels);
  check_same(op, x, dy);
  check_channels(op, "mean must be f32 [C]", mean, channels);
  check_channels(op, "invstd must be f32 [C]", invstd, channels);
  kernels::detail::require(
      sums.defined() && sums.dtype() == DType::f32 && sums.device() == Device::cpu &&
          sums.numel() >= 2 * channels,
      op, "sums must be f32 on the host with at least 2C elements", sums);
  const Layout l = layout(x, channels);
  const std::int64_t batch = x.dim(0);
  const void* in = x.raw();
  const void* grad = dy.raw();
  const DType x_type = x.dtype(), dy_type = dy.dtype();
  const float* m = mean.data<float>();
  const float* r = invstd.data<float>();
  float* out = sums.data<float>();
  parallel_rows(label, channels, batch * l.plane, [=](std::int64_t c0, std::int64_t c1) {
    float x_block[kIoBlock], dy_block[kIoBlock];
    for (std::int64_t c = c0; c < c1; ++c) {
      double sum_dy = 0, sum_dy_xhat = 0;
      for (std::int64_t n = 0; n < batch; ++n) {
        const std::int64_t base = (n * channels + c) * l.plane;
        for (std::int64_t s = 0; s < l.plane; s += kIoBlock) {
          const std::int64_t count = std::min(kIoBlock, l.plane - s);
          sum_and_centred(load_f32(in, x_type, base + s, count, x_block),
                          load_f32(grad, dy_type, base + s, count, dy_block), m[c], count, sum_dy,
                          sum_dy_xhat);
        }
      }
      out[c] = static_cast<float>(sum_dy);
      out[channels + c] = static_cast<float>(sum_dy_xhat * r[c]);
    }
  });
}

void batchnorm_backward_dx(const Tensor& x, const Tensor& dy, std::int64_t channels,
                           const Tensor& mean, const Tensor& dy_coef, const Tensor& x_coef,
                           const Tensor& bias, Tensor& dx) {
  static const std::string label = "kernels::batchnorm_backward_dx";
  constexpr const char* op = "kernels::batchnorm_backward_dx";
  check_batch(op, "x must be [N, C, ...] f32, f16 or bf16 on the host", x, channels);
  check_batch(op, "dy must be f32, f16 or bf16 on the host", dy, channels);
  check_batch(op, "dx must be f32, f16 or bf16 on the host", dx, channels);
  check_same(op, x, dy);
  check_same(op, dy, dx);
  for (const Tensor* t : {&mean, &dy_coef, &x_coef, &bias})
    check_channels(op, "per-channel coefficients must be f32 [C]", *t, channels);
  const Layout l = layout(x, channels);
  const void* in = x.raw();
  const void* grad_out = dy.raw();  // may alias dx
  void* grad_in = dx.raw();
  const DType x_type = x.dtype(), dy_type = dy.dtype(), dx_type = dx.dtype();
  const float* m = mean.data<float>();
  const float* k1 = dy_coef.data<float>();
  const float* k2 = x_coef.data<float>();
  const float* k3 = bias.data<float>();
  parallel_rows(label, l.planes, l.plane, [=](std::int64_t p0, std::int64_t p1) {
    float x_block[kIoBlock], dy_block[kIoBlock], dx_block[kIoBlock];
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int64_t c = p % channels;
      const float a = k1[c], b = k2[c], d = k3[c], centre = m[c];
      for (std::int64_t s = 0; s < l.plane; s += kIoBlock) {
        const std::int64_t count = std::min(kIoBlock, l.plane - s);
        const std::int64_t at = p * l.plane + s;
        const float* v = load_f32(in, x_type, at, count, x_block);
        const float* g = load_f32(grad_out, dy_type, at, count, dy_block);
        float* w = store_target(grad_in, dx_type, at, dx_block);
        for (std::int64_t i = 0; i < count; ++i) w[i] = a * g[i] + b * (v[i] - centre) + d;
        store_f32(grad_in, dx_type, at, count, w);
      }
    }
  });
}

void batchnorm_forward_coefs(const Tensor& sums, double plane, bool training, const Tensor& gamma,
                             const Tensor& beta, Tensor& running_mean, Tensor& running_var,
                             double momentum, double epsilon, Tensor& mean, Tensor& invstd,
                             Tensor& scale, Tensor& shift) {
  constexpr const char* op = "kernels::batchnorm_forward_coefs";
  const std::int64_t c = gamma.numel();
  check_channels(op, "gamma must be f32 on the host", gamma, c);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&beta, &running_mean, &running_var, &mean,
                                                              &invstd, &scale, &shift})
    check_channels(op, "per-channel values must be f32 [C] on the host", *t, c);
  if (training) check_channels(op, "sums must be f32 [2C + 1] on the host", sums, 2 * c + 1);
  const float* sum = training ? sums.data<float>() : nullptr;
  const double count = training ? double{sum[2 * c]} * plane : 0.0;
  training = training && count > 0;  // no sample: the running statistics, left as they are
  const float* g = gamma.data<float>();
  const float* b = beta.data<float>();
  float* rm = running_mean.data<float>();
  float* rv = running_var.data<float>();
  float* mu = mean.data<float>();
  float* is = invstd.data<float>();
  float* sc = scale.data<float>();
  float* sh = shift.data<float>();
  // Unbiased variance for the running estimate, as PyTorch (M/(M-1); M = 1 keeps it biased).
  const double unbias = count > 1 ? count / (count - 1) : 1.0;
  for (std::int64_t k = 0; k < c; ++k) {
    if (training) {
      const double m = sum[k] / count;
      const double var = std::max(0.0, sum[c + k] / count - m * m);
      mu[k] = static_cast<float>(m);
      is[k] = static_cast<float>(1.0 / std::sqrt(var + epsilon));
      rm[k] = static_cast<float>((1 - momentum) * rm[k] + momentum * m);
      rv[k] = static_cast<float>((1 - momentum) * rv[k] + momentum * var * unbias);
    } else {
      mu[k] = rm[k];
      is[k] = static_cast<float>(1.0 / std::sqrt(double{rv[k]} + epsilon));
    }
    // y = (x - mean) * invstd * gamma + beta = x * scale + shift.
    const double s = double{g[k]} * is[k];
    sc[k] = static_cast<float>(s);
    sh[k] = static_cast<float>(b[k] - mu[k] * s);
  }
}

void batchnorm_backward_coefs(const Tensor& sums, double plane, const Tensor& gamma,
                              const Tensor& invstd, Tensor& dy_coef, Tensor& x_coef, Tensor& bias) {
  constexpr const char* op = "kernels::batchnorm_backward_coefs";
  const std::int64_t c = gamma.numel();
  check_channels(op, "gamma must be f32 on the host", gamma, c);
  for (const Tensor* t : std::initializer_list<const Tensor*>{&invstd, &dy_coef, &x_coef, &bias})
    check_channels(op, "per-channel values must be f32 [C] on the host", *t, c);
  if (plane > 0)
    check_channels(op, "sums must be f32 [2C + 1] on the host", sums, 2 * c + 1);
  else
    check_channels(op, "sums must be f32 [2C] on the host", sums, 2 * c);
  const float* sum = sums.data<float>();
  const double count = plane > 0 ? double{sum[2 * c]} * plane : 0.0;
  const float* g = gamma.data<float>();
  const float* is = invstd.data<float>();
  float* k1 = dy_coef.data<float>();
  float* k2 = x_coef.data<float>();
  float* k3 = bias.data<float>();
  const bool through_stats = count > 0;
  for (std::int64_t k = 0; k < c; ++k) {
    // dx = gamma invstd (dy - mean(dy) - xhat mean(dy xhat)), xhat = (x - mean) invstd; with
    // running statistics (eval) only the first term.
    const double gk = double{g[k]} * is[k];
    k1[k] = static_cast<float>(gk);
    k2[k] = through_stats ? static_cast<float>(-gk * is[k] * sum[c + k] / count) : 0.f;
    k3[k] = through_stats ? static_cast<float>(-gk * sum[k] / count) : 0.f;
  }
}

}  // namespace mpt::kernels::host
