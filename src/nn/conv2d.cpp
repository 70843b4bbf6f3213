// Conv2d forward and backward, a block of samples at a time: im2col unfolds the block's windows
// side by side into col_ (planned once), and the work is one matmul with the (C_out, C_in*K*K)
// weight matrix per block. Per-sample GEMMs (N = OH*OW, as small as 49) left most of a core's
// FLOPs unused; a block's GEMM has N = block*OH*OW, and the weight gradient's inner dimension
// becomes the block's positions. The price is a reorder between NCHW samples and the GEMM's
// channel-major rows, one pass over the output, fused with the bias.
#include "nn/conv2d.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdlib>

#include "core/error.hpp"
#include "kernels/cast.hpp"
#include "kernels/matmul.hpp"
#include "nn/workspace.hpp"

namespace mpt::nn {

namespace {
constexpr std::size_t kWeight = 0, kBias = 1;
constexpr std::size_t kInSlot = 0, kOutSlot = 1, kDoutSlot = 2, kDinSlot = 3;
// Elements of a block's column matrix: 2^20 floats = 4 MiB (6 samples of the cnn's second conv,
// 53 of its first). From 2^16 to 2^22 the cnn's step time changed by less than this machine's
// noise (docs/perf.md); the block is at least one sample and at most the batch.
constexpr std::int64_t kBlockColumnElements = std::int64_t{1} << 20;

// A process-wide conv path: the environment VARIABLE (parsed by FROM_NAME) when set, else
// FALLBACK. One per Path type: the cuda device's and the host's.
template <class Path>
std::atomic<Path>& path_setting(const char* variable, Path fallback,
                                Path (*from_name)(const std::string&, const std::string&)) {
  static std::atomic<Path> path{[&] {
    const char* text = std::getenv(variable);
    return text && *text ? from_name(text, variable) : fallback;
  }()};
  return path;
}
std::atomic<CudaConvPath>& conv_path_setting() {
  return path_setting("MPTRAIN_CUDA_CONV", CudaConvPath::cudnn, cuda_conv_path_from_name);
}
std::atomic<HostConvPath>& host_conv_path_setting() {
  return path_setting("MPTRAIN_HOST_CONV", HostConvPath::onednn, host_conv_path_from_name);
}
}  // namespace

void set_host_conv_path(HostConvPath path) { host_conv_path_setting().store(path); }
HostConvPath host_conv_path() { return host_conv_path_setting().load(); }

HostConvPath host_conv_path_from_name(const std::string& name, const std::string& option) {
  if (name == "onednn") return HostConvPath::onednn;
  if (name == "im2col") return HostConvPath::im2col;
  throw_user_error(option + "='" + name + "' is not a host conv path", "use onednn or im2col");
}

const char* host_conv_path_name(HostConvPath path) {
  return path == HostConvPath::onednn ? "onednn" : "im2col";
}

void set_cuda_conv_path(CudaConvPath path) { conv_path_setting().store(path); }
CudaConvPath cuda_conv_path() { return conv_path_setting().load(); }

CudaConvPath cuda_conv_path_from_name(const std::string& name, const std::string& option) {
  if (name == "cudnn") return CudaConvPath::cudnn;
  if (name == "im2col") return CudaConvPath::im2col;
  throw_user_error(option + "='" + name + "' is not a conv path", "use cudnn or im2col");
}

const char* cuda_conv_path_name(CudaConvPath path) {
  return path == CudaConvPath::cudnn ? "cudnn" : "im2col";
}

Conv2d::Conv2d(std::string name, const Shape& input_shape, std::int64_t out_channels,
               std::int64_t kernel, std::int64_t stride, std::int64_t pad)
    : Layer(std::move(name)), out_channels_(out_channels) {
  if (input_shape.size() != 3 || out_channels < 1 || kernel < 1 || stride < 1 || pad < 0 ||
      kernel > input_shape[1] + 2 * pad || kernel > input_shape[2] + 2 * pad)
    abort_job("nn::Conv2d " + this->name() + ": bad geometry for input " +
              shape_to_string(input_shape));
  geometry_ = {input_shape[0], input_shape[1], input_shape[2], kernel, stride, pad};
}

std::string Conv2d::spec() const {
  std::string text =
      "conv:" + std::to_string(out_channels_) + ":" + std::to_string(geometry_.kernel);
  if (geometry_.stride != 1) text += ":stride=" + std::to_string(geometry_.stride);
  if (geometry_.pad != 0) text += ":pad=" + std::to_string(geometry_.pad);
  return text;
}

Shape Conv2d::output_shape(const Shape&) const {
  return {out_channels_, geometry_.out_height(), geometry_.out_width()};
}

double Conv2d::flops_per_sample(const Shape&) const {
  // A multiply-add per weight per output position, plus the bias add.
  const double positions = static_cast<double>(geometry_.col_columns());
  return positions * static_cast<double>(out_channels_) *
         (2.0 * static_cast<double>(geometry_.col_rows()) + 1.0);
}

std::vector<ParamSpec> Conv2d::param_specs() const {
  // He (Kaiming) uniform for a ReLU network: U(±sqrt(6 / fan_in)), fan_in = C_in*K*K, so the
  // activations keep their variance through conv+relu; the bias starts at zero.
  const auto fan_in = static_cast<double>(geometry_.col_rows());
  const auto bound = static_cast<float>(std::sqrt(6.0 / fan_in));
  return {
      {"weight", {out_channels_, geometry_.channels, geometry_.kernel, geometry_.kernel}, bound},
      {"bias", {out_channels_}, 0.f}};
}

void Conv2d::plan(std::int64_t max_batch, DType precision) {
  uses_cudnn_ = plan_cudnn(max_batch, precision);
  uses_dnnl_ = !uses_cudnn_ && plan_dnnl(max_batch, precision);
  takes_16_ = false;
  col16_ = rows16_ = x16_ = Tensor();
  if (uses_cudnn_ || uses_dnnl_) {  // none of the im2col path's scratch
    col_ = rows_ = weight_grad_ = bias_grad_ = Tensor();
    staging_ = SampleStaging();
    block_ = 0;
    return;
  }
  const std::int64_t per_sample = geometry_.col_rows() * geometry_.col_columns();
  block_ = requested_block_ > 0 ? requested_block_
                                : std::max<std::int64_t>(1, kBlockColumnElements / per_sample);
  block_ = std::max<std::int64_t>(1, std::min(block_, std::max<std::int64_t>(1, max_batch)));
  const std::int64_t columns = block_ * geometry_.col_columns();
  // On the model's device, like the activations they stage (Layer::set_device).
  col_ = Tensor({geometry_.col_rows(), columns}, DType::f32, device_);
  rows_ = Tensor({out_channels_, columns}, DType::f32, device_);
  const std::int64_t in = block_ * geometry_.channels * geometry_.height * geometry_.width;
  const std::int64_t out = block_ * out_channels_ * geometry_.col_columns();
  staging_.plan(precision, device_, {in, out, out, in});
  if (precision != DType::f32) {
    weight_grad_ = Tensor({out_channels_, geometry_.col_rows()}, DType::f32, device_);
    bias_grad_ = Tensor({out_channels_}, DType::f32, device_);
  }
  // The model's workspace (set before plan()) holds the working weights exactly where the
  // matmul takes the 16-bit dtype; a layer planned alone has none and widens.
  takes_16_ = precision != DType::f32 && has_working_weights();
  if (takes_16_) {
    col16_ = Tensor({geometry_.col_rows(), columns}, precision, device_);
    rows16_ = Tensor({out_channels_, columns}, precision, device_);
    x16_ = Tensor({in}, precision, device_);
  }
}

const Tensor& Conv2d::input_16(const Tensor& x, std::int64_t first, std::int64_t count) {
  const std::int64_t in = geometry_.channels * geometry_.height * geometry_.width;
  Tensor::view_into(input_run_, x, first * in, {count, in});
  if (x.dtype() == storage_) return input_run_;
  Tensor::view_into(x16_run_, x16_, 0, {count, in});
  kernels::cast(input_run_, x16_run_);  // the f32 input of the first layer, rounded
  return x16_run_;
}

const Tensor& Conv2d::unfold(const Tensor& x, std::int64_t first, std::int64_t count) {
  const std::int64_t in = geometry_.channels * geometry_.height * geometry_.width;
  const std::int64_t columns = count * geometry_.col_columns();
  if (takes_16_) {
    Tensor::view_into(col16_block_, col16_, 0, {geometry_.col_rows(), columns});
    kernels::im2col(input_16(x, first, count), geometry_, col16_block_);
    return col16_block_;
  }
  Tensor::view_into(col_block_, col_, 0, {geometry_.col_rows(), columns});
  kernels::im2col(staging_.read_run(x, first, count, in, kInSlot), geometry_, col_block_);
  return col_block_;
}

bool Conv2d::plan_cudnn(std::int64_t max_batch, DType precision) {
  storage_ = precision;
#ifdef MPTRAIN_HAVE_CUDNN
  if (device_ != Device::cuda || cuda_conv_path() != CudaConvPath::cudnn) return false;
  return cudnn_.plan(geometry_, out_channels_, std::max<std::int64_t>(1, max_batch), precision,
                     fused_relu_);
#else
  (void)max_batch;
  return false;
#endif
}

bool Conv2d::plan_dnnl(std::int64_t max_batch, DType precision) {
  dnnl_ = kernels::host::DnnlConv2d();
  if (device_ != Device::cpu || host_conv_path() != HostConvPath::onednn ||
      kernels::matmul_backend() != kernels::MatmulBackend::dnnl)
    return false;
  // A 16-bit conv reads its weight in the working copy, which only a model's workspace holds.
  if (precision != DType::f32 && !has_working_weights()) return false;
  return dnnl_.plan(geometry_, out_channels_, std::max<std::int64_t>(1, max_batch), precision,
                    fused_relu_);
}

bool Conv2d::has_working_weights() const {
  return workspace_ && workspace_->working_params.defined();
}

std::string Conv2d::dnnl_plan() const {
  if (device_ != Device::cpu) return "not on the host";
  return dnnl_.describe();
}

std::string Conv2d::cudnn_plan() const {
#ifdef MPTRAIN_HAVE_CUDNN
  if (device_ != Device::cuda) return "not on the cuda device";
  return cudnn_.describe();
#else
  return "built without cuDNN";
#endif
}

const Tensor& Conv2d::storage_weight(const char* caller) {
  const Tensor& weight = param_value(kWeight);  // a view of the f32 compute copy
  if (storage_ == DType::f32) return weight;
  if (!has_working_weights())
    abort_job("nn::Conv2d::" + std::string(caller) + " " + name() +
              ": 16-bit convolutions need the model's workspace (plan() the model)");
  const auto offset = static_cast<std::int64_t>(
      (static_cast<const std::byte*>(weight.raw()) -
       static_cast<const std::byte*>(workspace_->compute_params.raw())) / sizeof(float));
  Tensor::view_into(weight16_, workspace_->working_params, offset,
                    {out_channels_, geometry_.channels, geometry_.kernel, geometry_.kernel});
  return weight16_;
}

std::int64_t Conv2d::scratch_bytes() const {
  // The cuDNN path's scratch is one buffer per device that every conv shares (counted once,
  // by the device arena), so a layer adds nothing of its own.
  if (uses_cudnn_) return 0;
  if (uses_dnnl_) return dnnl_.scratch_bytes();
  std::int64_t bytes = staging_.scratch_bytes();
  for (const Tensor* t : {&col_, &rows_, &weight_grad_, &bias_grad_, &col16_, &rows16_, &x16_})
    if (t->defined()) bytes += static_cast<std::int64_t>(t->size_bytes());
  return bytes;
}

void Conv2d::forward(const Tensor& x, Tensor& y, bool) {
#ifdef MPTRAIN_HAVE_CUDNN
  if (uses_cudnn_) return cudnn_.forward(x, storage_weight("forward"), param_value(kBias), y);
#endif
  if (uses_dnnl_) return dnnl_.forward(x, storage_weight("forward"), param_value(kBias), y);
  if (!col_.defined()) abort_job("nn::Conv2d::forward " + name() + ": plan() the model first");
  const std::int64_t positions = geometry_.col_columns();
  const std::int64_t out = out_channels_ * positions;
  const Tensor& weight = takes_16_ ? storage_weight("forward") : param_value(kWeight);
  Tensor::view_into(weight_2d_, weight, 0, {out_channels_, geometry_.col_rows()});
  for (std::int64_t first = 0; first < x.dim(0); first += block_) {
    const std::int64_t count = std::min(block_, x.dim(0) - first);
    Tensor::view_into(rows_block_, rows_, 0, {out_channels_, count * positions});
    const Tensor& windows = unfold(x, first, count);
    // rows[C_out, B*P] = W[C_out, C_in*K*K] · col[C_in*K*K, B*P], then y[b] = rows[:, b] + bias.
    kernels::matmul(weight_2d_, false, windows, false, rows_block_);
    kernels::channel_rows_to_samples(rows_block_, param_value(kBias),
                                     staging_.write_run(y, first, count, out, kOutSlot),
                                     fused_relu_);
    staging_.commit(kOutSlot);
  }
}

void Conv2d::backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dx) {
#ifdef MPTRAIN_HAVE_CUDNN
  // cuDNN sums dW and db over the whole batch in f32 and rounds once into the gradients' dtype,
  // the contract of weight_grad_ and bias_grad_ below.
  if (uses_cudnn_)
    return cudnn_.backward(x, storage_weight("backward"), y, dy, param_grad(kWeight),
                           param_grad(kBias), dx);
#endif
  if (uses_dnnl_)
    return dnnl_.backward(x, storage_weight("backward"), y, dy, param_grad(kWeight),
                          param_grad(kBias), dx);
  const std::int64_t in = geometry_.channels * geometry_.height * geometry_.width;
  const std::int64_t positions = geometry_.col_columns();
  const std::int64_t out = out_channels_ * positions;
  // Summed over the blocks in f32: straight into f32 gradients, else in f32 scratch rounded once.
  const bool f32_grads = param_grad(kWeight).dtype() == DType::f32;
  Tensor& dw = f32_grads ? param_grad(kWeight) : weight_grad_;
  Tensor& db = f32_grads ? param_grad(kBias) : bias_grad_;
  const Tensor& weight = takes_16_ ? storage_weight("backward") : param_value(kWeight);
  Tensor::view_into(weight_2d_, weight, 0, {out_channels_, geometry_.col_rows()});
  Tensor::view_into(weight_grad_2d_, dw, 0, {out_channels_, geometry_.col_rows()});
  for (std::int64_t first = 0; first < x.dim(0); first += block_) {
    const std::int64_t count = std::min(block_, x.dim(0) - first);
    const bool first_block = first == 0;
    Tensor::view_into(rows_block_, rows_, 0, {out_channels_, count * positions});
    const Tensor& windows = unfold(x, first, count);
    // With the ReLU fused, dy is the ReLU's output gradient: masked by y (read in its storage
    // dtype, not widened) on the way.
    if (fused_relu_) Tensor::view_into(output_run_, y, first * out, {count, out});
    kernels::samples_to_channel_rows(staging_.read_run(dy, first, count, out, kDoutSlot),
                                     rows_block_, fused_relu_ ? &output_run_ : nullptr);
    // The 16-bit GEMMs take dy's rows in the storage dtype: exact, since dy was 16-bit.
    const Tensor* dy_rows = &rows_block_;
    if (takes_16_) {
      Tensor::view_into(rows16_block_, rows16_, 0, {out_channels_, count * positions});
      kernels::cast(rows_block_, rows16_block_);
      dy_rows = &rows16_block_;
    }
    // dW += dy[C_out, B*P] · colᵀ; db += row sums of dy.
    kernels::matmul(*dy_rows, false, windows, true, weight_grad_2d_, first_block ? 0.f : 1.f);
    kernels::channel_bias_backward(rows_block_, db, /*accumulate=*/!first_block);
    if (!dx) continue;
    // dcol = Wᵀ · dy, into col_ in f32 (on the f32 path its windows are used up), then folded
    // back onto dx.
    Tensor::view_into(col_block_, col_, 0, {geometry_.col_rows(), count * positions});
    kernels::matmul(weight_2d_, true, *dy_rows, false, col_block_);
    kernels::col2im(col_block_, geometry_, staging_.write_run(*dx, first, count, in, kDinSlot));
    staging_.commit(kDinSlot);
  }
  if (x.dim(0) == 0) {
    dw.zero();
    db.zero();
  }
  if (!f32_grads) {
    kernels::cast(weight_grad_, param_grad(kWeight));
    kernels::cast(bias_grad_, param_grad(kBias));
  }
}

}  // namespace mpt::nn
