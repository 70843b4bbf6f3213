// Parsing of model specs ("mlp", "cnn", "resnet-mini", "conv:32:5:pad=2,relu,maxpool:2,flatten,dense:10") into
// a list of layer descriptions. Shapes are checked later, by Model::build, which knows the input.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mpt::nn {

// One item of a spec: a layer kind and its arguments (0 where the kind takes none).
struct LayerSpec {
  // "dense", "relu", "gelu", "conv", "maxpool", "avgpool", "gap", "flatten", "bn", "dropout",
  // "resblock"
  std::string kind;
  std::int64_t size = 0;  // dense: output features; conv, resblock: output channels
  std::int64_t kernel = 0;  // conv, maxpool, avgpool: the K of a K x K window
  std::int64_t stride = 0;  // conv, resblock: default 1; pools: default the kernel
  std::int64_t pad = 0;     // conv: zero padding on every side
  double rate = 0;          // dropout: drop probability in [0, 1)
  std::string item;         // the item as written, for error messages
};

// The text of the option every spec error names.
inline constexpr const char* kModelLayersOption = "--model.layers";

// Expands a model name and parses the comma list. Throws UserError naming --model.layers, with
// the known kinds in the hint, on an empty item, an unknown kind or a bad number.
std::vector<LayerSpec> parse_model_spec(const std::string& name_or_spec, int num_classes);

// "0.5" for 0.5: the canonical text of a dropout rate (up to 6 significant digits).
std::string format_rate(double rate);

// "dense:1024,relu,dense:10"
std::string format_model_spec(const std::vector<LayerSpec>& layers);

// Throws the UserError for a spec whose layers do not fit together: "--model.layers 'SPEC':
// layer NAME ('ITEM'): PROBLEM", with HINT.
[[noreturn]] void throw_layer_error(const std::string& spec, const std::string& name,
                                    const LayerSpec& layer, const std::string& problem,
                                    const std::string& hint);

}  // namespace mpt::nn
