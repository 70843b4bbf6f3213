// Counter-based random numbers (Philox4x32-10): a value is a pure function of (key, counter),
// so any rank, epoch or resumed run can regenerate exactly the same stream without state.
#pragma once

#include <array>
#include <cstdint>

namespace mpt {

// Philox4x32-10 (Salmon et al., SC'11): 4 x 32-bit outputs for a 128-bit counter and 64-bit key.
inline std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter,
                                               std::array<std::uint32_t, 2> key) {
  constexpr std::uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(kMul0) * counter[0];
    const std::uint64_t p1 = static_cast<std::uint64_t>(kMul1) * counter[2];
    counter = {static_cast<std::uint32_t>(p1 >> 32) ^ counter[1] ^ key[0], static_cast<std::uint32_t>(p1),
               static_cast<std::uint32_t>(p0 >> 32) ^ counter[3] ^ key[1], static_cast<std::uint32_t>(p0)};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return counter;
}

// A stream of random numbers identified by (seed, stream id); element i is generated from
// counter i alone. Stream ids name their use (weights of layer k, shuffle of epoch e, ...).
class CounterRng {
 public:
  CounterRng(std::uint64_t seed, std::uint64_t stream) : seed_(seed), stream_(stream) {}

  // 64 random bits for position I of the stream.
  std::uint64_t bits(std::uint64_t i) const {
    const auto out = philox4x32({static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(i >> 32),
                                 static_cast<std::uint32_t>(stream_), static_cast<std::uint32_t>(stream_ >> 32)},
                                {static_cast<std::uint32_t>(seed_), static_cast<std::uint32_t>(seed_ >> 32)});
    return (static_cast<std::uint64_t>(out[0]) << 32) | out[1];
  }
  // Uniform in [0, 1) with 24 bits of precision, exactly representable in float.
  float uniform(std::uint64_t i) const { return static_cast<float>(bits(i) >> 40) * 0x1.0p-24f; }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift, negligible bias for n < 2^32).
  std::uint64_t below(std::uint64_t i, std::uint64_t n) const {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(bits(i)) * n) >> 64);
  }

 private:
  std::uint64_t seed_;
  std::uint64_t stream_;
};

}  // namespace mpt
