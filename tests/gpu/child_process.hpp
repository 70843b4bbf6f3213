// Reading a forked child's output and status, for tests/gpu's crash isolation (isolation.cpp)
// and Harness::expect_fatal (harness.cpp). POSIX: poll, waitpid.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <string_view>

namespace mpt::gpu_test {

// Reads FD until its writer closes it, handing each chunk to ON_DATA. When TIMEOUT_S seconds
// pass with nothing to read, kills PID (SIGKILL) and returns true. Closes FD either way.
bool read_until_closed(int fd, pid_t pid, int timeout_s,
                       const std::function<void(std::string_view)>& on_data);
// Waits for PID to end (retrying on EINTR) and returns its wait status.
int wait_for(pid_t pid);
// A wait status in words: "signal 11 (Segmentation fault)", "exit status 3".
std::string how_it_ended(int status);

}  // namespace mpt::gpu_test
