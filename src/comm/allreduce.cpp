// The all-reduce algorithms (see allreduce.hpp): flat MPI, and hierarchical with an MPI or a
// shared-memory intra-node backend; flat NCCL and the nccl intra-node backend live in
// nccl_allreduce.cpp (built only with CUDA and NCCL), which Allreducer hands device data to.
// Every element is summed by exactly one rank (its shard's owner, or MPI's reduction, which ends
// equal on every rank) and then copied, so all ranks end with the same bits.
#include "comm/allreduce.hpp"

#include <sched.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include <mpi.h>
// Open MPI's extensions (MPIX_CUDA_AWARE_SUPPORT, MPIX_Query_cuda_support), where present.
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif

#include "comm/half_sum.hpp"
#include "comm/nccl_allreduce.hpp"
#include "comm/wire.hpp"
#include "core/error.hpp"

namespace mpt::comm {
namespace {

// Elements per MPI call: MPI counts are int. Every rank cuts a buffer at the same places.
constexpr std::int64_t kMaxMpiCount = std::int64_t{1} << 30;
// The shm segment is split into two halves of a multiple of this many bytes.
constexpr std::int64_t kShmAlign = 64;
// Each segment starts with this rank's barrier counter and, a cache line further, the number of
// peers asleep on it; both alone in their cache lines.
constexpr std::int64_t kFlagBytes = 128;
constexpr std::int64_t kSleepersOffset = 64;
// How a node barrier waits for a late peer, after spinning on its counter a while. When
// the machine has a core per rank, by sleeping until the peer's arrival wakes it (a futex on
// the counter's shared page): the core then belongs to whatever else this rank runs (backward,
// while a communication thread reduces buckets), and the waiter is back the moment the peer
// arrives, where a yielding waiter would wait out compute's time slice. When ranks outnumber
// the cores, by yielding: the thread that gets this core is then most likely the peer itself,
// and a futex's sleep and wake-up would cost more than the barrier (a longer spin, too).
// 8192 pauses are about 200 us here: more than ranks drift apart inside one call, where a
// sleep costs the wake-up of a halted vCPU at every chunk (1024 made 16-64 MiB calls on 2 ranks
// about 30 % slower), and far less than a time slice, which a descheduled peer costs.
constexpr int kSpinsBeforeSleep = 8192;
constexpr int kSpinsBeforeYield = 256;

// How many peers sleep on a rank's barrier COUNTER: a cache line past it, in the same segment.
std::uint32_t* sleepers(std::uint64_t* counter) {
  auto* line = reinterpret_cast<std::uint8_t*>(counter) + kSleepersOffset;
  return reinterpret_cast<std::uint32_t*>(line);
}

#ifdef __linux__
// The futex word of a barrier counter: its low 32 bits, which change at every barrier.
std::uint32_t* futex_word(std::uint64_t* counter) {
  const int low_half = std::endian::native == std::endian::little ? 0 : 1;
  return reinterpret_cast<std::uint32_t*>(counter) + low_half;
}
// Sleeps while *WORD == EXPECTED (the kernel checks it atomically with queueing the sleeper),
// at most 200 ms, a safety net: the caller re-checks either way, and the peer's arrival wakes
// it long before. Not FUTEX_PRIVATE: the window's pages are shared between processes.
void futex_sleep(std::uint32_t* word, std::uint32_t expected) {
  timespec timeout{0, 200'000'000};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &timeout, nullptr, 0);
}
void futex_wake_all(std::uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}
#endif

std::uint8_t* bytes(void* data) { return static_cast<std::uint8_t*>(data); }
std::size_t offset(std::int64_t elements, std::size_t element_size) {
  return static_cast<std::size_t>(elements) * element_size;
}

#ifdef MPTRAIN_SIMGRID
// The simulation build (perf/sim/, smpicxx): SMPI runs thousands of simulated ranks in one
// process, whose scratch buffers would not fit in memory. SMPI_SHARED_MALLOC gives every rank
// the same pages (a plain malloc under --cfg=smpi/shared-malloc:off, which the correctness
// check uses), left uninitialised: the algorithm writes before it reads.
template <class T>
struct SimScratchAllocator {
  using value_type = T;
  SimScratchAllocator() = default;
  template <class U>
  SimScratchAllocator(const SimScratchAllocator<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(SMPI_SHARED_MALLOC(n * sizeof(T))); }
  void deallocate(T* p, std::size_t) { SMPI_SHARED_FREE(p); }
  template <class U>
  void construct(U*) {}  // resize() leaves the bytes as they are
  bool operator==(const SimScratchAllocator&) const { return true; }
};
using Scratch = std::vector<std::uint8_t, SimScratchAllocator<std::uint8_t>>;
#else
using Scratch = std::vector<std::uint8_t>;
#endif

void grow(Scratch& buffer, std::size_t size) {
  // Planned by the first (largest) bucket; later calls reuse it.
  if (buffer.size() < size) buffer.resize(std::max<std::size_t>(size, 64));
}

bool is_reducible(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16;
}

}  // namespace

const char* algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::flat_mpi:
      return "flat-mpi";
    case Algorithm::flat_nccl:
      return "flat-nccl";
    default:
      return "hierarchical";
  }
}

const char* intra_name(IntraBackend intra) {
  switch (intra) {
    case IntraBackend::mpi:
      return "mpi";
    case IntraBackend::nccl:
      return "nccl";
    default:
      return "shm";
  }
}

