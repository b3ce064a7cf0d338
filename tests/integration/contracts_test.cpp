// Contracts between two real brokers (issue 5, docs/contracts.md): the
// domains' admins negotiate over each broker's REST API, the brokers carry
// the versions over the federation link, and a stream crosses only under an
// active, doubly-signed contract.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/contracts.h"
#include "tests/integration/support/federation.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;

TEST(Contracts, NegotiateThroughRestThenTheStreamFlowsAndStopsOnRevoke) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  FedNode& acme = *d.acme;
  FedNode& beta = *d.beta;

  // Without a contract the import is refused, naming why.
  auto refused = import_stream(beta, "acme/bids");
  EXPECT_EQ(refused.status, 403u) << refused.body;
  EXPECT_NE(problem_detail(refused.body).find("no stream contract covers it"), std::string::npos) << refused.body;

  const int64_t from = seconds_from_now(-60), until = seconds_from_now(3600);
  const std::string id = d.propose(stream_terms(5, from, until));

  // beta counters (3), acme counters (4), beta accepts; acme countersigns.
  auto c2 = act(beta, id, "counter", "{\"version\":1,\"terms\":" + stream_terms(3, from, until) + "}");
  ASSERT_EQ(c2.status, 200u) << c2.body;
  EXPECT_EQ(c2.state, "countered");
  ASSERT_EQ(wait_version(acme, id, 2).version, 2u);
  auto c3 = act(acme, id, "counter", "{\"version\":2,\"terms\":" + stream_terms(4, from, until) + "}");
  ASSERT_EQ(c3.status, 200u) << c3.body;
  ASSERT_EQ(wait_version(beta, id, 3).version, 3u);
  // Not acme's turn: it made the offer on the table.
  auto own = act(acme, id, "accept", R"({"version":3})");
  EXPECT_EQ(own.status, 403u) << own.body;
  // A reader token may not negotiate.
  auto reader = act(beta, id, "accept", R"({"version":3})", kReaderToken);
  EXPECT_EQ(reader.status, 403u) << reader.body;
  // A stale version is a 409 naming the current one.
  auto stale = beta.process().request("POST", "/v1/contracts/" + id + "/accept", R"({"version":2})");
  EXPECT_EQ(stale.status, 409u) << stale.body;
  EXPECT_EQ(uint_field(stale.body, "current_version"), 3u) << stale.body;

  auto c4 = act(beta, id, "accept", R"({"version":3})");
  ASSERT_EQ(c4.status, 200u) << c4.body;
  EXPECT_EQ(c4.state, "accepted");
  auto on_acme = wait_version(acme, id, 5);
  auto on_beta = wait_version(beta, id, 5);
  ASSERT_EQ(on_acme.version, 5u) << on_acme.body;
  ASSERT_EQ(on_beta.version, 5u) << on_beta.body;
  EXPECT_EQ(on_acme.state, "active");
  EXPECT_TRUE(on_acme.in_force);
  EXPECT_EQ(on_acme.states,
            (std::vector<std::string>{"proposed", "countered", "countered", "accepted", "active"}));
  EXPECT_EQ(on_acme.last_signatures, 2u) << "active carries both signatures";
  EXPECT_EQ(on_acme.history, on_beta.history) << "both ledgers hold the same versions";
  // Listing with filters.
  auto listed = [&](const FedNode& n, const std::string& query) {
    return n.process().request("GET", "/v1/contracts" + query, "", kReaderToken).body;
  };
  EXPECT_NE(listed(acme, "?state=active&peer=beta").find(id), std::string::npos);
  EXPECT_NE(listed(beta, "?state=active&peer=acme&kind=stream").find(id), std::string::npos);
  EXPECT_EQ(listed(acme, "?state=proposed"), R"({"contracts":[]})");
  EXPECT_EQ(listed(acme, "?peer=gamma"), R"({"contracts":[]})");
  EXPECT_EQ(listed(acme, "?kind=hosting"), R"({"contracts":[]})");

  // The stream now flows, projected to the contract's fields.
  auto imported = import_stream(beta, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body;
  EXPECT_EQ(schema_names(imported.body), (std::vector<std::string>{"auction", "price"})) << imported.body;
  constexpr uint64_t kN = 1000;
  ASSERT_NO_FATAL_FAILURE(publish(acme, "bids", 0, kN));
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(beta, "acme/bids", kN + 1));

  // Metered on the provider, at the agreed price.
  std::string usage;
  EXPECT_TRUE(eventually(5s, [&] {
    usage = acme.process().request("GET", "/v1/contracts/" + id + "/usage", "", kReaderToken).body;
    return uint_field(usage, "tuples") == kN;
  })) << usage;
  EXPECT_NE(usage.find("\"price_per_million\":4"), std::string::npos) << usage;
  EXPECT_NE(usage.find("\"cost_credits\":0.004"), std::string::npos) << usage;

  // Outside the contract: another stream of acme, and a query on beta that
  // expects a field the contract does not share.
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "asks"));
  auto other = import_stream(beta, "acme/asks");
  EXPECT_EQ(other.status, 403u) << other.body;
  EXPECT_NE(problem_detail(other.body).find("no stream contract covers it"), std::string::npos) << other.body;
  const std::string query = std::string(R"({"name":"peek","inputs":[{"name":"bids","stream":"acme/bids",)") +
                            R"("event_time":"date_time","schema":)" + kBidsSchema + R"(}],)" +
                            R"("boxes":[{"id":"f1","type":"filter","options":{"predicates":["bidder > 1"]}}],)" +
                            R"("arcs":[{"from":"bids","to":"f1"}],"outputs":[{"name":"peeked","from":"f1"}]})";
  auto outside = post_slow(beta, "/v1/queries", query);
  EXPECT_EQ(outside.status / 100, 4u) << outside.body;
  EXPECT_NE(outside.body.find("$.inputs[0]"), std::string::npos) << outside.body;
  // It names what the contract shares.
  EXPECT_NE(outside.body.find("whose schema is auction:int64, price:int64"), std::string::npos) << outside.body;

  // A subscriber of the mirror on beta, live when the contract ends.
  auto live = std::async(std::launch::async, [&] {
    return read_stream(beta.process(), "acme%2Fbids", kN + 1, kN + 100, 15000);
  });
  std::this_thread::sleep_for(300ms);

  // acme revokes: the flow stops, and beta's import says why.
  auto revoked = act(acme, id, "revoke", R"({"version":5,"reason":"audit"})");
  ASSERT_EQ(revoked.status, 200u) << revoked.body;
  EXPECT_EQ(revoked.state, "revoked");
  ImportView iv;
  EXPECT_TRUE(eventually(5s, [&] {
    iv = get_import(beta.process(), "acme/bids");
    return iv.state == "refused";
  })) << iv.body;
  EXPECT_NE(iv.reason.find("revoked by acme: audit"), std::string::npos) << iv.body;
  // ... and so does the subscriber: closed with 4003 and the reason.
  const ReadResult ended = live.get();
  EXPECT_TRUE(ended.closed) << ended.error;
  EXPECT_EQ(ended.close_code, 4003) << ended.close_reason;
  EXPECT_NE(ended.close_reason.find("resume with from=" + std::to_string(kN + 1)), std::string::npos)
      << ended.close_reason;
  EXPECT_NE(ended.close_reason.find("revoked by acme: audit"), std::string::npos) << ended.close_reason;
  EXPECT_TRUE(ended.tuples.empty());
  ASSERT_NO_FATAL_FAILURE(publish(acme, "bids", kN, 200));
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(get_import(beta.process(), "acme/bids").next_seq, kN + 1) << "nothing crosses after the revoke";
  auto after = wait_version(beta, id, 6);
  EXPECT_EQ(after.state, "revoked") << after.body;
  EXPECT_EQ(after.history, get_contract(acme, id).history);

  // A new contract: the refused import resumes by itself where its mirror
  // stands, and gets what was published meanwhile, once.
  const std::string id2 = d.agree(stream_terms(4, from, until));
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(beta, "acme/bids", kN + 201));
  EXPECT_EQ(get_import(beta.process(), "acme/bids").state, "active");
  ASSERT_EQ(act(beta, id2, "revoke", R"({"version":3,"reason":"done"})").status, 200u);
  EXPECT_TRUE(eventually(5s, [&] { return get_import(beta.process(), "acme/bids").state == "refused"; }));

  // A new import is refused with the contract's reason.
  ASSERT_EQ(beta.process().request("DELETE", "/v1/imports/acme/bids").status / 100, 2u);
  auto again = import_stream(beta, "acme/bids");
  EXPECT_EQ(again.status, 403u) << again.body;
  EXPECT_NE(problem_detail(again.body).find("revoked"), std::string::npos) << again.body;
}

