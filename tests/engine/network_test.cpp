// Query networks: parsing, every validation error (path and message), and
// the synchronous Executor (routing, event time, watermarks, statistics,
// snapshot/restore).
#include "engine/network.h"

#include <gtest/gtest.h>

#include <array>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/codec.h"

namespace entente::engine {
namespace {

// ---------------------------------------------------------------------------
// Helpers

// A network in pieces, so that each test changes one piece.
struct Net {
  std::string name = R"("hot-items")";
  std::string inputs =
      R"([{"name": "bids", "schema": [{"name": "auction", "type": "int64"},
                                      {"name": "price", "type": "int64"},
                                      {"name": "date_time", "type": "timestamp"}],
          "event_time": "date_time"}])";
  std::string boxes =
      R"([{"id": "f1", "type": "filter", "options": {"predicates": ["price > 100"]}},
          {"id": "m1", "type": "map", "options": {"fields": [{"name": "auction", "expr": "auction"},
                                                            {"name": "dollars", "expr": "price / 100"}]}}])";
  std::string arcs = R"([{"from": "bids", "to": "f1"}, {"from": "f1.0", "to": "m1"}])";
  std::string outputs = R"([{"name": "hot", "from": "m1"}])";
  std::string extra;  // more top-level members, with a leading comma

  std::string json() const {
    return R"({"name": )" + name + R"(, "inputs": )" + inputs + R"(, "boxes": )" + boxes + R"(, "arcs": )" + arcs +
           R"(, "outputs": )" + outputs + extra + "}";
  }
};

Diagnostics errors_of(const std::string& json) {
  Diagnostics diag;
  auto net = QueryNetwork::parse(json, diag);
  EXPECT_FALSE(net.ok()) << "expected the network to be refused:\n" << json;
  if (!net.ok()) {
    EXPECT_FALSE(diag.ok());
  }
  return diag;
}

// True if some diagnostic has exactly `path` and a message containing
// `text`.
::testing::AssertionResult has_error(const Diagnostics& diag, const std::string& path, const std::string& text) {
  for (const auto& d : diag.items())
    if (d.path == path && d.message.find(text) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "no error at " << path << " containing \"" << text << "\"; got:\n"
                                       << diag.to_string();
}

QueryNetwork parse_ok(const std::string& json) {
  Diagnostics diag;
  auto net = QueryNetwork::parse(json, diag);
  EXPECT_TRUE(net.ok()) << diag.to_string();
  EXPECT_TRUE(diag.ok());
  return net.ok() ? *net : QueryNetwork{};
}

SchemaPtr bids_schema() {
  return make_schema({{"auction", Type::Int64}, {"price", Type::Int64}, {"date_time", Type::Timestamp}});
}

// A batch of bids; event times left for the executor to take from
// date_time.
Batch bids(const std::vector<std::array<int64_t, 3>>& rows, Seq first_seq = 0) {
  BatchBuilder b(bids_schema());
  for (const auto& r : rows) {
    for (size_t c = 0; c < 3; ++c) b.column(c).ints.push_back(r[c]);
    b.event_time().push_back(0);
    b.seq().push_back(first_seq++);
  }
  return b.finish();
}

// Every row reaching each output, as JSON lines (values, event time and
// sequence number), in arrival order.
struct Collector {
  std::map<size_t, std::vector<std::string>> rows;
  Executor::Sink sink() {
    return [this](size_t output, const Batch& b) {
      for (size_t r = 0; r < b.rows(); ++r) {
        std::string line;
        row_to_json(b, r, line);
        rows[output].push_back(std::move(line));
      }
    };
  }
};

// ---------------------------------------------------------------------------
// Valid networks

TEST(NetworkParse, ValidNetworkResolvesInputsOutputsAndOrder) {
  Net n;
  // Boxes listed downstream-first: the order is topological, not textual.
  n.boxes = R"([{"id": "m1", "type": "map", "options": {"fields": [{"name": "auction", "expr": "auction"},
                                                                   {"name": "dollars", "expr": "price / 100"}]}},
                {"id": "f1", "type": "filter", "options": {"predicates": ["price > 100"]}}])";
  auto net = parse_ok(n.json());
  EXPECT_EQ(net.name(), "hot-items");
  ASSERT_EQ(net.inputs().size(), 1u);
  EXPECT_EQ(net.inputs()[0].name, "bids");
  EXPECT_EQ(net.inputs()[0].time_field, "date_time");
  EXPECT_EQ(*net.inputs()[0].schema, *bids_schema());
  ASSERT_EQ(net.outputs().size(), 1u);
  EXPECT_EQ(net.outputs()[0].name, "hot");
  EXPECT_EQ(net.outputs()[0].from, "m1");
  EXPECT_EQ(net.outputs()[0].schema->to_string(), "auction:int64, dollars:int64");
  EXPECT_EQ(net.box_ids(), (std::vector<std::string>{"f1", "m1"}));
  EXPECT_EQ(net.input_index("bids"), 0u);
  EXPECT_EQ(net.input_index("asks"), std::nullopt);
  EXPECT_EQ(net.output_index("hot"), 0u);
  EXPECT_EQ(net.output_index("cold"), std::nullopt);
}

TEST(NetworkParse, DurationsManualWatermarksAndDescriptions) {
  Net n;
  n.inputs = R"([{"name": "bids", "schema": [{"name": "auction", "type": "int64"},
                                            {"name": "price", "type": "int64"},
                                            {"name": "date_time", "type": "timestamp"}],
                  "watermark_lag": "2s", "watermarks": "manual"}])";
  n.extra = R"(, "description": "bids above one dollar")";
  auto net = parse_ok(n.json());
  EXPECT_EQ(net.inputs()[0].watermark_lag_ms, 2000);
  EXPECT_FALSE(net.inputs()[0].auto_watermark);
  EXPECT_TRUE(net.inputs()[0].time_field.empty());
}

