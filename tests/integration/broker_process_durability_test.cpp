// ingest_durability "process" on a real broker process: the group commit
// does not fsync, yet a SIGKILL (the broker crashing) loses nothing that was
// acknowledged, because the ack waits for RocksDB's WAL write, which is in
// the kernel's page cache when the process dies. Each acknowledged tuple is
// in the stream exactly once and in publication order, with contiguous
// sequence numbers: the guarantee "fsync" gives for a process crash. Query
// checkpoints and a clean shutdown keep working in this mode.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

const char* kProcessMode = "\"ingest_durability\":\"process\"";

const char* kStream =
    R"({"name":"feed","schema":[{"name":"k","type":"int64"},{"name":"payload","type":"string"}]})";

// Rows k = batch * rows .. batch * rows + rows - 1: the value says which
// batch, and which row of it, a stored tuple came from.
std::string batch_rows(int batch, int rows) {
  std::string s;
  for (int j = 0; j < rows; ++j) {
    s += "{\"k\":" + std::to_string(static_cast<int64_t>(batch) * rows + j) + ",\"payload\":\"p" +
         std::to_string(batch) + "\"}\n";
  }
  return s;
}

// One publisher, one request at a time. A batch number is never sent twice
// (not even after a failed request), so a tuple in the stream twice can only
// be the broker's doing.
struct Publisher {
  std::atomic<int> next_batch{0};
  std::atomic<int> acked_batches{0};  // in this round (reset by the caller before run())
  std::vector<int> acked;             // batch numbers acknowledged, in order (read after join)
  std::vector<uint64_t> acked_last_seq;
  void run(const BrokerProcess& b, int rows, int max_batches) {
    auto c = http::Client::connect(b.client_options());
    if (!c.ok()) return;
    while (next_batch < max_batches) {
      const int batch = next_batch++;
      auto r = (*c)->request("POST", "/v1/streams/feed/tuples", batch_rows(batch, rows), "application/x-ndjson",
                             {{"authorization", std::string("Bearer ") + kPublisherToken}});
      if (!r.ok() || r->status != 200) return;
      rapidjson::Document d;
      d.Parse(r->body.c_str());
      acked.push_back(batch);
      acked_last_seq.push_back(d["last_seq"].GetUint64());
      ++acked_batches;
    }
  }
};

int64_t k_of(const Tuple& t) {
  rapidjson::Document d;
  d.Parse(t.line.c_str());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("k") || !d["k"].IsInt64()) return -1;
  return d["k"].GetInt64();
}

std::string metrics(const BrokerProcess& b) { return b.request("GET", "/metrics", "", kReaderToken).body; }

TEST(BrokerProcessDurability, ReportsItsModeInTheMetrics) {
  BrokerProcess a(with_config(kProcessMode));
  ASSERT_TRUE(a.start()) << a.last_error();
  EXPECT_NE(metrics(a).find("entente_ingest_durability{mode=\"process\"} 1"), std::string::npos) << metrics(a);
  BrokerProcess b;
  ASSERT_TRUE(b.start()) << b.last_error();
  EXPECT_NE(metrics(b).find("entente_ingest_durability{mode=\"fsync\"} 1"), std::string::npos) << metrics(b);
}

