// The emulated NCCL's own checks (tests/cudaemu/nccl.cpp; docs/testing.md, "The CUDA emulator"),
// on 2 ranks under mpiexec: what gpu_nccl_allreduce does not reach. Two ranks on one device are
// refused on both ("Duplicate GPU detected"); a bad rank, count or id at init, a group end with
// no start, a buffer in host memory, another device's stream or memory are refused; an in-place
// all-reduce and reduce-scatter give every rank the hand-worked sums; and a rank that aborts
// its communicator releases its peer from the collective it waits in, with ncclRemoteError.
// Without nccl.h it says it was skipped and exits 77. Rank 0 ends with "N passed, N failed".
#include <mpi.h>

#include <cstdio>

#ifndef MPT_CUDAEMU_NO_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "tests/cudaemu/check.hpp"

namespace {

using mpt::cudaemu::check::device_floats;
using mpt::cudaemu::check::expect;
using mpt::cudaemu::check::host_floats;

int rank = 0, size = 1;

// Every rank's verdict, agreed (false if false anywhere); rank 0 prints it.
void expect_all(bool ok, const std::string& what) {
  int value = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (rank == 0) expect(value == 1, what);
}

ncclUniqueId shared_id() {
  ncclUniqueId id{};
  if (rank == 0) ncclGetUniqueId(&id);
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  return id;
}

}  // namespace

int main(int argc, char** argv) {
  setenv("MPTRAIN_CUDAEMU_DEVICES", "2", 1);
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) std::printf("cudaemu_nccl_selftest wants 2 ranks, has %d\n", size);
    MPI_Finalize();
    return 1;
  }
  {
    cudaSetDevice(0);  // both ranks on device 0
    ncclComm_t comm = nullptr;
    const ncclResult_t result = ncclCommInitRank(&comm, 2, shared_id(), rank);
    expect_all(result == ncclInvalidUsage &&
                   std::string(ncclGetLastError(nullptr)).find("Duplicate GPU detected") !=
                       std::string::npos,
               "two ranks on one device: ncclInvalidUsage, 'Duplicate GPU detected', on both");
  }
  cudaSetDevice(rank);
  {
    // Refused at once, on the calling rank alone (no peer is waited for).
    ncclComm_t bad = nullptr;
    const ncclUniqueId id = shared_id();
    expect_all(ncclCommInitRank(&bad, 2, id, 2) == ncclInvalidArgument &&
                   ncclCommInitRank(&bad, 0, id, 0) == ncclInvalidArgument,
               "a rank outside the count, or no ranks: ncclInvalidArgument");
    ncclUniqueId made_up{};
    made_up.internal[0] = 7;
    expect_all(ncclCommInitRank(&bad, 2, made_up, rank) == ncclInvalidArgument,
               "an id that ncclGetUniqueId did not make: ncclInvalidArgument");
    expect_all(ncclGroupEnd() == ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart: ncclInvalidUsage");
  }
  ncclComm_t comm = nullptr;
  expect_all(ncclCommInitRank(&comm, 2, shared_id(), rank) == ncclSuccess,
             "one device per rank: the communicator is made");
  cudaStream_t stream = nullptr;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  {
    // A stream of the other device (made there, then back on this rank's own).
    cudaSetDevice(1 - rank);
    cudaStream_t other = nullptr;
    cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
    float* elsewhere = device_floats({1, 2, 3, 4});
    cudaSetDevice(rank);
    float* here = device_floats({1, 2, 3, 4});
    expect_all(ncclAllReduce(here, here, 4, ncclFloat32, ncclSum, comm, other) ==
                       ncclInvalidArgument &&
                   ncclAllReduce(elsewhere, elsewhere, 4, ncclFloat32, ncclSum, comm, stream) ==
                       ncclInvalidArgument,
               "the other device's stream, or its memory: ncclInvalidArgument");
    cudaFree(here);
    cudaFree(elsewhere);
    cudaStreamDestroy(other);
  }

  std::vector<float> host(4, 1.f);
  expect_all(ncclAllReduce(host.data(), host.data(), 4, ncclFloat32, ncclSum, comm, stream) ==
                 ncclInvalidArgument,
             "a buffer in host memory: ncclInvalidArgument");

  // Rank r holds r+1 + 10 i: the sums are 3 + 20 i; the reduce-scatter's rank r gets its half.
  std::vector<float> mine(4);
  for (int i = 0; i < 4; ++i) mine[i] = static_cast<float>(rank + 1 + 10 * i);
  float* data = device_floats(mine);
  ncclAllReduce(data, data, 4, ncclFloat32, ncclSum, comm, stream);
  cudaStreamSynchronize(stream);
  expect_all(host_floats(data, 4) == std::vector<float>{3, 23, 43, 63},
             "in-place all-reduce: 3 23 43 63 on both ranks");
  cudaMemcpy(data, mine.data(), 16, cudaMemcpyHostToDevice);
  ncclReduceScatter(data, data + 2 * rank, 2, ncclFloat32, ncclSum, comm, stream);
  cudaStreamSynchronize(stream);
  const std::vector<float> half = host_floats(data + 2 * rank, 2);
  expect_all(half == (rank == 0 ? std::vector<float>{3, 23} : std::vector<float>{43, 63}),
             "in-place reduce-scatter: rank 0 gets 3 23, rank 1 gets 43 63");

  // Rank 1 aborts; rank 0's broadcast, waiting for it, is released with ncclRemoteError.
  MPI_Barrier(MPI_COMM_WORLD);
  ncclResult_t async = ncclSuccess;
  if (rank == 1) {
    ncclCommAbort(comm);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    ncclBroadcast(data, data, 4, ncclFloat32, 1, comm, stream);
    cudaStreamSynchronize(stream);
    ncclCommGetAsyncError(comm, &async);
  }
  expect_all(rank == 1 || async == ncclRemoteError,
             "a peer's ncclCommAbort releases the collective waiting for it: ncclRemoteError");
  if (rank == 0) ncclCommDestroy(comm);

  int code = rank == 0 ? mpt::cudaemu::check::report() : 0;
  MPI_Bcast(&code, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Finalize();
  return code;
}

#else
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0)
    std::printf(
        "cudaemu NCCL self-test SKIPPED: the toolkit has no nccl.h, so NCCL is not "
        "emulated\n");
  MPI_Finalize();
  return 77;
}
#endif
