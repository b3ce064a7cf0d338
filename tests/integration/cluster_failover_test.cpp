// Failover of a stream's leader in a domain of three nodes (docs/cluster.md,
// "Failover"): the leader of a stream with two followers is killed with
// SIGKILL, or stopped (SIGSTOP) for longer than its lease, while a
// publisher appends through every node in turn. The controller makes an
// in-sync follower the leader (epoch 2), which goes on from the last
// sequence number it holds; the old leader, when it comes back, discards its
// log and copies the stream again as a follower. The checker reads the new
// leader's log at the end: every acknowledged batch is there exactly once,
// in the order of the acknowledgements, with no gap in the sequence numbers.
// Real processes: one etcd, three brokers with certificates from `entente
// certs`, leases of 2 s.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/domain.h"
#include "tests/integration/support/ws_reader.h"
#include "tests/support/sigstop.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kRowsPerBatch = 20;
const char* kSchema = R"([{"name":"auction","type":"int64"},{"name":"price","type":"int64"}])";

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  return d;
}

std::string batch_body(int b) { return auction_batch(b, kRowsPerBatch); }

// What GET /v1/streams/{name} says through a node (forwarded to the leader).
struct Leadership {
  std::string node;
  uint64_t epoch = 0;
  std::map<std::string, bool> in_sync;    // follower -> in the set
  std::map<std::string, bool> connected;  // follower -> its copy open at the leader
};

class ClusterFailover : public ThreeNodeDomain {
 protected:
  ClusterFailover() : ThreeNodeDomain("etcd-failover") {}

  Leadership leadership(int via, const std::string& stream) {
    Leadership l;
    if (nodes_[static_cast<size_t>(via - 1)]->process().pid() <= 0) return l;
    auto r = node(via).try_request("GET", "/v1/streams/" + stream, {}, kReaderToken);
    if (!r.ok() || r->status != 200) return l;
    auto d = parse(r->body);
    if (!d.IsObject() || !d.HasMember("replication")) return l;
    l.node = d["node"].GetString();
    l.epoch = d["replication"]["epoch"].GetUint64();
    for (const auto& x : d["replication"]["replicas"].GetArray()) {
      l.in_sync[x["node"].GetString()] = x["in_sync"].GetBool();
      l.connected[x["node"].GetString()] = x["connected"].GetBool();
    }
    return l;
  }

  void create_bids() {
    auto created = node(2).request("POST", "/v1/streams",
                                   R"({"name":"bids","schema":)" + std::string(kSchema) +
                                       R"(,"node":"n1","replication":3})");
    ASSERT_EQ(created.status, 201u) << created.body;
    ASSERT_TRUE(eventually(20.0, [&] {
      auto l = leadership(1, "bids");
      return l.in_sync["n2"] && l.in_sync["n3"] && l.connected["n2"] && l.connected["n3"];
    })) << node(1).request("GET", "/v1/streams/bids", {}, kReaderToken).body;
  }

  // Batch b under producer "p", through the running nodes in turn (not
  // through `stopped`, which would not answer).
  void publish(int b, int stopped = 0) {
    std::vector<const BrokerProcess*> via;
    for (int i = 1; i <= 3; ++i)
      if (i != stopped) via.push_back(&node(i));
    const std::string problem = post_through_any(
        via, static_cast<size_t>(b), "/v1/streams/bids/tuples?producer_id=p&producer_seq=" + std::to_string(b),
        batch_body(b));
    if (!problem.empty()) FAIL() << "batch " << b << ": " << problem;
  }

