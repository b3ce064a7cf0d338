// The canonical form byte for byte, RFC 3339 times, and terms parsing with
// path-named errors.

#include "contracts/canonical.h"

#include <gtest/gtest.h>

#include <string>

#include "contracts/terms.h"
#include "engine/types.h"
#include "fixture.h"
#include "rapidjson/document.h"

namespace entente::contracts {
namespace {

using testing::hosting_terms;
using testing::stream_terms;

rapidjson::Document parse(std::string_view text) {
  rapidjson::Document d;
  d.Parse<rapidjson::kParseValidateEncodingFlag>(text.data(), text.size());
  EXPECT_FALSE(d.HasParseError()) << text;
  return d;
}

std::string canon(std::string_view text) {
  auto r = canonical_json(parse(text));
  EXPECT_TRUE(r.ok()) << r.error().message;
  return r.ok() ? *r : std::string();
}

TEST(Canonical, SortsKeysByBytesAndDropsWhiteSpace) {
  EXPECT_EQ(canon(R"({ "b": 1, "a": [3, 2, {"z": true, "Z": false, "_": null}], "aa": "x" })"),
            R"({"a":[3,2,{"Z":false,"_":null,"z":true}],"aa":"x","b":1})");
  // Byte order, not code point order by locale: "é" (0xC3 0xA9) after "z".
  EXPECT_EQ(canon(R"({"é":1,"z":2,"B":3})"), "{\"B\":3,\"z\":2,\"\xc3\xa9\":1}");
  EXPECT_EQ(canon("{}"), "{}");
  EXPECT_EQ(canon("[]"), "[]");
}

TEST(Canonical, IntegersAreDecimalWithoutLeadingZerosOrPlus) {
  EXPECT_EQ(canon("[0, -0, 7, -12, 18446744073709551615, -9223372036854775808]"),
            "[0,0,7,-12,18446744073709551615,-9223372036854775808]");
}

TEST(Canonical, EscapesOnlyWhatMustBeEscaped) {
  EXPECT_EQ(canon(R"(["q\"b\\s\/", "\b\f\n\r\t", "\u0001\u001f\u007f", "\u00e9\u20ac"])"),
            "[\"q\\\"b\\\\s/\",\"\\b\\f\\n\\r\\t\",\"\\u0001\\u001f\x7f\",\"\xc3\xa9\xe2\x82\xac\"]");
  // NUL inside a string survives as \u0000.
  rapidjson::Value v(rapidjson::StringRef("a\0b", 3));
  EXPECT_EQ(*canonical_json(v), "\"a\\u0000b\"");
}

TEST(Canonical, RefusesFloatsDuplicatesBadUtf8AndDeepNesting) {
  for (const char* text : {"1.0", "[1e3]", R"({"a":0.5})", "-0.0"}) {
    auto r = canonical_json(parse(text));
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.error().code, Errc::invalid_argument);
    EXPECT_EQ(r.error().message, "floats have no canonical form; use an integer");
  }
  auto dup = canonical_json(parse(R"({"a":1,"b":2,"a":3})"));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().message, "duplicate key 'a'");
  rapidjson::Value bad(rapidjson::StringRef("\xc3\x28", 2));
  EXPECT_EQ(canonical_json(bad).error().code, Errc::invalid_argument);
  rapidjson::Value surrogate(rapidjson::StringRef("\xed\xa0\x80", 3));
  EXPECT_FALSE(canonical_json(surrogate).ok());
  std::string deep(40, '[');
  deep += std::string(40, ']');
  EXPECT_EQ(canonical_json(parse(deep)).error().code, Errc::limit_exceeded);
}

