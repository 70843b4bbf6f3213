// comm::Topology: the world split into nodes and rails, which the hierarchical all-reduce walks.
// A node is a set of ranks that share memory (or K consecutive ranks, to emulate nodes on one
// machine); a rail joins the ranks of every node that own the same shard of a buffer.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

namespace mpt::comm {

// Block partition of COUNT elements into PARTS shards: shard j is [begin, end), the first
// COUNT % PARTS shards one element longer. Any count works, 0 included.
struct Range {
  std::int64_t begin = 0, end = 0;
  std::int64_t size() const { return end - begin; }
};
Range shard_range(std::int64_t count, int parts, int shard);
// The shards [begin, end) that local rank LOCAL_RANK of a node of LOCAL_SIZE ranks owns out of
// PARTS >= LOCAL_SIZE: the j with floor(j * LOCAL_SIZE / PARTS) == LOCAL_RANK, at least one each.
Range owned_shards(int local_size, int parts, int local_rank);

class Topology {
 public:
  // Collective over WORLD. RANKS_PER_NODE = 0: nodes are MPI_COMM_TYPE_SHARED domains. K > 0:
  // world ranks [iK, (i+1)K) form node i (the last node may be smaller: 5 ranks, K = 2 gives
  // nodes of 2, 2, 1); such a group must lie inside one shared-memory domain for the shm
  // backend, which Topology checks (shm_capable()). Nodes are numbered by their lowest world
  // rank. Throws UserError for K < 0 (before any collective, so on every rank alike).
  explicit Topology(MPI_Comm world, int ranks_per_node = 0);
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  MPI_Comm world() const { return world_; }
  int rank() const { return rank_; }
  int size() const { return size_; }

  MPI_Comm node() const { return node_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int node_index() const { return node_index_; }
  int num_nodes() const { return num_nodes_; }
  // Local rank in the real shared-memory domain, whatever RANKS_PER_NODE says: the GPU binding.
  int device_rank() const { return device_rank_; }
  // Ranks in this rank's real shared-memory domain (the machine), emulated nodes or not.
  int device_peers() const { return device_peers_; }
  // True when every node's ranks share memory (always, for K = 0). Agreed over the world, so
  // that every rank resolves the same algorithm.
  bool shm_capable() const { return shm_capable_; }

  // The shard partition of a buffer: P = the largest node's local size. On a node of L ranks,
  // local rank l owns the contiguous shards [first_shard, end_shard) (j with floor(j*L/P) == l):
  // one shard each when every node has P ranks, several on a smaller node.
  int num_shards() const { return num_shards_; }
  int first_shard() const { return first_shard_; }
  int end_shard() const { return end_shard_; }
  bool uniform() const { return uniform_; }  // every node has the same local size
  // The rail of shard j (first_shard() <= j < end_shard()): the rank that owns j on every node,
  // ordered by node. With one rank per node, it is the world; with one node, a single rank.
  MPI_Comm rail(int shard) const;

 private:
  MPI_Comm world_ = MPI_COMM_NULL;  // not owned
  MPI_Comm node_ = MPI_COMM_NULL;
  std::vector<MPI_Comm> rails_;  // indexed by shard - first_shard_
  int rank_ = 0, size_ = 1;
  int local_rank_ = 0, local_size_ = 1, node_index_ = 0, num_nodes_ = 1, device_rank_ = 0,
      device_peers_ = 1;
  int num_shards_ = 1, first_shard_ = 0, end_shard_ = 1;
  bool shm_capable_ = true, uniform_ = true;
};

}  // namespace mpt::comm
