// Host sum of squares in double (see kernels/norm.hpp).
#include "kernels/norm.hpp"

#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

double sum_of_squares(const Tensor& x) {
  static const std::string label = "kernels::sum_of_squares";
  detail::require_host_f32("kernels::sum_of_squares", "x must be f32 on the host", x);
  const std::int64_t n = x.numel();
  if (n <= 0) return 0;
  const float* __restrict values = x.data<float>();
  // Chunks as in parallel_chunks, so the inner loop is a plain loop the compiler vectorises;
  // the chunk order of the reduction is fixed, so the result is deterministic for a backend.
  const std::int64_t chunks = (n + kChunkElements - 1) / kChunkElements;
  double total = 0;
  parallel_reduce(
      label, chunks,
      [=](const std::int64_t chunk, double& sum) {
        const std::int64_t begin = chunk * kChunkElements;
        const std::int64_t end = std::min(n, begin + kChunkElements);
        double local = 0;
        for (std::int64_t i = begin; i < end; ++i) {
          const double value = values[i];
          local += value * value;
        }
        sum += local;
      },
      total);
  return total;
}

}  // namespace mpt::kernels::host
