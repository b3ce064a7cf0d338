// Cutting a query into fragments (engine/fragments.h): every placement
// error with its path and message, the fragments' networks and internal
// arcs for chains, fan-out, joins and splits, and equivalence: the
// fragments chained give the whole network's output row for row. Also
// Executor::output_watermark, which carrying watermarks across needs.
#include "engine/fragments.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/detail/network_def.h"
#include "engine/network.h"
#include "rapidjson/document.h"
#include "tests/engine/fragment_chain.h"

namespace entente::engine {
namespace {

using fragment_test::FragmentChain;
using fragment_test::Feed;
using fragment_test::rows_of;

// ---------------------------------------------------------------------------
// Networks

// bids -> a (filter) -> b (map) -> c (aggregate) -> d (map) -> out
const char* kChain = R"({
  "name": "chain",
  "inputs": [{"name": "bids", "schema": [{"name": "auction", "type": "int64"}, {"name": "price", "type": "int64"},
                                        {"name": "date_time", "type": "timestamp"}],
              "event_time": "date_time", "watermark_lag": "1s"}],
  "boxes": [
    {"id": "a", "type": "filter", "options": {"predicates": ["price > 10"]}, "description": "not cheap"},
    {"id": "b", "type": "map", "options": {"fields": [{"name": "auction", "expr": "auction"},
                                                      {"name": "cents", "expr": "price * 100"}]}},
    {"id": "c", "type": "aggregate", "options": {"group_by": ["auction"], "window": {"type": "tumbling", "size": "2s"},
                                                 "aggregates": [{"fn": "count", "as": "n"},
                                                                {"fn": "sum", "field": "cents", "as": "total"}]}},
    {"id": "d", "type": "map", "options": {"fields": [{"name": "auction", "expr": "auction"},
                                                      {"name": "n", "expr": "n"}, {"name": "total", "expr": "total"}]}}
  ],
  "arcs": [{"from": "bids", "to": "a"}, {"from": "a.0", "to": "b"}, {"from": "b", "to": "c"}, {"from": "c", "to": "d"}],
  "outputs": [{"name": "out", "from": "d"}]
})";

// The "every box" example of docs/query-networks.md: bsort, filter with
// three ports, union, split, two aggregates, merge, map, join.
const char* kEveryBox = R"({
  "name": "every-box",
  "inputs": [
    {"name": "bids",
     "schema": [{"name": "auction", "type": "int64"}, {"name": "price", "type": "int64"},
                {"name": "date_time", "type": "timestamp"}],
     "event_time": "date_time", "watermark_lag": 300},
    {"name": "auctions",
     "schema": [{"name": "id", "type": "int64"}, {"name": "seller", "type": "int64"},
                {"name": "date_time", "type": "timestamp"}],
     "event_time": "date_time", "watermark_lag": "1s"}
  ],
  "boxes": [
    {"id": "sorted", "type": "bsort", "options": {"slack": 8}},
    {"id": "by_price", "type": "filter", "options": {"predicates": ["price > 700", "price > 300"]}},
    {"id": "cheap", "type": "union"},
    {"id": "parts", "type": "split", "options": {"mode": "hash", "keys": ["auction"], "outputs": 2}},
    {"id": "count0", "type": "aggregate",
     "options": {"group_by": ["auction"], "window": {"type": "tumbling", "size": "2s"},
                 "aggregates": [{"fn": "count"}, {"fn": "sum", "field": "price"}]}},
    {"id": "count1", "type": "aggregate",
     "options": {"group_by": ["auction"], "window": {"type": "tumbling", "size": "2s"},
                 "aggregates": [{"fn": "count"}, {"fn": "sum", "field": "price"}]}},
    {"id": "counts", "type": "merge"},
    {"id": "dear", "type": "map",
     "options": {"fields": [{"name": "auction", "expr": "auction"}, {"name": "cents", "expr": "price * 100"}]}},
    {"id": "with_seller", "type": "join",
     "options": {"left_keys": ["auction"], "right_keys": ["id"],
                 "window": {"type": "tumbling", "size": "5s"}}}
  ],
  "arcs": [
    {"from": "bids", "to": "sorted"},
    {"from": "sorted", "to": "by_price"},
    {"from": "by_price.0", "to": "dear"},
    {"from": "by_price.1", "to": "cheap.0"},
    {"from": "by_price.2", "to": "cheap.1"},
    {"from": "cheap", "to": "parts"},
    {"from": "parts.0", "to": "count0"},
    {"from": "parts.1", "to": "count1"},
    {"from": "count0", "to": "counts.0"},
    {"from": "count1", "to": "counts.1"},
    {"from": "dear", "to": "with_seller.0"},
    {"from": "auctions", "to": "with_seller.1"}
  ],
  "outputs": [
    {"name": "counts", "from": "counts"},
    {"name": "joined", "from": "with_seller"},
    {"name": "dear", "from": "dear"}
  ]
})";

