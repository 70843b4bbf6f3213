// The whole convolution through oneDNN on the host (see host::DnnlConv2d in kernels/conv2d.hpp):
// the CPU's counterpart of the cuDNN path. oneDNN picks each primitive's memory formats
// (blocked nChw16c-like layouts for its JIT and AMX kernels); the layer's tensors stay NCHW, so
// each call reorders between the two where they differ, a pass over a tensor that costs a small
// part of the unfolded column matrix the im2col path writes (25 values per input at 5x5).
// Primitives are made once per batch size (plan() for the largest; a short last batch gets its
// own the first time it is seen), and each reorder the first time it is needed, so a
// steady-state call creates nothing.
#include "kernels/conv2d.hpp"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "kernels/cast.hpp"
#include "kernels/matmul.hpp"
#include "kernels/relu.hpp"

#ifdef MPTRAIN_HAVE_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace mpt::kernels::host {

#ifdef MPTRAIN_HAVE_DNNL

namespace {
using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

dt dnnl_type(DType dtype) { return dtype == DType::bf16 ? dt::bf16 : dt::f32; }

// The primitives of one batch size, made once, and the reorders its calls need, made the first
// time each is needed: a steady-state call creates nothing.
struct BatchPlan {
  dnnl::convolution_forward::primitive_desc forward;
  dnnl::convolution_backward_data::primitive_desc backward_data;
  dnnl::convolution_backward_weights::primitive_desc backward_weights;
  dnnl::convolution_forward forward_primitive;
  dnnl::convolution_backward_data backward_data_primitive;
  dnnl::convolution_backward_weights backward_weights_primitive;
  struct Reorder {
    dnnl::memory::desc from, to;
    dnnl::reorder primitive;
  };
  std::vector<Reorder> reorders;  // a few per plan: a linear search

  BatchPlan(dnnl::convolution_forward::primitive_desc f,
            dnnl::convolution_backward_data::primitive_desc d,
            dnnl::convolution_backward_weights::primitive_desc w)
      : forward(std::move(f)), backward_data(std::move(d)), backward_weights(std::move(w)),
        forward_primitive(forward), backward_data_primitive(backward_data),
        backward_weights_primitive(backward_weights) {}

  const dnnl::reorder& reorder(const dnnl::memory::desc& from, const dnnl::memory::desc& to,
                               const dnnl::engine& engine) {
    for (const Reorder& r : reorders)
      if (r.from == from && r.to == to) return r.primitive;
    reorders.push_back({from, to, dnnl::reorder(dnnl::reorder::primitive_desc(engine, from, engine, to))});
    return reorders.back().primitive;
  }
};
}  // namespace

struct DnnlConv2d::State {
  Conv2dGeometry g;
  std::int64_t out_channels = 0, max_batch = 0;
  DType dtype = DType::f32;
  bool relu = false;
  std::string why;
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<std::int64_t, BatchPlan> plans;
  // Scratch for the primitives' own layouts (bytes, grown only when a plan needs more), the
  // ReLU-masked dy (plain, DTYPE) and f32 bias gradient sums.
  Tensor src, dst, weights, backward_weights, diff_dst, diff_dst_weights, src_weights, diff_src,
      diff_weights, masked_dy, bias_sums;
  Tensor masked_view;

