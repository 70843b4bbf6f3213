// The all-reduce algorithms: plain synchronous functions of a Topology and a buffer, so that each
// is tested alone and the overlap engine (GradientReducer's thread) merely calls them.
//   flat-mpi      MPI_Allreduce on the world.
//   flat-nccl     ncclAllReduce on the world, over device memory (nccl_allreduce.hpp).
//   hierarchical  1. reduce-scatter inside the node (intra backend mpi, shm or nccl),
//                 2. all-reduce of each owned shard across nodes, on the shard's rail (MPI),
//                 3. all-gather inside the node.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "comm/shared_buffer.hpp"
#include "comm/topology.hpp"
#include "core/tensor.hpp"

namespace mpt::comm {
namespace detail {
class NcclAllreduce;  // nccl_allreduce.hpp
}  // namespace detail

// The [comm] options, as parsed (names validated by resolve_allreduce()).
struct CommOptions {
  std::string allreduce = "auto";   // auto | flat-mpi | flat-nccl | hierarchical
  std::string intra = "auto";       // auto | shm | mpi | nccl: hierarchical's intra-node backend
  int ranks_per_node = 0;           // 0: shared-memory domains; K: groups of K ranks
  double bucket_mb = 25;            // gradient bucket size; 0: one bucket after backward
  double first_bucket_mb = 1;       // the first bucket (the last layers' gradients)
  std::string wire_dtype = "auto";  // auto (the gradients' dtype) | fp32 | fp16 | bf16
  // auto: the nccl backend's phase 2 (across nodes) calls MPI on device memory where MPI says
  // it can (cuda_aware_mpi()) and the wire is f32; off: always through pinned host memory.
  std::string cuda_aware_mpi = "auto";
  // on: buckets go out while backward runs; off: all at the end of backward; auto: see
  // overlap_buckets().
  std::string overlap = "auto";
  // Whether every rank has a core beyond its compute threads: `mptrain train` sets it from the
  // cores (one MAX over the world); a library caller keeps true.
  bool spare_core_everywhere = true;
  // The watchdog aborts the job when a rank has waited this long in one collective (0: off).
  double stall_timeout_s = 300;
};

enum class Algorithm { flat_mpi, hierarchical, flat_nccl };
enum class IntraBackend { mpi, shm, nccl };
// How the shm backend's node barrier waits for a late peer once a short spin is over: sleep (a
// futex the peer's arrival wakes: the core goes to the rank's other threads, such as backward
// beside a communication thread) or yield (the core goes to whatever else is runnable, most
// likely a peer rank when ranks outnumber cores). automatic: yield when the machine has more
// ranks than cores, else sleep.
enum class BarrierWait { automatic, sleep, yield };

struct AllreduceConfig {
  Algorithm algorithm = Algorithm::flat_mpi;
  IntraBackend intra = IntraBackend::shm;
  // The element type that travels and is summed. When it differs from the data's dtype, the
  // data is converted on the way in (times prescale) and back on the way out (times postscale).
  // 16-bit wire sums add in f32 wherever the backend allows (shm: one rounding per shard sum;
  // MPI ops: one rounding per pairwise step) and round to nearest even.
  DType wire = DType::f32;
  float prescale = 1;   // applied before the sum (1/N keeps a 16-bit sum from overflowing)
  float postscale = 1;  // applied after, fused into the last pass (1/N: the average)
  // The shm backend's segment per rank: longer buffers go through in chunks of half of it
  // (the two halves alternate, which saves a barrier per chunk). 1 MiB keeps a chunk's working
  // set in a core's L2: 2.5x faster than 16 MiB at 1-64 MiB on 2 ranks here (docs/architecture.md).
  std::int64_t shm_segment_bytes = std::int64_t{1} << 20;
  // Across nodes, the shm backend packs the pieces of this many bytes of wire data (whole
  // chunks, at least one) and sends each owned shard's pieces in one rail all-reduce: one call
  // per chunk cost latency that one node does not pay (docs/architecture.md).
  std::int64_t rail_batch_bytes = std::int64_t{2} << 20;
  BarrierWait barrier_wait = BarrierWait::automatic;
  // The nccl backend: phase 2 through the pinned host buffers and MPI even on one node, where
  // every rail is a single rank and it changes nothing: how a one-GPU test runs that path.
  bool nccl_stage_one_node = false;
  // The nccl backend's phase 2 hands MPI the device memory itself (CUDA-aware MPI), with no
  // copies through the host: only for an f32 wire, which MPI sums with its own MPI_SUM (the
  // 16-bit wires' sums are this project's MPI ops, which read host memory).
  bool mpi_on_device = false;
};

const char* algorithm_name(Algorithm algorithm);  // "flat-mpi", "hierarchical", "flat-nccl"
const char* intra_name(IntraBackend intra);       // "mpi", "shm", "nccl"

// True where this build has the nccl backend (CUDA and NCCL were found: MPTRAIN_HAVE_NCCL).
bool nccl_built();
// True where MPI can read and write cuda device memory: an Open MPI built with CUDA support
// (MPIX_CUDA_AWARE_SUPPORT in mpi-ext.h) that confirms it at run time (MPIX_Query_cuda_support).
// False for any other MPI (Debian's Open MPI is built without it).
bool cuda_aware_mpi();
// True when CONFIG's algorithm runs NCCL (flat-nccl, or hierarchical with the nccl intra
// backend): then allreduce() takes data in the current cuda device's memory, never host memory.
bool uses_nccl(const AllreduceConfig& config);

// Which ranks would hand NCCL the same GPU (NCCL refuses a communicator where two ranks share
// one): a line such as "ranks 0 and 1 share the GPU 0000:1b:00.0 on HOST", or empty when none.
struct SharedGpus {
  std::string in_node;   // two ranks of one node (the hierarchical nccl backend's communicator)
  std::string in_world;  // two ranks anywhere (flat-nccl's)
};
// Collective over TOPOLOGY's world, every rank bound to its cuda device: compares the devices'
// host and PCI bus ids. Both empty in a build without NCCL (and then not collective).
SharedGpus find_shared_gpus(const Topology& topology);

// OPTIONS' names resolved for TOPOLOGY and gradients of GRAD_DTYPE on DEVICE. auto on the cpu:
// hierarchical with shm when the world has more than one rank and the node shares memory, else
// flat-mpi. auto on cuda: hierarchical with nccl where this build has it and no two ranks of a
// node share a GPU (SHARED, from find_shared_gpus), else as on the cpu (the caller stages the
// gradients through host memory). Throws UserError naming the option (--comm.allreduce,
// --comm.intra, --comm.wire-dtype) when a name is unknown, shm is asked for where ranks do not
// share memory, or nccl (flat-nccl) where the build has no NCCL, the gradients are not on cuda
// or ranks share a GPU, and --comm.cuda-aware-mpi for a value other than auto and off.
// mpi_on_device: hierarchical nccl, an f32 wire, cuda_aware_mpi() and not off. prescale and
// postscale stay 1: the trainer folds 1/global_batch into
// the gradients and wants the plain sum; a caller that averages (the benchmark) sets them.
AllreduceConfig resolve_allreduce(const CommOptions& options, const Topology& topology,
                                  DType grad_dtype, Device device = Device::cpu,
                                  const SharedGpus& shared = {});

// --comm.overlap for a run whose model is on cuda (ON_CUDA) or the host: on and off as given;
// auto: on for a cuda model, whose host thread only queues kernels while the communication
// thread reduces; on the host only where spare_core_everywhere, since the all-reduce is CPU work
// and on ranks that fill their cores it takes turns with backward (docs/perf.md). Every input
// is agreed over the world, so every rank decides alike (sync BN's collectives run among the
// buckets). Throws UserError naming --comm.overlap for another value.
bool overlap_buckets(const CommOptions& options, bool on_cuda);

// One algorithm bound to a topology, with the state it needs (the shm window, wire scratch).
// Collective to construct, to call and to destroy (the shm window is freed over the node):
// every rank of the topology's world calls allreduce() with the same count and dtype, in the
// same order. Not thread-safe: one thread at a time calls it (MPI_THREAD_SERIALIZED suffices).
class Allreducer {
 public:
  Allreducer(const Topology& topology, const AllreduceConfig& config);
  ~Allreducer();
  Allreducer(const Allreducer&) = delete;
  Allreducer& operator=(const Allreducer&) = delete;

