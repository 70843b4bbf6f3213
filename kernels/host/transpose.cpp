// Host transpose of a band of columns (see kernels/transpose.hpp): square tiles, so that both
// the rows read and the rows written stay in cache while a tile is copied.
#include "kernels/transpose.hpp"

#include <algorithm>
#include <cstdint>

#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

void transpose_columns(const Tensor& a, std::int64_t column_begin, Tensor& at) {
  static const std::string label = "kernels::transpose_columns";
  constexpr const char* op = "kernels::transpose_columns";
  detail::require_host_f32(op, "a must be f32 on the host", a);
  detail::require_host_f32(op, "at must be f32 on the host", at);
  detail::require(a.rank() == 2, op, "a must be 2-D", a);
  detail::require_pair(at.rank() == 2 && at.dim(1) == a.dim(0) && column_begin >= 0 &&
                           column_begin + at.dim(0) <= a.dim(1),
                       op, "at must be [K, rows of a] with the K columns inside a", a, at);
  constexpr std::int64_t kTile = 32;  // 4 KiB of f32 read and 4 KiB written per tile
  const std::int64_t rows = a.dim(0), columns = a.dim(1), band_columns = at.dim(0);
  const float* __restrict in = a.data<float>() + column_begin;
  float* __restrict out = at.data<float>();
  // One task per KTILE rows of A (columns of AT): the tasks write disjoint elements.
  const std::int64_t tasks = (rows + kTile - 1) / kTile;
  parallel_for(label, tasks, [=](std::int64_t task) {
    const std::int64_t row_begin = task * kTile, row_end = std::min(rows, row_begin + kTile);
    for (std::int64_t j_begin = 0; j_begin < band_columns; j_begin += kTile) {
      const std::int64_t j_end = std::min(band_columns, j_begin + kTile);
      for (std::int64_t row = row_begin; row < row_end; ++row)
        for (std::int64_t j = j_begin; j < j_end; ++j) out[j * rows + row] = in[row * columns + j];
    }
  });
}

}  // namespace mpt::kernels::host
