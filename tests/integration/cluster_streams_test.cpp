// A domain of three real broker processes and one real etcd
// (docs/cluster.md): streams and queries created through any node, placed
// on one (by the controller, or where the request says), and every call
// about them answered by any node: HTTP requests and WebSocket sessions are
// forwarded to the node that leads the stream or runs the query. Faults:
// the forwarding node killed mid-publish (the producer's retry through
// another node stores nothing twice), the controller killed (a deploy
// afterwards works), etcd paused (tuples keep flowing, a deploy answers
// 503, everything converges when etcd is back).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
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

using Clock = std::chrono::steady_clock;

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  return d;
}

std::string field(const std::string& body, const char* name) {
  auto d = parse(body);
  if (!d.IsObject() || !d.HasMember(name) || !d[name].IsString()) return "";
  return d[name].GetString();
}

const char* kPriceSchema = R"([{"name":"auction","type":"int64"},{"name":"price","type":"int64"}])";

std::string stream_body(const std::string& name, const std::string& node = "") {
  return R"({"name":")" + name + R"(","schema":)" + kPriceSchema +
         (node.empty() ? std::string() : R"(,"node":")" + node + "\"") + "}";
}

// Expensive bids: a filter from `input` to `output`.
std::string query_body(const std::string& name, const std::string& input, const std::string& output,
                       const std::string& placement = "") {
  return R"({"name":")" + name + R"(","inputs":[{"name":")" + input + R"(","schema":)" + kPriceSchema +
         R"(}],"boxes":[{"id":"hot","type":"filter","options":{"predicates":["price >= 100"],)"
         R"("drop_unmatched":true}}],"arcs":[{"from":")" + input + R"(","to":"hot"}],"outputs":[{"name":")" +
         output + R"(","from":"hot"}])" + (placement.empty() ? std::string() : R"(,"placement":)" + placement) + "}";
}

class ClusterStreams : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
    etcd_ = std::make_unique<EtcdProcess>("etcd-streams");
    ASSERT_TRUE(etcd_->start()) << etcd_->last_error();
    for (const char* name : {"n1", "n2", "n3"}) {
      BrokerOptions o;
      o.node = name;
      o.extra_config = R"("checkpoint_interval": "200ms", )" + cluster_section(*etcd_);
      nodes_.push_back(std::make_unique<BrokerProcess>(o));
    }
    for (auto& n : nodes_) ASSERT_TRUE(n->start()) << n->last_error();
    ASSERT_TRUE(eventually(20, [&] { return !controller().empty(); }));
  }

  BrokerProcess& node(const std::string& name) { return *nodes_.at(static_cast<size_t>(name.back() - '1')); }

  // The controller every running node names, once they agree and all
  // running nodes are up in every view.
  std::string controller() {
    std::string c;
    for (auto& n : nodes_) {
      if (n->pid() <= 0) continue;
      auto r = n->try_request("GET", "/v1/nodes", {}, kReaderToken);
      if (!r.ok() || r->status != 200) return "";
      auto d = parse(r->body);
      if (!d.IsObject() || !d["controller"].IsString() || !d["etcd"]["reachable"].GetBool()) return "";
      if (d["nodes"].Size() != nodes_.size()) return "";  // every node registered, in every view
      for (const auto& m : d["nodes"].GetArray()) {
        const bool running = node(m["node"].GetString()).pid() > 0;
        if (running != (std::string(m["state"].GetString()) == "up")) return "";
      }
      if (!c.empty() && c != d["controller"].GetString()) return "";
      c = d["controller"].GetString();
    }
    return c;
  }

  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<std::unique_ptr<BrokerProcess>> nodes_;
};

