// The prefetcher delivering to the cuda device (issue #8: pinned host buffers, host->device
// copies on the I/O threads' own streams): every batch's device copy equals a direct read, for
// several depths and I/O thread counts, and a slot is not refilled on the device while kernels
// launched on its previous batch are still queued (the copy waits for release()'s mark); the
// same with the uint8 samples delivered as stored (deliver_to's raw_u8, --data.normalize). Full
// build only (it needs MPI, HDF5 and the data module); skipped (exit 77) without a device.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/device_memory.hpp"
#include "data/data.hpp"
#include "kernels/add.hpp"
#include "kernels/copy.hpp"
#include "kernels/matmul.hpp"
#include "kernels/normalize.hpp"
#include "tests/gpu/harness.hpp"

#ifdef MPTRAIN_HAVE_KOKKOS
#include <Kokkos_Core.hpp>
#endif

namespace {

using namespace mpt;
constexpr int kSkipCode = 77;  // SKIP_RETURN_CODE in tests/gpu/CMakeLists.txt

// Each batch: BACKLOG large matmuls (milliseconds of work each) and then a few kernels that add
// the device samples into an accumulator are launched and left queued before release(), so the
// GPU is still to read the slot when the I/O thread gets it back: without the copy's wait on
// release()'s mark, the next batch of the slot would land under them. The accumulator is
// compared with the same sums of a direct host read: identical bits (one f32 add each). RAW:
// u8 batches, turned into floats by normalize_u8 with scale 1 and shift 0 (exact) on each side
// before the adds.
void check(gpu_test::Harness& harness, const std::string& file, const data::ShardPlan& plan,
           int depth, int io_threads, int backlog, std::int64_t batches, bool raw = false) {
  constexpr int kAdds = 4;
  const std::string name = "depth " + std::to_string(depth) + ", io-threads " +
                           std::to_string(io_threads) + ", " + std::to_string(backlog) +
                           " matmuls queued before release" + (raw ? ", raw uint8" : "");
  data::DatasetReader reference(file, {}), first(file, {}), second(file, {});
  data::PrefetchOptions options;
  options.depth = depth;
  options.io_threads = io_threads;
  data::Prefetcher prefetcher({&first, &second}, plan, options);
  prefetcher.deliver_to(Device::cuda, raw);
  prefetcher.start(0, 0, batches);
  Shape shape{plan.batch_per_rank()};
  for (auto extent : reference.info().sample_shape) shape.push_back(extent);
  Tensor samples(shape, raw ? DType::u8 : DType::f32), labels({plan.batch_per_rank()}, DType::i32);
  Tensor floats_here(shape, DType::f32), floats_there(shape, DType::f32, Device::cuda);
  Tensor sum_here(shape, DType::f32), sum_there(shape, DType::f32, Device::cuda);
  // 137 GFLOP per matmul at 4096: ~2 ms on an H200. MPT_GPU_BUSY_N shrinks them where the work
  // cannot queue anyway (the CUDA emulator runs each launch at the call: tests/gpu/CMakeLists).
  const char* busy_n = std::getenv("MPT_GPU_BUSY_N");
  const std::int64_t n = backlog > 0 ? (busy_n ? std::max(1L, std::atol(busy_n)) : 4096) : 1;
  const Tensor busy_a = gpu_test::Random(9).tensor({n, n}, DType::f32).to(Device::cuda);
  Tensor busy_c({n, n}, DType::f32, Device::cuda);
  std::vector<std::int64_t> indices;
  int wrong = 0;
  for (std::int64_t k = 0; k < batches; ++k) {
    const std::int64_t epoch = k / plan.steps_per_epoch(), step = k % plan.steps_per_epoch();
    plan.batch_indices(epoch, step, indices);
    reference.read_batch(indices, samples, labels);
    if (raw) kernels::normalize_u8(samples, floats_here, 1.f, 0.f);
    const Tensor& addend_here = raw ? floats_here : samples;
    sum_here.zero();
    for (int r = 0; r < kAdds; ++r) kernels::add(sum_here, addend_here, sum_here);

    const data::Batch& batch = prefetcher.next();
    if (batch.device_samples.device() != Device::cuda || batch.epoch != epoch ||
        batch.step != step || batch.device_samples.dtype() != samples.dtype()) {
      harness.expect(false, name + ": batch " + std::to_string(k), "not the planned batch on cuda");
      return;
    }
    // The labels (a synchronous copy back) and the pinned host buffer, as read.
    const Tensor device_labels = batch.device_labels.to(Device::cpu);
    bool same = std::memcmp(device_labels.raw(), labels.raw(), labels.size_bytes()) == 0 &&
                std::memcmp(batch.samples.raw(), samples.raw(), samples.size_bytes()) == 0;
    sum_there.zero();
    for (int r = 0; r < backlog; ++r) kernels::matmul(busy_a, false, busy_a, false, busy_c);
    if (raw) kernels::normalize_u8(batch.device_samples, floats_there, 1.f, 0.f);
    const Tensor& addend_there = raw ? floats_there : batch.device_samples;
    for (int r = 0; r < kAdds; ++r) kernels::add(sum_there, addend_there, sum_there);
    prefetcher.release();  // with all of that still queued on the compute stream
    const Tensor got = sum_there.to(Device::cpu);  // waits for it
    same = same && std::memcmp(got.raw(), sum_here.raw(), sum_here.size_bytes()) == 0;
    if (!same) ++wrong;
  }
  prefetcher.stop();
  harness.expect(wrong == 0, name,
                 std::to_string(wrong) + " of " + std::to_string(batches) + " batches differ");
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (device_memory::cuda_device_count() == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", device_memory::cuda_device_description().c_str());
    MPI_Finalize();
    return kSkipCode;
  }
#ifdef MPTRAIN_HAVE_KOKKOS
  Kokkos::initialize(argc, argv);
#endif
  int failed = 0;
  {
    std::printf("gpu_prefetcher on %s\n", device_memory::cuda_device_description().c_str());
    const std::string dir = "gpu_prefetcher_data";
    data::SyntheticSpec spec;
    spec.train_samples = 2048;
    spec.test_samples = 16;
    spec.sample_shape = {1, 28, 28};
    spec.num_classes = 10;
    spec.seed = 5;
    data::prepare_synthetic(spec, dir);
    const std::string file = dir + "/train.h5";
    const data::ShardPlan plan(spec.train_samples, 256, 1, 0, 11);  // 8 steps per epoch
    gpu_test::Harness harness;
    check(harness, file, plan, 0, 1, 0, 12);
    check(harness, file, plan, 2, 1, 0, 20);
    check(harness, file, plan, 2, 2, 0, 20);
    // About 16 ms queued per batch: far longer than the I/O thread takes to read the slot's
    // next batch (well under a millisecond for 800 KB), so a copy that did not wait would land.
    check(harness, file, plan, 0, 1, 8, 6);
    check(harness, file, plan, 2, 1, 8, 10);
    check(harness, file, plan, 4, 2, 8, 10);
    check(harness, file, plan, 0, 1, 8, 6, /*raw=*/true);
    check(harness, file, plan, 4, 2, 8, 10, /*raw=*/true);
    std::printf("%d passed, %d failed\n", harness.passed(), harness.failed());
    failed = harness.failed();
  }
#ifdef MPTRAIN_HAVE_KOKKOS
  Kokkos::finalize();
#endif
  MPI_Finalize();
  return failed == 0 ? 0 : 1;
}
