// tests/gpu: nn::Model on the cuda device against the same model on the host, in fp32, fp16
// and bf16: same initialisation, same batch. The mlp: logits after forward and every parameter
// gradient after backward. The cnn, resnet-mini and a spec with the remaining layer kinds: also
// the loss, the BN running statistics, one SGD step and the logits after it. All in relative L2
// norm (tolerances: docs/gpu.md). Convolutions and pooling on the device go through cuDNN
// (checked: every top-level conv and pooling layer must have planned it), with looser
// tolerances than the im2col path (mptrain's own CUDA kernels), which runs the cnn and the conv
// shapes once more. cuDNN's max pooling may route a tied window's gradient to another of its
// equal maxima than the host; in these models ties are ReLU zeros, whose gradient the ReLU
// before the pooling masks either way. The conv shapes: odd sizes, stride 2, pad 0/1/2,
// 1x1, C_in = 1, a fused ReLU, a model planned for more samples than it runs (cuDNN's plan for
// another batch size). Then one whole training step (the sync-free step of gpu_bench's
// bench_model) captured as one kernels::StepGraph and replayed, against the same step run
// eagerly: bitwise. Skipped (exit 77) without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/device_memory.hpp"
#include "kernels/graph.hpp"
#include "kernels/softmax_xent.hpp"
#include "kernels/step_state.hpp"
#include "kernels/unscale_check.hpp"
#include "nn/conv2d.hpp"
#include "nn/nn.hpp"
#include "nn/pool2d_layer.hpp"
#include "optim/optim.hpp"
#include "tests/gpu/harness.hpp"
#include "tests/gpu/isolation.hpp"

#ifdef MPTRAIN_HAVE_KOKKOS
#include <Kokkos_Core.hpp>
#endif