TEST_F(ClusterStreams, CreatedOnOneNodePublishedThroughASecondSubscribedThroughAThird) {
  // Created through n2, to be led by n1.
  auto created = node("n2").request("POST", "/v1/streams", stream_body("bids", "n1"));
  ASSERT_EQ(created.status, 201u) << created.body;
  EXPECT_EQ(field(created.body, "node"), "n1");
  // Every node lists it, led by n1.
  for (auto& n : nodes_) {
    ASSERT_TRUE(eventually(10, [&] {
      auto r = n->request("GET", "/v1/streams", {}, kReaderToken);
      return r.body.find(R"("name":"bids")") != std::string::npos &&
             r.body.find(R"("node":"n1")") != std::string::npos;
    })) << n->request("GET", "/v1/streams", {}, kReaderToken).body;
  }
  // HTTP ingest through n2, forwarded to n1.
  auto posted = node("n2").request("POST", "/v1/streams/bids/tuples",
                                   R"([{"auction":1,"price":50},{"auction":2,"price":150}])", kPublisherToken);
  ASSERT_EQ(posted.status, 200u) << posted.body;
  // WebSocket publish through n2, forwarded to n1.
  auto options = node("n2").client_options();
  auto pub = http::WsClient::connect(options, "/v1/streams/bids/publish",
                                     {{"authorization", std::string("Bearer ") + kPublisherToken}});
  ASSERT_TRUE(pub.ok()) << pub.error().message;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE((*pub)->send(R"([{"auction":)" + std::to_string(10 + i) + R"(,"price":)" +
                             std::to_string(100 + i) + "}]")
                    .ok());
    auto ack = (*pub)->receive(10'000);
    ASSERT_TRUE(ack.ok()) << ack.error().message;
    EXPECT_NE(ack->data.find(R"("ack")"), std::string::npos) << ack->data;
  }
  (void)(*pub)->close();
  // WebSocket subscribe through n3, forwarded to n1: every tuple once, in
  // order, with n1's sequence numbers.
  ReadResult got = read_stream(node("n3"), "bids", 1, 12);
  ASSERT_EQ(got.tuples.size(), 12u) << got.error << " " << got.close_reason;
  for (size_t i = 0; i < got.tuples.size(); ++i) EXPECT_EQ(got.tuples[i].seq, i + 1);
  // GET through n3: n1's positions.
  auto info = node("n3").request("GET", "/v1/streams/bids", {}, kReaderToken);
  ASSERT_EQ(info.status, 200u) << info.body;
  EXPECT_EQ(parse(info.body)["next_seq"].GetUint64(), 13u);
  EXPECT_EQ(field(info.body, "node"), "n1");
  // n2 counted what it forwarded to n1.
  auto metrics = node("n2").request("GET", "/metrics", {}, kReaderToken);
  EXPECT_NE(metrics.body.find(R"(entente_cluster_forwarded_total{kind="http",node="n1"})"), std::string::npos)
      << metrics.body.substr(0, 2000);
  EXPECT_NE(metrics.body.find(R"(entente_cluster_forwarded_total{kind="websocket",node="n1"} 1)"), std::string::npos);
  EXPECT_NE(metrics.body.find("entente_cluster_etcd_reachable 1"), std::string::npos);
  EXPECT_NE(metrics.body.find("entente_cluster_nodes_up 3"), std::string::npos);
  // The same name again, through any node: 409.
  auto again = node("n3").request("POST", "/v1/streams", stream_body("bids"));
  EXPECT_EQ(again.status, 409u) << again.body;
  EXPECT_NE(again.body.find("led by n1"), std::string::npos) << again.body;
}

TEST_F(ClusterStreams, TheControllerPlacesStreamsAndBadPlacementsAreRefused) {
  std::set<std::string> leaders;
  std::string s0_leader;
  for (int i = 0; i < 3; ++i) {
    auto r = nodes_[static_cast<size_t>(i)]->request("POST", "/v1/streams", stream_body("s" + std::to_string(i)));
    ASSERT_EQ(r.status, 201u) << r.body;
    leaders.insert(field(r.body, "node"));
    if (i == 0) s0_leader = field(r.body, "node");
    // The controller places by the catalog, which its watch brings
    // up to date within milliseconds of the leader's write.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }
  EXPECT_EQ(leaders.size(), 3u) << "the least loaded node leads each new stream";
  auto unknown = node("n1").request("POST", "/v1/streams", stream_body("x", "n9"));
  EXPECT_EQ(unknown.status, 400u);
  EXPECT_NE(unknown.body.find("$.node: n9 is not a node of domain acme (its nodes: n1, n2, n3)"), std::string::npos)
      << unknown.body;
  auto bad_query = node("n2").request("POST", "/v1/queries", query_body("q", "s0", "out", R"({"node":"n7"})"));
  EXPECT_EQ(bad_query.status, 400u) << bad_query.body;
  EXPECT_NE(bad_query.body.find("$.placement.node: n7 is not a node"), std::string::npos) << bad_query.body;
  // Placed on a node that does not lead its input: the node could not
  // read it.
  const std::string elsewhere = s0_leader == "n1" ? "n2" : "n1";
  auto misplaced = node("n3").request("POST", "/v1/queries",
                                      query_body("q", "s0", "out", R"({"node":")" + elsewhere + "\"}"));
  EXPECT_EQ(misplaced.status, 400u) << misplaced.body;
  EXPECT_NE(misplaced.body.find("$.inputs[0].name: no stream 's0' on " + elsewhere + " (" + s0_leader + " leads it)"),
            std::string::npos)
      << misplaced.body;
  EXPECT_EQ(node("n3").request("GET", "/v1/queries/q", {}, kReaderToken).status, 404u);
}

