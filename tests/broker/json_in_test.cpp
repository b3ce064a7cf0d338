// The one reader of JSON request bodies: duplicate keys at any depth, with
// the JSON path and, in an array, the element; depth bounded; syntax errors.
#include "broker/detail/json_in.h"

#include <gtest/gtest.h>

#include <string>

namespace entente::broker::detail {
namespace {

std::optional<JsonProblem> read(const std::string& text) {
  rapidjson::Document d;
  return read_json(text, d);
}

TEST(JsonIn, AcceptsWhatIsWellFormedAndUnique) {
  EXPECT_FALSE(read(R"({"a":1,"b":{"a":2},"c":[{"a":1},{"a":2}]})"));
  EXPECT_FALSE(read("[]"));
  EXPECT_FALSE(read("3"));
}

TEST(JsonIn, NamesTheDuplicateKeyByItsPath) {
  auto p = read(R"({"name":"a","name":"b"})");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->code, Errc::invalid_argument);
  EXPECT_EQ(p->message(), "$.name: duplicate key 'name'");
  EXPECT_EQ(p->key, "name");
  EXPECT_FALSE(p->element);

  p = read(R"({"boxes":[{"id":"f"},{"id":"g","options":{"x":1,"y":2,"x":3}}]})");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->path, "$.boxes[1].options.x");

  p = read(R"([{"k":1},{"k":2,"k":3}])");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->path, "$[1].k");
  ASSERT_TRUE(p->element);
  EXPECT_EQ(*p->element, 1u);

  // A large object (keys compared by sorting).
  std::string big = "{";
  for (int i = 0; i < 100; ++i) big += "\"f" + std::to_string(i) + "\":" + std::to_string(i) + ",";
  EXPECT_FALSE(read(big + "\"last\":0}"));
  p = read(big + "\"f42\":0}");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->path, "$.f42");
}

TEST(JsonIn, BoundsNestingAndReportsSyntax) {
  const std::string ok = std::string(kMaxJsonDepth, '[') + std::string(kMaxJsonDepth, ']');
  EXPECT_FALSE(read(ok));
  // Deep enough to overflow a recursive parser's stack: refused, not a crash.
  auto p = read(std::string(100000, '[') + std::string(100000, ']'));
  ASSERT_TRUE(p);
  EXPECT_NE(p->why.find("nested deeper than 64"), std::string::npos) << p->why;
  p = read(R"({"a":)");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->code, Errc::parse_error);
  EXPECT_EQ(p->message().rfind("invalid JSON at offset 5: ", 0), 0u) << p->message();

  std::string text = R"({"a":1,"a":2})";
  rapidjson::Document d;
  p = read_json_insitu(text.data(), d);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->path, "$.a");
  EXPECT_FALSE(read_json_body(R"({"a":1,"a":2})", d).ok());
}

}  // namespace
}  // namespace entente::broker::detail
