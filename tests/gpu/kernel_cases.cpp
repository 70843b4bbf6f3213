// The kernel cases of kernel_cases.hpp: each runs kernels::<op> on host tensors and on their
// copies on the cuda device (the headers dispatch on the device), then compares.
#include "tests/gpu/kernel_cases.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/adamw.hpp"
#include "kernels/add.hpp"
#include "kernels/batchnorm.hpp"
#include "kernels/bias.hpp"
#include "kernels/cast.hpp"
#include "kernels/conv2d.hpp"
#include "kernels/copy.hpp"
#include "kernels/dropout.hpp"
#include "kernels/finite.hpp"
#include "kernels/gelu.hpp"
#include "kernels/graph.hpp"
#include "kernels/matmul.hpp"
#include "kernels/norm.hpp"
#include "kernels/normalize.hpp"
#include "kernels/pool2d.hpp"
#include "kernels/relu.hpp"
#include "kernels/scale.hpp"
#include "kernels/sgd.hpp"
#include "kernels/softmax_xent.hpp"
#include "kernels/staging.hpp"
#include "kernels/step_state.hpp"
#include "kernels/transpose.hpp"
#include "kernels/unscale_check.hpp"

namespace mpt::gpu_test {
namespace {

constexpr std::int64_t kN = 100003;  // several blocks and chunks, and a ragged tail
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr DType kFloatTypes[] = {DType::f32, DType::f16, DType::bf16};

Tensor dev(const Tensor& host) { return host.to(Device::cuda); }
std::string tag(DType dtype) { return std::string(" [") + dtype_name(dtype) + "]"; }

// WHAT gives FIRST's bits in 20 more runs of AGAIN: a device reduction that added its partial
// sums atomically, in the order they finish, would differ between some of them.
template <class Again>
void expect_same_bits(Harness& h, const std::string& what, double first, Again again) {
  bool same = true;
  double differing = first;
  for (int run = 0; run < 20 && same; ++run) {
    differing = again();
    same = std::memcmp(&differing, &first, sizeof first) == 0;
  }
  char detail[96];
  std::snprintf(detail, sizeof detail, "%.17g then %.17g", first, differing);
  h.expect(same, what + " gives the same bits in 20 runs", detail);
}

// Sprinkles zeros, signed zeros, Inf and NaN, which every elementwise kernel must pass through.
void plant_specials(Tensor& t) {
  const float specials[] = {0.f, -0.f, kInf, -kInf, kNaN, 1e-40f, -1e-40f, 7e4f, -7e4f};
  std::int64_t i = 0;
  for (float value : specials) set_element(t, (i += 977) % t.numel(), value);
}

// The fields of two StepStates that differ ("" when none): every field exact, except the two
// sums whose order differs between the twins, loss_sum (LOSS_TOL) and grad_sumsq (rtol 1e-12).
std::string state_differences(const kernels::StepState& got, const kernels::StepState& want,
                              Tolerance loss_tol) {
  std::string differ;
  const auto field = [&](const char* name, double a, double b, Tolerance tol) {
    const bool ok = a == b || (std::isnan(a) && std::isnan(b)) ||
                    std::abs(a - b) <= tol.atol + tol.rtol * std::abs(b);
    if (ok) return;
    char text[160];
    std::snprintf(text, sizeof text, " %s: got %.17g, want %.17g;", name, a, b);
    differ += text;
  };
  field("scale", got.scale, want.scale, kExact);
  field("growth_tracker", got.growth_tracker, want.growth_tracker, kExact);
  field("hysteresis_tracker", got.hysteresis_tracker, want.hysteresis_tracker, kExact);
  field("skipped_steps", got.skipped_steps, want.skipped_steps, kExact);
  field("applied_steps", got.applied_steps, want.applied_steps, kExact);
  field("applied_at_start", got.applied_at_start, want.applied_at_start, kExact);
  field("loss_sum", got.loss_sum, want.loss_sum, loss_tol);
  field("correct", got.correct, want.correct, kExact);
  field("grad_sumsq", got.grad_sumsq, want.grad_sumsq, {1e-12, 0});
  field("lr", got.lr, want.lr, kExact);
  field("bias_correction1", got.bias_correction1, want.bias_correction1, kExact);
  field("bias_correction2", got.bias_correction2, want.bias_correction2, kExact);
  field("old_scale", got.old_scale, want.old_scale, kExact);
  if (got.first_bad_row != want.first_bad_row)
    differ += " first_bad_row: got " + std::to_string(got.first_bad_row) + ", want " +
              std::to_string(want.first_bad_row) + ";";
  field("bad_label", got.bad_label, want.bad_label, kExact);
  field("found_inf", got.found_inf, want.found_inf, kExact);
  field("skip", got.skip, want.skip, kExact);
  field("failed_at_min_scale", got.failed_at_min_scale, want.failed_at_min_scale, kExact);
  return differ;
}

// One check that the device's state DEVICE_STATE equals the host's HOST_STATE.
void expect_same_state(Harness& h, const std::string& what, const Tensor& device_state,
                       const Tensor& host_state, Tolerance loss_tol = {1e-12, 0}) {
  const std::string differ = state_differences(kernels::read_step_state(device_state),
                                               kernels::read_step_state(host_state), loss_tol);
  h.expect(differ.empty(), what, differ);
}

// The same StepState on the host and on the device.
struct StatePair {
  Tensor host, device;
  explicit StatePair(const kernels::StepState& init)
      : host(kernels::step_state_tensor(init, Device::cpu)),
        device(kernels::step_state_tensor(init, Device::cuda)) {}
};

}  // namespace

void case_relu(Harness& h, Random& rng) {
  for (DType dtype : kFloatTypes) {
    Tensor x = rng.tensor({kN}, dtype);
    plant_specials(x);
    Tensor y(x.shape(), dtype), dx(x.shape(), dtype);
    Tensor dy = rng.tensor({kN}, dtype);
    Tensor xd = dev(x), yd(x.shape(), dtype, Device::cuda), dyd = dev(dy),
           dxd(x.shape(), dtype, Device::cuda);
    kernels::relu_forward(x, y);
    kernels::relu_forward(xd, yd);
    h.expect_same_bytes("relu_forward" + tag(dtype), yd, y);
    kernels::relu_backward(y, dy, dx);
    kernels::relu_backward(yd, dyd, dxd);
    h.expect_same_bytes("relu_backward" + tag(dtype), dxd, dx);
  }
}

void case_gelu(Harness& h, Random& rng) {
  Tensor x = rng.tensor({kN}, DType::f32, -6.f, 6.f), dy = rng.tensor({kN}, DType::f32);
  Tensor y(x.shape(), DType::f32), dx(x.shape(), DType::f32);
  Tensor xd = dev(x), dyd = dev(dy), yd(x.shape(), DType::f32, Device::cuda),
         dxd(x.shape(), DType::f32, Device::cuda);
  kernels::gelu_forward(x, y);
  kernels::gelu_forward(xd, yd);
  h.expect_close("gelu_forward", yd, y, kF32Transcendental);
  kernels::gelu_backward(x, dy, dx);
  kernels::gelu_backward(xd, dyd, dxd);
  h.expect_close("gelu_backward", dxd, dx, kF32Transcendental);
}

void case_bias(Harness& h, Random& rng) {
  // The large shapes split the column sum into many row chunks with partial column tiles.
  for (auto [batch, features] :
       {std::pair<std::int64_t, std::int64_t>{256, 1024}, {37, 10}, {8193, 1000}, {20000, 33}}) {
    const std::string dims = " [" + std::to_string(batch) + "x" + std::to_string(features) + "]";
    Tensor y = rng.tensor({batch, features}, DType::f32), b = rng.tensor({features}, DType::f32);
    Tensor yd = dev(y), bd = dev(b);
    kernels::bias_add_forward(y, b);
    kernels::bias_add_forward(yd, bd);
    h.expect_close("bias_add_forward" + dims, yd, y, kF32Elementwise);
    for (bool accumulate : {false, true}) {
      Tensor db = rng.tensor({features}, DType::f32);
      Tensor dbd = dev(db);
      // Relative to the sum of |dy| down the column: a long sum may cancel to near 0.
      Tensor size({features}, DType::f32);
      for (std::int64_t j = 0; j < features; ++j) {
        double total = std::abs(db.data<float>()[j]);
        for (std::int64_t row = 0; row < batch; ++row)
          total += std::abs(y.data<float>()[row * features + j]);
        size.data<float>()[j] = static_cast<float>(total);
      }
      kernels::bias_add_backward(y, db, accumulate);
      kernels::bias_add_backward(yd, dbd, accumulate);
      h.expect_close(std::string("bias_add_backward") + (accumulate ? " accumulate" : "") + dims,
                     dbd, db, kF32Reduction, &size);
    }
  }
}

void case_cast(Harness& h, Random& rng) {
  for (DType from : kFloatTypes)
    for (DType to : kFloatTypes) {
      Tensor src = rng.tensor({kN}, from, -7e4f, 7e4f);  // beyond fp16's range: Inf
      plant_specials(src);
      Tensor dst({kN}, to), dstd({kN}, to, Device::cuda);
      kernels::cast(src, dst);
      kernels::cast(dev(src), dstd);
      h.expect_close(std::string("cast ") + dtype_name(from) + " -> " + dtype_name(to), dstd, dst,
                     kExact);
    }
  for (DType to : {DType::f16, DType::bf16}) {
    Tensor src = rng.tensor({kN}, DType::f32, -100.f, 100.f);
    plant_specials(src);
    Tensor rounded({kN}, to), widened({kN}, DType::f32);
    Tensor roundedd({kN}, to, Device::cuda), widenedd({kN}, DType::f32, Device::cuda);
    kernels::round_and_widen(src, rounded, widened);
    kernels::round_and_widen(dev(src), roundedd, widenedd);
    h.expect_close("round_and_widen rounded" + tag(to), roundedd, rounded, kExact);
    h.expect_close("round_and_widen widened" + tag(to), widenedd, widened, kExact);
  }
  // Dispatch follows src: the other side's device is each twin's own check, one line and exit 3
  // rather than a write through the wrong kind of pointer.
  const Tensor src({64}, DType::f32), srcd({64}, DType::f32, Device::cuda);
  Tensor dst({64}, DType::f16), dstd({64}, DType::f16, Device::cuda);
  h.expect_fatal("cast host -> cuda dst", "kernels::cast: dst must be on the host",
                 [&] { kernels::cast(src, dstd); });
  h.expect_fatal("cast cuda -> host dst", "kernels::cuda::cast: dst must be f32, f16 or bf16 on the cuda device",
                 [&] { kernels::cast(srcd, dst); });
}

void case_copy(Harness& h, Random& rng) {
  Tensor x = rng.tensor({3, 1000, 7}, DType::f32);
  Tensor on_device(x.shape(), DType::f32, Device::cuda), back(x.shape(), DType::f32);
  kernels::copy(x, on_device);
  Tensor again = on_device.to(Device::cuda);  // device -> device
  kernels::copy(again, back);
  h.expect_same_bytes("copy host -> device -> device -> host", back, x);
  on_device.zero();
  h.expect_same_bytes("Tensor::zero on the device", on_device, Tensor(x.shape(), DType::f32));
}

void case_add(Harness& h, Random& rng) {
  // Every mix the trainer makes (16-bit gradients into an f32 accumulator and back, residual
  // branches), with the in-place form; f32 sums rounded once: the same values on both sides.
  const DType mixes[][3] = {{DType::f32, DType::f32, DType::f32},
                            {DType::f32, DType::f16, DType::f32},
                            {DType::bf16, DType::f32, DType::bf16},
                            {DType::f16, DType::f16, DType::f16},
                            {DType::bf16, DType::bf16, DType::f32}};
  for (const auto& mix : mixes) {
    Tensor a = rng.tensor({kN}, mix[0]), b = rng.tensor({kN}, mix[1]);
    plant_specials(a);
    Tensor y(a.shape(), mix[2]), yd(a.shape(), mix[2], Device::cuda);
    Tensor ad = dev(a), bd = dev(b);
    const std::string label = std::string("add") + tag(mix[0]) + tag(mix[1]) + " ->" + tag(mix[2]);
    kernels::add(a, b, y);
    kernels::add(ad, bd, yd);
    // Exact, signed zeros included; any NaN matches any NaN, since the GPU returns its one
    // canonical NaN where the host keeps the planted NaN's payload.
    h.expect_close(label, yd, y, kExact);
    if (mix[0] == mix[2]) {  // in place, as the accumulation runs
      kernels::add(a, b, a);
      kernels::add(ad, bd, ad);
      h.expect_close(label + " in place", ad, a, kExact);
    }
  }
}

void case_pool2d(Harness& h, Random& rng) {
  {
    // Dispatch follows x: the host backward refuses a cuda dx rather than write through it.
    const kernels::Pool2dGeometry g{4, 4, 2, 2, 2};
    const Tensor x({1, 1, 4, 4}, DType::f32), dy({1, 1, 2, 2}, DType::f32);
    Tensor dxd({1, 1, 4, 4}, DType::f32, Device::cuda);
    h.expect_fatal("max_pool2d_backward on the host into a cuda dx",
                   "kernels::max_pool2d_backward: dx must be on the host shaped like x, in its dtype",
                   [&] { kernels::max_pool2d_backward(x, g, dy, dxd); });
  }
  struct Geometry {
    std::int64_t batch, channels, height, width, kernel_h, kernel_w, stride;
  };
  const Geometry geometries[] = {
      {4, 16, 28, 28, 2, 2, 2},  // maxpool:2 on 28x28: disjoint windows, many blocks
      {3, 13, 7, 11, 2, 2, 2},   // non-square, odd: the last row and column are dropped
      {5, 7, 9, 13, 3, 3, 2},    // overlapping windows (stride < kernel)
      {2, 2, 8, 9, 3, 3, 2},     // overlapping, and the last row dropped
      {2, 3, 10, 7, 2, 3, 3},    // stride > kernel_h: rows no window covers; last column dropped
      {1, 5, 12, 12, 3, 2, 1},   // stride 1: an element in up to 6 windows
      {257, 1, 5, 6, 5, 6, 1},   // global pooling, 257 planes (not a multiple of a block)
  };
  for (const Geometry& s : geometries)
    for (bool ties : {false, true}) {
      kernels::Pool2dGeometry g;
      g.height = s.height;
      g.width = s.width;
      g.kernel_h = s.kernel_h;
      g.kernel_w = s.kernel_w;
      g.stride = s.stride;
      char label[160];
      std::snprintf(label, sizeof label,
                    " [%lldx%lld planes %lldx%lld, window %lldx%lld stride %lld%s]",
                    static_cast<long long>(s.batch), static_cast<long long>(s.channels),
                    static_cast<long long>(s.height), static_cast<long long>(s.width),
                    static_cast<long long>(s.kernel_h), static_cast<long long>(s.kernel_w),
                    static_cast<long long>(s.stride), ties ? ", ties" : "");
      Tensor x = rng.tensor({s.batch, s.channels, s.height, s.width}, DType::f32);
      // Ties: values in {-1, -0.5, -0, 0, 0.5, 1}, so most windows hold several maxima and the
      // first must win on both sides (-0 and +0 tie too).
      if (ties)
        for (std::int64_t i = 0; i < x.numel(); ++i)
          x.data<float>()[i] = std::round(x.data<float>()[i] * 2.f) / 2.f;
      // NaNs: at the first tap of the first window, two side by side (often in one window), and
      // a few scattered: a NaN wins the forward and takes the gradient in the backward.
      set_element(x, 0, kNaN);
      set_element(x, x.numel() / 2, kNaN);
      set_element(x, x.numel() / 2 + 1, kNaN);
      for (std::int64_t i = 0, at = 0; i < 5; ++i) set_element(x, (at += 977) % x.numel(), kNaN);
      const Shape out_shape{s.batch, s.channels, g.out_height(), g.out_width()};
      Tensor dy = rng.tensor(out_shape, DType::f32);
      set_element(dy, dy.numel() - 1, -0.f);  // a -0 gradient keeps its sign in disjoint windows
      Tensor xd = dev(x), dyd = dev(dy);
      Tensor y(out_shape, DType::f32), yd(out_shape, DType::f32, Device::cuda);
      Tensor dx(x.shape(), DType::f32), dxd(x.shape(), DType::f32, Device::cuda);
      // Max pooling selects and adds in the host's order: the same bytes, NaNs included.
      kernels::max_pool2d_forward(x, g, y);
      kernels::max_pool2d_forward(xd, g, yd);
      h.expect_same_bytes(std::string("max_pool2d_forward") + label, yd, y);
      dxd = dev(rng.tensor(x.shape(), DType::f32));  // garbage: the backward must overwrite it
      kernels::max_pool2d_backward(x, g, dy, dx);
      kernels::max_pool2d_backward(xd, g, dyd, dxd);
      h.expect_same_bytes(std::string("max_pool2d_backward") + label, dxd, dx);
      // Max pooling on 16-bit storage selects on the stored bits: the same bytes on both sides;
      // its backward where the windows are disjoint (the only 16-bit backward there is).
      for (const DType half : {DType::f16, DType::bf16}) {
        Tensor x16(x.shape(), half), dy16(out_shape, half);
        kernels::cast(x, x16);
        kernels::cast(dy, dy16);
        Tensor y16(out_shape, half), y16d(out_shape, half, Device::cuda);
        kernels::max_pool2d_forward(x16, g, y16);
        kernels::max_pool2d_forward(dev(x16), g, y16d);
        h.expect_same_bytes(std::string("max_pool2d_forward") + tag(half) + label, y16d, y16);
        if (g.stride != g.kernel_h || g.stride != g.kernel_w) continue;
        Tensor dx16(x.shape(), half), dx16d = dev(rng.tensor(x.shape(), half));
        kernels::max_pool2d_backward(x16, g, dy16, dx16);
        kernels::max_pool2d_backward(dev(x16), g, dev(dy16), dx16d);
        h.expect_same_bytes(std::string("max_pool2d_backward") + tag(half) + label, dx16d, dx16);
      }
      // Average pooling: the same sums in the same order; a NaN's payload may differ after
      // arithmetic, so NaN matches NaN (kExact), every other value bit for bit.
      kernels::avg_pool2d_forward(x, g, y);
      kernels::avg_pool2d_forward(xd, g, yd);
      h.expect_close(std::string("avg_pool2d_forward") + label, yd, y, kExact);
      dxd = dev(rng.tensor(x.shape(), DType::f32));
      kernels::avg_pool2d_backward(g, dy, dx);
      kernels::avg_pool2d_backward(g, dyd, dxd);
      h.expect_close(std::string("avg_pool2d_backward") + label, dxd, dx, kExact);
    }
  cudnn_pool2d_cases(h, rng);
}

void case_dropout(Harness& h, Random& rng) {
  // A plain key, and one with every high word set and a first element inside a Philox group.
  const kernels::DropoutKey keys[] = {{1234, 7, 0},
                                      {0x0123456789abcdefull, (1ull << 32) + 3, (5ull << 34) + 3}};
  // The masks themselves, against host::dropout_keeps: inputs never 0, so an output is 0
  // exactly where the element was dropped.
  for (const kernels::DropoutKey& key : keys)
    for (float p : {0.f, 0.1f, 0.5f, 0.9f}) {
      char label[160];
      std::snprintf(label, sizeof label, " [p=%g seed=%llx stream=%llx first=%llu]", p,
                    static_cast<unsigned long long>(key.seed),
                    static_cast<unsigned long long>(key.stream),
                    static_cast<unsigned long long>(key.first_element));
      Tensor x = rng.tensor({kN}, DType::f32, 0.5f, 1.5f);
      Tensor y({kN}, DType::f32), yd({kN}, DType::f32, Device::cuda);
      kernels::dropout_forward(x, p, key, y);
      kernels::dropout_forward(dev(x), p, key, yd);
      const Tensor got = host_f32(yd);
      std::int64_t wrong = 0, first_wrong = -1;
      for (std::int64_t i = 0; i < kN; ++i)
        if ((got.data<float>()[i] != 0.f) !=
                kernels::dropout_keeps(p, key, static_cast<std::uint64_t>(i)) &&
            wrong++ == 0)
          first_wrong = i;
      h.expect(
          wrong == 0, std::string("dropout_forward mask = dropout_keeps") + label,
          std::to_string(wrong) + " elements differ, the first at " + std::to_string(first_wrong));
      h.expect_same_bytes(std::string("dropout_forward") + label, yd, y);
    }
  // Every storage mix, with specials, forward, backward and in place: kExact, as in case_cast
  // (a NaN rounded into 16 bits may carry another payload).
  const DType mixes[][2] = {{DType::f32, DType::f32},
                            {DType::f16, DType::f16},
                            {DType::bf16, DType::bf16},
                            {DType::f16, DType::f32},
                            {DType::f32, DType::bf16}};
  for (const auto& mix : mixes)
    for (const kernels::DropoutKey& key : keys) {
      const float p = 0.3f;
      const std::string label = std::string(" [") + dtype_name(mix[0]) + " -> " +
                                dtype_name(mix[1]) + " first=" + std::to_string(key.first_element) +
                                "]";
      Tensor x = rng.tensor({kN}, mix[0], -10.f, 10.f);
      plant_specials(x);
      Tensor y({kN}, mix[1]), yd({kN}, mix[1], Device::cuda);
      Tensor xd = dev(x);
      kernels::dropout_forward(x, p, key, y);
      kernels::dropout_forward(xd, p, key, yd);
      h.expect_close("dropout_forward" + label, yd, y, kExact);
      kernels::dropout_backward(x, p, key, y);
      kernels::dropout_backward(xd, p, key, yd);
      h.expect_close("dropout_backward" + label, yd, y, kExact);
      if (mix[0] == mix[1]) {
        kernels::dropout_backward(x, p, key, x);
        kernels::dropout_backward(xd, p, key, xd);
        h.expect_close("dropout_backward in place" + label, xd, x, kExact);
      }
    }
  // Tensors smaller than a Philox group, starting and ending inside one or spanning two.
  for (std::uint64_t first : {0ull, 1ull, 2ull, 3ull})
    for (std::int64_t n : {1, 2, 3, 5}) {
      const kernels::DropoutKey key{99, 1, first};
      const std::string label =
          " [n=" + std::to_string(n) + " first=" + std::to_string(first) + "]";
      Tensor x = rng.tensor({n}, DType::f32, 0.5f, 1.5f);
      Tensor y({n}, DType::f32), yd({n}, DType::f32, Device::cuda);
      kernels::dropout_forward(x, 0.5f, key, y);
      kernels::dropout_forward(dev(x), 0.5f, key, yd);
      h.expect_same_bytes("dropout_forward tiny" + label, yd, y);
    }
}

void case_scale(Harness& h, Random& rng) {
  Tensor x = rng.tensor({kN}, DType::f32);
  plant_specials(x);
  Tensor xd = dev(x);
  kernels::scale_inplace(x, 0.125f / 3.f);
  kernels::scale_inplace(xd, 0.125f / 3.f);
  h.expect_close("scale_inplace", xd, x, kExact);
}

void case_normalize(Harness& h, Random& rng) {
  Tensor in({kN}, DType::u8);
  for (std::int64_t i = 0; i < kN; ++i)
    in.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(rng.next());
  Tensor out({kN}, DType::f32), outd({kN}, DType::f32, Device::cuda);
  kernels::normalize_u8(in, out, 1.f / (255.f * 0.3081f), -0.1307f / 0.3081f);
  kernels::normalize_u8(dev(in), outd, 1.f / (255.f * 0.3081f), -0.1307f / 0.3081f);
  h.expect_close("normalize_u8", outd, out, kF32Elementwise);
}

void case_finite(Harness& h, Random& rng) {
  for (DType dtype : kFloatTypes)
    for (float poison : {1.f, kInf, -kInf, kNaN}) {
      Tensor x = rng.tensor({kN}, dtype);
      set_element(x, kN - 1, poison);  // the very last element: the tail must be seen
      const bool want = kernels::all_finite(x);
      const bool got = kernels::all_finite(dev(x));
      h.expect(got == want && want == std::isfinite(poison),
               "all_finite" + tag(dtype) + " last=" + std::to_string(poison),
               "got " + std::to_string(got) + ", host " + std::to_string(want));
    }
}

void case_norm(Harness& h, Random& rng) {
  Tensor x = rng.tensor({1000003}, DType::f32, -3.f, 3.f);
  const Tensor xd = dev(x);
  const double first = kernels::sum_of_squares(xd);
  h.expect_near("sum_of_squares", first, kernels::sum_of_squares(x), {1e-12, 0});
  // The same bits every time: the clip factor of every rank depends on them.
  expect_same_bits(h, "sum_of_squares", first, [&] { return kernels::sum_of_squares(xd); });
}

namespace {

// COUNT gradient buckets of every dtype and of sizes from 1 to 3 chunks (more than one
// launch's worth), on the host and copied to the device, with f32 outputs on both: bucket
// EMPTY (if >= 0) holds no element, and with POISONED bucket 59 ends in an Inf.
struct UnscaleBuckets {
  std::vector<Tensor> in, out, device_in, device_out;
};
UnscaleBuckets unscale_buckets(Random& rng, int count, bool poisoned, int empty) {
  UnscaleBuckets buckets;
  for (int b = 0; b < count; ++b) {
    const DType dtype = kFloatTypes[b % 3];
    const std::int64_t n = b == empty ? 0 : 1 + (b * 977) % 9000;
    Tensor x = rng.tensor({n}, dtype, -100.f, 100.f);
    if (poisoned && b == 59) set_element(x, n - 1, kInf);
    buckets.in.push_back(x);
    buckets.out.emplace_back(Shape{n}, DType::f32);
    buckets.device_in.push_back(dev(x));
    buckets.device_out.emplace_back(Shape{n}, DType::f32, Device::cuda);
  }
  return buckets;
}

}  // namespace

void case_unscale_check(Harness& h, Random& rng) {
  // 60 buckets of every dtype and of sizes from 1 to 3 chunks: more than one launch's worth.
  for (bool poisoned : {false, true}) {
    auto [in, out, ind, outd] = unscale_buckets(rng, 60, poisoned, -1);
    const bool want = kernels::unscale_and_check(in, out, 1.f / 1024.f);
    const bool got = kernels::unscale_and_check(ind, outd, 1.f / 1024.f);
    const std::string label =
        std::string("unscale_and_check") + (poisoned ? " (Inf in the last bucket)" : "");
    h.expect(got == want && want == !poisoned, label + ": finite flag",
             "got " + std::to_string(got) + ", host " + std::to_string(want));
    bool same = true;
    for (std::size_t b = 0; b < in.size(); ++b) {
      const Tensor g = host_f32(outd[b]);
      const Tensor w = out[b];
      for (std::int64_t i = 0; i < w.numel() && same; ++i) {
        const float a = g.data<float>()[i], c = w.data<float>()[i];
        same = a == c || (std::isnan(a) && std::isnan(c));
      }
    }
    h.expect(same, label + ": unscaled values identical", "some bucket differs");
  }
  // Dispatch follows inputs[0]: a later bucket or an output on the other device is refused, on
  // the device before the flag is cleared or any bucket launched.
  {
    std::vector<Tensor> in{Tensor({64}, DType::f16), Tensor({64}, DType::f16, Device::cuda)};
    std::vector<Tensor> out{Tensor({64}, DType::f32), Tensor({64}, DType::f32)};
    h.expect_fatal("unscale_and_check with a cuda input after a host one",
                   "kernels::unscale_and_check: inputs must be f32, f16 or bf16 on the host",
                   [&] { kernels::unscale_and_check(in, out, 1.f); });
    std::vector<Tensor> ind{Tensor({64}, DType::f16, Device::cuda), Tensor({64}, DType::f16)};
    std::vector<Tensor> outd{Tensor({64}, DType::f32, Device::cuda),
                             Tensor({64}, DType::f32, Device::cuda)};
    h.expect_fatal("unscale_and_check with a host input after a cuda one",
                   "kernels::cuda::unscale_and_check: inputs must be f32, f16 or bf16 on the cuda device",
                   [&] { kernels::unscale_and_check(ind, outd, 1.f); });
    std::vector<Tensor> ind2{Tensor({64}, DType::f16, Device::cuda)};
    std::vector<Tensor> outh{Tensor({64}, DType::f32)};
    h.expect_fatal("unscale_and_check into a host output",
                   "kernels::cuda::unscale_and_check: outputs must be f32 on the cuda device",
                   [&] { kernels::unscale_and_check(ind2, outh, 1.f); });
  }
}

void case_softmax_xent(Harness& h, Random& rng) {
  {
    // Dispatch follows logits: the device twin refuses host labels or dlogits before it clears
    // its scratch.
    const Tensor logitsd({4, 10}, DType::f32, Device::cuda), labels({4}, DType::i32);
    Tensor dlogits({4, 10}, DType::f32);
    const Tensor labelsd = dev(labels);
    h.expect_fatal("softmax_xent_forward on the device with host labels",
                   "kernels::cuda::softmax_xent_forward: labels must be 1-D int32 on the cuda device",
                   [&] { kernels::softmax_xent_forward(logitsd, labels); });
    h.expect_fatal("softmax_xent_forward_backward on the device into a host dlogits",
                   "kernels::cuda::softmax_xent_forward_backward: dlogits must be f32 on the cuda device",
                   [&] { kernels::softmax_xent_forward_backward(logitsd, labelsd, dlogits, 1.f); });
  }
  // 20000 rows are more than blocks_for's cap of blocks holds at 8 rows a block on any GPU made
  // so far (8 blocks per SM): warps there take several rows of the grid-stride loop.
  for (auto [batch, classes] :
       {std::pair<std::int64_t, std::int64_t>{256, 10}, {67, 1000}, {20000, 10}}) {
    const std::string dims = " [" + std::to_string(batch) + "x" + std::to_string(classes) + "]";
    Tensor logits = rng.tensor({batch, classes}, DType::f32, -8.f, 8.f);
    // A tie for the maximum in row 0: both must pick the first.
    logits.data<float>()[3] = logits.data<float>()[7] = 20.f;
    Tensor labels({batch}, DType::i32);
    for (std::int64_t i = 0; i < batch; ++i)
      labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.next() % classes);
    labels.data<std::int32_t>()[0] = 3;
    labels.data<std::int32_t>()[1] = kernels::kIgnoreLabel;
    Tensor logitsd = dev(logits), labelsd = dev(labels);
    const auto want = kernels::softmax_xent_forward(logits, labels);
    const auto got = kernels::softmax_xent_forward(logitsd, labelsd);
    h.expect_near("softmax_xent_forward loss" + dims, got.loss_sum, want.loss_sum, {1e-6, 0});
    h.expect(got.correct == want.correct, "softmax_xent_forward correct" + dims,
             std::to_string(got.correct) + " vs " + std::to_string(want.correct));
    Tensor dl(logits.shape(), DType::f32), dld(logits.shape(), DType::f32, Device::cuda);
    const float grad_scale = 1024.f / static_cast<float>(batch);
    const auto want2 = kernels::softmax_xent_forward_backward(logits, labels, dl, grad_scale);
    const auto got2 = kernels::softmax_xent_forward_backward(logitsd, labelsd, dld, grad_scale);
    h.expect_near("softmax_xent_forward_backward loss" + dims, got2.loss_sum, want2.loss_sum,
                  {1e-6, 0});
    h.expect_close("softmax_xent_forward_backward dlogits" + dims, dld, dl,
                   {1e-5, 1e-6 * grad_scale});
    // The same loss bits every time: a resumed run's step records depend on them.
    expect_same_bits(h, "softmax_xent_forward loss" + dims, got.loss_sum,
                     [&] { return kernels::softmax_xent_forward(logitsd, labelsd).loss_sum; });
  }
  // NaN logits: the host starts from column 0 and moves on only to a greater value, so a NaN past
  // column 0 never wins (row 0: the maximum sits in the NaN's lane, 32 columns on) and a NaN in
  // column 0 wins its row (row 1). The losses are NaN; only the correct count can differ.
  {
    constexpr std::int64_t classes = 64;
    Tensor logits = rng.tensor({2, classes}, DType::f32, -8.f, 8.f);
    float* x = logits.data<float>();
    x[1] = kNaN;
    x[33] = 20.f;
    x[classes] = kNaN;
    x[classes + 5] = 20.f;
    Tensor labels({2}, DType::i32);
    labels.data<std::int32_t>()[0] = 33;
    labels.data<std::int32_t>()[1] = 0;
    const auto want = kernels::softmax_xent_forward(logits, labels);
    const auto got = kernels::softmax_xent_forward(dev(logits), dev(labels));
    h.expect(want.correct == 2, "softmax_xent_forward NaN rows: host argmax",
             std::to_string(want.correct) + " of 2 rows");
    h.expect(got.correct == want.correct, "softmax_xent_forward NaN rows: correct",
             std::to_string(got.correct) + " vs " + std::to_string(want.correct));
  }
}

