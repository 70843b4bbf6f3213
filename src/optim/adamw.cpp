// AdamW optimizer: option checks, the FP32 moment buffers, the bias corrections, and the step
// through kernels::adamw_update.
#include "kernels/adamw.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include "core/error.hpp"
#include "optim/optim.hpp"

namespace mpt::optim {

void validate(const AdamwOptions& options) {
  MPT_REQUIRE(std::isfinite(options.lr) && options.lr >= 0,
              "--optimizer.lr is " + std::to_string(options.lr) + ", but must be >= 0",
              "use a learning rate such as 1e-3 for AdamW");
  MPT_REQUIRE(options.beta1 >= 0 && options.beta1 < 1,
              "--optimizer.beta1 is " + std::to_string(options.beta1) + ", but must be in [0, 1)",
              "the usual value is 0.9");
  MPT_REQUIRE(options.beta2 >= 0 && options.beta2 < 1,
              "--optimizer.beta2 is " + std::to_string(options.beta2) + ", but must be in [0, 1)",
              "the usual value is 0.999");
  MPT_REQUIRE(std::isfinite(options.eps) && options.eps > 0, "--optimizer.eps must be > 0",
              "the usual value is 1e-8");
  MPT_REQUIRE(
      std::isfinite(options.weight_decay) && options.weight_decay >= 0,
      "--optimizer.weight-decay is " + std::to_string(options.weight_decay) + ", but must be >= 0",
      "AdamW's decoupled decay is usually 0.01 to 0.1");
}

AdamW::AdamW(Tensor params, Tensor grads, AdamwOptions options, Tensor decay_mask)
    : params_(std::move(params)),
      grads_(std::move(grads)),
      decay_mask_(std::move(decay_mask)),
      options_(options) {
  validate(options_);
  if (!params_.defined() || !grads_.defined() || params_.dtype() != DType::f32 ||
      grads_.dtype() != DType::f32 || params_.numel() != grads_.numel())
    abort_job("optim::AdamW: params and grads must be f32 with the same number of elements");
  if (decay_mask_.defined() &&
      (decay_mask_.dtype() != DType::u8 || decay_mask_.numel() != params_.numel()))
    abort_job("optim::AdamW: the decay mask must be u8 with one element per parameter");
  // Zero-filled, as torch.zeros_like: the bias correction assumes m and v start at 0.
  exp_avg_ = Tensor({params_.numel()}, DType::f32, params_.device());
  exp_avg_sq_ = Tensor({params_.numel()}, DType::f32, params_.device());
}

void AdamW::step(float lr) {
  kernels::AdamwStep scalars;
  scalars.lr = lr;
  scalars.beta1 = options_.beta1;
  scalars.beta2 = options_.beta2;
  scalars.eps = options_.eps;
  scalars.weight_decay = options_.weight_decay;
  // In double from t: beta2^t stays accurate for the long runs where it approaches 0 slowly.
  const double t = static_cast<double>(steps_ + 1);
  scalars.bias_correction1 = 1.0 - std::pow(static_cast<double>(options_.beta1), t);
  scalars.bias_correction2 = 1.0 - std::pow(static_cast<double>(options_.beta2), t);
  const bool recast = rounded_.defined();
  kernels::adamw_update(params_, grads_, exp_avg_, exp_avg_sq_,
                        decay_mask_.defined() ? &decay_mask_ : nullptr, scalars,
                        recast ? &rounded_ : nullptr, recast ? &widened_ : nullptr);
  ++steps_;
}

void AdamW::step(const Tensor& control) {
  kernels::AdamwStep scalars;  // lr and the bias corrections come from CONTROL
  scalars.beta1 = options_.beta1;
  scalars.beta2 = options_.beta2;
  scalars.eps = options_.eps;
  scalars.weight_decay = options_.weight_decay;
  const bool recast = rounded_.defined();
  kernels::adamw_update(params_, grads_, exp_avg_, exp_avg_sq_,
                        decay_mask_.defined() ? &decay_mask_ : nullptr, scalars,
                        recast ? &rounded_ : nullptr, recast ? &widened_ : nullptr, &control);
}

std::vector<StateTensor> AdamW::state() {
  return {{"exp_avg", exp_avg_}, {"exp_avg_sq", exp_avg_sq_}};
}

Tensor decay_mask(std::int64_t numel, const std::vector<ParamRange>& params, bool decay_biases) {
  Tensor mask({numel}, DType::u8);
  std::uint8_t* out = mask.data<std::uint8_t>();
  std::fill_n(out, numel, std::uint8_t{1});
  if (decay_biases) return mask;
  const auto ends_with = [](const std::string& name, std::string_view suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  for (const auto& param : params) {
    const std::string& name = param.name;
    if (!ends_with(name, "/bias") && !ends_with(name, "/gamma") && !ends_with(name, "/beta"))
      continue;
    if (param.offset < 0 || param.numel < 0 || param.offset + param.numel > numel)
      abort_job("optim::decay_mask: parameter " + name + " lies outside the flat buffer");
    std::fill_n(out + param.offset, param.numel, std::uint8_t{0});
  }
  return mask;
}

}  // namespace mpt::optim
