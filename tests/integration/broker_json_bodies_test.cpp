// Every JSON request body goes through one reader (broker/detail/json_in.h):
// a key given twice, at any depth, is a 400 naming its JSON path, and nothing
// is created. {"name":"a","name":"b"} used to create stream b.
#include <gtest/gtest.h>

#include <string>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/federation.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

std::string detail_of(const http::ClientResponse& r) {
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("detail") || !d["detail"].IsString()) return "";
  return d["detail"].GetString();
}

void expect_400(const http::ClientResponse& r, const std::string& detail_part) {
  EXPECT_EQ(r.status, 400u) << r.body;
  EXPECT_EQ(r.header("content-type").value_or(""), "application/problem+json") << r.body;
  EXPECT_NE(detail_of(r).find(detail_part), std::string::npos) << r.body;
}

const char* kSchema = R"([{"name":"k","type":"int64"},{"name":"ts","type":"timestamp"}])";

TEST(BrokerJsonBodies, DuplicateKeysAreRefusedInStreamsQueriesImportsAndRows) {
  BrokerProcess b;
  ASSERT_TRUE(b.start()) << b.last_error();

  // Streams: at the top, and nested.
  expect_400(b.request("POST", "/v1/streams",
                       std::string(R"({"name":"a","name":"b","schema":)") + kSchema + "}"),
             "$.name: duplicate key 'name'");
  EXPECT_EQ(b.request("GET", "/v1/streams/b", "", kReaderToken).status, 404u);
  EXPECT_EQ(b.request("GET", "/v1/streams/a", "", kReaderToken).status, 404u);
  expect_400(b.request("POST", "/v1/streams",
                       std::string(R"({"name":"a","schema":)") + kSchema +
                           R"(,"retention":{"max_tuples":1,"max_tuples":2}})"),
             "$.retention.max_tuples: duplicate key");
  expect_400(b.request("POST", "/v1/streams",
                       R"({"name":"a","schema":[{"name":"k","type":"int64","type":"string"}]})"),
             "$.schema[0].type: duplicate key");
  EXPECT_EQ(b.request("GET", "/v1/streams", "", kReaderToken).body, R"({"streams":[]})");

  ASSERT_EQ(b.request("POST", "/v1/streams",
                      std::string(R"({"name":"bids","event_time":"ts","schema":)") + kSchema + "}")
                .status,
            201u);

  // Queries: deep inside a box's options.
  const std::string query =
      std::string(R"({"name":"q","inputs":[{"name":"bids","event_time":"ts","schema":)") + kSchema +
      R"(}],"boxes":[{"id":"f","type":"filter","options":{"predicates":["k > 1"],"predicates":["k > 2"],)"
      R"("drop_unmatched":true}}],"arcs":[{"from":"bids","to":"f"}],"outputs":[{"name":"big","from":"f"}]})";
  expect_400(b.request("POST", "/v1/queries", query), "$.boxes[0].options.predicates: duplicate key");
  EXPECT_EQ(b.request("GET", "/v1/queries/q", "", kReaderToken).status, 404u);

  // Imports (checked before anything else, even on a node without federation).
  expect_400(b.request("POST", "/v1/imports", R"({"stream":"x/a","stream":"x/b"})"), "$.stream: duplicate key");

  // Rows: a field given twice, as a JSON array and as NDJSON, names the row
  // and the field; so does `_time` given twice.
  auto rows = b.request("POST", "/v1/streams/bids/tuples", R"([{"k":1,"ts":5},{"k":2,"k":3,"ts":6}])",
                        kPublisherToken);
  expect_400(rows, "row 1, field 'k': given twice");
  EXPECT_NE(rows.body.find(R"("errors":[{"row":1,"field":"k")"), std::string::npos) << rows.body;
  rows = b.request("POST", "/v1/streams/bids/tuples", "{\"k\":1,\"ts\":5}\n{\"k\":2,\"ts\":6,\"ts\":7}\n",
                   kPublisherToken, "application/x-ndjson");
  expect_400(rows, "row 1, field 'ts': given twice");
  // Syntax errors say where, as before.
  expect_400(b.request("POST", "/v1/streams", R"({"name":)"), "invalid JSON at offset");
  // Too deep to be a body of this API.
  expect_400(b.request("POST", "/v1/streams", std::string(100, '[') + std::string(100, ']')), "nested deeper");
  // Nothing of the refused batches was stored.
  EXPECT_EQ(next_seq(b, "bids"), 1u);
}

TEST(BrokerJsonBodies, DuplicateKeysAreRefusedInContractBodies) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  fed.link(acme, beta);
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  auto r = acme.process().request("POST", "/v1/contracts", R"({"terms":{},"terms":{}})");
  expect_400(r, "$.terms: duplicate key 'terms'");
  r = acme.process().request("POST", "/v1/contracts/c-0123456789abcdef/accept", R"({"version":1,"version":2})");
  expect_400(r, "$.version: duplicate key");
  EXPECT_EQ(acme.process().request("GET", "/v1/contracts", "", kReaderToken).body, R"({"contracts":[]})");
}

}  // namespace
}  // namespace entente::testing
