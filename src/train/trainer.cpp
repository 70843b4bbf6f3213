// The data-parallel training loop: every rank reads its shard, runs forward and backward on
// planned buffers, and the ranks average gradients before an identical optimizer step.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "amp/amp.hpp"
#include "ckpt/ckpt.hpp"
#include "comm/gradient_reducer.hpp"
#include "comm/topology.hpp"
#include "comm/watchdog.hpp"
#include "core/build_info.hpp"
#include "core/device_memory.hpp"
#include "core/error.hpp"
#include "core/json.hpp"
#include "core/profile.hpp"
#include "data/data.hpp"
#include "export/export.hpp"
#include "kernels/add.hpp"
#include "kernels/cast.hpp"
#include "kernels/copy.hpp"
#include "kernels/graph.hpp"
#include "kernels/matmul.hpp"
#include "kernels/normalize.hpp"
#include "kernels/softmax_xent.hpp"
#include "kernels/staging.hpp"
#include "kernels/step_state.hpp"
#include "nn/conv2d.hpp"
#include "nn/nn.hpp"
#include "optim/optim.hpp"
#include "train/checkpointing.hpp"
#include "train/evaluate.hpp"
#include "train/output_files.hpp"
#include "train/progress.hpp"
#include "train/step_reports.hpp"
#include "train/tensorboard.hpp"
#include "train/timeline.hpp"
#include "train/train.hpp"

namespace mpt::train {
namespace {

// The path the model's top-level conv layers took (a ResBlock's own convs follow them):
// "cudnn", "onednn" or "im2col", "mixed" where they differ, "none" without a conv layer
// (summary.json conv_path).
std::string conv_path(const nn::Model& model) {
  std::string path = "none";
  for (const auto& layer : model.layers())
    if (const auto* conv = dynamic_cast<const nn::Conv2d*>(layer.get())) {
      const std::string mine = conv->uses_cudnn() ? "cudnn" : conv->uses_dnnl() ? "onednn" : "im2col";
      path = path == "none" || path == mine ? mine : "mixed";
    }
  return path;
}

using Clock = std::chrono::steady_clock;

// Room kept free in the device arena before step 1 for the kernels' first-use buffers: cuBLASLt's
// 32 MiB workspace and the small ones beside it (the reductions' slots, the bias partial rows).
constexpr std::size_t kFirstUseDeviceScratchBytes = std::size_t{48} << 20;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Creates DIR (and parents); a failure is a user error naming OPTION.
void ensure_directory(const std::string& dir, const std::string& option) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  MPT_REQUIRE(!error, "cannot create directory '" + dir + "' for " + option + ": " + error.message(),
              "choose a writable path with " + option + "=DIR");
}

data::ReaderOptions reader_options(const DataConfig& config, const std::string& option) {
  return reader_options_for(config, option);  // shared with evaluation (evaluate.cpp)
}

DType precision_dtype(const PrecisionConfig& amp) {
  return amp.precision == "fp16" ? DType::f16 : amp.precision == "bf16" ? DType::bf16 : DType::f32;
}

// Loss scaling is on by default only for fp16, whose range needs it; bf16 has fp32's range.
amp::LossScalerOptions scaler_options(const PrecisionConfig& amp) {
  amp::LossScalerOptions options = amp.scaler;
  options.enabled = amp.loss_scaling == "on" ||
                    (amp.loss_scaling == "auto" && (amp.precision == "fp16" || options.static_scale > 0));
  return options;
}

// Writes one NaN into GRADS. Summed by the all-reduce, it reaches every rank, whose
// unscale-and-check then skips the step: a local decision becomes a global one without an
// extra collective.
void poison(Tensor& grads) {
  if (grads.numel() == 0) return;
  // The first element's NaN, written in place, or copied over for device gradients (the nccl
  // all-reduce reduces them where they are).
  const float f32_nan = std::nanf("");
  const std::uint16_t f16_nan = 0x7e00u, bf16_nan = 0x7fc0u;
  const void* nan = nullptr;
  switch (grads.dtype()) {
    case DType::f32: nan = &f32_nan; break;
    case DType::f16: nan = &f16_nan; break;
    case DType::bf16: nan = &bf16_nan; break;
    default: abort_job("Trainer: gradients must be f32, f16 or bf16");
  }
  device_memory::copy(grads.raw(), grads.device(), nan, Device::cpu, dtype_size(grads.dtype()));
}

// A parsed MPTRAIN_FAULT: which rank gets which fault at which step.
struct Fault {
  std::string kind;
  int rank = -1;
  std::int64_t step = -1;
};

Fault parse_fault(const std::string& text) {
  Fault fault;
  if (text.empty()) return fault;
  const auto first = text.find(':'), second = text.find(':', first == std::string::npos ? first : first + 1);
  bool ok = first != std::string::npos && second != std::string::npos;
  if (ok) {
    fault.kind = text.substr(0, first);
    try {
      fault.rank = std::stoi(text.substr(first + 1, second - first - 1));
      fault.step = std::stoll(text.substr(second + 1));
    } catch (const std::exception&) {
      ok = false;
    }
  }
  const bool known = fault.kind == "nan-grad" || fault.kind == "comm-error" ||
                     fault.kind == "comm-crash" || fault.kind == "stop-signal" ||
                     fault.kind == "slow-rank" || fault.kind == "stall" ||
                     fault.kind == "slow-checkpoint" || fault.kind == "exit" ||
                     fault.kind == "abort" || fault.kind == "io-error";
  MPT_REQUIRE(ok && known && fault.rank >= 0 && fault.step >= 1,
              "MPTRAIN_FAULT='" + text + "' is not KIND:RANK:STEP with KIND nan-grad, comm-error, "
              "comm-crash, stop-signal, stall, exit, abort or io-error, or KIND:RANK:MS with KIND slow-rank "
              "or slow-checkpoint",
              "unset MPTRAIN_FAULT; it is a test hook (docs/testing.md)");
  return fault;
}

// Gradient accumulation (--train.accumulate=K): an epoch's batches form optimizer steps of K
// micro-batches each, the last step of an epoch taking what is left. `step` and
// --train.max-steps count optimizer steps (as a PyTorch loop that steps every K batches).
std::int64_t optimizer_steps_per_epoch(std::int64_t batches_per_epoch, std::int64_t accumulate) {
  return (batches_per_epoch + accumulate - 1) / accumulate;
}

// MPTRAIN_FAULT=io-error:RANK:STEP: RANK's reader fails on the first batch of step STEP (1-based)
// the way a failed pread() does, on its I/O thread; the error reaches the trainer at next().
std::function<void(std::int64_t, std::int64_t)> io_fault(const Fault& fault, int rank,
                                                         const data::ShardPlan& plan,
                                                         const RunConfig& config) {
  if (fault.kind != "io-error" || fault.rank != rank) return {};
  const std::int64_t per_epoch =
      optimizer_steps_per_epoch(plan.steps_per_epoch(), config.loop.accumulate);
  const std::int64_t epoch = (fault.step - 1) / per_epoch;
  const std::int64_t batch = ((fault.step - 1) % per_epoch) * config.loop.accumulate;
  const std::string path = config.data.train_path;
  const std::int64_t step = fault.step;
  return [=](std::int64_t read_epoch, std::int64_t read_batch) {
    if (read_epoch == epoch && read_batch == batch)
      throw_user_error("cannot read the samples of step " + std::to_string(step) + " from '" +
                           path + "': Input/output error (injected by MPTRAIN_FAULT=io-error)",
                       "check the file system; MPTRAIN_FAULT is a test hook (docs/testing.md)");
  };
}

// The micro-batches (prefetcher batches) that the first STEPS optimizer steps read.
std::int64_t batches_for_steps(std::int64_t steps, std::int64_t batches_per_epoch,
                               std::int64_t accumulate) {
  const std::int64_t per_epoch = optimizer_steps_per_epoch(batches_per_epoch, accumulate);
  return steps / per_epoch * batches_per_epoch +
         std::min(steps % per_epoch * accumulate, batches_per_epoch);
}

optim::AdamwOptions adamw_options(const OptimizerConfig& config) {
  optim::AdamwOptions options;
  options.lr = static_cast<float>(config.lr);
  options.beta1 = static_cast<float>(config.beta1);
  options.beta2 = static_cast<float>(config.beta2);
  options.eps = static_cast<float>(config.eps);
  options.weight_decay = static_cast<float>(config.weight_decay);
  return options;
}

// AdamW's decay mask over the flat FP32 masters, from the model's parameter names. Norm layers'
// scales and shifts would join the undecayed set here by name when they exist.
Tensor decay_mask(nn::Model& model, bool decay_biases) {
  const auto* base = static_cast<const float*>(model.master_params().raw());
  std::vector<optim::ParamRange> ranges;
  for (const auto& param : model.named_params()) {
    // NamedParam values are contiguous views of the flat master buffer.
    if (param.value.dtype() != DType::f32)
      abort_job("Trainer: parameter " + param.name + " is not a view of the FP32 masters");
    ranges.push_back({param.name, static_cast<const float*>(param.value.raw()) - base,
                      param.value.numel()});
  }
  Tensor mask = optim::decay_mask(model.master_params().numel(), ranges, decay_biases);
  // Made on the host; AdamW reads it beside the masters, on the model's device.
  return mask.defined() && model.device() != Device::cpu ? mask.to(model.device()) : mask;
}

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", seconds);
  return text;
}

ProgressBar::Mode progress_mode(const std::string& option) {
  if (option == "lines") return ProgressBar::Mode::off;
  return option == "bar" ? ProgressBar::Mode::always : ProgressBar::Mode::terminal;
}

void validate(const RunConfig& config) {
  MPT_REQUIRE(!config.data.train_path.empty(), "no training data given (--data.train)",
              "set [data] train = PATH in the config or pass --data.train=PATH");
  MPT_REQUIRE(config.loop.batch_size > 0,
              "--train.batch-size must be positive, got " + std::to_string(config.loop.batch_size),
              "the batch size is per rank, e.g. --train.batch-size=64");
  MPT_REQUIRE(config.loop.epochs > 0, "--train.epochs must be positive", "e.g. --train.epochs=2");
  MPT_REQUIRE(config.loop.max_steps >= 0, "--train.max-steps must be >= 0",
              "0 means no limit besides --train.epochs");
  MPT_REQUIRE(config.loop.log_every > 0, "--train.log-every must be positive", "e.g. 50");
  MPT_REQUIRE(config.device == "auto" || config.device == "cpu" || config.device == "cuda",
              "unknown device '" + config.device + "' (--device)", "use --device=auto, cpu or cuda");
  comm::overlap_buckets(config.comm, false);  // a bad --comm.overlap fails here, before any work
  MPT_REQUIRE(config.loop.accumulate >= 1, "--train.accumulate must be >= 1",
              "1 updates after every batch; K averages K micro-batches per update");
  MPT_REQUIRE(config.progress == "auto" || config.progress == "bar" || config.progress == "lines",
              "--output.progress: unknown value '" + config.progress + "'",
              "use auto (a bar on a terminal, lines otherwise), bar or lines");
  MPT_REQUIRE(config.comm.stall_timeout_s >= 0 && std::isfinite(config.comm.stall_timeout_s),
              "--comm.stall-timeout must be a number of seconds >= 0",
              "e.g. --comm.stall-timeout=300 (0: no watchdog)");
  MPT_REQUIRE(config.comm.ranks_per_node >= 0, "--comm.ranks-per-node must be >= 0",
              "0 uses the nodes MPI reports; K groups K consecutive ranks");
  const auto& buckets = config.comm;
  MPT_REQUIRE(buckets.bucket_mb >= 0 && buckets.first_bucket_mb >= 0 &&
                  std::isfinite(buckets.bucket_mb) && std::isfinite(buckets.first_bucket_mb),
              "--comm.bucket-mb and --comm.first-bucket-mb must be >= 0",
              "e.g. --comm.bucket-mb=25 (0: one bucket after backward)");
  MPT_REQUIRE(config.optimizer.name == "sgd" || config.optimizer.name == "adamw",
              "unknown optimizer '" + config.optimizer.name + "' (--optimizer.name)",
              "use sgd or adamw");
  MPT_REQUIRE(config.optimizer.lr > 0 && std::isfinite(config.optimizer.lr),
              "--optimizer.lr must be a positive number", "e.g. --optimizer.lr=0.05");
  MPT_REQUIRE(config.optimizer.momentum >= 0 && config.optimizer.momentum < 1,
              "--optimizer.momentum must be in [0, 1)", "e.g. --optimizer.momentum=0.9");
  MPT_REQUIRE(config.optimizer.weight_decay >= 0, "--optimizer.weight-decay must be >= 0",
              "e.g. --optimizer.weight-decay=5e-4");
  MPT_REQUIRE(std::isfinite(config.optimizer.clip_norm) && config.optimizer.clip_norm >= 0,
              "--optimizer.clip-norm must be >= 0",
              "0 turns clipping off; e.g. --optimizer.clip-norm=1");
  MPT_REQUIRE(config.data.chunk_cache_mb >= 0, "--data.chunk-cache-mb must be >= 0", "e.g. 64");
  const auto& amp = config.amp;
  MPT_REQUIRE(amp.precision == "fp32" || amp.precision == "fp16" || amp.precision == "bf16",
              "unknown --train.precision '" + amp.precision + "'", "use fp32, fp16 or bf16");
  MPT_REQUIRE(amp.loss_scaling == "auto" || amp.loss_scaling == "on" || amp.loss_scaling == "off",
              "unknown --amp.loss-scaling '" + amp.loss_scaling + "'", "use auto, on or off");
  MPT_REQUIRE(amp.on_nonfinite_loss == "error" || amp.on_nonfinite_loss == "skip",
              "unknown --amp.on-nonfinite-loss '" + amp.on_nonfinite_loss + "'", "use error or skip");
  const auto& checkpoint = config.checkpoint;
  MPT_REQUIRE(checkpoint.keep >= 1, "--checkpoint.keep must be >= 1",
              "the newest checkpoint is always kept; e.g. --checkpoint.keep=3");
  MPT_REQUIRE(checkpoint.every_steps >= 0 && checkpoint.keep_every >= 0 && checkpoint.debug_pause_ms >= 0,
              "--checkpoint.every-steps, --checkpoint.keep-every and --checkpoint.debug-pause-ms must be >= 0",
              "0 turns each off");
  MPT_REQUIRE(std::isfinite(checkpoint.every_minutes) && checkpoint.every_minutes >= 0,
              "--checkpoint.every-minutes must be >= 0", "0 turns it off; e.g. --checkpoint.every-minutes=30");
  const bool periodic = checkpoint.every_steps > 0 || checkpoint.every_minutes > 0 || checkpoint.async;
  MPT_REQUIRE(!periodic || !checkpoint.dir.empty(),
              "--checkpoint.every-steps, --checkpoint.every-minutes and --checkpoint.async need --checkpoint.dir",
              "e.g. --checkpoint.dir=runs/ckpt");
  MPT_REQUIRE(checkpoint.resume != "auto" || !checkpoint.dir.empty(),
              "--resume=auto needs --checkpoint.dir (the directory it resumes from)",
              "pass --checkpoint.dir=DIR, or --resume=PATH of a checkpoint file");
  MPT_REQUIRE(!checkpoint.resume.empty(), "--resume is empty", "use none, auto or the path of a checkpoint");
  MPT_REQUIRE(!config.timeline || !config.output_dir.empty(),
              "--output.timeline needs --output.dir (the timelines go to output.dir/timeline-rank<R>.json)",
              "pass --output.dir=DIR");
  MPT_REQUIRE(!config.tensorboard || !config.output_dir.empty(),
              "--output.tensorboard needs --output.dir (the event files go to output.dir/tensorboard)",
              "pass --output.dir=DIR");
  MPT_REQUIRE(config.loop.time_limit_s == 0 || config.loop.time_limit_s > config.loop.stop_margin_s,
              "--train.time-limit (" + seconds_text(config.loop.time_limit_s) +
                  ") is not longer than --train.stop-margin (" +
                  seconds_text(config.loop.stop_margin_s) + ")",
              "give a longer limit or a shorter margin, e.g. --train.stop-margin=00:00:30");
}

