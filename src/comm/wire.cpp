// The all-reduce element loops (see wire.hpp). The data is processed in blocks of kBlock
// elements through an f32 accumulator on the stack, which stays in L1: each input is read once
// from memory and each output written once, whatever the number of sources. The inner loops are
// plain loops over restrict pointers, which the compiler vectorises; fp16 gets F16C versions.
#include "comm/wire.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "core/half.hpp"

namespace mpt::comm::detail {
namespace {

constexpr std::int64_t kBlock = 2048;  // 8 KiB of f32 accumulator

bool cpu_has_f16c() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}

// ---- f16 <-> f32 -------------------------------------------------------------------------------
__attribute__((target("avx,f16c"))) void widen_f16_f16c(const std::uint16_t* __restrict in,
                                                        float* __restrict out, std::int64_t n,
                                                        bool add) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    if (add) v = _mm256_add_ps(v, _mm256_loadu_ps(out + i));
    _mm256_storeu_ps(out + i, v);
  }
  for (; i < n; ++i) out[i] = half_bits_to_float(in[i]) + (add ? out[i] : 0.f);
}

__attribute__((target("avx,f16c"))) void narrow_f16_f16c(const float* __restrict in,
                                                         std::uint16_t* __restrict out,
                                                         std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) out[i] = float_to_half_bits(in[i]);
}

// OUT = float(IN), or OUT += float(IN) with ADD.
void widen(const void* in, DType type, float* __restrict out, std::int64_t n, bool add) {
  if (type == DType::f32) {
    const float* __restrict x = static_cast<const float*>(in);
    if (add) {
      for (std::int64_t i = 0; i < n; ++i) out[i] += x[i];
    } else {
      std::memcpy(out, x, static_cast<std::size_t>(n) * sizeof(float));
    }
  } else if (type == DType::f16) {
    const auto* x = static_cast<const std::uint16_t*>(in);
    if (cpu_has_f16c()) return widen_f16_f16c(x, out, n, add);
    for (std::int64_t i = 0; i < n; ++i) out[i] = half_bits_to_float(x[i]) + (add ? out[i] : 0.f);
  } else {
    const std::uint16_t* __restrict x = static_cast<const std::uint16_t*>(in);
    // A shift: the compiler vectorises both loops.
    if (add) {
      for (std::int64_t i = 0; i < n; ++i) out[i] += bf16_bits_to_float(x[i]);
    } else {
      for (std::int64_t i = 0; i < n; ++i) out[i] = bf16_bits_to_float(x[i]);
    }
  }
}

// OUT = IN rounded to TYPE.
void narrow(const float* __restrict in, void* out, DType type, std::int64_t n) {
  if (type == DType::f32) {
    std::memcpy(out, in, static_cast<std::size_t>(n) * sizeof(float));
  } else if (type == DType::f16) {
    auto* y = static_cast<std::uint16_t*>(out);
    if (cpu_has_f16c()) return narrow_f16_f16c(in, y, n);
    for (std::int64_t i = 0; i < n; ++i) y[i] = float_to_half_bits(in[i]);
  } else {
    std::uint16_t* __restrict y = static_cast<std::uint16_t*>(out);
    for (std::int64_t i = 0; i < n; ++i) y[i] = float_to_bf16_bits(in[i]);
  }
}

void scale_block(float* __restrict x, std::int64_t n, float scale) {
  for (std::int64_t i = 0; i < n; ++i) x[i] *= scale;
}

// The f32 -> f32 cases, the hot path of f32 gradients: no accumulator round trip.
void scale_f32(const float* src, float* dst, std::int64_t n, float scale) {
  if (src == dst) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] *= scale;
  } else {
    const float* __restrict x = src;
    float* __restrict y = dst;
    for (std::int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
  }
}

