// Sequential model: building from a spec, the flat parameter layout (working copy, f32 compute
// copy and FP32 masters), initialisation, buffer planning, and the forward and backward passes.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.hpp"
#include "core/random.hpp"
#include "kernels/cast.hpp"
#include "kernels/copy.hpp"
#include "kernels/finite.hpp"
#include "kernels/matmul.hpp"
#include "nn/batchnorm.hpp"
#include "nn/conv2d.hpp"
#include "nn/dense.hpp"
#include "nn/dropout_layer.hpp"
#include "nn/flatten_layer.hpp"
#include "nn/gelu_layer.hpp"
#include "nn/nn.hpp"
#include "nn/pool2d_layer.hpp"
#include "nn/relu_layer.hpp"
#include "nn/resblock.hpp"
#include "nn/spec.hpp"
#include "nn/workspace.hpp"

namespace mpt::nn {

void Layer::bind_params(std::vector<Tensor> values, std::vector<Tensor> grads) {
  const auto specs = param_specs();
  if (values.size() != specs.size() || grads.size() != specs.size())
    abort_job("nn::Layer::bind_params: " + name() + " needs " + std::to_string(specs.size()) +
              " parameters, got " + std::to_string(values.size()));
  params_.clear();
  for (std::size_t i = 0; i < specs.size(); ++i)
    params_.push_back({name() + "/" + specs[i].name, std::move(values[i]), std::move(grads[i])});
  on_bound();
}

void Layer::bind_buffers(std::vector<Tensor> values) {
  const auto specs = buffer_specs();
  if (values.size() != specs.size())
    abort_job("nn::Layer::bind_buffers: " + name() + " needs " + std::to_string(specs.size()) +
              " buffers, got " + std::to_string(values.size()));
  buffers_.clear();
  for (std::size_t i = 0; i < specs.size(); ++i)
    buffers_.push_back({name() + "/" + specs[i].name, std::move(values[i]), Tensor()});
  on_bound();
}

InitScheme init_scheme_from_name(const std::string& name, const std::string& option) {
  if (name == "default") return InitScheme::default_init;
  if (name == "he") return InitScheme::he;
  if (name == "xavier") return InitScheme::xavier;
  throw_user_error(option + " '" + name + "' is not an initialisation scheme",
                   "use default (PyTorch's defaults), he or xavier; see docs/model-spec.md");
}

Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;
Model::~Model() = default;

namespace {
// Rows per block of the 16-bit layers' f32 scratch. 512 rows keep the matmuls efficient (the
// benchmark batch of 128 is one block) while the scratch of the 784-1024-1024-10 MLP stays at
// 8 MiB at any batch.
constexpr std::int64_t kBlockRows = 512;
// On the cuda device a block is as many rows as this much f32 scratch holds (the whole batch at
// the usual sizes): one GEMM per operand and pass. Blocks of 512 rows cut an H200's GEMMs at
// batch 8192 into 16 small ones of a few dozen thread blocks each, and dW into 16 partial sums.
constexpr std::int64_t kDeviceScratchBytes = std::int64_t{256} << 20;
}  // namespace

Model Model::build(const std::string& name_or_spec, const Shape& sample_shape, int num_classes,
                   DType precision, Device device) {
  if (num_classes < 1) abort_job("nn::Model::build: num_classes must be positive");
  if (precision != DType::f32 && precision != DType::f16 && precision != DType::bf16)
    abort_job(std::string("nn::Model::build: precision must be f32, f16 or bf16, got ") +
              dtype_name(precision));
  if (sample_shape.empty() || shape_numel(sample_shape) <= 0)
    abort_job("nn::Model::build: bad sample shape " + shape_to_string(sample_shape));
  const auto layer_specs = parse_model_spec(name_or_spec, num_classes);

  Model model;
  model.sample_shape_ = sample_shape;
  model.num_classes_ = num_classes;
  model.precision_ = precision;
  model.device_ = device;
  const std::string spec = format_model_spec(layer_specs);
  // The layers whose kernels all have CUDA twins and whose scratch follows the model's device
  // (docs/gpu.md). A new layer kind stays host-only until it is added here and to gpu_model.
  if (device != Device::cpu)
    for (const auto& item : layer_specs) {
      static constexpr std::string_view kOnDevice[] = {"dense",   "relu",    "flatten", "conv",
                                                       "maxpool", "avgpool", "gap",     "bn",
                                                       "gelu",    "dropout", "resblock"};
      MPT_REQUIRE(
          std::find(std::begin(kOnDevice), std::end(kOnDevice), item.kind) != std::end(kOnDevice),
          "--model.layers '" + spec + "': layer '" + item.kind + "' has no CUDA path yet",
          "use dense, conv, pooling, bn, relu, gelu, dropout, resblock and flatten "
          "layers on the cuda device, or --device=cpu");
    }
  // Spatial layers see samples as (C,H,W); without any, the input is flattened implicitly, so
  // "dense:..." specs behave as they always have.
  bool spatial = false;
  for (const auto& item : layer_specs)
    spatial = spatial || item.kind == "conv" || item.kind == "maxpool" || item.kind == "avgpool" ||
              item.kind == "gap" || item.kind == "resblock";
  Shape shape{shape_numel(sample_shape)};
  if (spatial) {
    shape = sample_shape;
    if (shape.size() == 2) shape.insert(shape.begin(), 1);  // (H,W): one channel
    if (shape.size() != 3)
      throw_user_error(std::string(kModelLayersOption) + " '" + spec +
                           "': conv and pooling layers need (C,H,W) or (H,W) samples, but the "
                           "data's samples are " +
                           shape_to_string(sample_shape),
                       "reshape the samples with --data.sample-shape=C,H,W, or use dense layers");
  }
  model.input_shape_ = shape;
  std::int64_t total_params = 0, total_buffers = 0;
  for (std::size_t i = 0; i < layer_specs.size(); ++i) {
    const LayerSpec& item = layer_specs[i];
    // Named by position, like the indices of PyTorch's nn.Sequential: dense0, relu1, dense2.
    const std::string name = item.kind + std::to_string(i);
    const auto need_planes = [&] {
      if (shape.size() != 3)
        throw_layer_error(spec, name, item,
                          "needs a (C,H,W) input but gets " + shape_to_string(shape),
                          "put conv and pooling layers before flatten, gap and dense layers");
    };
    const auto need_fit = [&](std::int64_t extent_h, std::int64_t extent_w) {
      if (item.kernel > extent_h || item.kernel > extent_w)
        throw_layer_error(spec, name, item,
                          "kernel " + std::to_string(item.kernel) + " is larger than its input " +
                              shape_to_string(shape) +
                              (item.pad ? " padded by " + std::to_string(item.pad) : ""),
                          "use a smaller kernel, more padding or fewer pooling layers before it");
    };
    std::unique_ptr<Layer> layer;
    if (item.kind == "dense") {
      if (shape.size() != 1)
        throw_layer_error(spec, name, item,
                          "a dense layer needs flat features but gets " + shape_to_string(shape),
                          "put flatten (or gap) before it");
      layer = std::make_unique<Dense>(name, shape_numel(shape), item.size);
    } else if (item.kind == "conv") {
      need_planes();
      need_fit(shape[1] + 2 * item.pad, shape[2] + 2 * item.pad);
      layer = std::make_unique<Conv2d>(name, shape, item.size, item.kernel, item.stride, item.pad);
    } else if (item.kind == "maxpool" || item.kind == "avgpool") {
      need_planes();
      need_fit(shape[1], shape[2]);
      layer = std::make_unique<Pool2dLayer>(
          name, item.kind == "maxpool" ? PoolMode::max : PoolMode::average, shape, item.kernel,
          item.stride);
    } else if (item.kind == "gap") {
      need_planes();
      layer = std::make_unique<Pool2dLayer>(name, PoolMode::global_average, shape, 0, 0);
    } else if (item.kind == "flatten") {
      layer = std::make_unique<FlattenLayer>(name);
    } else if (item.kind == "gelu") {
      layer = std::make_unique<GeluLayer>(name, shape);
    } else if (item.kind == "bn") {
      layer = std::make_unique<BatchNorm>(name, shape);
    } else if (item.kind == "dropout") {
      layer = std::make_unique<DropoutLayer>(name, item.rate, i);
    } else if (item.kind == "resblock") {
      need_planes();
      layer = std::make_unique<ResBlock>(name, shape, item.size, item.stride);
    } else {
      layer = std::make_unique<ReluLayer>(name);
    }
    layer->set_device(device);
    shape = layer->output_shape(shape);
    for (const auto& param : layer->param_specs()) total_params += shape_numel(param.shape);
    for (const auto& buffer : layer->buffer_specs()) total_buffers += shape_numel(buffer.shape);
    model.output_shapes_.push_back(shape);
    model.layers_.push_back(std::move(layer));
  }
  // A ReLU right after a layer that can apply it in its own passes (conv) folds into that
  // layer: one pass over the activations fewer each way, and the ReLU's buffers become views
  // of the layer's (docs/perf.md). The values are the same (under 16-bit storage a -0 may come
  // out as +0).
  for (std::size_t i = 1; i + 1 < model.layers_.size(); ++i)
    if (auto* relu = dynamic_cast<ReluLayer*>(model.layers_[i].get()))
      if (model.layers_[i - 1]->fuse_following_relu()) relu->fold_into_previous();

  // One allocation for all parameters and one for all gradients, densely packed in layer order
  // (weight, then bias), so the all-reduce and the optimizer each see one buffer. Under 16-bit
  // storage the masters and the f32 compute copy are two more flat f32 buffers of the same
  // layout. The compute copy (4 bytes a parameter) spares widening every weight in every
  // forward and backward; weights are small next to the activations at the batches where
  // memory matters (7 MiB for the MLP against 268 MiB of fp16 activations at batch 16384).
  model.params_ = Tensor({total_params}, precision, device);
  model.grads_ = Tensor({total_params}, precision, device);
  if (precision == DType::f32) {
    model.master_params_ = model.params_;
    model.master_grads_ = model.grads_;
    model.compute_params_ = model.params_;
  } else {
    model.master_params_ = Tensor({total_params}, DType::f32, device);
    model.master_grads_ = Tensor({total_params}, DType::f32, device);
    model.compute_params_ = Tensor({total_params}, DType::f32, device);
  }
  std::int64_t offset = 0;
  for (auto& layer : model.layers_) {
    std::vector<Tensor> values, grads;
    model.layer_param_offsets_.push_back(layer->param_specs().empty() ? -1 : offset);
    for (const auto& param : layer->param_specs()) {
      values.push_back(Tensor::view(model.compute_params_, offset, param.shape));
      grads.push_back(Tensor::view(model.grads_, offset, param.shape));
      model.param_slots_.push_back({layer->name() + "/" + param.name, offset, param.shape,
                                    param.init_bound, param.init_offset});
      offset += shape_numel(param.shape);
    }
    layer->bind_params(std::move(values), std::move(grads));
  }
  // Buffers (BN running statistics): one more flat f32 allocation, initialised here so that
  // every rank starts with the same values without a broadcast.
  model.buffers_ = Tensor({total_buffers}, DType::f32, device);
  std::int64_t buffer_offset = 0;
  for (auto& layer : model.layers_) {
    std::vector<Tensor> values;
    for (const auto& buffer : layer->buffer_specs()) {
      values.push_back(Tensor::view(model.buffers_, buffer_offset, buffer.shape));
      model.buffer_slots_.push_back(
          {layer->name() + "/" + buffer.name, buffer_offset, buffer.shape, buffer.init});
      buffer_offset += shape_numel(buffer.shape);
    }
    if (!values.empty()) layer->bind_buffers(std::move(values));
  }
  model.reset_buffers();
  model.context_ = std::make_unique<StepContext>();
  for (auto& layer : model.layers_) layer->set_context(model.context_.get());
  return model;
}

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// PyTorch's _calculate_fan_in_and_fan_out for a (out, in, k...) weight.
void fans(const Shape& weight, double& fan_in, double& fan_out) {
  const double receptive = static_cast<double>(shape_numel(weight)) /
                           static_cast<double>(weight[0] * weight[1]);
  fan_in = static_cast<double>(weight[1]) * receptive;
  fan_out = static_cast<double>(weight[0]) * receptive;
}

}  // namespace