// SLURM_JOB_END_TIME (seconds since the epoch), when set: the job's end as seen now, in
// seconds from now. nullopt: not under Slurm. UserError for a value that is not a number.
std::optional<double> slurm_seconds_left() {
  const char* text = std::getenv("SLURM_JOB_END_TIME");
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const double end_time = std::strtod(text, &end);
  MPT_REQUIRE(end != text && *end == '\0' && std::isfinite(end_time),
              std::string("SLURM_JOB_END_TIME='") + text + "' is not a time in seconds since the epoch",
              "unset it, or let Slurm set it");
  const double now = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
  return end_time - now;
}

// Appends one JSON object per line to metrics.jsonl; only rank 0 holds an open file. APPEND: a
// run that continues from a checkpoint adds to its run's file (claim_run_directories decided).
class MetricsLog {
 public:
  void open(const std::string& dir, bool append) {
    path_ = dir + "/metrics.jsonl";
    require_not_symlink(path_, "--output.dir");
    file_.open(path_, append ? std::ios::app : std::ios::trunc);
    MPT_REQUIRE(file_.good(), "cannot write '" + path_ + "' (--output.dir)",
                "choose a writable directory with --output.dir=DIR");
  }
  void write(const JsonObject& record) {
    if (!file_.is_open()) return;
    file_ << record.str() << '\n';
    file_.flush();  // a killed run keeps every line written so far
  }

 private:
  std::string path_;
  std::ofstream file_;
};

void write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::error_code ignored;
  std::filesystem::remove(tmp, ignored);  // debris of a killed run, or a link: never written to
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text << '\n';
    MPT_REQUIRE(out.good(), "cannot write '" + path + "'", "check free space and permissions");
  }
  std::filesystem::rename(tmp, path);
}

// The training set's input pipeline: readers for the extra I/O threads (a reader owns scratch
// buffers, so each thread needs its own), the optional sample cache and the prefetcher. Members
// are destroyed last to first, so the prefetcher's threads are joined before what they use goes.
struct InputPipeline {
  std::vector<std::unique_ptr<data::DatasetReader>> extra_readers;
  std::optional<data::SampleCache> cache;
  std::optional<data::Prefetcher> prefetcher;

  // Setup (no collective call): checks the [data] pipeline options and plans every buffer.
  // OPEN_READER opens one more reader of the training set, as the trainer opened TRAIN_READER.
  void plan(const DataConfig& config, const comm::World& world, data::DatasetReader& train_reader,
            const std::function<std::unique_ptr<data::DatasetReader>()>& open_reader,
            const data::ShardPlan& shard_plan,
            std::function<void(std::int64_t epoch, std::int64_t step)> before_read) {
    data::PrefetchOptions options;
    options.before_read = std::move(before_read);
    options.depth = config.prefetch;
    options.io_threads = config.io_threads;
    options.read_delay_ms = config.debug_read_delay_ms;
    data::Prefetcher::validate(options);
    MPT_REQUIRE(config.normalize == "auto" || config.normalize == "reader" ||
                    config.normalize == "device",
                "--data.normalize: unknown value '" + config.normalize + "'",
                "use auto (device on cuda, reader on the cpu), reader or device");
    MPT_REQUIRE(config.cache == "none" || config.cache == "memory",
                "unknown --data.cache '" + config.cache + "'",
                "use --data.cache=none (read the file every epoch) or --data.cache=memory");
    MPT_REQUIRE(config.cache_limit_mb >= 0, "--data.cache-limit-mb must be >= 0",
                "0 means: the node's available memory divided by its ranks");
    std::vector<data::DatasetReader*> readers{&train_reader};
    for (int thread = 1; config.prefetch > 0 && thread < config.io_threads; ++thread) {
      extra_readers.push_back(open_reader());
      readers.push_back(extra_readers.back().get());
    }
    if (config.cache == "memory") {
      const bool explicit_limit = config.cache_limit_mb > 0;
      const std::size_t limit = explicit_limit
                                    ? static_cast<std::size_t>(config.cache_limit_mb) << 20
                                    : data::available_memory_per_rank(world.local_size());
      const std::string limit_text =
          explicit_limit ? std::string("--data.cache-limit-mb")
                         : "the memory available per rank (MemAvailable / " +
                               std::to_string(world.local_size()) + " rank(s) on this node)";
      const auto& info = train_reader.info();
      cache.emplace(info.num_samples, train_reader.staged_sample_bytes(), limit, limit_text,
                    info.path);
      for (auto* reader : readers) reader->set_cache(&*cache);
    }
    prefetcher.emplace(std::move(readers), shard_plan, options);
  }
};


// ---- step-time breakdown ------------------------------------------------------------------------

// What each rank sends rank 0 per logging window, in this order.
// The last two are the soak instrumentation (issue #11): the rank's resident set and open
// file descriptors at the window's end, in the same gather.
enum BreakdownField : int {
  kWindowSeconds, kDataWait, kForward, kBackward, kComm, kExposed, kOptimizer, kCheckpoint,
  kResidentMb, kOpenFds, kPeerWait, kBreakdownFields
};

struct WindowBreakdown {
  double max[kBreakdownFields] = {};  // each part's maximum over the ranks
  double max_other = 0;       // the largest part of a rank's window outside the parts
  double min_accounted = 1;   // the smallest share of a rank's window that the parts explain
  int straggler = -1;         // a rank busy > 1.2x the median rank, -1 if none
  double straggler_busy = 0, median_busy = 0;
};

// GATHERED: kBreakdownFields values per rank. A rank's busy time is what it spent on its own
// work (data wait, forward, backward, optimizer): the others then wait for it in the exposed
// all-reduce, so busy time, not the window, shows who holds the job back.
WindowBreakdown summarize_breakdown(const std::vector<double>& gathered, int ranks) {
  WindowBreakdown result;
  std::vector<double> busy(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const double* v = gathered.data() + static_cast<std::size_t>(r) * kBreakdownFields;
    for (int f = 0; f < kBreakdownFields; ++f) result.max[f] = std::max(result.max[f], v[f]);
    const double parts = v[kDataWait] + v[kForward] + v[kBackward] + v[kExposed] +
                         v[kOptimizer] + v[kCheckpoint];
    result.max_other = std::max(result.max_other, v[kWindowSeconds] - parts);
    if (v[kWindowSeconds] > 0)
      result.min_accounted = std::min(result.min_accounted, parts / v[kWindowSeconds]);
    busy[static_cast<std::size_t>(r)] = v[kDataWait] + v[kForward] + v[kBackward] + v[kOptimizer];
  }
  std::vector<double> sorted = busy;
  std::sort(sorted.begin(), sorted.end());
  result.median_busy = sorted[(sorted.size() - 1) / 2];  // the lower one: 2 ranks compare
  if (ranks > 1 && result.median_busy > 0) {
    const auto slowest = std::max_element(busy.begin(), busy.end());
    if (*slowest > 1.2 * result.median_busy) {
      result.straggler = static_cast<int>(slowest - busy.begin());
      result.straggler_busy = *slowest;
    }
  }
  return result;
}

// ---- soak instrumentation ----------------------------------------------------------------------

// This process's resident set in MiB (VmRSS of /proc/self/status); -1 where /proc lacks it. Read
// once per logging window, never in a step.
double resident_set_mb() {
  std::FILE* status = std::fopen("/proc/self/status", "r");
  if (status == nullptr) return -1;
  char line[256];
  double kilobytes = -1;
  while (std::fgets(line, sizeof(line), status) != nullptr)
    if (std::strncmp(line, "VmRSS:", 6) == 0) {
      kilobytes = std::strtod(line + 6, nullptr);
      break;
    }
  std::fclose(status);
  return kilobytes < 0 ? -1 : kilobytes / 1024;
}

// This process's open file descriptors (the entries of /proc/self/fd, less the one that lists
// them); -1 where /proc lacks it.
double open_file_descriptors() {
  DIR* fds = ::opendir("/proc/self/fd");
  if (fds == nullptr) return -1;
  int count = 0;
  while (const dirent* entry = ::readdir(fds))
    if (entry->d_name[0] != '.') ++count;
  ::closedir(fds);
  return count - 1;
}

// Rank 0's record of every rank's resident set and descriptors over the run's windows, for
// metrics.jsonl (each window) and summary.json (first, last and largest per rank).
struct ResourceTrack {
  std::vector<double> rss_first, rss_last, rss_max, fds_first, fds_last, fds_max;

  void add(const std::vector<double>& gathered, int ranks) {
    const bool first = rss_first.empty();
    for (int r = 0; r < ranks; ++r) {
      const double* v = gathered.data() + static_cast<std::size_t>(r) * kBreakdownFields;
      if (first) {
        rss_first.push_back(v[kResidentMb]);
        fds_first.push_back(v[kOpenFds]);
        rss_max.push_back(v[kResidentMb]);
        fds_max.push_back(v[kOpenFds]);
        rss_last.push_back(0);
        fds_last.push_back(0);
      }
      const auto i = static_cast<std::size_t>(r);
      rss_last[i] = v[kResidentMb];
      fds_last[i] = v[kOpenFds];
      rss_max[i] = std::max(rss_max[i], v[kResidentMb]);
      fds_max[i] = std::max(fds_max[i], v[kOpenFds]);
    }
  }
};

// A JSON array of VALUES: MiB with one decimal, or whole counts.
std::string json_array(const std::vector<double>& values, bool counts) {
  std::string text = "[";
  char number[32];
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::snprintf(number, sizeof(number), counts ? "%.0f" : "%.1f", values[i]);
    text += (i > 0 ? ", " : "") + std::string(number);
  }
  return text + "]";
}

// ---- checkpoints -------------------------------------------------------------------------------

// OUT := LIVE's tensors: the very tensors (views), or with COPY host copies, reusing OUT's own
// buffers where a name and shape match (a recycled snapshot) and allocating the rest.
void take_tensors(const std::vector<ckpt::NamedTensor>& live, bool copy,
                  std::vector<ckpt::NamedTensor>& out) {
  if (!copy) {
    out = live;
    return;
  }
  out.resize(live.size());
  for (std::size_t i = 0; i < live.size(); ++i) {
    ckpt::NamedTensor& target = out[i];
    const Tensor& source = live[i].value;
    target.name = live[i].name;
    if (target.value.defined() && target.value.shape() == source.shape() &&
        target.value.dtype() == source.dtype()) {
      kernels::copy(source, target.value);  // from the host or the cuda device
    } else {
      target.value = source.to(Device::cpu);
    }
  }
}

// ---- resume ------------------------------------------------------------------------------------

// What rank 0 broadcasts about the checkpoint it resumes from (int64 fields, the loss scale's
// bits included), so that every rank sets up the same cursor before any tensor moves.
enum ResumeField : int {
  kPresent, kHasState, kStep, kEpoch, kEpochStep, kEpochSamples, kMicroStep, kOptimizerSteps,
  kGrowthTracker, kHysteresisTracker, kSkippedSteps, kBatchPerRank, kAccumulate, kWorldSize,
  kLossScaleBits, kSamePrecision, kScheduleSteps, kResumeFields
};

// Where this run continues, in its own shape (world size, batch, accumulation).
struct ResumePoint {
  bool from_checkpoint = false;
  bool has_state = false;       // false: weights only (a format-1 checkpoint)
  bool same_shape = true;       // written by a run of this world size, batch and accumulation
  bool same_precision = true;   // the loss scaler's state applies only then
  std::int64_t checkpoint_step = 0;
  std::int64_t step = 0, epoch = 0, epoch_step = 0, epoch_samples = 0, micro_step = 0;
  std::int64_t optimizer_steps = 0;
  std::int64_t schedule_steps = 0;  // the LR schedule's position in this run's steps
  double loss_scale = 1;
  std::int64_t scaler_growth_tracker = 0, scaler_hysteresis_tracker = 1, scaler_skipped_steps = 0;
  std::int64_t written_world_size = 0, written_batch = 0, written_accumulate = 0;
};

// The gradients in the node's shared-memory window, where the hierarchical shm all-reduce sums
// straight out of the peers' buffers (one copy pass a step fewer; docs/architecture.md,
// "Registered gradients"). Collective over the node. Null, and the gradients stay where they
// are, for every other algorithm, a node of one rank, a 16-bit wire under f32 gradients (the
// copy-in converts anyway), or when /dev/shm lacks the room (said by the node's first rank:
// nodes decide one by one).
std::shared_ptr<comm::SharedBuffer> share_gradients(nn::Model& model, const comm::Topology& topology,
                                                    const comm::AllreduceConfig& allreduce) {
  Tensor& grads = model.grads();
  if (allreduce.algorithm != comm::Algorithm::hierarchical ||
      allreduce.intra != comm::IntraBackend::shm || topology.local_size() == 1 ||
      grads.device() != Device::cpu || allreduce.wire != grads.dtype() || grads.numel() == 0)
    return nullptr;
  std::string why;
  if (!comm::SharedBuffer::fits(topology, grads.size_bytes(), &why)) {
    if (topology.local_rank() == 0)
      std::printf("mptrain: note: node %d: the gradients stay in private memory (%s), so the "
                  "shm all-reduce copies them in first\n",
                  topology.node_index(), why.c_str());
    return nullptr;
  }
  auto shared = std::make_shared<comm::SharedBuffer>(topology, grads.size_bytes());
  model.rebind_grads(Tensor::adopt(shared->data(), grads.shape(), grads.dtype(), shared));
  return shared;
}

// Whether the gradients are all-reduced through a host twin (kernels::HostStaging), bucket by
// bucket: for a cuda model under the host backends (MPI reads host memory; the nccl backend
// reduces device memory in place), and on the cpu where MPTRAIN_STAGE_GRADIENTS=1 asks, so that
// the CPU tests run the cuda pipeline's staging (tests/app/resume.sh). Throws UserError naming
// the variable for a value other than 0 or 1.
bool stages_gradients(Device device, const comm::AllreduceConfig& allreduce) {
  const char* text = std::getenv("MPTRAIN_STAGE_GRADIENTS");
  const bool asked = text != nullptr && std::strcmp(text, "1") == 0;
  MPT_REQUIRE(text == nullptr || !*text || asked || std::strcmp(text, "0") == 0,
              std::string("MPTRAIN_STAGE_GRADIENTS is '") + text + "', but must be 0 or 1",
              "unset it: a cuda run stages its gradients for the host all-reduce by itself");
  if (comm::uses_nccl(allreduce)) return false;
  return device != Device::cpu || asked;
}