bool nccl_built() {
#ifdef MPTRAIN_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

bool cuda_aware_mpi() {
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

bool uses_nccl(const AllreduceConfig& config) {
  return config.algorithm == Algorithm::flat_nccl ||
         (config.algorithm == Algorithm::hierarchical && config.intra == IntraBackend::nccl);
}

#ifndef MPTRAIN_HAVE_NCCL
SharedGpus find_shared_gpus(const Topology&) { return {}; }  // (nccl_allreduce.cpp otherwise)
#endif

namespace {

// Where OPTION (--comm.intra=nccl, --comm.allreduce=flat-nccl) cannot run: no NCCL in the
// build, gradients on the host, or two ranks of one communicator on the same GPU (SHARED).
void require_nccl(const std::string& option, Device device, const std::string& shared) {
  MPT_REQUIRE(nccl_built(), option + ": this build has no NCCL",
              "rebuild with -DMPTRAIN_ENABLE_CUDA=ON where NCCL is found (docs/gpu.md), or use "
              "--comm.intra=auto, shm or mpi and --comm.allreduce=auto, flat-mpi or hierarchical");
  MPT_REQUIRE(device == Device::cuda,
              option + ": the gradients are on the cpu, NCCL reduces GPU memory",
              "train with --device=cuda (one GPU per rank), or use --comm.intra=auto, shm or mpi "
              "and --comm.allreduce=auto, flat-mpi or hierarchical");
  MPT_REQUIRE(shared.empty(), option + ": " + shared + ", and NCCL needs a GPU per rank",
              "run at most one rank per GPU, or use --comm.intra=shm or mpi (--comm.allreduce="
              "flat-mpi), which stage the gradients through host memory");
}

}  // namespace

bool overlap_buckets(const CommOptions& options, bool on_cuda) {
  const std::string& option = options.overlap;
  MPT_REQUIRE(option == "auto" || option == "on" || option == "off",
              "--comm.overlap: unknown value '" + option + "'", "use auto, on or off");
  if (option != "auto") return option == "on";
  return on_cuda || options.spare_core_everywhere;
}

AllreduceConfig resolve_allreduce(const CommOptions& options, const Topology& topology,
                                  DType grad_dtype, Device device, const SharedGpus& shared) {
  AllreduceConfig config;
  const bool shm_possible = topology.shm_capable();
  // auto on cuda takes NCCL where it can run; elsewhere (and where ranks share a GPU) the host
  // backends, on gradients the caller stages through host memory.
  const bool nccl_possible = nccl_built() && device == Device::cuda && shared.in_node.empty();
  if (options.intra == "auto") {
    config.intra = nccl_possible  ? IntraBackend::nccl
                   : shm_possible ? IntraBackend::shm
                                  : IntraBackend::mpi;
  } else if (options.intra == "nccl") {
    require_nccl("--comm.intra=nccl", device, shared.in_node);
    config.intra = IntraBackend::nccl;
  } else if (options.intra == "shm") {
    MPT_REQUIRE(shm_possible, "--comm.intra=shm: the ranks of a node do not all share memory",
                "use --comm.intra=mpi, or a --comm.ranks-per-node that divides the ranks per host");
    config.intra = IntraBackend::shm;
  } else if (options.intra == "mpi") {
    config.intra = IntraBackend::mpi;
  } else {
    throw_user_error("--comm.intra: unknown backend '" + options.intra + "'",
                     "use auto, shm, mpi or nccl");
  }

  if (options.allreduce == "auto") {
    // With nccl even on one rank: the device gradients then never leave the device.
    config.algorithm = config.intra == IntraBackend::nccl || (topology.size() > 1 && shm_possible)
                           ? Algorithm::hierarchical
                           : Algorithm::flat_mpi;
  } else if (options.allreduce == "flat-mpi") {
    config.algorithm = Algorithm::flat_mpi;
  } else if (options.allreduce == "flat-nccl") {
    require_nccl("--comm.allreduce=flat-nccl", device, shared.in_world);
    config.algorithm = Algorithm::flat_nccl;
  } else if (options.allreduce == "hierarchical") {
    config.algorithm = Algorithm::hierarchical;
  } else {
    throw_user_error("--comm.allreduce: unknown algorithm '" + options.allreduce + "'",
                     "use auto, flat-mpi, flat-nccl or hierarchical");
  }

  if (options.wire_dtype == "auto") {
    config.wire = grad_dtype;
  } else if (options.wire_dtype == "fp32") {
    config.wire = DType::f32;
  } else if (options.wire_dtype == "fp16") {
    config.wire = DType::f16;
  } else if (options.wire_dtype == "bf16") {
    config.wire = DType::bf16;
  } else {
    throw_user_error("--comm.wire-dtype: unknown dtype '" + options.wire_dtype + "'",
                     "use auto (the gradients' dtype), fp32, fp16 or bf16");
  }
  if (!is_reducible(config.wire))
    abort_job(std::string("comm::resolve_allreduce: gradients of dtype ") + dtype_name(grad_dtype) +
              " cannot be all-reduced");
  MPT_REQUIRE(options.cuda_aware_mpi == "auto" || options.cuda_aware_mpi == "off",
              "--comm.cuda-aware-mpi: unknown value '" + options.cuda_aware_mpi + "'",
              "use auto (MPI on device memory where it says it can) or off");
  config.mpi_on_device = options.cuda_aware_mpi == "auto" &&
                         config.algorithm == Algorithm::hierarchical &&
                         config.intra == IntraBackend::nccl && config.wire == DType::f32 &&
                         cuda_aware_mpi();
  // prescale and postscale stay 1: the trainer folds 1/global_batch into the gradients, so it
  // wants the plain sum. A caller that averages sets them (1/N), e.g. the benchmark.
  return config;
}

// Consecutive chunks whose pieces of each shard a rank owns are packed together, shard after
// shard, so that one rail call per shard covers them all. Every chunk but the last is full.
struct RailBatch {
  std::int64_t chunks = 0;
  std::vector<std::int64_t> base;  // per owned shard (from the first): its offset; then the total
  std::vector<std::int64_t> full;  // per owned shard: its piece of a full chunk
  std::int64_t piece(int owned, std::int64_t chunk) const {
    return base[static_cast<std::size_t>(owned)] + chunk * full[static_cast<std::size_t>(owned)];
  }
};

struct Allreducer::Impl {
  Impl(const Topology& topology, const AllreduceConfig& config);
  ~Impl();

  void flat(void* data, std::int64_t count, DType dtype);
  void hierarchical_mpi(void* data, std::int64_t count, DType dtype);
  void hierarchical_shm(void* data, std::int64_t count, DType dtype);
  // The shm backend on data in the registered buffer: each rank sums its region straight out of
  // the peers' data (the same offset in their parts), and gathers the others from theirs.
  void registered_shm(void* data, std::int64_t count, DType dtype);
  bool can_read_peers(const void* data, std::int64_t count, DType dtype) const;
  // Chunk and rail batch, in elements, for data of DTYPE: the same on every rank.
  std::int64_t chunk_elements(DType dtype) const;
  std::int64_t batch_elements(std::int64_t chunk) const;

  // The buffer that goes on the wire: DATA itself (scaled in place if prescale != 1) when the
  // dtypes agree, else the scratch with DATA converted and prescaled.
  std::uint8_t* to_wire(void* data, std::int64_t count, DType dtype);
  // The way back: converts WIRE into DATA with postscale, or scales DATA in place, unless
  // SCALED says the postscale was applied already.
  void from_wire(const std::uint8_t* wire, void* data, std::int64_t count, DType dtype,
                 bool scaled);
  // Phase 2 alone, for a node of one rank: every shard of CHUNK-sized pieces on its rail.
  void rails_only(std::uint8_t* wire, std::int64_t count, std::int64_t chunk);
  // Elements [begin, end) of an N-element piece owned by local rank LOCAL (its shards).
  Range region(std::int64_t n, int local) const;
  // All-reduces the shards this rank owns of an N-element piece; MINE is its region's start.
  void rail_allreduce(std::uint8_t* mine, std::int64_t n);
  void node_barrier();
  // The call's first node barrier, timed into peer_wait: where this rank waits for late peers.
  void arrival_barrier();
  // The packed layout of N elements (a rail batch) cut in CHUNK-sized chunks.
  const RailBatch& rail_batch(std::int64_t n, std::int64_t chunk);
  // Phase 2 of the shm backend: each owned shard of a packed rail batch on its rail.
  void rail_allreduce_batch(std::uint8_t* packed, const RailBatch& batch);
  // Phase 4 of the shm backend for one chunk of N elements at CHUNK_DATA: the other regions,
  // from their owners' slots in the current half.
  void gather(std::uint8_t* chunk_data, std::int64_t n, DType dtype);
  // The shm backend on a node of one rank (no window): phase 2 alone, in the same batches.
  void lone_rank(void* data, std::int64_t count, DType dtype, std::int64_t chunk,
                 std::int64_t batch_count);

  const Topology& topology;
  const AllreduceConfig& config;
  const std::size_t wire_size;
  detail::SumOps ops;
  Scratch wire_scratch, shard_scratch, rail_scratch;
  RailBatch batch_;
  std::vector<int> counts, displacements;
  std::vector<detail::Operand> inputs;  // the shm sum's, one per local rank
  // shm: one segment per local rank: its barrier counter, then two halves that successive
  // chunks use alternately.
  MPI_Win window = MPI_WIN_NULL;
  std::vector<std::uint8_t*> segments;  // each past its counter
  std::vector<std::uint64_t*> counters;
  bool ranks_share_cores = false;  // more ranks on this machine than cores: wait by yielding
  std::uint64_t barriers = 0;      // node barriers passed: the same count on every rank of the node
  std::int64_t half_bytes = 0;
  int half = 0;
  std::shared_ptr<SharedBuffer> registered;     // the buffer whose peers' parts the sums read
  std::unique_ptr<detail::NcclAllreduce> nccl;  // flat-nccl and hierarchical nccl: all of it
  Allreducer::PeerWait peer_wait;  // the last call's, reset by each call
};

Allreducer::Impl::Impl(const Topology& topology, const AllreduceConfig& config)
    : topology(topology), config(config), wire_size(dtype_size(config.wire)) {
  const int local_size = topology.local_size();
  counts.resize(static_cast<std::size_t>(local_size));
  displacements.resize(static_cast<std::size_t>(local_size));
  inputs.resize(static_cast<std::size_t>(local_size));
  const std::int64_t segment =
      std::max(2 * kShmAlign, config.shm_segment_bytes / (2 * kShmAlign) * (2 * kShmAlign));
  half_bytes = segment / 2;
  if (uses_nccl(config)) {
#ifdef MPTRAIN_HAVE_NCCL
    nccl = detail::make_nccl_allreduce(topology, config);
#else
    abort_job("comm::Allreducer: this build has no NCCL (resolve_allreduce refuses nccl here)");
#endif
    return;
  }
  const bool use_shm = config.algorithm == Algorithm::hierarchical &&
                       config.intra == IntraBackend::shm && topology.size() > 1;
  if (!use_shm || local_size == 1) return;  // (a node of one rank needs no window)
  if (!topology.shm_capable())
    abort_job("comm::Allreducer: the shm backend needs nodes that share memory");
  // Non-contiguous: each rank's segment may sit in its own pages (first touch by its owner).
  MPI_Info info = MPI_INFO_NULL;
  MPT_CHECK_MPI(MPI_Info_create(&info));
  MPT_CHECK_MPI(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
  void* base = nullptr;
  MPT_CHECK_MPI(
      MPI_Win_allocate_shared(kFlagBytes + segment, 1, info, topology.node(), &base, &window));
  MPT_CHECK_MPI(MPI_Info_free(&info));
  segments.resize(static_cast<std::size_t>(local_size));
  counters.resize(static_cast<std::size_t>(local_size));
  for (int local = 0; local < local_size; ++local) {
    MPI_Aint size = 0;
    int unit = 0;
    void* pointer = nullptr;
    MPT_CHECK_MPI(MPI_Win_shared_query(window, local, &size, &unit, &pointer));
    counters[static_cast<std::size_t>(local)] = static_cast<std::uint64_t*>(pointer);
    segments[static_cast<std::size_t>(local)] = static_cast<std::uint8_t*>(pointer) + kFlagBytes;
  }
  // One passive epoch for the window's lifetime: loads and stores go straight to memory, and
  // node_barrier() orders them (MPI_Win_sync is a memory barrier for the unified model).
  MPT_CHECK_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, window));
  ranks_share_cores = config.barrier_wait == BarrierWait::yield ||
                      (config.barrier_wait == BarrierWait::automatic &&
                       topology.device_peers() > sysconf(_SC_NPROCESSORS_ONLN));
  const auto me = static_cast<std::size_t>(topology.local_rank());
  std::atomic_ref<std::uint64_t>(*counters[me]).store(0, std::memory_order_release);
  std::atomic_ref<std::uint32_t>(*sleepers(counters[me])).store(0, std::memory_order_release);
  MPT_CHECK_MPI(MPI_Win_sync(window));
  MPT_CHECK_MPI(MPI_Barrier(topology.node()));  // every counter is 0 before any barrier
  MPT_CHECK_MPI(MPI_Win_sync(window));
}

Allreducer::Impl::~Impl() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || window == MPI_WIN_NULL) return;
  // MPI_Win_free synchronises the node: skip it while an exception unwinds on this rank alone
  // (the job is ending; the other ranks may never get here).
  if (std::uncaught_exceptions() > 0) return;
  MPI_Win_unlock_all(window);
  MPI_Win_free(&window);
}