namespace mpt::gpu_test {
namespace {

// ||got - want|| / ||want|| over all elements, both widened to f32 on the host.
double relative_error(const Tensor& got, const Tensor& want) {
  const Tensor g = host_f32(got), w = host_f32(want);
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < w.numel(); ++i) {
    const double d = static_cast<double>(g.data<float>()[i]) - w.data<float>()[i];
    diff += d * d;
    norm += static_cast<double>(w.data<float>()[i]) * w.data<float>()[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

void check_model(Harness& h, Random& rng, DType dtype, double tol) {
  const std::int64_t batch = 300;  // not a multiple of anything, and over no block boundary
  nn::Model host = nn::Model::build("mlp", {1, 28, 28}, 10, dtype);
  nn::Model device = nn::Model::build("mlp", {1, 28, 28}, 10, dtype, Device::cuda);
  for (nn::Model* model : {&host, &device}) {
    model->init_params(7);
    model->plan(batch);
  }
  h.expect(relative_error(device.params(), host.params()) == 0,
           std::string("model init on cuda = host [") + dtype_name(dtype) + "]");
  Tensor x = rng.tensor({batch, 1, 28, 28}, DType::f32);
  Tensor labels({batch}, DType::i32);
  for (std::int64_t i = 0; i < batch; ++i)
    labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.next() % 10);
  const Tensor& host_logits = host.forward(x, true);
  const Tensor& device_logits = device.forward(x.to(Device::cuda), true);
  const double logits_error = relative_error(device_logits, host_logits);
  char detail[96];
  std::snprintf(detail, sizeof detail, "relative error %.3g > %.3g", logits_error, tol);
  h.expect(logits_error <= tol, std::string("model forward logits [") + dtype_name(dtype) + "]",
           detail);
  Tensor dlogits(host_logits.shape(), DType::f32);
  kernels::softmax_xent_forward_backward(host_logits, labels, dlogits,
                                         1.f / static_cast<float>(batch));
  host.backward(dlogits);
  device.backward(dlogits.to(Device::cuda));
  const auto host_params = host.named_working_params();
  const auto device_params = device.named_working_params();
  for (std::size_t p = 0; p < host_params.size(); ++p) {
    const double error = relative_error(device_params[p].grad, host_params[p].grad);
    std::snprintf(detail, sizeof detail, "relative error %.3g > %.3g", error, tol);
    h.expect(error <= tol, "model backward " + host_params[p].name + " [" + dtype_name(dtype) + "]",
             detail);
  }
}

// ||v|| of a tensor, widened to f32 on the host.
double norm(const Tensor& t) {
  const Tensor v = host_f32(t);
  double sum = 0;
  for (std::int64_t i = 0; i < v.numel(); ++i)
    sum += static_cast<double>(v.data<float>()[i]) * v.data<float>()[i];
  return std::sqrt(sum);
}

// VALUES minus BEFORE (their earlier host copy), as f32 on the host.
Tensor update_of(const Tensor& values, const Tensor& before) {
  Tensor after = host_f32(values);
  for (std::int64_t i = 0; i < after.numel(); ++i)
    after.data<float>()[i] -= before.data<float>()[i];
  return after;
}

// One training step of SPEC on the device against the host, as the trainer steps it (without
// a loss scale): forward in training mode (dropout keyed alike), the loss, backward from the
// host's dlogits (so each layer's gradient is compared on the same input), the 16-bit
// gradients unscaled into the FP32 masters, one SGD step with momentum and the fused recast,
// and a second forward. Every comparison is relative L2 within TOL; a parameter gradient is
// measured against max(its own norm, 5% of the whole gradient's), since the bias of a conv
// that feeds a BN is zero in exact arithmetic and only rounding noise on both sides.
// PLAN_BATCH (0: BATCH) is the batch the models are planned for.
void check_training_step(Harness& h, Random& rng, const std::string& label, const std::string& spec,
                         const Shape& sample, std::int64_t batch, DType dtype, double tol,
                         std::int64_t plan_batch = 0) {
  const std::string tag = " " + label + " [" + dtype_name(dtype) + ", conv " +
                          nn::cuda_conv_path_name(nn::cuda_conv_path()) + "]";
  nn::Model host = nn::Model::build(spec, sample, 10, dtype);
  nn::Model device = nn::Model::build(spec, sample, 10, dtype, Device::cuda);
  for (nn::Model* model : {&host, &device}) {
    model->init_params(7);
    model->plan(plan_batch > 0 ? plan_batch : batch);
    model->set_rng(/*seed=*/11, /*step=*/3);
  }
  h.expect(relative_error(device.params(), host.params()) == 0, "init on cuda = host" + tag);
  // Every top-level conv and pooling layer on the device took the path asked for (a resblock's
  // are not visible).
#ifdef MPTRAIN_HAVE_CUDNN
  const bool want_cudnn = nn::cuda_conv_path() == nn::CudaConvPath::cudnn;
#else
  const bool want_cudnn = false;
#endif
  for (const auto& layer : device.layers())
    if (const auto* conv = dynamic_cast<const nn::Conv2d*>(layer.get()))
      h.expect(conv->uses_cudnn() == want_cudnn, "conv path of " + conv->name() + tag,
               conv->cudnn_plan());
    else if (const auto* pool = dynamic_cast<const nn::Pool2dLayer*>(layer.get()))
      h.expect(pool->uses_cudnn() == want_cudnn, "pooling path of " + pool->name() + tag);
  char detail[128];
  const auto expect_within = [&](const std::string& what, double error) {
    std::snprintf(detail, sizeof detail, "relative error %.3g > %.3g", error, tol);
    // The measured error is in the name, so a passing GPU run shows the margin too.
    char measured[48];
    std::snprintf(measured, sizeof measured, " (%.2g)", error);
    h.expect(error <= tol, what + tag + measured, detail);
  };
  Shape x_shape{batch};
  x_shape.insert(x_shape.end(), sample.begin(), sample.end());
  const Tensor x = rng.tensor(x_shape, DType::f32);
  const Tensor x_device = x.to(Device::cuda);
  Tensor labels({batch}, DType::i32);
  for (std::int64_t i = 0; i < batch; ++i)
    labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.next() % 10);
  const Tensor labels_device = labels.to(Device::cuda);

  // BN's running statistics start at (0, 1) on both; their change is what the forward adds.
  const Tensor buffers_before = host_f32(host.buffers());
  const Tensor& host_logits = host.forward(x, true);
  const Tensor& device_logits = device.forward(x_device, true);
  expect_within("forward logits", relative_error(device_logits, host_logits));
  if (host.buffers().numel() > 0)
    expect_within("BN running statistics' update",
                  relative_error(update_of(device.buffers(), buffers_before),
                                 update_of(host.buffers(), buffers_before)));
  const float grad_scale = 1.f / static_cast<float>(batch);
  Tensor dlogits(host_logits.shape(), DType::f32);
  Tensor dlogits_device(host_logits.shape(), DType::f32, Device::cuda);
  const double host_loss =
      kernels::softmax_xent_forward_backward(host_logits, labels, dlogits, grad_scale).loss_sum;
  const double device_loss = kernels::softmax_xent_forward_backward(device_logits, labels_device,
                                                                    dlogits_device, grad_scale)
                                 .loss_sum;
  expect_within("loss", std::abs(device_loss - host_loss) / std::abs(host_loss));

  host.backward(dlogits);
  device.backward(dlogits.to(Device::cuda));
  const double whole = norm(host.grads());
  const auto host_params = host.named_working_params();
  const auto device_params = device.named_working_params();
  for (std::size_t p = 0; p < host_params.size(); ++p) {
    const Tensor got = host_f32(device_params[p].grad), want = host_f32(host_params[p].grad);
    double diff = 0;
    for (std::int64_t i = 0; i < want.numel(); ++i) {
      const double d = static_cast<double>(got.data<float>()[i]) - want.data<float>()[i];
      diff += d * d;
    }
    const double scale = std::max({norm(want), 0.05 * whole, 1e-30});
    expect_within("backward " + host_params[p].name, std::sqrt(diff) / scale);
  }

  // The step: 16-bit gradients into the FP32 master gradients (under f32 they are one buffer),
  // then SGD with momentum on the masters and the recast of the working and compute copies.
  const Tensor masters_before = host_f32(host.master_params());
  optim::SgdOptions options;
  options.lr = 0.05f;
  options.momentum = 0.9f;
  optim::Sgd host_sgd(host.master_params(), host.master_grads(), options);
  optim::Sgd device_sgd(device.master_params(), device.master_grads(), options);
  if (dtype != DType::f32) {
    host_sgd.recast_into(host.params(), host.compute_params());
    device_sgd.recast_into(device.params(), device.compute_params());
    for (nn::Model* model : {&host, &device}) {
      std::vector<Tensor> grads{model->grads()}, masters{model->master_grads()};
      h.expect(kernels::unscale_and_check(grads, masters, 1.f), "finite gradients" + tag);
    }
  }
  host_sgd.step(options.lr);
  device_sgd.step(options.lr);
  expect_within("SGD update of the masters",
                relative_error(update_of(device.master_params(), masters_before),
                               update_of(host.master_params(), masters_before)));
  expect_within("forward logits after the step",
                relative_error(device.forward(x_device, false), host.forward(x, false)));
}

// One model with its optimizer and step state on the cuda device, stepped as
// perf/gpu/gpu_bench.cpp's bench_model (and the trainer) steps it: every decision on the
// device (kernels/step_state.hpp), no host synchronisation, so the step can be captured.
struct GraphTrainee {
  nn::Model model;
  std::unique_ptr<optim::Sgd> sgd;
  Tensor state, dlogits;
  std::vector<Tensor> grads, master_grads;
};

GraphTrainee make_graph_trainee(const std::string& spec, DType dtype, std::int64_t batch) {
  GraphTrainee t{
      nn::Model::build(spec, {1, 28, 28}, 10, dtype, Device::cuda), nullptr, {}, {}, {}, {}};
  t.model.init_params(7);
  t.model.plan(batch);
  optim::SgdOptions options;
  options.lr = 0.05f;
  options.momentum = 0.9f;
  t.sgd = std::make_unique<optim::Sgd>(t.model.master_params(), t.model.master_grads(), options);
  if (dtype != DType::f32) t.sgd->recast_into(t.model.params(), t.model.compute_params());
  kernels::StepState init;
  init.scale = dtype == DType::f16 ? 1024.0 : 1.0;  // fp16: the dynamic loss scale from 1024
  t.state = kernels::step_state_tensor(init, Device::cuda);
  t.dlogits = Tensor({batch, 10}, DType::f32, Device::cuda);
  t.grads = {t.model.grads()};
  t.master_grads = {t.model.master_grads()};
  return t;
}

void graph_trainee_step(GraphTrainee& t, const Tensor& x, const Tensor& labels,
                        const kernels::ScaleRule& rule, const Tensor& schedule) {
  kernels::begin_step(t.state);
  const Tensor& logits = t.model.forward(x, true);
  kernels::softmax_xent_step(logits, labels, t.dlogits, 1.f / static_cast<float>(x.dim(0)),
                             t.state);
  t.model.backward(t.dlogits);
  kernels::unscale_and_check_step(t.grads, t.master_grads, t.state);
  kernels::decide_step(t.state, rule, schedule);
  t.sgd->step(t.state);
}

// The fields of two StepStates that differ ("" when none): every field bitwise, except
// loss_sum, which the loss kernel adds up with one double atomicAdd per row, in whatever order
// the rows finish (eager or replayed alike), so it may differ in its last bits.
std::string step_state_differences(const kernels::StepState& got, const kernels::StepState& want) {
  // StepState has no padding (13 doubles, a uint64, 4 int32), so memcmp compares the fields.
  kernels::StepState got_rest = got, want_rest = want;
  got_rest.loss_sum = want_rest.loss_sum = 0;
  std::string differ;
  if (std::memcmp(&got_rest, &want_rest, sizeof got_rest) != 0) {
    char text[400];
    std::snprintf(text, sizeof text,
                  " fields other than loss_sum differ (got/want: scale %.17g/%.17g, applied "
                  "%.17g/%.17g, skipped %.17g/%.17g, lr %.17g/%.17g);",
                  got.scale, want.scale, got.applied_steps, want.applied_steps, got.skipped_steps,
                  want.skipped_steps, got.lr, want.lr);
    differ += text;
  }
  if (!(std::abs(got.loss_sum - want.loss_sum) <= 1e-12 * std::abs(want.loss_sum))) {
    char text[96];
    std::snprintf(text, sizeof text, " loss_sum: got %.17g, want %.17g;", got.loss_sum,
                  want.loss_sum);
    differ += text;
  }
  return differ;
}

// One training step of SPEC captured as ONE kernels::StepGraph (begin_step, forward, loss,
// backward, unscale and check, the skip decision, the SGD step) and replayed 3 times gives
// bitwise the masters, the working copy, the momentum and the step state of 3 eager steps from
// the same initial model. Both first take one eager step: cuBLASLt plans, cuDNN's first use and
// the kernels' grow-once scratch buffers are made then, outside the capture (which refuses
// allocation and synchronous copies).
void check_graph_step(Harness& h, Random& rng, const std::string& spec, DType dtype) {
  const std::string tag = " [" + spec + ", " + dtype_name(dtype) + "]";
  if (!kernels::graphs_supported()) {
    std::printf("  skip  StepGraph of a training step%s: MPTRAIN_CUDA_LEGACY_STREAM=1\n",
                tag.c_str());
    return;
  }
  const std::int64_t batch = 64;
  const Tensor x = rng.tensor({batch, 1, 28, 28}, DType::f32).to(Device::cuda);
  Tensor labels_host({batch}, DType::i32);
  for (std::int64_t i = 0; i < batch; ++i)
    labels_host.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.next() % 10);
  const Tensor labels = labels_host.to(Device::cuda);
  kernels::ScaleRule rule;
  rule.dynamic = dtype == DType::f16;
  const optim::Schedule constant(optim::ScheduleOptions{}, 0.05, 1);
  const Tensor schedule = optim::schedule_table(constant, 0, 0, 1, 0.f, 0.f, Device::cuda);