// Whether the training loop runs on a cuda device. It does (docs/gpu.md): the prefetcher
// delivers the batches there, loss, gradient accumulation and optimizer run there, the nccl
// backend all-reduces the gradients in place (the host backends reduce a pinned host twin,
// bucket by bucket: stages_gradients),
// sync-BN's per-channel sums are summed on the device with nccl (through a host copy under the
// host backends), checkpoints and evaluation go through host copies. Setting this to false keeps --device=auto on the cpu and
// refuses --device=cuda after the device checks.
constexpr bool kTrainsOnCuda = true;

// Rank 0 prints where every rank computes, "device: rank 0 -> HOST:cpu, rank 1 -> HOST:cuda:1",
// once at start. Collective (one gather of fixed-size labels).
void log_device_map(const std::string& label, const comm::World& world) {
  constexpr int kLabel = 128;
  char mine[kLabel] = {};
  std::snprintf(mine, kLabel, "%s:%s", process_host().c_str(), label.c_str());
  std::vector<char> all(world.rank() == 0 ? static_cast<std::size_t>(kLabel) * world.size() : 0);
  MPT_CHECK_MPI(MPI_Gather(mine, kLabel, MPI_CHAR, all.data(), kLabel, MPI_CHAR, 0, world.handle()));
  if (world.rank() != 0) return;
  std::string line = "device:";
  for (int r = 0; r < world.size(); ++r)
    line += (r ? ", rank " : " rank ") + std::to_string(r) + " -> " +
            std::string(all.data() + static_cast<std::size_t>(r) * kLabel);
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// The device this rank trains on (--device), decided alike on every rank. auto: cuda where
// every rank sees a CUDA device (one MAX over the world, so that no rank trains alone on the
// host), else cpu. cuda: a rank of a build without CUDA, or that sees no device, fails the
// agreed phase, so the lowest such rank names --device and every rank stops. A cuda rank binds
// to its local rank on the real machine (Topology::device_rank, whatever --comm.ranks-per-node
// emulates) modulo the devices it sees: one GPU per rank where every rank sees them all, device
// 0 where Slurm's --gpus-per-task=1 shows each rank only its own. Collective.
// --cuda.graphs replays the step's kernels as captured (kernels/graph.hpp): refused, naming the
// reason, where a replay would not be the step (the cpu, accumulation's changing micro-batch
// work, a layer that waits for the host or changes its work each step).
void check_graphs(const RunConfig& config, Device device, const nn::Model& model) {
  MPT_REQUIRE(device == Device::cuda,
              "--cuda.graphs needs the cuda device, and this run trains on the cpu",
              "pass --device=cuda on GPU nodes, or leave --cuda.graphs off");
  MPT_REQUIRE(kernels::graphs_supported(),
              "--cuda.graphs: the compute stream is the legacy default stream "
              "(MPTRAIN_CUDA_LEGACY_STREAM is set), which a graph cannot capture",
              "unset MPTRAIN_CUDA_LEGACY_STREAM, or leave --cuda.graphs off");
  MPT_REQUIRE(config.loop.accumulate == 1, "--cuda.graphs needs --train.accumulate=1",
              "leave --cuda.graphs off to accumulate gradients");
  const std::string blocker = model.graph_blocker();
  MPT_REQUIRE(blocker.empty(), "--cuda.graphs cannot capture layer " + blocker,
              "use a model without it (e.g. --model.name=mlp), or leave --cuda.graphs off");
}

Device select_device(const RunConfig& config, const comm::Topology& topology,
                     const comm::World& world) {
  const std::string& option = config.device;
  const int visible = device_memory::cuda_device_count();
  const bool some_rank_has_none = world.max(visible > 0 ? 0.0 : 1.0) > 0;
  Device device = Device::cpu;
  std::string label = "cpu";
  world.run_agreed([&] {
    if (option == "cpu" || (option == "auto" && (some_rank_has_none || !kTrainsOnCuda))) return;
    MPT_REQUIRE(device_memory::cuda_built(), "--device=cuda: this build has no CUDA",
                "rebuild with -DMPTRAIN_ENABLE_CUDA=ON (docs/gpu.md), or use --device=cpu or auto");
    MPT_REQUIRE(visible > 0,
                "--device=cuda: no CUDA device visible on " + process_host() + " (" +
                    device_memory::cuda_device_description() + ")",
                "check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device=cpu or auto");
    MPT_REQUIRE(kTrainsOnCuda, "--device=cuda: the trainer does not run on CUDA yet",
                "use --device=cpu or auto (the CUDA kernels, model and their tests: docs/gpu.md)");
    const int index = topology.device_rank() % visible;
    device_memory::set_cuda_device(index);
    device = Device::cuda;
    label = "cuda:" + std::to_string(index);
  });
  set_process_device(label);
  log_device_map(label, world);
  return device;
}

// Rank 0: the checkpoint --resume names, verified (every checksum) and its weights checked
// against this model (the buffers are checked as they load); nullopt for --resume=none, or auto with no checkpoint yet (a fresh start).
std::optional<ckpt::LoadedCheckpoint> load_for_resume(const RunConfig& config, nn::Model& model,
                                                      const data::DatasetInfo& info) {
  const std::string& resume = config.checkpoint.resume;
  if (resume == "none") return std::nullopt;
  // Reading (and verifying) a large checkpoint is busy, not hung: the watchdog waits for it.
  comm::set_phase(comm::Phase::checkpoint);
  std::optional<ckpt::LoadedCheckpoint> loaded;
  if (resume == "auto") {
    loaded = ckpt::load_newest_valid(config.checkpoint.dir, [](const std::string& line) {
      std::printf("warning: %s\n", line.c_str());
      std::fflush(stdout);
    });
    if (!loaded) {
      std::printf("resume: no checkpoint in '%s' yet, starting fresh\n", config.checkpoint.dir.c_str());
      return std::nullopt;
    }
  } else {
    loaded = ckpt::load_weights(resume);
  }
  const std::string hint = "resume with the model and data it was written for, or start fresh with --resume=none";
  MPT_REQUIRE(loaded->meta.sample_shape == info.sample_shape,
              "checkpoint '" + loaded->path + "' was written for samples of shape " +
                  shape_to_string(loaded->meta.sample_shape) + ", the training set has " +
                  shape_to_string(info.sample_shape),
              hint);
  std::vector<ckpt::NamedTensor> expected;
  for (const auto& param : model.named_params()) expected.push_back({param.name, param.value});
  ckpt::check_weights_match(*loaded, expected);
  // The same weights can serve another network (relu against gelu, a dropout rate): the spec
  // must match too.
  MPT_REQUIRE(loaded->meta.model_spec == model.spec(),
              "checkpoint '" + loaded->path + "' was written for the model '" +
                  loaded->meta.model_spec + "', this run builds '" + model.spec() + "'",
              hint);
  if (loaded->state) {
    MPT_REQUIRE(loaded->state->optimizer == config.optimizer.name,
                "checkpoint '" + loaded->path + "' was written with --optimizer.name=" +
                    loaded->state->optimizer + ", this run uses " + config.optimizer.name,
                "resume with the same optimizer, or start fresh with --resume=none");
  }
  return loaded;
}

void write_resume_header(const ckpt::LoadedCheckpoint& loaded, const std::string& precision,
                         std::int64_t* header) {
  header[kPresent] = 1;
  header[kStep] = loaded.meta.step;
  header[kWorldSize] = loaded.meta.world_size;
  if (!loaded.state) return;
  const ckpt::TrainingState& state = *loaded.state;
  header[kHasState] = 1;
  header[kEpoch] = state.epoch;
  header[kEpochStep] = state.epoch_step;
  header[kEpochSamples] = state.epoch_samples;
  header[kMicroStep] = state.micro_step;
  header[kOptimizerSteps] = state.optimizer_steps;
  header[kScheduleSteps] = state.schedule_steps;
  header[kGrowthTracker] = state.scaler_growth_tracker;
  header[kHysteresisTracker] = state.scaler_hysteresis_tracker;
  header[kSkippedSteps] = state.scaler_skipped_steps;
  header[kBatchPerRank] = state.batch_per_rank;
  header[kAccumulate] = state.accumulate;
  header[kLossScaleBits] = std::bit_cast<std::int64_t>(state.loss_scale);
  header[kSamePrecision] = loaded.meta.precision == precision ? 1 : 0;
}

// The cursor in this run's shape. The same shape continues at the very step; another one
// continues at the step holding the epoch's next unseen sample (rounded down: up to one global
// batch of the epoch is seen twice), with the step count and the LR schedule's position
// re-expressed in the new shape (the optimizer keeps its own count: AdamW's bias correction).
ResumePoint resume_point(const std::int64_t* header, int world_size, std::int64_t batch,
                         std::int64_t accumulate, std::int64_t global_batch,
                         std::int64_t steps_per_epoch) {
  ResumePoint point;
  point.from_checkpoint = header[kPresent] != 0;
  point.has_state = header[kHasState] != 0;
  point.checkpoint_step = header[kStep];
  if (!point.has_state) return point;  // weights only: the run starts at step 0
  point.written_world_size = header[kWorldSize];
  point.written_batch = header[kBatchPerRank];
  point.written_accumulate = header[kAccumulate];
  point.same_shape = point.written_world_size == world_size && point.written_batch == batch &&
                     point.written_accumulate == accumulate;
  point.same_precision = header[kSamePrecision] != 0;
  point.epoch = header[kEpoch];
  point.epoch_samples = header[kEpochSamples];
  point.epoch_step = point.same_shape ? header[kEpochStep]
                                      : point.epoch_samples / (global_batch * accumulate);
  if (point.epoch_step >= steps_per_epoch) {
    ++point.epoch;
    point.epoch_step = 0;
    point.epoch_samples = 0;
  }
  point.step = point.same_shape ? header[kStep] : point.epoch * steps_per_epoch + point.epoch_step;
  point.micro_step = header[kMicroStep];
  point.optimizer_steps = header[kOptimizerSteps];
  // The schedule moves by the samples an update covers: scaled by the ratio of samples per step.
  const double written_step_samples = static_cast<double>(
      point.written_world_size * point.written_batch * point.written_accumulate);
  point.schedule_steps =
      point.same_shape ? header[kScheduleSteps]
                       : std::llround(static_cast<double>(header[kScheduleSteps]) *
                                      written_step_samples /
                                      static_cast<double>(global_batch * accumulate));
  point.loss_scale = std::bit_cast<double>(header[kLossScaleBits]);
  point.scaler_growth_tracker = header[kGrowthTracker];
  point.scaler_hysteresis_tracker = header[kHysteresisTracker];
  point.scaler_skipped_steps = header[kSkippedSteps];
  return point;
}

// Copies rank 0's TENSOR to every rank. MPI here reads host memory only (not CUDA-aware), so a
// tensor on the cuda device goes through a host copy (setup and evaluation only, not the step).
void broadcast_from_root(Tensor& tensor, const comm::World& world) {
  if (tensor.device() == Device::cpu) {
    world.broadcast(tensor, 0);
    return;
  }
  if (world.size() == 1) return;
  Tensor host = tensor.to(Device::cpu);
  world.broadcast(host, 0);
  kernels::copy(host, tensor);
}

// Copies the checkpoint's FP32 masters, buffers and optimizer state into this rank's live
// tensors: rank 0 from LOADED (checking each optimizer tensor against this optimizer's), every
// other rank by broadcast; then the 16-bit working copy is recast.
void restore_tensors(const std::optional<ckpt::LoadedCheckpoint>& loaded, const ResumePoint& resume,
                     nn::Model& model, optim::Optimizer& optimizer, const comm::World& world) {
  std::vector<optim::StateTensor> optimizer_state = optimizer.state();
  world.run_agreed([&] {
    if (world.rank() != 0) return;
    exported::load_into(model, loaded->weights, loaded->buffers, loaded->path);
    if (!resume.has_state) return;
    const auto& stored_state = loaded->state->optimizer_tensors;
    MPT_REQUIRE(stored_state.size() == optimizer_state.size(),
                "checkpoint '" + loaded->path + "' holds " + std::to_string(stored_state.size()) +
                    " optimizer state tensor(s), this optimizer has " +
                    std::to_string(optimizer_state.size()),
                "resume with the same --optimizer.* options (e.g. momentum on or off), or start fresh with --resume=none");
    for (auto& live : optimizer_state) {
      const auto found = std::find_if(stored_state.begin(), stored_state.end(),
                                      [&](const auto& s) { return s.name == live.name; });
      MPT_REQUIRE(found != stored_state.end() && found->value.numel() == live.value.numel(),
                  "checkpoint '" + loaded->path + "' has no optimizer state '" + live.name +
                      "' of " + std::to_string(live.value.numel()) + " elements",
                  "resume with the same --optimizer.* options, or start fresh with --resume=none");
      kernels::copy(found->value, live.value);  // the live state may be on the cuda device
    }
  });
  broadcast_from_root(model.master_params(), world);
  if (model.buffers().numel() > 0) broadcast_from_root(model.buffers(), world);
  if (resume.has_state)
    for (auto& live : optimizer_state) broadcast_from_root(live.value, world);
  model.recast_from_master();
}

}  // namespace

struct Trainer::State {
  State(const RunConfig& run_config, const comm::World& run_world) : config(run_config), world(run_world) {}
  RunConfig config;
  const comm::World& world;
  Clock::time_point wall_start = Clock::now();
  // From construction on, a stop signal is recorded, not fatal: one that comes during setup
  // stops the run at its first step boundary.
  StopSignals stop_signals;
  // Started once the options are agreed; covers every collective from then on.
  std::optional<comm::Watchdog> watchdog;
  std::optional<data::DatasetReader> train_reader, test_reader;
  std::optional<nn::Model> model;
  std::optional<amp::LossScaler> scaler;
  Fault fault;
  std::optional<data::ShardPlan> plan;
  std::int64_t total_steps = 0;  // of this run: epochs x steps per epoch, capped by max-steps
  double base_lr = 0;            // --optimizer.lr after --optimizer.lr-scaling
  std::optional<optim::Schedule> schedule;
  // Communication: the world cut into nodes and rails, the resolved --comm options, and the
  // reducer (built in run(); after the topology, so destroyed before it).
  std::optional<comm::Topology> topology;
  Device device = Device::cpu;  // --device, resolved (select_device)
  // --data.normalize resolved: the batches hold uint8 samples as stored, which the step
  // normalises on the training device (kernels::normalize_u8) before forward.
  bool raw_u8 = false;
  comm::AllreduceConfig allreduce;
  std::optional<comm::GradientReducer> reducer;
  MetricsLog metrics;
  std::optional<TensorBoardWriter> tensorboard;  // rank 0, with --output.tensorboard
  std::optional<Timeline> timeline;              // every rank, with --output.timeline
  InputPipeline input;  // last: its I/O threads use the members above
};

