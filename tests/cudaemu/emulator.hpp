// The CUDA emulator's host-side helpers, shared by its runtime (runtime.cpp), its cuBLASLt
// (cublaslt.cpp) and its cuDNN (cudnn.cpp). See device.hpp for what kernels see,
// docs/testing.md for what it is for.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>

namespace mpt::cudaemu {

// True when [POINTER, POINTER + BYTES) lies inside one cudaMalloc allocation.
bool device_memory_contains(const void* pointer, std::size_t bytes);
// The device whose memory [POINTER, POINTER + BYTES) is, or -1 where it is not inside one
// cudaMalloc allocation.
int device_memory_owner(const void* pointer, std::size_t bytes);
// The calling thread's current device (cudaSetDevice's).
int current_device_index();
// The device STREAM belongs to: the one current when it was made; the calling thread's current
// device for the legacy and per-thread default streams.
int stream_device(cudaStream_t stream);
// Queues WORK on STREAM (it runs when a synchronisation or a later wait needs it, on whichever
// host thread asks: capture what it reads by value), or records it into STREAM's capture;
// fails as a copy on STREAM would.
cudaError_t run_on_stream(cudaStream_t stream, std::function<void()> work);
// Records ACTION into STREAM's capture, which the calling thread must be making: every launch
// of the graph calls it on the launching thread, in its place among the graph's nodes, with the
// launch's stream, and it queues its own work there. For a library whose host side must run
// once per launch (NCCL numbers its collectives on the host, and the emulator's progress
// thread must learn of each one). cudaErrorIllegalState when STREAM is not being captured.
cudaError_t capture_host_action(cudaStream_t stream,
                                std::function<cudaError_t(cudaStream_t)> action);
// Ends the process naming a CUDA feature that the emulator does not model (so that no test
// passes on behaviour the emulator made up).
[[noreturn]] void emulator_limit(const char* what);

}  // namespace mpt::cudaemu