TEST(NetworkParse, UnusedOutputPortsAndUnusedInputsAreAllowed) {
  Net n;
  n.inputs = R"([{"name": "bids", "schema": [{"name": "auction", "type": "int64"},
                                            {"name": "price", "type": "int64"},
                                            {"name": "date_time", "type": "timestamp"}]},
                 {"name": "people", "schema": [{"name": "id", "type": "int64"}]}])";
  // f1 has two output ports (matched, unmatched); port 1 feeds nothing.
  auto net = parse_ok(n.json());
  EXPECT_EQ(net.inputs().size(), 2u);
}

// The other examples of docs/query-networks.md parse as written.
TEST(NetworkParse, DocumentedExamplesAreValid) {
  parse_ok(R"({
  "name": "hot-items",
  "description": "auctions with the most bids above one dollar, per 10 s",
  "inputs": [
    {"name": "bids",
     "schema": [{"name": "auction", "type": "int64"},
                {"name": "bidder", "type": "int64"},
                {"name": "price", "type": "int64"},
                {"name": "date_time", "type": "timestamp"}],
     "event_time": "date_time",
     "watermark_lag": "2s"}
  ],
  "boxes": [
    {"id": "f1", "type": "filter",
     "options": {"predicates": ["price > 100"], "drop_unmatched": true}},
    {"id": "a1", "type": "aggregate",
     "options": {"group_by": ["auction"],
                 "window": {"type": "tumbling", "size": "10s"},
                 "aggregates": [{"fn": "count", "as": "bids"}]}}
  ],
  "arcs": [
    {"from": "bids", "to": "f1"},
    {"from": "f1", "to": "a1"}
  ],
  "outputs": [
    {"name": "hot", "from": "a1"}
  ]
})");
  auto clicks = parse_ok(R"({
  "name": "clicks-per-page",
  "inputs": [{"name": "clicks", "schema": [{"name": "page", "type": "string"}],
              "watermarks": "manual"}],
  "boxes": [{"id": "per_page", "type": "aggregate",
             "options": {"group_by": ["page"], "window": {"type": "tumbling", "size": "1m"},
                         "aggregates": [{"fn": "count", "as": "clicks"}]}}],
  "arcs": [{"from": "clicks", "to": "per_page"}],
  "outputs": [{"name": "page_counts", "from": "per_page"}]
})");
  EXPECT_EQ(clicks.outputs()[0].schema->to_string(),
            "page:string, window_start:timestamp, window_end:timestamp, clicks:int64");
}

// ---------------------------------------------------------------------------
// The document: syntax, size, nesting, shape

TEST(NetworkValidate, JsonSyntaxErrorNamesOffsetAndCause) {
  Diagnostics diag;
  auto net = QueryNetwork::parse("{\"name\": \"x\",\n \"inputs\": [}", diag);
  ASSERT_FALSE(net.ok());
  EXPECT_EQ(net.error().code, Errc::parse_error);
  ASSERT_EQ(diag.size(), 1u);
  EXPECT_TRUE(has_error(diag, "$", "JSON syntax error at offset 26 (line 2, column 13)"));
  EXPECT_TRUE(has_error(diag, "$", "Invalid value"));
}

TEST(NetworkValidate, EmptyDocumentAndTrailingGarbage) {
  EXPECT_TRUE(has_error(errors_of(""), "$", "JSON syntax error at offset 0"));
  Net n;
  EXPECT_TRUE(has_error(errors_of(n.json() + " {}"), "$", "JSON syntax error"));
}

TEST(NetworkValidate, DocumentSizeLimit) {
  Net n;
  n.extra = R"(, "description": ")" + std::string(4u << 20, 'x') + "\"";
  Diagnostics diag;
  auto net = QueryNetwork::parse(n.json(), diag);
  ASSERT_FALSE(net.ok());
  EXPECT_EQ(net.error().code, Errc::limit_exceeded);
  EXPECT_TRUE(has_error(diag, "$", "the limit is 4194304 (4 MiB)"));
}

TEST(NetworkValidate, NestingLimit) {
  Net n;
  n.extra = R"(, "description": )" + std::string(100, '[') + std::string(100, ']');
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$", "nested deeper than 64 levels"));
  // Brackets inside strings do not count.
  n.extra = R"(, "description": ")" + std::string(100, '[') + "\"";
  parse_ok(n.json());
}

TEST(NetworkValidate, RootMustBeAnObject) {
  EXPECT_TRUE(has_error(errors_of("[1, 2]"), "$", "a query network is a JSON object, got array"));
}

TEST(NetworkValidate, UnknownAndDuplicateTopLevelFields) {
  Net n;
  n.extra = R"(, "outptus": [], "name": "again")";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.outptus", "unknown field 'outptus'; known fields: name description inputs"));
  EXPECT_TRUE(has_error(diag, "$.name", "duplicate field 'name'"));
}

TEST(NetworkValidate, MissingRequiredTopLevelFields) {
  auto diag = errors_of(R"({"name": "x"})");
  EXPECT_TRUE(has_error(diag, "$.inputs", "missing required field 'inputs'"));
  EXPECT_TRUE(has_error(diag, "$.boxes", "missing required field 'boxes'"));
  EXPECT_TRUE(has_error(diag, "$.arcs", "missing required field 'arcs'"));
  EXPECT_TRUE(has_error(diag, "$.outputs", "missing required field 'outputs'"));
  auto diag2 = errors_of(R"({"inputs": [], "boxes": {}, "arcs": [], "outputs": []})");
  EXPECT_TRUE(has_error(diag2, "$.name", "missing required field 'name'"));
  EXPECT_TRUE(has_error(diag2, "$.inputs", "at least one input"));
  EXPECT_TRUE(has_error(diag2, "$.boxes", "expected an array, got object"));
  EXPECT_TRUE(has_error(diag2, "$.outputs", "at least one output"));
}

TEST(NetworkValidate, BadNetworkName) {
  for (const char* bad : {R"("Hot_Items")", R"("9lives")", R"("")", R"(7)"}) {
    Net n;
    n.name = bad;
    auto diag = errors_of(n.json());
    if (std::string(bad) == "7") EXPECT_TRUE(has_error(diag, "$.name", "expected a string, got number"));
    else EXPECT_TRUE(has_error(diag, "$.name", "bad network name")) << bad;
  }
  Net n;
  n.name = "\"" + std::string(65, 'a') + "\"";
  EXPECT_TRUE(has_error(errors_of(n.json()), "$.name", "at most 64 characters"));
}

