// Failover of a query's fragments (docs/cluster.md, "Failover of a query's
// fragments"): a query cut into three fragments on the three nodes of a
// domain, the last one stateful (a tumbling count per auction). Its node is
// killed with SIGKILL mid-stream and stays down: the node that followed the
// fragment's state stream and outputs takes them over and runs the fragment
// from the replicated checkpoint and journal. The same query runs whole on
// a node that is never killed: at the end the cut query's output must equal
// it row for row (values, event times, sequence numbers), with no gap and no
// repeat, and the query's entry must show the move. When the killed node
// comes back it removes its own stale run of the fragment.
// Real processes: one etcd, three brokers with certificates from `entente
// certs`, leases of 2 s.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/cut_query.h"
#include "tests/integration/support/domain.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kBatches = 120;
constexpr int kRowsPerBatch = 20;
constexpr int kAuctions = 7;
// Rows of the complete output: batch b's bids are at b * 100 ms, so the
// batches fill the 1 s windows 0 .. kBatches / 10, each with every auction
// (20 consecutive rows cover the 7), and the end marker closes them all.
constexpr uint64_t kAllRows = (kBatches / 10 + 1) * kAuctions;

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  return d;
}

// Batch b (support/cut_query.h); b = 0: the end marker.
std::string batch(int b) { return cut_bid_batch(b, kBatches, kRowsPerBatch, kAuctions); }

class ClusterFragmentFailover : public ThreeNodeDomain {
 protected:
  ClusterFragmentFailover() : ThreeNodeDomain("etcd-fragment-failover", R"("checkpoint_interval": "200ms", )") {}

  // Publishes batch b through the nodes that are up, from `start` on,
  // until one answers 200 (the producer's number makes a resend safe).
  void publish(int b, size_t start) {
    const std::string problem = post_through_any(
        processes(), start,
        "/v1/streams/bids/tuples?producer_id=p&producer_seq=" + std::to_string(b == 0 ? kBatches + 1 : b), batch(b));
    if (!problem.empty()) FAIL() << "batch " << b << ": " << problem;
  }

  // bids led by n1 with a follower; the query whole on n1 (never killed:
  // the reference) and cut over n1, n2, n3 (the stateful fragment on n3).
  void deploy() {
    auto created = node(1).request("POST", "/v1/streams",
                                   R"({"name":"bids","node":"n1","replication":2,"schema":)" + std::string(kCutBidSchema) +
                                       "}");
    ASSERT_EQ(created.status, 201u) << created.body;
    auto whole = node(1).request("POST", "/v1/queries", cut_count_query("whole", "counts-whole", R"({"node":"n1"})"));
    ASSERT_EQ(whole.status, 201u) << whole.body;
    auto cut = node(2).request(
        "POST", "/v1/queries",
        cut_count_query("cut", "counts-cut",
              R"({"fragments":[{"name":"a","node":"n1","boxes":["keep"]},{"name":"b","node":"n2","boxes":["cents"]},)"
              R"({"name":"c","node":"n3","boxes":["counts"]}]})"));
    ASSERT_EQ(cut.status, 201u) << cut.body;
  }

  // Where GET /v1/queries/cut through node `via` places fragment `name`.
  std::string fragment_node(int via, const std::string& name) {
    auto r = node(via).try_request("GET", "/v1/queries/cut", {}, kReaderToken);
    if (!r.ok() || r->status != 200) return {};
    auto d = parse(r->body);
    if (!d.IsObject() || !d.HasMember("fragments")) return {};
    for (const auto& f : d["fragments"].GetArray())
      if (name == f["name"].GetString()) return f["node"].GetString();
    return {};
  }
};

