// Crash isolation for the tests/gpu case tables (see isolation.hpp). POSIX: fork, exec, pipe.
#include "tests/gpu/isolation.hpp"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/gpu/child_process.hpp"

namespace mpt::gpu_test {
namespace {

void report(int fd, const std::string& line) {
  const std::string text = line + "\n";
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n <= 0) return;  // the supervisor is gone: nothing to tell
    done += static_cast<std::size_t>(n);
  }
}

// Cases FROM, ..., COUNT - 1 in this process, each reported to REPORT_FD (when >= 0).
Harness run_here(int from, int report_fd, int count, const std::function<void(int, Harness&)>& run,
                 const std::function<void()>& setup, const std::function<void()>& teardown) {
  if (setup) setup();
  Harness harness;
  for (int i = from; i < count; ++i) {
    if (report_fd >= 0) report(report_fd, "start " + std::to_string(i));
    const int passed = harness.passed(), failed = harness.failed();
    run(i, harness);
    std::fflush(stdout);
    if (report_fd >= 0)
      report(report_fd, "end " + std::to_string(i) + " " +
                            std::to_string(harness.passed() - passed) + " " +
                            std::to_string(harness.failed() - failed));
  }
  if (teardown) teardown();
  std::fflush(stdout);
  return harness;
}

// Forks and execs this program as the child that runs cases FROM, ..., reporting into the
// write end of FDS (closed here after the fork).
pid_t start_child(const IsolationArgs& args, int from, const int fds[2]) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t supervisor = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::perror("run_isolated: fork");
    std::exit(2);
  }
  if (pid == 0) {
    // A child outlives no supervisor (CTest's timeout kills only the process it started): one
    // left behind would hold the GPU through the stages after it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != supervisor) std::_Exit(127);
    ::close(fds[0]);
    std::vector<std::string> words{"/proc/self/exe"};
    words.insert(words.end(), args.rest.begin(), args.rest.end());
    words.insert(words.end(),
                 {"--cases-from", std::to_string(from), "--report-fd", std::to_string(fds[1])});
    std::vector<char*> argv;
    for (auto& word : words) argv.push_back(word.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    std::perror("run_isolated: exec /proc/self/exe");
    std::_Exit(127);
  }
  ::close(fds[1]);
  return pid;
}

struct ChildReport {
  int started = -1, ended = -1;  // the last case begun and the last finished
  bool timed_out = false;        // killed after the time limit with no report
};

// The child's reports from FD until it closes it (or until TIMEOUT_S seconds pass with none:
// then the child PID is killed), each finished case's counts added to TOTALS. Closes FD.
ChildReport read_reports(int fd, pid_t pid, int timeout_s, IsolatedTotals& totals) {
  ChildReport child;
  std::string pending;  // a line not yet complete
  child.timed_out = read_until_closed(fd, pid, timeout_s, [&](std::string_view chunk) {
    pending.append(chunk);
    for (std::size_t eol; (eol = pending.find('\n')) != std::string::npos;) {
      const std::string line = pending.substr(0, eol);
      pending.erase(0, eol + 1);
      int index = 0, passed = 0, failed = 0;
      if (std::sscanf(line.c_str(), "start %d", &index) == 1) {
        child.started = index;
      } else if (std::sscanf(line.c_str(), "end %d %d %d", &index, &passed, &failed) == 3) {
        child.ended = index;
        totals.passed += passed;
        totals.failed += failed;
      }
    }
  });
  return child;
}

}  // namespace

IsolationArgs parse_isolation_args(int argc, char** argv) {
  IsolationArgs args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cases-from" && i + 1 < argc) {
      args.from = std::atoi(argv[++i]);
    } else if (arg == "--report-fd" && i + 1 < argc) {
      args.report_fd = std::atoi(argv[++i]);
    } else {
      args.rest.push_back(arg);
    }
  }
  return args;
}

IsolatedTotals run_isolated(const IsolationArgs& args, int count,
                            const std::function<std::string(int)>& name,
                            const std::function<void(int, Harness&)>& run,
                            const std::function<void()>& setup,
                            const std::function<void()>& teardown) {
  if (args.child()) {
    // Before the child's first output: a crash then keeps every line printed before it.
    std::setvbuf(stdout, nullptr, _IOLBF, 0);
    run_here(args.from, args.report_fd, count, run, setup, teardown);
    std::exit(0);
  }
  IsolatedTotals totals;
  // MPT_GPU_ISOLATION=0: every case in this one process, for a debugger (cuda-gdb) or a tool
  // that should see a single process; a crash then ends the run, as before isolation.
  if (const char* mode = std::getenv("MPT_GPU_ISOLATION"); mode && std::strcmp(mode, "0") == 0) {
    const Harness harness = run_here(0, -1, count, run, setup, teardown);
    totals.passed = harness.passed();
    totals.failed = harness.failed();
    return totals;
  }
  int timeout_s = 45;
  if (const char* text = std::getenv("MPT_GPU_CASE_TIMEOUT_S"); text && std::atoi(text) > 0)
    timeout_s = std::atoi(text);
  int next = 0;
  while (next < count) {
    int fds[2];
    if (::pipe(fds) != 0) {
      std::perror("run_isolated: pipe");
      std::exit(2);
    }
    const pid_t pid = start_child(args, next, fds);
    const ChildReport child = read_reports(fds[0], pid, timeout_s, totals);
    const int status = wait_for(pid);
    std::fflush(stdout);
    const int started = child.started, ended = child.ended;
    if (started >= 0 && started != ended) {
      // Died inside case STARTED: one failure, and the next child goes on after it.
      ++totals.failed;
      ++totals.crashed;
      const std::string how = child.timed_out ? "no result in " + std::to_string(timeout_s) +
                                                    " s (MPT_GPU_CASE_TIMEOUT_S), killed"
                                              : how_it_ended(status);
      std::printf("  FAIL  %s crashed: %s; the cases after it run in a new process\n",
                  name(started).c_str(), how.c_str());
      next = started + 1;
      continue;
    }
    if (ended + 1 >= count && WIFEXITED(status) && WEXITSTATUS(status) == 0) break;  // done
    // Ended outside a case (before the first, between two, or after the last): one failure.
    ++totals.failed;
    std::printf("  FAIL  the case runner ended after %d of %d cases: %s\n", ended + 1, count,
                how_it_ended(status).c_str());
    if (ended < next) break;  // no case ran: another child would end the same way
    next = ended + 1;
  }
  return totals;
}

int print_totals(const IsolatedTotals& totals) {
  if (totals.crashed > 0) std::printf("%d case(s) crashed\n", totals.crashed);
  std::printf("%d passed, %d failed\n", totals.passed, totals.failed);
  return totals.failed == 0 ? 0 : 1;
}

}  // namespace mpt::gpu_test
