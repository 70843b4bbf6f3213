// Model spec parsing (see spec.hpp). Every error names --model.layers, the option it comes from.
#include "nn/spec.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "core/error.hpp"
#include "nn/nn.hpp"

namespace mpt::nn {

namespace {

constexpr const char* kOption = kModelLayersOption;
constexpr const char* kKnownKinds =
    "known layers are dense:N, conv:C_OUT:K[:stride=S][:pad=P], maxpool:K[:stride=S], "
    "avgpool:K[:stride=S], gap, flatten, relu, gelu, bn, dropout:P and resblock:C[:stride=S], "
    "comma-separated, e.g. conv:32:5:pad=2,relu,maxpool:2,flatten,dense:10 (docs/model-spec.md); "
    "known models are mlp, cnn and resnet-mini";

std::string trim(const std::string& text) {
  std::size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

[[noreturn]] void bad_spec(const std::string& spec, const std::string& problem) {
  throw_user_error(std::string(kOption) + " '" + spec + "': " + problem, kKnownKinds);
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (true) {
    const auto at = text.find(separator, begin);
    parts.push_back(trim(text.substr(begin, at - begin)));
    if (at == std::string::npos) return parts;
    begin = at + 1;
  }
}

// A whole decimal number >= MINIMUM, or nothing.
bool parse_number(const std::string& text, std::int64_t minimum, std::int64_t& value) {
  const char* first = text.data();
  const char* last = first + text.size();
  const auto [end, error] = std::from_chars(first, last, value);
  return !text.empty() && error == std::errc() && end == last && value >= minimum;
}

LayerSpec parse_item(const std::string& spec, const std::string& item) {
  if (item.empty()) bad_spec(spec, "empty layer in the list");
  const auto parts = split(item, ':');
  const std::string& kind = parts[0];
  LayerSpec layer;
  layer.kind = kind;
  layer.item = item;
  const auto fail = [&](const std::string& usage) -> void {
    bad_spec(spec, "'" + item + "': " + usage);
  };
  if (kind == "relu" || kind == "gelu" || kind == "flatten" || kind == "gap" || kind == "bn") {
    if (parts.size() > 1) fail(kind + " takes no argument");
    return layer;
  }
  if (kind == "dense") {
    if (parts.size() != 2 || !parse_number(parts[1], 1, layer.size))
      fail("dense needs a positive number of output features, as in dense:1024");
    return layer;
  }
  if (kind == "dropout") {
    const std::string usage = "dropout needs a drop probability in [0, 1), as in dropout:0.5";
    if (parts.size() != 2 || parts[1].empty()) fail(usage);
    char* end = nullptr;
    layer.rate = std::strtod(parts[1].c_str(), &end);
    if (end != parts[1].c_str() + parts[1].size() || !(layer.rate >= 0 && layer.rate < 1))
      fail(usage);
    return layer;
  }
  if (kind == "resblock") {
    const std::string usage =
        "resblock needs a positive number of output channels, then an optional positive "
        "stride=, as in resblock:64:stride=2";
    if (parts.size() < 2 || parts.size() > 3 || !parse_number(parts[1], 1, layer.size))
      fail(usage);
    layer.stride = 1;
    if (parts.size() == 3) {
      const auto equals = parts[2].find('=');
      if (equals == std::string::npos || trim(parts[2].substr(0, equals)) != "stride" ||
          !parse_number(trim(parts[2].substr(equals + 1)), 1, layer.stride))
        fail(usage);
    }
    return layer;
  }
  if (kind == "conv" || kind == "maxpool" || kind == "avgpool") {
    const bool conv = kind == "conv";
    const std::string usage =
        conv ? "conv needs output channels and a kernel size, then optional stride= and pad=, "
               "all positive (pad >= 0), as in conv:32:5:stride=1:pad=2"
             : kind + " needs a kernel size, then an optional positive stride=, as in " + kind +
                   ":2:stride=2";
    const std::size_t positional = conv ? 2 : 1;
    if (parts.size() < positional + 1) fail(usage);
    if (conv && !parse_number(parts[1], 1, layer.size)) fail(usage);
    if (!parse_number(parts[positional], 1, layer.kernel)) fail(usage);
    layer.stride = conv ? 1 : layer.kernel;
    for (std::size_t i = positional + 1; i < parts.size(); ++i) {
      const auto equals = parts[i].find('=');
      const std::string key = trim(parts[i].substr(0, equals));
      const std::string value =
          equals == std::string::npos ? std::string() : trim(parts[i].substr(equals + 1));
      if (equals != std::string::npos && key == "stride" && parse_number(value, 1, layer.stride))
        continue;
      if (conv && equals != std::string::npos && key == "pad" && parse_number(value, 0, layer.pad))
        continue;
      fail(usage);
    }
    return layer;
  }
  bad_spec(spec, "unknown layer '" + kind + "'");
}

}  // namespace

void require_builtin_model(const std::string& name, const std::string& option) {
  if (name == "mlp" || name == "cnn" || name == "resnet-mini") return;
  throw_user_error(option + " '" + name + "' is not a built-in model",
                   "use mlp, cnn or resnet-mini, or give the layers with --model.layers "
                   "(docs/model-spec.md)");
}

std::vector<LayerSpec> parse_model_spec(const std::string& name_or_spec, int num_classes) {
  std::string spec = trim(name_or_spec);
  const std::string classes = std::to_string(num_classes);
  if (spec == "mlp") spec = "dense:1024,relu,dense:1024,relu,dense:" + classes;
  if (spec == "cnn")
    spec =
        "conv:32:5:pad=2,relu,maxpool:2,conv:64:5:pad=2,relu,maxpool:2,flatten,dense:512,relu,"
        "dense:" +
        classes;
  if (spec == "resnet-mini")
    spec =
        "conv:16:3:pad=1,bn,relu,resblock:16,resblock:32:stride=2,resblock:64:stride=2,gap,"
        "dense:" +
        classes;
  if (spec.empty()) bad_spec(spec, "no layers given");
  std::vector<LayerSpec> layers;
  for (const auto& item : split(spec, ',')) layers.push_back(parse_item(spec, item));
  const LayerSpec& last = layers.back();
  if (last.kind != "dense")
    throw_user_error(std::string(kOption) + " '" + spec + "': the last layer is " + last.kind +
                         ", but it must be the dense layer that outputs the class scores",
                     "end the list with dense:" + classes);
  if (last.size != num_classes)
    throw_user_error(std::string(kOption) + " '" + spec + "': the last layer outputs " +
                         std::to_string(last.size) + " features but the data has " + classes +
                         " classes",
                     "end the list with dense:" + classes);
  return layers;
}

std::string format_rate(double rate) {
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", rate);
  return text;
}

std::string format_model_spec(const std::vector<LayerSpec>& layers) {
  std::string text;
  for (const auto& layer : layers) {
    if (!text.empty()) text += ',';
    text += layer.kind;
    if (layer.kind == "dense" || layer.kind == "conv" || layer.kind == "resblock")
      text += ':' + std::to_string(layer.size);
    if (layer.kind == "resblock" && layer.stride != 1)
      text += ":stride=" + std::to_string(layer.stride);
    if (layer.kind == "dropout") text += ':' + format_rate(layer.rate);
    if (layer.kind == "conv" || layer.kind == "maxpool" || layer.kind == "avgpool")
      text += ':' + std::to_string(layer.kernel);
    if ((layer.kind == "conv" && layer.stride != 1) ||
        ((layer.kind == "maxpool" || layer.kind == "avgpool") && layer.stride != layer.kernel))
      text += ":stride=" + std::to_string(layer.stride);
    if (layer.kind == "conv" && layer.pad != 0) text += ":pad=" + std::to_string(layer.pad);
  }
  return text;
}

void throw_layer_error(const std::string& spec, const std::string& name, const LayerSpec& layer,
                       const std::string& problem, const std::string& hint) {
  throw_user_error(std::string(kOption) + " '" + spec + "': layer " + name + " ('" + layer.item +
                       "'): " + problem,
                   hint);
}

}  // namespace mpt::nn
