// HDF5 lock, handle and attribute/dataset helpers (see hdf5.hpp). Every function takes the lock
// itself, so callers that forget cannot race; recursion makes the nested take free of deadlock.
#include "core/hdf5.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/error.hpp"

// Set by the sanitizer runtimes (ASan, UBSan) when they are linked in; libFuzzer installs a death
// callback through it that writes a crash file, which a probe child must not do for its parent.
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace mpt {

namespace {
// True only in a forked probe child (hdf5_probe_file), which has a single thread. It inherits the
// mutex as its parent's thread held it, and that thread does not exist there.
bool in_probe_child = false;
std::atomic<bool> probe_isolation{true};
}  // namespace

std::unique_lock<std::recursive_mutex> hdf5_lock() {
  static std::recursive_mutex mutex;
  if (in_probe_child) return {};
  return std::unique_lock<std::recursive_mutex>(mutex);
}

void hdf5_quiet() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto lock = hdf5_lock();
    MPT_CHECK_HDF5(H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr));
  });
}

std::string hdf5_last_error() {
  auto lock = hdf5_lock();
  return detail::hdf5_error_string(-1);
}

void Hdf5Handle::reset(hid_t id) {
  if (id_ >= 0) {
    auto lock = hdf5_lock();
    if (H5Iis_valid(id_) > 0) {
      // A failed close in a destructor cannot be reported usefully; writers close their files
      // explicitly (release() + H5Fclose under MPT_CHECK_HDF5) where a failure matters.
      switch (H5Iget_type(id_)) {
        case H5I_FILE:
          H5Fclose(id_);
          break;
        case H5I_GROUP:
          H5Gclose(id_);
          break;
        case H5I_DATATYPE:
          H5Tclose(id_);
          break;
        case H5I_DATASPACE:
          H5Sclose(id_);
          break;
        case H5I_DATASET:
          H5Dclose(id_);
          break;
        case H5I_ATTR:
          H5Aclose(id_);
          break;
        case H5I_GENPROP_LST:
          H5Pclose(id_);
          break;
        default:
          H5Idec_ref(id_);
          break;
      }
    }
  }
  id_ = id;
}

