// The shared-memory buffer (see shared_buffer.hpp).
#include "comm/shared_buffer.hpp"

#include <sys/statvfs.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "core/error.hpp"

namespace mpt::comm {
namespace {

// Each part is padded to this, so that the next rank's part starts on its own cache line and
// a kernel may round its last vector up as it does with a Tensor's own allocation.
constexpr std::size_t kPartAlign = 64;
// Where Open MPI's osc/sm component backs MPI_Win_allocate_shared: its MCA parameter
// osc_sm_backing_directory when set in the environment, else its default.
std::string backing_directory() {
  const char* set = std::getenv("OMPI_MCA_osc_sm_backing_directory");
  return set != nullptr && *set != '\0' ? set : "/dev/shm";
}

std::size_t padded(std::size_t bytes) {
  return (bytes + kPartAlign - 1) / kPartAlign * kPartAlign + kPartAlign;
}

}  // namespace

SharedBuffer::SharedBuffer(const Topology& topology, std::size_t bytes)
    : topology_(topology), bytes_(bytes) {
  MPI_Info info = MPI_INFO_NULL;
  MPT_CHECK_MPI(MPI_Info_create(&info));
  // Non-contiguous: each part may sit in pages of its own, first touched by its owner.
  MPT_CHECK_MPI(MPI_Info_set(info, "alloc_shared_noncontig", "true"));
  void* base = nullptr;
  // One alignment more than the padded size: Open MPI places the parts on 8-byte boundaries.
  MPT_CHECK_MPI(MPI_Win_allocate_shared(static_cast<MPI_Aint>(padded(bytes) + kPartAlign), 1, info,
                                        topology.node(), &base, &window_));
  MPT_CHECK_MPI(MPI_Info_free(&info));
  parts_.resize(static_cast<std::size_t>(topology.local_size()));
  for (int local = 0; local < topology.local_size(); ++local) {
    MPI_Aint size = 0;
    int unit = 0;
    void* pointer = nullptr;
    MPT_CHECK_MPI(MPI_Win_shared_query(window_, local, &size, &unit, &pointer));
    // Rounded up in this process's mapping: the window is mapped page-aligned in every process,
    // so every rank rounds each part by the same amount and sees the same bytes.
    const auto address = reinterpret_cast<std::uintptr_t>(pointer);
    parts_[static_cast<std::size_t>(local)] =
        static_cast<std::byte*>(pointer) + (kPartAlign - address % kPartAlign) % kPartAlign;
  }
  std::memset(data(), 0, padded(bytes));
  // Every part is zero before any rank reads a peer's.
  MPT_CHECK_MPI(MPI_Barrier(topology.node()));
}

SharedBuffer::~SharedBuffer() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || window_ == MPI_WIN_NULL || std::uncaught_exceptions() > 0) return;
  MPI_Win_free(&window_);
}

bool SharedBuffer::holds(const void* pointer, std::size_t bytes) const {
  const auto* begin = static_cast<const std::byte*>(pointer);
  const std::byte* mine = parts_[static_cast<std::size_t>(topology_.local_rank())];
  return begin >= mine && bytes <= bytes_ &&
         begin - mine <= static_cast<std::ptrdiff_t>(bytes_ - bytes);
}

bool SharedBuffer::fits(const Topology& topology, std::size_t bytes, std::string* why) {
  // Local rank 0 looks and tells the others, so that the whole node decides alike.
  long long free_bytes = -1;  // -1: no such file system
  const std::string directory = backing_directory();
  if (topology.local_rank() == 0) {
    struct statvfs fs {};
    if (statvfs(directory.c_str(), &fs) == 0)
      free_bytes = static_cast<long long>(fs.f_bavail) * static_cast<long long>(fs.f_frsize);
  }
  MPT_CHECK_MPI(MPI_Bcast(&free_bytes, 1, MPI_LONG_LONG, 0, topology.node()));
  const long long needed = static_cast<long long>(padded(bytes)) * topology.local_size();
  // A quarter spare: Open MPI's own segments (vader, the all-reduce's window) live there too.
  const bool room = free_bytes >= 0 && needed + needed / 4 <= free_bytes;
  if (!room && why != nullptr) {
    *why = free_bytes < 0 ? directory + " is not there"
                          : directory + " has " + std::to_string(free_bytes >> 20) +
                                " MiB free and the node needs " +
                                std::to_string((needed + needed / 4) >> 20) + " MiB";
  }
  return room;
}

}  // namespace mpt::comm
