// The rows of overlap_cases.hpp: for each launcher that must not write over its inputs, an
// output that overlaps one (part of it, or all of it), and the message that names the pair.
#include "tests/gpu/overlap_cases.hpp"

#include <cstring>
#include <memory>
#include <string>

#include "kernels/adamw.hpp"
#include "kernels/add.hpp"
#include "kernels/batchnorm.hpp"
#include "kernels/bias.hpp"
#include "kernels/cast.hpp"
#include "kernels/conv2d.hpp"
#include "kernels/dropout.hpp"
#include "kernels/gelu.hpp"
#include "kernels/matmul.hpp"
#include "kernels/normalize.hpp"
#include "kernels/pool2d.hpp"
#include "kernels/relu.hpp"
#include "kernels/sgd.hpp"
#include "kernels/softmax_xent.hpp"
#include "kernels/step_state.hpp"
#include "kernels/transpose.hpp"

namespace mpt::gpu_test {
namespace {

std::string on(Device device) { return std::string(" on ") + device_name(device); }

// A host tensor of DTYPE over the bytes of BASE (from its first byte): another element width
// over the same memory, which a view (always of its base's dtype) cannot give. Host only.
Tensor reinterpret(const Tensor& base, Shape shape, DType dtype) {
  return Tensor::adopt(const_cast<void*>(base.raw()), std::move(shape), dtype,
                       std::make_shared<Tensor>(base));
}

void overlap_matmul(Harness& h, Device d) {
  const Tensor buffer({32}, DType::f32, d), b({4, 4}, DType::f32, d);
  const Tensor a = Tensor::view(buffer, 0, {4, 4});
  Tensor c_over_a = Tensor::view(buffer, 8, {4, 4});  // a's last two rows and two more
  Tensor c_is_b = b;
  h.expect_fatal("matmul into a c over a's last rows" + on(d),
                 "kernels::matmul: c must not overlap a",
                 [&] { kernels::matmul(a, false, b, false, c_over_a); });
  h.expect_fatal("matmul into b" + on(d), "kernels::matmul: c must not overlap b",
                 [&] { kernels::matmul(a, false, b, true, c_is_b, 1.f); });
}

void overlap_cast(Harness& h, Device d) {
  const Tensor buffer({128}, DType::f32, d);
  const Tensor src = Tensor::view(buffer, 0, {64});
  Tensor shifted = Tensor::view(buffer, 32, {64});
  h.expect_fatal("cast into a shifted view of src" + on(d),
                 "kernels::cast: src and dst must not overlap unless they are one tensor",
                 [&] { kernels::cast(src, shifted); });
  Tensor rounded({64}, DType::f16, d), widened = src;
  h.expect_fatal("round_and_widen with widened = src" + on(d),
                 "kernels::round_and_widen: widened must not overlap src",
                 [&] { kernels::round_and_widen(src, rounded, widened); });
  if (d != Device::cpu) return;
  // Another width over the same bytes: an f16 dst over the f32 src, an f16 rounded over it.
  Tensor narrow = reinterpret(src, {64}, DType::f16);
  h.expect_fatal("cast f32 -> f16 over src's own bytes" + on(d),
                 "kernels::cast: src and dst must not overlap unless they are one tensor",
                 [&] { kernels::cast(src, narrow); });
  Tensor widened_apart({64}, DType::f32, d);
  h.expect_fatal("round_and_widen with rounded over src" + on(d),
                 "kernels::round_and_widen: rounded must not overlap src",
                 [&] { kernels::round_and_widen(src, narrow, widened_apart); });
  Tensor rounded_over_widened = reinterpret(widened_apart, {64}, DType::bf16);
  const Tensor src_apart({64}, DType::f32, d);
  h.expect_fatal("round_and_widen with rounded over widened" + on(d),
                 "kernels::round_and_widen: widened must not overlap rounded",
                 [&] { kernels::round_and_widen(src_apart, rounded_over_widened, widened_apart); });
}

void overlap_transpose(Harness& h, Device d) {
  const Tensor a({8, 8}, DType::f32, d);
  Tensor at = a;
  h.expect_fatal("transpose_columns in place" + on(d),
                 "kernels::transpose_columns: at must not overlap a",
                 [&] { kernels::transpose_columns(a, 0, at); });
}

void overlap_normalize(Harness& h, Device d) {
  if (d != Device::cpu) return;  // the f32 output over u8 input needs another width: host only
  const Tensor in({256}, DType::u8, d);
  Tensor out = reinterpret(in, {64}, DType::f32);
  const Tensor first = Tensor::view(in, 0, {64});
  h.expect_fatal("normalize_u8 into its input's bytes" + on(d),
                 "kernels::normalize_u8: out must not overlap in",
                 [&] { kernels::normalize_u8(first, out, 1.f / 255, 0.f); });
}

void overlap_softmax_xent(Harness& h, Device d) {
  const Tensor logits({4, 10}, DType::f32, d), labels({4}, DType::i32, d);
  Tensor dlogits = logits;
  h.expect_fatal("softmax_xent_forward_backward in place" + on(d),
                 "kernels::softmax_xent_forward_backward: dlogits must not overlap logits",
                 [&] { kernels::softmax_xent_forward_backward(logits, labels, dlogits, 1.f); });
}

void overlap_step_state(Harness& h, Device d) {
  const Tensor logits({4, 10}, DType::f32, d), labels({4}, DType::i32, d);
  Tensor dlogits = logits, state = kernels::step_state_tensor({}, d);
  h.expect_fatal("softmax_xent_step in place" + on(d),
                 "kernels::softmax_xent_step: dlogits must not overlap logits",
                 [&] { kernels::softmax_xent_step(logits, labels, dlogits, 1.f, state); });
}

void overlap_conv2d(Harness& h, Device d) {
  const kernels::Conv2dGeometry g{.channels = 1, .height = 4, .width = 4, .kernel = 3, .pad = 1};
  // col [9, 16]
  Tensor col({9, 16}, DType::f32, d);
  const Tensor x = Tensor::view(col, 0, {1, 1, 4, 4});
  h.expect_fatal("im2col into x's buffer" + on(d), "kernels::im2col: col must not overlap x",
                 [&] { kernels::im2col(x, g, col); });
  Tensor dx = Tensor::view(col, 128, {1, 1, 4, 4});
  h.expect_fatal("col2im into col's last rows" + on(d), "kernels::col2im: dx must not overlap col",
                 [&] { kernels::col2im(col, g, dx); });
  // C = 2 channels, B = 2 samples, P = 4 positions.
  const Tensor rows({2, 8}, DType::f32, d), bias({2}, DType::f32, d);
  Tensor samples = rows.reshaped({2, 2, 4});
  h.expect_fatal("channel_rows_to_samples in place" + on(d),
                 "kernels::channel_rows_to_samples: samples must not overlap rows",
                 [&] { kernels::channel_rows_to_samples(rows, bias, samples); });
  const Tensor in_samples({2, 2, 4}, DType::f32, d);
  Tensor out_rows = in_samples.reshaped({2, 8});
  h.expect_fatal("samples_to_channel_rows in place" + on(d),
                 "kernels::samples_to_channel_rows: rows must not overlap samples",
                 [&] { kernels::samples_to_channel_rows(in_samples, out_rows); });
  const Tensor dy({2, 8}, DType::f32, d);
  Tensor bias_grad = Tensor::view(dy, 6, {2});
  h.expect_fatal("channel_bias_backward into dy" + on(d),
                 "kernels::channel_bias_backward: bias_grad must not overlap dy",
                 [&] { kernels::channel_bias_backward(dy, bias_grad, false); });
  Tensor y({2, 8}, DType::f32, d);
  const Tensor bias_in_y = Tensor::view(y, 0, {2});
  h.expect_fatal("channel_bias_forward with its bias in y" + on(d),
                 "kernels::channel_bias_forward: y must not overlap bias",
                 [&] { kernels::channel_bias_forward(y, bias_in_y); });
}

void overlap_bias(Harness& h, Device d) {
  const Tensor dy({3, 5}, DType::f32, d);
  Tensor dbias = Tensor::view(dy, 10, {5});
  h.expect_fatal("bias_add_backward into dy's last row" + on(d),
                 "kernels::bias_add_backward: dbias must not overlap dy",
                 [&] { kernels::bias_add_backward(dy, dbias); });
  Tensor y({3, 5}, DType::f32, d);
  const Tensor bias_in_y = Tensor::view(y, 10, {5});
  h.expect_fatal("bias_add_forward with its bias in y" + on(d),
                 "kernels::bias_add_forward: y must not overlap bias",
                 [&] { kernels::bias_add_forward(y, bias_in_y); });
}

void overlap_pool2d(Harness& h, Device d) {
  const kernels::Pool2dGeometry g{
      .height = 4, .width = 4, .kernel_h = 2, .kernel_w = 2, .stride = 2};
  const Tensor x({1, 1, 4, 4}, DType::f32, d);
  Tensor y = Tensor::view(x, 12, {1, 1, 2, 2});
  h.expect_fatal("max_pool2d_forward into x's last row" + on(d),
                 "kernels::max_pool2d_forward: y must not overlap x",
                 [&] { kernels::max_pool2d_forward(x, g, y); });
  h.expect_fatal("avg_pool2d_forward into x's last row" + on(d),
                 "kernels::avg_pool2d_forward: y must not overlap x",
                 [&] { kernels::avg_pool2d_forward(x, g, y); });
  const Tensor dy({1, 1, 2, 2}, DType::f32, d);
  Tensor dx_is_x = x;
  h.expect_fatal("max_pool2d_backward into x" + on(d),
                 "kernels::max_pool2d_backward: dx must not overlap x",
                 [&] { kernels::max_pool2d_backward(x, g, dy, dx_is_x); });
  Tensor dx({1, 1, 4, 4}, DType::f32, d);
  const Tensor dy_in_dx = Tensor::view(dx, 0, {1, 1, 2, 2});
  h.expect_fatal("avg_pool2d_backward with dy in dx" + on(d),
                 "kernels::avg_pool2d_backward: dx must not overlap dy",
                 [&] { kernels::avg_pool2d_backward(g, dy_in_dx, dx); });
}

void overlap_batchnorm(Harness& h, Device d) {
  const Tensor x({2, 3, 4}, DType::f32, d), dy({2, 3, 4}, DType::f32, d);
  const Tensor mean({3}, DType::f32, d), invstd({3}, DType::f32, d);
  Tensor sums_in_x = Tensor::view(x, 0, {6});
  h.expect_fatal("batchnorm_sums into x" + on(d),
                 "kernels::batchnorm_sums: sums must not overlap x",
                 [&] { kernels::batchnorm_sums(x, 3, sums_in_x); });
  Tensor sums_in_dy = Tensor::view(dy, 18, {6});
  h.expect_fatal("batchnorm_backward_sums into dy" + on(d),
                 "kernels::batchnorm_backward_sums: sums must not overlap dy",
                 [&] { kernels::batchnorm_backward_sums(x, dy, 3, mean, invstd, sums_in_dy); });
  // Apply and dx are element-wise: in place, but not shifted, nor in another width.
  const Tensor scale({3}, DType::f32, d), shift({3}, DType::f32, d);
  const Tensor buffer({30}, DType::f32, d);
  const Tensor xb = Tensor::view(buffer, 0, {2, 3, 4});
  Tensor shifted = Tensor::view(buffer, 6, {2, 3, 4});
  h.expect_fatal("batchnorm_apply into a shifted view of x" + on(d),
                 "kernels::batchnorm_apply: y must be x or not overlap it",
                 [&] { kernels::batchnorm_apply(xb, 3, scale, shift, shifted); });
  const Tensor dy_coef({3}, DType::f32, d), x_coef({3}, DType::f32, d), bias({3}, DType::f32, d);
  h.expect_fatal("batchnorm_backward_dx into a shifted view of dy" + on(d),
                 "kernels::batchnorm_backward_dx: dx must be dy or not overlap it", [&] {
                   kernels::batchnorm_backward_dx(x, xb, 3, mean, dy_coef, x_coef, bias, shifted);
                 });
  if (d != Device::cpu) return;
  Tensor narrow = reinterpret(x, {2, 3, 4}, DType::f16);
  h.expect_fatal("batchnorm_apply f32 -> f16 over x's own bytes" + on(d),
                 "kernels::batchnorm_apply: y must be x or not overlap it",
                 [&] { kernels::batchnorm_apply(x, 3, scale, shift, narrow); });
}

// Element-wise ops may run in place (the output is the input itself), but not into a shifted
// view of it, nor in another width over its bytes.
void overlap_add(Harness& h, Device d) {
  const Tensor buffer({80}, DType::f32, d), b({64}, DType::f32, d);
  const Tensor a = Tensor::view(buffer, 0, {64});
  Tensor shifted = Tensor::view(buffer, 16, {64});
  h.expect_fatal("add into a shifted view of a" + on(d),
                 "kernels::add: y must be a or not overlap it",
                 [&] { kernels::add(a, b, shifted); });
  Tensor b_shifted = Tensor::view(buffer, 1, {64});
  h.expect_fatal("add into a shifted view of b" + on(d),
                 "kernels::add: y must be b or not overlap it",
                 [&] { kernels::add(b, a, b_shifted); });
}

void overlap_relu(Harness& h, Device d) {
  const Tensor buffer({80}, DType::f32, d), dy({64}, DType::f32, d);
  const Tensor x = Tensor::view(buffer, 0, {64});
  Tensor shifted = Tensor::view(buffer, 1, {64});
  h.expect_fatal("relu_forward into a shifted view of x" + on(d),
                 "kernels::relu_forward: y must be x or not overlap it",
                 [&] { kernels::relu_forward(x, shifted); });
  h.expect_fatal("relu_backward into a shifted view of y" + on(d),
                 "kernels::relu_backward: dx must be y or not overlap it",
                 [&] { kernels::relu_backward(x, dy, shifted); });
}

void overlap_gelu(Harness& h, Device d) {
  const Tensor buffer({80}, DType::f32, d), dy({64}, DType::f32, d);
  const Tensor x = Tensor::view(buffer, 0, {64});
  Tensor shifted = Tensor::view(buffer, 8, {64});
  h.expect_fatal("gelu_forward into a shifted view of x" + on(d),
                 "kernels::gelu_forward: y must be x or not overlap it",
                 [&] { kernels::gelu_forward(x, shifted); });
  Tensor dx_over_dy = Tensor::view(dy, 0, {32});
  const Tensor x32({32}, DType::f32, d);
  const Tensor dy_tail = Tensor::view(dy, 16, {32});
  h.expect_fatal("gelu_backward into a view before dy" + on(d),
                 "kernels::gelu_backward: dx must be dy or not overlap it",
                 [&] { kernels::gelu_backward(x32, dy_tail, dx_over_dy); });
}

void overlap_dropout(Harness& h, Device d) {
  const Tensor buffer({80}, DType::f32, d);
  const Tensor x = Tensor::view(buffer, 0, {64});
  Tensor shifted = Tensor::view(buffer, 4, {64});
  h.expect_fatal("dropout_forward into a shifted view of x" + on(d),
                 "kernels::dropout_forward: y must be x or not overlap it",
                 [&] { kernels::dropout_forward(x, 0.5f, {}, shifted); });
  h.expect_fatal("dropout_backward into a shifted view of dy" + on(d),
                 "kernels::dropout_backward: dx must be dy or not overlap it",
                 [&] { kernels::dropout_backward(x, 0.5f, {}, shifted); });
}

// An optimizer updates its buffers at one index each: no two of them may share a byte.
void overlap_sgd(Harness& h, Device d) {
  Tensor params({64}, DType::f32, d), momentum = params;
  const Tensor grads({64}, DType::f32, d);
  h.expect_fatal("sgd_update with params as its momentum buffer" + on(d),
                 "kernels::sgd_update: momentum_buffer must not overlap params", [&] {
                   kernels::sgd_update(params, grads, momentum, 0.1f, 0.9f, 0.f, false, false);
                 });
}

void overlap_adamw(Harness& h, Device d) {
  Tensor params({64}, DType::f32, d), state({96}, DType::f32, d);
  const Tensor grads({64}, DType::f32, d);
  Tensor exp_avg = Tensor::view(state, 0, {64}), exp_avg_sq = Tensor::view(state, 32, {64});
  h.expect_fatal("adamw_update with its moments in one buffer, overlapping" + on(d),
                 "kernels::adamw_update: exp_avg_sq must not overlap exp_avg",
                 [&] { kernels::adamw_update(params, grads, exp_avg, exp_avg_sq, nullptr, {}); });
}

struct OverlapCase {
  const char* header;
  void (*run)(Harness&, Device);
};

constexpr OverlapCase kOverlapCases[] = {
    {"adamw.hpp", overlap_adamw},
    {"add.hpp", overlap_add},
    {"dropout.hpp", overlap_dropout},
    {"gelu.hpp", overlap_gelu},
    {"relu.hpp", overlap_relu},
    {"sgd.hpp", overlap_sgd},
    {"batchnorm.hpp", overlap_batchnorm},
    {"bias.hpp", overlap_bias},
    {"cast.hpp", overlap_cast},
    {"conv2d.hpp", overlap_conv2d},
    {"matmul.hpp", overlap_matmul},
    {"normalize.hpp", overlap_normalize},
    {"pool2d.hpp", overlap_pool2d},
    {"softmax_xent.hpp", overlap_softmax_xent},
    {"step_state.hpp", overlap_step_state},
    {"transpose.hpp", overlap_transpose},
};

bool selects(const char* header, const OverlapCase& row) {
  return header == nullptr || std::strcmp(header, row.header) == 0;
}

}  // namespace

int overlap_rows(const char* header) {
  int rows = 0;
  for (const OverlapCase& row : kOverlapCases) rows += selects(header, row) ? 1 : 0;
  return rows;
}

void check_overlap_refusals(Harness& h, Device device, const char* header) {
  for (const OverlapCase& row : kOverlapCases)
    if (selects(header, row)) row.run(h, device);
}

}  // namespace mpt::gpu_test
