// Kill -9 and restart of each node of a three-node domain in turn, while a
// producer publishes through whichever node is up (docs/cluster.md): the
// stream and its query live on n1, the producer names its batches and
// resends a batch through another node when the one it used did not answer.
// A checker then reads the query's output through a third node and counts
// every tuple: none lost, none twice, sequence numbers 1..N without a gap.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/cluster.h"
#include "tests/integration/support/ws_reader.h"
#include "tests/support/etcd_process.h"

namespace entente::testing {
namespace {

constexpr int kBatches = 240;
constexpr int kRowsPerBatch = 25;

class ClusterFaults : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
    etcd_ = std::make_unique<EtcdProcess>("etcd-faults");
    ASSERT_TRUE(etcd_->start()) << etcd_->last_error();
    for (const char* name : {"n1", "n2", "n3"}) {
      BrokerOptions o;
      o.node = name;
      o.extra_config = R"("checkpoint_interval": "100ms", )" + cluster_section(*etcd_);
      nodes_.push_back(std::make_unique<BrokerProcess>(o));
    }
    for (auto& n : nodes_) ASSERT_TRUE(n->start()) << n->last_error();
    ASSERT_TRUE(eventually(20, [&] { return all_listed(); }));
  }

  // Every running node lists all three, the running ones up.
  bool all_listed() {
    for (auto& n : nodes_) {
      if (n->pid() <= 0) continue;
      auto r = n->try_request("GET", "/v1/nodes", {}, kReaderToken);
      if (!r.ok() || r->status != 200) return false;
      rapidjson::Document d;
      d.Parse(r->body.c_str());
      if (!d.IsObject() || d["nodes"].Size() != 3) return false;
      for (const auto& m : d["nodes"].GetArray()) {
        const bool running = nodes_.at(static_cast<size_t>(m["node"].GetString()[1] - '1'))->pid() > 0;
        if (running != (std::string(m["state"].GetString()) == "up")) return false;
      }
    }
    return true;
  }

  // Sends batch `b` (producer "p", number b) through the running nodes in
  // turn, starting at `start`, until one answers 200 (post_through_any).
  void publish(int b, size_t start) {
    const std::string body = auction_batch(b, kRowsPerBatch);
    std::vector<const BrokerProcess*> all;
    for (auto& n : nodes_) all.push_back(n.get());
    const std::string problem =
        post_through_any(all, start, "/v1/streams/bids/tuples?producer_id=p&producer_seq=" + std::to_string(b), body);
    if (!problem.empty()) FAIL() << "batch " << b << ": " << problem;
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<std::unique_ptr<BrokerProcess>> nodes_;
};

TEST_F(ClusterFaults, KillNineOfEachNodeInTurnLosesAndDuplicatesNothing) {
  const char* schema = R"([{"name":"auction","type":"int64"},{"name":"price","type":"int64"}])";
  auto created = nodes_[1]->request("POST", "/v1/streams",
                                    R"({"name":"bids","node":"n1","schema":)" + std::string(schema) + "}");
  ASSERT_EQ(created.status, 201u) << created.body;
  // A query on n1 that keeps every row (price >= 0) and maps it.
  const std::string query =
      R"({"name":"all-bids","inputs":[{"name":"bids","schema":)" + std::string(schema) +
      R"(}],"boxes":[{"id":"keep","type":"filter","options":{"predicates":["price >= 0"],"drop_unmatched":true}},)"
      R"({"id":"cents","type":"map","options":{"fields":[{"name":"auction","expr":"auction"},)"
      R"({"name":"cents","expr":"price * 100"}]}}],"arcs":[{"from":"bids","to":"keep"},{"from":"keep","to":"cents"}],)"
      R"("outputs":[{"name":"bids-cents","from":"cents"}],"placement":{"node":"n1"}})";
  auto deployed = nodes_[2]->request("POST", "/v1/queries", query);
  ASSERT_EQ(deployed.status, 201u) << deployed.body;

  // Kill -9 of n2 at batch 40 (back at 70), n3 at 100 (back at 130), n1 —
  // the stream's leader and the query's node — at 160 (back at once: the
  // batches meanwhile are answered 502 through the others and resent).
  for (int b = 1; b <= kBatches; ++b) {
    if (b == 40) nodes_[1]->kill();
    if (b == 70) {
      ASSERT_TRUE(nodes_[1]->start()) << nodes_[1]->last_error();
    }
    if (b == 100) nodes_[2]->kill();
    if (b == 130) {
      ASSERT_TRUE(nodes_[2]->start()) << nodes_[2]->last_error();
    }
    if (b == 160) {
      nodes_[0]->kill();
      // Through n2 while n1 is down: the leader cannot be reached (502).
      auto r = nodes_[1]->try_request("POST", "/v1/streams/bids/tuples?producer_id=p&producer_seq=160",
                                      R"([{"auction":160000,"price":0}])", kPublisherToken);
      ASSERT_TRUE(r.ok()) << r.error().message;
      EXPECT_EQ(r->status, 502u) << r->body;
      ASSERT_TRUE(nodes_[0]->start()) << nodes_[0]->last_error();
    }
    publish(b, static_cast<size_t>(b));
    if (HasFatalFailure()) return;
  }
  ASSERT_TRUE(eventually(20, [&] { return all_listed(); }));

  // The checker: the query's output through n3, every tuple once.
  const uint64_t total = static_cast<uint64_t>(kBatches) * kRowsPerBatch;
  ReadResult got = read_stream(*nodes_[2], "bids-cents", 1, total, 60'000);
  ASSERT_EQ(got.tuples.size(), total) << got.error << " " << got.close_reason;
  std::map<int64_t, int> seen;
  for (size_t i = 0; i < got.tuples.size(); ++i) {
    EXPECT_EQ(got.tuples[i].seq, i + 1) << "a gap or a repeat in the output's numbering";
    rapidjson::Document d;
    d.Parse(got.tuples[i].line.c_str());
    ASSERT_TRUE(d.IsObject()) << got.tuples[i].line;
    seen[d["auction"].GetInt64()]++;
  }
  ASSERT_EQ(seen.size(), total) << "some tuple is missing or came twice";
  for (int b = 1; b <= kBatches; ++b) {
    for (int k = 0; k < kRowsPerBatch; ++k) ASSERT_EQ(seen[b * 1000 + k], 1) << "batch " << b << " row " << k;
  }
  // And nothing more is coming: the input holds exactly what was published.
  auto info = nodes_[2]->request("GET", "/v1/streams/bids", {}, kReaderToken);
  rapidjson::Document d;
  d.Parse(info.body.c_str());
  ASSERT_TRUE(d.IsObject()) << info.body;
  EXPECT_EQ(d["next_seq"].GetUint64(), total + 1) << info.body;
}

}  // namespace
}  // namespace entente::testing