// ---------------------------------------------------------------------------
// Inputs

TEST(NetworkValidate, InputFieldsAndNames) {
  Net n;
  n.inputs = R"([{"name": "bids.x", "schema": [{"name": "a", "type": "int64"}], "lag": 3},
                 {"schema": [{"name": "a", "type": "int64"}]},
                 "bids"])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.inputs[0].name", "bad input name 'bids.x'"));
  EXPECT_TRUE(has_error(diag, "$.inputs[0].lag", "unknown field 'lag'; known fields: name schema event_time"));
  EXPECT_TRUE(has_error(diag, "$.inputs[1].name", "missing required field 'name'"));
  EXPECT_TRUE(has_error(diag, "$.inputs[2]", "expected an input object, got string"));
}

TEST(NetworkValidate, InputStreamNamesAnotherDomainsStream) {
  Net n;
  n.inputs = R"([{"name": "bids", "stream": "beta/bids", "schema": [{"name": "auction", "type": "int64"},
                  {"name": "price", "type": "int64"}, {"name": "date_time", "type": "timestamp"}],
                  "event_time": "date_time"}])";
  Diagnostics diag;
  auto net = QueryNetwork::parse(n.json(), diag);
  ASSERT_TRUE(net.ok()) << diag.to_string();
  EXPECT_EQ(net->inputs()[0].name, "bids");
  EXPECT_EQ(net->inputs()[0].stream, "beta/bids");

  for (const char* bad : {"Beta/bids", "beta/", "/bids", "beta/bids/x", "beta bids", ""}) {
    Net m;
    m.inputs = std::string(R"([{"name": "bids", "stream": ")") + bad +
               R"(", "schema": [{"name": "auction", "type": "int64"}, {"name": "price", "type": "int64"}]}])";
    EXPECT_TRUE(has_error(errors_of(m.json()), "$.inputs[0].stream", "DOMAIN/NAME")) << bad;
  }
}

TEST(NetworkValidate, SchemaErrorsAreAllReported) {
  Net n;
  n.inputs = R"([{"name": "bids", "schema": [{"name": "auction", "type": "integer"},
                                            {"name": "auction", "type": "int64"},
                                            {"name": "9x", "type": "int64"},
                                            {"name": "p", "type": "double", "nullable": true},
                                            {"type": "bool"},
                                            3]},
                 {"name": "b2", "schema": []},
                 {"name": "b3", "schema": {"a": "int64"}},
                 {"name": "b4"}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.inputs[0].schema[0].type",
                        "unknown type 'integer'; known types: bool double int64 string timestamp"));
  EXPECT_TRUE(has_error(diag, "$.inputs[0].schema[1].name", "duplicate field name 'auction' (also at $.inputs[0].schema[0])"));
  EXPECT_TRUE(has_error(diag, "$.inputs[0].schema[2].name", "bad field name '9x'"));
  EXPECT_TRUE(has_error(diag, "$.inputs[0].schema[3].nullable", "unknown field 'nullable'"));
  EXPECT_TRUE(has_error(diag, "$.inputs[0].schema[4].name", "missing required field 'name'"));
  EXPECT_TRUE(has_error(diag, "$.inputs[0].schema[5]", "expected a {\"name\", \"type\"} object, got number"));
  EXPECT_TRUE(has_error(diag, "$.inputs[1].schema", "at least one field"));
  EXPECT_TRUE(has_error(diag, "$.inputs[2].schema", "a schema is an array"));
  EXPECT_TRUE(has_error(diag, "$.inputs[3].schema", "missing required field 'schema'"));
}

TEST(NetworkValidate, EventTimeFieldMissingOrOfWrongType) {
  Net n;
  n.inputs = R"([{"name": "bids", "schema": [{"name": "auction", "type": "int64"}, {"name": "price", "type": "int64"},
                                            {"name": "date_time", "type": "timestamp"}, {"name": "s", "type": "string"}],
                  "event_time": "datetime"},
                 {"name": "b2", "schema": [{"name": "s", "type": "string"}], "event_time": "s"},
                 {"name": "b3", "schema": [{"name": "t", "type": "int64"}], "event_time": "t"},
                 {"name": "b4", "schema": [{"name": "t", "type": "int64"}], "event_time": 5}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.inputs[0].event_time", "event time field 'datetime' is not in the schema (auction:int64"));
  EXPECT_TRUE(has_error(diag, "$.inputs[1].event_time", "event time field 's' has type string; it must be timestamp or int64"));
  EXPECT_TRUE(has_error(diag, "$.inputs[3].event_time", "expected a string, got number"));
  for (const auto& d : diag.items()) EXPECT_NE(d.path, "$.inputs[2].event_time") << "int64 is a valid event time";
}

TEST(NetworkValidate, WatermarkLagAndMode) {
  Net n;
  n.inputs = R"([{"name": "bids", "schema": [{"name": "a", "type": "int64"}], "watermark_lag": "2 weeks"},
                 {"name": "b2", "schema": [{"name": "a", "type": "int64"}], "watermark_lag": -5},
                 {"name": "b3", "schema": [{"name": "a", "type": "int64"}], "watermarks": "sometimes"}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.inputs[0].watermark_lag", "bad duration '2 weeks'"));
  EXPECT_TRUE(has_error(diag, "$.inputs[1].watermark_lag", "must not be negative"));
  EXPECT_TRUE(has_error(diag, "$.inputs[2].watermarks", "unknown value 'sometimes'; expected one of: auto manual"));
}

// ---------------------------------------------------------------------------
// Boxes