TEST_F(ClusterFragmentFailover, AStatefulFragmentRunsOnAnotherNodeWhenItsNodeDiesAndItsOutputStaysExact) {
  ASSERT_NO_FATAL_FAILURE(deploy());

  // The stateful fragment's streams have a follower, in sync.
  {
    auto r = node(3).request("GET", "/v1/streams/cut--c--state", {}, kReaderToken);
    ASSERT_EQ(r.status, 200u) << r.body;
    auto d = parse(r.body);
    ASSERT_TRUE(d.IsObject() && d.HasMember("replication")) << r.body;
    EXPECT_EQ(d["replication"]["factor"].GetUint64(), 2u) << r.body;
  }

  for (int b = 1; b <= kBatches; ++b) {
    if (b == 60) {
      // Mid-stream, with state in the window counts: n3 dies for good.
      ASSERT_TRUE(eventually(30s, [&] { return next_seq(node(1), "counts-cut") > 1; }))
          << "no output from the cut query before the kill";
      nodes_[2]->process().kill();
    }
    publish(b, static_cast<size_t>(b % 2));
    if (HasFatalFailure()) return;
  }
  publish(0, 0);

  // The fragment moved to n1 or n2, and the entry says why.
  std::string moved_to;
  ASSERT_TRUE(eventually(30s, [&] {
    moved_to = fragment_node(1, "c");
    return moved_to == "n1" || moved_to == "n2";
  })) << "fragment c is still placed on " << moved_to;
  {
    auto r = node(1).request("GET", "/v1/queries/cut", {}, kReaderToken);
    auto d = parse(r.body);
    ASSERT_TRUE(d.IsObject() && d.HasMember("moves") && d["moves"].IsArray() && d["moves"].Size() >= 1) << r.body;
    EXPECT_STREQ(d["moves"][0]["from"].GetString(), "n3") << r.body;
    EXPECT_NE(std::string(d["moves"][0]["reason"].GetString()).find("n3 is down"), std::string::npos) << r.body;
  }

  int64_t total = 0;
  ASSERT_NO_FATAL_FAILURE(expect_cut_output_equals_whole(node(1), node(2), kAllRows, 60s, total));
  EXPECT_EQ(total, int64_t{kBatches} * kRowsPerBatch) << "the counts do not add up to every tuple published";

  // n3 comes back: its stale run of the fragment goes, the fragment stays
  // where it moved, and the query reads as running through n3.
  ASSERT_TRUE(nodes_[2]->start()) << nodes_[2]->last_error();
  ASSERT_TRUE(eventually(30s, [&] {
    auto r = node(3).try_request("GET", "/v1/queries/cut/fragments/c", {}, kReaderToken);
    return r.ok() && r->status == 404;
  })) << "n3 still runs its own fragment c";
  EXPECT_EQ(fragment_node(3, "c"), moved_to);
  ASSERT_TRUE(eventually(30s, [&] {
    auto r = node(3).try_request("GET", "/v1/queries/cut", {}, kReaderToken);
    return r.ok() && r->status == 200 && r->body.find(R"("state":"running")") != std::string::npos;
  }));
}

// etcd away for longer than the nodes' leases, mid-stream: no node can
// confirm that it still leads, so the fragments' outputs wait (their state
// stream appends are refused as unavailable and asked again) and the
// publisher is answered 503; when etcd is back everything goes on, and the
// output is still exactly the whole query's.
TEST_F(ClusterFragmentFailover, AnEtcdOutageLongerThanTheLeasesPausesTheFragmentsAndLosesNothing) {
  ASSERT_NO_FATAL_FAILURE(deploy());
  for (int b = 1; b <= kBatches; ++b) {
    if (b == 40) {
      ASSERT_TRUE(eventually(30s, [&] { return next_seq(node(1), "counts-cut") > 1; }));
      etcd_->pause();  // SIGSTOP: connections hang rather than being refused
      std::this_thread::sleep_for(4s);  // twice the nodes' 2 s leases
      etcd_->resume();
    }
    publish(b, static_cast<size_t>(b % 3));
    if (HasFatalFailure()) return;
  }
  publish(0, 0);
  int64_t total = 0;
  ASSERT_NO_FATAL_FAILURE(expect_cut_output_equals_whole(node(1), node(2), kAllRows, 90s, total));
  EXPECT_EQ(total, int64_t{kBatches} * kRowsPerBatch) << "the counts do not add up to every tuple published";
  auto q = node(3).request("GET", "/v1/queries/cut", {}, kReaderToken);
  EXPECT_NE(q.body.find(R"("state":"running")"), std::string::npos) << q.body;
}