TEST(Contracts, BadRequestsAreRefusedWithClearErrors) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  FedNode& acme = *d.acme;
  const int64_t from = seconds_from_now(-60), until = seconds_from_now(3600);
  struct Case {
    std::string body;
    unsigned status;
    std::string detail;
  };
  const std::vector<Case> cases = {
      {"{\"terms\":" + stream_terms(1, until, from) + "}", 400, "valid_until"},
      {R"({"terms":{"kind":"stream","provider":"acme","consumer":"gamma","streams":["bids"],)"
       R"("valid_from":0,"valid_until":1000}})",
       404, "gamma is not a peer"},
      {R"({"terms":{"kind":"stream","provider":"gamma","consumer":"beta","streams":["bids"],)"
       R"("valid_from":0,"valid_until":1000}})",
       403, "not a party"},
      {R"({"terms":{}, "extra":1})", 400, "$.extra"},
      {"not json", 400, "not JSON"},
  };
  for (const auto& c : cases) {
    auto r = acme.process().request("POST", "/v1/contracts", c.body);
    EXPECT_EQ(r.status, c.status) << c.body << " -> " << r.body;
    EXPECT_NE(problem_detail(r.body).find(c.detail), std::string::npos) << c.body << " -> " << r.body;
  }
  EXPECT_EQ(acme.process().request("GET", "/v1/contracts/c-0123456789abcdef", "", kReaderToken).status, 404u);
  EXPECT_EQ(acme.process().request("POST", "/v1/contracts", "{}", kReaderToken).status, 403u);
  auto list = acme.process().request("GET", "/v1/contracts?state=bogus", "", kReaderToken);
  EXPECT_EQ(list.status, 400u) << list.body;
  // Nothing was recorded by any of these.
  auto all = acme.process().request("GET", "/v1/contracts", "", kReaderToken);
  EXPECT_EQ(all.body, R"({"contracts":[]})");
  EXPECT_EQ(acme.process().request("GET", "/v1/health").status, 200u);
}

