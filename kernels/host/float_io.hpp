// Private to the host kernels: runs of f32, f16 or bf16 storage read and written as f32 through
// a small block on the stack, so that kernels accepting any storage dtype keep one f32 loop.
#pragma once

#include <cstdint>

#include "core/tensor.hpp"
#include "kernels/host/convert.hpp"

namespace mpt::kernels::host {

// Elements per block: 1 KiB of f32 on the stack.
inline constexpr std::int64_t kIoBlock = 256;

inline bool is_float_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16;
}

// N (<= kIoBlock) elements of BASE (of DTYPE) from element OFFSET, as f32: the storage itself
// under f32, else widened into BLOCK.
inline const float* load_f32(const void* base, DType dtype, std::int64_t offset, std::int64_t n,
                             float* block) {
  if (dtype == DType::f32) return static_cast<const float*>(base) + offset;
  widen_to_f32(static_cast<const std::uint16_t*>(base) + offset, dtype, block, n);
  return block;
}

// Where to put N f32 values bound for element OFFSET of BASE: the storage itself under f32, else
// BLOCK, which store_f32 then rounds into place.
inline float* store_target(void* base, DType dtype, std::int64_t offset, float* block) {
  return dtype == DType::f32 ? static_cast<float*>(base) + offset : block;
}
inline void store_f32(void* base, DType dtype, std::int64_t offset, std::int64_t n,
                      const float* block) {
  if (dtype != DType::f32)
    round_from_f32(block, dtype, static_cast<std::uint16_t*>(base) + offset, n);
}

}  // namespace mpt::kernels::host
