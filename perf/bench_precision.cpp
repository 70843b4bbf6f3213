// Mixed precision on the host: one training step of the 784-1024-1024-10 MLP in fp32, fp16 and
// bf16, timed side by side (alternating, median of repetitions, ratios against fp32), and the
// peak resident memory of one precision at a large batch (one process per precision).
//   bench_precision step   [--batch 128] [--reps 15] [--steps 5]
//   bench_precision memory --precision fp32|fp16|bf16 [--batch 16384]
#include <omp.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/random.hpp"
#include "core/tensor.hpp"
#include "kernels/softmax_xent.hpp"
#include "kernels/unscale_check.hpp"
#include "nn/nn.hpp"
#include "optim/optim.hpp"

namespace {

using mpt::DType;
using mpt::Tensor;

constexpr const char* kUsage =
    "usage: bench_precision step [--batch B (128)] [--reps R (15)] [--steps S (5)]\n"
    "       bench_precision memory --precision fp32|fp16|bf16 [--batch B (16384)]\n";

// The loss scale: fp16's default; fp32 and bf16 run unscaled, as they will in training.
float loss_scale_for(DType precision) { return precision == DType::f16 ? 65536.f : 1.f; }

Tensor random_input(std::int64_t batch, std::uint64_t seed) {
  Tensor t({batch, 1, 28, 28}, DType::f32);
  const mpt::CounterRng rng(seed, 0);
  float* data = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    data[i] = 2.f * rng.uniform(static_cast<std::uint64_t>(i)) - 1.f;
  return t;
}

// Everything one precision's training step touches, planned once.
struct StepRig {
  StepRig(DType precision, std::int64_t batch)
      : model(mpt::nn::Model::build("mlp", {1, 28, 28}, 10, precision)),
        labels({batch}, DType::i32),
        dlogits({batch, 10}, DType::f32) {
    model.init_params(1);
    model.plan(batch);
    sgd = std::make_unique<mpt::optim::Sgd>(model.master_params(), model.master_grads(),
                                            mpt::optim::SgdOptions{});
    if (precision != DType::f32) sgd->recast_into(model.params(), model.compute_params());
    for (std::int64_t i = 0; i < batch; ++i)
      labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(i % 10);
    grads[0] = model.grads();
    master_grads[0] = model.master_grads();
    scale = loss_scale_for(precision);
  }

  // forward, softmax-xent (dlogits already times S / batch), backward, unscale-and-check into
  // the f32 master gradients (in place under fp32), SGD on the masters, recast. One rank, so
  // the all-reduce is left out.
  void step(const Tensor& input) {
    const Tensor& logits = model.forward(input, true);
    mpt::kernels::softmax_xent_forward_backward(logits, labels, dlogits,
                                                scale / static_cast<float>(input.dim(0)));
    model.backward(dlogits);
    if (mpt::kernels::unscale_and_check(grads, master_grads, 1.f / scale)) {
      sgd->step(0.01f);  // with the recast fused in, as the trainer does
    } else {
      ++skipped;
    }
  }