// One port feeding two boxes of one fragment and a box of another, and a
// network input feeding two fragments.
const char* kFanOut = R"({
  "name": "fan",
  "inputs": [{"name": "bids", "schema": [{"name": "auction", "type": "int64"}, {"name": "price", "type": "int64"}]}],
  "boxes": [
    {"id": "src", "type": "map", "options": {"fields": [{"name": "auction", "expr": "auction"},
                                                        {"name": "price", "expr": "price"}]}},
    {"id": "low", "type": "filter", "options": {"predicates": ["price < 50"], "drop_unmatched": true}},
    {"id": "high", "type": "filter", "options": {"predicates": ["price >= 90"], "drop_unmatched": true}},
    {"id": "both", "type": "union"},
    {"id": "copy", "type": "map", "options": {"fields": [{"name": "auction", "expr": "auction"}]}},
    {"id": "raw", "type": "map", "options": {"fields": [{"name": "price", "expr": "price"}]}}
  ],
  "arcs": [{"from": "bids", "to": "src"}, {"from": "src", "to": "low"}, {"from": "src", "to": "high"},
           {"from": "low", "to": "both.0"}, {"from": "high", "to": "both.1"},
           {"from": "src", "to": "copy"}, {"from": "bids", "to": "raw"}],
  "outputs": [{"name": "both", "from": "both"}, {"name": "high", "from": "high"}, {"name": "copy", "from": "copy"},
              {"name": "raw", "from": "raw"}]
})";

QueryNetwork parse_ok(const std::string& json) {
  Diagnostics diag;
  auto net = QueryNetwork::parse(json, diag);
  EXPECT_TRUE(net.ok()) << diag.to_string();
  return std::move(net).value();
}

QueryCut cut_ok(const QueryNetwork& net, const std::vector<FragmentSpec>& specs) {
  Diagnostics diag;
  auto cut = cut_query(net, specs, diag);
  EXPECT_TRUE(cut.ok()) << diag.to_string();
  EXPECT_TRUE(diag.ok());
  return cut.ok() ? std::move(cut).value() : QueryCut{};
}

// The placement is refused; returns the diagnostics as "path: message" lines.
std::vector<std::string> cut_errors(const QueryNetwork& net, const std::vector<FragmentSpec>& specs) {
  Diagnostics diag;
  auto cut = cut_query(net, specs, diag);
  EXPECT_FALSE(cut.ok());
  if (!cut.ok()) {
    EXPECT_EQ(cut.error().code, Errc::invalid_argument);
  }
  std::vector<std::string> lines;
  for (const auto& d : diag.items()) lines.push_back(d.path + ": " + d.message);
  return lines;
}

const InternalArc* arc_from(const QueryCut& cut, const std::string& from) {
  for (const auto& a : cut.arcs)
    if (a.from == from) return &a;
  return nullptr;
}

const FragmentPlan& fragment(const QueryCut& cut, const std::string& name) {
  for (const auto& f : cut.fragments)
    if (f.name == name) return f;
  throw std::out_of_range("no fragment " + name);
}

const detail::BoxDef& box_of(const QueryNetwork& net, const std::string& id) {
  for (const auto& b : net.def()->boxes)
    if (b.id == id) return b;
  throw std::out_of_range("no box " + id);
}

rapidjson::Document json_of(const std::string& text) {
  rapidjson::Document d;
  d.Parse(text.data(), text.size());
  EXPECT_FALSE(d.HasParseError());
  return d;
}

// Deterministic bids (auction, price, date_time) with a little disorder.
std::vector<Batch> make_bids(size_t batches, size_t rows, uint64_t seed) {
  auto schema = make_schema({{"auction", Type::Int64}, {"price", Type::Int64}, {"date_time", Type::Timestamp}});
  std::vector<Batch> out;
  uint64_t x = seed;
  auto next = [&x] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  };
  Seq seq = 0;
  for (size_t k = 0; k < batches; ++k) {
    BatchBuilder bb(schema);
    for (size_t r = 0; r < rows; ++r) {
      const int64_t i = int64_t(k * rows + r);
      bb.column(0).ints.push_back(int64_t(next() % 40));
      bb.column(1).ints.push_back(int64_t(next() % 1000));
      // 10 ms apart, up to 200 ms late.
      bb.column(2).ints.push_back(1'000'000 + i * 10 - int64_t(next() % 20) * 10);
      bb.event_time().push_back(0);
      bb.seq().push_back(seq++);
    }
    out.push_back(bb.finish());
  }
  return out;
}

std::vector<Batch> make_auctions(size_t batches, size_t rows) {
  auto schema = make_schema({{"id", Type::Int64}, {"seller", Type::Int64}, {"date_time", Type::Timestamp}});
  std::vector<Batch> out;
  Seq seq = 0;
  for (size_t k = 0; k < batches; ++k) {
    BatchBuilder bb(schema);
    for (size_t r = 0; r < rows; ++r) {
      const int64_t i = int64_t(k * rows + r);
      bb.column(0).ints.push_back(i % 40);
      bb.column(1).ints.push_back(100 + i % 7);
      bb.column(2).ints.push_back(1'000'000 + i * 100);
      bb.event_time().push_back(0);
      bb.seq().push_back(seq++);
    }
    out.push_back(bb.finish());
  }
  return out;
}

Feed interleave(const std::vector<Batch>& bids, const std::vector<Batch>& auctions) {
  Feed f;
  for (size_t i = 0; i < std::max(bids.size(), auctions.size()); ++i) {
    if (i < auctions.size()) f.pushes.emplace_back("auctions", auctions[i]);
    if (i < bids.size()) f.pushes.emplace_back("bids", bids[i]);
  }
  return f;
}

void expect_equivalent(const QueryNetwork& net, const std::vector<FragmentSpec>& specs, const Feed& feed) {
  const QueryCut cut = cut_ok(net, specs);
  ASSERT_EQ(cut.fragments.size(), specs.size());
  fragment_test::expect_same_output(net, cut, feed);
}

