// gpu_bench: one-GPU throughput of the CUDA kernels, on synthetic in-memory data.
//   1. cuBLASLt GEMM through kernels::matmul: TFLOP/s at a few square sizes, fp32/fp16/bf16.
//   2. A KERNEL-LEVEL mlp training step (784-1024-1024-10, ReLU, softmax cross-entropy, SGD
//      with momentum 0.9), composed from the kernels/ API on Device::cuda, not nn::Model: the
//      forward and backward GEMMs take 16-bit operands straight from the working copy
//      (FP32 accumulate, f32 results), bias/ReLU/loss in f32, fp16 with a fixed loss scale and
//      the fused unscale-and-check, then the SGD update over flat FP32 masters fused with the
//      recast of the 16-bit working copy. Prints one line per precision:
//        mptrain-kernels model=mlp precision=fp16 batch=256 steps=200 samples_per_s=123.4
//   3. The same mlp as nn::Model on Device::cuda with optim::Sgd, as the trainer steps it:
//        mptrain-model model=mlp precision=fp16 batch=256 steps=200 samples_per_s=123.4 graphs=off
//      With --model cnn (or resnet-mini) that model instead, on 28x28 one-channel samples, and
//      no kernel-level step (2 exists for the mlp only). --conv cudnn|im2col picks how its conv
//      layers compute (nn::CudaConvPath; default cudnn), and the line names it:
//        mptrain-model model=cnn precision=fp16 batch=256 steps=200 samples_per_s=123.4 conv=cudnn
//          graphs=off
//      With --graphs the whole step is captured once, after the warm-up steps, as one CUDA
//      graph (kernels::StepGraph) and the timed steps are its replays (graphs=on); the
//      kernel-level step (2) is skipped then, since its fp16 overflow check reads a flag on the
//      host, which a capture cannot contain.
// perf/gpu_check.sh runs it beside perf/pytorch_gpu.py (the same model in PyTorch AMP).
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/device_memory.hpp"
#include "core/error.hpp"
#include "kernels/bias.hpp"
#include "kernels/cast.hpp"
#include "kernels/copy.hpp"
#include "kernels/graph.hpp"
#include "kernels/matmul.hpp"
#include "kernels/relu.hpp"
#include "kernels/sgd.hpp"
#include "kernels/softmax_xent.hpp"
#include "kernels/step_state.hpp"
#include "kernels/unscale_check.hpp"
#include "nn/nn.hpp"
#include "optim/optim.hpp"

#ifdef MPTRAIN_HAVE_KOKKOS
#include <Kokkos_Core.hpp>
#endif

namespace mpt {
namespace {

namespace k = kernels;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) abort_job(std::string("gpu_bench: ") + what + ": " + cudaGetErrorString(status));
}

// Seconds of GPU time for CALLS calls of BODY, between two events on the legacy default stream,
// which orders them after and before the work of the (blocking) compute stream.
template <class Body>
double time_gpu(int calls, const Body& body, bool profiled = false) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  // A timed step loop is the profiler's range (ncu --profile-from-start off profiles only
  // these kernels, not the set-up, warm-up or capture); a no-op without a profiler.
  if (profiled) check(cudaProfilerStart(), "cudaProfilerStart");
  check(cudaEventRecord(start), "cudaEventRecord");
  for (int i = 0; i < calls; ++i) body(i);
  check(cudaEventRecord(stop), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  if (profiled) check(cudaProfilerStop(), "cudaProfilerStop");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1e3;
}

const char* precision_name(DType dtype) {
  return dtype == DType::f32 ? "fp32" : dtype == DType::f16 ? "fp16" : "bf16";
}

// A host tensor of uniform values in [-scale, scale), copied to the device.
Tensor random_device(Shape shape, DType dtype, float scale, unsigned seed) {
  Tensor wide(shape, DType::f32);
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t i = 0; i < wide.numel(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    wide.data<float>()[i] = scale * (static_cast<float>(state >> 40) / 8388608.f - 1.f);
  }
  Tensor host(shape, dtype);
  k::cast(wide, host);
  return host.to(Device::cuda);
}

