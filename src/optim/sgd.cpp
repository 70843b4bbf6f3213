// SGD optimizer: option checks, the momentum buffer, and the step through kernels::sgd_update.
#include "kernels/sgd.hpp"

#include <cmath>
#include <string>

#include "core/error.hpp"
#include "optim/optim.hpp"

namespace mpt::optim {

void validate(const SgdOptions& options) {
  MPT_REQUIRE(std::isfinite(options.lr) && options.lr >= 0,
              "--optimizer.lr is " + std::to_string(options.lr) + ", but must be >= 0",
              "use a learning rate such as 0.05");
  MPT_REQUIRE(std::isfinite(options.momentum) && options.momentum >= 0,
              "--optimizer.momentum is " + std::to_string(options.momentum) + ", but must be >= 0",
              "use 0 for plain SGD or a value such as 0.9");
  MPT_REQUIRE(
      std::isfinite(options.weight_decay) && options.weight_decay >= 0,
      "--optimizer.weight-decay is " + std::to_string(options.weight_decay) + ", but must be >= 0",
      "use 0 to disable weight decay, or a small value such as 5e-4");
  MPT_REQUIRE(!options.nesterov || options.momentum > 0,
              "--optimizer.nesterov needs a momentum > 0",
              "set --optimizer.momentum (for example 0.9) or turn Nesterov off");
}

Sgd::Sgd(Tensor params, Tensor grads, SgdOptions options)
    : params_(std::move(params)), grads_(std::move(grads)), options_(options) {
  validate(options_);
  if (!params_.defined() || !grads_.defined() || params_.dtype() != DType::f32 ||
      grads_.dtype() != DType::f32 || params_.numel() != grads_.numel())
    abort_job("optim::Sgd: params and grads must be f32 with the same number of elements");
  if (options_.momentum > 0)
    momentum_buffer_ = Tensor({params_.numel()}, DType::f32, params_.device());
}

void Sgd::step(float lr) {
  const bool recast = rounded_.defined();
  kernels::sgd_update(params_, grads_, momentum_buffer_, lr, options_.momentum,
                      options_.weight_decay, options_.nesterov, steps_ == 0,
                      recast ? &rounded_ : nullptr, recast ? &widened_ : nullptr);
  ++steps_;
}

void Sgd::step(const Tensor& control) {
  const bool recast = rounded_.defined();
  kernels::sgd_update(params_, grads_, momentum_buffer_, 0.f, options_.momentum,
                      options_.weight_decay, options_.nesterov, false, recast ? &rounded_ : nullptr,
                      recast ? &widened_ : nullptr, &control);
}

std::vector<StateTensor> Sgd::state() {
  if (!momentum_buffer_.defined()) return {};
  return {{"momentum_buffer", momentum_buffer_}};
}

}  // namespace mpt::optim