  BatchPlan make_plan(std::int64_t n) const {
    const dt type = dnnl_type(dtype);
    const dims src_dims{n, g.channels, g.height, g.width};
    const dims weight_dims{out_channels, g.channels, g.kernel, g.kernel};
    const dims dst_dims{n, out_channels, g.out_height(), g.out_width()};
    // The same padding on both sides: oneDNN's output size is (H + 2P - K) / S + 1 rounded
    // down, as the geometry's, so a stride that leaves the last padded rows unread is fine.
    const dims strides{g.stride, g.stride}, left{g.pad, g.pad}, right = left;
    const dnnl::memory::desc src_any(src_dims, type, tag::any), weight_any(weight_dims, type, tag::any),
        dst_any(dst_dims, type, tag::any), bias(dims{out_channels}, dt::f32, tag::a),
        weight_grad_any(weight_dims, dt::f32, tag::any);
    dnnl::primitive_attr attr;
    if (relu) {
      dnnl::post_ops ops;
      ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
      attr.set_post_ops(ops);
    }
    const dnnl::convolution_forward::primitive_desc forward(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                        dnnl::algorithm::convolution_direct, src_any, weight_any,
                                        bias, dst_any, strides, left, right),
        attr, engine);
    const dnnl::convolution_backward_data::primitive_desc backward_data(
        dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, src_any,
                                              weight_any, dst_any, strides, left, right),
        engine, forward);
    const dnnl::convolution_backward_weights::desc backward_weights_desc(
        dnnl::algorithm::convolution_direct, src_any, weight_grad_any, bias, dst_any, strides,
        left, right);
    dnnl::convolution_backward_weights::primitive_desc backward_weights(backward_weights_desc,
                                                                        engine, forward);
    // oneDNN 2.6's AMX backward-weights kernel runs a single input channel (a grayscale first
    // layer) at 60 % of the AVX512-BF16 kernel's rate (docs/perf.md: 2.8 against 1.7 ms for
    // the cnn's first layer, batch 128); from 3 channels on AMX is the faster. So a
    // one-channel bf16 layer takes the AVX512-BF16 kernel where oneDNN offers it: a fixed rule,
    // so that every run of a configuration computes with the same kernels, in the same order.
    if (type == dt::bf16 && g.channels == 1 &&
        std::string(backward_weights.impl_info_str()).find("amx") != std::string::npos) {
      dnnl::convolution_backward_weights::primitive_desc candidate(backward_weights_desc,
                                                                   engine, forward);
      while (candidate.next_impl())
        if (std::string(candidate.impl_info_str()).find("avx512_core_bf16") != std::string::npos) {
          backward_weights = candidate;
          break;
        }
    }
    return BatchPlan(forward, backward_data, backward_weights);
  }

  // The plan for batch N, made the first time N is seen (plan() makes the first, and declines
  // where oneDNN cannot); its scratch grown to fit.
  BatchPlan& plan_for(std::int64_t n) {
    auto found = plans.find(n);
    if (found != plans.end()) return found->second;
    try {
      return adopt(n, make_plan(n));
    } catch (const dnnl::error& error) {
      abort_job("kernels::DnnlConv2d: oneDNN cannot make the primitives for a batch of " +
                std::to_string(n) + " (" + describe_geometry() + "): " + error.what());
    }
  }

  // PLAN as batch N's, with the scratch grown to fit its layouts.
  BatchPlan& adopt(std::int64_t n, BatchPlan plan) {
    const auto fit = [](Tensor& buffer, const dnnl::memory::desc& desc) {
      const auto bytes = static_cast<std::int64_t>(desc.get_size());
      if (!buffer.defined() || buffer.numel() < bytes) buffer = Tensor({bytes}, DType::u8);
    };
    fit(src, plan.forward.src_desc());
    fit(dst, plan.forward.dst_desc());
    fit(weights, plan.forward.weights_desc());
    fit(backward_weights, plan.backward_data.weights_desc());
    fit(diff_dst, plan.backward_data.diff_dst_desc());
    fit(diff_src, plan.backward_data.diff_src_desc());
    fit(diff_dst_weights, plan.backward_weights.diff_dst_desc());
    fit(src_weights, plan.backward_weights.src_desc());
    fit(diff_weights, plan.backward_weights.diff_weights_desc());
    const std::int64_t dst_numel = n * out_channels * g.col_columns();
    if (relu && (!masked_dy.defined() || masked_dy.numel() < dst_numel))
      masked_dy = Tensor({dst_numel}, dtype);
    if (!bias_sums.defined()) bias_sums = Tensor({out_channels}, DType::f32);
    return plans.emplace(n, std::move(plan)).first->second;
  }

  std::string describe_geometry() const {
    return "C=" + std::to_string(g.channels) + " " + std::to_string(g.height) + "x" +
           std::to_string(g.width) + " K=" + std::to_string(g.kernel) +
           " S=" + std::to_string(g.stride) + " P=" + std::to_string(g.pad) + " -> " +
           std::to_string(out_channels) + " channels, " + dtype_name(dtype);
  }

  // T's NCHW (or OIHW) memory, on its own buffer.
  dnnl::memory user(const Tensor& t, const dims& shape, tag layout) {
    return dnnl::memory(dnnl::memory::desc(shape, dnnl_type(t.dtype()), layout), engine,
                        const_cast<void*>(t.raw()));
  }
  // USER in the layout WANT: USER itself when it already is, else reordered into SCRATCH (the
  // reorder also converts f32 to bf16: rounding to nearest even, as kernels::cast).
  dnnl::memory in_layout(BatchPlan& plan, const dnnl::memory::desc& want,
                         const dnnl::memory& from, Tensor& scratch) {
    if (want == from.get_desc()) return from;
    dnnl::memory source = from, to(want, engine, scratch.raw());  // handles: copies share
    plan.reorder(from.get_desc(), want, engine).execute(stream, source, to);
    return to;
  }
  // Where a primitive writes a result whose caller's memory is TO: TO itself when the layouts
  // agree, else SCRATCH in the primitive's layout, which finish() then reorders into TO.
  dnnl::memory out_layout(const dnnl::memory::desc& have, const dnnl::memory& to, Tensor& scratch) {
    return have == to.get_desc() ? to : dnnl::memory(have, engine, scratch.raw());
  }
  void finish(BatchPlan& plan, const dnnl::memory& result, const dnnl::memory& to) {
    if (result.get_data_handle() == to.get_data_handle()) return;
    dnnl::memory source = result, target = to;  // handles: copies share the memory
    plan.reorder(result.get_desc(), to.get_desc(), engine).execute(stream, source, target);
  }
};

