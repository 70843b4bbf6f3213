// Dense layer: forward and backward through the matmul and bias kernels.
#include "nn/dense.hpp"

#include <cmath>

#include "core/error.hpp"
#include "kernels/bias.hpp"
#include "kernels/matmul.hpp"

namespace mpt::nn {

namespace {
constexpr std::size_t kWeight = 0, kBias = 1;
}

Dense::Dense(std::string name, std::int64_t in_features, std::int64_t out_features)
    : Layer(std::move(name)), in_features_(in_features), out_features_(out_features) {
  if (in_features <= 0 || out_features <= 0)
    abort_job("nn::Dense: feature counts must be positive, got in=" + std::to_string(in_features) +
              " out=" + std::to_string(out_features));
}

std::string Dense::spec() const { return "dense:" + std::to_string(out_features_); }

Shape Dense::output_shape(const Shape& input_shape) const {
  if (shape_numel(input_shape) != in_features_)
    abort_job("nn::Dense " + name() + ": expects " + std::to_string(in_features_) +
              " input features, got sample shape " + shape_to_string(input_shape));
  return {out_features_};
}

double Dense::flops_per_sample(const Shape&) const {
  // A multiply-add per weight, plus the bias add.
  return 2.0 * static_cast<double>(in_features_) * static_cast<double>(out_features_) +
         static_cast<double>(out_features_);
}

std::vector<ParamSpec> Dense::param_specs() const {
  // nn.Linear's reset_parameters: kaiming_uniform_(a=sqrt(5)) on the weight reduces to
  // U(-1/sqrt(in), 1/sqrt(in)), and the bias uses the same bound.
  const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(in_features_)));
  return {{"weight", {out_features_, in_features_}, bound}, {"bias", {out_features_}, bound}};
}

void Dense::forward(const Tensor& x, Tensor& y, bool) {
  // y[b, out] = x[b, in] · W[out, in]ᵀ, then + bias. A sum post-op could fold the bias into the
  // matmul, but the separate pass over a [b, out] tile is cheap next to the matmul.
  kernels::matmul(x, false, param_value(kWeight), true, y);
  kernels::bias_add_forward(y, param_value(kBias));
}

void Dense::backward(const Tensor& x, const Tensor&, const Tensor& dy, Tensor* dx) {
  // dW[out, in] = dyᵀ[out, b] · x[b, in]; db = column sums of dy; dx[b, in] = dy · W.
  kernels::matmul(dy, true, x, false, param_grad(kWeight));
  kernels::bias_add_backward(dy, param_grad(kBias));
  if (dx) kernels::matmul(dy, false, param_value(kWeight), false, *dx);
}

}  // namespace mpt::nn