  // In place: DATA[0, COUNT) of DTYPE (f32, f16 or bf16) <- postscale * sum over ranks of
  // (prescale * DATA). Every rank ends with the same bits. COUNT may be 0. DATA is host memory,
  // or device memory when uses_nccl(config()): then the call returns once the result is there
  // (the nccl backend orders itself after the work already queued on the compute stream).
  void allreduce(void* data, std::int64_t count, DType dtype);
  void allreduce(Tensor& data) { allreduce(data.raw(), data.numel(), data.dtype()); }
  // Registers BUFFER (built over this topology's node; collective: every rank of the world
  // registers its part, or none does): from then on, a hierarchical shm all-reduce of data
  // inside this rank's part whose dtype is the wire's reads the peers' data straight from their
  // parts, with no copy into the staging segment (docs/architecture.md, "Registered
  // gradients"). Other data, and the other algorithms, go as before.
  void register_buffer(std::shared_ptr<SharedBuffer> buffer);

  // The queued form, where the data is device memory (uses_nccl(config())): the calls of a step
  // go on the comm stream, each after the compute work that wrote its data, and the host never
  // waits for the device inside the step. SLOTS name the step's calls (plan once); mark(SLOT),
  // from the thread that queues the compute work, records where it is; allreduce_queued(SLOT,
  // ...) queues the call after that point and returns; join(), from the compute thread once
  // every call is queued, makes later compute work wait for them on the device; finish(KEEP),
  // any thread, waits on the host until at most KEEP joins are outstanding, reports NCCL's
  // asynchronous errors, and returns the seconds the compute stream waited for the calls (the
  // contract of detail::NcclAllreduce). Abort unless queues().
  bool queues() const;
  void plan_slots(int slots, std::int64_t max_count, DType dtype);
  void mark(int slot);
  void allreduce_queued(int slot, void* data, std::int64_t count, DType dtype);
  void join();
  double finish(int keep);
  // Sync BN's statistics on the device: whether sum_queued() is possible (queues(), and the
  // nccl communicator spans the world), and the queued f32 sum over the world of DATA[0,
  // COUNT), in place, ordered on the device after the compute work queued so far and before
  // the compute work queued after it (detail::NcclAllreduce::sum_queued).
  bool sums_on_device() const;
  void sum_queued(float* data, std::int64_t count);
  // CUDA graphs (detail::NcclAllreduce's contract): whether calls can be captured at all (the
  // communicator spans the world, NCCL_GRAPH_MIXING_SUPPORT is not 0), and the gradient calls
  // too (no phase through the host); capture_on(STREAM) while the calling thread captures the
  // compute stream STREAM (nullptr ends it; needs captures()); the join slot a graph captured
  // now would hold; and replayed(SLOT) once a launch of that graph is queued.
  bool captures() const;
  bool captures_buckets() const;
  void capture_on(void* stream);
  int next_join_slot() const;
  void replayed(int slot);
  // Tests: BACKEND stands in for the nccl backend from now on (before the first call), so that
  // the queued form's users run on the CPU. Every call goes to it, as to the nccl backend.
  void set_device_backend(std::unique_ptr<detail::NcclAllreduce> backend);

  // Where the last allreduce() call waited in its first node barrier: this rank had arrived
  // (its data final, or staged) and waited for the node's last peer to arrive. That is the
  // peers' lateness, the ranks' skew, not the cost of moving data; the trainer reports the part
  // of it that backward did not hide (docs/architecture.md, "Peer wait"). Measured by the shm
  // backend on a node of more than one rank; elsewhere the lateness stays inside MPI or NCCL
  // and `measured` is false.
  struct PeerWait {
    std::chrono::steady_clock::time_point start, end;
    bool measured = false;
  };
  const PeerWait& last_peer_wait() const;
  // True when calls of this Allreducer measure PeerWait (the shm backend, local_size > 1).
  bool measures_peer_wait() const;

  const AllreduceConfig& config() const { return config_; }
  const Topology& topology() const { return topology_; }

 private:
  struct Impl;
  const Topology& topology_;
  AllreduceConfig config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace mpt::comm
