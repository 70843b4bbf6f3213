// Neural-network models for the trainer: a sequence of layers built from a spec string, with all
// parameters (and all gradients) in one flat buffer and activations planned once. Under fp16 or
// bf16 these are stored in 16 bits, every layer computes in f32, and FP32 masters sit beside.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.hpp"

namespace mpt::nn {

// A parameter of the model: value and gradient are views into flat model buffers (which ones
// depends on the accessor: Model::named_params() or named_working_params()).
struct NamedParam {
  std::string name;  // "dense0/weight"
  Tensor value;
  Tensor grad;
};

// What a layer asks the model to allocate for it, before the flat buffers exist.
struct ParamSpec {
  std::string name;  // local name: "weight", "bias"
  Shape shape;
  // Under --model.init=default: init_offset + U[-init_bound, init_bound).
  float init_bound;
  float init_offset = 0.f;  // BN gamma: 1
  // The he and xavier schemes replace the bound of parameters named "weight" (rank >= 2, fans
  // as PyTorch computes them from the shape) and zero those named "bias"; others keep theirs.
};

// A non-trainable tensor of a layer (BN running statistics): f32, set to INIT at build.
struct BufferSpec {
  std::string name;  // local name: "running_mean"
  Shape shape;
  float init;
};

// How Model::init_params sizes conv and dense parameters (docs/model-spec.md).
enum class InitScheme { default_init, he, xavier };
// Parses "default", "he" or "xavier"; throws UserError naming OPTION otherwise.
InitScheme init_scheme_from_name(const std::string& name, const std::string& option);

// Throws UserError naming OPTION unless NAME is a built-in model (mlp, cnn, resnet-mini), so
// that a misspelt --model.name is reported as such rather than as an unknown layer.
void require_builtin_model(const std::string& name, const std::string& option);

// How conv and pooling layers on the cuda device compute (docs/gpu.md): cudnn (the default, in
// a build with cuDNN) or im2col (mptrain's own CUDA twins of the host path: im2col + cuBLASLt
// for conv, the pooling kernels). Each such layer reads it in plan(); a build without cuDNN
// always takes im2col. It starts from the environment variable MPTRAIN_CUDA_CONV
// (cudnn|im2col) when set.
enum class CudaConvPath { cudnn, im2col };
void set_cuda_conv_path(CudaConvPath path);
CudaConvPath cuda_conv_path();
// Parses "cudnn" or "im2col"; throws UserError naming OPTION otherwise.
CudaConvPath cuda_conv_path_from_name(const std::string& name, const std::string& option);
const char* cuda_conv_path_name(CudaConvPath path);

// How conv layers on the host compute: onednn (the default: oneDNN's convolution primitives,
// kernels::host::DnnlConv2d, for f32, and for bf16 where the CPU has bf16 dot products) or
// im2col (im2col + the host matmul, the path for fp16 and wherever oneDNN declines). The matmul
// backend blas (--kernels.matmul=blas) means no oneDNN, so im2col too. Each conv reads it in
// plan(). It starts from the environment variable MPTRAIN_HOST_CONV (onednn|im2col) when set.
enum class HostConvPath { onednn, im2col };
void set_host_conv_path(HostConvPath path);
HostConvPath host_conv_path();
// Parses "onednn" or "im2col"; throws UserError naming OPTION otherwise.
HostConvPath host_conv_path_from_name(const std::string& name, const std::string& option);
const char* host_conv_path_name(HostConvPath path);

// Sums SUMS (f32, on the layer's device) element-wise across the ranks of a data-parallel job,
// in place: on return, work queued after it (kernels on the compute stream) sees the sums,
// without the host having read them. The trainer installs one for synchronised BatchNorm (an
// MPI_Allreduce, or ncclAllReduce on the device's comm stream); nn knows nothing of MPI. A
// step captured into a CUDA graph captures the reducer's calls too: the installer makes them
// capturable (the trainer's queues the ncclAllReduce on the captured stream itself).
using StatsReducer = std::function<void(Tensor& sums)>;

// Model::backward's per-layer hook: GRAD_OFFSET is the element offset in Model::grads() from
// which every gradient is final (layers run last to first and own ascending ranges).
using GradsReady = std::function<void(std::int64_t grad_offset)>;

class Layer;

// What the model tells its layers about the current step; owned by the model (heap-held, so
// that the layers' pointers to it survive moves of the model).
struct StepContext {
  StatsReducer stats_reducer;       // empty: statistics stay local to the rank
  std::uint64_t seed = 0;           // dropout: the run's seed
  std::uint64_t step = 0;           // dropout: the global step
  std::uint64_t sample_offset = 0;  // dropout: global index of this rank's first sample

