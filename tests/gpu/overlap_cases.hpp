// The launchers' refusals of an output that overlaps an input it is read with
// (kernels/check.hpp, require_disjoint). The check sits in kernels/<op>.hpp before the device
// dispatch, so the host and CUDA twins refuse alike; these rows prove it on both. Each row
// builds its tensors on DEVICE in the calling process (a forked child may make no CUDA call)
// and expects the launcher to end the job with the line that names the pair.
// gpu_host_reference runs every row on the host, in CI; each CUDA case of kernel_cases.cpp runs
// its own header's rows on the device.
#pragma once

#include "core/tensor.hpp"
#include "tests/gpu/harness.hpp"

namespace mpt::gpu_test {

// Runs the rows of HEADER ("matmul.hpp"; every row when null) on DEVICE.
void check_overlap_refusals(Harness& h, Device device, const char* header = nullptr);
// How many rows HEADER has (every row when null): gpu_host_reference checks that each row's
// header is one of kernel_cases.hpp's, which gpu_kernels runs the rows by.
int overlap_rows(const char* header = nullptr);

}  // namespace mpt::gpu_test
