// BatchNorm's running statistics and modes, dropout's counter-based masks, model buffers,
// residual blocks and the resnet-mini built-in, initialisation schemes and spec errors of the
// new layers. (The layers' numerics against float64 references: test_layer_references.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/dropout.hpp"
#include "kernels/softmax_xent.hpp"
#include "nn/batchnorm.hpp"
#include "nn/dropout_layer.hpp"
#include "nn/nn.hpp"
#include "tests/nn/gradcheck_util.hpp"
#include "tests/nn/twin_util.hpp"

namespace mpt::nn {
namespace {

void fill_uniform(Tensor& t, std::uint64_t seed, float low, float high) {
  test::fill_uniform(t, seed, low, high, 31);
}

using test::values_of;

const NamedParam& find(const std::vector<NamedParam>& all, const std::string& name) {
  for (const auto& p : all)
    if (p.name == name) return p;
  throw std::runtime_error("no tensor named " + name);
}

TEST(BatchNormModes, RunningStatisticsFollowPyTorchAndEvalUsesThem) {
  // bn0 normalises the model's input itself, so the test knows its input exactly.
  Model model = Model::build("bn,gap,dense:2", {2, 3, 3}, 2);
  model.init_params(3);
  ASSERT_EQ(model.named_buffers().size(), 2u);
  EXPECT_EQ(model.named_buffers()[0].name, "bn0/running_mean");
  EXPECT_EQ(model.named_buffers()[1].name, "bn0/running_var");
  EXPECT_FALSE(model.named_buffers()[0].grad.defined());
  const std::int64_t batch = 5;
  model.plan(batch);
  Tensor x({batch, 2, 3, 3}, DType::f32);
  std::vector<double> running_mean = {0, 0}, running_var = {1, 1};
  for (int step = 0; step < 2; ++step) {
    fill_uniform(x, 40 + step, -1.f + step, 3.f);
    model.forward(x, /*training=*/true);
    for (int c = 0; c < 2; ++c) {
      double sum = 0, squares = 0;
      for (int n = 0; n < batch; ++n)
        for (int i = 0; i < 9; ++i) sum += x.data<float>()[(n * 2 + c) * 9 + i];
      const double mean = sum / (batch * 9);
      for (int n = 0; n < batch; ++n)
        for (int i = 0; i < 9; ++i) {
          const double d = x.data<float>()[(n * 2 + c) * 9 + i] - mean;
          squares += d * d;
        }
      // PyTorch: running = 0.9 running + 0.1 batch, with the unbiased variance.
      running_mean[c] = 0.9 * running_mean[c] + 0.1 * mean;
      running_var[c] = 0.9 * running_var[c] + 0.1 * squares / (batch * 9 - 1);
      EXPECT_NEAR(model.buffers().data<float>()[c], running_mean[c], 1e-6) << step;
      EXPECT_NEAR(model.buffers().data<float>()[2 + c], running_var[c], 1e-6) << step;
    }
  }
  // Eval: uses (and keeps) the running statistics. gamma 1, beta 0 at init, so the bn output
  // averaged by gap is (mean of the sample's plane - running mean) / sqrt(running var + eps);
  // read it through the dense layer's input: compare logits with a hand-made dense.
  const std::vector<double> buffers_before = values_of(model.buffers());
  const Tensor& logits = model.forward(x, /*training=*/false);
  EXPECT_EQ(values_of(model.buffers()), buffers_before);
  const auto params = model.named_params();
  const Tensor& w = find(params, "dense2/weight").value;
  const Tensor& b = find(params, "dense2/bias").value;
  for (int n = 0; n < batch; ++n)
    for (int o = 0; o < 2; ++o) {
      double expected = b.data<float>()[o];
      for (int c = 0; c < 2; ++c) {
        double plane = 0;
        for (int i = 0; i < 9; ++i) plane += x.data<float>()[(n * 2 + c) * 9 + i] / 9;
        expected += w.data<float>()[o * 2 + c] * (plane - running_mean[c]) /
                    std::sqrt(running_var[c] + 1e-5);
      }
      EXPECT_NEAR(logits.data<float>()[n * 2 + o], expected, 1e-5);
    }
  // Train mode normalises with the batch statistics instead: different logits.
  const std::vector<double> eval_logits = values_of(logits);
  EXPECT_NE(values_of(model.forward(x, true)), eval_logits);
}

TEST(BatchNormModes, TrainOutputHasZeroMeanUnitVariancePerChannel) {
  BatchNorm bn("bn0", {3, 4, 4});
  Tensor params({6}, DType::f32), grads({6}, DType::f32), buffers({6}, DType::f32);
  for (int c = 0; c < 3; ++c) params.data<float>()[c] = 1.f;  // gamma 1, beta 0
  bn.bind_params({Tensor::view(params, 0, {3}), Tensor::view(params, 3, {3})},
                 {Tensor::view(grads, 0, {3}), Tensor::view(grads, 3, {3})});
  bn.bind_buffers({Tensor::view(buffers, 0, {3}), Tensor::view(buffers, 3, {3})});
  Tensor x({4, 3, 4, 4}, DType::f32), y({4, 3, 4, 4}, DType::f32);
  fill_uniform(x, 50, 5.f, 9.f);  // mean far from 0
  bn.forward(x, y, true);
  for (int c = 0; c < 3; ++c) {
    double sum = 0, squares = 0;
    for (int n = 0; n < 4; ++n)
      for (int i = 0; i < 16; ++i) {
        const double v = y.data<float>()[(n * 3 + c) * 16 + i];
        sum += v;
        squares += v * v;
      }
    EXPECT_NEAR(sum / 64, 0.0, 1e-5);
    // Biased variance 1 up to eps: var / (var + 1e-5).
    EXPECT_NEAR(squares / 64, 1.0, 1e-3);
  }
}

TEST(ModelBuffers, AllocatedAtBuildInitialisedAndNamed) {
  Model model = Model::build("dense:8,bn,relu,dense:3", {5}, 3);  // BatchNorm1d on 8 features
  EXPECT_EQ(model.buffers().numel(), 16);
  EXPECT_EQ(model.buffers().dtype(), DType::f32);
  const auto buffers = model.named_buffers();
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers[0].name, "bn1/running_mean");
  EXPECT_EQ(buffers[1].name, "bn1/running_var");
  for (double v : values_of(buffers[0].value)) EXPECT_EQ(v, 0.0);
  for (double v : values_of(buffers[1].value)) EXPECT_EQ(v, 1.0);
  model.init_params(1);
  for (double v : values_of(find(model.named_params(), "bn1/gamma").value)) EXPECT_EQ(v, 1.0);
  for (double v : values_of(find(model.named_params(), "bn1/beta").value)) EXPECT_EQ(v, 0.0);
  // A model without BN has an empty buffer tensor.
  EXPECT_EQ(Model::build("mlp", {784}, 10).buffers().numel(), 0);
  EXPECT_TRUE(Model::build("mlp", {784}, 10).named_buffers().empty());
}

// ---- dropout ----

TEST(DropoutMasks, ReproducibleKeyedByStepAndLayerWithTheRightKeepFraction) {
  const std::int64_t n = 200000;
  Tensor x({n}, DType::f32), y({n}, DType::f32), y2({n}, DType::f32);
  for (std::int64_t i = 0; i < n; ++i) x.data<float>()[i] = 1.f;
  const auto kept = [](const Tensor& t) {
    std::int64_t k = 0;
    for (std::int64_t i = 0; i < t.numel(); ++i) k += t.data<float>()[i] != 0.f;
    return k;
  };
  for (const float p : {0.1f, 0.5f, 0.8f}) {
    DropoutLayer layer("dropout0", p, 2);
    StepContext context;
    context.seed = 42;
    context.step = 100;
    layer.set_context(&context);
    Tensor batch = x.reshaped({1000, 200}), out = y.reshaped({1000, 200}),
           out2 = y2.reshaped({1000, 200});
    layer.forward(batch, out, true);
    // Keep fraction 1 - p: binomial std sqrt(p (1-p) / n) <= 0.0012; 0.006 is 5 sigma.
    EXPECT_NEAR(static_cast<double>(kept(y)) / n, 1.0 - p, 0.006) << p;
    // Kept elements are scaled by 1 / (1 - p).
    for (std::int64_t i = 0; i < n; ++i)
      if (y.data<float>()[i] != 0.f) {
        ASSERT_FLOAT_EQ(y.data<float>()[i], 1.f / (1.f - p));
      }
    // Same (seed, step): the same mask, bit for bit.
    layer.forward(batch, out2, true);
    EXPECT_EQ(std::memcmp(y.raw(), y2.raw(), y.size_bytes()), 0);
    // Another step: another mask (a fraction ~2p(1-p) of the elements differ).
    context.step = 101;
    layer.forward(batch, out2, true);
    EXPECT_NE(std::memcmp(y.raw(), y2.raw(), y.size_bytes()), 0);
    // Another layer index at the same step: another mask too.
    context.step = 100;
    DropoutLayer other("dropout5", p, 5);
    other.set_context(&context);
    other.forward(batch, out2, true);
    EXPECT_NE(std::memcmp(y.raw(), y2.raw(), y.size_bytes()), 0);
    // Evaluation: the identity.
    layer.forward(batch, out2, false);
    EXPECT_EQ(std::memcmp(x.raw(), y2.raw(), x.size_bytes()), 0);
  }
}

TEST(DropoutMasks, BackwardUsesTheForwardMask) {
  DropoutLayer layer("dropout0", 0.4, 1);
  StepContext context;
  context.seed = 7;
  context.step = 3;
  layer.set_context(&context);
  Tensor x({50, 20}, DType::f32), y({50, 20}, DType::f32), dy({50, 20}, DType::f32),
      dx({50, 20}, DType::f32);
  fill_uniform(x, 60, 0.5f, 1.f);  // never zero
  fill_uniform(dy, 61, 0.5f, 1.f);
  layer.forward(x, y, true);
  context.step = 4;  // the context moving on after the forward must not change the mask
  layer.backward(x, y, dy, &dx);
  int dropped = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const float yi = y.data<float>()[i], dxi = dx.data<float>()[i];
    ASSERT_EQ(yi == 0.f, dxi == 0.f) << i;
    dropped += yi == 0.f;
    if (yi != 0.f) {
      ASSERT_FLOAT_EQ(dxi, dy.data<float>()[i] / 0.6f);
    }
  }
  EXPECT_GT(dropped, 300);
  EXPECT_LT(dropped, 500);
}

