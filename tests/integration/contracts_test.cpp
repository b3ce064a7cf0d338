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

#include "rapidjson/document.h"
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
  EXPECT_EQ(ended.close_reason, "revoked " + id + " by acme; from=" + std::to_string(kN + 1));
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

// The "errors" of a problem (or another array of {path, message}): "path:
// message" each.
std::vector<std::string> problem_errors(const std::string& body, const char* member = "errors") {
  std::vector<std::string> out;
  rapidjson::Document d;
  d.Parse(body.c_str());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember(member) || !d[member].IsArray()) return out;
  for (const auto& e : d[member].GetArray()) {
    if (e.IsObject() && e.HasMember("path") && e["path"].IsString() && e.HasMember("message") && e["message"].IsString()) {
      out.push_back(std::string(e["path"].GetString()) + ": " + e["message"].GetString());
    }
  }
  return out;
}

// Whether one of `errors` begins with `path` and contains `text`.
bool has_error(const std::vector<std::string>& errors, const std::string& path, const std::string& text) {
  for (const auto& e : errors) {
    if (e.rfind(path + ": ", 0) == 0 && e.find(text) != std::string::npos) return true;
  }
  return false;
}

// Issue 11, point 12: terms are checked against the provider's catalog
// when proposed, countered or accepted on the provider's node; every
// problem is answered at once, with its path; ?dry_run=true checks only.
TEST(Contracts, TermsAreCheckedAgainstTheProvidersCatalog) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  FedNode& acme = *d.acme;
  FedNode& beta = *d.beta;
  const int64_t from = seconds_from_now(-60), until = seconds_from_now(3600);
  auto propose = [&](const FedNode& n, const std::string& terms, const std::string& query = "") {
    return n.process().request("POST", "/v1/contracts" + query, "{\"terms\":" + terms + "}");
  };

  // A field bids does not have.
  auto r = propose(acme, stream_terms(1, from, until, R"(["auction","price","prise"])"));
  EXPECT_EQ(r.status, 400u) << r.body;
  auto errors = problem_errors(r.body);
  EXPECT_EQ(errors.size(), 1u) << r.body;
  EXPECT_TRUE(has_error(errors, "$.terms.fields[2]", "stream acme/bids has no field 'prise'")) << r.body;
  EXPECT_NE(problem_detail(r.body).find("$.terms.fields[2]: stream acme/bids has no field 'prise'"), std::string::npos)
      << r.body;

  // A predicate that does not parse.
  r = propose(acme, stream_terms(1, from, until, "[]", R"("predicate":"price > 10 &&")"));
  EXPECT_EQ(r.status, 400u) << r.body;
  errors = problem_errors(r.body);
  EXPECT_EQ(errors.size(), 1u) << r.body;
  EXPECT_TRUE(has_error(errors, "$.terms.predicate", "does not compile against acme/bids")) << r.body;

  // A stream acme does not have, named where the admin wrote it (the
  // streams are sorted when recorded).
  const std::string two_streams = R"({"kind":"stream","provider":"acme","consumer":"beta","streams":["zebra","bids"],)"
                                  R"("valid_from":)" + std::to_string(from) + R"(,"valid_until":)" +
                                  std::to_string(until) + "}";
  r = propose(acme, two_streams);
  EXPECT_EQ(r.status, 400u) << r.body;
  errors = problem_errors(r.body);
  EXPECT_EQ(errors.size(), 1u) << r.body;
  EXPECT_TRUE(has_error(errors, "$.terms.streams[0]", "acme has no stream 'zebra'")) << r.body;

  // Every problem in one answer: the defect's own terms, and a stream more.
  const std::string bad = R"({"kind":"stream","provider":"acme","consumer":"beta","streams":["bids","asks"],)"
                          R"("fields":["auction","price","prise"],"predicate":"prise > 10 &&",)"
                          R"("valid_from":)" + std::to_string(from) + R"(,"valid_until":)" +
                          std::to_string(until) + "}";
  r = propose(acme, bad);
  EXPECT_EQ(r.status, 400u) << r.body;
  errors = problem_errors(r.body);
  EXPECT_EQ(errors.size(), 3u) << r.body;
  EXPECT_TRUE(has_error(errors, "$.terms.streams[1]", "acme has no stream 'asks'")) << r.body;
  EXPECT_TRUE(has_error(errors, "$.terms.fields[2]", "no field 'prise'")) << r.body;
  EXPECT_TRUE(has_error(errors, "$.terms.predicate", "unknown field 'prise'")) << r.body;

  // A dry run answers the same problems, and what would be proposed when
  // there is none; it records and sends nothing.
  r = propose(acme, bad, "?dry_run=true");
  EXPECT_EQ(r.status, 400u) << r.body;
  EXPECT_EQ(problem_errors(r.body).size(), 3u) << r.body;
  r = propose(acme, stream_terms(1, from, until, R"(["price","auction"])", R"("predicate":"price > 10")"),
              "?dry_run=true");
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_NE(r.body.find("\"dry_run\":true"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("\"state\":\"proposed\",\"version\":1"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("\"fields\":[\"price\",\"auction\"]"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("\"catalog_checked\":true"), std::string::npos) << r.body;
  EXPECT_EQ(propose(acme, "{}", "?dry_run=maybe").status, 400u);
  EXPECT_EQ(acme.process().request("GET", "/v1/contracts", "", kReaderToken).body, R"({"contracts":[]})");
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(beta.process().request("GET", "/v1/contracts", "", kReaderToken).body, R"({"contracts":[]})");

  // The consumer cannot know acme's catalog: beta's offer of a field bids
  // lacks is recorded (a dry run says the catalog was not checked) ...
  r = propose(beta, stream_terms(1, from, until, R"(["auction","prise"])"), "?dry_run=true");
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_NE(r.body.find("\"catalog_checked\":false"), std::string::npos) << r.body;
  r = propose(beta, stream_terms(1, from, until, R"(["auction","prise"])"));
  ASSERT_EQ(r.status, 201u) << r.body;
  const std::string id = parse_contract(r.status, r.body).id;
  ASSERT_EQ(wait_version(acme, id, 1).version, 1u);
  // ... acme's node shows what its catalog says of the offer ...
  auto shown = acme.process().request("GET", "/v1/contracts/" + id, "", kReaderToken);
  EXPECT_TRUE(has_error(problem_errors(shown.body, "catalog_problems"), "$.terms.fields[1]",
                        "stream acme/bids has no field 'prise'"))
      << shown.body;
  EXPECT_EQ(beta.process().request("GET", "/v1/contracts/" + id, "", kReaderToken).body.find("catalog_problems"),
            std::string::npos)
      << "beta's node knows nothing of acme's catalog";
  // ... and acme, the provider, refuses to accept it, saying why.
  r = acme.process().request("POST", "/v1/contracts/" + id + "/accept", R"({"version":1})");
  EXPECT_EQ(r.status, 400u) << r.body;
  EXPECT_TRUE(has_error(problem_errors(r.body), "$.terms.fields[1]", "stream acme/bids has no field 'prise'"))
      << r.body;
  EXPECT_EQ(get_contract(acme, id).state, "proposed");
  // A counter-offer is checked the same way, dry or not.
  const std::string bad_counter =
      "{\"version\":1,\"terms\":" + stream_terms(1, from, until, R"(["auction","prise"])") + "}";
  r = acme.process().request("POST", "/v1/contracts/" + id + "/counter", bad_counter);
  EXPECT_EQ(r.status, 400u) << r.body;
  EXPECT_TRUE(has_error(problem_errors(r.body), "$.terms.fields[1]", "no field 'prise'")) << r.body;
  const std::string good_counter = "{\"version\":1,\"terms\":" + stream_terms(1, from, until) + "}";
  r = acme.process().request("POST", "/v1/contracts/" + id + "/counter?dry_run=true", good_counter);
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_NE(r.body.find("\"state\":\"countered\",\"version\":2"), std::string::npos) << r.body;
  EXPECT_EQ(get_contract(acme, id).version, 1u) << "a dry run records nothing";
  r = acme.process().request("POST", "/v1/contracts/" + id + "/counter", good_counter);
  EXPECT_EQ(r.status, 200u) << r.body;
  EXPECT_EQ(acme.process().request("GET", "/v1/health").status, 200u);
}

// Issue 11, point 16: a subscriber of a mirror whose contract is revoked
// learns why and where to resume within the close reason's 123 bytes; the
// next subscription attempt gets the whole text.
TEST(Contracts, ARevokedMirrorsSubscriberGetsTheCauseAndResumePointFirst) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  FedNode& acme = *d.acme;
  FedNode& beta = *d.beta;
  const std::string id = d.agree(stream_terms(1, seconds_from_now(-60), seconds_from_now(3600)));
  ASSERT_EQ(import_stream(beta, "acme/bids").status, 201u);
  ASSERT_NO_FATAL_FAILURE(publish(acme, "bids", 0, 10));
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(beta, "acme/bids", 11));

  auto live = std::async(std::launch::async, [&] { return read_stream(beta.process(), "acme%2Fbids", 11, 100, 15000); });
  std::this_thread::sleep_for(300ms);
  // A long reason: more than a close frame can carry.
  const std::string reason = "the quarterly audit of the bids feed found " + std::string(150, 'x') + " and more";
  ASSERT_EQ(act(acme, id, "revoke", R"({"version":3,"reason":")" + reason + R"("})").status, 200u);
  const ReadResult ended = live.get();
  ASSERT_TRUE(ended.closed) << ended.error;
  EXPECT_EQ(ended.close_code, 4003) << ended.close_reason;
  EXPECT_LE(ended.close_reason.size(), 123u) << ended.close_reason;
  EXPECT_EQ(ended.close_reason.rfind("revoked " + id + " by acme; from=11", 0), 0u) << ended.close_reason;

  // Resuming where it said: a problem with the whole reason.
  auto again = http::WsClient::connect(beta.process().client_options(), "/v1/streams/acme%2Fbids/subscribe?from=11",
                                               {{"authorization", std::string("Bearer ") + kReaderToken}});
  ASSERT_FALSE(again.ok()) << "the subscription was accepted";
  const std::string& answer = again.error().message;
  EXPECT_NE(answer.find("HTTP 409"), std::string::npos) << answer;
  EXPECT_NE(answer.find("\"status\":409"), std::string::npos) << "a problem+json body: " << answer;
  EXPECT_NE(answer.find("acme refused acme/bids: stream contract " + id + " was revoked by acme: " + reason),
            std::string::npos)
      << answer;
  // Reading what the mirror holds still works.
  const ReadResult held = read_stream(beta.process(), "acme%2Fbids", 1, 10, 10000);
  EXPECT_EQ(held.tuples.size(), 10u) << held.error << " " << held.close_reason;
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