TEST(BrokerProcessDurability, AcknowledgedTuplesSurviveSigkillOnceAndInOrder) {
  BrokerProcess a(with_config(kProcessMode));
  ASSERT_TRUE(a.start()) << a.last_error();
  ASSERT_EQ(a.request("POST", "/v1/streams", kStream).status, 201u);

  constexpr int kRows = 40;
  constexpr int kUnbounded = 1 << 30;
  Publisher pub;
  for (int round = 0; round < 3; ++round) {
    pub.acked_batches = 0;
    std::thread t([&] { pub.run(a, kRows, kUnbounded); });
    // Kill only once tuples are flowing, so that the kill lands mid-feed.
    for (int i = 0; i < 500 && pub.acked_batches < 5 + 5 * round; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    a.kill();
    t.join();
    EXPECT_GE(pub.acked_batches.load(), 5 + 5 * round) << "round " << round;
    EXPECT_LT(pub.next_batch.load(), kUnbounded) << "round " << round;
    ASSERT_TRUE(a.start()) << a.last_error();
    ASSERT_FALSE(pub.acked_last_seq.empty());
    // Everything acknowledged so far is there after the restart.
    EXPECT_GE(next_seq(a, "feed"), pub.acked_last_seq.back() + 1) << "round " << round;
  }
  // A clean stop in this mode syncs and exits 0; what was stored stays.
  const uint64_t before_term = next_seq(a, "feed");
  EXPECT_EQ(a.terminate(), 0) << a.stderr_text();
  ASSERT_TRUE(a.start()) << a.last_error();
  EXPECT_EQ(next_seq(a, "feed"), before_term);

  const uint64_t next = next_seq(a, "feed");
  ASSERT_GT(next, 1u);
  auto stored = read_stream(a, "feed", 1, next - 1);
  ASSERT_TRUE(stored.error.empty()) << stored.error;
  ASSERT_EQ(stored.tuples.size(), next - 1);
  // Contiguous sequence numbers; k strictly increasing, so no tuple is there
  // twice and none is out of publication order. Whole batches only: a batch
  // is one atomic write.
  std::vector<int> stored_batches;
  int64_t previous_k = -1;
  for (size_t i = 0; i < stored.tuples.size(); ++i) {
    ASSERT_EQ(stored.tuples[i].seq, i + 1);
    const int64_t k = k_of(stored.tuples[i]);
    ASSERT_GT(k, previous_k) << "seq " << i + 1 << ": " << stored.tuples[i].line;
    if (k % kRows == 0) stored_batches.push_back(static_cast<int>(k / kRows));
    else ASSERT_EQ(k, previous_k + 1) << "a batch was split: seq " << i + 1;
    previous_k = k;
  }
  ASSERT_EQ(stored.tuples.size() % kRows, 0u);
  // Every acknowledged batch is stored, at the sequence numbers its ack gave.
  size_t s = 0;
  for (size_t i = 0; i < pub.acked.size(); ++i) {
    while (s < stored_batches.size() && stored_batches[s] < pub.acked[i]) ++s;
    ASSERT_LT(s, stored_batches.size()) << "acknowledged batch " << pub.acked[i] << " is missing";
    ASSERT_EQ(stored_batches[s], pub.acked[i]) << "acknowledged batch " << pub.acked[i] << " is missing";
    EXPECT_EQ(static_cast<uint64_t>(s + 1) * kRows, pub.acked_last_seq[i]) << "batch " << pub.acked[i];
  }
  // Unacknowledged batches (in flight at a kill) may or may not be stored,
  // but nothing beyond what was sent.
  EXPECT_LT(stored_batches.back(), pub.next_batch.load());
}

// Checkpoints are written through the same (unsynced) group commit; the node
// syncs them separately. After a SIGKILL the query resumes from one.
TEST(BrokerProcessDurability, QueryCheckpointSurvivesSigkill) {
  BrokerProcess a(with_config(std::string(kProcessMode) + ",\"checkpoint_interval\":\"1h\""));
  ASSERT_TRUE(a.start()) << a.last_error();
  ASSERT_EQ(a.request("POST", "/v1/streams", kStream).status, 201u);
  const char* query = R"({"name":"copy","inputs":[{"name":"feed","schema":[
      {"name":"k","type":"int64"},{"name":"payload","type":"string"}]}],
    "boxes":[{"id":"f","type":"filter","options":{"predicates":["k >= 0"]}}],
    "arcs":[{"from":"feed","to":"f"}],"outputs":[{"name":"copied","from":"f"}]})";
  auto deployed = a.request("POST", "/v1/queries", query);
  ASSERT_EQ(deployed.status, 201u) << deployed.body;
  for (int i = 0; i < 5; ++i)
    ASSERT_EQ(a.request("POST", "/v1/streams/feed/tuples", batch_rows(i, 20), kPublisherToken, "application/x-ndjson")
                  .status,
              200u);
  // Wait for the query to consume all 100 tuples, then checkpoint.
  bool caught_up = false;
  for (int i = 0; i < 500 && !caught_up; ++i) {
    rapidjson::Document d;
    d.Parse(a.request("GET", "/v1/queries/copy", "", kReaderToken).body.c_str());
    caught_up = !d.HasParseError() && d.IsObject() && d["positions"]["feed"].GetUint64() == 101;
    if (!caught_up) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(caught_up);
  auto cp = a.request("POST", "/v1/checkpoints");
  ASSERT_EQ(cp.status, 200u) << cp.body;
  a.kill();
  ASSERT_TRUE(a.start()) << a.last_error();
  rapidjson::Document d;
  auto r = a.request("GET", "/v1/queries/copy", "", kReaderToken);
  d.Parse(r.body.c_str());
  ASSERT_TRUE(d.IsObject()) << r.body;
  ASSERT_TRUE(d["checkpoint"].IsObject()) << r.body;
  EXPECT_EQ(d["positions"]["feed"].GetUint64(), 101u) << r.body;
  EXPECT_NE(r.body.find("\"state\":\"running\""), std::string::npos) << r.body;
  // The output has each input tuple once.
  auto out = read_stream(a, "copied", 1, 100);
  ASSERT_TRUE(out.error.empty()) << out.error;
  ASSERT_EQ(out.tuples.size(), 100u);
  for (size_t i = 0; i < out.tuples.size(); ++i) EXPECT_EQ(k_of(out.tuples[i]), static_cast<int64_t>(i));
  EXPECT_EQ(next_seq(a, "copied"), 101u);
}

}  // namespace
}  // namespace entente::testing
