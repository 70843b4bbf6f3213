// Model spec parsing (see spec.hpp). Every error names --model.layers, the option it comes from.
#include "nn/spec.hpp"

#include <cctype>
#include <charconv>

#include "core/error.hpp"

namespace mpt::nn {

namespace {

constexpr const char* kOption = "--model.layers";
constexpr const char* kKnownKinds =
    "known layers are dense:N (N output features) and relu, comma-separated, e.g. "
    "dense:1024,relu,dense:10; known models are mlp";

std::string trim(const std::string& text) {
  std::size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

[[noreturn]] void bad_spec(const std::string& spec, const std::string& problem) {
  throw_user_error(std::string(kOption) + " '" + spec + "': " + problem, kKnownKinds);
}

LayerSpec parse_item(const std::string& spec, const std::string& item) {
  if (item.empty()) bad_spec(spec, "empty layer in the list");
  const auto colon = item.find(':');
  const std::string kind = trim(item.substr(0, colon));
  const bool has_argument = colon != std::string::npos;
  const std::string argument = has_argument ? trim(item.substr(colon + 1)) : std::string();
  if (kind == "relu") {
    if (has_argument) bad_spec(spec, "'" + item + "': relu takes no argument");
    return {"relu", 0};
  }
  if (kind == "dense") {
    std::int64_t size = 0;
    const char* first = argument.data();
    const char* last = first + argument.size();
    const auto [end, error] = std::from_chars(first, last, size);
    if (!has_argument || argument.empty() || error != std::errc() || end != last || size <= 0)
      bad_spec(spec, "'" + item +
                         "': dense needs a positive number of output features, "
                         "as in dense:1024");
    return {"dense", size};
  }
  bad_spec(spec, "unknown layer '" + kind + "'");
}

}  // namespace

std::vector<LayerSpec> parse_model_spec(const std::string& name_or_spec, int num_classes) {
  std::string spec = trim(name_or_spec);
  if (spec == "mlp") spec = "dense:1024,relu,dense:1024,relu,dense:" + std::to_string(num_classes);
  if (spec.empty()) bad_spec(spec, "no layers given");
  std::vector<LayerSpec> layers;
  std::size_t begin = 0;
  while (true) {
    const auto comma = spec.find(',', begin);
    layers.push_back(parse_item(spec, trim(spec.substr(begin, comma - begin))));
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  const LayerSpec& last = layers.back();
  if (last.kind != "dense")
    throw_user_error(std::string(kOption) + " '" + spec + "': the last layer is " + last.kind +
                         ", but it must be the dense layer that outputs the class scores",
                     "end the list with dense:" + std::to_string(num_classes));
  if (last.size != num_classes)
    throw_user_error(std::string(kOption) + " '" + spec + "': the last layer outputs " +
                         std::to_string(last.size) + " features but the data has " +
                         std::to_string(num_classes) + " classes",
                     "end the list with dense:" + std::to_string(num_classes));
  return layers;
}

std::string format_model_spec(const std::vector<LayerSpec>& layers) {
  std::string text;
  for (const auto& layer : layers) {
    if (!text.empty()) text += ',';
    text += layer.kind;
    if (layer.kind == "dense") {
      text += ':';
      text += std::to_string(layer.size);
    }
  }
  return text;
}

}  // namespace mpt::nn
