// Private to nn: the f32 scratch that layers compute in while the model stores activations in
// 16 bits. Sized for one block of rows of the widest layer, not for the whole batch, so that it
// stays small next to the activations it serves and the 16-bit saving is real: 512 rows on the
// host (cache-sized); on the cuda device up to 256 MiB of rows (Model::plan), so that a layer's
// GEMMs cover the whole batch at once and fill the GPU.
#pragma once

#include <cstdint>

#include "core/tensor.hpp"

namespace mpt::nn {

// A layer walks its batch in blocks of at most block_rows rows. Each buffer is flat; layers
// take views of the leading elements they need.
struct ComputeWorkspace {
  std::int64_t block_rows = 0;
  Tensor input_rows;   // f32 [block_rows * widest input]: widened x, later dx before rounding
  Tensor output_rows;  // f32 [block_rows * widest output]: y before rounding, or widened dy
  Tensor weight_grad;  // f32 [largest weight]: dW summed over the blocks, rounded at the end
  Tensor bias_grad;    // f32 [largest bias]
  // Where the matmul takes the 16-bit dtype (the cuda device; the host for bf16 where
  // kernels::host_matmul_takes says so): the model's flat 16-bit working weights and the f32
  // compute copy (same layout), so that a layer finds its 16-bit weight at its f32 weight's
  // offset and feeds 16-bit operands straight to the matmul. Undefined elsewhere: the layers
  // then widen to f32.
  Tensor working_params, compute_params;
  // With them: [block_rows * widest input] in the working dtype, an f32 input (the model's
  // first layer) rounded for the 16-bit GEMMs.
  Tensor input16;
};

}  // namespace mpt::nn
