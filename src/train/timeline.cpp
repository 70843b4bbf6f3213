#include "train/timeline.hpp"

#include <cstdio>

#include "core/error.hpp"

namespace mpt::train {

Timeline::Timeline(const std::string& path, int rank, TimePoint origin)
    : path_(path), rank_(rank), origin_(origin) {
  file_.open(path_, std::ios::trunc);
  MPT_REQUIRE(file_.good(), "cannot write '" + path_ + "' (--output.timeline)",
              "choose a writable --output.dir");
  file_ << "[\n";
  const std::string process = "rank " + std::to_string(rank_);
  char text[256];
  std::snprintf(text, sizeof(text),
                R"({"name":"process_name","ph":"M","pid":%d,"tid":0,"args":{"name":"%s"}})", rank_,
                process.c_str());
  event(text);
  for (const auto& [tid, name] : {std::pair{kTraining, "training"}, {kCommunication, "communication"}}) {
    std::snprintf(text, sizeof(text),
                  R"({"name":"thread_name","ph":"M","pid":%d,"tid":%d,"args":{"name":"%s"}})",
                  rank_, tid, name);
    event(text);
  }
  // Where ts 0 is on the steady clock (CLOCK_MONOTONIC on Linux, shared by the host's
  // processes), so that other records of the run can be put on the same axis (the CUDA
  // emulator's host-wait log, tests/cudaemu/runtime.cpp). Viewers ignore metadata they do not
  // know.
  std::snprintf(text, sizeof(text),
                R"({"name":"clock_origin","ph":"M","pid":%d,"tid":0,"args":{"steady_clock_ns":%lld}})",
                rank_,
                static_cast<long long>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                           origin_.time_since_epoch())
                                           .count()));
  event(text);
  flush();
}

Timeline::~Timeline() {
  if (!closed_ && file_.is_open()) {
    file_ << buffer_;  // no throwing in a destructor: the array stays open, which viewers accept
  }
}

void Timeline::event(const std::string& json) {
  if (!first_) buffer_ += ",\n";
  first_ = false;
  buffer_ += json;
}

void Timeline::span(const char* name, Thread thread, TimePoint start, TimePoint end,
                    long long step) {
  const auto micros = [&](TimePoint t) {
    return std::chrono::duration<double, std::micro>(t - origin_).count();
  };
  char text[256];
  std::snprintf(text, sizeof(text),
                R"({"name":"%s","cat":"step","ph":"X","ts":%.3f,"dur":%.3f,"pid":%d,"tid":%d,"args":{"step":%lld}})",
                name, micros(start), micros(end) - micros(start), rank_, static_cast<int>(thread),
                step);
  event(text);
}

void Timeline::flush() {
  file_ << buffer_;
  file_.flush();
  buffer_.clear();
  MPT_REQUIRE(file_.good(), "cannot write '" + path_ + "' (--output.timeline)",
              "check the free space of --output.dir");
}

void Timeline::close() {
  if (closed_) return;
  flush();
  file_ << "\n]\n";
  file_.flush();
  closed_ = true;
}

}  // namespace mpt::train
