// BlockArena (see arena.hpp).
#include "core/arena.hpp"

#include <algorithm>

namespace mpt {

namespace {
std::size_t round_up(std::size_t bytes) {
  const std::size_t a = BlockArena::kAlignment;
  return (std::max<std::size_t>(bytes, 1) + a - 1) / a * a;
}
}  // namespace

BlockArena::BlockArena(SlabSource source, std::size_t min_slab_bytes)
    : source_(std::move(source)), min_slab_bytes_(round_up(min_slab_bytes)) {}

BlockArena::~BlockArena() {
  for (const auto& [base, size] : slabs_) source_.release(reinterpret_cast<void*>(base));
}

bool BlockArena::add_slab(std::size_t bytes) {
  const std::size_t size = std::max(round_up(bytes), min_slab_bytes_);
  void* base = source_.allocate(size);
  if (base == nullptr) return false;
  const auto at = reinterpret_cast<Address>(base);
  slabs_.emplace(at, size);
  ++stats_.slabs;
  stats_.reserved_bytes += static_cast<std::int64_t>(size);
  Block& block = blocks_[at];
  block = {size, false, static_cast<int>(slabs_.size())};
  mark_free(at, block);
  return true;
}

void BlockArena::mark_free(Address at, Block& block) {
  block.free = true;
  free_.emplace(block.size, at);
}

void* BlockArena::allocate(std::size_t bytes) {
  const std::size_t size = round_up(bytes);
  auto fit = free_.lower_bound({size, 0});
  if (fit == free_.end()) {
    if (!add_slab(size)) return nullptr;
    fit = free_.lower_bound({size, 0});
  }
  const Address at = fit->second;
  free_.erase(fit);
  Block& block = blocks_.at(at);
  if (block.size > size) {  // split: the tail stays free
    Block tail{block.size - size, false, block.slab};
    block.size = size;
    auto [tail_it, inserted] = blocks_.emplace(at + size, tail);
    mark_free(tail_it->first, tail_it->second);
  }
  block.free = false;
  ++stats_.blocks;
  stats_.in_use_bytes += static_cast<std::int64_t>(size);
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return reinterpret_cast<void*>(at);
}

bool BlockArena::release(void* pointer) {
  if (pointer == nullptr) return true;
  auto it = blocks_.find(reinterpret_cast<Address>(pointer));
  if (it == blocks_.end() || it->second.free) return false;
  --stats_.blocks;
  stats_.in_use_bytes -= static_cast<std::int64_t>(it->second.size);
  // Merge with the next block, then with the previous one, when free and of the same slab.
  auto next = std::next(it);
  if (next != blocks_.end() && next->second.free && next->second.slab == it->second.slab &&
      next->first == it->first + it->second.size) {
    free_.erase({next->second.size, next->first});
    it->second.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto previous = std::prev(it);
    if (previous->second.free && previous->second.slab == it->second.slab &&
        previous->first + previous->second.size == it->first) {
      free_.erase({previous->second.size, previous->first});
      previous->second.size += it->second.size;
      blocks_.erase(it);
      it = previous;
    }
  }
  mark_free(it->first, it->second);
  return true;
}

bool BlockArena::reserve(std::size_t bytes) {
  if (free_.lower_bound({round_up(bytes), 0}) != free_.end()) return true;
  return add_slab(bytes);
}

}  // namespace mpt