void case_step_state(Harness& h, Random& rng) {
  {
    // The step's loss on the device refuses a host dlogits before it clears its scratch.
    const Tensor logitsd({4, 10}, DType::f32, Device::cuda);
    const Tensor labelsd = dev(Tensor({4}, DType::i32));
    Tensor dlogits({4, 10}, DType::f32);
    Tensor state = kernels::step_state_tensor(kernels::StepState{}, Device::cuda);
    h.expect_fatal("softmax_xent_step on the device into a host dlogits",
                   "kernels::cuda::softmax_xent_step: dlogits must be f32 on the cuda device",
                   [&] { kernels::softmax_xent_step(logitsd, labelsd, dlogits, 1.f, state); });
  }
  using kernels::StepState;
  // begin_step clears what the last step left and keeps the scaler's and the optimizer's fields.
  {
    StepState used;
    used.scale = 512;
    used.growth_tracker = 2;
    used.applied_steps = 17;
    used.lr = 0.25;
    used.loss_sum = 3.5;
    used.correct = 7;
    used.grad_sumsq = 12;
    used.first_bad_row = 4;
    used.bad_label = 99;
    used.found_inf = 1;
    used.skip = 1;
    StatePair state(used);
    kernels::begin_step(state.host);
    kernels::begin_step(state.device);
    expect_same_state(h, "begin_step", state.device, state.host);
  }

  // softmax_xent_step over two micro-batches: the gradient scale times the state's loss scale
  // (3072: the f32 product rounds), the sums added up. The tolerances of case_softmax_xent:
  // expf on the device and std::exp on the host differ in the last bit, so loss_sum agrees to
  // 1e-6, not to the 1e-12 of a mere change of summation order.
  {
    StepState init;
    init.scale = 3072;
    StatePair state(init);
    kernels::begin_step(state.host);
    kernels::begin_step(state.device);
    const float grad_scale = 1.f / (256 + 67);
    const float effective = grad_scale * 3072.f;
    // 20000 rows are more than blocks_for's cap of blocks holds at 8 rows a block on any GPU made
    // so far (8 blocks per SM): warps there take several rows of the grid-stride loop.
    for (auto [batch, classes] :
         {std::pair<std::int64_t, std::int64_t>{256, 10}, {67, 1000}, {20000, 10}}) {
      const std::string dims = " [" + std::to_string(batch) + "x" + std::to_string(classes) + "]";
      Tensor logits = rng.tensor({batch, classes}, DType::f32, -8.f, 8.f);
      logits.data<float>()[3] = logits.data<float>()[7] = 20.f;  // a tie: the first maximum wins
      Tensor labels({batch}, DType::i32);
      for (std::int64_t i = 0; i < batch; ++i)
        labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.next() % classes);
      labels.data<std::int32_t>()[0] = 3;
      labels.data<std::int32_t>()[1] = kernels::kIgnoreLabel;
      Tensor dl(logits.shape(), DType::f32), dld(logits.shape(), DType::f32, Device::cuda);
      kernels::softmax_xent_step(logits, labels, dl, grad_scale, state.host);
      kernels::softmax_xent_step(dev(logits), dev(labels), dld, grad_scale, state.device);
      h.expect_close("softmax_xent_step dlogits" + dims, dld, dl, {1e-5, 1e-6 * effective});
    }
    expect_same_state(h, "softmax_xent_step state after 2 micro-batches", state.device, state.host,
                      {1e-6, 0});
  }

  // Bad labels on the device (the host aborts instead): the first bad row of the first
  // micro-batch that has one is recorded with its label; bad rows add nothing and get zero
  // gradients, as ignored rows do on the host; a later micro-batch's bad row replaces nothing.
  {
    StepState init;
    init.scale = 8;
    StatePair state(init);
    kernels::begin_step(state.host);
    kernels::begin_step(state.device);
    constexpr std::int64_t batch = 40, classes = 10;
    const std::vector<std::pair<std::int64_t, std::int32_t>> bad[3] = {
        {}, {{12, -5}, {7, 10}, {30, 1000}}, {{2, 99}}};  // (row, label) per micro-batch
    for (int micro = 0; micro < 3; ++micro) {
      Tensor logits = rng.tensor({batch, classes}, DType::f32, -4.f, 4.f);
      Tensor labels({batch}, DType::i32);
      for (std::int64_t i = 0; i < batch; ++i)
        labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.next() % classes);
      Tensor ignored = labels.to(Device::cpu);
      for (auto [row, label] : bad[micro]) {
        labels.data<std::int32_t>()[row] = label;
        ignored.data<std::int32_t>()[row] = kernels::kIgnoreLabel;
      }
      Tensor dl(logits.shape(), DType::f32), dld(logits.shape(), DType::f32, Device::cuda);
      kernels::softmax_xent_step(logits, ignored, dl, 0.25f, state.host);
      kernels::softmax_xent_step(dev(logits), dev(labels), dld, 0.25f, state.device);
      h.expect_close(
          "softmax_xent_step dlogits, bad labels as ignored, micro-batch " + std::to_string(micro),
          dld, dl, {1e-5, 1e-6 * 0.25 * 8});
    }
    const StepState got = kernels::read_step_state(state.device);
    StepState want = kernels::read_step_state(state.host);
    h.expect(got.first_bad_row == 7 && got.bad_label == classes,
             "softmax_xent_step records the first bad row and its label",
             "got row " + std::to_string(got.first_bad_row) + " label " +
                 std::to_string(got.bad_label) + ", want row 7 label 10");
    want.first_bad_row = 7;
    want.bad_label = classes;
    const std::string differ = state_differences(got, want, {1e-6, 0});
    h.expect(differ.empty(), "softmax_xent_step: bad rows add nothing", differ);
  }

  // poison_if_nonfinite_loss: a NaN into element 0 exactly when the loss is not finite.
  for (DType dtype : kFloatTypes)
    for (double loss : {1.5, std::nan(""), HUGE_VAL, -HUGE_VAL}) {
      StepState init;
      init.loss_sum = loss;
      StatePair state(init);
      Tensor g = rng.tensor({1000}, dtype);
      Tensor gd = dev(g);
      kernels::poison_if_nonfinite_loss(g, state.host);
      kernels::poison_if_nonfinite_loss(gd, state.device);
      const std::string label =
          "poison_if_nonfinite_loss loss=" + std::to_string(loss) + tag(dtype);
      h.expect_same_bytes(label, gd, g);
      h.expect(std::isnan(host_f32(gd).data<float>()[0]) == !std::isfinite(loss),
               label + ": element 0 is NaN iff the loss is not finite", "it is not");
    }
  {
    StepState init;
    init.loss_sum = std::nan("");
    StatePair state(init);
    Tensor empty({0}, DType::f32, Device::cuda);
    kernels::poison_if_nonfinite_loss(empty, state.device);
    h.expect(empty.numel() == 0, "poison_if_nonfinite_loss on no elements writes nothing");
  }

  // unscale_and_check_step: 60 buckets and an empty one, with 1/scale from the state (1/3072
  // rounds to f32); found_inf is raised by an Inf and never cleared.
  for (auto [poisoned, before] : {std::pair<bool, std::int32_t>{false, 0}, {true, 0}, {false, 1}}) {
    StepState init;
    init.scale = 3072;
    init.found_inf = before;
    StatePair state(init);
    auto [in, out, ind, outd] = unscale_buckets(rng, 61, poisoned, 30);
    kernels::unscale_and_check_step(in, out, state.host);
    kernels::unscale_and_check_step(ind, outd, state.device);
    const std::string label = std::string("unscale_and_check_step") +
                              (poisoned ? " (Inf in the last bucket)" : "") +
                              (before ? " (found_inf already raised)" : "");
    expect_same_state(h, label + ": state", state.device, state.host);
    h.expect(kernels::read_step_state(state.device).found_inf == (poisoned || before ? 1 : 0),
             label + ": found_inf", "wrong flag");
    bool same = true;
    for (std::size_t b = 0; b < in.size(); ++b) {
      const Tensor g = host_f32(outd[b]);
      const Tensor& w = out[b];
      for (std::int64_t i = 0; i < w.numel() && same; ++i) {
        const float a = g.data<float>()[i], c = w.data<float>()[i];
        same = a == c || (std::isnan(a) && std::isnan(c));
      }
    }
    h.expect(same, label + ": unscaled values identical", "some bucket differs");
  }

  // decide_step over 50 steps with overflows at random, under four rules. Each step runs as the
  // trainer's after the all-reduce: begin_step, unscale_and_check_step (a clean or a poisoned
  // bucket sets found_inf), decide_step, clip_grad_norm. The schedule table has 4 rows; the
  // runs go past its end (the last row serves), and the first starts before its first row.
  // Its own seed, so that the coverage checks below do not depend on the cases run before.
  {
    Random overflows(20261201);
    constexpr std::int64_t kRows = 4;
    Tensor schedule({kRows, kernels::kScheduleColumns}, DType::f64);
    for (std::int64_t k = 0; k < kRows; ++k) {
      double* row = schedule.data<double>() + k * kernels::kScheduleColumns;
      row[kernels::kScheduleLr] = 0.1 / static_cast<double>(k + 3);
      row[kernels::kScheduleBias1] = 1 - std::pow(0.9, static_cast<double>(k + 1));
      row[kernels::kScheduleBias2] = 1 - std::pow(0.999, static_cast<double>(k + 1));
    }
    const Tensor scheduled = dev(schedule);
    kernels::ScaleRule dynamic;
    dynamic.growth_interval = 3;
    dynamic.hysteresis = 2;
    kernels::ScaleRule odd = dynamic;  // factors whose products round, and a reachable max_scale
    odd.growth_factor = 1.5;
    odd.backoff_factor = 0.3;
    odd.min_scale = 0.75;
    odd.max_scale = 100;
    odd.hysteresis = 1;
    kernels::ScaleRule fixed;
    fixed.dynamic = false;
    kernels::ScaleRule failing = dynamic;
    failing.fail_at_min_scale = true;
    struct Run {
      const char* name;
      kernels::ScaleRule rule;
      double init_scale;
      double applied_steps;  // applied_at_start is 10
      unsigned overflow_percent;
    };
    const Run runs[] = {
        {"dynamic, growth_interval 3, hysteresis 2", dynamic, 65536, 9, 30},
        {"dynamic, factors 1.5 and 0.3, scale in [0.75, 100]", odd, 80, 10, 25},
        {"static", fixed, 1024, 10, 30},
        {"fail_at_min_scale, min_scale 1", failing, 4, 10, 60},
    };
    for (const Run& run : runs) {
      StepState init;
      init.scale = run.init_scale;
      init.hysteresis_tracker = static_cast<double>(run.rule.hysteresis);
      init.applied_steps = run.applied_steps;
      init.applied_at_start = 10;
      StatePair state(init);
      std::string first_difference;
      double low = run.init_scale, high = run.init_scale;
      for (int step = 0; step < 50; ++step) {
        kernels::begin_step(state.host);
        kernels::begin_step(state.device);
        constexpr std::int64_t n = 513;
        Tensor bucket = overflows.tensor({n}, DType::f16, -100.f, 100.f);
        if (overflows.next() % 100 < run.overflow_percent)
          set_element(bucket, static_cast<std::int64_t>(overflows.next() % n),
                      step % 2 ? kInf : kNaN);
        std::vector<Tensor> in{bucket}, out{Tensor({n}, DType::f32)}, ind{dev(bucket)},
            outd{Tensor({n}, DType::f32, Device::cuda)};
        kernels::unscale_and_check_step(in, out, state.host);
        kernels::unscale_and_check_step(ind, outd, state.device);
        kernels::decide_step(state.host, run.rule, schedule);
        kernels::decide_step(state.device, run.rule, scheduled);
        kernels::clip_grad_norm(out[0], state.host, 0.5);
        kernels::clip_grad_norm(outd[0], state.device, 0.5);
        const StepState want = kernels::read_step_state(state.host);
        const std::string differ =
            state_differences(kernels::read_step_state(state.device), want, {1e-12, 0});
        if (!differ.empty() && first_difference.empty())
          first_difference = "step " + std::to_string(step) + ":" + differ;
        low = std::min(low, want.scale);
        high = std::max(high, want.scale);
      }
      h.expect(first_difference.empty(), std::string("decide_step, 50 steps [") + run.name + "]",
               first_difference);
      // The run covers what it is for: skips, updates past the table's end, and its rule's
      // scale moves (or none), seen in the host's trajectory.
      const StepState end = kernels::read_step_state(state.host);
      bool covered = end.skipped_steps > 0 && end.applied_steps - end.applied_at_start >= kRows;
      if (run.rule.dynamic) covered = covered && low < run.init_scale && high > low;
      if (!run.rule.dynamic) covered = covered && low == high;
      if (run.rule.fail_at_min_scale) covered = covered && end.failed_at_min_scale == 1;
      if (run.rule.max_scale == odd.max_scale)
        covered = covered && high == odd.max_scale && low == odd.min_scale;
      char detail[200];
      std::snprintf(detail, sizeof detail,
                    "skipped %g, applied %g, scale in [%g, %g], failed_at_min_scale %d",
                    end.skipped_steps, end.applied_steps - end.applied_at_start, low, high,
                    end.failed_at_min_scale);
      h.expect(covered, std::string("decide_step [") + run.name + "] covers its rule", detail);
    }
  }

  // clip_grad_norm: the sum of squares into the state and, above MAX_NORM (0: none), the
  // scaling by float(factor), which may round differently by one ulp when the sums differ; a
  // skipped step touches neither the gradients nor the state.
  for (std::int32_t skip : {0, 1})
    for (double max_norm : {0.0, 10.0, 1e4}) {
      StepState init;
      init.skip = skip;
      StatePair state(init);
      Tensor g = rng.tensor({kN}, DType::f32);  // norm about 182.6
      Tensor gd = dev(g);
      const Tensor original = g.to(Device::cpu);
      kernels::clip_grad_norm(g, state.host, max_norm);
      kernels::clip_grad_norm(gd, state.device, max_norm);
      const std::string label =
          "clip_grad_norm max_norm=" + std::to_string(max_norm) + (skip ? " (skipped)" : "");
      h.expect_close(label + ": grads", gd, g, {1e-6, 0});
      if (skip || max_norm != 10.0) h.expect_same_bytes(label + ": grads unchanged", gd, original);
      expect_same_state(h, label + ": state", state.device, state.host);
    }
  {
    StatePair state{StepState{}};
    Tensor empty({0}, DType::f32), emptyd({0}, DType::f32, Device::cuda);
    kernels::clip_grad_norm(empty, state.host, 1.0);
    kernels::clip_grad_norm(emptyd, state.device, 1.0);
    expect_same_state(h, "clip_grad_norm on no elements", state.device, state.host);
  }
}

