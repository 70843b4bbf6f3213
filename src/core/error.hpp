// Error handling shared by every module: user errors that name the option or file and give a
// hint (MPT_REQUIRE), and checks on library calls that abort the whole job (MPT_CHECK_*).
#pragma once

#include <stdexcept>
#include <string>

namespace mpt {

// A mistake the user can fix: a bad option, a missing or malformed file. Carries a hint.
class UserError : public std::runtime_error {
 public:
  UserError(std::string what, std::string hint)
      : std::runtime_error(std::move(what)), hint_(std::move(hint)) {}
  const std::string& hint() const { return hint_; }

 private:
  std::string hint_;
};

// Records who this process is, so that every message can name its rank and host.
void set_process_identity(int rank, int world_size);
int process_rank();
int process_world_size();
// The device this rank computes on, for messages ("cpu", "cuda:0").
void set_process_device(std::string device);
const std::string& process_device();
const std::string& process_host();
// "rank 3 on nid00042"
std::string process_where();

// The one-line text printed for a user error: "mptrain: error: [rank R on HOST] WHAT (hint: H)".
std::string format_user_error(const UserError& error);

[[noreturn]] void throw_user_error(std::string what, std::string hint);

namespace detail {
// Prints the failing call as text with file:line, rank, host and device, then aborts every rank.
[[noreturn]] void check_failed(const char* library, const char* call_text,
                               const std::string& description, const char* file, int line);
inline bool mpi_ok(int code) { return code == 0; }
std::string mpi_error_string(int code);
inline bool hdf5_ok(long long status) { return status >= 0; }
std::string hdf5_error_string(long long status);
// " (while WHAT)" for this thread's innermost FailureContext, or "" (what fatal lines end with).
std::string failure_context_suffix();
}  // namespace detail

// Aborts the job (all ranks) with a one-line message; for internal invariants broken at run time.
[[noreturn]] void abort_job(const std::string& message);

// HOOK runs first, once, in whichever thread ends the job through a fatal failure (abort_job,
// check_failed): the nccl backend aborts its communicators there, so that no NCCL kernel of
// this rank spins on a peer while the job goes down, whatever check failed. One hook; the last
// set wins; nullptr clears it.
void set_abort_hook(void (*hook)());

// While one lives, the fatal failures of this thread (check_failed, abort_job) end with
// "(while WHAT)": what the thread was doing where the call that failed may not be the culprit,
// such as capturing a CUDA graph. Nested contexts restore the outer one.
class FailureContext {
 public:
  explicit FailureContext(std::string what);
  ~FailureContext();
  FailureContext(const FailureContext&) = delete;
  FailureContext& operator=(const FailureContext&) = delete;

 private:
  std::string previous_;
};

}  // namespace mpt

// User error: COND false means the user gave something wrong. WHAT names the option or file.
#define MPT_REQUIRE(cond, what, hint)                        \
  do {                                                       \
    if (!(cond)) ::mpt::throw_user_error((what), (hint));    \
  } while (0)

// One generator for every library's check macro (the ggml pattern).
#define MPT_CHECK_GEN(library, call, is_ok, describe)                                      \
  do {                                                                                     \
    const auto mpt_check_status_ = (call);                                                 \
    if (!is_ok(mpt_check_status_))                                                         \
      ::mpt::detail::check_failed(library, #call, describe(mpt_check_status_), __FILE__,   \
                                  __LINE__);                                               \
  } while (0)

#define MPT_CHECK_MPI(call) \
  MPT_CHECK_GEN("MPI", call, ::mpt::detail::mpi_ok, ::mpt::detail::mpi_error_string)
#define MPT_CHECK_HDF5(call) \
  MPT_CHECK_GEN("HDF5", call, ::mpt::detail::hdf5_ok, ::mpt::detail::hdf5_error_string)
