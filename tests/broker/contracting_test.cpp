// Contracting (broker/detail/contracting.h) between two domains without
// processes: each side has a real store, ledger and signer; a "link" hands
// each CONTROL message straight to the other side's on_control, and can be
// cut. Shows the negotiation protocol's sync, gap filling, automatic
// countersignature, restarts and refusals.
#include "broker/detail/contracting.h"
#include "broker/detail/node_impl.h"

#include <gtest/gtest.h>

#include <deque>
#include <memory>
#include <string>

#include "broker/metrics.h"
#include "contracts/contract.h"
#include "tests/contracts/fixture.h"

namespace entente::broker::detail {
namespace {

using contracts::State;
using contracts::testing::Domains;
using contracts::testing::Node;

contracts::Terms terms(uint64_t price) {
  contracts::Terms t = contracts::testing::stream_terms();
  t.valid_from_ms = (wall_clock_ms() / 1000 - 60) * 1000;  // in force now
  t.stream.price_per_million = price;
  return t;
}

// One domain's Contracting over a reopenable store.
struct Side {
  std::string domain;
  const certs::Signer* signer;
  Node node;
  Registry metrics;
  std::unique_ptr<Contracting> c;
  std::deque<std::string>* outbox = nullptr;  // messages to the other side
  bool* link_up = nullptr;
  std::vector<std::string> log;

  certs::Identity identity() const { return signer->identity(); }

  void open(const std::string& peer) {
    c.reset();
    Contracting::Hooks h;
    h.send_to_domain = [this](const std::string&, const std::string& m) {
      if (!*link_up) return false;
      outbox->push_back(m);
      return true;
    };
    h.send_to_peer = [this](const certs::Identity&, const std::string& m) {
      if (!*link_up) return false;
      outbox->push_back(m);
      return true;
    };
    h.log = [this](const std::string& line) { log.push_back(line); };
    const auto& d = Domains::get();
    // The fixture's trust store outlives every test.
    std::shared_ptr<const certs::TrustStore> trust(&d.trust(), [](const certs::TrustStore*) {});
    auto opened = Contracting::open(node.store(), *signer, trust, {peer}, metrics, std::move(h));
    ASSERT_TRUE(opened.ok()) << opened.error().message;
    c = std::move(*opened);
  }
  uint64_t version(const std::string& id) {
    auto k = c->ledger().get(id);
    return k.ok() ? k->current().number : 0;
  }
};

class ContractingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    acme_.domain = "acme";
    acme_.signer = &Domains::get().acme();
    beta_.domain = "beta";
    beta_.signer = &Domains::get().beta();
    acme_.outbox = &to_beta_;
    beta_.outbox = &to_acme_;
    acme_.link_up = beta_.link_up = &up_;
    ASSERT_NO_FATAL_FAILURE(acme_.open("beta"));
    ASSERT_NO_FATAL_FAILURE(beta_.open("acme"));
  }

  // Delivers queued messages both ways until none is left (or `drop`
  // says to lose one).
  void pump(const std::function<bool(const std::string&)>& drop = {}) {
    for (int rounds = 0; rounds < 1000 && (!to_beta_.empty() || !to_acme_.empty()); ++rounds) {
      while (!to_beta_.empty()) {
        std::string m = std::move(to_beta_.front());
        to_beta_.pop_front();
        if (drop && drop(m)) continue;
        beta_.c->on_control(acme_.identity(), m);
      }
      while (!to_acme_.empty()) {
        std::string m = std::move(to_acme_.front());
        to_acme_.pop_front();
        if (drop && drop(m)) continue;
        acme_.c->on_control(beta_.identity(), m);
      }
    }
  }
  // The link comes (back) up: both sides sync.
  void link_up() {
    up_ = true;
    acme_.c->on_link_up(beta_.identity());
    beta_.c->on_link_up(acme_.identity());
    pump();
  }
  void expect_same_history(const std::string& id) {
    auto a = acme_.c->ledger().get(id);
    auto b = beta_.c->ledger().get(id);
    ASSERT_TRUE(a.ok() && b.ok());
    ASSERT_EQ(a->history.size(), b->history.size());
    for (size_t i = 0; i < a->history.size(); ++i) {
      EXPECT_EQ(contracts::version_to_json(a->history[i]), contracts::version_to_json(b->history[i])) << i;
    }
  }

  std::deque<std::string> to_beta_, to_acme_;
  bool up_ = true;
  Side acme_, beta_;
};

