// A Chrome-trace timeline per rank (issue #9, --output.timeline): complete events ("ph": "X")
// in the JSON array format that chrome://tracing and Perfetto open, one process per rank, the
// training thread and the communication thread as its two threads, and a "clock_origin"
// metadata event giving ts 0 on the steady clock (nanoseconds). Spans are buffered and
// written once per logging window; close() ends the array (a killed run leaves it open, which
// both viewers accept).
#pragma once

#include <chrono>
#include <fstream>
#include <string>

namespace mpt::train {

class Timeline {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  enum Thread : int { kTraining = 0, kCommunication = 1 };

  // Opens PATH for RANK; times count from ORIGIN. UserError naming --output.timeline.
  Timeline(const std::string& path, int rank, TimePoint origin);
  ~Timeline();
  void span(const char* name, Thread thread, TimePoint start, TimePoint end, long long step);
  void flush();  // writes the buffered spans
  void close();  // flushes and ends the JSON array

 private:
  void event(const std::string& json);

  std::string path_;
  std::ofstream file_;
  std::string buffer_;
  int rank_;
  TimePoint origin_;
  bool first_ = true, closed_ = false;
};

}  // namespace mpt::train