TEST(NetworkValidate, DuplicateIdsShareOneNamespaceWithInputs) {
  Net n;
  n.boxes = R"([{"id": "bids", "type": "filter", "options": {"predicates": ["price > 100"]}},
                {"id": "f1", "type": "filter", "options": {"predicates": ["price > 100"]}},
                {"id": "m1", "type": "map", "options": {"fields": [{"name": "a", "expr": "auction"}]}},
                {"id": "f1", "type": "filter", "options": {"predicates": ["price > 100"]}}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.boxes[0].id", "duplicate id 'bids': already used by $.inputs[0]"));
  EXPECT_TRUE(has_error(diag, "$.boxes[3].id", "duplicate id 'f1': already used by $.boxes[1]"));
}

TEST(NetworkValidate, BoxFieldsAndIds) {
  Net n;
  n.boxes = R"([{"id": "f1", "type": "filter", "options": {"predicates": ["price > 100"]}, "opts": {}},
                {"id": "m-1.2", "type": "map"},
                {"type": "map"},
                {"id": "x", "type": "map", "options": [1]},
                7])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.boxes[0].opts", "unknown field 'opts'; known fields: id type options description"));
  EXPECT_TRUE(has_error(diag, "$.boxes[1].id", "bad box id 'm-1.2'"));
  EXPECT_TRUE(has_error(diag, "$.boxes[2].id", "missing required field 'id'"));
  EXPECT_TRUE(has_error(diag, "$.boxes[3].options", "options must be an object, got array"));
  EXPECT_TRUE(has_error(diag, "$.boxes[4]", "expected a box object, got number"));
}

TEST(NetworkValidate, UnknownBoxTypeListsTheKnownOnes) {
  Net n;
  n.boxes = R"([{"id": "f1", "type": "fliter", "options": {"predicates": ["price > 100"]}},
                {"id": "m1", "type": "map", "options": {"fields": [{"name": "a", "expr": "auction"}]}}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.boxes[0].type",
                        "unknown box type 'fliter'; known types: aggregate bsort filter join map merge split union"));
  // m1, downstream of the broken box, is not type-checked: one error only.
  EXPECT_EQ(diag.size(), 1u) << diag.to_string();
}

TEST(NetworkValidate, BoxOptionErrorsComeFromTheFactoriesWithPaths) {
  Net n;
  n.boxes = R"([{"id": "f1", "type": "filter", "options": {"predicates": ["prise > 100"], "limit": 3}},
                {"id": "m1", "type": "map", "options": {"fields": [{"name": "a", "expr": "auction"}]}}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.boxes[0].options.predicates[0]", "unknown field 'prise'"));
  EXPECT_TRUE(has_error(diag, "$.boxes[0].options.limit", "unknown option 'limit'"));
}

TEST(NetworkValidate, TypeErrorsUseTheUpstreamOutputSchema) {
  Net n;
  // m1 sees the map's output (auction, dollars), not the input's price.
  n.boxes = R"([{"id": "m0", "type": "map", "options": {"fields": [{"name": "auction", "expr": "auction"},
                                                                   {"name": "dollars", "expr": "price / 100"}]}},
                {"id": "m1", "type": "map", "options": {"fields": [{"name": "p", "expr": "price"}]}}])";
  n.arcs = R"([{"from": "bids", "to": "m0"}, {"from": "m0", "to": "m1"}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.boxes[1].options.fields[0].expr", "unknown field 'price'"));
  EXPECT_EQ(diag.size(), 1u) << diag.to_string();
}

TEST(NetworkValidate, NoCascadeBelowAFailedBox) {
  Net n;
  n.boxes = R"([{"id": "f1", "type": "filter", "options": {"predicates": ["nope > 1"]}},
                {"id": "m1", "type": "map", "options": {"fields": [{"name": "p", "expr": "also_nope"}]}}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.boxes[0].options.predicates[0]", "unknown field 'nope'"));
  EXPECT_EQ(diag.size(), 1u) << diag.to_string();
}

TEST(NetworkValidate, WrongNumberOfInputsForTheBoxType) {
  Net n;
  n.arcs = R"([{"from": "bids", "to": "f1"}, {"from": "bids", "to": "f1.1"}, {"from": "f1.0", "to": "m1"}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.boxes[0]", "filter box needs 1 input, got 2"));
}

// ---------------------------------------------------------------------------
// Arcs and ports

TEST(NetworkValidate, ArcsNamingUnknownThingsOrBadPorts) {
  Net n;
  n.arcs = R"([{"from": "bids", "to": "f1"}, {"from": "f1.0", "to": "m1"},
               {"from": "asks", "to": "m1.1"},
               {"from": "bids.1", "to": "m1.2"},
               {"from": "f1", "to": "bids"},
               {"from": "f1.x", "to": "m1.3"},
               {"from": "f1", "to": "m2"},
               {"from": "f1.999", "to": "m1.4"},
               {"from": "", "to": "m1.5"},
               {"from": "f1.01", "to": "m1.6"},
               {"to": "m1.7", "via": 1},
               [1]])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.arcs[2].from", "unknown box or input 'asks'"));
  EXPECT_TRUE(has_error(diag, "$.arcs[3].from", "input 'bids' has no ports; write just 'bids'"));
  EXPECT_TRUE(has_error(diag, "$.arcs[4].to", "an arc cannot feed network input 'bids'"));
  EXPECT_TRUE(has_error(diag, "$.arcs[5].from", "bad port in 'f1.x'"));
  EXPECT_TRUE(has_error(diag, "$.arcs[6].to", "unknown box 'm2'"));
  EXPECT_TRUE(has_error(diag, "$.arcs[7].from", "port 999 out of range"));
  EXPECT_TRUE(has_error(diag, "$.arcs[8].from", "expected 'id' or 'id.port'"));
  EXPECT_TRUE(has_error(diag, "$.arcs[9].from", "bad port in 'f1.01'"));
  EXPECT_TRUE(has_error(diag, "$.arcs[10].from", "missing required field 'from'"));
  EXPECT_TRUE(has_error(diag, "$.arcs[10].via", "unknown field 'via'; known fields: from to"));
  EXPECT_TRUE(has_error(diag, "$.arcs[11]", "expected an arc object"));
}

