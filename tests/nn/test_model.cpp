// Model building from specs, the flat parameter layout, initialisation, planning with smaller
// batches, and the no-allocation rule for the steady-state step.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/random.hpp"
#include "kernels/cast.hpp"
#include "kernels/copy.hpp"
#include "kernels/matmul.hpp"
#include "kernels/softmax_xent.hpp"
#include "kernels/unscale_check.hpp"
#include "nn/nn.hpp"
#include "optim/optim.hpp"

// Counts operator new while armed, to check that a training step allocates nothing.
namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
}  // namespace

// GCC cannot see that every operator new here is malloc, so it flags the matching free.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t size) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1);
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace mpt::nn {
namespace {

Tensor random_input(Shape shape, std::uint64_t seed) {
  Tensor t(std::move(shape), DType::f32);
  const CounterRng rng(seed, 3);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = 2.f * rng.uniform(static_cast<std::uint64_t>(i)) - 1.f;
  return t;
}

TEST(ModelSpec, MlpIs784x1024x1024x10) {
  const Model model = Model::build("mlp", {1, 28, 28}, 10);
  EXPECT_EQ(model.spec(), "dense:1024,relu,dense:1024,relu,dense:10");
  EXPECT_EQ(model.num_params(), 1863690);
  EXPECT_EQ(model.grads().numel(), 1863690);
  const auto params = model.named_params();
  ASSERT_EQ(params.size(), 6u);
  EXPECT_EQ(params[0].name, "dense0/weight");
  EXPECT_EQ(params[0].value.shape(), (Shape{1024, 784}));
  EXPECT_EQ(params[1].name, "dense0/bias");
  EXPECT_EQ(params[2].name, "dense2/weight");
  EXPECT_EQ(params[2].value.shape(), (Shape{1024, 1024}));
  EXPECT_EQ(params[5].name, "dense4/bias");
  EXPECT_EQ(params[5].value.shape(), (Shape{10}));
  // Views are packed back to back in the flat buffers.
  EXPECT_EQ(params[1].value.raw(), static_cast<const float*>(model.params().raw()) + 1024 * 784);
  EXPECT_EQ(params[5].grad.raw(), static_cast<const float*>(model.grads().raw()) + 1863680);
  // 2*in*out + out per dense, out per relu.
  const double flops =
      (2.0 * 784 * 1024 + 1024) + 1024 + (2.0 * 1024 * 1024 + 1024) + 1024 + (2.0 * 1024 * 10 + 10);
  EXPECT_DOUBLE_EQ(model.flops_per_sample(), flops);
  const std::string summary = model.summary();
  EXPECT_NE(summary.find("dense2"), std::string::npos);
  EXPECT_NE(summary.find("1863690"), std::string::npos);
}

TEST(ModelSpec, GraphBlockersNameTheFirstLayerThatCannotBeReplayed) {
  EXPECT_EQ(Model::build("mlp", {1, 28, 28}, 10).graph_blocker(), "");
  EXPECT_EQ(Model::build("cnn", {1, 28, 28}, 10).graph_blocker(), "");
  EXPECT_EQ(Model::build("dense:64,dropout:0,dense:10", {1, 28, 28}, 10).graph_blocker(), "");
  const std::string dropout = Model::build("dense:64,dropout:0.1,dense:10", {1, 28, 28}, 10).graph_blocker();
  EXPECT_EQ(dropout.rfind("dropout1: dropout's mask key", 0), 0u) << dropout;
  // BatchNorm's arithmetic runs where its kernels do, and sync BN's reducer is the installer's
  // to make capturable (the trainer's queues its NCCL calls on the captured stream).
  Model resnet = Model::build("resnet-mini", {1, 28, 28}, 10);
  EXPECT_EQ(resnet.graph_blocker(), "");
  resnet.set_stats_reducer([](Tensor&) {});
  EXPECT_EQ(resnet.graph_blocker(), "");
  // The largest stats call, inside the last block (64 channels): 2C sums and the sample count.
  EXPECT_EQ(resnet.stats_values(), 2 * 64 + 1);
  EXPECT_EQ(Model::build("mlp", {1, 28, 28}, 10).stats_values(), 0);
}

TEST(ModelSpec, MlpFollowsTheClassCount) {
  EXPECT_EQ(Model::build("mlp", {3, 32, 32}, 100).spec(),
            "dense:1024,relu,dense:1024,relu,dense:100");
}

TEST(ModelSpec, CanonicalSpecAcceptsSpaces) {
  const Model model = Model::build(" dense:5 , relu,dense:3 ", {4}, 3);
  EXPECT_EQ(model.spec(), "dense:5,relu,dense:3");
  EXPECT_EQ(model.layers()[1]->name(), "relu1");
  EXPECT_EQ(model.num_params(), 5 * 4 + 5 + 3 * 5 + 3);
}

TEST(ModelSpec, BadSpecsNameTheOption) {
  for (const std::string spec :
       {"", "dense", "dense:", "dense:0", "dense:-5", "dense:12abc", "dense:1e3", "conv:3,dense:10",
        "relu:4,dense:10", "dense:5,,dense:10", "dense:10,relu", "dense:7", "mlp2"}) {
    SCOPED_TRACE("spec '" + spec + "'");
    try {
      Model::build(spec, {1, 28, 28}, 10);
      ADD_FAILURE() << "no UserError";
    } catch (const UserError& error) {
      EXPECT_NE(std::string(error.what()).find("--model.layers"), std::string::npos)
          << error.what();
      EXPECT_NE(error.hint().find("dense"), std::string::npos) << error.hint();
    }
  }
}

TEST(ModelSpec, UnknownKindListsKnownOnes) {
  try {
    Model::build("dense:64,tanh,dense:10", {784}, 10);
    FAIL() << "no UserError";
  } catch (const UserError& error) {
    EXPECT_NE(std::string(error.what()).find("unknown layer 'tanh'"), std::string::npos);
    EXPECT_NE(error.hint().find("relu"), std::string::npos);
  }
}

TEST(ModelInit, DeterministicAndWithinNnLinearBounds) {
  Model a = Model::build("dense:50,relu,dense:10", {1, 8, 8}, 10);
  Model b = Model::build("dense:50,relu,dense:10", {1, 8, 8}, 10);
  a.init_params(42);
  b.init_params(42);
  const auto n = a.num_params();
  const float* pa = a.params().data<float>();
  const float* pb = b.params().data<float>();
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(pa[i], pb[i]) << i;
  b.init_params(43);
  std::int64_t differing = 0;
  for (std::int64_t i = 0; i < n; ++i) differing += pa[i] != pb[i];
  EXPECT_GT(differing, n * 99 / 100);

  for (const auto& param : a.named_params()) {
    const double in = param.name.rfind("dense0", 0) == 0 ? 64 : 50;
    const double bound = 1 / std::sqrt(in);
    double max_abs = 0, sum = 0;
    for (std::int64_t i = 0; i < param.value.numel(); ++i) {
      const double v = param.value.data<float>()[i];
      ASSERT_LE(std::fabs(v), bound) << param.name;
      max_abs = std::max(max_abs, std::fabs(v));
      sum += v;
    }
    // Uniform over the whole interval, not a narrower one, and centred.
    EXPECT_GT(max_abs, 0.8 * bound) << param.name;
    EXPECT_LT(std::fabs(sum / param.value.numel()), 0.3 * bound) << param.name;
  }
  // Weight and bias of one layer come from different streams.
  const auto params = a.named_params();
  EXPECT_NE(params[0].value.data<float>()[0], params[1].value.data<float>()[0]);
}

TEST(ModelPlan, SmallerBatchMatchesTheSameRowsOfAFullBatch) {
  Model model = Model::build("dense:16,relu,dense:5", {2, 3}, 5);
  model.init_params(7);
  model.plan(8);
  const Tensor full = random_input({8, 2, 3}, 1);
  const Tensor logits_full = model.forward(full, true);
  std::vector<float> expected(logits_full.data<float>(), logits_full.data<float>() + 3 * 5);
  // The first 3 samples as their own smaller batch.
  const Tensor part = Tensor::view(full, 0, {3, 2, 3});
  const Tensor& logits_part = model.forward(part, true);
  ASSERT_EQ(logits_part.shape(), (Shape{3, 5}));
  for (std::size_t i = 0; i < expected.size(); ++i)
    EXPECT_FLOAT_EQ(logits_part.data<float>()[i], expected[i]) << i;

  // Gradients of the smaller batch equal those of a model planned for exactly 3.
  Tensor labels({3}, DType::i32);
  for (int i = 0; i < 3; ++i) labels.data<std::int32_t>()[i] = i;
  Tensor dlogits({3, 5}, DType::f32);
  kernels::softmax_xent_forward_backward(logits_part, labels, dlogits, 1.f / 3);
  model.backward(dlogits);
  Model exact = Model::build("dense:16,relu,dense:5", {2, 3}, 5);
  exact.init_params(7);
  exact.plan(3);
  Tensor dlogits_exact({3, 5}, DType::f32);
  kernels::softmax_xent_forward_backward(exact.forward(part, true), labels, dlogits_exact, 1.f / 3);
  exact.backward(dlogits_exact);
  for (std::int64_t i = 0; i < model.num_params(); ++i)
    ASSERT_EQ(model.grads().data<float>()[i], exact.grads().data<float>()[i]) << i;
}

// Layers without parameters in front of the first one with parameters need no backward (the
// input needs no gradient), so backward stops at that layer and skips its dx: a spec that
// begins with flatten (in 16 bits: the input cast to the model's precision once, as autocast
// does) or relu trains the same parameters to the same gradients as the spec without it, on
// an input that the 16-bit cast leaves as it is.
TEST(ModelPlan, LeadingLayersWithoutParametersLeaveTheGradientsAsTheyWere) {
  for (const DType precision : {DType::f32, DType::f16}) {
    Model plain = Model::build("dense:16,relu,dense:5", {2, 3}, 5, precision);
    Model flattened = Model::build("flatten,dense:16,relu,dense:5", {2, 3}, 5, precision);
    Model rectified = Model::build("relu,relu,dense:16,relu,dense:5", {2, 3}, 5, precision);
    Tensor labels({4}, DType::i32);
    for (int i = 0; i < 4; ++i) labels.data<std::int32_t>()[i] = i;
    // The input in the model's precision, widened back: what the leading layer passes on.
    const Tensor drawn = random_input({4, 2, 3}, 3);
    Tensor narrow(drawn.shape(), precision), x(drawn.shape(), DType::f32);
    kernels::cast(drawn, narrow);
    kernels::cast(narrow, x);
    // relu's input: x's magnitudes, so that the first relu passes everything.
    Tensor x_positive(x.shape(), DType::f32);
    for (std::int64_t i = 0; i < x.numel(); ++i)
      x_positive.data<float>()[i] = std::abs(x.data<float>()[i]);
    const auto gradients = [&](Model& model, const Tensor& input) {
      model.init_params(11);
      model.plan(4);
      Tensor dlogits({4, 5}, DType::f32);
      kernels::softmax_xent_forward_backward(model.forward(input, true), labels, dlogits, 0.25f);
      // Every gradient NaN before backward, which must write each one.
      Tensor nan({model.num_params()}, DType::f32), poison(model.grads().shape(), precision);
      for (std::int64_t i = 0; i < nan.numel(); ++i) nan.data<float>()[i] = std::nanf("");
      kernels::cast(nan, poison);
      kernels::copy(poison, model.grads());
      model.backward(dlogits);
      Tensor written({model.num_params()}, DType::f32);
      kernels::cast(model.grads(), written);
      for (std::int64_t i = 0; i < written.numel(); ++i)
        EXPECT_TRUE(std::isfinite(written.data<float>()[i])) << "gradient " << i << " not written";
      const auto* bytes = static_cast<const unsigned char*>(model.grads().raw());
      return std::vector<unsigned char>(bytes, bytes + model.grads().size_bytes());
    };
    const std::vector<unsigned char> expected = gradients(plain, x);
    EXPECT_EQ(gradients(flattened, x), expected) << dtype_name(precision);
    EXPECT_EQ(gradients(rectified, x_positive), gradients(plain, x_positive)) << dtype_name(precision);
  }
}

// The hook of backward (how the gradient all-reduce overlaps it): called after each layer with
// parameters, last layer first, with that layer's first parameter offset, and by a large dense
// layer after each block of weight-gradient rows, when every gradient from there on already has
// its final value; a hook built once allocates nothing.
// check_backward_hook runs a training backward of SPEC without a hook (the reference), then twice with one, on the
// same forward each time, with grads() poisoned with NaN first. At every call the hook checks
// that the offset is truthful: grads()[offset, end) are all final, i.e. equal to the reference
// within TOLERANCE_ULPS ulps of the largest reference value of each element's parameter (the
// row-block matmuls of a dense weight may sum in another order than the one matmul). Offsets
// must strictly decrease down to 0, the result must match the reference, and the second hooked
// pass must allocate nothing (when COUNT_ALLOCATIONS). Returns the reported offsets (the same in
// both passes).
std::vector<std::int64_t> check_backward_hook(const std::string& spec, const Shape& sample,
                                              std::int64_t batch, int classes, float tolerance_ulps,
                                              bool count_allocations = true) {
  Model model = Model::build(spec, sample, classes);
  model.init_params(3);
  model.plan(batch);
  Shape input_shape{batch};
  input_shape.insert(input_shape.end(), sample.begin(), sample.end());
  const Tensor x = random_input(input_shape, 5);
  Tensor labels({batch}, DType::i32);
  for (std::int64_t i = 0; i < batch; ++i)
    labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(i % classes);
  Tensor dlogits({batch, classes}, DType::f32);
  const std::int64_t n = model.num_params();
  float* g = model.grads().data<float>();
  const auto poisoned_forward = [&] {
    for (std::int64_t i = 0; i < n; ++i) g[i] = std::nanf("");
    kernels::softmax_xent_forward_backward(model.forward(x, true), labels, dlogits, 0.125f);
  };
  poisoned_forward();
  model.backward(dlogits);
  const std::vector<float> reference(g, g + n);
  std::vector<float> tolerance(static_cast<std::size_t>(n));
  const auto offsets_of = model.param_offsets();
  for (std::size_t p = 0; p < offsets_of.size(); ++p) {
    const std::int64_t begin = offsets_of[p];
    const std::int64_t end = p + 1 < offsets_of.size() ? offsets_of[p + 1] : n;
    float largest = 0;
    for (std::int64_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs(reference[i]));
    for (std::int64_t i = begin; i < end; ++i)
      tolerance[static_cast<std::size_t>(i)] = tolerance_ulps * std::ldexp(largest, -24);
  }

  std::vector<std::int64_t> offsets;
  offsets.reserve(64);
  std::int64_t untrue = 0;  // elements declared final that were not
  const GradsReady hook = [&](std::int64_t offset) {
    offsets.push_back(offset);
    for (std::int64_t i = offset; i < n; ++i) {
      const auto k = static_cast<std::size_t>(i);
      untrue += !(std::fabs(g[i] - reference[k]) <= tolerance[k]);  // NaN counts
    }
  };
  std::vector<std::int64_t> first_pass;
  for (int pass = 0; pass < 2; ++pass) {
    offsets.clear();
    untrue = 0;
    poisoned_forward();
    allocations = 0;
    counting = pass == 1;
    model.backward(dlogits, hook);
    counting = false;
    if (pass == 1 && count_allocations) {
      EXPECT_EQ(allocations.load(), 0);
    }
    EXPECT_EQ(untrue, 0) << "pass " << pass << ": a reported offset was not final";
    if (pass == 0) first_pass = offsets;
  }
  EXPECT_EQ(offsets, first_pass);
  if (offsets.empty()) {
    ADD_FAILURE() << "the hook was never called";
    return offsets;
  }
  EXPECT_EQ(offsets.back(), 0);
  for (std::size_t i = 1; i < offsets.size(); ++i)
    EXPECT_LT(offsets[i], offsets[i - 1]) << "report " << i;
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto k = static_cast<std::size_t>(i);
    wrong += !(std::fabs(g[i] - reference[k]) <= tolerance[k]);
  }
  EXPECT_EQ(wrong, 0) << "the hooked backward's gradients differ from the reference";
  return offsets;
}

TEST(ModelPlan, BackwardHookReportsFinalGradientsLastLayerFirst) {
  const kernels::MatmulBackend saved = kernels::matmul_backend();
  kernels::set_matmul_backend(kernels::MatmulBackend::blas);  // as below: count only our news
  // Small layers: one report per layer with parameters (conv0, dense4, dense6), at its first
  // offset, last first; the gradients are those of the hookless backward, bit for bit.
  const std::string spec = "conv:2:3,relu,maxpool:2,flatten,dense:6,relu,dense:5";
  const auto offsets = check_backward_hook(spec, {1, 8, 8}, 4, 5, /*tolerance_ulps=*/0);
  const auto all = Model::build(spec, {1, 8, 8}, 5).param_offsets();
  ASSERT_EQ(all.size(), 6u);
  EXPECT_EQ(offsets, (std::vector<std::int64_t>{all[4], all[2], all[0]}));
  EXPECT_EQ(all[0], 0);
  kernels::set_matmul_backend(saved);
}

TEST(ModelPlan, BackwardHookReportsLargeDenseWeightsInRowBlocks) {
  // dense0's weight (700 x 784, 2.1 MiB) and dense2's (400 x 700, 1.1 MiB) exceed one 1 MiB
  // block: with a hook their gradients are computed in blocks of output rows, last block
  // first, each reported as soon as it is written. Each element is still one length-8 dot
  // product; the tolerance (64 ulps of the parameter's largest gradient) only allows for the
  // library summing it in another order when the matmul's shape changes.
  const std::string spec = "dense:700,relu,dense:400,relu,dense:5";
  const auto all = Model::build(spec, {1, 28, 28}, 5).param_offsets();
  ASSERT_EQ(all.size(), 6u);
  const kernels::MatmulBackend saved = kernels::matmul_backend();
  for (const auto backend : {kernels::MatmulBackend::blas, kernels::MatmulBackend::dnnl}) {
    if (backend == kernels::MatmulBackend::dnnl && !kernels::dnnl_available()) continue;
    SCOPED_TRACE(kernels::matmul_backend_name(backend));
    kernels::set_matmul_backend(backend);
    // oneDNN allocates in each matmul call (see SteadyStateStepAllocatesNothing): count BLAS.
    const auto offsets = check_backward_hook(spec, {1, 28, 28}, 8, 5, /*tolerance_ulps=*/64,
                                             backend == kernels::MatmulBackend::blas);
    const auto inside = [&](std::size_t weight) {  // reports strictly inside a weight
      int count = 0;
      for (auto offset : offsets) count += offset > all[weight] && offset < all[weight + 1];
      return count;
    };
    EXPECT_GE(inside(0), 2) << "dense0's weight is three blocks";
    EXPECT_GE(inside(2), 1) << "dense2's weight is two blocks";
    // The layers' first offsets are reported too (dense4's by the model, the others by the
    // layers' last blocks), and nothing inside the small dense4.
    for (std::size_t p : {0u, 2u, 4u})
      EXPECT_NE(std::find(offsets.begin(), offsets.end(), all[p]), offsets.end()) << p;
    EXPECT_EQ(inside(4), 0);
  }
  kernels::set_matmul_backend(saved);
}

TEST(ModelPlan, SteadyStateStepAllocatesNothing) {
  // With the BLAS backend every allocation would be ours. oneDNN's own dnnl_primitive_execute
  // builds a small argument map per call (about 5 operator new per matmul in 2.6), which no
  // caller can avoid; our side of the dnnl path (cached primitives and memory objects, a plain
  // argument array) adds nothing to it.
  const kernels::MatmulBackend saved = kernels::matmul_backend();
  kernels::set_matmul_backend(kernels::MatmulBackend::blas);
  Model model = Model::build("mlp", {1, 28, 28}, 10);
  model.init_params(1);
  model.plan(16);
  optim::Sgd sgd(model.params(), model.grads(), optim::SgdOptions{});
  // A loader-like ring of two input buffers, [b, 1, 28, 28] as the data files store them.
  const Tensor ring[2] = {random_input({16, 1, 28, 28}, 1), random_input({16, 1, 28, 28}, 2)};
  Tensor labels({16}, DType::i32);
  Tensor dlogits({16, 10}, DType::f32);
  const auto step = [&](int i) {
    const Tensor& logits = model.forward(ring[i % 2], true);
    kernels::softmax_xent_forward_backward(logits, labels, dlogits, 1.f / 16);
    model.backward(dlogits);
    sgd.step(0.01f);
  };
  for (int i = 0; i < 3; ++i) step(i);  // warm-up: views of both ring buffers
  allocations = 0;
  counting = true;
  for (int i = 3; i < 8; ++i) step(i);
  counting = false;
  kernels::set_matmul_backend(saved);
  EXPECT_EQ(allocations.load(), 0);
}

TEST(ModelPlan, SteadyStateMixedPrecisionStepAllocatesNothing) {
  // The whole mixed-precision step: 16-bit forward and backward in row blocks (a batch of 1030
  // is three blocks, the last one short), unscale-and-check into the f32 master gradients, SGD
  // on the masters, recast of the working copy. BLAS backend, as above.
  const kernels::MatmulBackend saved = kernels::matmul_backend();
  kernels::set_matmul_backend(kernels::MatmulBackend::blas);
  for (const DType precision : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(precision));
    const std::int64_t batch = 1030;
    Model model = Model::build("dense:64,relu,dense:64,relu,dense:10", {1, 28, 28}, 10, precision);
    model.init_params(1);
    model.plan(batch);
    optim::Sgd sgd(model.master_params(), model.master_grads(), optim::SgdOptions{});
    const Tensor ring[2] = {random_input({batch, 1, 28, 28}, 1), random_input({batch, 1, 28, 28}, 2)};
    Tensor labels({batch}, DType::i32);
    Tensor dlogits({batch, 10}, DType::f32);
    const Tensor grads[1] = {model.grads()};
    Tensor master_grads[1] = {model.master_grads()};
    const auto step = [&](int i) {
      const Tensor& logits = model.forward(ring[i % 2], true);
      kernels::softmax_xent_forward_backward(logits, labels, dlogits, 1024.f / batch);
      model.backward(dlogits);
      if (kernels::unscale_and_check(grads, master_grads, 1.f / 1024)) {
        sgd.step(0.01f);
        model.recast_from_master();
      }
    };
    for (int i = 0; i < 3; ++i) step(i);  // warm-up: views of both ring buffers and the blocks
    allocations = 0;
    counting = true;
    for (int i = 3; i < 6; ++i) step(i);
    counting = false;
    EXPECT_EQ(allocations.load(), 0);
  }
  kernels::set_matmul_backend(saved);
}

