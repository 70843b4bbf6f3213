// sgd_update against PyTorch's SGD rule: hand-computed values, and a float64 replay of the rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cast.hpp"
#include "kernels/sgd.hpp"
#include "random_fill.hpp"

namespace mpt::kernels {
namespace {

using test::random_tensor;

Tensor scalar_tensor(float value) {
  Tensor t({1}, DType::f32);
  t.data<float>()[0] = value;
  return t;
}

// p = 1, constant g = 0.5, lr 0.1, momentum 0.9, weight decay 0.1. By hand (torch.optim.SGD):
//   step 1: d = 0.5 + 0.1*1 = 0.6;        buf = 0.6;                 p = 1 - 0.06 = 0.94
//   step 2: d = 0.5 + 0.094 = 0.594;      buf = 0.54 + 0.594 = 1.134; p = 0.94 - 0.1134 = 0.8266
//   step 3: d = 0.5 + 0.08266 = 0.58266;  buf = 1.0206 + 0.58266 = 1.60326;
//           p = 0.8266 - 0.160326 = 0.666274
// Nesterov, same numbers, p -= lr * (d + 0.9 buf):
//   step 1: buf = 0.6;          p = 1 - 0.1*(0.6 + 0.54) = 0.886
//   step 2: d = 0.5886;         buf = 1.1286;     p = 0.886 - 0.1*(0.5886 + 1.01574) = 0.725566
//   step 3: d = 0.5725566;      buf = 1.5882966;
//           p = 0.725566 - 0.1*(0.5725566 + 1.42946694) = 0.525363646
TEST(Sgd, HandComputedThreeSteps) {
  for (const bool nesterov : {false, true}) {
    SCOPED_TRACE(nesterov ? "nesterov" : "heavy ball");
    Tensor p = scalar_tensor(1.f);
    const Tensor g = scalar_tensor(0.5f);
    // The first step must ignore whatever the buffer holds.
    Tensor buf = scalar_tensor(std::numeric_limits<float>::quiet_NaN());
    const double expected_p[2][3] = {{0.94, 0.8266, 0.666274}, {0.886, 0.725566, 0.525363646}};
    const double expected_buf[2][3] = {{0.6, 1.134, 1.60326}, {0.6, 1.1286, 1.5882966}};
    for (int step = 0; step < 3; ++step) {
      sgd_update(p, g, buf, 0.1f, 0.9f, 0.1f, nesterov, step == 0);
      EXPECT_NEAR(p.data<float>()[0], expected_p[nesterov][step], 1e-6) << "step " << step + 1;
      EXPECT_NEAR(buf.data<float>()[0], expected_buf[nesterov][step], 1e-6) << "step " << step + 1;
    }
  }
}

TEST(Sgd, MatchesFloat64ReplayOnVectors) {
  const std::int64_t n = 40000;  // several chunks
  for (const bool nesterov : {false, true}) {
    for (const float momentum : {0.f, 0.9f}) {
      if (nesterov && momentum == 0.f) continue;
      SCOPED_TRACE(::testing::Message() << "nesterov=" << nesterov << " momentum=" << momentum);
      Tensor p = random_tensor({n}, 21);
      Tensor buf({n}, DType::f32);
      std::vector<double> p64(p.data<float>(), p.data<float>() + n), buf64(n, 0.0);
      const float lr = 0.05f, wd = 1e-3f;
      for (int step = 0; step < 3; ++step) {
        const Tensor g = random_tensor({n}, 30 + step);
        sgd_update(p, g, buf, lr, momentum, wd, nesterov, step == 0);
        for (std::int64_t i = 0; i < n; ++i) {
          const double d = g.data<float>()[i] + double{wd} * p64[i];
          if (momentum == 0.f) {
            p64[i] -= double{lr} * d;
            continue;
          }
          buf64[i] = step == 0 ? d : double{momentum} * buf64[i] + d;
          p64[i] -= double{lr} * (nesterov ? d + double{momentum} * buf64[i] : buf64[i]);
        }
      }
      for (std::int64_t i = 0; i < n; ++i) {
        // Values are O(1); three f32 steps round a few times at 6e-8 each.
        ASSERT_NEAR(p.data<float>()[i], p64[i], 2e-6) << i;
        if (momentum > 0) {
          ASSERT_NEAR(buf.data<float>()[i], buf64[i], 2e-6) << i;
        }
      }
    }
  }
}

TEST(Sgd, NoMomentumLeavesBufferAlone) {
  Tensor p = scalar_tensor(2.f);
  const Tensor g = scalar_tensor(1.f);
  Tensor unused;  // PyTorch keeps no buffer without momentum
  sgd_update(p, g, unused, 0.5f, 0.f, 0.25f, false, true);
  EXPECT_FLOAT_EQ(p.data<float>()[0], 2.f - 0.5f * (1.f + 0.25f * 2.f));
}

}  // namespace
}  // namespace mpt::kernels

namespace mpt {
namespace {

// The recast fused into the SGD update writes exactly what a separate round_and_widen of the
// updated parameters writes, for fp16 and bf16, with and without momentum.
TEST(SgdFusedRecast, MatchesSeparateRecast) {
  for (const DType dtype : {DType::f16, DType::bf16}) {
    for (const float momentum : {0.f, 0.9f}) {
      const std::int64_t n = 40000;  // several chunks and a partial one
      Tensor p({n}, DType::f32), g({n}, DType::f32), buf({n}, DType::f32);
      for (std::int64_t i = 0; i < n; ++i) {
        p.data<float>()[i] = 0.001f * static_cast<float>(i % 997) - 0.5f;
        g.data<float>()[i] = 0.01f * static_cast<float>(i % 13) - 0.06f;
      }
      Tensor p_ref({n}, DType::f32), buf_ref({n}, DType::f32);
      std::copy_n(p.data<float>(), n, p_ref.data<float>());
      Tensor rounded({n}, dtype), widened({n}, DType::f32), rounded_ref({n}, dtype), widened_ref({n}, DType::f32);
      kernels::sgd_update(p, g, buf, 0.1f, momentum, 1e-4f, false, true, &rounded, &widened);
      kernels::sgd_update(p_ref, g, buf_ref, 0.1f, momentum, 1e-4f, false, true);
      kernels::round_and_widen(p_ref, rounded_ref, widened_ref);
      ASSERT_EQ(std::memcmp(p.raw(), p_ref.raw(), p.size_bytes()), 0);
      EXPECT_EQ(std::memcmp(rounded.raw(), rounded_ref.raw(), rounded.size_bytes()), 0) << dtype_name(dtype);
      EXPECT_EQ(std::memcmp(widened.raw(), widened_ref.raw(), widened.size_bytes()), 0) << dtype_name(dtype);
    }
  }
}

}  // namespace
}  // namespace mpt