void case_sgd(Harness& h, Random& rng) {
  struct Setting {
    float momentum;
    bool nesterov, first_step;
    DType recast;  // f32: no recast
  };
  for (const Setting s :
       {Setting{0.f, false, false, DType::f32}, Setting{0.9f, false, true, DType::f16},
        Setting{0.9f, true, false, DType::bf16}, Setting{0.9f, false, false, DType::f32}}) {
    const std::string label = "sgd_update momentum=" + std::to_string(s.momentum) +
                              (s.nesterov ? " nesterov" : "") + (s.first_step ? " first" : "") +
                              " recast=" + dtype_name(s.recast);
    Tensor p = rng.tensor({kN}, DType::f32), g = rng.tensor({kN}, DType::f32),
           buf = rng.tensor({kN}, DType::f32);
    Tensor pd = dev(p), gd = dev(g), bufd = dev(buf);
    const bool recast = s.recast != DType::f32;
    Tensor r({kN}, recast ? s.recast : DType::f16), w({kN}, DType::f32);
    Tensor rd({kN}, r.dtype(), Device::cuda), wd({kN}, DType::f32, Device::cuda);
    kernels::sgd_update(p, g, buf, 0.05f, s.momentum, 1e-4f, s.nesterov, s.first_step,
                        recast ? &r : nullptr, recast ? &w : nullptr);
    kernels::sgd_update(pd, gd, bufd, 0.05f, s.momentum, 1e-4f, s.nesterov, s.first_step,
                        recast ? &rd : nullptr, recast ? &wd : nullptr);
    h.expect_close(label + ": params", pd, p, kF32Elementwise);
    if (s.momentum != 0.f) h.expect_close(label + ": buffer", bufd, buf, kF32Elementwise);
    if (recast) {
      // The rounding of a master that differs in its last bit may differ by one 16-bit ulp.
      h.expect_close(label + ": working copy", rd, r, {s.recast == DType::f16 ? 1e-3 : 8e-3, 1e-7});
      h.expect_close(label + ": widened", wd, w, {s.recast == DType::f16 ? 1e-3 : 8e-3, 1e-7});
    }
  }
  // With a control state: its lr (0.03 in double) and first-step flag (applied_steps == 1) replace
  // the arguments, which are wrong on purpose here; a skipped step writes nothing at all.
  for (std::int32_t skip : {0, 1})
    for (double applied : {1.0, 4.0}) {
      const std::string label = std::string("sgd_update with control, applied_steps=") +
                                (applied == 1.0 ? "1" : "4") + (skip ? ", skipped" : "");
      kernels::StepState control;
      control.skip = skip;
      control.lr = 0.03;
      control.applied_steps = applied;
      const Tensor c = kernels::step_state_tensor(control, Device::cpu);
      const Tensor cd = kernels::step_state_tensor(control, Device::cuda);
      Tensor p = rng.tensor({kN}, DType::f32), g = rng.tensor({kN}, DType::f32),
             buf = rng.tensor({kN}, DType::f32);
      const Tensor p0 = p.to(Device::cpu), buf0 = buf.to(Device::cpu);
      Tensor pd = dev(p), gd = dev(g), bufd = dev(buf);
      Tensor r({kN}, DType::f16), w({kN}, DType::f32);
      Tensor rd({kN}, DType::f16, Device::cuda), wd({kN}, DType::f32, Device::cuda);
      kernels::sgd_update(p, g, buf, 1.f, 0.9f, 1e-4f, false, applied != 1.0, &r, &w, &c);
      kernels::sgd_update(pd, gd, bufd, 1.f, 0.9f, 1e-4f, false, applied != 1.0, &rd, &wd, &cd);
      h.expect_close(label + ": params", pd, p, kF32Elementwise);
      h.expect_close(label + ": buffer", bufd, buf, kF32Elementwise);
      h.expect_close(label + ": working copy", rd, r, {1e-3, 1e-7});
      h.expect_close(label + ": widened", wd, w, {1e-3, 1e-7});
      if (skip) {
        h.expect_same_bytes(label + ": params untouched", pd, p0);
        h.expect_same_bytes(label + ": buffer untouched", bufd, buf0);
        h.expect_same_bytes(label + ": working copy untouched", rd, Tensor({kN}, DType::f16));
      }
    }
  // Dispatch follows params: a working copy on the other device is refused.
  Tensor p({64}, DType::f32), g({64}, DType::f32), buf({64}, DType::f32);
  Tensor pd({64}, DType::f32, Device::cuda), gd({64}, DType::f32, Device::cuda),
      bufd({64}, DType::f32, Device::cuda);
  Tensor r({64}, DType::f16), w({64}, DType::f32);
  Tensor rd({64}, DType::f16, Device::cuda), wd({64}, DType::f32, Device::cuda);
  h.expect_fatal("sgd_update on the host into a cuda working copy",
                 "kernels::sgd_update: rounded must be on the host",
                 [&] { kernels::sgd_update(p, g, buf, 0.1f, 0.9f, 0.f, false, false, &rd, &w); });
  h.expect_fatal("sgd_update on the device into a host working copy",
                 "kernels::cuda::sgd_update: rounded must be f16 or bf16 on the cuda device",
                 [&] { kernels::sgd_update(pd, gd, bufd, 0.1f, 0.9f, 0.f, false, false, &r, &wd); });
  h.expect_fatal("sgd_update on the device with host grads",
                 "kernels::cuda::sgd_update: grads must be f32 on the cuda device",
                 [&] { kernels::sgd_update(pd, g, bufd, 0.1f, 0.9f, 0.f, false, false, nullptr, nullptr); });
}

