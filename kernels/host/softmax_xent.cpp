// Host softmax cross-entropy, forward and fused forward+backward (see kernels/softmax_xent.hpp).
// One parallel reduction over rows; each row is read once for its maximum and once for exp.
#include "kernels/softmax_xent.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "core/error.hpp"
#include "kernels/host/parallel.hpp"

namespace mpt::kernels::host {

namespace {

struct RowTotals {
  double loss_sum;
  std::int64_t correct;
  std::int64_t first_bad_row;  // smallest row with a label outside [0, C), not kIgnoreLabel; or max()
};

// A functor reduction: Kokkos 3.4 has no multi-value reducers for lambdas. Labels are checked
// inside the loop, but the abort happens after it, on the calling thread (MPI is FUNNELED).
struct XentRows {
  using value_type = RowTotals;

  const float* logits;
  const std::int32_t* labels;
  float* dlogits;  // nullptr: loss only
  std::int64_t classes;
  float grad_scale;

  void init(value_type& totals) const {
    totals.loss_sum = 0;
    totals.correct = 0;
    totals.first_bad_row = std::numeric_limits<std::int64_t>::max();
  }
  // Kokkos 3.4 joins through volatile references; plain assignments keep C++20 from warning
  // about deprecated compound assignment to volatile.
  void join(volatile value_type& into, const volatile value_type& from) const {
    into.loss_sum = into.loss_sum + from.loss_sum;
    into.correct = into.correct + from.correct;
    if (from.first_bad_row < into.first_bad_row) into.first_bad_row = from.first_bad_row;
  }

  void operator()(const std::int64_t row, value_type& totals) const {
    const float* __restrict x = logits + row * classes;
    const std::int32_t label = labels[row];
    if (label < 0 || label >= classes) {
      if (label != kIgnoreLabel && row < totals.first_bad_row) totals.first_bad_row = row;
      if (dlogits)
        for (std::int64_t j = 0; j < classes; ++j) dlogits[row * classes + j] = 0.f;
      return;
    }
    // The first maximum, as torch.argmax returns it.
    float max_logit = x[0];
    std::int64_t argmax = 0;
    for (std::int64_t j = 1; j < classes; ++j)
      if (x[j] > max_logit) {
        max_logit = x[j];
        argmax = j;
      }
    // exp(x - max) <= 1 cannot overflow; the sum is in double so that many classes lose nothing.
    double exp_sum = 0;
    if (dlogits) {
      float* __restrict dx = dlogits + row * classes;
      for (std::int64_t j = 0; j < classes; ++j) {
        const float e = std::exp(x[j] - max_logit);
        dx[j] = e;
        exp_sum += e;
      }
      const float factor = static_cast<float>(grad_scale / exp_sum);
      for (std::int64_t j = 0; j < classes; ++j) dx[j] *= factor;
      dx[label] -= grad_scale;
    } else {
      for (std::int64_t j = 0; j < classes; ++j) exp_sum += std::exp(x[j] - max_logit);
    }
    // log-sum-exp - x[label], with max and x[label] exact in double: no cancellation at 1e4.
    totals.loss_sum +=
        static_cast<double>(max_logit) + std::log(exp_sum) - static_cast<double>(x[label]);
    totals.correct += argmax == label ? 1 : 0;
  }
};

XentStats run(const char* op, const Tensor& logits, const Tensor& labels, Tensor* dlogits,
              float grad_scale) {
  static const std::string label = "kernels::softmax_xent";
  detail::require_host_f32(op, "logits must be f32 on the host", logits);
  detail::require(logits.rank() == 2 && logits.dim(1) > 0, op,
                  "logits must be [batch, classes] with classes > 0", logits);
  detail::require(labels.defined() && labels.dtype() == DType::i32 &&
                      labels.device() == Device::cpu && labels.rank() == 1,
                  op, "labels must be 1-D int32 on the host", labels);
  detail::require_pair(labels.dim(0) == logits.dim(0), op,
                       "labels must have one entry per row of logits", logits, labels);
  if (dlogits) {
    detail::require_host_f32(op, "dlogits must be f32 on the host", *dlogits);
    detail::require_pair(dlogits->shape() == logits.shape(), op,
                         "dlogits must have the shape of logits", logits, *dlogits);
  }
  const XentRows rows{logits.data<float>(), labels.data<std::int32_t>(),
                      dlogits ? dlogits->data<float>() : nullptr, logits.dim(1), grad_scale};
  RowTotals totals{};
  parallel_reduce(label, logits.dim(0), rows, totals);
  if (totals.first_bad_row != std::numeric_limits<std::int64_t>::max()) {
    const auto row = totals.first_bad_row;
    abort_job(std::string(op) + ": label " + std::to_string(labels.data<std::int32_t>()[row]) +
              " of row " + std::to_string(row) + " is outside [0, " +
              std::to_string(logits.dim(1)) + ")");
  }
  return XentStats{totals.loss_sum, totals.correct};
}

}  // namespace

XentStats softmax_xent_forward(const Tensor& logits, const Tensor& labels) {
  return run("kernels::softmax_xent_forward", logits, labels, nullptr, 0.f);
}

XentStats softmax_xent_forward_backward(const Tensor& logits, const Tensor& labels, Tensor& dlogits,
                                        float grad_scale) {
  return run("kernels::softmax_xent_forward_backward", logits, labels, &dlogits, grad_scale);
}

}  // namespace mpt::kernels::host