std::uint8_t* Allreducer::Impl::to_wire(void* data, std::int64_t count, DType dtype) {
  if (dtype == config.wire) {
    detail::convert_scaled(data, dtype, data, dtype, count, config.prescale);  // 1: nothing
    return bytes(data);
  }
  grow(wire_scratch, offset(count, wire_size));
  detail::convert_scaled(data, dtype, wire_scratch.data(), config.wire, count, config.prescale);
  return wire_scratch.data();
}

void Allreducer::Impl::from_wire(const std::uint8_t* wire, void* data, std::int64_t count,
                                 DType dtype, bool scaled) {
  const float postscale = scaled ? 1.f : config.postscale;
  detail::convert_scaled(wire, config.wire, data, dtype, count, postscale);
}

void Allreducer::Impl::flat(void* data, std::int64_t count, DType dtype) {
  std::uint8_t* wire = to_wire(data, count, dtype);
  for (std::int64_t begin = 0; begin < count; begin += kMaxMpiCount) {
    const int n = static_cast<int>(std::min(kMaxMpiCount, count - begin));
    MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, wire + offset(begin, wire_size), n,
                                ops.type(config.wire), ops.sum(config.wire), topology.world()));
  }
  from_wire(wire, data, count, dtype, /*scaled=*/false);
}