  // Partial readiness. Model::backward reports each layer's gradients final once it returns; a
  // layer that finishes a large gradient in parts (a dense weight, in row blocks) may report
  // earlier through report_grads_ready(), so that buckets cut inside that gradient go out while
  // the layer still computes. Set by Model::backward for one backward with a hook.
  const GradsReady* grads_ready = nullptr;    // null: no hook, reports are no-ops
  const Layer* running_layer = nullptr;       // the model's layer in backward ...
  std::int64_t running_layer_offset = 0;      // ... and the offset of its first parameter
  mutable std::int64_t grads_final_from = 0;  // the lowest offset reported in this backward

  // True when reports reach a hook: a layer may then trade a little speed for earlier reports.
  bool wants_grads_reports() const { return grads_ready != nullptr; }
  // LAYER reports that its gradients from element LOCAL_OFFSET on (counted from its first
  // parameter, in param_specs() order) are final, and with them every gradient after them in
  // Model::grads(). Reports that are not below an earlier one, or come from anything but the
  // model's running layer (a composite's child does not know its place), are dropped.
  void report_grads_ready(const Layer* layer, std::int64_t local_offset) const {
    const std::int64_t offset = running_layer_offset + local_offset;
    if (grads_ready == nullptr || layer != running_layer || offset >= grads_final_from) return;
    grads_final_from = offset;
    (*grads_ready)(offset);
  }
};

// The f32 scratch that layers compute in when activations are stored in 16 bits; private to nn
// (nn/workspace.hpp), owned by the model.
struct ComputeWorkspace;

// One layer of a sequential model. Activations are [batch, features...] tensors owned by the
// model, f32 or (under mixed precision) f16/bf16; a layer holds only views of its parameters,
// whose values are always f32 (the compute copy) and whose gradients are in the model's precision.
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
  virtual std::vector<BufferSpec> buffer_specs() const { return {}; }
  // Sizes the layer's own scratch for batches of up to MAX_BATCH stored in PRECISION; called by
  // Model::plan, so that forward and backward allocate nothing.
  virtual void plan(std::int64_t /*max_batch*/, DType /*precision*/) {}
  // Bytes of that scratch.
  virtual std::int64_t scratch_bytes() const { return 0; }
  // True when the output is the input under another shape (flatten): the model then makes the
  // output and its gradient views of the input's buffers.
  virtual bool output_aliases_input() const { return false; }
  // Asks the layer to apply the ReLU that follows it in its own output pass, and that ReLU's
  // backward in its pass over the output gradient; true if it will (conv). The model then
  // folds the ReLU away (ReluLayer::fold_into_previous). Called once, before plan().
  virtual bool fuse_following_relu() { return false; }

  // Hands the layer its views, in param_specs() order; called once by the model.
  void bind_params(std::vector<Tensor> values, std::vector<Tensor> grads);
  // Hands the layer views of its buffers (f32), in buffer_specs() order; called once.
  void bind_buffers(std::vector<Tensor> values);
  // The bound parameters, named "<layer>/<param>".
  const std::vector<NamedParam>& params() const { return params_; }
  // The bound buffers, named "<layer>/<buffer>" (grad undefined).
  const std::vector<NamedParam>& buffers() const { return buffers_; }

