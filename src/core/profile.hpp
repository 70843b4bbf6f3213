// Named ranges on the calling thread for profilers: NVTX v3 in a CUDA build, so that Nsight
// Systems (`nsys profile -t cuda,nvtx,mpi`) shows each training step and its phases above the
// kernels and NCCL calls they queued (docs/gpu.md, "Profiling"). NVTX v3 is header-only: until
// a tool injects itself a range costs a branch. Without CUDA, or where the toolkit has no
// nvtx3 headers, nothing.
#pragma once

namespace mpt::profile {

// True where push() and pop() reach NVTX (a CUDA build with the nvtx3 headers).
bool enabled();
// Opens a range named NAME (copied by the tool, if any, at the call) on this thread.
void push(const char* name);
// Closes this thread's innermost open range.
void pop();

// A range for a scope.
class Range {
 public:
  explicit Range(const char* name) { push(name); }
  ~Range() { pop(); }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;
};

}  // namespace mpt::profile
