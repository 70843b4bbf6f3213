// optim::Sgd: option checks name the option, the first step starts the momentum buffer from the
// gradient, and a restored step count continues the buffer.
#include <gtest/gtest.h>

#include <string>

#include "core/error.hpp"
#include "optim/optim.hpp"

namespace mpt::optim {
namespace {

TEST(SgdOptimizer, RejectsBadOptionsNamingThem) {
  const std::pair<SgdOptions, const char*> cases[] = {
      {{-0.1f, 0.9f, 0.f, false}, "--optimizer.lr"},
      {{0.1f, -0.5f, 0.f, false}, "--optimizer.momentum"},
      {{0.1f, 0.9f, -1e-4f, false}, "--optimizer.weight-decay"},
      {{0.1f, 0.f, 0.f, true}, "--optimizer.nesterov"},
  };
  for (const auto& [options, option] : cases) {
    try {
      validate(options);
      ADD_FAILURE() << option << " accepted";
    } catch (const UserError& error) {
      EXPECT_NE(std::string(error.what()).find(option), std::string::npos) << error.what();
      EXPECT_FALSE(error.hint().empty());
    }
  }
  EXPECT_NO_THROW(validate(SgdOptions{}));
}

TEST(SgdOptimizer, StepsLikeTorch) {
  Tensor params({2}, DType::f32), grads({2}, DType::f32);
  params.data<float>()[0] = 1.f;
  params.data<float>()[1] = -1.f;
  Sgd sgd(params, grads, SgdOptions{0.1f, 0.5f, 0.f, false});
  ASSERT_TRUE(sgd.momentum_buffer().defined());
  grads.data<float>()[0] = 1.f;
  grads.data<float>()[1] = 2.f;
  sgd.step(0.1f);  // buf = g = (1, 2); p = (0.9, -1.2)
  EXPECT_FLOAT_EQ(params.data<float>()[0], 0.9f);
  EXPECT_FLOAT_EQ(params.data<float>()[1], -1.2f);
  sgd.step(0.2f);  // buf = 0.5 buf + g = (1.5, 3); p -= 0.2 buf = (0.6, -1.8)
  EXPECT_FLOAT_EQ(params.data<float>()[0], 0.6f);
  EXPECT_FLOAT_EQ(params.data<float>()[1], -1.8f);
  EXPECT_EQ(sgd.steps(), 2);

  // A restored optimizer (buffer and step count from a checkpoint) continues the same sequence.
  Tensor restored_params({2}, DType::f32);
  Sgd restored(restored_params, grads, SgdOptions{0.1f, 0.5f, 0.f, false});
  for (int i = 0; i < 2; ++i) {
    restored_params.data<float>()[i] = params.data<float>()[i];
    restored.momentum_buffer().data<float>()[i] = sgd.momentum_buffer().data<float>()[i];
  }
  restored.set_steps(2);
  sgd.step(0.1f);
  restored.step(0.1f);
  EXPECT_EQ(restored_params.data<float>()[0], params.data<float>()[0]);
  EXPECT_EQ(restored_params.data<float>()[1], params.data<float>()[1]);
  EXPECT_NEAR(params.data<float>()[0], 0.6f - 0.1f * (0.75f + 1.f), 1e-6);  // not a fresh start
}

TEST(SgdOptimizer, NoBufferWithoutMomentum) {
  Tensor params({3}, DType::f32), grads({3}, DType::f32);
  Sgd sgd(params, grads, SgdOptions{0.1f, 0.f, 0.f, false});
  EXPECT_FALSE(sgd.momentum_buffer().defined());
  grads.data<float>()[2] = 4.f;
  sgd.step(0.25f);
  EXPECT_FLOAT_EQ(params.data<float>()[2], -1.f);
}

}  // namespace
}  // namespace mpt::optim