namespace {

// Checks an id returned by an HDF5 create/open call and wraps it.
Hdf5Handle checked(hid_t id, const char* call_text, const char* file, int line) {
  if (id < 0) detail::check_failed("HDF5", call_text, detail::hdf5_error_string(id), file, line);
  return Hdf5Handle(id);
}
#define MPT_HDF5_HANDLE(call) checked((call), #call, __FILE__, __LINE__)

Hdf5Handle variable_string_type() {
  Hdf5Handle type = MPT_HDF5_HANDLE(H5Tcopy(H5T_C_S1));
  MPT_CHECK_HDF5(H5Tset_size(type.get(), H5T_VARIABLE));
  MPT_CHECK_HDF5(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  return type;
}

// Our string attributes are fixed-length (SIZE bytes, NUL-padded, UTF-8): their bytes then live in
// the object header, which the 1.8 format checksums. Variable-length strings would sit in the
// global heap, which has no checksum in any HDF5 format and on which HDF5 1.10 crashes when it is
// damaged (fuzz/regressions/*/libhdf5-*). Readers accept both.
Hdf5Handle fixed_string_type(std::size_t size) {
  Hdf5Handle type = MPT_HDF5_HANDLE(H5Tcopy(H5T_C_S1));
  MPT_CHECK_HDF5(H5Tset_size(type.get(), std::max<std::size_t>(size, 1)));
  MPT_CHECK_HDF5(H5Tset_strpad(type.get(), H5T_STR_NULLPAD));
  MPT_CHECK_HDF5(H5Tset_cset(type.get(), H5T_CSET_UTF8));
  return type;
}

void write_attribute_raw(hid_t object, const std::string& name, hid_t file_type, hid_t memory_type,
                         hid_t space, const void* data) {
  auto lock = hdf5_lock();
  if (hdf5_has_attribute(object, name)) MPT_CHECK_HDF5(H5Adelete(object, name.c_str()));
  Hdf5Handle attribute =
      MPT_HDF5_HANDLE(H5Acreate2(object, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT));
  MPT_CHECK_HDF5(H5Awrite(attribute.get(), memory_type, data));
}

void write_scalar_attribute(hid_t object, const std::string& name, hid_t file_type,
                            hid_t memory_type, const void* data) {
  auto lock = hdf5_lock();
  Hdf5Handle space = MPT_HDF5_HANDLE(H5Screate(H5S_SCALAR));
  write_attribute_raw(object, name, file_type, memory_type, space.get(), data);
}

Hdf5Handle vector_space(std::size_t count) {
  const hsize_t extent = count;
  return MPT_HDF5_HANDLE(H5Screate_simple(1, &extent, nullptr));
}

// Opens attribute NAME if it exists and has the wanted type class; also returns its size.
struct OpenedAttribute {
  Hdf5Handle attribute;
  Hdf5Handle type;
  std::int64_t count = 0;
};
std::optional<OpenedAttribute> open_attribute(hid_t object, const std::string& name,
                                              std::initializer_list<H5T_class_t> classes) {
  if (!hdf5_has_attribute(object, name)) return std::nullopt;
  OpenedAttribute opened;
  opened.attribute = MPT_HDF5_HANDLE(H5Aopen(object, name.c_str(), H5P_DEFAULT));
  opened.type = MPT_HDF5_HANDLE(H5Aget_type(opened.attribute.get()));
  const H5T_class_t type_class = H5Tget_class(opened.type.get());
  bool wanted = false;
  for (auto c : classes) wanted = wanted || c == type_class;
  if (!wanted) return std::nullopt;
  Hdf5Handle space = MPT_HDF5_HANDLE(H5Aget_space(opened.attribute.get()));
  const hssize_t points = H5Sget_simple_extent_npoints(space.get());
  MPT_CHECK_HDF5(points);
  opened.count = points;
  return opened;
}

std::vector<std::string> read_strings(const OpenedAttribute& opened) {
  const hid_t attribute = opened.attribute.get();
  const auto count = static_cast<std::size_t>(opened.count);
  std::vector<std::string> values;
  values.reserve(count);
  if (H5Tis_variable_str(opened.type.get()) > 0) {
    Hdf5Handle memory_type = variable_string_type();
    MPT_CHECK_HDF5(H5Tset_cset(memory_type.get(), H5Tget_cset(opened.type.get())));
    std::vector<char*> pointers(count, nullptr);
    MPT_CHECK_HDF5(H5Aread(attribute, memory_type.get(), pointers.data()));
    for (char* p : pointers) values.emplace_back(p ? p : "");
    Hdf5Handle space = MPT_HDF5_HANDLE(H5Aget_space(attribute));
    MPT_CHECK_HDF5(H5Dvlen_reclaim(memory_type.get(), space.get(), H5P_DEFAULT, pointers.data()));
  } else {
    const std::size_t size = H5Tget_size(opened.type.get());
    const bool space_padded = H5Tget_strpad(opened.type.get()) == H5T_STR_SPACEPAD;
    std::vector<char> buffer(size * count + 1, '\0');
    MPT_CHECK_HDF5(H5Aread(attribute, opened.type.get(), buffer.data()));
    for (std::size_t i = 0; i < count; ++i) {
      const char* begin = buffer.data() + i * size;
      std::size_t length = 0;
      while (length < size && begin[length] != '\0') ++length;
      // Space-padded fixed strings (Fortran style) carry trailing blanks that are not content.
      while (space_padded && length > 0 && begin[length - 1] == ' ') --length;
      values.emplace_back(begin, length);
    }
  }
  return values;
}

}  // namespace

bool hdf5_has_attribute(hid_t object, const std::string& name) {
  auto lock = hdf5_lock();
  const htri_t exists = H5Aexists(object, name.c_str());
  MPT_CHECK_HDF5(exists);
  return exists > 0;
}

bool hdf5_has_link(hid_t location, const std::string& path) {
  auto lock = hdf5_lock();
  // H5Lexists fails (rather than answering false) when an intermediate group is missing, so the
  // path is walked one component at a time.
  std::string prefix;
  std::size_t begin = 0;
  while (begin <= path.size()) {
    std::size_t end = path.find('/', begin);
    if (end == std::string::npos) end = path.size();
    if (end > begin) {
      if (!prefix.empty()) prefix += '/';
      prefix.append(path, begin, end - begin);
      const htri_t exists = H5Lexists(location, prefix.c_str(), H5P_DEFAULT);
      MPT_CHECK_HDF5(exists);
      if (exists == 0) return false;
      if (end < path.size()) {
        // Only groups can hold further components. (H5Oopen + H5Iget_type rather than
        // H5Oget_info*, whose signature changed between HDF5 1.10 and 1.12.)
        Hdf5Handle object = MPT_HDF5_HANDLE(H5Oopen(location, prefix.c_str(), H5P_DEFAULT));
        if (H5Iget_type(object.get()) != H5I_GROUP) return false;
      }
    }
    begin = end + 1;
  }
  return !prefix.empty();
}

void hdf5_write_attribute(hid_t object, const std::string& name, std::int32_t value) {
  write_scalar_attribute(object, name, H5T_STD_I32LE, H5T_NATIVE_INT32, &value);
}
void hdf5_write_attribute(hid_t object, const std::string& name, std::int64_t value) {
  write_scalar_attribute(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}
void hdf5_write_attribute(hid_t object, const std::string& name, std::uint32_t value) {
  write_scalar_attribute(object, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &value);
}
void hdf5_write_attribute(hid_t object, const std::string& name, float value) {
  write_scalar_attribute(object, name, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, &value);
}
void hdf5_write_attribute(hid_t object, const std::string& name, const std::string& value) {
  auto lock = hdf5_lock();
  Hdf5Handle type = fixed_string_type(value.size());
  const std::string padded = value.empty() ? std::string(1, '\0') : value;
  write_scalar_attribute(object, name, type.get(), type.get(), padded.data());
}
void hdf5_write_attribute(hid_t object, const std::string& name, const char* value) {
  hdf5_write_attribute(object, name, std::string(value));
}
void hdf5_write_attribute(hid_t object, const std::string& name,
                          const std::vector<std::int64_t>& values) {
  auto lock = hdf5_lock();
  Hdf5Handle space = vector_space(values.size());
  write_attribute_raw(object, name, H5T_STD_I64LE, H5T_NATIVE_INT64, space.get(), values.data());
}
void hdf5_write_attribute(hid_t object, const std::string& name,
                          const std::vector<std::string>& values) {
  auto lock = hdf5_lock();
  std::size_t width = 1;
  for (const auto& value : values) width = std::max(width, value.size());
  Hdf5Handle type = fixed_string_type(width);
  Hdf5Handle space = vector_space(values.size());
  std::string packed(width * values.size(), '\0');
  for (std::size_t i = 0; i < values.size(); ++i) packed.replace(i * width, values[i].size(), values[i]);
  write_attribute_raw(object, name, type.get(), type.get(), space.get(), packed.data());
}

std::optional<std::int64_t> hdf5_read_int_attribute(hid_t object, const std::string& name) {
  auto lock = hdf5_lock();
  auto opened = open_attribute(object, name, {H5T_INTEGER});
  if (!opened || opened->count != 1) return std::nullopt;
  std::int64_t value = 0;
  MPT_CHECK_HDF5(H5Aread(opened->attribute.get(), H5T_NATIVE_INT64, &value));
  return value;
}

std::optional<double> hdf5_read_float_attribute(hid_t object, const std::string& name) {
  auto lock = hdf5_lock();
  auto opened = open_attribute(object, name, {H5T_FLOAT, H5T_INTEGER});
  if (!opened || opened->count != 1) return std::nullopt;
  double value = 0;
  MPT_CHECK_HDF5(H5Aread(opened->attribute.get(), H5T_NATIVE_DOUBLE, &value));
  return value;
}

std::optional<std::string> hdf5_read_string_attribute(hid_t object, const std::string& name) {
  auto lock = hdf5_lock();
  auto opened = open_attribute(object, name, {H5T_STRING});
  if (!opened || opened->count != 1) return std::nullopt;
  return read_strings(*opened).front();
}

std::optional<std::vector<std::int64_t>> hdf5_read_int_array_attribute(hid_t object,
                                                                       const std::string& name) {
  auto lock = hdf5_lock();
  auto opened = open_attribute(object, name, {H5T_INTEGER});
  if (!opened) return std::nullopt;
  std::vector<std::int64_t> values(static_cast<std::size_t>(opened->count));
  if (!values.empty())
    MPT_CHECK_HDF5(H5Aread(opened->attribute.get(), H5T_NATIVE_INT64, values.data()));
  return values;
}

std::optional<std::vector<std::string>> hdf5_read_string_array_attribute(hid_t object,
                                                                         const std::string& name) {
  auto lock = hdf5_lock();
  auto opened = open_attribute(object, name, {H5T_STRING});
  if (!opened) return std::nullopt;
  if (opened->count == 0) return std::vector<std::string>{};
  return read_strings(*opened);
}

Shape hdf5_dataset_shape(hid_t dataset) {
  auto lock = hdf5_lock();
  Hdf5Handle space = MPT_HDF5_HANDLE(H5Dget_space(dataset));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  MPT_CHECK_HDF5(rank);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0) MPT_CHECK_HDF5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr));
  return Shape(dims.begin(), dims.end());
}

