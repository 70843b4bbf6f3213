// Private helpers for the host kernels: Kokkos loops over contiguous chunks, so that the inner
// loop stays a plain loop over raw pointers that the compiler vectorises, whatever the backend.
// Without Kokkos (MPTRAIN_HAVE_KOKKOS undefined: the GPU-only build) the same helpers loop
// with OpenMP, or serially where the compiler has no OpenMP.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#ifdef MPTRAIN_HAVE_KOKKOS
#include <Kokkos_Core.hpp>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

namespace mpt::kernels::host {

#ifdef MPTRAIN_HAVE_KOKKOS
// 64-bit indices: a flat parameter buffer can exceed 2^31 elements.
using HostRange =
    Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::IndexType<std::int64_t>>;
#endif

// Calls BODY(i) for every i in [0, count), in parallel. LABEL names the loop for Kokkos tools.
template <class Body>
void parallel_for(const std::string& label, std::int64_t count, const Body& body) {
  if (count <= 0) return;
#ifdef MPTRAIN_HAVE_KOKKOS
  Kokkos::parallel_for(label, HostRange(0, count), body);
#else
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < count; ++i) body(i);
#endif
}

// A functor with Kokkos' reducer interface: init(value) and join(into, from).
template <class Body, class T>
concept JoinReducer = requires(const Body& body, T& value) {
  body.init(value);
  body.join(value, value);
};

// RESULT = the reduction of BODY(i, partial) over i in [0, count): a sum of RESULT's type, or,
// when BODY is a functor with init(value) and join(into, from) (Kokkos' functor reducer
// interface), that reduction. RESULT is overwritten, as Kokkos::parallel_reduce does. The
// OpenMP fallback joins per-thread partials in thread order, so a result does not depend on
// which thread finishes first.
template <class Body, class T>
void parallel_reduce(const std::string& label, std::int64_t count, const Body& body, T& result) {
#ifdef MPTRAIN_HAVE_KOKKOS
  Kokkos::parallel_reduce(label, HostRange(0, std::max<std::int64_t>(0, count)), body, result);
#else
  constexpr bool custom = JoinReducer<Body, T>;
  const auto init = [&](T& value) {
    if constexpr (custom)
      body.init(value);
    else
      value = T{};
  };
  constexpr int kMaxThreads = 256;
  std::array<T, kMaxThreads> partials;
  int threads = 1;
#ifdef _OPENMP
  threads = std::min(kMaxThreads, omp_get_max_threads());
#endif
  for (int t = 0; t < threads; ++t) init(partials[static_cast<std::size_t>(t)]);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int64_t i = 0; i < count; ++i) {
    int thread = 0;
#ifdef _OPENMP
    thread = omp_get_thread_num();
#endif
    body(i, partials[static_cast<std::size_t>(thread)]);
  }
  init(result);
  for (int t = 0; t < threads; ++t) {
    if constexpr (custom)
      body.join(result, partials[static_cast<std::size_t>(t)]);
    else
      result += partials[static_cast<std::size_t>(t)];
  }
#endif
}

// 16 Ki floats = 64 KiB per chunk: large enough to amortise scheduling, small enough to give
// every thread work on a 1M-parameter model.
inline constexpr std::int64_t kChunkElements = 16384;

// Calls BODY(begin, end) on disjoint chunks covering [0, n). LABEL must outlive the call; pass a
// function-local static so that no string is built per call.
template <class Body>
void parallel_chunks(const std::string& label, std::int64_t n, const Body& body) {
  if (n <= 0) return;
  const std::int64_t chunks = (n + kChunkElements - 1) / kChunkElements;
  parallel_for(label, chunks, [=](const std::int64_t chunk) {
    const std::int64_t begin = chunk * kChunkElements;
    body(begin, std::min(n, begin + kChunkElements));
  });
}

// Calls BODY(row_begin, row_end) on disjoint blocks of whole rows of a [rows, row_length] array,
// with about kChunkElements elements per block.
template <class Body>
void parallel_rows(const std::string& label, std::int64_t rows, std::int64_t row_length,
                   const Body& body) {
  if (rows <= 0) return;
  const std::int64_t rows_per_block =
      std::max<std::int64_t>(1, kChunkElements / std::max<std::int64_t>(1, row_length));
  const std::int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  parallel_for(label, blocks, [=](const std::int64_t block) {
    const std::int64_t begin = block * rows_per_block;
    body(begin, std::min(rows, begin + rows_per_block));
  });
}

}  // namespace mpt::kernels::host
