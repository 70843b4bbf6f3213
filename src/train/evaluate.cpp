// Evaluation (eval, predict and the trainer's periodic evaluation): the test set is cut into
// contiguous per-rank slices with nothing dropped, and loss sums, top-1/top-5 hits and
// confusion counts are reduced across ranks.
#include "train/evaluate.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <vector>

#include "ckpt/ckpt.hpp"
#include "core/error.hpp"
#include "core/hdf5.hpp"
#include "export/export.hpp"
#include "kernels/copy.hpp"
#include "kernels/softmax_xent.hpp"

namespace mpt::train {

data::ReaderOptions reader_options_for(const DataConfig& config, const std::string& option) {
  data::ReaderOptions options;
  options.samples_name = config.samples_name;
  options.labels_name = config.labels_name;
  options.chunk_cache_bytes = static_cast<std::size_t>(config.chunk_cache_mb) << 20;
  options.option_prefix = option;
  options.num_classes = config.num_classes;
  options.mean = static_cast<float>(config.mean);
  options.std = static_cast<float>(config.std);
  options.on_nonfinite = data::parse_nonfinite_action(config.on_nonfinite);
  MPT_REQUIRE(config.num_classes >= 0, "--data.num-classes must be >= 0",
              "0 takes the class count from the file's num_classes attribute");
  MPT_REQUIRE(std::isnan(config.std) || config.std > 0, "--data.std must be positive",
              "e.g. --data.std=0.353");
  std::stringstream stream(config.sample_shape);
  for (std::string item; std::getline(stream, item, ',');) {
    char* end = nullptr;
    const long long extent = std::strtoll(item.c_str(), &end, 10);
    MPT_REQUIRE(
        !item.empty() && end && *end == '\0' && extent > 0,
        "--data.sample-shape '" + config.sample_shape + "' is not a list of positive integers",
        "e.g. --data.sample-shape=1,28,28");
    options.sample_shape.push_back(extent);
  }
  return options;
}

data::ShardOptions shard_options_for(const DataConfig& config, const data::DatasetInfo& info) {
  data::ShardOptions options;
  options.shuffle = data::parse_shuffle_mode(config.shuffle);
  options.shuffle_window = config.shuffle_window;
  options.drop_last = config.drop_last;
  options.data_description =
      "the training set '" + info.path + "' (dataset '" + info.samples_name + "')";
  return options;
}

Shape concat_shape(std::int64_t n, const Shape& sample_shape) {
  Shape shape{n};
  shape.insert(shape.end(), sample_shape.begin(), sample_shape.end());
  return shape;
}

void count_predictions(const Tensor& logits, const Tensor& labels, EvalCounts& counts,
                       std::int32_t* predicted) {
  const std::int64_t rows = logits.shape()[0], classes = logits.shape()[1];
  if (classes != counts.num_classes || labels.numel() < rows)
    abort_job("count_predictions: logits " + logits.describe() + " do not fit labels " +
              labels.describe() + " and " + std::to_string(counts.num_classes) + " classes");
  const std::int64_t k = std::min<std::int64_t>(kTopK, classes);
  const float* x = logits.data<float>();
  const std::int32_t* y = labels.data<std::int32_t>();
  for (std::int64_t row = 0; row < rows; ++row, x += classes) {
    std::int64_t argmax = 0;  // the first maximum, as the loss kernel and numpy's argmax pick it
    for (std::int64_t j = 1; j < classes; ++j)
      if (x[j] > x[argmax]) argmax = j;
    if (predicted) predicted[row] = static_cast<std::int32_t>(argmax);
    const std::int64_t label = y[row];
    if (label < 0 || label >= classes) continue;
    std::int64_t ahead = 0;  // classes ranked before the true one
    for (std::int64_t j = 0; j < classes; ++j)
      ahead += (x[j] > x[label] || (x[j] == x[label] && j < label)) ? 1 : 0;
    counts.top1 += ahead == 0 ? 1 : 0;
    counts.top5 += ahead < k ? 1 : 0;
    counts.confusion[static_cast<std::size_t>(label * classes + argmax)] += 1;
  }
}

EvalResult evaluate(nn::Model& model, data::DatasetReader& reader, std::int64_t batch,
                    const comm::World& world, const EvalOutputs* outputs) {
  const auto& info = reader.info();
  const int classes = model.num_classes();
  const auto [begin, end] = data::eval_shard(info.num_samples, world.size(), world.rank());
  Tensor inputs(concat_shape(batch, info.sample_shape), DType::f32);
  Tensor labels({batch}, DType::i32);
  // A model on the cuda device gets each batch copied over, and its logits copied back for
  // the counts (planned once per evaluation).
  const Device device = model.device();
  const bool on_device = device != Device::cpu;
  Tensor device_inputs = on_device ? Tensor(inputs.shape(), DType::f32, device) : Tensor();
  Tensor device_labels = on_device ? Tensor({batch}, DType::i32, device) : Tensor();
  Tensor host_logits = on_device ? Tensor({batch, classes}, DType::f32) : Tensor();
  std::vector<std::int32_t> predicted(static_cast<std::size_t>(batch));
  std::vector<std::int64_t> indices;
  EvalCounts counts(classes);
  for (std::int64_t first = begin; first < end; first += batch) {
    const std::int64_t count = std::min(batch, end - first);
    indices.resize(static_cast<std::size_t>(count));
    std::iota(indices.begin(), indices.end(), first);
    reader.read_batch(indices, inputs, labels);
    const Tensor x = Tensor::view(on_device ? device_inputs : inputs, 0,
                                  concat_shape(count, info.sample_shape));
    const Tensor y = Tensor::view(on_device ? device_labels : labels, 0, {count});
    if (on_device) {
      Tensor x_to = x, y_to = y;
      kernels::copy(Tensor::view(inputs, 0, x.shape()), x_to);
      kernels::copy(Tensor::view(labels, 0, {count}), y_to);
    }
    const Tensor& device_logits = model.forward(x, /*training=*/false);
    counts.loss_sum += kernels::softmax_xent_forward(device_logits, y).loss_sum;
    counts.samples += static_cast<double>(count);
    Tensor logits = device_logits;
    if (on_device) {
      logits = Tensor::view(host_logits, 0, {count, classes});
      kernels::copy(device_logits, logits);
    }
    const Tensor host_y = Tensor::view(labels, 0, {count});
    count_predictions(logits, host_y, counts, predicted.data());
    if (outputs && outputs->predicted)
      for (std::int64_t i = 0; i < count; ++i)
        (*outputs->predicted)[static_cast<std::size_t>(first + i)] =
            predicted[static_cast<std::size_t>(i)];
    if (outputs && outputs->logits)
      std::copy_n(logits.data<float>(), count * classes,
                  outputs->logits->data<float>() + first * classes);
  }
  // One reduction for every sum: loss, hits, samples, then the confusion counts.
  std::vector<double> sums{counts.loss_sum, counts.top1, counts.top5, counts.samples};
  sums.insert(sums.end(), counts.confusion.begin(), counts.confusion.end());
  world.allreduce_sum(sums.data(), static_cast<int>(sums.size()));
  // Each rank filled only its own rows, the rest are zero: the sum gathers them exactly.
  if (outputs && outputs->predicted)
    world.allreduce_sum(outputs->predicted->data(), static_cast<int>(outputs->predicted->size()));
  if (outputs && outputs->logits) world.allreduce_sum(*outputs->logits);
  EvalResult result;
  const double samples = sums[3];
  result.samples = static_cast<std::int64_t>(samples);
  result.loss = samples > 0 ? sums[0] / samples : 0;
  result.accuracy = samples > 0 ? sums[1] / samples : 0;
  result.top5_accuracy = samples > 0 ? sums[2] / samples : 0;
  result.num_classes = classes;
  for (std::size_t i = 4; i < sums.size(); ++i)
    result.confusion.push_back(static_cast<std::int64_t>(sums[i]));
  return result;
}

void write_confusion_csv(const EvalResult& result, const std::string& path) {
  std::ostringstream csv;
  csv << "true/pred";
  for (int c = 0; c < result.num_classes; ++c) csv << ',' << c;
  csv << '\n';
  for (int t = 0; t < result.num_classes; ++t) {
    csv << t;
    for (int p = 0; p < result.num_classes; ++p)
      csv << ',' << result.confusion[static_cast<std::size_t>(t * result.num_classes + p)];
    csv << '\n';
  }
  if (path == "-") {
    std::fputs(csv.str().c_str(), stdout);
    std::fflush(stdout);
    return;
  }
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << csv.str();
    out.close();
    MPT_REQUIRE(out.good(),
                "cannot write the confusion matrix to '" + path + "' (--eval.confusion)",
                "choose a writable path, or - for stdout");
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  MPT_REQUIRE(!error, "cannot write the confusion matrix to '" + path + "': " + error.message(),
              "choose a writable path, or - for stdout");
}

namespace {

DType precision_dtype(const std::string& name) {
  return name == "fp16" ? DType::f16 : name == "bf16" ? DType::bf16 : DType::f32;
}

// Checks that a confusion output path can be written, before any work (setup, no collective).
void check_output_path(const std::string& path, const std::string& option) {
  if (path.empty() || path == "-") return;
  const auto dir = std::filesystem::path(path).parent_path();
  MPT_REQUIRE(dir.empty() || std::filesystem::is_directory(dir),
              "directory '" + dir.string() + "' of " + option + " '" + path + "' does not exist",
              "create it first, or choose another path");
}

// Writes the predictions file (rank 0): predicted class, logits and labels per sample.
void write_predictions(const std::string& path, const exported::ModelFile& model_file,
                       const data::DatasetInfo& info, const std::vector<double>& predicted,
                       const Tensor& logits, const EvalResult& result) {
  std::vector<std::int32_t> classes(predicted.begin(), predicted.end());
  ckpt::write_hdf5_atomically(path, "predictions file", [&](hid_t root) {
    hdf5_write_attribute(root, "mptrain_format", "mptrain-predictions");
    hdf5_write_attribute(root, "format_version", std::int32_t{1});
    hdf5_write_attribute(root, "model", model_file.path);
    hdf5_write_attribute(root, "model_sha256", model_file.sha256);
    hdf5_write_attribute(root, "data", info.path);
    hdf5_write_attribute(root, "num_classes", static_cast<std::int32_t>(result.num_classes));
    hdf5_write_attribute(root, "accuracy", static_cast<float>(result.accuracy));
    hdf5_write_attribute(root, "top5_accuracy", static_cast<float>(result.top5_accuracy));
    hdf5_write_attribute(root, "loss", static_cast<float>(result.loss));
    const Shape n{static_cast<std::int64_t>(classes.size())};
    hdf5_write_dataset(root, "predictions", H5T_STD_I32LE, H5T_NATIVE_INT32, n, classes.data());
    hdf5_write_dataset(root, "logits", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, logits.shape(),
                       logits.raw());
  });
}

}  // namespace

EvalResult run_evaluation(const std::string& checkpoint, const DataConfig& data_config,
                          std::int64_t batch_size, const comm::World& world,
                          const std::string& confusion_path) {
  std::optional<ckpt::LoadedCheckpoint> loaded;
  std::optional<data::DatasetReader> reader;
  std::optional<nn::Model> model;
  world.run_agreed([&] {
    MPT_REQUIRE(!checkpoint.empty(), "no checkpoint given (--checkpoint)",
                "pass --checkpoint=FILE or a directory that holds `latest`");
    MPT_REQUIRE(!data_config.test_path.empty(), "no dataset given to evaluate on (--data.test)",
                "pass --data.test=PATH, e.g. data/fashion-mnist/test.h5");
    MPT_REQUIRE(batch_size > 0, "--train.batch-size must be positive", "e.g. 256");
    check_output_path(confusion_path, "--eval.confusion");
    loaded.emplace(ckpt::load_weights(checkpoint));
    reader.emplace(data_config.test_path, reader_options_for(data_config, "--data.test"));
    const auto& info = reader->info();
    const auto& meta = loaded->meta;
    MPT_REQUIRE(info.sample_shape == meta.sample_shape,
                "dataset '" + info.path + "' has sample shape " +
                    shape_to_string(info.sample_shape) + " but the checkpoint's model expects " +
                    shape_to_string(meta.sample_shape),
                "evaluate on data prepared like the training set");
    MPT_REQUIRE(info.num_classes == meta.num_classes,
                "dataset '" + info.path + "' has " + std::to_string(info.num_classes) +
                    " classes but the checkpoint's model has " + std::to_string(meta.num_classes),
                "evaluate on data prepared like the training set");
    // Evaluate in the precision the model was trained in, from its FP32 master weights.
    model.emplace(nn::Model::build(meta.model_spec, meta.sample_shape, meta.num_classes,
                                   precision_dtype(meta.precision)));
    // Weights and buffers by name and shape (a mismatch names the layer).
    exported::load_into(*model, loaded->weights, loaded->buffers, loaded->path);
  });
  model->plan(batch_size);
  const EvalResult result = evaluate(*model, *reader, batch_size, world);
  if (!confusion_path.empty())
    world.run_agreed([&] {
      if (world.rank() == 0) write_confusion_csv(result, confusion_path);
    });
  return result;
}

EvalResult run_prediction(const PredictConfig& config, const comm::World& world) {
  std::optional<exported::ModelFile> model_file;
  std::optional<data::DatasetReader> reader;
  std::optional<nn::Model> model;
  world.run_agreed([&] {
    MPT_REQUIRE(!config.data.test_path.empty(), "no data given to predict on (--data)",
                "pass --data=PATH, a data file in mptrain's layout (docs/data-format.md)");
    MPT_REQUIRE(config.batch_size > 0, "--batch-size must be positive", "e.g. --batch-size=256");
    const auto& precision = config.precision;
    MPT_REQUIRE(
        precision == "auto" || precision == "fp32" || precision == "fp16" || precision == "bf16",
        "unknown --precision '" + precision + "'", "use auto, fp32, fp16 or bf16");
    check_output_path(config.confusion_path, "--confusion");
    check_output_path(config.out_path, "--out");
    model_file.emplace(exported::load_model_file(config.model_path));
    reader.emplace(config.data.test_path, reader_options_for(config.data, "--data"));
    const auto& info = reader->info();
    const auto& file = *model_file;
    MPT_REQUIRE(info.sample_shape == file.sample_shape,
                "data '" + info.path + "' has sample shape " + shape_to_string(info.sample_shape) +
                    " but model '" + file.path + "' expects " + shape_to_string(file.sample_shape),
                "predict on data prepared like the training set");
    MPT_REQUIRE(info.num_classes == file.num_classes,
                "data '" + info.path + "' has " + std::to_string(info.num_classes) +
                    " classes but model '" + file.path + "' has " +
                    std::to_string(file.num_classes),
                "predict on data prepared like the training set");
    // uint8 pixels are normalised by the data file's mean/std (as eval does); they must be the
    // model's, or every input is shifted.
    MPT_REQUIRE(info.sample_dtype != DType::u8 ||
                    (info.mean == file.input_mean && info.std == file.input_std),
                "data '" + info.path + "' normalises its uint8 pixels with mean/std " +
                    std::to_string(info.mean) + "/" + std::to_string(info.std) + " but model '" +
                    file.path + "' was trained with " + std::to_string(file.input_mean) + "/" +
                    std::to_string(file.input_std),
                "prepare the data with the training set's statistics (`mptrain prepare ... "
                "--stats-from TRAIN.h5`)");
    model.emplace(exported::build_model(
        file, precision_dtype(precision == "auto" ? file.precision : precision)));
  });
  model->plan(config.batch_size);
  const auto& info = reader->info();
  std::vector<double> predicted;
  Tensor logits;
  EvalOutputs outputs;
  if (!config.out_path.empty()) {
    predicted.assign(static_cast<std::size_t>(info.num_samples), 0.0);
    logits = Tensor({info.num_samples, model->num_classes()}, DType::f32);
    std::fill_n(logits.data<float>(), logits.numel(), 0.0f);
    outputs.predicted = &predicted;
    outputs.logits = &logits;
  }
  const EvalResult result = evaluate(*model, *reader, config.batch_size, world, &outputs);
  world.run_agreed([&] {
    if (world.rank() != 0) return;
    if (!config.confusion_path.empty()) write_confusion_csv(result, config.confusion_path);
    if (!config.out_path.empty())
      write_predictions(config.out_path, *model_file, info, predicted, logits, result);
  });
  return result;
}

}  // namespace mpt::train
