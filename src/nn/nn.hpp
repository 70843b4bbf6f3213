// Neural-network models for the trainer: a sequence of layers built from a spec string, with all
// parameters (and all gradients) in one flat f32 buffer and activations planned once.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.hpp"

namespace mpt::nn {

// A parameter of the model: value and gradient are views into Model::params() and grads().
struct NamedParam {
  std::string name;  // "dense0/weight"
  Tensor value;
  Tensor grad;
};

// What a layer asks the model to allocate for it, before the flat buffers exist.
struct ParamSpec {
  std::string name;  // local name: "weight", "bias"
  Shape shape;
  float init_bound;  // initialised uniformly in [-init_bound, init_bound)
};

// One layer of a sequential model. Activations are [batch, features...] f32 tensors owned by
// the model; a layer holds only views of its parameters.
class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string_view kind() const = 0;         // "dense", "relu"
  const std::string& name() const { return name_; }  // kind + position: "dense0", "relu1"
  // The canonical spec item of this layer: "dense:1024", "relu".
  virtual std::string spec() const = 0;
  // Per-sample output shape for per-sample input shape INPUT_SHAPE.
  virtual Shape output_shape(const Shape& input_shape) const = 0;
  // Forward FLOPs per sample (a multiply-add is 2, an elementwise op 1).
  virtual double flops_per_sample(const Shape& input_shape) const = 0;
  virtual std::vector<ParamSpec> param_specs() const { return {}; }

  // Hands the layer its views, in param_specs() order; called once by the model.
  void bind_params(std::vector<Tensor> values, std::vector<Tensor> grads);
  // The bound parameters, named "<layer>/<param>".
  const std::vector<NamedParam>& params() const { return params_; }

  // Y = layer(X) for a batch. TRAINING is for layers that behave differently (none yet).
  virtual void forward(const Tensor& x, Tensor& y, bool training) = 0;
  // From DY = dLoss/dY (and X, Y of the last forward), overwrites the parameter gradients and,
  // when DX is not null, writes DX = dLoss/dX.
  virtual void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) = 0;

 protected:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  Tensor& param_value(std::size_t index) { return params_[index].value; }
  Tensor& param_grad(std::size_t index) { return params_[index].grad; }
  const Tensor& param_value(std::size_t index) const { return params_[index].value; }

 private:
  std::string name_;
  std::vector<NamedParam> params_;
};

class Model {
 public:
  // NAME_OR_SPEC is a model name ("mlp" = dense:1024,relu,dense:1024,relu,dense:NUM_CLASSES)
  // or a comma list of layers ("dense:1024,relu,dense:10"). The input is flattened first.
  // Throws UserError naming --model.layers when the spec is malformed or its last layer does
  // not output NUM_CLASSES features. Parameters are allocated (zero) but not initialised.
  static Model build(const std::string& name_or_spec, const Shape& sample_shape, int num_classes);

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  // PyTorch nn.Linear's default: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)), parameter k
  // drawn from CounterRng(seed, k), so the result is a pure function of SEED.
  void init_params(std::uint64_t seed);

  // Allocates every activation and activation-gradient buffer for batches of up to MAX_BATCH.
  void plan(std::int64_t max_batch);
  // Logits [b, C] for X [b, sample_shape...] f32 with b <= the planned batch. The result is a
  // view of a planned buffer, valid until the next forward. No allocation once the batch size
  // and the input buffers repeat.
  const Tensor& forward(const Tensor& x, bool training);
  // From DLOGITS [b, C] (b of the last forward), overwrites grads(). Needs the last forward's
  // activations, so call it before the next forward.
  void backward(const Tensor& dlogits);

  Tensor& params() { return params_; }  // every parameter, flat f32
  Tensor& grads() { return grads_; }    // every gradient, same layout
  const Tensor& params() const { return params_; }
  const Tensor& grads() const { return grads_; }
  std::vector<NamedParam> named_params() const;  // in layout order
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

  std::string spec() const;  // canonical: "dense:1024,relu,dense:1024,relu,dense:10"
  const Shape& sample_shape() const { return sample_shape_; }
  int num_classes() const { return num_classes_; }
  std::int64_t num_params() const { return params_.numel(); }
  double flops_per_sample() const;  // forward
  std::int64_t planned_batch() const { return planned_batch_; }
  // A table: layer, output shape, parameters, forward FLOPs per sample, and totals.
  std::string summary() const;

 private:
  Model() = default;
  void use_batch(std::int64_t batch);
  const Tensor& flat_input(const Tensor& x);

  Shape sample_shape_;
  int num_classes_ = 0;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Shape> output_shapes_;  // per sample, one per layer
  Tensor params_, grads_;

  std::int64_t planned_batch_ = 0;
  std::vector<Tensor> outputs_;       // [max_batch, features] per layer
  std::vector<Tensor> output_grads_;  // dLoss/d(output) per layer but the last (the caller's)
  // Views of the planned buffers for the current batch size; rebuilt when it changes.
  std::int64_t current_batch_ = -1;
  std::vector<Tensor> output_views_, output_grad_views_;
  // Flattened [b, features] views of recent input tensors. Each holds its input's buffer, so
  // equal data pointers mean the same buffer: a loader's ring of buffers hits every step and
  // the training step does not allocate a shape. Slot last_input_ is the last forward's input.
  std::array<Tensor, 4> flat_inputs_;
  std::size_t next_flat_input_ = 0;
  std::size_t last_input_ = 0;
  bool have_forward_ = false;
};

}  // namespace mpt::nn
