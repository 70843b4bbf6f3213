// nn::Model under fp16 and bf16: the storage layout (16-bit working copy, FP32 masters that
// alias the working copy under f32), exact recasting, gradient checks of every layer against the
// f32 model, the underflow that loss scaling exists for, forward accuracy, the first-non-finite
// re-check and the activation memory.
//
// How the gradients are checked. A finite difference of the 16-bit forward is dominated by its
// rounding: a step h changes the loss by ~h*g, while rounding the activations moves it by
// ~u*|loss| (u = 2^-11 for fp16, 2^-8 for bf16), so the quotient carries an error ~u/h that no
// step size makes small for bf16. Instead, the f32 model is the reference: its analytic gradient
// is anchored by central differences (ModelGradcheck in test_dense_gradcheck.cpp, and once more
// below on the exact network used here), and the 16-bit model must reproduce it on identical
// weights (the masters rounded to 16 bits, exactly representable in f32) and identical inputs.
// What may differ is the 16-bit rounding of the activations, of the activation gradients and of
// the stored gradient: a few roundings of relative size u each. The tolerances below are those
// few u, derived per test.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/half.hpp"
#include "core/random.hpp"
#include "kernels/matmul.hpp"
#include "kernels/softmax_xent.hpp"
#include "kernels/unscale_check.hpp"
#include "nn/conv2d.hpp"
#include "nn/nn.hpp"
#include "nn/relu_layer.hpp"
#include "optim/optim.hpp"

