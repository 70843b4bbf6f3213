// Private to comm: the nccl backend of the all-reduce. The algorithms (nccl_allreduce.cpp) are
// built only where CUDA and NCCL are found; this header names no CUDA or NCCL type, so that
// allreduce.cpp and the CPU-only build never see one. The plan of the intra-node calls
// (nccl_plan.cpp) is plain arithmetic, built everywhere and unit-tested on the CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/allreduce.hpp"
#include "comm/topology.hpp"

namespace mpt::comm::detail {

// The nccl backend's shard J of N elements cut in PARTS: [J q, (J + 1) q) with q = N / PARTS, the
// last shard also taking the N % PARTS remainder. Equal shards are what ncclReduceScatter and
// ncclAllGather scatter and gather; the remainder then costs one small extra call, not a padded
// copy of the whole buffer. (The host backends spread the remainder instead: shard_range.)
Range nccl_shard(std::int64_t n, int parts, int shard);

// The NCCL calls of phases 1 and 3 on a node of LOCAL_SIZE ranks, for N elements in PARTS
// shards (Topology::num_shards(), >= LOCAL_SIZE), all in place on the buffer:
//  - BLOCK > 0: ncclReduceScatter with recvcount BLOCK over [0, LOCAL_SIZE * BLOCK) (local rank
//    l receives [l BLOCK, (l + 1) BLOCK)), and ncclAllGather with sendcount BLOCK back;
//  - then each piece: ncclReduce of RANGE to ROOT, and ncclBroadcast of it from ROOT back.
// A full node (LOCAL_SIZE == PARTS) reduce-scatters the equal shards and sends the remainder to
// its last rank; a smaller node (an uneven split) reduces each rank's region to that rank.
// Afterwards local rank l holds the node's sum of region(l), the union of the shards it owns
// (owned_shards): the same elements on every node, so that the rails match.
struct IntraPlan {
  struct Piece {
    Range range;
    int root = 0;
  };
  std::int64_t block = 0;
  std::vector<Piece> pieces;   // non-empty ranges only
  std::vector<Range> regions;  // per local rank: the elements it owns after phase 1
};
// Fills PLAN (its vectors keep their capacity: no allocation once planned for LOCAL_SIZE).
void plan_intra(std::int64_t n, int local_size, int parts, IntraPlan& plan);

// flat-nccl (ncclAllReduce over the world) or hierarchical with the nccl intra-node backend, on
// data in the current cuda device's memory. Collective to construct (an NCCL communicator over
// the node or the world, from an ncclUniqueId broadcast over its MPI communicator) and destroy.
class NcclAllreduce {
 public:
  virtual ~NcclAllreduce() = default;
  // As Allreducer::allreduce, with DATA in device memory; returns once the result is in DATA.
  virtual void allreduce(void* data, std::int64_t count, DType dtype) = 0;

  // The queued form (Allreducer's, for GradientReducer), with no host wait in the step:
  // SLOTS (0 <= slot < SLOTS) name the calls of a step; set once, before the first mark().
  // MAX_COUNT elements of DTYPE is the largest call: the buffers it needs (a wire-dtype
  // scratch, the pinned staging across nodes) are taken now, not inside a step.
  virtual void plan_slots(int slots, std::int64_t max_count, DType dtype) = 0;
  // Where the compute stream is now, for SLOT's call: from the thread that queues the compute
  // work that wrote the slot's data.
  virtual void mark(int slot) = 0;
  // Queues the all-reduce of DATA on the comm stream after SLOT's mark, and returns (across
  // nodes it still waits for the intra-node phase, which MPI must read from the host).
  virtual void allreduce_queued(int slot, void* data, std::int64_t count, DType dtype) = 0;
  // Compute work queued from now on runs after every call queued so far, without the host
  // waiting: from the thread that queues it, once every call was queued (happens-before).
  // Each join is a point finish() waits for; at most two may be outstanding (a step's, and the
  // step's before it, which the host waits for while the device runs this one).
  virtual void join() = 0;
  // Blocks until at most KEEP (0 or 1) joins are outstanding, the oldest first: every call of
  // the joins it completes is done. Polls for NCCL's asynchronous errors (a hang meets the comm
  // watchdog when called inside a CollectiveScope). Returns the seconds the compute stream
  // waited, on the device, for those joins' calls (from the compute work queued before each
  // join to its last call's end): the communication backward did not hide. Any thread.
  virtual double finish(int keep) = 0;

  // Sync BN's statistics. True when sum_queued() sums over the whole world: the communicator
  // spans it (flat-nccl, or hierarchical on one node). Across nodes the caller sums them
  // through the host instead.
  virtual bool sums_world() const = 0;
  // DATA (COUNT f32 values, device memory) <- their sum over the world, in place, with no host
  // wait: queued on the comm stream after the compute work queued so far (and after the calls
  // queued before it), and compute work queued after it waits for it on the device. From the
  // thread that queues the calls, in the same order on every rank. Abort unless sums_world().
  virtual void sum_queued(float* data, std::int64_t count) = 0;

  // CUDA graphs (--cuda.graphs). captures(): calls may be captured at all: the communicator
  // spans the world (sums_world()), and NCCL lets a graph's calls and eager ones be outstanding
  // together (NCCL_GRAPH_MIXING_SUPPORT is not 0), as the eager steps around a replay need.
  // captures_buckets(): the gradient calls too, none of which then goes through the host
  // (flat-nccl, or hierarchical on one node and not staged there).
  virtual bool captures() const = 0;
  virtual bool captures_buckets() const = 0;
  // STREAM (a cudaStream_t), or nullptr to end it: the calling thread is capturing STREAM (the
  // compute stream) into a graph, and makes every call of this object until it ends. mark(),
  // sum_queued() and join() then order the comm stream after STREAM, and STREAM after the comm
  // stream, by events recorded on STREAM itself (CUDA's fork and join: the comm stream's calls
  // become nodes of the graph), not through the legacy stream; join()'s timing points are
  // nodes of the graph, recorded by each launch, and its join is outstanding only once a launch
  // is queued (replayed()). allreduce() and finish() abort meanwhile. Abort unless
  // captures(); allreduce_queued() then aborts unless captures_buckets().
  virtual void capture_on(void* stream) = 0;
  // The ring slot (0 or 1) of the join that join() or replayed() adds next. A graph captured
  // with a join holds that slot's timing events, so it may be launched only when its slot
  // comes round again: the other slot's graph alternates with it.
  virtual int next_join_slot() const = 0;
  // A launch of a graph captured with the join of SLOT was queued: that join is outstanding now,
  // as after join(). Aborts unless SLOT is next_join_slot().
  virtual void replayed(int slot) = 0;
};

// Collective over TOPOLOGY's world (nccl_allreduce.cpp; only in a build with NCCL).
std::unique_ptr<NcclAllreduce> make_nccl_allreduce(const Topology& topology,
                                                   const AllreduceConfig& config);

}  // namespace mpt::comm::detail
