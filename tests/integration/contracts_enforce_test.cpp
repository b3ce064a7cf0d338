// Enforcement of a stream contract's predicate and rate cap by the provider,
// with two real brokers (issue 5, docs/protocol.md §9.5): only the rows the
// predicate passes leave acme, projected on the contract's fields, exactly
// once across a crash of the importer; a predicate that does not apply to
// the stream refuses the import; a rate cap spreads the tuples over time.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <sstream>
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
using Clock = std::chrono::steady_clock;

// What the importer may see of one bid: its event time (unique per row),
// auction and price.
struct Seen {
  int64_t time = 0, auction = 0, price = 0;
  bool has_bidder = false;
  bool operator==(const Seen& o) const {
    return time == o.time && auction == o.auction && price == o.price && has_bidder == o.has_bidder;
  }
};

Seen seen_of(const std::string& line) {
  rapidjson::Document d;
  d.Parse(line.c_str());
  Seen s;
  if (d.HasParseError() || !d.IsObject()) return s;
  auto num = [&](const char* k) -> int64_t {
    return d.HasMember(k) && d[k].IsInt64() ? d[k].GetInt64() : -1;
  };
  s.time = num("_time");
  s.auction = num("auction");
  s.price = num("price");
  return s;
}

std::string describe(const Seen& s) {
  return "{_time " + std::to_string(s.time) + ", auction " + std::to_string(s.auction) + ", price " +
         std::to_string(s.price) + (s.has_bidder ? ", bidder" : "") + "}";
}

// The owner's rows 1..head that pass `price >= 500`, as the importer should
// see them (projected: no bidder).
std::vector<Seen> passing_rows(const FedNode& owner, uint64_t head) {
  const ReadResult all = read_stream(owner.process(), "bids", 1, head, 60000);
  EXPECT_EQ(all.tuples.size(), head) << "reading acme bids: " << all.error << " " << all.close_reason;
  std::vector<Seen> out;
  for (const auto& t : all.tuples) {
    Seen s = seen_of(t.line);
    if (s.price >= 500) out.push_back(s);
  }
  return out;
}

// The mirror holds exactly `want`, in order, under 1, 2, 3, ...
void expect_mirror(const FedNode& importer, const std::vector<Seen>& want) {
  ASSERT_FALSE(want.empty());
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(importer, "acme/bids", want.size() + 1));
  const ReadResult got = read_stream(importer.process(), "acme%2Fbids", 1, want.size(), 60000);
  ASSERT_EQ(got.tuples.size(), want.size()) << got.error << " " << got.close_reason;
  size_t mismatches = 0;
  for (size_t i = 0; i < want.size() && mismatches < 5; ++i) {
    Seen s = seen_of(got.tuples[i].line);
    s.has_bidder = got.tuples[i].line.find("\"bidder\"") != std::string::npos;
    if (got.tuples[i].seq != i + 1 || !(s == want[i])) {
      ++mismatches;
      ADD_FAILURE() << "mirror position " << i + 1 << ": " << got.tuples[i].line << ", want " << describe(want[i]);
    }
  }
  // Nothing more arrives.
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(get_import(importer.process(), "acme/bids").next_seq, want.size() + 1);
}

// The value of a metric line `name{labels} value` in /metrics; -1 when absent.
double metric(const FedNode& n, const std::string& name_and_labels) {
  const std::string text = n.process().request("GET", "/metrics", "", kReaderToken).body;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name_and_labels + " ", 0) == 0) return std::strtod(line.c_str() + name_and_labels.size() + 1, nullptr);
  }
  return -1;
}

