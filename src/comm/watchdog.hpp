// The stall watchdog (Horovod's stall inspector, but it names the culprit): every collective the
// trainer makes is bracketed by a CollectiveScope, and every phase of a step is announced with
// set_phase(). A Watchdog thread notices when this rank has waited inside one collective for
// longer than the timeout, asks every rank where it is (the others' watchdog threads answer,
// whatever their main thread is doing), prints one line that names the ranks that have not
// arrived and what they are doing, and aborts the job.
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace mpt::comm {

// Exit code of a job the watchdog aborted (documented in the README beside 2 and 3).
inline constexpr int kExitStall = 4;

// What a rank is doing, as the watchdog reports it.
enum class Phase : int {
  setup = 0,
  data,  // waiting for the next batch
  forward,
  backward,
  allreduce,  // waiting for the gradient buckets after backward
  optimizer,
  agree,       // the per-step stop / checkpoint agreement
  checkpoint,  // rank 0 writing (the others wait for its stall to end)
  log,         // the log window's statistics
  evaluate,
  finish,
};
const char* phase_name(Phase phase);

// The collectives, as the watchdog names them.
enum class Collective : int {
  none = 0,
  gradient_bucket,  // one bucket's all-reduce (index: the bucket)
  allreduce,        // World::allreduce_sum / max / allreduce_max
  broadcast,
  gather,
  barrier,
  agreement,           // World::run_agreed
  communicator_setup,  // a device communicator's construction (ncclCommInitRank)
};
const char* collective_name(Collective collective);

// This process's position, written by the threads that compute and communicate, read by the
// watchdog thread. One per process, like MPI itself: World and GradientReducer update it
// without being handed anything.
struct Progress {
  std::atomic<std::int64_t> step{0};  // the step in progress (1-based), 0 before the first
  std::atomic<int> phase{static_cast<int>(Phase::setup)};
  std::atomic<std::uint64_t> entered{0};  // collectives entered so far (the same on every rank)
  std::atomic<int> collective{0};         // Collective while inside one, else none
  std::atomic<int> index{-1};             // its bucket, where it has one
  std::atomic<std::int64_t> since_ns{0};  // steady-clock ns when the current state began
};
Progress& progress();

// Announces this rank's phase (and step; negative keeps the current one).
void set_phase(Phase phase, std::int64_t step = -1);

// Marks the enclosing block as one collective. Only one thread at a time is inside MPI on the
// data path (MPI_THREAD_SERIALIZED discipline), so scopes never overlap.
class CollectiveScope {
 public:
  explicit CollectiveScope(Collective collective, int index = -1);
  ~CollectiveScope();
  CollectiveScope(const CollectiveScope&) = delete;
  CollectiveScope& operator=(const CollectiveScope&) = delete;
};

// The watchdog thread. Collective over COMM (it duplicates it for its own messages). With
// TIMEOUT_S <= 0 it does nothing. CENSUS: the MPI library provides MPI_THREAD_MULTIPLE, so
// the thread may call MPI while another is inside a collective; without it the watchdog still
// aborts a stalled job but cannot ask the other ranks where they are.
class Watchdog {
 public:
  Watchdog(MPI_Comm comm, double timeout_s, bool census);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  bool active() const { return thread_.joinable(); }

 private:
  void thread_main();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  double timeout_s_ = 0;
  bool census_ = false;
  std::mutex mutex_;
  std::condition_variable wake_;  // the destructor's stop, without waiting out a period
  bool stopping_ = false;
  std::thread thread_;  // last: started once every member above exists
};

}  // namespace mpt::comm