void Model::init_params(std::uint64_t seed, InitScheme scheme) {
  // On the cuda device the values are drawn on the host and copied over once.
  Tensor host_masters =
      device_ == Device::cpu ? master_params_ : Tensor(master_params_.shape(), DType::f32);
  for (std::size_t stream = 0; stream < param_slots_.size(); ++stream) {
    const CounterRng rng(seed, stream);
    const ParamSlot& slot = param_slots_[stream];
    float* data = host_masters.data<float>() + slot.offset;
    float bound = slot.init_bound, offset = slot.init_offset;
    if (scheme != InitScheme::default_init) {
      // He and Xavier resize conv and dense weights (by name and shape) and zero their biases.
      if (ends_with(slot.name, "/weight") && slot.shape.size() >= 2) {
        double fan_in = 0, fan_out = 0;
        fans(slot.shape, fan_in, fan_out);
        bound = static_cast<float>(scheme == InitScheme::he ? std::sqrt(6.0 / fan_in)
                                                            : std::sqrt(6.0 / (fan_in + fan_out)));
        offset = 0.f;
      } else if (ends_with(slot.name, "/bias")) {
        bound = offset = 0.f;
      }
    }
    for (std::int64_t i = 0; i < shape_numel(slot.shape); ++i)
      // A zero bound (conv biases, BN) gives exactly the offset, not a mix of signed zeros.
      data[i] = bound == 0.f
                    ? offset
                    : offset + bound * (2.f * rng.uniform(static_cast<std::uint64_t>(i)) - 1.f);
  }
  if (device_ != Device::cpu) kernels::copy(host_masters, master_params_);
  reset_buffers();
  recast_from_master();
}

