// The training and evaluation drivers: build data, model and optimizer from a configuration,
// run the data-parallel loop, evaluate, and write metrics, summary and checkpoint.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "amp/amp.hpp"
#include "comm/allreduce.hpp"
#include "comm/comm.hpp"
#include "optim/optim.hpp"

namespace mpt::train {

struct DataConfig {
  std::string train_path;
  std::string test_path;
  std::string samples_name;  // empty: from the file's attribute, else "samples"
  std::string labels_name;   // empty: from the file's attribute, else "labels"
  std::int64_t chunk_cache_mb = 64;
  // How the files are read (data::ReaderOptions): used where a file lacks the attribute.
  std::int64_t num_classes = 0;  // 0: from the file's num_classes
  double mean = std::numeric_limits<double>::quiet_NaN();  // NaN: the file's (else 0)
  double std = std::numeric_limits<double>::quiet_NaN();   // NaN: the file's (else 1)
  std::string sample_shape;          // e.g. "1,28,28"; empty: as stored (or the file's attribute)
  std::string on_nonfinite = "error";  // error | skip
  // Which samples each step reads (data::ShardPlan).
  std::string shuffle = "global";       // global | window | none
  std::int64_t shuffle_window = 65536;  // samples per window, for shuffle = window
  bool drop_last = true;                // false: pad the last batch by wrapping around
  // The input pipeline (data::Prefetcher, data::SampleCache).
  int prefetch = 2;                 // batches read ahead; 0: synchronous reads
  int io_threads = 1;               // threads that each fill whole batches
  // Where uint8 samples are normalised: reader (the I/O thread, into f32) | device (the stored
  // bytes are delivered and the training device converts them: kernels::normalize_u8) | auto
  // (device on cuda, reader on the cpu). Float samples are read as they are either way.
  std::string normalize = "auto";
  std::string cache = "none";       // none | memory
  std::int64_t cache_limit_mb = 0;  // 0: the node's available memory / ranks on the node
  int debug_read_delay_ms = 0;      // testing aid: sleep per batch read
};

struct ModelConfig {
  std::string name = "mlp";
  std::string layers;  // overrides name when set
  bool print = false;  // print the layer table before training
  std::string init = "default";  // default | he | xavier (docs/model-spec.md)
  bool sync_bn = false;  // BatchNorm statistics summed across ranks (docs/architecture.md)
};

struct LoopConfig {
  std::int64_t epochs = 1;
  std::int64_t max_steps = 0;  // 0: no limit
  std::int64_t batch_size = 64;  // per rank
  std::uint64_t seed = 42;
  std::int64_t log_every = 50;
  // Micro-batches per optimizer step; max_steps and the logged `step` count optimizer steps.
  std::int64_t accumulate = 1;
  // Stop cleanly (checkpoint, exit 0) this long after the start, less stop_margin_s; 0: no
  // limit. SLURM_JOB_END_TIME in the environment sets a deadline the same way.
  double time_limit_s = 0;
  double stop_margin_s = 120;
};

// Checkpoints and resume (docs/checkpoint-format.md, docs/running-on-clusters.md).
struct CheckpointConfig {
  std::string dir;                  // empty: no checkpoints (and --resume=auto starts fresh)
  std::int64_t every_steps = 0;     // 0: off
  double every_minutes = 0;         // 0: off (rank 0's clock decides, for every rank)
  int keep = 3;                     // the newest KEEP are kept ...
  std::int64_t keep_every = 0;      // ... and every step multiple of this, for good (0: none)
  bool async = false;               // snapshot at the step boundary, write on a thread
  int debug_pause_ms = 0;           // testing aid: pause after each dataset written
  std::string resume = "none";      // none | auto (the newest valid in dir) | a file or directory
};

// Mixed precision: the storage dtype of weights, activations and gradients, and the loss scaler.
struct PrecisionConfig {
  std::string precision = "fp32";     // fp32 | fp16 | bf16
  std::string loss_scaling = "auto";  // auto (on for fp16, or with a static scale) | on | off
  std::string on_nonfinite_loss = "error";  // error | skip
  amp::LossScalerOptions scaler;      // the [amp] options; `enabled` follows from the two above
};

struct OptimizerConfig {
  std::string name = "sgd";  // sgd | adamw
  double lr = 0.05;          // base LR, before lr_scaling and the schedule
  double momentum = 0.9;     // sgd
  double weight_decay = 0.0;  // sgd: L2 in the gradient; adamw: decoupled
  bool nesterov = false;      // sgd
  double beta1 = 0.9;         // adamw
  double beta2 = 0.999;       // adamw
  double eps = 1e-8;          // adamw
  bool decay_biases = false;  // adamw: also decay parameters named */bias
  std::string lr_scaling = "none";  // none | linear (lr * global batch / reference_batch)
  std::int64_t reference_batch = 256;
  double clip_norm = 0;  // > 0: clip the global gradient norm to this
};

// The learning-rate schedule (optim::ScheduleOptions), in applied optimizer steps.
// The [schedule] options are the schedule's own (optim::ScheduleOptions).
using ScheduleConfig = optim::ScheduleOptions;

struct RunConfig {
  DataConfig data;
  ModelConfig model;
  LoopConfig loop;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  PrecisionConfig amp;
  comm::CommOptions comm;
  // auto | cpu | cuda (--device). auto: cuda where every rank sees a CUDA device and the trainer
  // runs there, else cpu. Resolved by the Trainer's agreed setup; cpu for a library caller.
  std::string device = "cpu";
  // --cuda.graphs: on cuda, capture forward+loss+backward and the optimizer's part of the step
  // as two CUDA graphs after the first step, and replay them (kernels/graph.hpp).
  bool cuda_graphs = false;
  std::string output_dir;
  // Replace an earlier run's files in output_dir and its checkpoints in checkpoint.dir when this
  // run does not continue from a checkpoint; false: such a run is refused (output_files.hpp).
  bool overwrite = false;
  bool tensorboard = false;  // also TensorBoard event files in output_dir/tensorboard (rank 0)
  bool timeline = false;     // also a Chrome-trace timeline per rank, output_dir/timeline-rank<R>.json
  std::string progress = "auto";  // rank 0's console: auto (a bar on a terminal) | bar | lines
  // Test hook, from the environment variable MPTRAIN_FAULT (docs/testing.md): "KIND:RANK:STEP".
  // KIND nan-grad puts a NaN into RANK's local gradients at STEP (1-based), before the
  // all-reduce. Empty: no fault.
  std::string fault;
  CheckpointConfig checkpoint;
};

struct TrainSummary {
  std::int64_t steps = 0;  // optimizer steps (of --train.accumulate micro-batches each)
  std::int64_t epochs = 0;
  double final_train_loss = 0;
  double test_loss = 0;
  double test_accuracy = -1;  // -1: no test set
  double test_top5_accuracy = -1;
  double samples_per_s = 0;
  double wall_s = 0;
  double data_wait_s = 0;         // time blocked waiting for input batches, slowest rank
  double data_wait_fraction = 0;  // data_wait_s / training time
  double comm_time_s = 0;          // gradient all-reduce time on the reducer's thread, slowest rank
  double exposed_comm_time_s = 0;  // of which backward did not hide (wait() blocked), slowest rank
  // The waits for node peers to arrive at a bucket's all-reduce (the ranks' skew): the exposed
  // part of them, then comm_time_s and exposed_comm_time_s without them, each the largest over
  // the ranks; all -1 where the all-reduce does not measure them (not the shm backend).
  double exposed_peer_wait_s = -1;
  double comm_excluding_peer_wait_s = -1;
  double exposed_comm_excluding_peer_wait_s = -1;
  double forward_s = 0, backward_s = 0, optimizer_s = 0;  // the step-time breakdown, slowest rank
  double loss_scale = 1;          // at the end
  std::int64_t skipped_steps = 0;  // steps skipped for non-finite gradients or loss
  std::int64_t skipped_samples = 0;  // samples skipped for non-finite values (--data.on-nonfinite=skip)
  std::int64_t optimizer_steps = 0;  // applied updates: steps - skipped_steps
  double base_lr = 0;   // --optimizer.lr after --optimizer.lr-scaling
  double last_lr = 0;   // the scheduled LR of the last applied update (0: none applied)
  double grad_norm = -1;  // pre-clip global gradient norm of the last applied update (-1: clipping off)
  // Why the run ended: "completed", "signal" (SIGTERM, SIGUSR1 or SIGINT) or "time-limit".
  std::string stop_reason = "completed";
  std::int64_t resumed_from_step = -1;  // the checkpoint's step; -1: a fresh start
  std::int64_t checkpoints = 0;         // written by this run
  double checkpoint_stall_s = 0;        // training time lost to them (rank 0's)
  std::string last_checkpoint;          // the newest written (empty: none)
  // Memory, the largest over ranks: Tensor buffers the training thread created inside steps
  // (0 when everything is planned), device arena slabs (cudaMalloc calls) taken inside steps,
  // the peak of Tensor memory on the training device, and the device arena's reservation.
  std::int64_t step_tensor_allocations = 0;
  std::int64_t step_device_slabs = 0;
  double tensor_peak_mb = 0;
  double device_reserved_mb = 0;
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
  // The model's flat working weights on this rank (identical on every rank between steps): f32
  // under fp32, the 16-bit working copy under fp16/bf16, and on the model's device (a cuda
  // tensor on --device=cuda: copy it to the host before reading).
  const Tensor& params() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Constructs a Trainer and runs it.
TrainSummary run_training(const RunConfig& config, const comm::World& world);

// What evaluate, eval, predict and the periodic evaluation report; identical on every rank.
struct EvalResult {
  std::int64_t samples = 0;
  double loss = 0;
  double accuracy = 0;       // top-1
  double top5_accuracy = 0;  // true class among the 5 highest logits (all of them under 5 classes)
  int num_classes = 0;
  // Row-major [true class][predicted class] counts; predicted = the first maximum logit.
  std::vector<std::int64_t> confusion;
};

// Writes RESULT's confusion matrix as CSV to PATH ("-": stdout), atomically (tmp + rename):
// a header "true/pred,0,1,...", then one row per true class (its index, then its counts).
// Call on one rank.
void write_confusion_csv(const EvalResult& result, const std::string& path);

// Evaluates the checkpoint at CHECKPOINT (a file, or a directory holding `latest`) on the
// dataset at DATA_PATH, every rank taking a contiguous slice of it. CONFUSION_PATH (empty:
// none) receives the confusion matrix from rank 0.
EvalResult run_evaluation(const std::string& checkpoint, const DataConfig& data,
                          std::int64_t batch_size, const comm::World& world,
                          const std::string& confusion_path = "");

// `mptrain predict`: inference with an exported model file (docs/export-format.md).
struct PredictConfig {
  std::string model_path;      // the exported model.h5
  DataConfig data;             // data.test_path: the samples to predict (with labels)
  std::string out_path;        // empty: none; else an HDF5 file of predictions and logits
  std::string confusion_path;  // empty: none; "-": stdout
  std::int64_t batch_size = 64;  // per rank
  std::string precision = "auto";  // auto: the precision the model was trained in
};

// Verifies and loads the model file, then evaluates it on the data exactly as `eval` does (each
// rank a contiguous slice, sums all-reduced); rank 0 writes OUT_PATH.
EvalResult run_prediction(const PredictConfig& config, const comm::World& world);

}  // namespace mpt::train