TEST(CanonicalTime, FormatsAndParsesWholeSecondsUtc) {
  EXPECT_EQ(format_time(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(format_time(testing::kJan2027), "2027-01-01T00:00:00Z");
  EXPECT_EQ(format_time(1709164799000), "2024-02-28T23:59:59Z");
  EXPECT_EQ(format_time(1709208000000), "2024-02-29T12:00:00Z");
  EXPECT_EQ(format_time(kMaxTimeMs), "9999-12-31T23:59:59Z");
  EXPECT_EQ(*parse_time("2027-01-01T00:00:00Z"), testing::kJan2027);
  EXPECT_EQ(*parse_time("2024-02-29T12:00:00Z"), 1709208000000);
  EXPECT_EQ(*parse_time("9999-12-31T23:59:59Z"), kMaxTimeMs);
  EXPECT_EQ(parse_time("2026-12-01T00:00:00.5Z").error().message,
            "time '2026-12-01T00:00:00.5Z' has a fraction of a second; times are whole seconds");
  EXPECT_EQ(parse_time("2026-12-01T00:00:00+01:00").error().message,
            "time '2026-12-01T00:00:00+01:00' is not an RFC 3339 UTC time like 2026-12-01T00:00:00Z");
  EXPECT_FALSE(parse_time("2026-12-01 00:00:00Z").ok());
  EXPECT_FALSE(parse_time("2023-02-29T00:00:00Z").ok());
  EXPECT_FALSE(parse_time("2026-13-01T00:00:00Z").ok());
  EXPECT_FALSE(parse_time("2026-12-01T24:00:00Z").ok());
  EXPECT_FALSE(parse_time("1969-12-31T23:59:59Z").ok());
}

TEST(CanonicalTerms, StreamTermsHaveEveryFieldInByteOrder) {
  EXPECT_EQ(canonical_terms(stream_terms()),
            R"({"consumer":"beta","fields":["price","item"],"kind":"stream","predicate":"price > 10",)"
            R"("price_per_million":250,"provider":"acme","rate_cap":5000,"streams":["asks","bids"],)"
            R"("valid_from":"2027-01-01T00:00:00Z","valid_until":"2028-01-01T00:00:00Z"})");
  Terms bare = stream_terms();
  bare.stream.fields.clear();
  bare.stream.predicate.clear();
  bare.stream.rate_cap = 0;
  bare.stream.price_per_million = 0;
  EXPECT_EQ(canonical_terms(bare),
            R"({"consumer":"beta","fields":[],"kind":"stream","predicate":"","price_per_million":0,)"
            R"("provider":"acme","rate_cap":0,"streams":["asks","bids"],)"
            R"("valid_from":"2027-01-01T00:00:00Z","valid_until":"2028-01-01T00:00:00Z"})");
}

TEST(CanonicalTerms, HostingTermsHaveEveryFieldInByteOrder) {
  EXPECT_EQ(canonical_terms(hosting_terms()),
            R"({"box_kinds":["aggregate","filter","map"],"host":"beta","host_may_export":false,)"
            R"("host_may_subscribe":false,"kind":"hosting","max_load":1000,"notice_seconds":600,)"
            R"("owner":"acme","price_max":20,"price_min":10,)"
            R"("valid_from":"2027-01-01T00:00:00Z","valid_until":"2028-01-01T00:00:00Z"})");
}

TEST(CanonicalTerms, PredicateEscapes) {
  Terms t = stream_terms();
  t.stream.predicate = "name = \"x\\y\"\n";
  EXPECT_NE(canonical_terms(t).find(R"("predicate":"name = \"x\\y\"\n")"), std::string::npos);
}

TEST(CanonicalTerms, SigningMessageWrapsTermsWithIdKindAndVersion) {
  const Terms t = stream_terms();
  EXPECT_EQ(signing_message("c-00112233445566ff", 4, t),
            R"({"id":"c-00112233445566ff","kind":"stream","terms":)" + canonical_terms(t) + R"(,"version":4})");
}

Result<Terms> terms_of(std::string_view text) { return terms_from_json(parse(text)); }

TEST(TermsJson, ParsesStreamTermsAndSortsStreams) {
  auto t = terms_of(R"({"kind":"stream","provider":"acme","consumer":"beta","streams":["bids","asks"],
    "fields":["price","item"],"predicate":"price > 10","rate_cap":5000,"price_per_million":250,
    "valid_from":"2027-01-01T00:00:00Z","valid_until":1830297600000})");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(*t, stream_terms());
  // Optional fields default to "everything, no cap, free".
  auto bare = terms_of(R"({"kind":"stream","provider":"acme","consumer":"beta","streams":["bids"],
    "valid_from":"2027-01-01T00:00:00Z","valid_until":"2028-01-01T00:00:00Z"})");
  ASSERT_TRUE(bare.ok()) << bare.error().message;
  EXPECT_TRUE(bare->stream.fields.empty());
  EXPECT_EQ(bare->stream.rate_cap, 0u);
}

TEST(TermsJson, ParsesHostingTerms) {
  auto t = terms_of(R"({"kind":"hosting","host":"beta","owner":"acme","box_kinds":["map","filter","aggregate"],
    "max_load":1000,"price_min":10,"price_max":20,"notice_seconds":600,
    "valid_from":"2027-01-01T00:00:00Z","valid_until":"2028-01-01T00:00:00Z"})");
  ASSERT_TRUE(t.ok()) << t.error().message;
  EXPECT_EQ(*t, hosting_terms());
}

TEST(TermsJson, CanonicalFormParsesBackToTheSameTerms) {
  for (const Terms& t : {stream_terms(), hosting_terms()}) {
    auto back = terms_of(canonical_terms(t));
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(*back, t);
  }
}