TEST(ContractsEnforce, OnlyRowsThePredicatePassesCrossProjectedAndExactlyOnceAcrossACrash) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  FedNode& acme = *d.acme;
  FedNode& beta = *d.beta;
  // The predicate reads price, which the projection keeps, and the
  // contract keeps bidder from beta.
  const std::string id = d.agree(stream_terms(1, seconds_from_now(-60), seconds_from_now(3600),
                                              R"(["auction","price"])", R"("predicate":"price >= 500")"));
  auto imported = import_stream(beta, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body;
  EXPECT_EQ(schema_names(imported.body), (std::vector<std::string>{"auction", "price"})) << imported.body;

  constexpr uint64_t kN = 2000;
  ASSERT_NO_FATAL_FAILURE(publish(acme, "bids", 0, kN));
  std::vector<Seen> want = passing_rows(acme, kN);
  ASSERT_GT(want.size(), kN / 3);
  ASSERT_LT(want.size(), kN * 2 / 3);
  ASSERT_NO_FATAL_FAILURE(expect_mirror(beta, want));
  // What crossed, and what acme metered: the passing rows only.
  EXPECT_EQ(get_import(beta.process(), "acme/bids").tuples, want.size());
  std::string usage;
  EXPECT_TRUE(eventually(5s, [&] {
    usage = acme.process().request("GET", "/v1/contracts/" + id + "/usage", "", kReaderToken).body;
    return uint_field(usage, "tuples") == want.size();
  })) << usage;

  // A record none of whose rows passes still gets acknowledged (an empty
  // DATA covers it), so acme's log is not pinned by it.
  std::string cheap;
  for (int i = 0; i < 50; ++i) {
    cheap += R"({"auction":7,"bidder":)" + std::to_string(900000 + i) + R"(,"price":1,"date_time":)" +
             std::to_string(kBidTimeZero) + "}\n";
  }
  auto r = acme.process().request("POST", "/v1/streams/bids/tuples", cheap, kPublisherToken, "application/x-ndjson");
  ASSERT_EQ(r.status, 200u) << r.body;
  ImportView iv;
  EXPECT_TRUE(eventually(5s, [&] {
    iv = get_import(beta.process(), "acme/bids");
    return iv.acked == kN + 50;
  })) << "beta acknowledges acme's sequence numbers through " << kN + 50 << ": " << iv.body;
  EXPECT_EQ(iv.next_seq, want.size() + 1) << iv.body;

  // kill -9 the importer while acme keeps publishing; after its restart the
  // mirror still holds every passing row once, in order.
  Feeder feeder(acme.process(), "bids", [](uint64_t i) { return bid(kN + 100 + i); });
  feeder.start();
  std::this_thread::sleep_for(400ms);
  beta.process().kill();
  std::this_thread::sleep_for(400ms);
  ASSERT_TRUE(beta.process().start()) << beta.process().last_error();
  std::this_thread::sleep_for(600ms);
  feeder.stop();
  ASSERT_GT(feeder.acked(), 0u) << feeder.last_failure();
  const uint64_t head = next_seq(acme.process(), "bids") - 1;
  EXPECT_EQ(head, kN + 50 + feeder.acked());
  want = passing_rows(acme, head);
  ASSERT_NO_FATAL_FAILURE(expect_mirror(beta, want));
  EXPECT_TRUE(eventually(10s, [&] {
    iv = get_import(beta.process(), "acme/bids");
    return iv.acked == head;
  })) << iv.body;
}

TEST(ContractsEnforce, APredicateThatDoesNotApplyToTheStreamRefusesTheImport) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  FedNode& acme = *d.acme;
  FedNode& beta = *d.beta;
  // The terms are checked against acme's catalog when signed; the stream
  // may change afterwards: acme recreates bids without a price.
  d.agree(stream_terms(1, seconds_from_now(-60), seconds_from_now(3600), "[]", R"("predicate":"price > 1")"));
  ASSERT_EQ(acme.process().request("DELETE", "/v1/streams/bids").status / 100, 2u);
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "bids",
                                        R"([{"name":"auction","type":"int64"},{"name":"date_time","type":"timestamp"}])"));
  auto refused = import_stream(beta, "acme/bids");
  EXPECT_EQ(refused.status, 403u) << refused.body;
  const std::string detail = problem_detail(refused.body);
  EXPECT_NE(detail.find("has a predicate that does not apply to acme/bids"), std::string::npos) << refused.body;
  EXPECT_NE(detail.find("price"), std::string::npos) << refused.body;
  EXPECT_EQ(get_import(beta.process(), "acme/bids").status, 404u) << "no import is left behind";
}

// The usage of contract `id` on `n`, as GET /v1/contracts/{id}/usage says.
uint64_t usage_tuples(const FedNode& n, const std::string& id) {
  return uint_field(n.process().request("GET", "/v1/contracts/" + id + "/usage", "", kReaderToken).body, "tuples");
}

