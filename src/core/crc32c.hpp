// CRC-32C (Castagnoli; the checksum of iSCSI, ext4, gRPC and TFRecord) for checkpoint datasets
// and event files. Uses the SSE4.2 crc32 instruction when the CPU has it (chosen at run time),
// a slicing-by-8 table otherwise; the two agree bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mpt {

// The CRC-32C of BYTES bytes at DATA, continued from CRC (the CRC of what came before; 0 to
// start): crc32c(b, nb, crc32c(a, na)) == crc32c of a followed by b. Reads only.
std::uint32_t crc32c(const void* data, std::size_t bytes, std::uint32_t crc = 0);

namespace detail {
// The two implementations behind crc32c(), exposed for tests and benchmarks.
std::uint32_t crc32c_table(const void* data, std::size_t bytes, std::uint32_t crc);
// Only where crc32c_hardware_available(); the SSE4.2 path with three interleaved streams.
std::uint32_t crc32c_hardware(const void* data, std::size_t bytes, std::uint32_t crc);
bool crc32c_hardware_available();
}  // namespace detail

}  // namespace mpt
