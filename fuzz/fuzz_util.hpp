// Plumbing shared by the fuzz targets: a scratch directory per process (most of mptrain's
// readers take a path, so each input is written to a file there), the split of one input into
// two files (IDX and npy converters take a pair), and the checks every target runs after an
// input: no HDF5 object left open, no file left behind.
//
// What counts as a finding (docs/testing.md, "Fuzzing"): anything but a normal return or an
// mpt::UserError. A UserError is the documented outcome for bad input (exit code 2). A crash, a
// sanitizer report, another exception type escaping, an abort_job / MPT_CHECK_* abort (the fuzz
// build raises SIGABRT there, see src/core/error.cpp) or an HDF5 id left open is a finding.
#pragma once

#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.hpp"
#include "core/hdf5.hpp"

namespace mpt::fuzz {

// Separates the two files of a two-file input (IDX images and labels, npy samples and labels).
// make_seeds.sh writes seeds in this form; an input without it is used as both files.
inline constexpr std::string_view kSplitMarker = "\n--MPTRAIN-FUZZ-SPLIT--\n";

// A directory of this process's own (${TMPDIR:-/tmp}/mptrain-fuzz-XXXXXX), removed at exit.
class Scratch {
 public:
  static Scratch& get() {
    static Scratch scratch;
    return scratch;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // Writes BYTES to NAME in the directory and returns its path.
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::string file = path(name);
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.close();
    if (!out) {
      std::fprintf(stderr, "fuzz: cannot write the input to '%s'\n", file.c_str());
      std::abort();
    }
    return file;
  }
  // Removes everything in the directory (inputs, converter outputs, stray .tmp files).
  void clear() const {
    std::error_code error;
    for (const auto& entry : std::filesystem::directory_iterator(dir_, error))
      std::filesystem::remove_all(entry.path(), error);
  }

 private:
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/mptrain-fuzz-XXXXXX";
    if (!mkdtemp(pattern.data())) {
      std::perror("fuzz: mkdtemp");
      std::abort();
    }
    dir_ = pattern;
  }
  // At exit, as the function-local static it is. (An atexit handler registered in the
  // constructor ran after this destructor, on a destroyed path, and left the directory behind.)
  ~Scratch() {
    std::error_code error;
    std::filesystem::remove_all(dir_, error);
  }
  std::filesystem::path dir_;
};

// The two files of a two-file input: the bytes before and after the first kSplitMarker, or the
// whole input twice when it has none.
inline std::pair<std::string_view, std::string_view> split_input(const std::uint8_t* data,
                                                                  std::size_t size) {
  const std::string_view all(reinterpret_cast<const char*>(data), size);
  const std::size_t at = all.find(kSplitMarker);
  if (at == std::string_view::npos) return {all, all};
  return {all.substr(0, at), all.substr(at + kSplitMarker.size())};
}

// Our code wraps every HDF5 id in an RAII handle, so after an input, whatever it threw, no file,
// group, dataset, attribute or type of a file may be open. A leaked id keeps the file's shared
// state alive (a later open of a file with the same inode would see stale metadata).
inline void check_no_open_hdf5_objects(const char* target) {
  auto lock = hdf5_lock();
  const ssize_t open = H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL);
  if (open != 0) {
    std::fprintf(stderr, "fuzz: %s left %zd HDF5 object(s) open after the input\n", target, open);
    std::abort();
  }
}

// Runs BODY on one input: a UserError is the expected outcome for bad input; everything else
// propagates (an uncaught exception is a finding). Then the scratch directory is emptied and
// the HDF5 ids are checked.
template <typename Body>
int run_one(const char* target, Body&& body) {
  Scratch::get().clear();
  try {
    body();
  } catch (const UserError&) {
    // The documented outcome for bad input.
  }
  Scratch::get().clear();
  check_no_open_hdf5_objects(target);
  return 0;
}

}  // namespace mpt::fuzz
