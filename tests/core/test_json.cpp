// JsonObject: escaping, numbers, and non-finite values written as null.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <string>

#include "core/json.hpp"

namespace mpt {
namespace {

TEST(Json, WritesOrderedKeysAndEscapes) {
  JsonObject o;
  o.add("step", 3).add("loss", 0.25).add("name", "a\"b\n").add("ok", true);
  EXPECT_EQ(o.str(), "{\"step\": 3, \"loss\": 0.25, \"name\": \"a\\\"b\\n\", \"ok\": true}");
}

// Every double reads back exactly. 14018.612792 lies just below the midpoint of two floats;
// nine digits ("14018.6128") lie above it, so a reader narrowing to float was one ulp off.
TEST(Json, DoublesReadBackExactly) {
  for (const double value : {14018.612792, 0.1 + 0.2, 1.0 / 3.0, -2.5e-300, 6.02214076e23, 3.0}) {
    JsonObject o;
    o.add("x", value);
    const std::string text = o.str();
    const std::string number = text.substr(6, text.size() - 7);  // {"x": <number>}
    EXPECT_EQ(std::strtod(number.c_str(), nullptr), value) << text;
    EXPECT_EQ(static_cast<float>(std::strtod(number.c_str(), nullptr)), static_cast<float>(value))
        << text;
  }
  JsonObject o;
  o.add("x", 3.0);
  EXPECT_EQ(o.str(), "{\"x\": 3}");
}

TEST(Json, NonFiniteBecomesNull) {
  JsonObject o;
  o.add("x", std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(o.str(), "{\"x\": null}");
}

}  // namespace
}  // namespace mpt