// Issue 11, point 3: tuples in flight when the contract is revoked are
// stored by the consumer and charged to that contract, once, across a
// kill -9 of the provider and under the next contract.
TEST(ContractsEnforce, TuplesInFlightAtARevocationAreChargedOnceAcrossARestart) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  FedNode& acme = *d.acme;
  FedNode& beta = *d.beta;
  const int64_t from = seconds_from_now(-60), until = seconds_from_now(3600);
  const std::string id = d.agree(stream_terms(1, from, until, "[]"));
  auto imported = import_stream(beta, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body;

  // One large batch, and the revocation right after it is stored.
  constexpr uint64_t kN = 60000;
  std::string batch;
  for (uint64_t i = 0; i < kN; ++i) batch += bid(i) + "\n";
  auto published = acme.process().request("POST", "/v1/streams/bids/tuples", batch, kPublisherToken,
                                          "application/x-ndjson");
  ASSERT_EQ(published.status, 200u) << published.body;
  auto revoked = act(acme, id, "revoke", R"({"version":3,"reason":"in flight"})");
  ASSERT_EQ(revoked.status, 200u) << revoked.body;

  // beta stores what was in flight, and holds it as acknowledged.
  ImportView iv;
  uint64_t held = 0;
  ASSERT_TRUE(eventually(30s, [&] {
    iv = get_import(beta.process(), "acme/bids");
    if (iv.state != "refused" || iv.next_seq == 0 || iv.acked != iv.next_seq - 1) return false;
    if (iv.next_seq - 1 != held) {  // still moving: look again
      held = iv.next_seq - 1;
      return false;
    }
    return true;
  })) << iv.body;
  ASSERT_GT(held, 0u) << iv.body;
  ASSERT_LE(held, kN);
  // Everything beta's mirror holds was sent under the contract: acme
  // charges exactly that.
  uint64_t charged = 0;
  EXPECT_TRUE(eventually(15s, [&] { return (charged = usage_tuples(acme, id)) == held; }))
      << "acme charged " << charged << " of the " << held << " tuples beta's mirror holds";

  // kill -9 acme: the count stays.
  ASSERT_TRUE(acme.process().restart_after_kill()) << acme.process().last_error();
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta));
  EXPECT_TRUE(eventually(10s, [&] { return (charged = usage_tuples(acme, id)) == held; }))
      << "after a restart acme shows " << charged << ", not " << held;

  // A new contract: the rest crosses under it, and nothing is counted twice.
  const std::string id2 = d.agree(stream_terms(2, seconds_from_now(-30), until, "[]"));
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(beta, "acme/bids", kN + 1));
  uint64_t charged2 = 0;
  EXPECT_TRUE(eventually(15s, [&] { return (charged2 = usage_tuples(acme, id2)) == kN - held; }))
      << "the new contract is charged " << charged2 << ", not " << kN - held;
  EXPECT_EQ(usage_tuples(acme, id), held) << "the revoked contract is charged nothing more";
  EXPECT_EQ(get_import(beta.process(), "acme/bids").tuples, kN) << "beta received every tuple once";
}

// The same promise when the provider dies right after sending: what beta
// stores of it is charged once, whether acme heard the acknowledgement
// before it died (the charge is durable) or not (the range it sent is).
TEST(ContractsEnforce, TuplesSentJustBeforeTheProviderIsKilledAreChargedOnce) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  FedNode& acme = *d.acme;
  FedNode& beta = *d.beta;
  const std::string id = d.agree(stream_terms(1, seconds_from_now(-60), seconds_from_now(3600), "[]"));
  auto imported = import_stream(beta, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body;
  constexpr uint64_t kN = 60000;
  std::string batch;
  for (uint64_t i = 0; i < kN; ++i) batch += bid(i) + "\n";
  auto published = acme.process().request("POST", "/v1/streams/bids/tuples", batch, kPublisherToken,
                                          "application/x-ndjson");
  ASSERT_EQ(published.status, 200u) << published.body;
  ASSERT_TRUE(acme.process().restart_after_kill()) << acme.process().last_error();
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta));
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(beta, "acme/bids", kN + 1));
  uint64_t charged = 0;
  EXPECT_TRUE(eventually(15s, [&] { return (charged = usage_tuples(acme, id)) == kN; }))
      << "acme charged " << charged << " of the " << kN << " tuples beta's mirror holds";
  // Once more after a restart, and nothing more later.
  ASSERT_TRUE(acme.process().restart_after_kill()) << acme.process().last_error();
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta));
  std::this_thread::sleep_for(500ms);
  EXPECT_EQ(usage_tuples(acme, id), kN);
}