namespace mpt::nn {
namespace {

double unit_roundoff(DType dtype) { return dtype == DType::f16 ? 0x1p-11 : 0x1p-8; }

float widen(DType dtype, std::uint16_t bits) {
  return dtype == DType::f16 ? half_bits_to_float(bits) : bf16_bits_to_float(bits);
}
std::uint16_t round_to(DType dtype, float value) {
  return dtype == DType::f16 ? float_to_half_bits(value) : float_to_bf16_bits(value);
}

// Any float tensor (f32 or 16-bit) as doubles.
std::vector<double> values_of(const Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i)
    out[i] = t.dtype() == DType::f32
                 ? t.data<float>()[i]
                 : widen(t.dtype(), static_cast<const std::uint16_t*>(t.raw())[i]);
  return out;
}

Tensor uniform(Shape shape, std::uint64_t seed, float low, float high) {
  Tensor t(std::move(shape), DType::f32);
  const CounterRng rng(seed, 11);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = low + (high - low) * rng.uniform(static_cast<std::uint64_t>(i));
  return t;
}

// An f32 model whose parameters are MODEL's working copy, widened: the same weights exactly.
Model f32_twin(const Model& model, const std::string& spec, const Shape& sample, int classes) {
  Model twin = Model::build(spec, sample, classes);
  const auto working = values_of(model.params());
  for (std::int64_t i = 0; i < twin.num_params(); ++i)
    twin.params().data<float>()[i] = static_cast<float>(working[i]);
  return twin;
}

class MixedPrecision : public testing::TestWithParam<DType> {};

TEST(MixedPrecisionLayout, MastersAreTheWorkingCopyUnderF32) {
  Model model = Model::build("dense:5,relu,dense:3", {4}, 3);
  EXPECT_EQ(model.precision(), DType::f32);
  EXPECT_EQ(model.master_params().raw(), model.params().raw());
  EXPECT_EQ(model.master_grads().raw(), model.grads().raw());
  const auto named = model.named_params();
  EXPECT_EQ(named[1].value.raw(), static_cast<float*>(model.params().raw()) + 20);
  EXPECT_EQ(model.named_working_params()[1].value.raw(), named[1].value.raw());
}

TEST_P(MixedPrecision, LayoutOfWorkingCopyAndMasters) {
  const DType dtype = GetParam();
  Model model = Model::build("dense:5,relu,dense:3", {4}, 3, dtype);
  EXPECT_EQ(model.precision(), dtype);
  EXPECT_EQ(model.params().dtype(), dtype);
  EXPECT_EQ(model.grads().dtype(), dtype);
  EXPECT_EQ(model.master_params().dtype(), DType::f32);
  EXPECT_EQ(model.master_grads().dtype(), DType::f32);
  EXPECT_EQ(model.master_params().numel(), model.num_params());
  EXPECT_NE(model.master_params().raw(), model.params().raw());
  // The checkpoint's view is the masters; the working view is the 16-bit copy.
  const auto named = model.named_params();
  const auto working = model.named_working_params();
  ASSERT_EQ(named.size(), 4u);
  EXPECT_EQ(named[2].name, "dense2/weight");
  EXPECT_EQ(named[2].value.dtype(), DType::f32);
  EXPECT_EQ(named[2].value.raw(), model.master_params().data<float>() + 25);
  EXPECT_EQ(named[2].grad.raw(), model.master_grads().data<float>() + 25);
  EXPECT_EQ(working[2].value.dtype(), dtype);
  EXPECT_EQ(working[2].value.raw(), static_cast<std::uint16_t*>(model.params().raw()) + 25);
  EXPECT_EQ(working[2].grad.raw(), static_cast<std::uint16_t*>(model.grads().raw()) + 25);
  model.plan(4);
  Tensor x = uniform({4, 4}, 1, -1.f, 1.f);
  EXPECT_EQ(model.forward(x, true).dtype(), DType::f32);  // logits stay f32
}

TEST_P(MixedPrecision, InitGivesTheF32MastersAndRecastRoundsExactly) {
  const DType dtype = GetParam();
  Model reference = Model::build("dense:50,relu,dense:10", {1, 8, 8}, 10);
  Model model = Model::build("dense:50,relu,dense:10", {1, 8, 8}, 10, dtype);
  reference.init_params(42);
  model.init_params(42);
  const float* master = model.master_params().data<float>();
  const auto* working = static_cast<const std::uint16_t*>(model.params().raw());
  for (std::int64_t i = 0; i < model.num_params(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(master[i]),
              std::bit_cast<std::uint32_t>(reference.params().data<float>()[i]))
        << i;
    ASSERT_EQ(working[i], round_to(dtype, master[i])) << i;
  }
  // Values that stress the rounding: ties, subnormals, fp16 overflow, Inf, NaN.
  const float specials[] = {1.f + 0x1p-11f,
                            1.f + 3 * 0x1p-11f,
                            1.f + 0x1p-8f,
                            1.f + 3 * 0x1p-8f,
                            3e-8f,
                            6e-8f,
                            -1e-7f,
                            65519.f,
                            65520.f,
                            1e30f,
                            std::numeric_limits<float>::infinity(),
                            -0.f};
  float* masters = model.master_params().data<float>();
  for (std::size_t i = 0; i < std::size(specials); ++i) masters[i * 7] = specials[i];
  masters[100] = std::numeric_limits<float>::quiet_NaN();
  model.recast_from_master();
  for (std::size_t i = 0; i < std::size(specials); ++i)
    EXPECT_EQ(working[i * 7], round_to(dtype, specials[i])) << specials[i];
  EXPECT_TRUE(std::isnan(widen(dtype, working[100])));
}

TEST_P(MixedPrecision, SingleDenseComputesWithTheRoundedWeightsExactly) {
  // One dense layer reads the f32 input, rounded to the precision as autocast does, and writes
  // f32 logits, so the 16-bit effects are the roundings of the weights and of the input: where
  // the layer widens to f32, the model rounds the input first and its logits equal the f32
  // model's on the rounded weights and input bit for bit, and its gradients are the f32
  // gradients rounded once (also exact, 0 ulp). Where the host matmul takes the 16-bit dtype
  // (bf16 on AMX or AVX512-BF16), the layer rounds the input itself and sums in oneDNN's bf16
  // order: then the logits are the twin's to f32 summation error (6 terms), and the gradients
  // (f32 dlogits: the widened path, on the input as given) stay exact.
  const DType dtype = GetParam();
  const bool native = kernels::host_matmul_takes(dtype);
  Model model = Model::build("dense:4", {6}, 4, dtype);
  model.init_params(3);
  Model twin = f32_twin(model, "dense:4", {6}, 4);
  model.plan(3);
  twin.plan(3);
  const Tensor x = uniform({3, 6}, 2, -2.f, 2.f);
  Tensor x_rounded = uniform({3, 6}, 2, -2.f, 2.f);
  for (std::int64_t i = 0; i < x_rounded.numel(); ++i)
    x_rounded.data<float>()[i] = widen(dtype, round_to(dtype, x_rounded.data<float>()[i]));
  const Tensor r = uniform({3, 4}, 4, -1.f, 1.f);  // loss = sum r .* logits, dlogits = r
  const auto logits = values_of(model.forward(x, true));
  const auto twin_logits = values_of(twin.forward(x_rounded, true));
  for (std::size_t i = 0; i < logits.size(); ++i) {
    if (native) {
      ASSERT_NEAR(logits[i], twin_logits[i], 8 * 0x1p-24 * 6 * 2 * 2) << i;
    } else {
      ASSERT_EQ(logits[i], twin_logits[i]) << i;
    }
  }
  if (native) twin.forward(x, true);  // the gradients below are of the unrounded input
  model.backward(r);
  twin.backward(r);
  const auto* grads = static_cast<const std::uint16_t*>(model.grads().raw());
  for (std::int64_t i = 0; i < model.num_params(); ++i)
    ASSERT_EQ(grads[i], round_to(dtype, twin.grads().data<float>()[i])) << i;
}

TEST_P(MixedPrecision, ReluLayerOnSixteenBitEqualsF32Relu) {
  const DType dtype = GetParam();
  ReluLayer relu("relu0");
  const Tensor wide = uniform({6, 9}, 8, -2.f, 2.f);
  const Tensor wide_dy = uniform({6, 9}, 9, -1.f, 1.f);
  Tensor x({6, 9}, dtype), y({6, 9}, dtype), dy({6, 9}, dtype), dx({6, 9}, dtype);
  for (std::int64_t i = 0; i < 54; ++i) {
    static_cast<std::uint16_t*>(x.raw())[i] = round_to(dtype, wide.data<float>()[i]);
    static_cast<std::uint16_t*>(dy.raw())[i] = round_to(dtype, wide_dy.data<float>()[i]);
  }
  relu.forward(x, y, true);
  relu.backward(x, y, dy, &dx);
  const auto xs = values_of(x), ys = values_of(y), dys = values_of(dy), dxs = values_of(dx);
  for (std::size_t i = 0; i < xs.size(); ++i) {
    ASSERT_EQ(ys[i], std::max(xs[i], 0.0)) << i;  // exact: ReLU outputs its input or 0
    ASSERT_EQ(dxs[i], xs[i] > 0 ? dys[i] : 0.0) << i;
  }
}

// The first seed from which "dense:8,relu,dense:3" keeps every hidden pre-activation 0.05 away
// from ReLU's kink on X, in both models (a kink crossed by rounding would flip a mask).
std::uint64_t seed_away_from_kink(Model& twin, const Tensor& x) {
  for (std::uint64_t seed = 1; seed < 1000; ++seed) {
    twin.init_params(seed);
    Tensor hidden({x.dim(0), 8}, DType::f32);
    const_cast<Layer&>(*twin.layers()[0]).forward(x, hidden, false);
    double margin = 1e9;
    for (std::int64_t i = 0; i < hidden.numel(); ++i)
      margin = std::min(margin, std::fabs(double{hidden.data<float>()[i]}));
    if (margin > 0.05) return seed;
  }
  return 0;
}

TEST_P(MixedPrecision, GradcheckDenseReluDenseWithSoftmaxXent) {
  const DType dtype = GetParam();
  const double u = unit_roundoff(dtype);
  const std::string spec = "dense:8,relu,dense:3";
  const std::int64_t batch = 4;
  const Tensor x = uniform({batch, 5}, 10, -2.f, 2.f);
  Tensor labels({batch}, DType::i32);
  for (std::int64_t i = 0; i < batch; ++i)
    labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(i % 3);

  Model model = Model::build(spec, {5}, 3, dtype);
  Model probe = Model::build(spec, {5}, 3);
  const std::uint64_t seed = seed_away_from_kink(probe, x);
  ASSERT_NE(seed, 0u);
  model.init_params(seed);
  Model twin = f32_twin(model, spec, {5}, 3);
  model.plan(batch);
  twin.plan(batch);
  Tensor dlogits({batch, 3}, DType::f32), twin_dlogits({batch, 3}, DType::f32);
  kernels::softmax_xent_forward_backward(model.forward(x, true), labels, dlogits, 1.f);
  model.backward(dlogits);
  kernels::softmax_xent_forward_backward(twin.forward(x, true), labels, twin_dlogits, 1.f);
  twin.backward(twin_dlogits);

  // The anchor: the f32 twin against central differences (as in ModelGradcheck, same bound).
  Tensor twin_params = twin.params();
  const float eps = 1e-2f;
  const auto loss = [&] {
    return kernels::softmax_xent_forward(twin.forward(x, true), labels).loss_sum;
  };
  for (std::int64_t i = 0; i < twin_params.numel(); ++i) {
    float* p = twin_params.data<float>() + i;
    const float saved = *p;
    *p = saved + eps;
    const double up_arg = *p, up = loss();
    *p = saved - eps;
    const double down_arg = *p, down = loss();
    *p = saved;
    const double numeric = (up - down) / (up_arg - down_arg);
    ASSERT_NEAR(twin.grads().data<float>()[i], numeric, 2e-4 * std::max(1.0, std::fabs(numeric)))
        << "f32 anchor, param " << i;
  }
  twin.forward(x, true);
  twin.backward(twin_dlogits);

  // Error budget of a 16-bit gradient against the f32 one, per parameter tensor: the hidden
  // activations, the hidden gradient and the stored gradient are each rounded once (u relative
  // each), and the rounded hidden activations move the logits, hence dlogits, by about u times
  // their scale. Each gradient entry is a sum over the batch, so its error is bounded by u times
  // the sum of the magnitudes of its terms, not by u times the (possibly cancelled) sum. At
  // batch 4 that sum of magnitudes stays within the largest gradient of the tensor, so the
  // tolerance is 4u * (|g| + max |g| of the tensor): four roundings, on a scale that cancellation
  // cannot shrink. Measured: about 0.5 in those units for both formats. (At large batches the
  // sum of magnitudes grows like the batch and |g| like its square root, which is why the
  // several-block test below compares against the same 16-bit computation instead.)
  const auto g16 = values_of(model.grads());
  const auto g32 = values_of(twin.grads());
  double worst = 0;  // the largest error in units of u * (|g| + max|g|), reported below
  std::int64_t nonzero = 0;
  for (const auto& param : model.named_params()) {
    const std::int64_t begin =
        static_cast<const float*>(param.value.raw()) - model.master_params().data<float>();
    const std::int64_t end = begin + param.value.numel();
    double scale = 0;
    for (std::int64_t i = begin; i < end; ++i) scale = std::max(scale, std::fabs(g32[i]));
    for (std::int64_t i = begin; i < end; ++i) {
      const double bound = u * (std::fabs(g32[i]) + scale);
      worst = std::max(worst, std::fabs(g16[i] - g32[i]) / bound);
      EXPECT_LE(std::fabs(g16[i] - g32[i]), 4 * bound) << param.name << " entry " << i - begin;
      nonzero += std::fabs(g32[i]) > 1e-3;
    }
  }
  EXPECT_GT(nonzero, model.num_params() / 2);  // real gradients were compared, not zeros
  RecordProperty("worst_error_in_u", std::to_string(worst));
  std::printf("    %s: worst gradient error %.2f u(|g| + max|g|)\n", dtype_name(dtype), worst);
}

TEST_P(MixedPrecision, MlpLogitsCloseToF32) {
  // Two hidden layers of 1024 are rounded to 16 bits: a relative perturbation of at most u per
  // activation, which each next layer sums over 1024 inputs with random signs, so it reaches the
  // logits as about u times their own scale (sqrt(1024) terms against a sum of sqrt(1024)
  // magnitude). Measured: about 0.5u * max |logit| for both formats. Tolerance 4u * max |logit|
  // covers two layers with margin; a missing bias or a wrong block is off by far more.
  const DType dtype = GetParam();
  const double u = unit_roundoff(dtype);
  Model model = Model::build("mlp", {1, 28, 28}, 10, dtype);
  model.init_params(5);
  Model twin = f32_twin(model, "mlp", {1, 28, 28}, 10);
  model.plan(32);
  twin.plan(32);
  const Tensor x = uniform({32, 1, 28, 28}, 6, -1.f, 1.f);
  const auto logits = values_of(model.forward(x, false));
  const auto reference = values_of(twin.forward(x, false));
  double scale = 0, worst = 0;
  for (double v : reference) scale = std::max(scale, std::fabs(v));
  for (std::size_t i = 0; i < logits.size(); ++i)
    worst = std::max(worst, std::fabs(logits[i] - reference[i]));
  std::printf("    %s: max |logit error| = %.2f u max|logit| (max|logit| %.3f)\n",
              dtype_name(dtype), worst / (u * scale), scale);
  EXPECT_LE(worst, 4 * u * scale);
  EXPECT_GT(worst, 0.0);  // the activations really were rounded
}

// A 16-bit model computes on its f32 input rounded to the precision, on every path: the 16-bit
// GEMM paths round it inside the first layer, and where the layers widen to f32 the model rounds
// it first (nn::Model's rounded_input_), so the host and the cuda device compute one function.
// So the input and its rounding give the same logits and gradients, bit for bit, for a dense
// and a conv first layer. Until 2026-12-07 the widened path (fp16 anywhere, bf16 without native
// GEMMs) computed on the unrounded input and failed this; the CUDA emulator found it.
TEST_P(MixedPrecision, TheModelComputesOnItsInputRoundedToThePrecision) {
  const DType dtype = GetParam();
  for (const char* spec : {"dense:24,relu,dense:10", "conv:4:3:pad=1,relu,flatten,dense:10"}) {
    Model model = Model::build(spec, {1, 6, 6}, 10, dtype);
    model.init_params(4);
    model.plan(5);
    const Tensor x = uniform({5, 1, 6, 6}, 8, -1.f, 1.f);
    Tensor rounded({5, 1, 6, 6}, DType::f32);
    bool any_change = false;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      rounded.data<float>()[i] = widen(dtype, round_to(dtype, x.data<float>()[i]));
      any_change |= rounded.data<float>()[i] != x.data<float>()[i];
    }
    ASSERT_TRUE(any_change) << "the input must not be representable already";
    Tensor labels({5}, DType::i32);
    for (std::int64_t i = 0; i < 5; ++i) labels.data<std::int32_t>()[i] = static_cast<int>(i * 3 % 10);
    std::vector<double> logits[2], grads[2];
    for (int pass = 0; pass < 2; ++pass) {
      const Tensor& out = model.forward(pass == 0 ? x : rounded, true);
      logits[pass] = values_of(out);
      Tensor dlogits(out.shape(), DType::f32);
      kernels::softmax_xent_forward_backward(out, labels, dlogits, 0.2f);
      model.backward(dlogits);
      grads[pass] = values_of(model.grads());
    }
    EXPECT_EQ(logits[0], logits[1]) << spec << " " << dtype_name(dtype);
    EXPECT_EQ(grads[0], grads[1]) << spec << " " << dtype_name(dtype);
  }
}