// ---------------------------------------------------------------------------
// Placement errors

TEST(CutQuery, NamesNodesAndBoxesEveryErrorWithItsPath) {
  const QueryNetwork net = parse_ok(kChain);
  const auto lines = cut_errors(net, {{"F1", "N1", {"a", "x"}},
                                      {"f2", "n2", {"b", "a"}},
                                      {"f2", "", {}},
                                      {"f3", "n3", {"b"}}});
  const std::vector<std::string> expected = {
      "$.placement.fragments[0].name: bad fragment name 'F1': expected [a-z][a-z0-9-]* without '--', at most 32 "
      "characters",
      "$.placement.fragments[0].node: bad node name 'N1': expected [a-z][a-z0-9-]*, at most 63 characters",
      "$.placement.fragments[2].name: duplicate fragment name 'f2': already used by $.placement.fragments[1]",
      "$.placement.fragments[0].boxes[1]: no box 'x' in the network",
      "$.placement.fragments[1].boxes[1]: box 'a' is already in fragment 'F1' ($.placement.fragments[0].boxes[0])",
      "$.placement.fragments[2].boxes: fragment 'f2' has no boxes",
      "$.placement.fragments[3].boxes[0]: box 'b' is already in fragment 'f2' ($.placement.fragments[1].boxes[0])",
      "$.placement.fragments: box 'c' is in no fragment",
      "$.placement.fragments: box 'd' is in no fragment",
  };
  EXPECT_EQ(lines, expected);
}

TEST(CutQuery, FragmentNameRules) {
  const QueryNetwork net = parse_ok(kChain);
  const std::string long_name(33, 'f');
  const auto lines = cut_errors(net, {{"a--b", "", {"a"}}, {long_name, "", {"b"}}, {"-x", "", {"c"}},
                                      {"ok-1", std::string(64, 'n'), {"d"}}});
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "$.placement.fragments[0].name: bad fragment name 'a--b': expected [a-z][a-z0-9-]* "
                      "without '--', at most 32 characters");
  EXPECT_EQ(lines[1].rfind("$.placement.fragments[1].name: bad fragment name 'fffff", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("$.placement.fragments[2].name: bad fragment name '-x'", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("$.placement.fragments[3].node: bad node name 'nnnn", 0), 0u) << lines[3];
  // 32 characters and a 63-character node are fine.
  cut_ok(net, {{std::string(32, 'f'), std::string(63, 'n'), {"a", "b", "c", "d"}}});
}

TEST(CutQuery, NoFragmentsOrTooMany) {
  const QueryNetwork net = parse_ok(kChain);
  EXPECT_EQ(cut_errors(net, {}), (std::vector<std::string>{
                                     "$.placement.fragments: a placement needs at least one fragment",
                                     "$.placement.fragments: box 'a' is in no fragment",
                                     "$.placement.fragments: box 'b' is in no fragment",
                                     "$.placement.fragments: box 'c' is in no fragment",
                                     "$.placement.fragments: box 'd' is in no fragment"}));
  std::vector<FragmentSpec> many;
  for (int i = 0; i < 65; ++i) many.push_back({"f" + std::to_string(i), "", {"a"}});
  EXPECT_EQ(cut_errors(net, many),
            (std::vector<std::string>{"$.placement.fragments: too many fragments: 65; the limit is 64"}));
}

TEST(CutQuery, DisconnectedFragmentsAndTheirCycle) {
  const QueryNetwork net = parse_ok(kChain);
  // {a, c} and {b, d}: neither is connected, and a -> b -> c -> d goes
  // back and forth between them.
  EXPECT_EQ(cut_errors(net, {{"f1", "n1", {"a", "c"}}, {"f2", "n2", {"b", "d"}}}),
            (std::vector<std::string>{
                "$.placement.fragments[0].boxes: fragment 'f1' is not connected: its boxes form 2 groups with no "
                "arc between them: [a], [c]",
                "$.placement.fragments[1].boxes: fragment 'f2' is not connected: its boxes form 2 groups with no "
                "arc between them: [b], [d]",
                "$.placement.fragments[0]: cycle between fragments: f1 -> f2 -> f1; each fragment must only read "
                "from fragments before it"}));
}

TEST(CutQuery, CycleOfThreeConnectedFragments) {
  // a feeds b and the union u; b -> c -> u. {a, u} is connected, but the
  // rows go x -> y -> z -> x.
  const QueryNetwork net = parse_ok(R"({
    "name": "loop",
    "inputs": [{"name": "in", "schema": [{"name": "v", "type": "int64"}]}],
    "boxes": [
      {"id": "a", "type": "map", "options": {"fields": [{"name": "v", "expr": "v"}]}},
      {"id": "b", "type": "map", "options": {"fields": [{"name": "v", "expr": "v + 1"}]}},
      {"id": "c", "type": "map", "options": {"fields": [{"name": "v", "expr": "v + 2"}]}},
      {"id": "u", "type": "union"}],
    "arcs": [{"from": "in", "to": "a"}, {"from": "a", "to": "b"}, {"from": "b", "to": "c"},
             {"from": "a", "to": "u.0"}, {"from": "c", "to": "u.1"}],
    "outputs": [{"name": "out", "from": "u"}]})");
  EXPECT_EQ(cut_errors(net, {{"w", "", {"b"}}, {"x", "", {"a", "u"}}, {"z", "", {"c"}}}),
            (std::vector<std::string>{"$.placement.fragments[0]: cycle between fragments: w -> z -> x -> w; each "
                                      "fragment must only read from fragments before it"}));
  // The same boxes as a pipeline are fine: {a}, {b, c}, {u}.
  const QueryCut cut = cut_ok(net, {{"w", "", {"u"}}, {"x", "", {"a"}}, {"z", "", {"c", "b"}}});
  EXPECT_EQ(cut.pipeline_order, (std::vector<size_t>{1, 2, 0}));
}

