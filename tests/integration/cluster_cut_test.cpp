// A query cut into three fragments on the three nodes of a domain
// (docs/cluster.md, "Queries cut into fragments"): acme is three real broker
// processes sharing one real etcd, each with its own peer-link listener and
// certificate from `entente certs`, none configured to dial another (a node
// dials the node whose internal stream it reads where the membership says
// it listens). The query filters bids on n1, maps them on n2 and counts
// them per auction in tumbling windows on n3: the rows and the watermark
// cross two internal streams before the windows close. The same query runs
// whole on n1 beside it. kill -9 and restart of each node in turn while the
// producer publishes; at the end both outputs are read through n2 and must
// be identical row for row (values, event times, sequence numbers), the
// counts must add up to every tuple published, and the numbering must have
// no gap and no repeat.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/cut_query.h"
#include "tests/integration/support/domain.h"
#include "tests/integration/support/ws_reader.h"
#include "tests/support/etcd_process.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kBatches = 150;
constexpr int kRowsPerBatch = 20;
constexpr int kAuctions = 7;

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  return d;
}

class ClusterCut : public ThreeNodeDomain {
 protected:
  ClusterCut() : ThreeNodeDomain("etcd-cut", R"("checkpoint_interval": "200ms", )") {}

  // Batch b (support/cut_query.h); b = 0: the end marker.
  static std::string batch(int b) { return cut_bid_batch(b, kBatches, kRowsPerBatch, kAuctions); }

  // Publishes batch b (producer "p", number b; the end marker kBatches + 1) through n1, n2, n3 in
  // turn from `start` until one answers 200: a 502 or 503 while a node is
  // down means "not stored", and the producer's number makes a resend safe.
  void publish(int b, size_t start) {
    const std::string problem = post_through_any(
        processes(), start,
        "/v1/streams/bids/tuples?producer_id=p&producer_seq=" + std::to_string(b == 0 ? kBatches + 1 : b), batch(b));
    if (!problem.empty()) FAIL() << "batch " << b << ": " << problem;
  }

  // Waits until the cut query's output holds every window that batch b
  // closed (each has a row per auction), read through a running node: the
  // rows crossed all three nodes, so the kill that follows hits a pipeline
  // with state in every fragment.
  void wait_through(int b) {
    const uint64_t want = static_cast<uint64_t>(b / 10) * kAuctions;
    uint64_t got = 0;
    ASSERT_TRUE(eventually(30s, [&] {
      for (FedNode* n : nodes_) {
        if (!n->running()) continue;
        got = next_seq(n->process(), "counts-cut") - 1;
        return got >= want;
      }
      return false;
    })) << "the cut query's output has " << got << " rows after batch " << b << ", expected " << want;
  }

};

