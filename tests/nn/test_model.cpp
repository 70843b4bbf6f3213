// Model building from specs, the flat parameter layout, initialisation, planning with smaller
// batches, and the no-allocation rule for the steady-state step.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <string>

#include "core/error.hpp"
#include "core/random.hpp"
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
    model.set_stats_reducer([&reductions](float*, std::int64_t) { ++reductions; });
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
