// The all-reduce algorithms of src/comm (flat-mpi, hierarchical with the mpi intra backend) run
// under SimGrid's SMPI on a simulated platform (perf/sim/platforms/*.xml). Built with smpicxx by
// perf/sim/CMakeLists.txt, never by the main build. Three modes, every one run by smpirun:
//   check  the sums of every algorithm and wire dtype against a float64 reference (exit 1 on a
//          wrong element): the CTest sim_allreduce_check. Run with smpi/shared-malloc:off.
//   bench  simulated seconds per all-reduce of COUNT elements, algbw and busbw (nccl-tests).
//   step   simulated step time of data-parallel training: forward, then backward in per-bucket
//          slices on a "gpu" actor of the rank's host, each bucket all-reduced (by this rank's
//          MPI actor, synchronously, as GradientReducer's thread does) as soon as it is ready.
// The overlap is accounted for by the simulator: the gpu actor's executions and the MPI
// transfers progress at the same time, and the step ends when the last bucket is reduced.
// Rank 0 prints one "key=value ..." line per result (perf/sim/scaling_sim.py parses them).
#include <mpi.h>

#include <simgrid/s4u.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/allreduce.hpp"
#include "comm/topology.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

namespace {

using mpt::DType;
using mpt::comm::Algorithm;
using mpt::comm::AllreduceConfig;
using mpt::comm::Allreducer;
using mpt::comm::IntraBackend;
using mpt::comm::Topology;

struct Args {
  std::string mode;
  std::string algo = "flat-mpi";  // flat-mpi | hierarchical (intra backend mpi)
  std::string wire = "fp32";      // fp32 | fp16 | bf16 (the gradients' dtype too)
  int ranks_per_node = 0;         // 0: SMPI's hosts (MPI_COMM_TYPE_SHARED)
  long long count = 1 << 20;      // elements per all-reduce (bench, step)
  int iters = 3;                  // timed all-reduces (bench) or steps (step)
  double compute_s = 0.1;         // step: forward + backward seconds per step on one GPU
  double backward_frac = 2.0 / 3; // step: backward's share of compute_s
  double bucket_mb = 25, first_bucket_mb = 1;  // step: as [comm] bucket-mb, first-bucket-mb
  // step: every bucket a multiple of this many elements (nearest, at least one), so that its
  // shards are equal on every rank whatever the payload scale (perf/sim/scaling_sim.py).
  long long align = 1;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "allreduce_sim: %s (hint: allreduce_sim check|bench|step [--algo A] "
               "[--wire W] [--ranks-per-node K] [--count N] [--iters I] [--compute-s S] "
               "[--backward-frac F] [--bucket-mb M] [--first-bucket-mb M] [--align A])\n", message.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args args;
  if (argc < 2) usage_error("no mode");
  args.mode = argv[1];
  if (args.mode != "check" && args.mode != "bench" && args.mode != "step")
    usage_error("unknown mode '" + args.mode + "'");
  for (int i = 2; i < argc; i += 2) {
    const std::string key = argv[i];
    if (i + 1 >= argc) usage_error(key + " needs a value");
    const char* value = argv[i + 1];
    if (key == "--algo") args.algo = value;
    else if (key == "--wire") args.wire = value;
    else if (key == "--ranks-per-node") args.ranks_per_node = std::atoi(value);
    else if (key == "--count") args.count = std::atoll(value);
    else if (key == "--iters") args.iters = std::atoi(value);
    else if (key == "--compute-s") args.compute_s = std::atof(value);
    else if (key == "--backward-frac") args.backward_frac = std::atof(value);
    else if (key == "--bucket-mb") args.bucket_mb = std::atof(value);
    else if (key == "--first-bucket-mb") args.first_bucket_mb = std::atof(value);
    else if (key == "--align") args.align = std::atoll(value);
    else usage_error("unknown option '" + key + "'");
  }
  if (args.algo != "flat-mpi" && args.algo != "hierarchical")
    usage_error("--algo: use flat-mpi or hierarchical");
  if (args.wire != "fp32" && args.wire != "fp16" && args.wire != "bf16")
    usage_error("--wire: use fp32, fp16 or bf16");
  if (args.count < 0 || args.iters < 1 || args.ranks_per_node < 0 || args.compute_s < 0 ||
      args.backward_frac < 0 || args.backward_frac > 1 || args.bucket_mb < 0 ||
      args.first_bucket_mb < 0 || args.align < 1)
    usage_error("a value is out of range");
  return args;
}

DType wire_dtype(const std::string& name) {
  return name == "fp16" ? DType::f16 : name == "bf16" ? DType::bf16 : DType::f32;
}

AllreduceConfig config_for(const std::string& algo, DType wire) {
  AllreduceConfig config;
  config.algorithm = algo == "flat-mpi" ? Algorithm::flat_mpi : Algorithm::hierarchical;
  config.intra = IntraBackend::mpi;  // shm's MPI-3 shared windows are no part of the model
  config.wire = wire;
  return config;
}

// ---- check -----------------------------------------------------------------------------------

// Rank r's element i: small integers times 1/8, exact in every wire dtype, so that the only
// error is the 16-bit rounding of the partial sums (bounded below).
double value(int rank, long long i) { return static_cast<double>((rank * 7 + i * 13) % 17 - 8) / 8; }

int check(const Args& args, MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  Topology topology(world, args.ranks_per_node);
  const long long counts[] = {0, 1, 7, 1000, 65537};
  int failures = 0, checked = 0;
  for (const char* algo : {"flat-mpi", "hierarchical"}) {
    for (const char* wire_name : {"fp32", "fp16", "bf16"}) {
      const DType wire = wire_dtype(wire_name);
      Allreducer reducer(topology, config_for(algo, wire));
      for (long long count : counts) {
        // f32 data (converted to the wire dtype and back by the algorithm).
        std::vector<float> data(static_cast<std::size_t>(count));
        for (long long i = 0; i < count; ++i) data[i] = static_cast<float>(value(rank, i));
        reducer.allreduce(data.data(), count, DType::f32);
        // |sum| <= 8 * size; a 16-bit partial sum rounds with relative error 2^-8 (bf16) or
        // 2^-11 (fp16) per step: bound the total by size steps of the largest magnitude.
        const double eps = wire == DType::f32 ? 1e-6 : wire == DType::f16 ? 1.0 / 2048 : 1.0 / 256;
        long long bad = 0;
        double worst = 0;
        for (long long i = 0; i < count; ++i) {
          double reference = 0;
          for (int r = 0; r < size; ++r) reference += value(r, i);
          const double error = std::fabs(data[i] - reference);
          worst = std::max(worst, error);
          if (error > eps * size * 8 + 1e-12) ++bad;
        }
        int my_bad = bad > 0 ? 1 : 0, any_bad = 0;
        MPI_Allreduce(&my_bad, &any_bad, 1, MPI_INT, MPI_MAX, world);
        ++checked;
        if (any_bad) ++failures;
        if (rank == 0 || bad > 0)
          std::printf("check rank=%d algo=%s wire=%s count=%lld max_abs_error=%.3g %s\n", rank,
                      algo, wire_name, count, worst, bad ? "FAIL" : "ok");
      }
    }
  }
  if (rank == 0)
    std::printf("check ranks=%d nodes=%d ranks_per_node=%d cases=%d failed=%d %s\n", size,
                topology.num_nodes(), topology.local_size(), checked, failures,
                failures ? "FAILED" : "PASSED");
  std::fflush(stdout);
  return failures ? 1 : 0;
}

// ---- bench and step --------------------------------------------------------------------------

// The gradient buffer: SMPI_SHARED_MALLOC maps the same pages into every rank, so that thousands
// of simulated ranks fit in memory; its contents are garbage, which timing does not read.
struct SharedBuffer {
  explicit SharedBuffer(std::size_t bytes) : data(SMPI_SHARED_MALLOC(std::max<std::size_t>(bytes, 64))) {}
  ~SharedBuffer() { SMPI_SHARED_FREE(data); }
  void* data;
};

// Timing runs move no gradient payload: the simulator charges a message's bytes without copying
// them, so that time and memory do not grow with ranks x message size (thousands of ranks on
// one core). Small messages are copied: they carry MPI_Comm_split's exchanges and the timings.
// (SimGrid's setter takes the base class of the CommImpl that its default callback wants.)
constexpr size_t kCopiedBytes = 64 * 1024;
void copy_small(smx_activity_t comm, void* buffer, size_t size) {
  if (size <= kCopiedBytes)
    smpi_comm_copy_buffer_callback(reinterpret_cast<simgrid::kernel::activity::CommImpl*>(comm),
                                   buffer, size);
}

void print_common(const Args& args, const Topology& topology) {
  std::printf("mode=%s algo=%s wire=%s ranks=%d nodes=%d ranks_per_node=%d count=%lld ",
              args.mode.c_str(), args.algo.c_str(), args.wire.c_str(), topology.size(),
              topology.num_nodes(), topology.local_size(), args.count);
}

int bench(const Args& args, MPI_Comm world) {
  Topology topology(world, args.ranks_per_node);
  const DType wire = wire_dtype(args.wire);
  Allreducer reducer(topology, config_for(args.algo, wire));
  const std::size_t bytes = static_cast<std::size_t>(args.count) * mpt::dtype_size(wire);
  SharedBuffer buffer(bytes);
  reducer.allreduce(buffer.data, args.count, wire);  // warm-up: plans the scratch buffers
  MPI_Barrier(world);
  const double start = MPI_Wtime();
  for (int i = 0; i < args.iters; ++i) reducer.allreduce(buffer.data, args.count, wire);
  double elapsed = MPI_Wtime() - start, slowest = 0;
  MPI_Reduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, world);
  if (topology.rank() == 0) {
    const double t = slowest / args.iters, n = topology.size();
    const double algbw = static_cast<double>(bytes) / t;
    print_common(args, topology);
    std::printf("bytes=%zu time_s=%.9g algbw_GBps=%.6g busbw_GBps=%.6g\n", bytes, t, algbw / 1e9,
                algbw * 2 * (n - 1) / n / 1e9);
    std::fflush(stdout);
  }
  return 0;
}

