#include "train/checkpointing.hpp"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <utility>

#include "core/error.hpp"

namespace mpt::train {
namespace {

constexpr int kStopSignals[3] = {SIGTERM, SIGUSR1, SIGINT};

// Lock-free, so storing from a signal handler is async-signal-safe.
std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void record_stop_signal(int signal_number) {
  int none = 0;
  g_received.compare_exchange_strong(none, signal_number, std::memory_order_relaxed);
}

// Whether a StopSignals scope is live: the routing thread records only then.
std::atomic<bool> g_scope_live{false};

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  for (const int signal_number : kStopSignals) sigaddset(&set, signal_number);
  return set;
}

[[noreturn]] void route_signals(sigset_t set) {
  for (;;) {
    siginfo_t info = {};
    const int signal_number = sigwaitinfo(&set, &info);
    if (signal_number < 0) continue;  // EINTR: another signal's handler ran on this thread
    if (g_scope_live.load()) {
      record_stop_signal(signal_number);
      continue;
    }
    // What the disposition says, as for a process that blocked nothing: an ignored signal
    // (a background job's SIGINT) stays ignored, a handler runs here, and the default action
    // (termination) is the signal unblocked on this thread alone and raised to it.
    struct sigaction now = {};
    sigaction(signal_number, nullptr, &now);
    if (now.sa_handler == SIG_IGN) continue;
    if (now.sa_flags & SA_SIGINFO) {
      now.sa_sigaction(signal_number, &info, nullptr);
      continue;
    }
    if (now.sa_handler != SIG_DFL) {
      now.sa_handler(signal_number);
      continue;
    }
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, signal_number);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    std::raise(signal_number);
  }
}

}  // namespace

void route_stop_signals_to_own_thread() {
  static std::once_flag once;
  std::call_once(once, [] {
    const sigset_t set = stop_signal_set();
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    std::thread(route_signals, set).detach();  // inherits the mask: sigwaitinfo takes them
  });
}

StopSignals::StopSignals() {
  g_received.store(0, std::memory_order_relaxed);
  g_scope_live.store(true);
  struct sigaction action = {};
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART: a signal during a blocking read or write resumes it rather than failing it.
  action.sa_flags = SA_RESTART;
  for (int i = 0; i < 3; ++i) sigaction(kStopSignals[i], &action, &previous_[i]);
}

StopSignals::~StopSignals() {
  g_scope_live.store(false);
  for (int i = 0; i < 3; ++i) sigaction(kStopSignals[i], &previous_[i], nullptr);
}

int StopSignals::received() { return g_received.load(std::memory_order_relaxed); }

CheckpointWriter::CheckpointWriter(std::string dir, ckpt::SaveOptions options, bool async)
    : dir_(std::move(dir)), options_(options), async_(async) {
  if (async_) thread_ = std::thread([this] { thread_main(); });
}

CheckpointWriter::~CheckpointWriter() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

CheckpointWritten CheckpointWriter::save(const CheckpointSnapshot& snapshot) const {
  const auto start = std::chrono::steady_clock::now();
  CheckpointWritten written;
  written.path = ckpt::save_checkpoint(dir_, snapshot.meta, snapshot.weights, snapshot.buffers,
                                       snapshot.state, options_);
  written.write_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  written.step = snapshot.meta.step;
  std::error_code error;
  const auto bytes = std::filesystem::file_size(written.path, error);
  written.bytes = error ? 0 : static_cast<std::int64_t>(bytes);
  return written;
}

void CheckpointWriter::write(CheckpointSnapshot snapshot) {
  if (!async_) {
    CheckpointWritten written = save(snapshot);
    std::lock_guard<std::mutex> lock(mutex_);
    completed_.push_back(std::move(written));
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !busy_ && !pending_; });
  if (error_) std::rethrow_exception(error_);
  pending_ = std::move(snapshot);
  changed_.notify_all();
}

CheckpointSnapshot CheckpointWriter::recycle() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !busy_ && !pending_; });
  if (error_) std::rethrow_exception(error_);
  return std::exchange(spare_, {});
}

std::vector<CheckpointWritten> CheckpointWriter::take_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(completed_, {});
}

bool CheckpointWriter::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_ != nullptr;
}

void CheckpointWriter::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !busy_ && !pending_; });
  if (error_) std::rethrow_exception(error_);
}

void CheckpointWriter::thread_main() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || pending_.has_value(); });
    if (!pending_) return;  // stopping, nothing left to write
    CheckpointSnapshot snapshot = std::move(*pending_);
    pending_.reset();
    busy_ = true;
    lock.unlock();
    std::optional<CheckpointWritten> written;
    std::exception_ptr error;
    try {
      written = save(snapshot);
    } catch (...) {
      // Kept for the training thread: it reports it where every rank can agree to stop.
      error = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    spare_ = std::move(snapshot);
    if (written) completed_.push_back(std::move(*written));
    if (error && !error_) error_ = error;
    changed_.notify_all();
  }
}

}  // namespace mpt::train
