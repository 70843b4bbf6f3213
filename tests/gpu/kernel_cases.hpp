// THE table of kernel test cases: one row per op header in kernels/, naming the case that runs
// its CUDA twin against the host kernel (tests/gpu/kernel_cases.cpp). gpu_kernels runs every
// case on a GPU; gpu_case_table (a CPU test, in CI) fails when a header in kernels/ has no row,
// or when a header that declares cuda:: twins is still marked host-only. So a new op cannot
// get a CUDA kernel without a test, nor a header without a decision.
#pragma once

#include "tests/gpu/harness.hpp"

namespace mpt::gpu_test {

enum class CaseStatus {
  cuda,         // the op has a CUDA twin; RUN compares it with the host kernel
  host_pending  // host-only for now (its CUDA twin is pending); RUN is null
};

using CaseFn = void (*)(Harness&, Random&);

struct KernelCase {
  const char* header;  // kernels/<header>
  const char* name;
  CaseStatus status;
  CaseFn run;
};

void case_adamw(Harness&, Random&);
void case_add(Harness&, Random&);
void case_batchnorm(Harness&, Random&);
void case_bias(Harness&, Random&);
void case_cast(Harness&, Random&);
void case_conv2d(Harness&, Random&);
void case_copy(Harness&, Random&);
void case_dropout(Harness&, Random&);
void case_finite(Harness&, Random&);
void case_gelu(Harness&, Random&);
void case_graph(Harness&, Random&);
void case_matmul(Harness&, Random&);
void case_norm(Harness&, Random&);
void case_normalize(Harness&, Random&);
void case_pool2d(Harness&, Random&);
void case_relu(Harness&, Random&);
void case_scale(Harness&, Random&);
void case_sgd(Harness&, Random&);
void case_softmax_xent(Harness&, Random&);
void case_staging(Harness&, Random&);
void case_step_state(Harness&, Random&);
void case_transpose(Harness&, Random&);
void case_unscale_check(Harness&, Random&);
// The cuDNN parts of case_conv2d and case_pool2d (kernels::cuda::CudnnConv2d, CudnnPool2d;
// tests/gpu/cudnn_cases.cpp): nothing in a build without cuDNN.
void cudnn_conv2d_cases(Harness&, Random&);
void cudnn_pool2d_cases(Harness&, Random&);

inline constexpr KernelCase kKernelCases[] = {
    {"adamw.hpp", "adamw_update", CaseStatus::cuda, case_adamw},
    {"add.hpp", "add (residual, gradient accumulation)", CaseStatus::cuda, case_add},
    {"batchnorm.hpp", "batchnorm sums, apply, backward sums, dx and coefficients", CaseStatus::cuda,
     case_batchnorm},
    {"bias.hpp", "bias_add_forward/backward", CaseStatus::cuda, case_bias},
    {"cast.hpp", "cast, round_and_widen", CaseStatus::cuda, case_cast},
    {"conv2d.hpp", "im2col, col2im, channel rows and bias; cuDNN conv", CaseStatus::cuda,
     case_conv2d},
    {"copy.hpp", "copy host<->device", CaseStatus::cuda, case_copy},
    {"dropout.hpp", "dropout_forward/backward (Philox masks)", CaseStatus::cuda, case_dropout},
    {"finite.hpp", "all_finite", CaseStatus::cuda, case_finite},
    {"gelu.hpp", "gelu_forward/backward", CaseStatus::cuda, case_gelu},
    {"matmul.hpp", "matmul (cuBLASLt)", CaseStatus::cuda, case_matmul},
    {"norm.hpp", "sum_of_squares", CaseStatus::cuda, case_norm},
    {"normalize.hpp", "normalize_u8", CaseStatus::cuda, case_normalize},
    {"pool2d.hpp", "max/avg_pool2d_forward/backward; cuDNN pooling", CaseStatus::cuda,
     case_pool2d},
    {"relu.hpp", "relu_forward/backward", CaseStatus::cuda, case_relu},
    {"scale.hpp", "scale_inplace", CaseStatus::cuda, case_scale},
    {"sgd.hpp", "sgd_update", CaseStatus::cuda, case_sgd},
    {"softmax_xent.hpp", "softmax_xent_forward(_backward)", CaseStatus::cuda, case_softmax_xent},
    {"staging.hpp", "HostStaging: downloads after the compute stream, uploads before it",
     CaseStatus::cuda, case_staging},
    {"step_state.hpp",
     "begin_step, softmax_xent_step, poison, unscale_and_check_step, decide_step, clip_grad_norm",
     CaseStatus::cuda, case_step_state},
    {"transpose.hpp", "transpose_columns", CaseStatus::cuda, case_transpose},
    {"unscale_check.hpp", "unscale_and_check", CaseStatus::cuda, case_unscale_check},
    // Last, out of order: a capture that fails aborts the process (abort_job), and every case
    // above has reported by then.
    {"graph.hpp", "StepGraph capture and replay (scale_inplace, add, cast)", CaseStatus::cuda,
     case_graph},
};

}  // namespace mpt::gpu_test
