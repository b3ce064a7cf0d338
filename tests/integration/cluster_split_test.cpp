// Splitting a running fragment by key groups (docs/cluster.md, "Splitting a
// fragment"): acme is three real broker processes sharing one real etcd,
// with peer links; a query cut in three fragments (filter on n1, map on n2,
// a 1 s tumbling count per auction on n3) runs beside the same query whole
// on n1. While the producer publishes, the count is split into two parts
// (n1 and n3, each restored with the key groups of its half from the
// count's state at the split, behind a router on n3 that continues from the
// count's input position, recombined by a merge on n3 that continues the
// output stream), and later merged back; the whole query (one fragment
// reading bids, mapping and counting) is split too. At the end the cut
// query's output equals the whole one row for row, numbered 1..N without
// gap or repeat, both parts having counted rows. The refusals: a fragment whose state is not keyed (naming
// its box), ranges that overlap or leave key groups out, an unknown node,
// one part, an unknown fragment, a bad body, a reader's token.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <map>
#include <string>
#include <utility>
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
// Rows of the complete outputs (the end marker closes every window; each
// window holds every auction, since 20 consecutive rows cover the 7).
// Compared only once the whole query wrote all of them: compared earlier,
// the whole one may still be behind the cut one (it is a query of its own,
// with its own output and followers), or both may be equal halfway.
// Batch b's bids are at b * 100 ms (.. + 19): the 1 s tumbling windows 0 ..
// kBatches / 10 hold them;
constexpr uint64_t kAllTumblingRows = (kBatches / 10 + 1) * kAuctions;
// the 2 s windows sliding every 500 ms start at -1500, -1000, ..,
// kBatches * 100 ms.
constexpr uint64_t kAllSlidingRows = (kBatches / 5 + 4) * kAuctions;

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  return d;
}

class ClusterSplit : public ThreeNodeDomain {
 protected:
  ClusterSplit() : ThreeNodeDomain("etcd-split", R"("checkpoint_interval": "200ms", )") {}

  static std::string batch(int b) { return cut_bid_batch(b, kBatches, kRowsPerBatch, kAuctions); }

  void publish(int b) {
    const std::string problem = post_through_any(
        processes(), 0,
        "/v1/streams/bids/tuples?producer_id=p&producer_seq=" + std::to_string(b == 0 ? kBatches + 1 : b), batch(b));
    if (!problem.empty()) FAIL() << "batch " << b << ": " << problem;
  }

  http::ClientResponse split(int via, const std::string& fragment, const std::string& body) {
    return node(via).request("POST", "/v1/queries/cut/fragments/" + fragment + "/split", body, kAdminToken);
  }

  // Expects a refusal with `status` whose detail contains `says`.
  void expect_refused(int via, const std::string& fragment, const std::string& body, unsigned status,
                      const std::string& says) {
    auto r = split(via, fragment, body);
    EXPECT_EQ(r.status, status) << r.body;
    EXPECT_NE(r.body.find(says), std::string::npos) << r.body;
  }
};

