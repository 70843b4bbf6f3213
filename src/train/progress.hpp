// Rank 0's progress bar (issue #9, --output.progress): on a terminal, one line redrawn in place
// with the epoch, step, ETA, loss and samples/s; in a batch log nothing, because the periodic
// step lines are the log. The bar is drawn at most 10 times a second and cleared before any
// other line is printed, so a terminal shows the step lines scrolling above one live bar.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace mpt::train {

// What the bar shows, at one moment.
struct ProgressView {
  std::int64_t step = 0, total_steps = 0;
  std::int64_t epoch = 0, epochs = 0;  // epoch 0-based, shown 1-based
  double loss = -1;                    // the last logged loss; negative: none yet
  double samples_per_s = 0;
  double eta_s = -1;  // negative: unknown
};

// The line, at most WIDTH columns (at least the counters when narrower than the bar needs):
// "epoch 2/8 [########............] step 1234/3750  33%  ETA 2m14s  loss 0.4312  12345 samples/s"
std::string render_progress(const ProgressView& view, int width);

// Columns of the terminal on FILE's descriptor, or 0 when FILE is not a terminal with a size.
// Under Open MPI every rank's stdout is a pseudo-terminal, sized like mpirun's terminal and 0x0
// when mpirun's output goes to a file or pipe: so the size, not isatty(), tells the two apart.
int terminal_columns(std::FILE* file);

class ProgressBar {
 public:
  // off: draws nothing. terminal: draws while OUT is a terminal with a size, as wide as it is at
  // each redraw (a resized window is followed). always: draws anyway, 100 columns where OUT has
  // no size (a log that wants the bar).
  enum class Mode { off, terminal, always };
  ProgressBar(std::FILE* out, Mode mode, std::int64_t total_steps, std::int64_t epochs);
  bool enabled() const { return mode_ != Mode::off; }
  // After STEP (1-based) of EPOCH, with SAMPLES trained in total; redraws if 0.1 s have passed
  // since the last draw (or on the last step).
  void update(std::int64_t step, std::int64_t epoch, std::int64_t samples);
  void set_loss(double loss) { loss_ = loss; }
  // Erases the bar, before a line of other output. Cheap when nothing is drawn.
  void clear();

 private:
  using Clock = std::chrono::steady_clock;
  std::FILE* out_;
  Mode mode_;
  std::int64_t total_steps_, epochs_;
  double loss_ = -1;
  bool drawn_ = false;
  bool started_ = false;
  Clock::time_point start_, last_draw_, rate_since_;
  std::int64_t start_step_ = 0, rate_samples_ = 0;
  double samples_per_s_ = 0;
};

}  // namespace mpt::train
