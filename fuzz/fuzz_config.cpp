// Fuzz target: the option parsing of the mptrain binary (app/cli.cpp, Boost.Program_options):
// --config INI files and command lines. The first byte picks what the rest is:
//   0 mod 6: an INI file for `train`      1: an INI file for `eval`
//   2: `train` arguments, one per line     3: `prepare` arguments, one per line
//   4: `bench` arguments, one per line     5: `export` (then `predict`) arguments, one per line
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "app/cli.hpp"
#include "fuzz/fuzz_util.hpp"

namespace {

std::vector<std::string> lines_of(std::string_view text) {
  std::vector<std::string> lines;
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    lines.emplace_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return lines;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  return mpt::fuzz::run_one("fuzz_config", [&] {
    namespace app = mpt::app;
    const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
    switch (data[0] % 6) {
      case 0:
      case 1: {
        const std::string path = mpt::fuzz::Scratch::get().write("config.ini", rest);
        (void)app::parse_train_command(data[0] % 6 == 0 ? "train" : "eval", {"--config", path});
        break;
      }
      case 2:
        (void)app::parse_train_command("train", lines_of(rest));
        break;
      case 3:
        (void)app::parse_prepare_command(lines_of(rest));
        break;
      case 4:
        (void)app::parse_bench_command(lines_of(rest));
        break;
      default:
        try {
          (void)app::parse_export_command(lines_of(rest));
        } catch (const mpt::UserError&) {
        }
        (void)app::parse_predict_command(lines_of(rest));
        break;
    }
  });
}
