// Dropout layer: the key of a step's masks from the model's StepContext, the masking in the
// dropout kernels, and a copy (or a cast, for a 16-bit model's f32 input) in evaluation.
#include "nn/dropout_layer.hpp"

#include "core/error.hpp"
#include "kernels/cast.hpp"
#include "nn/spec.hpp"

namespace mpt::nn {

namespace {
// Mixed into the run's seed so that dropout's Philox streams never coincide with the weight
// initialisation's, which use the seed itself as key.
constexpr std::uint64_t kDropoutDomain = 0x64726f706f757421ull;  // "dropout!"
// The global step takes the low 48 bits of the stream id, the layer index the high 16.
constexpr std::uint64_t kStepBits = 48;

void copy(const Tensor& from, Tensor& to) {
  if (from.raw() == to.raw() && from.dtype() == to.dtype()) return;
  kernels::cast(from, to);  // same dtype: a copy; else f32 input rounded into 16-bit storage
}
}  // namespace

DropoutLayer::DropoutLayer(std::string name, double rate, std::uint64_t layer_index)
    : Layer(std::move(name)), rate_(rate), layer_index_(layer_index) {
  if (!(rate >= 0 && rate < 1))
    abort_job("nn::DropoutLayer " + this->name() + ": rate must be in [0, 1)");
}

std::string DropoutLayer::spec() const { return "dropout:" + format_rate(rate_); }

double DropoutLayer::flops_per_sample(const Shape& input_shape) const {
  return static_cast<double>(shape_numel(input_shape));  // one multiply per element
}

kernels::DropoutKey DropoutLayer::key(const StepContext& context, std::int64_t features) const {
  kernels::DropoutKey key;
  key.seed = context.seed ^ kDropoutDomain;
  key.stream = (layer_index_ << kStepBits) | (context.step & ((std::uint64_t{1} << kStepBits) - 1));
  key.first_element = context.sample_offset * static_cast<std::uint64_t>(features);
  return key;
}

void DropoutLayer::forward(const Tensor& x, Tensor& y, bool training) {
  last_training_ = training && rate_ > 0;
  if (!last_training_) return copy(x, y);
  const std::int64_t features = x.dim(0) > 0 ? x.numel() / x.dim(0) : 0;
  static const StepContext no_context;  // a standalone layer: seed 0, step 0
  last_key_ = key(context_ ? *context_ : no_context, features);
  kernels::dropout_forward(x, static_cast<float>(rate_), last_key_, y);
}

void DropoutLayer::backward(const Tensor&, const Tensor&, const Tensor& dy, Tensor* dx) {
  if (!dx) return;
  if (!last_training_) return copy(dy, *dx);
  kernels::dropout_backward(dy, static_cast<float>(rate_), last_key_, *dx);
}

}  // namespace mpt::nn
