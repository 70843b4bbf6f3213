// Compute threads per rank (see threads.hpp).
#include "app/threads.hpp"

#include <sched.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <set>
#include <thread>

#include "core/error.hpp"

namespace mpt::app {

int default_threads(int rank_cores, int sharing_ranks) {
  return std::max(1, rank_cores / std::max(1, sharing_ranks));
}

int NodePlan::total_threads() const {
  int total = 0;
  for (int count : threads) total += count;
  return total;
}

NodePlan plan_node(const std::vector<RankCpus>& ranks) {
  NodePlan plan;
  std::set<int> node_cpus;
  for (const auto& rank : ranks) node_cpus.insert(rank.cpus.begin(), rank.cpus.end());
  plan.cores = std::max<int>(1, static_cast<int>(node_cpus.size()));
  for (const auto& rank : ranks) {
    // Ranks bound to disjoint CPU sets do not compete; those that overlap share the overlap.
    int sharing = 0;
    for (const auto& other : ranks) {
      const bool overlap = std::any_of(other.cpus.begin(), other.cpus.end(), [&](int cpu) {
        return std::binary_search(rank.cpus.begin(), rank.cpus.end(), cpu);
      });
      sharing += overlap || &other == &rank ? 1 : 0;
    }
    const int share = default_threads(static_cast<int>(rank.cpus.size()), sharing);
    plan.shares.push_back(share);
    plan.threads.push_back(rank.requested > 0 ? rank.requested : share);
  }
  return plan;
}

std::string oversubscription_warning(const NodePlan& plan, const std::string& option) {
  const int total = plan.total_threads();
  if (total <= plan.cores) return "";
  const int most = *std::max_element(plan.threads.begin(), plan.threads.end());
  const bool uniform = std::all_of(plan.threads.begin(), plan.threads.end(),
                                   [&](int count) { return count == most; });
  const auto text = [](int value) { return std::to_string(value); };
  return "mptrain: warning: " + text(static_cast<int>(plan.threads.size())) +
         " rank(s) on a node x " + (uniform ? "" : "up to ") + text(most) +
         " compute thread(s) = " + text(total) + " threads on " + text(plan.cores) +
         " core(s): oversubscribed, every step waits for the extra threads; hint: set "
         "OMP_NUM_THREADS or " + option + " so that ranks x threads <= cores (with neither "
         "set, each rank takes its share)";
}

RankCpus this_rank_cpus(int requested) {
  RankCpus mine;
  mine.requested = requested;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (CPU_ISSET(cpu, &set)) mine.cpus.push_back(cpu);
  }
  if (mine.cpus.empty()) {  // more CPUs than a cpu_set_t holds: assume all of them
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    for (int cpu = 0; cpu < cores; ++cpu) mine.cpus.push_back(cpu);
  }
  return mine;
}

std::vector<RankCpus> gather_node_cpus(MPI_Comm comm, const RankCpus& mine) {
  // A fixed-size record (the request, then a CPU bit mask) keeps this to one allgather.
  constexpr int kWords = 1 + CPU_SETSIZE / 64;
  std::array<std::uint64_t, kWords> record{};
  record[0] = static_cast<std::uint64_t>(mine.requested);
  for (int cpu : mine.cpus)
    if (cpu < CPU_SETSIZE) record[1 + cpu / 64] |= std::uint64_t{1} << (cpu % 64);
  MPI_Comm node = MPI_COMM_NULL;
  int rank = 0, local_size = 1;
  MPT_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  MPT_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  MPT_CHECK_MPI(MPI_Comm_size(node, &local_size));
  std::vector<std::uint64_t> all(static_cast<std::size_t>(kWords) * local_size);
  MPT_CHECK_MPI(
      MPI_Allgather(record.data(), kWords, MPI_UINT64_T, all.data(), kWords, MPI_UINT64_T, node));
  MPT_CHECK_MPI(MPI_Comm_free(&node));
  std::vector<RankCpus> ranks(local_size);
  for (int local = 0; local < local_size; ++local) {
    const std::uint64_t* words = all.data() + static_cast<std::size_t>(kWords) * local;
    ranks[local].requested = static_cast<int>(words[0]);
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
      if (words[1 + cpu / 64] >> (cpu % 64) & 1) ranks[local].cpus.push_back(cpu);
  }
  return ranks;
}

}  // namespace mpt::app
