// The nccl backend's partition and intra-node call plan (see nccl_allreduce.hpp): arithmetic
// only, so that it is built in every build and tested on the CPU.
#include "comm/nccl_allreduce.hpp"

namespace mpt::comm::detail {

Range nccl_shard(std::int64_t n, int parts, int shard) {
  const std::int64_t q = n / parts;
  return {shard * q, shard == parts - 1 ? n : (shard + 1) * q};
}

void plan_intra(std::int64_t n, int local_size, int parts, IntraPlan& plan) {
  plan.block = 0;
  plan.pieces.clear();
  plan.regions.resize(static_cast<std::size_t>(local_size));
  for (int local = 0; local < local_size; ++local) {
    const Range owned = owned_shards(local_size, parts, local);
    plan.regions[static_cast<std::size_t>(local)] = {
        nccl_shard(n, parts, static_cast<int>(owned.begin)).begin,
        nccl_shard(n, parts, static_cast<int>(owned.end) - 1).end};
  }
  if (local_size == parts) {
    // One shard each: the equal blocks in one reduce-scatter, the remainder to the last rank
    // (whose region is its block and the remainder, contiguous).
    plan.block = n / parts;
    const Range rest{plan.block * parts, n};
    if (rest.size() > 0) plan.pieces.push_back({rest, local_size - 1});
    return;
  }
  // A smaller node: the regions differ in size, which ncclReduceScatter cannot express; one
  // ncclReduce per rank (grouped, so they run together) is the reduce-scatter NCCL lacks.
  for (int local = 0; local < local_size; ++local) {
    const Range region = plan.regions[static_cast<std::size_t>(local)];
    if (region.size() > 0) plan.pieces.push_back({region, local});
  }
}

}  // namespace mpt::comm::detail
