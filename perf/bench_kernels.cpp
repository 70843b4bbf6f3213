// Host matmul, oneDNN against OpenBLAS, on the MLP's shapes at batch 128, single thread, and
// oneDNN with bf16 operands where the host takes them (AMX or AVX512-BF16: "dnnl_bf16"). Every
// benchmark checks its result against the other backend once, and the run ends with a table of
// oneDNN/OpenBLAS ratios. Run: bench_kernels [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "core/tensor.hpp"
#include "kernels/cast.hpp"
#include "kernels/matmul.hpp"

namespace {

using mpt::DType;
using mpt::Tensor;
using mpt::kernels::MatmulBackend;

// One matmul of the MLP 784-1024-1024-10 at batch 128, as nn::Dense calls it.
struct MatmulCase {
  const char* name;
  std::int64_t m, n, k;
  bool transpose_a, transpose_b;
};

constexpr std::int64_t kBatch = 128;
const MatmulCase kCases[] = {
    // forward: y[b, out] = x[b, in] · W[out, in]ᵀ
    {"fwd_784to1024", kBatch, 1024, 784, false, true},
    {"fwd_1024to1024", kBatch, 1024, 1024, false, true},
    {"fwd_1024to10", kBatch, 10, 1024, false, true},
    // weight gradient: dW[out, in] = dy[b, out]ᵀ · x[b, in]
    {"dW_784to1024", 1024, 784, kBatch, true, false},
    {"dW_1024to1024", 1024, 1024, kBatch, true, false},
    {"dW_1024to10", 10, 1024, kBatch, true, false},
    // input gradient: dx[b, in] = dy[b, out] · W[out, in]
    {"dx_1024to1024", kBatch, 1024, 1024, false, false},
    {"dx_1024to10", kBatch, 1024, 10, false, false},
};

Tensor random_matrix(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  Tensor t({rows, cols}, DType::f32);
  const mpt::CounterRng rng(seed, 0);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = 2.f * rng.uniform(static_cast<std::uint64_t>(i)) - 1.f;
  return t;
}

// The timed loop of one case: OUT = op(A) op(B), after checking OUT (already computed once)
// against CHECK, the same product another way; a difference over 1e-3 fails the run with
// DISAGREE and the difference.
void time_matmul(benchmark::State& state, const MatmulCase& c, const Tensor& a, const Tensor& b,
                 Tensor& out, const Tensor& check, const char* disagree) {
  double worst = 0;
  for (std::int64_t i = 0; i < out.numel(); ++i)
    worst = std::max(worst, double{std::fabs(out.data<float>()[i] - check.data<float>()[i])});
  if (worst > 1e-3) state.SkipWithError((disagree + std::to_string(worst)).c_str());
  for (auto _ : state) {
    mpt::kernels::matmul(a, c.transpose_a, b, c.transpose_b, out);
    benchmark::DoNotOptimize(out.raw());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * static_cast<double>(c.m * c.n * c.k) * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["worst_diff"] = worst;
}

void run_matmul(benchmark::State& state, MatmulCase c, MatmulBackend backend) {
  mpt::kernels::set_matmul_backend(backend);
  const Tensor a = c.transpose_a ? random_matrix(c.k, c.m, 1) : random_matrix(c.m, c.k, 1);
  const Tensor b = c.transpose_b ? random_matrix(c.n, c.k, 2) : random_matrix(c.k, c.n, 2);
  Tensor out({c.m, c.n}, DType::f32), check({c.m, c.n}, DType::f32);

  // Correctness in every run (the nccl-tests habit): compare with the other backend.
  mpt::kernels::matmul(a, c.transpose_a, b, c.transpose_b, out);
  mpt::kernels::set_matmul_backend(backend == MatmulBackend::dnnl ? MatmulBackend::blas
                                                                  : MatmulBackend::dnnl);
  mpt::kernels::matmul(a, c.transpose_a, b, c.transpose_b, check);
  mpt::kernels::set_matmul_backend(backend);
  time_matmul(state, c, a, b, out, check, "backends disagree by ");
}

// The same product with bf16 operands (the values rounded to bf16) and an f32 result, as the
// layers call it where mptrain::kernels::host_matmul_takes(bf16); checked against the f32
// product of the rounded values, which it equals up to the order of the f32 sums.
void run_matmul_bf16(benchmark::State& state, MatmulCase c) {
  mpt::kernels::set_matmul_backend(MatmulBackend::dnnl);
  Tensor a32 = c.transpose_a ? random_matrix(c.k, c.m, 1) : random_matrix(c.m, c.k, 1);
  Tensor b32 = c.transpose_b ? random_matrix(c.n, c.k, 2) : random_matrix(c.k, c.n, 2);
  Tensor a(a32.shape(), DType::bf16), b(b32.shape(), DType::bf16);
  mpt::kernels::cast(a32, a);
  mpt::kernels::cast(b32, b);
  mpt::kernels::cast(a, a32);
  mpt::kernels::cast(b, b32);
  Tensor out({c.m, c.n}, DType::f32), check({c.m, c.n}, DType::f32);
  mpt::kernels::matmul(a, c.transpose_a, b, c.transpose_b, out);
  mpt::kernels::matmul(a32, c.transpose_a, b32, c.transpose_b, check);
  time_matmul(state, c, a, b, out, check, "bf16 and f32 disagree by ");
}

// The console report, then one line per case with oneDNN / OpenBLAS throughput.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& run : runs) {
      const auto found = run.counters.find("GFLOP/s");
      if (found == run.counters.end() || run.error_occurred) continue;
      const std::string name = run.benchmark_name();  // "matmul/<case>/<backend>"
      const auto slash = name.rfind('/');
      rates_[name.substr(0, slash)][name.substr(slash + 1)] = found->second.value;
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n%-28s %10s %10s %8s\n", "case", "dnnl", "openblas", "ratio");
    for (const auto& [name, rate] : rates_) {
      const auto dnnl = rate.find("dnnl"), blas = rate.find("openblas");
      if (dnnl == rate.end() || blas == rate.end()) continue;
      std::printf("%-28s %10.1f %10.1f %8.2f\n", name.c_str(), dnnl->second, blas->second,
                  dnnl->second / blas->second);
    }
  }

 private:
  std::map<std::string, std::map<std::string, double>> rates_;
};

}  // namespace

int main(int argc, char** argv) {
  Kokkos::initialize(argc, argv);
  {
    // One thread each: the comparison is per core, and MPI ranks pin one per core anyway.
    omp_set_num_threads(1);
    openblas_set_num_threads(1);
    for (const MatmulCase& c : kCases) {
      const std::string base = std::string("matmul/") + c.name;
      if (mpt::kernels::dnnl_available())
        benchmark::RegisterBenchmark((base + "/dnnl").c_str(), run_matmul, c, MatmulBackend::dnnl);
      if (mpt::kernels::host_matmul_takes(DType::bf16))
        benchmark::RegisterBenchmark((base + "/dnnl_bf16").c_str(), run_matmul_bf16, c);
      benchmark::RegisterBenchmark((base + "/openblas").c_str(), run_matmul, c,
                                   MatmulBackend::blas);
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    RatioReporter reporter;
    benchmark::RunSpecifiedBenchmarks(&reporter);
    benchmark::Shutdown();
  }
  Kokkos::finalize();
  return 0;
}
