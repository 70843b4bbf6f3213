// The cnn's non-GEMM kernels (im2col, col2im, the NCHW <-> channel-row reorders with and without
// the folded ReLU, ReLU, max pooling) at its shapes, batch 128, in its sample blocks: best of 5
// timings each, ms per batch. Run with OMP_NUM_THREADS=1; an argument is ignored. The GEMMs are
// bench_kernels' (docs/perf.md, "The cnn's host kernels").
#include <Kokkos_Core.hpp>
#include <chrono>
#include <cstdio>
#include <functional>
#include "kernels/conv2d.hpp"
#include "kernels/pool2d.hpp"
#include "kernels/relu.hpp"
using namespace mpt;
using namespace mpt::kernels;
static double time_ms(const std::function<void()>& f, int reps) {
  f();
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
    best = std::min(best, ms);
  }
  return best;
}
static void fill(Tensor& t, unsigned seed) {
  float* d = t.data<float>();
  unsigned s = seed;
  for (std::int64_t i = 0; i < t.numel(); ++i) { s = s * 1664525u + 1013904223u; d[i] = (s >> 8) * (1.f / 16777216.f) - 0.5f; }
}
int main(int argc, char** argv) {
  Kokkos::initialize(argc, argv);
  {
    const int B = 128;
    struct Conv { const char* name; Conv2dGeometry g; std::int64_t cout, block; };
    for (Conv c : {Conv{"conv1", {1, 28, 28, 5, 1, 2}, 32, 53}, Conv{"conv2", {32, 14, 14, 5, 1, 2}, 64, 6}}) {
      const std::int64_t P = c.g.col_columns(), in = c.g.channels * c.g.height * c.g.width;
      Tensor x({B, c.g.channels, c.g.height, c.g.width}, DType::f32); fill(x, 1);
      Tensor col({c.g.col_rows(), c.block * P}, DType::f32);
      Tensor rows({c.cout, c.block * P}, DType::f32); fill(rows, 2);
      Tensor bias({c.cout}, DType::f32); fill(bias, 3);
      Tensor y({B, c.cout, c.g.out_height(), c.g.out_width()}, DType::f32);
      Tensor yr({B, c.cout, c.g.out_height(), c.g.out_width()}, DType::f32);
      auto per_batch = [&](auto body) {
        return [&, body] {
          for (std::int64_t first = 0; first < B; first += c.block) {
            const std::int64_t count = std::min(c.block, B - first);
            body(first, count);
          }
        };
      };
      Tensor xs, cb, rb, ys;
      double t;
      t = time_ms(per_batch([&](std::int64_t first, std::int64_t count) {
        Tensor::view_into(xs, x, first * in, {count, in});
        Tensor::view_into(cb, col, 0, {c.g.col_rows(), count * P});
        im2col(xs, c.g, cb);
      }), 3);
      std::printf("%s im2col            %8.3f ms/batch\n", c.name, t);
      t = time_ms(per_batch([&](std::int64_t first, std::int64_t count) {
        Tensor::view_into(xs, x, first * in, {count, in});
        Tensor::view_into(cb, col, 0, {c.g.col_rows(), count * P});
        col2im(cb, c.g, xs);
      }), 3);
      std::printf("%s col2im            %8.3f ms/batch\n", c.name, t);
      t = time_ms(per_batch([&](std::int64_t first, std::int64_t count) {
        Tensor::view_into(rb, rows, 0, {c.cout, count * P});
        Tensor::view_into(ys, y, first * c.cout * P, {count, c.cout * P});
        channel_rows_to_samples(rb, bias, ys);
      }), 3);
      std::printf("%s rows_to_samples   %8.3f ms/batch\n", c.name, t);
      t = time_ms(per_batch([&](std::int64_t first, std::int64_t count) {
        Tensor::view_into(rb, rows, 0, {c.cout, count * P});
        Tensor::view_into(ys, y, first * c.cout * P, {count, c.cout * P});
        samples_to_channel_rows(ys, rb);
      }), 3);
      std::printf("%s samples_to_rows   %8.3f ms/batch\n", c.name, t);
      t = time_ms(per_batch([&](std::int64_t first, std::int64_t count) {
        Tensor::view_into(rb, rows, 0, {c.cout, count * P});
        Tensor::view_into(ys, y, first * c.cout * P, {count, c.cout * P});
        channel_rows_to_samples(rb, bias, ys, true);
      }), 3);
      std::printf("%s rows_to_samples+relu %8.3f ms/batch\n", c.name, t);
      t = time_ms(per_batch([&](std::int64_t first, std::int64_t count) {
        Tensor::view_into(rb, rows, 0, {c.cout, count * P});
        Tensor::view_into(ys, y, first * c.cout * P, {count, c.cout * P});
        Tensor::view_into(xs, yr, first * c.cout * P, {count, c.cout * P});
        samples_to_channel_rows(ys, rb, &xs);
      }), 3);
      std::printf("%s samples_to_rows+relu' %8.3f ms/batch\n", c.name, t);
      t = time_ms([&] { relu_forward(y, yr); }, 3);
      std::printf("%s relu_forward      %8.3f ms/batch\n", c.name, t);
      Tensor dy({B, c.cout, c.g.out_height(), c.g.out_width()}, DType::f32); fill(dy, 5);
      Tensor dx({B, c.cout, c.g.out_height(), c.g.out_width()}, DType::f32);
      t = time_ms([&] { relu_backward(yr, dy, dx); }, 3);
      std::printf("%s relu_backward     %8.3f ms/batch\n", c.name, t);
      const Pool2dGeometry pg{c.g.out_height(), c.g.out_width(), 2, 2, 2};
      Tensor py({B, c.cout, pg.out_height(), pg.out_width()}, DType::f32);
      t = time_ms([&] { max_pool2d_forward(yr, pg, py); }, 3);
      std::printf("%s maxpool_forward   %8.3f ms/batch\n", c.name, t);
      Tensor pdy({B, c.cout, pg.out_height(), pg.out_width()}, DType::f32); fill(pdy, 6);
      t = time_ms([&] { max_pool2d_backward(yr, pg, pdy, dx); }, 3);
      std::printf("%s maxpool_backward  %8.3f ms/batch\n", c.name, t);
    }
  }
  Kokkos::finalize();
}
