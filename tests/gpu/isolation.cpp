// Crash isolation for the tests/gpu case tables (see isolation.hpp). POSIX: fork, exec, pipe.
#include "tests/gpu/isolation.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

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

[[noreturn]] void run_child(const IsolationArgs& args, int count,
                            const std::function<void(int, Harness&)>& run,
                            const std::function<void()>& setup,
                            const std::function<void()>& teardown) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash keeps every line printed before it
  if (setup) setup();
  Harness harness;
  for (int i = args.from; i < count; ++i) {
    report(args.report_fd, "start " + std::to_string(i));
    const int passed = harness.passed(), failed = harness.failed();
    run(i, harness);
    std::fflush(stdout);
    report(args.report_fd, "end " + std::to_string(i) + " " +
                               std::to_string(harness.passed() - passed) + " " +
                               std::to_string(harness.failed() - failed));
  }
  if (teardown) teardown();
  std::fflush(stdout);
  std::exit(0);
}

std::string how_it_ended(int status) {
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    const char* text = strsignal(signal);
    return "signal " + std::to_string(signal) + " (" + (text ? text : "?") + ")";
  }
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  return "wait status " + std::to_string(status);
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
  if (args.child()) run_child(args, count, run, setup, teardown);
  IsolatedTotals totals;
  int next = 0;
  while (next < count) {
    int fds[2];
    if (::pipe(fds) != 0) {
      std::perror("run_isolated: pipe");
      std::exit(2);
    }
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("run_isolated: fork");
      std::exit(2);
    }
    if (pid == 0) {
      ::close(fds[0]);
      std::vector<std::string> words;
      words.push_back("/proc/self/exe");
      words.insert(words.end(), args.rest.begin(), args.rest.end());
      words.insert(words.end(),
                   {"--cases-from", std::to_string(next), "--report-fd", std::to_string(fds[1])});
      std::vector<char*> argv;
      for (auto& word : words) argv.push_back(word.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      std::perror("run_isolated: exec /proc/self/exe");
      std::_Exit(127);
    }
    ::close(fds[1]);
    int started = -1, ended = -1;
    if (FILE* in = ::fdopen(fds[0], "r")) {
      char line[128];
      while (std::fgets(line, sizeof line, in)) {
        int index = 0, passed = 0, failed = 0;
        if (std::sscanf(line, "start %d", &index) == 1) {
          started = index;
        } else if (std::sscanf(line, "end %d %d %d", &index, &passed, &failed) == 3) {
          ended = index;
          totals.passed += passed;
          totals.failed += failed;
        }
      }
      std::fclose(in);
    } else {
      ::close(fds[0]);
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    std::fflush(stdout);
    if (started >= 0 && started != ended) {
      // Died inside case STARTED: one failure, and the next child goes on after it.
      ++totals.failed;
      ++totals.crashed;
      std::printf("  FAIL  %s crashed: %s; the cases after it run in a new process\n",
                  name(started).c_str(), how_it_ended(status).c_str());
      next = started + 1;
      continue;
    }
    if (ended + 1 >= count && WIFEXITED(status) && WEXITSTATUS(status) == 0) break;  // done
    // Ended outside a case (before the first, between two, or after the last): one failure.
    ++totals.failed;
    std::printf("  FAIL  the case runner ended after %d of %d cases: %s\n", ended + 1, count,
                how_it_ended(status).c_str());
    if (ended + 1 <= next) break;  // no case ran: another child would end the same way
    next = ended + 1;
  }
  return totals;
}

}  // namespace mpt::gpu_test
