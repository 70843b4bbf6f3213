// Fuzz target: data::convert_npy (`mptrain prepare npy`): the input is the samples .npy and the
// labels .npy, separated by kSplitMarker (fuzz_util.hpp).
#include <cstdint>

#include "data/data.hpp"
#include "fuzz/fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return mpt::fuzz::run_one("fuzz_npy", [&] {
    const auto [samples, labels] = mpt::fuzz::split_input(data, size);
    auto& scratch = mpt::fuzz::Scratch::get();
    mpt::data::convert_npy(scratch.write("x.npy", samples), scratch.write("y.npy", labels),
                           scratch.path("out.h5"), mpt::data::ArrayConvertOptions{});
  });
}