TEST_P(MixedPrecision, BatchOfSeveralRowBlocksEqualsItsBlocksRunAlone) {
  // 1100 rows are three blocks of the f32 scratch (512, 512, 76). Rows are independent in the
  // forward pass, so the blocked logits equal those of the three blocks run as batches of their
  // own, bit for bit (same matmul shapes). The gradients are the f32 sum of the blocks' f32
  // partial gradients, rounded once; the blocks run alone round each partial instead. So the
  // two differ by at most u * |blocked| + u * sum |partial| (plus f32 noise): a dropped block,
  // an overwritten accumulator or a misplaced row is off by whole partials.
  const DType dtype = GetParam();
  const double u = unit_roundoff(dtype);
  const std::string spec = "dense:32,relu,dense:16,relu,dense:4";
  const std::int64_t batch = 1100;
  const std::int64_t blocks[3][2] = {{0, 512}, {512, 512}, {1024, 76}};  // first row, rows
  Model model = Model::build(spec, {12}, 4, dtype);
  model.init_params(4);
  model.plan(batch);
  const Tensor x = uniform({batch, 12}, 5, -1.f, 1.f);
  Tensor labels({batch}, DType::i32);
  for (std::int64_t i = 0; i < batch; ++i)
    labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(i * 7 % 4);
  // The loss scale as in training, so that fp16 activation gradients stay normal numbers.
  const float grad_scale = 1024.f / batch;
  Tensor dlogits({batch, 4}, DType::f32);
  const auto logits = values_of(model.forward(x, true));
  kernels::softmax_xent_forward_backward(model.forward(x, true), labels, dlogits, grad_scale);
  model.backward(dlogits);
  const auto blocked = values_of(model.grads());

  std::vector<double> sum(blocked.size(), 0.0), magnitude(blocked.size(), 0.0);
  for (const auto& [first, rows] : blocks) {
    const Tensor x_rows = Tensor::view(x, first * 12, {rows, 12});
    const Tensor label_rows = Tensor::view(labels, first, {rows});
    Tensor dlogit_rows({rows, 4}, DType::f32);
    const auto block_logits = values_of(model.forward(x_rows, true));
    for (std::int64_t i = 0; i < rows * 4; ++i)
      ASSERT_EQ(block_logits[i], logits[first * 4 + i]) << "row block at " << first << ", " << i;
    kernels::softmax_xent_forward_backward(model.forward(x_rows, true), label_rows, dlogit_rows,
                                           grad_scale);
    model.backward(dlogit_rows);
    const auto partial = values_of(model.grads());
    for (std::size_t i = 0; i < partial.size(); ++i) {
      sum[i] += partial[i];
      magnitude[i] += std::fabs(partial[i]);
    }
  }
  for (std::size_t i = 0; i < blocked.size(); ++i)
    ASSERT_NEAR(blocked[i], sum[i],
                u * (std::fabs(blocked[i]) + magnitude[i]) + 1e-6 * magnitude[i])
        << "gradient " << i;
}

