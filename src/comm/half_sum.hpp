// Private to comm: the MPI reduction functions for 16-bit floats, which MPI has no type or
// MPI_SUM for. Each adds in f32 and rounds the sum back to nearest even.
#pragma once

#include <mpi.h>

#include "core/tensor.hpp"

namespace mpt::comm::detail {

// MPI_User_function signatures: INOUT[i] = round(float(IN[i]) + float(INOUT[i])) for *LEN
// 2-byte elements, IEEE binary16 (F16C-vectorised where the CPU has it) or bfloat16.
void sum_f16(void* in, void* inout, int* len, MPI_Datatype* type);
void sum_bf16(void* in, void* inout, int* len, MPI_Datatype* type);

// The MPI datatype and sum op for each element type that an all-reduce carries: f32 (MPI_FLOAT,
// MPI_SUM), f16 and bf16 (a 2-byte type with the ops above). Creates and frees the 16-bit ones;
// construct and destroy while MPI is initialised (the destructor does nothing after finalize).
class SumOps {
 public:
  SumOps();
  ~SumOps();
  SumOps(const SumOps&) = delete;
  SumOps& operator=(const SumOps&) = delete;
  MPI_Datatype type(DType dtype) const;
  MPI_Op sum(DType dtype) const;

 private:
  MPI_Datatype two_bytes_ = MPI_DATATYPE_NULL;
  MPI_Op f16_sum_ = MPI_OP_NULL, bf16_sum_ = MPI_OP_NULL;
};

}  // namespace mpt::comm::detail
