// See child_process.hpp.
#include "tests/gpu/child_process.hpp"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

namespace mpt::gpu_test {

bool read_until_closed(int fd, pid_t pid, int timeout_s,
                       const std::function<void(std::string_view)>& on_data) {
  bool timed_out = false;
  for (;;) {
    pollfd watch{fd, POLLIN, 0};
    const int ready = ::poll(&watch, 1, timeout_s * 1000);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    char chunk[512];
    const ssize_t n = ready < 0 ? -1 : ::read(fd, chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the child is gone (or the pipe failed): its status says how
    on_data(std::string_view(chunk, static_cast<std::size_t>(n)));
  }
  ::close(fd);
  return timed_out;
}

int wait_for(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
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

}  // namespace mpt::gpu_test
