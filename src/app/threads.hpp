// Compute threads per rank: how the ranks on a node share its cores. The arithmetic is pure
// (tested in tests/app/test_threads.cpp); NodeCpus::gather is one allgather at start-up.
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace mpt::app {

// One rank's view at start-up: the CPUs it may run on and the threads it was asked for.
struct RankCpus {
  std::vector<int> cpus;  // sorted ids from sched_getaffinity (what the launcher bound it to)
  int requested = 0;      // --train.threads, else OMP_NUM_THREADS; 0: neither was given
};

// The default for a rank whose threads nobody set: its cores shared evenly among the node's
// ranks bound to overlapping CPUs (SHARING counts the rank itself), at least 1. As Horovod and
// torchrun do with OMP_NUM_THREADS: 2 unbound ranks on 2 cores get 1 thread each, a rank bound
// to 4 cores of its own gets 4.
int default_threads(int rank_cores, int sharing_ranks);

// The threads every rank of a node will run, and the cores their CPU sets cover together.
struct NodePlan {
  std::vector<int> threads;  // per local rank
  std::vector<int> shares;   // per local rank: default_threads, the cores it may fill alone
  int cores = 1;             // CPUs in the union of the ranks' affinity sets
  int total_threads() const;
};
NodePlan plan_node(const std::vector<RankCpus>& ranks);

// A one-line warning when the node's compute threads outnumber its cores (every extra
// thread waits its turn, and the step slows down), naming the figures and OPTION (the
// threads option of the command) in its hint; empty otherwise.
std::string oversubscription_warning(const NodePlan& plan, const std::string& option);

// This rank's CPUs; collective over COMM's node (MPI_COMM_TYPE_SHARED): every local rank's.
RankCpus this_rank_cpus(int requested);
std::vector<RankCpus> gather_node_cpus(MPI_Comm comm, const RankCpus& mine);

}  // namespace mpt::app
