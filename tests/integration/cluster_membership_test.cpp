// A domain of three real broker processes sharing one real etcd
// (docs/cluster.md): every node lists every node through GET /v1/nodes, one
// controller at a time; the controller's node killed with SIGKILL or
// stopped with SIGTERM: another takes the role; etcd stopped: the nodes keep
// serving (ingest included) and say etcd is unreachable, then converge when
// it is back; a node started before etcd registers once etcd runs.
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
#include "tests/support/etcd_process.h"

namespace entente::testing {
namespace {

using Clock = std::chrono::steady_clock;

// What one node says about its domain.
struct DomainView {
  bool ok = false;  // answered 200 with JSON
  bool cluster = false;
  bool etcd_reachable = false;
  std::string etcd_error;
  std::string controller;
  std::map<std::string, std::string> state;  // node → up/down
  std::map<std::string, std::string> role;   // node → controller/member
  std::string body;
};

DomainView nodes_of(const BrokerProcess& b) {
  DomainView v;
  auto r = b.try_request("GET", "/v1/nodes", {}, kReaderToken);
  if (!r.ok() || r->status != 200) return v;
  v.body = r->body;
  rapidjson::Document d;
  d.Parse(r->body.c_str());
  if (d.HasParseError() || !d.IsObject()) return v;
  v.ok = true;
  v.cluster = d["cluster"].GetBool();
  if (d["controller"].IsString()) v.controller = d["controller"].GetString();
  if (d.HasMember("etcd")) {
    v.etcd_reachable = d["etcd"]["reachable"].GetBool();
    if (d["etcd"].HasMember("error")) v.etcd_error = d["etcd"]["error"].GetString();
  }
  for (const auto& n : d["nodes"].GetArray()) {
    v.state[n["node"].GetString()] = n["state"].GetString();
    v.role[n["node"].GetString()] = n["role"].GetString();
  }
  return v;
}

class ClusterMembership : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
    etcd_ = std::make_unique<EtcdProcess>("etcd-membership");
    ASSERT_TRUE(etcd_->start()) << etcd_->last_error();
    for (const char* name : {"n1", "n2", "n3"}) {
      BrokerOptions o;
      o.node = name;
      o.extra_config = cluster_section();
      nodes_.push_back(std::make_unique<BrokerProcess>(o));
    }
    for (auto& n : nodes_) ASSERT_TRUE(n->start()) << n->last_error();
  }

  std::string cluster_section() const {
    return testing::cluster_section(*etcd_, lease_ttl_, "/test/acme/");
  }

  // Every running node in `expect_up` sees exactly those nodes up, the
  // others in `expect_down` down, and agrees on one controller among the
  // up ones; returns it ("" when not (yet) so).
  std::string agreed_controller(const std::set<std::string>& expect_up,
                                const std::set<std::string>& expect_down = {}) {
    std::string controller;
    for (auto& n : nodes_) {
      if (n->pid() <= 0) continue;
      DomainView v = nodes_of(*n);
      if (!v.ok || !v.cluster || !v.etcd_reachable || v.controller.empty()) return "";
      for (const auto& name : expect_up) {
        if (v.state[name] != "up") return "";
      }
      for (const auto& name : expect_down) {
        if (v.state[name] != "down") return "";
      }
      if (v.state.size() != expect_up.size() + expect_down.size()) return "";
      if (!expect_up.count(v.controller) || v.role[v.controller] != "controller") return "";
      if (!controller.empty() && controller != v.controller) return "";
      controller = v.controller;
    }
    return controller;
  }

  // "n1" → nodes_[0].
  BrokerProcess& node(const std::string& name) { return *nodes_.at(static_cast<size_t>(name.back() - '1')); }

  std::string lease_ttl_ = "2s";
  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<std::unique_ptr<BrokerProcess>> nodes_;
};

TEST_F(ClusterMembership, EveryNodeListsTheDomainWithOneController) {
  std::string controller;
  ASSERT_TRUE(eventually(20, [&] { return !(controller = agreed_controller({"n1", "n2", "n3"})).empty(); }))
      << nodes_of(*nodes_[0]).body;
  // Exactly one node is listed as controller.
  int controllers = 0;
  for (const auto& [name, role] : nodes_of(*nodes_[0]).role) controllers += role == "controller";
  EXPECT_EQ(controllers, 1);
  // Each entry says where the node's API is, and its load.
  auto r = nodes_[1]->request("GET", "/v1/nodes", {}, kReaderToken);
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  ASSERT_TRUE(d.IsObject()) << r.body;
  EXPECT_STREQ(d["self"].GetString(), "n2");
  EXPECT_STREQ(d["domain"].GetString(), "acme");
  for (const auto& n : d["nodes"].GetArray()) {
    const std::string name = n["node"].GetString();
    EXPECT_EQ(n["api"].GetString(), "http://127.0.0.1:" + std::to_string(node(name).port())) << r.body;
    ASSERT_TRUE(n.HasMember("load")) << r.body;
    EXPECT_TRUE(n["load"]["cpu"].IsNumber());
    EXPECT_TRUE(n["streams_led"].IsArray());
    EXPECT_TRUE(n["fragments"].IsArray());
  }
}

