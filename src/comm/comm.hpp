// Communication for data-parallel training: the world communicator with its node-local view,
// agreement on setup failures (so no rank waits alone in a collective), and small collectives.
// Gradients are reduced by comm::GradientReducer (gradient_reducer.hpp).
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace mpt::comm {

namespace detail {
class SumOps;
}

// Thrown on every rank after a failure was agreed and reported once; carries the exit code.
class ReportedFailure : public std::runtime_error {
 public:
  explicit ReportedFailure(int exit_code)
      : std::runtime_error("failure already reported"), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// Exit codes, documented in the README.
inline constexpr int kExitUserError = 2;
inline constexpr int kExitInternalError = 3;

class World {
 public:
  // Duplicates COMM so that mptrain's messages never match a user's or a library's.
  explicit World(MPI_Comm comm = MPI_COMM_WORLD);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  MPI_Comm handle() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // Position and count of ranks on this rank's node (MPI_COMM_TYPE_SHARED).
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }

  // Runs STEP, which must make no collective call, on every rank, then agrees on the outcome:
  // if it threw on any rank, the lowest such rank prints its one-line error and every rank
  // throws ReportedFailure. This is how setup errors (bad option, missing file) end the job
  // cleanly on every rank within one collective.
  void run_agreed(const std::function<void()>& step) const;

  // Sums DATA in place over all ranks. f32 and f64 use MPI_SUM; f16 and bf16 travel as 2-byte
  // elements and are added in f32 and rounded to nearest even at every step of the reduction,
  // so the result carries fp16 (bf16) rounding but is bit-identical on every rank.
  void allreduce_sum(Tensor& data) const;
  void allreduce_sum(double* values, int count) const;
  // Copies ROOT's DATA to every rank.
  void broadcast(Tensor& data, int root) const;
  double max(double value) const;
  // Element-wise maximum of VALUES over all ranks, in place (several maxima in one collective).
  void allreduce_max(double* values, int count) const;
  // ROOT receives every rank's COUNT VALUES, rank after rank, in OUT (resized; untouched on the
  // other ranks): per-rank statistics in one small collective.
  void gather(const double* values, int count, std::vector<double>& out, int root) const;
  void barrier() const;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int local_rank_ = 0;
  int local_size_ = 1;
  // The 2-byte element type and its f32-accumulating sum ops (half_sum.hpp), created once.
  std::unique_ptr<detail::SumOps> sum_ops_;
};

}  // namespace mpt::comm
