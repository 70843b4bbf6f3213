// The emulator's self-tests' checks (selftest.cu, cudnn_selftest.cpp): a line per check, "ok"
// or "FAIL", counted; and a check that a body ends the process with a given line on stderr.
// Not Harness (tests/gpu): that expects abort_job's exit status, and the emulator aborts. And
// f32 values to and from device memory.
#pragma once

#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace mpt::cudaemu::check {

inline int passed = 0, failed = 0;

inline void expect(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "  ok  " : "  FAIL", what.c_str());
  ++(ok ? passed : failed);
}

// Runs BODY in a child and expects it to die with a line containing NEEDLE on stderr.
template <class Body>
void expect_death(const std::string& what, const char* needle, Body body) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) std::abort();
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(pipe_fds[1], 2);
    close(pipe_fds[0]);
    body();
    std::_Exit(0);  // it did not die
  }
  close(pipe_fds[1]);
  std::string text;
  char buffer[512];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof buffer)) > 0;) text.append(buffer, n);
  close(pipe_fds[0]);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  int status = 0;
  waitpid(pid, &status, 0);
  const bool died = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  expect(
      died && text.find(needle) != std::string::npos,
      what + (died ? "" : " (it did not die)") + (text.empty() ? "" : ": " + text.substr(0, 160)));
}

// VALUES in a new device allocation (on the current device).
inline float* device_floats(const std::vector<float>& values) {
  float* p = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&p), values.size() * sizeof(float)) != cudaSuccess)
    std::abort();
  cudaMemcpy(p, values.data(), values.size() * sizeof(float), cudaMemcpyHostToDevice);
  return p;
}
// N floats from device memory at P.
inline std::vector<float> host_floats(const float* p, std::size_t n) {
  std::vector<float> out(n);
  cudaMemcpy(out.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost);
  return out;
}

// "N passed, N failed", and the exit status: 0 when none failed.
inline int report() {
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace mpt::cudaemu::check
