// The tests/gpu harness (see harness.hpp).
#include "tests/gpu/harness.hpp"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/half.hpp"
#include "kernels/cast.hpp"
#include "kernels/copy.hpp"
#include "tests/gpu/child_process.hpp"

namespace mpt::gpu_test {

void Harness::record(bool ok, const std::string& what, const std::string& detail) {
  ++(ok ? passed_ : failed_);
  if (print_ && ok) std::printf("  ok    %s\n", what.c_str());
  if (print_ && !ok) std::printf("  FAIL  %s: %s\n", what.c_str(), detail.c_str());
}

void Harness::expect(bool ok, const std::string& what, const std::string& detail) {
  record(ok, what, detail);
}

void Harness::expect_fatal(const std::string& what, const std::string& needle,
                           const std::function<void()>& fn, int timeout_s) {
  int fds[2];
  if (pipe(fds) != 0) return record(false, what, std::string("pipe: ") + std::strerror(errno));
  std::fflush(stdout);  // the child's exit flushes its copy of these buffers
  std::fflush(stderr);
  const pid_t child = fork();
  if (child < 0) {
    close(fds[0]);
    close(fds[1]);
    return record(false, what, std::string("fork: ") + std::strerror(errno));
  }
  if (child == 0) {
    close(fds[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the case that forked it
    dup2(fds[1], STDERR_FILENO);
    dup2(fds[1], STDOUT_FILENO);
    // Whatever FN does, the child ends here: unwinding into the rest of the case would run it
    // twice, and would write on the isolation runner's report pipe, which the child inherits.
    try {
      fn();
    } catch (...) {
      std::_Exit(4);
    }
    std::_Exit(0);  // FN returned: nothing was refused
  }
  close(fds[1]);
  std::string output;
  const bool timed_out =
      read_until_closed(fds[0], child, timeout_s, [&](std::string_view chunk) { output += chunk; });
  const int status = wait_for(child);
  while (!output.empty() && output.back() == '\n') output.pop_back();
  const bool ended = !timed_out && WIFEXITED(status) && WEXITSTATUS(status) == 3;
  const bool named = output.find(needle) != std::string::npos;
  const std::string detail =
      (timed_out ? "silent for " + std::to_string(timeout_s) + " s, killed" : how_it_ended(status)) +
      ", wanted exit status 3 and \"" + needle + "\"; printed: " +
      (output.empty() ? "nothing" : output);
  record(ended && named, what + " is refused", ended && named ? "" : detail);
}

void Harness::expect_near(const std::string& what, double got, double want, Tolerance tol) {
  const bool ok = std::abs(got - want) <= tol.atol + tol.rtol * std::abs(want) ||
                  (std::isnan(got) && std::isnan(want));
  char detail[160];
  std::snprintf(detail, sizeof detail, "got %.17g, want %.17g", got, want);
  record(ok, what, detail);
}

void Harness::expect_close(const std::string& what, const Tensor& got, const Tensor& want,
                           Tolerance tol, const Tensor* scale) {
  if (got.numel() != want.numel()) {
    record(false, what, "got " + got.describe() + ", want " + want.describe());
    return;
  }
  const Tensor g = host_f32(got), w = host_f32(want);
  const Tensor s = scale ? host_f32(*scale) : Tensor();
  const float* gp = g.data<float>();
  const float* wp = w.data<float>();
  std::int64_t bad = 0, first = -1;
  double worst = 0;
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    const double a = gp[i], b = wp[i];
    bool ok;
    if (std::isnan(a) || std::isnan(b)) {
      ok = std::isnan(a) && std::isnan(b);
    } else if (tol.rtol == 0 && tol.atol == 0) {
      ok = a == b && std::signbit(a) == std::signbit(b);
    } else {
      const double size = scale ? s.data<float>()[i] : std::abs(b);
      ok = std::abs(a - b) <= tol.atol + tol.rtol * size || a == b;
      if (!std::isinf(a) && !std::isinf(b)) worst = std::max(worst, std::abs(a - b));
    }
    if (!ok && bad++ == 0) first = i;
  }
  char detail[200] = "";
  if (bad)
    std::snprintf(detail, sizeof detail, "%lld of %lld differ; first at %lld: got %.9g, want %.9g",
                  static_cast<long long>(bad), static_cast<long long>(g.numel()),
                  static_cast<long long>(first), gp[first], wp[first]);
  record(bad == 0, what, detail);
}

void Harness::expect_same_bytes(const std::string& what, const Tensor& got, const Tensor& want) {
  if (got.size_bytes() != want.size_bytes()) {
    record(false, what, "got " + got.describe() + ", want " + want.describe());
    return;
  }
  Tensor g(got.shape(), got.dtype()), w(want.shape(), want.dtype());
  kernels::copy(got, g);
  kernels::copy(want, w);
  const bool same = std::memcmp(g.raw(), w.raw(), g.size_bytes()) == 0;
  record(same, what, "bytes differ");
}

std::uint64_t Random::next() {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

float Random::uniform(float low, float high) {
  return low + (high - low) * static_cast<float>(next() >> 40) * (1.f / 16777216.f);
}

Tensor Random::tensor(Shape shape, DType dtype, float low, float high) {
  Tensor wide(shape, DType::f32);
  float* p = wide.data<float>();
  for (std::int64_t i = 0; i < wide.numel(); ++i) p[i] = uniform(low, high);
  if (dtype == DType::f32) return wide;
  Tensor narrow(std::move(shape), dtype);
  kernels::cast(wide, narrow);
  return narrow;
}

Tensor host_f32(const Tensor& t) {
  const Tensor host = t.device() == Device::cpu ? t : t.to(Device::cpu);
  Tensor wide(host.shape(), DType::f32);
  kernels::cast(host, wide);
  return wide;
}

void set_element(Tensor& t, std::int64_t i, float value) {
  switch (t.dtype()) {
    case DType::f32: t.data<float>()[i] = value; break;
    case DType::f16: static_cast<std::uint16_t*>(t.raw())[i] = float_to_half_bits(value); break;
    case DType::bf16: static_cast<std::uint16_t*>(t.raw())[i] = float_to_bf16_bits(value); break;
    default: break;
  }
}

}  // namespace mpt::gpu_test
