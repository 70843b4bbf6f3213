// HDF5 plumbing shared by data and checkpoint code: one process-wide lock around every HDF5 call,
// an RAII handle for hid_t, and small helpers for attributes and whole datasets.
//
// Why the lock: Debian's libhdf5-openmpi is built without --enable-threadsafe (the parallel build
// cannot be), so two threads inside the library at once corrupt its global state. The
// prefetcher's I/O thread and the main thread (checkpoints, inspect) must therefore take
// hdf5_lock() around every HDF5 call. The lock is recursive so that helpers may nest.
//
// File locking: HDF5 1.10.7+ takes an flock() on every file it opens and reads the environment
// variable HDF5_USE_FILE_LOCKING itself (FALSE disables it). On Lustre and some NFS mounts
// flock() fails or hangs, so users there set HDF5_USE_FILE_LOCKING=FALSE; nothing in mptrain
// overrides it. Many ranks opening the same file read-only share the lock and are fine.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace mpt {

// The one lock every HDF5 call in the process goes through (see above). Hold it for the whole
// sequence of calls, not per call: HDF5's error stack is global state too.
std::unique_lock<std::recursive_mutex> hdf5_lock();

// Turns off HDF5's automatic printing of its error stack, so a failing call costs us one line of
// our own, not fifty of HDF5's. The stack is still recorded and read by MPT_CHECK_HDF5.
// Idempotent; the data and checkpoint modules call it before they open files.
void hdf5_quiet();

// The innermost message on HDF5's error stack ("unable to open file", "truncated file ...");
// clears the stack. For turning a failed call on a user's file into a UserError.
std::string hdf5_last_error();

// Owns one HDF5 identifier and closes it with the matching H5?close (found by H5Iget_type) under
// hdf5_lock(). Never wrap predefined ids such as H5T_NATIVE_FLOAT: they are not ours to close.
class Hdf5Handle {
 public:
  Hdf5Handle() = default;
  explicit Hdf5Handle(hid_t id) : id_(id) {}
  ~Hdf5Handle() { reset(); }
  Hdf5Handle(const Hdf5Handle&) = delete;
  Hdf5Handle& operator=(const Hdf5Handle&) = delete;
  Hdf5Handle(Hdf5Handle&& other) noexcept : id_(other.release()) {}
  Hdf5Handle& operator=(Hdf5Handle&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
  // Closes the current id (if any) and takes ownership of ID.
  void reset(hid_t id = H5I_INVALID_HID);

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// All helpers below expect the caller to hold hdf5_lock() (they take it again, which is cheap).
// Failures of the library itself abort the job through MPT_CHECK_HDF5; a missing attribute is
// not a failure and comes back as std::nullopt.

bool hdf5_has_attribute(hid_t object, const std::string& name);
// True when NAME (a path relative to LOCATION, intermediate groups included) is a link there.
bool hdf5_has_link(hid_t location, const std::string& path);

// Scalar and string attributes on OBJECT (file, group or dataset); an existing one is replaced.
void hdf5_write_attribute(hid_t object, const std::string& name, std::int32_t value);
void hdf5_write_attribute(hid_t object, const std::string& name, std::int64_t value);
void hdf5_write_attribute(hid_t object, const std::string& name, std::uint32_t value);
void hdf5_write_attribute(hid_t object, const std::string& name, float value);
// Variable-length UTF-8 string, which h5py returns as str.
void hdf5_write_attribute(hid_t object, const std::string& name, const std::string& value);
void hdf5_write_attribute(hid_t object, const std::string& name, const char* value);
// One-dimensional arrays.
void hdf5_write_attribute(hid_t object, const std::string& name,
                          const std::vector<std::int64_t>& values);
void hdf5_write_attribute(hid_t object, const std::string& name,
                          const std::vector<std::string>& values);

// Readers convert from whatever integer or float type the file holds (HDF5 does the
// conversion), so files written by h5py with other widths read fine. A scalar reader given an
// array attribute reads its first element only if it has exactly one.
std::optional<std::int64_t> hdf5_read_int_attribute(hid_t object, const std::string& name);
std::optional<double> hdf5_read_float_attribute(hid_t object, const std::string& name);
// Fixed- or variable-length strings.
std::optional<std::string> hdf5_read_string_attribute(hid_t object, const std::string& name);
std::optional<std::vector<std::int64_t>> hdf5_read_int_array_attribute(hid_t object,
                                                                       const std::string& name);
std::optional<std::vector<std::string>> hdf5_read_string_array_attribute(hid_t object,
                                                                         const std::string& name);

// The extents of a dataset's (simple) dataspace; empty for a scalar dataset.
Shape hdf5_dataset_shape(hid_t dataset);

// Creates dataset PATH under LOCATION (intermediate groups are created) with FILE_TYPE and
// SHAPE, optionally chunked with CHUNK (same rank as SHAPE, empty = contiguous), and writes
// DATA (MEMORY_TYPE, C order, numel(SHAPE) elements, owned by the caller). Returns the dataset.
Hdf5Handle hdf5_write_dataset(hid_t location, const std::string& path, hid_t file_type,
                              hid_t memory_type, const Shape& shape, const void* data,
                              const Shape& chunk = {});

// Reads the whole of DATASET as MEMORY_TYPE into OUT (room for every element, caller-owned).
// Returns the HDF5 status instead of aborting, so that a damaged user file can be reported as a
// UserError by the caller.
herr_t hdf5_read_dataset(hid_t dataset, hid_t memory_type, void* out);

// Checks a user's file before the process opens it: a child process opens PATH read-only and
// reads every object header and every attribute value, which makes HDF5 read (and, in files of
// the 1.8 format or later, verify the checksum of) all the metadata the helpers above touch, and
// every variable-length attribute value in the global heap. Returns "'/obj': reason" for the
// first that fails, or what happened when the library crashed or looped on it (HDF5 1.10 does on
// some damaged files: fuzz/regressions/*/libhdf5-*), nullopt when all read or when HDF5 cannot open the
// file at all (the caller's own H5Fopen then says why). Call it before opening a user's file:
// the helpers above abort the job on a failure of the library rather than report it.
//
// Why a child: a crash inside libhdf5 cannot be caught in the process, and the global heap has no
// checksum in any HDF5 format. The probe is fork()ed (it calls no MPI, and Open MPI allows that)
// and gets MPTRAIN_HDF5_PROBE_TIMEOUT seconds (default 20) before it is killed. Where fork()
// fails, or after hdf5_set_probe_isolation(false), the same walk runs in this process.
std::optional<std::string> hdf5_probe_file(const std::string& path);
void hdf5_set_probe_isolation(bool isolated);

// "uint8", "int32", "float32", "float16", "string", ... for messages and inspect.
std::string hdf5_type_name(hid_t type);

}  // namespace mpt