void bench_gemm() {
  for (std::int64_t size : {1024, 4096, 8192})
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      Tensor a = random_device({size, size}, dtype, 1.f, 1), b = random_device({size, size}, dtype, 1.f, 2);
      Tensor c({size, size}, dtype, Device::cuda);
      const int calls = size <= 1024 ? 200 : size <= 4096 ? 40 : 10;
      time_gpu(3, [&](int) { k::matmul(a, false, b, false, c); });  // plan + warm up
      const double seconds = time_gpu(calls, [&](int) { k::matmul(a, false, b, false, c); });
      const double flops = 2.0 * size * size * size * calls;
      std::printf("gemm precision=%s m=n=k=%lld tflops=%.1f\n", precision_name(dtype),
                  static_cast<long long>(size), flops / seconds / 1e12);
      std::fflush(stdout);
    }
}

struct Dense {
  std::int64_t in, out;
  Tensor w, b, w_work, dw, db;  // views of the flat masters, working copy and gradients
  Tensor z;                     // f32 [B, out]: pre-activation, then ReLU output in place
  Tensor act;                   // the next layer's input in the compute dtype (z itself in fp32)
  Tensor grad_in;               // f32 [B, in]: gradient w.r.t. this layer's input
  Tensor grad_out_work;         // [B, out] in the compute dtype (16-bit only)
};

double bench_mlp(DType dtype, std::int64_t batch, int steps, int warmup) {
  const std::int64_t widths[] = {784, 1024, 1024, 10};
  std::int64_t total = 0;
  for (int l = 0; l < 3; ++l) total += widths[l] * widths[l + 1] + widths[l + 1];
  Tensor master = random_device({total}, DType::f32, 0.03f, 7);
  const bool half = dtype != DType::f32;
  Tensor working({total}, half ? dtype : DType::f32, Device::cuda);
  if (half) k::cast(master, working);
  Tensor grads({total}, DType::f32, Device::cuda), momentum({total}, DType::f32, Device::cuda);

  std::vector<Dense> layers(3);
  std::int64_t offset = 0;
  for (int l = 0; l < 3; ++l) {
    Dense& d = layers[static_cast<std::size_t>(l)];
    d.in = widths[l];
    d.out = widths[l + 1];
    d.w = Tensor::view(master, offset, {d.out, d.in});
    d.w_work = half ? Tensor::view(working, offset, {d.out, d.in}) : d.w;
    d.dw = Tensor::view(grads, offset, {d.out, d.in});
    offset += d.out * d.in;
    d.b = Tensor::view(master, offset, {d.out});
    d.db = Tensor::view(grads, offset, {d.out});
    offset += d.out;
    d.z = Tensor({batch, d.out}, DType::f32, Device::cuda);
    d.act = half ? Tensor({batch, d.out}, dtype, Device::cuda) : d.z;
    d.grad_in = Tensor({batch, d.in}, DType::f32, Device::cuda);
    if (half) d.grad_out_work = Tensor({batch, d.out}, dtype, Device::cuda);
  }
  // A ring of 8 synthetic batches on the device, as perf/pytorch_gpu.py keeps.
  std::vector<Tensor> inputs, labels;
  for (unsigned r = 0; r < 8; ++r) {
    inputs.push_back(random_device({batch, 784}, DType::f32, 1.f, 100 + r));
    Tensor y({batch}, DType::i32);
    for (std::int64_t i = 0; i < batch; ++i) y.data<std::int32_t>()[i] = static_cast<std::int32_t>((i * 7 + r) % 10);
    labels.push_back(y.to(Device::cuda));
  }
  Tensor x_work = half ? Tensor({batch, 784}, dtype, Device::cuda) : Tensor();
  Tensor dlogits({batch, 10}, DType::f32, Device::cuda);
  const float loss_scale = dtype == DType::f16 ? 1024.f : 1.f;
  std::vector<Tensor> grad_list{grads};

  const auto step = [&](int i) {
    const Tensor& x = inputs[static_cast<std::size_t>(i % 8)];
    if (half) k::cast(x, x_work);
    const Tensor* input = half ? &x_work : &x;
    for (int l = 0; l < 3; ++l) {
      Dense& d = layers[static_cast<std::size_t>(l)];
      k::matmul(*input, false, d.w_work, true, d.z);  // 16-bit operands, f32 result
      k::bias_add_forward(d.z, d.b);
      if (l < 2) {
        k::relu_forward(d.z, d.z);
        if (half) k::cast(d.z, d.act);
      }
      input = &d.act;
    }
    k::softmax_xent_forward_backward(layers[2].z, labels[static_cast<std::size_t>(i % 8)], dlogits,
                                     loss_scale / static_cast<float>(batch));
    const Tensor* grad = &dlogits;  // f32 gradient w.r.t. the current layer's output
    for (int l = 2; l >= 0; --l) {
      Dense& d = layers[static_cast<std::size_t>(l)];
      const Tensor* grad_work = grad;
      if (half) {
        k::cast(*grad, d.grad_out_work);
        grad_work = &d.grad_out_work;
      }
      const Tensor& layer_input = l == 0 ? (half ? x_work : x) : layers[static_cast<std::size_t>(l - 1)].act;
      k::matmul(*grad_work, true, layer_input, false, d.dw);  // dW = g^T x
      k::bias_add_backward(*grad, d.db);
      if (l > 0) {
        k::matmul(*grad_work, false, d.w_work, false, d.grad_in);  // dx = g W
        k::relu_backward(layers[static_cast<std::size_t>(l - 1)].z, d.grad_in, d.grad_in);
        grad = &d.grad_in;
      }
    }
    bool finite = true;
    if (dtype == DType::f16) finite = k::unscale_and_check(grad_list, grad_list, 1.f / loss_scale);
    if (finite)
      k::sgd_update(master, grads, momentum, 0.01f, 0.9f, 0.f, false, i == 0, half ? &working : nullptr,
                    nullptr);
  };
  time_gpu(warmup, step);
  const double seconds = time_gpu(steps, [&](int i) { step(i + warmup); }, true);
  return static_cast<double>(batch) * steps / seconds;
}