TEST_F(ClusterCut, ThreeFragmentsOnThreeNodesMatchTheWholeQueryAcrossKillNineOfEachNode) {
  auto created = node(2).request("POST", "/v1/streams",
                                 R"({"name":"bids","node":"n1","schema":)" + std::string(kCutBidSchema) + "}");
  ASSERT_EQ(created.status, 201u) << created.body;
  auto whole = node(1).request("POST", "/v1/queries", cut_count_query("whole", "counts-whole", R"({"node":"n1"})"));
  ASSERT_EQ(whole.status, 201u) << whole.body;
  // Deployed through n3; each fragment on its node, producers first.
  auto cut = node(3).request(
      "POST", "/v1/queries",
      cut_count_query("cut", "counts-cut",
            R"({"fragments":[{"name":"a","node":"n1","boxes":["keep"]},{"name":"b","node":"n2","boxes":["cents"]},)"
            R"({"name":"c","node":"n3","boxes":["counts"]}]})"));
  ASSERT_EQ(cut.status, 201u) << cut.body;
  EXPECT_NE(cut.body.find(R"("name":"cut")"), std::string::npos) << cut.body;

  // Through any node: the fragments, their nodes, positions and boxes.
  for (int i = 1; i <= 3; ++i) {
    auto got = node(i).request("GET", "/v1/queries/cut", {}, kReaderToken);
    ASSERT_EQ(got.status, 200u) << got.body;
    auto d = parse(got.body);
    ASSERT_TRUE(d.IsObject() && d.HasMember("fragments")) << got.body;
    ASSERT_EQ(d["fragments"].Size(), 3u) << got.body;
    EXPECT_STREQ(d["state"].GetString(), "running") << got.body;
    const char* want_nodes[] = {"n1", "n2", "n3"};
    for (rapidjson::SizeType f = 0; f < 3; ++f) {
      EXPECT_STREQ(d["fragments"][f]["node"].GetString(), want_nodes[f]) << got.body;
      ASSERT_TRUE(d["fragments"][f]["runner"].IsObject()) << got.body;
      EXPECT_TRUE(d["fragments"][f]["runner"].HasMember("positions")) << got.body;
      EXPECT_TRUE(d["fragments"][f]["runner"]["boxes"][0].HasMember("cpu_ns_per_tuple")) << got.body;
    }
  }
  // Internal streams are hidden from the listing; the query is listed once.
  auto listed = node(2).request("GET", "/v1/streams", {}, kReaderToken);
  EXPECT_EQ(listed.body.find("cut--"), std::string::npos) << listed.body;
  auto queries = node(2).request("GET", "/v1/queries", {}, kReaderToken);
  EXPECT_EQ(queries.body.find("cut--"), std::string::npos) << queries.body;
  EXPECT_NE(queries.body.find(R"("name":"cut")"), std::string::npos) << queries.body;

  // kill -9 of n2 at batch 30 (back at 50), n3 at 70 (back at 90), n1 —
  // the stream's leader and the first fragment's node — at 110 (back at once).
  for (int b = 1; b <= kBatches; ++b) {
    if (b == 30 || b == 70 || b == 110) {
      ASSERT_NO_FATAL_FAILURE(wait_through(b - 1));
    }
    if (b == 30) nodes_[1]->process().kill();
    if (b == 50) {
      ASSERT_TRUE(nodes_[1]->start()) << nodes_[1]->last_error();
    }
    if (b == 70) nodes_[2]->process().kill();
    if (b == 90) {
      ASSERT_TRUE(nodes_[2]->start()) << nodes_[2]->last_error();
    }
    if (b == 110) {
      nodes_[0]->process().kill();
      std::this_thread::sleep_for(300ms);
      ASSERT_TRUE(nodes_[0]->start()) << nodes_[0]->last_error();
    }
    publish(b, static_cast<size_t>(b));
    if (HasFatalFailure()) return;
  }
  publish(0, 0);
  ASSERT_TRUE(eventually(30s, [&] { return all_up(); }));

  // The whole query's output is the reference: read it through n2 once
  // complete (the end marker closed every window: 150 batches of 100 ms
  // are 15 windows of 1 s, each with every auction).
  int64_t total = 0;
  ASSERT_NO_FATAL_FAILURE(expect_cut_output_equals_whole(node(2), node(2), 1, 60s, total));
  EXPECT_EQ(total, int64_t{kBatches} * kRowsPerBatch) << "the counts do not add up to every tuple published";

  // The load of each fragment's boxes, through any node (counted since
  // each node's last start): the aggregate on n3 counted rows, and its
  // state was checkpointed.
  {
    const std::string body = node(1).request("GET", "/v1/queries/cut", {}, kReaderToken).body;
    auto d = parse(body);
    ASSERT_TRUE(d.IsObject() && d.HasMember("fragments")) << body;
    const auto& counts = d["fragments"][2]["runner"]["boxes"][0];
    EXPECT_STREQ(counts["id"].GetString(), "counts") << body;
    EXPECT_GT(counts["tuples_in"].GetUint64(), 0u) << body;
    EXPECT_GT(counts["state_bytes"].GetUint64(), 0u) << body;
    EXPECT_TRUE(counts.HasMember("tuples_in_per_s") && counts.HasMember("cpu_ns_per_tuple")) << body;
  }

  // Deleting through n1 removes every fragment and internal stream.
  auto del = node(1).request("DELETE", "/v1/queries/cut", {}, kAdminToken);
  ASSERT_EQ(del.status, 204u) << del.body;
  for (int i = 1; i <= 3; ++i) {
    EXPECT_EQ(node(i).request("GET", "/v1/queries/cut", {}, kReaderToken).status, 404u);
    // The followers drop their copies as their watch brings the delete.
    std::string all;
    EXPECT_TRUE(eventually(10s, [&] {
      all = node(i).request("GET", "/v1/streams?internal=true", {}, kReaderToken).body;
      return all.find("cut--") == std::string::npos;
    })) << "node " << i << ": " << all;
  }
  EXPECT_EQ(node(2).request("GET", "/v1/streams/counts-cut", {}, kReaderToken).status, 404u);
}

