// Host matmul (see kernels/matmul.hpp). oneDNN primitives are created once per shape and cached
// with their memory objects; a call only swaps data pointers and executes, so the steady-state
// training step creates nothing.
#include "kernels/matmul.hpp"

#ifdef MPTRAIN_HAVE_BLAS
#include <cblas.h>
#endif

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/error.hpp"
#include "kernels/host/parallel.hpp"

#ifdef MPTRAIN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace mpt::kernels {

namespace {

#ifdef MPTRAIN_HAVE_DNNL
constexpr MatmulBackend kDefaultBackend = MatmulBackend::dnnl;
#else
constexpr MatmulBackend kDefaultBackend = MatmulBackend::blas;
#endif

std::atomic<MatmulBackend> selected_backend{kDefaultBackend};

// The problem after shape checks: C[m, n] = op(A)[m, k] · op(B)[k, n] + beta C, with A and B
// in INPUT (f32, or bf16 on a CPU with bf16 dot products) and C in OUTPUT (f32 or INPUT).
struct MatmulShape {
  std::int64_t m, n, k;
  bool transpose_a, transpose_b;
  float beta;
  DType input = DType::f32, output = DType::f32;
  bool operator==(const MatmulShape&) const = default;
};

#ifdef MPTRAIN_HAVE_BLAS
void blas_matmul(const MatmulShape& s, const float* a, const float* b, float* c) {
  // Row-major leading dimensions are the stored row lengths; BLAS wants them >= 1 even when
  // a dimension is 0 (those cases never get here, but keep the call valid regardless).
  const auto lda = static_cast<int>(std::max<std::int64_t>(1, s.transpose_a ? s.m : s.k));
  const auto ldb = static_cast<int>(std::max<std::int64_t>(1, s.transpose_b ? s.k : s.n));
  const auto ldc = static_cast<int>(std::max<std::int64_t>(1, s.n));
  cblas_sgemm(CblasRowMajor, s.transpose_a ? CblasTrans : CblasNoTrans,
              s.transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(s.m),
              static_cast<int>(s.n), static_cast<int>(s.k), 1.f, a, lda, b, ldb, s.beta, c, ldc);
}
#else
// No BLAS (a GPU-only build): a plain blocked product, parallel over blocks of rows of C. It
// exists so the host twins of the CUDA kernels can be checked anywhere, not for speed.
void blas_matmul(const MatmulShape& s, const float* a, const float* b, float* c) {
  static const std::string label = "kernels::matmul_fallback";
  constexpr std::int64_t kRows = 16, kDepth = 128;
  const std::int64_t lda = s.transpose_a ? s.m : s.k, ldb = s.transpose_b ? s.k : s.n;
  const auto a_at = [=](std::int64_t i, std::int64_t p) {
    return s.transpose_a ? a[p * lda + i] : a[i * lda + p];
  };
  const auto b_at = [=](std::int64_t p, std::int64_t j) {
    return s.transpose_b ? b[j * ldb + p] : b[p * ldb + j];
  };
  const std::int64_t blocks = (s.m + kRows - 1) / kRows;
  host::parallel_for(label, blocks, [=](std::int64_t block) {
    const std::int64_t row_end = std::min(s.m, (block + 1) * kRows);
    for (std::int64_t i = block * kRows; i < row_end; ++i) {
      float* __restrict row = c + i * s.n;
      // beta == 0 must not read C, so that NaN in C does not leak (as BLAS).
      for (std::int64_t j = 0; j < s.n; ++j) row[j] = s.beta == 0.f ? 0.f : s.beta * row[j];
      for (std::int64_t p0 = 0; p0 < s.k; p0 += kDepth) {
        const std::int64_t p1 = std::min(s.k, p0 + kDepth);
        for (std::int64_t p = p0; p < p1; ++p) {
          const float scale = a_at(i, p);
          if (s.transpose_b)
            for (std::int64_t j = 0; j < s.n; ++j) row[j] += scale * b_at(p, j);
          else
            for (std::int64_t j = 0; j < s.n; ++j) row[j] += scale * b[p * ldb + j];
        }
      }
    }
  });
}
#endif

#ifdef MPTRAIN_HAVE_DNNL

std::string dnnl_status_text(dnnl_status_t status) {
  const char* name = nullptr;
  switch (status) {
    case dnnl_out_of_memory: name = "out_of_memory"; break;
    case dnnl_invalid_arguments: name = "invalid_arguments"; break;
    case dnnl_unimplemented: name = "unimplemented"; break;
    case dnnl_runtime_error: name = "runtime_error"; break;
    default: break;
  }
  return "oneDNN status " + std::to_string(static_cast<int>(status)) +
         (name ? std::string(" (") + name + ")" : std::string());
}
bool dnnl_ok(dnnl_status_t status) { return status == dnnl_success; }
std::string pointer_text(const void* pointer) {
  char text[32];
  std::snprintf(text, sizeof text, "%p", pointer);
  return text;
}
#define MPT_CHECK_DNNL(call) MPT_CHECK_GEN("oneDNN", call, dnnl_ok, dnnl_status_text)

struct MatmulShapeHash {
  std::size_t operator()(const MatmulShape& s) const {
    std::uint32_t beta_bits = 0;
    std::memcpy(&beta_bits, &s.beta, sizeof beta_bits);
    std::size_t h = static_cast<std::size_t>(s.m);
    for (std::size_t v : {static_cast<std::size_t>(s.n), static_cast<std::size_t>(s.k),
                          static_cast<std::size_t>(s.transpose_a) * 2 + s.transpose_b,
                          static_cast<std::size_t>(beta_bits),
                          static_cast<std::size_t>(s.input) * 16 + static_cast<std::size_t>(s.output)})
      h = h * 0x9E3779B97F4A7C15ull + v;
    return h;
  }
};

// A primitive and the memory objects it executes on; only their data handles change per call.
struct DnnlMatmul {
  dnnl::matmul primitive;
  dnnl::memory src, weights, dst;
};

class DnnlMatmulCache {
 public:
  static DnnlMatmulCache& instance() {
    static DnnlMatmulCache cache;
    return cache;
  }