void Model::reset_buffers() {
  Tensor host_buffers = device_ == Device::cpu ? buffers_ : Tensor(buffers_.shape(), DType::f32);
  for (const auto& slot : buffer_slots_) {
    float* data = host_buffers.data<float>() + slot.offset;
    for (std::int64_t i = 0; i < shape_numel(slot.shape); ++i) data[i] = slot.init;
  }
  if (device_ != Device::cpu) kernels::copy(host_buffers, buffers_);
}

void Model::set_rng(std::uint64_t seed, std::uint64_t step, std::uint64_t sample_offset) {
  context_->seed = seed;
  context_->step = step;
  context_->sample_offset = sample_offset;
}

void Model::set_stats_reducer(StatsReducer reducer) {
  context_->stats_reducer = std::move(reducer);
}

void Model::recast_from_master() {
  if (precision_ == DType::f32) return;  // params_, compute_params_ and the masters are one
  kernels::round_and_widen(master_params_, params_, compute_params_);
}

void Model::plan(std::int64_t max_batch) {
  if (max_batch < 1) abort_job("nn::Model::plan: max_batch must be positive");
  planned_batch_ = max_batch;
  outputs_.clear();
  output_grads_.clear();
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Shape shape{max_batch};
    shape.insert(shape.end(), output_shapes_[i].begin(), output_shapes_[i].end());
    // Activations are stored in the precision, except the logits, which softmax-xent reads in f32.
    const bool logits = i + 1 == layers_.size();
    // A flatten after another layer shares that layer's buffers (the spec parser makes the last
    // layer a dense, so a flatten is never the logits).
    if (i > 0 && !logits && layers_[i]->output_aliases_input()) {
      outputs_.push_back(Tensor::view(outputs_[i - 1], 0, shape));
      output_grads_.push_back(Tensor::view(output_grads_[i - 1], 0, shape));
      continue;
    }
    outputs_.emplace_back(shape, logits ? DType::f32 : precision_, device_);
    // The last layer's output gradient is the caller's dlogits.
    if (!logits) output_grads_.emplace_back(shape, precision_, device_);
  }
  // The workspace first: a layer's plan may depend on it (Conv2d's 16-bit paths take the
  // working weights from it).
  if (precision_ != DType::f32) {
    // f32 scratch for one block of rows of the widest dense layer (see nn/workspace.hpp).
    std::int64_t widest_in = 1, widest_out = 1, largest_weight = 1;
    for (const auto& layer : layers_)
      if (const auto* dense = dynamic_cast<const Dense*>(layer.get())) {
        widest_in = std::max(widest_in, dense->in_features());
        widest_out = std::max(widest_out, dense->out_features());
        largest_weight = std::max(largest_weight, dense->in_features() * dense->out_features());
      }
    workspace_ = std::make_unique<ComputeWorkspace>();
    const std::int64_t block_rows =
        device_ == Device::cpu
            ? kBlockRows
            : std::max(kBlockRows, kDeviceScratchBytes /
                                       static_cast<std::int64_t>(sizeof(float) * (widest_in + widest_out)));
    workspace_->block_rows = std::min(max_batch, block_rows);
    workspace_->input_rows = Tensor({workspace_->block_rows * widest_in}, DType::f32, device_);
    workspace_->output_rows = Tensor({workspace_->block_rows * widest_out}, DType::f32, device_);
    workspace_->weight_grad = Tensor({largest_weight}, DType::f32, device_);
    workspace_->bias_grad = Tensor({widest_out}, DType::f32, device_);
    if (device_ != Device::cpu || kernels::host_matmul_takes(precision_)) {
      workspace_->working_params = params_;
      workspace_->compute_params = compute_params_;
      workspace_->input16 = Tensor({workspace_->block_rows * widest_in}, precision_, device_);
    }
    for (auto& layer : layers_) layer->set_workspace(workspace_.get());
  }
  rounded_input_ = Tensor();
  if (precision_ != DType::f32 && !workspace_->working_params.defined())
    rounded_input_ = Tensor({max_batch * shape_numel(sample_shape_)}, precision_, device_);
  for (auto& layer : layers_) layer->plan(max_batch, precision_);
  current_batch_ = -1;
  have_forward_ = false;
  use_batch(max_batch);
}

