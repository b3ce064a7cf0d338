// The REST API of a real broker process: health, auth, streams, ingest,
// queries, checkpoints, metrics, and every bad-input case the issue names.
#include <gtest/gtest.h>

#include <string>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"

namespace entente::testing {
namespace {

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  EXPECT_FALSE(d.HasParseError()) << body;
  return d;
}

// Every error is problem+json with a readable detail.
void expect_problem(const http::ClientResponse& r, unsigned status, const std::string& detail_part = {}) {
  EXPECT_EQ(r.status, status) << r.body;
  auto ct = r.header("content-type");
  ASSERT_TRUE(ct.has_value());
  EXPECT_EQ(*ct, "application/problem+json") << r.body;
  auto d = parse(r.body);
  ASSERT_TRUE(d.IsObject());
  EXPECT_EQ(d["status"].GetUint(), status);
  ASSERT_TRUE(d.HasMember("detail") && d["detail"].IsString());
  if (!detail_part.empty()) {
    EXPECT_NE(std::string(d["detail"].GetString()).find(detail_part), std::string::npos) << r.body;
  }
}

const char* kBidsStream =
    R"({"name":"bids","schema":[{"name":"auction","type":"int64"},{"name":"price","type":"int64"},)"
    R"({"name":"ts","type":"timestamp"}],"event_time":"ts"})";

class BrokerApi : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(broker_.start()) << broker_.last_error(); }
  BrokerProcess broker_;
};

TEST_F(BrokerApi, HealthNeedsNoToken) {
  auto r = broker_.request("GET", "/v1/health", "", "");
  ASSERT_EQ(r.status, 200u) << r.body;
  auto d = parse(r.body);
  EXPECT_STREQ(d["status"].GetString(), "ok");
  EXPECT_STREQ(d["domain"].GetString(), "acme");
  EXPECT_STREQ(d["node"].GetString(), "n1");
}

// The build's version has one source, project(entente VERSION ...): CMake
// hands it to this test as ENTENTE_EXPECTED_VERSION, and the node's health
// and the CLI must both say it.
TEST_F(BrokerApi, HealthAndCliSayTheBuildsVersion) {
  const std::string expected = ENTENTE_EXPECTED_VERSION;
  ASSERT_FALSE(expected.empty());
  auto r = broker_.request("GET", "/v1/health", "", "");
  ASSERT_EQ(r.status, 200u) << r.body;
  auto d = parse(r.body);
  ASSERT_TRUE(d.HasMember("version") && d["version"].IsString()) << r.body;
  EXPECT_EQ(std::string(d["version"].GetString()), expected);

  for (const char* arg : {"--version", "version"}) {
    std::string out;
    EXPECT_EQ(run_command(std::string(ENTENTE_BIN) + " " + arg, out), 0) << arg;
    EXPECT_EQ(out, "entente " + expected + "\n") << arg;
  }
}

TEST_F(BrokerApi, AuthFailuresAreProblems) {
  expect_problem(broker_.request("GET", "/v1/streams", "", ""), 401, "bearer token");
  expect_problem(broker_.request("GET", "/v1/streams", "", "wrong-token"), 401, "not valid");
  expect_problem(broker_.request("POST", "/v1/streams", kBidsStream, kReaderToken), 403, "role admin");
  expect_problem(broker_.request("POST", "/v1/streams", kBidsStream, kPublisherToken), 403, "role admin");
  EXPECT_EQ(broker_.request("GET", "/v1/streams", "", kReaderToken).status, 200u);
}