Hdf5Handle hdf5_write_dataset(hid_t location, const std::string& path, hid_t file_type,
                              hid_t memory_type, const Shape& shape, const void* data,
                              const Shape& chunk) {
  auto lock = hdf5_lock();
  const std::vector<hsize_t> dims(shape.begin(), shape.end());
  Hdf5Handle space =
      shape.empty()
          ? MPT_HDF5_HANDLE(H5Screate(H5S_SCALAR))
          : MPT_HDF5_HANDLE(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  Hdf5Handle link_properties = MPT_HDF5_HANDLE(H5Pcreate(H5P_LINK_CREATE));
  MPT_CHECK_HDF5(H5Pset_create_intermediate_group(link_properties.get(), 1));
  Hdf5Handle create_properties = MPT_HDF5_HANDLE(H5Pcreate(H5P_DATASET_CREATE));
  if (!chunk.empty()) {
    const std::vector<hsize_t> chunk_dims(chunk.begin(), chunk.end());
    MPT_CHECK_HDF5(H5Pset_chunk(create_properties.get(), static_cast<int>(chunk_dims.size()),
                                chunk_dims.data()));
  }
  Hdf5Handle dataset =
      MPT_HDF5_HANDLE(H5Dcreate2(location, path.c_str(), file_type, space.get(),
                                 link_properties.get(), create_properties.get(), H5P_DEFAULT));
  if (shape_numel(shape) > 0)
    MPT_CHECK_HDF5(H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data));
  return dataset;
}