Range Allreducer::Impl::region(std::int64_t n, int local) const {
  const int parts = topology.num_shards();
  const Range shards = owned_shards(topology.local_size(), parts, local);
  return {shard_range(n, parts, static_cast<int>(shards.begin)).begin,
          shard_range(n, parts, static_cast<int>(shards.end) - 1).end};
}

void Allreducer::Impl::rail_allreduce(std::uint8_t* mine, std::int64_t n) {
  if (topology.num_nodes() == 1) return;  // each rail is a single rank
  // Increasing shard order on every rank: on a smaller node one rank owns several shards and
  // meets each rail in the order its owners on the other nodes do, so nothing deadlocks.
  const std::int64_t mine_begin = region(n, topology.local_rank()).begin;
  for (int shard = topology.first_shard(); shard < topology.end_shard(); ++shard) {
    const Range range = shard_range(n, topology.num_shards(), shard);
    if (range.size() == 0) continue;  // the same on every node: the rail skips it together
    MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, mine + offset(range.begin - mine_begin, wire_size),
                                static_cast<int>(range.size()), ops.type(config.wire),
                                ops.sum(config.wire), topology.rail(shard)));
  }
}

void Allreducer::Impl::rails_only(std::uint8_t* wire, std::int64_t count, std::int64_t chunk) {
  for (std::int64_t begin = 0; begin < count; begin += chunk)
    rail_allreduce(wire + offset(begin, wire_size), std::min(chunk, count - begin));
}

void Allreducer::Impl::hierarchical_mpi(void* data, std::int64_t count, DType dtype) {
  std::uint8_t* wire = to_wire(data, count, dtype);
  const int local_size = topology.local_size();
  if (local_size == 1) {
    rails_only(wire, count, kMaxMpiCount);
    return from_wire(wire, data, count, dtype, /*scaled=*/false);
  }
  // The owner scales its shard before the all-gather when the data is the wire buffer: the
  // postscale then costs 1/L of a pass. Otherwise it rides on the conversion back.
  const bool scale_shard = wire == bytes(data) && config.postscale != 1.f;
  const MPI_Datatype type = ops.type(config.wire);
  const MPI_Op sum = ops.sum(config.wire);
  for (std::int64_t begin = 0; begin < count; begin += kMaxMpiCount) {
    const std::int64_t n = std::min(kMaxMpiCount, count - begin);
    std::uint8_t* piece = wire + offset(begin, wire_size);
    for (int local = 0; local < local_size; ++local) {
      const Range range = region(n, local);
      counts[static_cast<std::size_t>(local)] = static_cast<int>(range.size());
      displacements[static_cast<std::size_t>(local)] = static_cast<int>(range.begin);
    }
    const int mine = counts[static_cast<std::size_t>(topology.local_rank())];
    grow(shard_scratch, offset(*std::max_element(counts.begin(), counts.end()), wire_size));
    std::uint8_t* shard = shard_scratch.data();
    // Equal regions (the count divides evenly and every rank owns as many shards): the _block
    // and plain forms, which MPI libraries tune best. Otherwise the per-rank counts (the first
    // ranks hold one element more, and on a smaller node some ranks hold several shards).
    const bool equal = std::all_of(counts.begin(), counts.end(), [&](int c) { return c == mine; });
    if (equal) {
      MPT_CHECK_MPI(MPI_Reduce_scatter_block(piece, shard, mine, type, sum, topology.node()));
    } else {
      MPT_CHECK_MPI(MPI_Reduce_scatter(piece, shard, counts.data(), type, sum, topology.node()));
    }
    rail_allreduce(shard, n);
    if (scale_shard)
      detail::convert_scaled(shard, config.wire, shard, config.wire, mine, config.postscale);
    if (equal) {
      MPT_CHECK_MPI(MPI_Allgather(shard, mine, type, piece, mine, type, topology.node()));
    } else {
      MPT_CHECK_MPI(MPI_Allgatherv(shard, mine, type, piece, counts.data(), displacements.data(),
                                   type, topology.node()));
    }
  }
  from_wire(wire, data, count, dtype, scale_shard);
}

