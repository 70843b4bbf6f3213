// Step reports read back a fixed number of steps late (see step_reports.hpp).
#include "train/step_reports.hpp"

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.hpp"

namespace mpt::train {

StepReports::StepReports(const Tensor& state, int lag)
    : state_(state), lag_(lag), steps_(static_cast<std::size_t>(lag) + 1, 0) {
  if (lag < 0) abort_job("StepReports: the lag must be >= 0");
  for (int i = 0; i <= lag; ++i)
    slots_.push_back(
        std::make_unique<device_memory::Readback>(sizeof(kernels::StepState), state.device()));
}

void StepReports::record(std::int64_t step) {
  if (count_ == slots_.size()) abort_job("StepReports: a report was recorded before the oldest was taken");
  const std::size_t slot = (head_ + count_) % slots_.size();
  slots_[slot]->start(state_.raw(), state_.device());
  steps_[slot] = step;
  ++count_;
}

std::optional<StepReport> StepReports::next(bool drain) {
  if (count_ == 0 || (!drain && count_ <= static_cast<std::size_t>(lag_))) return std::nullopt;
  StepReport report;
  report.step = steps_[head_];
  std::memcpy(&report.state, slots_[head_]->wait(), sizeof report.state);
  head_ = (head_ + 1) % slots_.size();
  --count_;
  return report;
}

int report_lag(Device device) {
  const char* text = std::getenv("MPTRAIN_REPORT_LAG");
  if (!text || !*text) return device == Device::cpu ? 0 : 1;
  char* end = nullptr;
  const long lag = std::strtol(text, &end, 10);
  MPT_REQUIRE(*end == '\0' && lag >= 0 && lag <= 8,
              std::string("MPTRAIN_REPORT_LAG is '") + text + "', but must be an integer from 0 to 8",
              "unset it: the trainer picks 1 on cuda and 0 on the host");
  return static_cast<int>(lag);
}

}  // namespace mpt::train
