// A second domain importing a stream of a domain of several nodes
// (docs/federation.md, "Imports from a domain of several nodes"): acme is
// three real broker processes sharing one real etcd, each with its own
// federation listener and certificate from `entente certs`; beta is one
// node whose configuration lists acme/n2 alone. acme/bids is led by n1:
// n2 answers beta's OPEN with RESET moved, beta dials n1 at the address the
// catalog gives and imports from it. Every tuple arrives once, and GET
// /v1/imports shows the import served by n1. The import follows bids to a
// new leader when n1 is killed, whether beta reached n1 by a move or lists
// it itself (ClusterImportsAllNodesListed). And a moved grants no trust: a
// node that names an address where an impostor listens gets its importer
// nowhere.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "federation/messages.h"

#include "rapidjson/document.h"
#include "tests/integration/support/cluster.h"
#include "tests/integration/support/federation.h"
#include "tests/integration/support/ws_reader.h"
#include "tests/support/etcd_process.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  return d;
}

class ClusterImports : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
    etcd_ = std::make_unique<EtcdProcess>("etcd-imports");
    ASSERT_TRUE(etcd_->start()) << etcd_->last_error();
    beta_ = &fed_.add("beta", "n1");
    for (const char* name : {"n1", "n2", "n3"}) {
      FedNode& n = fed_.add("acme", name);
      // Every node exports bids to beta (the node asked permits the OPEN
      // before it says where the stream is) and accepts beta's links
      // without dialing beta.
      n.pins(*beta_, "", beta_->ca_file());
      n.exports("bids", {"beta"});
      n.config_extra(R"("checkpoint_interval": "200ms", )" + cluster_section(*etcd_));
      acme_.push_back(&n);
    }
    pin_acme();
    ASSERT_TRUE(fed_.start_all()) << fed_.last_error();
    ASSERT_TRUE(eventually(20s, [&] { return all_up(); })) << "acme's nodes do not all see each other up";
  }

  // The nodes of acme beta's configuration lists: n2 alone here.
  virtual void pin_acme() { beta_->pins(*acme_[1]); }

  FedNode& acme(int i) { return *acme_.at(static_cast<size_t>(i - 1)); }

  // Every acme node lists the three nodes up, with one controller.
  bool all_up() {
    for (FedNode* n : acme_) {
      auto r = n->process().try_request("GET", "/v1/nodes", {}, kReaderToken);
      if (!r.ok() || r->status != 200) return false;
      auto d = parse(r->body);
      if (!d.IsObject() || !d.HasMember("nodes") || !d["controller"].IsString()) return false;
      int up = 0;
      for (const auto& m : d["nodes"].GetArray()) up += std::string(m["state"].GetString()) == "up";
      if (up != 3) return false;
    }
    return true;
  }

  // GET /v1/streams on `n` lists `name` led by `leader`.
  static bool listed(const FedNode& n, const std::string& name, const std::string& leader) {
    auto r = n.process().try_request("GET", "/v1/streams", {}, kReaderToken);
    if (!r.ok() || r->status != 200) return false;
    auto d = parse(r->body);
    const rapidjson::Value* list = d.IsArray() ? &d : (d.IsObject() && d.HasMember("streams") ? &d["streams"] : nullptr);
    if (list == nullptr || !list->IsArray()) return false;
    for (const auto& s : list->GetArray()) {
      if (s.IsObject() && s.HasMember("name") && s["name"].IsString() && s["name"].GetString() == name &&
          s.HasMember("node") && s["node"].IsString() && s["node"].GetString() == leader) {
        return true;
      }
    }
    return false;
  }

  void import_follows_a_failover();

  std::unique_ptr<EtcdProcess> etcd_;
  Federation fed_;
  FedNode* beta_ = nullptr;
  std::vector<FedNode*> acme_;
};

