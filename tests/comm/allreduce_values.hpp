// Test values of the all-reduce tests (tests/comm/test_allreduce_algos.cpp on the host,
// tests/gpu/gpu_nccl_allreduce.cpp on the device): each rank's contribution, exact in its dtype,
// the element conversions, and the check that every rank holds the same bits. Plain C++ and MPI
// (the GPU test has no GoogleTest).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "core/half.hpp"
#include "core/tensor.hpp"

namespace mpt::test {

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64: cheap enough for 8 ranks x 1M references
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline float widen(DType dtype, const void* data, std::int64_t i) {
  if (dtype == DType::f32) return static_cast<const float*>(data)[i];
  const std::uint16_t bits = static_cast<const std::uint16_t*>(data)[i];
  return dtype == DType::f16 ? half_bits_to_float(bits) : bf16_bits_to_float(bits);
}
inline void store(DType dtype, void* data, std::int64_t i, float value) {
  if (dtype == DType::f32) {
    static_cast<float*>(data)[i] = value;
  } else {
    static_cast<std::uint16_t*>(data)[i] =
        dtype == DType::f16 ? float_to_half_bits(value) : float_to_bf16_bits(value);
  }
}

// Rank R's value at index I, exactly representable in DTYPE: mixed signs, magnitudes 2^-6..2^7,
// so that N = 8 summands and a 1/N prescale stay normal and finite in fp16.
inline float contribution(DType dtype, int rank, std::int64_t i) {
  const std::uint64_t h =
      mix(static_cast<std::uint64_t>(i) * 131 + static_cast<std::uint64_t>(rank));
  const float mantissa = 1.f + static_cast<float>(h >> 40) * 0x1p-24f;
  const float value = std::ldexp(h & 1 ? -mantissa : mantissa, static_cast<int>((h >> 1) % 14) - 6);
  if (dtype == DType::f16) return half_bits_to_float(float_to_half_bits(value));
  if (dtype == DType::bf16) return bf16_bits_to_float(float_to_bf16_bits(value));
  return value;
}

// The (data, wire) dtype pairs every backend is checked with: f32 data on each wire, and
// 16-bit data on its own.
struct Types {
  DType data, wire;
};
inline constexpr Types kTypes[] = {{DType::f32, DType::f32},
                                   {DType::f32, DType::f16},
                                   {DType::f32, DType::bf16},
                                   {DType::f16, DType::f16},
                                   {DType::bf16, DType::bf16}};

// Unit roundoff (half an ulp of 1) of each element type.
inline double unit_roundoff(DType dtype) {
  return dtype == DType::f32 ? 0x1p-24 : dtype == DType::f16 ? 0x1p-11 : 0x1p-8;
}

// Element I after an all-reduce of N ranks' contribution()s in DTYPE over a WIRE dtype, scaled
// by SCALE (prescale x postscale): the exact value and the bound on the error. Each rank's value
// enters the wire with at most one rounding (u of the wire dtype: the prescale product and the
// conversion round once together). An element's sum is a tree of N - 1 additions, each rounded
// at most to the wire (the shm backend adds in f32 and rounds once per node, MPI's ops and NCCL
// once per step), each error at most u times the sum of magnitudes. The postscale and the
// conversion back add at most one more rounding of max(u_wire, u_data) = u. So |error| <=
// (N + 1) u sum_r |scale x_r| to first order; N + 2 covers the second-order terms. With N = 1
// and f32 throughout the result is exact.
struct ExpectedSum {
  double value, tolerance;
};
inline ExpectedSum expected_sum(DType dtype, DType wire, int n, std::int64_t i, double scale) {
  const double u = std::max(unit_roundoff(wire), unit_roundoff(dtype));
  double exact = 0, magnitudes = 0;
  for (int r = 0; r < n; ++r) {
    const double v = contribution(dtype, r, i);
    exact += v;
    magnitudes += std::fabs(v);
  }
  return {exact * scale, (n + 2) * u * magnitudes * std::fabs(scale)};
}

// True on every rank when every rank holds the same bytes (min and max of a hash agree).
inline bool identical_on_every_rank(const void* data, std::size_t size) {
  std::uint64_t hash = 0xcbf29ce484222325ull;  // FNV-1a
  for (std::size_t i = 0; i < size; ++i)
    hash = (hash ^ static_cast<const std::uint8_t*>(data)[i]) * 0x100000001b3ull;
  std::uint64_t low = hash, high = hash;
  MPI_Allreduce(MPI_IN_PLACE, &low, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &high, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
  return low == high;
}

}  // namespace mpt::test