// The model NAME (the mlp by default) as the real nn::Model on Device::cuda:
// Model::forward/backward, the loss, the unscale of the 16-bit gradients into the FP32 master
// gradients (fp16: dynamic loss scale from 1024 and the overflow check; bf16: scale 1), the
// skip decision and optim::Sgd with the fused recast, as the trainer steps: every decision on
// the device, no host synchronisation inside the step. Dense layers feed 16-bit activations and weights
// straight to cuBLASLt. With GRAPHS the step after the warm-up is captured as one StepGraph and
// the timed steps replay it.
double bench_model(const std::string& name, DType dtype, std::int64_t batch, int steps,
                   int warmup, bool graphs) {
  nn::Model model = nn::Model::build(name, {1, 28, 28}, 10, dtype, Device::cuda);
  model.init_params(42);
  model.plan(batch);
  optim::SgdOptions options;
  options.lr = 0.01f;
  options.momentum = 0.9f;
  optim::Sgd sgd(model.master_params(), model.master_grads(), options);
  const bool half = dtype != DType::f32;
  if (half) sgd.recast_into(model.params(), model.compute_params());
  std::vector<Tensor> inputs, labels;
  for (unsigned r = 0; r < 8; ++r) {
    inputs.push_back(random_device({batch, 1, 28, 28}, DType::f32, 1.f, 200 + r));
    Tensor y({batch}, DType::i32);
    for (std::int64_t i = 0; i < batch; ++i) y.data<std::int32_t>()[i] = static_cast<std::int32_t>((i * 3 + r) % 10);
    labels.push_back(y.to(Device::cuda));
  }
  Tensor dlogits({batch, 10}, DType::f32, Device::cuda);
  // The step's decisions on the device, as the trainer makes them (kernels/step_state.hpp):
  // fp16 starts at a loss scale of 1024 under the dynamic rule; no host synchronisation.
  k::StepState init;
  init.scale = dtype == DType::f16 ? 1024.0 : 1.0;
  Tensor state = k::step_state_tensor(init, Device::cuda);
  k::ScaleRule rule;
  rule.dynamic = dtype == DType::f16;
  const optim::Schedule constant(optim::ScheduleOptions{}, options.lr, 1);
  const Tensor table = optim::schedule_table(constant, 0, 0, 1, 0.f, 0.f, Device::cuda);
  std::vector<Tensor> grads{model.grads()}, master_grads{model.master_grads()};
  const auto step = [&](int i) {
    k::begin_step(state);
    const Tensor& logits = model.forward(inputs[static_cast<std::size_t>(i % 8)], true);
    k::softmax_xent_step(logits, labels[static_cast<std::size_t>(i % 8)], dlogits,
                         1.f / static_cast<float>(batch), state);
    model.backward(dlogits);
    k::unscale_and_check_step(grads, master_grads, state);
    k::decide_step(state, rule, table);
    sgd.step(state);
  };
  time_gpu(warmup, step);
  double seconds = 0;
  if (graphs) {
    // A graph replays fixed buffers, so every replay trains on the same ring slot (the trainer
    // copies each batch into fixed buffers first; here the data does not change the work). The
    // capture comes after the warm-up, which made the plans and scratch buffers it must not
    // allocate. Not timed: instantiation is a one-off.
    k::StepGraph graph("gpu_bench " + name + " step");
    graph.capture([&] { step(warmup); });
    seconds = time_gpu(steps, [&](int) { graph.replay(); }, true);
  } else {
    seconds = time_gpu(steps, [&](int i) { step(i + warmup); }, true);
  }
  return static_cast<double>(batch) * steps / seconds;
}

