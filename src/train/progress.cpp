// The progress bar (see progress.hpp).
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "train/progress.hpp"

namespace mpt::train {
namespace {

std::string format_eta(double seconds) {
  if (seconds < 0 || !std::isfinite(seconds)) return "--";
  const auto s = static_cast<long long>(std::llround(seconds));
  char text[32];
  if (s >= 3600)
    std::snprintf(text, sizeof text, "%lldh%02lldm", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    std::snprintf(text, sizeof text, "%lldm%02llds", s / 60, s % 60);
  else
    std::snprintf(text, sizeof text, "%llds", s);
  return text;
}

}  // namespace

std::string render_progress(const ProgressView& view, int width) {
  const double fraction =
      view.total_steps > 0
          ? std::clamp(static_cast<double>(view.step) / static_cast<double>(view.total_steps), 0.0,
                       1.0)
          : 0.0;
  char head[64], tail[160];
  std::snprintf(head, sizeof head, "epoch %lld/%lld ", static_cast<long long>(view.epoch + 1),
                static_cast<long long>(view.epochs));
  char loss[32] = "-";
  if (view.loss >= 0) std::snprintf(loss, sizeof loss, "%.4f", view.loss);
  std::snprintf(tail, sizeof tail, " step %lld/%lld %3d%%  ETA %s  loss %s  %.0f samples/s",
                static_cast<long long>(view.step), static_cast<long long>(view.total_steps),
                static_cast<int>(100 * fraction), format_eta(view.eta_s).c_str(), loss,
                view.samples_per_s);
  // The bar takes what the counters leave, between 10 and 30 columns; none when too narrow.
  const int room =
      width - static_cast<int>(std::string(head).size() + std::string(tail).size()) - 2;
  std::string line = head;
  if (room >= 10) {
    const int cells = std::min(room, 30);
    const int full = static_cast<int>(fraction * cells);
    line += '[';
    line.append(static_cast<std::size_t>(full), '#');
    line.append(static_cast<std::size_t>(cells - full), '.');
    line += ']';
  }
  line += tail;
  if (static_cast<int>(line.size()) > width)
    line.resize(static_cast<std::size_t>(std::max(width, 0)));
  return line;
}

int terminal_columns(std::FILE* file) {
  const int fd = fileno(file);
  if (fd < 0 || !isatty(fd)) return 0;
  winsize size{};
  if (ioctl(fd, TIOCGWINSZ, &size) != 0) return 0;
  return size.ws_col;
}

ProgressBar::ProgressBar(std::FILE* out, Mode mode, std::int64_t total_steps, std::int64_t epochs)
    : out_(out), mode_(mode), total_steps_(total_steps), epochs_(epochs) {}

void ProgressBar::update(std::int64_t step, std::int64_t epoch, std::int64_t samples) {
  if (!enabled()) return;
  const auto now = Clock::now();
  if (!started_) {  // rates count from the first step on: setup is not training
    started_ = true;
    start_ = rate_since_ = now;
    start_step_ = step;
    rate_samples_ = samples;
    return;
  }
  const bool last = step >= total_steps_;
  if (!last && now - last_draw_ < std::chrono::milliseconds(100)) return;
  int width = terminal_columns(out_);  // an ioctl per redraw, at most 10 a second
  if (width == 0 && mode_ == Mode::always) width = 100;
  if (width == 0) return;
  // samples/s over the last second or so; the ETA from the whole run's pace so far.
  const double since = std::chrono::duration<double>(now - rate_since_).count();
  if (since >= 1.0 || samples_per_s_ == 0) {
    if (since > 0) samples_per_s_ = static_cast<double>(samples - rate_samples_) / since;
    rate_since_ = now;
    rate_samples_ = samples;
  }
  ProgressView view;
  view.step = step;
  view.total_steps = total_steps_;
  view.epoch = epoch;
  view.epochs = epochs_;
  view.loss = loss_;
  view.samples_per_s = samples_per_s_;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (step > start_step_)
    view.eta_s = elapsed / static_cast<double>(step - start_step_) *
                 static_cast<double>(total_steps_ - step);
  // Carriage return, the line, erase to the end: one line, rewritten in place.
  std::fprintf(out_, "\r%s\033[K", render_progress(view, width - 1).c_str());
  std::fflush(out_);
  drawn_ = true;
  last_draw_ = now;
}

void ProgressBar::clear() {
  if (!drawn_) return;
  std::fputs("\r\033[K", out_);
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace mpt::train