// Each fragment keeps its journal and checkpoints in a hidden state stream
// (docs/cluster.md, "A fragment's state stream"), on its node: it is
// listed only with ?internal=true, holds journal rows (kind 1) and
// checkpoint chunks (kind 2), is trimmed to the last checkpoint, and is
// what a kill -9 of the fragment's node recovers from: the output is then
// the whole query's, row for row, and the checkpoints go on from the
// recovered one.
TEST_F(ClusterCut, AFragmentsStateStreamHoldsItsJournalAndCheckpointsAndIsWhatAKillNineRecoversFrom) {
  ASSERT_EQ(node(1).request("POST", "/v1/streams", R"({"name":"bids","node":"n1","schema":)" + std::string(kCutBidSchema) + "}")
                .status,
            201u);
  ASSERT_EQ(node(1).request("POST", "/v1/queries", cut_count_query("whole", "counts-whole", R"({"node":"n1"})")).status, 201u);
  auto cut = node(1).request(
      "POST", "/v1/queries",
      cut_count_query("cut", "counts-cut",
            R"({"fragments":[{"name":"a","node":"n1","boxes":["keep"]},{"name":"b","node":"n2","boxes":["cents"]},)"
            R"({"name":"c","node":"n3","boxes":["counts"]}]})"));
  ASSERT_EQ(cut.status, 201u) << cut.body;
  const std::string state = "cut--c--state";

  // Hidden from the listing, listed with ?internal=true, on the fragment's
  // node, written by the query.
  EXPECT_EQ(node(3).request("GET", "/v1/streams", {}, kReaderToken).body.find("--state"), std::string::npos);
  const std::string internal = node(3).request("GET", "/v1/streams?internal=true", {}, kReaderToken).body;
  EXPECT_NE(internal.find(R"("name":")" + state + "\""), std::string::npos) << internal;
  auto info = [&](const std::string& stream) {
    auto r = node(3).request("GET", "/v1/streams/" + stream, {}, kReaderToken);
    EXPECT_EQ(r.status, 200u) << r.body;
    return parse(r.body);
  };
  {
    auto d = info(state);
    ASSERT_TRUE(d.IsObject() && d.HasMember("producer")) << "no state stream";
    EXPECT_STREQ(d["producer"].GetString(), "query:cut");
    EXPECT_STREQ(d["node"].GetString(), "n3");
  }
  // The runner's last checkpoint (GET /v1/queries/cut), 0 before one.
  auto checkpoint_id = [&](int through) -> uint64_t {
    auto d = parse(node(through).request("GET", "/v1/queries/cut", {}, kReaderToken).body);
    if (!d.IsObject() || !d.HasMember("fragments")) return 0;
    const auto& r = d["fragments"][2]["runner"];
    if (!r.IsObject() || !r.HasMember("checkpoint") || !r["checkpoint"].IsObject()) return 0;
    return r["checkpoint"]["id"].GetUint64();
  };

  for (int b = 1; b <= 40; ++b) ASSERT_NO_FATAL_FAILURE(publish(b, 0));
  ASSERT_NO_FATAL_FAILURE(wait_through(40));
  // It grew with journal rows and checkpoints (every 200 ms), and was
  // trimmed to a checkpoint: its first retained row is a first chunk.
  uint64_t first = 0, next = 0;
  ASSERT_TRUE(eventually(30s, [&] {
    auto d = info(state);
    if (!d.IsObject() || !d.HasMember("first_seq")) return false;
    first = d["first_seq"].GetUint64();
    next = d["next_seq"].GetUint64();
    return first > 1 && checkpoint_id(3) >= 3;
  })) << "the state stream is not trimmed: first_seq " << first << ", next_seq " << next;
  {
    // A checkpoint taken between the look and the read may trim the rows
    // looked at (the subscription is then closed as trimmed): look again.
    ReadResult rows;
    ASSERT_TRUE(eventually(30s, [&] {
      auto d = info(state);
      if (!d.IsObject() || !d.HasMember("first_seq")) return false;
      first = d["first_seq"].GetUint64();
      next = d["next_seq"].GetUint64();
      rows = read_stream(node(3), state, first, next - 1, 30'000);
      return !rows.tuples.empty() && rows.tuples.front().seq == first;
    })) << "the state stream could not be read from its first row: " << rows.error << rows.close_reason;
    auto d = parse(rows.tuples.front().line);
    ASSERT_TRUE(d.IsObject() && d.HasMember("kind")) << rows.tuples.front().line;
    EXPECT_EQ(d["kind"].GetInt64(), 2) << "the first retained row is not a checkpoint chunk: " << rows.tuples.front().line;
    EXPECT_EQ(d["b"].GetInt64(), 0) << "the first retained row is not a first chunk: " << rows.tuples.front().line;
  }
  {
    // New input: journal rows (one per input range consumed) follow, read
    // live from the state stream, between checkpoint chunks.
    auto live = std::async(std::launch::async, [&] { return read_stream(node(3), state, next, next + 9, 30'000); });
    std::this_thread::sleep_for(300ms);  // subscribed
    for (int b = 41; b <= 50; ++b) ASSERT_NO_FATAL_FAILURE(publish(b, 0));
    ASSERT_NO_FATAL_FAILURE(wait_through(50));
    const ReadResult rows = live.get();
    ASSERT_GE(rows.tuples.size(), 10u) << rows.error;  // whole records
    int journal = 0, chunks = 0;
    for (const auto& t : rows.tuples) {
      auto r = parse(t.line);
      ASSERT_TRUE(r.IsObject() && r.HasMember("kind")) << t.line;
      journal += r["kind"].GetInt64() == 1;
      chunks += r["kind"].GetInt64() == 2;
    }
    EXPECT_GT(journal, 0) << "no journal rows for new input";
    EXPECT_EQ(static_cast<size_t>(journal + chunks), rows.tuples.size());
  }
  // The checkpoints are in the state stream, not in the node's store:
  // GET /v1/checkpoints names the stream they are in.
  const std::string stored = node(3).request("GET", "/v1/checkpoints", {}, kReaderToken).body;
  EXPECT_NE(stored.find(R"("query":"cut--c")"), std::string::npos) << stored;
  EXPECT_NE(stored.find(R"("state_stream":"cut--c--state")"), std::string::npos) << stored;

  // kill -9 of the fragment's node mid-stream; the producer goes on.
  const uint64_t before = checkpoint_id(3);
  ASSERT_GT(before, 0u);
  nodes_[2]->process().kill();
  for (int b = 51; b <= 70; ++b) ASSERT_NO_FATAL_FAILURE(publish(b, 0));
  ASSERT_TRUE(nodes_[2]->start()) << nodes_[2]->last_error();
  // Recovered from the state stream: the first checkpoint the runner shows
  // is the one it restored, at least the last one seen before the kill (a
  // runner starting afresh would count from 1).
  uint64_t after = 0;
  ASSERT_TRUE(eventually(30s, [&] { return (after = checkpoint_id(3)) != 0; }));
  EXPECT_GE(after, before) << "the restarted runner did not restore its checkpoint from the state stream";
  for (int b = 71; b <= 100; ++b) ASSERT_NO_FATAL_FAILURE(publish(b, 0));
  ASSERT_NO_FATAL_FAILURE(publish(0, 0));

  // Complete: equal to the whole query's output, row for row, numbered
  // without gap or repeat.
  int64_t total = 0;
  ASSERT_NO_FATAL_FAILURE(expect_cut_output_equals_whole(node(1), node(1), 10u * kAuctions, 60s, total));
  EXPECT_EQ(total, int64_t{100} * kRowsPerBatch) << "the counts do not add up to every tuple published";

  // Deleting the query deletes its state streams (and internal streams)
  // with it. (The whole query, a cut of one fragment in this domain, keeps
  // its own, whole--all--state.)
  ASSERT_EQ(node(1).request("DELETE", "/v1/queries/cut", {}, kAdminToken).status, 204u);
  for (int i = 1; i <= 3; ++i) {
    // The followers drop their copies as their watch brings the delete.
    std::string all;
    EXPECT_TRUE(eventually(10s, [&] {
      all = node(i).request("GET", "/v1/streams?internal=true", {}, kReaderToken).body;
      return all.find(R"("name":"cut--)") == std::string::npos && all.find(R"("name":"@n1/cut--)") == std::string::npos &&
             all.find(R"("name":"@n2/cut--)") == std::string::npos && all.find(R"("name":"@n3/cut--)") == std::string::npos;
    })) << "node " << i << ": " << all;
  }
}

// Two fragments on one node (their arc stays on the node: the consumer
// reads the producer's internal stream directly) and one on another; the
// fragment without a node runs next to the stream it reads (n1).
TEST_F(ClusterCut, FragmentsSharingANodeReadTheirArcLocally) {
  ASSERT_EQ(node(1).request("POST", "/v1/streams", R"({"name":"bids","node":"n1","schema":)" + std::string(kCutBidSchema) + "}")
                .status,
            201u);
  ASSERT_EQ(node(1).request("POST", "/v1/queries", cut_count_query("whole", "counts-whole", R"({"node":"n1"})")).status, 201u);
  auto cut = node(2).request(
      "POST", "/v1/queries",
      cut_count_query("cut", "counts-cut",
            R"({"fragments":[{"name":"a","boxes":["keep"]},{"name":"b","node":"n1","boxes":["cents"]},)"
            R"({"name":"c","node":"n2","boxes":["counts"]}]})"));
  ASSERT_EQ(cut.status, 201u) << cut.body;
  const std::string body = node(3).request("GET", "/v1/queries/cut", {}, kReaderToken).body;
  auto got = parse(body);
  ASSERT_TRUE(got.IsObject() && got.HasMember("fragments")) << body;
  EXPECT_STREQ(got["fragments"][0]["node"].GetString(), "n1");
  EXPECT_STREQ(got["fragments"][2]["node"].GetString(), "n2");
  // b reads a's stream on n1 itself; c reads b's from n1 into @n1/....
  EXPECT_STREQ(got["fragments"][1]["runner"]["inputs"][0].GetString(), "cut--keep_0");
  EXPECT_STREQ(got["fragments"][2]["runner"]["inputs"][0].GetString(), "@n1/cut--cents_0");
  auto internal = node(1).request("GET", "/v1/streams?internal=true", {}, kReaderToken);
  EXPECT_NE(internal.body.find("cut--keep_0"), std::string::npos) << internal.body;
  // Each node's load report (every lease tick) lists the fragments it runs.
  std::string nodes;
  EXPECT_TRUE(eventually(10s, [&] {
    nodes = node(1).request("GET", "/v1/nodes", {}, kReaderToken).body;
    return nodes.find("cut--c") != std::string::npos && nodes.find("cut--a") != std::string::npos;
  })) << nodes;

  for (int b = 1; b <= 40; ++b) ASSERT_NO_FATAL_FAILURE(publish(b, 0));
  ASSERT_NO_FATAL_FAILURE(publish(0, 0));
  int64_t total = 0;
  ASSERT_NO_FATAL_FAILURE(expect_cut_output_equals_whole(node(1), node(3), 4u * kAuctions, 30s, total));
}

TEST_F(ClusterCut, BadCutsAreRefusedAndLeaveNothing) {
  auto created = node(1).request("POST", "/v1/streams",
                                 R"({"name":"bids","node":"n1","schema":)" + std::string(kCutBidSchema) + "}");
  ASSERT_EQ(created.status, 201u) << created.body;
  // The fragment reading bids is not on bids' node.
  auto far = node(1).request(
      "POST", "/v1/queries",
      cut_count_query("far", "far-out",
            R"({"fragments":[{"name":"a","node":"n2","boxes":["keep"]},{"name":"b","node":"n3","boxes":["cents","counts"]}]})"));
  EXPECT_EQ(far.status, 409u) << far.body;
  EXPECT_NE(far.body.find("leads"), std::string::npos) << far.body;
  // An unknown node.
  auto unknown = node(1).request(
      "POST", "/v1/queries",
      cut_count_query("unk", "unk-out",
            R"({"fragments":[{"name":"a","node":"n1","boxes":["keep"]},{"name":"b","node":"n9","boxes":["cents","counts"]}]})"));
  EXPECT_EQ(unknown.status, 400u) << unknown.body;
  EXPECT_NE(unknown.body.find("$.placement.fragments[1].node"), std::string::npos) << unknown.body;
  // "--" is reserved.
  auto reserved = node(1).request("POST", "/v1/queries", cut_count_query("x--y", "xy-out", R"({"node":"n1"})"));
  EXPECT_EQ(reserved.status, 400u) << reserved.body;
  auto stream = node(1).request("POST", "/v1/streams", R"({"name":"a--b","schema":)" + std::string(kCutBidSchema) + "}");
  EXPECT_EQ(stream.status, 400u) << stream.body;
  for (int i = 1; i <= 3; ++i) {
    auto q = node(i).request("GET", "/v1/queries", {}, kReaderToken);
    EXPECT_EQ(q.body, R"({"queries":[]})") << "node " << i;
  }
}

}  // namespace
}  // namespace entente::testing
