// Fuzz target: the model-spec parser (--model.layers, nn/spec.cpp) and Model::build, which
// checks that the layers chain for an input shape. The input is the spec text; the data has 10
// classes. Also a property: the canonical text of a parsed spec parses to the same layers.
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.hpp"
#include "nn/nn.hpp"
#include "nn/spec.hpp"

namespace {

constexpr int kClasses = 10;

// Model::build allocates every parameter, so the harness builds only specs whose numbers stay
// small (the parser, and the build of anything else, is what a user's typo reaches first; the
// sizes themselves are the user's to choose).
bool small_enough(const std::vector<mpt::nn::LayerSpec>& layers) {
  if (layers.size() > 24) return false;
  for (const auto& layer : layers)
    if (layer.size > 64 || layer.kernel > 16 || layer.stride > 16 || layer.pad > 4) return false;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return mpt::fuzz::run_one("fuzz_model_spec", [&] {
    const std::string spec(reinterpret_cast<const char*>(data), size);
    const auto layers = mpt::nn::parse_model_spec(spec, kClasses);
    const std::string canonical = mpt::nn::format_model_spec(layers);
    const std::string again = mpt::nn::format_model_spec(mpt::nn::parse_model_spec(canonical, kClasses));
    if (again != canonical) {
      std::fprintf(stderr, "fuzz_model_spec: '%s' formats as '%s', which reparses as '%s'\n",
                   spec.c_str(), canonical.c_str(), again.c_str());
      std::abort();
    }
    if (!small_enough(layers)) return;
    for (const mpt::Shape& sample : {mpt::Shape{2, 12, 12}, mpt::Shape{20}}) {
      try {
        (void)mpt::nn::Model::build(spec, sample, kClasses, mpt::DType::f32);
      } catch (const mpt::UserError&) {
      }
    }
  });
}