TEST_F(ClusterSplit, AKeyedFragmentSplitAndMergedBackMidStreamKeepsTheOutputExactAndRefusalsSayWhy) {
  ASSERT_EQ(node(2).request("POST", "/v1/streams",
                            R"({"name":"bids","node":"n1","schema":)" + std::string(kCutBidSchema) + "}")
                .status,
            201u);
  auto whole = node(1).request("POST", "/v1/queries", cut_count_query("whole", "counts-whole", R"({"node":"n1"})"));
  ASSERT_EQ(whole.status, 201u) << whole.body;
  auto cut = node(3).request(
      "POST", "/v1/queries",
      cut_count_query("cut", "counts-cut",
                      R"({"fragments":[{"name":"a","node":"n1","boxes":["keep"]},)"
                      R"({"name":"b","node":"n2","boxes":["cents"]},{"name":"c","node":"n3","boxes":["counts"]}]})"));
  ASSERT_EQ(cut.status, 201u) << cut.body;

  // Refused, nothing split: each names why.
  expect_refused(1, "a", R"({"parts":[{"node":"n1"},{"node":"n2"}]})", 409,
                 "the fragment's state is not keyed: none of its boxes ('keep' (filter)) keeps state by key group");
  expect_refused(2, "c", R"({"parts":[{"node":"n1","range":[0,70]},{"node":"n3","range":[64,128]}]})", 400,
                 "key-group range [64, 128) overlaps the part before it, which ends at 70");
  expect_refused(2, "c", R"({"parts":[{"node":"n1","range":[0,60]},{"node":"n3","range":[60,100]}]})", 400,
                 "key groups [100, 128) are left to no part");
  expect_refused(2, "c", R"({"parts":[{"node":"n1","range":[0,64]},{"node":"n3"}]})", 400,
                 "give every part a range, or none");
  expect_refused(1, "c", R"({"parts":[{"node":"n1"},{"node":"n9"}]})", 400,
                 "$.parts[1].node: n9 is not a node of domain acme");
  expect_refused(1, "c", R"({"parts":[{"node":"n1"}]})", 400, "a split has 2 to 16 parts, not 1");
  expect_refused(1, "zz", R"({"parts":[{"node":"n1"},{"node":"n2"}]})", 404, "has no fragment 'zz'");
  expect_refused(1, "c", R"({"nodes":["n1","n2"]})", 400, "$.parts: the parts to split the fragment into");
  auto reader =
      node(1).request("POST", "/v1/queries/cut/fragments/c/split", R"({"parts":[{"node":"n1"},{"node":"n2"}]})",
                      kReaderToken);
  EXPECT_EQ(reader.status, 403u) << reader.body;

  for (int b = 1; b <= 50; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));
  // Split through a node that is neither the fragment's nor a part's.
  auto r = split(2, "c", R"({"parts":[{"node":"n1"},{"node":"n3"}]})");
  ASSERT_EQ(r.status, 200u) << r.body;
  std::printf("split of c: %s\n", r.body.c_str());
  auto s = parse(r.body);
  ASSERT_TRUE(s.IsObject() && s.HasMember("parts") && s["parts"].IsArray() && s["parts"].Size() == 2) << r.body;
  EXPECT_STREQ(s["state"].GetString(), "split");
  EXPECT_STREQ(s["keyed_box"].GetString(), "counts");
  EXPECT_STREQ(s["router"]["fragment"].GetString(), "c-split");
  EXPECT_STREQ(s["router"]["node"].GetString(), "n3");
  EXPECT_STREQ(s["merge"]["fragment"].GetString(), "c-merge");
  EXPECT_STREQ(s["parts"][0]["node"].GetString(), "n1");
  EXPECT_EQ(s["parts"][0]["range"][1].GetUint(), 64u);
  EXPECT_STREQ(s["parts"][1]["fragment"].GetString(), "c-1");
  EXPECT_TRUE(s["checkpointed"].GetBool()) << r.body;
  EXPECT_GT(s["pause_ms"].GetDouble(), 0.0);

  // The reference itself, a query deployed whole (its one fragment "all"
  // reads bids and maps before counting, handing the key on), is split
  // too: its router reads bids on n1, where that stream is led.
  auto w = node(3).request("POST", "/v1/queries/whole/fragments/all/split", R"({"parts":[{"node":"n2"},{"node":"n3"}]})",
                           kAdminToken);
  ASSERT_EQ(w.status, 200u) << w.body;
  EXPECT_NE(w.body.find(R"("router":{"fragment":"all-split","node":"n1"})"), std::string::npos) << w.body;
  for (int b = 51; b <= 80; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));

  // The entry shows the new fragments where they run and records the split.
  auto q = parse(node(1).request("GET", "/v1/queries/cut", {}, kReaderToken).body);
  ASSERT_TRUE(q.IsObject() && q.HasMember("fragments") && q.HasMember("splits")) << "GET /v1/queries/cut";
  std::map<std::string, std::string> where;
  for (const auto& f : q["fragments"].GetArray()) where[f["name"].GetString()] = f["node"].GetString();
  EXPECT_EQ(where.count("c"), 0u);
  EXPECT_EQ(where["c-split"], "n3");
  EXPECT_EQ(where["c-0"], "n1");
  EXPECT_EQ(where["c-1"], "n3");
  EXPECT_EQ(where["c-merge"], "n3");
  ASSERT_EQ(q["splits"].Size(), 1u);
  EXPECT_STREQ(q["splits"][0]["fragment"].GetString(), "c");
  EXPECT_FALSE(q["splits"][0].HasMember("original"));

  // Both parts count rows once split.
  for (const auto& [part, n] : std::vector<std::pair<std::string, int>>{{"c-0", 1}, {"c-1", 3}}) {
    uint64_t in = 0;
    EXPECT_TRUE(eventually(30.0, [&, part = part, n = n] {
      auto f = parse(node(n).request("GET", "/v1/queries/cut/fragments/" + part, {}, kReaderToken).body);
      in = 0;
      if (f.IsObject() && f.HasMember("boxes") && f["boxes"].IsArray())
        for (const auto& b : f["boxes"].GetArray())
          if (b.HasMember("tuples_in")) in += b["tuples_in"].GetUint64();
      return in > 0;
    })) << part << " counted nothing";
  }
  // A split fragment is split once: its parts are fragments of their own,
  // not split again until it is merged back.
  expect_refused(1, "c", R"({"parts":[{"node":"n1"},{"node":"n2"}]})", 404, "has no fragment 'c'");
  expect_refused(1, "c-0", R"({"parts":[{"node":"n1"},{"node":"n2"}]})", 409,
                 "fragment c-0 is the router, a part or the merge of the split of fragment c: merge c back");
  auto no_split = node(1).request("POST", "/v1/queries/cut/fragments/b/merge", "", kAdminToken);
  EXPECT_EQ(no_split.status, 404u) << no_split.body;
  EXPECT_NE(no_split.body.find("has no split fragment 'b'"), std::string::npos) << no_split.body;

  // Merged back mid-stream, through a part's node.
  auto m = node(1).request("POST", "/v1/queries/cut/fragments/c/merge", "", kAdminToken);
  ASSERT_EQ(m.status, 200u) << m.body;
  std::printf("merge of c: %s\n", m.body.c_str());
  auto md = parse(m.body);
  EXPECT_STREQ(md["state"].GetString(), "merged");
  EXPECT_TRUE(md["checkpointed"].GetBool());
  for (int b = 81; b <= kBatches; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));
  ASSERT_NO_FATAL_FAILURE(publish(0));

  q = parse(node(2).request("GET", "/v1/queries/cut", {}, kReaderToken).body);
  ASSERT_TRUE(q.IsObject() && q.HasMember("fragments") && q.HasMember("splits"));
  where.clear();
  for (const auto& f : q["fragments"].GetArray()) where[f["name"].GetString()] = f["node"].GetString();
  EXPECT_EQ(where.size(), 3u);
  EXPECT_EQ(where["c"], "n3");
  EXPECT_TRUE(q["splits"][0].HasMember("merged_at_ms"));
  EXPECT_STREQ(q["state"].GetString(), "running");
  // The parts are gone from their nodes.
  EXPECT_EQ(node(1).request("GET", "/v1/queries/cut/fragments/c-0", {}, kReaderToken).status, 404u);

  int64_t total = 0;
  ASSERT_NO_FATAL_FAILURE(
      expect_cut_output_equals_whole(node(1), node(3), kAllTumblingRows, 90s, total));
  EXPECT_EQ(total, int64_t{kBatches} * kRowsPerBatch) << "the counts do not add up to every tuple published";
}