herr_t hdf5_read_dataset(hid_t dataset, hid_t memory_type, void* out) {
  auto lock = hdf5_lock();
  return H5Dread(dataset, memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out);
}

std::string hdf5_type_name(hid_t type) {
  auto lock = hdf5_lock();
  const std::size_t bits = H5Tget_size(type) * 8;
  switch (H5Tget_class(type)) {
    case H5T_INTEGER:
      return std::string(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_FLOAT:
      return "float" + std::to_string(bits);
    case H5T_STRING:
      return H5Tis_variable_str(type) > 0 ? "string" : "string[" + std::to_string(bits / 8) + "]";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "vlen";
    case H5T_OPAQUE:
      return "opaque";
    case H5T_REFERENCE:
      return "reference";
    default:
      return "unknown";
  }
}

namespace {

std::optional<std::string> find_damaged_object(hid_t file) {
  // Each attribute is read in full, in its own type: variable-length values live in the file's
  // global heap, outside the object header and its checksum, and a damaged one would otherwise
  // first fail inside a helper above, which aborts (found by fuzz/fuzz_data_file).
  auto read_value = [](hid_t location, const char* name, const H5A_info_t*, void*) -> herr_t {
    Hdf5Handle attribute(H5Aopen(location, name, H5P_DEFAULT));
    Hdf5Handle type(attribute.valid() ? H5Aget_type(attribute.get()) : H5I_INVALID_HID);
    Hdf5Handle space(attribute.valid() ? H5Aget_space(attribute.get()) : H5I_INVALID_HID);
    if (!type.valid() || !space.valid()) return -1;
    const hssize_t points = H5Sget_simple_extent_npoints(space.get());
    const std::size_t size = H5Tget_size(type.get());
    // mptrain's attributes are small; a size beyond 64 MiB is a damaged header, not a value.
    if (points < 0 || size == 0 || static_cast<double>(points) * size > (64 << 20)) return -1;
    std::vector<unsigned char> value(static_cast<std::size_t>(points) * size + 1);
    if (H5Aread(attribute.get(), type.get(), value.data()) < 0) return -1;
    H5Dvlen_reclaim(type.get(), space.get(), H5P_DEFAULT, value.data());
    return 0;
  };
  if (H5Aiterate2(file, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, read_value, nullptr) < 0)
    return "'/': " + hdf5_last_error();
  std::vector<std::string> paths;
  auto visit = [](hid_t, const char* name, const H5L_info_t* info, void* data) -> herr_t {
    if (info->type == H5L_TYPE_HARD) static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
  };
  if (H5Lvisit(file, H5_INDEX_NAME, H5_ITER_NATIVE, visit, &paths) < 0)
    return "the links under '/': " + hdf5_last_error();
  for (const auto& path : paths) {
    Hdf5Handle object(H5Oopen(file, path.c_str(), H5P_DEFAULT));
    if (!object.valid() ||
        H5Aiterate2(object.get(), H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, read_value, nullptr) < 0)
      return "'/" + path + "': " + hdf5_last_error();
  }
  return std::nullopt;
}

// Opens PATH and walks it; nullopt also when HDF5 cannot open it (the caller's open says why).
std::optional<std::string> walk_file(const std::string& path) {
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  if (!file.valid()) {
    hdf5_last_error();  // clear the stack
    return std::nullopt;
  }
  return find_damaged_object(file.get());
}

// The child's side: walk, write "ok" or "damaged\n" + reason to OUT, _exit(0). Anything else
// the parent sees (a signal, another exit status, a short message) means the library crashed.
[[noreturn]] void run_probe_child(const std::string& path, int out) {
  in_probe_child = true;
  // A crash here must end this process quietly, not run handlers the parent installed (ASan's
  // report, libFuzzer's crash file, a core dump of a large process).
  for (int signal_number : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(signal_number, SIG_DFL);
  if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(nullptr);
  const struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  const int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null >= 0) dup2(null, STDERR_FILENO);
  std::string verdict = "ok";
  if (const auto damaged = walk_file(path)) verdict = "damaged\n" + *damaged;
  const char* data = verdict.data();
  std::size_t left = verdict.size();
  while (left > 0) {
    const ssize_t written = write(out, data, left);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) _exit(3);
    data += written;
    left -= static_cast<std::size_t>(written);
  }
  _exit(0);
}

double probe_timeout_s() {
  const char* text = std::getenv("MPTRAIN_HDF5_PROBE_TIMEOUT");
  if (text == nullptr || *text == '\0') return 20.0;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  MPT_REQUIRE(end != text && *end == '\0' && seconds > 0,
              "MPTRAIN_HDF5_PROBE_TIMEOUT='" + std::string(text) + "' is not a positive number",
              "give the seconds a damaged-file check of an HDF5 file may take, e.g. 20");
  return seconds;
}

std::string signal_text(int signal_number) {
  const char* abbreviation = sigabbrev_np(signal_number);
  return abbreviation ? "SIG" + std::string(abbreviation) : "signal " + std::to_string(signal_number);
}

}  // namespace

