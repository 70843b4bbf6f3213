// Option tables and parsing for every subcommand (see cli.hpp).
#include "app/cli.hpp"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "core/error.hpp"

namespace po = boost::program_options;

namespace mpt::app {
namespace {

constexpr unsigned kHelpWidth = 100;
const char* kHelpHint = "`mptrain %s --help` lists every option with its default";

std::string help_hint(const std::string& command) {
  char text[128];
  std::snprintf(text, sizeof(text), kHelpHint, command.c_str());
  return text;
}

// The options shared by `train` and `eval`, so that one config file serves both.
po::options_description train_options(TrainCommand& out) {
  auto& run = out.run;
  auto& time_limit_text = out.time_limit_text;
  auto& stop_margin_text = out.stop_margin_text;
  po::options_description data("[data]", kHelpWidth, kHelpWidth / 2);
  data.add_options()
      ("data.train", po::value(&run.data.train_path), "training set (HDF5, see docs/data-format.md)")
      ("data.test", po::value(&run.data.test_path)->implicit_value(""), "test set, evaluated after every epoch (empty: none)")
      ("data.samples", po::value(&run.data.samples_name)->default_value(""),
       "name of the samples dataset (empty: the file's samples_dataset attribute, else 'samples')")
      ("data.labels", po::value(&run.data.labels_name)->default_value(""),
       "name of the labels dataset (empty: the file's labels_dataset attribute, else 'labels')")
      ("data.chunk-cache-mb", po::value(&run.data.chunk_cache_mb)->default_value(64), "HDF5 chunk cache per dataset, MiB")
      ("data.shuffle", po::value(&run.data.shuffle)->default_value("global"),
       "global | window (shuffle inside windows of data.shuffle-window samples, and the windows' order) | none")
      ("data.shuffle-window", po::value(&run.data.shuffle_window)->default_value(65536), "samples per window for data.shuffle=window")
      ("data.drop-last", po::value(&run.data.drop_last)->default_value(true),
       "drop the last incomplete global batch of an epoch (false: pad it by wrapping around)")
      ("data.num-classes", po::value(&run.data.num_classes)->default_value(0), "classes, for files without a num_classes attribute (0: the file's)")
      ("data.mean", po::value(&run.data.mean)->default_value(std::nan(""), "file"),
       "normalisation mean of [0,1]-scaled uint8 pixels, for files without a mean attribute (default 0)")
      ("data.std", po::value(&run.data.std)->default_value(std::nan(""), "file"),
       "normalisation std, for files without a std attribute (default 1)")
      ("data.sample-shape", po::value(&run.data.sample_shape)->default_value(""), "reshape each sample, e.g. 1,28,28 (empty: as stored)")
      ("data.on-nonfinite", po::value(&run.data.on_nonfinite)->default_value("error"),
       "error | skip: a float sample with NaN/Inf stops the run, or is left out (zeroed, label ignored) and counted")
      ("data.prefetch", po::value(&run.data.prefetch)->default_value(2),
       "batches read ahead by background I/O threads (0: read synchronously in the training step)")
      ("data.io-threads", po::value(&run.data.io_threads)->default_value(1),
       "I/O threads, each filling whole batches (at most data.prefetch)")
      ("data.normalize", po::value(&run.data.normalize)->default_value("auto"),
       "where uint8 samples become (x/255 - mean)/std: reader (on the I/O thread) | device (the "
       "stored bytes travel, a quarter of the f32 bytes, and the training device converts them) | "
       "auto (device on cuda, reader on the cpu); float samples are always read as they are")
      ("data.cache", po::value(&run.data.cache)->default_value("none"),
       "none | memory: keep every training sample read in memory, so later epochs read no file")
      ("data.cache-limit-mb", po::value(&run.data.cache_limit_mb)->default_value(0),
       "memory data.cache may plan per rank, MiB (0: available memory / ranks per node)")
      ("data.debug-read-delay-ms", po::value(&run.data.debug_read_delay_ms)->default_value(0),
       "testing aid: sleep this long in every batch read, to emulate slow storage");
  po::options_description model("[model]", kHelpWidth, kHelpWidth / 2);
  model.add_options()
      ("model.name", po::value(&run.model.name)->default_value("mlp"), "built-in model: mlp (784-1024-1024-10) | cnn (two 5x5 conv + pool blocks, dense 512) | resnet-mini (conv16, 3 residual blocks with BN, gap)")
      ("model.layers", po::value(&run.model.layers), "layer spec (overrides model.name): dense:N, conv:C:K[:stride=S][:pad=P], maxpool:K, avgpool:K, gap, flatten, relu, gelu, bn, dropout:P, resblock:C[:stride=S] (docs/model-spec.md)")
      ("model.print", po::value(&run.model.print)->default_value(false)->implicit_value(true),
       "print layers, output shapes, parameters and FLOPs per sample")
      ("model.init", po::value(&run.model.init)->default_value("default"),
       "weight init: default (conv He uniform, dense PyTorch nn.Linear) | he | xavier (biases 0)")
      ("model.sync-bn", po::value(&run.model.sync_bn)->default_value(false)->implicit_value(true),
       "BatchNorm statistics over the global batch (an all-reduce per BN layer, forward and backward)");
  po::options_description loop("[train]", kHelpWidth, kHelpWidth / 2);
  loop.add_options()
      ("train.epochs", po::value(&run.loop.epochs)->default_value(1), "passes over the training set")
      ("train.max-steps", po::value(&run.loop.max_steps)->default_value(0), "stop after this many steps (0: no limit)")
      ("train.batch-size", po::value(&run.loop.batch_size)->default_value(64), "samples per rank per step; global batch = this x ranks")
      ("train.seed", po::value(&run.loop.seed)->default_value(42), "seed of weight initialisation and shuffling")
      ("train.log-every", po::value(&run.loop.log_every)->default_value(50), "log and write metrics every N steps")
      ("train.time-limit", po::value(&time_limit_text)->default_value(""),
       "HH:MM:SS (or seconds): stop cleanly with a checkpoint this long after the start, less the stop margin (empty: none; SLURM_JOB_END_TIME also sets one)")
      ("train.stop-margin", po::value(&stop_margin_text)->default_value("00:02:00"),
       "HH:MM:SS (or seconds) kept free before a time limit for the last checkpoint")
      ("train.accumulate", po::value(&run.loop.accumulate)->default_value(1),
       "micro-batches per optimizer step (gradient accumulation; communicates on the last only)")
      ("train.precision", po::value(&run.amp.precision)->default_value("fp32"),
       "fp32 | fp16 | bf16: storage of weights, activations and gradients (FP32 masters, FP32 compute)")
      ("train.threads", po::value(&out.runtime.threads)->default_value(0),
       "compute threads per rank (0: OMP_NUM_THREADS if set, else the rank's cores / ranks sharing them)");
  po::options_description amp("[amp]", kHelpWidth, kHelpWidth / 2);
  amp.add_options()
      ("amp.loss-scaling", po::value(&run.amp.loss_scaling)->default_value("auto"),
       "auto (dynamic for fp16, off for fp32 and bf16) | on | off")
      ("amp.loss-scale", po::value(&run.amp.scaler.static_scale)->default_value(0, "0"), "a static loss scale (0: dynamic)")
      ("amp.init-scale", po::value(&run.amp.scaler.init_scale)->default_value(65536, "65536"), "initial dynamic scale")
      ("amp.growth-factor", po::value(&run.amp.scaler.growth_factor)->default_value(2, "2"), "scale x this after growth-interval clean steps")
      ("amp.backoff-factor", po::value(&run.amp.scaler.backoff_factor)->default_value(0.5, "0.5"), "scale x this on overflow")
      ("amp.growth-interval", po::value(&run.amp.scaler.growth_interval)->default_value(2000), "clean steps before the scale grows")
      ("amp.hysteresis", po::value(&run.amp.scaler.hysteresis)->default_value(1), "overflows tolerated before backing off")
      ("amp.min-scale", po::value(&run.amp.scaler.min_scale)->default_value(1, "1"), "lower bound of the dynamic scale")
      ("amp.max-scale", po::value(&run.amp.scaler.max_scale)->default_value(16777216, "16777216"), "upper bound (2^24)")
      ("amp.fail-at-min-scale", po::value(&run.amp.scaler.fail_at_min_scale)->default_value(false)->implicit_value(true),
       "end the run with an error when gradients overflow at min-scale")
      ("amp.on-nonfinite-loss", po::value(&run.amp.on_nonfinite_loss)->default_value("error"),
       "error (name rank, step and first non-finite layer) | skip (log and skip the step)");
  po::options_description optimizer("[optimizer]", kHelpWidth, kHelpWidth / 2);
  optimizer.add_options()
      ("optimizer.name", po::value(&run.optimizer.name)->default_value("sgd"), "sgd | adamw")
      ("optimizer.lr", po::value(&run.optimizer.lr)->default_value(0.05, "0.05"), "base learning rate")
      ("optimizer.momentum", po::value(&run.optimizer.momentum)->default_value(0.9, "0.9"), "SGD momentum")
      ("optimizer.weight-decay", po::value(&run.optimizer.weight_decay)->default_value(0.0, "0"),
       "SGD: L2 weight decay; AdamW: decoupled weight decay")
      ("optimizer.nesterov", po::value(&run.optimizer.nesterov)->default_value(false)->implicit_value(true), "Nesterov momentum")
      ("optimizer.beta1", po::value(&run.optimizer.beta1)->default_value(0.9, "0.9"), "AdamW: decay of the first moment")
      ("optimizer.beta2", po::value(&run.optimizer.beta2)->default_value(0.999, "0.999"), "AdamW: decay of the second moment")
      ("optimizer.eps", po::value(&run.optimizer.eps)->default_value(1e-8, "1e-8"), "AdamW: added to the denominator")
      ("optimizer.decay-biases", po::value(&run.optimizer.decay_biases)->default_value(false)->implicit_value(true),
       "AdamW: also apply weight decay to biases and norm parameters (gamma, beta)")
      ("optimizer.lr-scaling", po::value(&run.optimizer.lr_scaling)->default_value("none"),
       "none | linear (lr x global batch / reference-batch)")
      ("optimizer.reference-batch", po::value(&run.optimizer.reference_batch)->default_value(256),
       "global batch the base lr was tuned for (lr-scaling=linear)")
      ("optimizer.clip-norm", po::value(&run.optimizer.clip_norm)->default_value(0.0, "0"),
       "clip the global gradient norm to this (0: off)");
  po::options_description schedule("[schedule]", kHelpWidth, kHelpWidth / 2);
  schedule.add_options()
      ("schedule.name", po::value(&run.schedule.name)->default_value("constant"), "constant | step | cosine | one-cycle")
      ("schedule.warmup-steps", po::value(&run.schedule.warmup_steps)->default_value(0),
       "linear warmup over this many optimizer steps (not with one-cycle)")
      ("schedule.step-size", po::value(&run.schedule.step_size)->default_value(0), "step: multiply by gamma every N steps")
      ("schedule.gamma", po::value(&run.schedule.gamma)->default_value(0.1, "0.1"), "step: the factor")
      ("schedule.min-lr", po::value(&run.schedule.min_lr)->default_value(0.0, "0"), "cosine: the final lr")
      ("schedule.max-lr", po::value(&run.schedule.max_lr)->default_value(0.0, "0"), "one-cycle: the peak lr (0: the base lr)")
      ("schedule.pct-start", po::value(&run.schedule.pct_start)->default_value(0.3, "0.3"),
       "one-cycle: fraction of the steps spent rising");
  po::options_description comm("[comm]", kHelpWidth, kHelpWidth / 2);
  comm.add_options()
      ("comm.allreduce", po::value(&run.comm.allreduce)->default_value("auto"),
       "auto (hierarchical: with nccl on cuda where built, with shm where ranks share memory; "
       "else flat-mpi) | flat-mpi | flat-nccl (ncclAllReduce on the world, --device=cuda) | "
       "hierarchical")
      ("comm.intra", po::value(&run.comm.intra)->default_value("auto"),
       "hierarchical's intra-node backend: auto (nccl on cuda where built, else shm) | shm (MPI-3 "
       "shared-memory window) | mpi | nccl (ncclReduceScatter/AllGather on the device gradients)")
      ("comm.ranks-per-node", po::value(&run.comm.ranks_per_node)->default_value(0),
       "emulate nodes of K consecutive ranks (0: the shared-memory domains MPI reports)")
      ("comm.bucket-mb", po::value(&run.comm.bucket_mb)->default_value(25, "25"),
       "gradient bucket size in MiB, reduced while backward runs (0: one bucket after backward)")
      ("comm.first-bucket-mb", po::value(&run.comm.first_bucket_mb)->default_value(1, "1"),
       "size of the first bucket (the last layers' gradients) in MiB")
      ("comm.wire-dtype", po::value(&run.comm.wire_dtype)->default_value("auto"),
       "auto (the gradients' dtype) | fp32 | fp16 | bf16: what gradients travel and are summed as")
      ("comm.cuda-aware-mpi", po::value(&run.comm.cuda_aware_mpi)->default_value("auto"),
       "auto (the nccl backend hands MPI device memory across nodes where MPI says it is "
       "CUDA-aware and the wire is fp32) | off (always through pinned host memory)")
      ("comm.overlap", po::value(&run.comm.overlap)->default_value("auto"),
       "auto (on for a model on cuda; on the cpu, where every rank has a core beyond its compute "
       "threads) | on (buckets go out while backward runs) | off (after backward)")
      ("comm.stall-timeout", po::value(&run.comm.stall_timeout_s)->default_value(300, "300"),
       "seconds a rank may wait in one collective before the watchdog names the ranks that have "
       "not arrived and aborts the job (0: off)");
  po::options_description output("[output] and [checkpoint]", kHelpWidth, kHelpWidth / 2);
  output.add_options()
      ("output.dir", po::value(&run.output_dir)->default_value("runs/latest")->implicit_value(""), "metrics.jsonl and summary.json go here")
      ("output.overwrite", po::value(&run.overwrite)->default_value(false)->implicit_value(true),
       "a run that does not continue from a checkpoint replaces an earlier run's files in output.dir and its checkpoints in checkpoint.dir (without it, such a run is refused)")
      ("output.timeline", po::value(&run.timeline)->default_value(false)->implicit_value(true),
       "also write a Chrome-trace timeline per rank (output.dir/timeline-rank<R>.json: each step's phases and each bucket's all-reduce; open in Perfetto or chrome://tracing)")
      ("output.progress", po::value(&run.progress)->default_value("auto"),
       "rank 0's console: auto (a progress bar with epoch, step, ETA, loss and samples/s on a terminal, above which the step lines scroll; the step lines alone in a batch log) | bar | lines")
      ("output.tensorboard", po::value(&run.tensorboard)->default_value(false)->implicit_value(true),
       "also write TensorBoard event files (scalars: loss, accuracy, lr, loss scale, samples/s, the step-time breakdown) to output.dir/tensorboard")
      ("checkpoint.dir", po::value(&run.checkpoint.dir)->default_value("")->implicit_value(""),
       "checkpoints (FP32 weights and the whole training state) go here: at the end, on a stop signal or time limit, and as every-steps/every-minutes say (empty: none)")
      ("checkpoint.every-steps", po::value(&run.checkpoint.every_steps)->default_value(0), "also every N optimizer steps (0: off)")
      ("checkpoint.every-minutes", po::value(&run.checkpoint.every_minutes)->default_value(0, "0"), "also every M minutes of wall time (0: off)")
      ("checkpoint.keep", po::value(&run.checkpoint.keep)->default_value(3), "keep the newest K checkpoints")
      ("checkpoint.keep-every", po::value(&run.checkpoint.keep_every)->default_value(0),
       "... and, for good, those whose step is a multiple of N (0: none)")
      ("checkpoint.async", po::value(&run.checkpoint.async)->default_value(false)->implicit_value(true),
       "snapshot into memory at the step boundary and write on a background thread")
      ("checkpoint.debug-pause-ms", po::value(&run.checkpoint.debug_pause_ms)->default_value(0),
       "testing aid: pause this long after each dataset written")
      ("resume", po::value(&run.checkpoint.resume)->default_value("none"),
       "none | auto (the newest checkpoint in checkpoint.dir whose checksums verify; none there: a fresh start) | PATH (a checkpoint file, or a directory with latest)");
  po::options_description runtime("runtime", kHelpWidth, kHelpWidth / 2);
  runtime.add_options()
      ("device", po::value(&out.runtime.device)->default_value("auto"),
       "auto (cuda where every rank sees a GPU and the trainer runs there, else cpu) | cpu | cuda")
      ("cuda.graphs", po::value(&out.run.cuda_graphs)->default_value(false)->implicit_value(true),
       "train: replay each step's forward+backward and optimizer as two CUDA graphs (cuda only; "
       "no dropout with a rate above 0, --model.sync-bn only with its sums on the device, "
       "--train.accumulate=1)")
      ("kernels.matmul", po::value(&out.runtime.matmul)->default_value("auto"), "host matmul and convolution library: auto | onednn | blas");
  po::options_description all(kHelpWidth, kHelpWidth / 2);
  all.add(data).add(model).add(loop).add(amp).add(optimizer).add(schedule).add(comm).add(output).add(runtime);
  return all;
}

// Parses ARGS against VISIBLE plus --help/--config, then the config file; the command line wins.
bool parse(const std::string& command, const std::vector<std::string>& args,
           const po::options_description& visible, std::string& help_text,
           const po::positional_options_description* positional = nullptr,
           const char* usage = nullptr) {
  std::string config_path;
  po::options_description generic("general", kHelpWidth, kHelpWidth / 2);
  generic.add_options()("help,h", "print this help")("config", po::value(&config_path),
                                                     "INI file with the same option names, in sections");
  po::options_description cli(kHelpWidth, kHelpWidth / 2);
  cli.add(generic).add(visible);
  std::ostringstream help;
  if (usage) help << usage << "\n" << cli;
  else help << "usage: mptrain " << command << " [--config FILE] [--section.key=value ...]\n" << cli;
  help_text = help.str();

  // Boost rejects `--key=` with nothing after it; users write that to clear a path option
  // (`--checkpoint.dir=`), which those options accept through an implicit empty value.
  std::vector<std::string> normalized = args;
  for (auto& arg : normalized)
    if (arg.size() > 3 && arg.rfind("--", 0) == 0 && arg.back() == '=') arg.pop_back();

  po::variables_map vm;
  try {
    auto parser = po::command_line_parser(normalized).options(cli);
    if (positional) parser.positional(*positional);
    else parser.positional(po::positional_options_description());
    po::store(parser.run(), vm);
  } catch (const po::unknown_option& e) {
    // Boost reports the whole token ("--x=1"); the option's name is what the user must fix.
    const std::string token = e.get_option_name();
    throw_user_error("unknown option '" + token.substr(0, token.find('=')) + "' for `mptrain " + command + "`",
                     help_hint(command));
  } catch (const po::ambiguous_option& e) {
    // `--model=cnn` names a section, not an option: point at the section's `name` key.
    const std::string token = e.get_option_name();
    const std::size_t start = std::min(token.find_first_not_of('-'), token.size());
    const std::size_t equals = token.find('=');
    const std::string section = token.substr(start, equals - start);
    const std::string value = equals == std::string::npos ? "VALUE" : token.substr(equals + 1);
    const auto& alternatives = e.alternatives();
    const bool named = std::find(alternatives.begin(), alternatives.end(), section + ".name") !=
                       alternatives.end();
    throw_user_error(std::string(e.what()) + " (mptrain " + command + ")",
                     named ? "did you mean --" + section + ".name=" + value + "? " +
                                 help_hint(command)
                           : help_hint(command));
  } catch (const po::too_many_positional_options_error&) {
    throw_user_error("unexpected argument for `mptrain " + command + "`: options take the form --section.key=value",
                     help_hint(command));
  } catch (const po::error& e) {
    throw_user_error(std::string(e.what()) + " (mptrain " + command + ")", help_hint(command));
  }
  if (vm.count("help")) return true;

  if (vm.count("config")) {
    config_path = vm["config"].as<std::string>();
    MPT_REQUIRE(std::filesystem::is_regular_file(config_path),
                "config file '" + config_path + "' not found (--config)",
                "pass the path of an INI file, e.g. --config inputs/fashion-mnist-mlp.ini");
    try {
      po::store(po::parse_config_file(config_path.c_str(), visible, /*allow_unregistered=*/false), vm);
    } catch (const po::unknown_option& e) {
      throw_user_error("unknown option '" + e.get_option_name() + "' in config file '" + config_path + "'",
                       help_hint(command) + "; in the file, [section] key = value");
    } catch (const po::error& e) {
      throw_user_error(std::string(e.what()) + " in config file '" + config_path + "'", help_hint(command));
    }
  }
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    throw_user_error(std::string(e.what()) + " (mptrain " + command + ")", help_hint(command));
  }
  return false;
}

}  // namespace

