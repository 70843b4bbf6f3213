// comm::SharedBuffer: a buffer that every rank of a node reads directly, as NCCL's registered
// user buffers are. Each rank's part lives in one MPI-3 shared-memory window over the node, so
// an Allreducer that has the buffer registered sums its shard straight out of the peers' parts:
// no copy into a staging segment first (docs/architecture.md, "Registered gradients").
#pragma once

#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

#include "comm/topology.hpp"

namespace mpt::comm {

class SharedBuffer {
 public:
  // Collective over TOPOLOGY's node: every rank gets BYTES of its own (the same BYTES on every
  // rank of the node), zero-filled by its owner, 64-byte aligned. TOPOLOGY must outlive this.
  SharedBuffer(const Topology& topology, std::size_t bytes);
  // Collective over the node (MPI_Win_free), except while an exception unwinds on this rank or
  // after MPI_Finalize (the job is ending; the peers may never get here).
  ~SharedBuffer();
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;

  std::byte* data() { return part(topology_.local_rank()); }
  std::size_t size() const { return bytes_; }
  // Local rank LOCAL's part, as mapped in this process.
  std::byte* part(int local) const { return parts_[static_cast<std::size_t>(local)]; }
  const Topology& topology() const { return topology_; }
  // Whether POINTER[0, BYTES) lies inside this rank's part.
  bool holds(const void* pointer, std::size_t bytes) const;

  // Collective over TOPOLOGY's node, the same answer on every rank of it: whether the node's
  // shared-memory file system (where Open MPI backs its windows:
  // $OMPI_MCA_osc_sm_backing_directory, else /dev/shm) has room for BYTES per local rank, with
  // a margin. A container's 64 MiB /dev/shm is the case this catches: pages past its size fault
  // with SIGBUS when first touched. When not, WHY says so in a line.
  static bool fits(const Topology& topology, std::size_t bytes, std::string* why);

 private:
  const Topology& topology_;
  std::size_t bytes_ = 0;
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<std::byte*> parts_;
};

}  // namespace mpt::comm
