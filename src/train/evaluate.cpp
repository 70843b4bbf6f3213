// Evaluation: the test set is cut into contiguous per-rank slices with nothing dropped, and
// loss sums and correct counts are reduced across ranks.
#include "train/evaluate.hpp"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <sstream>
#include <vector>

#include "ckpt/ckpt.hpp"
#include "core/error.hpp"
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
    MPT_REQUIRE(!item.empty() && end && *end == '\0' && extent > 0,
                "--data.sample-shape '" + config.sample_shape +
                    "' is not a list of positive integers",
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

EvalResult evaluate(nn::Model& model, data::DatasetReader& reader, std::int64_t batch,
                    const comm::World& world) {
  const auto& info = reader.info();
  const auto [begin, end] = data::eval_shard(info.num_samples, world.size(), world.rank());
  Tensor inputs(concat_shape(batch, info.sample_shape), DType::f32);
  Tensor labels({batch}, DType::i32);
  std::vector<std::int64_t> indices;
  double sums[3] = {0, 0, 0};  // loss sum, correct, samples
  for (std::int64_t first = begin; first < end; first += batch) {
    const std::int64_t count = std::min(batch, end - first);
    indices.resize(static_cast<std::size_t>(count));
    std::iota(indices.begin(), indices.end(), first);
    reader.read_batch(indices, inputs, labels);
    const Tensor x = Tensor::view(inputs, 0, concat_shape(count, info.sample_shape));
    const Tensor y = Tensor::view(labels, 0, {count});
    const Tensor& logits = model.forward(x, /*training=*/false);
    const auto stats = kernels::softmax_xent_forward(logits, y);
    sums[0] += stats.loss_sum;
    sums[1] += static_cast<double>(stats.correct);
    sums[2] += static_cast<double>(count);
  }
  world.allreduce_sum(sums, 3);
  EvalResult result;
  result.samples = static_cast<std::int64_t>(sums[2]);
  result.loss = sums[2] > 0 ? sums[0] / sums[2] : 0;
  result.accuracy = sums[2] > 0 ? sums[1] / sums[2] : 0;
  return result;
}

EvalResult run_evaluation(const std::string& checkpoint, const DataConfig& data_config,
                          std::int64_t batch_size, const comm::World& world) {
  std::optional<ckpt::LoadedCheckpoint> loaded;
  std::optional<data::DatasetReader> reader;
  std::optional<nn::Model> model;
  world.run_agreed([&] {
    MPT_REQUIRE(!checkpoint.empty(), "no checkpoint given (--checkpoint)",
                "pass --checkpoint=FILE or a directory that holds `latest`");
    MPT_REQUIRE(!data_config.test_path.empty(), "no dataset given to evaluate on (--data.test)",
                "pass --data.test=PATH, e.g. data/fashion-mnist/test.h5");
    MPT_REQUIRE(batch_size > 0, "--train.batch-size must be positive", "e.g. 256");
    loaded.emplace(ckpt::load_weights(checkpoint));
    reader.emplace(data_config.test_path, reader_options_for(data_config, "--data.test"));
    const auto& info = reader->info();
    const auto& meta = loaded->meta;
    MPT_REQUIRE(info.sample_shape == meta.sample_shape,
                "dataset '" + info.path + "' has sample shape " + shape_to_string(info.sample_shape) +
                    " but the checkpoint's model expects " + shape_to_string(meta.sample_shape),
                "evaluate on data prepared like the training set");
    MPT_REQUIRE(info.num_classes == meta.num_classes,
                "dataset '" + info.path + "' has " + std::to_string(info.num_classes) +
                    " classes but the checkpoint's model has " + std::to_string(meta.num_classes),
                "evaluate on data prepared like the training set");
    // Evaluate in the precision the model was trained in, from its FP32 master weights.
    const DType precision = meta.precision == "fp16" ? DType::f16 : meta.precision == "bf16" ? DType::bf16 : DType::f32;
    model.emplace(nn::Model::build(meta.model_spec, meta.sample_shape, meta.num_classes, precision));
    // Copy the checkpoint's weights into the model, matching by name and shape.
    auto params = model->named_params();
    MPT_REQUIRE(params.size() == loaded->weights.size(),
                "checkpoint holds " + std::to_string(loaded->weights.size()) + " tensors but model '" +
                    meta.model_spec + "' has " + std::to_string(params.size()),
                "the checkpoint does not match its own model spec; it may be corrupt");
    for (auto& param : params) {
      const auto found = std::find_if(loaded->weights.begin(), loaded->weights.end(),
                                      [&](const ckpt::NamedTensor& w) { return w.name == param.name; });
      MPT_REQUIRE(found != loaded->weights.end() && found->value.shape() == param.value.shape(),
                  "checkpoint lacks weights '" + param.name + "' of shape " +
                      shape_to_string(param.value.shape()),
                  "the checkpoint does not match its own model spec; it may be corrupt");
      std::copy_n(found->value.data<float>(), param.value.numel(), param.value.data<float>());
    }
    model->recast_from_master();
  });
  model->plan(batch_size);
  return evaluate(*model, *reader, batch_size, world);
}

}  // namespace mpt::train
