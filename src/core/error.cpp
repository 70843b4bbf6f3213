// Implements the error reporting declared in error.hpp: identity of the process, message
// formatting, and the job-wide abort that never leaves other ranks waiting in a collective.
#include "core/error.hpp"

#include <unistd.h>

#ifdef MPTRAIN_HAVE_HDF5
#include <hdf5.h>
#endif
#ifdef MPTRAIN_HAVE_MPI
#include <mpi.h>
#endif

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace mpt {
namespace {

int g_rank = 0;
int g_world_size = 1;
std::string g_device = "cpu";

std::string read_host_name() {
  char buffer[256] = {};
  if (gethostname(buffer, sizeof(buffer) - 1) != 0) return "unknown-host";
  return buffer;
}

std::atomic<void (*)()> g_abort_hook{nullptr};

// Stops every rank. MPI_Abort is used whenever MPI is up, because a rank that merely exits
// would leave its peers blocked in the next collective.
[[noreturn]] void abort_all(int code) {
  // Taken, not read: a hook whose own failure ends the job again does not run twice.
  if (void (*hook)() = g_abort_hook.exchange(nullptr)) hook();
  std::fflush(stdout);
  std::fflush(stderr);
#ifdef MPTRAIN_FUZZING
  // Under libFuzzer (fuzz/) an abort on bad input is a finding: SIGABRT makes it keep the input,
  // where exit(3) would end the run with nothing saved.
  std::abort();
#endif
#ifdef MPTRAIN_HAVE_MPI
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::_Exit(code);
}

}  // namespace

void set_abort_hook(void (*hook)()) { g_abort_hook.store(hook); }

void set_process_identity(int rank, int world_size) {
  g_rank = rank;
  g_world_size = world_size;
}
void set_process_device(std::string device) { g_device = std::move(device); }
const std::string& process_device() { return g_device; }
int process_rank() { return g_rank; }
int process_world_size() { return g_world_size; }
const std::string& process_host() {
  static const std::string host = read_host_name();
  return host;
}
std::string process_where() {
  return "rank " + std::to_string(g_rank) + " on " + process_host();
}

std::string format_user_error(const UserError& error) {
  std::string line = "mptrain: error: [" + process_where() + "] " + error.what();
  if (!error.hint().empty()) line += " (hint: " + error.hint() + ")";
  return line;
}

void throw_user_error(std::string what, std::string hint) {
  throw UserError(std::move(what), std::move(hint));
}

namespace {
thread_local std::string g_failure_context;
}  // namespace

std::string detail::failure_context_suffix() {
  return g_failure_context.empty() ? std::string() : " (while " + g_failure_context + ")";
}

FailureContext::FailureContext(std::string what) : previous_(std::move(g_failure_context)) {
  g_failure_context = std::move(what);
}

FailureContext::~FailureContext() { g_failure_context = std::move(previous_); }

void abort_job(const std::string& message) {
  std::fprintf(stderr, "mptrain: fatal: [%s] %s%s\n", process_where().c_str(), message.c_str(),
               detail::failure_context_suffix().c_str());
  abort_all(3);
}

namespace detail {

// GPU-only builds have no MPI or HDF5: the error strings are then plain codes.
#ifdef MPTRAIN_HAVE_MPI
std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}
#else
std::string mpi_error_string(int code) { return "MPI error " + std::to_string(code); }
#endif

#ifdef MPTRAIN_HAVE_HDF5
std::string hdf5_error_string(long long) {
  // The innermost message on HDF5's error stack says what went wrong (file not found, ...).
  std::string message;
  auto walker = [](unsigned, const H5E_error2_t* entry, void* out) -> herr_t {
    auto* text = static_cast<std::string*>(out);
    if (text->empty() && entry->desc) *text = entry->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, walker, &message);
  H5Eclear2(H5E_DEFAULT);
  return message.empty() ? "HDF5 call failed" : message;
}
#else
std::string hdf5_error_string(long long) { return "HDF5 call failed"; }
#endif

void check_failed(const char* library, const char* call_text, const std::string& description,
                  const char* file, int line) {
  std::fprintf(stderr, "mptrain: fatal: [%s, device %s] %s call `%s` failed: %s at %s:%d%s\n",
               process_where().c_str(), g_device.c_str(), library, call_text, description.c_str(),
               file, line, failure_context_suffix().c_str());
  abort_all(3);
}

}  // namespace detail
}  // namespace mpt