  void run(const MatmulShape& s, const void* a, const void* b, void* c) {
    // One lock per call: cheap next to a matmul, and it makes the cached memory objects (whose
    // handles are swapped per call) safe if two threads ever multiply at once.
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = entries_.find(s);
    if (found == entries_.end()) found = entries_.emplace(s, create(s)).first;
    DnnlMatmul& entry = found->second;
    // oneDNN takes const-less handles; it does not write through src or weights.
    entry.src.set_data_handle(const_cast<void*>(a));
    entry.weights.set_data_handle(const_cast<void*>(b));
    entry.dst.set_data_handle(c);
    // The C API takes a plain array of arguments; the C++ execute() would build an
    // unordered_map on every call.
    const dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, entry.src.get()},
                                     {DNNL_ARG_WEIGHTS, entry.weights.get()},
                                     {DNNL_ARG_DST, entry.dst.get()}};
    const dnnl_status_t status = dnnl_primitive_execute(entry.primitive.get(), stream_.get(), 3, args);
    // With the call's shape and buffers: the status alone could not say why one CI run failed
    // here (invalid_arguments: a stop signal inside oneDNN's GEMM, train/checkpointing.hpp).
    if (status != dnnl_success)
      ::mpt::detail::check_failed("oneDNN", "dnnl_primitive_execute (matmul)",
                           dnnl_status_text(status) + " on m=" + std::to_string(s.m) +
                               " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                               (s.transpose_a ? " A^T" : "") + (s.transpose_b ? " B^T" : "") +
                               " " + dtype_name(s.input) + "->" + dtype_name(s.output) +
                               " beta=" + std::to_string(s.beta) + ", a " + pointer_text(a) +
                               ", b " + pointer_text(b) + ", c " + pointer_text(c) + ", " +
                               std::to_string(entries_.size()) + " shapes cached",
                           __FILE__, __LINE__);
    MPT_CHECK_DNNL(dnnl_stream_wait(stream_.get()));
  }

  std::size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }

 private:
  DnnlMatmulCache() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  DnnlMatmul create(const MatmulShape& s) {
    using dims = dnnl::memory::dims;
    using dt = dnnl::memory::data_type;
    const auto type = [](DType d) { return d == DType::bf16 ? dt::bf16 : dt::f32; };
    // Transposes are strides: a stored [K, M] matrix read as [M, K] has strides {1, M}.
    const dnnl::memory::desc src_md(dims{s.m, s.k}, type(s.input),
                                    s.transpose_a ? dims{1, s.m} : dims{s.k, 1});
    const dnnl::memory::desc weights_md(dims{s.k, s.n}, type(s.input),
                                        s.transpose_b ? dims{1, s.k} : dims{s.n, 1});
    const dnnl::memory::desc dst_md(dims{s.m, s.n}, type(s.output), dims{s.n, 1});
    dnnl::primitive_attr attr;
    if (s.beta != 0.f) {
      // dst = matmul + beta * dst, fused: the sum post-op reads dst before overwriting it.
      dnnl::post_ops ops;
      ops.append_sum(s.beta);
      attr.set_post_ops(ops);
    }
    try {
      const dnnl::matmul::desc desc(src_md, weights_md, dst_md);
      const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
      return DnnlMatmul{dnnl::matmul(pd), dnnl::memory(src_md, engine_, nullptr),
                        dnnl::memory(weights_md, engine_, nullptr),
                        dnnl::memory(dst_md, engine_, nullptr)};
    } catch (const dnnl::error& error) {
      abort_job("kernels::matmul: oneDNN cannot create a matmul for M=" + std::to_string(s.m) +
                " N=" + std::to_string(s.n) + " K=" + std::to_string(s.k) + " " +
                dtype_name(s.input) + "->" + dtype_name(s.output) + ": " + error.what());
    }
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::mutex mutex_;
  std::unordered_map<MatmulShape, DnnlMatmul, MatmulShapeHash> entries_;
};

#endif  // MPTRAIN_HAVE_DNNL