TEST_F(BrokerApi, StreamLifecycleAndIngest) {
  auto r = broker_.request("POST", "/v1/streams", kBidsStream);
  ASSERT_EQ(r.status, 201u) << r.body;
  EXPECT_EQ(r.header("location").value_or(""), "/v1/streams/bids");
  expect_problem(broker_.request("POST", "/v1/streams", kBidsStream), 409, "exists");

  r = broker_.request("POST", "/v1/streams/bids/tuples",
                      "{\"auction\":1,\"price\":10,\"ts\":1000}\n{\"auction\":2,\"price\":20,\"ts\":1001}\n",
                      kPublisherToken, "application/x-ndjson");
  ASSERT_EQ(r.status, 200u) << r.body;
  auto d = parse(r.body);
  EXPECT_EQ(d["count"].GetUint64(), 2u);
  EXPECT_EQ(d["first_seq"].GetUint64(), 1u);
  EXPECT_EQ(d["last_seq"].GetUint64(), 2u);

  r = broker_.request("POST", "/v1/streams/bids/tuples", R"([{"auction":3,"price":30,"ts":1002}])", kPublisherToken);
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(parse(r.body)["first_seq"].GetUint64(), 3u);

  r = broker_.request("GET", "/v1/streams/bids", "", kReaderToken);
  ASSERT_EQ(r.status, 200u);
  d = parse(r.body);
  EXPECT_EQ(d["next_seq"].GetUint64(), 4u);
  EXPECT_EQ(d["tuples"].GetUint64(), 3u);
  EXPECT_STREQ(d["event_time"].GetString(), "ts");

  r = broker_.request("GET", "/v1/streams", "", kReaderToken);
  EXPECT_EQ(parse(r.body)["streams"].Size(), 1u);

  EXPECT_EQ(broker_.request("DELETE", "/v1/streams/bids").status, 204u);
  expect_problem(broker_.request("GET", "/v1/streams/bids", "", kReaderToken), 404, "no stream 'bids'");
}

TEST_F(BrokerApi, BadRowsRejectTheWholeBatch) {
  ASSERT_EQ(broker_.request("POST", "/v1/streams", kBidsStream).status, 201u);
  auto r = broker_.request("POST", "/v1/streams/bids/tuples",
                           "{\"auction\":1,\"price\":10,\"ts\":1}\n{\"auction\":2,\"price\":\"high\",\"ts\":2}\n",
                           kPublisherToken, "application/x-ndjson");
  expect_problem(r, 400, "nothing was stored");
  auto d = parse(r.body);
  ASSERT_TRUE(d.HasMember("errors"));
  EXPECT_EQ(d["errors"][0]["row"].GetUint(), 1u);
  EXPECT_STREQ(d["errors"][0]["field"].GetString(), "price");

  // Unknown field, missing field, broken JSON line.
  expect_problem(broker_.request("POST", "/v1/streams/bids/tuples", R"([{"auction":1,"prise":1,"ts":1}])",
                                 kPublisherToken),
                 400, "prise");
  expect_problem(broker_.request("POST", "/v1/streams/bids/tuples", "{\"auction\":1,\n", kPublisherToken,
                                 "application/x-ndjson"),
                 400, "invalid JSON");
  // Nothing of the rejected batches was stored.
  auto s = parse(broker_.request("GET", "/v1/streams/bids", "", kReaderToken).body);
  EXPECT_EQ(s["next_seq"].GetUint64(), 1u);
}