TEST(TermsJson, ErrorsNameTheirPaths) {
  auto t = terms_of(R"({"kind":"stream","provider":"acme","consumer":"beta","streams":["bids","asks","B!"],
    "valid_from":"2027-01-01T00:00:00Z","valid_until":"2028-01-01T00:00:00Z"})");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, Errc::invalid_argument);
  EXPECT_EQ(t.error().message,
            "$.terms.streams[2]: invalid stream name 'B!': expected [a-z][a-z0-9_-]*, at most 63 characters");

  // Every problem at once.
  t = terms_of(R"({"kind":"stream","provider":"Acme","consumer":"beta","streams":["bids","bids"],
    "fields":["a","1x","a"],"rate_cap":-1,"price_per_million":1.5,"color":"red",
    "valid_from":"2027-01-01T00:00:00.250Z","valid_until":"2028-01-01T00:00:00Z"})");
  ASSERT_FALSE(t.ok());
  const std::string& m = t.error().message;
  EXPECT_NE(m.find("$.terms.color: unknown field"), std::string::npos) << m;
  EXPECT_NE(m.find("$.terms.rate_cap: must not be negative"), std::string::npos) << m;
  EXPECT_NE(m.find("$.terms.price_per_million: must be an integer"), std::string::npos) << m;
  EXPECT_NE(m.find("$.terms.valid_from: time '2027-01-01T00:00:00.250Z' has a fraction of a second"),
            std::string::npos) << m;

  // Rules are checked once the types are right.
  t = terms_of(R"({"kind":"stream","provider":"Acme","consumer":"beta","streams":["bids","bids"],
    "fields":["a","1x","a"],"valid_from":1798761600000,"valid_until":1798761600000})");
  ASSERT_FALSE(t.ok());
  const std::string& r = t.error().message;
  EXPECT_NE(r.find("$.terms.provider: invalid domain name 'Acme'"), std::string::npos) << r;
  EXPECT_NE(r.find("$.terms.streams[1]: duplicate 'bids'"), std::string::npos) << r;
  EXPECT_NE(r.find("$.terms.fields[1]: invalid field name '1x'"), std::string::npos) << r;
  EXPECT_NE(r.find("$.terms.fields[2]: duplicate 'a'"), std::string::npos) << r;
  EXPECT_NE(r.find("$.terms.valid_until: must be after valid_from"), std::string::npos) << r;
}

TEST(TermsJson, RefusesMissingKindSameDomainsAndLimits) {
  EXPECT_EQ(terms_of(R"({"provider":"acme"})").error().message, R"($.terms.kind: missing: "stream" or "hosting")");
  EXPECT_EQ(terms_of(R"({"kind":"barter"})").error().message,
            R"($.terms.kind: must be "stream" or "hosting", not 'barter')");
  EXPECT_EQ(terms_from_json(parse("[]"), "$.body.terms").error().message, "$.body.terms: must be an object");
  auto same = terms_of(R"({"kind":"stream","provider":"acme","consumer":"acme","streams":["bids"],
    "valid_from":"2027-01-01T00:00:00Z","valid_until":"2028-01-01T00:00:00Z"})");
  EXPECT_EQ(same.error().message, "$.terms.consumer: provider and consumer are the same domain 'acme'");
  auto missing = terms_of(R"({"kind":"stream","provider":"acme","valid_from":"2027-01-01T00:00:00Z"})");
  EXPECT_NE(missing.error().message.find("$.terms.consumer: missing"), std::string::npos);
  EXPECT_NE(missing.error().message.find("$.terms.streams: missing"), std::string::npos);
  EXPECT_NE(missing.error().message.find("$.terms.valid_until: missing"), std::string::npos);
  auto empty = terms_of(R"({"kind":"stream","provider":"acme","consumer":"beta","streams":[],
    "valid_from":"2027-01-01T00:00:00Z","valid_until":"2028-01-01T00:00:00Z"})");
  EXPECT_EQ(empty.error().message, "$.terms.streams: must name 1..64 streams");
  auto long_span = terms_of(R"({"kind":"stream","provider":"acme","consumer":"beta","streams":["b"],
    "valid_from":"2027-01-01T00:00:00Z","valid_until":"2040-01-01T00:00:00Z"})");
  EXPECT_EQ(long_span.error().message, "$.terms.valid_until: is more than 10 years after valid_from");
  std::string big_predicate(kMaxPredicateBytes + 1, 'x');
  auto big = terms_of(R"({"kind":"stream","provider":"acme","consumer":"beta","streams":["b"],"predicate":")" +
                      big_predicate + R"(","valid_from":"2027-01-01T00:00:00Z","valid_until":"2028-01-01T00:00:00Z"})");
  EXPECT_EQ(big.error().message, "$.terms.predicate: is longer than 4096 bytes");
  std::string many = "[";
  for (int i = 0; i < 65; ++i) many += (i ? ",\"s" : "\"s") + std::to_string(i) + "\"";
  many += "]";
  auto too_many = terms_of(R"({"kind":"stream","provider":"acme","consumer":"beta","streams":)" + many +
                           R"(,"valid_from":"2027-01-01T00:00:00Z","valid_until":"2028-01-01T00:00:00Z"})");
  EXPECT_EQ(too_many.error().message, "$.terms.streams: has 65 items; at most 64");
}