// K == 0: the product is empty, so C = beta * C (and exactly 0 when beta == 0, as BLAS does).
void scale_output(Tensor& c, float beta) {
  static const std::string label = "kernels::matmul_empty_k";
  float* __restrict out = c.data<float>();
  host::parallel_chunks(label, c.numel(), [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) out[i] = beta == 0.f ? 0.f : beta * out[i];
  });
}

}  // namespace

bool host_matmul_takes(DType dtype) {
  if (dtype == DType::f32) return true;
#ifdef MPTRAIN_HAVE_DNNL
  if (dtype != DType::bf16 || matmul_backend() != MatmulBackend::dnnl) return false;
  // The ISA oneDNN dispatches to, after ONEDNN_MAX_CPU_ISA: its bit for bf16 dot products
  // (avx512_core_bf16 and avx512_core_amx have it). Below that, oneDNN's bf16 matmul would
  // emulate the products and be slower than widening to f32, the layers' other path.
  static const bool native = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto bf16 = static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return native;
#else
  return false;
#endif
}

bool dnnl_available() {
#ifdef MPTRAIN_HAVE_DNNL
  return true;
#else
  return false;
#endif
}

void set_matmul_backend(MatmulBackend backend) {
  if (backend == MatmulBackend::dnnl && !dnnl_available())
    abort_job("kernels::set_matmul_backend: this build has no oneDNN (MPTRAIN_HAVE_DNNL off)");
  selected_backend.store(backend);
}

MatmulBackend matmul_backend() { return selected_backend.load(); }

const char* matmul_backend_name(MatmulBackend backend) {
  return backend == MatmulBackend::dnnl ? "dnnl" : "blas";
}

std::size_t dnnl_primitive_count() {
#ifdef MPTRAIN_HAVE_DNNL
  return DnnlMatmulCache::instance().size();
#else
  return 0;
#endif
}

namespace host {

void matmul(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b, Tensor& c,
            float beta) {
  constexpr const char* op = "kernels::matmul";
  if (a.defined() && a.dtype() == DType::bf16) {
    // bf16 products are exact in f32, so this is the widened f32 product with f32 sums, in
    // oneDNN's order; it needs the bf16 dot products (AVX512-BF16, AMX) to be worth it.
    detail::require(host_matmul_takes(DType::bf16), op,
                    "bf16 a needs the oneDNN backend on a CPU with bf16 dot products "
                    "(AVX512-BF16 or AMX; see host_matmul_takes); widen to f32 elsewhere",
                    a);
    detail::require(a.device() == Device::cpu, op, "a must be on the host", a);
    detail::require_pair(b.defined() && b.dtype() == DType::bf16 && b.device() == Device::cpu, op,
                         "b must be a host bf16 tensor, like a", a, b);
    detail::require_pair(c.defined() && c.device() == Device::cpu &&
                             (c.dtype() == DType::f32 || c.dtype() == DType::bf16),
                         op, "c must be f32 or bf16 on the host", a, c);
  } else {
    detail::require_host_f32(op, "a must be f32 on the host (or bf16, see host_matmul_takes)", a);
    detail::require_host_f32(op, "b must be f32 on the host", b);
    detail::require_host_f32(op, "c must be f32 on the host", c);
  }
  detail::require(a.rank() == 2, op, "a must be 2-D", a);
  detail::require(b.rank() == 2, op, "b must be 2-D", b);
  detail::require(c.rank() == 2, op, "c must be 2-D", c);
  const MatmulShape shape{transpose_a ? a.dim(1) : a.dim(0),
                          transpose_b ? b.dim(0) : b.dim(1),
                          transpose_a ? a.dim(0) : a.dim(1),
                          transpose_a,
                          transpose_b,
                          beta,
                          a.dtype(),
                          c.dtype()};
  const std::int64_t k_of_b = transpose_b ? b.dim(1) : b.dim(0);
  detail::require_pair(shape.k == k_of_b, op, "inner dimensions of op(a) and op(b) differ", a, b);
  detail::require_pair(c.dim(0) == shape.m && c.dim(1) == shape.n, op,
                       "c must be [rows of op(a), columns of op(b)]", a, c);
  // BLAS takes int dimensions.
  constexpr std::int64_t kIntMax = 0x7fffffff;
  detail::require(a.numel() <= kIntMax && b.numel() <= kIntMax && c.numel() <= kIntMax, op,
                  "matrices over 2^31 elements are not supported", a);
  if (shape.m == 0 || shape.n == 0) return;
  if (shape.k == 0) {
    if (c.dtype() == DType::f32) {
      scale_output(c, beta);
    } else {
      detail::require(beta == 0.f || beta == 1.f, op,
                      "an empty product into bf16 c takes beta 0 or 1 only", c);
      if (beta == 0.f) c.zero();
    }
    return;
  }
#ifdef MPTRAIN_HAVE_DNNL
  if (selected_backend.load(std::memory_order_relaxed) == MatmulBackend::dnnl) {
    DnnlMatmulCache::instance().run(shape, a.raw(), b.raw(), c.raw());
    return;
  }
#endif
  blas_matmul(shape, a.data<float>(), b.data<float>(), c.data<float>());
}

}  // namespace host

}  // namespace mpt::kernels
