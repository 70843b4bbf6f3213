// Parsing of model specs ("mlp", "dense:1024,relu,dense:10") into a list of layer descriptions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mpt::nn {

// One item of a spec: a layer kind and its size argument (0 when the kind takes none).
struct LayerSpec {
  std::string kind;  // "dense", "relu"
  std::int64_t size = 0;
};

// Expands a model name and parses the comma list. Throws UserError naming --model.layers, with
// the known kinds in the hint, on an empty item, an unknown kind or a bad size.
std::vector<LayerSpec> parse_model_spec(const std::string& name_or_spec, int num_classes);

// "dense:1024,relu,dense:10"
std::string format_model_spec(const std::vector<LayerSpec>& layers);

}  // namespace mpt::nn
