// SHA-256 (FIPS 180-4), for the digest that export files carry over their weights. Small and
// dependency-free; hashing speed is not a concern at model sizes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace mpt {

// Incremental SHA-256: update() any number of times, then digest() once.
class Sha256 {
 public:
  Sha256();
  void update(const void* data, std::size_t bytes);
  void update(std::string_view text) { update(text.data(), text.size()); }
  // The 32-byte digest; the object must not be updated afterwards.
  std::array<std::uint8_t, 32> digest();
  // The digest as 64 lowercase hex digits (what hashlib's hexdigest() prints).
  std::string hex_digest();

 private:
  void compress(const std::uint8_t* block);
  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> buffer_{};
  std::size_t buffered_ = 0;
  std::uint64_t total_bytes_ = 0;
};

// One-shot hex digest of TEXT.
std::string sha256_hex(std::string_view text);

}  // namespace mpt
