// Every layer against a naive float64 reference, in two steps:
//  1. the reference's own backward (written in this file or reference_layers.hpp) is checked by
//     central differences in float64, with a tight tolerance: the reference is then trusted;
//  2. the real layer runs in fp32, fp16 and bf16 on the same inputs (rounded to the storage
//     dtype first, so both see identical numbers) and must match the reference's output,
//     parameter gradients and input gradient within the tolerance documented in docs/testing.md.
// Layers: dense, conv, relu, gelu, maxpool, avgpool, gap, flatten, bn (train and eval), dropout
// (with its fixed mask), the residual add, and resblock (with and without projection).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "kernels/add.hpp"
#include "kernels/cast.hpp"
#include "kernels/dropout.hpp"
#include "nn/batchnorm.hpp"
#include "nn/conv2d.hpp"
#include "nn/dense.hpp"
#include "nn/dropout_layer.hpp"
#include "nn/flatten_layer.hpp"
#include "nn/gelu_layer.hpp"
#include "nn/nn.hpp"
#include "nn/pool2d_layer.hpp"
#include "nn/relu_layer.hpp"
#include "nn/resblock.hpp"
#include "nn/workspace.hpp"
#include "tests/nn/gradcheck_util.hpp"
#include "tests/nn/reference_layers.hpp"

namespace mpt::nn {
namespace {

using test::I64;
using test::Vec;

// The residual Add as a layer, for this test only: Y = X + B with B a "parameter" holding a
// whole batch, so that both operands of kernels::add get a gradient (dB = dY, dX = dY).
class AddLayer final : public Layer {
 public:
  AddLayer(std::string name, Shape batch_shape)
      : Layer(std::move(name)), batch_shape_(std::move(batch_shape)) {}
  std::string_view kind() const override { return "add"; }
  std::string spec() const override { return "add"; }
  Shape output_shape(const Shape& in) const override { return in; }
  double flops_per_sample(const Shape& in) const override {
    return static_cast<double>(shape_numel(in));
  }
  std::vector<ParamSpec> param_specs() const override { return {{"other", batch_shape_, 1.f}}; }
  void forward(const Tensor& x, Tensor& y, bool) override { kernels::add(x, param_value(0), y); }
  void backward(const Tensor&, const Tensor&, const Tensor& dy, Tensor* dx) override {
    kernels::cast(dy, param_grad(0));
    if (dx) kernels::cast(dy, *dx);
  }