TEST(NetworkValidate, InputPortFedByTwoArcs) {
  Net n;
  n.arcs = R"([{"from": "bids", "to": "f1"}, {"from": "f1.0", "to": "m1"}, {"from": "f1.1", "to": "m1.0"}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.arcs[2].to", "input port 0 of box 'm1' is already fed by $.arcs[1]"));
}

TEST(NetworkValidate, InputPortsMustBeContiguous) {
  Net n;
  n.boxes = R"([{"id": "f1", "type": "filter", "options": {"predicates": ["price > 100"]}},
                {"id": "u1", "type": "union"}])";
  n.arcs = R"([{"from": "bids", "to": "f1"}, {"from": "f1.0", "to": "u1.0"}, {"from": "f1.1", "to": "u1.2"}])";
  n.outputs = R"([{"name": "all", "from": "u1"}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.boxes[1]", "input port 1 of box 'u1' is not fed; input ports must be numbered "
                                            "0..k-1 without gaps (fed: 0, 2)"));
}

TEST(NetworkValidate, BoxWithoutInputAndBoxFeedingNoOutput) {
  Net n;
  n.boxes = R"([{"id": "f1", "type": "filter", "options": {"predicates": ["price > 100"]}},
                {"id": "m1", "type": "map", "options": {"fields": [{"name": "a", "expr": "auction"}]}},
                {"id": "lonely", "type": "map", "options": {"fields": [{"name": "a", "expr": "auction"}]}},
                {"id": "sidetrack", "type": "map", "options": {"fields": [{"name": "a", "expr": "auction"}]}}])";
  n.arcs = R"([{"from": "bids", "to": "f1"}, {"from": "f1.0", "to": "m1"}, {"from": "f1.1", "to": "sidetrack"}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.boxes[2]", "box 'lonely' has no input: no arc leads to it"));
  EXPECT_TRUE(has_error(diag, "$.boxes[2]", "box 'lonely' feeds no output"));
  EXPECT_TRUE(has_error(diag, "$.boxes[3]", "box 'sidetrack' feeds no output"));
  for (const auto& d : diag.items())
    EXPECT_EQ(d.message.find("'f1'"), std::string::npos) << "f1 reaches an output: " << d.path << ": " << d.message;
}

TEST(NetworkValidate, CyclesAreNamed) {
  Net n;
  n.boxes = R"([{"id": "f1", "type": "filter", "options": {"predicates": ["price > 100"]}},
                {"id": "u1", "type": "union"},
                {"id": "m1", "type": "map", "options": {"fields": [{"name": "a", "expr": "auction"}]}},
                {"id": "self", "type": "union"},
                {"id": "after", "type": "map", "options": {"fields": [{"name": "a", "expr": "auction"}]}}])";
  n.arcs = R"([{"from": "bids", "to": "f1"}, {"from": "f1.0", "to": "u1.0"}, {"from": "u1", "to": "m1"},
               {"from": "m1", "to": "u1.1"},
               {"from": "f1.1", "to": "self.0"}, {"from": "self", "to": "self.1"},
               {"from": "u1", "to": "after"}])";
  n.outputs = R"([{"name": "a", "from": "m1"}, {"name": "b", "from": "self"}, {"name": "c", "from": "after"}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.boxes[1]", "cycle: u1 -> m1 -> u1"));
  EXPECT_TRUE(has_error(diag, "$.boxes[3]", "cycle: self -> self"));
  // One error per cycle; 'after', downstream of one, is not reported.
  EXPECT_EQ(diag.size(), 2u) << diag.to_string();
}

TEST(NetworkValidate, OutputsNamingNonexistentPortsOrThings) {
  Net n;
  n.outputs = R"([{"name": "hot", "from": "m1.3"}, {"name": "hot", "from": "m1"}, {"name": "raw", "from": "bids"},
                  {"name": "x", "from": "nothing"}, {"name": "y"}, {"name": "z", "from": "m1", "format": "csv"}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.outputs[0].from", "box 'm1' has 1 output port (0..0); there is no port 3"));
  EXPECT_TRUE(has_error(diag, "$.outputs[1].name", "duplicate output name 'hot': already used by $.outputs[0]"));
  EXPECT_TRUE(has_error(diag, "$.outputs[2].from", "a network output must come from a box; 'bids' is a network input"));
  EXPECT_TRUE(has_error(diag, "$.outputs[3].from", "unknown box 'nothing'"));
  EXPECT_TRUE(has_error(diag, "$.outputs[4].from", "missing required field 'from'"));
  EXPECT_TRUE(has_error(diag, "$.outputs[5].format", "unknown field 'format'; known fields: name from"));
}

TEST(NetworkValidate, ArcFromNonexistentOutputPort) {
  Net n;
  n.boxes = R"([{"id": "f1", "type": "filter", "options": {"predicates": ["price > 100"]}},
                {"id": "m1", "type": "map", "options": {"fields": [{"name": "a", "expr": "auction"}]}},
                {"id": "m2", "type": "map", "options": {"fields": [{"name": "a", "expr": "auction"}]}}])";
  n.arcs = R"([{"from": "bids", "to": "f1"}, {"from": "f1.0", "to": "m1"}, {"from": "f1.5", "to": "m2"}])";
  n.outputs = R"([{"name": "hot", "from": "m1"}, {"name": "other", "from": "m2"}])";
  auto diag = errors_of(n.json());
  EXPECT_TRUE(has_error(diag, "$.arcs[2].from", "box 'f1' has 2 output ports (0..1); there is no port 5"));
  EXPECT_EQ(diag.size(), 1u) << diag.to_string();
}

