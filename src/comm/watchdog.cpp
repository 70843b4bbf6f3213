// The stall watchdog (see watchdog.hpp). The census is a query / reply exchange on the
// watchdog's own communicator: a stalled rank sends its position to every rank, and each
// rank's watchdog thread, which polls for queries whatever its main thread is doing, answers
// with its own. Ranks whose answer shows them inside the same collective have arrived; the
// others are named with their step, phase and how long they have been there.
#include "comm/watchdog.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <vector>

#include "core/error.hpp"

namespace mpt::comm {
namespace {

using Clock = std::chrono::steady_clock;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

double seconds_since_ns(std::int64_t then_ns) {
  return 1e-9 * static_cast<double>(now_ns() - then_ns);
}

constexpr int kQueryTag = 1;
constexpr int kReplyTag = 2;

// One rank's position, as it travels in a query or a reply.
struct Position {
  std::int64_t step = 0;
  std::int64_t phase = 0;
  std::int64_t entered = 0;
  std::int64_t collective = 0;
  std::int64_t index = -1;
  std::int64_t age_ms = 0;  // in the current state (inside the collective, or outside any)
};
using Wire = std::array<std::int64_t, 6>;

Position read_position() {
  Progress& p = progress();
  Position position;
  position.collective = p.collective.load(std::memory_order_acquire);
  position.entered = static_cast<std::int64_t>(p.entered.load(std::memory_order_acquire));
  position.index = p.index.load(std::memory_order_relaxed);
  position.step = p.step.load(std::memory_order_relaxed);
  position.phase = p.phase.load(std::memory_order_relaxed);
  position.age_ms =
      static_cast<std::int64_t>(1e3 * seconds_since_ns(p.since_ns.load(std::memory_order_acquire)));
  return position;
}

Wire to_wire(const Position& p) {
  return {p.step, p.phase, p.entered, p.collective, p.index, p.age_ms};
}
Position from_wire(const Wire& w) { return {w[0], w[1], w[2], w[3], w[4], w[5]}; }

std::string describe_collective(const Position& p) {
  std::string text = collective_name(static_cast<Collective>(p.collective));
  if (p.index >= 0) {  // appended piecewise: `" " + std::to_string` trips GCC 12's -Wrestrict
    text += ' ';
    text += std::to_string(p.index);
  }
  return text;
}

char* format_seconds(char* buffer, std::size_t size, double seconds) {
  std::snprintf(buffer, size, "%.1f s", seconds);
  return buffer;
}

// "rank 3 (step 41, forward, outside any collective for 12.0 s)"
std::string describe_rank(int rank, const std::optional<Position>& p) {
  if (!p)
    return "rank " + std::to_string(rank) +
           " (no answer: dead, or hung where its watchdog cannot run)";
  char age[32];
  format_seconds(age, sizeof age, 1e-3 * static_cast<double>(p->age_ms));
  std::string text = "rank " + std::to_string(rank) + " (step " + std::to_string(p->step) + ", " +
                     phase_name(static_cast<Phase>(p->phase)) + ", ";
  if (p->collective != 0)
    text +=
        "in " + describe_collective(*p) + " #" + std::to_string(p->entered) + " for " + age + ")";
  else
    text += "outside any collective for " + std::string(age) + ")";
  return text;
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::setup: return "setup";
    case Phase::data: return "waiting for data";
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::allreduce: return "gradient all-reduce";
    case Phase::optimizer: return "optimizer";
    case Phase::agree: return "step agreement";
    case Phase::checkpoint: return "checkpoint";
    case Phase::log: return "log statistics";
    case Phase::evaluate: return "evaluation";
    case Phase::finish: return "finish";
  }
  return "unknown";
}

const char* collective_name(Collective collective) {
  switch (collective) {
    case Collective::none: return "none";
    case Collective::gradient_bucket: return "gradient bucket";
    case Collective::allreduce: return "all-reduce";
    case Collective::broadcast: return "broadcast";
    case Collective::gather: return "gather";
    case Collective::barrier: return "barrier";
    case Collective::agreement: return "error agreement";
    case Collective::communicator_setup: return "communicator setup";
  }
  return "unknown";
}

Progress& progress() {
  static Progress instance;
  return instance;
}

void set_phase(Phase phase, std::int64_t step) {
  Progress& p = progress();
  if (step >= 0) p.step.store(step, std::memory_order_relaxed);
  p.phase.store(static_cast<int>(phase), std::memory_order_relaxed);
}

// The stores are ordered so that the watchdog, which reads the collective first, never pairs
// "inside" with the time of an older state: entering sets the time before the collective,
// leaving clears the collective before the time.
CollectiveScope::CollectiveScope(Collective collective, int index) {
  Progress& p = progress();
  p.since_ns.store(now_ns(), std::memory_order_release);
  p.index.store(index, std::memory_order_relaxed);
  p.entered.fetch_add(1, std::memory_order_release);
  p.collective.store(static_cast<int>(collective), std::memory_order_release);
}

CollectiveScope::~CollectiveScope() {
  Progress& p = progress();
  p.collective.store(static_cast<int>(Collective::none), std::memory_order_release);
  p.since_ns.store(now_ns(), std::memory_order_release);
}

Watchdog::Watchdog(MPI_Comm comm, double timeout_s, bool census)
    : timeout_s_(timeout_s), census_(census) {
  progress().since_ns.store(now_ns(), std::memory_order_release);
  if (timeout_s <= 0) return;
  MPT_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  MPT_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  MPT_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  thread_ = std::thread([this] { thread_main(); });
}

Watchdog::~Watchdog() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void Watchdog::thread_main() {
  // Polls often enough that a stall is seen within 5 % of the timeout and a query is answered
  // long before the asker gives up; at the default 300 s that is once a second.
  const double period = std::clamp(timeout_s_ / 20, 0.01, 1.0);
  // How long a stalled rank collects answers: every live watchdog answers within one period.
  const double grace = std::clamp(10 * period, 1.0, 10.0);
  std::deque<Wire> outbox;  // reply buffers, alive until their sends complete
  std::vector<MPI_Request> sends;

  const auto answer_queries = [&] {
    for (;;) {
      int pending = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, comm_, &pending, &status);
      if (!pending) break;
      Wire query{};
      MPI_Recv(query.data(), 6, MPI_INT64_T, status.MPI_SOURCE, kQueryTag, comm_,
               MPI_STATUS_IGNORE);
      outbox.push_back(to_wire(read_position()));
      sends.emplace_back();
      MPI_Isend(outbox.back().data(), 6, MPI_INT64_T, status.MPI_SOURCE, kReplyTag, comm_,
                &sends.back());
    }
    // Completed sends in order free their buffers (replies are tiny and eager: they complete).
    while (!sends.empty()) {
      int done = 0;
      MPI_Test(&sends.front(), &done, MPI_STATUS_IGNORE);
      if (!done) break;
      sends.erase(sends.begin());
      outbox.pop_front();
    }
  };
  const auto sleep_for = [](double seconds) {
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  };

