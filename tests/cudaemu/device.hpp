// The device side of the CUDA emulator (docs/testing.md, "The CUDA emulator"): what a .cu file of
// kernels/cuda sees when tests/cudaemu/rewrite_launches.py has turned it into host C++. The CUDA
// toolkit's own headers give the types and the host halves of the 16-bit conversions; this header
// gives the execution-space keywords, the built-in indices, the barriers and warp shuffles (which
// suspend the emulated thread: runtime.cpp runs a block's threads as fibers), the intrinsics and
// atomics, and the launch that replaces <<<...>>>. Only for the emulation build
// (MPTRAIN_CUDA_EMULATION): nothing of the production build includes it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
// A block's threads run one after another on one host thread, and blocks run one at a time, so a
// function-local static is exactly one block's shared memory.
#define __shared__ static
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)

namespace mpt::cudaemu {

// What a running emulated thread sees: its indices and its block's launch configuration.
struct ThreadContext {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
// The thread now running on this host thread (set by the scheduler around every switch).
ThreadContext& context();

// The block-wide barrier; with OR, the predicate's OR over the block (__syncthreads_or).
int block_barrier(bool with_or, int predicate);
// A warp shuffle: every lane in MASK deposits VALUE (the raw bits, at most 8 bytes) and gets the
// bits of lane SOURCE(lane): lane + DELTA (down) or LANE_ARG (direct), within segments of WIDTH
// lanes; a lane whose source falls outside its segment gets its own value back.
enum class ShuffleMode { down, direct };
std::uint64_t warp_shuffle(unsigned mask, std::uint64_t value, ShuffleMode mode, int lane_arg,
                           int width);

// A kernel launch: the configuration of <<<...>>>.
struct LaunchConfig {
  dim3 grid;
  dim3 block;
  std::size_t shared_bytes = 0;
  cudaStream_t stream = nullptr;
  LaunchConfig(dim3 grid_, dim3 block_, std::size_t shared_bytes_ = 0,
               cudaStream_t stream_ = nullptr)
      : grid(grid_), block(block_), shared_bytes(shared_bytes_), stream(stream_) {}
};

// A type-erased reference to a callable that runs one emulated thread.
struct ThreadBody {
  void* object;
  void (*call)(void*);
  void operator()() const { call(object); }
};

// Runs (or, inside a stream capture, records) a kernel of NAME over CONFIG, calling BODY once
// per thread. Sets the launch error that cudaGetLastError reports for a bad configuration.
// KEEP_ALIVE owns what BODY points to when the launch is recorded into a graph.
void launch_erased(const char* name, const LaunchConfig& config, ThreadBody body,
                   std::shared_ptr<void> keep_alive);
// Ends the process when a kernel's pointer parameter INDEX points to host memory that the
// device cannot reach (neither device memory nor pinned host memory); null passes.
void check_kernel_pointer(const char* name, int index, const void* pointer);

template <class T>
void check_parameter(const char* name, int index, const T& value) {
  if constexpr (std::is_pointer_v<T>)
    check_kernel_pointer(name, index, static_cast<const void*>(value));
}

// KERNEL<<<CONFIG>>>(ARGS...) becomes launch("KERNEL", LaunchConfig(CONFIG), CALL, ARGS...),
// CALL being a lambda that calls the kernel with its arguments: the arguments are evaluated and
// copied once, at the launch, as CUDA copies kernel parameters (and as a graph keeps them).
template <class Call, class... Args>
void launch(const char* name, const LaunchConfig& config, Call call, Args&&... args) {
  struct Launch {
    Call call;
    std::tuple<std::decay_t<Args>...> args;
  };
  auto state = std::make_shared<Launch>(Launch{call, {std::forward<Args>(args)...}});
  std::apply(
      [name](const auto&... values) {
        int index = 0;
        (check_parameter(name, index++, values), ...);
      },
      state->args);
  ThreadBody body{state.get(), [](void* object) {
                    auto* launch = static_cast<Launch*>(object);
                    auto copy = launch->args;  // each thread gets its own parameters
                    std::apply(launch->call, copy);
                  }};
  launch_erased(name, config, body, std::move(state));
}

template <class T>
std::uint64_t to_bits(T value) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>,
                "cudaemu: shuffle of a large type");
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof value);
  return bits;
}
template <class T>
T from_bits(std::uint64_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

}  // namespace mpt::cudaemu

