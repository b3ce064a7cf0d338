// The ledger: a full negotiation between two domains' ledgers exchanging
// version JSON, persistence across restarts, usage, and the stream contract
// lookup that enforcement will use.

#include "contracts/ledger.h"

#include <gtest/gtest.h>

#include "fixture.h"

namespace entente::contracts {
namespace {

using testing::Domains;
using testing::kJan2027;
using testing::kJan2028;
using testing::Node;
using testing::stream_terms;

const certs::TrustStore& trust() { return Domains::get().trust(); }
const certs::Signer& acme() { return Domains::get().acme(); }
const certs::Signer& beta() { return Domains::get().beta(); }

// What crosses the federation link: the version's JSON, parsed on arrival.
Version wire(const Version& v) {
  auto back = version_from_text(version_to_json(v));
  EXPECT_TRUE(back.ok()) << back.error().message;
  return std::move(back).value();
}

// One domain's step: make the version locally, record it (from = self), and
// deliver it to the peer's ledger (from = the authenticated sender).
void step(Ledger& mine, Ledger& theirs, const std::string& self, const std::string& id, const Result<Version>& v) {
  ASSERT_TRUE(v.ok()) << v.error().message;
  auto local = mine.apply(id, *v, self, trust());
  ASSERT_TRUE(local.ok()) << local.error().message;
  auto remote = theirs.apply(id, wire(*v), self, trust());
  ASSERT_TRUE(remote.ok()) << remote.error().message;
}

TEST(Negotiation, TwoLedgersEndWithIdenticalSignedHistories) {
  Node a, b;  // acme's and beta's nodes
  const std::string id = new_contract_id();
  step(a.ledger(), b.ledger(), "acme", id, propose("acme", stream_terms(), 1000));
  Terms cheaper = stream_terms();
  cheaper.stream.price_per_million = 100;
  step(b.ledger(), a.ledger(), "beta", id, counter(*b.ledger().get(id), "beta", 1, cheaper, 2000));
  Terms middle = stream_terms();
  middle.stream.price_per_million = 175;
  step(a.ledger(), b.ledger(), "acme", id, counter(*a.ledger().get(id), "acme", 2, middle, 3000));
  step(b.ledger(), a.ledger(), "beta", id, accept(*b.ledger().get(id), beta(), 3, 4000));
  // acme's broker countersigns on receipt: it offered these terms.
  step(a.ledger(), b.ledger(), "acme", id, countersign(*a.ledger().get(id), acme(), 4, 5000));

  // Both restart: nothing is lost.
  a.reopen();
  b.reopen();
  auto ca = a.ledger().get(id);
  auto cb = b.ledger().get(id);
  ASSERT_TRUE(ca.ok() && cb.ok());
  ASSERT_EQ(ca->history.size(), 5u);
  EXPECT_EQ(ca->history, cb->history);
  for (size_t i = 0; i < 5; ++i) {
    auto ka = a.store().get(store::Cf::contracts, version_key(id, i + 1));
    auto kb = b.store().get(store::Cf::contracts, version_key(id, i + 1));
    ASSERT_TRUE(ka.ok() && kb.ok() && ka->has_value() && kb->has_value());
    EXPECT_EQ(**ka, **kb) << "version " << i + 1;  // byte-identical
  }
  const Version& active = ca->current();
  EXPECT_EQ(active.state, State::active);
  EXPECT_EQ(active.offer, 3u);
  EXPECT_EQ(active.terms, middle);
  ASSERT_EQ(active.signatures.size(), 2u);
  const std::string message = signing_message(id, 3, middle);
  for (const auto& sig : active.signatures) EXPECT_TRUE(certs::verify_signature(trust(), sig, message).ok());
  EXPECT_EQ(active.signatures[0].domain, "beta");
  EXPECT_EQ(active.signatures[1].domain, "acme");
  EXPECT_TRUE(ca->in_force(kJan2027));

  // A replay of an old version, a tampered one, one made by the wrong party:
  // each refused, nothing changes.
  EXPECT_EQ(b.ledger().apply(id, wire(ca->history[3]), "beta", trust()).error().code, Errc::conflict);
  Version forged = wire(ca->history[4]);
  forged.number = 6;
  forged.state = State::revoked;
  forged.signatures.clear();
  forged.reason = "forged";
  EXPECT_EQ(b.ledger().apply(id, forged, "gamma", trust()).error().code, Errc::permission_denied);
  auto rv = revoke(*a.ledger().get(id), "acme", 5, "done", 6000);
  ASSERT_TRUE(rv.ok());
  Version tampered = wire(*rv);
  tampered.signatures = active.signatures;
  tampered.signatures[0].value[3] = tampered.signatures[0].value[3] == 'A' ? 'B' : 'A';
  EXPECT_EQ(b.ledger().apply(id, tampered, "acme", trust()).error().code, Errc::invalid_argument);
  EXPECT_EQ(b.ledger().get(id)->history.size(), 5u);

  // Revocation reaches both.
  step(a.ledger(), b.ledger(), "acme", id, rv);
  EXPECT_EQ(b.ledger().get(id)->state_at(kJan2027), State::revoked);
  EXPECT_EQ(a.ledger().get(id)->history, b.ledger().get(id)->history);
}

TEST(LedgerTest, TamperedAcceptanceRefusedAndNothingRecorded) {
  Node b;
  Contract c{new_contract_id(), {}};
  ASSERT_TRUE(apply(c, *propose("acme", stream_terms(), 1), "acme", trust()).ok());
  ASSERT_TRUE(b.ledger().append(c.id, c.history[0]).ok());
  auto v2 = accept(c, beta(), 1, 2);
  ASSERT_TRUE(v2.ok());
  Version t = wire(*v2);
  t.signatures[0].value[10] = t.signatures[0].value[10] == 'A' ? 'B' : 'A';
  auto r = b.ledger().apply(c.id, t, "beta", trust());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::permission_denied);
  EXPECT_EQ(r.error().message, "version 2 of contract " + c.id + ": signature of beta/n1 does not verify");
  b.reopen();
  EXPECT_EQ(b.ledger().get(c.id)->history.size(), 1u);
}

TEST(LedgerTest, AppendRefusesANumberThatIsNotNext) {
  Node n;
  Contract c = testing::active_contract(stream_terms(), acme(), beta());
  ASSERT_TRUE(n.ledger().append(c.id, c.history[0]).ok());
  Status skip = n.ledger().append(c.id, c.history[2]);
  ASSERT_FALSE(skip.ok());
  EXPECT_EQ(skip.error().code, Errc::conflict);
  EXPECT_EQ(skip.error().message, "contract " + c.id + " is at version 1; version 3 is not the next one");
  EXPECT_EQ(n.ledger().append(c.id, c.history[0]).error().code, Errc::conflict);
  Status start = n.ledger().append(new_contract_id(), c.history[1]);
  EXPECT_EQ(start.error().code, Errc::conflict);
  ASSERT_TRUE(n.ledger().append(c.id, c.history[1]).ok());
  n.reopen();
  EXPECT_EQ(n.ledger().get(c.id)->history.size(), 2u);
  EXPECT_EQ(n.ledger().get("c-ffffffffffffffff").error().code, Errc::not_found);
}

// The gate a domain of several nodes puts before every append
// (docs/cluster.md, "One ledger per domain"): it sees each checked version
// with its stored form, and its refusal stores nothing.
TEST(LedgerTest, TheGateSeesEveryCheckedVersionAndItsRefusalStoresNothing) {
  Node n;
  Contract c = testing::active_contract(stream_terms(), acme(), beta());
  std::vector<std::pair<uint64_t, std::string>> seen;
  bool refuse = false;
  n.ledger().set_gate([&](const std::string& id, const Version& v, const std::string& json) -> Status {
    EXPECT_EQ(id, c.id);
    seen.emplace_back(v.number, json);
    if (refuse) return make_error(Errc::unavailable, "etcd unreachable");
    return {};
  });
  EXPECT_EQ(n.ledger().versions(c.id), 0u);
  ASSERT_TRUE(n.ledger().append(c.id, c.history[0]).ok());
  // A version that fails the ledger's own checks never reaches the gate.
  EXPECT_FALSE(n.ledger().append(c.id, c.history[2]).ok());
  refuse = true;
  Status refused = n.ledger().append(c.id, c.history[1]);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().message, "etcd unreachable");
  EXPECT_EQ(n.ledger().versions(c.id), 1u);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].first, 1u);
  EXPECT_EQ(seen[0].second, version_to_json(c.history[0]));
  EXPECT_EQ(seen[1].first, 2u);
  n.reopen();
  EXPECT_EQ(n.ledger().versions(c.id), 1u);  // nothing of version 2 was stored
}

