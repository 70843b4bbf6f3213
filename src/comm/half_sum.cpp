// MPI sums of fp16 and bf16 buffers (see half_sum.hpp). The addition is commutative and
// deterministic, so an MPI_Allreduce with these ops gives every rank the same bits.
#include "comm/half_sum.hpp"

#include <immintrin.h>

#include <cstdint>

#include "core/error.hpp"
#include "core/half.hpp"

namespace mpt::comm::detail {
namespace {

bool cpu_has_f16c() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}

__attribute__((target("avx,f16c"))) void sum_f16_f16c(const std::uint16_t* in, std::uint16_t* inout,
                                                      std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(inout + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(inout + i),
                     _mm256_cvtps_ph(_mm256_add_ps(a, b), _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i)
    inout[i] = float_to_half_bits(half_bits_to_float(in[i]) + half_bits_to_float(inout[i]));
}

}  // namespace

void sum_f16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  const std::int64_t n = *len;
  if (cpu_has_f16c()) return sum_f16_f16c(a, b, n);
  for (std::int64_t i = 0; i < n; ++i)
    b[i] = float_to_half_bits(half_bits_to_float(a[i]) + half_bits_to_float(b[i]));
}

void sum_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* __restrict a = static_cast<const std::uint16_t*>(in);
  auto* __restrict b = static_cast<std::uint16_t*>(inout);
  const std::int64_t n = *len;
  // Widening is a shift and rounding a few integer ops: the compiler vectorises this loop.
  for (std::int64_t i = 0; i < n; ++i)
    b[i] = float_to_bf16_bits(bf16_bits_to_float(a[i]) + bf16_bits_to_float(b[i]));
}

SumOps::SumOps() {
  MPT_CHECK_MPI(MPI_Type_contiguous(2, MPI_BYTE, &two_bytes_));
  MPT_CHECK_MPI(MPI_Type_commit(&two_bytes_));
  MPT_CHECK_MPI(MPI_Op_create(&sum_f16, /*commute=*/1, &f16_sum_));
  MPT_CHECK_MPI(MPI_Op_create(&sum_bf16, /*commute=*/1, &bf16_sum_));
}

SumOps::~SumOps() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Op* op : {&f16_sum_, &bf16_sum_})
    if (*op != MPI_OP_NULL) MPI_Op_free(op);
  if (two_bytes_ != MPI_DATATYPE_NULL) MPI_Type_free(&two_bytes_);
}

MPI_Datatype SumOps::type(DType dtype) const {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f16:
    case DType::bf16: return two_bytes_;
    default: abort_job(std::string("comm: no all-reduce of ") + dtype_name(dtype));
  }
}

MPI_Op SumOps::sum(DType dtype) const {
  switch (dtype) {
    case DType::f32: return MPI_SUM;
    case DType::f16: return f16_sum_;
    case DType::bf16: return bf16_sum_;
    default: abort_job(std::string("comm: no all-reduce of ") + dtype_name(dtype));
  }
}

}  // namespace mpt::comm::detail
