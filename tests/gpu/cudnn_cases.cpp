// The cuDNN sub-cases of case_conv2d and case_pool2d (kernel_cases.hpp): kernels::cuda::CudnnConv2d
// against a float64 direct convolution of the same (rounded) inputs, and CudnnPool2d against the
// host pooling kernels. Nothing to run in a build without cuDNN.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cast.hpp"
#include "kernels/conv2d.hpp"
#include "kernels/copy.hpp"
#include "kernels/pool2d.hpp"
#include "tests/gpu/kernel_cases.hpp"

namespace mpt::gpu_test {

#ifdef MPTRAIN_HAVE_CUDNN
namespace {

Tensor dev(const Tensor& host) { return host.to(Device::cuda); }

// cuDNN against float64, relative to the sum of the magnitudes of the products (as the matmul
// tolerances): f32 sums in another order; under 16-bit storage y is rounded twice (the conv's
// output, then with the bias), the gradients once.
Tolerance conv_tolerance(DType dtype) {
  return dtype == DType::f32   ? Tolerance{2e-5, 1e-6}
         : dtype == DType::f16 ? Tolerance{2e-3, 1e-6}
                               : Tolerance{1.6e-2, 1e-6};
}

struct ConvShape {
  std::int64_t batch, channels, height, width, out_channels, kernel, stride, pad;
  bool relu, f32_input, misaligned_weight;
};

void check_conv(Harness& h, Random& rng, const ConvShape& s, DType dtype) {
  kernels::Conv2dGeometry g{s.channels, s.height, s.width, s.kernel, s.stride, s.pad};
  const std::int64_t oh = g.out_height(), ow = g.out_width(), k = s.kernel;
  char label[200];
  std::snprintf(
      label, sizeof label, " [cuDNN %s B=%lld C=%lld %lldx%lld K=%lld k=%lld S=%lld P=%lld%s%s%s]",
      dtype_name(dtype), static_cast<long long>(s.batch), static_cast<long long>(s.channels),
      static_cast<long long>(s.height), static_cast<long long>(s.width),
      static_cast<long long>(s.out_channels), static_cast<long long>(k),
      static_cast<long long>(s.stride), static_cast<long long>(s.pad), s.relu ? " relu" : "",
      s.f32_input ? " f32 x" : "", s.misaligned_weight ? " misaligned w" : "");
  const bool f32_input = s.f32_input && dtype != DType::f32;
  // Inputs in the storage dtype; an f32 x is rounded by the plan, so the reference takes the
  // rounded values.
  Tensor x32 = rng.tensor({s.batch, s.channels, s.height, s.width}, DType::f32);
  Tensor x(x32.shape(), dtype);
  kernels::cast(x32, x);
  const Tensor x_ref = host_f32(x);
  const Shape w_shape{s.out_channels, s.channels, k, k};
  const Tensor w = rng.tensor(w_shape, dtype, -0.5f, 0.5f);
  const Tensor w_ref = host_f32(w);
  const Tensor bias = rng.tensor({s.out_channels}, DType::f32);
  const Shape y_shape{s.batch, s.out_channels, oh, ow};
  const Tensor dy = rng.tensor(y_shape, dtype);

  // The weight one element into a larger buffer: off every 16-byte boundary.
  Tensor w_base(Shape{shape_numel(w_shape) + 1}, dtype, Device::cuda);
  Tensor wd = Tensor::view(w_base, s.misaligned_weight ? 1 : 0, w_shape);
  kernels::copy(w, wd);
  Tensor dw_base(Shape{shape_numel(w_shape) + 1}, dtype, Device::cuda);
  Tensor dwd = Tensor::view(dw_base, s.misaligned_weight ? 1 : 0, w_shape);
  const Tensor xd = f32_input ? dev(x_ref) : dev(x);
  Tensor yd(y_shape, dtype, Device::cuda), dbd({s.out_channels}, dtype, Device::cuda);
  Tensor dxd(xd.shape(), xd.dtype(), Device::cuda);

  kernels::cuda::CudnnConv2d conv;
  // Planned for two samples more than it runs: the batch gets a plan of its own.
  if (!conv.plan(g, s.out_channels, s.batch + 2, dtype, s.relu)) {
    h.expect(false, std::string("CudnnConv2d::plan") + label, conv.describe());
    return;
  }
  // The algorithms of the planned batch, so that a result out of tolerance names them.
  const std::string algorithms = " {" + conv.describe() + "}";
  conv.forward(xd, wd, dev(bias), yd);
  conv.backward(xd, wd, yd, dev(dy), dwd, dbd, &dxd);

  // The float64 reference, and the magnitudes each result sums.
  const Tensor y_got = host_f32(yd), dy_in = host_f32(dy);
  Tensor y_ref(y_shape, DType::f32), y_size(y_shape, DType::f32);
  Tensor dy_masked(y_shape, DType::f32);
  const auto xi = [&](std::int64_t n, std::int64_t c, std::int64_t i, std::int64_t j) {
    return ((n * s.channels + c) * s.height + i) * s.width + j;
  };
  const auto wi = [&](std::int64_t o, std::int64_t c, std::int64_t i, std::int64_t j) {
    return ((o * s.channels + c) * k + i) * k + j;
  };
  for (std::int64_t n = 0; n < s.batch; ++n)
    for (std::int64_t o = 0; o < s.out_channels; ++o)
      for (std::int64_t p = 0; p < oh; ++p)
        for (std::int64_t q = 0; q < ow; ++q) {
          double sum = bias.data<float>()[o], size = std::abs(sum);
          for (std::int64_t c = 0; c < s.channels; ++c)
            for (std::int64_t i = 0; i < k; ++i)
              for (std::int64_t j = 0; j < k; ++j) {
                const std::int64_t r = p * s.stride - s.pad + i, t = q * s.stride - s.pad + j;
                if (r < 0 || r >= s.height || t < 0 || t >= s.width) continue;
                const double product = double{x_ref.data<float>()[xi(n, c, r, t)]} *
                                       w_ref.data<float>()[wi(o, c, i, j)];
                sum += product;
                size += std::abs(product);
              }
          const std::int64_t at = ((n * s.out_channels + o) * oh + p) * ow + q;
          y_ref.data<float>()[at] = static_cast<float>(s.relu && sum < 0 ? 0.0 : sum);
          y_size.data<float>()[at] = static_cast<float>(size);
          // The ReLU's mask comes from the device's y (what the plan masks by), so that a value
          // rounded to zero on one side only cannot fail the gradients.
          dy_masked.data<float>()[at] =
              s.relu && !(y_got.data<float>()[at] > 0.f) ? 0.f : dy_in.data<float>()[at];
        }
  h.expect_close(std::string("CudnnConv2d::forward") + label + algorithms, yd, y_ref, conv_tolerance(dtype),
                 &y_size);

  Tensor dw_ref(w_shape, DType::f32), dw_size(w_shape, DType::f32);
  Tensor db_ref({s.out_channels}, DType::f32), db_size({s.out_channels}, DType::f32);
  Tensor dx_ref(x_ref.shape(), DType::f32), dx_size(x_ref.shape(), DType::f32);
  std::vector<double> dx_sum(static_cast<std::size_t>(x_ref.numel())),
      dx_abs(static_cast<std::size_t>(x_ref.numel()));
  for (std::int64_t o = 0; o < s.out_channels; ++o) {
    double bias_sum = 0, bias_abs = 0;
    for (std::int64_t n = 0; n < s.batch; ++n)
      for (std::int64_t p = 0; p < oh * ow; ++p) {
        const double g_out = dy_masked.data<float>()[(n * s.out_channels + o) * oh * ow + p];
        bias_sum += g_out;
        bias_abs += std::abs(g_out);
      }
    db_ref.data<float>()[o] = static_cast<float>(bias_sum);
    db_size.data<float>()[o] = static_cast<float>(bias_abs);
    for (std::int64_t c = 0; c < s.channels; ++c)
      for (std::int64_t i = 0; i < k; ++i)
        for (std::int64_t j = 0; j < k; ++j) {
          double sum = 0, size = 0;
          for (std::int64_t n = 0; n < s.batch; ++n)
            for (std::int64_t p = 0; p < oh; ++p)
              for (std::int64_t q = 0; q < ow; ++q) {
                const std::int64_t r = p * s.stride - s.pad + i, t = q * s.stride - s.pad + j;
                if (r < 0 || r >= s.height || t < 0 || t >= s.width) continue;
                const double g_out =
                    dy_masked.data<float>()[((n * s.out_channels + o) * oh + p) * ow + q];
                const double product = g_out * x_ref.data<float>()[xi(n, c, r, t)];
                sum += product;
                size += std::abs(product);
                const double back = g_out * w_ref.data<float>()[wi(o, c, i, j)];
                dx_sum[static_cast<std::size_t>(xi(n, c, r, t))] += back;
                dx_abs[static_cast<std::size_t>(xi(n, c, r, t))] += std::abs(back);
              }
          dw_ref.data<float>()[wi(o, c, i, j)] = static_cast<float>(sum);
          dw_size.data<float>()[wi(o, c, i, j)] = static_cast<float>(size);
        }
  }
  for (std::int64_t e = 0; e < x_ref.numel(); ++e) {
    dx_ref.data<float>()[e] = static_cast<float>(dx_sum[static_cast<std::size_t>(e)]);
    dx_size.data<float>()[e] = static_cast<float>(dx_abs[static_cast<std::size_t>(e)]);
  }
  const Tolerance tol = conv_tolerance(dtype);
  h.expect_close(std::string("CudnnConv2d::backward dw") + label + algorithms, dwd, dw_ref, tol, &dw_size);
  h.expect_close(std::string("CudnnConv2d::backward db") + label + algorithms, dbd, db_ref, tol, &db_size);
  h.expect_close(std::string("CudnnConv2d::backward dx") + label + algorithms, dxd, dx_ref, tol, &dx_size);
  h.expect(host_f32(dw_base).data<float>()[s.misaligned_weight ? 0 : shape_numel(w_shape)] == 0.f,
           std::string("CudnnConv2d writes dw and nothing beside it") + label);
}

}  // namespace

void cudnn_conv2d_cases(Harness& h, Random& rng) {
  // Odd planes, stride 2, pad 0/1/2, 1x1 kernels, C_in = 1, a kernel as large as the padded
  // plane, a fused ReLU, an f32 input under 16-bit storage (the model's first layer) and a
  // weight off a 16-byte boundary; and the cnn's 3x3, stride 1, pad 1 (where cuDNN ranks the
  // Winograd transforms first). The last two have more outputs than the emulated grid's 8,192
  // threads, so the bias and ReLU pass steps on: over 14x14 planes and 10 channels, and over
  // 96x96 planes longer than the stride (the bias gradient then takes two slices a channel).
  const ConvShape shapes[] = {
      {4, 3, 8, 8, 6, 3, 1, 1, true, true, false},
      {3, 1, 13, 11, 5, 3, 2, 1, false, false, false},
      {2, 3, 9, 15, 4, 1, 1, 0, true, false, false},
      {4, 6, 7, 7, 8, 5, 1, 2, true, false, true},
      {5, 2, 12, 10, 3, 3, 2, 0, false, true, false},
      {1, 4, 6, 5, 2, 1, 2, 2, true, true, true},
      {2, 3, 5, 5, 7, 7, 1, 1, false, false, false},
      {6, 3, 14, 14, 10, 3, 1, 1, true, false, false},
      {1, 1, 96, 96, 2, 3, 1, 1, true, false, false},
  };
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const ConvShape& s : shapes) check_conv(h, rng, s, dtype);
  // An output over an input is refused before cuDNN is called (kernels/check.hpp,
  // require_disjoint), with the pair named: cuDNN's own answer would be wrong values.
  const kernels::Conv2dGeometry g{.channels = 1, .height = 4, .width = 4, .kernel = 3, .pad = 1};
  kernels::cuda::CudnnConv2d conv;
  if (!conv.plan(g, 2, 1, DType::f32, false)) {
    std::printf("  note CudnnConv2d: no plan for the overlap checks (%s)\n",
                conv.describe().c_str());
    return;
  }
  const Tensor buffer({32}, DType::f32, Device::cuda);
  const Tensor weight({2, 1, 3, 3}, DType::f32, Device::cuda), bias({2}, DType::f32, Device::cuda);
  const Tensor x = Tensor::view(buffer, 0, {1, 1, 4, 4});
  Tensor y_over_x = Tensor::view(buffer, 0, {1, 2, 4, 4});
  h.expect_fatal("CudnnConv2d::forward into x's buffer",
                 "kernels::cuda::CudnnConv2d::forward: y must not overlap x",
                 [&] { conv.forward(x, weight, bias, y_over_x); });
  const Tensor dy({1, 2, 4, 4}, DType::f32, Device::cuda);
  const Tensor x_apart({1, 1, 4, 4}, DType::f32, Device::cuda);
  Tensor weight_grad({2, 1, 3, 3}, DType::f32, Device::cuda);
  Tensor bias_grad({2}, DType::f32, Device::cuda);
  Tensor dx_in_dy = Tensor::view(dy, 16, {1, 1, 4, 4});
  h.expect_fatal("CudnnConv2d::backward into dy's second channel",
                 "kernels::cuda::CudnnConv2d::backward: dx must not overlap dy", [&] {
                   conv.backward(x_apart, weight, dy, dy, weight_grad, bias_grad, &dx_in_dy);
                 });
}