TEST(LedgerTest, RestartKeepsVersionsAndUsage) {
  Node n;
  Contract c = testing::active_contract(stream_terms(), acme(), beta());
  testing::record(n.ledger(), c);
  ASSERT_TRUE(n.ledger().add_usage(c.id, 3'000'000).ok());
  ASSERT_TRUE(n.ledger().add_usage(c.id, 1'000'000).ok());
  EXPECT_EQ(n.ledger().add_usage("c-ffffffffffffffff", 1).error().code, Errc::not_found);
  auto u = n.ledger().usage(c.id);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->tuples, 4'000'000u);
  EXPECT_DOUBLE_EQ(u->cost_credits, 1000.0);  // 4 million at 250 per million
  ASSERT_TRUE(n.ledger().flush_usage().ok());
  n.reopen();
  EXPECT_EQ(n.ledger().get(c.id)->history, c.history);
  u = n.ledger().usage(c.id);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->tuples, 4'000'000u);
  EXPECT_EQ(u->load_seconds, 0.0);
  // Usage counted after the last flush is what a crash may lose.
  ASSERT_TRUE(n.ledger().add_usage(c.id, 10).ok());
  n.reopen();
  EXPECT_EQ(n.ledger().usage(c.id)->tuples, 4'000'000u);
  // A hosting contract's usage exists with zero load-seconds.
  Contract h = testing::active_contract(testing::hosting_terms(), beta(), acme());
  testing::record(n.ledger(), h);
  EXPECT_EQ(n.ledger().usage(h.id)->cost_credits, 0.0);
  // CPU time hosted, to the microsecond, costs load_seconds x price_min,
  // and survives a restart once flushed.
  ASSERT_TRUE(n.ledger().add_load(h.id, 2'000'000).ok());
  ASSERT_TRUE(n.ledger().add_load(h.id, 500'000).ok());
  u = n.ledger().usage(h.id);
  ASSERT_TRUE(u.ok());
  EXPECT_DOUBLE_EQ(u->load_seconds, 2.5);
  EXPECT_DOUBLE_EQ(u->cost_credits, 2.5 * static_cast<double>(h.current().terms.hosting.price_min));
  ASSERT_TRUE(n.ledger().flush_usage().ok());
  n.reopen();
  EXPECT_DOUBLE_EQ(n.ledger().usage(h.id)->load_seconds, 2.5);
  EXPECT_EQ(n.ledger().add_load(c.id, 1).error().code, Errc::invalid_argument);  // a stream contract
  EXPECT_EQ(n.ledger().add_load("c-0000000000000000", 1).error().code, Errc::not_found);
}

TEST(LedgerTest, ListFiltersByStateAtNowAndPeer) {
  Node n;
  Contract active = testing::active_contract(stream_terms(), acme(), beta());
  testing::record(n.ledger(), active);
  Contract other = testing::active_contract(stream_terms("acme", "gamma"), acme(), Domains::get().gamma());
  testing::record(n.ledger(), other);
  Contract proposal{new_contract_id(), {}};
  ASSERT_TRUE(apply(proposal, *propose("beta", testing::hosting_terms(), 1), "beta", trust()).ok());
  testing::record(n.ledger(), proposal);

  EXPECT_EQ(n.ledger().list({}, kJan2027).size(), 3u);
  ContractFilter f;
  f.peer = "gamma";
  ASSERT_EQ(n.ledger().list(f, kJan2027).size(), 1u);
  EXPECT_EQ(n.ledger().list(f, kJan2027)[0].id, other.id);
  f = {};
  f.state = State::active;
  EXPECT_EQ(n.ledger().list(f, kJan2027).size(), 2u);
  EXPECT_EQ(n.ledger().list(f, kJan2028).size(), 0u);
  f.state = State::expired;
  EXPECT_EQ(n.ledger().list(f, kJan2028).size(), 2u);
  f = {};
  f.kind = Kind::hosting;
  ASSERT_EQ(n.ledger().list(f, 0).size(), 1u);
  EXPECT_EQ(n.ledger().list(f, 0)[0].id, proposal.id);
}

TEST(LedgerTest, FindStreamContract) {
  Node n;
  Ledger& l = n.ledger();
  auto none = l.find_stream_contract("acme", "beta", "bids", kJan2027);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, Errc::not_found);
  EXPECT_EQ(none.error().message, "no active stream contract from acme to beta covers stream bids");

  Contract c = testing::active_contract(stream_terms(), acme(), beta());
  testing::record(l, c);
  // In force.
  auto found = l.find_stream_contract("acme", "beta", "bids", kJan2027);
  ASSERT_TRUE(found.ok()) << found.error().message;
  EXPECT_EQ(found->id, c.id);
  // Before the start.
  auto early = l.find_stream_contract("acme", "beta", "bids", kJan2027 - 1000);
  ASSERT_FALSE(early.ok());
  EXPECT_EQ(early.error().code, Errc::permission_denied);
  EXPECT_EQ(early.error().message, "stream contract " + c.id + " starts at 2027-01-01T00:00:00Z");
  // After the end.
  auto late = l.find_stream_contract("acme", "beta", "bids", kJan2028);
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.error().message, "stream contract " + c.id + " expired at 2028-01-01T00:00:00Z");
  // Another consumer, another stream, the other direction.
  EXPECT_EQ(l.find_stream_contract("acme", "gamma", "bids", kJan2027).error().code, Errc::not_found);
  EXPECT_EQ(l.find_stream_contract("acme", "beta", "trades", kJan2027).error().message,
            "no active stream contract from acme to beta covers stream trades");
  EXPECT_EQ(l.find_stream_contract("beta", "acme", "bids", kJan2027).error().code, Errc::not_found);

  // A newer contract for the same stream starting later wins once in force.
  Terms second = stream_terms("acme", "beta", {"bids"});
  second.valid_from_ms = kJan2027 + 86'400'000;
  Contract c2 = testing::active_contract(second, acme(), beta());
  testing::record(l, c2);
  EXPECT_EQ(l.find_stream_contract("acme", "beta", "bids", kJan2027)->id, c.id);
  EXPECT_EQ(l.find_stream_contract("acme", "beta", "bids", second.valid_from_ms)->id, c2.id);
  EXPECT_EQ(l.find_stream_contract("acme", "beta", "asks", second.valid_from_ms)->id, c.id);

  // Revoked.
  Contract latest = *l.get(c2.id);
  ASSERT_TRUE(l.append(c2.id, *revoke(latest, "beta", 3, "stopped paying", 9000)).ok());
  Contract first = *l.get(c.id);
  ASSERT_TRUE(l.append(c.id, *revoke(first, "acme", 3, "audit", 9000)).ok());
  auto revoked = l.find_stream_contract("acme", "beta", "bids", second.valid_from_ms);
  ASSERT_FALSE(revoked.ok());
  EXPECT_EQ(revoked.error().code, Errc::permission_denied);
  EXPECT_NE(revoked.error().message.find(" was revoked by "), std::string::npos) << revoked.error().message;
  EXPECT_EQ(l.find_stream_contract("acme", "beta", "asks", kJan2027).error().message,
            "stream contract " + c.id + " was revoked by acme: audit");

  // Still negotiating.
  Contract p{new_contract_id(), {}};
  ASSERT_TRUE(apply(p, *propose("beta", stream_terms("acme", "beta", {"trades"}), 1), "beta", trust()).ok());
  testing::record(l, p);
  EXPECT_EQ(l.find_stream_contract("acme", "beta", "trades", kJan2027).error().message,
            "stream contract " + p.id + " is proposed, not active");
}

