// A tiny test harness for tests/gpu (plain executables: GoogleTest is not on GPU machines).
// A case runs a CUDA kernel and its host twin on the same random inputs and compares them
// under a tolerance; the tolerances are documented in docs/gpu.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace mpt::gpu_test {

// |got - want| <= atol + rtol * |want| per element, or, with SCALE given, atol + rtol * scale[i]
// (for matmul: scale = sum over k of |a||b|, the size of the products that were added up).
// rtol == atol == 0 asks for identical bits; NaN matches NaN in every comparison.
struct Tolerance {
  double rtol = 0, atol = 0;
};
inline constexpr Tolerance kExact{0, 0};
inline constexpr Tolerance kF32Elementwise{2e-6, 1e-7};    // FMA contraction on the device
inline constexpr Tolerance kF32Transcendental{1e-5, 1e-6};  // erff, expf, sqrtf: a few ulp
inline constexpr Tolerance kF32Reduction{1e-5, 1e-6};       // another summation order
inline constexpr Tolerance kMatmulF32{1e-5, 1e-6};          // relative to sum |a||b|
inline constexpr Tolerance kMatmulF16Out{1e-3, 1e-6};       // + the fp16 rounding of C
inline constexpr Tolerance kMatmulBf16Out{8e-3, 1e-6};      // + the bf16 rounding of C

class Harness {
 public:
  // PRINT false: count only, for a harness that tests the harness (its FAILs are expected).
  explicit Harness(bool print = true) : print_(print) {}
  // Compares any two float tensors (either device, f32/f16/bf16: widened to f32 first).
  void expect_close(const std::string& what, const Tensor& got, const Tensor& want, Tolerance tol,
                    const Tensor* scale = nullptr);
  // Compares raw bytes, for integer and bit-exact results.
  void expect_same_bytes(const std::string& what, const Tensor& got, const Tensor& want);
  void expect(bool ok, const std::string& what, const std::string& detail = "");
  void expect_near(const std::string& what, double got, double want, Tolerance tol);
  // Runs FN in a forked child and expects it to end the job as a kernel precondition does
  // (abort_job: exit status 3) with a message containing NEEDLE; a child silent for TIMEOUT_S
  // seconds is killed and fails the check. FN must make no
  // CUDA call: a forked child cannot use its parent's context. The launchers check their
  // inputs before they touch the device, so a refused call makes none. Not for a process with
  // MPI initialised: the child's abort would be MPI_Abort, from a fork of this rank.
  void expect_fatal(const std::string& what, const std::string& needle,
                    const std::function<void()>& fn, int timeout_s = 10);
  int passed() const { return passed_; }
  int failed() const { return failed_; }

 private:
  void record(bool ok, const std::string& what, const std::string& detail);
  bool print_;
  int passed_ = 0, failed_ = 0;
};

// Deterministic inputs (splitmix64), so a failure reproduces.
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  float uniform(float low, float high);
  // A host tensor of SHAPE and DTYPE (f32, f16, bf16: rounded from f32) uniform in [low, high).
  Tensor tensor(Shape shape, DType dtype, float low = -1.f, float high = 1.f);

 private:
  std::uint64_t state_;
};

// The host tensor widened to f32 (a copy), wherever it lives.
Tensor host_f32(const Tensor& t);
// Writes VALUE (rounded to T's dtype) into element I of a host float tensor.
void set_element(Tensor& t, std::int64_t i, float value);

}  // namespace mpt::gpu_test
