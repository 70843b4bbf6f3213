// CUDA transpose of a band of columns (see kernels/transpose.hpp): 32 x 32 tiles staged in
// shared memory, so that both the rows of A read and the rows of AT written are coalesced.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/transpose.hpp"

namespace mpt::kernels::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kTileRowsPerPass = 8;  // blocks of 32 x 8 threads, 4 elements per thread and tile
constexpr std::int64_t kMaxGridY = 65535;

// Tile (tile_row, tile_column) covers rows [tile_row*32, +32) of A and band columns
// [tile_column*32, +32); A already points at the band's first column, COLUMNS is A's row
// length. Grid-stride over the tiles, so any matrix fits the grid limits.
__global__ void transpose_tiles_kernel(const float* a, std::int64_t rows, std::int64_t columns,
                                       std::int64_t band_columns, float* at) {
  __shared__ float tile[kTile][kTile + 1];  // +1: the column reads hit distinct banks
  const std::int64_t row_tiles = (rows + kTile - 1) / kTile;
  const std::int64_t column_tiles = (band_columns + kTile - 1) / kTile;
  for (std::int64_t tile_row = blockIdx.y; tile_row < row_tiles; tile_row += gridDim.y)
    for (std::int64_t tile_column = blockIdx.x; tile_column < column_tiles;
         tile_column += gridDim.x) {
      const std::int64_t row0 = tile_row * kTile, column0 = tile_column * kTile;
      for (int k = static_cast<int>(threadIdx.y); k < kTile; k += kTileRowsPerPass) {
        const std::int64_t row = row0 + k, j = column0 + threadIdx.x;
        if (row < rows && j < band_columns) tile[k][threadIdx.x] = a[row * columns + j];
      }
      __syncthreads();
      for (int k = static_cast<int>(threadIdx.y); k < kTile; k += kTileRowsPerPass) {
        const std::int64_t j = column0 + k, row = row0 + threadIdx.x;
        if (j < band_columns && row < rows) at[j * rows + row] = tile[threadIdx.x][k];
      }
      __syncthreads();  // the tile is read before the next one overwrites it
    }
}

}  // namespace

void transpose_columns(const Tensor& a, std::int64_t column_begin, Tensor& at) {
  constexpr const char* op = "kernels::cuda::transpose_columns";
  require_cuda(op, "a must be f32 on the cuda device", a, DType::f32);
  require_cuda(op, "at must be f32 on the cuda device", at, DType::f32);
  detail::require(a.rank() == 2, op, "a must be 2-D", a);
  detail::require_pair(at.rank() == 2 && at.dim(1) == a.dim(0) && column_begin >= 0 &&
                           column_begin + at.dim(0) <= a.dim(1),
                       op, "at must be [K, rows of a] with the K columns inside a", a, at);
  const std::int64_t rows = a.dim(0), columns = a.dim(1), band_columns = at.dim(0);
  if (rows == 0 || band_columns == 0) return;
  const std::int64_t row_tiles = (rows + kTile - 1) / kTile;
  const std::int64_t column_tiles = (band_columns + kTile - 1) / kTile;
  const dim3 grid(static_cast<unsigned>(std::min(column_tiles, kMaxGridY)),
                  static_cast<unsigned>(std::min(row_tiles, kMaxGridY)));
  transpose_tiles_kernel<<<grid, dim3(kTile, kTileRowsPerPass), 0, stream()>>>(
      a.data<float>() + column_begin, rows, columns, band_columns, at.data<float>());
  check_launch(op);
}

}  // namespace mpt::kernels::cuda