  GraphTrainee eager = make_graph_trainee(spec, dtype, batch);
  GraphTrainee replayed = make_graph_trainee(spec, dtype, batch);
  h.expect_same_bytes("StepGraph: same initial masters" + tag, replayed.model.master_params(),
                      eager.model.master_params());
  for (GraphTrainee* t : {&eager, &replayed}) graph_trainee_step(*t, x, labels, rule, schedule);

  const Tensor masters_before = replayed.model.master_params().to(Device::cpu);
  const Tensor state_before = replayed.state.to(Device::cpu);
  kernels::StepGraph graph("gpu_model step");
  graph.capture([&] { graph_trainee_step(replayed, x, labels, rule, schedule); });
  h.expect_same_bytes("StepGraph: the capture runs nothing (masters)" + tag,
                      replayed.model.master_params(), masters_before);
  h.expect_same_bytes("StepGraph: the capture runs nothing (step state)" + tag, replayed.state,
                      state_before);
  for (int i = 0; i < 3; ++i) {
    graph_trainee_step(eager, x, labels, rule, schedule);
    graph.replay();
  }
  h.expect_same_bytes("StepGraph: 3 replays = 3 eager steps (masters)" + tag,
                      replayed.model.master_params(), eager.model.master_params());
  h.expect_same_bytes("StepGraph: 3 replays = 3 eager steps (working copy)" + tag,
                      replayed.model.params(), eager.model.params());
  const auto eager_state = eager.sgd->state(), replayed_state = replayed.sgd->state();
  for (std::size_t i = 0; i < eager_state.size() && i < replayed_state.size(); ++i)
    h.expect_same_bytes("StepGraph: 3 replays = 3 eager steps (" + eager_state[i].name + ")" + tag,
                        replayed_state[i].value, eager_state[i].value);
  const kernels::StepState got = kernels::read_step_state(replayed.state);
  const kernels::StepState want = kernels::read_step_state(eager.state);
  const std::string differ = step_state_differences(got, want);
  h.expect(differ.empty(), "StepGraph: 3 replays = 3 eager steps (step state)" + tag, differ);
  h.expect(want.applied_steps + want.skipped_steps == 4, "StepGraph: 4 steps decided" + tag,
           "applied " + std::to_string(want.applied_steps) + ", skipped " +
               std::to_string(want.skipped_steps));
}

}  // namespace
}  // namespace mpt::gpu_test