TEST(ModelPlan, SteadyStateStepWithBnDropoutAndResblocksAllocatesNothing) {
  // BN (with a stats reducer installed, as under --model.sync-bn), dropout re-keyed every step,
  // and residual blocks with and without projection, in f32 and 16 bits. BLAS backend, as above.
  const kernels::MatmulBackend saved = kernels::matmul_backend();
  kernels::set_matmul_backend(kernels::MatmulBackend::blas);
  for (const DType precision : {DType::f32, DType::f16}) {
    SCOPED_TRACE(dtype_name(precision));
    const std::int64_t batch = 4;
    Model model = Model::build(
        "conv:4:3:pad=1,bn,relu,resblock:4,resblock:8:stride=2,gap,dense:16,bn,dropout:0.5,dense:10",
        {1, 12, 12}, 10, precision);
    model.init_params(1);
    model.plan(batch);
    long reductions = 0;
    model.set_stats_reducer([&reductions](Tensor&) { ++reductions; });
    const Tensor ring[2] = {random_input({batch, 1, 12, 12}, 1), random_input({batch, 1, 12, 12}, 2)};
    Tensor labels({batch}, DType::i32);
    Tensor dlogits({batch, 10}, DType::f32);
    const auto step = [&](int i) {
      model.set_rng(7, static_cast<std::uint64_t>(i));
      const Tensor& logits = model.forward(ring[i % 2], true);
      kernels::softmax_xent_forward_backward(logits, labels, dlogits, 1.f / batch);
      model.backward(dlogits);
    };
    for (int i = 0; i < 3; ++i) step(i);
    allocations = 0;
    counting = true;
    for (int i = 3; i < 6; ++i) step(i);
    counting = false;
    EXPECT_EQ(allocations.load(), 0);
    // 7 BN layers, forward and backward, 6 steps.
    EXPECT_EQ(reductions, 7 * 2 * 6);
  }
  kernels::set_matmul_backend(saved);
}

}  // namespace
}  // namespace mpt::nn
