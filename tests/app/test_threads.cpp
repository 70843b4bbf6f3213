// Compute threads per rank: each rank's default share of its cores, and the warning when a
// node's ranks x threads outnumber its cores.
#include <gtest/gtest.h>

#include "app/threads.hpp"

namespace mpt::app {
namespace {

std::vector<int> cpu_range(int begin, int end) {
  std::vector<int> cpus;
  for (int cpu = begin; cpu < end; ++cpu) cpus.push_back(cpu);
  return cpus;
}

TEST(Threads, DefaultSharesCoresAmongRanks) {
  EXPECT_EQ(default_threads(2, 2), 1);
  EXPECT_EQ(default_threads(16, 4), 4);
  EXPECT_EQ(default_threads(7, 2), 3);  // rounds down: never oversubscribes
  EXPECT_EQ(default_threads(2, 4), 1);  // at least one
  EXPECT_EQ(default_threads(8, 0), 8);
}

TEST(Threads, UnboundRanksShareTheNode) {
  // mpirun --bind-to none: every rank sees all 8 CPUs.
  const auto plan = plan_node(
      {{cpu_range(0, 8), 0}, {cpu_range(0, 8), 0}, {cpu_range(0, 8), 0}, {cpu_range(0, 8), 0}});
  EXPECT_EQ(plan.cores, 8);
  EXPECT_EQ(plan.threads, (std::vector<int>{2, 2, 2, 2}));
  EXPECT_EQ(plan.total_threads(), 8);
  EXPECT_EQ(oversubscription_warning(plan, "--train.threads"), "");
}

TEST(Threads, BoundRanksUseTheirOwnCores) {
  // Bound to a socket each: 2 ranks per 4-core socket get 2 threads; a rank alone on its
  // 4 cores gets 4. Disjoint sets do not count as sharing.
  const auto plan = plan_node({{cpu_range(0, 4), 0}, {cpu_range(0, 4), 0}, {cpu_range(4, 8), 0}});
  EXPECT_EQ(plan.cores, 8);
  EXPECT_EQ(plan.threads, (std::vector<int>{2, 2, 4}));
  EXPECT_EQ(plan.shares, plan.threads);
  EXPECT_EQ(oversubscription_warning(plan, "--train.threads"), "");
}

TEST(Threads, RequestWinsOverShare) {
  const auto plan = plan_node({{cpu_range(0, 2), 3}, {cpu_range(0, 2), 0}});
  EXPECT_EQ(plan.threads, (std::vector<int>{3, 1}));
  EXPECT_EQ(plan.shares, (std::vector<int>{1, 1}));
}

TEST(Threads, WarnsWhenThreadsOutnumberCores) {
  // OMP_NUM_THREADS=2 for 2 ranks on 2 cores.
  const auto plan = plan_node({{cpu_range(0, 2), 2}, {cpu_range(0, 2), 2}});
  const auto warning = oversubscription_warning(plan, "--train.threads");
  EXPECT_NE(warning.find("2 rank(s) on a node x 2 compute thread(s) = 4 threads on 2 core(s)"),
            std::string::npos)
      << warning;
  EXPECT_NE(warning.find("OMP_NUM_THREADS or --train.threads"), std::string::npos) << warning;
  EXPECT_EQ(warning.find('\n'), std::string::npos);
}

TEST(Threads, WarnsWhenRanksAreBoundToOneCore) {
  // Two ranks bound to the same CPU: even one thread each is too many; the default cannot fix
  // it, so the warning says so.
  const auto plan = plan_node({{{0}, 0}, {{0}, 0}});
  EXPECT_EQ(plan.cores, 1);
  EXPECT_EQ(plan.threads, (std::vector<int>{1, 1}));
  EXPECT_NE(oversubscription_warning(plan, "--threads").find("= 2 threads on 1 core(s)"),
            std::string::npos);
}

TEST(Threads, UnevenThreadsNameTheLargest) {
  const auto plan = plan_node({{cpu_range(0, 4), 4}, {cpu_range(0, 4), 1}});
  EXPECT_NE(oversubscription_warning(plan, "--train.threads")
                .find("2 rank(s) on a node x up to 4 compute thread(s) = 5 threads on 4 core(s)"),
            std::string::npos);
}

}  // namespace
}  // namespace mpt::app
