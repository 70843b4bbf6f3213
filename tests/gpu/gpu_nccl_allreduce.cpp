// The nccl all-reduce backend on the GPU (issue #8): flat-nccl and hierarchical with the nccl
// intra-node backend (also with phase 2 forced through the pinned host buffers and MPI), for
// sizes {0, 1, 7, 1000, 1M+3} at odd offsets into a device buffer, f32 data with f32, f16 or bf16
// on the wire and 16-bit data with its own, plain sums and pre/postscaled ones, against a float64
// sum and for identical bits on every rank; then GradientReducer's buckets on device gradients
// (the trainer's use: the queued form, calls from its communication thread), sync BN's
// statistics summed on the device among them, and such a step captured into CUDA graphs
// (--cuda.graphs: the buckets' calls forked onto the comm stream inside the graph) and
// replayed. Runs under mpiexec.
// NCCL refuses two ranks on one GPU, so where the ranks of a node outnumber its GPUs (np 2 on the
// one-H200 check machine) every rank reports SKIPPED (exit 77) with the reason, as it does
// without a device or without NCCL. On one GPU only np 1 runs: NCCL's calls on a communicator of
// one rank, and the staging path over single-rank rails.
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/allreduce.hpp"
#include "comm/gradient_reducer.hpp"
#include "comm/topology.hpp"
#include "core/device_memory.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "kernels/add.hpp"
#include "kernels/graph.hpp"
#include "tests/comm/allreduce_values.hpp"
#include "tests/gpu/harness.hpp"

namespace mpt::comm {
namespace {

using gpu_test::Harness;

int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

using test::contribution;
using test::identical_on_every_rank;
using test::store;
using test::ExpectedSum;
using test::expected_sum;
using test::widen;

// Every rank's verdict on a check, agreed (a check fails if it failed on any rank).
bool all_ranks(bool ok) {
  int value = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return value == 1;
}

// Reduces COUNT elements of DTYPE, placed at an offset that varies with COUNT inside a device
// buffer (the trainer's buckets start anywhere), and checks them against the float64 sum with the
// host backends' bound: |error| <= (N + 2) u sum_r |pre post x_r|.
void check_allreduce(Harness& harness, const std::string& label, Allreducer& allreducer,
                     std::int64_t count, DType dtype) {
  const AllreduceConfig& config = allreducer.config();
  const int n = world_size();
  const std::int64_t offset = count % 5;
  const std::size_t element = dtype_size(dtype);
  std::vector<std::uint8_t> host(static_cast<std::size_t>(count + offset) * element);
  for (std::int64_t i = 0; i < count; ++i)
    store(dtype, host.data() + offset * element, i, contribution(dtype, world_rank(), i));
  Tensor device({count + offset}, dtype, Device::cuda);
  if (!host.empty())
    device_memory::copy(device.raw(), Device::cuda, host.data(), Device::cpu, host.size());
  auto* data = static_cast<std::uint8_t*>(device.raw()) + offset * element;
  allreducer.allreduce(data, count, dtype);
  if (!host.empty())
    device_memory::copy(host.data(), Device::cpu, device.raw(), Device::cuda, host.size());
  const double scale = static_cast<double>(config.prescale) * config.postscale;
  std::int64_t bad = 0, first = -1;
  double got_first = 0, want_first = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const ExpectedSum want = expected_sum(dtype, config.wire, n, i, scale);
    const double got = widen(dtype, host.data() + offset * element, i);
    if (!(std::fabs(got - want.value) <= want.tolerance) && bad++ == 0) {
      first = i;
      got_first = got;
      want_first = want.value;
    }
  }
  char detail[200] = "";
  if (bad)
    std::snprintf(detail, sizeof detail,
                  "rank %d: %lld of %lld wrong; first at %lld: got %.9g, want %.9g", world_rank(),
                  static_cast<long long>(bad), static_cast<long long>(count),
                  static_cast<long long>(first), got_first, want_first);
  const std::string what = label + ", count " + std::to_string(count) + ", data " +
                           dtype_name(dtype) + ", wire " + dtype_name(config.wire) + ", prescale " +
                           std::to_string(config.prescale) + ", postscale " +
                           std::to_string(config.postscale);
  const bool sums_ok = all_ranks(bad == 0);
  const bool same = identical_on_every_rank(host.data(), host.size());
  if (world_rank() == 0) {
    harness.expect(sums_ok, what, bad ? detail : "wrong on another rank");
    harness.expect(same, what + ": the same bits on every rank");
  }
}

using test::kTypes;
using test::Types;
// A sum, a prescale, a postscale, both: powers of two, exact in every dtype, and not 1 even on one
// rank, so that the scale kernel's placement is checked there too.
const float kScales[][2] = {{1.f, 1.f}, {0.5f, 1.f}, {1.f, 0.25f}, {0.5f, 0.25f}};

void check_algorithm(Harness& harness, const std::string& label, const Topology& topology,
                     AllreduceConfig config) {
  int case_index = 0;
  for (const Types& types : kTypes) {
    config.wire = types.wire;
    config.prescale = kScales[case_index % 4][0];
    config.postscale = kScales[case_index % 4][1];
    ++case_index;
    Allreducer allreducer(topology, config);
    for (const std::int64_t count : {0L, 1L, 7L, 1000L, (1L << 20) + 3})
      check_allreduce(harness, label, allreducer, count, types.data);
  }
}

// The elements of HOST (COUNT, read back from the reduced gradients) that are not the world's
// sum of STEP * contribution(rank, i) within the f32 summation bound.
std::int64_t wrong_gradients(const std::vector<float>& host, std::int64_t count, int step) {
  const int ranks = world_size();
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    double exact = 0, magnitudes = 0;
    for (int r = 0; r < ranks; ++r) {
      exact += step * contribution(DType::f32, r, i);
      magnitudes += std::fabs(step * contribution(DType::f32, r, i));
    }
    if (!(std::fabs(host[static_cast<std::size_t>(i)] - exact) <= (ranks + 2) * 0x1p-24 * magnitudes))
      ++wrong;
  }
  return wrong;
}