double parse_duration(const std::string& text, const std::string& option) {
  const auto bad = [&] {
    throw_user_error(option + " has a bad duration '" + text + "'",
                     "use HH:MM:SS (e.g. 01:30:00), D-HH:MM:SS, MM:SS or seconds");
  };
  if (text.empty()) bad();
  const auto number = [&](const std::string& part, bool fraction) {
    if (part.empty() || part.find_first_not_of(fraction ? "0123456789." : "0123456789") != std::string::npos ||
        part.size() > 12)
      bad();
    try {
      return std::stod(part);
    } catch (const std::exception&) {
      bad();
    }
    return 0.0;
  };
  if (text.find(':') == std::string::npos) return number(text, /*fraction=*/true);
  std::string rest = text;
  double days = 0;
  if (const auto dash = rest.find('-'); dash != std::string::npos) {
    days = number(rest.substr(0, dash), false);
    rest = rest.substr(dash + 1);
  }
  std::vector<std::string> parts;
  std::stringstream fields(rest);
  for (std::string part; std::getline(fields, part, ':');) parts.push_back(part);
  if (rest.back() == ':' || parts.size() < 2 || parts.size() > 3 || (days > 0 && parts.size() != 3)) bad();
  double seconds = 0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const double value = number(parts[i], i + 1 == parts.size());
    if (i > 0 && value >= 60) bad();  // minutes and seconds below 60
    seconds = seconds * 60 + value;
  }
  return days * 86400 + seconds;
}