void Allreducer::Impl::node_barrier() {
  // A barrier through the window: each rank raises its own counter to the barrier's number and
  // waits until every peer's counter reaches it (a peer may already be one further: >=). Release
  // and acquire order the slot stores before the counter and the peers' slot loads after it;
  // MPI_Win_sync is the MPI-3 memory barrier for the same, kept so that the window's use stays
  // within the unified model. Unlike MPI_Barrier, a waiter that spun briefly gives its core up
  // (see kSpinsBeforeSleep), which matters when ranks and their communication threads outnumber the
  // free cores.
  MPT_CHECK_MPI(MPI_Win_sync(window));
  ++barriers;
  const auto me = static_cast<std::size_t>(topology.local_rank());
  std::atomic_ref<std::uint64_t>(*counters[me]).store(barriers, std::memory_order_seq_cst);
#ifdef __linux__
  // Dekker with the sleeper's side below: a sleeper raises the count, then reads the counter;
  // this rank stores the counter, then reads the count (all seq_cst). Either the sleeper sees
  // the new counter, or this rank sees it asleep and wakes it (or makes its FUTEX_WAIT return:
  // the kernel compares the word when it queues the sleeper).
  if (std::atomic_ref<std::uint32_t>(*sleepers(counters[me])).load(std::memory_order_seq_cst) != 0)
    futex_wake_all(futex_word(counters[me]));
#endif
  for (std::size_t peer = 0; peer < counters.size(); ++peer) {
    if (peer == me) continue;
    const std::atomic_ref<std::uint64_t> counter(*counters[peer]);
    const auto arrived = [&] { return counter.load(std::memory_order_acquire) >= barriers; };
    const int spin_limit = ranks_share_cores ? kSpinsBeforeYield : kSpinsBeforeSleep;
    for (int spins = 0; spins < spin_limit && !arrived(); ++spins) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    if (arrived()) continue;
#ifdef __linux__
    if (ranks_share_cores) {
      while (!arrived()) sched_yield();
      continue;
    }
    const std::atomic_ref<std::uint32_t> asleep(*sleepers(counters[peer]));
    asleep.fetch_add(1, std::memory_order_seq_cst);
    for (std::uint64_t seen; (seen = counter.load(std::memory_order_seq_cst)) < barriers;)
      futex_sleep(futex_word(counters[peer]), static_cast<std::uint32_t>(seen));
    asleep.fetch_sub(1, std::memory_order_seq_cst);
#else
    while (!arrived()) sched_yield();
#endif
  }
  MPT_CHECK_MPI(MPI_Win_sync(window));
}

void Allreducer::Impl::arrival_barrier() {
  const auto start = std::chrono::steady_clock::now();
  node_barrier();
  peer_wait = {start, std::chrono::steady_clock::now(), true};
}

const RailBatch& Allreducer::Impl::rail_batch(std::int64_t n, std::int64_t chunk) {
  RailBatch& batch = batch_;  // refilled in place: its vectors keep their capacity
  batch.chunks = (n + chunk - 1) / chunk;
  batch.base.clear();
  batch.full.clear();
  const std::int64_t last = n - (batch.chunks - 1) * chunk;
  const int parts = topology.num_shards();
  std::int64_t total = 0;
  for (int shard = topology.first_shard(); shard < topology.end_shard(); ++shard) {
    const std::int64_t full = shard_range(chunk, parts, shard).size();
    batch.base.push_back(total);
    batch.full.push_back(full);
    total += (batch.chunks - 1) * full + shard_range(last, parts, shard).size();
  }
  batch.base.push_back(total);
  return batch;
}

void Allreducer::Impl::rail_allreduce_batch(std::uint8_t* packed, const RailBatch& batch) {
  for (int shard = topology.first_shard(); shard < topology.end_shard(); ++shard) {
    const int owned = shard - topology.first_shard();
    const std::int64_t begin = batch.base[owned], size = batch.base[owned + 1] - begin;
    if (size == 0) continue;  // the same on every node: the rail skips it together
    MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, packed + offset(begin, wire_size),
                                static_cast<int>(size), ops.type(config.wire),
                                ops.sum(config.wire), topology.rail(shard)));
  }
}

