// ResBlock: builds its sub-layers, splits the block's parameter and buffer views among them,
// plans the intermediate activations, and runs the two paths forward and backward.
#include "nn/resblock.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "kernels/add.hpp"
#include "kernels/relu.hpp"
#include "nn/batchnorm.hpp"
#include "nn/conv2d.hpp"
#include "nn/relu_layer.hpp"

namespace mpt::nn {

ResBlock::ResBlock(std::string name, const Shape& input_shape, std::int64_t channels,
                   std::int64_t stride)
    : Layer(std::move(name)), input_shape_(input_shape), channels_(channels), stride_(stride) {
  if (input_shape.size() != 3 || channels < 1 || stride < 1)
    abort_job("nn::ResBlock " + this->name() + ": bad geometry for input " +
              shape_to_string(input_shape));
  auto conv1 = std::make_unique<Conv2d>("conv1", input_shape, channels, 3, stride, 1);
  mid_shape_ = conv1->output_shape(input_shape);
  children_.push_back(std::move(conv1));
  children_.push_back(std::make_unique<BatchNorm>("bn1", mid_shape_));
  children_.push_back(std::make_unique<ReluLayer>("relu"));
  children_.push_back(std::make_unique<Conv2d>("conv2", mid_shape_, channels, 3, 1, 1));
  children_.push_back(std::make_unique<BatchNorm>("bn2", mid_shape_));
  if (input_shape[0] != channels || stride != 1) {
    children_.push_back(std::make_unique<Conv2d>("proj", input_shape, channels, 1, stride, 0));
    children_.push_back(std::make_unique<BatchNorm>("proj_bn", mid_shape_));
  }
  conv1_ = children_[0].get();
  bn1_ = children_[1].get();
  relu_ = children_[2].get();
  conv2_ = children_[3].get();
  bn2_ = children_[4].get();
  if (children_.size() > 5) {
    proj_ = children_[5].get();
    proj_bn_ = children_[6].get();
  }
}

ResBlock::~ResBlock() = default;

std::string ResBlock::spec() const {
  std::string text = "resblock:" + std::to_string(channels_);
  if (stride_ != 1) text += ":stride=" + std::to_string(stride_);
  return text;
}

Shape ResBlock::output_shape(const Shape&) const { return mid_shape_; }

double ResBlock::flops_per_sample(const Shape&) const {
  double total = 0;
  for (const auto& row : child_rows()) total += row.flops;
  return total;
}

std::int64_t ResBlock::stats_values() const {
  std::int64_t most = 0;
  for (const auto& child : children_) most = std::max(most, child->stats_values());
  return most;
}

std::vector<Layer::Row> ResBlock::child_rows() const {
  std::vector<Row> rows;
  const auto params_of = [](const Layer& layer) {
    std::int64_t count = 0;
    for (const auto& spec : layer.param_specs()) count += shape_numel(spec.shape);
    return count;
  };
  const std::string prefix = name() + "/";
  Shape shape = input_shape_;
  for (const Layer* child : {conv1_, bn1_, relu_, conv2_, bn2_}) {
    rows.push_back(
        {prefix + child->name(), mid_shape_, params_of(*child), child->flops_per_sample(shape)});
    shape = mid_shape_;
  }
  if (proj_) {
    rows.push_back(
        {prefix + "proj", mid_shape_, params_of(*proj_), proj_->flops_per_sample(input_shape_)});
    rows.push_back({prefix + "proj_bn", mid_shape_, params_of(*proj_bn_),
                    proj_bn_->flops_per_sample(mid_shape_)});
  }
  // The residual add and the final relu: one operation each per element.
  const double elements = static_cast<double>(shape_numel(mid_shape_));
  rows.push_back({prefix + "add+relu", mid_shape_, 0, 2 * elements});
  return rows;
}

std::vector<ParamSpec> ResBlock::param_specs() const {
  std::vector<ParamSpec> specs;
  for (const auto& child : children_)
    for (auto spec : child->param_specs()) {
      spec.name = child->name() + "/" + spec.name;
      specs.push_back(std::move(spec));
    }
  return specs;
}

std::vector<BufferSpec> ResBlock::buffer_specs() const {
  std::vector<BufferSpec> specs;
  for (const auto& child : children_)
    for (auto spec : child->buffer_specs()) {
      spec.name = child->name() + "/" + spec.name;
      specs.push_back(std::move(spec));
    }
  return specs;
}

void ResBlock::on_bound() {
  // The block's views, in param_specs() order, dealt out to the children in the same order.
  std::size_t next_param = 0, next_buffer = 0;
  const bool params_bound = params().size() == param_specs().size();
  const bool buffers_bound = buffers().size() == buffer_specs().size();
  for (auto& child : children_) {
    const std::size_t n_params = child->param_specs().size();
    const std::size_t n_buffers = child->buffer_specs().size();
    if (params_bound && n_params > 0) {
      std::vector<Tensor> values, grads;
      for (std::size_t i = 0; i < n_params; ++i, ++next_param) {
        values.push_back(params()[next_param].value);
        grads.push_back(params()[next_param].grad);
      }
      child->bind_params(std::move(values), std::move(grads));
    }
    if (buffers_bound && n_buffers > 0) {
      std::vector<Tensor> values;
      for (std::size_t i = 0; i < n_buffers; ++i, ++next_buffer)
        values.push_back(buffers()[next_buffer].value);
      child->bind_buffers(std::move(values));
    }
  }
}

void ResBlock::set_workspace(ComputeWorkspace* workspace) {
  Layer::set_workspace(workspace);
  for (auto& child : children_) child->set_workspace(workspace);
}

void ResBlock::set_device(Device device) {
  Layer::set_device(device);
  for (auto& child : children_) child->set_device(device);
}

void ResBlock::set_context(const StepContext* context) {
  Layer::set_context(context);
  for (auto& child : children_) child->set_context(context);
}

void ResBlock::plan(std::int64_t max_batch, DType precision) {
  for (auto& child : children_) child->plan(max_batch, precision);
  const auto allocate = [&](Buffer& buffer, const Shape& shape) {
    buffer.shape = shape;
    Shape full{max_batch};
    full.insert(full.end(), shape.begin(), shape.end());
    buffer.planned = Tensor(full, precision, device_);
    buffer.view = Tensor();
  };
  for (Buffer* b : {&conv1_out_, &bn1_out_, &conv2_out_, &grad_sum_, &grad_a_, &grad_b_})
    allocate(*b, mid_shape_);
  if (proj_) {
    allocate(proj_out_, mid_shape_);
    allocate(proj_bn_out_, mid_shape_);
    allocate(grad_input_, input_shape_);
  }
}

std::int64_t ResBlock::scratch_bytes() const {
  std::int64_t bytes = 0;
  for (const auto& child : children_) bytes += child->scratch_bytes();
  for (const Buffer* b : {&conv1_out_, &bn1_out_, &conv2_out_, &proj_out_, &proj_bn_out_,
                          &grad_sum_, &grad_a_, &grad_b_, &grad_input_})
    if (b->planned.defined()) bytes += static_cast<std::int64_t>(b->planned.size_bytes());
  return bytes;
}

Tensor& ResBlock::batch_view(Buffer& buffer, std::int64_t batch) {
  if (!buffer.planned.defined()) abort_job("nn::ResBlock " + name() + ": plan() the model first");
  if (batch > buffer.planned.dim(0))
    abort_job("nn::ResBlock " + name() + ": batch " + std::to_string(batch) +
              " exceeds the planned " + std::to_string(buffer.planned.dim(0)));
  // Re-made only when the batch size changes (a short last batch), as the model's own views.
  if (!buffer.view.defined() || buffer.view.dim(0) != batch) {
    Shape full{batch};
    full.insert(full.end(), buffer.shape.begin(), buffer.shape.end());
    buffer.view = Tensor::view(buffer.planned, 0, full);
  }
  return buffer.view;
}

void ResBlock::forward(const Tensor& x, Tensor& y, bool training) {
  const std::int64_t batch = x.dim(0);
  Tensor& a1 = batch_view(conv1_out_, batch);
  Tensor& a2 = batch_view(bn1_out_, batch);
  Tensor& a3 = batch_view(conv2_out_, batch);
  conv1_->forward(x, a1, training);
  bn1_->forward(a1, a2, training);
  relu_->forward(a2, a2, training);  // in place: bn1's backward needs its input, not its output
  conv2_->forward(a2, a3, training);
  bn2_->forward(a3, y, training);  // main path straight into the output
  if (proj_) {
    Tensor& p1 = batch_view(proj_out_, batch);
    Tensor& p2 = batch_view(proj_bn_out_, batch);
    proj_->forward(x, p1, training);
    proj_bn_->forward(p1, p2, training);
    kernels::add(y, p2, y);
  } else {
    kernels::add(y, x, y);
  }
  kernels::relu_forward(y, y);
}

void ResBlock::backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) {
  const std::int64_t batch = x.dim(0);
  Tensor& a1 = batch_view(conv1_out_, batch);
  Tensor& a2 = batch_view(bn1_out_, batch);
  Tensor& a3 = batch_view(conv2_out_, batch);
  Tensor& g_sum = batch_view(grad_sum_, batch);
  Tensor& g_a = batch_view(grad_a_, batch);
  Tensor& g_b = batch_view(grad_b_, batch);
  // dL/d(main + skip), masked by the final relu (its output is Y).
  kernels::relu_backward(y, dy, g_sum);
  bn2_->backward(a3, y, g_sum, &g_a);
  conv2_->backward(a2, a3, g_a, &g_b);
  relu_->backward(a2, a2, g_b, &g_b);  // mask from relu's output (a2 after the in-place relu)
  bn1_->backward(a1, a2, g_b, &g_b);   // in place: the kernel reads dy before writing dx
  conv1_->backward(x, a1, g_b, dx);
  if (proj_) {
    Tensor& p1 = batch_view(proj_out_, batch);
    Tensor& p2 = batch_view(proj_bn_out_, batch);
    proj_bn_->backward(p1, p2, g_sum, &g_a);
    if (!dx) {
      proj_->backward(x, p1, g_a, nullptr);
      return;
    }
    Tensor& g_in = batch_view(grad_input_, batch);
    proj_->backward(x, p1, g_a, &g_in);
    kernels::add(*dx, g_in, *dx);
  } else if (dx) {
    kernels::add(*dx, g_sum, *dx);
  }
}

}  // namespace mpt::nn
