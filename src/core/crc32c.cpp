// CRC-32C, reflected polynomial 0x82F63B78. The hardware path runs three independent crc32
// instruction streams over three blocks (the instruction has a latency of 3 cycles and a
// throughput of 1, so one stream leaves two thirds of the unit idle) and joins them with
// precomputed "append N zero bytes" operators (Mark Adler's method), which reaches the
// ~20 GB/s a checkpoint write needs not to wait on its checksum.
#include "core/crc32c.hpp"

#include <array>
#include <bit>
#include <cstring>
#include <utility>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define MPT_CRC32C_X86 1
#endif

namespace mpt {
namespace {

constexpr std::uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, bit-reversed

static_assert(std::endian::native == std::endian::little,
              "crc32c: the slicing-by-8 tables read words little-endian");

using Table = std::array<std::array<std::uint32_t, 256>, 8>;

// TABLE[0] is the classic byte-at-a-time table; TABLE[k] advances a byte's CRC over k more zero
// bytes, so eight lookups consume eight bytes at once.
constexpr Table make_slicing_table() {
  Table table{};
  for (std::uint32_t n = 0; n < 256; ++n) {
    std::uint32_t crc = n;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1u) ? kPolynomial : 0u);
    table[0][n] = crc;
  }
  for (std::size_t k = 1; k < 8; ++k)
    for (std::size_t n = 0; n < 256; ++n)
      table[k][n] = (table[k - 1][n] >> 8) ^ table[0][table[k - 1][n] & 0xFFu];
  return table;
}

constexpr Table kSlicing = make_slicing_table();

std::uint32_t table_byte(std::uint32_t crc, std::uint8_t byte) {
  return kSlicing[0][(crc ^ byte) & 0xFFu] ^ (crc >> 8);
}

#ifdef MPT_CRC32C_X86

// A linear operator on the 32-bit CRC register over GF(2): column i is the image of bit i.
using Operator = std::array<std::uint32_t, 32>;

std::uint32_t apply(const Operator& op, std::uint32_t vector) {
  std::uint32_t sum = 0;
  for (int i = 0; vector != 0; ++i, vector >>= 1)
    if (vector & 1u) sum ^= op[static_cast<std::size_t>(i)];
  return sum;
}

Operator compose(const Operator& outer, const Operator& inner) {
  Operator result{};
  for (std::size_t i = 0; i < 32; ++i) result[i] = apply(outer, inner[i]);
  return result;
}

// The operator that feeds BYTES zero bytes through the register: a CRC register after block A,
// so advanced, XORed with the register over block B started from 0, is the register after A+B.
Operator zeros_operator(std::size_t bytes) {
  Operator power{};  // one zero bit
  power[0] = kPolynomial;
  for (std::size_t i = 1; i < 32; ++i) power[i] = 1u << (i - 1);
  for (int i = 0; i < 3; ++i) power = compose(power, power);  // one zero byte
  Operator result{};
  for (std::size_t i = 0; i < 32; ++i) result[i] = 1u << i;  // identity
  for (; bytes != 0; bytes >>= 1) {
    if (bytes & 1u) result = compose(power, result);
    power = compose(power, power);
  }
  return result;
}

// The operator applied a byte of the register at a time: four lookups instead of 32 XORs.
struct ShiftTable {
  std::array<std::array<std::uint32_t, 256>, 4> bytes;
  explicit ShiftTable(std::size_t zero_bytes) {
    const Operator op = zeros_operator(zero_bytes);
    for (std::uint32_t n = 0; n < 256; ++n)
      for (std::size_t k = 0; k < 4; ++k) bytes[k][n] = apply(op, n << (8 * k));
  }
  std::uint32_t shift(std::uint32_t crc) const {
    return bytes[0][crc & 0xFFu] ^ bytes[1][(crc >> 8) & 0xFFu] ^ bytes[2][(crc >> 16) & 0xFFu] ^
           bytes[3][crc >> 24];
  }
};

