// Host dropout (see kernels/dropout.hpp): one Philox call per four elements, the draw compared
// with an integer threshold, the scale applied in f32 and rounded once into 16-bit storage.
#include "kernels/dropout.hpp"

#include <algorithm>

#include "core/random.hpp"
#include "kernels/host/float_io.hpp"
#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

namespace {

// Draws >= this are kept: P * 2^32, computed in double so that P = 0 keeps every element.
std::uint64_t threshold(float p) {
  return static_cast<std::uint64_t>(static_cast<double>(p) * 4294967296.0);
}

std::array<std::uint32_t, 4> draws(const DropoutKey& key, std::uint64_t group) {
  return philox4x32(
      {static_cast<std::uint32_t>(group), static_cast<std::uint32_t>(group >> 32),
       static_cast<std::uint32_t>(key.stream), static_cast<std::uint32_t>(key.stream >> 32)},
      {static_cast<std::uint32_t>(key.seed), static_cast<std::uint32_t>(key.seed >> 32)});
}

void check(const char* op, float p, const Tensor& in, const Tensor& out) {
  kernels::detail::require(in.defined() && in.device() == Device::cpu && is_float_dtype(in.dtype()),
                           op, "input must be f32, f16 or bf16 on the host", in);
  kernels::detail::require(
      out.defined() && out.device() == Device::cpu && is_float_dtype(out.dtype()), op,
      "output must be f32, f16 or bf16 on the host", out);
  kernels::detail::require_pair(in.numel() == out.numel(), op,
                                "tensors must have the same element count", in, out);
  kernels::detail::require(p >= 0.f && p < 1.f, op, "drop probability must be in [0, 1)", in);
}

// OUT = IN * scale where kept, else 0, over the whole tensor.
void masked_scale(const char* op, const std::string& label, const Tensor& in_tensor, float p,
                  const DropoutKey& key, Tensor& out_tensor) {
  check(op, p, in_tensor, out_tensor);
  const void* in = in_tensor.raw();
  void* out = out_tensor.raw();
  const DType in_type = in_tensor.dtype(), out_type = out_tensor.dtype();
  const std::uint64_t cut = threshold(p);
  const float scale = 1.f / (1.f - p);
  const DropoutKey k = key;
  parallel_chunks(label, in_tensor.numel(), [=](std::int64_t begin, std::int64_t end) {
    float in_block[kIoBlock], out_block[kIoBlock];
    std::uint64_t group = ~std::uint64_t{0};
    std::array<std::uint32_t, 4> lanes{};
    for (std::int64_t at = begin; at < end; at += kIoBlock) {
      const std::int64_t count = std::min(kIoBlock, end - at);
      const float* v = load_f32(in, in_type, at, count, in_block);
      float* w = store_target(out, out_type, at, out_block);
      for (std::int64_t i = 0; i < count; ++i) {
        const std::uint64_t element = k.first_element + static_cast<std::uint64_t>(at + i);
        if (element / 4 != group) {
          group = element / 4;
          lanes = draws(k, group);
        }
        w[i] = lanes[element % 4] >= cut ? v[i] * scale : 0.f;
      }
      store_f32(out, out_type, at, count, w);
    }
  });
}

}  // namespace

void dropout_forward(const Tensor& x, float p, const DropoutKey& key, Tensor& y) {
  static const std::string label = "kernels::dropout_forward";
  masked_scale("kernels::dropout_forward", label, x, p, key, y);
}

void dropout_backward(const Tensor& dy, float p, const DropoutKey& key, Tensor& dx) {
  static const std::string label = "kernels::dropout_backward";
  masked_scale("kernels::dropout_backward", label, dy, p, key, dx);
}

bool dropout_keeps(float p, const DropoutKey& key, std::uint64_t element) {
  const std::uint64_t e = key.first_element + element;
  return draws(key, e / 4)[e % 4] >= threshold(p);
}

}  // namespace mpt::kernels::host
