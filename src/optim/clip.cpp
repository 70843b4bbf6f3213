// Gradient clipping by global norm over the flat FP32 master gradients.
#include <algorithm>
#include <cmath>

#include "kernels/norm.hpp"
#include "kernels/scale.hpp"
#include "optim/optim.hpp"

namespace mpt::optim {

double clip_by_global_norm(Tensor& grads, double max_norm) {
  const double norm = std::sqrt(kernels::sum_of_squares(grads));
  // The 1e-6 is PyTorch's: it keeps a zero gradient from dividing by zero. Below the threshold
  // the gradients are left untouched (no multiply by a factor that rounds to 1).
  const double factor = std::min(1.0, max_norm / (norm + 1e-6));
  if (max_norm > 0 && factor < 1.0) kernels::scale_inplace(grads, static_cast<float>(factor));
  return norm;
}

}  // namespace mpt::optim