 private:
  Shape batch_shape_;
};

// Any float tensor as doubles.
Vec values_of(const Tensor& t) {
  Vec out(static_cast<std::size_t>(t.numel()));
  for (I64 i = 0; i < t.numel(); ++i) {
    const auto bits = [&] { return static_cast<const std::uint16_t*>(t.raw())[i]; };
    out[static_cast<std::size_t>(i)] = t.dtype() == DType::f32   ? t.data<float>()[i]
                                       : t.dtype() == DType::f16 ? half_bits_to_float(bits())
                                                                 : bf16_bits_to_float(bits());
  }
  return out;
}

Vec uniform(I64 n, std::uint64_t seed, double low, double high) {
  Tensor t({std::max<I64>(n, 1)}, DType::f32);
  test::fill_uniform(t, seed, static_cast<float>(low), static_cast<float>(high), 21);
  Vec v = values_of(t);
  v.resize(static_cast<std::size_t>(n));
  return v;
}

// V rounded to DTYPE and widened back: the numbers a tensor of DTYPE holds.
Vec rounded(const Vec& v, DType dtype) {
  Vec out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto f = static_cast<float>(v[i]);
    out[i] = dtype == DType::f32   ? f
             : dtype == DType::f16 ? half_bits_to_float(float_to_half_bits(f))
                                   : bf16_bits_to_float(float_to_bf16_bits(f));
  }
  return out;
}

Tensor tensor_of(const Vec& v, Shape shape, DType dtype) {
  Tensor f32(shape, DType::f32);
  for (std::size_t i = 0; i < v.size(); ++i) f32.data<float>()[i] = static_cast<float>(v[i]);
  if (dtype == DType::f32) return f32;
  Tensor out(std::move(shape), dtype);
  kernels::cast(f32, out);
  return out;
}

// A reference: forward(params, x) and backward(params, x, dy) -> (dparams, dx).
struct Reference {
  std::function<Vec(const Vec&, const Vec&)> forward;
  std::function<void(const Vec&, const Vec&, const Vec&, Vec&, Vec&)> backward;
};

// One layer under test.
struct Case {
  std::string name;
  std::function<std::unique_ptr<Layer>()> make;
  Shape sample;  // per-sample input shape
  I64 batch;
  Reference reference;
  double x_low = -2, x_high = 2;
  // Tolerance under 16 bits, in units of the dtype's unit roundoff u, relative to each
  // tensor's largest reference magnitude (docs/testing.md).
  double tolerance_u = 2;
  bool training = true;
  // Optional: set buffers or a context on the bound layer, before the forward.
  std::function<void(Layer&)> prepare;
  // Optional: the inputs (else uniform in [x_low, x_high)), e.g. a distinct ramp for max pool.
  std::function<Vec(I64)> inputs;
};

Case make_case(std::string name, std::function<std::unique_ptr<Layer>()> make, Shape sample,
               I64 batch, Reference reference) {
  Case c;
  c.name = std::move(name);
  c.make = std::move(make);
  c.sample = std::move(sample);
  c.batch = batch;
  c.reference = std::move(reference);
  return c;
}

I64 param_count(const Layer& layer) {
  I64 total = 0;
  for (const auto& spec : layer.param_specs()) total += shape_numel(spec.shape);
  return total;
}

Vec draw_params(const Layer& layer) { return uniform(param_count(layer), 5, -1.0, 1.0); }
Vec draw_inputs(const Case& c) {
  const I64 n = c.batch * shape_numel(c.sample);
  return c.inputs ? c.inputs(n) : uniform(n, 6, c.x_low, c.x_high);
}

// Step 1: the reference's backward against central differences of its forward, in float64.
// Loss = sum R .* Y. A step of 1e-6 leaves a truncation error ~1e-12 |f'''| and a rounding
// error ~1e-16 |loss| / 1e-6 ~ 1e-9; tolerance 1e-6 * max(1, |g|) is far above both and far
// below any wrong term. Inputs sit well away from kinks (relu at 0, ties in max pooling).
void check_reference(const Case& c) {
  const auto layer = c.make();
  Vec params = draw_params(*layer);
  Vec x = draw_inputs(c);
  const Vec y = c.reference.forward(params, x);
  const Vec r = uniform(static_cast<I64>(y.size()), 7, -1.0, 1.0);
  Vec dparams, dx;
  c.reference.backward(params, x, r, dparams, dx);
  ASSERT_EQ(dparams.size(), params.size());
  ASSERT_EQ(dx.size(), x.size());
  const auto loss = [&] {
    const Vec out = c.reference.forward(params, x);
    double sum = 0;
    for (std::size_t i = 0; i < out.size(); ++i) sum += r[i] * out[i];
    return sum;
  };
  const double eps = 1e-6;
  const auto numeric = [&](double& value) {
    const double saved = value;
    value = saved + eps;
    const double up = loss();
    value = saved - eps;
    const double down = loss();
    value = saved;
    return (up - down) / (2 * eps);
  };
  int nonzero = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const double g = numeric(params[i]);
    ASSERT_NEAR(dparams[i], g, 1e-6 * std::max(1.0, std::fabs(g))) << "param " << i;
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double g = numeric(x[i]);
    ASSERT_NEAR(dx[i], g, 1e-6 * std::max(1.0, std::fabs(g))) << "input " << i;
    nonzero += std::fabs(g) > 1e-3;
  }
  EXPECT_GT(nonzero, 0) << "the input gradient is all zero: the check would be vacuous";
}

double max_abs(const Vec& v) {
  double m = 0;
  for (double e : v) m = std::max(m, std::fabs(e));
  return m;
}

// |got - want| <= tolerance * max(max |want|, FLOOR) elementwise. FLOOR is the scale of the
// other gradients of the layer, for tensors whose true gradient is zero (conv biases before a
// BN, which removes any constant shift): theirs is then the rounding of cancelling sums.
void expect_close(const Vec& got, const Vec& want, double tolerance, const std::string& what,
                  double floor = 0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double bound = tolerance * std::max({max_abs(want), floor, 1e-30});
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], bound) << what << " element " << i << " of " << got.size();
}