TEST_F(BrokerApi, WrongRequestsGetTheRightStatus) {
  ASSERT_EQ(broker_.request("POST", "/v1/streams", kBidsStream).status, 201u);
  expect_problem(broker_.request("GET", "/v1/nothing-here", "", kReaderToken), 404);
  auto r = broker_.request("PUT", "/v1/streams", "{}");
  expect_problem(r, 405, "not allowed");
  EXPECT_EQ(r.header("allow").value_or(""), "GET, POST");
  expect_problem(broker_.request("POST", "/v1/streams", "{\"name\":", kAdminToken), 400, "invalid JSON");
  expect_problem(broker_.request("POST", "/v1/streams", kBidsStream, kAdminToken, "text/plain"), 415);
  expect_problem(broker_.request("POST", "/v1/streams/bids/tuples", "a,b", kPublisherToken, "text/csv"), 415);
  expect_problem(broker_.request("POST", "/v1/streams/nope/tuples", "[]", kPublisherToken), 404);
  expect_problem(broker_.request("POST", "/v1/streams", R"({"name":"x","schema":[{"name":"a","type":"int64"}],"colour":1})"), 400, "colour");
  expect_problem(broker_.request("POST", "/v1/streams", R"({"name":"Bad Name","schema":[{"name":"a","type":"int64"}]})"),
                 400, "stream name");
  // An oversized body (the default limit is 16 MiB).
  std::string big(17u << 20, ' ');
  auto c = broker_.client();
  auto rr = c->request("POST", "/v1/streams/bids/tuples", big, "application/json",
                       {{"authorization", std::string("Bearer ") + kPublisherToken}});
  if (rr.ok()) {
    expect_problem(*rr, 413);
  }
  // Garbage instead of HTTP.
  auto c2 = broker_.client();
  auto raw = c2->raw("NOT HTTP AT ALL\r\n\r\n");
  if (raw.ok()) {
    EXPECT_EQ(raw->status, 400u);
  }
  // And the node keeps serving.
  EXPECT_EQ(broker_.request("GET", "/v1/health", "", "").status, 200u);
}

TEST_F(BrokerApi, QueryValidationErrorsComeAllAtOnce) {
  ASSERT_EQ(broker_.request("POST", "/v1/streams", kBidsStream).status, 201u);
  const char* bad = R"({"name":"q","inputs":[{"name":"nosuch","schema":[{"name":"a","type":"int64"}]}],
    "boxes":[{"id":"f","type":"filter","options":{"predicates":["b > 1"]}},{"id":"g","type":"nosuchbox"}],
    "arcs":[{"from":"nosuch","to":"f"}],"outputs":[{"name":"out","from":"f"}]})";
  auto r = broker_.request("POST", "/v1/queries", bad);
  expect_problem(r, 400);
  auto d = parse(r.body);
  ASSERT_TRUE(d.HasMember("errors"));
  EXPECT_GE(d["errors"].Size(), 2u) << r.body;
  for (auto& e : d["errors"].GetArray()) EXPECT_EQ(std::string(e["path"].GetString()).rfind("$", 0), 0u);
  // A valid network that reads a stream this node does not have.
  const char* missing = R"({"name":"q","inputs":[{"name":"asks","schema":[{"name":"a","type":"int64"}]}],
    "boxes":[{"id":"f","type":"filter","options":{"predicates":["a > 1"],"drop_unmatched":true}}],
    "arcs":[{"from":"asks","to":"f"}],"outputs":[{"name":"out","from":"f"}]})";
  r = broker_.request("POST", "/v1/queries", missing);
  expect_problem(r, 400);
  EXPECT_NE(r.body.find("$.inputs[0].name"), std::string::npos) << r.body;
}

const char* kExpensive = R"({"name":"expensive","inputs":[{"name":"bids","schema":[
    {"name":"auction","type":"int64"},{"name":"price","type":"int64"},{"name":"ts","type":"timestamp"}]}],
  "boxes":[{"id":"f","type":"filter","options":{"predicates":["price > 100"],"drop_unmatched":true}}],
  "arcs":[{"from":"bids","to":"f"}],"outputs":[{"name":"big_bids","from":"f"}]})";

