// Dense matrix multiply for the layers: oneDNN's matmul primitive, or BLAS sgemm as a fallback
// and as the peer the benchmarks compare against. The backend is chosen once, process-wide.
#pragma once

#include <cstddef>

#include "core/tensor.hpp"
#include "kernels/check.hpp"

namespace mpt::kernels {

enum class MatmulBackend { dnnl, blas };

// True when this build links oneDNN (MPTRAIN_HAVE_DNNL).
bool dnnl_available();
// Selects the backend for every later matmul. Aborts on dnnl when !dnnl_available().
void set_matmul_backend(MatmulBackend backend);
// The current backend; dnnl when available, else blas, until set_matmul_backend is called.
MatmulBackend matmul_backend();
const char* matmul_backend_name(MatmulBackend backend);  // "dnnl", "blas"
// True when the host matmul takes A and B in DTYPE directly (C in f32 or DTYPE), with f32 sums:
// f32 always; bf16 with the oneDNN backend on a CPU with bf16 dot products (AVX512-BF16 or
// AMX; ONEDNN_MAX_CPU_ISA=AVX512_CORE_VNNI or lower turns it off); f16 never (oneDNN 2.6 has
// no f16 matmul on the CPU). Decided once per process; the layers widen to f32 otherwise.
bool host_matmul_takes(DType dtype);
// How many oneDNN matmul primitives have been created so far: one per distinct
// (M, N, K, transposes, beta, dtypes), so it stays constant in a steady-state training loop.
std::size_t dnnl_primitive_count();

namespace host {
void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
            float beta);
}  // namespace host
// The CUDA twins (kernels/cuda/matmul.cu), same contracts, every tensor on the cuda device.
namespace cuda {
void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
            float beta);
}  // namespace cuda

// C[M, N] = op(A) · op(B) + beta · C, with op(X) = X or Xᵀ. A, B and C are 2-D, row-major,
// contiguous f32 tensors owned by the caller: A is [M, K] ([K, M] when transpose_a), B is
// [K, N] ([N, K] when transpose_b). With beta == 0, C is not read (NaN in C does not leak).
// On the cuda device (cuBLASLt) A and B may also both be f16 or both bf16, with C f32 or of
// their dtype: FP32 accumulation on the tensor cores. On the host the same holds for bf16
// where host_matmul_takes(bf16) (oneDNN on AMX or AVX512-BF16).
inline void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
                   float beta = 0.f) {
  detail::require_disjoint("kernels::matmul", "c must not overlap a", a, c);
  detail::require_disjoint("kernels::matmul", "c must not overlap b", b, c);
  MPT_DISPATCH_CUDA(a, matmul, a, transpose_a, b, transpose_b, c, beta);
  host::matmul(a, transpose_a, b, transpose_b, c, beta);
}

}  // namespace mpt::kernels
