// Tensor: allocation, views sharing storage, reshape and dtype checks.
#include <gtest/gtest.h>

#include "core/error.hpp"
#include "core/tensor.hpp"

namespace mpt {
namespace {

TEST(Tensor, AllocatesZeroFilledAndAligned) {
  Tensor t({3, 5}, DType::f32);
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.size_bytes(), 60u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw()) % 64, 0u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t.data<float>()[i], 0.0f);
}

TEST(Tensor, ViewSharesStorageAtOffset) {
  Tensor flat({10}, DType::f32);
  Tensor v = Tensor::view(flat, 4, {2, 3});
  v.data<float>()[0] = 7.0f;
  v.data<float>()[5] = 9.0f;
  EXPECT_EQ(flat.data<float>()[4], 7.0f);
  EXPECT_EQ(flat.data<float>()[9], 9.0f);
  EXPECT_EQ(v.shape(), (Shape{2, 3}));
}

TEST(Tensor, ReshapeKeepsElements) {
  Tensor t({2, 6}, DType::i32);
  t.data<std::int32_t>()[11] = 5;
  Tensor r = t.reshaped({3, 4});
  EXPECT_EQ(r.data<std::int32_t>()[11], 5);
  EXPECT_EQ(r.dim(1), 4);
}

TEST(Tensor, DescribeAndNames) {
  Tensor t({64, 784}, DType::f32);
  EXPECT_EQ(t.describe(), "float32(64,784) cpu");
  EXPECT_EQ(dtype_from_name("bf16", "--x"), DType::bf16);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
}

TEST(Tensor, UnknownDtypeIsUserErrorNamingOption) {
  try {
    dtype_from_name("fp8", "--train.precision");
    FAIL() << "expected UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("--train.precision"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("fp8"), std::string::npos);
    EXPECT_FALSE(e.hint().empty());
  }
}

TEST(Error, FormatNamesRankHostAndHint) {
  UserError e("data file 'x.h5' not found", "run mptrain prepare first");
  const std::string line = format_user_error(e);
  EXPECT_NE(line.find("rank 0 on "), std::string::npos);
  EXPECT_NE(line.find("x.h5"), std::string::npos);
  EXPECT_NE(line.find("(hint: run mptrain prepare first)"), std::string::npos);
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace mpt