// The statistics of SUMS that are not the world's sum of STEP * (rank + 1) + i (exact: small
// integers).
std::int64_t wrong_stats(const std::vector<float>& sums, int step) {
  const int ranks = world_size();
  std::int64_t bad = 0;
  for (std::size_t i = 0; i < sums.size(); ++i)
    bad += sums[i] != static_cast<float>(step * ranks * (ranks + 1) / 2 +
                                         ranks * static_cast<std::int64_t>(i));
  return bad;
}

// The trainer's path: device gradients in buckets, GradientReducer's queued form (each bucket
// marked on the compute stream at launch, queued on the comm stream by its thread, the step's
// end joined, and waited for on the host a step later or by drain()): all launched at wait(),
// then launched one by one from the last parameter as backward's hook does, each also with
// phase 2 through the host (the rails wait inside a queued call). Step 1's result is read
// without drain(), by a copy on the legacy stream, which the join orders after the calls; step
// 2's after drain(), as the trainer reads (the host then has waited for the calls itself).
void check_gradient_reducer(Harness& harness, const Topology& topology, AllreduceConfig config) {
  const std::int64_t count = 300007;
  const std::vector<std::int64_t> offsets = {0, 1000, 1003, 50000, 299999};
  Tensor grads({count}, DType::f32, Device::cuda);
  std::vector<float> host(static_cast<std::size_t>(count));
  config.wire = DType::f32;
  for (const bool through_host : {false, true}) {
    config.nccl_stage_one_node = through_host;
    GradientReducer reducer(topology, config, grads, offsets, 256 << 10, 64 << 10);
    for (int step = 1; step <= 2; ++step) {
      for (std::int64_t i = 0; i < count; ++i)
        host[static_cast<std::size_t>(i)] = step * contribution(DType::f32, world_rank(), i);
      device_memory::copy(grads.raw(), Device::cuda, host.data(), Device::cpu, grads.size_bytes());
      reducer.begin();
      if (step == 2)
        for (std::size_t p = offsets.size(); p-- > 0;) reducer.ready_from(offsets[p]);
      reducer.wait();
      if (step == 2) reducer.drain();
      device_memory::copy(host.data(), Device::cpu, grads.raw(), Device::cuda, grads.size_bytes());
      const std::int64_t bad = wrong_gradients(host, count, step);
      const bool ok = all_ranks(bad == 0);
      if (world_rank() == 0)
        harness.expect(ok,
                       "GradientReducer, " + std::to_string(reducer.num_buckets()) +
                           " queued buckets of device gradients (" +
                           algorithm_name(config.algorithm) +
                           (through_host ? ", phase 2 through the host" : "") + ", " +
                           (step == 1 ? "all at wait()" : "launched one by one") + ")",
                       std::to_string(bad) + " wrong elements on some rank");
    }
  }
}