void cudnn_pool2d_cases(Harness& h, Random& rng) {
  struct PoolShape {
    std::int64_t batch, channels, height, width, kernel, stride;
  };
  // Disjoint, overlapping (stride < kernel), dropped last row/column, global.
  const PoolShape shapes[] = {{4, 16, 28, 28, 2, 2},
                              {3, 13, 7, 11, 2, 2},
                              {5, 7, 9, 13, 3, 2},
                              {1, 5, 12, 12, 3, 1},
                              {257, 1, 5, 6, 5, 1}};
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (const PoolShape& s : shapes)
      for (bool max : {true, false}) {
        kernels::Pool2dGeometry g;
        g.height = s.height;
        g.width = s.width;
        g.kernel_h = s.kernel;
        g.kernel_w = s.kernel == 5 ? 6 : s.kernel;  // the global case: 5x6 windows
        g.stride = s.stride;
        char label[160];
        std::snprintf(label, sizeof label,
                      " [cuDNN %s %s %lldx%lld planes %lldx%lld window %lld S=%lld]",
                      max ? "max" : "avg", dtype_name(dtype), static_cast<long long>(s.batch),
                      static_cast<long long>(s.channels), static_cast<long long>(s.height),
                      static_cast<long long>(s.width), static_cast<long long>(s.kernel),
                      static_cast<long long>(s.stride));
        // Tie-free inputs for max pooling, so that each window has one maximum and the
        // gradient's route is the host's: within a plane, element l (shuffled by a stride
        // coprime to every plane size here) is +-(m / 128) 2^e with m = 128 + l % 128 and
        // e = l / 128 - 3, distinct magnitudes exact in bf16 (8 significant bits) and f16.
        const Shape x_shape{s.batch, s.channels, s.height, s.width};
        Tensor x32(x_shape, DType::f32);
        const std::int64_t plane = s.height * s.width;
        for (std::int64_t i = 0; i < x32.numel(); ++i) {
          const std::int64_t l = (i % plane) * 37 % plane;
          const float magnitude =
              std::ldexp(static_cast<float>(128 + l % 128) / 128.f, static_cast<int>(l / 128) - 3);
          x32.data<float>()[i] = max ? (l % 2 ? -magnitude : magnitude) : rng.uniform(-1.f, 1.f);
        }
        Tensor x(x_shape, dtype);
        kernels::cast(x32, x);
        const Shape y_shape{s.batch, s.channels, g.out_height(), g.out_width()};
        const Tensor dy = rng.tensor(y_shape, dtype);
        // The host kernels on the same (rounded) values, in f32.
        const Tensor xh = host_f32(x), dyh = host_f32(dy);
        Tensor y_ref(y_shape, DType::f32), dx_ref(x_shape, DType::f32);
        if (max) {
          kernels::max_pool2d_forward(xh, g, y_ref);
          kernels::max_pool2d_backward(xh, g, dyh, dx_ref);
        } else {
          kernels::avg_pool2d_forward(xh, g, y_ref);
          kernels::avg_pool2d_backward(g, dyh, dx_ref);
        }
        kernels::cuda::CudnnPool2d pool;
        pool.plan(g, s.channels, dtype, max);
        const Tensor xd = dev(x), dyd = dev(dy);
        Tensor yd(y_shape, dtype, Device::cuda), dxd(x_shape, dtype, Device::cuda);
        pool.forward(xd, yd);
        pool.backward(xd, yd, dyd, dxd);
        // Max: a selection (exact, once the host's f32 result is rounded to the dtype). Average:
        // a sum in another order, rounded once: a few ulps of f32, half an ulp of 16-bit.
        const Tolerance tol = max                   ? Tolerance{0, 0}
                              : dtype == DType::f32 ? Tolerance{1e-5, 1e-6}
                              : dtype == DType::f16 ? Tolerance{1e-3, 1e-4}
                                                    : Tolerance{8e-3, 1e-3};
        Tensor y_want(y_shape, dtype), dx_want(x_shape, dtype);
        kernels::cast(y_ref, y_want);
        kernels::cast(dx_ref, dx_want);
        h.expect_close(std::string("CudnnPool2d::forward") + label, yd, y_want, tol);
        // Overlapping max windows add several gradients into one element in some order: the
        // average's tolerances (docs/gpu.md). Up to 9 terms of |dy| < 1 may cancel, so the
        // absolute part carries f32: 9 roundings of 2^-24 are under 1e-6.
        const Tolerance dx_tol = max && s.stride < s.kernel
                                     ? (dtype == DType::f32   ? Tolerance{1e-5, 1e-6}
                                        : dtype == DType::f16 ? Tolerance{1e-3, 1e-4}
                                                              : Tolerance{8e-3, 1e-3})
                                     : tol;
        h.expect_close(std::string("CudnnPool2d::backward") + label, dxd, dx_want, dx_tol);
      }
  // Ties: which of a window's equal maxima cuDNN gives the gradient to is not documented; the
  // host gives it to the first. Reported, not required (docs/gpu.md).
  kernels::Pool2dGeometry g;
  g.height = g.width = 4;
  g.kernel_h = g.kernel_w = 2;
  g.stride = 2;
  Tensor x({1, 1, 4, 4}, DType::f32), dy({1, 1, 2, 2}, DType::f32);
  for (std::int64_t i = 0; i < 16; ++i) x.data<float>()[i] = 1.f;
  for (std::int64_t i = 0; i < 4; ++i) dy.data<float>()[i] = static_cast<float>(i + 1);
  Tensor y({1, 1, 2, 2}, DType::f32), dx({1, 1, 4, 4}, DType::f32);
  kernels::max_pool2d_forward(x, g, y);
  kernels::max_pool2d_backward(x, g, dy, dx);
  kernels::cuda::CudnnPool2d pool;
  pool.plan(g, 1, DType::f32, true);
  const Tensor xd = dev(x);
  Tensor yd({1, 1, 2, 2}, DType::f32, Device::cuda), dxd({1, 1, 4, 4}, DType::f32, Device::cuda);
  pool.forward(xd, yd);
  pool.backward(xd, yd, dev(dy), dxd);
  const Tensor got = host_f32(dxd);
  bool same = true;
  for (std::int64_t i = 0; i < 16; ++i) same = same && got.data<float>()[i] == dx.data<float>()[i];
  std::printf("  note CudnnPool2d: ties in a max window go to %s\n",
              same ? "the first maximum, as on the host" : "another maximum than on the host");
  // An output over an input is refused before cuDNN is called, with the pair named.
  Tensor y_in_x = Tensor::view(xd, 12, {1, 1, 2, 2}), dx_is_x = xd;
  h.expect_fatal("CudnnPool2d::forward into x's last row",
                 "kernels::cuda::CudnnPool2d::forward: y must not overlap x",
                 [&] { pool.forward(xd, y_in_x); });
  h.expect_fatal("CudnnPool2d::backward into x",
                 "kernels::cuda::CudnnPool2d::backward: dx must not overlap x",
                 [&] { pool.backward(xd, yd, yd, dx_is_x); });
}

#else
void cudnn_conv2d_cases(Harness&, Random&) {}
void cudnn_pool2d_cases(Harness&, Random&) {}
#endif

}  // namespace mpt::gpu_test
