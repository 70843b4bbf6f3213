// Fuzz target: `mptrain inspect FILE`, which must describe any HDF5 file, damaged ones included:
// data::inspect_file, then ckpt::describe_checkpoint (a checkpoint's run state and checksums).
#include <cstdint>

#include "ckpt/ckpt.hpp"
#include "data/data.hpp"
#include "fuzz/fuzz_util.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return mpt::fuzz::run_one("fuzz_inspect", [&] {
    const std::string path = mpt::fuzz::Scratch::get().write(
        "file.h5", {reinterpret_cast<const char*>(data), size});
    try {
      (void)mpt::data::inspect_file(path);
    } catch (const mpt::UserError&) {
    }
    (void)mpt::ckpt::describe_checkpoint(path);
  });
}