// Large blocks amortise the join; the short ones keep mid-sized buffers on three streams too.
constexpr std::size_t kLongBlock = 8192;
constexpr std::size_t kShortBlock = 256;

std::uint64_t load_word(const std::uint8_t* at) {
  std::uint64_t word;
  std::memcpy(&word, at, sizeof(word));
  return word;
}

#endif  // MPT_CRC32C_X86

}  // namespace

namespace detail {

std::uint32_t crc32c_table(const void* data, std::size_t bytes, std::uint32_t crc) {
  const auto* next = static_cast<const std::uint8_t*>(data);
  crc = ~crc;
  while (bytes > 0 && (reinterpret_cast<std::uintptr_t>(next) & 7u) != 0) {
    crc = table_byte(crc, *next++);
    --bytes;
  }
  for (; bytes >= 8; bytes -= 8, next += 8) {
    std::uint64_t word;
    std::memcpy(&word, next, sizeof(word));
    word ^= crc;
    crc = kSlicing[7][word & 0xFFu] ^ kSlicing[6][(word >> 8) & 0xFFu] ^
          kSlicing[5][(word >> 16) & 0xFFu] ^ kSlicing[4][(word >> 24) & 0xFFu] ^
          kSlicing[3][(word >> 32) & 0xFFu] ^ kSlicing[2][(word >> 40) & 0xFFu] ^
          kSlicing[1][(word >> 48) & 0xFFu] ^ kSlicing[0][word >> 56];
  }
  while (bytes-- > 0) crc = table_byte(crc, *next++);
  return ~crc;
}

#ifdef MPT_CRC32C_X86

bool crc32c_hardware_available() {
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
}

__attribute__((target("sse4.2"))) std::uint32_t crc32c_hardware(const void* data, std::size_t bytes,
                                                                std::uint32_t crc) {
  static const ShiftTable long_shift(kLongBlock), short_shift(kShortBlock);
  const auto* next = static_cast<const std::uint8_t*>(data);
  std::uint64_t crc0 = ~crc;
  while (bytes > 0 && (reinterpret_cast<std::uintptr_t>(next) & 7u) != 0) {
    crc0 = _mm_crc32_u8(static_cast<std::uint32_t>(crc0), *next++);
    --bytes;
  }
  for (const auto& [block, table] :
       {std::pair<std::size_t, const ShiftTable*>{kLongBlock, &long_shift},
        std::pair<std::size_t, const ShiftTable*>{kShortBlock, &short_shift}}) {
    while (bytes >= 3 * block) {
      std::uint64_t crc1 = 0, crc2 = 0;
      const std::uint8_t* end = next + block;
      do {
        crc0 = _mm_crc32_u64(crc0, load_word(next));
        crc1 = _mm_crc32_u64(crc1, load_word(next + block));
        crc2 = _mm_crc32_u64(crc2, load_word(next + 2 * block));
        next += 8;
      } while (next < end);
      crc0 = table->shift(static_cast<std::uint32_t>(crc0)) ^ crc1;
      crc0 = table->shift(static_cast<std::uint32_t>(crc0)) ^ crc2;
      next += 2 * block;
      bytes -= 3 * block;
    }
  }
  for (; bytes >= 8; bytes -= 8, next += 8) crc0 = _mm_crc32_u64(crc0, load_word(next));
  while (bytes-- > 0) crc0 = _mm_crc32_u8(static_cast<std::uint32_t>(crc0), *next++);
  return ~static_cast<std::uint32_t>(crc0);
}

#else

bool crc32c_hardware_available() { return false; }

std::uint32_t crc32c_hardware(const void* data, std::size_t bytes, std::uint32_t crc) {
  return crc32c_table(data, bytes, crc);
}

#endif  // MPT_CRC32C_X86

}  // namespace detail

std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc) {
  return detail::crc32c_hardware_available() ? detail::crc32c_hardware(data, bytes, crc)
                                             : detail::crc32c_table(data, bytes, crc);
}

}  // namespace mpt