Trainer::Trainer(const RunConfig& run_config, const comm::World& run_world)
    : state_(std::make_unique<State>(run_config, run_world)) {
  const auto& config = state_->config;
  const auto& world = state_->world;
  const bool root = world.rank() == 0;
  auto& train_reader = state_->train_reader;
  auto& test_reader = state_->test_reader;
  auto& model = state_->model;
  auto& plan = state_->plan;
  // Setup makes no collective call, so a bad option or file on any rank ends every rank here.
  world.run_agreed([&] {
    validate(config);
    train_reader.emplace(config.data.train_path, reader_options(config.data, "--data.train"));
    if (!config.data.test_path.empty()) {
      test_reader.emplace(config.data.test_path, reader_options(config.data, "--data.test"));
      const auto& train_info = train_reader->info();
      const auto& test_info = test_reader->info();
      MPT_REQUIRE(test_info.sample_shape == train_info.sample_shape,
                  "test set '" + test_info.path + "' has sample shape " +
                      shape_to_string(test_info.sample_shape) + " but the training set has " +
                      shape_to_string(train_info.sample_shape),
                  "--data.test must come from the same preparation as --data.train");
      MPT_REQUIRE(test_info.num_classes == train_info.num_classes,
                  "test set '" + test_info.path + "' has " + std::to_string(test_info.num_classes) +
                      " classes but the training set has " + std::to_string(train_info.num_classes),
                  "--data.test must come from the same preparation as --data.train");
    }
    const auto& info = train_reader->info();
    if (config.model.layers.empty()) nn::require_builtin_model(config.model.name, "--model.name");
    const std::string model_spec = config.model.layers.empty() ? config.model.name : config.model.layers;
    model.emplace(nn::Model::build(model_spec, info.sample_shape, info.num_classes,
                                   precision_dtype(config.amp)));
    nn::init_scheme_from_name(config.model.init, "--model.init");  // checked on every rank
    state_->scaler.emplace(scaler_options(config.amp));
    state_->fault = parse_fault(config.fault);
    plan.emplace(info.num_samples, config.loop.batch_size, world.size(), world.rank(),
                 config.loop.seed, shard_options_for(config.data, info));
    state_->total_steps = config.loop.epochs * optimizer_steps_per_epoch(plan->steps_per_epoch(),
                                                                         config.loop.accumulate);
    if (config.loop.max_steps > 0)
      state_->total_steps = std::min(state_->total_steps, config.loop.max_steps);
    // The optimizer and schedule options are checked here, where a mistake ends every rank
    // cleanly; the optimizer itself is built in run(), beside the buffers it updates.
    // Linear scaling follows the batch of one update: K micro-batches of the global batch.
    state_->base_lr = optim::scaled_lr(config.optimizer.lr, config.optimizer.lr_scaling,
                                       plan->global_batch() * config.loop.accumulate,
                                       config.optimizer.reference_batch);
    if (config.optimizer.name == "adamw") optim::validate(adamw_options(config.optimizer));
    state_->schedule.emplace(config.schedule, state_->base_lr,
                             state_->total_steps);
    state_->input.plan(config.data, world, *train_reader, [&] {
      return std::make_unique<data::DatasetReader>(config.data.train_path,
                                                   reader_options(config.data, "--data.train"));
    }, *plan, io_fault(state_->fault, world.rank(), *plan, config));
    // The files in it are opened in run(), once the resume decision says whether this run
    // continues an earlier one (claim_run_directories).
    if (root && !config.output_dir.empty()) ensure_directory(config.output_dir, "--output.dir");
    if (root && !config.checkpoint.dir.empty()) ensure_directory(config.checkpoint.dir, "--checkpoint.dir");
  });
  // The watchdog and the topology are collective, so they are built between two agreed phases
  // (every rank gets here); the --comm names are then checked against the topology where a
  // mistake ends every rank. The watchdog names the ranks that have not arrived only where
  // its thread may call MPI beside the others (MPI_THREAD_MULTIPLE, which `mptrain train`
  // asks for).
  int thread_level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&thread_level);
  state_->watchdog.emplace(world.handle(), config.comm.stall_timeout_s,
                           thread_level >= MPI_THREAD_MULTIPLE);
  state_->topology.emplace(world.handle(), config.comm.ranks_per_node);
  state_->device = select_device(config, *state_->topology, world);
  // The nccl backend needs a GPU per rank; which ranks share one is found by a collective, so
  // here, before the agreed phase that resolves the --comm options.
  const comm::SharedGpus shared_gpus = state_->device == Device::cuda && comm::nccl_built()
                                           ? comm::find_shared_gpus(*state_->topology)
                                           : comm::SharedGpus{};
  world.run_agreed([&] {
    // uint8 samples travel as stored where the training device normalises them: a quarter of
    // the f32 bytes over the bus, and no conversion on the I/O threads (--data.normalize).
    const std::string& normalize = config.data.normalize;
    state_->raw_u8 = train_reader->info().sample_dtype == DType::u8 &&
                     (normalize == "device" || (normalize == "auto" && state_->device != Device::cpu));
    // The model was built on the host during setup (the device is chosen after the topology):
    // on cuda it is built again there, before anything refers to its buffers.
    if (state_->device != Device::cpu) {
      const auto& info = train_reader->info();
      const std::string spec = config.model.layers.empty() ? config.model.name : config.model.layers;
      model.emplace(nn::Model::build(spec, info.sample_shape, info.num_classes,
                                     precision_dtype(config.amp), state_->device));
    }
    // On cuda the batches arrive on the device too: pinned host buffers, copied on the I/O
    // threads.
    if (state_->device != Device::cpu || state_->raw_u8)
      state_->input.prefetcher->deliver_to(state_->device, state_->raw_u8);
    state_->allreduce =
        comm::resolve_allreduce(config.comm, *state_->topology, model->grads().dtype(),
                                state_->device, shared_gpus);
    // No pre-scaling, also for a 16-bit wire: the gradients already carry 1/global batch (the
    // loss gradient's scale), so rank r sends (1/N) x (the mean of its B samples' gradients).
    // Every partial sum is thus bounded by the largest per-sample gradient, like the final
    // mean: a 16-bit sum overflows only where the gradients themselves would (and then the
    // loss scaler backs off). A further 1/N would only push small gradients into fp16's
    // subnormals. The sum is the mean, so no post-scaling either.
    state_->allreduce.prescale = 1;
    state_->allreduce.postscale = 1;
    if (config.cuda_graphs) check_graphs(config, state_->device, *model);
  });
}

Trainer::~Trainer() = default;

const Tensor& Trainer::params() const { return state_->model->params(); }

TrainSummary run_training(const RunConfig& config, const comm::World& world) {
  Trainer trainer(config, world);
  return trainer.run();
}