// Sync BN's statistics on the device (GradientReducer::sum_stats): in the middle of a step,
// between queued buckets, 2C + 1 f32 values summed over the world in place, read back by a copy
// on the legacy stream, exact for small integers; the buckets around it still reduce right.
// EXPECT_ON_DEVICE: whether TOPOLOGY's communicator spans the world (one node or flat-nccl),
// which sums_on_device() must report. Then the sum is the nccl backend's sum_queued, ordered
// before the read-back by the device-side wait alone (no drain), and stats_path() says
// "device"; across emulated nodes it goes through plan_stats()'s host copy ("staged").
void check_stats_sums(Harness& harness, const std::string& label, const Topology& topology,
                      AllreduceConfig config, bool expect_on_device) {
  const std::int64_t count = 20000, values = 2 * 64 + 1;
  const std::vector<std::int64_t> offsets = {0, 5000, 12000};
  Tensor grads({count}, DType::f32, Device::cuda);
  Tensor stats({values}, DType::f32, Device::cuda);
  std::vector<float> host(static_cast<std::size_t>(count)), sums(static_cast<std::size_t>(values));
  config.wire = DType::f32;
  GradientReducer reducer(topology, config, grads, offsets, 16 << 10, 16 << 10);
  const bool on_device = all_ranks(reducer.sums_on_device() == expect_on_device);
  if (world_rank() == 0)
    harness.expect(on_device, label + ": sums_on_device() is " +
                                  (expect_on_device ? "true" : "false"));
  reducer.plan_stats(Device::cuda, values);
  const std::string path = reducer.stats_path(), want = expect_on_device ? "device" : "staged";
  const bool path_ok = all_ranks(path == want);
  if (world_rank() == 0) harness.expect(path_ok, label + ": stats_path() is " + want, path);
  for (int step = 1; step <= 2; ++step) {
    for (std::int64_t i = 0; i < count; ++i)
      host[static_cast<std::size_t>(i)] = step * contribution(DType::f32, world_rank(), i);
    device_memory::copy(grads.raw(), Device::cuda, host.data(), Device::cpu, grads.size_bytes());
    for (std::int64_t i = 0; i < values; ++i)
      sums[static_cast<std::size_t>(i)] = static_cast<float>(step * (world_rank() + 1) + i);
    device_memory::copy(stats.raw(), Device::cuda, sums.data(), Device::cpu, stats.size_bytes());
    reducer.begin();
    reducer.ready_from(offsets[2]);  // a bucket queued before the statistics
    reducer.sum_stats(stats);
    device_memory::copy(sums.data(), Device::cpu, stats.raw(), Device::cuda, stats.size_bytes());
    const std::int64_t bad = wrong_stats(sums, step);
    reducer.wait();
    reducer.drain();
    device_memory::copy(host.data(), Device::cpu, grads.raw(), Device::cuda, grads.size_bytes());
    const std::int64_t wrong = wrong_gradients(host, count, step);
    const bool ok = all_ranks(bad == 0), grads_ok = all_ranks(wrong == 0);
    if (world_rank() == 0) {
      const std::string at = label + ", step " + std::to_string(step);
      harness.expect(ok, at + ": " + std::to_string(values) + " statistics summed (" + want + ")",
                     std::to_string(bad) + " wrong sums on some rank");
      harness.expect(grads_ok, at + ": the buckets around the statistics",
                     std::to_string(wrong) + " wrong gradients on some rank");
    }
  }
}