// The fraction of entries of a flat gradient that are exactly zero.
double zero_fraction(const std::vector<double>& values) {
  return static_cast<double>(std::count(values.begin(), values.end(), 0.0)) / values.size();
}

TEST(MixedPrecisionUnderflow, Fp16LosesTinyGradientsWithoutScalingAndKeepsThemWithIt) {
  // dlogits of 1e-8 (a small loss gradient divided by a large global batch) give weight
  // gradients around 1e-8..1e-7: below fp16's smallest subnormal (6e-8, and everything under
  // 3e-8 rounds to 0), well inside f32's and bf16's range. A loss scale of 65536 lifts them to
  // ~1e-3, where fp16 keeps 11 significant bits.
  const std::string spec = "dense:64,relu,dense:10";
  const std::int64_t batch = 8;
  const Tensor x = uniform({batch, 32}, 20, -1.f, 1.f);
  Tensor tiny = uniform({batch, 10}, 21, -1e-8f, 1e-8f);
  Tensor scaled({batch, 10}, DType::f32);
  const float scale = 65536.f;
  for (std::int64_t i = 0; i < tiny.numel(); ++i)
    scaled.data<float>()[i] = tiny.data<float>()[i] * scale;

  Model fp16 = Model::build(spec, {32}, 10, DType::f16);
  fp16.init_params(9);
  Model twin = f32_twin(fp16, spec, {32}, 10);
  fp16.plan(batch);
  twin.plan(batch);
  twin.forward(x, true);
  twin.backward(tiny);
  const auto reference = values_of(twin.grads());
  const double reference_zeros = zero_fraction(reference);  // dead ReLU units only

  fp16.forward(x, true);
  fp16.backward(tiny);
  const double unscaled_zeros = zero_fraction(values_of(fp16.grads()));

  fp16.forward(x, true);
  fp16.backward(scaled);
  const double scaled_zeros = zero_fraction(values_of(fp16.grads()));
  std::vector<Tensor> in{fp16.grads()}, out{fp16.master_grads()};
  ASSERT_TRUE(kernels::unscale_and_check(in, out, 1.f / scale));
  const auto recovered = values_of(fp16.master_grads());

  std::printf("    zero gradient entries: f32 %.3f, fp16 unscaled %.3f, fp16 scaled %.3f\n",
              reference_zeros, unscaled_zeros, scaled_zeros);
  EXPECT_LT(reference_zeros, 0.05);
  EXPECT_GT(unscaled_zeros, 0.9);
  EXPECT_LE(scaled_zeros, reference_zeros + 0.01);
  // And the unscaled master gradients are the f32 ones to fp16 rounding (see the gradcheck's
  // budget; no softmax here, so three roundings).
  double max_ref = 0;
  for (double v : reference) max_ref = std::max(max_ref, std::fabs(v));
  for (std::size_t i = 0; i < reference.size(); ++i)
    ASSERT_NEAR(recovered[i], reference[i], 4 * 0x1p-11 * (std::fabs(reference[i]) + max_ref)) << i;

  // bf16 shares f32's exponent range: the same tiny gradients survive without any scaling,
  // which is why bf16 defaults to no loss scaling.
  Model bf16 = Model::build(spec, {32}, 10, DType::bf16);
  bf16.init_params(9);
  bf16.plan(batch);
  bf16.forward(x, true);
  bf16.backward(tiny);
  EXPECT_LE(zero_fraction(values_of(bf16.grads())), reference_zeros + 0.01);
}