TEST(NetworkValidate, CountLimits) {
  Net n;
  std::string boxes = "[";
  for (int i = 0; i < 1001; ++i) boxes += std::string(i ? "," : "") + R"({"id": "b)" + std::to_string(i) + R"(", "type": "union"})";
  n.boxes = boxes + "]";
  std::string inputs = "[";
  for (int i = 0; i < 257; ++i)
    inputs += std::string(i ? "," : "") + R"({"name": "i)" + std::to_string(i) + R"(", "schema": [{"name": "a", "type": "int64"}]})";
  n.inputs = inputs + "]";
  Diagnostics diag;
  auto net = QueryNetwork::parse(n.json(), diag);
  ASSERT_FALSE(net.ok());
  EXPECT_TRUE(has_error(diag, "$.boxes", "too many boxes: 1001; the limit is 1000"));
  EXPECT_TRUE(has_error(diag, "$.inputs", "too many inputs: 257; the limit is 256"));
}

TEST(NetworkValidate, EveryErrorIsCollectedAndSummarised) {
  Net n;
  n.name = R"("Bad Name")";
  n.boxes = R"([{"id": "f1", "type": "filter", "options": {"predicates": ["prise > 100"]}},
                {"id": "m1", "type": "mapp"}])";
  n.outputs = R"([{"name": "hot", "from": "m1"}, {"name": "cold", "from": "f1.1"}])";
  Diagnostics diag;
  auto net = QueryNetwork::parse(n.json(), diag);
  ASSERT_FALSE(net.ok());
  EXPECT_EQ(diag.size(), 3u) << diag.to_string();
  EXPECT_TRUE(has_error(diag, "$.name", "bad network name 'Bad Name'"));
  EXPECT_TRUE(has_error(diag, "$.boxes[0].options.predicates[0]", "unknown field 'prise'"));
  EXPECT_TRUE(has_error(diag, "$.boxes[1].type", "unknown box type 'mapp'"));
  EXPECT_EQ(net.error().code, Errc::invalid_argument);
  EXPECT_NE(net.error().message.find("is invalid: 3 problems; first: $.name: bad network name"), std::string::npos)
      << net.error().message;
}

TEST(NetworkValidate, HugeStringsAreCutShortInMessages) {
  Net n;
  n.boxes = R"([{"id": "f1", "type": ")" + std::string(10000, 'q') + R"("}])";
  auto diag = errors_of(n.json());
  for (const auto& d : diag.items()) EXPECT_LT(d.message.size(), 400u) << d.path;
}

// The example of docs/query-networks.md, "A network with mistakes": the
// documented output must stay true.
TEST(NetworkValidate, DocumentedExampleOfMistakes) {
  const char* json = R"({
  "name": "Hot Items",
  "inputs": [{"name": "bids", "schema": [{"name": "auction", "type": "int64"},
                                         {"name": "price", "type": "int64"}],
              "event_time": "date_time"}],
  "boxes": [
    {"id": "f1", "type": "filter", "options": {"predicates": ["prise > 100"]}},
    {"id": "m1", "type": "map", "options": {"fields": [{"name": "p", "expr": "price"}]}},
    {"id": "x", "type": "mapp"}
  ],
  "arcs": [{"from": "bids", "to": "f1"}, {"from": "f1.0", "to": "m1"}, {"from": "f1.1", "to": "m1"}],
  "outputs": [{"name": "hot", "from": "m1.1"}]
})";
  auto diag = errors_of(json);
  EXPECT_EQ(diag.to_string(),
            "$.name: bad network name 'Hot Items': expected [a-z][a-z0-9-]*, at most 64 characters\n"
            "$.inputs[0].event_time: event time field 'date_time' is not in the schema (auction:int64, price:int64)\n"
            "$.boxes[2].type: unknown box type 'mapp'; known types: aggregate bsort filter join map merge split union\n"
            "$.arcs[2].to: input port 0 of box 'm1' is already fed by $.arcs[1]\n"
            "$.boxes[2]: box 'x' has no input: no arc leads to it\n"
            "$.boxes[2]: box 'x' feeds no output\n"
            "$.boxes[0].options.predicates[0]: unknown field 'prise' at 1:1");
}

// ---------------------------------------------------------------------------
// Executor

TEST(Executor, RunsAPipelineAndTakesEventTimeFromTheTimeField) {
  auto net = parse_ok(Net{}.json());
  Collector out;
  auto ex = Executor::create(net, out.sink());
  ASSERT_TRUE(ex.ok()) << ex.error().message;
  (*ex)->push(0, bids({{1, 50, 1000}, {2, 250, 1001}, {3, 900, 1002}}));
  ASSERT_EQ(out.rows[0].size(), 2u);
  EXPECT_EQ(out.rows[0][0], R"({"_seq":0,"_time":1001,"auction":2,"dollars":2})");
  EXPECT_EQ(out.rows[0][1], R"({"_seq":1,"_time":1002,"auction":3,"dollars":9})");

  auto stats = (*ex)->box_stats();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].id, "f1");
  EXPECT_EQ(stats[0].type, "filter");
  EXPECT_EQ(stats[0].stats.batches_in, 1u);
  EXPECT_EQ(stats[0].stats.tuples_in, 3u);
  EXPECT_EQ(stats[1].id, "m1");
  EXPECT_EQ(stats[1].stats.tuples_in, 2u);
  EXPECT_EQ(stats[1].stats.tuples_out, 2u);
}

// An input's event times are its time column's values, shared, not
// copied: a map forwarding them hands the very same values to the sink,
// however the batch was pushed; the pushed batch is not changed.
TEST(Executor, EventTimesShareTheTimeColumn) {
  Net n;
  n.boxes = R"([{"id": "m1", "type": "map", "options": {"fields": [{"name": "auction", "expr": "auction"},
                                                                   {"name": "date_time", "expr": "date_time"}]}}])";
  n.arcs = R"([{"from": "bids", "to": "m1"}])";
  auto net = parse_ok(n.json());
  std::vector<Batch> got;
  auto ex = Executor::create(net, [&got](size_t, const Batch& b) { got.push_back(b); });
  ASSERT_TRUE(ex.ok());
  const Batch batch = bids({{1, 50, 1000}, {2, 250, 1002}});
  (*ex)->push(0, batch);
  Batch moved = bids({{3, 70, 1003}});
  const EventTime* moved_times = moved.column(2).ints.data();
  (*ex)->push(0, std::move(moved));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].event_time, (RowVector<EventTime>{1000, 1002}));
  EXPECT_EQ(got[0].event_time.data(), batch.column(2).ints.data());
  EXPECT_EQ(got[0].column(1).ints.data(), batch.column(2).ints.data());
  EXPECT_EQ(got[1].event_time.data(), moved_times);
  EXPECT_EQ(batch.event_time, (RowVector<EventTime>{0, 0}));
  EXPECT_EQ(got[0].seq, (RowVector<Seq>{0, 1}));
  EXPECT_EQ(got[1].seq, (RowVector<Seq>{2}));
}

