// comm::Topology (see topology.hpp): node, shard and rail communicators, built once at startup
// with a handful of collectives over the world.
#include "comm/topology.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"

namespace mpt::comm {

Range shard_range(std::int64_t count, int parts, int shard) {
  // Written without count * shard, which could overflow for huge counts.
  const std::int64_t base = count / parts, extra = count % parts;
  const std::int64_t begin = shard * base + std::min<std::int64_t>(shard, extra);
  return {begin, begin + base + (shard < extra ? 1 : 0)};
}

Range owned_shards(int local_size, int parts, int local_rank) {
  // floor(j * L / P) == l  <=>  l * P <= j * L < (l + 1) * P: j from ceil(l P / L) on.
  const auto first = [&](std::int64_t l) { return (l * parts + local_size - 1) / local_size; };
  return {first(local_rank), first(local_rank + 1)};
}

Topology::Topology(MPI_Comm world, int ranks_per_node) : world_(world) {
  // Every rank has the same option, so every rank throws here, before any collective.
  MPT_REQUIRE(ranks_per_node >= 0, "--comm.ranks-per-node must be >= 0",
              "0 groups the ranks that share memory; K > 0 groups K consecutive ranks");
  MPT_CHECK_MPI(MPI_Comm_rank(world_, &rank_));
  MPT_CHECK_MPI(MPI_Comm_size(world_, &size_));

  // The real shared-memory domain: the device binding, and the test for emulated nodes.
  MPI_Comm shared = MPI_COMM_NULL;
  MPT_CHECK_MPI(MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &shared));
  MPT_CHECK_MPI(MPI_Comm_rank(shared, &device_rank_));
  MPT_CHECK_MPI(MPI_Comm_size(shared, &device_peers_));
  int shared_leader = rank_;  // lowest world rank of the domain names it
  MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &shared_leader, 1, MPI_INT, MPI_MIN, shared));

  if (ranks_per_node == 0) {
    node_ = shared;
  } else {
    MPT_CHECK_MPI(MPI_Comm_free(&shared));
    MPT_CHECK_MPI(MPI_Comm_split(world_, rank_ / ranks_per_node, rank_, &node_));
  }
  MPT_CHECK_MPI(MPI_Comm_rank(node_, &local_rank_));
  MPT_CHECK_MPI(MPI_Comm_size(node_, &local_size_));

  // A node shares memory when all its ranks name the same shared-memory leader. The answer is
  // agreed over the world: the algorithm must be chosen alike on every rank.
  int leader_range[2] = {-shared_leader, shared_leader};  // {-min, max} in one MPI_MAX
  MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, leader_range, 2, MPI_INT, MPI_MAX, node_));
  int capable = -leader_range[0] == leader_range[1] ? 1 : 0;
  MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &capable, 1, MPI_INT, MPI_MIN, world_));
  shm_capable_ = capable != 0;

  // Nodes are numbered by their lowest world rank: every rank learns every rank's node leader.
  int node_leader = rank_;
  MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &node_leader, 1, MPI_INT, MPI_MIN, node_));
  std::vector<int> leaders(static_cast<std::size_t>(size_));
  MPT_CHECK_MPI(MPI_Allgather(&node_leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, world_));
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  num_nodes_ = static_cast<int>(leaders.size());
  node_index_ = static_cast<int>(std::lower_bound(leaders.begin(), leaders.end(), node_leader) -
                                 leaders.begin());

  int local_sizes[2] = {-local_size_, local_size_};  // {-min, max}
  MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, local_sizes, 2, MPI_INT, MPI_MAX, world_));
  num_shards_ = local_sizes[1];
  uniform_ = -local_sizes[0] == local_sizes[1];
  const Range owned = owned_shards(local_size_, num_shards_, local_rank_);
  first_shard_ = static_cast<int>(owned.begin);
  end_shard_ = static_cast<int>(owned.end);

  // One split per shard, over the whole world and in shard order, so that the calls match on
  // every rank; the owner of shard j on each node joins rail j, ordered by node.
  rails_.reserve(static_cast<std::size_t>(end_shard_ - first_shard_));
  for (int shard = 0; shard < num_shards_; ++shard) {
    const bool owns = shard >= first_shard_ && shard < end_shard_;
    MPI_Comm rail = MPI_COMM_NULL;
    MPT_CHECK_MPI(MPI_Comm_split(world_, owns ? 0 : MPI_UNDEFINED, node_index_, &rail));
    if (owns) rails_.push_back(rail);
  }
}

Topology::~Topology() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm& rail : rails_)
    if (rail != MPI_COMM_NULL) MPI_Comm_free(&rail);
  if (node_ != MPI_COMM_NULL) MPI_Comm_free(&node_);
}

MPI_Comm Topology::rail(int shard) const {
  if (shard < first_shard_ || shard >= end_shard_)
    abort_job("comm::Topology::rail: shard " + std::to_string(shard) + " is not owned by rank " +
              std::to_string(rank_) + " (owns [" + std::to_string(first_shard_) + ", " +
              std::to_string(end_shard_) + "))");
  return rails_[static_cast<std::size_t>(shard - first_shard_)];
}

}  // namespace mpt::comm
