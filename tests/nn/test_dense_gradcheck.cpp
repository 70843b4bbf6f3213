// Finite-difference gradient checks: the Dense layer alone (weights, bias, input), and
// softmax cross-entropy through a small model with a ReLU.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/random.hpp"
#include "kernels/softmax_xent.hpp"
#include "nn/dense.hpp"
#include "nn/nn.hpp"
#include "tests/nn/gradcheck_util.hpp"

namespace mpt::nn {
namespace {

// This file's fills draw from stream 7.
void fill_uniform(Tensor& t, std::uint64_t seed, float low, float high) {
  test::fill_uniform(t, seed, low, high, 7);
}
using test::central_difference;

TEST(DenseGradcheck, WeightsBiasAndInput) {
  const std::int64_t batch = 3, in = 6, out = 4;
  Dense dense("dense0", in, out);
  Tensor params({out * in + out}, DType::f32), grads({out * in + out}, DType::f32);
  dense.bind_params({Tensor::view(params, 0, {out, in}), Tensor::view(params, out * in, {out})},
                    {Tensor::view(grads, 0, {out, in}), Tensor::view(grads, out * in, {out})});
  fill_uniform(params, 1, -1.f, 1.f);
  Tensor x({batch, in}, DType::f32), y({batch, out}, DType::f32);
  fill_uniform(x, 2, -2.f, 2.f);
  // Loss = sum r .* y with a fixed random R, accumulated in double, so dLoss/dy = R exactly.
  Tensor r({batch, out}, DType::f32);
  fill_uniform(r, 3, -1.f, 1.f);
  const auto loss = [&] {
    dense.forward(x, y, true);
    double sum = 0;
    for (std::int64_t i = 0; i < y.numel(); ++i)
      sum += double{r.data<float>()[i]} * y.data<float>()[i];
    return sum;
  };
  loss();
  Tensor dx({batch, in}, DType::f32);
  dense.backward(x, y, r, &dx);

  // The loss is linear in every weight, bias and input, so central differences have no
  // truncation error and a large step is safe. What remains is f32 rounding of y (about 2^-24
  // relative, |y| <~ 10, 12 terms): ~1e-5 in the loss difference, / 2 eps = 0.5 -> ~1e-5 in
  // the quotient. Tolerance 1e-4 sits above that and far below the O(0.1..1) error of any
  // wrong transpose, sign or missing term.
  const float eps = 0.25f;
  const double tolerance = 1e-4;
  for (std::int64_t i = 0; i < params.numel(); ++i) {
    const double numeric = central_difference(params.data<float>() + i, eps, loss);
    ASSERT_NEAR(grads.data<float>()[i], numeric, tolerance)
        << (i < out * in ? "weight " : "bias ") << i;
  }
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double numeric = central_difference(x.data<float>() + i, eps, loss);
    ASSERT_NEAR(dx.data<float>()[i], numeric, tolerance) << "input " << i;
  }
}

TEST(ModelGradcheck, SoftmaxXentThroughDenseReluDense) {
  const std::int64_t batch = 3;
  Model model = Model::build("dense:5,relu,dense:3", {4}, 3);
  ASSERT_EQ(model.num_params(), 5 * 4 + 5 + 3 * 5 + 3);
  model.plan(batch);
  Tensor x({batch, 4}, DType::f32);
  fill_uniform(x, 10, -2.f, 2.f);
  Tensor labels({batch}, DType::i32);
  for (std::int64_t i = 0; i < batch; ++i)
    labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(i % 3);

  // ReLU has a kink at 0, where a finite difference straddling it is meaningless. Pick the
  // first seed whose hidden pre-activations all stay 0.05 away from 0; a step of eps moves a
  // pre-activation by at most eps * (|x| + 1) = 0.03, so no difference crosses the kink.
  const float eps = 1e-2f;
  const Layer& first = *model.layers()[0];
  std::uint64_t seed = 0;
  for (std::uint64_t candidate = 1; candidate < 1000 && seed == 0; ++candidate) {
    model.init_params(candidate);
    Tensor hidden({batch, 5}, DType::f32);
    const_cast<Layer&>(first).forward(x, hidden, false);
    double margin = 1e9;
    for (std::int64_t i = 0; i < hidden.numel(); ++i)
      margin = std::min(margin, std::fabs(double{hidden.data<float>()[i]}));
    if (margin > 0.05) seed = candidate;
  }
  ASSERT_NE(seed, 0u) << "no seed keeps the ReLU inputs away from the kink";
  model.init_params(seed);

  const auto loss = [&] {
    return kernels::softmax_xent_forward(model.forward(x, true), labels).loss_sum;
  };
  Tensor dlogits({batch, 3}, DType::f32);
  kernels::softmax_xent_forward_backward(model.forward(x, true), labels, dlogits, 1.f);
  model.backward(dlogits);

  // Smooth away from the kink: central differences err by eps^2/6 * f''' ~ 2e-5 * O(1), and f32
  // rounding of the logits (~1e-7 each) adds ~1e-7 / 2e-2 = 5e-6. Tolerance 2e-4 (relative to
  // max(1, |g|)) sits above both and far below a missing ReLU mask or a wrong layer's gradient.
  const Tensor grads = model.grads();
  Tensor params = model.params();
  int nonzero = 0;
  for (std::int64_t i = 0; i < params.numel(); ++i) {
    const double numeric = central_difference(params.data<float>() + i, eps, loss);
    const double analytic = grads.data<float>()[i];
    ASSERT_NEAR(analytic, numeric, 2e-4 * std::max(1.0, std::fabs(numeric))) << "param " << i;
    nonzero += std::fabs(analytic) > 1e-3;
  }
  EXPECT_GT(nonzero, params.numel() / 2);  // the check exercised real gradients, not zeros
}

}  // namespace
}  // namespace mpt::nn
