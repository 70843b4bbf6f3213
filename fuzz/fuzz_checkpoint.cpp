// Fuzz target: ckpt::load_weights, the loader behind --resume, eval and export: format, version,
// attributes, every dataset's CRC-32C and the training state.
#include <cstdint>

#include "ckpt/ckpt.hpp"
#include "fuzz/fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return mpt::fuzz::run_one("fuzz_checkpoint", [&] {
    const std::string path = mpt::fuzz::Scratch::get().write(
        "ckpt-1.h5", {reinterpret_cast<const char*>(data), size});
    (void)mpt::ckpt::load_weights(path);
  });
}
