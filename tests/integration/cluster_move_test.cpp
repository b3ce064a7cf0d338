// Moving a running fragment to another node of its domain (docs/cluster.md,
// "Moving a fragment"): acme is three real broker processes sharing one
// real etcd, with peer links; a query cut in three fragments (filter on n1
// next to bids, map on n2, a 1 s tumbling count per auction on n3) runs
// beside the same query whole on n1. While the producer publishes, the
// stateful fragment is moved n3 → n1 → n2 and the map n2 → n3; the answer
// of each move says where it went and how long the fragment paused, the
// query's entry records the move and why, and at the end the cut query's
// output equals the whole one row for row, numbered without gap or repeat,
// and a live `entente subscribe` of the output, resuming each time the
// stream's leadership moves under it (close 4010), printed every row once.
// Refusals are checked on the way: an unknown node, the node it runs on, a
// fragment that reads a user stream, an unknown fragment, a bad body.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

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

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  return d;
}

class ClusterMove : public ThreeNodeDomain {
 protected:
  ClusterMove() : ThreeNodeDomain("etcd-move", R"("checkpoint_interval": "200ms", )") {}

  static std::string batch(int b) { return cut_bid_batch(b, kBatches, kRowsPerBatch, kAuctions); }

  void publish(int b) {
    const std::string problem = post_through_any(
        processes(), 0,
        "/v1/streams/bids/tuples?producer_id=p&producer_seq=" + std::to_string(b == 0 ? kBatches + 1 : b), batch(b));
    if (!problem.empty()) FAIL() << "batch " << b << ": " << problem;
  }

  http::ClientResponse move(int via, const std::string& fragment, const std::string& body) {
    return node(via).request("POST", "/v1/queries/cut/fragments/" + fragment + "/move", body, kAdminToken);
  }

  // The node the query's entry places `fragment` on, read through n2.
  std::string placed(const std::string& fragment) {
    auto d = parse(node(2).request("GET", "/v1/queries/cut", {}, kReaderToken).body);
    if (!d.IsObject() || !d.HasMember("fragments")) return {};
    for (const auto& f : d["fragments"].GetArray())
      if (f["name"].GetString() == fragment) return f["node"].GetString();
    return {};
  }

  // Moves `fragment` to `to` through node `via` and checks the answer.
  void expect_move(int via, const std::string& fragment, const std::string& from, const std::string& to) {
    auto r = move(via, fragment, R"({"node":")" + to + R"("})");
    ASSERT_EQ(r.status, 200u) << r.body;
    auto d = parse(r.body);
    ASSERT_TRUE(d.IsObject() && d.HasMember("pause_ms") && d.HasMember("steps_ms")) << r.body;
    EXPECT_STREQ(d["from"].GetString(), from.c_str()) << r.body;
    EXPECT_STREQ(d["to"].GetString(), to.c_str()) << r.body;
    EXPECT_STREQ(d["state"].GetString(), "moved") << r.body;
    EXPECT_GT(d["pause_ms"].GetDouble(), 0.0) << r.body;
    // The target warmed a standby from the fragment's checkpoint and
    // journal before the fragment stopped here.
    EXPECT_TRUE(d.HasMember("warm_standby") && d["warm_standby"].GetBool()) << r.body;
    std::printf("move of %s %s -> %s: %s\n", fragment.c_str(), from.c_str(), to.c_str(), r.body.c_str());
    EXPECT_EQ(placed(fragment), to);
    // The target continued from that standby rather than restoring the
    // checkpoint after the pause.
    const std::string metrics = node(to.back() - '0').request("GET", "/metrics", {}, kReaderToken).body;
    EXPECT_NE(metrics.find(R"(outcome="promoted")"), std::string::npos) << metrics;
    EXPECT_EQ(metrics.find(R"(outcome="fell_back")"), std::string::npos) << metrics;
  }
};

