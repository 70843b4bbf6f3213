#include "train/tensorboard.hpp"

#include <unistd.h>

#include <bit>
#include <chrono>
#include <cctype>
#include <cstring>
#include <filesystem>

#include "core/crc32c.hpp"
#include "core/error.hpp"

namespace mpt::train {
namespace {

static_assert(std::endian::native == std::endian::little, "TFRecord fields are little-endian");

// Protobuf wire format: field key = number << 3 | wire type (0 varint, 1 fixed64, 2 length-
// delimited, 5 fixed32).
void varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}
void key(std::string& out, int field, int wire_type) {
  varint(out, static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire_type));
}
template <class T>
void raw(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}
void bytes_field(std::string& out, int field, const std::string& value) {
  key(out, field, 2);
  varint(out, value.size());
  out += value;
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// An Event with its wall time and step; BODY appends its remaining fields.
template <class Body>
std::string event(std::int64_t step, Body body) {
  std::string out;
  key(out, 1, 1);
  raw(out, wall_time());
  key(out, 2, 0);
  varint(out, static_cast<std::uint64_t>(step));
  body(out);
  return out;
}

}  // namespace

std::uint32_t TensorBoardWriter::masked_crc(const std::string& bytes) {
  const std::uint32_t crc = crc32c(bytes.data(), bytes.size());
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  MPT_REQUIRE(!error, "cannot create '" + dir + "' for --output.tensorboard: " + error.message(),
              "choose a writable --output.dir");
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  // The name is TensorBoard's convention; the host part keeps to [A-Za-z0-9_-] (others become
  // '_') so that no name can leave DIR through a '/' or "..", however unlikely from a host name.
  std::string host_part = host;
  for (char& c : host_part)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '_';
  path_ = dir + "/events.out.tfevents." +
          std::to_string(static_cast<std::int64_t>(wall_time())) + "." + host_part;
  file_.open(path_, std::ios::binary | std::ios::trunc);
  MPT_REQUIRE(file_.good(), "cannot write '" + path_ + "' (--output.tensorboard)",
              "choose a writable --output.dir");
  record(event(0, [](std::string& out) { bytes_field(out, 3, "brain.Event:2"); }));
}

void TensorBoardWriter::scalars(std::int64_t step,
                                const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string entry;
    bytes_field(entry, 1, tag);
    key(entry, 2, 5);
    raw(entry, static_cast<float>(value));
    bytes_field(summary, 1, entry);
  }
  record(event(step, [&](std::string& out) { bytes_field(out, 5, summary); }));
}

void TensorBoardWriter::record(const std::string& payload) {
  std::string header;
  raw(header, static_cast<std::uint64_t>(payload.size()));
  std::string framed = header;
  raw(framed, masked_crc(header));
  framed += payload;
  raw(framed, masked_crc(payload));
  file_.write(framed.data(), static_cast<std::streamsize>(framed.size()));
  file_.flush();
  MPT_REQUIRE(file_.good(), "cannot write '" + path_ + "' (--output.tensorboard)",
              "check the free space of --output.dir");
}

}  // namespace mpt::train
