// The negotiation state machine: every transition allowed and refused, the
// checks apply() makes on versions from a peer, expiry, and version JSON.

#include "contracts/contract.h"

#include <gtest/gtest.h>

#include "fixture.h"
#include "rapidjson/document.h"

namespace entente::contracts {
namespace {

using testing::Domains;
using testing::kJan2027;
using testing::kJan2028;
using testing::stream_terms;

const certs::TrustStore& trust() { return Domains::get().trust(); }
const certs::Signer& acme() { return Domains::get().acme(); }
const certs::Signer& beta() { return Domains::get().beta(); }

// A contract acme proposed to beta (version 1).
Contract proposed() {
  Contract c{new_contract_id(), {}};
  auto v1 = propose("acme", stream_terms(), 1000);
  EXPECT_TRUE(v1.ok()) << v1.error().message;
  EXPECT_TRUE(apply(c, *v1, "acme", trust()).ok());
  return c;
}

Terms cheaper() {
  Terms t = stream_terms();
  t.stream.price_per_million = 100;
  return t;
}

void expect_error(const Result<Version>& r, Errc code, const std::string& message) {
  ASSERT_FALSE(r.ok()) << "expected: " << message;
  EXPECT_EQ(r.error().code, code) << r.error().message;
  EXPECT_EQ(r.error().message, message);
}

TEST(ContractId, IsRandomLowerHex) {
  const std::string a = new_contract_id(), b = new_contract_id();
  EXPECT_TRUE(valid_contract_id(a)) << a;
  EXPECT_NE(a, b);
  EXPECT_FALSE(valid_contract_id("c-0123456789ABCDEF"));
  EXPECT_FALSE(valid_contract_id("c-0123"));
  EXPECT_FALSE(valid_contract_id("x-0123456789abcdef"));
}

TEST(Transitions, ProposeByAPartyOnly) {
  auto v = propose("acme", stream_terms(), 5);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->number, 1u);
  EXPECT_EQ(v->state, State::proposed);
  EXPECT_EQ(v->offer, 1u);
  EXPECT_EQ(v->at_ms, 5);
  expect_error(propose("gamma", stream_terms(), 5), Errc::permission_denied,
               "gamma may not propose a contract between acme and beta");
  Terms bad = stream_terms();
  bad.stream.streams.clear();
  EXPECT_EQ(propose("acme", bad, 5).error().code, Errc::invalid_argument);
}

TEST(Transitions, CounterByTheOtherPartyKeepingKindAndParties) {
  Contract c = proposed();
  auto v2 = counter(c, "beta", 1, cheaper(), 2000);
  ASSERT_TRUE(v2.ok()) << v2.error().message;
  EXPECT_EQ(v2->state, State::countered);
  EXPECT_EQ(v2->offer, 2u);
  expect_error(counter(c, "acme", 1, cheaper(), 2000), Errc::permission_denied,
               "acme made version 1 of contract " + c.id + "; only beta may counter it");
  expect_error(counter(c, "gamma", 1, cheaper(), 2000), Errc::permission_denied,
               "gamma is not a party of contract " + c.id + " (acme, beta)");
  expect_error(counter(c, "beta", 1, stream_terms("acme", "gamma"), 2000), Errc::invalid_argument,
               "a counter-offer keeps the parties (acme, beta)");
  expect_error(counter(c, "beta", 1, stream_terms("beta", "acme"), 2000), Errc::invalid_argument,
               "a counter-offer keeps the parties (acme, beta)");
  expect_error(counter(c, "beta", 1, testing::hosting_terms(), 2000), Errc::invalid_argument,
               "a counter-offer keeps the kind (stream)");
  ASSERT_TRUE(apply(c, *v2, "beta", trust()).ok());
  // Counters alternate: now acme answers.
  EXPECT_TRUE(counter(c, "acme", 2, stream_terms(), 3000).ok());
  EXPECT_EQ(counter(c, "beta", 2, stream_terms(), 3000).error().code, Errc::permission_denied);
}

TEST(Transitions, StaleVersionIsAConflictNamingTheCurrentOne) {
  Contract c = proposed();
  ASSERT_TRUE(apply(c, *counter(c, "beta", 1, cheaper(), 2000), "beta", trust()).ok());
  ASSERT_TRUE(apply(c, *counter(c, "acme", 2, stream_terms(), 3000), "acme", trust()).ok());
  expect_error(accept(c, beta(), 2, 4000), Errc::conflict, "contract " + c.id + " is at version 3, not 2");
  expect_error(counter(c, "beta", 1, cheaper(), 4000), Errc::conflict,
               "contract " + c.id + " is at version 3, not 1");
  expect_error(reject(c, "beta", 4, "no", 4000), Errc::conflict, "contract " + c.id + " is at version 3, not 4");
  expect_error(revoke(c, "beta", 2, "no", 4000), Errc::conflict, "contract " + c.id + " is at version 3, not 2");
}

TEST(Transitions, AcceptSignsTheOfferAndCountersignActivates) {
  Contract c = proposed();
  expect_error(accept(c, acme(), 1, 2000), Errc::permission_denied,
               "acme made version 1 of contract " + c.id + "; only beta may accept it");
  auto v2 = accept(c, beta(), 1, 2000);
  ASSERT_TRUE(v2.ok()) << v2.error().message;
  EXPECT_EQ(v2->state, State::accepted);
  EXPECT_EQ(v2->offer, 1u);
  ASSERT_EQ(v2->signatures.size(), 1u);
  EXPECT_EQ(v2->signatures[0].domain, "beta");
  EXPECT_TRUE(certs::verify_signature(trust(), v2->signatures[0], signing_message(c.id, 1, stream_terms())).ok());
  ASSERT_TRUE(apply(c, *v2, "beta", trust()).ok());

  // Accepted: no more counters, accepts or rejects.
  expect_error(counter(c, "acme", 2, cheaper(), 3000), Errc::conflict,
               "contract " + c.id + " is accepted; only a proposed or countered contract can be countered");
  EXPECT_EQ(accept(c, acme(), 2, 3000).error().code, Errc::conflict);
  EXPECT_EQ(reject(c, "acme", 2, "changed my mind", 3000).error().code, Errc::conflict);
  // Only the offerer countersigns.
  expect_error(countersign(c, beta(), 2, 3000), Errc::permission_denied,
               "beta made version 2 of contract " + c.id + "; only acme may countersign it");
  auto v3 = countersign(c, acme(), 2, 3000);
  ASSERT_TRUE(v3.ok()) << v3.error().message;
  EXPECT_EQ(v3->state, State::active);
  ASSERT_EQ(v3->signatures.size(), 2u);
  EXPECT_EQ(v3->signatures[0], v2->signatures[0]);
  EXPECT_EQ(v3->signatures[1].domain, "acme");
  ASSERT_TRUE(apply(c, *v3, "acme", trust()).ok());
  EXPECT_EQ(countersign(c, acme(), 3, 4000).error().code, Errc::conflict);
}

TEST(Transitions, RejectIsTerminal) {
  Contract c = proposed();
  EXPECT_EQ(reject(c, "acme", 1, "no", 2000).error().code, Errc::permission_denied);
  auto v2 = reject(c, "beta", 1, "too expensive", 2000);
  ASSERT_TRUE(v2.ok());
  EXPECT_EQ(v2->reason, "too expensive");
  ASSERT_TRUE(apply(c, *v2, "beta", trust()).ok());
  EXPECT_EQ(c.state_at(0), State::rejected);
  for (auto r : {counter(c, "acme", 2, cheaper(), 3000), accept(c, acme(), 2, 3000),
                 reject(c, "acme", 2, "x", 3000), revoke(c, "acme", 2, "x", 3000)}) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, Errc::conflict) << r.error().message;
  }
  EXPECT_EQ(reject(c, "beta", 1, std::string(kMaxReasonBytes + 1, 'x'), 1).error().code, Errc::conflict);
}