void add2_f32(const float* __restrict a, const float* __restrict b, float* __restrict out,
              std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace

void convert_scaled(const void* src, DType from, void* dst, DType to, std::int64_t n, float scale) {
  if (n <= 0) return;
  if (from == to && scale == 1.f) {
    if (src != dst) std::memcpy(dst, src, static_cast<std::size_t>(n) * dtype_size(to));
    return;
  }
  if (from == DType::f32 && to == DType::f32)
    return scale_f32(static_cast<const float*>(src), static_cast<float*>(dst), n, scale);
  const auto* in = static_cast<const std::uint8_t*>(src);
  auto* out = static_cast<std::uint8_t*>(dst);
  const std::size_t in_size = dtype_size(from), out_size = dtype_size(to);
  alignas(64) float block[kBlock];
  // Block by block, so that a scaled block is still in L1 when it is rounded or scaled.
  for (std::int64_t begin = 0; begin < n; begin += kBlock) {
    const std::int64_t len = std::min(kBlock, n - begin);
    const void* block_in = in + static_cast<std::size_t>(begin) * in_size;
    void* block_out = out + static_cast<std::size_t>(begin) * out_size;
    if (to == DType::f32) {  // 16 bits -> f32: widen straight into the destination
      widen(block_in, from, static_cast<float*>(block_out), len, /*add=*/false);
      if (scale != 1.f) scale_block(static_cast<float*>(block_out), len, scale);
    } else if (from == DType::f32 && scale == 1.f) {  // f32 -> 16 bits: round from the source
      narrow(static_cast<const float*>(block_in), block_out, to, len);
    } else {
      if (from == DType::f32) {
        scale_f32(static_cast<const float*>(block_in), block, len, scale);
      } else {
        widen(block_in, from, block, len, /*add=*/false);
        if (scale != 1.f) scale_block(block, len, scale);
      }
      narrow(block, block_out, to, len);
    }
  }
}

void sum_inputs(const Operand* inputs, int count, void* dst, DType type, std::int64_t n,
                const Copy* copy) {
  if (n <= 0 || count <= 0) return;
  const auto at = [](const void* base, DType dtype, std::int64_t offset) {
    return static_cast<const std::uint8_t*>(base) +
           static_cast<std::size_t>(offset) * dtype_size(dtype);
  };
  const auto plain_f32 = [](const Operand& input) {
    return input.type == DType::f32 && input.scale == 1.f;
  };
  alignas(64) float acc[kBlock];
  alignas(64) float scaled[kBlock];
  for (std::int64_t begin = 0; begin < n; begin += kBlock) {
    const std::int64_t len = std::min(kBlock, n - begin);
    // Every input of the block is read before DST and COPY are written: either may alias one.
    int next = 1;
    if (count >= 2 && plain_f32(inputs[0]) && plain_f32(inputs[1])) {  // the f32 hot path
      add2_f32(reinterpret_cast<const float*>(at(inputs[0].data, DType::f32, begin)),
               reinterpret_cast<const float*>(at(inputs[1].data, DType::f32, begin)), acc, len);
      next = 2;
    } else {
      convert_scaled(at(inputs[0].data, inputs[0].type, begin), inputs[0].type, acc, DType::f32,
                     len, inputs[0].scale);
    }
    for (int s = next; s < count; ++s) {
      const void* block_in = at(inputs[s].data, inputs[s].type, begin);
      if (inputs[s].scale == 1.f) {
        widen(block_in, inputs[s].type, acc, len, /*add=*/true);
      } else {
        convert_scaled(block_in, inputs[s].type, scaled, DType::f32, len, inputs[s].scale);
        widen(scaled, DType::f32, acc, len, /*add=*/true);
      }
    }
    auto* block_out = const_cast<std::uint8_t*>(at(dst, type, begin));
    narrow(acc, block_out, type, len);
    if (copy)
      convert_scaled(block_out, type, const_cast<std::uint8_t*>(at(copy->data, copy->type, begin)),
                     copy->type, len, copy->scale);
  }
}

}  // namespace mpt::comm::detail
