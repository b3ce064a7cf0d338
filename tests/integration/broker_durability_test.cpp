// Durability of a real broker process: tuples acknowledged before a SIGKILL
// are there after the restart; the catalog comes back; a stateful query
// resumes from its checkpoint and the log, so its output stream continues
// with no gap and no duplicate (compared with an uninterrupted run); SIGTERM
// drains, checkpoints and exits 0.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "broker/config.h"
#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

const char* kStream =
    R"({"name":"bids","schema":[{"name":"auction","type":"int64"},{"name":"price","type":"int64"},)"
    R"({"name":"ts","type":"timestamp"}],"event_time":"ts"})";

// Counts and sums bids per auction in 200 ms event-time windows: stateful,
// so a restart that lost or repeated anything would show in its output.
const char* kQuery = R"({"name":"per-auction","inputs":[{"name":"bids","schema":[
    {"name":"auction","type":"int64"},{"name":"price","type":"int64"},{"name":"ts","type":"timestamp"}],
    "event_time":"ts"}],
  "boxes":[{"id":"agg","type":"aggregate","options":{"group_by":["auction"],
    "window":{"type":"tumbling","size":"200ms"},
    "aggregates":[{"fn":"count","as":"bids"},{"fn":"sum","field":"price","as":"total"}]}}],
  "arcs":[{"from":"bids","to":"agg"}],"outputs":[{"name":"per_auction","from":"agg"}]})";

std::string batch_rows(int batch, int rows) {
  std::string s;
  for (int j = 0; j < rows; ++j) {
    const int i = batch * rows + j;
    s += "{\"auction\":" + std::to_string(i % 7) + ",\"price\":" + std::to_string(i % 1000) + ",\"ts\":" +
         std::to_string(10 * i) + "}\n";
  }
  return s;
}

// Publishes batches until the broker stops answering; returns the highest
// acknowledged sequence number.
struct Publisher {
  std::atomic<uint64_t> acked{0};
  std::atomic<int> next_batch{0};
  void run(const BrokerProcess& b, int rows, int max_batches) {
    auto c = http::Client::connect(b.client_options());
    if (!c.ok()) return;
    while (next_batch < max_batches) {
      auto r = (*c)->request("POST", "/v1/streams/bids/tuples", batch_rows(next_batch, rows), "application/x-ndjson",
                             {{"authorization", std::string("Bearer ") + kPublisherToken}});
      if (!r.ok() || r->status != 200) return;
      rapidjson::Document d;
      d.Parse(r->body.c_str());
      acked = d["last_seq"].GetUint64();
      ++next_batch;
    }
  }
};

// Waits until the query has consumed its input up to `input_next`, then
// takes a checkpoint: it is written after every output the query produced
// before it, so once it is durable the output stream's head is final.
uint64_t wait_caught_up(const BrokerProcess& b, const std::string& query, uint64_t input_next) {
  for (int i = 0; i < 500; ++i) {
    auto r = b.request("GET", "/v1/queries/" + query, "", kReaderToken);
    rapidjson::Document d;
    d.Parse(r.body.c_str());
    if (!d.HasParseError() && d.IsObject() && d["positions"]["bids"].GetUint64() == input_next) {
      if (b.request("POST", "/v1/checkpoints").status != 200) return 0;
      return d["positions"]["bids"].GetUint64();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}

TEST(BrokerDurability, AcknowledgedTuplesSurviveSigkillAndQueryOutputHasNoGapNoDuplicate) {
  BrokerProcess a(with_config("\"checkpoint_interval\":\"100ms\""));
  ASSERT_TRUE(a.start()) << a.last_error();
  ASSERT_EQ(a.request("POST", "/v1/streams", kStream).status, 201u);
  ASSERT_EQ(a.request("POST", "/v1/queries", kQuery).status, 201u) << a.stderr_text();

  Publisher pub;
  constexpr int kRows = 50;
  // Kill rounds publish until the node dies under them.
  constexpr int kUnbounded = 1 << 30;
  uint64_t previous = 0;
  for (int round = 0; round < 3; ++round) {
    std::thread t([&] { pub.run(a, kRows, kUnbounded); });
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + 100 * round));
    a.kill();  // in the middle of publishing
    t.join();
    const uint64_t acked = pub.acked;
    // The kill came while tuples were flowing, not before or after.
    EXPECT_GT(acked, previous) << "round " << round;
    EXPECT_LT(pub.next_batch.load(), kUnbounded) << "round " << round;
    previous = acked;
    ASSERT_TRUE(a.start()) << a.last_error();
    // Everything acknowledged is there; the catalog and the query are back.
    EXPECT_GE(next_seq(a, "bids"), acked + 1) << "round " << round;
    auto q = a.request("GET", "/v1/queries/per-auction", "", kReaderToken);
    ASSERT_EQ(q.status, 200u) << a.stderr_text();
    EXPECT_NE(q.body.find("\"state\":\"running\""), std::string::npos) << q.body;
  }
  // Finish the feed (the last batch pushes the watermark past every window).
  const int total = pub.next_batch + 40;
  pub.run(a, kRows, total);
  ASSERT_EQ(pub.next_batch.load(), total);
  const uint64_t in_next = next_seq(a, "bids");
  ASSERT_EQ(wait_caught_up(a, "per-auction", in_next), in_next);

  // The input log: contiguous sequence numbers, in records as ingested.
  auto input = read_stream(a, "bids", 1, in_next - 1);
  ASSERT_TRUE(input.error.empty()) << input.error;
  ASSERT_EQ(input.tuples.size(), in_next - 1);
  for (size_t i = 0; i < input.tuples.size(); ++i) ASSERT_EQ(input.tuples[i].seq, i + 1);

  const uint64_t out_next = next_seq(a, "per_auction");
  ASSERT_GT(out_next, 1u);
  auto output = read_stream(a, "per_auction", 1, out_next - 1);
  ASSERT_EQ(output.tuples.size(), out_next - 1);

  // The same input, record for record, through an uninterrupted broker.
  BrokerProcess b;
  ASSERT_TRUE(b.start()) << b.last_error();
  ASSERT_EQ(b.request("POST", "/v1/streams", kStream).status, 201u);
  ASSERT_EQ(b.request("POST", "/v1/queries", kQuery).status, 201u);
  for (auto& frame : input.frames) {
    std::string rows;
    // A subscriber's line without the `_seq` and `_time` it starts with: a
    // publisher may send neither here (the node numbers tuples, and `ts` is
    // the event time).
    for (auto& t : frame) {
      const size_t fields = t.line.find(',', t.line.find("\"_time\":"));
      ASSERT_NE(fields, std::string::npos) << t.line;
      rows += "{" + t.line.substr(fields + 1) + "\n";
    }
    ASSERT_EQ(b.request("POST", "/v1/streams/bids/tuples", rows, kPublisherToken, "application/x-ndjson").status, 200u);
  }
  ASSERT_EQ(wait_caught_up(b, "per-auction", in_next), in_next);
  const uint64_t ref_next = next_seq(b, "per_auction");
  auto reference = read_stream(b, "per_auction", 1, ref_next - 1);
  ASSERT_EQ(output.tuples.size(), reference.tuples.size()) << "outputs " << out_next - 1 << ", reference " << ref_next - 1;
  for (size_t i = 0; i < output.tuples.size(); ++i) ASSERT_EQ(output.tuples[i].line, reference.tuples[i].line) << i;
}