TEST_F(ClusterMembership, StreamsLedShowWhereEachStreamLives) {
  ASSERT_TRUE(eventually(20, [&] { return !agreed_controller({"n1", "n2", "n3"}).empty(); }));
  // Led by n3, created through n1.
  const std::string stream = R"({"name":"bids","schema":[{"name":"price","type":"int64"}],"node":"n3"})";
  auto created = nodes_[0]->request("POST", "/v1/streams", stream);
  ASSERT_EQ(created.status, 201u) << created.body;
  ASSERT_TRUE(eventually(20, [&] {
    auto r = nodes_[0]->try_request("GET", "/v1/nodes", {}, kReaderToken);
    if (!r.ok()) return false;
    rapidjson::Document d;
    d.Parse(r->body.c_str());
    if (!d.IsObject()) return false;
    for (const auto& n : d["nodes"].GetArray()) {
      if (std::string(n["node"].GetString()) != "n3" || !n.HasMember("streams_led")) continue;
      for (const auto& s : n["streams_led"].GetArray()) {
        if (std::string(s.GetString()) == "bids") return true;
      }
    }
    return false;
  }));
}

TEST_F(ClusterMembership, ANodeGoneForGoodIsForgottenOnlyWhenDownAndHoldingNothing) {
  ASSERT_TRUE(eventually(20, [&] { return !agreed_controller({"n1", "n2", "n3"}).empty(); }));
  ASSERT_EQ(nodes_[0]->request("POST", "/v1/streams",
                               R"({"name":"bids","schema":[{"name":"price","type":"int64"}],"node":"n2"})")
                .status,
            201u);
  EXPECT_EQ(nodes_[0]->request("DELETE", "/v1/nodes/n3").status, 409u);  // up
  EXPECT_EQ(nodes_[0]->request("DELETE", "/v1/nodes/n1").status, 409u);  // itself
  EXPECT_EQ(nodes_[0]->request("DELETE", "/v1/nodes/n9").status, 404u);
  EXPECT_EQ(nodes_[0]->request("DELETE", "/v1/nodes/n3", {}, kReaderToken).status, 403u);
  node("n3").kill();
  node("n2").kill();
  ASSERT_TRUE(eventually(20, [&] {
    DomainView v = nodes_of(*nodes_[0]);
    return v.state["n3"] == "down" && v.state["n2"] == "down";
  })) << nodes_of(*nodes_[0]).body;
  auto held = nodes_[0]->request("DELETE", "/v1/nodes/n2");
  EXPECT_EQ(held.status, 409u) << held.body;  // leads bids
  EXPECT_NE(held.body.find("stream bids"), std::string::npos) << held.body;
  auto gone = nodes_[0]->request("DELETE", "/v1/nodes/n3");
  EXPECT_EQ(gone.status, 204u) << gone.body;
  ASSERT_TRUE(eventually(20, [&] {
    DomainView v = nodes_of(*nodes_[0]);
    return v.ok && !v.state.count("n3") && v.state.count("n2");
  })) << nodes_of(*nodes_[0]).body;
}

TEST_F(ClusterMembership, AKilledControllerIsReplacedAndComesBackAsAMember) {
  std::string first;
  ASSERT_TRUE(eventually(20, [&] { return !(first = agreed_controller({"n1", "n2", "n3"})).empty(); }));
  node(first).kill();
  std::set<std::string> rest = {"n1", "n2", "n3"};
  rest.erase(first);
  // Its lease (2 s) expires, a survivor takes the role, and both survivors
  // list the dead node as down.
  const auto killed_at = Clock::now();
  std::string second;
  ASSERT_TRUE(eventually(20, [&] { return !(second = agreed_controller(rest, {first})).empty(); }))
      << nodes_of(node(*rest.begin())).body;
  EXPECT_NE(second, first);
  const double takeover_s = std::chrono::duration<double>(Clock::now() - killed_at).count();
  std::printf("controller %s killed; %s took over after %.2f s (lease TTL 2 s)\n", first.c_str(),
              second.c_str(), takeover_s);
  // Back: up again, a member; the controller stays where it is.
  ASSERT_TRUE(node(first).start()) << node(first).last_error();
  ASSERT_TRUE(eventually(20, [&] { return agreed_controller({"n1", "n2", "n3"}) == second; }))
      << nodes_of(node(first)).body;
}

// A long lease (10 s), so that only the revocation on SIGTERM can explain a
// quick handover.
class ClusterMembershipLongLease : public ClusterMembership {
 protected:
  void SetUp() override {
    lease_ttl_ = "10s";
    ClusterMembership::SetUp();
  }
};