void Model::use_batch(std::int64_t batch) {
  if (batch == current_batch_) return;
  // Changes only for a short last batch of an epoch or an evaluation pass, so the few small
  // allocations of new views stay out of the steady state.
  output_views_.clear();
  output_grad_views_.clear();
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    Shape shape{batch};
    shape.insert(shape.end(), output_shapes_[i].begin(), output_shapes_[i].end());
    output_views_.push_back(Tensor::view(outputs_[i], 0, shape));
    if (i + 1 < layers_.size())
      output_grad_views_.push_back(Tensor::view(output_grads_[i], 0, shape));
  }
  current_batch_ = batch;
}

const Tensor& Model::flat_input(const Tensor& x) {
  for (std::size_t i = 0; i < flat_inputs_.size(); ++i) {
    const Tensor& cached = flat_inputs_[i];
    if (cached.defined() && cached.raw() == x.raw() && cached.dim(0) == x.dim(0)) {
      last_input_ = i;
      return cached;
    }
  }
  const std::size_t slot = next_flat_input_;
  next_flat_input_ = (next_flat_input_ + 1) % flat_inputs_.size();
  flat_inputs_[slot] = Tensor::view(x, 0, {x.dim(0), shape_numel(sample_shape_)});
  last_input_ = slot;
  return flat_inputs_[slot];
}