TrainSummary Trainer::run() {
  const auto& config = state_->config;
  const auto& world = state_->world;
  const auto wall_start = state_->wall_start;
  const bool root = world.rank() == 0;
  auto& train_reader = state_->train_reader;
  auto& test_reader = state_->test_reader;
  auto& model = state_->model;
  auto& plan = state_->plan;
  auto& metrics = state_->metrics;

  const std::int64_t batch = config.loop.batch_size;
  const std::int64_t global_batch = plan->global_batch();  // of one micro-batch
  const std::int64_t accumulate = config.loop.accumulate;
  const std::int64_t batches_per_epoch = plan->steps_per_epoch();
  // Optimizer steps (each of up to ACCUMULATE micro-batches): what step and max-steps count.
  const std::int64_t steps_per_epoch = optimizer_steps_per_epoch(batches_per_epoch, accumulate);
  const std::int64_t total_steps = state_->total_steps;
  const auto& info = train_reader->info();

  // The gradient reducer: buckets in reverse layer order, all-reduced on the communication
  // thread while backward goes on. Collective (the all-reduce's own setup).
  const auto& topology = *state_->topology;
  const auto& allreduce = state_->allreduce;
  const auto mib = [](double megabytes) {
    return static_cast<std::int64_t>(megabytes * (1 << 20));
  };
  // On the cuda device the nccl backend reduces the device gradients in place: each bucket is
  // queued on the comm stream after the compute work that wrote it, and the step's end waits
  // for the previous step's calls only (drain() for the last: before a log line, a checkpoint,
  // evaluation and the end). The host backends reduce a pinned host twin of them
  // (stages_gradients), planned once: each bucket is copied down as backward finishes it,
  // reduced, and copied back, with no host wait for the compute stream. Either way buckets overlap backward, on the device too.
  const bool on_cuda = model->device() != Device::cpu;
  // Whether the 16-bit GEMMs take their operands as they are (the tensor cores; AMX or
  // AVX512-BF16 on the host) or widen them to f32 first: a factor of several in speed.
  const DType precision = precision_dtype(config.amp);
  const bool gemm_16 =
      precision != DType::f32 && (on_cuda || kernels::host_matmul_takes(precision));
  const bool staged = stages_gradients(model->device(), allreduce);
  const std::shared_ptr<comm::SharedBuffer> shared_grads =
      staged ? nullptr : share_gradients(*model, topology, allreduce);
  state_->reducer.emplace(topology, allreduce, model->grads(), model->param_offsets(),
                          mib(config.comm.bucket_mb), mib(config.comm.first_bucket_mb),
                          shared_grads);
  comm::GradientReducer& reducer = *state_->reducer;
  if (staged && reducer.num_buckets() > 0)
    reducer.set_staging(std::make_unique<kernels::HostStaging>(model->grads(), reducer.num_buckets()));
  const bool overlap = comm::overlap_buckets(config.comm, on_cuda) &&
                       (!on_cuda || staged || reducer.allreducer().queues());

  if (root) {
    std::printf("mptrain %s: %d rank(s), model %s (%lld parameters), batch %lld per rank, global %lld, "
                "%lld steps per epoch, precision %s, matmul %s\n",
                MPTRAIN_VERSION, world.size(), model->spec().c_str(),
                static_cast<long long>(model->num_params()), static_cast<long long>(batch),
                static_cast<long long>(global_batch), static_cast<long long>(steps_per_epoch),
                config.amp.precision.c_str(), kernels::matmul_backend() == kernels::MatmulBackend::dnnl ? "oneDNN" : "BLAS");
    if (precision != DType::f32)
      std::printf("%s GEMMs: %s\n", config.amp.precision.c_str(),
                  gemm_16 ? "16-bit operands, f32 sums"
                  : precision == DType::f16
                      ? "widened to f32 (oneDNN 2.6 has no fp16 matmul on the CPU)"
                      : "widened to f32 (no AMX or AVX512-BF16 here, or --kernels.matmul=blas)");
    if (accumulate > 1)
      std::printf("accumulate %lld micro-batches per optimizer step: %lld samples per update\n",
                  static_cast<long long>(accumulate),
                  static_cast<long long>(accumulate * global_batch));
    std::printf("allreduce %s", comm::algorithm_name(allreduce.algorithm));
    if (allreduce.algorithm == comm::Algorithm::hierarchical)
      std::printf(" (intra %s%s, %d node(s) of up to %d rank(s)%s)", comm::intra_name(allreduce.intra),
                  shared_grads ? " on registered gradients" : "", topology.num_nodes(),
                  topology.num_shards(),
                  allreduce.intra != comm::IntraBackend::nccl ? ""
                  : allreduce.mpi_on_device ? ", across nodes CUDA-aware MPI on device memory"
                                            : ", across nodes MPI through pinned host memory");
    std::printf(", wire %s, %d bucket(s)", dtype_name(allreduce.wire), reducer.num_buckets());
    if (staged)
      std::printf(" staged through %s", on_cuda ? "pinned host memory"
                                                : "a host twin (MPTRAIN_STAGE_GRADIENTS=1)");
    if (config.comm.bucket_mb > 0)
      std::printf(" (%g MiB, first %g MiB)", config.comm.bucket_mb, config.comm.first_bucket_mb);
    else
      std::printf(" (one bucket after backward)");
    std::printf(", overlap %s", overlap ? "on" : "off (buckets after backward)");
    std::printf("\n");
    if (config.model.print) std::printf("%s", model->summary().c_str());
    std::fflush(stdout);
  }

  // Every buffer of the steady state is planned here, once (the input batches in setup, by the
  // prefetcher). Its I/O threads start now, so the first batches load during the broadcast.
  model->plan(batch);
  Tensor dlogits({batch, model->num_classes()}, DType::f32, model->device());

  // Resume (--resume): rank 0 reads and verifies the checkpoint; the others learn where the run
  // continues from one broadcast now, and the tensors once the optimizer exists.
  const auto& checkpointing = config.checkpoint;
  std::optional<ckpt::LoadedCheckpoint> resumed;
  world.run_agreed([&] {
    if (!root) return;
    resumed = load_for_resume(config, *model, info);
    // Only now is it known whether this run continues an earlier one, whose files it appends
    // to; else an earlier run's files are refused (or with --output.overwrite removed) before
    // anything is opened.
    claim_run_directories(config, resumed.has_value());
    if (config.output_dir.empty()) return;
    metrics.open(config.output_dir, resumed.has_value());
    if (config.tensorboard) {
      require_not_symlink(config.output_dir + "/tensorboard", "--output.dir");
      state_->tensorboard.emplace(config.output_dir + "/tensorboard");
    }
  });
  // Every rank's timeline, in the directory rank 0 created during setup (one per invocation: a
  // continued run starts it afresh).
  world.run_agreed([&] {
    if (!config.timeline) return;
    const std::string path =
        config.output_dir + "/timeline-rank" + std::to_string(world.rank()) + ".json";
    require_not_symlink(path, "--output.dir");
    state_->timeline.emplace(path, world.rank(), wall_start);
  });
  Timeline* const timeline = state_->timeline ? &*state_->timeline : nullptr;
  Tensor resume_header({kResumeFields}, DType::i64);
  std::fill_n(resume_header.data<std::int64_t>(), kResumeFields, 0);
  if (root && resumed)
    write_resume_header(*resumed, config.amp.precision, resume_header.data<std::int64_t>());
  world.broadcast(resume_header, 0);
  const ResumePoint resume = resume_point(resume_header.data<std::int64_t>(), world.size(), batch,
                                          accumulate, global_batch, steps_per_epoch);
  if (root && resume.from_checkpoint) {
    std::printf("resumed from %s: step %lld, epoch %lld", resumed->path.c_str(),
                static_cast<long long>(resume.checkpoint_step), static_cast<long long>(resume.epoch));
    if (!resume.has_state)
      std::printf(" (weights only: optimizer, loss scale and data cursor start fresh)");
    else if (!resume.same_precision)
      std::printf(" (written under another --train.precision: the loss scale starts fresh)");
    else if (!resume.same_shape)
      std::printf(" (written by %lld rank(s) x batch %lld x accumulate %lld: continues at sample "
                  "%lld of the epoch, step %lld of this shape)",
                  static_cast<long long>(resume.written_world_size),
                  static_cast<long long>(resume.written_batch),
                  static_cast<long long>(resume.written_accumulate),
                  static_cast<long long>(resume.epoch_samples), static_cast<long long>(resume.step));
    std::printf("\n");
    std::fflush(stdout);
  }
  data::Prefetcher& prefetcher = *state_->input.prefetcher;
  const std::int64_t start_step = std::min(resume.step, total_steps);
  prefetcher.start(resume.epoch, resume.epoch_step * accumulate,
                   batches_for_steps(total_steps, batches_per_epoch, accumulate) -
                       batches_for_steps(start_step, batches_per_epoch, accumulate));

  // Rank 0 draws the initial weights and broadcasts them: the ranks start identical even if a
  // site's libm differs between nodes.
  if (root) model->init_params(config.loop.seed, nn::init_scheme_from_name(config.model.init, "--model.init"));
  // Sync BN: the layers' per-channel sums (and the sample count) are summed over the world on
  // the reducer's thread, in order with the buckets (one thread calls MPI and queues NCCL
  // calls at a time). On cuda, with the nccl backend on one node or flat-nccl, on the device
  // without a host wait; under the host backends or across nodes, through a host copy that
  // plan_stats() allocates here (each call then waits for the device: docs/gpu.md).
  if (config.model.sync_bn) {
    reducer.plan_stats(model->device(), model->stats_values());
    model->set_stats_reducer([&reducer](Tensor& sums) { reducer.sum_stats(sums); });
    // --cuda.graphs captures the sums into the step's graph, as ncclAllReduce calls on the
    // compute stream: only where they are summed on the device (no host copy inside a step).
    MPT_REQUIRE(!config.cuda_graphs || std::string(reducer.stats_path()) == "device",
                std::string("--cuda.graphs cannot capture --model.sync-bn here: its statistics "
                            "go through a host copy (bn_stats_path ") +
                    reducer.stats_path() + ": the host backends, or nccl across nodes)",
                "use --comm.intra=nccl on one node or --comm.allreduce=flat-nccl, or leave one "
                "of the two off");
    MPT_REQUIRE(!config.cuda_graphs || reducer.allreducer().captures(),
                "--cuda.graphs cannot capture --model.sync-bn's NCCL sums: "
                "NCCL_GRAPH_MIXING_SUPPORT=0 forbids a graph's NCCL calls and eager ones "
                "outstanding together",
                "unset NCCL_GRAPH_MIXING_SUPPORT, or leave one of the two off");
  }
  broadcast_from_root(model->master_params(), world);
  model->recast_from_master();  // the 16-bit working copy (a no-op under fp32)

  // The optimizer updates the FP32 masters from FP32 gradients; the working copy is recast.
  std::unique_ptr<optim::Optimizer> optimizer;
  if (config.optimizer.name == "adamw") {
    optimizer = std::make_unique<optim::AdamW>(model->master_params(), model->master_grads(),
                                               adamw_options(config.optimizer),
                                               decay_mask(*model, config.optimizer.decay_biases));
  } else {
    optim::SgdOptions sgd_options;
    sgd_options.lr = static_cast<float>(config.optimizer.lr);
    sgd_options.momentum = static_cast<float>(config.optimizer.momentum);
    sgd_options.weight_decay = static_cast<float>(config.optimizer.weight_decay);
    sgd_options.nesterov = config.optimizer.nesterov;
    optimizer = std::make_unique<optim::Sgd>(model->master_params(), model->master_grads(),
                                             sgd_options);
  }
  // Under 16 bits the optimizer also recasts the working copy, in the same pass over the masters.
  const bool sixteen_bit = model->precision() != DType::f32;
  if (sixteen_bit) optimizer->recast_into(model->params(), model->compute_params());
  amp::LossScaler& scaler = *state_->scaler;
  // The schedule's position is the optimizer's applied steps, plus this offset after a resume
  // on another shape (ResumePoint::schedule_steps).
  std::int64_t schedule_offset = 0;
  if (resume.from_checkpoint) {
    restore_tensors(resumed, resume, *model, *optimizer, world);
    if (resume.has_state) optimizer->set_steps(resume.optimizer_steps);
    if (resume.has_state) schedule_offset = resume.schedule_steps - resume.optimizer_steps;
    if (resume.has_state && resume.same_precision) {
      amp::LossScalerState restored;
      restored.scale = resume.loss_scale;
      restored.growth_tracker = resume.scaler_growth_tracker;
      restored.hysteresis_tracker = resume.scaler_hysteresis_tracker;
      restored.skipped_steps = resume.scaler_skipped_steps;
      scaler.set_state(restored);
    }
  }
  resumed.reset();  // the tensors are in place: free the file's copy
  const optim::Schedule& schedule = *state_->schedule;
  const double clip_norm = config.optimizer.clip_norm;
  if (root) {
    std::printf("optimizer %s, base lr %g", config.optimizer.name.c_str(), state_->base_lr);
    if (config.optimizer.lr_scaling == "linear")
      std::printf(" (linear scaling: %g x global batch %lld / reference batch %lld)",
                  config.optimizer.lr, static_cast<long long>(global_batch),
                  static_cast<long long>(config.optimizer.reference_batch));
    std::printf(", schedule %s, clip-norm %g\n", config.schedule.name.c_str(), clip_norm);
    std::fflush(stdout);
  }
  const bool skip_nonfinite_loss = config.amp.on_nonfinite_loss == "skip";
  double lr = schedule.lr(optimizer->steps() + schedule_offset);  // of the last applied update, as logged
  double grad_norm = -1;       // the pre-clip norm of the last applied update (-1: not computed)

  // The step's decisions are kernels over a state on the model's device (kernels/step_state.hpp):
  // the loss scale, the skip verdict, the update's lr and bias corrections. The host reads each
  // step's state back LAG steps late (1 on cuda, 0 on the host), so the device never waits for
  // it; with a lag the per-micro-batch loss is not known on the host in time, and a non-finite
  // loss is handled on the device (its rank poisons its gradients) and reported late.
  Tensor step_state;
  {
    const amp::LossScalerState& scaler_state = scaler.state();
    kernels::StepState init;
    init.scale = scaler_state.scale;
    init.growth_tracker = static_cast<double>(scaler_state.growth_tracker);
    init.hysteresis_tracker = static_cast<double>(scaler_state.hysteresis_tracker);
    init.skipped_steps = static_cast<double>(scaler_state.skipped_steps);
    init.applied_steps = init.applied_at_start = static_cast<double>(optimizer->steps());
    step_state = kernels::step_state_tensor(init, model->device());
  }
  const kernels::ScaleRule scale_rule = amp::scale_rule(scaler.options());
  const bool adamw = config.optimizer.name == "adamw";
  const Tensor schedule_table = optim::schedule_table(
      schedule, schedule_offset, optimizer->steps(),
      std::max<std::int64_t>(1, total_steps - std::min(resume.step, total_steps)),
      adamw ? static_cast<float>(config.optimizer.beta1) : 0.f,
      adamw ? static_cast<float>(config.optimizer.beta2) : 0.f, model->device());
  StepReports reports(step_state, report_lag(model->device()));
  // --cuda.graphs (checked in the setup: cuda, no accumulation, every layer capturable): the
  // graphs and the fixed batch buffers they read.
  const bool graphs = config.cuda_graphs;
  kernels::StepGraph optimizer_graph("optimizer");
  // Where the reducer can capture the communicator's calls (nccl with no phase through the
  // host), the step's gradient all-reduce is in the forward+backward graph too: each bucket
  // queued on the comm stream as backward's hook launches it, so the replays overlap it with
  // backward, and the graph ends with the compute stream's wait for it. Such a graph holds its
  // join slot's timing events, so there is one per slot and they alternate
  // (GradientReducer::next_join_slot). Elsewhere one graph, and the buckets go at wait().
  const bool graph_buckets = graphs && reducer.captures_buckets() && reducer.num_buckets() > 0;
  // An injected fault that the host decides on in the all-reduce (a NaN gradient, a failure in
  // it) needs an eager step where the buckets would be in the graph, and on every rank: NCCL
  // requires a collective to be captured on all ranks or on none. MPTRAIN_FAULT names one rank
  // but one step for all (agreed below); -1: no such step.
  const bool host_fault =
      state_->fault.kind == "nan-grad" || state_->fault.kind.rfind("comm-", 0) == 0;
  const std::int64_t eager_fault_step = graph_buckets && host_fault ? state_->fault.step : -1;
  if (graphs) {
    // NCCL requires each collective to be captured on every rank or on none. Whether the
    // buckets are captured, and the step a host-decided fault makes eager (below), come from
    // each rank's own environment (NCCL_GRAPH_MIXING_SUPPORT, MPTRAIN_FAULT): agreed here, so
    // that a launcher that did not pass them to every rank ends the run before step 1 instead
    // of hanging in it.
    const double fault_step = host_fault ? static_cast<double>(state_->fault.step) : 0.0;
    const double in_graph = graph_buckets ? 1.0 : 0.0;
    double agreed[4] = {fault_step, -fault_step, in_graph, -in_graph};  // maxima and minima
    world.allreduce_max(agreed, 4);
    MPT_REQUIRE(agreed[0] == -agreed[1] && agreed[2] == -agreed[3],
                "--cuda.graphs: the ranks disagree on MPTRAIN_FAULT or NCCL_GRAPH_MIXING_SUPPORT, "
                "which decide which NCCL calls a graph captures",
                "pass the same environment to every rank (mpirun -x NAME)");
  }
  kernels::StepGraph forward_backward_graphs[2] = {
      kernels::StepGraph(graph_buckets ? "forward+backward+allreduce (join slot 0)" : "forward+backward"),
      kernels::StepGraph("forward+backward+allreduce (join slot 1)")};
  // Set by the first eager micro-batch of a full batch whose backward ran: that one made every
  // buffer the kernels create on first use (cuBLASLt's workspace, the bias partial rows), which
  // a capture must not allocate. Until then steps stay eager: a first step whose backward did not
  // run (a non-finite loss skipped under MPTRAIN_REPORT_LAG=0, read on the host) warms nothing.
  // (Batches are always full on cuda, ShardPlan padding the last; the size test keeps it so.)
  bool graph_warmed = false;
  std::int64_t graph_replays = 0;  // micro-batches whose forward+backward replayed (summary.json)
  Tensor graph_samples, graph_labels;
  Shape sample_batch{batch};
  for (const std::int64_t d : info.sample_shape) sample_batch.push_back(d);
  if (graphs) {
    graph_samples = Tensor(sample_batch, DType::f32, model->device());
    graph_labels = Tensor({batch}, DType::i32, model->device());
  }
  // Raw uint8 batches (state_->raw_u8) are normalised into this before forward, with the
  // reader's own two floats.
  const bool raw_u8 = state_->raw_u8;
  const data::U8Normalization normalization = data::u8_normalization(info);
  Tensor normalized;
  if (raw_u8) normalized = Tensor(sample_batch, DType::f32, model->device());
  // The host reads the loss inside a step only where that is free: lag 0 on the host.
  const bool deferred = reports.lag() > 0 || model->device() != Device::cpu;
  // Samples this rank's readers left out for non-finite values (--data.on-nonfinite=skip).
  const auto skipped_samples = [&] {
    std::int64_t count = train_reader->skipped_nonfinite();
    for (const auto& reader : state_->input.extra_readers) count += reader->skipped_nonfinite();
    return count;
  };

  // Gradient accumulation: the micro-batches before the last add their gradients into an f32
  // buffer (backward overwrites grads()); the last one's backward adds it back into grads() a
  // layer at a time, just before the reducer launches the bucket holding those gradients.
  Tensor& grads = model->grads();
  Tensor accumulated =
      accumulate > 1 ? Tensor({grads.numel()}, DType::f32, model->device()) : Tensor();
  Tensor grads_range, accumulated_range;  // planned views: view_into allocates nothing
  std::int64_t accumulated_until = 0;     // grads()[this, end) already hold the sum
  const auto add_accumulated = [&](std::int64_t from) {
    if (from >= accumulated_until) return;
    Tensor::view_into(grads_range, grads, from, {accumulated_until - from});
    Tensor::view_into(accumulated_range, accumulated, from, {accumulated_until - from});
    kernels::add(grads_range, accumulated_range, grads_range);
    accumulated_until = from;
  };
  // The last micro-batch's backward hook: add what the earlier micro-batches accumulated, write
  // this rank's NaN (see below) before the bucket holding element 0 goes out, launch buckets.
  bool accumulating = false;    // this step has more than one micro-batch
  bool poison_in_hook = false;  // this rank must carry a NaN into the all-reduce
  // MPTRAIN_FAULT=comm-error|comm-crash:RANK:STEP: RANK fails on the communication thread
  // once its first bucket is reduced, while its peers are inside the next bucket's all-reduce
  // waiting for it: the job must end on every rank, not hang (tests/app/comm_faults.sh).
  bool fail_in_comm = false;
  const std::function<void()> injected_comm_failure = [&] {
    if (state_->fault.kind == "comm-crash") std::raise(SIGKILL);  // a hard crash: no message
    abort_job("injected failure in the gradient all-reduce at step " +
              std::to_string(state_->fault.step) + " (MPTRAIN_FAULT)");
  };
  const nn::GradsReady launch_buckets = [&](std::int64_t offset) {
    if (accumulating) add_accumulated(offset);
    if (offset == 0 && poison_in_hook) poison(grads);
    if (offset == 0 && deferred) kernels::poison_if_nonfinite_loss(grads, step_state);
    reducer.ready_from(offset);
    if (fail_in_comm && offset < grads.numel()) {
      fail_in_comm = false;
      reducer.run_collective(injected_comm_failure);
    }
  };
  const nn::GradsReady no_hook;

  TrainSummary summary;
  double train_seconds = 0;
  // A checkpoint's metadata after STEP, with EPOCHS epochs complete.
  const auto checkpoint_meta = [&](std::int64_t at_step, std::int64_t epochs) {
    ckpt::CheckpointMeta meta;
    meta.model_spec = model->spec();
    meta.sample_shape = info.sample_shape;
    meta.num_classes = model->num_classes();
    meta.step = at_step;
    meta.epoch = epochs;
    meta.world_size = world.size();
    meta.global_batch = global_batch;
    meta.precision = config.amp.precision;
    meta.mptrain_version = MPTRAIN_VERSION;
    meta.git_hash = git_hash();
    meta.input_mean = info.mean;  // what the reader applied to uint8 samples; export needs it
    meta.input_std = info.std;
    return meta;
  };
  // Loss and accuracy of the current logging window, summed locally and reduced when logged.
  // Loss sum, correct, samples, and (set at log time) the samples skipped so far.
  double window[4] = {0, 0, 0, 0};
  double window_data_wait = 0;   // seconds blocked in prefetcher.next() (reduced with MAX)
  double total_data_wait = 0;
  // Seconds the reducer's thread spent all-reducing, and the part of it that wait() blocked
  // (not hidden behind backward); summed over a window's steps, the slowest rank's logged.
  double window_comm = 0, window_exposed = 0, total_comm = 0, total_exposed = 0;
  // Waits for node peers to reach a bucket's all-reduce, the ranks' skew: the exposed part
  // (GradientReducer::last_exposed_peer_wait_seconds()) per window and per run, and all of it
  // (part of comm) per run.
  double window_peer_wait = 0, total_exposed_peer_wait = 0, total_peer_wait = 0;
  const bool measures_peer_wait = reducer.measures_peer_wait();
  // After reducer.wait() or reducer.drain(): what it measured, into the window and the run.
  // (The nccl backend's device figures arrive a step late, at the next wait(), or at drain().)
  const auto take_reducer_times = [&] {
    window_comm += reducer.last_comm_seconds();
    window_exposed += reducer.last_exposed_seconds();
    total_comm += reducer.last_comm_seconds();
    total_exposed += reducer.last_exposed_seconds();
    window_peer_wait += reducer.last_exposed_peer_wait_seconds();
    total_exposed_peer_wait += reducer.last_exposed_peer_wait_seconds();
    total_peer_wait += reducer.last_peer_wait_seconds();
  };
  // The rest of the step-time breakdown (docs/architecture.md, "Step-time breakdown"): seconds
  // in forward (and the loss), backward (with the accumulation copies), the optimizer (unscale,
  // check, clip, update) and checkpoints, summed over the window and over the run.
  double window_forward = 0, window_backward = 0, window_optimizer = 0, window_checkpoint = 0;
  double total_forward = 0, total_backward = 0, total_optimizer = 0;
  std::vector<double> gathered;  // rank 0: every rank's window statistics
  ResourceTrack resources;       // rank 0: every rank's RSS and descriptors, window by window
  double last_window_loss = std::nan("");
  Clock::time_point window_start;  // set as the first step begins, and after each window
  std::int64_t window_steps = 0;

  // Checkpoints: rank 0 writes (the weights are replicated), synchronously or on its writer's
  // thread. Every decision to write or to stop is agreed at a step boundary by one small MAX
  // all-reduce (a signal may reach one rank only; rank 0's clock decides the timed ones).
  std::optional<CheckpointWriter> writer;
  if (root && !checkpointing.dir.empty()) {
    ckpt::SaveOptions save_options;
    save_options.keep = checkpointing.keep;
    save_options.keep_every = checkpointing.keep_every;
    save_options.debug_pause_ms = checkpointing.debug_pause_ms;
    writer.emplace(checkpointing.dir, save_options, checkpointing.async);
  }
  // The deadline of --train.time-limit and SLURM_JOB_END_TIME, less the stop margin (rank 0's).
  std::optional<Clock::time_point> deadline;
  world.run_agreed([&] {
    if (!root) return;
    const auto seconds = [](double s) {
      return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
    };
    if (config.loop.time_limit_s > 0)
      deadline = wall_start + seconds(config.loop.time_limit_s - config.loop.stop_margin_s);
    if (const auto left = slurm_seconds_left()) {
      const auto slurm_deadline = Clock::now() + seconds(*left - config.loop.stop_margin_s);
      deadline = deadline ? std::min(*deadline, slurm_deadline) : slurm_deadline;
    }
  });
  auto last_checkpoint_at = Clock::now();
  std::int64_t last_saved_step = -1;
  std::map<std::int64_t, double> stalls;  // rank 0: the stall of each write not yet reported

  std::int64_t step = start_step;               // optimizer steps
  std::int64_t micro_step = resume.micro_step;  // micro-batches, over the run: the dropout masks' key
  bool stopping = false;
  // Rank 0 on a terminal (--output.progress): a live bar under the step lines.
  ProgressBar progress(stdout, root ? progress_mode(config.progress) : ProgressBar::Mode::off,
                       total_steps, config.loop.epochs);
  // Rank 0: reports the writes that completed (all of them, when sync) with their stall.
  const auto report_checkpoints = [&] {
    if (!writer) return;
    for (const auto& written : writer->take_completed()) {
      const double stall = stalls[written.step];
      stalls.erase(written.step);
      summary.last_checkpoint = written.path;
      progress.clear();
      std::printf("checkpoint: wrote %s (%lld bytes, write %.3f s, stall %.3f s, %s)\n",
                  written.path.c_str(), static_cast<long long>(written.bytes), written.write_s,
                  stall, writer->async() ? "async" : "sync");
      std::fflush(stdout);
      JsonObject record;
      record.add("checkpoint", written.path).add("step", written.step).add("bytes", written.bytes)
          .add("write_s", written.write_s).add("stall_s", stall).add("async", writer->async());
      metrics.write(record);
    }
  };
  // Every rank: one checkpoint of the state after STEP, whose data cursor is (EPOCH, EPOCH_STEP).
  const auto save_checkpoint = [&](std::int64_t cursor_epoch, std::int64_t cursor_epoch_step) {
    const auto stall_start = Clock::now();
    comm::set_phase(comm::Phase::checkpoint);
    world.run_agreed([&] {
      if (!root) return;
      // MPTRAIN_FAULT=slow-checkpoint:0:MS: the write takes MS longer (the watchdog's test: a
      // rank writing a checkpoint is busy, not hung).
      if (state_->fault.kind == "slow-checkpoint" && state_->fault.rank == 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(state_->fault.step));
      // Synchronous: views of the live tensors, written before training goes on. Asynchronous:
      // copies, into the previous snapshot's buffers.
      // A model on the cuda device is always copied: the writer reads host memory.
      const bool copy = writer->async() || model->device() != Device::cpu;
      CheckpointSnapshot snapshot = copy ? writer->recycle() : CheckpointSnapshot();
      snapshot.meta = checkpoint_meta(step, cursor_epoch);
      std::vector<ckpt::NamedTensor> live;
      for (const auto& param : model->named_params()) live.push_back({param.name, param.value});
      take_tensors(live, copy, snapshot.weights);
      live.clear();
      for (const auto& buffer : model->named_buffers()) live.push_back({buffer.name, buffer.value});
      take_tensors(live, copy, snapshot.buffers);
      live.clear();
      for (const auto& tensor : optimizer->state()) live.push_back({tensor.name, tensor.value});
      ckpt::TrainingState& saved = snapshot.state;
      take_tensors(live, copy, saved.optimizer_tensors);
      saved.optimizer = config.optimizer.name;
      saved.optimizer_steps = optimizer->steps();
      saved.schedule_steps = optimizer->steps() + schedule_offset;
      const amp::LossScalerState& scaler_state = scaler.state();
      saved.loss_scale = scaler_state.scale;
      saved.scaler_growth_tracker = scaler_state.growth_tracker;
      saved.scaler_hysteresis_tracker = scaler_state.hysteresis_tracker;
      saved.scaler_skipped_steps = scaler_state.skipped_steps;
      saved.epoch = cursor_epoch;
      saved.epoch_step = cursor_epoch_step;
      saved.epoch_samples = cursor_epoch_step * global_batch * accumulate;
      saved.seed = config.loop.seed;
      saved.micro_step = micro_step;
      saved.batch_per_rank = batch;
      saved.accumulate = accumulate;
      saved.wall_time_s = seconds_since(wall_start);
      writer->write(std::move(snapshot));
      stalls[step] = seconds_since(stall_start);
      report_checkpoints();
    });
    window_checkpoint += seconds_since(stall_start);  // before the MAX: this rank's own
    if (timeline) timeline->span("checkpoint", Timeline::kTraining, stall_start, Clock::now(), step);
    const double stall = world.max(seconds_since(stall_start));
    summary.checkpoint_stall_s += stall;
    ++summary.checkpoints;
    last_saved_step = step;
    last_checkpoint_at = Clock::now();
  };

  // Everything a step needs is planned before the first one: the training thread's Tensor
  // allocations and the device arena's slabs (its cudaMalloc calls) inside steps are counted,
  // reported in summary.json and expected to be zero (tests/app/memory.sh). A few device
  // buffers are made by the kernels on first use, inside step 1, from the arena: cuBLASLt's
  // workspace (32 MiB), the reductions' slots, the bias gradients' partial rows. A free block
  // for them now, so that they take no slab of their own then.
  if (on_cuda) device_memory::reserve_cuda(kFirstUseDeviceScratchBytes);
  std::int64_t step_allocations = 0, step_slabs = 0;
  // A step's report, lag steps late: the scaler's state and the optimizer's step count mirrored
  // on the host (checkpoints, logs), the loss into the window, and what the device decided.
  const auto take_report = [&](const StepReport& report) {
    const kernels::StepState& s = report.state;
    const auto at = static_cast<long long>(report.step);
    if (s.first_bad_row != ~0ull)  // found by the cuda loss kernel, which cannot stop the job
      abort_job("kernels::cuda::softmax_xent_step: label " + std::to_string(s.bad_label) +
                " of row " + std::to_string(s.first_bad_row) + " is outside [0, " +
                std::to_string(model->num_classes()) + ") at step " + std::to_string(at));
    amp::LossScalerState mirrored;
    mirrored.scale = s.scale;
    mirrored.growth_tracker = static_cast<std::int64_t>(s.growth_tracker);
    mirrored.hysteresis_tracker = static_cast<std::int64_t>(s.hysteresis_tracker);
    mirrored.skipped_steps = static_cast<std::int64_t>(s.skipped_steps);
    scaler.set_state(mirrored);
    optimizer->set_steps(static_cast<std::int64_t>(s.applied_steps));
    window[0] += s.loss_sum;
    window[1] += s.correct;
    const bool loss_finite = std::isfinite(s.loss_sum);
    if (s.failed_at_min_scale != 0) {
      char scale[32];
      std::snprintf(scale, sizeof scale, "%g", s.scale);
      throw_user_error("gradients overflow even at the minimum loss scale " + std::string(scale) +
                           " at step " + std::to_string(at) + " (--amp.fail-at-min-scale)",
                       "the model diverged: lower --optimizer.lr, or train in bf16/fp32");
    }
    if (deferred && !loss_finite) {
      // Without a lag this was handled in the step itself, with the first non-finite layer.
      MPT_REQUIRE(skip_nonfinite_loss,
                  "non-finite loss at step " + std::to_string(at) +
                      " (seen on the device; the step was skipped. The first non-finite layer "
                      "is named with MPTRAIN_REPORT_LAG=0 on --device=cpu)",
                  "lower --optimizer.lr, check the data, or pass --amp.on-nonfinite-loss=skip");
      progress.clear();
      std::printf("step %lld: non-finite loss on %s, step skipped\n", at, process_where().c_str());
    }
    if (s.skip == 0) {
      lr = s.lr;  // of the last applied update, as logged
      if (clip_norm > 0) grad_norm = std::sqrt(s.grad_sumsq);
    } else if (root) {
      progress.clear();
      std::printf("step %lld: gradient overflow%s, loss scale %g -> %g, step skipped (%lld skipped so far)\n",
                  at, loss_finite ? "" : " or non-finite loss", s.old_scale, s.scale,
                  static_cast<long long>(s.skipped_steps));
    }
  };
  // Everything the device owes the host so far: the last all-reduce first, which the nccl backend
  // waits for a step late (a collective that failed or hangs is then reported and watched, not
  // waited for in the reports' copy, and the window's comm times are whole), then every step's
  // report.
  const auto drain_device = [&] {
    reducer.drain();
    take_reducer_times();
    while (const auto report = reports.next(/*drain=*/true)) take_report(*report);
  };
  // The first window starts here, not before the setup above (the checkpoint writer, the
  // deadline's agreement: a collective), which is no part of any step.
  window_start = Clock::now();
  for (std::int64_t epoch = resume.epoch; epoch < config.loop.epochs && step < total_steps && !stopping; ++epoch) {
    const auto epoch_start = Clock::now();
    const std::int64_t first_step = epoch == resume.epoch ? resume.epoch_step : 0;
    char step_range[32];  // "step N": the step's NVTX range
    for (std::int64_t epoch_step = first_step; epoch_step < steps_per_epoch && step < total_steps && !stopping;
         ++epoch_step) {
      const auto step_start = Clock::now();
      // NVTX ranges (core/profile.hpp) for Nsight Systems: the step, and inside it the phases
      // the timeline records.
      std::snprintf(step_range, sizeof step_range, "step %lld", static_cast<long long>(step + 1));
      profile::push(step_range);
      const std::int64_t allocations_before = tensor_allocations_on_this_thread();
      const std::int64_t slabs_before = on_cuda ? device_memory::cuda_arena_stats().slabs : 0;
      const std::int64_t first_batch = epoch_step * accumulate;
      // The epoch's last group may be short; its loss gradient scale follows its real size, so
      // the update is the mean over every sample of the group on every rank.
      const std::int64_t group = std::min(accumulate, batches_per_epoch - first_batch);
      const float grad_scale = 1.0f / static_cast<float>(global_batch * group);
      kernels::begin_step(step_state);
      const bool fault_now = state_->fault.rank == world.rank() && state_->fault.step == step + 1;
      const bool inject_nan = fault_now && state_->fault.kind == "nan-grad";
      fail_in_comm = fault_now && state_->fault.kind.rfind("comm-", 0) == 0;
      // The replayed step's join slot, when its buckets are in the graph (-1: they go at wait()).
      int replayed_slot = -1;
      for (std::int64_t micro = 0; micro < group; ++micro) {
        const bool last_micro = micro + 1 == group;
        const auto wait_start = Clock::now();
        comm::set_phase(comm::Phase::data, step + 1);
        profile::push("data_wait");
        const data::Batch& input = prefetcher.next();  // with --data.prefetch=0 this is the read
        profile::pop();
        const double data_wait = seconds_since(wait_start);
        if (timeline) timeline->span("data_wait", Timeline::kTraining, wait_start, Clock::now(), step + 1);
        window_data_wait += data_wait;
        total_data_wait += data_wait;
        if (input.epoch != epoch || input.step != first_batch + micro)
          abort_job("Trainer: prefetched batch (" + std::to_string(input.epoch) + ", " +
                    std::to_string(input.step) + ") is not the planned (" + std::to_string(epoch) +
                    ", " + std::to_string(first_batch + micro) + ")");
        // Dropout masks keyed by (seed, layer, global micro-batch, global sample index): the
        // same on resume, and different for each micro-batch of a step.
        const auto forward_start = Clock::now();
        model->set_rng(
            config.loop.seed, static_cast<std::uint64_t>(micro_step),
            static_cast<std::uint64_t>(world.rank()) * static_cast<std::uint64_t>(batch));
        comm::set_phase(comm::Phase::forward);
        profile::push("forward");
        // MPTRAIN_FAULT=slow-rank:RANK:MS: RANK's forward takes MS longer (a straggler).
        if (state_->fault.kind == "slow-rank" && state_->fault.rank == world.rank())
          std::this_thread::sleep_for(std::chrono::milliseconds(state_->fault.step));
        // MPTRAIN_FAULT=stall:RANK:STEP: RANK hangs in the forward of step STEP (the watchdog's
        // test: the others wait for it in the gradient all-reduce).
        if (fault_now && state_->fault.kind == "stall")
          for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
        // MPTRAIN_FAULT=exit|abort:RANK:STEP: RANK dies in the forward of step STEP, by exit(1)
        // without MPI_Finalize or by SIGABRT; the launcher must end the others.
        if (fault_now && (state_->fault.kind == "exit" || state_->fault.kind == "abort")) {
          std::fprintf(stderr, "mptrain: error: [%s] injected %s at step %lld (MPTRAIN_FAULT)\n",
                       process_where().c_str(), state_->fault.kind.c_str(),
                       static_cast<long long>(step + 1));
          std::fflush(stderr);
          if (state_->fault.kind == "exit") std::_Exit(1);
          std::abort();
        }
        // On cuda the prefetcher's I/O thread has already copied the batch over.
        const Tensor& delivered = on_cuda ? input.device_samples : input.samples;
        const Tensor& labels = on_cuda ? input.device_labels : input.labels;
        if (raw_u8)
          kernels::normalize_u8(delivered, normalized, normalization.scale, normalization.shift);
        const Tensor& samples = raw_u8 ? normalized : delivered;
        // --cuda.graphs, after an eager full batch (graph_warmed): the batch goes into fixed
        // buffers, and forward, loss and backward replay from one graph (captured at the first
        // such step), with the gradient all-reduce where graph_buckets; a short batch runs
        // eagerly. Without graph_buckets, buckets all go at wait(): no hook. Each of these
        // choices is the same on every rank.
        const bool replayed =
            graphs && graph_warmed && samples.dim(0) == batch && step + 1 != eager_fault_step;
        // Without a lag the step's loss so far is read on the host, before and after this
        // micro-batch's (free: host memory), so that the skip line is printed once per step.
        const bool finite_before =
            deferred || std::isfinite(kernels::detail::host_step_state("Trainer", step_state).loss_sum);
        if (replayed) {
          kernels::copy(samples, graph_samples);
          kernels::copy(labels, graph_labels);
          if (graph_buckets) replayed_slot = reducer.next_join_slot();
          kernels::StepGraph& graph = forward_backward_graphs[std::max(0, replayed_slot)];
          if (!graph.captured()) {
            // The communicator's calls (sync BN's sums, and the buckets where graph_buckets)
            // become nodes of the graph, made by this thread (nothing of the reducer is in
            // flight here: the previous step's wait() is done, and this step begins inside).
            const bool capture_calls = config.model.sync_bn || graph_buckets;
            // Ends the reducer's capture mode however the capture ends (a throw from the body
            // included), so that nothing after it takes an eager call for a captured one.
            struct EndCapture {
              comm::GradientReducer* reducer;
              ~EndCapture() {
                if (reducer != nullptr) reducer->capture_on(nullptr);
              }
            };
            if (capture_calls) reducer.capture_on(kernels::capture_stream());
            const EndCapture end_capture{capture_calls ? &reducer : nullptr};
            graph.capture([&] {
              if (graph_buckets) {
                reducer.begin();
                accumulating = false;  // no accumulation under graphs
                poison_in_hook = false;  // a host-decided NaN takes an eager step (above)
              }
              const Tensor& logits = model->forward(graph_samples, /*training=*/true);
              kernels::softmax_xent_step(logits, graph_labels, dlogits, grad_scale, step_state);
              const bool graph_hook = graph_buckets && overlap && reducer.num_buckets() > 1;
              model->backward(dlogits, graph_hook ? launch_buckets : no_hook);
              if (graph_buckets) {
                // The hook poisons before the bucket of element 0 launches; without it, here.
                if (!graph_hook && deferred) kernels::poison_if_nonfinite_loss(grads, step_state);
                reducer.wait();
              }
            });
          }
          graph.replay();
          ++graph_replays;
        } else {
          const Tensor& logits = model->forward(samples, /*training=*/true);
          // dlogits carry the loss scale, read from the step state on its device.
          kernels::softmax_xent_step(logits, labels, dlogits, grad_scale, step_state);
        }
        const auto backward_start = Clock::now();
        profile::pop();
        comm::set_phase(comm::Phase::backward);
        profile::push("backward");
        window_forward += std::chrono::duration<double>(backward_start - forward_start).count();
        // Known here only without a lag (the state is host memory, read at once): the sum over
        // the step's micro-batches so far. Deferred, it is taken as finite: backward runs, and
        // the device poisons a non-finite loss's gradients before the all-reduce.
        const bool loss_finite =
            deferred || std::isfinite(kernels::detail::host_step_state("Trainer", step_state).loss_sum);
        // Only the last micro-batch communicates; its buckets go out while backward runs. A rank
        // that must skip the step (a non-finite loss under --amp.on-nonfinite-loss=skip, an
        // injected fault) writes a NaN into its gradients, which the all-reduce carries to every
        // rank. Where backward runs with the hook, the hook writes it just before the last
        // bucket launches, so every rank launches the same buckets at the same points: with
        // sync BN, whose collectives queue between the buckets, the order must not depend on
        // a rank's loss.
        const bool run_backward = loss_finite || config.model.sync_bn;
        // One bucket goes at wait() anyway: no hook, so backward keeps its single dW GEMMs.
        const bool hooked =
            !graphs && last_micro && run_backward && overlap && reducer.num_buckets() > 1;
        const bool must_poison =
            (!loss_finite && skip_nonfinite_loss) || (last_micro && inject_nan);
        if (last_micro && replayed_slot < 0) {
          reducer.begin();
          accumulated_until = grads.numel();
          accumulating = group > 1;
          poison_in_hook = must_poison;
        }
        if (run_backward && !replayed) model->backward(dlogits, hooked ? launch_buckets : no_hook);
        if (run_backward && !replayed && samples.dim(0) == batch) graph_warmed = true;
        if (!loss_finite && !skip_nonfinite_loss) {
          const std::string layer = model->first_nonfinite_layer(samples);
          throw_user_error("non-finite loss at step " + std::to_string(step + 1) +
                               (layer.empty() ? std::string(" (all activations finite: the labels or the loss overflowed)")
                                              : " (first non-finite activations: layer " + layer + ")"),
                           "lower --optimizer.lr, check the data, or pass --amp.on-nonfinite-loss=skip");
        }
        if (!loss_finite && finite_before) progress.clear();
        if (!loss_finite && finite_before)
          std::printf("step %lld: non-finite loss on %s, step skipped\n", static_cast<long long>(step + 1),
                      process_where().c_str());
        prefetcher.release();  // backward was the last reader of the inputs: refill the slot now
        if (!last_micro) {
          // A NaN is carried along in the sum, so the step is still skipped everywhere.
          if (must_poison) poison(grads);
          if (micro == 0 && grads.dtype() == DType::f32) kernels::copy(grads, accumulated);
          else if (micro == 0) kernels::cast(grads, accumulated);
          else kernels::add(accumulated, grads, accumulated);
        } else if (!hooked && replayed_slot < 0) {
          // No backward ran on this rank (non-finite loss), or it ran without the hook (graphs,
          // overlap off): nothing is launched yet, so the gradients can still be written; every
          // bucket goes at wait(). (A replay with the buckets did all of this in the graph.)
          if (accumulating) add_accumulated(0);
          if (deferred) kernels::poison_if_nonfinite_loss(grads, step_state);
          if (must_poison) poison(grads);
        }
        window_backward += seconds_since(backward_start);
        profile::pop();
        if (timeline) {
          timeline->span("forward", Timeline::kTraining, forward_start, backward_start, step + 1);
          timeline->span("backward", Timeline::kTraining, backward_start, Clock::now(), step + 1);
        }
        window[2] += static_cast<double>(batch);  // the loss and correct sums: from the reports
        ++micro_step;
      }
      if (fail_in_comm) {  // not injected by the hook (overlap off): after the first bucket
        fail_in_comm = false;
        reducer.ready_from(reducer.bucket(0).begin);
        reducer.run_collective(injected_comm_failure);
      }
      const auto wait_called = Clock::now();
      comm::set_phase(comm::Phase::allreduce);
      profile::push("allreduce_wait");
      // A replay with the buckets queued its all-reduce in the graph: the host waits for the
      // previous step's, as wait() does.
      if (replayed_slot >= 0) reducer.replayed(replayed_slot);
      else reducer.wait();
      take_reducer_times();
      profile::pop();
      const auto optimizer_start = Clock::now();
      comm::set_phase(comm::Phase::optimizer);
      profile::push("optimizer");
      if (timeline) {
        timeline->span("allreduce_wait", Timeline::kTraining, wait_called, optimizer_start, step + 1);
        // A replay's buckets were queued by the graph's launch: no host span to show.
        const std::size_t spans = replayed_slot >= 0 ? 0 : reducer.last_bucket_spans().size();
        for (std::size_t b = 0; b < spans; ++b) {
          const auto& bucket = reducer.last_bucket_spans()[b];
          // The step's tail may run on the training thread, inside wait().
          const auto track = bucket.by_caller ? Timeline::kTraining : Timeline::kCommunication;
          timeline->span("allreduce_bucket", track, bucket.start, bucket.end, step + 1);
          if (bucket.peer_wait.measured)
            timeline->span("peer_wait", track, bucket.peer_wait.start, bucket.peer_wait.end, step + 1);
        }
      }
      // After the all-reduce every rank holds the same gradients, so every rank reaches the
      // same verdict here and skips (or applies) the same steps with no further collective.
      // Every decision is a kernel on the gradients' device; the host hears of it in a report.
      Tensor working_grads[1] = {model->grads()};
      Tensor master_grads[1] = {model->master_grads()};
      const auto decide_and_update = [&] {
        kernels::unscale_and_check_step(working_grads, master_grads, step_state);
        kernels::decide_step(step_state, scale_rule, schedule_table);
        // The masters hold the unscaled, all-reduced gradients: the same norm on every rank.
        if (clip_norm > 0) kernels::clip_grad_norm(model->master_grads(), step_state, clip_norm);
        optimizer->step(step_state);  // nothing when skipped; under 16 bits, the recast too
      };
      if (graphs && step > start_step) {
        if (!optimizer_graph.captured()) optimizer_graph.capture(decide_and_update);
        optimizer_graph.replay();
      } else {
        decide_and_update();
      }
      reports.record(step + 1);
      while (const auto report = reports.next(/*drain=*/false)) take_report(*report);
      window_optimizer += seconds_since(optimizer_start);
      profile::pop();  // optimizer
      profile::pop();  // the step
      if (timeline) timeline->span("optimizer", Timeline::kTraining, optimizer_start, Clock::now(), step + 1);
      train_seconds += seconds_since(step_start);
      step_allocations += tensor_allocations_on_this_thread() - allocations_before;
      if (on_cuda) step_slabs += device_memory::cuda_arena_stats().slabs - slabs_before;
      ++step;
      ++window_steps;
      progress.update(step, epoch, step * global_batch * accumulate);

      // MPTRAIN_FAULT=stop-signal:RANK:STEP: RANK gets SIGUSR1 as step STEP ends, as from a
      // scheduler (to the process, as kill sends it), at a step the tests can name: it waits
      // until the signal is recorded, which the routing thread does a moment later.
      if (fault_now && state_->fault.kind == "stop-signal") {
        kill(getpid(), SIGUSR1);
        for (int waited_ms = 0; StopSignals::received() == 0 && waited_ms < 10000; ++waited_ms)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      // Stop and checkpoint decisions, agreed: a stop signal on any rank, rank 0's timed
      // checkpoint or deadline, a failed asynchronous write on rank 0.
      double decide[4] = {StopSignals::received() != 0 ? 1.0 : 0.0, 0, 0, 0};
      if (root) {
        report_checkpoints();
        decide[1] = checkpointing.every_minutes > 0 &&
                    seconds_since(last_checkpoint_at) >= 60 * checkpointing.every_minutes;
        decide[2] = deadline && Clock::now() >= *deadline;
        decide[3] = writer && writer->failed();
      }
      const auto agree_start = Clock::now();
      comm::set_phase(comm::Phase::agree);
      world.allreduce_max(decide, 4);
      // Waiting here is waiting for the slowest rank, like the all-reduce's exposed part: the
      // breakdown counts it there.
      window_exposed += seconds_since(agree_start);
      if (decide[3] > 0) world.run_agreed([&] { if (root) writer->finish(); });  // rethrows there
      if (decide[0] > 0 || decide[2] > 0) {
        stopping = true;
        summary.stop_reason = decide[0] > 0 ? "signal" : "time-limit";
      }
      const bool epoch_ends = epoch_step + 1 == steps_per_epoch;
      const bool checkpoint_now =
          !checkpointing.dir.empty() && step < total_steps &&
          (stopping || decide[1] > 0 ||
           (checkpointing.every_steps > 0 && step % checkpointing.every_steps == 0));
      const bool log_now = step % config.loop.log_every == 0 || step == total_steps ||
                           epoch_step + 1 == steps_per_epoch || stopping;
      // A checkpoint and a step line need every step's verdict so far: the last reports first.
      if (checkpoint_now || log_now) drain_device();
      if (checkpoint_now)
        save_checkpoint(epoch_ends ? epoch + 1 : epoch, epoch_ends ? 0 : epoch_step + 1);
      if (!log_now) continue;
      comm::set_phase(comm::Phase::log);
      window[3] = static_cast<double>(skipped_samples());
      const auto log_sum_start = Clock::now();
      world.allreduce_sum(window, 4);
      // As at the agreement above: waiting for the slowest rank, counted as exposed.
      window_exposed += seconds_since(log_sum_start);
      // Every rank's breakdown reaches rank 0 in one gather per window: it logs the maximum of
      // each part (the slowest rank sets the pace) and names a straggler.
      // With them, this rank's resident set and descriptors (a few /proc reads per window).
      const double mine[kBreakdownFields] = {seconds_since(window_start), window_data_wait,
                                             window_forward, window_backward, window_comm,
                                             window_exposed, window_optimizer, window_checkpoint,
                                             resident_set_mb(), open_file_descriptors(),
                                             window_peer_wait};
      world.gather(mine, kBreakdownFields, gathered, 0);
      const double loss = window[0] / window[2];
      last_window_loss = loss;
      if (root) {
        const WindowBreakdown parts = summarize_breakdown(gathered, world.size());
        resources.add(gathered, world.size());
        progress.clear();
        progress.set_loss(loss);
        // Throughput is training's: the checkpoints' stall is reported beside it, not in it.
        const double training_seconds = parts.max[kWindowSeconds] - parts.max[kCheckpoint];
        const double samples_per_s = training_seconds > 0 ? window[2] / training_seconds : 0;
        const double data_wait_fraction =
            parts.max[kWindowSeconds] > 0 ? parts.max[kDataWait] / parts.max[kWindowSeconds] : 0;
        const auto per_step_ms = [&](int field) {
          return 1e3 * parts.max[field] / static_cast<double>(std::max<std::int64_t>(window_steps, 1));
        };
        // The exposed time's wait for late peers (the ranks' skew), where the shm backend
        // measures it.
        char peers[48] = "";
        if (measures_peer_wait)
          std::snprintf(peers, sizeof peers, ", peers %.3f s", parts.max[kPeerWait]);
        std::printf("step %lld/%lld  epoch %lld  loss %.4f  train_acc %.4f  lr %g  %.0f samples/s"
                    "  data_wait %.1f%%  comm %.3f s (exposed %.3f s%s)  ms/step: data %.2f fwd %.2f"
                    " bwd %.2f exposed %.2f opt %.2f ckpt %.2f other %.2f\n",
                    static_cast<long long>(step), static_cast<long long>(total_steps),
                    static_cast<long long>(epoch), loss, window[1] / window[2], lr,
                    samples_per_s, 100 * data_wait_fraction, parts.max[kComm], parts.max[kExposed], peers,
                    per_step_ms(kDataWait), per_step_ms(kForward), per_step_ms(kBackward),
                    per_step_ms(kExposed), per_step_ms(kOptimizer), per_step_ms(kCheckpoint),
                    1e3 * parts.max_other / static_cast<double>(std::max<std::int64_t>(window_steps, 1)));
        if (parts.straggler >= 0)
          std::printf("straggler: rank %d busy %.2f ms/step, %.2fx the median rank's %.2f ms\n",
                      parts.straggler,
                      1e3 * parts.straggler_busy / static_cast<double>(std::max<std::int64_t>(window_steps, 1)),
                      parts.straggler_busy / parts.median_busy,
                      1e3 * parts.median_busy / static_cast<double>(std::max<std::int64_t>(window_steps, 1)));
        std::fflush(stdout);
        JsonObject record;
        record.add("step", step).add("epoch", epoch).add("loss", loss)
            .add("train_accuracy", window[1] / window[2]).add("lr", lr)
            .add("samples_per_s", samples_per_s).add("window_steps", window_steps)
            .add("window_s", parts.max[kWindowSeconds])
            .add("data_wait_s", parts.max[kDataWait]).add("data_wait_fraction", data_wait_fraction)
            .add("forward_s", parts.max[kForward]).add("backward_s", parts.max[kBackward])
            .add("comm_time_s", parts.max[kComm]).add("exposed_comm_time_s", parts.max[kExposed])
            .add("optimizer_s", parts.max[kOptimizer]).add("checkpoint_s", parts.max[kCheckpoint])
            .add("other_s", parts.max_other).add("accounted_fraction", parts.min_accounted)
            .add("straggler_rank", parts.straggler)
            .add("straggler_ratio", parts.straggler >= 0 ? parts.straggler_busy / parts.median_busy : 0.0)
            .add("loss_scale", scaler.scale()).add("skipped_steps", scaler.state().skipped_steps)
            .add("skipped_samples", static_cast<std::int64_t>(window[3]))
            .add_raw("rss_mb", json_array(resources.rss_last, false))
            .add_raw("open_fds", json_array(resources.fds_last, true));
        if (grad_norm >= 0) record.add("grad_norm", grad_norm);
        if (measures_peer_wait) record.add("exposed_peer_wait_s", parts.max[kPeerWait]);
        metrics.write(record);
        if (state_->tensorboard)
          state_->tensorboard->scalars(
              step, {{"train/loss", loss}, {"train/accuracy", window[1] / window[2]},
                     {"train/lr", lr}, {"train/loss_scale", scaler.scale()},
                     {"train/samples_per_s", samples_per_s},
                     {"step_time_ms/data_wait", per_step_ms(kDataWait)},
                     {"step_time_ms/forward", per_step_ms(kForward)},
                     {"step_time_ms/backward", per_step_ms(kBackward)},
                     {"step_time_ms/comm", per_step_ms(kComm)},
                     {"step_time_ms/exposed_comm", per_step_ms(kExposed)},
                     {"step_time_ms/optimizer", per_step_ms(kOptimizer)},
                     {"step_time_ms/checkpoint", per_step_ms(kCheckpoint)}});
      }
      summary.skipped_samples = static_cast<std::int64_t>(window[3]);
      window[0] = window[1] = window[2] = window[3] = 0;
      total_forward += window_forward;
      total_backward += window_backward;
      total_optimizer += window_optimizer;
      window_data_wait = window_forward = window_backward = window_optimizer = 0;
      if (timeline) timeline->flush();  // once per window: no file I/O in the step
      window_comm = window_exposed = window_checkpoint = window_peer_wait = 0;
      window_steps = 0;
      window_start = Clock::now();
    }

    summary.epochs = epoch + 1;
    const bool epoch_complete = step % steps_per_epoch == 0;
    const bool last = step >= total_steps;
    if (test_reader && (epoch_complete || last) && !stopping) {
      const auto eval_start = Clock::now();
      comm::set_phase(comm::Phase::evaluate);
      // Without sync BN every rank's running statistics drift apart; evaluate (and later save)
      // rank 0's on every rank, as PyTorch DDP broadcasts buffers, so that this evaluation is
      // the one `eval` and `predict` reproduce from the checkpoint.
      if (model->buffers().numel() > 0) broadcast_from_root(model->buffers(), world);
      const EvalResult eval = evaluate(*model, *test_reader, batch, world);
      summary.test_loss = eval.loss;
      summary.test_accuracy = eval.accuracy;
      summary.test_top5_accuracy = eval.top5_accuracy;
      if (root) {
        progress.clear();
        std::printf("epoch %lld done in %.1f s: test_loss %.4f  test_accuracy %.4f  test_top5 %.4f  (%lld samples, eval %.1f s)\n",
                    static_cast<long long>(epoch), seconds_since(epoch_start), eval.loss,
                    eval.accuracy, eval.top5_accuracy, static_cast<long long>(eval.samples),
                    seconds_since(eval_start));
        std::fflush(stdout);
        JsonObject record;
        record.add("step", step).add("epoch", epoch).add("test_loss", eval.loss)
            .add("test_accuracy", eval.accuracy).add("test_top5_accuracy", eval.top5_accuracy)
            .add("test_samples", eval.samples);
        metrics.write(record);
        if (state_->tensorboard)
          state_->tensorboard->scalars(step, {{"test/loss", eval.loss},
                                              {"test/accuracy", eval.accuracy},
                                              {"test/top5_accuracy", eval.top5_accuracy}});
      }
      window_start = Clock::now();  // evaluation time is not training throughput
    }
  }

  comm::set_phase(comm::Phase::finish);
  drain_device();  // nothing left after the last step's line; kept for a loop that ends early
  progress.clear();
  prefetcher.stop();
  summary.steps = step;
  summary.loss_scale = scaler.scale();
  summary.skipped_steps = scaler.state().skipped_steps;
  summary.final_train_loss = last_window_loss;
  summary.optimizer_steps = optimizer->steps();
  summary.base_lr = state_->base_lr;
  summary.last_lr = optimizer->steps() > 0 ? lr : 0;
  summary.grad_norm = grad_norm;
  // The slowest rank sets the pace of synchronous training.
  const Device train_device = on_cuda ? Device::cuda : Device::cpu;
  double run_max[14] = {train_seconds, total_data_wait, total_comm, total_exposed,
                        total_forward + window_forward, total_backward + window_backward,
                        total_optimizer + window_optimizer,
                        static_cast<double>(step_allocations), static_cast<double>(step_slabs),
                        static_cast<double>(tensor_memory_stats(train_device).peak_bytes),
                        static_cast<double>(device_memory::cuda_arena_stats().reserved_bytes),
                        total_exposed_peer_wait, total_comm - total_peer_wait,
                        total_exposed - total_exposed_peer_wait};
  world.allreduce_max(run_max, 14);
  if (measures_peer_wait) {
    summary.exposed_peer_wait_s = run_max[11];
    summary.comm_excluding_peer_wait_s = run_max[12];
    summary.exposed_comm_excluding_peer_wait_s = run_max[13];
  }
  summary.step_tensor_allocations = static_cast<std::int64_t>(run_max[7]);
  summary.step_device_slabs = static_cast<std::int64_t>(run_max[8]);
  summary.tensor_peak_mb = run_max[9] / (1 << 20);
  summary.device_reserved_mb = run_max[10] / (1 << 20);
  summary.forward_s = run_max[4];
  summary.backward_s = run_max[5];
  summary.optimizer_s = run_max[6];
  train_seconds = run_max[0];
  summary.data_wait_s = run_max[1];
  summary.data_wait_fraction = train_seconds > 0 ? summary.data_wait_s / train_seconds : 0;
  summary.comm_time_s = run_max[2];
  summary.exposed_comm_time_s = run_max[3];
  summary.samples_per_s =
      train_seconds > 0 ? static_cast<double>((micro_step - resume.micro_step) * global_batch) / train_seconds : 0;
  if (config.model.sync_bn) model->set_stats_reducer({});  // it refers to this function's locals

  // The last checkpoint: the state at the end (unless the stop already wrote it, or a resumed
  // run had nothing left to do), then every write finished before the run reports.
  if (!checkpointing.dir.empty() && last_saved_step != step &&
      (step > start_step || !resume.from_checkpoint))
    save_checkpoint(step / steps_per_epoch, step % steps_per_epoch);
  world.run_agreed([&] {
    if (timeline) timeline->close();
    if (!writer) return;
    writer->finish();
    report_checkpoints();
  });
  if (root && stopping) {
    std::printf("stopped %s at step %lld, checkpoint %s\n",
                summary.stop_reason == "signal" ? "by signal" : "for the time limit",
                static_cast<long long>(step),
                summary.last_checkpoint.empty() ? "none (no --checkpoint.dir)" : summary.last_checkpoint.c_str());
    std::fflush(stdout);
  }
  if (root && resume.from_checkpoint && step == start_step)
    std::printf("nothing to train: the checkpoint is at step %lld, the run ends at step %lld\n",
                static_cast<long long>(start_step), static_cast<long long>(total_steps));
  summary.resumed_from_step = resume.from_checkpoint ? resume.checkpoint_step : -1;

  summary.wall_s = world.max(seconds_since(wall_start));
  if (root) {
    JsonObject json;
    json.add("world_size", world.size()).add("nodes", state_->topology->num_nodes())
        .add("batch_per_rank", batch).add("global_batch", global_batch)
        .add("epochs", summary.epochs).add("steps", summary.steps)
        .add("final_train_loss", summary.final_train_loss)
        .add("test_loss", test_reader ? summary.test_loss : std::nan(""))
        .add("test_accuracy", test_reader ? summary.test_accuracy : std::nan(""))
        .add("test_top5_accuracy", test_reader ? summary.test_top5_accuracy : std::nan(""))
        .add("samples_per_s", summary.samples_per_s).add("train_s", train_seconds)
        .add("data_wait_s", summary.data_wait_s).add("data_wait_fraction", summary.data_wait_fraction)
        .add("comm_time_s", summary.comm_time_s).add("exposed_comm_time_s", summary.exposed_comm_time_s)
        .add("forward_s", summary.forward_s).add("backward_s", summary.backward_s)
        .add("optimizer_s", summary.optimizer_s)
        .add("exposed_comm_fraction", summary.comm_time_s > 0 ? summary.exposed_comm_time_s / summary.comm_time_s : 0.0)
        .add("exposed_peer_wait_s", summary.exposed_peer_wait_s)
        .add("comm_excluding_peer_wait_s", summary.comm_excluding_peer_wait_s)
        .add("exposed_comm_excluding_peer_wait_s", summary.exposed_comm_excluding_peer_wait_s)
        .add("allreduce", comm::algorithm_name(state_->allreduce.algorithm))
        .add("allreduce_intra", comm::intra_name(state_->allreduce.intra))
        .add("wire_dtype", dtype_name(state_->allreduce.wire))
        // Where the buckets were reduced: in place in host memory, through the staged host twin
        // (cuda under the MPI backends), or queued on NCCL's stream on the device.
        .add("gradient_path", staged ? "staged" : reducer.allreducer().queues() ? "device" : "host")
        // Where sync BN summed its statistics: off, host memory (cpu), staged (cuda through a
        // host copy: the host backends, or nccl across nodes) or device (NCCL's stream).
        .add("bn_stats_path", reducer.stats_path())
        .add("graph_replays", graph_replays)
        // Where a replayed step's gradient all-reduce ran: inside the graph (overlapping
        // backward), after it (at wait()), or none without --cuda.graphs.
        .add("graph_allreduce", !graphs ? "none" : graph_buckets ? "in-graph" : "after-graph")
        .add("overlap", overlap)
        .add("buckets", reducer.num_buckets()).add("accumulate", accumulate)
        .add("precision", config.amp.precision).add("loss_scale", summary.loss_scale)
        .add("skipped_steps", summary.skipped_steps).add("skipped_samples", summary.skipped_samples)
        .add("wall_s", summary.wall_s).add("model", model->spec()).add("num_params", model->num_params())
        .add("stop_reason", summary.stop_reason).add("resumed_from_step", summary.resumed_from_step)
        .add("checkpoints", summary.checkpoints).add("checkpoint_stall_s", summary.checkpoint_stall_s)
        .add("last_checkpoint", summary.last_checkpoint)
        .add("device", on_cuda ? "cuda" : "cpu")
        .add("step_tensor_allocations", summary.step_tensor_allocations)
        .add("step_device_slabs", summary.step_device_slabs)
        .add("tensor_peak_mb", summary.tensor_peak_mb)
        .add("device_reserved_mb", summary.device_reserved_mb)
        .add("matmul", kernels::matmul_backend() == kernels::MatmulBackend::dnnl ? "onednn" : "blas")
        .add("gemm_operands", gemm_16 ? config.amp.precision : std::string("fp32"))
        .add("conv_path", conv_path(*model))
        .add("mptrain_version", MPTRAIN_VERSION).add("git_hash", git_hash());
    // Each rank's resident set (MiB) and open descriptors over the logged windows (issue #11).
    if (!resources.rss_first.empty())
      json.add_raw("rss_mb_first", json_array(resources.rss_first, false))
          .add_raw("rss_mb_last", json_array(resources.rss_last, false))
          .add_raw("rss_mb_max", json_array(resources.rss_max, false))
          .add_raw("open_fds_first", json_array(resources.fds_first, true))
          .add_raw("open_fds_last", json_array(resources.fds_last, true))
          .add_raw("open_fds_max", json_array(resources.fds_max, true));
    if (!config.output_dir.empty()) write_text_file(config.output_dir + "/summary.json", json.str());
    std::printf("done: %lld steps, %.0f samples/s, final train loss %.4f", static_cast<long long>(step),
                summary.samples_per_s, summary.final_train_loss);
    if (world.size() > 1 && summary.comm_time_s > 0) {  // one rank reduces nothing
      std::printf(", comm %.2f s (%.0f%% exposed", summary.comm_time_s,
                  100 * summary.exposed_comm_time_s / summary.comm_time_s);
      if (summary.exposed_peer_wait_s >= 0)
        std::printf(", %.2f s of it waiting for peers", summary.exposed_peer_wait_s);
      std::printf(")");
    }
    if (test_reader && summary.test_accuracy >= 0) std::printf(", test accuracy %.4f", summary.test_accuracy);
    std::printf(", %.1f s\n", summary.wall_s);
    std::printf("memory: tensors peak %.1f MiB on %s", summary.tensor_peak_mb, on_cuda ? "cuda" : "cpu");
    if (on_cuda) std::printf(" (device arena %.0f MiB reserved)", summary.device_reserved_mb);
    std::printf(", %lld tensor allocations inside steps", static_cast<long long>(summary.step_tensor_allocations));
    if (on_cuda) std::printf(", %lld cudaMalloc", static_cast<long long>(summary.step_device_slabs));
    std::printf("\n");
    std::fflush(stdout);
  }
  return summary;
}

}  // namespace mpt::train