void Allreducer::Impl::hierarchical_shm(void* data, std::int64_t count, DType dtype) {
  // A chunk fills half a segment on the wire, and as many bytes of data at most: the cache
  // footprint is what the segment size tunes. Every rank computes the same chunk (the data dtype
  // is the same everywhere), and the same rail batches, so the rail calls of all nodes match.
  const std::int64_t chunk = chunk_elements(dtype);
  const std::int64_t batch_count = batch_elements(chunk);
  const int local_size = topology.local_size(), me = topology.local_rank();
  const int parts = topology.num_shards(), first = topology.first_shard();
  const std::size_t data_size = dtype_size(dtype);
  if (local_size == 1) return lone_rank(data, count, dtype, chunk, batch_count);
  const bool one_node = topology.num_nodes() == 1;
  const auto slot = [&](int local) {
    return segments[static_cast<std::size_t>(local)] + half * half_bytes;
  };
  for (std::int64_t batch_begin = 0; batch_begin < count; batch_begin += batch_count) {
    const std::int64_t batch_n = std::min(batch_count, count - batch_begin);
    const RailBatch& batch = rail_batch(batch_n, chunk);
    if (!one_node) grow(rail_scratch, offset(batch.base.back(), wire_size));
    std::uint8_t* const packed = rail_scratch.data();
    // 1-2. Per chunk: copy in, then sum this rank's region out of every slot. On one node the
    // sum is final and the chunk is gathered at once; across nodes each owned shard's piece goes
    // to the rail batch, shard by shard, and the gather waits for the batch's rail calls.
    for (std::int64_t c = 0; c < batch.chunks; ++c) {
      const std::int64_t begin = batch_begin + c * chunk;
      const std::int64_t n = std::min(chunk, count - begin);
      std::uint8_t* chunk_data = bytes(data) + offset(begin, data_size);
      const Range mine = region(n, me);
      // Copy in (converted to the wire dtype, prescaled) what the peers sum: everything but this
      // rank's own region, which it reads straight from its data. Then wait for every peer's copy.
      detail::convert_scaled(chunk_data, dtype, slot(me), config.wire, mine.begin, config.prescale);
      detail::convert_scaled(chunk_data + offset(mine.end, data_size), dtype,
                             slot(me) + offset(mine.end, wire_size), config.wire, n - mine.end,
                             config.prescale);
      if (batch_begin == 0 && c == 0)
        arrival_barrier();
      else
        node_barrier();
      // Reduce-scatter: sum straight out of every peer's slot, in local rank order.
      const auto sum_into = [&](Range range, std::uint8_t* dst, const detail::Copy* back) {
        for (int local = 0; local < local_size; ++local) {
          inputs[static_cast<std::size_t>(local)] =
              local == me
                  ? detail::Operand{chunk_data + offset(range.begin, data_size), dtype,
                                    config.prescale}
                  : detail::Operand{slot(local) + offset(range.begin, wire_size), config.wire};
        }
        detail::sum_inputs(inputs.data(), local_size, dst, config.wire, range.size(), back);
      };
      if (one_node) {
        // The final sum, into this rank's slot for the peers and its own data in the same pass.
        const detail::Copy back{chunk_data + offset(mine.begin, data_size), dtype,
                                config.postscale};
        sum_into(mine, slot(me) + offset(mine.begin, wire_size), &back);
        node_barrier();
        gather(chunk_data, n, dtype);
      } else {
        for (int shard = first; shard < topology.end_shard(); ++shard)
          sum_into(shard_range(n, parts, shard),
                   packed + offset(batch.piece(shard - first, c), wire_size), nullptr);
      }
      // No barrier here: the next chunk fills the other half, and its barrier (which every rank
      // reaches only after it is done with this chunk) comes before anyone writes this half again.
      half ^= 1;
    }
    if (one_node) continue;
    // 3. Across nodes: one all-reduce per owned shard and batch, on the shard's rail.
    rail_allreduce_batch(packed, batch);
    // 4. Per chunk: put the reduced pieces in this rank's slot and data, then gather the rest.
    for (std::int64_t c = 0; c < batch.chunks; ++c) {
      const std::int64_t begin = batch_begin + c * chunk;
      const std::int64_t n = std::min(chunk, count - begin);
      std::uint8_t* chunk_data = bytes(data) + offset(begin, data_size);
      for (int shard = first; shard < topology.end_shard(); ++shard) {
        const Range range = shard_range(n, parts, shard);
        const std::uint8_t* piece = packed + offset(batch.piece(shard - first, c), wire_size);
        detail::convert_scaled(piece, config.wire, slot(me) + offset(range.begin, wire_size),
                               config.wire, range.size(), 1.f);
        detail::convert_scaled(piece, config.wire, chunk_data + offset(range.begin, data_size),
                               dtype, range.size(), config.postscale);
      }
      node_barrier();
      gather(chunk_data, n, dtype);
      half ^= 1;
    }
  }
}

std::int64_t Allreducer::Impl::chunk_elements(DType dtype) const {
  return half_bytes / static_cast<std::int64_t>(std::max(wire_size, dtype_size(dtype)));
}

std::int64_t Allreducer::Impl::batch_elements(std::int64_t chunk) const {
  return chunk * std::max<std::int64_t>(
                     1, config.rail_batch_bytes / static_cast<std::int64_t>(wire_size) / chunk);
}

bool Allreducer::Impl::can_read_peers(const void* data, std::int64_t count, DType dtype) const {
  // The same answer on every rank of a node: all registered alike, and the trainer's buckets
  // (like any caller's data) sit at the same offsets everywhere.
  return registered != nullptr && topology.local_size() > 1 && dtype == config.wire &&
         registered->holds(data, offset(count, wire_size));
}