const Tensor& Model::forward(const Tensor& x, bool training) {
  if (planned_batch_ == 0) abort_job("nn::Model::forward: call plan() first");
  if (!x.defined() || x.dtype() != DType::f32 || x.rank() < 1 ||
      x.numel() != x.dim(0) * shape_numel(sample_shape_) || x.dim(0) > planned_batch_)
    abort_job("nn::Model::forward: input " +
              (x.defined() ? x.describe() : std::string("undefined")) + " is not f32 [b, " +
              shape_to_string(sample_shape_) + "] with b <= " + std::to_string(planned_batch_));
  use_batch(x.dim(0));
  const Tensor* input = &flat_input(x);
  if (rounded_input_.defined()) {  // see nn.hpp: the layers here widen, so round first
    Tensor::view_into(rounded_view_, rounded_input_, 0, {input->dim(0), input->dim(1)});
    kernels::cast(*input, rounded_view_);
    input = &rounded_view_;
  }
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->forward(*input, output_views_[i], training);
    input = &output_views_[i];
  }
  have_forward_ = true;
  return output_views_.back();
}

void Model::backward(const Tensor& dlogits, const GradsReady& grads_ready) {
  if (!have_forward_) abort_job("nn::Model::backward: no forward pass to differentiate");
  if (dlogits.shape() != output_views_.back().shape())
    abort_job("nn::Model::backward: dlogits " + dlogits.describe() + " does not match logits " +
              output_views_.back().describe());
  // Layers may report parts of their gradients early through the context (dense row blocks);
  // the context drops repeated offsets, so the report after each layer is one only when the
  // layer made none of its own.
  StepContext& context = *context_;
  struct ClearHook {  // the hook is the caller's, valid for this call only
    StepContext& context;
    ~ClearHook() { context.grads_ready = nullptr; }
  } clear_hook{context};
  context.grads_ready = grads_ready ? &grads_ready : nullptr;
  context.grads_final_from = grads_.numel();
  // The input needs no gradient, and neither does a layer's input when no layer before it has
  // parameters: backward stops at the first layer with parameters, without its dx (a whole
  // matmul for a dense; a spec may begin with flatten, say, to cast the input once).
  std::size_t first_with_params = 0;
  while (first_with_params < layers_.size() && layer_param_offsets_[first_with_params] < 0)
    ++first_with_params;
  for (std::size_t i = layers_.size(); i-- > first_with_params;) {
    const Tensor& input = i == 0 ? last_input() : output_views_[i - 1];
    const Tensor& output_grad = i + 1 == layers_.size() ? dlogits : output_grad_views_[i];
    Tensor* input_grad = i == first_with_params ? nullptr : &output_grad_views_[i - 1];
    const bool has_params = layer_param_offsets_[i] >= 0;
    context.running_layer = has_params ? layers_[i].get() : nullptr;
    context.running_layer_offset = has_params ? layer_param_offsets_[i] : 0;
    layers_[i]->backward(input, output_views_[i], output_grad, input_grad);
    if (has_params) context.report_grads_ready(layers_[i].get(), 0);
  }
}

