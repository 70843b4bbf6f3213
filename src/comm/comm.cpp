// World communicator, setup agreement and the collectives the trainer uses (see comm.hpp).
#include "comm/comm.hpp"

#include <climits>
#include <cstdio>

#include "comm/half_sum.hpp"
#include "comm/watchdog.hpp"
#include "core/error.hpp"

namespace mpt::comm {
namespace {

MPI_Datatype mpi_type_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::f16:
    case DType::bf16: return MPI_UINT16_T;  // bits only: copies, never arithmetic
    default: abort_job(std::string("comm: no MPI datatype for ") + dtype_name(dtype));
  }
}

int checked_count(const Tensor& data, const char* what) {
  // Host buffers only: MPI here may not be CUDA-aware (device tensors go through .to(cpu)).
  if (data.device() != Device::cpu)
    abort_job(std::string("World::") + what + ": needs a host tensor, got " + data.describe());
  if (data.numel() > INT_MAX) abort_job(std::string(what) + ": buffer too large for one MPI call");
  return static_cast<int>(data.numel());
}

}  // namespace

World::World(MPI_Comm comm) {
  MPT_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  MPT_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  MPT_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  MPI_Comm node = MPI_COMM_NULL;
  MPT_CHECK_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  MPT_CHECK_MPI(MPI_Comm_rank(node, &local_rank_));
  MPT_CHECK_MPI(MPI_Comm_size(node, &local_size_));
  MPT_CHECK_MPI(MPI_Comm_free(&node));
  sum_ops_ = std::make_unique<detail::SumOps>();
}

World::~World() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void World::run_agreed(const std::function<void()>& step) const {
  std::string message;
  int exit_code = 0;
  try {
    step();
  } catch (const UserError& error) {
    message = format_user_error(error);
    exit_code = kExitUserError;
  } catch (const ReportedFailure& failure) {
    exit_code = failure.exit_code();  // printed already, by this rank
  } catch (const std::exception& error) {
    message = "mptrain: error: [" + process_where() + "] internal error: " + error.what();
    exit_code = kExitInternalError;
  }
  // One collective decides: the lowest failing rank reports, so a message that every rank
  // would print identically (a bad option) appears once.
  const CollectiveScope scope(Collective::agreement);
  int first_failed = exit_code ? rank_ : size_;
  int agreed_first = size_;
  MPT_CHECK_MPI(MPI_Allreduce(&first_failed, &agreed_first, 1, MPI_INT, MPI_MIN, comm_));
  if (agreed_first == size_) return;
  int code = exit_code;
  MPT_CHECK_MPI(MPI_Bcast(&code, 1, MPI_INT, agreed_first, comm_));
  if (rank_ == agreed_first && !message.empty()) {
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
  }
  throw ReportedFailure(code);
}

void World::allreduce_sum(Tensor& data) const {
  const CollectiveScope scope(Collective::allreduce);
  if (data.dtype() == DType::f16 || data.dtype() == DType::bf16) {
    MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, data.raw(), checked_count(data, "allreduce_sum"),
                                sum_ops_->type(data.dtype()), sum_ops_->sum(data.dtype()),
                                comm_));
    return;
  }
  MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, data.raw(), checked_count(data, "allreduce_sum"),
                              mpi_type_of(data.dtype()), MPI_SUM, comm_));
}

void World::allreduce_sum(double* values, int count) const {
  const CollectiveScope scope(Collective::allreduce);
  MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, MPI_SUM, comm_));
}

void World::broadcast(Tensor& data, int root) const {
  const CollectiveScope scope(Collective::broadcast);
  MPT_CHECK_MPI(MPI_Bcast(data.raw(), checked_count(data, "broadcast"), mpi_type_of(data.dtype()),
                          root, comm_));
}

double World::max(double value) const {
  const CollectiveScope scope(Collective::allreduce);
  double result = value;
  MPT_CHECK_MPI(MPI_Allreduce(&value, &result, 1, MPI_DOUBLE, MPI_MAX, comm_));
  return result;
}

void World::allreduce_max(double* values, int count) const {
  const CollectiveScope scope(Collective::allreduce);
  MPT_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, values, count, MPI_DOUBLE, MPI_MAX, comm_));
}

void World::gather(const double* values, int count, std::vector<double>& out, int root) const {
  const CollectiveScope scope(Collective::gather);
  if (rank_ == root) out.resize(static_cast<std::size_t>(count) * static_cast<std::size_t>(size_));
  MPT_CHECK_MPI(MPI_Gather(values, count, MPI_DOUBLE, rank_ == root ? out.data() : nullptr, count,
                           MPI_DOUBLE, root, comm_));
}

void World::barrier() const {
  const CollectiveScope scope(Collective::barrier);
  MPT_CHECK_MPI(MPI_Barrier(comm_));
}

}  // namespace mpt::comm
