// JSON serialisation for the run's output files (see json.hpp).
#include "core/json.hpp"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace mpt {

std::string json_escape(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char buffer[8];
          std::snprintf(buffer, sizeof(buffer), "\\u%04x", c);
          out += buffer;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

void JsonObject::add_key(const std::string& key) {
  if (!body_.empty()) body_ += ", ";
  body_ += json_escape(key) + ": ";
}

JsonObject& JsonObject::add(const std::string& key, const std::string& value) {
  add_key(key);
  body_ += json_escape(value);
  return *this;
}

JsonObject& JsonObject::add(const std::string& key, double value) {
  add_key(key);
  if (!std::isfinite(value)) {
    body_ += "null";  // JSON has no NaN or Inf
  } else {
    // The shortest text that reads back as the same double. A fixed "%.9g" rounded twice: a
    // reader that narrows the text to float (as TensorBoard's records do) could land one ulp
    // away from the float the trainer wrote beside it.
    char buffer[32];
    const auto written = std::to_chars(buffer, buffer + sizeof(buffer), value);
    body_.append(buffer, written.ptr);
  }
  return *this;
}

JsonObject& JsonObject::add(const std::string& key, std::int64_t value) {
  add_key(key);
  body_ += std::to_string(value);
  return *this;
}

JsonObject& JsonObject::add(const std::string& key, bool value) {
  add_key(key);
  body_ += value ? "true" : "false";
  return *this;
}

JsonObject& JsonObject::add_raw(const std::string& key, const std::string& value_json) {
  add_key(key);
  body_ += value_json;
  return *this;
}

}  // namespace mpt
