// adamw_update against torch.optim.AdamW's rule (hand-computed steps, a float64 replay, the
// decay mask, the fused recast) and sum_of_squares against a float64 sum.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/adamw.hpp"
#include "kernels/cast.hpp"
#include "kernels/norm.hpp"
#include "random_fill.hpp"

namespace mpt::kernels {
namespace {

using test::random_tensor;

AdamwStep scalars_for(int t, float lr, float weight_decay) {
  AdamwStep s;
  s.lr = lr;
  s.weight_decay = weight_decay;
  s.bias_correction1 = 1.0 - std::pow(static_cast<double>(s.beta1), t);
  s.bias_correction2 = 1.0 - std::pow(static_cast<double>(s.beta2), t);
  return s;
}

// Constant g = 0.5 makes m_hat = g and v_hat = g^2 at every step (bias correction exact), so each
// Adam step moves p by lr * g / (|g| + eps) = lr (to 2e-8), and decoupled decay multiplies p by
// 1 - lr * wd first. p0 = 1, lr 0.1, wd 0.01:
//   decayed:  0.999 - 0.1 = 0.899;  0.899*0.999 - 0.1 = 0.798101;
//             0.798101*0.999 - 0.1 = 0.697302899
//   masked:   0.9, 0.8, 0.7
TEST(Adamw, HandComputedThreeStepsWithAndWithoutDecay) {
  Tensor p({2}, DType::f32), g({2}, DType::f32), m({2}, DType::f32), v({2}, DType::f32);
  Tensor mask({2}, DType::u8);
  p.data<float>()[0] = p.data<float>()[1] = 1.f;
  g.data<float>()[0] = g.data<float>()[1] = 0.5f;
  mask.data<std::uint8_t>()[0] = 1;  // element 1 stays 0: a bias
  const double decayed[3] = {0.899, 0.798101, 0.697302899};
  const double masked[3] = {0.9, 0.8, 0.7};
  for (int t = 1; t <= 3; ++t) {
    adamw_update(p, g, m, v, &mask, scalars_for(t, 0.1f, 0.01f));
    EXPECT_NEAR(p.data<float>()[0], decayed[t - 1], 2e-6) << "step " << t;
    EXPECT_NEAR(p.data<float>()[1], masked[t - 1], 2e-6) << "step " << t;
  }
  // Without a mask every element decays.
  Tensor q({1}, DType::f32), h({1}, DType::f32), m1({1}, DType::f32), v1({1}, DType::f32);
  q.data<float>()[0] = 1.f;
  h.data<float>()[0] = 0.5f;
  for (int t = 1; t <= 3; ++t) adamw_update(q, h, m1, v1, nullptr, scalars_for(t, 0.1f, 0.01f));
  EXPECT_NEAR(q.data<float>()[0], decayed[2], 2e-6);
}

// Varying gradients over 3 steps against the rule replayed in float64, on a vector long enough
// for several chunks; half the elements masked.
TEST(Adamw, MatchesFloat64Replay) {
  const std::int64_t n = 40000;
  Tensor p = random_tensor({n}, 1), m({n}, DType::f32), v({n}, DType::f32), mask({n}, DType::u8);
  for (std::int64_t i = 0; i < n; ++i) mask.data<std::uint8_t>()[i] = i % 2;
  std::vector<double> p64(p.data<float>(), p.data<float>() + n), m64(n, 0), v64(n, 0);
  const float lr = 1e-2f, wd = 0.1f;
  for (int t = 1; t <= 3; ++t) {
    Tensor g = random_tensor({n}, 10 + t);
    const AdamwStep s = scalars_for(t, lr, wd);
    adamw_update(p, g, m, v, &mask, s);
    for (std::int64_t i = 0; i < n; ++i) {
      const double gi = g.data<float>()[i];
      if (i % 2) p64[i] *= 1.0 - double(lr) * double(wd);
      m64[i] = double(s.beta1) * m64[i] + (1 - double(s.beta1)) * gi;
      v64[i] = double(s.beta2) * v64[i] + (1 - double(s.beta2)) * gi * gi;
      p64[i] -= double(lr) / s.bias_correction1 * m64[i] /
                (std::sqrt(v64[i]) / std::sqrt(s.bias_correction2) + double(s.eps));
    }
  }
  double worst = 0;
  for (std::int64_t i = 0; i < n; ++i)
    worst = std::max(worst, std::fabs(p.data<float>()[i] - p64[i]));
  // Each step moves p by at most about lr; f32 rounding of |p| <= 1 is 6e-8 per operation.
  EXPECT_LT(worst, 2e-6);
}

TEST(AdamwFusedRecast, MatchesSeparateRecast) {
  for (const DType dtype : {DType::f16, DType::bf16}) {
    const std::int64_t n = 40000;
    Tensor p = random_tensor({n}, 3), g = random_tensor({n}, 4);
    Tensor m({n}, DType::f32), v({n}, DType::f32), m_ref({n}, DType::f32), v_ref({n}, DType::f32);
    Tensor p_ref({n}, DType::f32);
    std::memcpy(p_ref.raw(), p.raw(), p.size_bytes());
    Tensor rounded({n}, dtype), widened({n}, DType::f32), rounded_ref({n}, dtype),
        widened_ref({n}, DType::f32);
    adamw_update(p, g, m, v, nullptr, scalars_for(1, 1e-3f, 0.01f), &rounded, &widened);
    adamw_update(p_ref, g, m_ref, v_ref, nullptr, scalars_for(1, 1e-3f, 0.01f));
    round_and_widen(p_ref, rounded_ref, widened_ref);
    ASSERT_EQ(std::memcmp(p.raw(), p_ref.raw(), p.size_bytes()), 0);
    EXPECT_EQ(std::memcmp(rounded.raw(), rounded_ref.raw(), rounded.size_bytes()), 0);
    EXPECT_EQ(std::memcmp(widened.raw(), widened_ref.raw(), widened.size_bytes()), 0);
  }
}

TEST(SumOfSquares, MatchesFloat64Sum) {
  for (const std::int64_t n : {0, 1, 7, 16384, 100003}) {
    Tensor x = random_tensor({std::max<std::int64_t>(n, 1)}, 21, -3.f, 3.f);
    if (n == 0) x = Tensor({0}, DType::f32);
    double reference = 0;
    for (std::int64_t i = 0; i < n; ++i)
      reference += double(x.data<float>()[i]) * x.data<float>()[i];
    EXPECT_NEAR(sum_of_squares(x), reference, 1e-12 * std::max(1.0, reference)) << n;
  }
}

}  // namespace
}  // namespace mpt::kernels