DnnlConv2d::DnnlConv2d() = default;
DnnlConv2d::~DnnlConv2d() = default;
DnnlConv2d::DnnlConv2d(DnnlConv2d&&) noexcept = default;
DnnlConv2d& DnnlConv2d::operator=(DnnlConv2d&&) noexcept = default;

bool DnnlConv2d::plan(const Conv2dGeometry& g, std::int64_t out_channels, std::int64_t max_batch,
                      DType dtype, bool relu) {
  state_ = std::make_unique<State>();
  State& s = *state_;
  s.g = g;
  s.out_channels = out_channels;
  s.max_batch = max_batch;
  s.dtype = dtype;
  s.relu = relu;
  const auto refuse = [&](std::string why) {
    s.why = std::move(why);
    s.plans.clear();
    return false;
  };
  if (dtype != DType::f32 && !(dtype == DType::bf16 && host_matmul_takes(DType::bf16)))
    return refuse(std::string(dtype_name(dtype)) +
                  " has no oneDNN convolution with native arithmetic on this CPU");
  try {
    s.adopt(max_batch, s.make_plan(max_batch));
  } catch (const dnnl::error& error) {  // no kernel for this geometry and dtype: im2col's
    return refuse(std::string("oneDNN: ") + error.what());
  }
  // A reference (plain C++) kernel is slower than the im2col path: leave the layer to it.
  const BatchPlan& p = s.plans.begin()->second;
  for (const std::string& impl : {std::string(p.forward.impl_info_str()),
                                 std::string(p.backward_data.impl_info_str()),
                                 std::string(p.backward_weights.impl_info_str())})
    if (impl.rfind("ref", 0) == 0) return refuse("oneDNN has only its reference kernel (" + impl + ")");
  return true;
}

bool DnnlConv2d::planned() const { return state_ && !state_->plans.empty(); }

std::string DnnlConv2d::describe() const {
  if (!state_) return "not planned";
  if (state_->plans.empty()) return state_->why;
  const BatchPlan& p = state_->plans.at(state_->max_batch);
  return std::string("fwd=") + p.forward.impl_info_str() +
         " bwd_data=" + p.backward_data.impl_info_str() +
         " bwd_weights=" + p.backward_weights.impl_info_str();
}

std::int64_t DnnlConv2d::scratch_bytes() const {
  if (!planned()) return 0;
  std::int64_t bytes = 0;
  for (const Tensor* t : {&state_->src, &state_->dst, &state_->weights, &state_->backward_weights,
                          &state_->diff_dst, &state_->diff_dst_weights, &state_->src_weights,
                          &state_->diff_src, &state_->diff_weights, &state_->masked_dy,
                          &state_->bias_sums})
    if (t->defined()) bytes += static_cast<std::int64_t>(t->size_bytes());
  return bytes;
}

