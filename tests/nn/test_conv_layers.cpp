// The convolutional layers: Conv2d and the pools against direct (naive, float64) references on
// odd shapes, finite-difference gradient checks of conv, max/avg/global pooling and GELU, the
// 16-bit models against the f32 model on the same rounded weights, spec errors, and the `cnn`
// built-in's size.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/half.hpp"
#include "core/random.hpp"
#include "kernels/cast.hpp"
#include "kernels/matmul.hpp"
#include "kernels/relu.hpp"
#include "kernels/softmax_xent.hpp"
#include "nn/conv2d.hpp"
#include "nn/gelu_layer.hpp"
#include "nn/nn.hpp"
#include "tests/nn/gradcheck_util.hpp"
#include "tests/nn/twin_util.hpp"
#include "nn/pool2d_layer.hpp"

namespace mpt::nn {
namespace {

// This file's fills draw from stream 13.
void fill_uniform(Tensor& t, std::uint64_t seed, float low, float high) {
  test::fill_uniform(t, seed, low, high, 13);
}
using test::central_difference;
using test::values_of;

// Sets the host conv path for a test and restores the process-wide one after it.
struct HostConvPathGuard {
  HostConvPath saved = host_conv_path();
  explicit HostConvPathGuard(HostConvPath path) { set_host_conv_path(path); }
  ~HostConvPathGuard() { set_host_conv_path(saved); }
};

// A standalone layer with its parameters bound to flat f32 buffers.
struct Bound {
  Tensor params, grads;
};
Bound bind(Layer& layer) {
  std::int64_t total = 0;
  for (const auto& spec : layer.param_specs()) total += shape_numel(spec.shape);
  Bound b{Tensor({std::max<std::int64_t>(total, 1)}, DType::f32),
          Tensor({std::max<std::int64_t>(total, 1)}, DType::f32)};
  std::vector<Tensor> values, grads;
  std::int64_t offset = 0;
  for (const auto& spec : layer.param_specs()) {
    values.push_back(Tensor::view(b.params, offset, spec.shape));
    grads.push_back(Tensor::view(b.grads, offset, spec.shape));
    offset += shape_numel(spec.shape);
  }
  layer.bind_params(std::move(values), std::move(grads));
  return b;
}

// Direct convolution in double: y[n, o, oh, ow] = b[o] + sum w[o,c,i,j] x[n,c,oh*s-p+i,ow*s-p+j].
std::vector<double> direct_conv(const Tensor& x, const Tensor& w, const Tensor& bias,
                                std::int64_t stride, std::int64_t pad) {
  const std::int64_t n = x.dim(0), c_in = x.dim(1), h = x.dim(2), wd = x.dim(3);
  const std::int64_t c_out = w.dim(0), k = w.dim(2);
  const std::int64_t oh_n = (h + 2 * pad - k) / stride + 1, ow_n = (wd + 2 * pad - k) / stride + 1;
  std::vector<double> y;
  for (std::int64_t s = 0; s < n; ++s)
    for (std::int64_t o = 0; o < c_out; ++o)
      for (std::int64_t oh = 0; oh < oh_n; ++oh)
        for (std::int64_t ow = 0; ow < ow_n; ++ow) {
          double sum = bias.data<float>()[o];
          for (std::int64_t c = 0; c < c_in; ++c)
            for (std::int64_t i = 0; i < k; ++i)
              for (std::int64_t j = 0; j < k; ++j) {
                const std::int64_t hh = oh * stride - pad + i, ww = ow * stride - pad + j;
                if (hh < 0 || hh >= h || ww < 0 || ww >= wd) continue;
                sum += double{w.data<float>()[((o * c_in + c) * k + i) * k + j]} *
                       x.data<float>()[((s * c_in + c) * h + hh) * wd + ww];
              }
          y.push_back(sum);
        }
  return y;
}

TEST(Conv2dLayer, MatchesDirectConvolutionOnOddShapes) {
  // C_in 3, 7x9 input, K 3, stride 2, pad 1 -> (4, 4, 5); and K 2, stride 3, no pad -> (4, 2, 3);
  // through oneDNN's convolution and through im2col.
  for (const HostConvPath path : {HostConvPath::onednn, HostConvPath::im2col})
  for (const auto& [kernel, stride, pad] :
       std::vector<std::array<std::int64_t, 3>>{{3, 2, 1}, {2, 3, 0}, {3, 1, 2}, {1, 1, 0}, {5, 2, 2}}) {
    SCOPED_TRACE(std::string(host_conv_path_name(path)) + " K " + std::to_string(kernel) +
                 " stride " + std::to_string(stride) + " pad " + std::to_string(pad));
    HostConvPathGuard guard(path);
    const Shape in_shape{3, 7, 9};
    Conv2d conv("conv0", in_shape, 4, kernel, stride, pad);
    Bound b = bind(conv);
    fill_uniform(b.params, 1, -1.f, 1.f);
    const Shape out = conv.output_shape(in_shape);
    conv.plan(2, DType::f32);
    // oneDNN takes every geometry here, the strides that leave padded columns unread too.
    EXPECT_EQ(conv.uses_dnnl(), path == HostConvPath::onednn && kernels::dnnl_available())
        << conv.dnnl_plan();
    Tensor x({2, 3, 7, 9}, DType::f32), y({2, out[0], out[1], out[2]}, DType::f32);
    fill_uniform(x, 2, -2.f, 2.f);
    conv.forward(x, y, true);
    const Tensor w = Tensor::view(b.params, 0, {4, 3, kernel, kernel});
    const Tensor bias = Tensor::view(b.params, 4 * 3 * kernel * kernel, {4});
    const auto reference = direct_conv(x, w, bias, stride, pad);
    ASSERT_EQ(static_cast<std::int64_t>(reference.size()), y.numel());
    // At most 27 products of |x w| <= 2 in f32: error well under 1e-5.
    for (std::int64_t i = 0; i < y.numel(); ++i)
      ASSERT_NEAR(y.data<float>()[i], reference[static_cast<std::size_t>(i)], 1e-5) << i;
  }
}

TEST(Conv2dLayer, BlocksThatDoNotDivideTheBatchMatchTheDirectConvolution) {
  // Batch 5 in blocks of 1, 2 (2+2+1), 3 (3+2), 5 and 8 (one short block), with "same" stride-1
  // padding (im2col's shifted-plane path) and with stride 2: every block size must give the
  // direct convolution, forward and backward (the gradients against the one-sample blocks).
  for (const auto& [kernel, stride, pad] :
       std::vector<std::array<std::int64_t, 3>>{{3, 1, 1}, {5, 1, 2}, {3, 2, 1}}) {
    SCOPED_TRACE("K " + std::to_string(kernel) + " stride " + std::to_string(stride));
    const Shape in_shape{3, 7, 9};
    const std::int64_t batch = 5;
    Tensor x({batch, 3, 7, 9}, DType::f32);
    fill_uniform(x, 20, -2.f, 2.f);
    std::vector<float> reference_dw, reference_dx;
    HostConvPathGuard guard(HostConvPath::im2col);  // blocks are the im2col path's
    for (const std::int64_t block : {1, 2, 3, 5, 8}) {
      SCOPED_TRACE("block " + std::to_string(block));
      Conv2d conv("conv0", in_shape, 4, kernel, stride, pad);
      conv.set_block_samples(block);
      Bound b = bind(conv);
      fill_uniform(b.params, 21, -1.f, 1.f);
      conv.plan(batch, DType::f32);
      EXPECT_EQ(conv.block_samples(), std::min<std::int64_t>(block, batch));
      const Shape out = conv.output_shape(in_shape);
      Tensor y({batch, out[0], out[1], out[2]}, DType::f32), dx(x.shape(), DType::f32);
      conv.forward(x, y, true);
      const Tensor w = Tensor::view(b.params, 0, {4, 3, kernel, kernel});
      const Tensor bias = Tensor::view(b.params, 4 * 3 * kernel * kernel, {4});
      const auto reference = direct_conv(x, w, bias, stride, pad);
      for (std::int64_t i = 0; i < y.numel(); ++i)
        ASSERT_NEAR(y.data<float>()[i], reference[static_cast<std::size_t>(i)], 1e-5) << i;
      Tensor dy(y.shape(), DType::f32);
      fill_uniform(dy, 22, -1.f, 1.f);
      conv.backward(x, y, dy, &dx);
      const float* dw = b.grads.data<float>();
      if (block == 1) {
        reference_dw.assign(dw, dw + b.grads.numel());
        reference_dx.assign(dx.data<float>(), dx.data<float>() + dx.numel());
        continue;
      }
      // Sums of up to 5 * 63 products of magnitude <= 2: f32 reordering error far below 1e-4.
      for (std::int64_t i = 0; i < b.grads.numel(); ++i)
        ASSERT_NEAR(dw[i], reference_dw[static_cast<std::size_t>(i)], 1e-4) << "grad " << i;
      for (std::int64_t i = 0; i < dx.numel(); ++i)
        ASSERT_NEAR(dx.data<float>()[i], reference_dx[static_cast<std::size_t>(i)], 1e-5) << i;
    }
  }
}

// Direct max / average pooling in double over [n*c] planes.
std::vector<double> direct_pool(const Tensor& x, std::int64_t planes, std::int64_t h,
                                std::int64_t w, std::int64_t k, std::int64_t stride, bool max) {
  std::vector<double> y;
  for (std::int64_t p = 0; p < planes; ++p)
    for (std::int64_t oh = 0; oh + k <= h; oh += stride)
      for (std::int64_t ow = 0; ow + k <= w; ow += stride) {
        double acc = max ? -1e300 : 0.0;
        for (std::int64_t i = 0; i < k; ++i)
          for (std::int64_t j = 0; j < k; ++j) {
            const double v = x.data<float>()[(p * h + oh + i) * w + ow + j];
            acc = max ? std::max(acc, v) : acc + v;
          }
        y.push_back(max ? acc : acc / static_cast<double>(k * k));
      }
  return y;
}

TEST(Pool2dLayer, MatchDirectPoolingOnOddShapes) {
  const Shape in_shape{3, 7, 9};
  Tensor x({2, 3, 7, 9}, DType::f32);
  fill_uniform(x, 4, -3.f, 3.f);
  for (const bool max : {true, false})
    for (const auto& [kernel, stride] :
         std::vector<std::array<std::int64_t, 2>>{{2, 2}, {3, 2}, {3, 3}, {2, 1}}) {
      SCOPED_TRACE(std::string(max ? "max" : "avg") + " K " + std::to_string(kernel) + " stride " +
                   std::to_string(stride));
      Pool2dLayer pool("pool0", max ? PoolMode::max : PoolMode::average, in_shape, kernel, stride);
      pool.plan(2, DType::f32);
      const Shape out = pool.output_shape(in_shape);
      Tensor y({2, out[0], out[1], out[2]}, DType::f32);
      pool.forward(x, y, true);
      const auto reference = direct_pool(x, 6, 7, 9, kernel, stride, max);
      ASSERT_EQ(static_cast<std::int64_t>(reference.size()), y.numel());
      for (std::int64_t i = 0; i < y.numel(); ++i)
        ASSERT_NEAR(y.data<float>()[i], reference[static_cast<std::size_t>(i)], 1e-6) << i;
    }
  Pool2dLayer gap("gap0", PoolMode::global_average, in_shape, 0, 0);
  gap.plan(2, DType::f32);
  EXPECT_EQ(gap.output_shape(in_shape), (Shape{3}));
  Tensor y({2, 3}, DType::f32);
  gap.forward(x, y, true);
  for (std::int64_t p = 0; p < 6; ++p) {
    double sum = 0;
    for (std::int64_t e = 0; e < 63; ++e) sum += x.data<float>()[p * 63 + e];
    EXPECT_NEAR(y.data<float>()[p], sum / 63, 1e-6) << p;
  }
}

// Loss = sum R .* Y in double (the f64 reference loss), so dLoss/dY = R exactly. Checks the
// parameter gradients and dX of LAYER on X against central differences.
void gradcheck(Layer& layer, Bound& b, Tensor& x, const Shape& out_shape, float eps,
               double tolerance, bool relative) {
  Shape y_shape{x.dim(0)};
  y_shape.insert(y_shape.end(), out_shape.begin(), out_shape.end());
  Tensor y(y_shape, DType::f32), r(y_shape, DType::f32), dx(x.shape(), DType::f32);
  fill_uniform(r, 3, -1.f, 1.f);
  const auto loss = [&] {
    layer.forward(x, y, true);
    double sum = 0;
    for (std::int64_t i = 0; i < y.numel(); ++i)
      sum += double{r.data<float>()[i]} * y.data<float>()[i];
    return sum;
  };
  loss();
  layer.backward(x, y, r, &dx);
  const auto near = [&](double analytic, double numeric) {
    return std::fabs(analytic - numeric) <=
           tolerance * (relative ? std::max(1.0, std::fabs(numeric)) : 1.0);
  };
  if (!layer.param_specs().empty())
    for (std::int64_t i = 0; i < b.params.numel(); ++i) {
      const double numeric = central_difference(b.params.data<float>() + i, eps, loss);
      ASSERT_TRUE(near(b.grads.data<float>()[i], numeric))
          << "param " << i << ": " << b.grads.data<float>()[i] << " vs " << numeric;
    }
  int nonzero = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double numeric = central_difference(x.data<float>() + i, eps, loss);
    ASSERT_TRUE(near(dx.data<float>()[i], numeric))
        << "input " << i << ": " << dx.data<float>()[i] << " vs " << numeric;
    nonzero += std::fabs(numeric) > 1e-3;
  }
  EXPECT_GT(nonzero, 0);
}

TEST(ConvGradcheck, WeightsBiasAndInput) {
  // Linear in every weight, bias and input: central differences are exact up to f32 rounding
  // of Y (|y| <~ 10, 2^-24 relative, ~80 terms in the loss) ~ 5e-5 / (2 eps = 0.5) ~ 1e-4 at
  // worst; tolerance 5e-4 is far below the O(0.1) error of a wrong tap, transpose or sign.
  // Both host paths: oneDNN's convolution (where the build has it) and im2col.
  const Shape in_shape{3, 7, 9};
  for (const HostConvPath path : {HostConvPath::onednn, HostConvPath::im2col}) {
  SCOPED_TRACE(host_conv_path_name(path));
  HostConvPathGuard guard(path);
  Conv2d conv("conv0", in_shape, 4, 3, 2, 1);
  Bound b = bind(conv);
  fill_uniform(b.params, 5, -1.f, 1.f);
  conv.plan(2, DType::f32);
  EXPECT_EQ(conv.uses_dnnl(), path == HostConvPath::onednn && kernels::dnnl_available());
  Tensor x({2, 3, 7, 9}, DType::f32);
  fill_uniform(x, 6, -2.f, 2.f);
  gradcheck(conv, b, x, conv.output_shape(in_shape), 0.25f, 5e-4, false);
  }
  // "Same" stride-1 padding, batch 3 in blocks of 2 (a short last block).
  HostConvPathGuard guard(HostConvPath::im2col);
  Conv2d same("conv1", in_shape, 4, 3, 1, 1);
  same.set_block_samples(2);
  Bound b_same = bind(same);
  fill_uniform(b_same.params, 5, -1.f, 1.f);
  same.plan(3, DType::f32);
  Tensor x3({3, 3, 7, 9}, DType::f32);
  fill_uniform(x3, 6, -2.f, 2.f);
  gradcheck(same, b_same, x3, same.output_shape(in_shape), 0.25f, 5e-4, false);
}

TEST(PoolGradcheck, MaxAvgAndGlobal) {
  // Inputs are distinct multiples of 0.01 (a shuffled ramp), so a step of 1e-3 never changes
  // which element of a window is the maximum: max pooling is then linear, like the average
  // pools, and the differences are exact up to f32 rounding (~1e-7 / 2e-3 = 5e-5 at worst).
  // Tolerance 2e-4 catches a gradient routed to the wrong element (error 1).
  const Shape in_shape{3, 7, 9};
  Tensor x({2, 3, 7, 9}, DType::f32);
  const CounterRng rng(7, 0);
  std::vector<std::int64_t> order(static_cast<std::size_t>(x.numel()));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<std::int64_t>(i);
  for (std::size_t i = order.size() - 1; i > 0; --i)
    std::swap(order[i], order[static_cast<std::size_t>(rng.uniform(i) * (i + 1)) % (i + 1)]);
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = 0.01f * static_cast<float>(order[static_cast<std::size_t>(i)]) - 1.5f;
  for (const auto& [mode, kernel, stride] :
       std::vector<std::tuple<PoolMode, int, int>>{{PoolMode::max, 2, 2},
                                                   {PoolMode::max, 3, 2},
                                                   {PoolMode::average, 3, 2},
                                                   {PoolMode::average, 2, 1},
                                                   {PoolMode::global_average, 0, 0}}) {
    Pool2dLayer pool("pool0", mode, in_shape, kernel, stride);
    SCOPED_TRACE(pool.spec());
    Bound b = bind(pool);
    pool.plan(2, DType::f32);
    gradcheck(pool, b, x, pool.output_shape(in_shape), 1e-3f, 2e-4, false);
  }
}

TEST(GeluGradcheck, InputAndValues) {
  // Smooth: central differences err by eps^2/6 |f'''| <= 2e-5 at eps 1e-2, f32 rounding of Y adds
  // ~126 * 6e-8 / 2e-2 ~ 4e-4 at worst (typically far less); tolerance 1e-3 (relative to
  // max(1, |g|)) is far below the error of using tanh's derivative or dropping x*phi(x) (~0.1).
  const Shape in_shape{2, 3, 3};
  GeluLayer gelu("gelu0", in_shape);
  Bound b = bind(gelu);
  gelu.plan(7, DType::f32);
  Tensor x({7, 2, 3, 3}, DType::f32);
  fill_uniform(x, 8, -4.f, 4.f);
  Tensor y(x.shape(), DType::f32);
  gelu.forward(x, y, true);
  // The exact (erf) form, which PyTorch's nn.GELU() computes by default.
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data<float>()[i];
    ASSERT_NEAR(y.data<float>()[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-6) << v;
  }
  gradcheck(gelu, b, x, in_shape, 1e-2f, 1e-3, true);
}

class ConvMixedPrecision : public testing::TestWithParam<DType> {};

TEST_P(ConvMixedPrecision, GradientsCloseToF32OnTheSameRoundedWeights) {
  // As in test_mixed_precision.cpp: the f32 model (whose layers the gradchecks above anchor)
  // is the reference, on the 16-bit model's rounded weights, widened exactly. The 16-bit model
  // rounds each stored activation and activation gradient once (relative u each) through 7
  // layers; the errors add up to a few u of each tensor's scale. Tolerance 16u * max |g| per
  // parameter tensor and 8u * max |logit| leave margin; a wrong sample offset, a missing
  // commit or an unrounded accumulator is off by O(1).
  const DType dtype = GetParam();
  const double u = dtype == DType::f16 ? 0x1p-11 : 0x1p-8;
  for (const std::string spec :
       {"conv:4:3:pad=1,relu,maxpool:2,conv:6:3:stride=2,gelu,avgpool:2:stride=1,flatten,dense:3",
        "conv:5:3,gelu,gap,dense:3"}) {
    SCOPED_TRACE(spec);
    Tensor x({5, 2, 10, 12}, DType::f32);
    fill_uniform(x, 10, -1.f, 1.f);
    const test::TwinStep step = test::step_with_f32_twin(spec, {2, 10, 12}, 3, dtype, x);
    const double worst = test::max_abs_difference(step.logits, step.twin_logits);
    EXPECT_LE(worst, 8 * u * test::max_abs(step.twin_logits));
    EXPECT_GT(worst, 0.0);  // the activations really were rounded
    for (std::size_t p = 0; p < step.grads.size(); ++p) {
      const auto& g = step.grads[p];
      const auto& ref = step.twin_grads[p];
      const double grad_scale = test::max_abs(ref);
      ASSERT_GT(grad_scale, 0.0) << step.names[p];
      for (std::size_t i = 0; i < g.size(); ++i)
        ASSERT_NEAR(g[i], ref[i], 16 * u * grad_scale) << step.names[p] << " " << i;
    }
  }
}

TEST(Conv2dLayer, SixteenBitStorageInShortBlocksMatchesF32) {
  // f16 activations and gradients, batch 5 in blocks of 2: the staging widens and rounds runs
  // of samples, and the last block is short. Against the f32 layer on the same (rounded)
  // input: y and dx are rounded once (relative 2^-11), dW and db are summed in f32 and rounded
  // once. A wrong run offset or a missed commit is off by O(1).
  const Shape in_shape{2, 6, 5};
  const std::int64_t batch = 5;
  Conv2d conv16("conv0", in_shape, 3, 3, 1, 1), conv32("conv0", in_shape, 3, 3, 1, 1);
  conv16.set_block_samples(2);
  std::int64_t total = 0;
  for (const auto& spec : conv16.param_specs()) total += shape_numel(spec.shape);
  Tensor values({total}, DType::f32), grads16({total}, DType::f16), grads32({total}, DType::f32);
  fill_uniform(values, 30, -1.f, 1.f);
  const auto bind_to = [&](Layer& layer, Tensor& grads) {
    std::vector<Tensor> v, g;
    std::int64_t offset = 0;
    for (const auto& spec : layer.param_specs()) {
      v.push_back(Tensor::view(values, offset, spec.shape));
      g.push_back(Tensor::view(grads, offset, spec.shape));
      offset += shape_numel(spec.shape);
    }
    layer.bind_params(std::move(v), std::move(g));
  };
  bind_to(conv16, grads16);
  bind_to(conv32, grads32);
  conv16.plan(batch, DType::f16);
  conv32.plan(batch, DType::f32);
  const Shape out = conv32.output_shape(in_shape);
  const Shape x_shape{batch, 2, 6, 5}, y_shape{batch, out[0], out[1], out[2]};
  Tensor x32(x_shape, DType::f32), dy32(y_shape, DType::f32);
  fill_uniform(x32, 31, -2.f, 2.f);
  fill_uniform(dy32, 32, -1.f, 1.f);
  // The 16-bit copies, and the f32 inputs set to their exact values.
  Tensor x16(x_shape, DType::f16), dy16(y_shape, DType::f16);
  for (auto [f, h] : {std::pair<Tensor*, Tensor*>{&x32, &x16}, {&dy32, &dy16}})
    for (std::int64_t i = 0; i < f->numel(); ++i) {
      const std::uint16_t bits = float_to_half_bits(f->data<float>()[i]);
      static_cast<std::uint16_t*>(h->raw())[i] = bits;
      f->data<float>()[i] = half_bits_to_float(bits);
    }
  Tensor y16(y_shape, DType::f16), y32(y_shape, DType::f32);
  Tensor dx16(x_shape, DType::f16), dx32(x_shape, DType::f32);
  conv16.forward(x16, y16, true);
  conv32.forward(x32, y32, true);
  conv16.backward(x16, y16, dy16, &dx16);
  conv32.backward(x32, y32, dy32, &dx32);
  const double u = 0x1p-11;
  for (auto [got16, want32] : {std::pair<const Tensor*, const Tensor*>{&y16, &y32},
                               {&dx16, &dx32}, {&grads16, &grads32}}) {
    const auto got = values_of(*got16);
    const auto want = values_of(*want32);
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 2 * u * std::max(1.0, std::fabs(want[i]))) << i;
  }
}

