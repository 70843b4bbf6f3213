// Fuzz target: exported::load_model_file, what `mptrain predict --model FILE` opens: format,
// metadata, the model spec built and matched against the weights, then the SHA-256.
#include <cstdint>

#include "export/export.hpp"
#include "fuzz/fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return mpt::fuzz::run_one("fuzz_export", [&] {
    const std::string path = mpt::fuzz::Scratch::get().write(
        "model.h5", {reinterpret_cast<const char*>(data), size});
    (void)mpt::exported::load_model_file(path);
  });
}