TEST(Transitions, RevokeByEitherPartyOnAcceptedOrActive) {
  Contract p = proposed();
  expect_error(revoke(p, "acme", 1, "no", 2000), Errc::conflict,
               "contract " + p.id + " is proposed; only an accepted or active contract can be revoked");
  Contract c = testing::active_contract(stream_terms(), acme(), beta());
  for (const char* who : {"acme", "beta"}) {
    auto v = revoke(c, who, 3, "breach of terms", 5000);
    ASSERT_TRUE(v.ok()) << who << ": " << v.error().message;
    EXPECT_EQ(v->state, State::revoked);
    EXPECT_EQ(v->offer, 1u);
  }
  EXPECT_EQ(revoke(c, "gamma", 3, "x", 5000).error().code, Errc::permission_denied);
  expect_error(revoke(c, "acme", 3, "", 5000), Errc::invalid_argument, "a revocation needs a reason");
  EXPECT_EQ(revoke(c, "acme", 3, std::string(kMaxReasonBytes + 1, 'x'), 5000).error().code,
            Errc::invalid_argument);
  ASSERT_TRUE(apply(c, *revoke(c, "beta", 3, "breach of terms", 5000), "beta", trust()).ok());
  EXPECT_EQ(c.state_at(kJan2027 + 1), State::revoked);
  EXPECT_FALSE(c.in_force(kJan2027 + 1));
  EXPECT_EQ(revoke(c, "acme", 4, "again", 6000).error().code, Errc::conflict);
}

