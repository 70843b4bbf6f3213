// Shared GoogleTest main: initialises MPI and Kokkos once, so the same test binary runs alone
// or under mpiexec. Only rank 0 prints the GoogleTest report; every rank's failures count.
#include <gtest/gtest.h>
#include <cstdio>
#include <hdf5.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>

#include "core/error.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  // What mptrain requires (src/app/run.cpp): comm::GradientReducer calls MPI from its thread.
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  if (provided < MPI_THREAD_SERIALIZED) {
    std::fprintf(stderr, "test_main: MPI provides thread level %d, tests need MPI_THREAD_SERIALIZED\n",
                 provided);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  mpt::set_process_identity(rank, size);
  Kokkos::initialize(argc, argv);
#if defined(__SANITIZE_ADDRESS__)
  // HDF5 recycles freed blocks through its own free lists, so LeakSanitizer would blame a block
  // HDF5 leaks on whichever call first allocated that memory; without the lists it names the
  // call that leaked it (tests/sanitizers/lsan.supp).
  H5set_free_list_limits(0, 0, 0, 0, 0, 0);
#endif
  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS();
  // A failure on any rank fails the test on every rank, so CTest sees it whichever rank failed.
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failed && !failed) std::fprintf(stderr, "rank %d: tests failed on another rank\n", rank);
  Kokkos::finalize();
  MPI_Finalize();
  return any_failed ? 1 : 0;
}