void case_adamw(Harness& h, Random& rng) {
  for (bool masked : {false, true}) {
    const std::string label = std::string("adamw_update") + (masked ? " masked, recast bf16" : "");
    Tensor p = rng.tensor({kN}, DType::f32), g = rng.tensor({kN}, DType::f32);
    Tensor m = rng.tensor({kN}, DType::f32, -0.1f, 0.1f),
           v = rng.tensor({kN}, DType::f32, 0.f, 0.01f);
    Tensor mask({kN}, DType::u8);
    for (std::int64_t i = 0; i < kN; ++i)
      mask.data<std::uint8_t>()[i] = static_cast<std::uint8_t>(i % 3 != 0);
    Tensor pd = dev(p), gd = dev(g), md = dev(m), vd = dev(v), maskd = dev(mask);
    kernels::AdamwStep step;
    step.lr = 1e-3f;
    step.weight_decay = 0.01f;
    step.bias_correction1 = 1 - std::pow(0.9, 3);
    step.bias_correction2 = 1 - std::pow(0.999, 3);
    Tensor r({kN}, DType::bf16), w({kN}, DType::f32);
    Tensor rd({kN}, DType::bf16, Device::cuda), wd({kN}, DType::f32, Device::cuda);
    kernels::adamw_update(p, g, m, v, masked ? &mask : nullptr, step, masked ? &r : nullptr,
                          masked ? &w : nullptr);
    kernels::adamw_update(pd, gd, md, vd, masked ? &maskd : nullptr, step, masked ? &rd : nullptr,
                          masked ? &wd : nullptr);
    h.expect_close(label + ": params", pd, p, kF32Transcendental);
    h.expect_close(label + ": exp_avg", md, m, kF32Elementwise);
    h.expect_close(label + ": exp_avg_sq", vd, v, kF32Elementwise);
    if (masked) h.expect_close(label + ": working copy", rd, r, {8e-3, 1e-7});
  }
  // With a control state: its lr (1e-3 in double) and bias corrections (of step 3) replace
  // STEP's, which are wrong on purpose here; a skipped step writes nothing at all.
  for (std::int32_t skip : {0, 1}) {
    const std::string label = std::string("adamw_update with control") + (skip ? ", skipped" : "");
    kernels::StepState control;
    control.skip = skip;
    control.lr = 1e-3;
    control.bias_correction1 = 1 - std::pow(0.9, 3);
    control.bias_correction2 = 1 - std::pow(0.999, 3);
    const Tensor c = kernels::step_state_tensor(control, Device::cpu);
    const Tensor cd = kernels::step_state_tensor(control, Device::cuda);
    Tensor p = rng.tensor({kN}, DType::f32), g = rng.tensor({kN}, DType::f32);
    Tensor m = rng.tensor({kN}, DType::f32, -0.1f, 0.1f),
           v = rng.tensor({kN}, DType::f32, 0.f, 0.01f);
    const Tensor p0 = p.to(Device::cpu), m0 = m.to(Device::cpu), v0 = v.to(Device::cpu);
    Tensor pd = dev(p), gd = dev(g), md = dev(m), vd = dev(v);
    kernels::AdamwStep step;
    step.lr = 0.5f;
    step.weight_decay = 0.01f;
    Tensor r({kN}, DType::bf16), w({kN}, DType::f32);
    Tensor rd({kN}, DType::bf16, Device::cuda), wd({kN}, DType::f32, Device::cuda);
    kernels::adamw_update(p, g, m, v, nullptr, step, &r, &w, &c);
    kernels::adamw_update(pd, gd, md, vd, nullptr, step, &rd, &wd, &cd);
    h.expect_close(label + ": params", pd, p, kF32Transcendental);
    h.expect_close(label + ": exp_avg", md, m, kF32Elementwise);
    h.expect_close(label + ": exp_avg_sq", vd, v, kF32Elementwise);
    h.expect_close(label + ": working copy", rd, r, {8e-3, 1e-7});
    if (skip) {
      h.expect_same_bytes(label + ": params untouched", pd, p0);
      h.expect_same_bytes(label + ": exp_avg untouched", md, m0);
      h.expect_same_bytes(label + ": exp_avg_sq untouched", vd, v0);
      h.expect_same_bytes(label + ": working copy untouched", rd, Tensor({kN}, DType::bf16));
    }
  }
  // Dispatch follows params: a working copy on the other device is refused.
  Tensor p({64}, DType::f32), g({64}, DType::f32), m({64}, DType::f32), v({64}, DType::f32);
  Tensor r({64}, DType::bf16, Device::cuda), w({64}, DType::f32);
  kernels::AdamwStep step;
  h.expect_fatal("adamw_update on the host into a cuda working copy",
                 "kernels::adamw_update: rounded must be on the host",
                 [&] { kernels::adamw_update(p, g, m, v, nullptr, step, &r, &w); });
}