  double fire_after = timeout_s_;  // grows when the culprit is known to be writing a checkpoint
  std::uint64_t warned_entered = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (wake_.wait_for(lock, std::chrono::duration<double>(period), [&] { return stopping_; }))
        break;
    }
    if (census_) answer_queries();
    const Position mine = read_position();
    if (mine.collective == 0 || static_cast<std::uint64_t>(mine.entered) != warned_entered)
      fire_after = timeout_s_;
    if (mine.collective == 0 || 1e-3 * static_cast<double>(mine.age_ms) < fire_after) continue;

    char waited[32], limit[32];
    format_seconds(waited, sizeof waited, 1e-3 * static_cast<double>(mine.age_ms));
    std::snprintf(limit, sizeof limit, "%g", timeout_s_);
    std::string line = "mptrain: error: [" + process_where() + "] watchdog: waited " + waited +
                       " in " + describe_collective(mine) + " #" + std::to_string(mine.entered) +
                       " at step " + std::to_string(mine.step) + " (" +
                       phase_name(static_cast<Phase>(mine.phase)) +
                       ", --comm.stall-timeout=" + limit + ")";
    if (!census_) {
      line +=
          "; which ranks have not arrived is unknown (this MPI library lacks MPI_THREAD_MULTIPLE)";
    } else {
      // Ask every rank where it is; keep answering the others, who may be asking too.
      std::vector<std::optional<Position>> answers(static_cast<std::size_t>(size_));
      answers[static_cast<std::size_t>(rank_)] = mine;
      const Wire query = to_wire(mine);
      std::vector<MPI_Request> queries;
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        queries.emplace_back();
        MPI_Isend(query.data(), 6, MPI_INT64_T, r, kQueryTag, comm_, &queries.back());
      }
      int missing = size_ - 1;
      const auto asked = Clock::now();
      while (missing > 0 && std::chrono::duration<double>(Clock::now() - asked).count() < grace) {
        answer_queries();
        int pending = 0;
        MPI_Status status;
        MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, comm_, &pending, &status);
        if (!pending) {
          sleep_for(0.002);
          continue;
        }
        Wire reply{};
        MPI_Recv(reply.data(), 6, MPI_INT64_T, status.MPI_SOURCE, kReplyTag, comm_,
                 MPI_STATUS_IGNORE);
        auto& slot = answers[static_cast<std::size_t>(status.MPI_SOURCE)];
        if (!slot) --missing;
        slot = from_wire(reply);
      }
      const auto arrived = [&](const std::optional<Position>& p) {
        return p && p->collective != 0 && p->entered == mine.entered;
      };
      std::vector<int> absent;
      bool all_checkpointing = true;
      for (int r = 0; r < size_; ++r) {
        const auto& p = answers[static_cast<std::size_t>(r)];
        if (arrived(p)) continue;
        absent.push_back(r);
        all_checkpointing = all_checkpointing && p && p->collective == 0 &&
                            static_cast<Phase>(p->phase) == Phase::checkpoint;
      }
      for (MPI_Request& request : queries) MPI_Request_free(&request);
      // Every stalled rank asks; the lowest one that is waiting in the collective reports, so
      // the line appears once. The others keep answering until its abort reaches them.
      int reporter = rank_;
      for (int r = 0; r < size_; ++r)
        if (arrived(answers[static_cast<std::size_t>(r)])) {
          reporter = r;
          break;
        }
      // A rank writing a checkpoint is busy, not hung (a large model on a slow file system):
      // say so once per collective and wait another timeout.
      if (!absent.empty() && all_checkpointing) {
        if (warned_entered != static_cast<std::uint64_t>(mine.entered) && reporter == rank_) {
          std::fprintf(
              stderr,
              "mptrain: warning: [%s] watchdog: waited %s at step %lld for %s; still waiting\n",
              process_where().c_str(), waited, static_cast<long long>(mine.step),
              describe_rank(absent.front(), answers[static_cast<std::size_t>(absent.front())])
                  .c_str());
          std::fflush(stderr);
        }
        warned_entered = static_cast<std::uint64_t>(mine.entered);
        fire_after += timeout_s_;
        continue;
      }
      if (reporter != rank_) {
        const auto deferred = Clock::now();
        while (std::chrono::duration<double>(Clock::now() - deferred).count() < 3 * grace) {
          answer_queries();
          sleep_for(0.01);
        }
      }
      if (absent.empty()) {
        line +=
            "; every rank is inside this collective (a hang inside the MPI library or the network)";
      } else {
        line += "; not arrived: ";
        const std::size_t shown = std::min<std::size_t>(absent.size(), 8);
        for (std::size_t i = 0; i < shown; ++i) {
          if (i) line += ", ";
          line += describe_rank(absent[i], answers[static_cast<std::size_t>(absent[i])]);
        }
        if (absent.size() > shown)
          line += " and " + std::to_string(absent.size() - shown) + " more";
      }
    }
    line += "; aborting the job (hint: raise --comm.stall-timeout if waits this long are expected)";
    std::fprintf(stderr, "%s\n", line.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, kExitStall);
  }
  for (MPI_Request& request : sends) MPI_Request_free(&request);
}

}  // namespace mpt::comm