TrainCommand parse_train_command(const std::string& command, const std::vector<std::string>& args) {
  TrainCommand out;
  po::options_description visible = train_options(out);
  if (command == "eval") {
    po::options_description eval("eval", kHelpWidth, kHelpWidth / 2);
    eval.add_options()("checkpoint", po::value(&out.checkpoint),
                       "checkpoint file, or a directory with `latest` (default: checkpoint.dir)")
                      ("eval.confusion", po::value(&out.confusion)->default_value("")->implicit_value(""),
                       "write the confusion matrix (rows: true class, columns: predicted) as CSV here; - for stdout");
    visible.add(eval);
  }
  out.help = parse(command, args, visible, out.help_text);
  if (out.help) return out;
  out.run.loop.time_limit_s =
      out.time_limit_text.empty() ? 0 : parse_duration(out.time_limit_text, "--train.time-limit");
  out.run.loop.stop_margin_s = parse_duration(out.stop_margin_text, "--train.stop-margin");
  const auto& device = out.runtime.device;
  MPT_REQUIRE(device == "auto" || device == "cpu" || device == "cuda",
              "unknown device '" + device + "' (--device)", "use --device=auto, cpu or cuda");
  // train resolves the device in its agreed setup (train::Trainer: every rank alike, after the
  // topology that binds each rank to a GPU); eval runs on the host.
  MPT_REQUIRE(command != "eval" || device != "cuda", "--device=cuda: `mptrain eval` runs on the cpu only",
              "use --device=cpu or --device=auto (auto evaluates on the cpu)");
  out.run.device = device;
  const auto& matmul = out.runtime.matmul;
  MPT_REQUIRE(matmul == "auto" || matmul == "onednn" || matmul == "blas",
              "unknown matmul library '" + matmul + "' (--kernels.matmul)", "use auto, onednn or blas");
  MPT_REQUIRE(out.runtime.threads >= 0, "--train.threads must be >= 0", "0 picks a default");
  // The [comm] values and --train.accumulate are checked by the trainer's agreed setup
  // (train::Trainer), the one place that also serves callers of the library.
  if (command == "eval" && out.checkpoint.empty()) out.checkpoint = out.run.checkpoint.dir;
  return out;
}

