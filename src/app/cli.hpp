// The command line and INI configuration of the mptrain binary. One option table serves both:
// `[optimizer] lr` in a --config file is `--optimizer.lr` on the command line, which wins.
#pragma once

#include <string>
#include <vector>

#include "train/train.hpp"

namespace mpt::app {

struct RuntimeConfig {
  std::string device = "auto";  // auto | cpu | cuda
  std::string matmul = "auto";  // auto | onednn | blas
  int threads = 0;              // per rank; 0: OMP_NUM_THREADS, else a share of its cores (threads.hpp)
};

struct TrainCommand {
  bool help = false;
  std::string help_text;
  train::RunConfig run;
  RuntimeConfig runtime;
  std::string checkpoint;  // eval only: file or directory to evaluate
  std::string confusion;   // eval only: --eval.confusion, CSV path ("-": stdout; empty: none)
  // --train.time-limit and --train.stop-margin as given; parsed into run.loop (seconds).
  std::string time_limit_text, stop_margin_text;
};

// A duration given as [[D-]HH:]MM:SS (Slurm's forms) or as seconds ("90", "1.5"), in seconds.
// Throws UserError naming OPTION for anything else or a negative value.
double parse_duration(const std::string& text, const std::string& option);

// Parses the arguments that follow `mptrain train` or `mptrain eval` (COMMAND names which).
// Throws UserError naming the option for an unknown option, a bad value or an unreadable file.
TrainCommand parse_train_command(const std::string& command, const std::vector<std::string>& args);

struct PrepareCommand {
  bool help = false;
  std::string help_text;
  std::string kind;  // fashion-mnist | synthetic | npy | csv
  std::string source;
  std::string out;
  std::string samples_path;  // npy
  std::string labels_path;   // npy
  std::string input_path;    // csv
  std::int64_t label_column = 0;
  std::string header = "auto";
  std::string stats_from;
  std::string dtype = "uint8";  // synthetic
  std::int64_t train_samples = 0;
  std::int64_t test_samples = 0;
  std::vector<std::int64_t> shape;
  int classes = 0;  // 0: synthetic 10; npy/csv the largest label + 1
  std::uint64_t seed = 0;
  double noise = 0;
};
PrepareCommand parse_prepare_command(const std::vector<std::string>& args);

// `mptrain export --checkpoint C --out model.h5`
struct ExportCommand {
  bool help = false;
  std::string help_text;
  std::string checkpoint;
  std::string out;
};
ExportCommand parse_export_command(const std::vector<std::string>& args);

// `mptrain predict --model model.h5 --data X.h5 [--out preds.h5]`
struct PredictCommand {
  bool help = false;
  std::string help_text;
  train::PredictConfig predict;
  RuntimeConfig runtime;
};
PredictCommand parse_predict_command(const std::vector<std::string>& args);

// `mptrain bench allreduce`: an nccl-tests style sweep (docs/perf.md, perf/allreduce.sh).
struct BenchCommand {
  bool help = false;
  std::string help_text;
  std::string what;                    // allreduce
  std::int64_t min_bytes = 8;          // -b
  std::int64_t max_bytes = 256 << 20;  // -e
  double step_factor = 2;              // -f
  int iters = 20;                      // -n: at most this many timed iterations per round
  int rounds = 5;                      // -r: rounds per row, interleaving the algorithms
  int warmup_iters = 2;                // -w
  double row_seconds = 0.5;            // -t: fewer iterations where one takes long
  std::vector<std::string> algos;      // -a: flat-mpi, hierarchical-shm, hierarchical-mpi[@K]
  std::vector<int> algo_ranks_per_node;  // per entry of algos: its K, or -K's
  std::string dtype = "fp32";          // -d: fp32 | fp16 | bf16 (data and wire)
  int ranks_per_node = 0;              // -K
  bool check = true;                   // -c
  std::int64_t memcpy_bytes = 64 << 20;
  std::int64_t shm_segment_bytes = 1 << 20;  // the shm backend's segment per rank
  std::int64_t rail_batch_bytes = 2 << 20;   // its wire data per batch of rail calls
  std::string json_path;               // --json
};
// Parses the arguments after `mptrain bench`. Sizes take K, M and G suffixes (powers of 1024).
BenchCommand parse_bench_command(const std::vector<std::string>& args);
// Runs the sweep on every rank; rank 0 prints the table (and writes JSON). Returns the exit
// code: 1 when any row had wrong elements.
int run_bench(const BenchCommand& command, const comm::World& world);

// Runs mptrain with its full argument vector; returns the process exit code. Initialises and
// finalises MPI and Kokkos.
int run(int argc, char** argv);

}  // namespace mpt::app
