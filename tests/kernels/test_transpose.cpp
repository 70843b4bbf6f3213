// transpose_columns: every element of the band lands at its mirrored place, for shapes smaller
// than, equal to and not a multiple of the 32-element tile, whole matrices and inner bands.
#include <gtest/gtest.h>

#include <array>

#include "kernels/transpose.hpp"
#include "random_fill.hpp"

namespace mpt::kernels {
namespace {

TEST(TransposeColumns, MirrorsEveryElementOfTheBand) {
  // rows, columns, first column, band width
  const std::array<std::array<std::int64_t, 4>, 8> cases = {{{1, 1, 0, 1},
                                                             {1, 37, 0, 37},
                                                             {37, 1, 0, 1},
                                                             {32, 32, 0, 32},
                                                             {33, 65, 0, 65},
                                                             {100, 7, 0, 7},
                                                             {33, 65, 31, 34},
                                                             {64, 70, 5, 1}}};
  std::uint64_t seed = 1;
  for (const auto& [rows, columns, first, width] : cases) {
    SCOPED_TRACE(::testing::Message()
                 << rows << "x" << columns << " from " << first << " width " << width);
    const Tensor a = test::random_tensor({rows, columns}, seed++);
    Tensor at = test::random_tensor({width, rows}, seed++);  // stale values must be overwritten
    transpose_columns(a, first, at);
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < width; ++j)
        ASSERT_EQ(at.data<float>()[j * rows + i], a.data<float>()[i * columns + first + j])
            << "a[" << i << ", " << first + j << "]";
  }
}

}  // namespace
}  // namespace mpt::kernels