int run(int argc, char** argv) {
  int steps = 200, warmup = 20;
  std::int64_t batch = 256;
  bool gemm = true, graphs = false, kernel_step = true;
  std::string model = "mlp";
  nn::CudaConvPath conv = nn::cuda_conv_path();
  std::vector<DType> precisions{DType::f32, DType::f16, DType::bf16};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw_user_error(arg + " needs a value", "see gpu_bench --help");
      return argv[++i];
    };
    if (arg == "--steps") steps = std::stoi(value());
    else if (arg == "--warmup") warmup = std::stoi(value());
    else if (arg == "--batch") batch = std::stoll(value());
    else if (arg == "--no-gemm") gemm = false;
    else if (arg == "--graphs") graphs = true;
    else if (arg == "--model-only") kernel_step = false;
    else if (arg == "--model") model = value();
    else if (arg == "--conv") conv = nn::cuda_conv_path_from_name(value(), "--conv");
    else if (arg == "--precision") {
      const DType d = dtype_from_name(value(), "--precision");
      MPT_REQUIRE(d == DType::f32 || d == DType::f16 || d == DType::bf16,
                  "--precision: '" + std::string(argv[i]) + "' is not a training precision",
                  "use fp32, fp16 or bf16");
      precisions = {d};
    }
    else if (arg == "--help") {
      std::printf(
          "usage: gpu_bench [--steps N] [--warmup N] [--batch B] [--precision fp32|fp16|bf16] "
          "[--model mlp|cnn|resnet-mini|SPEC] [--conv cudnn|im2col] [--no-gemm] [--graphs] [--model-only]\n"
          "  --graphs      capture each nn::Model step as one CUDA graph and time its replays\n"
          "                (default off; skips the kernel-level mlp step)\n"
          "  --model-only  time nn::Model alone, without the kernel-level mlp step\n"
          "  Each timed loop is a profiler range: ncu --profile-from-start off profiles it alone.\n");
      return 0;
    } else {
      throw_user_error("unknown option " + arg, "see gpu_bench --help");
    }
  }
  MPT_REQUIRE(steps > 0 && warmup >= 0 && batch > 0, "--steps/--warmup/--batch",
              "steps and batch must be positive");
  // A name, or any model spec (docs/model-spec.md; a bad one is refused by Model::build).
  MPT_REQUIRE(model == "mlp" || model == "cnn" || model == "resnet-mini" ||
                  model.find(':') != std::string::npos,
              "--model '" + model + "' is not a model gpu_bench knows",
              "use mlp, cnn, resnet-mini or a spec such as flatten,dense:1024,relu,dense:10");
  MPT_REQUIRE(!graphs || warmup >= 1, "--graphs with --warmup 0",
              "the capture needs an eager step first (plans, scratch buffers): --warmup 1 or more");
  MPT_REQUIRE(!graphs || k::graphs_supported(),
              "--graphs: the compute stream is the legacy default stream "
              "(MPTRAIN_CUDA_LEGACY_STREAM=1), which CUDA graphs cannot capture",
              "unset MPTRAIN_CUDA_LEGACY_STREAM, or drop --graphs");
  {
    // The model as a host model first, so a bad spec, or --graphs on a model that cannot be
    // captured, is refused before the device is looked for (and so on a machine without one).
    // As the trainer refuses --cuda.graphs: a replay would reuse the captured dropout mask.
    const nn::Model probe = nn::Model::build(model, {1, 28, 28}, 10, DType::f32, Device::cpu);
    if (graphs && !probe.graph_blocker().empty())
      throw_user_error("--graphs: model '" + model + "' cannot be captured: " + probe.graph_blocker(),
                       "drop --graphs for this model");
  }
  if (device_memory::cuda_device_count() == 0) {
    std::printf("gpu_bench: SKIPPED: no CUDA device (%s)\n", device_memory::cuda_device_description().c_str());
    return 0;
  }
  std::printf("gpu_bench on %s\n", device_memory::cuda_device_description().c_str());
  if (gemm) bench_gemm();
  // The kernel-level step reads its fp16 overflow flag on the host: never captured.
  for (DType dtype : model == "mlp" && !graphs && kernel_step ? precisions : std::vector<DType>{}) {
    const double rate = bench_mlp(dtype, batch, steps, warmup);
    std::printf("mptrain-kernels model=mlp precision=%s batch=%lld steps=%d samples_per_s=%.1f\n",
                precision_name(dtype), static_cast<long long>(batch), steps, rate);
    std::fflush(stdout);
  }
  nn::set_cuda_conv_path(conv);
  // The path the conv layers were asked to take (a layer without a cuDNN algorithm for its shape
  // keeps im2col; tests/gpu/gpu_model checks that the cnn's have one).
  const std::string conv_field =
      model == "mlp" ? "" : std::string(" conv=") + nn::cuda_conv_path_name(conv);
  for (DType dtype : precisions) {
    const double rate = bench_model(model, dtype, batch, steps, warmup, graphs);
    std::printf(
        "mptrain-model model=%s precision=%s batch=%lld steps=%d samples_per_s=%.1f%s graphs=%s\n",
        model.c_str(), precision_name(dtype), static_cast<long long>(batch), steps, rate,
        conv_field.c_str(), graphs ? "on" : "off");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace mpt

int main(int argc, char** argv) {
#ifdef MPTRAIN_HAVE_KOKKOS
  Kokkos::initialize(argc, argv);
#endif
  int code = 0;
  try {
    code = mpt::run(argc, argv);
  } catch (const mpt::UserError& error) {
    std::fprintf(stderr, "%s\n", mpt::format_user_error(error).c_str());
    code = 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gpu_bench: error: %s\n", error.what());
    code = 2;
  }
#ifdef MPTRAIN_HAVE_KOKKOS
  Kokkos::finalize();
#endif
  return code;
}