// The leader of an imported stream is killed: acme's controller makes an
// in-sync follower the leader, and beta's import, its link to n1 gone,
// asks the node it knows again, is told where the stream is now, and
// resumes after the last tuple it holds. At the end beta's mirror is the
// new leader's log row for row: nothing lost, nothing twice.
// Kills n1, the leader of bids (factor 3), after a third of the batches
// published through acme's nodes in turn, and checks that beta's mirror
// ends up the new leader's log row for row, imported from it.
void ClusterImports::import_follows_a_failover() {
  auto created = acme(2).process().request(
      "POST", "/v1/streams",
      R"({"name":"bids","event_time":"date_time","node":"n1","replication":3,"schema":)" + std::string(kBidsSchema) +
          "}");
  ASSERT_EQ(created.status, 201u) << created.body;
  ASSERT_TRUE(eventually(20s, [&] { return listed(acme(2), "bids", "n1"); }));
  ASSERT_NO_FATAL_FAILURE(wait_linked(*beta_, acme(2)));
  auto imported = import_stream(*beta_, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body << "\nbeta stderr:\n" << beta_->process().stderr_text();
  std::vector<const BrokerProcess*> nodes;
  for (FedNode* n : acme_) nodes.push_back(&n->process());
  // Batches of 50 bids, each under its producer number, through acme's
  // nodes in turn; n1 (the leader) killed after the 10th, for good.
  constexpr uint64_t kBatches = 30, kRows = 50;
  for (uint64_t b = 0; b < kBatches; ++b) {
    if (b == 10) acme(1).process().kill();
    std::string body = "[";
    for (uint64_t i = b * kRows; i < (b + 1) * kRows; ++i) body += (i == b * kRows ? "" : ",") + bid(i);
    const std::string problem = post_through_any(
        nodes, b, "/v1/streams/bids/tuples?producer_id=p&producer_seq=" + std::to_string(b + 1), body + "]");
    ASSERT_EQ(problem, "") << "batch " << b;
  }
  std::string leader;
  ASSERT_TRUE(eventually(20s, [&] {
    if (listed(acme(2), "bids", "n2")) leader = "n2";
    else if (listed(acme(2), "bids", "n3")) leader = "n3";
    return !leader.empty();
  }));
  FedNode& now = acme(leader == "n2" ? 2 : 3);
  const uint64_t total = kBatches * kRows;
  ASSERT_EQ(next_seq(now.process(), "bids"), total + 1) << "the new leader's log is not every batch once";
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(*beta_, "acme/bids", total + 1));
  const ImportView v = get_import(beta_->process(), "acme/bids");
  EXPECT_EQ(v.owner, now.identity()) << v.body;
  const ReadResult want = read_stream(now.process(), "bids", 1, total, 60000);
  const ReadResult got = read_stream(beta_->process(), url_name("acme/bids"), 1, total, 60000);
  ASSERT_EQ(want.tuples.size(), total) << want.error;
  ASSERT_EQ(got.tuples.size(), total) << got.error;
  for (uint64_t i = 0; i < total; ++i) {
    ASSERT_EQ(got.tuples[i].seq, i + 1);
    ASSERT_EQ(got.tuples[i].line, want.tuples[i].line) << "position " << i;
  }
}

TEST_F(ClusterImports, AnImportFollowsTheStreamToItsNewLeaderAfterAFailover) { import_follows_a_failover(); }

// beta lists every node of acme, n1 first: its import of bids is served by
// n1 without a move. When n1 dies the import must not wait for n1's link
// to come back (it never does): it asks the other configured nodes, whose
// links are up, and follows the stream to its new leader.
class ClusterImportsAllNodesListed : public ClusterImports {
 protected:
  void pin_acme() override {
    for (FedNode* n : acme_) beta_->pins(*n);
  }
};

TEST_F(ClusterImportsAllNodesListed, AnImportServedByAConfiguredNodeFollowsTheStreamWhenThatNodeDies) {
  import_follows_a_failover();
}

