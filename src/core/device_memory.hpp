// Raw device memory for Tensor storage and copies between devices. In a CUDA build
// (MPTRAIN_HAVE_CUDA) this wraps cudaMalloc, cudaMemset and cudaMemcpy; otherwise every cuda
// request aborts with a message that says the build has no CUDA, and the device count is 0.
#pragma once

#include <cstddef>
#include <string>

#include "core/arena.hpp"
#include "core/tensor.hpp"

namespace mpt::device_memory {

// True when this build was compiled with CUDA.
bool cuda_built();
// The number of CUDA devices this process can see; 0 without CUDA, a driver or a device (never
// aborts: callers use it to skip GPU work).
int cuda_device_count();
// "NVIDIA H200 (sm_90, 139 GiB)" for the current device, or why there is none.
std::string cuda_device_description();
// Makes DEVICE (0 <= DEVICE < cuda_device_count()) this process's current cuda device, for every
// later allocation and launch. Throws UserError naming --device when it cannot (a build without
// CUDA, a busy or missing device), so that a caller inside an agreed phase ends every rank.
void set_cuda_device(int device);

// BYTES of zero-filled memory on the cuda device, out of the process's device arena
// (core/arena.hpp: cudaMalloc only when a new slab is needed); aborts on failure, naming the size.
void* allocate_cuda(std::size_t bytes);
// Back to the arena, not to the driver. Never aborts: called from destructors.
void free_cuda(void* pointer);
// Takes a slab for BYTES now unless one fits already (false: no CUDA, or out of memory).
bool reserve_cuda(std::size_t bytes);
// The arena's counters: slabs are its cudaMalloc calls; all zero without CUDA.
ArenaStats cuda_arena_stats();
void zero_cuda(void* pointer, std::size_t bytes);
// Copies BYTES between any two devices; synchronous with respect to the host.
void copy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes);
// Waits for all work queued on the current cuda device (no-op without CUDA).
void synchronize();

}  // namespace mpt::device_memory
