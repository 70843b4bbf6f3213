// Private to comm: the element loops of the all-reduce algorithms, over raw buffers of f32, f16
// or bf16. Conversions fuse a scale factor (pre- and postscale cost no pass of their own), and
// sums add in f32 and round once. fp16 uses F16C where the CPU has it (checked at run time).
#pragma once

#include <cstdint>

#include "core/tensor.hpp"

namespace mpt::comm::detail {

// DST[i] = SCALE * SRC[i], converted from FROM to TO (each f32, f16 or bf16) with round to
// nearest even. SRC and DST either do not overlap or are the same pointer with FROM == TO.
// Same type and SCALE == 1: a memcpy (nothing at all in place).
void convert_scaled(const void* src, DType from, void* dst, DType to, std::int64_t n, float scale);

// One operand of a sum: elements of TYPE at DATA, each taken times SCALE.
struct Operand {
  const void* data = nullptr;
  DType type = DType::f32;
  float scale = 1;
};
// Where a sum is copied too: elements of TYPE at DATA, each the rounded sum times SCALE.
struct Copy {
  void* data;
  DType type = DType::f32;
  float scale = 1;
};

// DST[i] = INPUTS[0][i] + ... + INPUTS[COUNT - 1][i] for N elements: widened to f32, scaled,
// added in input order and rounded to TYPE once. With COPY, also COPY[i] = DST[i] converted and
// scaled, from the rounded DST while it is still in L1 (the bits any other reader of DST would
// make of it). DST or COPY may be an input (the same pointer), never a partial overlap.
void sum_inputs(const Operand* inputs, int count, void* dst, DType type, std::int64_t n,
                const Copy* copy = nullptr);

}  // namespace mpt::comm::detail
