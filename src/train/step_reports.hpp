// The training step's state (kernels::StepState) read back by the host a fixed number of steps
// late. The step's decisions are kernels over that state (kernels/step_state.hpp), so the
// device never waits for the host; the host learns a step's verdict (skipped or not, the loss
// scale, the loss and the learning rate) LAG steps later. On cuda the lag is 1: the device runs
// step t+1 while the host waits for step t's copy. On the host it is 0 (the state is host
// memory). MPTRAIN_REPORT_LAG overrides it, so that the CPU tests run the cuda pipeline.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/device_memory.hpp"
#include "core/tensor.hpp"
#include "kernels/step_state.hpp"

namespace mpt::train {

struct StepReport {
  std::int64_t step = 0;  // 1-based, as the step lines print it
  kernels::StepState state;
};

class StepReports {
 public:
  // STATE: the StepState tensor the step's kernels update; LAG >= 0.
  StepReports(const Tensor& state, int lag);
  int lag() const { return lag_; }
  // After the step's last kernel: queues a copy of the state as STEP's report.
  void record(std::int64_t step);
  // The oldest queued report once more than lag() are queued, or any with DRAIN; in step order.
  std::optional<StepReport> next(bool drain);

 private:
  Tensor state_;
  int lag_;
  std::vector<std::unique_ptr<device_memory::Readback>> slots_;  // lag + 1, a ring
  std::vector<std::int64_t> steps_;
  std::size_t head_ = 0, count_ = 0;
};

// The lag for a state on DEVICE: MPTRAIN_REPORT_LAG (0 to 8) when set, else 1 on cuda and 0 on
// the host. Throws UserError naming the variable for any other value.
int report_lag(Device device);

}  // namespace mpt::train