TEST(CutQuery, GeneratedNetworkNameTooLong) {
  std::string json = kChain;
  const std::string long_query(60, 'q');
  json.replace(json.find("\"chain\""), 7, "\"" + long_query + "\"");
  const QueryNetwork net = parse_ok(json);
  // 60 + 2 + 3 = 65 characters; 60 + 2 + 1 = 63 would do.
  EXPECT_EQ(cut_errors(net, {{"f12", "", {"a", "b"}}, {"f", "", {"c", "d"}}}),
            (std::vector<std::string>{"$.placement.fragments[0].name: the fragment's network name '" + long_query +
                                      "--f12' would be 65 characters; the limit is 64: shorten the query's or the "
                                      "fragment's name"}));
  const QueryCut cut = cut_ok(net, {{"f1", "", {"a", "b"}}, {"f", "", {"c", "d"}}});
  ASSERT_EQ(cut.arcs.size(), 1u);
  // The internal stream's plain name would be 60 + 2 + 3 > 63: hashed.
  EXPECT_EQ(cut.arcs[0].stream.size(), 40u + 2 + 16);
  EXPECT_EQ(cut.arcs[0].stream.substr(0, 42), std::string(40, 'q') + "--");
}

TEST(CutQuery, FragmentWithMoreStreamsThanANetworkMayHave) {
  // Four filters of 65 ports each (after one map) feed 260 maps, recombined by two unions.
  // With the filters in one fragment and the rest in another, the first
  // would write and the second read 260 internal streams: more than a
  // network's 256 outputs and inputs.
  std::string preds;
  for (int k = 0; k < 64; ++k) preds += (k ? ", " : "") + std::string("\"v > ") + std::to_string(k) + "\"";
  std::string boxes = R"({"id": "src", "type": "map", "options": {"fields": [{"name": "v", "expr": "v"}]}},
                          {"id": "u0", "type": "union"}, {"id": "u1", "type": "union"})";
  std::string arcs = R"({"from": "in", "to": "src"}, {"from": "u0", "to": "u1.0"})";
  for (int f = 0; f < 4; ++f) {
    const std::string id = "f" + std::to_string(f);
    boxes += R"(, {"id": ")" + id + R"(", "type": "filter", "options": {"predicates": [)" + preds + "]}}";
    arcs += R"(, {"from": "src", "to": ")" + id + "\"}";
  }
  std::vector<std::string> rest = {"u0", "u1"};
  for (int m = 0; m < 260; ++m) {
    const std::string id = "m" + std::to_string(m);
    boxes += R"(, {"id": ")" + id + R"(", "type": "map", "options": {"fields": [{"name": "v", "expr": "v"}]}})";
    arcs += R"(, {"from": "f)" + std::to_string(m / 65) + "." + std::to_string(m % 65) + R"(", "to": ")" + id + "\"}";
    arcs += R"(, {"from": ")" + id + R"(", "to": ")" + (m < 256 ? "u0." + std::to_string(m) : "u1." + std::to_string(m - 255)) +
            "\"}";
    rest.push_back(id);
  }
  const QueryNetwork net = parse_ok(R"({"name": "wide", "inputs": [{"name": "in", "schema": [{"name": "v", "type": "int64"}]}],
                                       "boxes": [)" + boxes + "], \"arcs\": [" + arcs +
                                    R"(], "outputs": [{"name": "out", "from": "u1"}]})");
  EXPECT_EQ(cut_errors(net, {{"split", "", {"src", "f0", "f1", "f2", "f3"}}, {"rest", "", rest}}),
            (std::vector<std::string>{
                "$.placement.fragments[0]: fragment 'split' would write 260 streams (query outputs and internal "
                "streams); a network has at most 256 outputs: put more of its downstream boxes in it",
                "$.placement.fragments[1]: fragment 'rest' would read 260 streams (query inputs and internal "
                "streams); a network has at most 256 inputs: put more of its upstream boxes in it"}));
  // The filters with the maps: fine.
  for (const char* f : {"src", "f0", "f1", "f2", "f3"}) rest.push_back(f);
  EXPECT_EQ(cut_ok(net, {{"all", "", rest}}).fragments.size(), 1u);
}

TEST(CutQuery, InternalStreamNamedLikeANameOfTheQuery) {
  // The input is named as b's internal stream would be.
  const QueryNetwork net = parse_ok(R"({
    "name": "q",
    "inputs": [{"name": "q--b_0", "schema": [{"name": "v", "type": "int64"}]}],
    "boxes": [{"id": "b", "type": "map", "options": {"fields": [{"name": "v", "expr": "v"}]}},
              {"id": "c", "type": "map", "options": {"fields": [{"name": "v", "expr": "v"}]}}],
    "arcs": [{"from": "q--b_0", "to": "b"}, {"from": "b", "to": "c"}],
    "outputs": [{"name": "out", "from": "c"}]})");
  EXPECT_EQ(cut_errors(net, {{"one", "", {"b"}}, {"two", "", {"c"}}}),
            (std::vector<std::string>{"$.placement.fragments[0]: the internal stream for b.0 would be named 'q--b_0', "
                                      "as input 'q--b_0' of the query is; rename that input"}));
}