// --cuda.graphs with the all-reduce in the graph (GradientReducer::capture_on; the nccl
// backend's fork of the comm stream from the captured compute stream at each bucket's mark, and
// its join at the end). A step whose gradients and statistics a kernel writes from source
// buffers, its buckets launched one by one and sync BN's sums between them: step 1 eager, then
// each join slot's graph captured the first time the slot comes round and replayed, steps 2-5,
// with new values in the sources each time. After each step (replayed(): the host waited for
// the previous step's calls only) a copy on the legacy stream, which follows the graph's join,
// must read the world's sums; the exposed time is the device's, from the graph's timing nodes.
void check_captured_step(Harness& harness, const std::string& label, const Topology& topology,
                         AllreduceConfig config) {
  const std::int64_t count = 300007, values = 2 * 64 + 1;
  const std::vector<std::int64_t> offsets = {0, 1000, 1003, 50000, 299999};
  Tensor grads({count}, DType::f32, Device::cuda), source({count}, DType::f32, Device::cuda);
  Tensor stats({values}, DType::f32, Device::cuda), stats_source({values}, DType::f32, Device::cuda);
  Tensor zeros({count}, DType::f32, Device::cuda), stats_zeros({values}, DType::f32, Device::cuda);
  std::vector<float> host(static_cast<std::size_t>(count)), sums(static_cast<std::size_t>(values));
  device_memory::copy(zeros.raw(), Device::cuda, std::vector<float>(static_cast<std::size_t>(count)).data(),
                      Device::cpu, zeros.size_bytes());
  device_memory::copy(stats_zeros.raw(), Device::cuda,
                      std::vector<float>(static_cast<std::size_t>(values)).data(), Device::cpu,
                      stats_zeros.size_bytes());
  config.wire = DType::f32;
  GradientReducer reducer(topology, config, grads, offsets, 256 << 10, 64 << 10);
  reducer.plan_stats(Device::cuda, values);
  const bool captures = all_ranks(reducer.captures_buckets());
  if (world_rank() == 0) harness.expect(captures, label + ": the buckets can be captured");
  if (!captures) return;
  kernels::StepGraph graphs[2] = {kernels::StepGraph(label + " (join slot 0)"),
                                  kernels::StepGraph(label + " (join slot 1)")};
  // The step: the "backward" that writes the gradients, the buckets from the last parameter,
  // and the statistics summed after the first two buckets (in order with them).
  const auto step_body = [&] {
    reducer.begin();
    kernels::add(source, zeros, grads);
    kernels::add(stats_source, stats_zeros, stats);
    reducer.ready_from(offsets[4]);
    reducer.ready_from(offsets[3]);
    reducer.sum_stats(stats);
    for (int p = 2; p >= 0; --p) reducer.ready_from(offsets[static_cast<std::size_t>(p)]);
    reducer.wait();
  };
  std::vector<int> slots;
  for (int step = 1; step <= 5; ++step) {
    for (std::int64_t i = 0; i < count; ++i)
      host[static_cast<std::size_t>(i)] = step * contribution(DType::f32, world_rank(), i);
    device_memory::copy(source.raw(), Device::cuda, host.data(), Device::cpu, source.size_bytes());
    for (std::int64_t i = 0; i < values; ++i)
      sums[static_cast<std::size_t>(i)] = static_cast<float>(step * (world_rank() + 1) + i);
    device_memory::copy(stats_source.raw(), Device::cuda, sums.data(), Device::cpu,
                        stats_source.size_bytes());
    if (step == 1) {
      step_body();  // eager: the communication thread's calls, NCCL's eager and captured mixed
    } else {
      const int slot = reducer.next_join_slot();
      slots.push_back(slot);
      kernels::StepGraph& graph = graphs[slot];
      if (!graph.captured()) {
        reducer.capture_on(kernels::capture_stream());
        graph.capture(step_body);
        reducer.capture_on(nullptr);
      }
      graph.replay();
      reducer.replayed(slot);
    }
    const double exposed = reducer.last_exposed_seconds();
    device_memory::copy(host.data(), Device::cpu, grads.raw(), Device::cuda, grads.size_bytes());
    device_memory::copy(sums.data(), Device::cpu, stats.raw(), Device::cuda, stats.size_bytes());
    const std::int64_t wrong = wrong_gradients(host, count, step), bad = wrong_stats(sums, step);
    const bool ok = all_ranks(wrong == 0 && bad == 0), timed = all_ranks(exposed >= 0);
    if (world_rank() == 0) {
      const std::string at = label + ", step " + std::to_string(step) +
                             (step == 1 ? " (eager)" : " (replayed, join slot " +
                                                           std::to_string(slots.back()) + ")");
      harness.expect(ok, at + ": " + std::to_string(reducer.num_buckets()) +
                             " buckets and the statistics summed",
                     std::to_string(wrong) + " wrong gradients, " + std::to_string(bad) +
                         " wrong statistics on some rank");
      harness.expect(timed, at + ": exposed time measured", std::to_string(exposed));
    }
  }
  reducer.drain();
  const bool alternated = all_ranks(slots == std::vector<int>{1, 0, 1, 0});
  if (world_rank() == 0)
    harness.expect(alternated, label + ": the two join slots' graphs alternate");
}

