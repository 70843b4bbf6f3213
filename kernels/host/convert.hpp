// Private to the host kernels: raw-pointer conversions between f32 and 16-bit storage (F16C for
// fp16 where the CPU has it), for kernels that widen or round inside their own chunked loops.
#pragma once

#include <cstdint>

#include "core/tensor.hpp"

namespace mpt::kernels::host {

// OUT[i] = float(IN[i]) for N elements of 16-bit storage FROM (f16 or bf16); exact.
void widen_to_f32(const std::uint16_t* in, DType from, float* out, std::int64_t n);
// OUT[i] = IN[i] rounded to nearest even in 16-bit storage TO (f16 or bf16).
void round_from_f32(const float* in, DType to, std::uint16_t* out, std::int64_t n);
// ROUNDED[i] = round(IN[i]) in TO and WIDENED[i] = float(ROUNDED[i]), in one pass.
void round_and_widen_f32(const float* in, DType to, std::uint16_t* rounded, float* widened,
                         std::int64_t n);

}  // namespace mpt::kernels::host