void case_matmul(Harness& h, Random& rng) {
  struct Shape3 {
    std::int64_t m, n, k;
  };
  for (const Shape3 s : {Shape3{256, 1024, 784}, Shape3{37, 10, 129}, Shape3{64, 64, 0}})
    for (DType ab : kFloatTypes)
      for (DType c_type : {DType::f32, ab})
        for (int transposes = 0; transposes < 4; ++transposes) {
          if (ab == DType::f32 && c_type != DType::f32) continue;
          const bool ta = transposes & 1, tb = transposes & 2;
          const float beta = transposes == 3 ? 1.f : 0.f;
          char label[160];
          std::snprintf(label, sizeof label, "matmul m=%lld n=%lld k=%lld %s%s %s -> %s beta=%g",
                        static_cast<long long>(s.m), static_cast<long long>(s.n),
                        static_cast<long long>(s.k), ta ? "A^T" : "A", tb ? "B^T" : "B",
                        dtype_name(ab), dtype_name(c_type), beta);
          Tensor a = rng.tensor(ta ? Shape{s.k, s.m} : Shape{s.m, s.k}, ab);
          Tensor b = rng.tensor(tb ? Shape{s.n, s.k} : Shape{s.k, s.n}, ab);
          Tensor c0 = rng.tensor({s.m, s.n}, c_type);
          // The host twin computes in f32 on the widened inputs; the size of the summed
          // products, sum |a||b|, sets the tolerance.
          Tensor a32 = host_f32(a), b32 = host_f32(b), c32 = host_f32(c0);
          Tensor abs_a = host_f32(a), abs_b = host_f32(b), size({s.m, s.n}, DType::f32);
          for (Tensor* t : {&abs_a, &abs_b})
            for (std::int64_t i = 0; i < t->numel(); ++i)
              t->data<float>()[i] = std::abs(t->data<float>()[i]);
          kernels::matmul(a32, ta, b32, tb, c32, beta);
          kernels::matmul(abs_a, ta, abs_b, tb, size, 0.f);
          if (beta != 0.f) {
            const Tensor c0_wide = host_f32(c0);
            for (std::int64_t i = 0; i < size.numel(); ++i)
              size.data<float>()[i] += std::abs(c0_wide.data<float>()[i]);
          }
          Tensor cd = dev(c0);
          kernels::matmul(dev(a), ta, dev(b), tb, cd, beta);
          const Tolerance tol = c_type == DType::f16    ? kMatmulF16Out
                                : c_type == DType::bf16 ? kMatmulBf16Out
                                                        : kMatmulF32;
          h.expect_close(label, cd, c32, tol, &size);
        }
}