TEST(ReadFragmentSpecs, ShapeErrors) {
  rapidjson::Document d = json_of(R"([
    {"name": "f1", "node": "n1", "boxes": ["a", "b"]},
    {"name": 3, "boxes": "a", "where": "n2"},
    "f3",
    {"node": "n4", "boxes": ["c", 7]}])");
  Diagnostics diag;
  auto specs = read_fragment_specs(d, diag);
  ASSERT_FALSE(specs.ok());
  std::vector<std::string> lines;
  for (const auto& i : diag.items()) lines.push_back(i.path + ": " + i.message);
  EXPECT_EQ(lines, (std::vector<std::string>{
                       "$.placement.fragments[1].name: expected a string, got number",
                       "$.placement.fragments[1].boxes: expected an array of strings, got string",
                       "$.placement.fragments[1].where: unknown field 'where'; known fields: boxes name node",
                       "$.placement.fragments[2]: expected a fragment {\"name\", \"node\", \"boxes\"}, got string",
                       "$.placement.fragments[3].name: missing required field 'name'",
                       "$.placement.fragments[3].boxes[1]: expected a string, got number"}));

  Diagnostics d2;
  EXPECT_FALSE(read_fragment_specs(json_of(R"({"f1": ["a"]})"), d2).ok());
  ASSERT_EQ(d2.size(), 1u);
  EXPECT_EQ(d2.items()[0].path + ": " + d2.items()[0].message,
            "$.placement.fragments: expected an array of fragments, got object");
}

TEST(ReadFragmentSpecs, FromTheQueryDocument) {
  Diagnostics diag;
  auto specs = read_fragment_specs(R"({"name": "q", "placement": {"fragments": [
                                         {"name": "f1", "node": "n1", "boxes": ["a", "b"]},
                                         {"name": "f2", "boxes": ["c"]}]}})",
                                   diag);
  ASSERT_TRUE(specs.ok()) << diag.to_string();
  ASSERT_EQ(specs->size(), 2u);
  EXPECT_EQ((*specs)[0].name, "f1");
  EXPECT_EQ((*specs)[0].node, "n1");
  EXPECT_EQ((*specs)[0].boxes, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ((*specs)[1].node, "");

  Diagnostics missing;
  EXPECT_FALSE(read_fragment_specs(R"({"name": "q", "placement": {"node": "n1"}})", missing).ok());
  EXPECT_EQ(missing.to_string(), "$.placement.fragments: missing required field 'fragments'");
  Diagnostics not_object;
  EXPECT_FALSE(read_fragment_specs(R"({"name": "q", "placement": ["f1"]})", not_object).ok());
  EXPECT_EQ(not_object.to_string(), "$.placement: expected an object, got array");
  Diagnostics bad;
  EXPECT_FALSE(read_fragment_specs(std::string_view(R"({"name": )"), bad).ok());
  EXPECT_FALSE(bad.ok());
}

// ---------------------------------------------------------------------------
// Names

TEST(InternalStreamName, PlainWhenValidElseHashed) {
  EXPECT_EQ(internal_stream_name("nexmark-q5", "counts", 0), "nexmark-q5--counts_0");
  EXPECT_EQ(internal_stream_name("q", "by_price", 2), "q--by_price_2");
  EXPECT_EQ(internal_stream_name("q", "new-users", 0), "q--new-users_0");
  // Upper case, "--" in the box id, or too long: a hash, stable and valid.
  for (const auto& [query, box] : std::vector<std::pair<std::string, std::string>>{
           {"q", "Counts"}, {"q", "a--b"}, {std::string(64, 'q'), "x"}, {"q", std::string(64, 'b')}}) {
    const std::string name = internal_stream_name(query, box, 1);
    EXPECT_EQ(name, internal_stream_name(query, box, 1));
    EXPECT_NE(name, internal_stream_name(query, box, 2));
    EXPECT_LE(name.size(), 63u) << name;
    EXPECT_EQ(name.substr(0, std::min<size_t>(query.size(), 40)), query.substr(0, 40));
    EXPECT_EQ(name.size(), std::min<size_t>(query.size(), 40) + 2 + 16) << name;
  }
  // "Counts" and "counts" do not meet.
  EXPECT_NE(internal_stream_name("q", "Counts", 0), internal_stream_name("q", "counts", 0));
  // The fixed hash: the name never changes across builds and machines.
  EXPECT_EQ(internal_stream_name("q", "Counts", 0), internal_stream_name("q", "Counts", 0));
  EXPECT_EQ(fragment_network_name("nexmark-q5", "f1"), "nexmark-q5--f1");
}

// ---------------------------------------------------------------------------
// Cuts

