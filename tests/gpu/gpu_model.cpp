// tests/gpu: the mlp as nn::Model on the cuda device against the same model on the host, in
// fp32, fp16 and bf16: same initialisation, same batch; logits after forward and every
// parameter gradient after backward must agree in relative L2 norm (tolerances: docs/gpu.md).
// Skipped (exit 77) without a CUDA device.
#include <cmath>
#include <cstdio>

#include "core/device_memory.hpp"
#include "kernels/softmax_xent.hpp"
#include "nn/nn.hpp"
#include "tests/gpu/harness.hpp"

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
  for (std::int64_t i = 0; i < batch; ++i) labels.data<std::int32_t>()[i] = static_cast<std::int32_t>(rng.next() % 10);
  const Tensor& host_logits = host.forward(x, true);
  const Tensor& device_logits = device.forward(x.to(Device::cuda), true);
  const double logits_error = relative_error(device_logits, host_logits);
  char detail[96];
  std::snprintf(detail, sizeof detail, "relative error %.3g > %.3g", logits_error, tol);
  h.expect(logits_error <= tol, std::string("model forward logits [") + dtype_name(dtype) + "]", detail);
  Tensor dlogits(host_logits.shape(), DType::f32);
  kernels::softmax_xent_forward_backward(host_logits, labels, dlogits, 1.f / static_cast<float>(batch));
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

}  // namespace
}  // namespace mpt::gpu_test

int main(int argc, char** argv) {
  using namespace mpt::gpu_test;
  if (mpt::device_memory::cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", mpt::device_memory::cuda_device_description().c_str());
    return 77;
  }
#ifdef MPTRAIN_HAVE_KOKKOS
  Kokkos::initialize(argc, argv);
#endif
  Harness harness;
  {
    Random rng(99);
    check_model(harness, rng, mpt::DType::f32, 1e-5);
    check_model(harness, rng, mpt::DType::f16, 3e-3);
    check_model(harness, rng, mpt::DType::bf16, 2e-2);
  }
#ifdef MPTRAIN_HAVE_KOKKOS
  Kokkos::finalize();
#endif
  std::printf("%d passed, %d failed\n", harness.passed(), harness.failed());
  return harness.failed() == 0 ? 0 : 1;
}