TEST_F(ClusterImports, AnImportReachesTheStreamsLeaderThroughANodeThatDoesNotLeadIt) {
  // bids is created through n3, to be led by n1.
  auto created = acme(3).process().request(
      "POST", "/v1/streams",
      R"({"name":"bids","event_time":"date_time","node":"n1","schema":)" + std::string(kBidsSchema) + "}");
  ASSERT_EQ(created.status, 201u) << created.body;
  // n2, the node beta dials, knows from the catalog that n1 leads it.
  ASSERT_TRUE(eventually(10s, [&] { return listed(acme(2), "bids", "n1"); }));
  // Published through n2 (forwarded to n1) before the import...
  ASSERT_NO_FATAL_FAILURE(publish(acme(2), "bids", 0, 1000));
  ASSERT_EQ(next_seq(acme(1).process(), "bids"), 1001u);

  ASSERT_NO_FATAL_FAILURE(wait_linked(*beta_, acme(2)));
  auto imported = import_stream(*beta_, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body << "\nbeta stderr:\n" << beta_->process().stderr_text();
  // ...and to n1 directly after it.
  ASSERT_NO_FATAL_FAILURE(publish(acme(1), "bids", 1000, 1500));
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(*beta_, "acme/bids", 2501));

  // Served by n1, which beta's configuration does not list.
  const ImportView v = get_import(beta_->process(), "acme/bids");
  EXPECT_EQ(v.state, "active") << v.body;
  EXPECT_EQ(v.owner, "entente://acme/n1") << v.body;
  EXPECT_EQ(v.tuples, 2500u) << v.body;
  const PeersView peers = get_peers(beta_->process());
  EXPECT_EQ(peers.state_of("entente://acme/n1"), "up") << peers.body;
  const PeerView* n1 = peers.find("entente://acme/n1");
  ASSERT_NE(n1, nullptr) << peers.body;
  EXPECT_TRUE(n1->dialed) << peers.body;
  EXPECT_EQ(n1->address, acme(1).federation_address()) << peers.body;

  // Every tuple once, in order, as n1 has it: the sequence numbers 1..2500
  // and the owner's lines.
  const ReadResult want = read_stream(acme(1).process(), "bids", 1, 2500, 60000);
  const ReadResult got = read_stream(beta_->process(), url_name("acme/bids"), 1, 2500, 60000);
  ASSERT_EQ(want.tuples.size(), 2500u) << want.error << " " << want.close_reason;
  ASSERT_EQ(got.tuples.size(), 2500u) << got.error << " " << got.close_reason;
  size_t mismatches = 0;
  for (size_t i = 0; i < got.tuples.size() && mismatches < 5; ++i) {
    if (got.tuples[i].seq != i + 1 || got.tuples[i].line != want.tuples[i].line) {
      ++mismatches;
      ADD_FAILURE() << "position " << i << ": beta has " << got.tuples[i].line << ", n1 has " << want.tuples[i].line;
    }
  }
  // n2 said where, and served nothing.
  EXPECT_NE(beta_->process().stderr_text().find("entente://acme/n2 says entente://acme/n1 at " +
                                                acme(1).federation_address() + " leads acme/bids"),
            std::string::npos)
      << beta_->process().stderr_text();
}


// acme/n2, played by the test, answers every OPEN with RESET moved naming
// acme/n1 at `address`.
class Redirector final : public federation::LinkHandler {
 public:
  explicit Redirector(std::string reason) : reason_(std::move(reason)) {}
  void attach(federation::LinkManager* links) { links_.store(links); }
  void on_link_up(const certs::Identity&) override {}
  void on_link_down(const certs::Identity&, std::string_view) override {}
  void on_frame(const certs::Identity& peer, federation::FrameType type, uint32_t channel,
                std::string_view) override {
    if (type != federation::FrameType::open) return;
    ++opens;
    if (auto* l = links_.load()) {
      (void)l->send(peer, federation::FrameType::reset, channel,
                    federation::encode(federation::Reset{federation::WireError::moved, reason_}));
    }
  }
  std::atomic<int> opens{0};

 private:
  const std::string reason_;
  std::atomic<federation::LinkManager*> links_{nullptr};
};

TEST(ClusterImportsTrust, AMovedToWhereAnImpostorListensLinksNothingAndImportsNothing) {
  Federation fed;
  FedNode& beta = fed.add("beta", "n1");
  FedNode& n2 = fed.add("acme", "n2");
  // Claims acme/n1, with a certificate of a CA that is not acme's.
  FedNode& impostor = fed.add_impostor("acme", "n1");
  impostor.pins(beta, "", beta.ca_file());
  beta.pins(n2, "", n2.ca_file());  // acme's CA; n2 dials beta
  ASSERT_TRUE(fed.start_all()) << fed.last_error();

  Redirector redirector("n1@" + impostor.federation_address());
  auto started = hand_link(n2, beta, redirector);
  ASSERT_TRUE(started.ok()) << started.error().message;
  std::unique_ptr<federation::LinkManager> links = std::move(*started);
  redirector.attach(links.get());

  // beta follows the move, dials the address, and refuses what answers
  // there: its certificate does not chain to acme's pinned CA.
  const http::ClientResponse r = post_slow(beta, "/v1/imports", R"({"stream":"acme/bids"})");
  EXPECT_EQ(r.status, 503u) << r.body;
  EXPECT_NE(problem_detail(r.body).find("waiting for the link to entente://acme/n1 at " +
                                        impostor.federation_address()),
            std::string::npos)
      << r.body;
  EXPECT_GE(redirector.opens.load(), 1);
  PeersView v;
  EXPECT_TRUE(eventually(10s, [&] {
    v = get_peers(beta.process());
    auto it = v.refusals.find("untrusted_chain");
    return it != v.refusals.end() && it->second >= 1;
  })) << v.body;
  EXPECT_NE(v.state_of("entente://acme/n1"), "up") << v.body;
  EXPECT_EQ(beta.process().stderr_text().find("link up with entente://acme/n1"), std::string::npos)
      << beta.process().stderr_text();
  // Nothing was imported.
  EXPECT_EQ(get_import(beta.process(), "acme/bids").status, 404u);
  links->stop();
}

}  // namespace
}  // namespace entente::testing
