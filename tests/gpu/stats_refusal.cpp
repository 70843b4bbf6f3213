// Sync BN's statistics refuse what the reducer cannot sum (issue #8): each misuse of
// GradientReducer::sum_stats / plan_stats / capture_on and Allreducer's queued form must
// end the job with one line naming the call, not sum garbage, crash inside MPI or NCCL, or
// leave a rank waiting. Usage: gpu_stats_refusal CASE, under mpiexec with 2 ranks, a device
// each (MPTRAIN_CUDAEMU_DEVICES=2 on the emulator): rank 0 makes the misuse while rank 1 waits
// in a barrier, which the abort must end. The pass is the message within the time limit
// (CTest's PASS_REGULAR_EXPRESSION and TIMEOUT in tests/gpu/CMakeLists.txt). Without a device,
// or (the nccl cases) without NCCL or with ranks sharing a GPU, every rank exits 77 and rank 0
// prints SKIPPED. A call that returns is a failure: exit 1.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/allreduce.hpp"
#include "comm/gradient_reducer.hpp"
#include "comm/topology.hpp"
#include "core/device_memory.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"

namespace {

using namespace mpt;
using namespace mpt::comm;

constexpr int kSkipCode = 77;

struct Case {
  const char* name;
  bool nccl;  // needs the nccl backend (a build with NCCL, one device per rank)
};
constexpr Case kCases[] = {
    {"unplanned", false},         // device statistics, host backends, no plan_stats()
    {"oversized", false},         // more device statistics than plan_stats() planned
    {"not-f32", false},           // 16-bit statistics
    {"capture-staged", false},    // capture_on() where the statistics go through the host
    {"negative-count", false},    // Allreducer::sum_queued with a negative count
    {"plan-negative", false},     // plan_stats() for a negative number of statistics
    {"capture-in-step", true},    // capture_on() between begin() and wait()
    {"across-nodes", true},       // Allreducer::sum_queued where NCCL spans a node only
    {"capture-across-nodes", true},   // ... and Allreducer::capture_on
    {"capture-staged-buckets", true},  // a bucket captured where it goes through the host
    {"finish-in-capture", true},  // a host wait (finish) while capturing
    {"replayed-out-of-turn", true},  // the other join slot's graph launched
    {"capture-no-mixing", true},  // capture_on() under NCCL_GRAPH_MIXING_SUPPORT=0
    {"replayed-in-capture", true},  // GradientReducer::replayed() while capturing
    {"replayed-in-step", true},     // ... and between begin() and wait()
    {"host-stats-in-capture", true},  // sum_stats() of host statistics while capturing
    {"allreduce-in-capture", true},   // the blocking Allreducer::allreduce while capturing
};

int skip(int rank, const std::string& why) {
  if (rank == 0) std::printf("SKIPPED: %s\n", why.c_str());
  return kSkipCode;
}

// Rank 0 runs MISUSE; every other rank waits in a barrier that only the abort ends.
template <class Misuse>
int on_rank0(int rank, const char* name, Misuse misuse) {
  std::printf("rank %d: %s\n", rank, rank == 0 ? name : "waiting in MPI_Barrier");
  std::fflush(stdout);
  if (rank == 0) misuse();
  MPI_Barrier(MPI_COMM_WORLD);
  std::printf("FAIL: rank %d: %s returned\n", rank, name);
  return 1;
}

int run(const Case& c, int rank) {
  const int devices = device_memory::cuda_device_count();
  int none = devices == 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &none, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (none) return skip(rank, "no CUDA device (" + device_memory::cuda_device_description() + ")");
  const Topology machine(MPI_COMM_WORLD, 0);
  device_memory::set_cuda_device(machine.device_rank() % devices);
  if (c.nccl) {
    if (!nccl_built()) return skip(rank, "this build has no NCCL");
    int shared = machine.device_peers() > devices ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &shared, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (shared) return skip(rank, "NCCL needs one GPU per rank");
  }

  const std::vector<std::int64_t> offsets = {0, 512};
  Tensor grads({1024}, DType::f32, Device::cuda);
  AllreduceConfig host;
  host.algorithm = Algorithm::flat_mpi;
  AllreduceConfig nccl;
  nccl.algorithm = Algorithm::hierarchical;
  nccl.intra = IntraBackend::nccl;
  const std::string name = c.name;

  // Any stream handle where one is passed: each refusal comes before the call would use it.
  void* const any_stream = grads.raw();
  if (name == "unplanned" || name == "oversized" || name == "not-f32" ||
      name == "capture-staged") {
    GradientReducer reducer(machine, host, grads, offsets, 1 << 12, 1 << 12);
    if (name != "unplanned") reducer.plan_stats(Device::cuda, 8);
    Tensor stats({name == "oversized" ? 9 : 8}, name == "not-f32" ? DType::f16 : DType::f32,
                 Device::cuda);
    if (name == "capture-staged")
      return on_rank0(rank, c.name, [&] { reducer.capture_on(any_stream); });
    return on_rank0(rank, c.name, [&] { reducer.sum_stats(stats); });
  }
  if (name == "negative-count") {
    Allreducer allreducer(machine, host);
    return on_rank0(rank, c.name, [&] { allreducer.sum_queued(nullptr, -1); });
  }
  if (name == "plan-negative") {
    GradientReducer reducer(machine, host, grads, offsets, 1 << 12, 1 << 12);
    return on_rank0(rank, c.name, [&] { reducer.plan_stats(Device::cuda, -1); });
  }
  if (name == "capture-in-step" || name == "replayed-in-capture" || name == "replayed-in-step" ||
      name == "host-stats-in-capture") {
    GradientReducer reducer(machine, nccl, grads, offsets, 1 << 12, 1 << 12);
    reducer.plan_stats(Device::cuda, 8);
    if (name == "capture-in-step" || name == "replayed-in-step") reducer.begin();
    if (name == "capture-in-step")
      return on_rank0(rank, c.name, [&] { reducer.capture_on(any_stream); });
    if (name == "replayed-in-step")
      return on_rank0(rank, c.name, [&] { reducer.replayed(reducer.next_join_slot()); });
    reducer.capture_on(any_stream);
    if (name == "replayed-in-capture")
      return on_rank0(rank, c.name, [&] { reducer.replayed(reducer.next_join_slot()); });
    Tensor host_stats({8}, DType::f32, Device::cpu);
    return on_rank0(rank, c.name, [&] { reducer.sum_stats(host_stats); });
  }
  if (name == "allreduce-in-capture") {
    Allreducer allreducer(machine, nccl);
    allreducer.capture_on(any_stream);
    return on_rank0(rank, c.name,
                    [&] { allreducer.allreduce(grads.raw(), grads.numel(), DType::f32); });
  }
  if (name == "capture-staged-buckets" || name == "finish-in-capture") {
    // One node, through the host anyway (the tests' stand-in for nodes of one rank), so the
    // sums may be captured and the buckets may not.
    AllreduceConfig staged = nccl;
    staged.nccl_stage_one_node = name == "capture-staged-buckets";
    Allreducer allreducer(machine, staged);
    allreducer.plan_slots(1, 1024, DType::f32);
    allreducer.capture_on(any_stream);
    if (name == "finish-in-capture")
      return on_rank0(rank, c.name, [&] { allreducer.finish(1); });
    return on_rank0(rank, c.name,
                    [&] { allreducer.allreduce_queued(0, grads.raw(), 1024, DType::f32); });
  }
  if (name == "capture-no-mixing") {
    setenv("NCCL_GRAPH_MIXING_SUPPORT", "0", 1);  // read as the backend is made
    Allreducer allreducer(machine, nccl);
    return on_rank0(rank, c.name, [&] { allreducer.capture_on(any_stream); });
  }
  if (name == "replayed-out-of-turn") {
    Allreducer allreducer(machine, nccl);
    return on_rank0(rank, c.name, [&] { allreducer.replayed(1); });
  }
  // across-nodes: emulated nodes of one rank, so the NCCL communicator is each rank's alone.
  const Topology nodes(MPI_COMM_WORLD, 1);
  Allreducer allreducer(nodes, nccl);
  Tensor stats({8}, DType::f32, Device::cuda);
  if (name == "capture-across-nodes")
    return on_rank0(rank, c.name, [&] { allreducer.capture_on(any_stream); });
  return on_rank0(rank, c.name, [&] { allreducer.sum_queued(stats.data<float>(), 8); });
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);  // GradientReducer's thread
  const Case* chosen = nullptr;
  for (const Case& c : kCases)
    if (argc == 2 && std::strcmp(argv[1], c.name) == 0) chosen = &c;
  if (chosen == nullptr) {
    std::fprintf(stderr, "usage: gpu_stats_refusal CASE (under mpiexec -n 2); CASE is one of");
    for (const Case& c : kCases) std::fprintf(stderr, " %s", c.name);
    std::fprintf(stderr, "\n");
    MPI_Finalize();
    return 2;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  mpt::set_process_identity(rank, size);
  const int code = run(*chosen, rank);
  MPI_Finalize();
  return code;
}