  // The checker: `acked` batches, in the order acknowledged, each exactly
  // once in the leader's log, which has no gap; no other tuple there.
  void check_log(int via, const std::vector<int>& acked) {
    const uint64_t total = static_cast<uint64_t>(acked.size()) * kRowsPerBatch;
    const ReadResult got = read_stream(node(via), "bids", 1, total, 60'000);
    ASSERT_EQ(got.tuples.size(), total) << got.error;
    std::vector<int64_t> want;
    for (int b : acked)
      for (int k = 0; k < kRowsPerBatch; ++k) want.push_back(int64_t{b} * 1000 + k);
    for (uint64_t i = 0; i < total; ++i) {
      ASSERT_EQ(got.tuples[i].seq, i + 1);
      ASSERT_EQ(parse(got.tuples[i].line)["auction"].GetInt64(), want[i]) << "row " << i;
    }
    EXPECT_EQ(next_seq(node(via), "bids"), total + 1) << "the log holds more than was acknowledged";
  }
};

TEST_F(ClusterFailover, AKilledLeaderIsReplacedByAnInSyncFollowerThatHoldsEveryAcknowledgedTuple) {
  create_bids();
  std::vector<int> acked;
  for (int b = 1; b <= 90; ++b) {
    if (b == 31) nodes_[0]->process().kill();  // the leader, for good (until b 61)
    if (b == 61) {
      ASSERT_TRUE(nodes_[0]->start()) << nodes_[0]->last_error();
    }
    publish(b);
    if (HasFatalFailure()) return;
    acked.push_back(b);
  }
  Leadership l;
  ASSERT_TRUE(eventually(20.0, [&] {
    l = leadership(2, "bids");
    return !l.node.empty() && l.node != "n1";
  }));
  EXPECT_EQ(l.epoch, 2u);
  const int leader = l.node == "n2" ? 2 : 3, other = 5 - leader;
  // The old leader copies the stream again, and with the other follower
  // joins the in-sync set once it holds all of it.
  ASSERT_TRUE(eventually(30.0, [&] {
    l = leadership(leader, "bids");
    return l.in_sync["n1"] && l.in_sync["n" + std::to_string(other)];
  })) << node(leader).request("GET", "/v1/streams/bids", {}, kReaderToken).body;
  check_log(leader, acked);
  if (HasFatalFailure()) return;
  // Its copy, row for row, under the new leader's name.
  const uint64_t total = acked.size() * kRowsPerBatch;
  const ReadResult want = read_stream(node(leader), "bids", 1, total, 60'000);
  const ReadResult copy = read_stream(node(1), "%40n" + std::to_string(leader) + "%2Fbids", 1, total, 60'000);
  ASSERT_EQ(copy.tuples.size(), total) << copy.error;
  for (uint64_t i = 0; i < total; ++i) ASSERT_EQ(copy.tuples[i].line, want.tuples[i].line) << "row " << i;
  auto metrics = node(2).request("GET", "/metrics", {}, kReaderToken).body +
                 node(3).request("GET", "/metrics", {}, kReaderToken).body;
  EXPECT_NE(metrics.find(R"(entente_stream_failovers_total{stream="bids"} 1)"), std::string::npos);
}

TEST_F(ClusterFailover, ALeaderStoppedPastItsLeaseAcknowledgesNothingWhenItWakes) {
  create_bids();
  std::vector<int> acked;
  for (int b = 1; b <= 20; ++b) {
    publish(b);
    if (HasFatalFailure()) return;
    acked.push_back(b);
  }
  const pid_t leader = nodes_[0]->process().pid();
  ASSERT_TRUE(stop_and_wait(leader));
  // Sent to the stopped leader itself: read only when it wakes, after the
  // failover, when it must not be acknowledged unless the new leader has it.
  auto stale = std::async(std::launch::async, [&] {
    return node(1).try_request("POST", "/v1/streams/bids/tuples?producer_id=q&producer_seq=1", batch_body(500),
                               kPublisherToken);
  });
  Leadership l;
  ASSERT_TRUE(eventually(30.0, [&] {
    l = leadership(2, "bids");
    return !l.node.empty() && l.node != "n1";
  }));
  for (int b = 21; b <= 40; ++b) {
    if (b == 31) {
      ASSERT_EQ(::kill(leader, SIGCONT), 0);
    }
    publish(b, b <= 30 ? 1 : 0);
    if (HasFatalFailure()) return;
    acked.push_back(b);
  }
  auto answer = stale.get();
  const bool stale_acked = answer.ok() && answer->status == 200;
  // The old leader's log is discarded; it follows the new leader again.
  const int now = l.node == "n2" ? 2 : 3;
  ASSERT_TRUE(eventually(30.0, [&] { return leadership(now, "bids").in_sync["n1"]; }))
      << node(now).request("GET", "/v1/streams/bids", {}, kReaderToken).body;
  // The batch sent to the stopped leader was acknowledged only if it is in
  // the new leader's log; unacknowledged (its answer lost), it may be there
  // or not (the old leader, awake, forwards it), but at most once.
  const uint64_t total = next_seq(node(now), "bids") - 1;
  ASSERT_GE(total, acked.size() * kRowsPerBatch);
  const ReadResult got = read_stream(node(now), "bids", 1, total, 60'000);
  ASSERT_EQ(got.tuples.size(), total) << got.error;
  std::multiset<int64_t> seen;
  for (const auto& t : got.tuples) seen.insert(parse(t.line)["auction"].GetInt64());
  for (int b : acked)
    EXPECT_EQ(seen.count(int64_t{b} * 1000), 1u) << "acknowledged batch " << b << " is missing or twice";
  EXPECT_EQ(seen.count(500'000), stale_acked ? 1u : seen.count(500'000))
      << "the stopped leader's answer: " << (answer.ok() ? std::to_string(answer->status) + " " + answer->body
                                                          : answer.error().message);
  EXPECT_LE(seen.count(500'000), 1u);
  EXPECT_EQ(total, (acked.size() + seen.count(500'000)) * kRowsPerBatch) << "a tuple no one sent is in the log";
}

}  // namespace
}  // namespace entente::testing