ExportCommand parse_export_command(const std::vector<std::string>& args) {
  ExportCommand out;
  po::options_description visible("export", kHelpWidth, kHelpWidth / 2);
  visible.add_options()
      ("checkpoint", po::value(&out.checkpoint), "checkpoint file, or a directory with `latest`")
      ("out", po::value(&out.out), "the model file to write (docs/export-format.md), e.g. model.h5");
  out.help = parse("export", args, visible, out.help_text);
  if (out.help) return out;
  MPT_REQUIRE(!out.checkpoint.empty(), "no checkpoint given to export (--checkpoint)",
              "e.g. mptrain export --checkpoint runs/ckpt --out model.h5");
  MPT_REQUIRE(!out.out.empty(), "no output file given (--out)",
              "e.g. mptrain export --checkpoint runs/ckpt --out model.h5");
  return out;
}

PredictCommand parse_predict_command(const std::vector<std::string>& args) {
  PredictCommand out;
  auto& predict = out.predict;
  po::options_description visible("predict", kHelpWidth, kHelpWidth / 2);
  visible.add_options()
      ("model", po::value(&predict.model_path), "the model file `mptrain export` wrote")
      ("data", po::value(&predict.data.test_path), "data file(s) to predict (docs/data-format.md)")
      ("out", po::value(&predict.out_path)->default_value("")->implicit_value(""),
       "write predicted class and logits per sample to this HDF5 file (empty: none)")
      ("confusion", po::value(&predict.confusion_path)->default_value("")->implicit_value(""),
       "write the confusion matrix as CSV here (- for stdout; empty: none)")
      ("batch-size", po::value(&predict.batch_size)->default_value(64), "samples per rank per forward pass")
      ("precision", po::value(&predict.precision)->default_value("auto"),
       "auto (the precision the model was trained in, as eval uses) | fp32 | fp16 | bf16")
      ("threads", po::value(&out.runtime.threads)->default_value(0),
       "compute threads per rank (0: OMP_NUM_THREADS if set, else the rank's cores / ranks sharing them)");
  out.help = parse("predict", args, visible, out.help_text);
  if (out.help) return out;
  MPT_REQUIRE(!predict.model_path.empty(), "no model file given (--model)",
              "e.g. mptrain predict --model model.h5 --data test.h5");
  MPT_REQUIRE(!predict.data.test_path.empty(), "no data given to predict on (--data)",
              "e.g. mptrain predict --model model.h5 --data test.h5");
  MPT_REQUIRE(out.runtime.threads >= 0, "--threads must be >= 0", "0 picks a default");
  return out;
}