void Allreducer::Impl::registered_shm(void* data, std::int64_t count, DType dtype) {
  // Node barriers order the reads of peers' data: one first (every rank's data is final), one
  // last (every region has its sum, and no peer still reads this rank's data when the caller
  // writes it again). Each element is summed by its region's owner, the only rank that reads or
  // writes that region in any rank's data between the two. On one node the owner writes the sum
  // into every rank's copy of its region. Across nodes it writes only its own, and a barrier per
  // rail batch (the staged path's cuts: the rail calls of every node match, registered or not)
  // comes before the peers gather it.
  const std::ptrdiff_t at = bytes(data) - reinterpret_cast<std::uint8_t*>(registered->data());
  const auto peer = [&](int local, std::int64_t element) {
    return reinterpret_cast<std::uint8_t*>(registered->part(local)) + at +
           offset(element, wire_size);
  };
  const int local_size = topology.local_size(), me = topology.local_rank();
  const int parts = topology.num_shards(), first = topology.first_shard();
  const bool one_node = topology.num_nodes() == 1;
  const std::int64_t chunk = chunk_elements(dtype);
  const std::int64_t group = batch_elements(chunk);  // across nodes
  const auto sum_from_peers = [&](std::int64_t begin, std::int64_t n, std::uint8_t* dst,
                                  const detail::Copy* back) {
    for (int local = 0; local < local_size; ++local)
      inputs[static_cast<std::size_t>(local)] = {peer(local, begin), dtype, config.prescale};
    detail::sum_inputs(inputs.data(), local_size, dst, config.wire, n, back);
  };
  arrival_barrier();
  if (one_node) {
    // A rank's region is read, in every rank's data, by that rank alone: once its sum is
    // written, the owner pushes it into the peers' copies of the region itself. That replaces
    // the gather (each rank reading the others' regions back: a pass over the data less) and
    // with it the barrier per chunk; the last barrier says every region has arrived.
    for (std::int64_t begin = 0; begin < count; begin += chunk) {
      const std::int64_t n = std::min(chunk, count - begin);
      const Range mine = region(n, me);
      std::uint8_t* dst = peer(me, begin + mine.begin);
      const std::size_t region_bytes = static_cast<std::size_t>(offset(mine.size(), wire_size));
      if (local_size == 2 && config.postscale == 1.f) {
        // Two ranks: the push is the sum's second store, made while the sum is in L1.
        const detail::Copy push{peer(1 - me, begin + mine.begin), dtype, 1.f};
        sum_from_peers(begin + mine.begin, mine.size(), dst, &push);
      } else {
        const detail::Copy back{dst, dtype, config.postscale};
        sum_from_peers(begin + mine.begin, mine.size(), dst,
                       config.postscale != 1.f ? &back : nullptr);
        for (int step = 1; step < local_size; ++step)
          std::memcpy(peer((me + step) % local_size, begin + mine.begin), dst, region_bytes);
      }
    }
    node_barrier();
    return;
  }
  for (std::int64_t group_begin = 0; group_begin < count; group_begin += group) {
    const std::int64_t group_n = std::min(group, count - group_begin);
    const std::int64_t chunks = (group_n + chunk - 1) / chunk;
    const RailBatch& batch = rail_batch(group_n, chunk);
    grow(rail_scratch, offset(batch.base.back(), wire_size));
    std::uint8_t* const packed = rail_scratch.data();
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t n = std::min(chunk, group_n - c * chunk);
      for (int shard = first; shard < topology.end_shard(); ++shard) {
        const Range range = shard_range(n, parts, shard);
        sum_from_peers(group_begin + c * chunk + range.begin, range.size(),
                       packed + offset(batch.piece(shard - first, c), wire_size), nullptr);
      }
    }
    rail_allreduce_batch(packed, batch);
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t n = std::min(chunk, group_n - c * chunk);
      for (int shard = first; shard < topology.end_shard(); ++shard) {
        const Range range = shard_range(n, parts, shard);
        detail::convert_scaled(packed + offset(batch.piece(shard - first, c), wire_size),
                               config.wire, peer(me, group_begin + c * chunk + range.begin),
                               dtype, range.size(), config.postscale);
      }
    }
    node_barrier();
    // Gather: every other region from its owner's data, final and postscaled there.
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t begin = group_begin + c * chunk;
      const std::int64_t n = std::min(chunk, count - begin);
      for (int step = 1; step < local_size; ++step) {
        const int owner = (me + step) % local_size;
        const Range range = region(n, owner);
        std::memcpy(peer(me, begin + range.begin), peer(owner, begin + range.begin),
                    offset(range.size(), wire_size));
      }
    }
  }
  node_barrier();
}

void Allreducer::Impl::gather(std::uint8_t* chunk_data, std::int64_t n, DType dtype) {
  // Copy every other region from its owner's slot, converted back and postscaled. Starting at
  // the next rank spreads the readers over the slots.
  const int local_size = topology.local_size(), me = topology.local_rank();
  const std::size_t data_size = dtype_size(dtype);
  for (int step = 1; step < local_size; ++step) {
    const int owner = (me + step) % local_size;
    const Range range = region(n, owner);
    detail::convert_scaled(segments[static_cast<std::size_t>(owner)] + half * half_bytes +
                               offset(range.begin, wire_size),
                           config.wire, chunk_data + offset(range.begin, data_size), dtype,
                           range.size(), config.postscale);
  }
}