  mpt::nn::Model model;
  std::unique_ptr<mpt::optim::Sgd> sgd;
  Tensor labels, dlogits;
  Tensor grads[1], master_grads[1];
  float scale = 1.f;
  long skipped = 0;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

int run_step_mode(std::int64_t batch, int reps, int steps) {
  const DType precisions[3] = {DType::f32, DType::f16, DType::bf16};
  std::vector<std::unique_ptr<StepRig>> rigs;
  for (DType p : precisions) rigs.push_back(std::make_unique<StepRig>(p, batch));
  const Tensor ring[2] = {random_input(batch, 1), random_input(batch, 2)};
  for (auto& rig : rigs)
    for (int i = 0; i < 3; ++i) rig->step(ring[i % 2]);  // warm-up: primitives, caches, pages
  std::vector<double> ms[3];
  for (int rep = 0; rep < reps; ++rep) {
    // Alternate, and rotate the order so that no precision always runs first after the others.
    for (int k = 0; k < 3; ++k) {
      const int which = (rep + k) % 3;
      const auto start = std::chrono::steady_clock::now();
      for (int s = 0; s < steps; ++s) rigs[which]->step(ring[s % 2]);
      const std::chrono::duration<double, std::milli> elapsed =
          std::chrono::steady_clock::now() - start;
      ms[which].push_back(elapsed.count() / steps);
    }
  }
  std::printf(
      "MLP 784-1024-1024-10, batch %lld, %d thread(s), %d reps x %d steps, median [min-max] "
      "ms/step\n",
      static_cast<long long>(batch), omp_get_max_threads(), reps, steps);
  // On a shared machine the load drifts between repetitions; the ratio within one repetition
  // (its three runs are adjacent) is steadier than the ratio of medians, so report both, and
  // the ratio of the fastest runs, which the load disturbs least.
  std::printf(
      "| precision | ms/step | ratio of medians | median of per-rep ratios | ratio of minima | "
      "skipped |\n"
      "| --- | ---: | ---: | ---: | ---: | ---: |\n");
  const double base = median(ms[0]);
  const double base_min = *std::min_element(ms[0].begin(), ms[0].end());
  for (int k = 0; k < 3; ++k) {
    const auto [lo, hi] = std::minmax_element(ms[k].begin(), ms[k].end());
    std::vector<double> ratios;
    for (int rep = 0; rep < reps; ++rep) ratios.push_back(ms[k][rep] / ms[0][rep]);
    std::printf("| %s | %.2f [%.2f-%.2f] | %.3f | %.3f | %.3f | %ld |\n",
                mpt::dtype_name(precisions[k]), median(ms[k]), *lo, *hi, median(ms[k]) / base,
                median(ratios), *lo / base_min, rigs[k]->skipped);
  }
  return 0;
}

// A field of /proc/self/status in KiB ("VmRSS", "VmHWM").
long status_kib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(status, line))
    if (line.rfind(key, 0) == 0) return std::atol(line.c_str() + key.size());
  return -1;
}

int run_memory_mode(DType precision, std::int64_t batch) {
  const long start_kib = status_kib("VmRSS");
  // The data loader's side, identical for every precision: the f32 input batch. Allocated (and
  // zero-filled, so resident) before the baseline.
  const Tensor input = random_input(batch, 1);
  const long baseline_kib = status_kib("VmRSS");
  StepRig rig(precision, batch);
  for (int i = 0; i < 2; ++i) rig.step(input);
  const long peak_kib = status_kib("VmHWM");
  std::printf(
      "precision=%s batch=%lld peak_minus_baseline_mib=%.1f peak_with_input_mib=%.1f "
      "activation_mib=%.1f params=%lld skipped=%ld\n",
      mpt::dtype_name(precision), static_cast<long long>(batch), (peak_kib - baseline_kib) / 1024.0,
      (peak_kib - start_kib) / 1024.0, rig.model.activation_bytes() / 1048576.0,
      static_cast<long long>(rig.model.num_params()), rig.skipped);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::initialize(argc, argv);
  int code = 0;
  {
    const std::string mode = argc > 1 ? argv[1] : "";
    std::int64_t batch = mode == "memory" ? 16384 : 128;
    int reps = 15, steps = 5;
    std::string precision_name;
    bool bad = mode != "step" && mode != "memory";
    for (int i = 2; i + 1 < argc && !bad; i += 2) {
      const std::string flag = argv[i], value = argv[i + 1];
      if (flag == "--batch")
        batch = std::atoll(value.c_str());
      else if (flag == "--reps")
        reps = std::atoi(value.c_str());
      else if (flag == "--steps")
        steps = std::atoi(value.c_str());
      else if (flag == "--precision")
        precision_name = value;
      else
        bad = true;
    }
    if (argc % 2 != 0 || batch < 1 || reps < 1 || steps < 1 ||
        (mode == "memory" && precision_name.empty()))
      bad = true;
    if (bad) {
      std::fputs(kUsage, stderr);
      code = 2;
    } else if (mode == "step") {
      code = run_step_mode(batch, reps, steps);
    } else {
      try {
        code = run_memory_mode(mpt::dtype_from_name(precision_name, "--precision"), batch);
      } catch (const mpt::UserError& error) {
        std::fprintf(stderr, "bench_precision: %s (hint: %s)\n", error.what(),
                     error.hint().c_str());
        code = 2;
      }
    }
  }
  Kokkos::finalize();
  return code;
}
