// World's Tensor collectives refuse a device tensor (issue #8): MPI here need not be CUDA-aware,
// so World::allreduce_sum and World::broadcast take host tensors only, and a device tensor
// handed to one must end the job with one line naming the call and the tensor, not a segfault
// inside MPI or a rank left waiting. Usage: gpu_world_refusal allreduce|broadcast, under
// mpiexec with 2 or more ranks: rank 0 passes a cuda tensor, every other rank a host tensor
// and so waits in the collective (for rank 0's part, or as broadcast's root, its bytes), which
// the abort must end. The pass is the message within the
// time limit (CTest's PASS_REGULAR_EXPRESSION and TIMEOUT in tests/gpu/CMakeLists.txt; the
// bundle's stage in perf/gpu_check.sh checks the same). Without a device every rank exits 77
// and rank 0 prints SKIPPED. A call that returns is a failure: exit 1.
#include <mpi.h>

#include <cstdio>
#include <cstring>

#include "comm/comm.hpp"
#include "core/device_memory.hpp"
#include "core/error.hpp"
#include "core/tensor.hpp"

namespace {

constexpr int kSkipCode = 77;

int run(const char* op, int rank, int size) {
  using namespace mpt;
  const int devices = device_memory::cuda_device_count();
  int none = devices == 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &none, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (none) {
    if (rank == 0)
      std::printf("SKIPPED: no CUDA device (%s)\n", device_memory::cuda_device_description().c_str());
    return kSkipCode;
  }
  device_memory::set_cuda_device(rank % devices);
  const comm::World world(MPI_COMM_WORLD);
  Tensor data({4}, DType::f32, rank == 0 ? Device::cuda : Device::cpu);
  std::printf("rank %d of %d: World::%s on %s\n", rank, size, op, data.describe().c_str());
  std::fflush(stdout);
  if (std::strcmp(op, "allreduce") == 0)
    world.allreduce_sum(data);
  else
    world.broadcast(data, 0);  // the other ranks wait for rank 0's bytes
  std::printf("FAIL: rank %d: World::%s returned with %s\n", rank, op, data.describe().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  if (argc != 2 || (std::strcmp(argv[1], "allreduce") != 0 && std::strcmp(argv[1], "broadcast") != 0)) {
    std::fprintf(stderr, "usage: gpu_world_refusal allreduce|broadcast (under mpiexec -n 2)\n");
    MPI_Finalize();
    return 2;
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  mpt::set_process_identity(rank, size);
  const int code = run(argv[1], rank, size);
  MPI_Finalize();
  return code;
}
