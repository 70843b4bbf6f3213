// CUDA matmul through cuBLASLt (see kernels/matmul.hpp). Row-major C = op(A) op(B) is computed
// as the column-major C^T = op(B)^T op(A)^T, so no data moves. One handle and one workspace
// are allocated on first use; a plan (descriptors, layouts and the heuristic's algorithm) is
// made once per shape, dtype and pointer alignment, so the training step creates nothing.
#include <cublasLt.h>

#include <cstring>
#include <mutex>
#include <unordered_map>

#include "kernels/cuda/common.cuh"
#include "kernels/matmul.hpp"

namespace mpt::kernels::cuda {
namespace {

bool cublas_ok(cublasStatus_t status) { return status == CUBLAS_STATUS_SUCCESS; }
std::string cublas_text(cublasStatus_t status) {
  return "cuBLAS status " + std::to_string(static_cast<int>(status));
}
#define MPT_CHECK_CUBLAS(call) MPT_CHECK_GEN("cuBLASLt", call, cublas_ok, cublas_text)

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;

struct PlanKey {
  std::int64_t m, n, k;
  bool transpose_a, transpose_b, beta_zero;
  DType ab, c;
  int align_a, align_b, align_c;
  bool operator==(const PlanKey&) const = default;
};
struct PlanKeyHash {
  std::size_t operator()(const PlanKey& key) const {
    std::size_t h = static_cast<std::size_t>(key.m);
    for (std::size_t v :
         {static_cast<std::size_t>(key.n), static_cast<std::size_t>(key.k),
          static_cast<std::size_t>(key.transpose_a * 4 + key.transpose_b * 2 + key.beta_zero),
          static_cast<std::size_t>(key.ab) * 16 + static_cast<std::size_t>(key.c),
          static_cast<std::size_t>(key.align_a * 1024 + key.align_b * 32 + key.align_c)})
      h = h * 0x9E3779B97F4A7C15ull + v;
    return h;
  }
};
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // in cuBLAS's (swapped) roles
  cublasLtMatmulAlgo_t algo{};
};

cudaDataType_t cuda_type(DType dtype) {
  return dtype == DType::f16 ? CUDA_R_16F : dtype == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
}

// The largest power of two up to 16 that divides the address: what cuBLASLt may assume.
int alignment(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  int bytes = 16;
  while (bytes > 1 && address % static_cast<std::uintptr_t>(bytes) != 0) bytes /= 2;
  return bytes;
}

class LtContext {
 public:
  static LtContext& instance() {
    static LtContext context;
    return context;
  }

  const Plan& plan(const PlanKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = plans_.find(key);
    if (found != plans_.end()) return found->second;
    return plans_.emplace(key, make_plan(key)).first->second;
  }
  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }

 private:
  LtContext() {
    MPT_CHECK_CUBLAS(cublasLtCreate(&handle_));
    workspace_ = device_memory::allocate_cuda(kWorkspaceBytes);  // from the arena
  }