void case_conv2d(Harness& h, Random& rng) {
  struct Case {
    std::int64_t channels, height, width, kernel, stride, pad, batch;
  };
  // 1x1, "same" 3x3 and 5x5 at stride 1 (the host's masked fast path), strided windows, 1x1
  // windows at stride 2 over pad 1 (some read only padding), one window covering the plane,
  // non-square planes, one or three samples, and a plane large enough for many blocks.
  const Case cases[] = {{1, 7, 5, 1, 1, 0, 1},  {5, 9, 6, 3, 1, 1, 3},  {5, 8, 8, 5, 1, 2, 1},
                        {5, 11, 8, 5, 2, 2, 3}, {1, 6, 10, 3, 2, 0, 3}, {5, 7, 9, 3, 2, 1, 1},
                        {5, 6, 7, 1, 2, 1, 3},  {1, 5, 5, 5, 1, 0, 3},  {5, 28, 28, 3, 1, 1, 3},
                        {1, 12, 9, 5, 2, 1, 1}};
  constexpr std::int64_t kOutChannels = 4;  // the GEMM output's channels
  for (const Case& s : cases) {
    kernels::Conv2dGeometry g;
    g.channels = s.channels;
    g.height = s.height;
    g.width = s.width;
    g.kernel = s.kernel;
    g.stride = s.stride;
    g.pad = s.pad;
    char dims[120];
    std::snprintf(dims, sizeof dims, " [B=%lld C=%lld %lldx%lld K=%lld S=%lld P=%lld]",
                  static_cast<long long>(s.batch), static_cast<long long>(s.channels),
                  static_cast<long long>(s.height), static_cast<long long>(s.width),
                  static_cast<long long>(s.kernel), static_cast<long long>(s.stride),
                  static_cast<long long>(s.pad));
    const std::int64_t positions = g.col_columns(), columns = s.batch * positions;
    const Shape out_shape{s.batch, kOutChannels, g.out_height(), g.out_width()};

    // im2col only copies (NaN and Inf included) and writes +0 for padding: the same bytes.
    Tensor x = rng.tensor({s.batch, s.channels, s.height, s.width}, DType::f32);
    plant_specials(x);
    Tensor col({g.col_rows(), columns}, DType::f32),
        cold({g.col_rows(), columns}, DType::f32, Device::cuda);
    kernels::im2col(x, g, col);
    kernels::im2col(dev(x), g, cold);
    h.expect_same_bytes(std::string("im2col") + dims, cold, col);
    // In 16 bits (the GEMM path that takes 16-bit operands): the same copy of the 16-bit bytes.
    for (const DType dtype : {DType::f16, DType::bf16}) {
      Tensor x16(x.shape(), dtype);
      kernels::cast(x, x16);
      Tensor col16({g.col_rows(), columns}, dtype),
          col16d({g.col_rows(), columns}, dtype, Device::cuda);
      kernels::im2col(x16, g, col16);
      kernels::im2col(dev(x16), g, col16d);
      h.expect_same_bytes(std::string("im2col ") + dtype_name(dtype) + dims, col16d, col16);
    }

    // col2im overwrites DX (both start from other values) and sums the taps in the host's
    // order: the same values.
    Tensor dcol = rng.tensor({g.col_rows(), columns}, DType::f32);
    Tensor dcold = dev(dcol);
    Tensor dx = rng.tensor(x.shape(), DType::f32);
    Tensor dxd = rng.tensor(x.shape(), DType::f32).to(Device::cuda);
    kernels::col2im(dcol, g, dx);
    kernels::col2im(dcold, g, dxd);
    h.expect_close(std::string("col2im") + dims, dxd, dx, kExact);

    // The GEMM output back to samples, with the bias and optionally the fused ReLU; the NaN at
    // rows[0, 0] must come out as NaN (sample 0, channel 0, position 0) with the ReLU too.
    Tensor rows = rng.tensor({kOutChannels, columns}, DType::f32);
    plant_specials(rows);
    set_element(rows, 0, kNaN);
    Tensor bias = rng.tensor({kOutChannels}, DType::f32);
    Tensor rowsd = dev(rows), biasd = dev(bias);
    for (bool relu : {false, true}) {
      Tensor y(out_shape, DType::f32), yd(out_shape, DType::f32, Device::cuda);
      kernels::channel_rows_to_samples(rows, bias, y, relu);
      kernels::channel_rows_to_samples(rowsd, biasd, yd, relu);
      const std::string label =
          std::string("channel_rows_to_samples") + (relu ? " relu" : "") + dims;
      h.expect_close(label, yd, y, kExact);
      h.expect(std::isnan(host_f32(yd).data<float>()[0]), label + ": a NaN stays", "got a number");
    }

    // Samples back to channel rows, plain or through the ReLU's backward on an output stored
    // in f32, f16 or bf16 (zeros, signed zeros, subnormals, Inf and NaN planted): a select.
    Tensor dy = rng.tensor(out_shape, DType::f32);
    Tensor dyd = dev(dy);
    for (int mode = 0; mode <= 3; ++mode) {
      Tensor relu_output, relu_outputd;
      if (mode > 0) {
        relu_output = rng.tensor(out_shape, kFloatTypes[mode - 1]);
        plant_specials(relu_output);
        relu_outputd = dev(relu_output);
      }
      Tensor r({kOutChannels, columns}, DType::f32),
          rd({kOutChannels, columns}, DType::f32, Device::cuda);
      kernels::samples_to_channel_rows(dy, r, mode > 0 ? &relu_output : nullptr);
      kernels::samples_to_channel_rows(dyd, rd, mode > 0 ? &relu_outputd : nullptr);
      h.expect_same_bytes(std::string("samples_to_channel_rows") +
                              (mode > 0 ? " relu" + tag(kFloatTypes[mode - 1]) : std::string()) +
                              dims,
                          rd, r);
    }

    // The per-channel bias of one sample [C, P] (one add per element: the same values).
    Tensor one = rng.tensor({kOutChannels, positions}, DType::f32);
    Tensor oned = dev(one);
    kernels::channel_bias_forward(one, bias);
    kernels::channel_bias_forward(oned, biasd);
    h.expect_close(std::string("channel_bias_forward") + dims, oned, one, kExact);
  }

  // The bias gradient: row sums of [C, P], from the conv's block rows up to one long row (many
  // terms per thread), and more channels than a typical grid row. Relative to sum |dy|.
  for (auto [channels, length] : {std::pair<std::int64_t, std::int64_t>{4, 3 * 35},
                                  {5, 1},
                                  {32, 3 * 784},
                                  {3, 100003},
                                  {70000, 7}}) {
    const std::string dims = " [" + std::to_string(channels) + "x" + std::to_string(length) + "]";
    Tensor dy = rng.tensor({channels, length}, DType::f32);
    Tensor dyd = dev(dy);
    for (bool accumulate : {false, true}) {
      Tensor db = rng.tensor({channels}, DType::f32);
      Tensor dbd = dev(db);
      Tensor size({channels}, DType::f32);
      for (std::int64_t c = 0; c < channels; ++c) {
        double total = std::abs(db.data<float>()[c]);
        for (std::int64_t p = 0; p < length; ++p)
          total += std::abs(dy.data<float>()[c * length + p]);
        size.data<float>()[c] = static_cast<float>(total);
      }
      kernels::channel_bias_backward(dy, db, accumulate);
      kernels::channel_bias_backward(dyd, dbd, accumulate);
      h.expect_close(
          std::string("channel_bias_backward") + (accumulate ? " accumulate" : "") + dims, dbd, db,
          kF32Reduction, &size);
    }
  }
  cudnn_conv2d_cases(h, rng);
}

void case_transpose(Harness& h, Random& rng) {
  struct Band {
    std::int64_t rows, columns, begin, count;
  };
  // Whole matrices and bands, ragged tiles, one column, and more row tiles than the grid's y
  // limit (65535 tiles of 32 rows), which the kernel covers by striding.
  for (const Band b : {Band{256, 1024, 0, 1024}, Band{37, 10, 3, 5}, Band{1000, 333, 300, 33},
                       Band{33, 65, 64, 1}, Band{2100000, 2, 1, 1}}) {
    char label[120];
    std::snprintf(label, sizeof label, "transpose_columns [%lldx%lld] columns %lld..%lld",
                  static_cast<long long>(b.rows), static_cast<long long>(b.columns),
                  static_cast<long long>(b.begin), static_cast<long long>(b.begin + b.count));
    Tensor a = rng.tensor({b.rows, b.columns}, DType::f32);
    plant_specials(a);
    Tensor at({b.count, b.rows}, DType::f32), atd({b.count, b.rows}, DType::f32, Device::cuda);
    kernels::transpose_columns(a, b.begin, at);
    kernels::transpose_columns(dev(a), b.begin, atd);
    h.expect_same_bytes(label, atd, at);
  }
}

void case_staging(Harness& h, Random& rng) {
  // The trainer's staged all-reduce in miniature, on the device and on the host: kernels write
  // the data, two ranges go down in two slots, the host changes the twin (the "all-reduce"),
  // the ranges go back up, and kernels after join() read them. Twice, reusing the twin. The
  // device tensor is large and scaled repeatedly first, so that a download that did not wait
  // for the compute stream, or a kernel that did not wait for the uploads, would see old values.
  constexpr std::int64_t kLarge = std::int64_t{1} << 23, kHalf = kLarge / 2 + 7;
  const Tensor x = rng.tensor({kLarge}, DType::f32);
  Tensor on_device = dev(x), on_host = x.to(Device::cpu);
  kernels::HostStaging device_staging(on_device, 2), host_staging(on_host, 2);
  const auto step = [&](Tensor& data, kernels::HostStaging& staging) {
    for (int i = 0; i < 16; ++i) kernels::scale_inplace(data, i % 2 ? 0.5f : 2.f);
    kernels::scale_inplace(data, 3.f);
    staging.download(0, kHalf, kLarge);
    staging.download(1, 0, kHalf);
    staging.wait_downloaded(1);
    staging.wait_downloaded(0);
    float* twin = static_cast<float*>(staging.host());
    for (std::int64_t i = 0; i < kLarge; ++i) twin[i] = twin[i] * 2.f + 1.f;
    staging.upload(0, kHalf);
    staging.upload(kHalf, kLarge);
    staging.join();
    kernels::scale_inplace(data, 0.25f);
  };
  for (int round = 1; round <= 2; ++round) {
    step(on_device, device_staging);
    step(on_host, host_staging);
    h.expect_same_bytes("HostStaging: round " + std::to_string(round) + ", device = host",
                        on_device, on_host);
    h.expect_same_bytes("HostStaging: round " + std::to_string(round) + ", the twins agree",
                        device_staging.host_tensor(), host_staging.host_tensor());
  }
}

