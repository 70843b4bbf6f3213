// The CUDA emulator's cuBLASLt: the calls kernels/cuda/matmul.cu makes, with cuBLASLt's
// column-major semantics, D = alpha op(A) op(B) + beta C, checked as the library checks them
// (layouts against the operation, types, leading dimensions, the algorithm's alignment against
// the pointers, device memory) and computed on the host: products summed in double, rounded to
// f32, scaled, and rounded once to D's type; C is not read when beta is 0. It is the matmul.cu
// plan logic (the transposed problem, layouts, alignment keys) that this checks, not cuBLASLt's
// kernels: their speed and rounding are the GPU check's (perf/gpu_check.sh).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tests/cudaemu/emulator.hpp"

struct cublasLtContext {
  int magic = 0x4c74;
};

namespace {

constexpr std::uint32_t kDescMagic = 0x44455343, kLayoutMagic = 0x4c41594f, kPrefMagic = 0x50524546;

struct Desc {
  std::uint32_t magic;
  cublasComputeType_t compute;
  cudaDataType_t scale;
  cublasOperation_t transa, transb;
};
struct Layout {
  std::uint32_t magic;
  cudaDataType_t type;
  std::uint64_t rows, cols;
  std::int64_t ld;
};
struct Preference {
  std::uint32_t magic;
  std::uint32_t align[4];  // A, B, C, D: the smallest alignment the caller promises, in bytes
  std::uint64_t workspace;
};
// What the heuristic hands back, in cublasLtMatmulAlgo_t's data: the alignments it assumed.
struct Algo {
  std::uint32_t magic;
  std::uint32_t align[4];
};
static_assert(sizeof(Desc) <= sizeof(cublasLtMatmulDescOpaque_t));
static_assert(sizeof(Layout) <= sizeof(cublasLtMatrixLayoutOpaque_t));
static_assert(sizeof(Preference) <= sizeof(cublasLtMatmulPreferenceOpaque_t));
static_assert(sizeof(Algo) <= sizeof(cublasLtMatmulAlgo_t));

template <class T, class Opaque>
T* as(Opaque* opaque, std::uint32_t magic) {
  if (opaque == nullptr) return nullptr;
  auto* object = reinterpret_cast<T*>(opaque->data);
  return object->magic == magic ? object : nullptr;
}

std::size_t element_bytes(cudaDataType_t type) {
  return type == CUDA_R_32F ? 4 : (type == CUDA_R_16F || type == CUDA_R_16BF) ? 2 : 0;
}

// The toolkit's host conversions (cuda_fp16.h, cuda_bf16.h): exact widening, and rounding to
// nearest even with Inf kept and fp16 overflow to Inf.
float load(const void* base, std::size_t index, cudaDataType_t type) {
  if (type == CUDA_R_32F) return static_cast<const float*>(base)[index];
  std::uint16_t bits;
  std::memcpy(&bits, static_cast<const char*>(base) + index * 2, 2);
  return type == CUDA_R_16F ? __half2float(__ushort_as_half(bits))
                            : __bfloat162float(__ushort_as_bfloat16(bits));
}
std::uint16_t round16(float value, cudaDataType_t type) {
  return type == CUDA_R_16F ? __half_as_ushort(__float2half_rn(value))
                            : __bfloat16_as_ushort(__float2bfloat16_rn(value));
}

bool aligned(const void* pointer, std::uint32_t bytes) {
  return bytes <= 1 || reinterpret_cast<std::uintptr_t>(pointer) % bytes == 0;
}

bool on_device(const void* pointer, const Layout& layout) {
  const std::size_t bytes =
      (static_cast<std::size_t>(layout.ld) * (layout.cols - 1) + layout.rows) *
      element_bytes(layout.type);
  return mpt::cudaemu::device_memory_contains(pointer, bytes);
}

// The problem a descriptor and its layouts describe: (m, n, k), or false when they disagree.
bool problem(const Desc& desc, const Layout& a, const Layout& b, const Layout& c, const Layout& d,
             std::uint64_t& m, std::uint64_t& n, std::uint64_t& k) {
  if (desc.compute != CUBLAS_COMPUTE_32F || desc.scale != CUDA_R_32F) return false;
  if (a.type != b.type || c.type != d.type || element_bytes(a.type) == 0) return false;
  if (c.type != CUDA_R_32F && c.type != a.type) return false;
  if (c.rows != d.rows || c.cols != d.cols || c.ld != d.ld) return false;
  m = desc.transa == CUBLAS_OP_N ? a.rows : a.cols;
  k = desc.transa == CUBLAS_OP_N ? a.cols : a.rows;
  const std::uint64_t k_of_b = desc.transb == CUBLAS_OP_N ? b.rows : b.cols;
  n = desc.transb == CUBLAS_OP_N ? b.cols : b.rows;
  if (k != k_of_b || c.rows != m || c.cols != n) return false;
  for (const Layout* layout : {&a, &b, &c, &d})
    if (layout->ld < static_cast<std::int64_t>(layout->rows) || layout->rows == 0 ||
        layout->cols == 0)
      return false;
  return true;
}

}  // namespace

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  *desc = new cublasLtMatmulDescOpaque_t{};
  auto* d = reinterpret_cast<Desc*>((*desc)->data);
  *d = Desc{kDescMagic, compute, scale, CUBLAS_OP_N, CUBLAS_OP_N};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  Desc* d = as<Desc>(desc, kDescMagic);
  if (d == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
      if (size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
      cublasOperation_t op;
      std::memcpy(&op, buf, size);
      if (op != CUBLAS_OP_N && op != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
      (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb) = op;
      return CUBLAS_STATUS_SUCCESS;
    }
    default:
      mpt::cudaemu::emulator_limit("cublasLtMatmulDescSetAttribute: only TRANSA and TRANSB");
  }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  *layout = new cublasLtMatrixLayoutOpaque_t{};
  *reinterpret_cast<Layout*>((*layout)->data) = Layout{kLayoutMagic, type, rows, cols, ld};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t,
                                                cublasLtMatrixLayoutAttribute_t, const void*,
                                                size_t) {
  mpt::cudaemu::emulator_limit("cublasLtMatrixLayoutSetAttribute (column-major, one batch only)");
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  *preference = new cublasLtMatmulPreferenceOpaque_t{};
  *reinterpret_cast<Preference*>((*preference)->data) =
      Preference{kPrefMagic, {256, 256, 256, 256}, 0};
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  delete preference;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  Preference* p = as<Preference>(preference, kPrefMagic);
  if (p == nullptr || buf == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      if (size != sizeof(std::uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
      std::memcpy(&p->workspace, buf, size);
      return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
      if (size != sizeof(std::uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
      const int slot = attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
      std::memcpy(&p->align[slot], buf, size);
      return CUBLAS_STATUS_SUCCESS;
    }
    default:
      mpt::cudaemu::emulator_limit(
          "cublasLtMatmulPreferenceSetAttribute: workspace and alignments only");
  }
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t preference, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* found) {
  const Desc* dd = as<Desc>(desc, kDescMagic);
  const Layout *la = as<Layout>(a, kLayoutMagic), *lb = as<Layout>(b, kLayoutMagic),
               *lc = as<Layout>(c, kLayoutMagic), *ld = as<Layout>(d, kLayoutMagic);
  const Preference* p = as<Preference>(preference, kPrefMagic);
  if (handle == nullptr || !dd || !la || !lb || !lc || !ld || !p || requested < 1 || !found)
    return CUBLAS_STATUS_INVALID_VALUE;
  std::uint64_t m, n, k;
  *found = 0;
  if (!problem(*dd, *la, *lb, *lc, *ld, m, n, k)) return CUBLAS_STATUS_NOT_SUPPORTED;
  results[0] = cublasLtMatmulHeuristicResult_t{};
  Algo algo{kPrefMagic, {p->align[0], p->align[1], p->align[2], p->align[3]}};
  std::memcpy(results[0].algo.data, &algo, sizeof algo);
  results[0].workspaceSize = 0;
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.f;
  *found = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a, const void* B,
                              cublasLtMatrixLayout_t b, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  const Desc* dd = as<Desc>(desc, kDescMagic);
  const Layout *la = as<Layout>(a, kLayoutMagic), *lb = as<Layout>(b, kLayoutMagic),
               *lc = as<Layout>(c, kLayoutMagic), *ldl = as<Layout>(d, kLayoutMagic);
  if (handle == nullptr || !dd || !la || !lb || !lc || !ldl || !alpha || !beta || !algo)
    return CUBLAS_STATUS_INVALID_VALUE;
  Algo chosen;
  std::memcpy(&chosen, algo->data, sizeof chosen);
  if (chosen.magic != kPrefMagic) return CUBLAS_STATUS_INVALID_VALUE;  // not from the heuristic
  std::uint64_t m, n, k;
  if (!problem(*dd, *la, *lb, *lc, *ldl, m, n, k)) return CUBLAS_STATUS_INVALID_VALUE;
  // An algorithm chosen for aligned operands must not be handed misaligned ones: the real
  // kernels would fault or read the wrong bytes (matmul.cu keys its plans on the alignment).
  if (!aligned(A, chosen.align[0]) || !aligned(B, chosen.align[1]) ||
      !aligned(C, chosen.align[2]) || !aligned(D, chosen.align[3]))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!on_device(A, *la) || !on_device(B, *lb) || !on_device(D, *ldl))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (workspace_bytes > 0 && !mpt::cudaemu::device_memory_contains(workspace, workspace_bytes))
    return CUBLAS_STATUS_INVALID_VALUE;
  const float alpha_value = *static_cast<const float*>(alpha);
  const float beta_value = *static_cast<const float*>(beta);
  if (beta_value != 0.f && !on_device(C, *lc)) return CUBLAS_STATUS_INVALID_VALUE;
  const Desc op = *dd;
  const Layout la_v = *la, lb_v = *lb, lc_v = *lc, ld_v = *ldl;
  const cudaError_t status = mpt::cudaemu::run_on_stream(stream, [=] {
    // op(A) stored by columns (each of its k columns m long), op(B) by columns too; D is then
    // built four of its columns at a time, each output's products summed over p in order, in
    // double. Each product of two floats is exact in double, so the sums do not depend on how
    // the loop is blocked; the inner loop over i runs four independent sums per load, which the
    // compiler vectorises (the emulator's time is mostly here and in cudnn.cpp's convolutions).
    std::vector<float> at(m * k), bt(n * k);
    for (std::uint64_t p = 0; p < k; ++p)
      for (std::uint64_t i = 0; i < m; ++i)
        at[p * m + i] = op.transa == CUBLAS_OP_N ? load(A, i + p * la_v.ld, la_v.type)
                                                 : load(A, p + i * la_v.ld, la_v.type);
    for (std::uint64_t j = 0; j < n; ++j)
      for (std::uint64_t p = 0; p < k; ++p)
        bt[j * k + p] = op.transb == CUBLAS_OP_N ? load(B, p + j * lb_v.ld, lb_v.type)
                                                 : load(B, j + p * lb_v.ld, lb_v.type);
    constexpr std::uint64_t kBlock = 4;
    std::vector<double> sums(kBlock * m);
    for (std::uint64_t j0 = 0; j0 < n; j0 += kBlock) {
      const std::uint64_t width = std::min(kBlock, n - j0);
      std::fill(sums.begin(), sums.end(), 0.0);
      double* s0 = sums.data();
      double *s1 = s0 + m, *s2 = s1 + m, *s3 = s2 + m;
      for (std::uint64_t p = 0; p < k; ++p) {
        // Columns past n repeat the last one: computed and not stored.
        const auto b_at = [&](std::uint64_t c) {
          return static_cast<double>(bt[(j0 + std::min(c, width - 1)) * k + p]);
        };
        const double b0 = b_at(0), b1 = b_at(1), b2 = b_at(2), b3 = b_at(3);
        const float* a = &at[p * m];
        for (std::uint64_t i = 0; i < m; ++i) {
          const double x = a[i];
          s0[i] += x * b0;
          s1[i] += x * b1;
          s2[i] += x * b2;
          s3[i] += x * b3;
        }
      }
      for (std::uint64_t c = 0; c < width; ++c) {
        const std::uint64_t j = j0 + c;
        for (std::uint64_t i = 0; i < m; ++i) {
          float value = alpha_value * static_cast<float>(sums[c * m + i]);
          if (beta_value != 0.f) value += beta_value * load(C, i + j * lc_v.ld, lc_v.type);
          const std::size_t at_d = i + j * ld_v.ld;
          if (ld_v.type == CUDA_R_32F) {
            static_cast<float*>(D)[at_d] = value;
          } else {
            const std::uint16_t bits = round16(value, ld_v.type);
            std::memcpy(static_cast<char*>(D) + at_d * 2, &bits, 2);
          }
        }
      }
    }
  });
  return status == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // extern "C"
