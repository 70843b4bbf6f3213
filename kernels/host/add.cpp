// Host elementwise add (see kernels/add.hpp), in blocks of f32.
#include "kernels/add.hpp"

#include <algorithm>

#include "kernels/host/float_io.hpp"
#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

void add(const Tensor& a, const Tensor& b, Tensor& y) {
  static const std::string label = "kernels::add";
  constexpr const char* op = "kernels::add";
  for (const Tensor* t : std::initializer_list<const Tensor*>{&a, &b, &y})
    kernels::detail::require(
        t->defined() && t->device() == Device::cpu && is_float_dtype(t->dtype()), op,
        "tensors must be f32, f16 or bf16 on the host", *t);
  kernels::detail::require_pair(a.numel() == b.numel(), op,
                                "a and b must have the same element count", a, b);
  kernels::detail::require_pair(a.numel() == y.numel(), op,
                                "a and y must have the same element count", a, y);
  const void* left = a.raw();
  const void* right = b.raw();
  void* out = y.raw();
  const DType a_type = a.dtype(), b_type = b.dtype(), y_type = y.dtype();
  parallel_chunks(label, a.numel(), [=](std::int64_t begin, std::int64_t end) {
    float a_block[kIoBlock], b_block[kIoBlock], y_block[kIoBlock];
    for (std::int64_t at = begin; at < end; at += kIoBlock) {
      const std::int64_t count = std::min(kIoBlock, end - at);
      const float* u = load_f32(left, a_type, at, count, a_block);
      const float* v = load_f32(right, b_type, at, count, b_block);
      float* w = store_target(out, y_type, at, y_block);
      for (std::int64_t i = 0; i < count; ++i) w[i] = u[i] + v[i];
      store_f32(out, y_type, at, count, w);
    }
  });
}

}  // namespace mpt::kernels::host