// Issue 11, point 18: of several covering contracts none of which is in
// force, the reason names the one that governs, whatever changed last.
TEST(LedgerTest, TheRefusalNamesTheGoverningContract) {
  Node n;
  Ledger& l = n.ledger();
  Contract signed_once = testing::active_contract(stream_terms(), acme(), beta());
  testing::record(l, signed_once);
  ASSERT_TRUE(l.append(signed_once.id, *revoke(*l.get(signed_once.id), "acme", 3, "audit", 9000)).ok());
  // An offer beta made later, which acme rejected later still.
  Contract offer{new_contract_id(), {}};
  ASSERT_TRUE(apply(offer, *propose("beta", stream_terms(), 10'000), "beta", trust()).ok());
  testing::record(l, offer);
  ASSERT_TRUE(l.append(offer.id, *reject(*l.get(offer.id), "acme", 1, "too cheap", 11'000)).ok());
  const std::string want = "stream contract " + signed_once.id + " was revoked by acme: audit";
  EXPECT_EQ(l.find_stream_contract("acme", "beta", "bids", kJan2027).error().message, want);
  n.reopen();
  EXPECT_EQ(n.ledger().find_stream_contract("acme", "beta", "bids", kJan2027).error().message, want)
      << "the same after a restart";

  // A negotiation under way is named before a rejected offer, after a
  // signed contract.
  Contract pending{new_contract_id(), {}};
  ASSERT_TRUE(apply(pending, *propose("beta", stream_terms(), 12'000), "beta", trust()).ok());
  testing::record(n.ledger(), pending);
  EXPECT_EQ(n.ledger().find_stream_contract("acme", "beta", "bids", kJan2027).error().message, want);
  Terms trades = stream_terms("acme", "beta", {"trades"});
  Contract rejected_asks{new_contract_id(), {}};
  ASSERT_TRUE(apply(rejected_asks, *propose("beta", trades, 20'000), "beta", trust()).ok());
  testing::record(n.ledger(), rejected_asks);
  ASSERT_TRUE(n.ledger().append(rejected_asks.id, *reject(*n.ledger().get(rejected_asks.id), "acme", 1, "", 21'000)).ok());
  Contract pending_asks{new_contract_id(), {}};
  ASSERT_TRUE(apply(pending_asks, *propose("beta", trades, 15'000), "beta", trust()).ok());
  testing::record(n.ledger(), pending_asks);
  EXPECT_EQ(n.ledger().find_stream_contract("acme", "beta", "trades", kJan2027).error().message,
            "stream contract " + pending_asks.id + " is proposed, not active");
}

TEST(LedgerTest, UsageAddedWithOtherWritesIsOneAtomicDurableWrite) {
  Node n;
  Contract c = testing::active_contract(stream_terms(), acme(), beta());
  testing::record(n.ledger(), c);
  ASSERT_TRUE(n.store().put(store::Cf::meta, "mark", "x", store::Durability::synced).ok());
  store::WriteBatch marks;
  marks.erase(store::Cf::meta, "mark");
  ASSERT_TRUE(n.ledger().add_usage_with({{c.id, 7}, {"c-ffffffffffffffff", 3}}, std::move(marks)).ok());
  EXPECT_EQ(n.ledger().usage(c.id)->tuples, 7u);
  // No flush: the count is written with the mark's removal.
  n.reopen();
  EXPECT_EQ(n.ledger().usage(c.id)->tuples, 7u);
  EXPECT_FALSE(n.store().get(store::Cf::meta, "mark")->has_value());
  ASSERT_TRUE(n.ledger().add_usage_with({{c.id, 5}}, store::WriteBatch()).ok());
  n.reopen();
  EXPECT_EQ(n.ledger().usage(c.id)->tuples, 12u);
}

TEST(LedgerTest, CorruptVersionIsReportedAtOpen) {
  Node n;
  Contract c = testing::active_contract(stream_terms(), acme(), beta());
  testing::record(n.ledger(), c);
  ASSERT_TRUE(n.store().put(store::Cf::contracts, version_key(c.id, 2), "{not json", store::Durability::synced).ok());
  auto l = Ledger::open(n.store());
  ASSERT_FALSE(l.ok());
  EXPECT_EQ(l.error().code, Errc::corrupt);
  EXPECT_NE(l.error().message.find("version 2 of " + c.id), std::string::npos) << l.error().message;
  ASSERT_TRUE(n.store().erase(store::Cf::contracts, version_key(c.id, 2), store::Durability::synced).ok());
  l = Ledger::open(n.store());
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.error().message.find("under key number 3 after 1 versions"), std::string::npos) << l.error().message;
}

}  // namespace
}  // namespace entente::contracts