namespace {

// "8", "4K", "256M", "1G" (powers of 1024, as nccl-tests reads them) to bytes.
std::int64_t parse_bytes(const std::string& text, const std::string& option) {
  std::size_t used = 0;
  double value = -1;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string suffix = text.substr(used);
  double unit = 1;
  if (suffix == "K" || suffix == "k") unit = 1024.0;
  else if (suffix == "M" || suffix == "m") unit = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g") unit = 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) used = 0;
  // Below 2^62 bytes: larger values do not fit the int64 they are converted to.
  MPT_REQUIRE(used > 0 && value >= 0 && value * unit < 0x1p62,
              option + " has a bad size '" + text + "'", "give bytes with an optional K, M or G suffix, e.g. 256M");
  return static_cast<std::int64_t>(value * unit);
}

}  // namespace

BenchCommand parse_bench_command(const std::vector<std::string>& args) {
  BenchCommand out;
  std::string min_text = "8", max_text = "256M", memcpy_text = "64M", segment_text = "1M", rail_batch_text = "2M", algos = "flat-mpi,hierarchical-shm,hierarchical-mpi";
  po::options_description visible("bench allreduce", kHelpWidth, kHelpWidth / 2);
  visible.add_options()
      ("what", po::value(&out.what), "the benchmark, given first: allreduce")
      ("min-bytes,b", po::value(&min_text)->default_value("8"), "smallest message (K, M, G suffixes)")
      ("max-bytes,e", po::value(&max_text)->default_value("256M"), "largest message")
      ("step-factor,f", po::value(&out.step_factor)->default_value(2, "2"), "size multiplier between rows")
      ("iters,n", po::value(&out.iters)->default_value(20), "timed iterations per round, at most")
      ("rounds,r", po::value(&out.rounds)->default_value(5),
       "timed rounds per row, each running every algorithm in turn; the row reports the median round")
      ("warmup-iters,w", po::value(&out.warmup_iters)->default_value(2), "untimed iterations per row")
      ("row-seconds,t", po::value(&out.row_seconds)->default_value(0.5, "0.5"),
       "time budget per row: fewer timed iterations (at least 1) where one is slow")
      ("algos,a", po::value(&algos)->default_value(algos),
       "comma-separated: flat-mpi, hierarchical-shm, hierarchical-shm-reg (the data in a "
       "registered shared buffer), hierarchical-mpi; ALGO@K: on nodes of K ranks")
      ("dtype,d", po::value(&out.dtype)->default_value("fp32"), "fp32 | fp16 | bf16 (data and wire)")
      ("ranks-per-node,K", po::value(&out.ranks_per_node)->default_value(0),
       "emulate nodes of K consecutive ranks (0: the shared-memory domains)")
      ("check,c", po::value(&out.check)->default_value(true), "check every result against the exact sum (0: off)")
      ("memcpy-bytes", po::value(&memcpy_text)->default_value("64M"), "size of the memcpy that measures memory bandwidth")
      ("shm-segment", po::value(&segment_text)->default_value("1M"),
       "the shm backend's segment per rank (a message goes through in chunks of half of it)")
      ("rail-batch", po::value(&rail_batch_text)->default_value("2M"),
       "across nodes, the shm backend's wire data per rail all-reduce (whole chunks, at least one)")
      ("json", po::value(&out.json_path), "also write the rows as JSON to this file");
  po::positional_options_description positional;
  positional.add("what", 1);
  out.help = parse("bench", args, visible, out.help_text, &positional,
                   "usage: mpiexec -n N mptrain bench allreduce [-b 8] [-e 256M] [-f 2] [-a ALGOS] [-K K] "
                   "[--json FILE] ...\n\nAll-reduce bandwidth in the style of nccl-tests: every row is "
                   "checked, busbw = algbw x 2(N-1)/N.");
  if (out.help) return out;
  MPT_REQUIRE(out.what == "allreduce",
              out.what.empty() ? std::string("no benchmark named for `mptrain bench`")
                               : "unknown benchmark '" + out.what + "' for `mptrain bench`",
              "use `mptrain bench allreduce -b 8 -e 256M -f 2`");
  out.min_bytes = parse_bytes(min_text, "--min-bytes (-b)");
  out.max_bytes = parse_bytes(max_text, "--max-bytes (-e)");
  out.memcpy_bytes = parse_bytes(memcpy_text, "--memcpy-bytes");
  out.shm_segment_bytes = parse_bytes(segment_text, "--shm-segment");
  MPT_REQUIRE(out.shm_segment_bytes >= 256, "--shm-segment is below 256 bytes", "e.g. --shm-segment 1M");
  out.rail_batch_bytes = parse_bytes(rail_batch_text, "--rail-batch");
  MPT_REQUIRE(out.min_bytes <= out.max_bytes, "--min-bytes (-b) is larger than --max-bytes (-e)",
              "e.g. -b 8 -e 256M");
  MPT_REQUIRE(out.step_factor > 1, "--step-factor (-f) must be > 1", "e.g. -f 2");
  MPT_REQUIRE(out.iters >= 1 && out.rounds >= 1 && out.warmup_iters >= 0,
              "--iters (-n) and --rounds (-r) must be >= 1 and --warmup-iters (-w) >= 0", "e.g. -n 20 -r 5 -w 2");
  MPT_REQUIRE(out.ranks_per_node >= 0, "--ranks-per-node (-K) must be >= 0", "0 uses the nodes MPI reports");
  MPT_REQUIRE(out.dtype == "fp32" || out.dtype == "fp16" || out.dtype == "bf16",
              "--dtype (-d) has unknown dtype '" + out.dtype + "'", "use fp32, fp16 or bf16");
  std::stringstream list(algos);
  for (std::string entry; std::getline(list, entry, ',');) {
    // ALGO or ALGO@K: the algorithm on nodes of K ranks instead of -K's, measured in the same
    // rounds as the others (one node against emulated nodes, side by side).
    const std::size_t at = entry.find('@');
    const std::string algo = entry.substr(0, at);
    MPT_REQUIRE(algo == "flat-mpi" || algo == "hierarchical-shm" ||
                    algo == "hierarchical-shm-reg" || algo == "hierarchical-mpi",
                "--algos (-a) has unknown algorithm '" + algo + "'",
                "use a comma-separated list of flat-mpi, hierarchical-shm, hierarchical-shm-reg, "
                "hierarchical-mpi, each optionally with @K (nodes of K ranks)");
    int per_node = out.ranks_per_node;
    if (at != std::string::npos) {
      const std::string k = entry.substr(at + 1);
      MPT_REQUIRE(!k.empty() && k.size() < 7 && k.find_first_not_of("0123456789") == std::string::npos,
                  "--algos (-a) entry '" + entry + "' has no ranks per node after '@'",
                  "e.g. -a hierarchical-shm@0,hierarchical-shm@2 (0: the nodes MPI reports)");
      per_node = std::stoi(k);
    }
    out.algos.push_back(entry);
    out.algo_ranks_per_node.push_back(per_node);
  }
  MPT_REQUIRE(!out.algos.empty(), "--algos (-a) is empty", "e.g. -a flat-mpi,hierarchical-shm");
  return out;
}