TEST_F(ClusterStreams, AQueryDeployedThroughAnyNodeRunsNextToItsInputAndIsReadEverywhere) {
  ASSERT_EQ(node("n1").request("POST", "/v1/streams", stream_body("bids", "n3")).status, 201u);
  // Deployed through n1 (controller or not): it runs on n3, next to bids.
  auto deployed = node("n1").request("POST", "/v1/queries", query_body("hot-bids", "bids", "hot"));
  ASSERT_EQ(deployed.status, 201u) << deployed.body;
  for (auto& n : nodes_) {
    ASSERT_TRUE(eventually(10, [&] {
      auto r = n->request("GET", "/v1/queries", {}, kReaderToken);
      return r.body.find(R"("name":"hot-bids")") != std::string::npos;
    }));
  }
  auto q = node("n2").request("GET", "/v1/queries/hot-bids", {}, kReaderToken);
  ASSERT_EQ(q.status, 200u) << q.body;
  EXPECT_EQ(field(q.body, "state"), "running");
  EXPECT_NE(q.body.find(R"("placement":"acme/n3")"), std::string::npos) << q.body;
  // In a domain of several nodes it runs as a cut of one fragment, "all",
  // so that it fails over (docs/cluster.md, "Whole queries fail over too").
  EXPECT_EQ(field(q.body, "node"), "n3") << q.body;
  EXPECT_NE(q.body.find(R"("fragments":[{"name":"all","node":"n3")"), std::string::npos) << q.body;
  EXPECT_EQ(node("n1").request("GET", "/v1/streams/hot-bids--all--state", {}, kReaderToken).status, 200u);
  // Published through n1, read from the output through n2.
  ASSERT_EQ(node("n1")
                .request("POST", "/v1/streams/bids/tuples",
                         R"([{"auction":1,"price":50},{"auction":2,"price":150},{"auction":3,"price":300}])",
                         kPublisherToken)
                .status,
            200u);
  ReadResult hot = read_stream(node("n2"), "hot", 1, 2);
  ASSERT_EQ(hot.tuples.size(), 2u) << hot.error << hot.close_reason;
  EXPECT_NE(hot.tuples[0].line.find(R"("price":150)"), std::string::npos) << hot.tuples[0].line;
  EXPECT_NE(hot.tuples[1].line.find(R"("price":300)"), std::string::npos) << hot.tuples[1].line;
  // Stopped, started and replaced through any node (cluster_lifecycle_test
  // has the rest): the replacement runs as the fragment's next generation.
  auto stopped = node("n1").request("POST", "/v1/queries/hot-bids/stop");
  EXPECT_EQ(stopped.status, 200u) << stopped.body;
  EXPECT_EQ(field(stopped.body, "state"), "stopped") << stopped.body;
  // Replaced while stopped: it stays stopped.
  auto put = node("n1").request("PUT", "/v1/queries/hot-bids", query_body("hot-bids", "bids", "hot"));
  EXPECT_EQ(put.status, 200u) << put.body;
  EXPECT_NE(put.body.find(R"("fragments":[{"name":"all-2","node":"n3")"), std::string::npos) << put.body;
  EXPECT_EQ(field(put.body, "state"), "stopped") << put.body;
  auto started = node("n2").request("POST", "/v1/queries/hot-bids/start");
  EXPECT_EQ(started.status, 200u) << started.body;
  EXPECT_EQ(field(started.body, "state"), "running") << started.body;
  EXPECT_EQ(field(node("n2").request("GET", "/v1/queries/hot-bids", {}, kReaderToken).body, "state"), "running");
  // Deleted through n2: gone everywhere, its output too.
  EXPECT_EQ(node("n2").request("DELETE", "/v1/queries/hot-bids").status, 204u);
  ASSERT_TRUE(eventually(10, [&] {
    return node("n1").request("GET", "/v1/queries/hot-bids", {}, kReaderToken).status == 404 &&
           node("n1").request("GET", "/v1/streams/hot", {}, kReaderToken).status == 404;
  }));
}

