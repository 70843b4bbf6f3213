// tests/gpu/isolation.hpp on the host (no device needed, so it runs everywhere, CI included):
// a table whose cases abort, segfault, _Exit (as abort_job does after a sticky CUDA error) and
// hang, between cases that pass and fail. Every case after a crash must still run, each crash must
// count as one failure, and a runner that dies before its first case must end the run, not
// restart forever.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/gpu/isolation.hpp"

using namespace mpt::gpu_test;

namespace {

void table(int i, Harness& h) {
  switch (i) {
    case 0:
      h.expect(true, "case 0 passes");
      break;
    case 1:
      std::abort();
    case 2:
      h.expect(false, "case 2 fails", "as planned");
      break;
    case 3:
      std::raise(SIGSEGV);
      break;
    case 4:
      h.expect(true, "case 4 passes");
      h.expect(true, "case 4 passes again");
      break;
    case 5:
      std::_Exit(3);
    case 6:
      for (;;) pause();  // a hang: killed after MPT_GPU_CASE_TIMEOUT_S
    default:
      h.expect(true, "case " + std::to_string(i) + " passes");
      break;
  }
}

int check(const char* what, const IsolatedTotals& got, IsolatedTotals want) {
  const bool ok =
      got.passed == want.passed && got.failed == want.failed && got.crashed == want.crashed;
  std::printf("%s %s: passed %d, failed %d, crashed %d (want %d, %d, %d)\n", ok ? "ok  " : "FAIL",
              what, got.passed, got.failed, got.crashed, want.passed, want.failed, want.crashed);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const IsolationArgs args = parse_isolation_args(argc, argv);
  const auto name = [](int i) { return "case " + std::to_string(i); };
  const bool setup_dies = !args.rest.empty() && args.rest[0] == "setup-dies";
  if (args.child())  // runs the cases and exits
    run_isolated(args, 8, name, table, [setup_dies] {
      if (setup_dies) std::_Exit(4);
    });
  int failed = 0;
  setenv("MPT_GPU_CASE_TIMEOUT_S", "2", 1);  // the hang's limit: 2 s, not the default 45
  // 8 cases: 0, 4 (twice) and 7 pass; 2 fails; 1, 3 and 5 crash, 6 hangs.
  failed += check("three crashes and a hang among eight cases", run_isolated(args, 8, name, table),
                  IsolatedTotals{4, 5, 4});
  // The same table from a runner whose setup dies: one failure, no endless restarts.
  IsolationArgs dying = args;
  dying.rest = {"setup-dies"};
  failed += check("a runner that dies in its setup", run_isolated(dying, 8, name, table),
                  IsolatedTotals{0, 1, 0});
  // MPT_GPU_ISOLATION=0, without the crashing cases (they would end this process): all in
  // this one process, which its first case checks by the pid.
  setenv("MPT_GPU_ISOLATION", "0", 1);
  const pid_t self = getpid();
  const auto in_process = [self](int i, Harness& h) {
    if (i == 0) h.expect(getpid() == self, "MPT_GPU_ISOLATION=0: the case runs in this process");
    if (i == 1) h.expect(false, "MPT_GPU_ISOLATION=0: a failing case", "as planned");
  };
  failed += check("MPT_GPU_ISOLATION=0", run_isolated(args, 2, name, in_process),
                  IsolatedTotals{1, 1, 0});
  return failed == 0 ? 0 : 1;
}