class FusedRelu : public testing::TestWithParam<DType> {};

// A ReLU folded into the conv before it (as Model::build does for conv,relu) against the conv
// and the relu kernels apart, in one storage dtype, batch 5 in blocks of 2: the same output,
// dW, db and dx (equal values; under 16-bit storage a -0 may come out as +0).
TEST_P(FusedRelu, MatchesConvThenRelu) {
  // Through oneDNN (the f32 layers here: a standalone 16-bit layer has no working weights) and
  // through im2col.
  for (const HostConvPath path : {HostConvPath::onednn, HostConvPath::im2col}) {
  SCOPED_TRACE(host_conv_path_name(path));
  HostConvPathGuard guard(path);
  const DType dtype = GetParam();
  const Shape in_shape{3, 7, 6};
  const std::int64_t batch = 5;
  Conv2d plain("conv0", in_shape, 4, 3, 1, 1), fused("conv0", in_shape, 4, 3, 1, 1);
  ASSERT_TRUE(fused.fuse_following_relu());
  std::int64_t total = 0;
  for (const auto& spec : plain.param_specs()) total += shape_numel(spec.shape);
  Tensor values({total}, DType::f32), grads_plain({total}, dtype), grads_fused({total}, dtype);
  fill_uniform(values, 40, -0.5f, 0.5f);
  for (auto [layer, grads] :
       {std::pair<Conv2d*, Tensor*>{&plain, &grads_plain}, {&fused, &grads_fused}}) {
    std::vector<Tensor> v, g;
    std::int64_t offset = 0;
    for (const auto& spec : layer->param_specs()) {
      v.push_back(Tensor::view(values, offset, spec.shape));
      g.push_back(Tensor::view(*grads, offset, spec.shape));
      offset += shape_numel(spec.shape);
    }
    layer->bind_params(std::move(v), std::move(g));
    layer->set_block_samples(2);
    layer->plan(batch, dtype);
  }
  const Shape x_shape{batch, 3, 7, 6}, y_shape{batch, 4, 7, 6};
  Tensor x32(x_shape, DType::f32), dz32(y_shape, DType::f32);
  fill_uniform(x32, 41, -1.f, 1.f);
  fill_uniform(dz32, 42, -1.f, 1.f);
  Tensor x(x_shape, dtype), dz(y_shape, dtype);
  kernels::cast(x32, x);
  kernels::cast(dz32, dz);
  // Apart: y = conv(x), z = relu(y); dy = relu'(z) dz, then conv's backward from dy.
  Tensor y(y_shape, dtype), z(y_shape, dtype), dy(y_shape, dtype), dx_plain(x_shape, dtype);
  plain.forward(x, y, true);
  kernels::relu_forward(y, z);
  kernels::relu_backward(z, dz, dy);
  plain.backward(x, y, dy, &dx_plain);
  // Fused: z straight from the conv, and its backward takes dz.
  Tensor z_fused(y_shape, dtype), dx_fused(x_shape, dtype);
  fused.forward(x, z_fused, true);
  fused.backward(x, z_fused, dz, &dx_fused);
  const auto z_values = values_of(z);
  EXPECT_GT(std::count(z_values.begin(), z_values.end(), 0.0), 20);  // the ReLU cut some
  EXPECT_LT(std::count(z_values.begin(), z_values.end(), 0.0),
            static_cast<long>(z_values.size()) - 20);
  for (auto [got, want] : {std::pair<const Tensor*, const Tensor*>{&z_fused, &z},
                           {&dx_fused, &dx_plain},
                           {&grads_fused, &grads_plain}}) {
    const auto got_values = values_of(*got);
    const auto want_values = values_of(*want);
    ASSERT_EQ(got_values.size(), want_values.size());
    for (std::size_t i = 0; i < got_values.size(); ++i)
      ASSERT_EQ(got_values[i], want_values[i]) << i;
  }
  EXPECT_EQ(fused.uses_dnnl(), path == HostConvPath::onednn && dtype == DType::f32 &&
                                   kernels::dnnl_available());
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedRelu, testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(ConvModel, ReluAfterConvIsFoldedIntoIt) {
  // conv,relu folds (the relu's output is the conv's buffer); dense,relu does not.
  const Model model =
      Model::build("conv:4:3:pad=1,relu,maxpool:2,flatten,dense:8,relu,dense:3", {1, 8, 8}, 3);
  const auto& layers = model.layers();
  ASSERT_EQ(layers.size(), 7u);
  EXPECT_TRUE(layers[1]->output_aliases_input());
  EXPECT_FALSE(layers[5]->output_aliases_input());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ConvMixedPrecision, testing::Values(DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(ConvModel, CnnBuiltInSizeShapesAndSummary) {
  // cnn on 1x28x28, by hand:
  //   conv0 5x5, 1 -> 32, pad 2:    32*1*5*5 + 32     =       832   -> (32,28,28)
  //   maxpool2:                                                    -> (32,14,14)
  //   conv3 5x5, 32 -> 64, pad 2:   64*32*5*5 + 64    =    51,264   -> (64,14,14)
  //   maxpool5:                                                    -> (64,7,7) = 3136
  //   dense7 3136 -> 512:           3136*512 + 512    = 1,606,144
  //   dense9 512 -> 10:             512*10 + 10       =     5,130
  //   total                                             1,663,370
  Model model = Model::build("cnn", {1, 28, 28}, 10);
  EXPECT_EQ(model.num_params(), 1663370);
  EXPECT_EQ(model.spec(),
            "conv:32:5:pad=2,relu,maxpool:2,conv:64:5:pad=2,relu,maxpool:2,flatten,dense:512,"
            "relu,dense:10");
  const std::string summary = model.summary();
  for (const char* text :
       {"conv0", "(32,28,28)", "maxpool2", "(64,7,7)", "flatten6", "(3136)", "51264", "1663370"})
    EXPECT_NE(summary.find(text), std::string::npos) << text << "\n" << summary;
  // FLOPs per sample: conv0 784*32*(2*25+1), conv3 196*64*(2*800+1), dense as before.
  EXPECT_GT(model.flops_per_sample(), 784.0 * 32 * 51 + 196.0 * 64 * 1601);
  // (H,W) samples are one channel.
  EXPECT_EQ(Model::build("cnn", {28, 28}, 10).num_params(), 1663370);
  // Flatten is a view: training the cnn end to end on a tiny batch runs and is finite.
  model.init_params(1);
  model.plan(3);
  Tensor x({3, 1, 28, 28}, DType::f32);
  fill_uniform(x, 12, 0.f, 1.f);
  const Tensor& logits = model.forward(x, true);
  for (double v : values_of(logits)) ASSERT_TRUE(std::isfinite(v));
}

TEST(ConvModel, SpecErrorsNameTheOptionAndTheLayer) {
  struct Case {
    std::string spec;
    Shape sample;
    std::string expected;  // in the message
  };
  for (const auto& c : std::vector<Case>{
           {"conv:8:3,relu,pool:2,flatten,dense:10", {1, 28, 28}, "unknown layer 'pool'"},
           {"conv:8:3:stride=0,flatten,dense:10", {1, 28, 28}, "'conv:8:3:stride=0'"},
           {"conv:8:3:pad=-1,flatten,dense:10", {1, 28, 28}, "'conv:8:3:pad=-1'"},
           {"conv:8,flatten,dense:10", {1, 28, 28}, "'conv:8'"},
           {"conv:0:3,flatten,dense:10", {1, 28, 28}, "'conv:0:3'"},
           {"conv:8:3:dilation=2,flatten,dense:10", {1, 28, 28}, "'conv:8:3:dilation=2'"},
           {"maxpool:x,flatten,dense:10", {1, 28, 28}, "'maxpool:x'"},
           {"maxpool:2:pad=1,flatten,dense:10", {1, 28, 28}, "'maxpool:2:pad=1'"},
           {"gap:2,dense:10", {1, 28, 28}, "'gap:2'"},
           {"conv:8:9,flatten,dense:10", {1, 7, 7}, "layer conv0 ('conv:8:9'): kernel 9 is larger"},
           {"conv:8:3,maxpool:4,maxpool:4,flatten,dense:10",
            {1, 12, 12},
            "layer maxpool2 ('maxpool:4'): kernel 4 is larger than its input (8,2,2)"},
           {"conv:8:3,dense:10",
            {1, 28, 28},
            "layer dense1 ('dense:10'): a dense layer needs flat"},
           {"flatten,maxpool:2,dense:10",
            {1, 28, 28},
            "layer maxpool1 ('maxpool:2'): needs a (C,H,W)"},
           {"conv:8:3,flatten,dense:10", {784}, "need (C,H,W) or (H,W) samples"},
       }) {
    SCOPED_TRACE(c.spec);
    try {
      Model::build(c.spec, c.sample, 10);
      ADD_FAILURE() << "no UserError";
    } catch (const UserError& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find("--model.layers"), std::string::npos) << what;
      EXPECT_NE(what.find(c.expected), std::string::npos) << what;
      EXPECT_FALSE(error.hint().empty());
    }
  }
}

}  // namespace
}  // namespace mpt::nn