PrepareCommand parse_prepare_command(const std::vector<std::string>& args) {
  PrepareCommand out;
  std::string shape_text;
  po::options_description visible("prepare", kHelpWidth, kHelpWidth / 2);
  visible.add_options()
      ("kind", po::value(&out.kind), "fashion-mnist | synthetic | npy | csv")
      ("source", po::value(&out.source)->default_value("/usr/share/datasets/fashion-mnist"),
       "fashion-mnist: directory with the four IDX files (gzip or raw)")
      ("out", po::value(&out.out), "fashion-mnist, synthetic: directory that receives train.h5 and test.h5; "
       "npy, csv: the .h5 file to write")
      ("samples", po::value(&out.samples_path), "npy: samples .npy, (N, ...) of |u1, <f2 or <f4")
      ("labels", po::value(&out.labels_path), "npy: labels .npy, (N,) of an integer dtype")
      ("input", po::value(&out.input_path), "csv: the CSV file, one sample per line")
      ("label-column", po::value(&out.label_column)->default_value(0), "csv: 0-based column of the label (-1: last)")
      ("header", po::value(&out.header)->default_value("auto"), "csv: auto | yes | no: whether the first line is a header")
      ("stats-from", po::value(&out.stats_from)->default_value(""),
       "npy, csv: copy mean/std from this data file (e.g. the training set when converting a test set)")
      ("train-samples", po::value(&out.train_samples)->default_value(8192), "synthetic: training samples")
      ("test-samples", po::value(&out.test_samples)->default_value(2048), "synthetic: test samples")
      ("shape", po::value(&shape_text)->default_value(""),
       "sample shape, comma separated (synthetic: default 1,28,28; npy, csv: a reshape, default as stored)")
      ("classes", po::value(&out.classes)->default_value(0), "number of classes (0: synthetic 10; npy, csv: largest label + 1)")
      ("dtype", po::value(&out.dtype)->default_value("uint8"), "synthetic: uint8 | float16 | float32")
      ("seed", po::value(&out.seed)->default_value(1), "synthetic: seed")
      ("noise", po::value(&out.noise)->default_value(0.35, "0.35"), "synthetic: noise level in [0, 1]");
  po::positional_options_description positional;
  positional.add("kind", 1);
  out.help = parse("prepare", args, visible, out.help_text, &positional);
  if (out.help) return out;
  MPT_REQUIRE(out.kind == "fashion-mnist" || out.kind == "synthetic" || out.kind == "npy" || out.kind == "csv",
              out.kind.empty() ? std::string("no dataset named for `mptrain prepare`")
                               : "unknown dataset '" + out.kind + "' for `mptrain prepare`",
              "use `mptrain prepare fashion-mnist|synthetic --out DIR`, `prepare npy --samples X.npy --labels "
              "Y.npy --out F.h5` or `prepare csv --input F.csv --out F.h5`");
  const bool to_file = out.kind == "npy" || out.kind == "csv";
  MPT_REQUIRE(!out.out.empty(), to_file ? "no output file given (--out)" : "no output directory given (--out)",
              to_file ? "e.g. --out data/mine/train.h5" : "e.g. --out data/fashion-mnist");
  MPT_REQUIRE(out.kind != "npy" || (!out.samples_path.empty() && !out.labels_path.empty()),
              "`mptrain prepare npy` needs --samples X.npy and --labels Y.npy", "e.g. --samples x_train.npy --labels y_train.npy");
  MPT_REQUIRE(out.kind != "csv" || !out.input_path.empty(), "`mptrain prepare csv` needs --input FILE.csv",
              "e.g. --input train.csv --label-column 0");
  MPT_REQUIRE(out.dtype == "uint8" || out.dtype == "float16" || out.dtype == "float32",
              "--dtype '" + out.dtype + "' is not uint8, float16 or float32", "e.g. --dtype float32");
  if (out.kind == "synthetic" && shape_text.empty()) shape_text = "1,28,28";
  if (out.kind == "synthetic" && out.classes == 0) out.classes = 10;
  std::stringstream stream(shape_text);
  for (std::string item; std::getline(stream, item, ',');) {
    std::int64_t extent = 0;
    try {
      std::size_t used = 0;
      extent = std::stoll(item, &used);
      if (used != item.size()) extent = 0;
    } catch (const std::exception&) {
      extent = 0;
    }
    MPT_REQUIRE(extent > 0, "--shape '" + shape_text + "' is not a list of positive integers", "e.g. --shape 1,28,28");
    out.shape.push_back(extent);
  }
  MPT_REQUIRE(!out.shape.empty() || out.kind != "synthetic", "--shape is empty", "e.g. --shape 1,28,28");
  MPT_REQUIRE(out.classes >= 2 || (out.kind != "synthetic" && out.classes == 0), "--classes must be at least 2", "e.g. --classes 10");
  MPT_REQUIRE(out.train_samples > 0 && out.test_samples > 0, "--train-samples and --test-samples must be positive",
              "e.g. --train-samples 8192 --test-samples 2048");
  MPT_REQUIRE(out.noise >= 0 && out.noise <= 1, "--noise must be in [0, 1]", "e.g. --noise 0.35");
  return out;
}

}  // namespace mpt::app
