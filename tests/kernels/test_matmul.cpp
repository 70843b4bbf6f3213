// matmul on both backends against a float64 reference: every transpose combination, beta 0 and
// 1, odd and degenerate sizes, and the primitive cache staying constant in a steady state; bf16
// operands where the host takes them, and their refusal where it does not.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cast.hpp"
#include "kernels/matmul.hpp"
#include "random_fill.hpp"

namespace mpt::kernels {
namespace {

using test::random_tensor;

struct BackendGuard {  // restores the process-wide backend after a test changes it
  MatmulBackend saved = matmul_backend();
  ~BackendGuard() { set_matmul_backend(saved); }
};

// C = op(A) op(B) + beta C0 in float64, with the elementwise bound sum_k |a||b| + |beta c0|.
void reference(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c0, float beta,
               std::vector<double>& expected, std::vector<double>& magnitude) {
  const std::int64_t m = c0.dim(0), n = c0.dim(1), k = ta ? a.dim(0) : a.dim(1);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  const float* pc = c0.data<float>();
  expected.assign(static_cast<std::size_t>(m * n), 0.0);
  magnitude.assign(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = 0, size = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double av = ta ? pa[p * m + i] : pa[i * k + p];
        const double bv = tb ? pb[j * k + p] : pb[p * n + j];
        sum += av * bv;
        size += std::fabs(av * bv);
      }
      const double prior = beta == 0.f ? 0.0 : static_cast<double>(beta) * pc[i * n + j];
      expected[static_cast<std::size_t>(i * n + j)] = sum + prior;
      magnitude[static_cast<std::size_t>(i * n + j)] = size + std::fabs(prior);
    }
}

class MatmulTest : public ::testing::TestWithParam<std::tuple<MatmulBackend, bool, bool, float>> {};

TEST_P(MatmulTest, MatchesFloat64Reference) {
  const auto [backend, ta, tb, beta] = GetParam();
  if (backend == MatmulBackend::dnnl && !dnnl_available()) GTEST_SKIP() << "built without oneDNN";
  BackendGuard guard;
  set_matmul_backend(backend);
  const std::vector<std::array<std::int64_t, 3>> sizes = {
      {7, 13, 5}, {1, 1, 1}, {13, 7, 1}, {1, 17, 9}, {33, 65, 129}, {128, 10, 1024}};
  std::uint64_t seed = 1;
  for (const auto& [m, n, k] : sizes) {
    SCOPED_TRACE(::testing::Message() << "M=" << m << " N=" << n << " K=" << k);
    const Tensor a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, seed++);
    const Tensor b = random_tensor(tb ? Shape{n, k} : Shape{k, n}, seed++);
    Tensor c = random_tensor({m, n}, seed++);
    if (beta == 0.f)  // C must not be read: poison it
      for (std::int64_t i = 0; i < c.numel(); ++i)
        c.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
    std::vector<double> expected, magnitude;
    reference(a, ta, b, tb, c, beta, expected, magnitude);
    matmul(a, ta, b, tb, c, beta);
    // Rounding of a length-K dot product in f32 is at most about K * 2^-24 * sum |a b|
    // (Higham's gamma_K); (K + 2) leaves room for the beta term. A transposition or indexing
    // bug gives errors of the order of the values themselves, far above this.
    const double unit = std::ldexp(1.0, -24);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      const double tolerance = static_cast<double>(k + 2) * unit * magnitude[i] + 1e-30;
      ASSERT_NEAR(c.data<float>()[i], expected[i], tolerance) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllCombinations, MatmulTest,
    ::testing::Combine(::testing::Values(MatmulBackend::dnnl, MatmulBackend::blas),
                       ::testing::Bool(), ::testing::Bool(), ::testing::Values(0.f, 1.f)),
    [](const auto& info) {
      return std::string(matmul_backend_name(std::get<0>(info.param))) +
             (std::get<1>(info.param) ? "_At" : "_A") + (std::get<2>(info.param) ? "_Bt" : "_B") +
             (std::get<3>(info.param) == 0.f ? "_beta0" : "_beta1");
    });

TEST(Matmul, EmptyInnerDimensionGivesBetaTimesC) {
  for (const auto backend : {MatmulBackend::dnnl, MatmulBackend::blas}) {
    if (backend == MatmulBackend::dnnl && !dnnl_available()) continue;
    BackendGuard guard;
    set_matmul_backend(backend);
    const Tensor a({3, 0}, DType::f32), b({0, 2}, DType::f32);
    Tensor c({3, 2}, DType::f32);
    for (std::int64_t i = 0; i < c.numel(); ++i) c.data<float>()[i] = static_cast<float>(i + 1);
    matmul(a, false, b, false, c, 1.f);
    EXPECT_EQ(c.data<float>()[5], 6.f);
    matmul(a, false, b, false, c, 0.f);
    EXPECT_EQ(c.data<float>()[5], 0.f);
  }
}

TEST(Matmul, DnnlCreatesNoPrimitiveInSteadyState) {
  if (!dnnl_available()) GTEST_SKIP() << "built without oneDNN";
  BackendGuard guard;
  set_matmul_backend(MatmulBackend::dnnl);
  const Tensor a = random_tensor({9, 11}, 40), b = random_tensor({11, 6}, 41);
  Tensor c({9, 6}, DType::f32);
  matmul(a, false, b, false, c);
  const std::size_t after_first = dnnl_primitive_count();
  for (int step = 0; step < 5; ++step) matmul(a, false, b, false, c);
  EXPECT_EQ(dnnl_primitive_count(), after_first);
  // A new shape (or beta) is a new primitive, so the count does measure creations.
  matmul(a, false, b, false, c, 1.f);
  EXPECT_EQ(dnnl_primitive_count(), after_first + 1);
}

// A bf16 copy of VALUES (rounded), and VALUES overwritten with the bf16 values widened back
// (exact), so that the f64 reference sees the numbers the bf16 matmul multiplies.
Tensor to_bf16(Tensor& values) {
  Tensor rounded(values.shape(), DType::bf16);
  cast(values, rounded);
  cast(rounded, values);
  return rounded;
}

class MatmulBf16Test : public ::testing::TestWithParam<std::tuple<bool, bool, float, DType>> {};

// bf16 products are exact in f32, so the bf16 matmul is the f32 product of the widened values:
// the same bound as above; a bf16 C adds its own rounding (half an ulp, 2^-9 relative).
TEST_P(MatmulBf16Test, MatchesFloat64ReferenceOfTheBf16Values) {
  if (!host_matmul_takes(DType::bf16))
    GTEST_SKIP() << "no native bf16 matmul here (host_matmul_takes(bf16) is false: a CPU "
                    "without AVX512-BF16 or AMX, or a build without oneDNN); "
                    "Matmul.Bf16IsRefusedWhereTheHostDoesNotTakeIt covers it";
  const auto [ta, tb, beta, c_dtype] = GetParam();
  const std::vector<std::array<std::int64_t, 3>> sizes = {
      {7, 13, 5}, {1, 1, 1}, {33, 65, 129}, {128, 10, 1024}, {64, 300, 800}};
  std::uint64_t seed = 100;
  for (const auto& [m, n, k] : sizes) {
    SCOPED_TRACE(::testing::Message() << "M=" << m << " N=" << n << " K=" << k);
    Tensor a32 = random_tensor(ta ? Shape{k, m} : Shape{m, k}, seed++);
    Tensor b32 = random_tensor(tb ? Shape{n, k} : Shape{k, n}, seed++);
    const Tensor a = to_bf16(a32), b = to_bf16(b32);
    const std::uint64_t c_seed = seed++;
    Tensor c0 = random_tensor({m, n}, c_seed);
    Tensor c = c_dtype == DType::bf16 ? to_bf16(c0) : random_tensor({m, n}, c_seed);
    if (beta == 0.f) {  // C must not be read: poison it
      Tensor nan({m, n}, DType::f32);
      for (std::int64_t i = 0; i < nan.numel(); ++i)
        nan.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
      cast(nan, c);
    }
    std::vector<double> expected, magnitude;
    reference(a32, ta, b32, tb, c0, beta, expected, magnitude);
    matmul(a, ta, b, tb, c, beta);
    Tensor result({m, n}, DType::f32);
    cast(c, result);
    const double unit = std::ldexp(1.0, -24);
    for (std::size_t i = 0; i < expected.size(); ++i) {
      double tolerance = static_cast<double>(k + 2) * unit * magnitude[i] + 1e-30;
      if (c_dtype == DType::bf16) tolerance += std::ldexp(std::fabs(expected[i]) + tolerance, -8);
      ASSERT_NEAR(result.data<float>()[i], expected[i], tolerance) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllCombinations, MatmulBf16Test,
    ::testing::Combine(::testing::Bool(), ::testing::Bool(), ::testing::Values(0.f, 1.f),
                       ::testing::Values(DType::f32, DType::bf16)),
    [](const auto& info) {
      return std::string(std::get<0>(info.param) ? "At" : "A") +
             (std::get<1>(info.param) ? "_Bt" : "_B") +
             (std::get<2>(info.param) == 0.f ? "_beta0" : "_beta1") +
             (std::get<3>(info.param) == DType::f32 ? "_f32out" : "_bf16out");
    });

// Which dtypes the host takes: f32 always, f16 never (oneDNN 2.6 has no f16 matmul on the CPU),
// bf16 only with the oneDNN backend, so BLAS turns it off.
TEST(Matmul, HostTakesF32AlwaysF16NeverBf16OnlyThroughDnnl) {
  BackendGuard guard;
  EXPECT_TRUE(host_matmul_takes(DType::f32));
  EXPECT_FALSE(host_matmul_takes(DType::f16));
  if (!dnnl_available()) {
    EXPECT_FALSE(host_matmul_takes(DType::bf16));
  }
  set_matmul_backend(MatmulBackend::blas);
  EXPECT_FALSE(host_matmul_takes(DType::bf16));
  EXPECT_TRUE(host_matmul_takes(DType::f32));
}

// Where the host does not take bf16 (here forced by the BLAS backend), a bf16 matmul ends the
// job with one line naming the fix rather than reading 16-bit data as f32. "threadsafe": the
// child re-runs this binary up to the test, with its own MPI singleton.
void bf16_matmul_through_blas() {
  set_matmul_backend(MatmulBackend::blas);
  const Tensor a({4, 3}, DType::bf16), b({3, 2}, DType::bf16);
  Tensor c({4, 2}, DType::f32);
  matmul(a, false, b, false, c);
}

TEST(MatmulDeathTest, Bf16IsRefusedWhereTheHostDoesNotTakeIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(bf16_matmul_through_blas(), testing::ExitedWithCode(3),
      "kernels::matmul: bf16 a needs the oneDNN backend on a CPU with bf16 dot products");
}

TEST(Matmul, Bf16OperandsMustMatchAndOutputIsF32OrBf16) {
  if (!host_matmul_takes(DType::bf16)) GTEST_SKIP() << "no native bf16 matmul here";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Tensor a({4, 3}, DType::bf16), b32({3, 2}, DType::f32), b({3, 2}, DType::bf16);
  Tensor c({4, 2}, DType::f32), c16({4, 2}, DType::f16);
  EXPECT_EXIT(matmul(a, false, b32, false, c), testing::ExitedWithCode(3),
              "b must be a host bf16 tensor, like a");
  EXPECT_EXIT(matmul(a, false, b, false, c16), testing::ExitedWithCode(3),
              "c must be f32 or bf16 on the host");
}

TEST(Matmul, DefaultBackendIsDnnlWhenAvailable) {
  // Nothing above leaves the backend changed (BackendGuard), so this is still the default.
  EXPECT_EQ(matmul_backend(), dnnl_available() ? MatmulBackend::dnnl : MatmulBackend::blas);
}

}  // namespace
}  // namespace mpt::kernels