// After the split each new fragment is a fragment like any other: kill -9
// of the node running the router, the merge and one part (restarted 20
// batches later), then of the node leading bids and running the other
// part (restarted at once), while the producer publishes: the output is
// still the whole query's, row for row; deleting the query leaves no
// internal stream of it on any node.
TEST_F(ClusterSplit, SplitFragmentsRecoverAcrossKillNineOfTheirNodes) {
  ASSERT_EQ(node(2).request("POST", "/v1/streams",
                            R"({"name":"bids","node":"n1","schema":)" + std::string(kCutBidSchema) + "}")
                .status,
            201u);
  auto whole = node(1).request("POST", "/v1/queries", cut_count_query("whole", "counts-whole", R"({"node":"n1"})"));
  ASSERT_EQ(whole.status, 201u) << whole.body;
  auto cut = node(3).request(
      "POST", "/v1/queries",
      cut_count_query("cut", "counts-cut",
                      R"({"fragments":[{"name":"a","node":"n1","boxes":["keep"]},)"
                      R"({"name":"b","node":"n2","boxes":["cents"]},{"name":"c","node":"n3","boxes":["counts"]}]})"));
  ASSERT_EQ(cut.status, 201u) << cut.body;
  for (int b = 1; b <= 20; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));
  auto r = split(2, "c", R"({"parts":[{"node":"n1"},{"node":"n3"}]})");
  ASSERT_EQ(r.status, 200u) << r.body;

  auto wait_through = [&](int b) {
    const uint64_t want = static_cast<uint64_t>(b / 10) * kAuctions;
    uint64_t got = 0;
    ASSERT_TRUE(eventually(30.0, [&] {
      for (FedNode* n : nodes_) {
        if (!n->running()) continue;
        got = next_seq(n->process(), "counts-cut") - 1;
        return got >= want;
      }
      return false;
    })) << "the cut query's output has " << got << " rows after batch " << b << ", expected " << want;
  };
  for (int b = 21; b <= kBatches; ++b) {
    if (b == 40 || b == 80) {
      ASSERT_NO_FATAL_FAILURE(wait_through(b - 1));
    }
    if (b == 40) nodes_[2]->process().kill();
    if (b == 60) {
      ASSERT_TRUE(nodes_[2]->start()) << nodes_[2]->last_error();
    }
    if (b == 80) {
      nodes_[0]->process().kill();
      std::this_thread::sleep_for(300ms);
      ASSERT_TRUE(nodes_[0]->start()) << nodes_[0]->last_error();
    }
    const std::string problem = post_through_any(
        processes(), static_cast<size_t>(b),
        "/v1/streams/bids/tuples?producer_id=p&producer_seq=" + std::to_string(b), batch(b));
    ASSERT_TRUE(problem.empty()) << "batch " << b << ": " << problem;
  }
  ASSERT_NO_FATAL_FAILURE(publish(0));
  ASSERT_TRUE(eventually(30.0, [&] { return all_up(); }));

  int64_t total = 0;
  ASSERT_NO_FATAL_FAILURE(expect_cut_output_equals_whole(node(2), node(2), kAllTumblingRows, 90s, total));
  EXPECT_EQ(total, int64_t{kBatches} * kRowsPerBatch) << "the counts do not add up to every tuple published";

  auto del = node(1).request("DELETE", "/v1/queries/cut", {}, kAdminToken);
  ASSERT_EQ(del.status, 204u) << del.body;
  for (int i = 1; i <= 3; ++i) {
    std::string all;
    EXPECT_TRUE(eventually(10.0, [&] {
      all = node(i).request("GET", "/v1/streams?internal=true", {}, kReaderToken).body;
      return all.find("cut--") == std::string::npos;
    })) << "node " << i << ": " << all;
  }
}