void DnnlConv2d::validate(const char* op, const Tensor& x, const Tensor& weight) const {
  if (!planned()) abort_job(std::string(op) + ": plan() it first (or plan() returned false)");
  const State& s = *state_;
  const std::int64_t sample = s.g.channels * s.g.height * s.g.width;
  detail::require(x.defined() && x.device() == Device::cpu && x.rank() >= 1 &&
                      (x.dtype() == s.dtype || x.dtype() == DType::f32) &&
                      x.numel() == x.dim(0) * sample && x.dim(0) <= s.max_batch,
                  op, "x must be [n <= max_batch, C, H, W] of the plan, in its dtype or f32", x);
  detail::require(weight.defined() && weight.device() == Device::cpu && weight.dtype() == s.dtype &&
                      weight.numel() == s.out_channels * s.g.col_rows(),
                  op, "weight must be [K, C, k, k] in the plan's dtype on the host", weight);
}

void DnnlConv2d::forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y) {
  constexpr const char* op = "kernels::DnnlConv2d::forward";
  validate(op, x, weight);
  State& s = *state_;
  const std::int64_t n = x.dim(0);
  detail::require(bias.defined() && bias.dtype() == DType::f32 && bias.device() == Device::cpu &&
                      bias.numel() == s.out_channels,
                  op, "bias must be f32 [K] on the host", bias);
  detail::require(y.defined() && y.device() == Device::cpu && y.dtype() == s.dtype &&
                      y.numel() == n * s.out_channels * s.g.col_columns(),
                  op, "y must be [n, K, OH, OW] in the plan's dtype on the host", y);
  if (n == 0) return;
  BatchPlan& p = s.plan_for(n);
  const dims x_dims{n, s.g.channels, s.g.height, s.g.width};
  const dims w_dims{s.out_channels, s.g.channels, s.g.kernel, s.g.kernel};
  const dims y_dims{n, s.out_channels, s.g.out_height(), s.g.out_width()};
  const dnnl::memory src =
      s.in_layout(p, p.forward.src_desc(), s.user(x, x_dims, tag::nchw), s.src);
  const dnnl::memory w =
      s.in_layout(p, p.forward.weights_desc(), s.user(weight, w_dims, tag::oihw), s.weights);
  const dnnl::memory b = s.user(bias, dims{s.out_channels}, tag::a);
  const dnnl::memory y_user = s.user(y, y_dims, tag::nchw);
  const dnnl::memory dst = s.out_layout(p.forward.dst_desc(), y_user, s.dst);
  p.forward_primitive.execute(s.stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w},
                                         {DNNL_ARG_BIAS, b}, {DNNL_ARG_DST, dst}});
  s.finish(p, dst, y_user);
  s.stream.wait();
}