TEST_F(ClusterMembershipLongLease, AStoppedControllerHandsTheRoleOverAtOnce) {
  std::string first;
  ASSERT_TRUE(eventually(20, [&] { return !(first = agreed_controller({"n1", "n2", "n3"})).empty(); }));
  EXPECT_EQ(node(first).terminate(), 0);
  std::set<std::string> rest = {"n1", "n2", "n3"};
  rest.erase(first);
  const auto stopped_at = Clock::now();
  std::string second;
  ASSERT_TRUE(eventually(20, [&] { return !(second = agreed_controller(rest, {first})).empty(); }));
  const double handover_s = std::chrono::duration<double>(Clock::now() - stopped_at).count();
  std::printf("controller %s stopped; %s took over after %.2f s\n", first.c_str(), second.c_str(), handover_s);
  // The revoked lease deletes the controller key; the survivors watch it
  // and campaign at once, long before the lease would have expired (10 s)
  // or their next tick (3.3 s). The bound is loose for a loaded machine;
  // the figure is printed above.
  EXPECT_LT(handover_s, 2.0);
}

TEST_F(ClusterMembership, EtcdStoppedTheNodesKeepServingAndConverge) {
  std::string controller;
  ASSERT_TRUE(eventually(20, [&] { return !(controller = agreed_controller({"n1", "n2", "n3"})).empty(); }));
  ASSERT_EQ(nodes_[0]->request("POST", "/v1/streams",
                               R"({"name":"bids","schema":[{"name":"price","type":"int64"}],"node":"n1"})")
                .status,
            201u);
  etcd_->pause();  // SIGSTOP: connections hang rather than being refused
  for (auto& n : nodes_) {
    ASSERT_TRUE(eventually(10, [&] {
      DomainView v = nodes_of(*n);
      return v.ok && !v.etcd_reachable && !v.etcd_error.empty();
    })) << nodes_of(*n).body;
  }
  // The data path does not wait for etcd.
  for (int i = 0; i < 5; ++i) {
    auto r = nodes_[0]->request("POST", "/v1/streams/bids/tuples", R"([{"price": )" + std::to_string(i) + "}]",
                                kPublisherToken);
    EXPECT_EQ(r.status, 200u) << r.body;
  }
  auto listed = nodes_[0]->request("GET", "/v1/streams/bids", {}, kReaderToken);
  EXPECT_EQ(listed.status, 200u);
  EXPECT_NE(listed.body.find("\"next_seq\":6"), std::string::npos) << listed.body;
  etcd_->resume();
  ASSERT_TRUE(eventually(20, [&] { return !agreed_controller({"n1", "n2", "n3"}).empty(); }))
      << nodes_of(*nodes_[0]).body;
}

TEST(ClusterMembershipStart, ANodeStartedBeforeEtcdRegistersWhenItRuns) {
  if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
  EtcdProcess etcd("etcd-late");
  BrokerOptions o;
  o.extra_config = cluster_section(etcd);
  BrokerProcess n1(o);
  ASSERT_TRUE(n1.start()) << n1.last_error();
  ASSERT_TRUE(eventually(10, [&] {
    DomainView v = nodes_of(n1);
    return v.ok && v.cluster && !v.etcd_reachable;
  })) << nodes_of(n1).body;
  EXPECT_NE(nodes_of(n1).etcd_error.find("127.0.0.1:" + std::to_string(etcd.client_port())), std::string::npos)
      << nodes_of(n1).body;
  ASSERT_TRUE(etcd.start()) << etcd.last_error();
  ASSERT_TRUE(eventually(20, [&] {
    DomainView v = nodes_of(n1);
    return v.ok && v.etcd_reachable && v.controller == "n1" && v.state["n1"] == "up";
  })) << nodes_of(n1).body;
}

TEST(ClusterMembershipStart, NodesWhoseTokensDifferAreFlagged) {
  if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
  EtcdProcess etcd("etcd-tokens");
  ASSERT_TRUE(etcd.start()) << etcd.last_error();
  const std::string cluster = cluster_section(etcd);
  BrokerOptions a, b;
  a.node = "n1";
  a.extra_config = cluster;
  b.node = "n2";
  b.extra_config = cluster;
  b.extra_tokens = R"({"name":"extra","role":"reader","sha256":")" + std::string(64, 'a') + R"("})";
  BrokerProcess n1(a), n2(b);
  ASSERT_TRUE(n1.start()) << n1.last_error();
  ASSERT_TRUE(n2.start()) << n2.last_error();
  ASSERT_TRUE(eventually(20, [&] {
    return nodes_of(n1).body.find("n2 accepts other API tokens than n1") != std::string::npos;
  })) << nodes_of(n1).body;
}

TEST(ClusterMembershipStart, WithoutAClusterSectionTheDomainIsThisNode) {
  BrokerProcess n1;
  ASSERT_TRUE(n1.start()) << n1.last_error();
  DomainView v = nodes_of(n1);
  ASSERT_TRUE(v.ok) << v.body;
  EXPECT_FALSE(v.cluster);
  EXPECT_EQ(v.controller, "n1");
  EXPECT_EQ(v.state, (std::map<std::string, std::string>{{"n1", "up"}}));
  EXPECT_EQ(v.role, (std::map<std::string, std::string>{{"n1", "controller"}}));
}

}  // namespace
}  // namespace entente::testing