TEST_F(ContractingTest, NegotiationEndsActiveOnBothSidesWithTheCountersignature) {
  auto p = acme_.c->propose(terms(5));
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_TRUE(p->delivered);
  const std::string id = p->contract.id;
  pump();
  ASSERT_EQ(beta_.version(id), 1u);
  ASSERT_TRUE(beta_.c->counter(id, 1, terms(3)).ok());
  pump();
  ASSERT_TRUE(acme_.c->counter(id, 2, terms(4)).ok());
  pump();
  // Acting on a version that is no longer current.
  auto stale = beta_.c->accept(id, 2);
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.error().code, Errc::conflict);
  ASSERT_TRUE(beta_.c->accept(id, 3).ok());
  pump();  // acme countersigns on receipt
  auto k = acme_.c->ledger().get(id);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->current().number, 5u);
  EXPECT_EQ(k->current().state, State::active);
  EXPECT_EQ(k->current().signatures.size(), 2u);
  EXPECT_EQ(k->current().terms.stream.price_per_million, 4u);
  EXPECT_TRUE(k->in_force(wall_clock_ms()));
  expect_same_history(id);
}

TEST_F(ContractingTest, WhatIsMadeWhileTheLinkIsDownArrivesAfterARestart) {
  up_ = false;
  auto p = acme_.c->propose(terms(5));
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_FALSE(p->delivered);
  const std::string id = p->contract.id;
  EXPECT_EQ(beta_.version(id), 0u);
  // acme restarts before the link is back: the proposal is in its ledger.
  acme_.node.reopen();
  ASSERT_NO_FATAL_FAILURE(acme_.open("beta"));
  link_up();
  ASSERT_EQ(beta_.version(id), 1u);

  // beta accepts with the link down, and restarts; acme countersigns once
  // the link is back.
  up_ = false;
  auto a = beta_.c->accept(id, 1);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->delivered);
  beta_.node.reopen();
  ASSERT_NO_FATAL_FAILURE(beta_.open("acme"));
  link_up();
  EXPECT_EQ(acme_.version(id), 3u);
  EXPECT_EQ(beta_.version(id), 3u);
  expect_same_history(id);
}

TEST_F(ContractingTest, ALostVersionIsFilledInWhenTheNextOneShowsTheGap) {
  auto p = acme_.c->propose(terms(5));
  ASSERT_TRUE(p.ok());
  const std::string id = p->contract.id;
  pump();
  ASSERT_TRUE(beta_.c->accept(id, 1).ok());
  // acme's countersignature (version 3) is lost on the way.
  pump([](const std::string& m) { return m.find("\"number\":3") != std::string::npos; });
  EXPECT_EQ(acme_.version(id), 3u);
  EXPECT_EQ(beta_.version(id), 2u);
  // acme revokes: version 4 reaches beta, which sees the gap, asks with a
  // sync, and gets 3 and 4.
  ASSERT_TRUE(acme_.c->revoke(id, 3, "audit").ok());
  pump();
  EXPECT_EQ(beta_.version(id), 4u);
  auto k = beta_.c->ledger().get(id);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->current().state, State::revoked);
  EXPECT_EQ(k->current().reason, "audit");
  expect_same_history(id);
  // A resend of what beta holds changes nothing.
  beta_.c->on_control(acme_.identity(), R"({"type":"contract.sync","have":{}})");
  pump();
  EXPECT_EQ(beta_.version(id), 4u);
  EXPECT_EQ(acme_.version(id), 4u);
}

TEST_F(ContractingTest, MessagesThatAreNotContractVersionsAreRefusedAndCounted) {
  const certs::Identity gamma{"gamma", "n1"};
  acme_.c->on_control(beta_.identity(), "not json");
  acme_.c->on_control(beta_.identity(), R"({"type":"contract.teleport"})");
  acme_.c->on_control(beta_.identity(), R"({"type":"contract.version","id":"c-1"})");
  acme_.c->on_control(beta_.identity(), R"({"type":"contract.version","id":"nope","version":{}})");
  acme_.c->on_control(gamma, R"({"type":"contract.sync","have":{}})");
  const std::string m = acme_.metrics.render();
  EXPECT_NE(m.find("entente_contract_refusals_total{reason=\"malformed\"} 3"), std::string::npos) << m;
  EXPECT_NE(m.find("entente_contract_refusals_total{reason=\"unknown_type\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("entente_contract_refusals_total{reason=\"not_a_peer\"} 1"), std::string::npos) << m;
  EXPECT_EQ(acme_.log.size(), 5u);
  EXPECT_TRUE(acme_.c->ledger().list({}, 0).empty());

  // A proposal to a domain that is not a peer, or between two others.
  auto t = terms(1);
  t.stream.consumer = "gamma";
  auto r = acme_.c->propose(t);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::not_found);
  t.stream.provider = "beta";
  r = acme_.c->propose(t);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::permission_denied);
}

}  // namespace
}  // namespace entente::broker::detail
