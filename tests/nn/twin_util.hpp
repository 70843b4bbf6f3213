// Helpers shared by the mixed-precision model tests: a 16-bit model and its f32 twin on the
// same (rounded) weights, stepped once on the same batch, with everything read back as doubles.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "core/tensor.hpp"
#include "kernels/softmax_xent.hpp"
#include "nn/nn.hpp"

namespace mpt::nn::test {

// A float tensor (f32 or 16-bit) as doubles.
inline std::vector<double> values_of(const Tensor& t) {
  std::vector<double> out(static_cast<std::size_t>(t.numel()));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const auto bits = [&] { return static_cast<const std::uint16_t*>(t.raw())[i]; };
    out[static_cast<std::size_t>(i)] = t.dtype() == DType::f32   ? t.data<float>()[i]
                                       : t.dtype() == DType::f16 ? half_bits_to_float(bits())
                                                                 : bf16_bits_to_float(bits());
  }
  return out;
}

inline double max_abs(const std::vector<double>& values) {
  double most = 0;
  for (double v : values) most = std::max(most, std::fabs(v));
  return most;
}

inline double max_abs_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double most = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) most = std::max(most, std::fabs(a[i] - b[i]));
  return most;
}

// One training forward and backward of the model SPEC stored in DTYPE and of its f32 twin,
// whose weights are the 16-bit model's working weights widened exactly. Labels are i % classes.
struct TwinStep {
  std::vector<double> logits, twin_logits;
  std::vector<std::string> names;                        // parameters, in layout order
  std::vector<std::vector<double>> grads, twin_grads;  // per parameter
  double twin_grad_scale = 0;                           // max |g| over every twin gradient
};

inline TwinStep step_with_f32_twin(const std::string& spec, const Shape& sample, int classes,
                                   DType dtype, const Tensor& x) {
  Model model = Model::build(spec, sample, classes, dtype);
  model.init_params(9);
  Model twin = Model::build(spec, sample, classes);
  const auto working = values_of(model.params());
  for (std::int64_t i = 0; i < twin.num_params(); ++i)
    twin.params().data<float>()[i] = static_cast<float>(working[static_cast<std::size_t>(i)]);
  const std::int64_t batch = x.dim(0);
  model.plan(batch);
  twin.plan(batch);
  Tensor labels({batch}, DType::i32);
  for (std::int64_t i = 0; i < batch; ++i)
    labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(i % classes);
  Tensor dlogits({batch, classes}, DType::f32), twin_dlogits({batch, classes}, DType::f32);
  TwinStep step;
  step.logits = values_of(model.forward(x, true));
  step.twin_logits = values_of(twin.forward(x, true));
  kernels::softmax_xent_forward_backward(model.forward(x, true), labels, dlogits, 1.f);
  kernels::softmax_xent_forward_backward(twin.forward(x, true), labels, twin_dlogits, 1.f);
  model.backward(dlogits);
  twin.backward(twin_dlogits);
  const auto params = model.named_working_params();
  const auto twin_params = twin.named_working_params();
  for (std::size_t p = 0; p < params.size(); ++p) {
    step.names.push_back(params[p].name);
    step.grads.push_back(values_of(params[p].grad));
    step.twin_grads.push_back(values_of(twin_params[p].grad));
  }
  step.twin_grad_scale = max_abs(values_of(twin.grads()));
  return step;
}

}  // namespace mpt::nn::test