// Issue 11, point 18: of several contracts covering a stream, the refusal
// names the one that governs: after a restart, the revoked contract, not
// an offer rejected after it.
TEST(ContractsEnforce, AfterARestartTheRefusalNamesTheRevokedContractNotARejectedOffer) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  FedNode& acme = *d.acme;
  FedNode& beta = *d.beta;
  const int64_t from = seconds_from_now(-60), until = seconds_from_now(3600);
  const std::string id = d.agree(stream_terms(1, from, until));
  auto imported = import_stream(beta, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body;
  ASSERT_EQ(act(acme, id, "revoke", R"({"version":3,"reason":"audit"})").status, 200u);
  ImportView iv;
  ASSERT_TRUE(eventually(10s, [&] {
    iv = get_import(beta.process(), "acme/bids");
    return iv.state == "refused";
  })) << iv.body;

  // beta offers again; acme rejects the offer, after the revocation.
  auto offered = beta.process().request("POST", "/v1/contracts", "{\"terms\":" + stream_terms(1, from, until) + "}");
  ASSERT_EQ(offered.status, 201u) << offered.body;
  const std::string offer = parse_contract(offered.status, offered.body).id;
  ASSERT_EQ(wait_version(acme, offer, 1).version, 1u);
  std::this_thread::sleep_for(1100ms);  // the rejection is recorded strictly later
  ASSERT_EQ(act(acme, offer, "reject", R"({"version":1,"reason":"too cheap"})").status, 200u);
  ASSERT_EQ(wait_version(beta, offer, 2).state, "rejected");

  // Both restart; beta opens the import again and acme refuses it.
  ASSERT_TRUE(acme.process().restart_after_kill()) << acme.process().last_error();
  ASSERT_TRUE(beta.process().restart_after_kill()) << beta.process().last_error();
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta));
  ASSERT_TRUE(eventually(10s, [&] {
    iv = get_import(beta.process(), "acme/bids");
    return iv.state == "refused" && iv.reason.find("stream contract") != std::string::npos;
  })) << iv.body;
  EXPECT_NE(iv.reason.find("stream contract " + id + " was revoked by acme: audit"), std::string::npos) << iv.body;
  EXPECT_EQ(iv.reason.find(offer), std::string::npos) << iv.body;

  // A new import is refused with the same reason.
  ASSERT_EQ(beta.process().request("DELETE", "/v1/imports/acme/bids").status / 100, 2u);
  auto again = import_stream(beta, "acme/bids");
  EXPECT_EQ(again.status, 403u) << again.body;
  EXPECT_NE(problem_detail(again.body).find("stream contract " + id + " was revoked"), std::string::npos)
      << again.body;
}

TEST(ContractsEnforce, ARateCapSpreadsTheTuplesOverTimeAndDropsNone) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  FedNode& acme = *d.acme;
  FedNode& beta = *d.beta;
  const std::string id =
      d.agree(stream_terms(1, seconds_from_now(-60), seconds_from_now(3600), "[]", R"("rate_cap":2000)"));
  constexpr uint64_t kN = 6000;
  ASSERT_NO_FATAL_FAILURE(publish(acme, "bids", 0, kN));
  auto imported = import_stream(beta, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body;

  // From the first tuple's arrival to the last's: 6000 at 2000/s, from an
  // empty bucket, is about 3 s.
  Clock::time_point first_seen{}, last_seen{};
  ImportView iv;
  const auto deadline = Clock::now() + 30s;
  while (Clock::now() < deadline) {
    iv = get_import(beta.process(), "acme/bids");
    if (iv.next_seq > 1 && first_seen == Clock::time_point{}) first_seen = Clock::now();
    if (iv.next_seq == kN + 1) {
      last_seen = Clock::now();
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_NE(last_seen, Clock::time_point{}) << "not every tuple arrived: " << iv.body;
  const double seconds = std::chrono::duration<double>(last_seen - first_seen).count();
  EXPECT_GE(seconds, 2.5) << "6000 tuples under a cap of 2000/s";
  EXPECT_EQ(iv.tuples, kN);
  const double throttled = metric(acme, "entente_contract_throttled_seconds_total{contract=\"" + id + "\"}");
  EXPECT_GT(throttled, 1.0) << "acme's /metrics shows the flow throttled";
  EXPECT_EQ(metric(acme, "entente_contract_rate_cap{contract=\"" + id + "\"}"), 2000);
}

}  // namespace
}  // namespace entente::testing