// A whole query (no placement) in a domain of three nodes runs as a cut of
// one fragment, "all", next to its input (docs/cluster.md, "Whole queries
// fail over too"): its node is killed with SIGKILL mid-stream and never
// comes back, another node runs it from its replicated checkpoint and
// journal, and its output, read through a surviving node, is the same
// query's on a broker of one node row for row: no gap, no repeat.
TEST_F(ClusterFragmentFailover, AWholeQueryRunsOnAnotherNodeWhenItsNodeDiesAndItsOutputStaysExact) {
  // The reference: the query whole on a broker of one node, fed the same
  // batches.
  BrokerProcess solo;
  ASSERT_TRUE(solo.start()) << solo.last_error();
  ASSERT_EQ(solo.request("POST", "/v1/streams", R"({"name":"bids","schema":)" + std::string(kCutBidSchema) + "}")
                .status,
            201u);
  ASSERT_EQ(solo.request("POST", "/v1/queries", cut_count_query("whole", "counts-whole", "")).status, 201u);

  auto created = node(2).request("POST", "/v1/streams",
                                 R"({"name":"bids","node":"n1","replication":2,"schema":)" +
                                     std::string(kCutBidSchema) + "}");
  ASSERT_EQ(created.status, 201u) << created.body;
  // Deployed through n3 without a placement: it goes next to bids, on n1.
  auto deployed = node(3).request("POST", "/v1/queries", cut_count_query("tally", "counts-cut", ""));
  ASSERT_EQ(deployed.status, 201u) << deployed.body;
  {
    auto d = parse(deployed.body);
    ASSERT_TRUE(d.IsObject() && d.HasMember("fragments") && d["fragments"].Size() == 1u) << deployed.body;
    EXPECT_STREQ(d["node"].GetString(), "n1") << deployed.body;
    EXPECT_STREQ(d["fragments"][0]["name"].GetString(), "all") << deployed.body;
    EXPECT_STREQ(d["fragments"][0]["node"].GetString(), "n1") << deployed.body;
  }
  // Listed through any node with its node; its state stream and output
  // have a follower.
  ASSERT_TRUE(eventually(10s, [&] {
    auto r = node(2).request("GET", "/v1/queries", {}, kReaderToken);
    return r.body.find(R"("name":"tally","state":"running","node":"n1")") != std::string::npos;
  })) << node(2).request("GET", "/v1/queries", {}, kReaderToken).body;
  for (const char* stream : {"tally--all--state", "counts-cut"}) {
    auto r = node(3).request("GET", std::string("/v1/streams/") + stream, {}, kReaderToken);
    ASSERT_EQ(r.status, 200u) << r.body;
    auto d = parse(r.body);
    ASSERT_TRUE(d.IsObject() && d.HasMember("replication")) << r.body;
    EXPECT_EQ(d["replication"]["factor"].GetUint64(), 2u) << r.body;
  }

  auto publish_both = [&](int b, size_t start) {
    const std::string target =
        "/v1/streams/bids/tuples?producer_id=p&producer_seq=" + std::to_string(b == 0 ? kBatches + 1 : b);
    const std::string problem = post_through_any(processes(), start, target, batch(b));
    if (!problem.empty()) FAIL() << "batch " << b << ": " << problem;
    auto r = solo.request("POST", target, batch(b), kPublisherToken);
    ASSERT_EQ(r.status, 200u) << r.body;
  };
  for (int b = 1; b <= kBatches; ++b) {
    if (b == 60) {
      // Mid-stream, with counts in open windows, its checkpoints taken:
      // n1 dies for good.
      ASSERT_TRUE(eventually(30s, [&] { return next_seq(node(2), "counts-cut") > 1; }))
          << "no output from the query before the kill";
      auto checkpoints = node(1).request("GET", "/v1/checkpoints", {}, kReaderToken);
      EXPECT_NE(checkpoints.body.find(R"("query":"tally--all")"), std::string::npos) << checkpoints.body;
      EXPECT_NE(checkpoints.body.find(R"("state_stream":"tally--all--state")"), std::string::npos)
          << checkpoints.body;
      // Its streams' followers in sync (one that fell behind under load
      // leaves nobody to take the query over without a loss: it would
      // rightly stay on the dead node).
      for (const char* stream : {"tally--all--state", "counts-cut", "bids"})
        ASSERT_NO_FATAL_FAILURE(await_followers_in_sync(1, stream));
      nodes_[0]->process().kill();
    }
    // Through n2 and n3 once n1 is dead.
    publish_both(b, b < 60 ? static_cast<size_t>(b % 3) : 1 + static_cast<size_t>(b % 2));
    if (HasFatalFailure()) return;
  }
  publish_both(0, 1);
  if (HasFatalFailure()) return;

  // The query moved to n2 or n3, and its entry says from where and why.
  std::string moved_to;
  ASSERT_TRUE(eventually(30s, [&] {
    auto r = node(2).try_request("GET", "/v1/queries/tally", {}, kReaderToken);
    if (!r.ok() || r->status != 200) return false;
    auto d = parse(r->body);
    if (!d.IsObject() || !d.HasMember("node") || !d["node"].IsString()) return false;
    moved_to = d["node"].GetString();
    return moved_to == "n2" || moved_to == "n3";
  })) << "the query is still placed on " << moved_to;
  {
    // Its node shows in the runner's boxes too (once a run of the new
    // runner let GET read them: a run in progress shows the last read).
    http::ClientResponse r;
    EXPECT_TRUE(eventually(20s, [&] {
      r = node(3).request("GET", "/v1/queries/tally", {}, kReaderToken);
      return r.body.find(R"("placement":"acme/)" + moved_to + "\"") != std::string::npos;
    })) << r.body;
    ASSERT_EQ(r.status, 200u) << r.body;
    auto d = parse(r.body);
    ASSERT_TRUE(d.IsObject() && d.HasMember("moves") && d["moves"].IsArray() && d["moves"].Size() >= 1) << r.body;
    EXPECT_STREQ(d["moves"][0]["fragment"].GetString(), "all") << r.body;
    EXPECT_STREQ(d["moves"][0]["from"].GetString(), "n1") << r.body;
    EXPECT_EQ(d["moves"][0]["to"].GetString(), moved_to) << r.body;
    EXPECT_NE(std::string(d["moves"][0]["reason"].GetString()).find("n1 is down"), std::string::npos) << r.body;
  }

  int64_t total = 0;
  ASSERT_NO_FATAL_FAILURE(expect_cut_output_equals_whole(solo, node(moved_to == "n2" ? 3 : 2), kAllRows, 90s, total));
  EXPECT_EQ(total, int64_t{kBatches} * kRowsPerBatch) << "the counts do not add up to every tuple published";

  // Deleted through the node that does not run it: gone, its output too.
  EXPECT_EQ(node(moved_to == "n2" ? 3 : 2).request("DELETE", "/v1/queries/tally").status, 204u);
  ASSERT_TRUE(eventually(20s, [&] {
    return node(2).request("GET", "/v1/queries/tally", {}, kReaderToken).status == 404 &&
           node(3).request("GET", "/v1/streams/counts-cut", {}, kReaderToken).status == 404;
  }));
}

}  // namespace
}  // namespace entente::testing