TEST(DropoutMasks, ModelMasksDependOnSeedAndStepNotOnBatchLayout) {
  const std::string spec = "dense:16,relu,dropout:0.5,dense:3";
  Model model = Model::build(spec, {6}, 3);
  model.init_params(2);
  model.plan(4);
  Tensor x({4, 6}, DType::f32);
  fill_uniform(x, 70, -1.f, 1.f);
  model.set_rng(11, 5);
  const auto first = values_of(model.forward(x, true));
  model.set_rng(11, 5);
  EXPECT_EQ(values_of(model.forward(x, true)), first);  // resume: same (seed, step), same masks
  model.set_rng(11, 6);
  EXPECT_NE(values_of(model.forward(x, true)), first);
  model.set_rng(12, 5);
  EXPECT_NE(values_of(model.forward(x, true)), first);
  // Samples 2 and 3 of a batch of 4 at offset 0 get the masks of a batch of 2 at offset 2 (as
  // rank 1 of two ranks with 2 samples each): the masks follow the global sample index.
  Model half = Model::build(spec, {6}, 3);
  half.init_params(2);
  half.plan(2);
  Tensor x_half = Tensor::view(x, 2 * 6, {2, 6});
  half.set_rng(11, 5, /*sample_offset=*/2);
  const auto second_half = values_of(half.forward(x_half, true));
  // (Equal up to the f32 summation order of the dense layers, which depends on the batch.)
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(second_half[i], first[6 + i], 1e-6) << i;
  // Eval ignores the masks.
  const auto eval1 = values_of(model.forward(x, false));
  model.set_rng(99, 99);
  EXPECT_EQ(values_of(model.forward(x, false)), eval1);
}

