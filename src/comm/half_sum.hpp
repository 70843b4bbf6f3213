// Private to comm: the MPI reduction functions for 16-bit floats, which MPI has no type or
// MPI_SUM for. Each adds in f32 and rounds the sum back to nearest even.
#pragma once

#include <mpi.h>

namespace mpt::comm::detail {

// MPI_User_function signatures: INOUT[i] = round(float(IN[i]) + float(INOUT[i])) for *LEN
// 2-byte elements, IEEE binary16 (F16C-vectorised where the CPU has it) or bfloat16.
void sum_f16(void* in, void* inout, int* len, MPI_Datatype* type);
void sum_bf16(void* in, void* inout, int* len, MPI_Datatype* type);

}  // namespace mpt::comm::detail