void Allreducer::Impl::lone_rank(void* data, std::int64_t count, DType dtype, std::int64_t chunk,
                                 std::int64_t batch_count) {
  // A node of one rank has phase 2 alone. It cuts as the shm nodes cut, in the same rail
  // batches, so that its rail calls match theirs; it owns every shard, and packs each one's
  // pieces together as they do. Where every node is one rank there is a single shard and the
  // packing is the identity: the batches are all-reduced in place (in batches rather than whole:
  // Open MPI's MPI_Allreduce takes a scratch buffer of the message's size, which from 32 MiB on
  // is fresh pages from mmap on every call, half the bandwidth here).
  std::uint8_t* wire = to_wire(data, count, dtype);
  const int parts = topology.num_shards();
  for (std::int64_t batch_begin = 0; batch_begin < count; batch_begin += batch_count) {
    const std::int64_t batch_n = std::min(batch_count, count - batch_begin);
    std::uint8_t* batch_wire = wire + offset(batch_begin, wire_size);
    if (parts == 1) {
      MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, batch_wire, static_cast<int>(batch_n),
                                  ops.type(config.wire), ops.sum(config.wire), topology.rail(0)));
      continue;
    }
    const RailBatch& batch = rail_batch(batch_n, chunk);
    grow(rail_scratch, offset(batch_n, wire_size));
    std::uint8_t* const packed = rail_scratch.data();
    const auto each_piece = [&](bool pack) {
      for (std::int64_t c = 0; c < batch.chunks; ++c) {
        const std::int64_t n = std::min(chunk, batch_n - c * chunk);
        for (int shard = 0; shard < parts; ++shard) {
          const Range range = shard_range(n, parts, shard);
          std::uint8_t* piece = packed + offset(batch.piece(shard, c), wire_size);
          std::uint8_t* home = batch_wire + offset(c * chunk + range.begin, wire_size);
          std::copy_n(pack ? home : piece, offset(range.size(), wire_size), pack ? piece : home);
        }
      }
    };
    each_piece(/*pack=*/true);
    rail_allreduce_batch(packed, batch);
    each_piece(/*pack=*/false);
  }
  from_wire(wire, data, count, dtype, /*scaled=*/false);
}

Allreducer::Allreducer(const Topology& topology, const AllreduceConfig& config)
    : topology_(topology), config_(config), impl_(std::make_unique<Impl>(topology_, config_)) {}

Allreducer::~Allreducer() = default;

void Allreducer::register_buffer(std::shared_ptr<SharedBuffer> buffer) {
  if (buffer == nullptr) abort_job("comm::Allreducer::register_buffer: no buffer");
  int same = MPI_UNEQUAL;
  MPT_CHECK_MPI(MPI_Comm_compare(buffer->topology().node(), topology_.node(), &same));
  if (same != MPI_IDENT && same != MPI_CONGRUENT)
    abort_job("comm::Allreducer::register_buffer: the buffer spans another node than the "
              "topology's");
  impl_->registered = std::move(buffer);
}

const Allreducer::PeerWait& Allreducer::last_peer_wait() const { return impl_->peer_wait; }

bool Allreducer::measures_peer_wait() const { return impl_->window != MPI_WIN_NULL; }

void Allreducer::allreduce(void* data, std::int64_t count, DType dtype) {
  if (!is_reducible(dtype) || count < 0)
    abort_job(std::string("comm::Allreducer::allreduce: cannot reduce ") + std::to_string(count) +
              " elements of " + dtype_name(dtype));
  impl_->peer_wait = {};
  if (count == 0) return;
  // NCCL before the size-1 shortcut: its data is on the device, where MPI cannot reach it.
  if (impl_->nccl) return impl_->nccl->allreduce(data, count, dtype);
  if (topology_.size() == 1 || config_.algorithm == Algorithm::flat_mpi)
    return impl_->flat(data, count, dtype);
  if (config_.intra == IntraBackend::shm) {
    if (impl_->can_read_peers(data, count, dtype)) return impl_->registered_shm(data, count, dtype);
    return impl_->hierarchical_shm(data, count, dtype);
  }
  impl_->hierarchical_mpi(data, count, dtype);
}

bool Allreducer::queues() const { return impl_->nccl != nullptr; }

namespace {
detail::NcclAllreduce& queued_backend(const std::unique_ptr<detail::NcclAllreduce>& nccl,
                                      const char* call) {
  if (!nccl)
    abort_job(std::string("comm::Allreducer::") + call +
              ": only the nccl backend queues its calls (device data)");
  return *nccl;
}
}  // namespace

void Allreducer::plan_slots(int slots, std::int64_t max_count, DType dtype) {
  if (slots < 1) abort_job("comm::Allreducer::plan_slots: needs at least one slot");
  queued_backend(impl_->nccl, "plan_slots").plan_slots(slots, max_count, dtype);
}
void Allreducer::mark(int slot) { queued_backend(impl_->nccl, "mark").mark(slot); }
void Allreducer::allreduce_queued(int slot, void* data, std::int64_t count, DType dtype) {
  if (!is_reducible(dtype) || count < 0)
    abort_job(std::string("comm::Allreducer::allreduce_queued: cannot reduce ") +
              std::to_string(count) + " elements of " + dtype_name(dtype));
  impl_->peer_wait = {};
  queued_backend(impl_->nccl, "allreduce_queued").allreduce_queued(slot, data, count, dtype);
}
void Allreducer::join() { queued_backend(impl_->nccl, "join").join(); }
double Allreducer::finish(int keep) {
  if (keep < 0 || keep > 1) abort_job("comm::Allreducer::finish: keeps 0 or 1 joins outstanding");
  return queued_backend(impl_->nccl, "finish").finish(keep);
}

bool Allreducer::sums_on_device() const { return impl_->nccl && impl_->nccl->sums_world(); }
void Allreducer::sum_queued(float* data, std::int64_t count) {
  if (count < 0) abort_job("comm::Allreducer::sum_queued: a negative count");
  queued_backend(impl_->nccl, "sum_queued").sum_queued(data, count);
}

bool Allreducer::captures() const { return impl_->nccl && impl_->nccl->captures(); }
bool Allreducer::captures_buckets() const {
  return impl_->nccl && impl_->nccl->captures_buckets();
}
void Allreducer::capture_on(void* stream) {
  queued_backend(impl_->nccl, "capture_on").capture_on(stream);
}
int Allreducer::next_join_slot() const {
  return queued_backend(impl_->nccl, "next_join_slot").next_join_slot();
}
void Allreducer::replayed(int slot) { queued_backend(impl_->nccl, "replayed").replayed(slot); }

void Allreducer::set_device_backend(std::unique_ptr<detail::NcclAllreduce> backend) {
  if (!backend) abort_job("comm::Allreducer::set_device_backend: no backend");
  impl_->nccl = std::move(backend);
}

}  // namespace mpt::comm