// ---- residual blocks and resnet-mini ----

TEST(ResNetMini, ParameterAndBufferNamesCountsAndShapes) {
  // By hand, 1x28x28 input, 10 classes:
  //   conv0 3x3 1->16:          16*9 + 16            =    160
  //   bn1:                      2*16                 =     32
  //   resblock3 16->16:         2*(16*16*9+16) + 2*32 =  4,704
  //   resblock4 16->32 s2:      32*16*9+32 + 32*32*9+32 + 32*16+32 + 3*64 = 14,624
  //   resblock5 32->64 s2:      64*32*9+64 + 64*64*9+64 + 64*32+64 + 3*128 = 57,920
  //   dense7 64->10:            650
  //   total                                            78,090
  Model model = Model::build("resnet-mini", {1, 28, 28}, 10);
  EXPECT_EQ(model.num_params(), 78090);
  EXPECT_EQ(model.spec(),
            "conv:16:3:pad=1,bn,relu,resblock:16,resblock:32:stride=2,resblock:64:stride=2,gap,"
            "dense:10");
  std::vector<std::string> names;
  for (const auto& p : model.named_params()) names.push_back(p.name);
  const std::vector<std::string> block4 = {
      "resblock4/conv1/weight", "resblock4/conv1/bias",    "resblock4/bn1/gamma",
      "resblock4/bn1/beta",     "resblock4/conv2/weight",  "resblock4/conv2/bias",
      "resblock4/bn2/gamma",    "resblock4/bn2/beta",      "resblock4/proj/weight",
      "resblock4/proj/bias",    "resblock4/proj_bn/gamma", "resblock4/proj_bn/beta"};
  const auto at = std::find(names.begin(), names.end(), block4[0]);
  ASSERT_NE(at, names.end());
  EXPECT_EQ(std::vector<std::string>(at, at + 12), block4);
  // Identity skip in resblock3 (16 -> 16, stride 1): no projection.
  EXPECT_EQ(std::count_if(names.begin(), names.end(),
                          [](const std::string& n) { return n.rfind("resblock3/proj", 0) == 0; }),
            0);
  EXPECT_EQ(find(model.named_params(), "resblock5/conv1/weight").value.shape(),
            (Shape{64, 32, 3, 3}));
  // Buffers: bn1, then 2 + 3 + 3 BNs in the blocks, mean then var each.
  const auto buffers = model.named_buffers();
  EXPECT_EQ(model.buffers().numel(), 32 + 64 + 192 + 384);
  ASSERT_EQ(buffers.size(), 18u);
  EXPECT_EQ(buffers[0].name, "bn1/running_mean");
  EXPECT_EQ(buffers[2].name, "resblock3/bn1/running_mean");
  EXPECT_EQ(buffers[3].name, "resblock3/bn1/running_var");
  EXPECT_EQ(buffers[10].name, "resblock4/proj_bn/running_mean");
  // Summary: one line per block with its output shape, plus indented sub-lines.
  const std::string summary = model.summary();
  for (const char* text :
       {"resblock4", "(32,14,14)", "(64,7,7)", "resblock4/proj_bn", "resblock5/conv2", "78090"})
    EXPECT_NE(summary.find(text), std::string::npos) << text << "\n" << summary;
  // 3x32x32: 78,090 - 160 + (16*27+16) = 78,378, and the last block outputs (64,8,8).
  Model cifar = Model::build("resnet-mini", {3, 32, 32}, 10);
  EXPECT_EQ(cifar.num_params(), 78378);
  EXPECT_NE(cifar.summary().find("(64,8,8)"), std::string::npos);
}