// Step 2: the real layer in DTYPE against the reference on the same (rounded) inputs.
// Under f32 the layers compute in f32 from the same numbers: tolerance 2e-5 relative to the
// tensor's scale covers f32 sums of up to a few hundred terms. Under 16 bits each output is the
// f32 result rounded once (u/2) plus, for composite layers, rounded intermediates.
void check_layer(const Case& c, DType dtype) {
  SCOPED_TRACE(std::string(dtype_name(dtype)));
  auto layer = c.make();
  const I64 n_params = param_count(*layer);
  const Vec params = draw_params(*layer);
  // Parameters: f32 values (the compute copy) and gradients in the precision, as in a model.
  Tensor values({std::max<I64>(n_params, 1)}, DType::f32),
      grads({std::max<I64>(n_params, 1)}, dtype);
  for (I64 i = 0; i < n_params; ++i) values.data<float>()[i] = static_cast<float>(params[i]);
  std::vector<Tensor> value_views, grad_views;
  I64 offset = 0;
  for (const auto& spec : layer->param_specs()) {
    value_views.push_back(Tensor::view(values, offset, spec.shape));
    grad_views.push_back(Tensor::view(grads, offset, spec.shape));
    offset += shape_numel(spec.shape);
  }
  layer->bind_params(std::move(value_views), std::move(grad_views));
  I64 n_buffers = 0;
  for (const auto& spec : layer->buffer_specs()) n_buffers += shape_numel(spec.shape);
  Tensor buffers({std::max<I64>(n_buffers, 1)}, DType::f32);
  std::vector<Tensor> buffer_views;
  offset = 0;
  for (const auto& spec : layer->buffer_specs()) {
    buffer_views.push_back(Tensor::view(buffers, offset, spec.shape));
    for (I64 i = 0; i < shape_numel(spec.shape); ++i) buffers.data<float>()[offset + i] = spec.init;
    offset += shape_numel(spec.shape);
  }
  if (n_buffers > 0) layer->bind_buffers(std::move(buffer_views));
  if (c.prepare) c.prepare(*layer);

  const Shape out_sample = layer->output_shape(c.sample);
  Shape x_shape{c.batch}, y_shape{c.batch};
  x_shape.insert(x_shape.end(), c.sample.begin(), c.sample.end());
  y_shape.insert(y_shape.end(), out_sample.begin(), out_sample.end());
  layer->plan(c.batch, dtype);
  // The f32 workspace a model gives its dense layers under 16 bits (whole batch in one block).
  ComputeWorkspace workspace;
  workspace.block_rows = c.batch;
  workspace.input_rows = Tensor({c.batch * shape_numel(c.sample)}, DType::f32);
  workspace.output_rows = Tensor({c.batch * shape_numel(out_sample)}, DType::f32);
  workspace.weight_grad = Tensor({std::max<I64>(n_params, 1)}, DType::f32);
  workspace.bias_grad = Tensor({shape_numel(out_sample)}, DType::f32);
  if (dtype != DType::f32) layer->set_workspace(&workspace);

  const Vec x = rounded(draw_inputs(c), dtype);
  Tensor x_t = tensor_of(x, x_shape, dtype), y_t(y_shape, dtype), dx_t(x_shape, dtype);
  layer->forward(x_t, y_t, c.training);
  const Vec want_y = c.reference.forward(params, x);
  const double u = dtype == DType::f32 ? 0 : dtype == DType::f16 ? 0x1p-11 : 0x1p-8;
  const double tolerance = dtype == DType::f32 ? 2e-5 : c.tolerance_u * u;
  expect_close(values_of(y_t), want_y, tolerance, "output");

  const Vec dy = rounded(uniform(static_cast<I64>(want_y.size()), 8, -1.0, 1.0), dtype);
  const Tensor dy_t = tensor_of(dy, y_shape, dtype);
  layer->backward(x_t, y_t, dy_t, &dx_t);
  Vec want_dparams, want_dx;
  c.reference.backward(params, x, dy, want_dparams, want_dx);
  expect_close(values_of(dx_t), want_dx, tolerance, "input gradient");
  const Vec got_grads = values_of(grads);
  const double gradient_scale = std::max(max_abs(want_dparams), max_abs(want_dx));
  offset = 0;
  for (const auto& spec : layer->param_specs()) {
    const auto count = static_cast<std::size_t>(shape_numel(spec.shape));
    expect_close(test::slice(got_grads, static_cast<std::size_t>(offset), count),
                 test::slice(want_dparams, static_cast<std::size_t>(offset), count), tolerance,
                 "gradient of " + spec.name, gradient_scale);
    offset += static_cast<I64>(count);
  }
}

// ---- the cases ----

