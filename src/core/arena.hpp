// BlockArena: sub-allocates blocks out of a few large slabs and keeps freed blocks for reuse,
// so that a process asks its device for memory a handful of times at start-up and never in a
// training step (issue #8: no cudaMalloc or cudaFree in the step). Device-neutral: the slabs
// come from a SlabSource, cudaMalloc in device_memory.cpp and plain malloc in the tests.
//
// Best fit over the free blocks (ties: the lowest address), split on allocation, merged with
// free neighbours of the same slab on release. Slabs are returned only when the arena dies.
// Not thread-safe: the caller serialises (device_memory.cpp holds a mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <utility>

namespace mpt {

struct SlabSource {
  std::function<void*(std::size_t)> allocate;  // nullptr when the device is out of memory
  std::function<void(void*)> release;
};

struct ArenaStats {
  std::int64_t slabs = 0;           // requests to the SlabSource so far (its allocations)
  std::int64_t reserved_bytes = 0;  // held in slabs
  std::int64_t in_use_bytes = 0;    // in blocks handed out (rounded to the alignment)
  std::int64_t peak_in_use_bytes = 0;
  std::int64_t blocks = 0;  // handed out and not yet released
};

class BlockArena {
 public:
  static constexpr std::size_t kAlignment =
      256;  // cudaMalloc's own, and enough for any vector load

  // New slabs hold at least MIN_SLAB_BYTES (a larger request gets a slab of its own size).
  BlockArena(SlabSource source, std::size_t min_slab_bytes);
  ~BlockArena();
  BlockArena(const BlockArena&) = delete;
  BlockArena& operator=(const BlockArena&) = delete;

  // A block of at least BYTES (0 counts as 1), kAlignment-aligned; nullptr only when a new slab
  // was needed and the source had none.
  void* allocate(std::size_t bytes);
  // POINTER must come from allocate() and not be released yet; nullptr is ignored. Returns
  // false (and changes nothing) for a pointer this arena did not hand out.
  bool release(void* pointer);
  // Makes sure a block of BYTES fits without a new slab, taking one of at least BYTES now if
  // not: a caller that knows its plan asks for it all at once, up front.
  bool reserve(std::size_t bytes);

  const ArenaStats& stats() const { return stats_; }

 private:
  struct Block {
    std::size_t size = 0;
    bool free = false;
    int slab = 0;  // blocks merge only within their slab
  };
  using Address = std::uintptr_t;

  bool add_slab(std::size_t bytes);
  void mark_free(Address at, Block& block);

  SlabSource source_;
  std::size_t min_slab_bytes_;
  std::map<Address, Block> blocks_;                 // every block of every slab, by address
  std::set<std::pair<std::size_t, Address>> free_;  // free blocks by (size, address): best fit
  std::map<Address, std::size_t> slabs_;            // slab base -> size, for the destructor
  ArenaStats stats_;
};

}  // namespace mpt
