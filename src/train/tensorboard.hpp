// TensorBoard event files (issue #9): scalars in the TFRecord framing that TensorBoard reads,
// written without TensorFlow or protobuf. A record is the length (uint64 LE), its masked
// CRC-32C, the payload, and the payload's masked CRC-32C; each payload is one Event protobuf:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; }
// The first event carries file_version "brain.Event:2", as TensorFlow's writers do.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

namespace mpt::train {

class TensorBoardWriter {
 public:
  // Creates DIR (and parents) and DIR/events.out.tfevents.<seconds>.<host>. UserError naming
  // --output.tensorboard when it cannot.
  explicit TensorBoardWriter(const std::string& dir);

  // One event at STEP with these (tag, value) scalars, flushed: a killed run keeps it.
  void scalars(std::int64_t step, const std::vector<std::pair<std::string, double>>& values);
  const std::string& path() const { return path_; }

  // TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
  static std::uint32_t masked_crc(const std::string& bytes);

 private:
  void record(const std::string& payload);

  std::string path_;
  std::ofstream file_;
};

}  // namespace mpt::train
