// The CUDA emulator's host-side helpers, shared by its runtime (runtime.cpp) and its cuBLASLt
// (cublaslt.cpp). See device.hpp for what kernels see, docs/testing.md for what it is for.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

namespace mpt::cudaemu {

// True when [POINTER, POINTER + BYTES) lies inside one cudaMalloc allocation.
bool device_memory_contains(const void* pointer, std::size_t bytes);
// Runs WORK now, or records it into the capture of STREAM; fails as a copy on STREAM would.
cudaError_t run_on_stream(cudaStream_t stream, std::function<void()> work);
// Ends the process naming a CUDA feature that the emulator does not model (so that no test
// passes on behaviour the emulator made up).
[[noreturn]] void emulator_limit(const char* what);

}  // namespace mpt::cudaemu
