// Helpers shared by the tests: a per-process temporary directory and a way to capture the
// text of an expected UserError.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>

#include "core/error.hpp"

namespace mpt::test {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
inline int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// /tmp/mpt-test-NAME-PID-rRANK, created empty and removed at the end of the test.
class TempDir {
 public:
  explicit TempDir(const std::string& name) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    path_ =
        "/tmp/mpt-test-" + name + "-" + std::to_string(::getpid()) + "-r" + std::to_string(rank);
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Runs BODY, which must throw mpt::UserError; returns "what (hint: hint)" for matching.
inline std::string user_error_text(const std::function<void()>& body) {
  try {
    body();
  } catch (const UserError& error) {
    return std::string(error.what()) + " (hint: " + error.hint() + ")";
  }
  ADD_FAILURE() << "expected a mpt::UserError, none was thrown";
  return "";
}

}  // namespace mpt::test
