// Named ranges on the calling thread for profilers: NVTX v3 in a CUDA build, so that Nsight
// Systems (`nsys profile -t cuda,nvtx,mpi`) shows each training step and its phases above the
// kernels and NCCL calls they queued (docs/gpu.md, "Profiling"). NVTX v3 is header-only: until
// a tool injects itself a range costs a branch. Without CUDA, or where the toolkit has no
// nvtx3 headers, nothing.
#pragma once

namespace mpt::profile {

// Opens a range named NAME (copied by the tool, if any, at the call) on this thread.
void push(const char* name);
// Closes this thread's innermost open range.
void pop();

}  // namespace mpt::profile
