// CRC-32C against the RFC 3720 (iSCSI) vectors and a bit-at-a-time reference, on the hardware
// and table paths alike, over lengths and alignments that reach every branch of both.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/crc32c.hpp"

namespace mpt {
namespace {

// The definition, one bit at a time: nothing shared with either implementation.
std::uint32_t crc32c_bitwise(const std::uint8_t* data, std::size_t bytes) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < bytes; ++i) {
    crc ^= data[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? 0x82F63B78u : 0u);
  }
  return ~crc;
}

std::vector<std::uint8_t> random_bytes(std::size_t count, unsigned seed) {
  std::mt19937 generator(seed);
  std::vector<std::uint8_t> bytes(count);
  for (auto& byte : bytes) byte = static_cast<std::uint8_t>(generator());
  return bytes;
}

// Every implementation this machine can run.
std::vector<std::uint32_t (*)(const void*, std::size_t, std::uint32_t)> implementations() {
  std::vector<std::uint32_t (*)(const void*, std::size_t, std::uint32_t)> all = {
      &detail::crc32c_table,
      [](const void* d, std::size_t n, std::uint32_t c) { return crc32c(d, n, c); }};
  if (detail::crc32c_hardware_available()) all.push_back(&detail::crc32c_hardware);
  return all;
}

TEST(Crc32c, KnownVectors) {
  const std::string digits = "123456789";
  std::vector<std::uint8_t> zeros(32, 0), ones(32, 0xFF), ascending(32), descending(32);
  for (int i = 0; i < 32; ++i) {
    ascending[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(i);
    descending[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(31 - i);
  }
  for (auto* crc : implementations()) {
    EXPECT_EQ(crc(digits.data(), digits.size(), 0), 0xE3069283u);
    EXPECT_EQ(crc(zeros.data(), zeros.size(), 0), 0x8A9136AAu);
    EXPECT_EQ(crc(ones.data(), ones.size(), 0), 0x62A8AB43u);
    EXPECT_EQ(crc(ascending.data(), ascending.size(), 0), 0x46DD794Eu);
    EXPECT_EQ(crc(descending.data(), descending.size(), 0), 0x113FDB5Cu);
    EXPECT_EQ(crc(nullptr, 0, 0), 0u);
  }
}

TEST(Crc32c, HardwareEqualsTableOnEveryLengthAndAlignment) {
  if (!detail::crc32c_hardware_available()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  // 3 * 8192 * 2 + change: both three-stream block sizes, the 8-byte loop and the byte tails.
  const auto bytes = random_bytes(3 * 8192 * 2 + 3 * 256 + 77, 7);
  std::mt19937 generator(11);
  for (int trial = 0; trial < 400; ++trial) {
    const std::size_t offset = generator() % 8;
    const std::size_t length = generator() % (bytes.size() - offset);
    const std::uint8_t* at = bytes.data() + offset;
    const std::uint32_t seed = trial % 2 ? generator() : 0u;
    ASSERT_EQ(detail::crc32c_hardware(at, length, seed), detail::crc32c_table(at, length, seed))
        << "offset " << offset << " length " << length;
  }
  for (std::size_t length = 0; length < 3 * 256 + 64; ++length)
    for (std::size_t offset = 0; offset < 8; ++offset)
      ASSERT_EQ(detail::crc32c_hardware(bytes.data() + offset, length, 0),
                detail::crc32c_table(bytes.data() + offset, length, 0))
          << "offset " << offset << " length " << length;
}

TEST(Crc32c, MatchesTheBitwiseDefinition) {
  const auto bytes = random_bytes(100000, 3);
  for (std::size_t length : {1u, 7u, 8u, 9u, 255u, 769u, 24576u, 24583u, 49999u, 100000u})
    for (auto* crc : implementations())
      EXPECT_EQ(crc(bytes.data() + 1, length - 1, 0), crc32c_bitwise(bytes.data() + 1, length - 1))
          << "length " << length - 1;
}

TEST(Crc32c, IncrementalEqualsOneShot) {
  const auto bytes = random_bytes(70000, 5);
  const std::uint32_t whole = crc32c(bytes.data(), bytes.size());
  for (std::size_t piece : {1u, 3u, 8u, 1000u, 24576u, 30001u}) {
    for (auto* crc : implementations()) {
      std::uint32_t running = 0;
      for (std::size_t at = 0; at < bytes.size(); at += piece)
        running = crc(bytes.data() + at, std::min(piece, bytes.size() - at), running);
      EXPECT_EQ(running, whole) << "pieces of " << piece;
    }
  }
}

}  // namespace
}  // namespace mpt