TEST(CutQuery, ChainInThree) {
  const QueryNetwork net = parse_ok(kChain);
  const QueryCut cut = cut_ok(net, {{"f1", "n1", {"a"}}, {"f2", "n2", {"c", "b"}}, {"f3", "n3", {"d"}}});
  ASSERT_EQ(cut.fragments.size(), 3u);
  EXPECT_EQ(cut.pipeline_order, (std::vector<size_t>{0, 1, 2}));

  ASSERT_EQ(cut.arcs.size(), 2u);
  EXPECT_EQ(cut.arcs[0].stream, "chain--a_0");
  EXPECT_EQ(cut.arcs[0].from_fragment, "f1");
  EXPECT_EQ(cut.arcs[0].from, "a.0");
  EXPECT_EQ(cut.arcs[0].to_fragments, (std::vector<std::string>{"f2"}));
  EXPECT_EQ(*cut.arcs[0].schema, *box_of(net, "a").output_schemas[0]);
  EXPECT_EQ(cut.arcs[1].stream, "chain--c_0");
  EXPECT_EQ(cut.arcs[1].from, "c.0");
  EXPECT_EQ(cut.arcs[1].to_fragments, (std::vector<std::string>{"f3"}));
  EXPECT_EQ(*cut.arcs[1].schema, *box_of(net, "c").output_schemas[0]);

  const FragmentPlan& f1 = fragment(cut, "f1");
  EXPECT_EQ(f1.node, "n1");
  EXPECT_EQ(f1.network.name(), "chain--f1");
  EXPECT_EQ(f1.inputs, (std::vector<std::string>{"bids"}));
  EXPECT_TRUE(f1.outputs.empty());
  EXPECT_TRUE(f1.reads.empty());
  EXPECT_EQ(f1.writes, (std::vector<std::string>{"chain--a_0"}));
  // The query's input, its box and options unchanged.
  const auto f1_doc = json_of(f1.network_json);
  const auto whole = json_of(kChain);
  EXPECT_TRUE(f1_doc["inputs"][0] == whole["inputs"][0]);
  EXPECT_TRUE(f1_doc["boxes"][0] == whole["boxes"][0]);
  EXPECT_EQ(f1.network.box_ids(), (std::vector<std::string>{"a"}));
  ASSERT_EQ(f1.network.outputs().size(), 1u);
  EXPECT_EQ(f1.network.outputs()[0].name, "chain--a_0");

  const FragmentPlan& f2 = fragment(cut, "f2");
  EXPECT_EQ(f2.reads, (std::vector<std::string>{"chain--a_0"}));
  EXPECT_EQ(f2.writes, (std::vector<std::string>{"chain--c_0"}));
  EXPECT_TRUE(f2.inputs.empty());
  // Boxes in document order, whatever the placement's order.
  EXPECT_EQ(f2.network.box_ids(), (std::vector<std::string>{"b", "c"}));
  ASSERT_EQ(f2.network.inputs().size(), 1u);
  const NetworkInput& in = f2.network.inputs()[0];
  EXPECT_EQ(in.name, "chain--a_0");
  EXPECT_EQ(*in.schema, *cut.arcs[0].schema);
  EXPECT_FALSE(in.auto_watermark);
  EXPECT_TRUE(in.time_field.empty());

  const FragmentPlan& f3 = fragment(cut, "f3");
  EXPECT_EQ(f3.outputs, (std::vector<std::string>{"out"}));
  const auto f3_doc = json_of(f3.network_json);
  EXPECT_TRUE(f3_doc["outputs"][0] == whole["outputs"][0]);
  EXPECT_TRUE(f3_doc["boxes"][0] == whole["boxes"][3]);
  EXPECT_EQ(*f3.network.outputs()[0].schema, *net.outputs()[0].schema);

  // Every fragment network parses again from its text (what a node that
  // receives it does), and the same cut gives the same bytes.
  for (const auto& f : cut.fragments) {
    Diagnostics diag;
    EXPECT_TRUE(QueryNetwork::parse(f.network_json, diag).ok()) << diag.to_string();
  }
  const QueryCut again = cut_ok(net, {{"f1", "n1", {"a"}}, {"f2", "n2", {"c", "b"}}, {"f3", "n3", {"d"}}});
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(again.fragments[i].network_json, cut.fragments[i].network_json);
}

TEST(CutQuery, FanOutToTwoFragmentsAndTwoBoxesOfOne) {
  const QueryNetwork net = parse_ok(kFanOut);
  const std::vector<FragmentSpec> specs = {
      {"p", "", {"src"}}, {"q", "", {"low", "high", "both"}}, {"r", "", {"copy"}}, {"s", "", {"raw"}}};
  const QueryCut cut = cut_ok(net, specs);
  // One internal stream for src's port, read by two fragments.
  ASSERT_EQ(cut.arcs.size(), 1u);
  EXPECT_EQ(cut.arcs[0].stream, "fan--src_0");
  EXPECT_EQ(cut.arcs[0].to_fragments, (std::vector<std::string>{"q", "r"}));
  EXPECT_EQ(fragment(cut, "p").writes, (std::vector<std::string>{"fan--src_0"}));
  // In q, one input feeding both filters.
  const FragmentPlan& q = fragment(cut, "q");
  ASSERT_EQ(q.network.inputs().size(), 1u);
  const auto q_doc = json_of(q.network_json);
  ASSERT_EQ(q_doc["arcs"].Size(), 4u);
  EXPECT_STREQ(q_doc["arcs"][0]["from"].GetString(), "fan--src_0");
  EXPECT_STREQ(q_doc["arcs"][0]["to"].GetString(), "low");
  EXPECT_STREQ(q_doc["arcs"][1]["from"].GetString(), "fan--src_0");
  EXPECT_STREQ(q_doc["arcs"][1]["to"].GetString(), "high");
  EXPECT_STREQ(q_doc["arcs"][2]["from"].GetString(), "low");
  EXPECT_STREQ(q_doc["arcs"][3]["from"].GetString(), "high");
  EXPECT_EQ(q.outputs, (std::vector<std::string>{"both", "high"}));
  // The network input feeds p and s: each reads it itself.
  EXPECT_EQ(fragment(cut, "p").inputs, (std::vector<std::string>{"bids"}));
  EXPECT_EQ(fragment(cut, "s").inputs, (std::vector<std::string>{"bids"}));
  EXPECT_TRUE(fragment(cut, "s").reads.empty());

  // And the same rows come out.
  auto schema = make_schema({{"auction", Type::Int64}, {"price", Type::Int64}});
  Feed feed;
  for (int k = 0; k < 5; ++k) {
    BatchBuilder bb(schema);
    for (int r = 0; r < 40; ++r) {
      bb.column(0).ints.push_back(k * 40 + r);
      bb.column(1).ints.push_back((k * 37 + r * 11) % 100);
      bb.event_time().push_back(k * 1000 + r);
      bb.seq().push_back(Seq(k * 40 + r));
    }
    feed.pushes.emplace_back("bids", bb.finish());
  }
  expect_equivalent(net, specs, feed);
}