Case dense_case() {
  const I64 batch = 5, in = 7, out = 4;
  Reference ref;
  ref.forward = [=](const Vec& p, const Vec& x) {
    Vec y(static_cast<std::size_t>(batch * out));
    for (I64 b = 0; b < batch; ++b)
      for (I64 o = 0; o < out; ++o) {
        double sum = p[static_cast<std::size_t>(out * in + o)];
        for (I64 i = 0; i < in; ++i) sum += p[o * in + i] * x[b * in + i];
        y[b * out + o] = sum;
      }
    return y;
  };
  ref.backward = [=](const Vec& p, const Vec& x, const Vec& dy, Vec& dp, Vec& dx) {
    dp.assign(p.size(), 0.0);
    dx.assign(x.size(), 0.0);
    for (I64 b = 0; b < batch; ++b)
      for (I64 o = 0; o < out; ++o) {
        const double g = dy[b * out + o];
        dp[out * in + o] += g;
        for (I64 i = 0; i < in; ++i) {
          dp[o * in + i] += g * x[b * in + i];
          dx[b * in + i] += g * p[o * in + i];
        }
      }
  };
  return make_case(
      "dense", [] { return std::make_unique<Dense>("dense0", 7, 4); }, {in}, batch, ref);
}

Case conv_case() {
  const test::ConvRef g{2, 3, 7, 9, 4, 3, 2, 1};
  Reference ref;
  ref.forward = [=](const Vec& p, const Vec& x) {
    return g.forward(test::slice(p, 0, g.weights()), test::slice(p, g.weights(), g.o), x);
  };
  ref.backward = [=](const Vec& p, const Vec& x, const Vec& dy, Vec& dp, Vec& dx) {
    Vec dw, db;
    g.backward(test::slice(p, 0, g.weights()), x, dy, dw, db, dx);
    dp = dw;
    dp.insert(dp.end(), db.begin(), db.end());
  };
  return make_case(
      "conv",
      [] {
        return std::make_unique<Conv2d>("conv0", Shape{3, 7, 9}, 4, 3, 2, 1);
      },
      {3, 7, 9}, 2, ref);
}

// A shuffled ramp of distinct values 0.01 apart: no ties in a window and no value within 0.005 of
// zero, so max pooling and relu are differentiable at every input, even after bf16 rounding for
// the pools' comparisons in float64 (ties in the 16-bit run break to the first maximum in both).
Vec ramp(I64 n, double low) {
  const CounterRng rng(9, 0);
  std::vector<I64> order(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<I64>(i);
  for (std::size_t i = order.size() - 1; i > 0; --i)
    std::swap(order[i], order[static_cast<std::size_t>(rng.uniform(i) * (i + 1)) % (i + 1)]);
  Vec v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = low + 0.005 + 0.01 * static_cast<double>(order[i]);
  return v;
}

Case pool_case(PoolMode mode, I64 kernel, I64 stride) {
  const I64 planes = 2 * 3, h = 7, w = 9;
  const bool global = mode == PoolMode::global_average;
  const I64 kh = global ? h : kernel, kw = global ? w : kernel, s = global ? 1 : stride;
  const I64 oh = (h - kh) / s + 1, ow = (w - kw) / s + 1;
  const bool max = mode == PoolMode::max;
  // The first maximum of each window, in window scan order, as the layer picks it.
  const auto window = [=](const Vec& x, I64 p, I64 i, I64 j, I64& arg) {
    double acc = max ? -1e300 : 0.0;
    for (I64 a = 0; a < kh; ++a)
      for (I64 b = 0; b < kw; ++b) {
        const I64 at = (p * h + i * s + a) * w + j * s + b;
        if (max && x[at] > acc) {
          acc = x[at];
          arg = at;
        }
        if (!max) acc += x[at] / static_cast<double>(kh * kw);
      }
    return acc;
  };
  Reference ref;
  ref.forward = [=](const Vec&, const Vec& x) {
    Vec y;
    for (I64 p = 0; p < planes; ++p)
      for (I64 i = 0; i < oh; ++i)
        for (I64 j = 0; j < ow; ++j) {
          I64 arg = 0;
          y.push_back(window(x, p, i, j, arg));
        }
    return y;
  };
  ref.backward = [=](const Vec&, const Vec& x, const Vec& dy, Vec& dp, Vec& dx) {
    dp.clear();
    dx.assign(x.size(), 0.0);
    for (I64 p = 0; p < planes; ++p)
      for (I64 i = 0; i < oh; ++i)
        for (I64 j = 0; j < ow; ++j) {
          const double g = dy[(p * oh + i) * ow + j];
          I64 arg = 0;
          window(x, p, i, j, arg);
          if (max) {
            dx[arg] += g;
            continue;
          }
          for (I64 a = 0; a < kh; ++a)
            for (I64 b = 0; b < kw; ++b)
              dx[(p * h + i * s + a) * w + j * s + b] += g / static_cast<double>(kh * kw);
        }
  };
  Case c = make_case(
      std::string(max      ? "maxpool"
                  : global ? "gap"
                           : "avgpool"),
      [=] {
        return std::make_unique<Pool2dLayer>("pool0", mode, Shape{3, h, w}, kernel, stride);
      },
      {3, h, w}, 2, ref);
  c.inputs = [](I64 n) { return ramp(n, -1.5); };
  return c;
}

Case elementwise_case(const std::string& kind) {
  const bool gelu = kind == "gelu";
  Reference ref;
  ref.forward = [=](const Vec&, const Vec& x) {
    Vec y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i)
      y[i] = gelu             ? 0.5 * x[i] * (1 + std::erf(x[i] / std::sqrt(2.0)))
             : kind == "relu" ? (x[i] > 0 ? x[i] : 0.0)
                              : x[i];  // flatten
    return y;
  };
  ref.backward = [=](const Vec&, const Vec& x, const Vec& dy, Vec& dp, Vec& dx) {
    dp.clear();
    dx.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double v = x[i];
      const double slope =
          gelu ? 0.5 * (1 + std::erf(v / std::sqrt(2.0))) +
                     v * std::exp(-0.5 * v * v) / std::sqrt(2.0 * 3.14159265358979323846)
          : kind == "relu" ? (v > 0 ? 1.0 : 0.0)
                           : 1.0;
      dx[i] = dy[i] * slope;
    }
  };
  const Shape sample{2, 3, 3};
  Case c = make_case(
      kind,
      [=]() -> std::unique_ptr<Layer> {
        if (gelu) return std::make_unique<GeluLayer>("gelu0", sample);
        if (kind == "relu") return std::make_unique<ReluLayer>("relu0");
        return std::make_unique<FlattenLayer>("flatten0");
      },
      sample, 4, ref);
  c.inputs = [](I64 n) { return ramp(n, -0.36); };  // both signs, none near 0
  // GELU in f32 uses libm's f32 erf: a few ulp, well inside 2e-5; under 16 bits: 2u.
  return c;
}

