// Host in-place scaling (see kernels/scale.hpp).
#include "kernels/scale.hpp"

#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

void scale_inplace(Tensor& x, float factor) {
  static const std::string label = "kernels::scale_inplace";
  detail::require_host_f32("kernels::scale_inplace", "x must be f32 on the host", x);
  float* __restrict values = x.data<float>();
  parallel_chunks(label, x.numel(), [=](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) values[i] *= factor;
  });
}

}  // namespace mpt::kernels::host