TEST_P(MixedPrecision, FirstNonfiniteLayerNamesTheLayer) {
  const DType dtype = GetParam();
  Model model = Model::build("dense:8,relu,dense:8,relu,dense:3", {5}, 3, dtype);
  model.init_params(1);
  model.plan(4);
  Tensor x = uniform({4, 5}, 3, -1.f, 1.f);
  EXPECT_EQ(model.first_nonfinite_layer(x), "");
  // dense0's bias of 10 makes every hidden unit about 10, and dense2's weights near fp16's
  // maximum make its outputs (sums of 8 such products) overflow fp16 but not the f32 compute;
  // for bf16, weights that overflow even f32. The overflow starts in dense2.
  const float huge = dtype == DType::f16 ? 60000.f : 3e38f;
  for (auto& param : model.named_params()) {
    const float value = param.name == "dense2/weight" ? huge
                        : param.name == "dense0/bias" ? 10.f
                                                      : 0.f;
    if (value != 0.f)
      for (std::int64_t i = 0; i < param.value.numel(); ++i) param.value.data<float>()[i] = value;
  }
  model.recast_from_master();
  EXPECT_EQ(model.first_nonfinite_layer(x), "dense2");
  x.data<float>()[7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(model.first_nonfinite_layer(x), "input");
}

TEST(MixedPrecisionLayout, FirstNonfiniteLayerUnderF32) {
  Model model = Model::build("dense:8,relu,dense:3", {5}, 3);
  model.init_params(1);
  model.plan(2);
  const Tensor x = uniform({2, 5}, 3, -1.f, 1.f);
  EXPECT_EQ(model.first_nonfinite_layer(x), "");
  model.params().data<float>()[0] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(model.first_nonfinite_layer(x), "dense0");
}

TEST_P(MixedPrecision, ActivationMemoryIsAboutHalf) {
  const DType dtype = GetParam();
  Model reference = Model::build("mlp", {1, 28, 28}, 10);
  Model model = Model::build("mlp", {1, 28, 28}, 10, dtype);
  EXPECT_EQ(model.activation_bytes(), 0);
  reference.plan(8192);
  model.plan(8192);
  // f32: (4 hidden outputs + 4 hidden gradients) x 1024 x 4 bytes + 10 f32 logits per sample,
  // and the two large dense layers' scratch for one 256-row block of dyᵀ (nn/dense.hpp).
  EXPECT_EQ(reference.activation_bytes(), 8192LL * (8 * 1024 * 4 + 10 * 4 + 2 * 256 * 4));
  // 16-bit: half of that for the hidden tensors, plus the f32 scratch for one block of 512
  // rows (two [512, 1024] blocks, a 1024 x 1024 weight gradient and a bias gradient), plus,
  // where the layers widen to f32 GEMMs, the input rounded to 16 bits (nn.hpp).
  const std::int64_t scratch = (2 * 512 * 1024 + 1024 * 1024 + 1024) * 4;
  const std::int64_t rounded_input = kernels::host_matmul_takes(dtype) ? 0 : 8192LL * 784 * 2;
  EXPECT_EQ(model.activation_bytes(), 8192LL * (8 * 1024 * 2 + 10 * 4) + scratch + rounded_input);
  EXPECT_LT(static_cast<double>(model.activation_bytes()) / reference.activation_bytes(), 0.55);
}

TEST_P(MixedPrecision, SgdOverTheMastersThenRecast) {
  // The trainer's order after the all-reduce: unscale the 16-bit gradients into the f32 master
  // gradients, step the masters, recast the working copy.
  const DType dtype = GetParam();
  Model model = Model::build("dense:5,relu,dense:3", {4}, 3, dtype);
  model.init_params(2);
  model.plan(2);
  optim::Sgd sgd(model.master_params(), model.master_grads(),
                 optim::SgdOptions{0.5f, 0.f, 0.f, false});
  const Tensor x = uniform({2, 4}, 1, -1.f, 1.f);
  Tensor labels({2}, DType::i32), dlogits({2, 3}, DType::f32);
  const std::vector<float> before(model.master_params().data<float>(),
                                  model.master_params().data<float>() + model.num_params());
  kernels::softmax_xent_forward_backward(model.forward(x, true), labels, dlogits, 1024.f / 2);
  model.backward(dlogits);
  std::vector<Tensor> in{model.grads()}, out{model.master_grads()};
  ASSERT_TRUE(kernels::unscale_and_check(in, out, 1.f / 1024));
  sgd.step(0.5f);
  model.recast_from_master();
  const float* master = model.master_params().data<float>();
  const auto* working = static_cast<const std::uint16_t*>(model.params().raw());
  std::int64_t moved = 0;
  for (std::int64_t i = 0; i < model.num_params(); ++i) {
    ASSERT_EQ(master[i], before[i] - 0.5f * model.master_grads().data<float>()[i]) << i;
    ASSERT_EQ(working[i], round_to(dtype, master[i])) << i;
    moved += master[i] != before[i];
  }
  EXPECT_GT(moved, model.num_params() / 2);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MixedPrecision, testing::Values(DType::f16, DType::bf16),
                         [](const testing::TestParamInfo<DType>& info) {
                           return std::string(info.param == DType::f16 ? "fp16" : "bf16");
                         });

}  // namespace
}  // namespace mpt::nn