  Plan make_plan(const PlanKey& key) {
    Plan plan;
    MPT_CHECK_CUBLAS(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // cuBLAS's A is our B and its B our A (the transposed problem).
    const cublasOperation_t op_a = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    MPT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                                    sizeof op_a));
    MPT_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                                    sizeof op_b));
    const auto ab = cuda_type(key.ab), c = cuda_type(key.c);
    // Our B, row-major [K, N] (or [N, K] transposed), is column-major [N, K] (or [K, N]).
    MPT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.a, ab, key.transpose_b ? key.k : key.n,
                                                key.transpose_b ? key.n : key.k,
                                                key.transpose_b ? key.k : key.n));
    MPT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.b, ab, key.transpose_a ? key.m : key.k,
                                                key.transpose_a ? key.k : key.m,
                                                key.transpose_a ? key.m : key.k));
    MPT_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&plan.c, c, key.n, key.m, key.n));

    cublasLtMatmulPreference_t preference = nullptr;
    MPT_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&preference));
    const std::uint64_t workspace = kWorkspaceBytes;
    MPT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
    const std::uint32_t align_a = key.align_b, align_b = key.align_a, align_c = key.align_c;
    MPT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a));
    MPT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b));
    MPT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c));
    MPT_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof align_c));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    // NOT_SUPPORTED (no heuristic for this problem), no result, or a result whose state is not
    // SUCCESS all mean the same to the user: this shape and dtype mix has no algorithm.
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle_, plan.desc, plan.a, plan.b, plan.c, plan.c, preference, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(preference);
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) MPT_CHECK_CUBLAS(status);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || found == 0 ||
        result.state != CUBLAS_STATUS_SUCCESS)
      abort_job("kernels::cuda::matmul: cuBLASLt has no algorithm for m=" + std::to_string(key.m) +
                " n=" + std::to_string(key.n) + " k=" + std::to_string(key.k) + " in " +
                dtype_name(key.ab) + " -> " + dtype_name(key.c));
    plan.algo = result.algo;
    return plan;
  }

  std::mutex mutex_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::unordered_map<PlanKey, Plan, PlanKeyHash> plans_;
};

}  // namespace

void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
            float beta) {
  constexpr const char* op = "kernels::cuda::matmul";
  const DType ab = a.dtype();
  detail::require(a.defined() && a.device() == Device::cuda && is_float_dtype(ab) && a.rank() == 2,
                  op, "a must be 2-D f32, f16 or bf16 on the cuda device", a);
  detail::require(b.defined() && b.device() == Device::cuda && b.dtype() == ab && b.rank() == 2, op,
                  "b must be 2-D on the cuda device with a's dtype", b);
  detail::require(c.defined() && c.device() == Device::cuda && c.rank() == 2 &&
                      (c.dtype() == DType::f32 || c.dtype() == ab),
                  op, "c must be 2-D on the cuda device, f32 or a's dtype", c);
  const std::int64_t m = transpose_a ? a.dim(1) : a.dim(0);
  const std::int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  const std::int64_t n = transpose_b ? b.dim(0) : b.dim(1);
  const std::int64_t k_of_b = transpose_b ? b.dim(1) : b.dim(0);
  detail::require_pair(k == k_of_b, op, "inner dimensions of op(a) and op(b) differ", a, b);
  detail::require_pair(c.dim(0) == m && c.dim(1) == n, op,
                       "c must be [rows of op(a), columns of op(b)]", a, c);
  if (m == 0 || n == 0) return;
  if (k == 0) {  // C = beta C, and exactly 0 when beta == 0 (C not read), as on the host
    if (beta == 0.f) {
      zero_on_stream(c);
    } else if (c.dtype() == DType::f32) {
      float* out = c.data<float>();
      launch_elementwise(op, c.numel(), [=] __device__(std::int64_t i) { out[i] *= beta; });
    } else {
      auto* out = static_cast<std::uint16_t*>(c.raw());
      const bool f16 = c.dtype() == DType::f16;
      launch_elementwise(op, c.numel(), [=] __device__(std::int64_t i) {
        out[i] = round16(beta * widen16(out[i], f16), f16);
      });
    }
    return;
  }
  LtContext& lt = LtContext::instance();
  const PlanKey key{m, n, k, transpose_a, transpose_b, beta == 0.f, ab, c.dtype(),
                    alignment(a.raw()), alignment(b.raw()), alignment(c.raw())};
  const Plan& plan = lt.plan(key);
  const float alpha = 1.f;
  MPT_CHECK_CUBLAS(cublasLtMatmul(lt.handle(), plan.desc, &alpha, b.raw(), plan.a, a.raw(), plan.b,
                                  &beta, c.raw(), plan.c, c.raw(), plan.c, &plan.algo,
                                  lt.workspace(), kWorkspaceBytes, stream()));
}

}  // namespace mpt::kernels::cuda
