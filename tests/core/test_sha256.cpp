// SHA-256 against the FIPS 180-4 / NIST example vectors, and incremental updates that cross
// block boundaries in odd pieces.
#include <gtest/gtest.h>

#include <string>

#include "core/sha256.hpp"

namespace mpt {
namespace {

TEST(Sha256, FipsVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjkl"
                       "mnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  // One million 'a': many blocks.
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalEqualsOneShot) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>(i * 7 + 3));
  for (std::size_t piece : {1u, 3u, 55u, 56u, 63u, 64u, 65u, 200u}) {
    Sha256 hash;
    for (std::size_t at = 0; at < text.size(); at += piece)
      hash.update(std::string_view(text).substr(at, piece));
    EXPECT_EQ(hash.hex_digest(), sha256_hex(text)) << "pieces of " << piece;
  }
  // Lengths around the padding boundary (55, 56, 64 bytes) differ from each other.
  EXPECT_NE(sha256_hex(std::string(55, 'x')), sha256_hex(std::string(56, 'x')));
}

}  // namespace
}  // namespace mpt