// Bucket boundaries in elements, in the order backward produces them: the first bucket (the
// last layers) FIRST_BUCKET_MB, then BUCKET_MB each, as GradientReducer cuts them; each rounded
// to a multiple of ALIGN (the last one too, so the total may differ from COUNT by < ALIGN).
std::vector<long long> buckets(long long count, std::size_t element, double first_mb,
                               double bucket_mb, long long align) {
  const auto aligned = [&](double elements) {
    return std::max<long long>(1, std::llround(elements / static_cast<double>(align))) * align;
  };
  const auto elements = [&](double mb) { return aligned(mb * 1e6 / static_cast<double>(element)); };
  if (bucket_mb <= 0) return {aligned(static_cast<double>(count))};  // one bucket after backward
  std::vector<long long> ends;
  long long end = std::min(aligned(static_cast<double>(count)),
                           elements(first_mb > 0 ? first_mb : bucket_mb));
  ends.push_back(end);
  while (count - end >= align) {
    const long long rest = aligned(static_cast<double>(count - end));
    ends.push_back(end += std::min(rest, elements(bucket_mb)));
  }
  return ends;
}

int step(const Args& args, MPI_Comm world) {
  Topology topology(world, args.ranks_per_node);
  const DType wire = wire_dtype(args.wire);
  Allreducer reducer(topology, config_for(args.algo, wire));
  const std::size_t element = mpt::dtype_size(wire);
  const std::vector<long long> ends =
      buckets(args.count, element, args.first_bucket_mb, args.bucket_mb, args.align);
  const long long count = ends.back();  // COUNT rounded to whole aligned buckets
  SharedBuffer buffer(static_cast<std::size_t>(count) * element);
  auto* grads = static_cast<std::uint8_t*>(buffer.data);
  // No warm-up: the first pass below plans the scratch buffers, and a buffer's allocation costs
  // no simulated time (the host computation is not simulated: smpi/simulate-computation:no).

  // Compute is charged as flops on the rank's host at its speed (every rank runs one gpu actor,
  // and a host has as many cores as GPUs), so seconds * speed flops take exactly those seconds.
  simgrid::s4u::Host* host = simgrid::s4u::Host::current();
  const double speed = host->get_speed();
  const double forward_s = args.compute_s * (1 - args.backward_frac);
  const double backward_s = args.compute_s * args.backward_frac;
  // The whole gradient in one all-reduce with no compute: the busbw column, and what the step
  // would expose without buckets and overlap.
  MPI_Barrier(world);
  double comm_only = MPI_Wtime();
  reducer.allreduce(grads, count, wire);
  comm_only = MPI_Wtime() - comm_only;
  double total = 0;
  for (int s = 0; s < args.iters; ++s) {
    MPI_Barrier(world);
    const double t0 = MPI_Wtime();
    auto ready = simgrid::s4u::Semaphore::create(0);
    // The device: forward, then backward slices, each as long as its bucket's share of the
    // gradient bytes (gradients are assumed to appear at a constant rate through backward).
    simgrid::s4u::ActorPtr gpu = simgrid::s4u::Actor::create(
        "gpu", host, [ready, ends, speed, forward_s, backward_s, count]() {
          simgrid::s4u::this_actor::execute(forward_s * speed);
          for (std::size_t b = 0; b < ends.size(); ++b) {
            const long long begin = b ? ends[b - 1] : 0;
            const double share = static_cast<double>(ends[b] - begin) / static_cast<double>(count);
            simgrid::s4u::this_actor::execute(backward_s * share * speed);
            ready->release();
          }
        });
    for (std::size_t b = 0; b < ends.size(); ++b) {
      ready->acquire();
      const long long begin = b ? ends[b - 1] : 0;
      reducer.allreduce(grads + begin * element, ends[b] - begin, wire);
    }
    gpu->join();
    double elapsed = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, world);
    total += slowest;
  }
  double comm_slowest = 0;
  MPI_Reduce(&comm_only, &comm_slowest, 1, MPI_DOUBLE, MPI_MAX, 0, world);
  if (topology.rank() == 0) {
    const double step_s = total / args.iters;
    print_common(args, topology);
    std::printf("aligned_count=%lld buckets=%zu compute_s=%.9g comm_s=%.9g step_s=%.9g exposed_s=%.9g "
                "efficiency=%.6g\n", count, ends.size(), args.compute_s, comm_slowest, step_s,
                step_s - args.compute_s, args.compute_s / step_s);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const Args args = parse(argc, argv);
  int rc = 0;
  if (args.mode != "check") smpi_comm_set_copy_data_callback(&copy_small);
  try {
    rc = args.mode == "check" ? check(args, MPI_COMM_WORLD)
         : args.mode == "bench" ? bench(args, MPI_COMM_WORLD)
                                : step(args, MPI_COMM_WORLD);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "allreduce_sim: %s\n", error.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return rc;
}
