// Runs everywhere: the host twins that tests/gpu compares the CUDA kernels with, checked
// against plain serial loops. In the GPU-only build these are the fallbacks (OpenMP loops
// instead of Kokkos, a blocked matmul instead of BLAS/oneDNN), so this is their test.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cast.hpp"
#include "kernels/finite.hpp"
#include "kernels/matmul.hpp"
#include "kernels/norm.hpp"
#include "kernels/softmax_xent.hpp"
#include "kernels/unscale_check.hpp"
#include "tests/gpu/harness.hpp"
#include "tests/gpu/kernel_cases.hpp"
#include "tests/gpu/overlap_cases.hpp"

#ifdef MPTRAIN_HAVE_KOKKOS
#include <Kokkos_Core.hpp>
#endif

namespace mpt::gpu_test {
namespace {

void check_matmul(Harness& h, Random& rng) {
  for (auto [m, n, k] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{37, 29, 300}, {1, 1, 1}, {64, 130, 17}})
    for (int transposes = 0; transposes < 4; ++transposes) {
      const bool ta = transposes & 1, tb = transposes & 2;
      const float beta = transposes == 2 ? 0.5f : 0.f;
      Tensor a = rng.tensor(ta ? Shape{k, m} : Shape{m, k}, DType::f32);
      Tensor b = rng.tensor(tb ? Shape{n, k} : Shape{k, n}, DType::f32);
      Tensor c = rng.tensor({m, n}, DType::f32), want = c.to(Device::cpu);
      if (beta == 0.f) c.data<float>()[0] = NAN;  // beta == 0 must not read C
      const float* pa = a.data<float>();
      const float* pb = b.data<float>();
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t j = 0; j < n; ++j) {
          double sum = 0;
          for (std::int64_t p = 0; p < k; ++p)
            sum += static_cast<double>(ta ? pa[p * m + i] : pa[i * k + p]) *
                   (tb ? pb[j * k + p] : pb[p * n + j]);
          float& out = want.data<float>()[i * n + j];
          out = static_cast<float>(sum + (beta == 0.f ? 0.0 : beta * static_cast<double>(out)));
        }
      kernels::matmul(a, ta, b, tb, c, beta);
      h.expect_close("host matmul (" + std::string(kernels::matmul_backend_name(kernels::matmul_backend())) +
                         ") m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                         " transposes=" + std::to_string(transposes),
                     c, want, {1e-5, 1e-5});
    }
}

void check_reductions(Harness& h, Random& rng) {
  Tensor x = rng.tensor({200001}, DType::f32, -2.f, 2.f);
  double want = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) want += static_cast<double>(x.data<float>()[i]) * x.data<float>()[i];
  h.expect_near("host sum_of_squares", kernels::sum_of_squares(x), want, {1e-12, 0});
  h.expect(kernels::all_finite(x), "host all_finite on finite data");
  x.data<float>()[x.numel() - 1] = INFINITY;
  h.expect(!kernels::all_finite(x), "host all_finite sees the last Inf");
  std::vector<Tensor> in{x, rng.tensor({77}, DType::f16)}, out{Tensor({x.numel()}, DType::f32), Tensor({77}, DType::f32)};
  h.expect(!kernels::unscale_and_check(in, out, 0.5f), "host unscale_and_check sees the Inf");
  h.expect(out[0].data<float>()[5] == 0.5f * x.data<float>()[5], "host unscale_and_check scales");

  const std::int64_t batch = 300, classes = 13;
  Tensor logits = rng.tensor({batch, classes}, DType::f32, -5.f, 5.f), labels({batch}, DType::i32);
  double loss = 0;
  std::int64_t correct = 0;
  for (std::int64_t r = 0; r < batch; ++r) {
    const auto label = static_cast<std::int32_t>(rng.next() % classes);
    labels.data<std::int32_t>()[r] = label;
    const float* row = logits.data<float>() + r * classes;
    std::int64_t argmax = 0;
    double sum = 0;
    for (std::int64_t j = 0; j < classes; ++j) {
      if (row[j] > row[argmax]) argmax = j;
      sum += std::exp(static_cast<double>(row[j]));
    }
    loss += std::log(sum) - row[label];
    correct += argmax == label;
  }
  const auto stats = kernels::softmax_xent_forward(logits, labels);
  h.expect_near("host softmax_xent loss", stats.loss_sum, loss, {1e-6, 0});
  h.expect(stats.correct == correct, "host softmax_xent correct",
           std::to_string(stats.correct) + " vs " + std::to_string(correct));
}

// Harness::expect_fatal, which the device cases use for the launchers' refusals of tensors on the
// wrong device: a host kernel's refusal passes it; a call that returns, ends otherwise or says
// something else fails it.
void check_expect_fatal(Harness& h) {
  const Tensor src({5}, DType::f32);
  Tensor bad_dst({5}, DType::i32);
  h.expect_fatal("host cast into an i32 dst", "kernels::cast: dst must be f32, f16 or bf16",
                 [&] { kernels::cast(src, bad_dst); });
  Harness inner(false);
  // A cast onto itself returns at once: no parallel region, which a forked child of a process
  // whose OpenMP pool has started (the GPU-only build's host kernels) could wait in forever.
  Tensor same = src;
  inner.expect_fatal("a cast that works", "kernels::cast", [&] { kernels::cast(src, same); });
  inner.expect_fatal("another exit status", "", [] { std::_Exit(1); });
  inner.expect_fatal("an exception", "", [] { throw std::runtime_error("not a refusal"); });
  inner.expect_fatal("another message", "no such message", [&] { kernels::cast(src, bad_dst); });
  inner.expect_fatal("a hang", "", [] { for (;;) pause(); }, 1);
  h.expect(inner.failed() == 5 && inner.passed() == 0,
           "expect_fatal fails a call that returns, exits 1, throws, hangs, or names something else",
           std::to_string(inner.failed()) + " of 5 failed");
}

// gpu_kernels runs the overlap rows of each case table header on the device: a row whose
// header is not in the table would never run there.
void check_overlap_headers(Harness& h) {
  int matched = 0;
  for (const KernelCase& row : kKernelCases) matched += overlap_rows(row.header);
  h.expect(matched == overlap_rows() && matched > 0,
           "every overlap row's header has a row in kernel_cases.hpp",
           std::to_string(matched) + " of " + std::to_string(overlap_rows()) + " matched");
}

}  // namespace
}  // namespace mpt::gpu_test

int main(int argc, char** argv) {
#ifdef MPTRAIN_HAVE_KOKKOS
  Kokkos::initialize(argc, argv);
#endif
  mpt::gpu_test::Harness harness;
  {
    mpt::gpu_test::Random rng(7);
    mpt::gpu_test::check_matmul(harness, rng);
    mpt::gpu_test::check_reductions(harness, rng);
    mpt::gpu_test::check_expect_fatal(harness);
    mpt::gpu_test::check_overlap_refusals(harness, mpt::Device::cpu);
    mpt::gpu_test::check_overlap_headers(harness);
  }
#ifdef MPTRAIN_HAVE_KOKKOS
  Kokkos::finalize();
#endif
  std::printf("%d passed, %d failed\n", harness.passed(), harness.failed());
  return harness.failed() == 0 ? 0 : 1;
}