namespace mpt::nn {
namespace {

// A 16-bit model whose first layer is relu takes the f32 input batch: its logits equal the f32
// model's on the same rounded weights, up to 16-bit rounding of the activations.
TEST(MixedPrecisionFirstLayer, ReluFirstAcceptsTheF32Input) {
  for (const DType dtype : {DType::f16, DType::bf16}) {
    Model model = Model::build("relu,dense:3", {4}, 3, dtype);
    Model reference = Model::build("relu,dense:3", {4}, 3);
    model.init_params(3);
    model.plan(2);
    reference.plan(2);
    // The reference computes with the 16-bit model's rounded weights.
    std::copy_n(model.compute_params().data<float>(), model.num_params(), reference.params().data<float>());
    Tensor x({2, 4}, DType::f32);
    const float values[8] = {-1.f, 0.5f, 2.f, -0.25f, 3.f, -4.f, 0.125f, 1.f};
    std::copy_n(values, 8, x.data<float>());
    const Tensor& logits = model.forward(x, true);
    const Tensor& expected = reference.forward(x, true);
    for (std::int64_t i = 0; i < 6; ++i)
      EXPECT_NEAR(logits.data<float>()[i], expected.data<float>()[i], 1e-2) << dtype_name(dtype);
  }
}

// Where the host matmul takes bf16 (oneDNN on AMX or AVX512-BF16), the conv and dense layers feed
// it the bf16 activations and working weights (a first layer rounds the f32 input), and convs
// go through oneDNN's bf16 convolution unless the im2col path is chosen; with BLAS they widen
// to f32 first (the model rounds the f32 input to bf16 before them). bf16 products
// are exact in f32 and both paths sum in f32, so they differ only in the order of the sums, and
// in the bf16 roundings that such a difference tips (an ulp of one activation now and then). The
// logits and every gradient agree to 4u of their largest magnitude; a transposed operand, a
// wrong weight view or a lost block is off by the values themselves.
TEST(MixedPrecisionHostBf16, NativeGemmsAgreeWithTheWidenedPath) {
  const kernels::MatmulBackend saved = kernels::matmul_backend();
  if (!kernels::host_matmul_takes(DType::bf16))
    GTEST_SKIP() << "no native bf16 matmul here (a CPU without AVX512-BF16 or AMX, or no oneDNN)";
  // A conv first (its f32 input rounded by the conv) and a dense first (rounded by the dense).
  const struct {
    const char* spec;
    Shape sample;
  } models[] = {
      {"conv:4:3:pad=1,relu,maxpool:2,conv:6:5:pad=2,relu,flatten,dense:24,relu,dense:5", {2, 8, 8}},
      {"dense:40,relu,dense:24,relu,dense:5", {2, 8, 8}}};
  const std::int64_t batch = 9;
  const double u = unit_roundoff(DType::bf16);
  const Tensor x = uniform({batch, 2, 8, 8}, 21, -1.f, 1.f);
  const Tensor r = uniform({batch, 5}, 22, -1.f, 1.f);  // dlogits
  for (const auto& [spec, sample] : models) {
    SCOPED_TRACE(spec);
    // 0: oneDNN's convolution and bf16 matmul; 1: im2col with the bf16 matmul; 2: widened.
    std::vector<double> logits[3], grads[3];
    const HostConvPath saved_path = host_conv_path();
    for (int config = 0; config < 3; ++config) {
      kernels::set_matmul_backend(config == 2 ? kernels::MatmulBackend::blas : saved);
      set_host_conv_path(config == 0 ? HostConvPath::onednn : HostConvPath::im2col);
      EXPECT_EQ(kernels::host_matmul_takes(DType::bf16), config < 2);
      Model model = Model::build(spec, sample, 5, DType::bf16);
      model.init_params(23);
      model.plan(batch);
      // The path each conv took: oneDNN's only in config 0 (where its bf16 kernels are native).
      for (const auto& layer : model.layers()) {
        if (const auto* conv = dynamic_cast<const Conv2d*>(layer.get())) {
          EXPECT_EQ(conv->uses_dnnl(), config == 0) << conv->name() << ": " << conv->dnnl_plan();
        }
      }
      logits[config] = values_of(model.forward(x, true));
      model.backward(r);
      grads[config] = values_of(model.grads());
    }
    kernels::set_matmul_backend(saved);
    set_host_conv_path(saved_path);
    const auto check = [&](const char* what, const std::vector<double>& got,
                           const std::vector<double>& want) {
      ASSERT_EQ(got.size(), want.size());
      double scale = 0, worst = 0;
      for (double v : want) scale = std::max(scale, std::fabs(v));
      for (std::size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::fabs(got[i] - want[i]));
      std::printf("    %s: max |native - widened| = %.2f u max|value| (max %.3g)\n", what,
                  worst / (u * scale), scale);
      EXPECT_GT(scale, 0.0) << what;
      EXPECT_LE(worst, 4 * u * scale) << what;
    };
    for (int config = 0; config < 2; ++config) {
      SCOPED_TRACE(config == 0 ? "onednn conv" : "im2col, bf16 matmul");
      check("logits", logits[config], logits[2]);
      check("gradients", grads[config], grads[2]);
    }
  }
}

}  // namespace
}  // namespace mpt::nn
