// Private to the train module: evaluation of a model on a dataset split across ranks.
#pragma once

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

// Mean loss and accuracy of MODEL on all of READER's samples; rank r takes a contiguous slice
// and the sums are reduced, so the result is the same on every rank. MODEL must be planned
// for at least BATCH samples.
EvalResult evaluate(nn::Model& model, data::DatasetReader& reader, std::int64_t batch,
                    const comm::World& world);

}  // namespace mpt::train