class ResNetMiniRuns : public testing::TestWithParam<DType> {};

TEST_P(ResNetMiniRuns, ForwardAndBackwardOn28And32Inputs) {
  for (const Shape& sample : {Shape{1, 28, 28}, Shape{3, 32, 32}}) {
    SCOPED_TRACE(shape_to_string(sample));
    Model model = Model::build("resnet-mini", sample, 10, GetParam());
    model.init_params(4);
    const std::int64_t batch = 3;
    model.plan(batch);
    Shape x_shape{batch};
    x_shape.insert(x_shape.end(), sample.begin(), sample.end());
    Tensor x(x_shape, DType::f32), labels({batch}, DType::i32), dlogits({batch, 10}, DType::f32);
    fill_uniform(x, 80, 0.f, 1.f);
    for (int i = 0; i < batch; ++i) labels.data<std::int32_t>()[i] = i;
    const Tensor& logits = model.forward(x, true);
    for (double v : values_of(logits)) ASSERT_TRUE(std::isfinite(v));
    kernels::softmax_xent_forward_backward(logits, labels, dlogits, 1.f);
    model.backward(dlogits);
    for (const auto& p : model.named_working_params()) {
      double norm = 0;
      for (double v : values_of(p.grad)) {
        ASSERT_TRUE(std::isfinite(v)) << p.name;
        norm += v * v;
      }
      // BN biases before another BN get no gradient only through the mean; every tensor here
      // has a path to the loss, and conv biases before a BN are the exception: their gradient is
      // zero up to rounding (BN removes the mean). Everything else must move.
      const bool bias_before_bn =
          p.name.find("conv") != std::string::npos && p.name.find("/bias") != std::string::npos;
      if (!bias_before_bn && p.name.find("proj/bias") == std::string::npos) {
        EXPECT_GT(norm, 0.0) << p.name;
      }
    }
    for (double v : values_of(model.forward(x, false))) ASSERT_TRUE(std::isfinite(v));
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ResNetMiniRuns,
                         testing::Values(DType::f32, DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

class ResNetSixteenBit : public testing::TestWithParam<DType> {};

TEST_P(ResNetSixteenBit, GradientsCloseToF32OnTheSameRoundedWeights) {
  // As ConvMixedPrecision (test_conv_layers.cpp): the f32 model, whose layers the reference
  // tests anchor, on the 16-bit model's rounded weights. Each stored activation and gradient is
  // rounded once (u/2); BN divides by batch stds below 1 and the two paths of a block add, so
  // the errors grow to tens of u of each tensor's scale through 12 layers (bf16's worst here,
  // conv0's weight gradient, is ~33u): tolerance 64u of the logits' and of each gradient
  // tensor's scale (biases before a BN, whose true gradient is zero, against all gradients'
  // scale). fp16 (u = 2^-11) makes this tight; a missing commit or a wrong offset is O(1) off.
  const DType dtype = GetParam();
  const double u = dtype == DType::f16 ? 0x1p-11 : 0x1p-8;
  const std::string spec = "conv:4:3:pad=1,bn,relu,resblock:4,resblock:6:stride=2,gap,dense:3";
  Tensor x({6, 2, 10, 12}, DType::f32);
  fill_uniform(x, 85, -1.f, 1.f);
  const test::TwinStep step = test::step_with_f32_twin(spec, {2, 10, 12}, 3, dtype, x);
  const double worst = test::max_abs_difference(step.logits, step.twin_logits);
  EXPECT_LE(worst, 64 * u * test::max_abs(step.twin_logits));
  EXPECT_GT(worst, 0.0);  // the activations really were rounded
  for (std::size_t p = 0; p < step.grads.size(); ++p) {
    const auto& g = step.grads[p];
    const auto& ref = step.twin_grads[p];
    const std::string& name = step.names[p];
    const bool zero_true_gradient =
        name.find("/bias") != std::string::npos && name.find("dense") == std::string::npos;
    const double bound = 64 * u * (zero_true_gradient ? step.twin_grad_scale : test::max_abs(ref));
    for (std::size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], ref[i], bound) << name << " " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ResNetSixteenBit, testing::Values(DType::f16, DType::bf16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- initialisation schemes ----

TEST(InitSchemes, DefaultHeAndXavierBounds) {
  const auto bounds = [](InitScheme scheme, const std::string& name) {
    Model model = Model::build("conv:4:3,bn,flatten,dense:5", {2, 6, 6}, 5);
    model.init_params(9, scheme);
    double largest = 0;
    for (double v : values_of(find(model.named_params(), name).value))
      largest = std::max(largest, std::fabs(v));
    return largest;
  };
  // dense2 is 64 -> 5; conv0 has fan_in 2*9 = 18, fan_out 4*9 = 36.
  const double dense_default = 1 / std::sqrt(64.0), he_dense = std::sqrt(6.0 / 64),
               xavier_dense = std::sqrt(6.0 / 69), he_conv = std::sqrt(6.0 / 18),
               xavier_conv = std::sqrt(6.0 / 54);
  // The largest of 320 draws is within a few % of the bound, and never above it.
  const auto near_bound = [](double largest, double bound) {
    return largest <= bound && largest > 0.9 * bound;
  };
  EXPECT_TRUE(near_bound(bounds(InitScheme::default_init, "dense3/weight"), dense_default));
  // Five biases: non-zero and within nn.Linear's bound under the default scheme.
  EXPECT_GT(bounds(InitScheme::default_init, "dense3/bias"), 0.0);
  EXPECT_LE(bounds(InitScheme::default_init, "dense3/bias"), dense_default);
  EXPECT_TRUE(near_bound(bounds(InitScheme::he, "dense3/weight"), he_dense));
  EXPECT_TRUE(near_bound(bounds(InitScheme::xavier, "dense3/weight"), xavier_dense));
  EXPECT_TRUE(near_bound(bounds(InitScheme::default_init, "conv0/weight"), he_conv));
  EXPECT_TRUE(near_bound(bounds(InitScheme::he, "conv0/weight"), he_conv));
  EXPECT_TRUE(near_bound(bounds(InitScheme::xavier, "conv0/weight"), xavier_conv));
  EXPECT_EQ(bounds(InitScheme::he, "dense3/bias"), 0.0);
  EXPECT_EQ(bounds(InitScheme::xavier, "dense3/bias"), 0.0);
  for (const InitScheme scheme : {InitScheme::default_init, InitScheme::he, InitScheme::xavier}) {
    Model model = Model::build("conv:4:3,bn,flatten,dense:5", {2, 6, 6}, 5);
    model.init_params(9, scheme);
    for (double v : values_of(find(model.named_params(), "bn1/gamma").value)) EXPECT_EQ(v, 1.0);
    for (double v : values_of(find(model.named_params(), "bn1/beta").value)) EXPECT_EQ(v, 0.0);
    // A pure function of the seed.
    Model again = Model::build("conv:4:3,bn,flatten,dense:5", {2, 6, 6}, 5);
    again.init_params(9, scheme);
    EXPECT_EQ(values_of(again.master_params()), values_of(model.master_params()));
  }
  EXPECT_EQ(init_scheme_from_name("xavier", "--model.init"), InitScheme::xavier);
  try {
    init_scheme_from_name("kaiming", "--model.init");
    ADD_FAILURE() << "no UserError";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("--model.init 'kaiming'"), std::string::npos);
    EXPECT_FALSE(error.hint().empty());
  }
}

// ---- spec errors and canonical forms of the new layers ----

TEST(NewLayerSpecs, ErrorsNameTheOptionAndTheItem) {
  struct Case {
    std::string spec;
    Shape sample;
    std::string expected;
  };
  for (const auto& c : std::vector<Case>{
           {"bn:4,dense:10", {784}, "'bn:4'"},
           {"dropout,dense:10", {784}, "'dropout'"},
           {"dropout:1,dense:10", {784}, "'dropout:1'"},
           {"dropout:-0.1,dense:10", {784}, "'dropout:-0.1'"},
           {"dropout:half,dense:10", {784}, "'dropout:half'"},
           {"resblock,gap,dense:10", {1, 28, 28}, "'resblock'"},
           {"resblock:0,gap,dense:10", {1, 28, 28}, "'resblock:0'"},
           {"resblock:8:pad=1,gap,dense:10", {1, 28, 28}, "'resblock:8:pad=1'"},
           {"resblock:8:stride=0,gap,dense:10", {1, 28, 28}, "'resblock:8:stride=0'"},
           {"flatten,resblock:8,dense:10",
            {1, 28, 28},
            "layer resblock1 ('resblock:8'): needs a (C,H,W)"},
           {"resblock:8,dense:10",
            {1, 28, 28},
            "layer dense1 ('dense:10'): a dense layer needs flat"},
           {"resnet,dense:10", {1, 28, 28}, "unknown layer 'resnet'"},
       }) {
    SCOPED_TRACE(c.spec);
    try {
      Model::build(c.spec, c.sample, 10);
      ADD_FAILURE() << "no UserError";
    } catch (const UserError& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find("--model.layers"), std::string::npos) << what;
      EXPECT_NE(what.find(c.expected), std::string::npos) << what;
      // Parse errors list the known layers in the hint; shape errors say what to change.
      if (c.expected.rfind("layer ", 0) != 0) {
        EXPECT_NE(error.hint().find("resblock"), std::string::npos) << error.hint();
      } else {
        EXPECT_FALSE(error.hint().empty());
      }
    }
  }
  EXPECT_EQ(Model::build(" dense:8 , bn , dropout:0.50 ,dense:10", {784}, 10).spec(),
            "dense:8,bn,dropout:0.5,dense:10");
  EXPECT_EQ(Model::build("resblock:4:stride=1,gap,dense:10", {4, 9, 9}, 10).spec(),
            "resblock:4,gap,dense:10");
}

}  // namespace
}  // namespace mpt::nn