// Pushing a batch by reference (stamped into a reused copy) or handing it
// over (stamped in place) delivers the same rows, event times and
// watermarks, and leaves a pushed-by-reference batch untouched.
TEST(Executor, PushByReferenceAndByValueAgree) {
  auto net = parse_ok(Net{}.json());
  Collector by_ref;
  Collector by_value;
  auto a = Executor::create(net, by_ref.sink());
  auto b = Executor::create(net, by_value.sink());
  ASSERT_TRUE(a.ok() && b.ok());
  const std::vector<std::vector<std::array<int64_t, 3>>> pushes = {
      {{1, 50, 1000}, {2, 250, 1001}, {3, 900, 1002}}, {{4, 300, 999}}, {}, {{5, 700, 1005}, {6, 100, 1003}}};
  Seq seq = 0;
  for (const auto& rows : pushes) {
    const Batch batch = bids(rows, seq);
    seq += rows.size();
    (*a)->push(0, batch);
    EXPECT_EQ(batch.event_time, std::vector<EventTime>(rows.size(), 0));  // untouched
    Batch moved = batch;
    (*b)->push(0, std::move(moved));
  }
  EXPECT_EQ(by_ref.rows, by_value.rows);
  EXPECT_EQ(by_ref.rows[0].size(), 4u);
  EXPECT_EQ((*a)->snapshot(), (*b)->snapshot());
}

// A sink may push into the executor that called it; the inner push must not
// disturb the batch the outer one is still delivering.
TEST(Executor, SinkMayPushIntoItsOwnExecutor) {
  auto net = parse_ok(Net{}.json());
  std::vector<std::string> rows;
  Executor* self = nullptr;
  int depth = 0;
  auto ex = Executor::create(net, [&](size_t, const Batch& b) {
    for (size_t r = 0; r < b.rows(); ++r) {
      std::string line;
      row_to_json(b, r, line);
      rows.push_back(std::move(line));
    }
    if (depth++ == 0) {
      const Batch inner = bids({{9, 500, 2000}}, 100);
      self->push(0, inner);
    }
  });
  ASSERT_TRUE(ex.ok());
  self = ex->get();
  const Batch outer = bids({{1, 300, 1000}, {2, 400, 1001}});
  (*ex)->push(0, outer);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0], R"({"_seq":0,"_time":1000,"auction":1,"dollars":3})");
  EXPECT_EQ(rows[1], R"({"_seq":1,"_time":1001,"auction":2,"dollars":4})");
  EXPECT_EQ(rows[2], R"({"_seq":2,"_time":2000,"auction":9,"dollars":5})");
}

TEST(Executor, FanOutDeliversOnePortToSeveralBoxesAndOutputs) {
  Net n;
  n.boxes = R"([{"id": "f1", "type": "filter", "options": {"predicates": ["price > 100"], "drop_unmatched": true}},
                {"id": "m1", "type": "map", "options": {"fields": [{"name": "a", "expr": "auction"}]}},
                {"id": "m2", "type": "map", "options": {"fields": [{"name": "p", "expr": "price"}]}}])";
  n.arcs = R"([{"from": "bids", "to": "f1"}, {"from": "f1", "to": "m1"}, {"from": "f1", "to": "m2"}])";
  n.outputs = R"([{"name": "a", "from": "m1"}, {"name": "p", "from": "m2"}, {"name": "raw", "from": "f1"}])";
  Collector out;
  auto ex = Executor::create(parse_ok(n.json()), out.sink());
  ASSERT_TRUE(ex.ok());
  (*ex)->push(0, bids({{1, 500, 10}, {2, 5, 11}}));
  EXPECT_EQ(out.rows[0], (std::vector<std::string>{R"({"_seq":0,"_time":10,"a":1})"}));
  EXPECT_EQ(out.rows[1], (std::vector<std::string>{R"({"_seq":0,"_time":10,"p":500})"}));
  EXPECT_EQ(out.rows[2], (std::vector<std::string>{R"({"_seq":0,"_time":10,"auction":1,"price":500,"date_time":10})"}));
}

// A tumbling count of bids per auction: windows close on watermarks.
Net window_net(const std::string& input_extra) {
  Net n;
  n.inputs = R"([{"name": "bids", "schema": [{"name": "auction", "type": "int64"},
                                            {"name": "price", "type": "int64"},
                                            {"name": "date_time", "type": "timestamp"}],
                  "event_time": "date_time")" + input_extra + "}]";
  n.boxes = R"([{"id": "a1", "type": "aggregate",
                 "options": {"group_by": ["auction"], "window": {"type": "tumbling", "size": "10s"},
                             "aggregates": [{"fn": "count"}, {"fn": "max", "field": "price"}]}}])";
  n.arcs = R"([{"from": "bids", "to": "a1"}])";
  n.outputs = R"([{"name": "counts", "from": "a1"}])";
  return n;
}