TEST_F(ClusterMove, AStatefulFragmentMovesBetweenNodesWhileItRunsAndTheOutputStaysExact) {
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

  // Refused, nothing moved: each names why.
  auto unknown = move(1, "c", R"({"node":"n9"})");
  EXPECT_EQ(unknown.status, 400u) << unknown.body;
  EXPECT_NE(unknown.body.find("n9 is not a node of domain acme"), std::string::npos) << unknown.body;
  auto same = move(2, "c", R"({"node":"n3"})");
  EXPECT_EQ(same.status, 409u) << same.body;
  EXPECT_NE(same.body.find("runs on n3 already"), std::string::npos) << same.body;
  auto reads_input = move(2, "a", R"({"node":"n2"})");
  EXPECT_EQ(reads_input.status, 409u) << reads_input.body;
  EXPECT_NE(reads_input.body.find("reads stream bids"), std::string::npos) << reads_input.body;
  auto no_fragment = move(1, "zz", R"({"node":"n2"})");
  EXPECT_EQ(no_fragment.status, 404u) << no_fragment.body;
  auto bad = move(1, "c", R"({"to":"n2"})");
  EXPECT_EQ(bad.status, 400u) << bad.body;
  auto reader = node(1).request("POST", "/v1/queries/cut/fragments/c/move", R"({"node":"n1"})", kReaderToken);
  EXPECT_EQ(reader.status, 403u) << reader.body;
  EXPECT_EQ(placed("c"), "n3");

  // Each move is made while the producer publishes.
  auto moving_while_publishing = [&](int first, int last, auto&& move_it) {
    std::thread producer([&] {
      for (int b = first; b <= last; ++b) {
        publish(b);
        std::this_thread::sleep_for(2ms);
      }
    });
    move_it();
    producer.join();
  };
  // A subscriber reading the output live through n3, where it is led
  // now: `entente subscribe`, which resumes by itself when the stream's
  // leadership moves (close 4010).
  const uint64_t want_rows = static_cast<uint64_t>(kBatches / 10) * kAuctions;
  std::string live;
  std::thread subscriber([&] {
    run_command(std::string("ENTENTE_TOKEN=") + kReaderToken + " " + ENTENTE_BIN + " subscribe --port " +
                    std::to_string(node(3).port()) + " --from 1 --count " + std::to_string(want_rows) +
                    " --timeout-ms 60000 counts-cut 2>&1",
                live);
  });
  struct JoinOnExit {
    std::thread& t;
    ~JoinOnExit() {
      if (t.joinable()) t.join();
    }
  } join_subscriber{subscriber};
  for (int b = 1; b <= 20; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));
  moving_while_publishing(21, 40, [&] { expect_move(1, "c", "n3", "n1"); });  // through the node it goes to
  moving_while_publishing(41, 70, [&] { expect_move(3, "c", "n1", "n2"); });  // through a third node
  moving_while_publishing(71, 100, [&] { expect_move(2, "b", "n2", "n3"); });  // the map, whose reader moved too
  ASSERT_FALSE(HasFailure());
  for (int b = 101; b <= kBatches; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));
  ASSERT_NO_FATAL_FAILURE(publish(0));

  // The entry says what moved, where and why.
  auto q = parse(node(3).request("GET", "/v1/queries/cut", {}, kReaderToken).body);
  ASSERT_TRUE(q.IsObject() && q.HasMember("moves") && q["moves"].IsArray());
  ASSERT_EQ(q["moves"].Size(), 3u);
  EXPECT_STREQ(q["moves"][0]["to"].GetString(), "n1");
  EXPECT_STREQ(q["moves"][1]["from"].GetString(), "n1");
  EXPECT_STREQ(q["moves"][2]["fragment"].GetString(), "b");
  EXPECT_NE(std::string(q["moves"][2]["reason"].GetString()).find("moved on request"), std::string::npos);
  // Each with the pause its move measured.
  for (const auto& mv : q["moves"].GetArray())
    EXPECT_TRUE(mv.HasMember("pause_ms") && mv["pause_ms"].IsNumber()) << mv["fragment"].GetString();

  int64_t total = 0;
  ASSERT_NO_FATAL_FAILURE(expect_cut_output_equals_whole(node(1), node(3), want_rows, 60s, total));
  // The live subscriber saw one stream across the moves: every sequence
  // number once, in order.
  subscriber.join();
  uint64_t expect_seq = 1;
  int resumed = 0;
  for (size_t at = 0; at < live.size();) {
    const size_t nl = live.find('\n', at);
    const std::string line = live.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    at = nl == std::string::npos ? live.size() : nl + 1;
    if (line.empty()) continue;
    // Its notes (stderr): each time the leadership moved under it.
    if (line.rfind("entente subscribe: led by ", 0) == 0 && line.find("resuming") != std::string::npos) {
      ++resumed;
      continue;
    }
    ASSERT_EQ(line.rfind("{\"_seq\":" + std::to_string(expect_seq) + ",", 0), 0u) << line;
    ++expect_seq;
  }
  EXPECT_EQ(expect_seq - 1, want_rows) << live.substr(0, 2000);
  EXPECT_GE(resumed, 1) << "the subscriber never saw the stream move: " << live.substr(0, 2000);
  EXPECT_EQ(total, int64_t{kBatches} * kRowsPerBatch) << "the counts do not add up to every tuple published";
}

}  // namespace
}  // namespace entente::testing