void case_graph(Harness& h, Random& rng) {
  // A small step captured once and replayed twice against the same kernels run eagerly twice,
  // on equal inputs: x = x * c + y, then z = f16(x). Every kernel reads what the one before
  // wrote, so two replays differ from one, and a replay out of order would show.
  if (!kernels::graphs_supported()) {
    h.expect(true, "StepGraph: skipped, MPTRAIN_CUDA_LEGACY_STREAM=1 selects the legacy stream");
    return;
  }
  const Tensor x = rng.tensor({kN}, DType::f32), y = rng.tensor({kN}, DType::f32);
  constexpr float factor = 0.75f;
  const auto body = [](Tensor& xs, const Tensor& ys, Tensor& zs) {
    kernels::scale_inplace(xs, factor);
    kernels::add(xs, ys, xs);
    kernels::cast(xs, zs);
  };
  Tensor x_eager = dev(x), y_eager = dev(y), z_eager({kN}, DType::f16, Device::cuda);
  for (int i = 0; i < 2; ++i) body(x_eager, y_eager, z_eager);

  Tensor x_graph = dev(x), y_graph = dev(y), z_graph({kN}, DType::f16, Device::cuda);
  const Tensor z_before({kN}, DType::f16);  // zero-filled, as a new device tensor is
  kernels::StepGraph graph("case_graph");
  h.expect(!graph.captured(), "StepGraph: not captured before capture()");
  graph.capture([&] { body(x_graph, y_graph, z_graph); });
  h.expect(graph.captured(), "StepGraph: captured after capture()");
  // The synchronous copies of the comparisons run on the legacy stream: ordered after the
  // compute stream's work, so they see what every replay wrote.
  h.expect_same_bytes("StepGraph: capture runs nothing (x unchanged)", x_graph, x);
  h.expect_same_bytes("StepGraph: capture runs nothing (z unchanged)", z_graph, z_before);
  graph.replay();
  graph.replay();
  h.expect_same_bytes("StepGraph: 2 replays = 2 eager steps (x)", x_graph, x_eager);
  h.expect_same_bytes("StepGraph: 2 replays = 2 eager steps (z)", z_graph, z_eager);
  // An eager kernel after the replays is ordered after them too.
  kernels::scale_inplace(x_graph, factor);
  kernels::scale_inplace(x_eager, factor);
  h.expect_same_bytes("StepGraph: eager work after a replay", x_graph, x_eager);
}

namespace {

// The per-channel coefficient kernels, batchnorm_forward_coefs and batchnorm_backward_coefs, on
// C = 1, 7 and 300 (two blocks of threads): the SUMS come from a real batchnorm_sums of a batch
// near 100, over N*S = 20 elements per channel and over a single sample (count 1). With C > 1 the
// last channel holds one value repeated, chosen so that sum x^2 / count - mean^2 comes out below
// 0 from the f32 sums and max(0, .) clamps it; with C = 300 one sum of squares is NaN, which the
// host's std::max(0.0, NaN) turns into 0. Training then evaluation (on the running statistics the
// training call left), backward through batch statistics (count > 0) and not (count 0): every
// output, the running statistics updated in place included, must be the host twin's bytes.
void batchnorm_coefs_cases(Harness& h, Random& rng) {
  constexpr double kMomentum = 0.1, kEpsilon = 1e-5;  // nn::BatchNorm's
  constexpr float kOffset = 100.f;
  const std::int64_t channel_counts[] = {1, 7, 300};
  const std::pair<std::int64_t, std::int64_t> batches[] = {{4, 5}, {1, 1}};  // (N, S)
  for (const std::int64_t channels : channel_counts)
    for (const auto& [batch, plane] : batches) {
      const double count = static_cast<double>(batch * plane);
      char dims[80];
      std::snprintf(dims, sizeof dims, " [C=%lld count=%g]", static_cast<long long>(channels),
                    count);
      const Shape shape = plane == 1 ? Shape{batch, channels} : Shape{batch, channels, plane};
      Tensor x = rng.tensor(shape, DType::f32, kOffset - 1.f, kOffset + 1.f);
      // 2C + 1 as the layer's: the last one is the sample count, which batchnorm_sums writes
      // and the coefficients multiply by the plane.
      Tensor sums({2 * channels + 1}, DType::f32);
      float* hs = sums.data<float>();
      kernels::batchnorm_sums(x, channels, sums);
      if (channels > 1) {
        const std::int64_t flat = channels - 1;
        bool negative = false;
        for (int attempt = 0; attempt < 256 && !negative; ++attempt) {
          const float value = kOffset + 0.0137f * static_cast<float>(attempt);
          for (std::int64_t n = 0; n < batch; ++n)
            for (std::int64_t s = 0; s < plane; ++s)
              x.data<float>()[(n * channels + flat) * plane + s] = value;
          kernels::batchnorm_sums(x, channels, sums);
          const double m = hs[flat] / count;
          negative = hs[channels + flat] / count - m * m < 0;
        }
        h.expect(negative, std::string("batchnorm coefs: a constant channel whose variance ") +
                               "cancels below 0" + dims);
      }
      if (channels == 300) hs[channels + 5] = kNaN;
      const Tensor sumsd = dev(sums);

      const Tensor gamma = rng.tensor({channels}, DType::f32, 0.5f, 1.5f);
      const Tensor beta = rng.tensor({channels}, DType::f32, -0.5f, 0.5f);
      const Tensor gammad = dev(gamma), betad = dev(beta);
      Tensor running_mean = rng.tensor({channels}, DType::f32, kOffset - 0.5f, kOffset + 0.5f);
      Tensor running_var = rng.tensor({channels}, DType::f32, 0.1f, 2.f);
      Tensor running_meand = dev(running_mean), running_vard = dev(running_var);
      const Tensor dy = rng.tensor(shape, DType::f32);
      for (bool training : {true, false}) {
        const std::string mode = training ? " training" : " evaluation";
        // The device's outputs start as noise, so an element left unwritten shows.
        Tensor mean({channels}, DType::f32), invstd({channels}, DType::f32);
        Tensor scale({channels}, DType::f32), shift({channels}, DType::f32);
        Tensor meand = dev(rng.tensor({channels}, DType::f32));
        Tensor invstdd = dev(rng.tensor({channels}, DType::f32));
        Tensor scaled = dev(rng.tensor({channels}, DType::f32));
        Tensor shiftd = dev(rng.tensor({channels}, DType::f32));
        kernels::batchnorm_forward_coefs(sums, static_cast<double>(plane), training, gamma, beta,
                                         running_mean, running_var, kMomentum, kEpsilon, mean,
                                         invstd, scale, shift);
        kernels::batchnorm_forward_coefs(sumsd, static_cast<double>(plane), training, gammad, betad,
                                         running_meand,
                                         running_vard, kMomentum, kEpsilon, meand, invstdd, scaled,
                                         shiftd);
        const std::string forward = "batchnorm_forward_coefs" + mode + dims;
        h.expect_same_bytes(forward + " mean", meand, mean);
        h.expect_same_bytes(forward + " invstd", invstdd, invstd);
        h.expect_same_bytes(forward + " scale", scaled, scale);
        h.expect_same_bytes(forward + " shift", shiftd, shift);
        h.expect_same_bytes(forward + " running_mean (in place)", running_meand, running_mean);
        h.expect_same_bytes(forward + " running_var (in place)", running_vard, running_var);

        // Backward from real sums (sum dy, sum dy xhat) over the host's mean and invstd, given
        // to both twins, so that a forward mismatch does not spill over.
        // The forward's sample count stays after them (backward_sums writes only 2C).
        Tensor grad_sums({2 * channels + 1}, DType::f32);
        grad_sums.data<float>()[2 * channels] = static_cast<float>(batch);
        kernels::batchnorm_backward_sums(x, dy, channels, mean, invstd, grad_sums);
        h.expect(grad_sums.data<float>()[2 * channels] == static_cast<float>(batch),
                 std::string("batchnorm_backward_sums leaves the sample count") + dims);
        const Tensor grad_sumsd = dev(grad_sums), invstd_in = dev(invstd);
        for (double backward_plane : {static_cast<double>(plane), 0.0}) {
          Tensor dy_coef({channels}, DType::f32), x_coef({channels}, DType::f32),
              bias({channels}, DType::f32);
          Tensor dy_coefd = dev(rng.tensor({channels}, DType::f32));
          Tensor x_coefd = dev(rng.tensor({channels}, DType::f32));
          Tensor biasd = dev(rng.tensor({channels}, DType::f32));
          kernels::batchnorm_backward_coefs(grad_sums, backward_plane, gamma, invstd, dy_coef,
                                            x_coef, bias);
          kernels::batchnorm_backward_coefs(grad_sumsd, backward_plane, gammad, invstd_in, dy_coefd,
                                            x_coefd, biasd);
          char counts[40];
          std::snprintf(counts, sizeof counts, " backward count=%g",
                        backward_plane * static_cast<double>(batch));
          const std::string backward = "batchnorm_backward_coefs" + mode + counts + dims;
          h.expect_same_bytes(backward + " dy_coef", dy_coefd, dy_coef);
          h.expect_same_bytes(backward + " x_coef", x_coefd, x_coef);
          h.expect_same_bytes(backward + " bias", biasd, bias);
        }
      }

      // The count is SUMS[2C] times the plane, not this batch: after sync BN's sum over ranks it
      // is the global batch (here three ranks' worth), and 0 when no rank had a sample, where
      // training must leave the running statistics alone and normalise as evaluation does.
      for (const float samples : {3.f * static_cast<float>(batch), 0.f}) {
        Tensor pooled = sums.to(Device::cpu);
        pooled.data<float>()[2 * channels] = samples;
        const Tensor pooledd = dev(pooled);
        const Tensor rm_before = running_mean.to(Device::cpu), rv_before = running_var.to(Device::cpu);
        Tensor rm = rm_before.to(Device::cpu), rv = rv_before.to(Device::cpu);
        Tensor rmd = dev(rm_before), rvd = dev(rv_before);
        Tensor mean({channels}, DType::f32), invstd({channels}, DType::f32);
        Tensor scale({channels}, DType::f32), shift({channels}, DType::f32);
        Tensor meand = dev(mean), invstdd = dev(invstd), scaled = dev(scale), shiftd = dev(shift);
        kernels::batchnorm_forward_coefs(pooled, static_cast<double>(plane), true, gamma, beta, rm,
                                         rv, kMomentum, kEpsilon, mean, invstd, scale, shift);
        kernels::batchnorm_forward_coefs(pooledd, static_cast<double>(plane), true, gammad, betad,
                                         rmd, rvd, kMomentum, kEpsilon, meand, invstdd, scaled,
                                         shiftd);
        char what[80];
        std::snprintf(what, sizeof what, "batchnorm_forward_coefs with %g samples in the sums",
                      static_cast<double>(samples));
        const std::string forward = what + std::string(dims);
        h.expect_same_bytes(forward + " mean", meand, mean);
        h.expect_same_bytes(forward + " invstd", invstdd, invstd);
        h.expect_same_bytes(forward + " shift", shiftd, shift);
        h.expect_same_bytes(forward + " running_var (in place)", rvd, rv);
        const double pooled_count = static_cast<double>(samples) * static_cast<double>(plane);
        const float want_mean = samples > 0 ? static_cast<float>(hs[0] / pooled_count)
                                            : rm_before.data<float>()[0];
        h.expect(mean.data<float>()[0] == want_mean, forward + " mean[0] from that count");
        h.expect((samples > 0) != (std::memcmp(rm.raw(), rm_before.raw(), rm.size_bytes()) == 0),
                 forward + (samples > 0 ? " moves" : " keeps") + " the running mean");
        // Backward through that count: x_coef and bias divide by it (0 samples: both 0).
        Tensor grad_sums = pooled.to(Device::cpu);
        const Tensor grad_sumsd = dev(grad_sums);
        Tensor dy_coef({channels}, DType::f32), x_coef({channels}, DType::f32),
            bias({channels}, DType::f32);
        Tensor dy_coefd = dev(dy_coef), x_coefd = dev(x_coef), biasd = dev(bias);
        kernels::batchnorm_backward_coefs(grad_sums, static_cast<double>(plane), gamma, invstd,
                                          dy_coef, x_coef, bias);
        kernels::batchnorm_backward_coefs(grad_sumsd, static_cast<double>(plane), gammad,
                                          dev(invstd), dy_coefd, x_coefd, biasd);
        h.expect_same_bytes(forward + " backward x_coef", x_coefd, x_coef);
        h.expect_same_bytes(forward + " backward bias", biasd, bias);
        const double g0 = double{gamma.data<float>()[0]} * invstd.data<float>()[0];
        const float want_bias = samples > 0 ? static_cast<float>(-g0 * hs[0] / pooled_count) : 0.f;
        h.expect(bias.data<float>()[0] == want_bias, forward + " backward bias[0] from that count");
      }
    }
}

}  // namespace