// NEXMark q5's shape: a sliding count per auction (2 s windows every
// 500 ms). Split into three uneven parts over the three nodes, merged back,
// split again into two: the output is the whole query's row for row.
TEST_F(ClusterSplit, ASlidingCountSplitInThreeMergedAndSplitAgainMatchesTheWholeQuery) {
  ASSERT_EQ(node(1).request("POST", "/v1/streams",
                            R"({"name":"bids","node":"n1","schema":)" + std::string(kCutBidSchema) + "}")
                .status,
            201u);
  auto sliding = [](std::string q) {
    const std::string tumbling = R"("window":{"type":"tumbling","size":"1s"})";
    return q.replace(q.find(tumbling), tumbling.size(), R"("window":{"type":"sliding","size":"2s","slide":"500ms"})");
  };
  auto whole = node(1).request("POST", "/v1/queries",
                               sliding(cut_count_query("whole", "counts-whole", R"({"node":"n1"})")));
  ASSERT_EQ(whole.status, 201u) << whole.body;
  auto cut = node(2).request(
      "POST", "/v1/queries",
      sliding(cut_count_query("cut", "counts-cut",
                              R"({"fragments":[{"name":"a","node":"n1","boxes":["keep"]},)"
                              R"({"name":"b","node":"n2","boxes":["cents"]},)"
                              R"({"name":"c","node":"n2","boxes":["counts"]}]})")));
  ASSERT_EQ(cut.status, 201u) << cut.body;

  for (int b = 1; b <= 30; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));
  auto r = split(3, "c",
                 R"({"parts":[{"node":"n1","range":[0,20]},{"node":"n2","range":[20,90]},)"
                 R"({"node":"n3","range":[90,128]}]})");
  ASSERT_EQ(r.status, 200u) << r.body;
  std::printf("split of c in three: %s\n", r.body.c_str());
  for (int b = 31; b <= 60; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));
  auto m = node(3).request("POST", "/v1/queries/cut/fragments/c/merge", "", kAdminToken);
  ASSERT_EQ(m.status, 200u) << m.body;
  std::printf("merge of c: %s\n", m.body.c_str());
  for (int b = 61; b <= 90; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));
  r = split(1, "c", R"({"parts":[{"node":"n3"},{"node":"n1"}]})");
  ASSERT_EQ(r.status, 200u) << r.body;
  std::printf("split of c in two: %s\n", r.body.c_str());
  for (int b = 91; b <= kBatches; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));
  ASSERT_NO_FATAL_FAILURE(publish(0));

  auto q = parse(node(1).request("GET", "/v1/queries/cut", {}, kReaderToken).body);
  ASSERT_TRUE(q.IsObject() && q.HasMember("splits") && q["splits"].IsArray());
  ASSERT_EQ(q["splits"].Size(), 2u);
  EXPECT_TRUE(q["splits"][0].HasMember("merged_at_ms"));
  EXPECT_EQ(q["splits"][0]["parts"].Size(), 3u);
  EXPECT_FALSE(q["splits"][1].HasMember("merged_at_ms"));

  // Each tuple counts in the 4 windows that hold it.
  int64_t total = 0;
  ASSERT_NO_FATAL_FAILURE(
      expect_cut_output_equals_whole(node(1), node(2), kAllSlidingRows, 90s, total));
  EXPECT_EQ(total, 4 * int64_t{kBatches} * kRowsPerBatch) << "the counts do not add up to every tuple published";
}

}  // namespace
}  // namespace entente::testing
