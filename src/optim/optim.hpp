// Optimizers over the model's flat parameter and gradient buffers. SGD only, for now.
#pragma once

#include <cstdint>

#include "core/tensor.hpp"

namespace mpt::optim {

struct SgdOptions {
  float lr = 0.05f;  // base learning rate; the schedule passes the current one to step()
  float momentum = 0.9f;
  float weight_decay = 0.f;  // L2, added to the gradient as in PyTorch (not decoupled)
  bool nesterov = false;
};

// Throws UserError naming the --optimizer.* option when OPTIONS are out of range, with the
// same rules as torch.optim.SGD (lr, momentum, weight decay >= 0; Nesterov needs momentum > 0).
void validate(const SgdOptions& options);

// torch.optim.SGD (dampening 0) over one flat buffer. PARAMS and GRADS are f32 tensors with the
// same number of elements; they are views the optimizer shares with the model.
class Sgd {
 public:
  // Validates OPTIONS and allocates the momentum buffer (zero) when momentum > 0.
  Sgd(Tensor params, Tensor grads, SgdOptions options);

  // One update with learning rate LR from grads(). The first step after construction (steps()
  // == 0) starts the momentum buffer from the gradient, as PyTorch does.
  void step(float lr);
  // Mixed precision: every step also writes ROUNDED = round(params) (f16/bf16) and WIDENED =
  // float(ROUNDED), fused into the update (the model's working and compute copies).
  void recast_into(Tensor rounded, Tensor widened) {
    rounded_ = std::move(rounded);
    widened_ = std::move(widened);
  }

  std::int64_t steps() const { return steps_; }
  // For a checkpoint restore: with steps > 0 the next step continues the restored buffer.
  void set_steps(std::int64_t steps) { steps_ = steps; }
  // Undefined when momentum == 0 (PyTorch keeps no buffer then).
  Tensor& momentum_buffer() { return momentum_buffer_; }
  const SgdOptions& options() const { return options_; }

 private:
  Tensor params_, grads_, momentum_buffer_;
  Tensor rounded_, widened_;  // undefined: no fused recast
  SgdOptions options_;
  std::int64_t steps_ = 0;
};

}  // namespace mpt::optim
