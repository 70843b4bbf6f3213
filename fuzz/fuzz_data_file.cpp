// Fuzz target: an HDF5 data file opened by data::DatasetReader (the validation every training
// and evaluation run does) and a few samples read from it, through pread() and through HDF5.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "data/data.hpp"
#include "fuzz/fuzz_util.hpp"

namespace {

// The harness reads samples only below this size, so that a file declaring one huge sample
// costs no more than the reader's validation (which always runs).
constexpr std::int64_t kMaxSampleElements = std::int64_t{1} << 20;

void read_some(const std::string& path, bool direct, mpt::data::NonFiniteAction on_nonfinite) {
  mpt::data::ReaderOptions options;
  options.option_prefix = "--data.train";
  options.direct_reads = direct;
  options.on_nonfinite = on_nonfinite;
  options.chunk_cache_bytes = 1u << 20;
  mpt::data::DatasetReader reader(path, options);
  const auto& info = reader.info();
  if (mpt::shape_numel(info.sample_shape) > kMaxSampleElements) return;
  const std::int64_t n = info.num_samples;
  // First, last, middle, and a duplicate: a run, a lone read and a reused slot.
  const std::vector<std::int64_t> indices{0, n - 1, n / 2, 0, std::min<std::int64_t>(1, n - 1)};
  mpt::Shape shape{static_cast<std::int64_t>(indices.size())};
  shape.insert(shape.end(), info.sample_shape.begin(), info.sample_shape.end());
  mpt::Tensor samples(shape, mpt::DType::f32);
  mpt::Tensor labels({static_cast<std::int64_t>(indices.size())}, mpt::DType::i32);
  reader.read_batch(indices, samples, labels);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return mpt::fuzz::run_one("fuzz_data_file", [&] {
    const std::string path = mpt::fuzz::Scratch::get().write(
        "train.h5", {reinterpret_cast<const char*>(data), size});
    try {
      read_some(path, /*direct=*/true, mpt::data::NonFiniteAction::error);
    } catch (const mpt::UserError&) {
    }
    read_some(path, /*direct=*/false, mpt::data::NonFiniteAction::skip);
  });
}