void hdf5_set_probe_isolation(bool isolated) { probe_isolation = isolated; }

std::optional<std::string> hdf5_probe_file(const std::string& path) {
  const double timeout_s = probe_timeout_s();
  // Held across fork(): no other thread of ours is inside HDF5 then, so the child's copy of the
  // library's global state is consistent.
  auto lock = hdf5_lock();
  hdf5_quiet();
  if (!probe_isolation) return walk_file(path);
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return walk_file(path);
  const pid_t child = fork();
  if (child < 0) {  // no processes or memory left for a child: probe here, unprotected
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return walk_file(path);
  }
  if (child == 0) {
    close(pipe_fds[0]);
    run_probe_child(path, pipe_fds[1]);
  }
  close(pipe_fds[1]);
  std::string message;
  bool timed_out = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    struct pollfd readable = {pipe_fds[0], POLLIN, 0};
    const int ready = poll(&readable, 1, static_cast<int>(std::min<long long>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char buffer[512];
    const ssize_t got = read(pipe_fds[0], buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;  // end of file: the child is done (or dead)
    message.append(buffer, static_cast<std::size_t>(got));
  }
  close(pipe_fds[0]);
  if (timed_out) kill(child, SIGKILL);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g", timeout_s);
  if (timed_out)
    return "its metadata within " + std::string(seconds) +
           " s (HDF5 1.10 loops on some damaged files; on a file system that slow, raise "
           "MPTRAIN_HDF5_PROBE_TIMEOUT)";
  const bool clean_exit = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (clean_exit && message == "ok") return std::nullopt;
  if (clean_exit && message.rfind("damaged\n", 0) == 0) return message.substr(8);
  const std::string how = WIFSIGNALED(status) ? signal_text(WTERMSIG(status))
                                              : "exit status " + std::to_string(WEXITSTATUS(status));
  return "its metadata: the HDF5 library crashed on it (" + how + " in mptrain's probe process)";
}

}  // namespace mpt