  // Gives the layer the model's f32 scratch for 16-bit activations (null under f32).
  virtual void set_workspace(ComputeWorkspace* workspace) { workspace_ = workspace; }
  // Says where the model's tensors live (cpu unless told), so that plan() allocates the
  // layer's own scratch there too; called once by Model::build, before binding and plan().
  virtual void set_device(Device device) { device_ = device; }
  // Gives the layer the model's step context (stats reducer, RNG key); null: none.
  virtual void set_context(const StepContext* context) { context_ = context; }

  // Sub-layers of a composite layer, for the summary: (name, output shape, parameters, FLOPs).
  struct Row {
    std::string name;
    Shape output;
    std::int64_t params = 0;
    double flops = 0;
  };
  virtual std::vector<Row> child_rows() const { return {}; }

  // Why this layer's training step cannot be captured in a CUDA graph (kernels/graph.hpp:
  // every step must launch the same work, read per-step values from the device and never wait
  // for the host), or "" when it can.
  virtual std::string graph_blocker() const { return ""; }
  // The most values this layer hands the stats reducer in one call (BN: 2C + 1), so that a
  // reducer that stages them can plan its buffer; 0 for a layer that hands none.
  virtual std::int64_t stats_values() const { return 0; }

  // Y = layer(X) for a batch. TRAINING selects batch statistics (BN) and masks (dropout).
  virtual void forward(const Tensor& x, Tensor& y, bool training) = 0;
  // From DY = dLoss/dY (and X, Y of the last forward), overwrites the parameter gradients and,
  // when DX is not null, writes DX = dLoss/dX.
  virtual void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) = 0;

 protected:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  // Called at the end of bind_params and bind_buffers: a composite layer hands views on.
  virtual void on_bound() {}
  Tensor& param_value(std::size_t index) { return params_[index].value; }
  Tensor& param_grad(std::size_t index) { return params_[index].grad; }
  const Tensor& param_value(std::size_t index) const { return params_[index].value; }
  Tensor& buffer_value(std::size_t index) { return buffers_[index].value; }
  ComputeWorkspace* workspace_ = nullptr;
  const StepContext* context_ = nullptr;
  Device device_ = Device::cpu;

 private:
  std::string name_;
  std::vector<NamedParam> params_;
  std::vector<NamedParam> buffers_;
};

class Model {
 public:
  // NAME_OR_SPEC is a model name ("mlp" = dense:1024,relu,dense:1024,relu,dense:NUM_CLASSES;
  // "cnn" = conv:32:5:pad=2,relu,maxpool:2,conv:64:5:pad=2,relu,maxpool:2,flatten,dense:512,
  // relu,dense:NUM_CLASSES; "resnet-mini", see docs/model-spec.md) or a comma list of layers.
  // Without a conv, pooling or resblock layer the input is flattened first (the MLP case). With
  // one, samples keep their (C,H,W) shape (an (H,W) sample is (1,H,W)), and a dense layer after
  // a 3-D shape needs an explicit flatten (or gap).
  // Throws UserError naming --model.layers and the layer when the spec is malformed, shapes do
  // not chain, a kernel is larger than its input, or the last layer does not output
  // NUM_CLASSES features. Parameters are allocated (zero) but not initialised.
  // PRECISION (f32, f16 or bf16; anything else aborts, the CLI validates the option) is the
  // storage type of the working weights, the activations and the gradients; layers compute in
  // f32 either way, and the logits are f32.
  // DEVICE: where every buffer of the model lives. On cuda every layer kind runs (docs/gpu.md);
  // BatchNorm reads its per-channel sums back to the host each pass (a synchronisation).
  static Model build(const std::string& name_or_spec, const Shape& sample_shape, int num_classes,
                     DType precision = DType::f32, Device device = Device::cpu);

  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;
  ~Model();

  // Each parameter ~ U(-bound, bound) with its layer's bound under SCHEME (default: dense:
  // PyTorch nn.Linear's 1/sqrt(in); conv: He uniform sqrt(6/fan_in), bias 0; BN gamma 1, beta
  // 0; he and xavier: docs/model-spec.md), parameter k drawn from CounterRng(seed, k), so the
  // result is a pure function of SEED. Writes the FP32 masters, then recasts the working copy.
  // Also resets the buffers (BN running mean 0, var 1).
  void init_params(std::uint64_t seed, InitScheme scheme = InitScheme::default_init);
  // Working copy := master_params() rounded to the precision (to nearest even), and the f32
  // compute copy := the working copy widened. A no-op under f32, where they are one buffer.
  // Call after every applied optimizer step, broadcast or checkpoint restore of the masters.
  void recast_from_master();

