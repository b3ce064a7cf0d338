// Contracting (federation/contracting.h) between two domains without
// processes: each side has a real store, ledger and signer; a "link" hands
// each CONTROL message straight to the other side's on_control, and can be
// cut. Shows the negotiation protocol's sync, gap filling, automatic
// countersignature, restarts, restores from an older copy, forgeries in a
// domain's own name, and refusals.
#include "federation/contracting.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <string>

#include "base/metrics.h"
#include "federation/detail/common.h"
#include "contracts/contract.h"
#include "tests/contracts/fixture.h"

namespace entente::federation {
namespace {

using contracts::State;
using contracts::testing::Domains;
using contracts::testing::Node;

contracts::Terms terms(uint64_t price) {
  contracts::Terms t = contracts::testing::stream_terms();
  t.valid_from_ms = (detail::wall_clock_ms() / 1000 - 60) * 1000;  // in force now
  t.stream.price_per_million = price;
  return t;
}

// One domain's Contracting over a reopenable store.
struct Side {
  std::string domain;
  const certs::Signer* signer;
  Node node;
  base::Registry metrics;
  std::unique_ptr<Contracting> c;
  std::deque<std::string>* outbox = nullptr;  // messages to the other side
  bool* link_up = nullptr;
  std::vector<std::string> log;
  std::vector<std::string> changed;  // ids the `changed` hook ran for

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
    h.changed = [this](const contracts::Contract& k) { changed.push_back(k.id); };
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
  // The value of one sample in /metrics ("name{labels}"); 0 when absent.
  double metric(const std::string& sample) {
    const std::string text = metrics.render();
    const size_t at = text.find("\n" + sample + " ");
    return at == std::string::npos ? 0 : std::stod(text.substr(at + sample.size() + 2));
  }
  size_t log_lines_with(const std::string& what) const {
    size_t n = 0;
    for (const auto& line : log) n += line.find(what) != std::string::npos;
    return n;
  }
};

// A contract.version message as a node sends it.
std::string version_message(const std::string& id, const contracts::Version& v) {
  return R"({"type":"contract.version","id":")" + id + R"(","version":)" + contracts::version_to_json(v) +
         R"(,"held":)" + std::to_string(v.number) + "}";
}

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
  // Returns how many were delivered; stops after 1000 rounds or 10,000
  // messages (two nodes that never stop answering each other).
  size_t pump(const std::function<bool(const std::string&)>& drop = {}) {
    size_t delivered = 0;
    for (int rounds = 0; rounds < 1000 && delivered < 10000 && (!to_beta_.empty() || !to_acme_.empty());
         ++rounds) {
      while (!to_beta_.empty()) {
        std::string m = std::move(to_beta_.front());
        to_beta_.pop_front();
        if (drop && drop(m)) continue;
        ++delivered;
        beta_.c->on_control(acme_.identity(), m);
      }
      while (!to_acme_.empty()) {
        std::string m = std::move(to_acme_.front());
        to_acme_.pop_front();
        if (drop && drop(m)) continue;
        ++delivered;
        acme_.c->on_control(beta_.identity(), m);
      }
    }
    return delivered;
  }
  // The link comes (back) up: both sides sync. Returns the messages delivered.
  size_t link_up() {
    up_ = true;
    acme_.c->on_link_up(beta_.identity());
    beta_.c->on_link_up(acme_.identity());
    return pump();
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
  EXPECT_TRUE(k->in_force(detail::wall_clock_ms()));
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
  EXPECT_EQ(acme_.log.size(), 5u) << ::testing::PrintToString(acme_.log);
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


// acme's data directory is restored from a copy made before two
// negotiations: it gets back every version it lost from beta, its own
// (verified) included, makes no version of its own meanwhile, and the
// exchange ends after a few messages. Before the fix acme refused its own
// versions and asked for them again, forever.
TEST_F(ContractingTest, ARestoredDomainGetsBackTheVersionsItLostAndTheExchangeEnds) {
  const std::string copy = acme_.node.backup();
  // 1: acme proposes, beta counters, acme accepts (signed), beta countersigns.
  auto p = acme_.c->propose(terms(5));
  ASSERT_TRUE(p.ok()) << p.error().message;
  const std::string id = p->contract.id;
  pump();
  ASSERT_TRUE(beta_.c->counter(id, 1, terms(3)).ok());
  pump();
  ASSERT_TRUE(acme_.c->accept(id, 2).ok());
  pump();
  ASSERT_EQ(beta_.version(id), 4u);
  // 2: acme proposes, beta accepts, acme countersigns.
  auto p2 = acme_.c->propose(terms(7));
  ASSERT_TRUE(p2.ok());
  const std::string id2 = p2->contract.id;
  pump();
  ASSERT_TRUE(beta_.c->accept(id2, 1).ok());
  pump();
  ASSERT_EQ(acme_.version(id2), 3u);

  up_ = false;
  acme_.c.reset();
  ASSERT_NO_FATAL_FAILURE(acme_.node.restore(copy));
  ASSERT_NO_FATAL_FAILURE(acme_.open("beta"));
  EXPECT_EQ(acme_.version(id), 0u);
  const double from_peer = acme_.metric("entente_contract_versions_total{by=\"peer\"}");
  beta_.changed.clear();
  const size_t delivered = link_up();

  EXPECT_EQ(acme_.version(id), 4u);
  EXPECT_EQ(acme_.version(id2), 3u);
  expect_same_history(id);
  expect_same_history(id2);
  auto k = acme_.c->ledger().get(id2);
  ASSERT_TRUE(k.ok());
  EXPECT_TRUE(k->in_force(detail::wall_clock_ms()));
  // Two syncs, seven versions, acme's sync once it caught up.
  EXPECT_LE(delivered, 12u);
  EXPECT_EQ(acme_.metric("entente_contract_versions_total{by=\"self_returned\"}"), 4);
  EXPECT_EQ(acme_.metric("entente_contract_versions_total{by=\"peer\"}") - from_peer, 3);
  EXPECT_EQ(acme_.metric("entente_contract_refusals_total{reason=\"not_permitted\"}"), 0);
  EXPECT_EQ(acme_.log_lines_with("refused"), 0u);
  EXPECT_EQ(acme_.log_lines_with("which this node had lost"), 4u);
  // beta learnt that acme holds both again: imports it was refused meanwhile try again.
  std::sort(beta_.changed.begin(), beta_.changed.end());
  std::vector<std::string> both{id, id2};
  std::sort(both.begin(), both.end());
  EXPECT_EQ(beta_.changed, both) << ::testing::PrintToString(beta_.log);
  // Nothing more to say on the next link-up.
  EXPECT_LE(link_up(), 2u);
}

// acme kept its proposal (version 1) but lost beta's acceptance and its
// own countersignature: it waits for the countersignature the peer holds
// instead of making a second, different one.
TEST_F(ContractingTest, ARestoredOffererDoesNotCountersignWhatItCountersignedBefore) {
  auto p = acme_.c->propose(terms(5));
  ASSERT_TRUE(p.ok());
  const std::string id = p->contract.id;
  pump();
  const std::string copy = acme_.node.backup();
  ASSERT_TRUE(beta_.c->accept(id, 1).ok());
  pump();
  ASSERT_EQ(beta_.version(id), 3u);
  up_ = false;
  acme_.c.reset();
  ASSERT_NO_FATAL_FAILURE(acme_.node.restore(copy));
  ASSERT_NO_FATAL_FAILURE(acme_.open("beta"));
  ASSERT_EQ(acme_.version(id), 1u);
  link_up();
  EXPECT_EQ(acme_.version(id), 3u);
  expect_same_history(id);
  EXPECT_EQ(acme_.metric("entente_contract_refusals_total{reason=\"diverged\"}"), 0);
  EXPECT_EQ(beta_.metric("entente_contract_refusals_total{reason=\"diverged\"}"), 0);
}

// beta holds an acceptance in acme's name that a beta key signed (what a
// peer forging acme's consent would send): acme refuses it, asks for the
// gap behind it once, and the exchange ends.
TEST_F(ContractingTest, AnAcceptanceForgedInThisDomainsNameIsRefusedAndNotAskedForAgain) {
  auto p = acme_.c->propose(terms(5));
  ASSERT_TRUE(p.ok());
  const std::string id = p->contract.id;
  pump();
  ASSERT_TRUE(beta_.c->counter(id, 1, terms(1)).ok());
  pump();
  ASSERT_EQ(acme_.version(id), 2u);
  // Version 3: "acme accepts", signed with beta's key; version 4: beta's
  // countersignature of it. beta's ledger takes them without checking
  // signatures (append), as a tampered store would.
  auto held = beta_.c->ledger().get(id);
  ASSERT_TRUE(held.ok());
  contracts::Version forged;
  forged.number = 3;
  forged.state = State::accepted;
  forged.by = "acme";
  forged.at_ms = detail::wall_clock_ms();
  forged.terms = held->current().terms;
  forged.offer = 2;
  auto signature = beta_.signer->sign(contracts::signing_message(id, 2, forged.terms));
  ASSERT_TRUE(signature.ok()) << signature.error().message;
  signature->domain = "acme";
  forged.signatures.push_back(*signature);
  ASSERT_TRUE(beta_.c->ledger().append(id, forged).ok());
  held = beta_.c->ledger().get(id);
  auto v4 = contracts::countersign(*held, *beta_.signer, 3, detail::wall_clock_ms());
  ASSERT_TRUE(v4.ok()) << v4.error().message;
  ASSERT_TRUE(beta_.c->ledger().append(id, *v4).ok());

  const size_t delivered = link_up();
  EXPECT_EQ(acme_.version(id), 2u) << "a forged signature is never recorded";
  EXPECT_LE(delivered, 6u);
  EXPECT_EQ(acme_.metric("entente_contract_refusals_total{reason=\"not_permitted\"}"), 1);
  EXPECT_EQ(acme_.metric("entente_contract_messages_total{direction=\"sent\",type=\"sync\"}"), 1)
      << "the link-up sync only: the gap behind a refused version asks for nothing";
  EXPECT_EQ(acme_.log_lines_with("in the name of acme"), 1u) << ::testing::PrintToString(acme_.log);
  // The same versions sent again change nothing and ask for nothing.
  acme_.c->on_control(beta_.identity(), version_message(id, forged));
  acme_.c->on_control(beta_.identity(), version_message(id, *v4));
  EXPECT_TRUE(to_beta_.empty());
  EXPECT_EQ(acme_.version(id), 2u);
  EXPECT_EQ(acme_.metric("entente_contract_refusals_total{reason=\"not_permitted\"}"), 2);
}

// beta sends a counter-offer in acme's name (offers carry no signature)
// and then accepts it: acme records both, but never countersigns terms it
// cannot tell it offered, not even after a restart.
TEST_F(ContractingTest, AnOfferInThisDomainsNameFromThePeerIsNeverCountersigned) {
  auto p = acme_.c->propose(terms(5));
  ASSERT_TRUE(p.ok());
  const std::string id = p->contract.id;
  pump();
  ASSERT_TRUE(beta_.c->counter(id, 1, terms(3)).ok());
  pump();
  auto held = beta_.c->ledger().get(id);
  ASSERT_TRUE(held.ok());
  auto offer = contracts::counter(*held, "acme", 2, terms(1), detail::wall_clock_ms());
  ASSERT_TRUE(offer.ok()) << offer.error().message;
  ASSERT_TRUE(beta_.c->ledger().append(id, *offer).ok());
  acme_.c->on_control(beta_.identity(), version_message(id, *offer));
  ASSERT_EQ(acme_.version(id), 3u);
  EXPECT_EQ(acme_.log_lines_with("which this node had lost"), 1u);

  acme_.c.reset();
  acme_.node.reopen();
  ASSERT_NO_FATAL_FAILURE(acme_.open("beta"));
  link_up();
  ASSERT_TRUE(beta_.c->accept(id, 3).ok());
  pump();
  auto k = acme_.c->ledger().get(id);
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->current().number, 4u);
  EXPECT_EQ(k->current().state, State::accepted);
  EXPECT_FALSE(k->in_force(detail::wall_clock_ms()));
  EXPECT_EQ(acme_.log_lines_with("does not countersign"), 1u) << ::testing::PrintToString(acme_.log);
  expect_same_history(id);
  // acme's own offers are still countersigned.
  auto own = acme_.c->propose(terms(9));
  ASSERT_TRUE(own.ok());
  pump();
  ASSERT_TRUE(beta_.c->accept(own->contract.id, 1).ok());
  pump();
  EXPECT_EQ(acme_.version(own->contract.id), 3u);
}

TEST_F(ContractingTest, AFloodOfRefusedMessagesLogsABurstAndCountsEveryOne) {
  for (int i = 0; i < 500; ++i) acme_.c->on_control(beta_.identity(), "not json");
  EXPECT_EQ(acme_.metric("entente_contract_refusals_total{reason=\"malformed\"}"), 500);
  EXPECT_EQ(acme_.log.size(), static_cast<size_t>(Contracting::kRefusalLogBurst));
}

}  // namespace
}  // namespace entente::federation
