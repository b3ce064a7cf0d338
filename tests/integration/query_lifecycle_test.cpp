// A query over its lifetime, against a real broker process
// (docs/query-networks.md, "Queries over their lifetime"): where a new
// query starts ("start_from"), input schemas taken from the stream, stop and
// start (across a restart too), and replacing a query's network while the
// boxes that did not change keep their state. Outputs are checked row for
// row: against the input's own tuples, or against a reference query that
// ran the same network on the same node without interruption.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

const char* kStream =
    R"({"name":"bids","schema":[{"name":"auction","type":"int64"},{"name":"price","type":"int64"},)"
    R"({"name":"ts","type":"timestamp"}],"event_time":"ts"})";

// Rows first..last (1-based, as the tuples' sequence numbers will be):
// auction = the row's number, so an output row says which input it was.
std::string rows(int first, int last) {
  std::string s;
  for (int i = first; i <= last; ++i)
    s += "{\"auction\":" + std::to_string(i) + ",\"price\":" + std::to_string(i * 37 % 1000) + ",\"ts\":" +
         std::to_string(10 * i) + "}\n";
  return s;
}

// Publishes rows first..last, ten to a request.
void publish(const BrokerProcess& b, int first, int last) {
  for (int i = first; i <= last; i += 10) {
    auto r = b.request("POST", "/v1/streams/bids/tuples", rows(i, std::min(i + 9, last)), kPublisherToken,
                       "application/x-ndjson");
    ASSERT_EQ(r.status, 200u) << r.body;
  }
}

rapidjson::Document get_json(const BrokerProcess& b, const std::string& target) {
  auto r = b.request("GET", target, "", kReaderToken);
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  return d;
}