  // Allocates every activation and activation-gradient buffer for batches of up to MAX_BATCH.
  void plan(std::int64_t max_batch);
  // Logits [b, C] f32 for X [b, sample_shape...] f32 with b <= the planned batch. The result is
  // a view of a planned buffer, valid until the next forward. No allocation once the batch size
  // and the input buffers repeat.
  // TRAINING: BN uses (and, with a stats reducer, synchronises) batch statistics and updates
  // its running statistics; dropout drops. Otherwise BN uses the running statistics and
  // dropout is the identity.
  const Tensor& forward(const Tensor& x, bool training);
  // Keys the dropout masks of the next training forward: (SEED, layer index, STEP, element
  // index), element index counted from SAMPLE_OFFSET samples (the trainer passes rank x batch,
  // so that the masks of a step are those of one process with the whole global batch).
  void set_rng(std::uint64_t seed, std::uint64_t step, std::uint64_t sample_offset = 0);
  // Installs the cross-rank sum that BN layers call in training forward (per-channel sums,
  // sums of squares and the sample count) and backward (sums of dy and dy*xhat). Every rank
  // must then run every training forward and backward. An empty reducer: local statistics.
  void set_stats_reducer(StatsReducer reducer);
  // From DLOGITS [b, C] f32 (b of the last forward), overwrites grads(), in the precision. Needs
  // the last forward's activations, so call it before the next forward.
  // GRADS_READY (optional) is called after each layer with parameters, last layer first, with
  // the element offset in grads() from which every gradient is final for this backward: how
  // the gradient all-reduce starts on a bucket while backward goes on. A dense layer with a
  // large weight also calls it inside its backward, once per block of weight-gradient rows
  // (StepContext::report_grads_ready). Offsets strictly decrease, the last is 0. Build the
  // function once and pass it every step (a std::function per call may allocate).
  void backward(const Tensor& dlogits, const GradsReady& grads_ready = {});
  // Re-runs the forward pass on X, testing each layer's output, and returns the name of the
  // first layer whose activations hold an Inf or NaN: "input" when X itself does, "" when none.
  // For the error message of a non-finite loss. Replaces the last forward's activations.
  std::string first_nonfinite_layer(const Tensor& x);
  // "LAYER: why" for the first layer whose step cannot be captured in a CUDA graph
  // (Layer::graph_blocker), or "" when the whole step can.
  std::string graph_blocker() const;
  // The largest stats_values() of its layers: what one stats reducer call may hand over.
  std::int64_t stats_values() const;

  DType precision() const { return precision_; }
  Device device() const { return device_; }
  // The working copy: every parameter, flat, in the precision, and every gradient (same layout,
  // same dtype) as backward() writes it; this is what the all-reduce sums.
  Tensor& params() { return params_; }
  Tensor& grads() { return grads_; }
  const Tensor& params() const { return params_; }
  const Tensor& grads() const { return grads_; }
  // FP32 master weights and gradients (same layout). The optimizer updates the masters from the
  // master gradients, which the trainer fills with unscale_and_check(grads()). Under f32 they
  // are params() and grads() themselves (same storage).
  // The f32 copy of the working weights that the layers compute with (params() under fp32).
  // With params(), the target of the recast (Sgd::recast_into fuses it into the update).
  Tensor& compute_params() { return compute_params_; }
  // Moves grads() (and, under f32, master_grads(), the same buffer) into STORAGE: a tensor of
  // the same shape, dtype and device that another component allocated, such as the node's
  // shared-memory window that the all-reduce reads peers' gradients from without a copy
  // (comm::SharedBuffer). Copies the current gradients and re-points every layer's views. Call
  // before plan(), and before anything else holds views of grads().
  void rebind_grads(Tensor storage);
  Tensor& master_params() { return master_params_; }
  Tensor& master_grads() { return master_grads_; }
  const Tensor& master_params() const { return master_params_; }
  const Tensor& master_grads() const { return master_grads_; }
  // In layout order: views of the FP32 masters (what checkpoints save and restore).
  std::vector<NamedParam> named_params() const;
  // In layout order: views of the working copy params() and of grads().
  std::vector<NamedParam> named_working_params() const;
  // In layout order: each parameter's element offset in the flat buffers (ascending from 0).
  std::vector<std::int64_t> param_offsets() const;
  // Non-trainable state (BN running statistics): one flat f32 tensor, allocated at build and
  // initialised there (mean 0, var 1); the same on every rank until training moves it.
  Tensor& buffers() { return buffers_; }
  const Tensor& buffers() const { return buffers_; }
  // In layout order: views of buffers(), named "bn1/running_mean"; grad undefined.
  std::vector<NamedParam> named_buffers() const;
  const std::vector<std::unique_ptr<Layer>>& layers() const { return layers_; }