TEST_F(ClusterStreams, InputsOnTwoNodesWithoutAPlacementAreRefusedWithHowToCut) {
  ASSERT_EQ(node("n1").request("POST", "/v1/streams", stream_body("a", "n1")).status, 201u);
  ASSERT_EQ(node("n1").request("POST", "/v1/streams", stream_body("b", "n2")).status, 201u);
  const std::string body =
      R"({"name":"u","inputs":[{"name":"a","schema":)" + std::string(kPriceSchema) +
      R"(},{"name":"b","schema":)" + kPriceSchema +
      R"(}],"boxes":[{"id":"both","type":"union"}],"arcs":[{"from":"a","to":"both.0"},{"from":"b","to":"both.1"}],)"
      R"("outputs":[{"name":"ab","from":"both"}]})";
  auto r = node("n3").request("POST", "/v1/queries", body);
  EXPECT_EQ(r.status, 409u) << r.body;
  EXPECT_NE(r.body.find("a on n1, b on n2"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("placement"), std::string::npos) << r.body;
  auto cut = node("n3").request("POST", "/v1/queries",
                                query_body("c", "a", "ca", R"({"fragments":[{"node":"n1","boxes":["hot"]}]})"));
  EXPECT_EQ(cut.status, 400u) << cut.body;
}

TEST_F(ClusterStreams, AProducerRetryThroughAnotherNodeAfterTheForwarderDiesStoresNothingTwice) {
  ASSERT_EQ(node("n1").request("POST", "/v1/streams", stream_body("bids", "n1")).status, 201u);
  ASSERT_TRUE(eventually(10, [&] { return node("n2").request("GET", "/v1/streams/bids", {}, kReaderToken).status == 200; }));
  // Batches 1..40 named by producer "p", sent through n2; n2 is killed after
  // batch 20 was sent (its answer possibly lost); the producer resends from
  // batch 15 through n3.
  auto post = [&](BrokerProcess& via, int batch) {
    return via.try_request("POST", "/v1/streams/bids/tuples?producer_id=p&producer_seq=" + std::to_string(batch),
                           R"([{"auction":)" + std::to_string(batch) + R"(,"price":1},{"auction":)" +
                               std::to_string(batch) + R"(,"price":2}])",
                           kPublisherToken);
  };
  for (int b = 1; b <= 20; ++b) {
    auto r = post(node("n2"), b);
    ASSERT_TRUE(r.ok() && r->status == 200) << (r.ok() ? r->body : r.error().message);
  }
  node("n2").kill();
  for (int b = 15; b <= 40; ++b) {
    auto r = post(node("n3"), b);
    ASSERT_TRUE(r.ok() && r->status == 200) << (r.ok() ? r->body : r.error().message);
  }
  ReadResult all = read_stream(node("n3"), "bids", 1, 80);
  ASSERT_EQ(all.tuples.size(), 80u) << all.error;
  std::map<std::string, int> seen;
  for (const auto& t : all.tuples) seen[t.line.substr(t.line.find("\"auction\""))]++;
  EXPECT_EQ(seen.size(), 80u);  // (auction, price) pairs: every one once
  auto info = node("n1").request("GET", "/v1/streams/bids", {}, kReaderToken);
  EXPECT_EQ(parse(info.body)["next_seq"].GetUint64(), 81u) << info.body;
}

TEST_F(ClusterStreams, AfterTheControllerIsKilledADeployWorks) {
  ASSERT_EQ(node("n1").request("POST", "/v1/streams", stream_body("bids", "n1")).status, 201u);
  const std::string first = controller();
  ASSERT_FALSE(first.empty());
  node(first).kill();
  std::string second;
  ASSERT_TRUE(eventually(20, [&] { return !(second = controller()).empty(); }));
  EXPECT_NE(second, first);
  // Through a survivor that is not the new controller when there is one.
  BrokerProcess* via = nullptr;
  for (auto& n : nodes_) {
    if (n->pid() > 0 && n.get() != &node(second)) via = n.get();
  }
  ASSERT_NE(via, nullptr);
  // bids is on n1; when n1 was the one killed the query goes elsewhere
  // only if asked, so create a fresh input on the survivors.
  ASSERT_EQ(via->request("POST", "/v1/streams", stream_body("asks")).status, 201u);
  auto deployed = via->request("POST", "/v1/queries", query_body("hot-asks", "asks", "hot-asks-out"));
  ASSERT_EQ(deployed.status, 201u) << deployed.body;
}

TEST_F(ClusterStreams, EtcdPausedTuplesFlowDeploysWaitAndEverythingConverges) {
  ASSERT_EQ(node("n1").request("POST", "/v1/streams", stream_body("bids", "n1")).status, 201u);
  ASSERT_TRUE(eventually(10, [&] { return node("n2").request("GET", "/v1/streams/bids", {}, kReaderToken).status == 200; }));
  etcd_->pause();
  // Forwarded ingest keeps working: the catalog and the members are known.
  for (int i = 0; i < 5; ++i) {
    auto r = node("n2").request("POST", "/v1/streams/bids/tuples", R"([{"auction":1,"price":)" +
                                                                        std::to_string(i) + "}]",
                                kPublisherToken);
    EXPECT_EQ(r.status, 200u) << r.body;
  }
  // A deploy needs etcd: 503 with the reason, once the node noticed.
  ASSERT_TRUE(eventually(10, [&] {
    auto r = node("n2").request("POST", "/v1/queries", query_body("late", "bids", "late-out"));
    return r.status == 503 && r.body.find("etcd") != std::string::npos;
  }));
  auto created = node("n3").request("POST", "/v1/streams", stream_body("asks", "n3"));
  EXPECT_EQ(created.status, 503u) << created.body;
  etcd_->resume();
  std::string last;
  ASSERT_TRUE(eventually(20, [&] {
    auto r = node("n2").request("POST", "/v1/queries", query_body("late", "bids", "late-out"));
    last = std::to_string(r.status) + " " + r.body;
    return r.status == 201;
  })) << last;
  EXPECT_EQ(parse(node("n3").request("GET", "/v1/streams/bids", {}, kReaderToken).body)["next_seq"].GetUint64(),
            6u);
}

// A query whose name leaves no room for its fragment's ("NAME--all", at most
// 64 characters) runs whole, as in a domain of one node.
TEST_F(ClusterStreams, AQueryWhoseNameIsTooLongForAFragmentRunsWhole) {
  ASSERT_EQ(node("n1").request("POST", "/v1/streams", stream_body("bids", "n2")).status, 201u);
  const std::string name(62, 'q');
  auto deployed = node("n1").request("POST", "/v1/queries", query_body(name, "bids", "hot"));
  ASSERT_EQ(deployed.status, 201u) << deployed.body;
  auto q = node("n3").request("GET", "/v1/queries/" + name, {}, kReaderToken);
  ASSERT_EQ(q.status, 200u) << q.body;
  EXPECT_EQ(q.body.find(R"("fragments")"), std::string::npos) << q.body;
  EXPECT_NE(q.body.find(R"("placement":"acme/n2")"), std::string::npos) << q.body;
}

// A domain of one node (a cluster section, one member): a whole query runs
// whole, its journal and checkpoints in the node's store, as before.
TEST(ClusterStreamsOneNode, AWholeQueryInADomainOfOneNodeRunsWholeAsBefore) {
  if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
  EtcdProcess etcd("etcd-one-node");
  ASSERT_TRUE(etcd.start()) << etcd.last_error();
  BrokerOptions o;
  o.extra_config = R"("checkpoint_interval": "200ms", )" + cluster_section(etcd);
  BrokerProcess n1(o);
  ASSERT_TRUE(n1.start()) << n1.last_error();
  ASSERT_TRUE(eventually(20, [&] { return domain_up({&n1}, 1); }));
  ASSERT_EQ(n1.request("POST", "/v1/streams", stream_body("bids")).status, 201u);
  auto deployed = n1.request("POST", "/v1/queries", query_body("hot-bids", "bids", "hot"));
  ASSERT_EQ(deployed.status, 201u) << deployed.body;
  EXPECT_EQ(deployed.body.find(R"("fragments")"), std::string::npos) << deployed.body;
  EXPECT_NE(deployed.body.find(R"("placement":"acme/n1")"), std::string::npos) << deployed.body;
  auto streams = n1.request("GET", "/v1/streams?internal=true", {}, kReaderToken);
  EXPECT_EQ(streams.body.find("--state"), std::string::npos) << streams.body;
  // Its checkpoints are the store's.
  std::string checkpoints;
  ASSERT_TRUE(eventually(20, [&] {
    checkpoints = n1.request("GET", "/v1/checkpoints", {}, kReaderToken).body;
    return checkpoints.find(R"("query":"hot-bids")") != std::string::npos;
  })) << checkpoints;
  EXPECT_EQ(checkpoints.find("state_stream"), std::string::npos) << checkpoints;
}

}  // namespace
}  // namespace entente::testing