std::int64_t Model::stats_values() const {
  std::int64_t most = 0;
  for (const auto& layer : layers_) most = std::max(most, layer->stats_values());
  return most;
}

std::string Model::graph_blocker() const {
  for (const auto& layer : layers_)
    if (std::string why = layer->graph_blocker(); !why.empty()) return layer->name() + ": " + why;
  return "";
}

std::string Model::first_nonfinite_layer(const Tensor& x) {
  forward(x, /*training=*/false);  // checks X and plans the views for its batch
  if (!kernels::all_finite(x)) return "input";
  // forward() has just written every layer's output; test them in order.
  for (std::size_t i = 0; i < layers_.size(); ++i)
    if (!kernels::all_finite(output_views_[i])) return layers_[i]->name();
  return "";
}

std::int64_t Model::activation_bytes() const {
  std::int64_t bytes = 0;
  for (std::size_t i = 0; i < outputs_.size(); ++i) {
    if (i > 0 && i + 1 < outputs_.size() && layers_[i]->output_aliases_input()) continue;
    bytes += static_cast<std::int64_t>(outputs_[i].size_bytes());
    if (i < output_grads_.size()) bytes += static_cast<std::int64_t>(output_grads_[i].size_bytes());
  }
  for (const auto& layer : layers_) bytes += layer->scratch_bytes();
  if (workspace_)
    for (const Tensor* t : {&workspace_->input_rows, &workspace_->output_rows,
                            &workspace_->weight_grad, &workspace_->bias_grad})
      bytes += static_cast<std::int64_t>(t->size_bytes());
  if (rounded_input_.defined()) bytes += static_cast<std::int64_t>(rounded_input_.size_bytes());
  return bytes;
}

