// Private helpers for the host kernels: Kokkos loops over contiguous chunks, so that the inner
// loop stays a plain loop over raw pointers that the compiler vectorises, whatever the backend.
#pragma once

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <string>

namespace mpt::kernels::host {

// 64-bit indices: a flat parameter buffer can exceed 2^31 elements.
using HostRange =
    Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace, Kokkos::IndexType<std::int64_t>>;

// 16 Ki floats = 64 KiB per chunk: large enough to amortise scheduling, small enough to give
// every thread work on a 1M-parameter model.
inline constexpr std::int64_t kChunkElements = 16384;

// Calls BODY(begin, end) on disjoint chunks covering [0, n). LABEL must outlive the call; pass a
// function-local static so that no string is built per call.
template <class Body>
void parallel_chunks(const std::string& label, std::int64_t n, const Body& body) {
  if (n <= 0) return;
  const std::int64_t chunks = (n + kChunkElements - 1) / kChunkElements;
  Kokkos::parallel_for(label, HostRange(0, chunks), [=](const std::int64_t chunk) {
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
  Kokkos::parallel_for(label, HostRange(0, blocks), [=](const std::int64_t block) {
    const std::int64_t begin = block * rows_per_block;
    body(begin, std::min(rows, begin + rows_per_block));
  });
}

}  // namespace mpt::kernels::host