Case batchnorm_case(const Shape& sample, bool training) {
  const I64 channels = sample[0], plane = shape_numel(sample) / channels, batch = 4;
  const test::BatchNormRef bn{batch, channels, plane};
  // Eval: running statistics set by prepare() to these values.
  const Vec running_mean = uniform(channels, 10, -0.5, 0.5);
  const Vec running_var = uniform(channels, 11, 0.5, 2.0);
  Reference ref;
  ref.forward = [=](const Vec& p, const Vec& x) {
    const Vec gamma = test::slice(p, 0, static_cast<std::size_t>(channels));
    const Vec beta =
        test::slice(p, static_cast<std::size_t>(channels), static_cast<std::size_t>(channels));
    return training ? bn.forward(gamma, beta, x)
                    : bn.forward(gamma, beta, x, &running_mean, &running_var);
  };
  ref.backward = [=](const Vec& p, const Vec& x, const Vec& dy, Vec& dp, Vec& dx) {
    const Vec gamma = test::slice(p, 0, static_cast<std::size_t>(channels));
    Vec dgamma, dbeta;
    if (training) {
      bn.backward(gamma, x, dy, dgamma, dbeta, dx);
    } else {
      // Statistics are constants: y = gamma (x - m) / sqrt(v + eps) + beta.
      dgamma.assign(static_cast<std::size_t>(channels), 0.0);
      dbeta.assign(static_cast<std::size_t>(channels), 0.0);
      dx.assign(x.size(), 0.0);
      for (I64 i = 0; i < static_cast<I64>(x.size()); ++i) {
        const I64 k = (i / plane) % channels;
        const double inv = 1 / std::sqrt(running_var[k] + 1e-5);
        dgamma[k] += dy[i] * (x[i] - running_mean[k]) * inv;
        dbeta[k] += dy[i];
        dx[i] = dy[i] * gamma[k] * inv;
      }
    }
    dp = dgamma;
    dp.insert(dp.end(), dbeta.begin(), dbeta.end());
  };
  Case c = make_case(
      std::string(training ? "bn train " : "bn eval ") + shape_to_string(sample),
      [=] { return std::make_unique<BatchNorm>("bn0", sample); }, sample, batch, ref);
  c.training = training;
  // Mean away from zero, to exercise the centring.
  c.x_low = -1.0;
  c.x_high = 3.0;
  if (!training)
    c.prepare = [=](Layer& layer) {
      for (I64 k = 0; k < channels; ++k) {
        Tensor mean = layer.buffers()[0].value, var = layer.buffers()[1].value;  // shared views
        mean.data<float>()[k] = static_cast<float>(running_mean[k]);
        var.data<float>()[k] = static_cast<float>(running_var[k]);
      }
    };
  // Normalising divides by the batch std (~1.2 here), and dx has three terms of similar size:
  // rounding of the 16-bit output and dx (u/2 each of their scale) plus f32 coefficients; 4u.
  c.tolerance_u = 4;
  return c;
}