TEST(Executor, AutomaticWatermarksCloseWindowsWithLag) {
  Collector out;
  auto ex = Executor::create(parse_ok(window_net(R"(, "watermark_lag": "1s")").json()), out.sink());
  ASSERT_TRUE(ex.ok()) << ex.error().message;
  (*ex)->push(0, bids({{1, 10, 1000}, {1, 30, 9000}, {2, 5, 9500}}));
  (*ex)->push(0, bids({{1, 20, 10500}}, 3));
  // Watermark 10500 - 1000 = 9500: window [0, 10s) still open.
  EXPECT_TRUE(out.rows[0].empty());
  (*ex)->push(0, bids({{1, 20, 11000}}, 4));  // watermark 10000 closes it
  ASSERT_EQ(out.rows[0].size(), 2u);
  auto has_row = [&](const std::string& part) {
    for (const auto& r : out.rows[0])
      if (r.find(part) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has_row(R"("auction":1,"window_start":0,"window_end":10000,"count":2,"max_price":30)"));
  EXPECT_TRUE(has_row(R"("auction":2,"window_start":0,"window_end":10000,"count":1,"max_price":5)"));
  (*ex)->finish();
  ASSERT_EQ(out.rows[0].size(), 3u);
  EXPECT_NE(out.rows[0][2].find(R"("count":2,"max_price":20)"), std::string::npos) << out.rows[0][2];
}

TEST(Executor, ManualWatermarksMoveOnlyWhenAdvanced) {
  Collector out;
  auto ex = Executor::create(parse_ok(window_net(R"(, "watermarks": "manual")").json()), out.sink());
  ASSERT_TRUE(ex.ok());
  (*ex)->push(0, bids({{1, 10, 1000}, {1, 30, 25000}}));
  EXPECT_TRUE(out.rows[0].empty());
  (*ex)->advance_watermark(0, 10000);
  EXPECT_EQ(out.rows[0].size(), 1u);
  (*ex)->advance_watermark(0, 5000);  // lower: ignored
  EXPECT_EQ(out.rows[0].size(), 1u);
  (*ex)->finish();
  EXPECT_EQ(out.rows[0].size(), 2u);
}

TEST(Executor, RejectsBadPushes) {
  Collector out;
  auto ex = Executor::create(parse_ok(Net{}.json()), out.sink());
  ASSERT_TRUE(ex.ok());
  EXPECT_THROW((*ex)->push(1, bids({{1, 2, 3}})), std::out_of_range);
  BatchBuilder other(make_schema({{"x", Type::Int64}}));
  other.column(0).ints.push_back(1);
  other.event_time().push_back(0);
  other.seq().push_back(0);
  EXPECT_THROW((*ex)->push(0, other.finish()), std::invalid_argument);
  EXPECT_THROW((*ex)->advance_watermark(3, 0), std::out_of_range);
  // An empty batch is fine and does nothing.
  (*ex)->push(0, bids({}));
  EXPECT_TRUE(out.rows[0].empty());
}

// Random bids in nearly increasing time, in batches.
std::vector<Batch> random_bids(uint32_t seed, size_t batches, size_t rows_per_batch) {
  std::vector<Batch> out;
  uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  int64_t t = 0;
  Seq seq = 0;
  for (size_t b = 0; b < batches; ++b) {
    std::vector<std::array<int64_t, 3>> rows;
    for (size_t r = 0; r < rows_per_batch; ++r) {
      t += int64_t(next() % 400);
      rows.push_back({int64_t(next() % 20), int64_t(next() % 1000), t});
    }
    out.push_back(bids(rows, seq));
    seq += rows_per_batch;
  }
  return out;
}

TEST(Executor, SnapshotMidStreamAndRestoreContinuesIdentically) {
  auto net = parse_ok(window_net(R"(, "watermark_lag": 500)").json());
  auto input = random_bids(7, 40, 50);

  Collector whole;
  auto a = Executor::create(net, whole.sink());
  ASSERT_TRUE(a.ok());
  for (const auto& b : input) (*a)->push(0, b);
  (*a)->finish();
  ASSERT_FALSE(whole.rows[0].empty());

  Collector split;
  auto b1 = Executor::create(net, split.sink());
  ASSERT_TRUE(b1.ok());
  for (size_t i = 0; i < 17; ++i) (*b1)->push(0, input[i]);
  std::string snap = (*b1)->snapshot();
  b1->reset();  // the first executor is gone
  auto b2 = Executor::create(net, split.sink());
  ASSERT_TRUE(b2.ok());
  ASSERT_TRUE((*b2)->restore(snap).ok());
  for (size_t i = 17; i < input.size(); ++i) (*b2)->push(0, input[i]);
  (*b2)->finish();
  EXPECT_EQ(split.rows, whole.rows);
}

TEST(Executor, RestoreRefusesAnotherNetworkOrCorruptBytes) {
  auto net = parse_ok(window_net("").json());
  Collector out;
  auto ex = Executor::create(net, out.sink());
  ASSERT_TRUE(ex.ok());
  (*ex)->push(0, bids({{1, 10, 1000}}));
  std::string snap = (*ex)->snapshot();

  // Same shape, other box id.
  Net other = window_net("");
  other.boxes = R"([{"id": "a2", "type": "aggregate",
                     "options": {"group_by": ["auction"], "window": {"type": "tumbling", "size": "10s"},
                                 "aggregates": [{"fn": "count"}, {"fn": "max", "field": "price"}]}}])";
  other.arcs = R"([{"from": "bids", "to": "a2"}])";
  other.outputs = R"([{"name": "counts", "from": "a2"}])";
  auto ex2 = Executor::create(parse_ok(other.json()), out.sink());
  ASSERT_TRUE(ex2.ok());
  Status st = (*ex2)->restore(snap);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::invalid_argument);
  EXPECT_NE(st.error().message.find("has box 'a1' (aggregate) where this network has 'a2'"), std::string::npos)
      << st.error().message;

  // Every truncation is refused, never read past the end.
  for (size_t len = 0; len < snap.size(); ++len) {
    Status s = (*ex)->restore(std::string_view(snap).substr(0, len));
    EXPECT_FALSE(s.ok()) << len;
  }
  EXPECT_EQ((*ex)->restore("XXXX").error().code, Errc::corrupt);
  EXPECT_EQ((*ex)->restore(snap + "x").error().code, Errc::corrupt);
  // A failed restore left the executor as it was.
  (*ex)->finish();
  ASSERT_EQ(out.rows[0].size(), 1u);
  EXPECT_NE(out.rows[0][0].find(R"("count":1)"), std::string::npos);
}

}  // namespace
}  // namespace entente::engine