TEST(CutQuery, JoinFedFromTwoFragmentsAndSplitPortsApart) {
  const QueryNetwork net = parse_ok(kEveryBox);
  // dear (the join's left) in one fragment, the join in another; the
  // split's two ports go to two fragments.
  const std::vector<FragmentSpec> specs = {
      {"sort", "n1", {"sorted", "by_price", "cheap", "parts"}},
      {"left", "n2", {"count0"}},
      {"right", "n3", {"count1"}},
      {"merge", "n1", {"counts"}},
      {"dear", "n2", {"dear"}},
      {"join", "n3", {"with_seller"}},
  };
  const QueryCut cut = cut_ok(net, specs);
  const InternalArc* p0 = arc_from(cut, "parts.0");
  const InternalArc* p1 = arc_from(cut, "parts.1");
  ASSERT_NE(p0, nullptr);
  ASSERT_NE(p1, nullptr);
  EXPECT_EQ(p0->stream, "every-box--parts_0");
  EXPECT_EQ(p1->stream, "every-box--parts_1");
  EXPECT_EQ(p0->to_fragments, (std::vector<std::string>{"left"}));
  EXPECT_EQ(p1->to_fragments, (std::vector<std::string>{"right"}));
  EXPECT_EQ(*p0->schema, *box_of(net, "parts").output_schemas[0]);
  const InternalArc* dear = arc_from(cut, "dear.0");
  ASSERT_NE(dear, nullptr);
  // dear's rows go to the join (another fragment) and to the query output
  // "dear", which its own fragment writes.
  EXPECT_EQ(dear->to_fragments, (std::vector<std::string>{"join"}));
  EXPECT_EQ(fragment(cut, "dear").outputs, (std::vector<std::string>{"dear"}));
  EXPECT_EQ(fragment(cut, "dear").writes, (std::vector<std::string>{"every-box--dear_0"}));
  // The join reads its left side from dear's stream and its right side from
  // the query's input, in the original ports.
  const FragmentPlan& join = fragment(cut, "join");
  EXPECT_EQ(join.inputs, (std::vector<std::string>{"auctions"}));
  EXPECT_EQ(join.reads, (std::vector<std::string>{"every-box--dear_0"}));
  const auto doc = json_of(join.network_json);
  ASSERT_EQ(doc["arcs"].Size(), 2u);
  EXPECT_STREQ(doc["arcs"][0]["from"].GetString(), "every-box--dear_0");
  EXPECT_STREQ(doc["arcs"][0]["to"].GetString(), "with_seller.0");
  EXPECT_STREQ(doc["arcs"][1]["from"].GetString(), "auctions");
  EXPECT_STREQ(doc["arcs"][1]["to"].GetString(), "with_seller.1");
  // The merge reads two streams, one per port.
  EXPECT_EQ(fragment(cut, "merge").reads,
            (std::vector<std::string>{"every-box--count0_0", "every-box--count1_0"}));
  // by_price's port 0 goes out (to dear); ports 1 and 2 stay inside.
  EXPECT_EQ(fragment(cut, "sort").writes,
            (std::vector<std::string>{"every-box--by_price_0", "every-box--parts_0", "every-box--parts_1"}));
}

TEST(CutQuery, WholeQueryAsOneFragment) {
  const QueryNetwork net = parse_ok(kEveryBox);
  const auto specs = whole_query_fragment(net, "all", "n1");
  ASSERT_EQ(specs.size(), 1u);
  EXPECT_EQ(specs[0].boxes, (std::vector<std::string>{"sorted", "by_price", "cheap", "parts", "count0", "count1",
                                                      "counts", "dear", "with_seller"}));
  const QueryCut cut = cut_ok(net, specs);
  ASSERT_EQ(cut.fragments.size(), 1u);
  EXPECT_TRUE(cut.arcs.empty());
  const FragmentPlan& f = cut.fragments[0];
  EXPECT_EQ(f.network.name(), "every-box--all");
  EXPECT_EQ(f.inputs, (std::vector<std::string>{"bids", "auctions"}));
  EXPECT_EQ(f.outputs, (std::vector<std::string>{"counts", "joined", "dear"}));
  // Everything but the name and description is the query's own JSON.
  auto doc = json_of(f.network_json);
  auto whole = json_of(kEveryBox);
  for (const char* key : {"inputs", "boxes", "arcs", "outputs"}) EXPECT_TRUE(doc[key] == whole[key]) << key;
  expect_equivalent(net, specs, interleave(make_bids(40, 250, 7), make_auctions(40, 25)));
}

