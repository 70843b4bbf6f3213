// The training and evaluation drivers: build data, model and optimizer from a configuration,
// run the data-parallel loop, evaluate, and write metrics, summary and checkpoint.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/comm.hpp"

namespace mpt::train {

struct DataConfig {
  std::string train_path;
  std::string test_path;
  std::string samples_name = "samples";
  std::string labels_name = "labels";
  std::int64_t chunk_cache_mb = 64;
};

struct ModelConfig {
  std::string name = "mlp";
  std::string layers;  // overrides name when set
  bool print = false;  // print the layer table before training
};

struct LoopConfig {
  std::int64_t epochs = 1;
  std::int64_t max_steps = 0;  // 0: no limit
  std::int64_t batch_size = 64;  // per rank
  std::uint64_t seed = 42;
  std::int64_t log_every = 50;
  bool shuffle = true;
};

struct OptimizerConfig {
  std::string name = "sgd";
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 0.0;
  bool nesterov = false;
};

struct RunConfig {
  DataConfig data;
  ModelConfig model;
  LoopConfig loop;
  OptimizerConfig optimizer;
  std::string output_dir;
  std::string checkpoint_dir;
};

struct TrainSummary {
  std::int64_t steps = 0;
  std::int64_t epochs = 0;
  double final_train_loss = 0;
  double test_loss = 0;
  double test_accuracy = -1;  // -1: no test set
  double samples_per_s = 0;
  double wall_s = 0;
};

// One data-parallel training run. Construction is the agreed setup (data, model, optimizer,
// output directories): a bad option or file on any rank throws ReportedFailure on every rank.
class Trainer {
 public:
  Trainer(const RunConfig& config, const comm::World& world);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains for the configured epochs or steps, evaluating after each epoch; rank 0 writes
  // metrics.jsonl, summary.json and the checkpoint.
  TrainSummary run();
  // The flat FP32 weights of this rank (identical on every rank between steps).
  const Tensor& params() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Constructs a Trainer and runs it.
TrainSummary run_training(const RunConfig& config, const comm::World& world);

struct EvalResult {
  std::int64_t samples = 0;
  double loss = 0;
  double accuracy = 0;
};

// Evaluates the checkpoint at CHECKPOINT (a file, or a directory holding `latest`) on the
// dataset at DATA_PATH, every rank taking a contiguous slice of it.
EvalResult run_evaluation(const std::string& checkpoint, const DataConfig& data,
                          std::int64_t batch_size, const comm::World& world);

}  // namespace mpt::train