void DnnlConv2d::backward(const Tensor& x, const Tensor& weight, const Tensor& y, const Tensor& dy,
                          Tensor& weight_grad, Tensor& bias_grad, Tensor* dx) {
  constexpr const char* op = "kernels::DnnlConv2d::backward";
  validate(op, x, weight);
  State& s = *state_;
  const std::int64_t n = x.dim(0);
  const std::int64_t out_numel = n * s.out_channels * s.g.col_columns();
  detail::require(dy.defined() && dy.device() == Device::cpu && dy.dtype() == s.dtype &&
                      dy.numel() == out_numel,
                  op, "dy must be [n, K, OH, OW] in the plan's dtype on the host", dy);
  detail::require(weight_grad.defined() && weight_grad.device() == Device::cpu &&
                      (weight_grad.dtype() == DType::f32 || weight_grad.dtype() == s.dtype) &&
                      weight_grad.numel() == weight.numel(),
                  op, "weight_grad must be shaped like weight, f32 or in the plan's dtype", weight_grad);
  detail::require(bias_grad.defined() && bias_grad.device() == Device::cpu &&
                      (bias_grad.dtype() == DType::f32 || bias_grad.dtype() == s.dtype) &&
                      bias_grad.numel() == s.out_channels,
                  op, "bias_grad must be [K], f32 or in the plan's dtype", bias_grad);
  if (dx)
    detail::require_pair(dx->defined() && dx->device() == Device::cpu && dx->dtype() == x.dtype() &&
                             dx->numel() == x.numel(),
                         op, "dx must be shaped like x, in x's dtype", x, *dx);
  if (n == 0) {  // the gradients of no samples
    weight_grad.zero();
    bias_grad.zero();
    return;
  }
  BatchPlan& p = s.plan_for(n);
  const dims x_dims{n, s.g.channels, s.g.height, s.g.width};
  const dims w_dims{s.out_channels, s.g.channels, s.g.kernel, s.g.kernel};
  const dims y_dims{n, s.out_channels, s.g.out_height(), s.g.out_width()};
  // With the ReLU fused into the forward, DY is its output's gradient: masked by Y first.
  const Tensor* gradient = &dy;
  if (s.relu) {
    detail::require_pair(y.defined() && y.dtype() == s.dtype && y.numel() == out_numel, op,
                         "y must be the forward's output, like dy", y, dy);
    Tensor::view_into(s.masked_view, s.masked_dy, 0, {out_numel});
    relu_backward(y, dy, s.masked_view);
    gradient = &s.masked_view;
  }
  const dnnl::memory dy_user = s.user(*gradient, y_dims, tag::nchw);
  const dnnl::memory x_user = s.user(x, x_dims, tag::nchw);
  // The weight and bias gradients: summed in f32 by oneDNN, rounded once on the way out.
  const dnnl::memory src_w = s.in_layout(p, p.backward_weights.src_desc(), x_user, s.src_weights);
  const dnnl::memory diff_dst_w =
      s.in_layout(p, p.backward_weights.diff_dst_desc(), dy_user, s.diff_dst_weights);
  const dnnl::memory dw_user = s.user(weight_grad, w_dims, tag::oihw);
  const dnnl::memory dw = s.out_layout(p.backward_weights.diff_weights_desc(), dw_user, s.diff_weights);
  const bool f32_bias = bias_grad.dtype() == DType::f32;
  const dnnl::memory db = s.user(f32_bias ? bias_grad : s.bias_sums, dims{s.out_channels}, tag::a);
  p.backward_weights_primitive.execute(
      s.stream, {{DNNL_ARG_SRC, src_w}, {DNNL_ARG_DIFF_DST, diff_dst_w},
                 {DNNL_ARG_DIFF_WEIGHTS, dw}, {DNNL_ARG_DIFF_BIAS, db}});
  s.finish(p, dw, dw_user);
  if (dx) {
    // The same reordered dy where both primitives chose one layout.
    const dnnl::memory diff_dst =
        p.backward_data.diff_dst_desc() == diff_dst_w.get_desc()
            ? diff_dst_w
            : s.in_layout(p, p.backward_data.diff_dst_desc(), dy_user, s.diff_dst);
    const dnnl::memory w = s.in_layout(p, p.backward_data.weights_desc(),
                                       s.user(weight, w_dims, tag::oihw), s.backward_weights);
    const dnnl::memory dx_user = s.user(*dx, x_dims, tag::nchw);
    const dnnl::memory diff_src = s.out_layout(p.backward_data.diff_src_desc(), dx_user, s.diff_src);
    p.backward_data_primitive.execute(s.stream, {{DNNL_ARG_DIFF_DST, diff_dst},
                                                 {DNNL_ARG_WEIGHTS, w},
                                                 {DNNL_ARG_DIFF_SRC, diff_src}});
    s.finish(p, diff_src, dx_user);
  }
  s.stream.wait();
  if (!f32_bias) cast(s.bias_sums, bias_grad);
}

#else  // no oneDNN: plan() always declines, and the layer keeps its im2col path

struct DnnlConv2d::State {};
DnnlConv2d::DnnlConv2d() = default;
DnnlConv2d::~DnnlConv2d() = default;
DnnlConv2d::DnnlConv2d(DnnlConv2d&&) noexcept = default;
DnnlConv2d& DnnlConv2d::operator=(DnnlConv2d&&) noexcept = default;
bool DnnlConv2d::plan(const Conv2dGeometry&, std::int64_t, std::int64_t, DType, bool) { return false; }
bool DnnlConv2d::planned() const { return false; }
std::string DnnlConv2d::describe() const { return "built without oneDNN"; }
std::int64_t DnnlConv2d::scratch_bytes() const { return 0; }
void DnnlConv2d::validate(const char* op, const Tensor&, const Tensor&) const {
  abort_job(std::string(op) + ": plan() it first (this build has no oneDNN: plan() always declines)");
}
void DnnlConv2d::forward(const Tensor& x, const Tensor& weight, const Tensor&, Tensor&) {
  validate("kernels::DnnlConv2d::forward", x, weight);
}
void DnnlConv2d::backward(const Tensor& x, const Tensor& weight, const Tensor&, const Tensor&,
                          Tensor&, Tensor&, Tensor*) {
  validate("kernels::DnnlConv2d::backward", x, weight);
}

#endif

}  // namespace mpt::kernels::host