Case dropout_case() {
  const double rate = 0.3;
  const Shape sample{3, 5};
  const I64 batch = 6, features = 15;
  // The mask of the layer's training forward under this context, replayed by the reference.
  static StepContext context;
  context.seed = 1234;
  context.step = 77;
  context.sample_offset = 12;
  const DropoutLayer probe("dropout0", rate, 3);
  const kernels::DropoutKey key = probe.key(context, features);
  const auto mask = [=](std::size_t i) {
    return kernels::dropout_keeps(static_cast<float>(rate), key, i)
               ? 1.0 / (1.0 - static_cast<float>(rate))
               : 0.0;
  };
  Reference ref;
  ref.forward = [=](const Vec&, const Vec& x) {
    Vec y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] * mask(i);
    return y;
  };
  ref.backward = [=](const Vec&, const Vec& x, const Vec& dy, Vec& dp, Vec& dx) {
    dp.clear();
    dx.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) dx[i] = dy[i] * mask(i);
  };
  Case c = make_case(
      "dropout", [=] { return std::make_unique<DropoutLayer>("dropout0", rate, 3); }, sample, batch,
      ref);
  c.prepare = [](Layer& layer) { layer.set_context(&context); };
  return c;
}

Case add_case() {
  const Shape sample{2, 5};
  const I64 batch = 3;
  Reference ref;
  ref.forward = [](const Vec& p, const Vec& x) { return test::add(x, p); };
  ref.backward = [](const Vec&, const Vec&, const Vec& dy, Vec& dp, Vec& dx) {
    dp = dy;
    dx = dy;
  };
  return make_case(
      "add",
      [=] {
        return std::make_unique<AddLayer>("add0", Shape{batch, 2, 5});
      },
      sample, batch, ref);
}

Case resblock_case(I64 in_channels, I64 channels, I64 stride) {
  const test::ResBlockRef block{3, in_channels, 6, 5, channels, stride};
  Reference ref;
  ref.forward = [=](const Vec& p, const Vec& x) { return block.forward(p, x); };
  ref.backward = [=](const Vec& p, const Vec& x, const Vec& dy, Vec& dp, Vec& dx) {
    block.backward(p, x, dy, dp, dx);
  };
  Case c = make_case(
      "resblock " + std::to_string(in_channels) + "->" + std::to_string(channels) + " stride " +
          std::to_string(stride),
      [=] {
        return std::make_unique<ResBlock>("resblock0", Shape{in_channels, 6, 5}, channels, stride);
      },
      {in_channels, 6, 5}, 3, ref);
  // Five 16-bit roundings in a row (conv1, bn1, conv2, the sum, and the gradients back), two
  // of them followed by a normalisation that divides by a batch std below 1: 16u.
  c.tolerance_u = 16;
  return c;
}

std::vector<Case> all_cases() {
  return {dense_case(),
          conv_case(),
          elementwise_case("relu"),
          elementwise_case("gelu"),
          elementwise_case("flatten"),
          pool_case(PoolMode::max, 3, 2),
          pool_case(PoolMode::average, 2, 1),
          pool_case(PoolMode::global_average, 0, 0),
          batchnorm_case({3, 4, 5}, true),
          batchnorm_case({3, 4, 5}, false),
          batchnorm_case({6}, true),
          dropout_case(),
          add_case(),
          resblock_case(3, 3, 1),
          resblock_case(2, 4, 2)};
}

TEST(LayerReference, Float64ReferencesPassCentralDifferences) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    check_reference(c);
  }
}

class LayerVersusReference : public testing::TestWithParam<DType> {};

TEST_P(LayerVersusReference, OutputsAndGradientsMatchTheReference) {
  for (const Case& c : all_cases()) {
    SCOPED_TRACE(c.name);
    check_layer(c, GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LayerVersusReference,
                         testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace mpt::nn