// ---------------------------------------------------------------------------
// Equivalence

TEST(CutEquivalence, ChainInThree) {
  const QueryNetwork net = parse_ok(kChain);
  expect_equivalent(net, {{"f1", "", {"a"}}, {"f2", "", {"b", "c"}}, {"f3", "", {"d"}}},
                    interleave(make_bids(50, 200, 1), {}));
}

TEST(CutEquivalence, EveryBoxInManyWays) {
  const QueryNetwork net = parse_ok(kEveryBox);
  const Feed feed = interleave(make_bids(60, 250, 3), make_auctions(60, 25));
  // Split ports and the join's sides in different fragments.
  expect_equivalent(net,
                    {{"sort", "", {"sorted", "by_price", "cheap", "parts"}},
                     {"left", "", {"count0"}},
                     {"right", "", {"count1"}},
                     {"merge", "", {"counts"}},
                     {"dear", "", {"dear"}},
                     {"join", "", {"with_seller"}}},
                    feed);
  // Every box its own fragment.
  std::vector<FragmentSpec> singles;
  for (const auto& id : net.box_ids()) {
    std::string name = id;
    std::replace(name.begin(), name.end(), '_', '-');
    singles.push_back({name, "", {id}});
  }
  expect_equivalent(net, singles, feed);
  // Three fragments, in placement order unlike the pipeline's.
  expect_equivalent(net,
                    {{"tail", "", {"counts"}},
                     {"head", "", {"sorted", "by_price", "dear", "with_seller"}},
                     {"middle", "", {"cheap", "parts", "count0", "count1"}}},
                    feed);
}

// ---------------------------------------------------------------------------
// Executor::output_watermark

TEST(ExecutorOutputWatermark, FollowsTheBoxAndSurvivesRestore) {
  const QueryNetwork net = parse_ok(kChain);
  std::vector<EventTime> at_sink;
  std::unique_ptr<Executor> ex;
  auto made = Executor::create(net, [&](size_t o, const Batch&) { at_sink.push_back(ex->output_watermark(o)); });
  ASSERT_TRUE(made.ok());
  ex = std::move(made).value();
  EXPECT_EQ(ex->output_watermark(0), kMinTime);
  EXPECT_THROW(ex->output_watermark(1), std::out_of_range);

  const auto bids = make_bids(10, 100, 5);
  ex->push(0, bids[0]);
  // Rows up to ~1,000,990 ms seen, lag 1 s: the aggregate promises rows
  // no earlier than its open window, [1,000,000, 1,002,000) at most.
  const EventTime wm0 = ex->output_watermark(0);
  EXPECT_NE(wm0, kMinTime);
  EXPECT_LT(wm0, 1'002'000);
  for (size_t i = 1; i < 5; ++i) ex->push(0, bids[i]);
  const EventTime wm1 = ex->output_watermark(0);
  EXPECT_GT(wm1, wm0);
  ASSERT_FALSE(at_sink.empty());
  // In the sink, the watermark that preceded the batch: below the one after.
  EXPECT_LE(at_sink.back(), wm1);

  // A restored executor reports the snapshotted watermark.
  const std::string snap = ex->snapshot();
  auto other = Executor::create(net, nullptr);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->output_watermark(0), kMinTime);
  ASSERT_TRUE((*other)->restore(snap).ok());
  EXPECT_EQ((*other)->output_watermark(0), wm1);

  ex->finish();
  EXPECT_EQ(ex->output_watermark(0), kMaxWatermark);
}

// ---------------------------------------------------------------------------
// The internal stream encoding (the run_staged equivalence tests carry every
// cut above through it; these check its edges)

TEST(InternalStream, SchemaAddsWatermarkFieldsWithFreeNames) {
  const Schema port({{"a", Type::Int64}, {"_wm", Type::String}});
  const SchemaPtr s = internal_stream_schema(port);
  ASSERT_EQ(s->size(), 4u);
  EXPECT_EQ(s->field(2).name, "_wm_1");
  EXPECT_EQ(s->field(2).type, Type::Int64);
  EXPECT_EQ(s->field(3).name, "_wm_only");
  EXPECT_EQ(s->field(3).type, Type::Bool);
  EXPECT_TRUE(Schema::make(s->fields()).ok());
}

TEST(InternalStream, RowsAndMarksRoundTripThroughTheCodec) {
  const QueryNetwork net = parse_ok(kChain);
  const SchemaPtr port = net.inputs()[0].schema;
  const SchemaPtr internal = internal_stream_schema(*port);
  const Feed feed = interleave(make_bids(3, 10, 1), {});
  const Batch rows = feed.pushes.front().second;
  std::vector<Batch> parts{internal_mark(internal, 5), internal_rows(internal, rows, 7), internal_mark(internal, 9)};
  const Batch all = concat(internal, parts);
  std::string bytes;
  encode_batch(all, bytes);
  std::string_view in = bytes;
  auto back = decode_batch(in);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->rows(), rows.rows() + 2);
  EXPECT_EQ(back->column(port->size()).ints.front(), 5);
  EXPECT_EQ(back->column(port->size() + 1).bools.back(), 1);
  // A batch of another schema is refused.
  std::unique_ptr<Executor> ex = std::move(Executor::create(net, [](size_t, const Batch&) {})).value();
  EXPECT_THROW(push_internal(*ex, 0, port, rows), std::invalid_argument);
}

}  // namespace
}  // namespace entente::engine