TEST(TermsJson, HostingRulesIncludingPrivacy) {
  auto t = terms_of(R"({"kind":"hosting","host":"beta","owner":"acme","box_kinds":["filter","teleport"],
    "max_load":0,"price_min":30,"price_max":20,"host_may_subscribe":true,"host_may_export":true,
    "provider":"acme","valid_from":"2027-01-01T00:00:00Z","valid_until":"2028-01-01T00:00:00Z"})");
  ASSERT_FALSE(t.ok());
  const std::string& m = t.error().message;
  // Stream fields on a hosting contract are unknown fields.
  EXPECT_NE(m.find("$.terms.provider: unknown field"), std::string::npos) << m;
  t = terms_of(R"({"kind":"hosting","host":"beta","owner":"acme","box_kinds":["filter","teleport"],
    "max_load":0,"price_min":30,"price_max":20,"host_may_subscribe":true,"host_may_export":true,
    "valid_from":"2027-01-01T00:00:00Z","valid_until":"2028-01-01T00:00:00Z"})");
  ASSERT_FALSE(t.ok());
  const std::string& r = t.error().message;
  EXPECT_NE(r.find("$.terms.box_kinds[1]: unknown box kind 'teleport' (known: aggregate, bsort, filter"),
            std::string::npos) << r;
  EXPECT_NE(r.find("$.terms.max_load: must be 1..1000000 CPU ms per second"), std::string::npos) << r;
  EXPECT_NE(r.find("$.terms.price_min: is above price_max (30 > 20)"), std::string::npos) << r;
  EXPECT_NE(r.find("$.terms.host_may_subscribe: must be false"), std::string::npos) << r;
  EXPECT_NE(r.find("$.terms.host_may_export: must be false"), std::string::npos) << r;
}

TEST(TermsJson, ValidateTermsRequiresSortedLists) {
  Terms t = stream_terms();
  EXPECT_TRUE(validate_terms(t).ok());
  t.stream.streams = {"bids", "asks"};
  EXPECT_EQ(validate_terms(t).error().message, "$.terms.streams: must be sorted");
  Terms h = hosting_terms();
  h.stream.provider = "acme";
  EXPECT_EQ(validate_terms(h).error().message, "$.terms: a hosting contract carries stream terms");
}

TEST(TermsJson, Parties) {
  EXPECT_EQ(parties(stream_terms()), std::make_pair(std::string("acme"), std::string("beta")));
  EXPECT_EQ(parties(hosting_terms()), std::make_pair(std::string("beta"), std::string("acme")));
}

// Issue 11, point 12: what the provider's catalog says of stream terms,
// every problem with its path.
TEST(CatalogCheck, NamesEveryMissingStreamFieldAndBadPredicate) {
  const engine::SchemaPtr bids = engine::make_schema(
      {{"item", engine::Type::String}, {"price", engine::Type::Int64}, {"bidder", engine::Type::Int64}});
  auto catalog = [&](const std::string& name) -> engine::SchemaPtr { return name == "bids" ? bids : nullptr; };
  auto problems = [&](const Terms& t, const std::vector<std::string>& given = {}) {
    Diagnostics diag;
    check_stream_catalog(t, catalog, diag, given);
    std::vector<std::string> out;
    for (const auto& d : diag.items()) out.push_back(d.path + ": " + d.message);
    return out;
  };
  Terms t = stream_terms("acme", "beta", {"bids"});  // fields price, item; price > 10
  EXPECT_TRUE(problems(t).empty());

  t.stream.fields = {"price", "item", "prise"};
  t.stream.predicate = "prise > 10 &&";
  t.stream.streams = {"asks", "bids"};
  auto p = problems(t, {"bids", "asks"});
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0], "$.terms.streams[1]: acme has no stream 'asks'");  // the position given
  EXPECT_EQ(p[1].rfind("$.terms.fields[2]: stream acme/bids has no field 'prise' (it has ", 0), 0u) << p[1];
  EXPECT_EQ(p[2], "$.terms.predicate: does not compile against acme/bids: unknown field 'prise' at 1:1");

  t = stream_terms("acme", "beta", {"bids"});
  t.stream.predicate = "price > 10 &&";
  p = problems(t);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].rfind("$.terms.predicate: does not compile against acme/bids: ", 0), 0u) << p[0];
  t.stream.predicate = "price * 2";
  p = problems(t);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0], "$.terms.predicate: is of type int64 on acme/bids, not bool: a predicate is a condition");
}

}  // namespace
}  // namespace entente::contracts
