// The trainer's side of checkpoints (issue #7): stop requests from signals, and rank 0's writer,
// synchronous or on a background thread. The file format and its atomic write are ckpt's.
#pragma once

#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/ckpt.hpp"

namespace mpt::train {

// oneDNN's generated GEMM kernels (Debian's 2.x; fixed upstream after 3.11, oneDNN issue 4845)
// point rsp into the heap while they run, so a signal handled on a thread inside one writes its
// frame over heap memory: a SIGTERM from Slurm could crash the graceful stop it asks for (seen
// in CI: "oneDNN status 2" in a matmul just after the signal; a storm of signals on a handler
// corrupts the heap within seconds). So no computing thread takes these three signals: this
// blocks them in the calling thread, which must be the process's first, before MPI, Kokkos or
// any pool starts (every later thread inherits the mask), and starts one thread that waits for
// them (sigwaitinfo). Inside a StopSignals scope it records the signal as the handler would;
// outside one it does what the disposition says (ignore, a handler, or the default action's
// termination), as if nothing were blocked.
// Threads that libraries started before main keep them unblocked, and get the handler or the
// default action as before. Idempotent. mptrain's entry point calls it first.
void route_stop_signals_to_own_thread();

// SIGTERM, SIGUSR1 and SIGINT only record that they came (an async-signal-safe store); the
// trainer polls at step boundaries and stops there. A second signal changes nothing, so it
// cannot interrupt a checkpoint being written. The previous handlers come back on destruction.
// With route_stop_signals_to_own_thread() in effect they are taken by its thread instead.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first of those signals received since construction, 0 if none.
  static int received();

 private:
  struct sigaction previous_[3] = {};
};

// One checkpoint. Written synchronously it may hold views of the live tensors; handed to the
// writer thread it must own copies, since training goes on while it is written.
struct CheckpointSnapshot {
  ckpt::CheckpointMeta meta;
  std::vector<ckpt::NamedTensor> weights, buffers;
  ckpt::TrainingState state;
};

struct CheckpointWritten {
  std::string path;
  std::int64_t step = 0;
  std::int64_t bytes = 0;
  double write_s = 0;  // from the start of the write to the rename of 'latest'
};

// Rank 0's writer. Synchronous: write() returns when the file is durable. Asynchronous: write()
// waits for the previous write still in flight (one snapshot at a time bounds the memory), then
// hands the snapshot to the writer thread and returns. ckpt::save_checkpoint takes the
// process-wide HDF5 lock per piece of at most 8 MB, so the training set's readers (the
// prefetcher's threads) interleave with an asynchronous write instead of waiting it out.
class CheckpointWriter {
 public:
  CheckpointWriter(std::string dir, ckpt::SaveOptions options, bool async);
  ~CheckpointWriter();  // finishes the write in flight, swallowing its error (unwinding)
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Throws the UserError of a failed earlier asynchronous write, or of this synchronous one.
  void write(CheckpointSnapshot snapshot);
  // Asynchronous: waits for the write in flight, then returns the last snapshot written (empty
  // before the first), whose tensors the next snapshot copies into: fresh pages cost more than
  // the copy (160 MB: 0.12-0.35 s for new memory here). Rethrows a failed write's error.
  CheckpointSnapshot recycle();
  // The writes completed since the last call, oldest first.
  std::vector<CheckpointWritten> take_completed();
  // Whether an asynchronous write failed (finish() or write() rethrows its error).
  bool failed() const;
  // Waits for the write in flight; rethrows its error.
  void finish();
  bool async() const { return async_; }

 private:
  CheckpointWritten save(const CheckpointSnapshot& snapshot) const;
  void thread_main();

  const std::string dir_;
  const ckpt::SaveOptions options_;
  const bool async_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<CheckpointSnapshot> pending_;  // handed over, not yet written
  CheckpointSnapshot spare_;                   // the last one written, for recycle()
  bool busy_ = false;                          // the thread is writing one
  bool stopping_ = false;
  std::exception_ptr error_;
  std::vector<CheckpointWritten> completed_;
  std::thread thread_;
};

}  // namespace mpt::train
