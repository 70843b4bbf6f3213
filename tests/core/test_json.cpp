// JsonObject: escaping, numbers, and non-finite values written as null.
#include <gtest/gtest.h>

#include <limits>

#include "core/json.hpp"

namespace mpt {
namespace {

TEST(Json, WritesOrderedKeysAndEscapes) {
  JsonObject o;
  o.add("step", 3).add("loss", 0.25).add("name", "a\"b\n").add("ok", true);
  EXPECT_EQ(o.str(), "{\"step\": 3, \"loss\": 0.25, \"name\": \"a\\\"b\\n\", \"ok\": true}");
}

TEST(Json, NonFiniteBecomesNull) {
  JsonObject o;
  o.add("x", std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(o.str(), "{\"x\": null}");
}

}  // namespace
}  // namespace mpt
