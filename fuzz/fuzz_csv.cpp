// Fuzz target: data::convert_csv (`mptrain prepare csv`), with the label in the first column and
// header detection (the defaults), then with the label last.
#include <cstdint>

#include "data/data.hpp"
#include "fuzz/fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return mpt::fuzz::run_one("fuzz_csv", [&] {
    auto& scratch = mpt::fuzz::Scratch::get();
    const std::string path = scratch.write("data.csv", {reinterpret_cast<const char*>(data), size});
    mpt::data::ArrayConvertOptions options;
    try {
      mpt::data::convert_csv(path, scratch.path("first.h5"), options);
    } catch (const mpt::UserError&) {
    }
    options.label_column = -1;
    mpt::data::convert_csv(path, scratch.path("last.h5"), options);
  });
}