TEST_F(BrokerApi, QueryRunsAndReportsBoxes) {
  ASSERT_EQ(broker_.request("POST", "/v1/streams", kBidsStream).status, 201u);
  auto r = broker_.request("POST", "/v1/queries", kExpensive);
  ASSERT_EQ(r.status, 201u) << r.body;
  expect_problem(broker_.request("POST", "/v1/queries", kExpensive), 409);
  std::string rows;
  for (int i = 0; i < 100; ++i)
    rows += "{\"auction\":" + std::to_string(i) + ",\"price\":" + std::to_string(i * 3) + ",\"ts\":" +
            std::to_string(1000 + i) + "}\n";
  ASSERT_EQ(broker_.request("POST", "/v1/streams/bids/tuples", rows, kPublisherToken, "application/x-ndjson").status,
            200u);
  // prices 0..297 step 3: 101..297 → i in 34..99 → 66 tuples.
  uint64_t out = 0;
  for (int i = 0; i < 200 && out != 67; ++i) {
    auto s = parse(broker_.request("GET", "/v1/streams/big_bids", "", kReaderToken).body);
    out = s["next_seq"].GetUint64();
    if (out != 67) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(out, 67u);
  auto q = parse(broker_.request("GET", "/v1/queries/expensive", "", kReaderToken).body);
  EXPECT_STREQ(q["state"].GetString(), "running");
  ASSERT_EQ(q["boxes"].Size(), 1u);
  EXPECT_EQ(q["boxes"][0]["tuples_in"].GetUint64(), 100u);
  EXPECT_EQ(q["boxes"][0]["tuples_out"].GetUint64(), 66u);
  EXPECT_STREQ(q["boxes"][0]["placement"].GetString(), "acme/n1");
  // Output streams take no tuples from publishers; inputs of a query cannot go.
  expect_problem(broker_.request("POST", "/v1/streams/big_bids/tuples", "[]", kPublisherToken), 409);
  expect_problem(broker_.request("DELETE", "/v1/streams/bids"), 409, "read by query");
  // Checkpoint on demand.
  r = broker_.request("POST", "/v1/checkpoints");
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(parse(r.body)["checkpoints"].Size(), 1u);
  r = broker_.request("GET", "/v1/checkpoints", "", kReaderToken);
  EXPECT_EQ(parse(r.body)["checkpoints"][0]["query"].GetString(), std::string("expensive"));
  // Metrics in Prometheus text.
  r = broker_.request("GET", "/metrics", "", kReaderToken);
  ASSERT_EQ(r.status, 200u);
  EXPECT_NE(r.body.find("entente_stream_tuples_total{stream=\"bids\"} 100"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("entente_box_tuples_in_total"), std::string::npos);
  EXPECT_NE(r.body.find("entente_api_requests_total"), std::string::npos);
  EXPECT_NE(r.body.find("entente_checkpoint_duration_seconds"), std::string::npos);
  // Delete the query: its output stream goes with it.
  EXPECT_EQ(broker_.request("DELETE", "/v1/queries/expensive").status, 204u);
  expect_problem(broker_.request("GET", "/v1/streams/big_bids", "", kReaderToken), 404);
  EXPECT_EQ(broker_.request("DELETE", "/v1/streams/bids").status, 204u);
}

// docs/api.md: 409 when a stream named like one of the query's outputs
// exists (it was a 400), naming the output; nothing is deployed.
TEST_F(BrokerApi, QueryOutputNamedLikeAStreamIsAConflict) {
  ASSERT_EQ(broker_.request("POST", "/v1/streams", kBidsStream).status, 201u);
  ASSERT_EQ(broker_.request("POST", "/v1/streams",
                            R"({"name":"big_bids","schema":[{"name":"a","type":"int64"}]})")
                .status,
            201u);
  auto r = broker_.request("POST", "/v1/queries", kExpensive);
  expect_problem(r, 409, "$.outputs[0].name: stream 'big_bids' exists already");
  expect_problem(broker_.request("GET", "/v1/queries/expensive", "", kReaderToken), 404);
  // An invalid network is still a 400, whatever its outputs are called.
  std::string bad = kExpensive;
  bad.replace(bad.find("price > 100"), 11, "nosuch > 1");
  expect_problem(broker_.request("POST", "/v1/queries", bad), 400);
  ASSERT_EQ(broker_.request("DELETE", "/v1/streams/big_bids").status, 204u);
  EXPECT_EQ(broker_.request("POST", "/v1/queries", kExpensive).status, 201u);
}

// One rule for `_seq` and `_time` in published rows (docs/api.md): `_seq`
// is refused; `_time` sets the event time of a stream without an event-time
// field and is refused on one with such a field. Both naming row and field.
TEST_F(BrokerApi, RowsMayNotCarrySeqNorASecondEventTime) {
  ASSERT_EQ(broker_.request("POST", "/v1/streams", kBidsStream).status, 201u);  // event_time: ts
  auto check = [&](const http::ClientResponse& r, unsigned row, const char* field) {
    expect_problem(r, 400, std::string("row ") + std::to_string(row) + ", field '" + field + "'");
    auto d = parse(r.body);
    ASSERT_TRUE(d.HasMember("errors")) << r.body;
    EXPECT_EQ(d["errors"][0]["row"].GetUint(), row) << r.body;
    EXPECT_STREQ(d["errors"][0]["field"].GetString(), field) << r.body;
  };
  check(broker_.request("POST", "/v1/streams/bids/tuples",
                        R"([{"auction":1,"price":1,"ts":1},{"auction":2,"price":2,"ts":2,"_seq":99}])",
                        kPublisherToken),
        1, "_seq");
  check(broker_.request("POST", "/v1/streams/bids/tuples", "{\"_seq\":1,\"auction\":1,\"price\":1,\"ts\":1}\n",
                        kPublisherToken, "application/x-ndjson"),
        0, "_seq");
  check(broker_.request("POST", "/v1/streams/bids/tuples", R"([{"auction":1,"price":1,"ts":1,"_time":5}])",
                        kPublisherToken),
        0, "_time");
  check(broker_.request("POST", "/v1/streams/bids/tuples",
                        "{\"auction\":1,\"price\":1,\"ts\":1}\n{\"auction\":1,\"price\":1,\"ts\":1,\"_time\":5}\n",
                        kPublisherToken, "application/x-ndjson"),
        1, "_time");
  EXPECT_EQ(parse(broker_.request("GET", "/v1/streams/bids", "", kReaderToken).body)["next_seq"].GetUint64(), 1u);

  // Without an event-time field, `_time` is the event time.
  ASSERT_EQ(broker_.request("POST", "/v1/streams", R"({"name":"notes","schema":[{"name":"a","type":"int64"}]})")
                .status,
            201u);
  auto r = broker_.request("POST", "/v1/streams/notes/tuples", "{\"a\":1,\"_time\":777}\n", kPublisherToken,
                           "application/x-ndjson");
  ASSERT_EQ(r.status, 200u) << r.body;
}

TEST_F(BrokerApi, CurlSmoke) {
  std::string out;
  const std::string base = "http://127.0.0.1:" + std::to_string(broker_.port());
  ASSERT_EQ(run_command("curl -sS -f " + base + "/v1/health", out), 0) << out;
  EXPECT_NE(out.find("\"status\":\"ok\""), std::string::npos);
  const std::string auth = std::string(" -H 'Authorization: Bearer ") + kAdminToken + "'";
  ASSERT_EQ(run_command("curl -sS -f -X POST" + auth + " -H 'Content-Type: application/json' --data '" +
                            std::string(kBidsStream) + "' " + base + "/v1/streams",
                        out),
            0)
      << out;
  ASSERT_EQ(run_command("printf '{\"auction\":7,\"price\":70,\"ts\":5}\\n' | curl -sS -f -X POST" + auth +
                            " -H 'Content-Type: application/x-ndjson' --data-binary @- " + base +
                            "/v1/streams/bids/tuples",
                        out),
            0)
      << out;
  EXPECT_NE(out.find("\"count\":1"), std::string::npos) << out;
  ASSERT_EQ(run_command("curl -sS -o /dev/null -w '%{http_code}' " + base + "/v1/streams", out), 0);
  EXPECT_EQ(out, "401");
  ASSERT_EQ(run_command("curl -sS -f " + base + "/v1/openapi.json", out), 0);
  EXPECT_NE(out.find("\"openapi\""), std::string::npos);
}

}  // namespace
}  // namespace entente::testing
