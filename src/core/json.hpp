// A small JSON object writer for metrics.jsonl and summary.json; keys keep insertion order.
#pragma once

#include <cstdint>
#include <string>

namespace mpt {

class JsonObject {
 public:
  JsonObject& add(const std::string& key, const std::string& value);
  JsonObject& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonObject& add(const std::string& key, double value);
  JsonObject& add(const std::string& key, std::int64_t value);
  JsonObject& add(const std::string& key, int value) { return add(key, static_cast<std::int64_t>(value)); }
  JsonObject& add(const std::string& key, bool value);
  // Adds VALUE_JSON verbatim (an already serialised object or array).
  JsonObject& add_raw(const std::string& key, const std::string& value_json);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void add_key(const std::string& key);
  std::string body_;
};

std::string json_escape(const std::string& text);

}  // namespace mpt