TEST(Notice, AHostingContractRevokedInForceEndsItsRunsAfterTheNotice) {
  using testing::hosting_terms;
  Contract c = testing::active_contract(hosting_terms(), acme(), beta());
  EXPECT_EQ(c.notice_until_ms(), 0);
  const int64_t at = kJan2027 + 5000;
  ASSERT_TRUE(apply(c, *revoke(c, "beta", 3, "capacity needed", at), "beta", trust()).ok());
  EXPECT_FALSE(c.in_force(at + 1));  // nothing new under it
  EXPECT_EQ(c.notice_until_ms(), at + 600'000);
  EXPECT_TRUE(c.in_notice(at + 599'999));
  EXPECT_FALSE(c.in_notice(at + 600'000));
  rapidjson::Document d;
  const std::string json = contract_to_json(c, at + 1);
  d.Parse(json.c_str());
  ASSERT_TRUE(d.IsObject() && d.HasMember("notice_until")) << json;
  EXPECT_STREQ(d["notice_until"].GetString(), "2027-01-01T00:10:05Z");

  // The notice never runs past the contract's end.
  Contract late = testing::active_contract(hosting_terms(), acme(), beta());
  ASSERT_TRUE(apply(late, *revoke(late, "acme", 3, "moving out", kJan2028 - 1000), "acme", trust()).ok());
  EXPECT_EQ(late.notice_until_ms(), kJan2028);

  // No notice: revoked before it was in force, without notice, or a
  // stream contract (its terms have none).
  Contract early = testing::active_contract(hosting_terms(), acme(), beta());
  ASSERT_TRUE(apply(early, *revoke(early, "acme", 3, "changed plans", kJan2027 - 1), "acme", trust()).ok());
  EXPECT_EQ(early.notice_until_ms(), 0);
  Terms none = hosting_terms();
  none.hosting.notice_seconds = 0;
  Contract bare = testing::active_contract(none, acme(), beta());
  ASSERT_TRUE(apply(bare, *revoke(bare, "acme", 3, "x", at), "acme", trust()).ok());
  EXPECT_EQ(bare.notice_until_ms(), 0);
  EXPECT_EQ(contract_to_json(bare, at + 1).find("notice_until"), std::string::npos);
  Contract stream = testing::active_contract(stream_terms(), acme(), beta());
  ASSERT_TRUE(apply(stream, *revoke(stream, "acme", 3, "x", at), "acme", trust()).ok());
  EXPECT_EQ(stream.notice_until_ms(), 0);
}

TEST(Expiry, DerivedFromValidity) {
  Contract c = testing::active_contract(stream_terms(), acme(), beta());
  EXPECT_EQ(c.state_at(kJan2027 - 1000), State::active);  // signed, not started
  EXPECT_FALSE(c.in_force(kJan2027 - 1000));
  EXPECT_TRUE(c.in_force(kJan2027));
  EXPECT_EQ(c.state_at(kJan2028 - 1), State::active);
  EXPECT_TRUE(c.in_force(kJan2028 - 1));
  EXPECT_EQ(c.state_at(kJan2028), State::expired);
  EXPECT_FALSE(c.in_force(kJan2028));
  // An accepted contract expires too; a proposal does not.
  Contract p = proposed();
  EXPECT_EQ(p.state_at(kJan2028 + 1), State::proposed);
  ASSERT_TRUE(apply(p, *accept(p, beta(), 1, 2000), "beta", trust()).ok());
  EXPECT_EQ(p.state_at(kJan2027), State::accepted);
  EXPECT_FALSE(p.in_force(kJan2027));
  EXPECT_EQ(p.state_at(kJan2028), State::expired);
}

TEST(Apply, RefusesAVersionMadeByAnotherDomainThanTheSender) {
  Contract c = proposed();
  auto v2 = counter(c, "beta", 1, cheaper(), 2000);
  ASSERT_TRUE(v2.ok());
  // gamma relays a version claiming to be beta's.
  Status s = apply(c, *v2, "gamma", trust());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::permission_denied);
  EXPECT_EQ(s.error().message, "version 2 of contract " + c.id + " is made by 'beta' but comes from gamma");
  // acme forging beta's counter.
  v2->by = "beta";
  s = apply(c, *v2, "acme", trust());
  EXPECT_EQ(s.error().code, Errc::permission_denied);
  EXPECT_EQ(c.history.size(), 1u);
}

TEST(Apply, RefusesReplayedAndSkippedVersions) {
  Contract c = proposed();
  auto v2 = counter(c, "beta", 1, cheaper(), 2000);
  ASSERT_TRUE(apply(c, *v2, "beta", trust()).ok());
  Status replay = apply(c, *v2, "beta", trust());
  ASSERT_FALSE(replay.ok());
  EXPECT_EQ(replay.error().code, Errc::conflict);
  EXPECT_EQ(replay.error().message, "contract " + c.id + " is at version 2; version 2 is not the next one");
  Version ahead = *v2;
  ahead.number = 5;
  EXPECT_EQ(apply(c, ahead, "beta", trust()).error().code, Errc::conflict);
  Status restart = apply(c, c.history[0], "acme", trust());
  EXPECT_EQ(restart.error().code, Errc::conflict);
  EXPECT_EQ(c.history.size(), 2u);
}

TEST(Apply, RefusesTamperedSignatures) {
  Contract c = proposed();
  auto v2 = accept(c, beta(), 1, 2000);
  ASSERT_TRUE(v2.ok());
  // One base64 character flipped.
  Version tampered = *v2;
  std::string& value = tampered.signatures[0].value;
  value[5] = value[5] == 'A' ? 'B' : 'A';
  Status s = apply(c, tampered, "beta", trust());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::permission_denied);
  EXPECT_EQ(s.error().message, "version 2 of contract " + c.id + ": signature of beta/n1 does not verify");
  // A valid signature over other terms: the acceptor signed something else.
  Version swapped = *v2;
  swapped.signatures[0] = *beta().sign(signing_message(c.id, 1, cheaper()));
  EXPECT_NE(apply(c, swapped, "beta", trust()).error().message.find("does not verify"), std::string::npos);
  // Terms changed after signing.
  Version changed = *v2;
  changed.terms = cheaper();
  EXPECT_EQ(apply(c, changed, "beta", trust()).error().message,
            "version 2 of contract " + c.id + " changes the terms; only a counter-offer may");
  // Signed by beta's impostor (a CA that is not pinned for beta).
  Version impostor = *v2;
  impostor.signatures[0] = *Domains::get().evil_beta().sign(signing_message(c.id, 1, stream_terms()));
  EXPECT_NE(apply(c, impostor, "beta", trust()).error().message.find("certificate of beta/n1 is not trusted"),
            std::string::npos);
  // Signed by acme on beta's behalf.
  Version wrong_signer = *v2;
  wrong_signer.signatures[0] = *acme().sign(signing_message(c.id, 1, stream_terms()));
  EXPECT_EQ(apply(c, wrong_signer, "beta", trust()).error().message,
            "an acceptance by beta carries exactly one signature, by beta");
  // No signature at all.
  Version unsigned_v = *v2;
  unsigned_v.signatures.clear();
  EXPECT_EQ(apply(c, unsigned_v, "beta", trust()).error().code, Errc::permission_denied);
  EXPECT_EQ(c.history.size(), 1u);
  EXPECT_TRUE(apply(c, *v2, "beta", trust()).ok());

  // The countersignature must keep the acceptor's signature as it was.
  auto v3 = countersign(c, acme(), 2, 3000);
  ASSERT_TRUE(v3.ok());
  Version dropped = *v3;
  dropped.signatures[0] = dropped.signatures[1];
  EXPECT_EQ(apply(c, dropped, "acme", trust()).error().code, Errc::permission_denied);
  Version flipped = *v3;
  std::string& v = flipped.signatures[1].value;
  v[7] = v[7] == 'A' ? 'B' : 'A';
  EXPECT_NE(apply(c, flipped, "acme", trust()).error().message.find("signature of acme/n1 does not verify"),
            std::string::npos);
  EXPECT_TRUE(apply(c, *v3, "acme", trust()).ok());
  EXPECT_TRUE(c.in_force(kJan2027));
}

TEST(Apply, RefusesRecordingExpiredOrBadStates) {
  Contract c = proposed();
  Version v = c.history[0];
  v.number = 2;
  v.state = State::expired;
  v.by = "beta";
  EXPECT_EQ(apply(c, v, "beta", trust()).error().message, "expired is derived from valid_until and never recorded");
  v.state = State::proposed;
  EXPECT_EQ(apply(c, v, "beta", trust()).error().code, Errc::conflict);
  Contract fresh{new_contract_id(), {}};
  Version counter_first = c.history[0];
  counter_first.state = State::countered;
  EXPECT_EQ(apply(fresh, counter_first, "acme", trust()).error().code, Errc::invalid_argument);
  Contract bad_id{"contract-1", {}};
  EXPECT_EQ(apply(bad_id, c.history[0], "acme", trust()).error().code, Errc::invalid_argument);
}

TEST(VersionJson, RoundTripsExactly) {
  Contract c = testing::active_contract(stream_terms(), acme(), beta());
  ASSERT_TRUE(apply(c, *revoke(c, "beta", 3, "line 1\n\"quoted\" \xc3\xa9", 4000), "beta", trust()).ok());
  for (const Version& v : c.history) {
    const std::string json = version_to_json(v);
    auto back = version_from_text(json);
    ASSERT_TRUE(back.ok()) << back.error().message;
    EXPECT_EQ(*back, v);
    EXPECT_EQ(version_to_json(*back), json);
  }
  // Hosting terms too.
  Contract h = testing::active_contract(testing::hosting_terms(), beta(), acme());
  auto back = version_from_text(version_to_json(h.history[2]));
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(*back, h.history[2]);
}

TEST(VersionJson, ErrorsNameTheirPaths) {
  EXPECT_EQ(version_from_text("{").error().code, Errc::parse_error);
  EXPECT_EQ(version_from_text("[]").error().message, "$: must be an object");
  Contract c = testing::active_contract(stream_terms(), acme(), beta());
  rapidjson::Document d;
  const std::string json = version_to_json(c.history[2]);
  d.Parse(json.data(), json.size());
  d["number"].SetInt(-3);
  d["state"].SetString("expired");
  d["signatures"][1].RemoveMember("value");
  d["terms"]["streams"][0].SetString("B!");
  d.AddMember("extra", true, d.GetAllocator());
  auto r = version_from_json(d);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.error().message;
  EXPECT_NE(m.find("$.extra: unknown field"), std::string::npos) << m;
  EXPECT_NE(m.find("$.number: must not be negative"), std::string::npos) << m;
  EXPECT_NE(m.find("$.state: must be proposed, countered, accepted, active, rejected or revoked"),
            std::string::npos) << m;
  EXPECT_NE(m.find("$.signatures[1].value: missing"), std::string::npos) << m;
  EXPECT_NE(m.find("$.terms.streams[0]: invalid stream name 'B!'"), std::string::npos) << m;
  EXPECT_EQ(version_from_text(std::string((1 << 20) + 1, ' ')).error().code, Errc::limit_exceeded);
}

TEST(ContractJson, ShowsStateAtNowAndTheWholeHistory) {
  Contract c = testing::active_contract(stream_terms(), acme(), beta());
  const std::string json = contract_to_json(c, kJan2027);
  rapidjson::Document d;
  d.Parse(json.data(), json.size());
  ASSERT_TRUE(d.IsObject());
  EXPECT_EQ(std::string(d["id"].GetString()), c.id);
  EXPECT_EQ(std::string(d["kind"].GetString()), "stream");
  EXPECT_EQ(std::string(d["state"].GetString()), "active");
  EXPECT_TRUE(d["in_force"].GetBool());
  EXPECT_EQ(d["version"].GetUint64(), 3u);
  EXPECT_EQ(std::string(d["parties"][0].GetString()), "acme");
  EXPECT_EQ(std::string(d["parties"][1].GetString()), "beta");
  ASSERT_EQ(d["history"].Size(), 3u);
  EXPECT_EQ(d["history"][2]["signatures"].Size(), 2u);
  const std::string later = contract_to_json(c, kJan2028);
  EXPECT_NE(later.find(R"("state":"expired")"), std::string::npos);
  EXPECT_NE(later.find(R"("in_force":false)"), std::string::npos);
}

}  // namespace
}  // namespace entente::contracts
