// Private to the train module: evaluation of a model on a dataset split across ranks.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/comm.hpp"
#include "core/tensor.hpp"
#include "data/data.hpp"
#include "nn/nn.hpp"
#include "train/train.hpp"

namespace mpt::train {

// The [data] options as the data module takes them; OPTION names the file's option in messages
// (--data.train or --data.test). UserError naming the option for a bad value.
data::ReaderOptions reader_options_for(const DataConfig& config, const std::string& option);
// The training set's ShardOptions (--data.shuffle, --data.shuffle-window, --data.drop-last).
data::ShardOptions shard_options_for(const DataConfig& config, const data::DatasetInfo& info);

// (n, s0, s1, ...) from n and (s0, s1, ...).
Shape concat_shape(std::int64_t n, const Shape& sample_shape);

// The sums evaluation keeps per rank and all-reduces: loss, top-1 and top-5 hits, samples, and
// the confusion counts, all as doubles (exact below 2^53) so that one reduction carries them.
struct EvalCounts {
  explicit EvalCounts(int num_classes)
      : num_classes(num_classes),
        confusion(static_cast<std::size_t>(num_classes) * static_cast<std::size_t>(num_classes)) {}
  int num_classes;
  double loss_sum = 0, top1 = 0, top5 = 0, samples = 0;
  std::vector<double> confusion;  // [true][predicted], row-major
};

// The k of top-k accuracy: 5, or every class when there are fewer.
inline constexpr int kTopK = 5;

// Adds the top-1 and top-5 hits and confusion counts of LOGITS (f32 [b, C]) against LABELS
// (i32 [b]; a negative label, a skipped sample, counts nowhere). The prediction is the first
// maximum; the true class is in the top k when fewer than k classes beat it, a tie counting
// against it when the other class comes first (numpy's stable argsort of -logits). PREDICTED,
// when not null, receives b predictions. Loss and samples are the caller's.
void count_predictions(const Tensor& logits, const Tensor& labels, EvalCounts& counts,
                       std::int32_t* predicted = nullptr);

// Per-sample outputs that evaluate() fills when asked (predict): rows are global sample indices,
// every rank writing its own slice, zero elsewhere.
struct EvalOutputs {
  std::vector<double>* predicted = nullptr;  // [N], the predicted class
  Tensor* logits = nullptr;                  // f32 [N, C]
};

// Loss, top-1 and top-5 accuracy and the confusion matrix of MODEL on all of READER's samples;
// rank r takes a contiguous slice and the sums are reduced, so the result is the same on every
// rank. MODEL must be planned for at least BATCH samples. OUTPUTS, when given, are summed across
// ranks too, so every rank ends with all N rows.
EvalResult evaluate(nn::Model& model, data::DatasetReader& reader, std::int64_t batch,
                    const comm::World& world, const EvalOutputs* outputs = nullptr);

}  // namespace mpt::train