// Waits until every query named has consumed "bids" up to `next`, then
// checkpoints: the outputs they produced before it are then in the logs.
void wait_caught_up(const BrokerProcess& b, const std::vector<std::string>& queries, uint64_t next) {
  for (const auto& q : queries) {
    bool done = false;
    for (int i = 0; i < 500 && !done; ++i) {
      auto d = get_json(b, "/v1/queries/" + q);
      done = d.IsObject() && d["positions"]["bids"].GetUint64() == next;
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(done) << q << " did not reach " << next;
  }
  ASSERT_EQ(b.request("POST", "/v1/checkpoints").status, 200u);
}

// A pass-through query: one output row per input row, its auction kept.
std::string pass_query(const std::string& name, const std::string& extra = "") {
  return R"({"name":")" + name + R"(","inputs":[{"name":"bids"}],)" +
         R"("boxes":[{"id":"m","type":"map","options":{"fields":[{"name":"auction","expr":"auction"}]}}],)" +
         R"("arcs":[{"from":"bids","to":"m"}],"outputs":[{"name":")" + name + R"(_out","from":"m"}])" + extra + "}";
}

// The auction numbers of a stream's rows, in order.
std::vector<int64_t> auctions(const BrokerProcess& b, const std::string& stream) {
  const uint64_t next = next_seq(b, stream);
  std::vector<int64_t> out;
  if (next <= 1) return out;
  auto got = read_stream(b, stream, 1, next - 1);
  for (const auto& t : got.tuples) {
    rapidjson::Document d;
    d.Parse(t.line.c_str());
    out.push_back(d["auction"].GetInt64());
  }
  return out;
}

std::vector<int64_t> range(int64_t first, int64_t last) {
  std::vector<int64_t> v;
  for (int64_t i = first; i <= last; ++i) v.push_back(i);
  return v;
}

std::string detail_of(const http::ClientResponse& r) {
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  return d.IsObject() && d.HasMember("detail") ? d["detail"].GetString() : r.body;
}

TEST(QueryLifecycle, StartFromLatestEarliestOrASequenceNumberWithTheStreamsSchema) {
  BrokerProcess b(with_config(R"("retention_check_interval":"100ms","checkpoint_interval":"1h")"));
  ASSERT_TRUE(b.start()) << b.last_error();
  ASSERT_EQ(b.request("POST", "/v1/streams", kStream).status, 201u);
  publish(b, 1, 100);
  // No schema typed: each takes the stream's.
  ASSERT_EQ(b.request("POST", "/v1/queries", pass_query("q-latest")).status, 201u) << b.stderr_text();
  auto r = b.request("POST", "/v1/queries", pass_query("q-earliest", R"(,"start_from":"earliest")"));
  ASSERT_EQ(r.status, 201u) << r.body;
  r = b.request("POST", "/v1/queries", pass_query("q-seq", R"(,"start_from":{"bids":51})"));
  ASSERT_EQ(r.status, 201u) << r.body;
  publish(b, 101, 120);
  wait_caught_up(b, {"q-latest", "q-earliest", "q-seq"}, 121);
  EXPECT_EQ(auctions(b, "q-latest_out"), range(101, 120));  // the default: the head at deploy
  EXPECT_EQ(auctions(b, "q-earliest_out"), range(1, 120));
  EXPECT_EQ(auctions(b, "q-seq_out"), range(51, 120));

  // Refusals, each with its reason.
  r = b.request("POST", "/v1/queries", pass_query("q-bad", R"(,"start_from":{"bidz":5})"));
  EXPECT_EQ(r.status, 400u);
  EXPECT_NE(detail_of(r).find("$.start_from.bidz: no input or stream 'bidz'"), std::string::npos) << r.body;
  r = b.request("POST", "/v1/queries", pass_query("q-bad", R"(,"start_from":{"bids":500})"));
  EXPECT_EQ(r.status, 409u);
  EXPECT_NE(detail_of(r).find("500 is past the head of stream 'bids': its next tuple will be 121"), std::string::npos)
      << r.body;
  r = b.request("POST", "/v1/queries", pass_query("q-bad", R"(,"start_from":"yesterday")"));
  EXPECT_EQ(r.status, 400u);
  EXPECT_NE(detail_of(r).find("$.start_from: expected"), std::string::npos) << r.body;
  // A typed schema that is not the stream's.
  r = b.request("POST", "/v1/queries",
                R"({"name":"q-typed","inputs":[{"name":"bids","schema":[{"name":"auction","type":"int64"},)"
                R"({"name":"price","type":"double"},{"name":"ts","type":"timestamp"}]}],)"
                R"("boxes":[{"id":"m","type":"map","options":{"fields":[{"name":"a","expr":"auction"}]}}],)"
                R"("arcs":[{"from":"bids","to":"m"}],"outputs":[{"name":"typed_out","from":"m"}]})");
  EXPECT_EQ(r.status, 400u);
  EXPECT_NE(r.body.find("field 1 is 'price:double' here and 'price:int64' in the stream"), std::string::npos)
      << r.body;

  // Below what retention left: the error names the first tuple held.
  ASSERT_EQ(b.request("POST", "/v1/streams",
                      R"({"name":"short","schema":[{"name":"auction","type":"int64"}],"retention":{"max_tuples":30}})")
                .status,
            201u);
  for (int i = 0; i < 10; ++i) {
    std::string ten;
    for (int j = 1; j <= 10; ++j) ten += "{\"auction\":" + std::to_string(10 * i + j) + "}\n";
    ASSERT_EQ(b.request("POST", "/v1/streams/short/tuples", ten, kPublisherToken, "application/x-ndjson").status,
              200u);
  }
  // Retention trims whole records, oldest first, down to 30 tuples.
  uint64_t first = 1;
  for (int i = 0; i < 200 && 101 - first > 30; ++i) {
    first = get_json(b, "/v1/streams/short")["first_seq"].GetUint64();
    if (101 - first > 30) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_LE(101 - first, 30u);
  const std::string short_query = R"({"name":"q-short","inputs":[{"name":"short"}],)"
                                  R"("boxes":[{"id":"m","type":"map","options":{"fields":[{"name":"auction",)"
                                  R"("expr":"auction"}]}}],"arcs":[{"from":"short","to":"m"}],)"
                                  R"("outputs":[{"name":"short_out","from":"m"}],"start_from":{"short":)";
  r = b.request("POST", "/v1/queries", short_query + std::to_string(first - 1) + "}}");
  EXPECT_EQ(r.status, 409u);
  EXPECT_NE(detail_of(r).find("tuple " + std::to_string(first - 1) + " is no longer in stream 'short': the first "
                              "it holds is " + std::to_string(first)),
            std::string::npos)
      << r.body;
  r = b.request("POST", "/v1/queries", short_query + std::to_string(first) + "}}");
  ASSERT_EQ(r.status, 201u) << r.body;
  for (int i = 0; i < 500 && next_seq(b, "short_out") < 101 - first + 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(auctions(b, "short_out"), range(static_cast<int64_t>(first), 100));
}

// Counts bids per auction group in 200 ms event-time windows: stateful, so
// anything lost or repeated across a stop, a restart or a replacement
// shows in its output.
std::string count_query(const std::string& name, const std::string& window = "200ms") {
  return R"({"name":")" + name + R"(","inputs":[{"name":"bids","event_time":"ts"}],)" +
         R"("boxes":[{"id":"agg","type":"aggregate","options":{"group_by":["g"],)" +
         R"("window":{"type":"tumbling","size":")" + window + R"("},)" +
         R"("aggregates":[{"fn":"count","as":"bids"},{"fn":"sum","field":"price","as":"total"}]}},)" +
         R"({"id":"key","type":"map","options":{"fields":[{"name":"g","expr":"auction % 5"},)" +
         R"({"name":"price","expr":"price"}]}}],)" +
         R"("arcs":[{"from":"bids","to":"key"},{"from":"key","to":"agg"}],)" +
         R"("outputs":[{"name":")" + name + R"(_out","from":"agg"}]})";
}

// The rows of two streams are the same, line for line (after `_seq` and
// `_time`, which differ only by the streams' own numbering).
void expect_same_rows(const BrokerProcess& b, const std::string& got, const std::string& want) {
  const uint64_t n = next_seq(b, want);
  ASSERT_GT(n, 1u);
  ASSERT_EQ(next_seq(b, got), n) << got << " vs " << want;
  auto g = read_stream(b, got, 1, n - 1);
  auto w = read_stream(b, want, 1, n - 1);
  ASSERT_EQ(g.tuples.size(), w.tuples.size());
  for (size_t i = 0; i < g.tuples.size(); ++i) EXPECT_EQ(g.tuples[i].line, w.tuples[i].line) << i;
}

TEST(QueryLifecycle, StopAndStartKeepStateAcrossARestartAndLoseNothing) {
  BrokerProcess b(with_config(R"("checkpoint_interval":"1h")"));
  ASSERT_TRUE(b.start()) << b.last_error();
  ASSERT_EQ(b.request("POST", "/v1/streams", kStream).status, 201u);
  ASSERT_EQ(b.request("POST", "/v1/queries", count_query("counted")).status, 201u) << b.stderr_text();
  ASSERT_EQ(b.request("POST", "/v1/queries", count_query("reference")).status, 201u);
  publish(b, 1, 95);  // the last window is open when it stops
  wait_caught_up(b, {"counted", "reference"}, 96);

  auto r = b.request("POST", "/v1/queries/counted/stop");
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_NE(r.body.find("\"state\":\"stopped\""), std::string::npos) << r.body;
  const uint64_t out_at_stop = next_seq(b, "counted_out");
  // Stopping a stopped query changes nothing.
  r = b.request("POST", "/v1/queries/counted/stop");
  EXPECT_EQ(r.status, 200u) << r.body;
  publish(b, 96, 170);
  wait_caught_up(b, {"reference"}, 171);
  auto q = get_json(b, "/v1/queries/counted");
  EXPECT_STREQ(q["state"].GetString(), "stopped");
  EXPECT_EQ(q["positions"]["bids"].GetUint64(), 96u);
  EXPECT_EQ(next_seq(b, "counted_out"), out_at_stop);

  // Still stopped after a restart.
  EXPECT_EQ(b.terminate(), 0) << b.stderr_text();
  ASSERT_TRUE(b.start()) << b.last_error();
  q = get_json(b, "/v1/queries/counted");
  EXPECT_STREQ(q["state"].GetString(), "stopped");
  EXPECT_EQ(q["positions"]["bids"].GetUint64(), 96u);
  const std::string metrics = b.request("GET", "/metrics", "", kReaderToken).body;
  EXPECT_NE(metrics.find("entente_query_stopped{query=\"counted\"} 1"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("entente_query_running{query=\"counted\"} 0"), std::string::npos);
  publish(b, 171, 230);

  r = b.request("POST", "/v1/queries/counted/start");
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_NE(r.body.find("\"state\":\"running\""), std::string::npos) << r.body;
  EXPECT_EQ(b.request("POST", "/v1/queries/counted/start").status, 200u);  // no-op
  publish(b, 231, 300);
  wait_caught_up(b, {"counted", "reference"}, 301);
  expect_same_rows(b, "counted_out", "reference_out");

  // Stopped and started again while tuples flow in, without a restart.
  std::thread feed([&] { publish(b, 301, 400); });
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(b.request("POST", "/v1/queries/counted/stop").status, 200u);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(b.request("POST", "/v1/queries/counted/start").status, 200u);
  feed.join();
  wait_caught_up(b, {"counted", "reference"}, 401);
  expect_same_rows(b, "counted_out", "reference_out");

  // Replaced while stopped: it stays stopped, and starts where it stood.
  ASSERT_EQ(b.request("POST", "/v1/queries/counted/stop").status, 200u);
  publish(b, 401, 420);
  r = b.request("PUT", "/v1/queries/counted", count_query("counted"));
  ASSERT_EQ(r.status, 200u) << r.body;
  EXPECT_NE(r.body.find("\"state\":\"stopped\""), std::string::npos) << r.body;
  ASSERT_EQ(b.request("POST", "/v1/queries/counted/start").status, 200u);
  publish(b, 421, 480);
  wait_caught_up(b, {"counted", "reference"}, 481);
  expect_same_rows(b, "counted_out", "reference_out");

  EXPECT_EQ(b.request("POST", "/v1/queries/nope/stop").status, 404u);
  // A stopped query is deleted as any other.
  ASSERT_EQ(b.request("POST", "/v1/queries/counted/stop").status, 200u);
  EXPECT_EQ(b.request("DELETE", "/v1/queries/counted").status, 204u);
  EXPECT_EQ(b.request("GET", "/v1/queries/counted", "", kReaderToken).status, 404u);
}

// The counting query with one more branch: a filter of expensive bids into
// a new output.
std::string count_query_v2(const std::string& extra_box_options = R"({"predicates":["price > 500"]})",
                           const std::string& window = "200ms") {
  std::string q = count_query("counted", window);
  q.insert(q.find("],\"arcs\""), R"(,{"id":"dear","type":"filter","options":)" + extra_box_options + "}");
  q.insert(q.find("],\"outputs\""), R"(,{"from":"bids","to":"dear"})");
  q.insert(q.rfind("]}"), R"(,{"name":"dear_bids","from":"dear.0"})");
  return q;
}

TEST(QueryLifecycle, ReplacingTheNetworkKeepsTheStateOfUnchangedBoxes) {
  BrokerProcess b(with_config(R"("checkpoint_interval":"1h")"));
  ASSERT_TRUE(b.start()) << b.last_error();
  ASSERT_EQ(b.request("POST", "/v1/streams", kStream).status, 201u);
  ASSERT_EQ(b.request("POST", "/v1/queries", count_query("counted")).status, 201u) << b.stderr_text();
  ASSERT_EQ(b.request("POST", "/v1/queries", count_query("reference")).status, 201u);
  publish(b, 1, 95);
  wait_caught_up(b, {"counted", "reference"}, 96);

  // Replaced while tuples flow in: the aggregate keeps its open windows,
  // and its output goes on as the reference's, which was never replaced.
  std::thread feed([&] { publish(b, 96, 300); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto r = b.request("PUT", "/v1/queries/counted", count_query_v2());
  feed.join();
  ASSERT_EQ(r.status, 200u) << r.body << b.stderr_text();
  EXPECT_NE(r.body.find("\"dear_bids\""), std::string::npos) << r.body;
  // Where it stood when replaced is in the answer's positions, or before
  // them: the new runner ran a moment before it answered.
  rapidjson::Document replaced;
  replaced.Parse(r.body.c_str());
  const auto answered = static_cast<int64_t>(replaced["positions"]["bids"].GetUint64());
  // More after the replacement: the feed may have been read to its end
  // before the new network took over, which then starts at 301.
  publish(b, 301, 350);
  wait_caught_up(b, {"counted", "reference"}, 351);
  expect_same_rows(b, "counted_out", "reference_out");
  // The new branch starts where the query stood: every row from there on
  // above 500, none missing, none twice.
  std::vector<int64_t> dear;
  for (int i = 96; i <= 350; ++i)
    if (i * 37 % 1000 > 500) dear.push_back(i);
  const auto got = auctions(b, "dear_bids");
  ASSERT_FALSE(got.empty());
  auto from = std::find(dear.begin(), dear.end(), got.front());
  ASSERT_NE(from, dear.end()) << got.front();
  EXPECT_EQ(got, std::vector<int64_t>(from, dear.end()));
  if (auto at = std::lower_bound(dear.begin(), dear.end(), answered); at != dear.end()) {
    EXPECT_LE(got.front(), *at) << "answered " << answered;
  }

  // A changed aggregate cannot keep its state: refused, naming it.
  r = b.request("PUT", "/v1/queries/counted", count_query_v2(R"({"predicates":["price > 500"]})", "400ms"));
  EXPECT_EQ(r.status, 409u);
  EXPECT_NE(detail_of(r).find("box 'agg': its options changed"), std::string::npos) << r.body;
  EXPECT_NE(detail_of(r).find("drop_state"), std::string::npos) << r.body;
  // A changed filter holds no state: it just takes the new definition.
  std::string v3 = count_query_v2(R"({"predicates":["price > 900"]})");
  r = b.request("PUT", "/v1/queries/counted", v3);
  EXPECT_EQ(r.status, 200u) << r.body;
  // An output whose schema would change is refused.
  std::string bad = count_query_v2();
  const std::string dear_out = R"("from":"dear.0"})";
  bad.replace(bad.find(dear_out), dear_out.size(), R"("from":"key"},{"name":"dear2","from":"dear.0"})");
  r = b.request("PUT", "/v1/queries/counted", bad);
  EXPECT_EQ(r.status, 409u);
  EXPECT_NE(detail_of(r).find("output 'dear_bids' would change its schema"), std::string::npos) << r.body;
  // The name stays.
  std::string renamed = count_query_v2();
  renamed.replace(renamed.find("\"counted\""), 9, "\"other\"");
  r = b.request("PUT", "/v1/queries/counted", renamed);
  EXPECT_EQ(r.status, 400u);
  EXPECT_NE(r.body.find("a replacement keeps it"), std::string::npos) << r.body;
  // drop_state naming no box, start_from naming an input it reads already.
  std::string unknown = count_query_v2();
  unknown.insert(unknown.rfind('}'), R"(,"drop_state":["agg2"],"start_from":{"bids":1})");
  r = b.request("PUT", "/v1/queries/counted", unknown);
  EXPECT_EQ(r.status, 400u);
  EXPECT_NE(r.body.find("no box 'agg2' in the new network"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("it continues where it stands"), std::string::npos) << r.body;
  // drop_state names the box: it starts empty.
  v3.insert(v3.rfind('}'), R"(,"drop_state":["agg"])");
  v3.replace(v3.find("200ms"), 5, "400ms");
  r = b.request("PUT", "/v1/queries/counted", v3);
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_STREQ(get_json(b, "/v1/queries/counted")["state"].GetString(), "running");
  // Everything survives a restart: the new network from its checkpoint.
  EXPECT_EQ(b.terminate(), 0) << b.stderr_text();
  ASSERT_TRUE(b.start()) << b.last_error();
  EXPECT_STREQ(get_json(b, "/v1/queries/counted")["state"].GetString(), "running");
}

}  // namespace
}  // namespace entente::testing
