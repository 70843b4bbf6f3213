// Runs a table of test cases so that a crash in one costs only that case. On a GPU a kernel's
// illegal address is sticky: the process can launch nothing more, and the first failed check
// ends it, with every later case unrun. The one device run of perf/gpu_check.sh must not lose
// the rest of the table to it.
//
// The process that calls run_isolated first (the supervisor) runs no case itself. It starts
// itself again (/proc/self/exe, its own arguments plus "--cases-from K --report-fd F"), and the
// child runs cases K, K + 1, ..., writing "start I" before and "end I PASSED FAILED" after each
// to descriptor F. When a child ends inside case I (a signal, or an exit before "end I"), case I
// counts as one failure, printed as "  FAIL  <name> crashed: ..." with how it ended, and a new
// child goes on from I + 1. A child that reports nothing for MPT_GPU_CASE_TIMEOUT_S seconds
// (default 45) is taken to hang in its case and killed, and the same follows: a spinning kernel
// costs its case, not the rest of the table. The supervisor prints no totals; its caller does.
// MPT_GPU_ISOLATION=0 runs every case in the first process instead (for cuda-gdb, say).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tests/gpu/harness.hpp"

namespace mpt::gpu_test {

// The arguments with run_isolated's own taken out (REST keeps the rest, argv[0] excluded).
struct IsolationArgs {
  int from = -1;       // the first case to run, in a child; -1 in the supervisor
  int report_fd = -1;  // the child's report descriptor
  std::vector<std::string> rest;
  bool child() const { return from >= 0; }
};
IsolationArgs parse_isolation_args(int argc, char** argv);

struct IsolatedTotals {
  int passed = 0, failed = 0, crashed = 0;  // crashed cases are also counted in failed
};

// COUNT cases; RUN(I, HARNESS) runs case I (in a child), NAME(I) names it. In a child, SETUP
// runs before the first case and TEARDOWN after the last (Kokkos, say), and the process then
// exits (status 0): the call does not return there. In the supervisor it returns the totals.
IsolatedTotals run_isolated(const IsolationArgs& args, int count,
                            const std::function<std::string(int)>& name,
                            const std::function<void(int, Harness&)>& run,
                            const std::function<void()>& setup = {},
                            const std::function<void()>& teardown = {});

// Prints TOTALS as the last lines ("K case(s) crashed" when any did, then "N passed, M
// failed", which perf/gpu_check.sh reads) and returns main's exit status: 0 when none failed.
int print_totals(const IsolatedTotals& totals);

}  // namespace mpt::gpu_test
