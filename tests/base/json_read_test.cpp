// base/json_read.h, the one JSON reader. Documents: duplicate keys at any
// depth, with the JSON path and, in an array, the element; depth bounded;
// syntax errors. Values: durations and sizes. Objects: every missing, bad or
// unknown key reported under its path, all of them in one pass.
#include "base/json_read.h"

#include <gtest/gtest.h>

#include <string>

namespace entente::base {
namespace {

std::optional<JsonProblem> read(const std::string& text) {
  rapidjson::Document d;
  return read_json(text, d);
}

TEST(JsonRead, AcceptsWhatIsWellFormedAndUnique) {
  EXPECT_FALSE(read(R"({"a":1,"b":{"a":2},"c":[{"a":1},{"a":2}]})"));
  EXPECT_FALSE(read("[]"));
  EXPECT_FALSE(read("3"));
}

TEST(JsonRead, NamesTheDuplicateKeyByItsPath) {
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

TEST(JsonRead, BoundsNestingAndReportsSyntax) {
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

rapidjson::Document parsed(const std::string& text) {
  rapidjson::Document d;
  EXPECT_FALSE(read_json(text, d)) << text;
  return d;
}

TEST(JsonRead, DurationsAndSizesWithTheirPaths) {
  Diagnostics diag;
  auto d = parsed(R"([1500, "250ms", "5min", "2h", -1, "1 s", 1.5, "99999999999999999999d"])");
  EXPECT_EQ(read_duration_ms(d[0], "$[0]", diag), 1500);
  EXPECT_EQ(read_duration_ms(d[1], "$[1]", diag), 250);
  EXPECT_EQ(read_duration_ms(d[2], "$[2]", diag), 300'000);
  EXPECT_EQ(read_duration_ms(d[3], "$[3]", diag), 7'200'000);
  EXPECT_TRUE(diag.ok());
  EXPECT_EQ(read_duration_ms(d[4], "$[4]", diag), std::nullopt);
  EXPECT_EQ(read_duration_ms(d[5], "$[5]", diag), std::nullopt);
  EXPECT_EQ(read_duration_ms(d[6], "$[6]", diag), std::nullopt);
  EXPECT_EQ(read_duration_ms(d[7], "$[7]", diag), std::nullopt);
  EXPECT_EQ(diag.to_string(),
            "$[4]: duration must not be negative\n"
            "$[5]: bad duration '1 s': expected a number followed by ms, s, m, min, h or d\n"
            "$[6]: expected a duration: milliseconds as an integer, or a string like \"10s\"\n"
            "$[7]: duration '99999999999999999999d' is too large");

  Diagnostics sizes;
  auto s = parsed(R"([4096, "4096", "64MiB", "1GB", "1 KiB", -5, true, "99999999999TiB"])");
  EXPECT_EQ(read_size_bytes(s[0], "$[0]", sizes), 4096u);
  EXPECT_EQ(read_size_bytes(s[1], "$[1]", sizes), 4096u);
  EXPECT_EQ(read_size_bytes(s[2], "$[2]", sizes), uint64_t{64} << 20);
  EXPECT_TRUE(sizes.ok());
  for (rapidjson::SizeType i = 3; i < 8; ++i) {
    EXPECT_EQ(read_size_bytes(s[i], "$[" + std::to_string(i) + "]", sizes), std::nullopt);
  }
  EXPECT_EQ(sizes.to_string(),
            "$[3]: size '1GB' is ambiguous; write binary units (KiB, MiB, GiB, TiB) or a number of bytes\n"
            "$[4]: bad size '1 KiB': expected a number of bytes, or one followed by B, KiB, MiB, GiB or TiB\n"
            "$[5]: size must not be negative\n"
            "$[6]: expected a size: bytes as an integer, or a string like \"64MiB\"\n"
            "$[7]: size '99999999999TiB' is too large");
}

TEST(JsonRead, ObjectReaderReportsEveryProblemOfAnObject) {
  auto d = parsed(R"({"name": 7, "window": "1 h", "buffer": "1GB", "mode": "fast", "extra": 1, "other": 2})");
  Diagnostics diag;
  JsonObjectReader r(&d, "$.spec", diag);
  EXPECT_EQ(r.string("name", Need::required), std::nullopt);
  EXPECT_EQ(r.duration_ms("window", Need::optional), std::nullopt);
  EXPECT_EQ(r.size_bytes("buffer", Need::optional), std::nullopt);
  EXPECT_EQ(r.choice("mode", Need::optional, {"slow", "exact"}), std::nullopt);
  EXPECT_EQ(r.int64("count", Need::required), std::nullopt);
  r.finish();
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(diag.to_string(),
            "$.spec.name: expected a string, got number\n"
            "$.spec.window: bad duration '1 h': expected a number followed by ms, s, m, min, h or d\n"
            "$.spec.buffer: size '1GB' is ambiguous; write binary units (KiB, MiB, GiB, TiB) or a number of bytes\n"
            "$.spec.mode: unknown value 'fast'; expected one of: slow exact\n"
            "$.spec.count: missing required key 'count'\n"
            "$.spec.extra: unknown key 'extra'; known keys: buffer count mode name window\n"
            "$.spec.other: unknown key 'other'; known keys: buffer count mode name window");
}

TEST(JsonRead, ObjectReaderReadsGoodValuesAndNamesItsMembers) {
  auto d = parsed(R"({"window": "10s", "buffer": "512KiB", "on": true, "tags": ["a", "b"]})");
  Diagnostics diag;
  JsonObjectReader r(&d, "$.boxes[0].options", diag, kOptionWords);
  EXPECT_EQ(r.duration_ms("window", Need::required), 10'000);
  EXPECT_EQ(r.size_bytes("buffer", Need::required), 512u * 1024);
  EXPECT_EQ(r.boolean("on", Need::required), true);
  EXPECT_EQ(r.strings("tags", Need::required), (std::vector<std::string>{"a", "b"}));
  r.finish();
  EXPECT_TRUE(r.ok()) << diag.to_string();

  auto not_object = parsed("[1]");
  Diagnostics bad;
  JsonObjectReader options(&not_object, "$.boxes[0].options", bad, kOptionWords);
  EXPECT_EQ(options.string("x", Need::required), std::nullopt);
  EXPECT_EQ(bad.to_string(),
            "$.boxes[0].options: options must be an object, not array\n"
            "$.boxes[0].options.x: missing required option 'x'");
}

TEST(JsonRead, CheckMembersReportsUnknownAndRepeatedKeysInOrder) {
  // Parsed without read_json, which would refuse the repeated key first.
  rapidjson::Document d;
  d.Parse(R"({"name": "a", "outptus": [], "name": "b", "inputs": []})");
  ASSERT_TRUE(d.IsObject());
  Diagnostics diag;
  check_members(d, "$", {"name", "description", "inputs"}, diag, kFieldWords);
  EXPECT_EQ(diag.to_string(),
            "$.outptus: unknown field 'outptus'; known fields: name description inputs\n"
            "$.name: duplicate field 'name'");
}

}  // namespace
}  // namespace entente::base