// The device-code vocabulary, for the rewritten .cu files only (runtime.cpp includes this header
// for the declarations above and defines MPT_CUDAEMU_RUNTIME).
#ifndef MPT_CUDAEMU_RUNTIME

#define threadIdx (::mpt::cudaemu::context().thread_idx)
#define blockIdx (::mpt::cudaemu::context().block_idx)
#define blockDim (::mpt::cudaemu::context().block_dim)
#define gridDim (::mpt::cudaemu::context().grid_dim)
#ifndef warpSize
#define warpSize 32
#endif

inline void __syncthreads() { ::mpt::cudaemu::block_barrier(false, 0); }
inline int __syncthreads_or(int predicate) {
  return ::mpt::cudaemu::block_barrier(true, predicate);
}
template <class T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  using namespace ::mpt::cudaemu;
  return from_bits<T>(
      warp_shuffle(mask, to_bits(value), ShuffleMode::down, static_cast<int>(delta), width));
}
template <class T>
T __shfl_sync(unsigned mask, T value, int source_lane, int width = 32) {
  using namespace ::mpt::cudaemu;
  return from_bits<T>(warp_shuffle(mask, to_bits(value), ShuffleMode::direct, source_lane, width));
}

// The correctly rounded arithmetic intrinsics: plain host operations, since the emulation build
// compiles with -ffp-contract=off (no fused multiply-adds behind the code's back).
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
// CUDA's math library puts the classification functions in the global namespace.
using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;
inline float __double2float_rn(double value) { return static_cast<float>(value); }
// CUDA's global min and max overloads for the built-in arithmetic types.
template <class A, class B>
requires std::is_arithmetic_v<A> && std::is_arithmetic_v<B> std::common_type_t<A, B> min(A a, B b) {
  using T = std::common_type_t<A, B>;
  return static_cast<T>(b) < static_cast<T>(a) ? static_cast<T>(b) : static_cast<T>(a);
}
template <class A, class B>
requires std::is_arithmetic_v<A> && std::is_arithmetic_v<B> std::common_type_t<A, B> max(A a, B b) {
  using T = std::common_type_t<A, B>;
  return static_cast<T>(a) < static_cast<T>(b) ? static_cast<T>(b) : static_cast<T>(a);
}
inline unsigned __umulhi(unsigned a, unsigned b) {
  return static_cast<unsigned>((static_cast<std::uint64_t>(a) * b) >> 32);
}
inline float __uint_as_float(unsigned bits) { return std::bit_cast<float>(bits); }
inline unsigned __float_as_uint(float value) { return std::bit_cast<unsigned>(value); }
inline float __int_as_float(int bits) { return std::bit_cast<float>(bits); }
inline int __float_as_int(float value) { return std::bit_cast<int>(value); }

// Atomics: the threads of a launch run one at a time, so a plain read-modify-write is atomic.
template <class T>
T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}
template <class T>
T atomicMin(T* address, T value) {
  const T old = *address;
  if (value < old) *address = value;
  return old;
}
template <class T>
T atomicMax(T* address, T value) {
  const T old = *address;
  if (value > old) *address = value;
  return old;
}
template <class T>
T atomicExch(T* address, T value) {
  const T old = *address;
  *address = value;
  return old;
}
template <class T>
T atomicCAS(T* address, T compare, T value) {
  const T old = *address;
  if (old == compare) *address = value;
  return old;
}
template <class T>
T atomicOr(T* address, T value) {
  const T old = *address;
  *address = old | value;
  return old;
}
inline void __threadfence() {}

#endif  // MPT_CUDAEMU_RUNTIME