int main(int argc, char** argv) {
  using namespace mpt::gpu_test;
  const IsolationArgs args = parse_isolation_args(argc, argv);
  if (mpt::device_memory::cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n",
                mpt::device_memory::cuda_device_description().c_str());
    return 77;
  }
  // Every check a case of its own, in a process that a crash in an earlier one cannot take
  // down (isolation.hpp), with its own seed and its own conv path.
  struct ModelCase {
    std::string name;
    std::function<void(Harness&, Random&)> run;
  };
  using mpt::DType;
  using mpt::nn::CudaConvPath;
  std::vector<ModelCase> cases;
  for (const auto& [dtype, tol] : std::vector<std::pair<DType, double>>{
           {DType::f32, 1e-5}, {DType::f16, 3e-3}, {DType::bf16, 2e-2}})
    cases.push_back({std::string("mlp ") + mpt::dtype_name(dtype),
                     [dtype, tol](Harness& h, Random& rng) { check_model(h, rng, dtype, tol); }});
  // Batch 70 is over a block boundary of both cnn convolutions (53 and 6 samples a block).
  // The rest: every other layer kind (GELU, average and strided max pooling, BatchNorm1d
  // after gap, dropout).
  const std::string others =
      "conv:8:3:pad=1,gelu,avgpool:2,conv:12:3:stride=2,bn,relu,maxpool:2:stride=1,gap,bn,"
      "dropout:0.3,dense:10";
  struct Case {
    const char* label;
    std::string spec;
    // The least tolerance in 16 bits. resnet-mini's conv weight gradients cancel heavily (each
    // conv feeds a BN, whose backward removes dy's mean), so the 16-bit roundings of dy that a
    // 1-ulp f32 difference flips, in whichever order the two sides sum, show as 1-3 % of dW at
    // fp16 and bf16 alike (the flips' number falls as their size grows): measured on the CUDA
    // emulator against the host, 2026-12-07, every other check of the step well inside.
    double min_tol_16 = 0;
  };
  // Odd planes, stride 2, pad 0/1/2, 1x1 kernels, C_in = 1 (the first conv reads the f32
  // input), ReLUs fused into convs. Planned for 77 samples and run with 70.
  struct ShapeCase {
    const char* label;
    std::string spec;
    mpt::Shape sample;
  };
  const ShapeCase shapes[] = {
      {"conv shapes 13x11",
       "conv:3:1,conv:5:3:stride=2:pad=1,relu,conv:4:5:pad=2,conv:6:3:stride=2,relu,flatten,"
       "dense:10",
       {1, 13, 11}},
      {"conv shapes 9x15",
       "conv:4:3:stride=2:pad=2,relu,conv:8:1:stride=2,flatten,dense:10",
       {1, 9, 15}},
  };
  // cuDNN sums in other orders than the host (and its 16-bit output is rounded before the
  // bias is added, and the first layer's f32 input is rounded to the storage dtype, as
  // autocast does), so its tolerances are looser than im2col's (docs/gpu.md).
  using Tolerances = std::vector<std::pair<DType, double>>;
  const Tolerances im2col_tol{{DType::f32, 1e-5}, {DType::f16, 3e-3}, {DType::bf16, 2e-2}};
  // fp32 1e-4, not 3e-5: the host side sums in oneDNN's order in a full build, and a conv bias
  // that feeds a BN (other layers' conv3) came out 4e-5 apart on the CUDA emulator.
  const Tolerances cudnn_tol{{DType::f32, 1e-4}, {DType::f16, 5e-3}, {DType::bf16, 3e-2}};
  const auto add_step = [&](CudaConvPath path, const std::string& label, const std::string& spec,
                            const mpt::Shape& sample, DType dtype, double tol,
                            std::int64_t plan_batch) {
    cases.push_back({"training step " + label + " [" + mpt::dtype_name(dtype) + ", conv " +
                         (path == CudaConvPath::cudnn ? "cudnn" : "im2col") + "]",
                     [=](Harness& h, Random& rng) {
                       mpt::nn::set_cuda_conv_path(path);
                       check_training_step(h, rng, label, spec, sample, 70, dtype, tol, plan_batch);
                     }});
  };
  for (const auto path : {CudaConvPath::cudnn, CudaConvPath::im2col}) {
    const bool cudnn = path == CudaConvPath::cudnn;
    const Tolerances& tols = cudnn ? cudnn_tol : im2col_tol;
    // The im2col path: the cnn again (its block boundaries) and the conv shapes.
    const std::vector<Case> steps =
        cudnn ? std::vector<Case>{{"cnn", "cnn"},
                                  {"resnet-mini", "resnet-mini", 5e-2},
                                  {"other layers", others},
                                  // The input cast to 16 bits first, as autocast does: the
                                  // first dense computes in 16 bits (no convolution here).
                                  {"mlp, input cast first",
                                   "flatten,dense:1024,relu,dense:1024,relu,dense:10"}}
              : std::vector<Case>{{"cnn", "cnn"}};
    for (const Case& c : steps)
      for (const auto& [dtype, tol] : tols)
        add_step(path, c.label, c.spec, {1, 28, 28}, dtype,
                 dtype == DType::f32 ? tol : std::max(tol, c.min_tol_16), 0);
    for (const ShapeCase& c : shapes)
      for (const auto& [dtype, tol] : tols)
        add_step(path, c.label, c.spec, c.sample, dtype, tol, 77);
  }
  // Whole training steps as CUDA graphs (kernels::StepGraph): the mlp, the cnn (conv, ReLU,
  // max pooling, dense) and resnet-mini (BatchNorm's per-channel arithmetic on the device,
  // residual blocks, global pooling); none has dropout, whose key changes every step.
  for (const auto& [spec, dtype] :
       std::vector<std::pair<std::string, DType>>{{"mlp", DType::f32},
                                                  {"mlp", DType::f16},
                                                  {"cnn", DType::f16},
                                                  {"resnet-mini", DType::f16}})
    cases.push_back({"StepGraph " + spec + " [" + mpt::dtype_name(dtype) + "]",
                     [spec, dtype](Harness& h, Random& rng) {
                       mpt::nn::set_cuda_conv_path(CudaConvPath::cudnn);
                       check_graph_step(h, rng, spec, dtype);
                     }});
  const IsolatedTotals totals = run_isolated(
      args, static_cast<int>(cases.size()),
      [&](int i) { return cases[static_cast<std::size_t>(i)].name; },
      [&](int i, Harness& harness) {
        std::printf("case %s\n", cases[static_cast<std::size_t>(i)].name.c_str());
        Random rng(99 + static_cast<std::uint64_t>(i));
        cases[static_cast<std::size_t>(i)].run(harness, rng);
      },
#ifdef MPTRAIN_HAVE_KOKKOS
      [&] { Kokkos::initialize(argc, argv); }, [] { Kokkos::finalize(); });
#else
      {}, {});
#endif
  return print_totals(totals);
}