void Model::rebind_grads(Tensor storage) {
  if (storage.shape() != grads_.shape() || storage.dtype() != grads_.dtype() ||
      storage.device() != grads_.device())
    abort_job("nn::Model::rebind_grads: needs " + grads_.describe() + ", got " +
              storage.describe());
  kernels::copy(grads_, storage);
  const bool masters_are_grads = master_grads_.raw() == grads_.raw();
  grads_ = std::move(storage);
  if (masters_are_grads) master_grads_ = grads_;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    const auto specs = layers_[i]->param_specs();
    if (specs.empty()) continue;
    std::vector<Tensor> values, grads;
    std::int64_t offset = layer_param_offsets_[i];
    for (const auto& param : specs) {
      values.push_back(Tensor::view(compute_params_, offset, param.shape));
      grads.push_back(Tensor::view(grads_, offset, param.shape));
      offset += shape_numel(param.shape);
    }
    layers_[i]->bind_params(std::move(values), std::move(grads));
  }
}

std::vector<NamedParam> Model::named_params() const {
  std::vector<NamedParam> all;
  for (const auto& slot : param_slots_)
    all.push_back({slot.name, Tensor::view(master_params_, slot.offset, slot.shape),
                   Tensor::view(master_grads_, slot.offset, slot.shape)});
  return all;
}

std::vector<NamedParam> Model::named_working_params() const {
  std::vector<NamedParam> all;
  for (const auto& slot : param_slots_)
    all.push_back({slot.name, Tensor::view(params_, slot.offset, slot.shape),
                   Tensor::view(grads_, slot.offset, slot.shape)});
  return all;
}

std::vector<std::int64_t> Model::param_offsets() const {
  std::vector<std::int64_t> offsets;
  for (const auto& slot : param_slots_) offsets.push_back(slot.offset);
  return offsets;
}

std::vector<NamedParam> Model::named_buffers() const {
  std::vector<NamedParam> all;
  for (const auto& slot : buffer_slots_)
    all.push_back({slot.name, Tensor::view(buffers_, slot.offset, slot.shape), Tensor()});
  return all;
}

std::string Model::spec() const {
  std::string text;
  for (const auto& layer : layers_) {
    if (!text.empty()) text += ',';
    text += layer->spec();
  }
  return text;
}

double Model::flops_per_sample() const {
  double total = 0;
  Shape shape = input_shape_;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    total += layers_[i]->flops_per_sample(shape);
    shape = output_shapes_[i];
  }
  return total;
}

std::string Model::summary() const {
  std::ostringstream out;
  char line[160];
  std::snprintf(line, sizeof line, "%-10s %-14s %14s %16s\n", "layer", "output", "params",
                "forward FLOPs");
  out << line;
  std::snprintf(line, sizeof line, "%-10s %-14s %14d %16d\n", "input",
                shape_to_string(sample_shape_).c_str(), 0, 0);
  out << line;
  Shape shape = input_shape_;
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    std::int64_t count = 0;
    for (const auto& param : layers_[i]->params()) count += param.value.numel();
    std::snprintf(line, sizeof line, "%-10s %-14s %14lld %16.0f\n", layers_[i]->name().c_str(),
                  shape_to_string(output_shapes_[i]).c_str(), static_cast<long long>(count),
                  layers_[i]->flops_per_sample(shape));
    out << line;
    // A composite layer's parts, indented under it (already counted in its line).
    for (const auto& row : layers_[i]->child_rows()) {
      std::snprintf(line, sizeof line, "  %-18s %-14s %6lld %16.0f\n", row.name.c_str(),
                    shape_to_string(row.output).c_str(), static_cast<long long>(row.params),
                    row.flops);
      out << line;
    }
    shape = output_shapes_[i];
  }
  std::snprintf(line, sizeof line, "%-10s %-14s %14lld %16.0f   (per sample)\n", "total",
                shape_to_string(output_shapes_.back()).c_str(),
                static_cast<long long>(num_params()), flops_per_sample());
  out << line;
  return out.str();
}

}  // namespace mpt::nn