void case_batchnorm(Harness& h, Random& rng) {
  {
    // Dispatch follows x: the host sums refuse a cuda output rather than write through it.
    const Tensor x({2, 3, 4, 4}, DType::f32);
    Tensor sumsd({7}, DType::f32, Device::cuda);
    h.expect_fatal("batchnorm_sums on the host into cuda sums",
                   "kernels::batchnorm_sums: sums must be f32 on the host",
                   [&] { kernels::batchnorm_sums(x, 3, sumsd); });
  }
  // BatchNorm1d ([N, C]: 1x1 planes) and 2d planes, one to eight samples, one to 16 channels,
  // the storage dtypes in a Latin square over (samples, channels, plane), the outputs in another.
  // The 64x64 planes give the device sums 3 or 8 slices a channel (4,096 elements and more per
  // slice; the 28x28 ones stay whole), 12,288 / 3 and 32,768 / 8 elements each.
  // Values near 100 with a spread of 1: E[x^2] - mean^2 cancels about four digits, the case the
  // layer's variance formula must survive. The coefficients are made as nn::BatchNorm makes
  // them, with batch statistics (training) and with running ones (inference). Then the kernels
  // that make those coefficients (batchnorm_coefs_cases).
  constexpr double kEpsilon = 1e-5;  // nn::BatchNorm's
  constexpr float kOffset = 100.f;
  const std::int64_t batches[] = {1, 3, 8}, channel_counts[] = {1, 5, 16};
  const std::pair<std::int64_t, std::int64_t> planes[] = {{1, 1}, {7, 5}, {28, 28}, {64, 64}};
  for (int bi = 0; bi < 3; ++bi)
    for (int ci = 0; ci < 3; ++ci)
      for (int pi = 0; pi < 4; ++pi) {
        const std::int64_t batch = batches[bi], channels = channel_counts[ci];
        const auto [height, width] = planes[pi];
        const std::int64_t plane = height * width, count = batch * plane;
        const DType in_type = kFloatTypes[(bi + ci + pi) % 3];
        const DType out_type = kFloatTypes[(bi + 2 * ci + pi + 1) % 3];
        const Shape shape =
            plane == 1 ? Shape{batch, channels} : Shape{batch, channels, height, width};
        char dims[120];
        std::snprintf(dims, sizeof dims, " [N=%lld C=%lld %lldx%lld %s -> %s]",
                      static_cast<long long>(batch), static_cast<long long>(channels),
                      static_cast<long long>(height), static_cast<long long>(width),
                      dtype_name(in_type), dtype_name(out_type));
        Tensor x = rng.tensor(shape, in_type, kOffset - 1.f, kOffset + 1.f);
        const Tensor x32 = host_f32(x);
        const float* xv = x32.data<float>();
        const Tensor xd = dev(x);
        auto at = [&](std::int64_t n, std::int64_t c, std::int64_t s) {
          return (n * channels + c) * plane + s;
        };

        // Statistics: sum relative to sum |x|, squares to themselves; then the variance the
        // layer derives from the device's sums against a two-pass float64 one.
        // The sample count rides after the 2C sums: exact, so any tolerance catches a wrong one.
        Tensor sums({2 * channels + 1}, DType::f32);
        Tensor sumsd = dev(rng.tensor({2 * channels + 1}, DType::f32));  // overwritten
        kernels::batchnorm_sums(x, channels, sums);
        kernels::batchnorm_sums(xd, channels, sumsd);
        h.expect(sums.data<float>()[2 * channels] == static_cast<float>(batch),
                 std::string("batchnorm_sums sample count on the host") + dims);
        Tensor size({2 * channels + 1}, DType::f32);
        size.data<float>()[2 * channels] = static_cast<float>(batch);
        std::vector<double> exact_var(channels), mean_square(channels);
        for (std::int64_t c = 0; c < channels; ++c) {
          double total = 0, squares = 0, centred = 0;
          for (std::int64_t n = 0; n < batch; ++n)
            for (std::int64_t s = 0; s < plane; ++s) {
              total += xv[at(n, c, s)];
              squares += double{xv[at(n, c, s)]} * xv[at(n, c, s)];
            }
          const double mean = total / count;
          for (std::int64_t n = 0; n < batch; ++n)
            for (std::int64_t s = 0; s < plane; ++s)
              centred += (xv[at(n, c, s)] - mean) * (xv[at(n, c, s)] - mean);
          size.data<float>()[c] = static_cast<float>(std::abs(total));  // x > 0: sum |x|
          size.data<float>()[channels + c] = static_cast<float>(squares);
          exact_var[c] = centred / count;
          mean_square[c] = squares / count;
        }
        h.expect_close(std::string("batchnorm_sums") + dims, sumsd, sums, kF32Reduction, &size);
        {
          const Tensor got = host_f32(sumsd);
          double worst = 0;
          bool ok = true;
          for (std::int64_t c = 0; c < channels; ++c) {
            const double mean = got.data<float>()[c] / static_cast<double>(count);
            const double var = std::max(
                0.0, got.data<float>()[channels + c] / static_cast<double>(count) - mean * mean);
            const double error = std::abs(var - exact_var[c]);
            worst = std::max(worst, error / mean_square[c]);
            ok = ok && error <= 1e-6 * mean_square[c];
          }
          char detail[120];
          std::snprintf(detail, sizeof detail, "variance off by %.3g * E[x^2]", worst);
          h.expect(ok, std::string("batchnorm_sums variance") + dims, detail);
        }

        // Per-channel coefficients as the layer makes them, training (batch statistics) or
        // inference (running statistics), from the host's sums.
        const float* hs = sums.data<float>();
        Tensor gamma = rng.tensor({channels}, DType::f32, 0.5f, 1.5f);
        Tensor beta = rng.tensor({channels}, DType::f32, -0.5f, 0.5f);
        Tensor running_mean = rng.tensor({channels}, DType::f32, kOffset - 0.5f, kOffset + 0.5f);
        Tensor running_var = rng.tensor({channels}, DType::f32, 0.1f, 2.f);
        Tensor dy = rng.tensor(shape, out_type);
        const Tensor dyd = dev(dy);
        for (bool training : {true, false}) {
          const std::string mode = training ? " training" : " inference";
          Tensor mean({channels}, DType::f32), invstd({channels}, DType::f32);
          Tensor scale({channels}, DType::f32), shift({channels}, DType::f32);
          for (std::int64_t c = 0; c < channels; ++c) {
            double m = running_mean.data<float>()[c], var = running_var.data<float>()[c];
            if (training) {
              m = hs[c] / static_cast<double>(count);
              var = std::max(0.0, hs[channels + c] / static_cast<double>(count) - m * m);
            }
            mean.data<float>()[c] = static_cast<float>(m);
            invstd.data<float>()[c] = static_cast<float>(1.0 / std::sqrt(var + kEpsilon));
            const double s = double{gamma.data<float>()[c]} * invstd.data<float>()[c];
            scale.data<float>()[c] = static_cast<float>(s);
            shift.data<float>()[c] =
                static_cast<float>(beta.data<float>()[c] - mean.data<float>()[c] * s);
          }
          const Tensor meand = dev(mean), invstdd = dev(invstd), scaled = dev(scale),
                       shiftd = dev(shift);

          // Apply: x * scale + shift rounded twice (no FMA), as the host: the same bytes, into
          // another dtype and in place.
          Tensor y(shape, out_type), yd = dev(rng.tensor(shape, out_type));
          kernels::batchnorm_apply(x, channels, scale, shift, y);
          kernels::batchnorm_apply(xd, channels, scaled, shiftd, yd);
          h.expect_close(std::string("batchnorm_apply") + mode + dims, yd, y, kExact);
          Tensor same(shape, in_type), in_place = dev(x);
          kernels::batchnorm_apply(x, channels, scale, shift, same);
          kernels::batchnorm_apply(in_place, channels, scaled, shiftd, in_place);
          h.expect_close(std::string("batchnorm_apply in place") + mode + dims, in_place, same,
                         kExact);

          // Backward sums: sum dy relative to sum |dy|, sum dy * xhat to sum |dy * xhat|.
          Tensor grad_sums({2 * channels}, DType::f32);
          Tensor grad_sumsd = dev(rng.tensor({2 * channels}, DType::f32));
          kernels::batchnorm_backward_sums(x, dy, channels, mean, invstd, grad_sums);
          kernels::batchnorm_backward_sums(xd, dyd, channels, meand, invstdd, grad_sumsd);
          const Tensor dy32 = host_f32(dy);
          Tensor grad_size({2 * channels}, DType::f32);
          for (std::int64_t c = 0; c < channels; ++c) {
            double total = 0, centred = 0;
            for (std::int64_t n = 0; n < batch; ++n)
              for (std::int64_t s = 0; s < plane; ++s) {
                const double g = dy32.data<float>()[at(n, c, s)];
                total += std::abs(g);
                centred += std::abs(g * (xv[at(n, c, s)] - double{mean.data<float>()[c]}));
              }
            grad_size.data<float>()[c] = static_cast<float>(total);
            grad_size.data<float>()[channels + c] =
                static_cast<float>(centred * invstd.data<float>()[c]);
          }
          h.expect_close(std::string("batchnorm_backward_sums") + mode + dims, grad_sumsd,
                         grad_sums, kF32Reduction, &grad_size);

          // Backward dx with the layer's coefficients (inference: only the dy term), from the
          // host's sums: every operation rounded as on the host, so the same bytes; in place too.
          Tensor dy_coef({channels}, DType::f32), x_coef({channels}, DType::f32),
              bias({channels}, DType::f32);
          for (std::int64_t c = 0; c < channels; ++c) {
            const double g = double{gamma.data<float>()[c]} * invstd.data<float>()[c];
            const float* gs = grad_sums.data<float>();
            dy_coef.data<float>()[c] = static_cast<float>(g);
            x_coef.data<float>()[c] =
                training
                    ? static_cast<float>(-g * invstd.data<float>()[c] * gs[channels + c] / count)
                    : 0.f;
            bias.data<float>()[c] = training ? static_cast<float>(-g * gs[c] / count) : 0.f;
          }
          const Tensor dy_coefd = dev(dy_coef), x_coefd = dev(x_coef), biasd = dev(bias);
          Tensor dx(shape, out_type), dxd = dev(rng.tensor(shape, out_type));
          kernels::batchnorm_backward_dx(x, dy, channels, mean, dy_coef, x_coef, bias, dx);
          kernels::batchnorm_backward_dx(xd, dyd, channels, meand, dy_coefd, x_coefd, biasd, dxd);
          h.expect_close(std::string("batchnorm_backward_dx") + mode + dims, dxd, dx, kExact);
          Tensor dx_in_place = dev(dy);
          kernels::batchnorm_backward_dx(xd, dx_in_place, channels, meand, dy_coefd, x_coefd, biasd,
                                         dx_in_place);
          h.expect_close(std::string("batchnorm_backward_dx in place") + mode + dims, dx_in_place,
                         dx, kExact);
        }
      }
  batchnorm_coefs_cases(h, rng);
}

}  // namespace mpt::gpu_test
