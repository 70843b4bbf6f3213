// A synthetic data set shared by the tests of one MPI test suite: rank 0 writes it once, under a
// temporary directory named by its pid (agreed by broadcast), and removes it at the end.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "data/data.hpp"

namespace mpt::train::suite {

// Collective: the directory that holds train.h5 and test.h5 (1024 and TEST_SAMPLES samples of
// shape 1x8x8, 4 classes, drawn with SEED).
inline std::string make_suite_data(const std::string& prefix, std::int64_t test_samples,
                                   std::uint64_t seed) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  long id = getpid();
  MPI_Bcast(&id, 1, MPI_LONG, 0, MPI_COMM_WORLD);
  const std::string dir =
      (std::filesystem::temp_directory_path() / (prefix + std::to_string(id))).string();
  if (rank == 0) {
    data::SyntheticSpec spec;
    spec.train_samples = 1024;
    spec.test_samples = test_samples;
    spec.sample_shape = {1, 8, 8};
    spec.num_classes = 4;
    spec.seed = seed;
    data::prepare_synthetic(spec, dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

// Collective: removes DIR once every rank is done with it.
inline void remove_suite_data(const std::string& dir) {
  MPI_Barrier(MPI_COMM_WORLD);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) std::filesystem::remove_all(dir);
}

}  // namespace mpt::train::suite
