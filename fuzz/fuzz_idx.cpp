// Fuzz target: data::convert_idx (`mptrain prepare fashion-mnist` and IDX files): the input is
// the images file and the labels file, separated by kSplitMarker (fuzz_util.hpp).
#include <cstdint>

#include "data/data.hpp"
#include "fuzz/fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return mpt::fuzz::run_one("fuzz_idx", [&] {
    const auto [images, labels] = mpt::fuzz::split_input(data, size);
    auto& scratch = mpt::fuzz::Scratch::get();
    mpt::data::IdxConvertOptions options;
    options.num_classes = 10;
    mpt::data::convert_idx(scratch.write("images-idx3-ubyte", images),
                           scratch.write("labels-idx1-ubyte", labels), scratch.path("out.h5"),
                           options);
  });
}