// Every rank says the same: prints on rank 0, returns 77 everywhere.
int skip(const std::string& why) {
  if (world_rank() == 0) std::printf("SKIPPED: %s\n", why.c_str());
  return 77;
}

int run() {
  if (!nccl_built()) return skip("this build has no NCCL (docs/gpu.md)");
  const int devices = device_memory::cuda_device_count();
  int none = devices == 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &none, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (none) return skip("no CUDA device (" + device_memory::cuda_device_description() + ")");
  const Topology machine(MPI_COMM_WORLD, 0);  // the real nodes
  device_memory::set_cuda_device(machine.device_rank() % devices);
  const SharedGpus shared = find_shared_gpus(machine);
  if (!shared.in_node.empty())
    return skip(shared.in_node + ": NCCL needs one GPU per rank, and this machine has " +
                std::to_string(devices) + " GPU(s) for " + std::to_string(machine.device_peers()) +
                " local rank(s) (on the one-GPU check machine only np 1 runs)");
  if (world_rank() == 0)
    std::printf("gpu_nccl_allreduce on %d rank(s), %s\n", world_size(),
                device_memory::cuda_device_description().c_str());

  Harness harness;
  AllreduceConfig config;
  if (shared.in_world.empty()) {
    config.algorithm = Algorithm::flat_nccl;
    check_algorithm(harness, "flat-nccl", machine, config);
  }
  config.algorithm = Algorithm::hierarchical;
  config.intra = IntraBackend::nccl;
  check_algorithm(harness, "hierarchical nccl", machine, config);
  config.nccl_stage_one_node = true;
  check_algorithm(harness, "hierarchical nccl, phase 2 through the host", machine, config);
  config.nccl_stage_one_node = false;
  // Emulated nodes of 1 and 2 ranks (each rank still on its own GPU): the rails and, with 3+
  // ranks, uneven nodes whose ranks own several shards.
  for (const int k : {1, 2}) {
    if (world_size() <= k) continue;
    const Topology nodes(MPI_COMM_WORLD, k);
    check_algorithm(harness, "hierarchical nccl, nodes of " + std::to_string(k), nodes, config);
  }
  check_gradient_reducer(harness, machine, config);
  check_stats_sums(harness, "sync BN sums, hierarchical nccl", machine, config,
                   machine.num_nodes() == 1);
  if (world_size() > 1)
    check_stats_sums(harness, "sync BN sums, hierarchical nccl, nodes of 1",
                     Topology(MPI_COMM_WORLD, 1), config, false);
  if (shared.in_world.empty()) {
    AllreduceConfig flat = config;
    flat.algorithm = Algorithm::flat_nccl;
    check_stats_sums(harness, "sync BN sums, flat-nccl", machine, flat, true);
  }
  if (kernels::graphs_supported()) {
    if (machine.num_nodes() == 1)
      check_captured_step(harness, "captured step, hierarchical nccl", machine, config);
    if (shared.in_world.empty()) {
      AllreduceConfig flat = config;
      flat.algorithm = Algorithm::flat_nccl;
      check_captured_step(harness, "captured step, flat-nccl", machine, flat);
    }
  } else if (world_rank() == 0) {
    std::printf("note: the captured steps are left out: MPTRAIN_CUDA_LEGACY_STREAM is set\n");
  }

  int failed = harness.failed();
  MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (world_rank() == 0) std::printf("%d passed, %d failed\n", harness.passed(), harness.failed());
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace mpt::comm

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);  // GradientReducer's thread
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  mpt::set_process_identity(rank, size);
  const int code = mpt::comm::run();
  MPI_Finalize();
  return code;
}