TEST(BrokerDurability, SigtermDrainsCheckpointsAndExitsZero) {
  BrokerProcess a(with_config("\"checkpoint_interval\":\"1h\""));
  ASSERT_TRUE(a.start()) << a.last_error();
  ASSERT_EQ(a.request("POST", "/v1/streams", kStream).status, 201u);
  ASSERT_EQ(a.request("POST", "/v1/queries", kQuery).status, 201u);
  for (int i = 0; i < 10; ++i)
    ASSERT_EQ(a.request("POST", "/v1/streams/bids/tuples", batch_rows(i, 100), kPublisherToken, "application/x-ndjson")
                  .status,
              200u);
  EXPECT_EQ(a.terminate(), 0) << a.stderr_text();
  // The final checkpoint covers all 1000 input tuples: nothing to replay.
  ASSERT_TRUE(a.start()) << a.last_error();
  auto r = a.request("GET", "/v1/queries/per-auction", "", kReaderToken);
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  ASSERT_TRUE(d.IsObject()) << r.body;
  ASSERT_TRUE(d["checkpoint"].IsObject()) << r.body;
  EXPECT_EQ(d["positions"]["bids"].GetUint64(), 1001u);
  EXPECT_EQ(a.terminate(), 0);
}

TEST(BrokerDurability, WrongConfigurationStopsStartupNamingTheKey) {
  std::string dir = make_temp_dir("badcfg");
  std::string cfg = dir + "/node.json";
  FILE* f = fopen(cfg.c_str(), "w");
  fputs(R"({"domain":"acme","node":"n1","api":{"listen":"127.0.0.1:0","tls":false},"data_dir":"d","tokens":[]})", f);
  fclose(f);
  std::string out;
  int rc = run_command(std::string(ENTENTE_BIN) + " broker --config " + cfg + " 2>&1", out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("tokens"), std::string::npos) << out;
  // Plain HTTP on an address other than loopback is refused, with the reason.
  f = fopen(cfg.c_str(), "w");
  fprintf(f,
          R"({"domain":"acme","node":"n1","api":{"listen":"0.0.0.0:0","tls":false},"data_dir":"d",)"
          R"("tokens":[{"name":"ops","role":"admin","sha256":"%s"}]})",
          broker::hash_token("x").c_str());
  fclose(f);
  rc = run_command(std::string(ENTENTE_BIN) + " broker --config " + cfg + " 2>&1", out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("loopback"), std::string::npos) << out;
  rc = run_command(std::string(ENTENTE_BIN) + " broker --config /nonexistent/node.json 2>&1", out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("/nonexistent/node.json"), std::string::npos) << out;
  rc = run_command(std::string(ENTENTE_BIN) + " --version", out);
  EXPECT_EQ(rc, 0);
  EXPECT_EQ(out.rfind("entente ", 0), 0u) << out;
  rc = run_command(std::string(ENTENTE_BIN) + " --help", out);
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("broker --config"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace entente::testing