TEST(Contracts, AProposalMadeWhileTheLinkIsDownArrivesWhenItIsBack) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  fed.link(acme, beta);
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "bids"));
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta));
  beta.process().kill();
  // Until acme notices (the reset, or a second of silence) a message to
  // beta still goes into the link; wait for the link to be down.
  PeersView peers;
  ASSERT_TRUE(eventually(5s, [&] {
    peers = get_peers(acme.process());
    return peers.state_of(beta.identity()) != "up";
  })) << peers.body;

  const std::string terms = stream_terms(2, seconds_from_now(-60), seconds_from_now(3600));
  auto r = acme.process().request("POST", "/v1/contracts", "{\"terms\":" + terms + "}");
  ASSERT_EQ(r.status, 201u) << r.body;
  EXPECT_NE(r.body.find("\"delivered\":false"), std::string::npos) << r.body;
  const std::string id = parse_contract(r.status, r.body).id;

  ASSERT_TRUE(beta.process().start()) << beta.process().last_error();
  auto seen = wait_version(beta, id, 1, 20s);
  ASSERT_EQ(seen.version, 1u) << seen.body;
  EXPECT_EQ(seen.state, "proposed");

  // beta accepts and restarts before acme could answer... acme answers on
  // the next link: both end active, and the ledgers survive the restarts.
  auto accepted = act(beta, id, "accept", R"({"version":1})");
  ASSERT_EQ(accepted.status, 200u) << accepted.body;
  ASSERT_TRUE(beta.process().restart_after_kill());
  ASSERT_TRUE(acme.process().restart_after_kill());
  auto on_beta = wait_version(beta, id, 3, 20s);
  auto on_acme = wait_version(acme, id, 3, 20s);
  EXPECT_EQ(on_beta.state, "active") << on_beta.body;
  EXPECT_EQ(on_acme.state, "active") << on_acme.body;
  EXPECT_EQ(on_beta.history, on_acme.history);
}

TEST(Contracts, AnExpiredContractStopsTheFlow) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  FedNode& acme = *d.acme;
  FedNode& beta = *d.beta;
  // In force for a few seconds only.
  const std::string id = d.agree(stream_terms(1, seconds_from_now(-60), seconds_from_now(4), "[]"));
  auto imported = import_stream(beta, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body;
  ASSERT_NO_FATAL_FAILURE(publish(acme, "bids", 0, 100));
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(beta, "acme/bids", 101));
  ImportView iv;
  EXPECT_TRUE(eventually(10s, [&] {
    iv = get_import(beta.process(), "acme/bids");
    return iv.state == "refused";
  })) << iv.body;
  EXPECT_NE(iv.reason.find("expired"), std::string::npos) << iv.body;
  EXPECT_EQ(get_contract(acme, id).state, "expired");
}

}  // namespace
}  // namespace entente::testing