  std::string spec() const;  // canonical: "dense:1024,relu,dense:1024,relu,dense:10"
  const Shape& sample_shape() const { return sample_shape_; }
  int num_classes() const { return num_classes_; }
  std::int64_t num_params() const { return params_.numel(); }
  double flops_per_sample() const;  // forward
  std::int64_t planned_batch() const { return planned_batch_; }
  // Bytes of the planned activations, activation gradients and f32 compute scratch (0 before
  // plan()); parameters, gradients and masters are not included.
  std::int64_t activation_bytes() const;
  // A table: layer, output shape, parameters, forward FLOPs per sample, and totals.
  std::string summary() const;

 private:
  Model() = default;
  void use_batch(std::int64_t batch);
  const Tensor& flat_input(const Tensor& x);

  Shape sample_shape_;
  Shape input_shape_;  // what the first layer sees: (features) or (C,H,W)
  int num_classes_ = 0;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<Shape> output_shapes_;  // per sample, one per layer
  DType precision_ = DType::f32;
  Device device_ = Device::cpu;
  // Working copy (precision), the f32 copy the layers compute with, and the FP32 masters. Under
  // f32 all three value tensors share one buffer, and the two gradient tensors another.
  Tensor params_, grads_, compute_params_, master_params_, master_grads_;
  struct ParamSlot {
    std::string name;  // "dense0/weight"
    std::int64_t offset;
    Shape shape;
    float init_bound, init_offset;  // the layer's default initialisation
  };
  void reset_buffers();
  std::vector<ParamSlot> param_slots_;  // layout of the flat buffers
  // Per layer: the offset of its first parameter in the flat buffers (-1: no parameters).
  std::vector<std::int64_t> layer_param_offsets_;
  Tensor buffers_;                      // f32, non-trainable
  struct BufferSlot {
    std::string name;
    std::int64_t offset;
    Shape shape;
    float init;
  };
  std::vector<BufferSlot> buffer_slots_;
  std::unique_ptr<StepContext> context_;  // heap-held: layers point at it
  // Heap-held so the layers' pointers to it survive moves of the model; null under f32.
  std::unique_ptr<ComputeWorkspace> workspace_;

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
  // A 16-bit model computes on its input rounded to the precision, as autocast does: the 16-bit
  // paths round it inside the first layer (Dense::takes_16, Conv2d::input_16, cuDNN, oneDNN).
  // Where the layers widen to f32 instead (the host without native 16-bit GEMMs: no working
  // weights in the workspace), the model rounds it here first and hands the first layer a 16-bit
  // input, which it widens block by block as it does any activation; so the same model
  // computes the same function on every device and path. [planned batch * sample] in the
  // precision (one more 16-bit activation), undefined elsewhere; the view is the last forward's.
  Tensor rounded_input_, rounded_view_;
  const Tensor& last_input() const {
    return rounded_input_.defined() ? rounded_view_ : flat_inputs_[last_input_];
  }
  bool have_forward_ = false;
};

}  // namespace mpt::nn
