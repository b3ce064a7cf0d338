// Hosting offers (federation/hosting.h): the wire form, the host's own
// check of the definition and contract, and an offer and its reply between
// two Hosting objects joined by their hooks, with the ways a reply fails
// to come.
#include "federation/hosting.h"

#include <gtest/gtest.h>

#include <memory>
#include <cstdlib>
#include <optional>
#include <string>

#include "engine/network.h"
#include "tests/contracts/fixture.h"

namespace entente::federation {
namespace {

using contracts::testing::Domains;
using contracts::testing::hosting_terms;
using contracts::testing::kJan2027;

// A fragment network of a map and a count; `extra_box` adds one more box
// fed by the input (JSON), e.g. of a kind no contract permits.
std::string network(const std::string& extra_box = {}) {
  return R"({"name":"cut--b","inputs":[{"name":"in","event_time":"date_time","schema":)"
         R"([{"name":"auction","type":"int64"},{"name":"date_time","type":"timestamp"}]}],"boxes":[)"
         R"({"id":"cents","type":"map","options":{"fields":[{"name":"auction","expr":"auction"}]}},)"
         R"({"id":"counts","type":"aggregate","options":{"group_by":["auction"],)"
         R"("window":{"type":"tumbling","size":"1s"},"aggregates":[{"fn":"count","as":"n"}]}})" +
         (extra_box.empty() ? std::string() : "," + extra_box) +
         R"(],"arcs":[{"from":"in","to":"cents"},{"from":"cents","to":"counts"})" +
         (extra_box.empty() ? std::string() : R"(,{"from":"in","to":"x"})") +
         R"(],"outputs":[{"name":"out","from":"counts"})" +
         (extra_box.empty() ? std::string() : R"(,{"name":"out2","from":"x"})") + "]}";
}

// The unsigned member `key` of a JSON message (0 when absent).
uint64_t uint_of(const std::string& message, const std::string& key) {
  const size_t at = message.find("\"" + key + "\":");
  return at == std::string::npos ? 0 : std::strtoull(message.c_str() + at + key.size() + 3, nullptr, 10);
}

class HostingOffer : public ::testing::Test {
 protected:
  HostingOffer() {
    const auto& d = Domains::get();
    contracts::Terms terms = hosting_terms();
    terms.hosting.box_kinds = {"aggregate", "map"};  // no filter
    contracts::Contract c = contracts::testing::active_contract(terms, d.beta(), d.acme());
    contract_ = c.id;
    contracts::testing::record(beta_node_.ledger(), c);
    contracts::testing::record(acme_node_.ledger(), c);
    // Each side's messages reach the other at once, unless the link is cut.
    Hosting::Hooks to_beta{[this](const certs::Identity& peer, const std::string& m) {
                             sent_to_beta_ = m;
                             if (!link_up_ || !(peer == beta_id_)) return false;
                             if (deliver_) beta_->on_control(acme_id_, m);
                             return true;
                           },
                           nullptr, [] { return kJan2027 + 1000; }, nullptr};
    Hosting::Hooks to_acme{[this](const certs::Identity& peer, const std::string& m) {
                             sent_to_acme_ = m;
                             if (!link_up_ || !(peer == acme_id_)) return false;
                             acme_->on_control(beta_id_, m);
                             return true;
                           },
                           nullptr, [] { return kJan2027 + 1000; }, nullptr};
    acme_ = std::make_unique<Hosting>(acme_node_.ledger(), "acme", to_beta);
    beta_ = std::make_unique<Hosting>(beta_node_.ledger(), "beta", to_acme);
  }

  // Offers `net` to beta/n1 and returns what `done` got (nullopt: not yet).
  std::optional<Result<Hosting::Reply>> offer(const std::string& net, uint64_t load = 100,
                                              std::chrono::milliseconds timeout = kOfferTimeout) {
    auto got = std::make_shared<std::optional<Result<Hosting::Reply>>>();
    acme_->offer(beta_id_, Hosting::Offer{"cut", "b", net, load},
                 [got](Result<Hosting::Reply> r) { *got = std::move(r); }, timeout);
    return *got;
  }

  contracts::testing::Node acme_node_, beta_node_;
  std::string contract_;
  const certs::Identity acme_id_{"acme", "n2"}, beta_id_{"beta", "n1"};
  bool link_up_ = true, deliver_ = true;
  std::string sent_to_beta_, sent_to_acme_;
  std::unique_ptr<Hosting> acme_, beta_;
};

TEST_F(HostingOffer, TheWireFormRoundTripsAndIsBounded) {
  const Hosting::Offer o{"cut", "b", network(), 42};
  uint64_t id = 0;
  auto back = decode_offer(encode_offer(7, o), id);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(id, 7u);
  EXPECT_EQ(back->query, "cut");
  EXPECT_EQ(back->fragment, "b");
  EXPECT_EQ(back->load, 42u);
  Diagnostics diag;
  EXPECT_TRUE(engine::QueryNetwork::parse(back->network_json, diag).ok()) << diag.to_string();
  auto bad = [](const std::string& m) {
    uint64_t i = 0;
    auto r = decode_offer(m, i);
    return r.ok() ? std::string("accepted") : r.error().message;
  };
  EXPECT_EQ(bad(R"({"type":"hosting.offer","query":"q"})"), "'id' must be an unsigned integer");
  EXPECT_EQ(bad(R"({"type":"hosting.offer","id":1,"query":"","fragment":"b","network":{},"load":1})"),
            "'query' must be a string of 1 to 64 bytes");
  EXPECT_EQ(bad(R"({"type":"hosting.offer","id":1,"query":"q","fragment":"b","network":"exec rm","load":1})"),
            "'network' must be a query network (a JSON object)");
  EXPECT_EQ(bad(R"({"type":"hosting.offer","id":1,"query":"q","fragment":"b","network":{},"load":0})"),
            "'load' must be 1..1000000 CPU ms per second");
  EXPECT_NE(bad(std::string(kMaxOfferNetworkBytes + 5000, ' ')).find("over the"), std::string::npos);
}

TEST_F(HostingOffer, TheHostChecksTheDefinitionAgainstItsOwnLedger) {
  auto ok = beta_->check("acme", Hosting::Offer{"cut", "b", network(), 100});
  EXPECT_TRUE(ok.admitted) << ok.reason;
  EXPECT_EQ(ok.contract, contract_);
  // The kinds are the definition's, whatever the owner thinks: a filter.
  const std::string filter = R"({"id":"x","type":"filter","options":{"predicates":["auction > 0"]}})";
  auto kinds = beta_->check("acme", Hosting::Offer{"cut", "b", network(filter), 100});
  EXPECT_FALSE(kinds.admitted);
  EXPECT_EQ(kinds.reason, "box kind 'filter' is not in contract " + contract_);
  auto load = beta_->check("acme", Hosting::Offer{"cut", "b", network(), 1001});
  EXPECT_FALSE(load.admitted);
  EXPECT_EQ(load.reason, "load 1001 + 0 hosted exceeds contract " + contract_ + "'s maximum 1000 CPU ms/s");
  // Not a network the engine accepts: nothing of it runs.
  auto code = beta_->check("acme", Hosting::Offer{"cut", "b", R"({"name":"x","boxes":[{"id":"s","type":"shell"}]})", 1});
  EXPECT_FALSE(code.admitted);
  EXPECT_NE(code.reason.find("does not validate on beta"), std::string::npos) << code.reason;
  // Another owner has no contract.
  EXPECT_EQ(beta_->check("gamma", Hosting::Offer{"cut", "b", network(), 1}).reason,
            "no hosting contract from host beta for owner gamma");
}

TEST_F(HostingOffer, AnOfferGetsTheHostsReply) {
  auto yes = offer(network());
  ASSERT_TRUE(yes.has_value());
  ASSERT_TRUE(yes->ok()) << yes->error().message;
  EXPECT_TRUE((*yes)->admitted);
  EXPECT_EQ((*yes)->contract, contract_);
  EXPECT_EQ((*yes)->reason, "admitted under contract " + contract_);
  auto no = offer(network(), 5000);
  ASSERT_TRUE(no.has_value() && no->ok());
  EXPECT_FALSE((*no)->admitted);
  EXPECT_NE((*no)->reason.find("exceeds contract"), std::string::npos) << (*no)->reason;
  // A malformed offer is answered, not run.
  beta_->on_control(acme_id_, R"({"type":"hosting.offer","id":99,"query":"q"})");
  EXPECT_EQ(sent_to_acme_, R"({"type":"hosting.reply","id":99,"admitted":false,"contract":"",)"
                           R"("reason":"malformed offer: 'fragment' must be a string of 1 to 64 bytes"})");
}

TEST_F(HostingOffer, NoReplyFailsTheOfferOnceAndALateOneIsIgnored) {
  link_up_ = false;
  auto down = offer(network());
  ASSERT_TRUE(down.has_value());
  EXPECT_EQ(down->error().code, Errc::unavailable);
  EXPECT_NE(down->error().message.find("no link up to entente://beta/n1"), std::string::npos);
  // Sent but never answered: the deadline fails it, and the link going
  // down fails another.
  link_up_ = true;
  deliver_ = false;
  auto got = std::make_shared<std::optional<Result<Hosting::Reply>>>();
  acme_->offer(beta_id_, Hosting::Offer{"cut", "b", network(), 1},
               [got](Result<Hosting::Reply> r) { *got = std::move(r); }, std::chrono::milliseconds(0));
  EXPECT_FALSE(got->has_value());
  acme_->expire();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->error().code, Errc::unavailable);
  EXPECT_NE((*got)->error().message.find("no reply"), std::string::npos);
  // The late reply (id of that offer) finds nothing, and a reply from a
  // node that was not offered anything is ignored.
  uint64_t id = 0;
  ASSERT_TRUE(decode_offer(sent_to_beta_, id).ok());
  acme_->on_control(beta_id_, R"({"type":"hosting.reply","id":)" + std::to_string(id) +
                                  R"(,"admitted":true,"contract":"c-1","reason":""})");
  auto other = std::make_shared<std::optional<Result<Hosting::Reply>>>();
  acme_->offer(beta_id_, Hosting::Offer{"cut", "b", network(), 1},
               [other](Result<Hosting::Reply> r) { *other = std::move(r); });
  ASSERT_TRUE(decode_offer(sent_to_beta_, id).ok());
  acme_->on_control(certs::Identity{"beta", "n2"}, R"({"type":"hosting.reply","id":)" + std::to_string(id) +
                                                       R"(,"admitted":true,"contract":"c-1","reason":""})");
  EXPECT_FALSE(other->has_value());
  acme_->on_link_down(beta_id_);
  ASSERT_TRUE(other->has_value());
  EXPECT_NE((*other)->error().message.find("link went down"), std::string::npos);
  // Stopping fails what waits, and what comes after at once.
  auto waiting = std::make_shared<std::optional<Result<Hosting::Reply>>>();
  acme_->offer(beta_id_, Hosting::Offer{"cut", "b", network(), 1},
               [waiting](Result<Hosting::Reply> r) { *waiting = std::move(r); });
  EXPECT_FALSE(waiting->has_value());
  acme_->stop();
  ASSERT_TRUE(waiting->has_value());
  EXPECT_NE((*waiting)->error().message.find("stopping"), std::string::npos);
  auto after = offer(network());
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->error().message, "this node is stopping");
}

// The calls of a hosted run (hosting.run, …): answered once, with the
// host's body or its refusal; the ways an answer fails to come; notices.
TEST_F(HostingOffer, ACallGetsTheHostsAnswerOnceAndItsFailuresSayWhy) {
  std::string served;
  Hosting::Hooks hooks{[this](const certs::Identity& peer, const std::string& m) {
                         sent_to_acme_ = m;
                         if (!link_up_ || !(peer == acme_id_)) return false;
                         acme_->on_control(beta_id_, m);
                         return true;
                       },
                       nullptr, [] { return kJan2027 + 1000; },
                       [&](const certs::Identity& peer, const std::string& type, const std::string& message,
                           Hosting::Answer answer) {
                         served = peer.uri() + " " + type + " " + message;
                         if (!answer) return;
                         if (type == "hosting.run") answer(true, "", R"({"outputs":["hosted-1-o0"],"state":"s"})");
                         else answer(false, "no such hosted run here", "");
                       }};
  beta_ = std::make_unique<Hosting>(beta_node_.ledger(), "beta", hooks);
  auto call = [&](const std::string& type, const std::string& fields, std::chrono::milliseconds wait = kOfferTimeout) {
    auto got = std::make_shared<std::optional<Result<std::string>>>();
    acme_->call(beta_id_, type, fields, [got](Result<std::string> r) {
      EXPECT_FALSE(got->has_value()) << "answered twice";
      *got = std::move(r);
    }, wait);
    return got;
  };
  auto ran = call("hosting.run", R"("query":"cut","fragment":"b")");
  ASSERT_TRUE(ran->has_value());
  ASSERT_TRUE((*ran)->ok()) << (*ran)->error().message;
  EXPECT_EQ(***ran, R"({"outputs":["hosted-1-o0"],"state":"s"})");
  EXPECT_NE(served.find(R"(entente://acme/n2 hosting.run {"type":"hosting.run","id":)"), std::string::npos) << served;
  EXPECT_NE(served.find(R"("query":"cut","fragment":"b"})"), std::string::npos) << served;
  // The host's refusal, with its reason.
  auto ended = call("hosting.end", R"("query":"cut","fragment":"b")");
  ASSERT_TRUE(ended->has_value());
  EXPECT_EQ((*ended)->error().code, Errc::conflict);
  EXPECT_EQ((*ended)->error().message, "no such hosted run here");
  // An answer from another node, or malformed, is dropped; the deadline
  // fails the call once.
  deliver_ = false;
  auto late = call("hosting.end", R"("query":"cut","fragment":"b")", std::chrono::milliseconds(0));
  acme_->on_control(certs::Identity{"beta", "n2"}, R"({"type":"hosting.answer","id":)" +
                                                       std::to_string(uint_of(sent_to_beta_, "id")) +
                                                       R"(,"ok":true,"reason":"","body":{}})");
  acme_->on_control(beta_id_, R"({"type":"hosting.answer","id":"x"})");
  EXPECT_FALSE(late->has_value());
  acme_->expire();
  ASSERT_TRUE(late->has_value());
  EXPECT_EQ((*late)->error().code, Errc::unavailable);
  // No link; a message over the bound.
  link_up_ = false;
  auto down = call("hosting.run", "");
  ASSERT_TRUE(down->has_value());
  EXPECT_NE((*down)->error().message.find("no link up to entente://beta/n1"), std::string::npos);
  link_up_ = true;
  auto big = call("hosting.chunk", R"("data":")" + std::string(kMaxHostingMessageBytes, 'a') + "\"");
  ASSERT_TRUE(big->has_value());
  EXPECT_EQ((*big)->error().code, Errc::invalid_argument);
  // A notice from the host reaches the owner, unanswered.
  EXPECT_TRUE(beta_->notify(acme_id_, "hosting.usage", R"("query":"cut","fragment":"b","cpu_seconds":1.5)"));
  EXPECT_EQ(sent_to_acme_, R"({"type":"hosting.usage","query":"cut","fragment":"b","cpu_seconds":1.5})");
  deliver_ = true;
  beta_->on_control(acme_id_, R"({"type":"hosting.usage","query":"cut"})");
  EXPECT_EQ(served, R"(entente://acme/n2 hosting.usage {"type":"hosting.usage","query":"cut"})");
}

TEST_F(HostingOffer, AtMost64OffersWait) {
  deliver_ = false;
  int failed = 0;
  for (size_t i = 0; i < kMaxPendingOffers + 3; ++i)
    acme_->offer(beta_id_, Hosting::Offer{"cut", "b", network(), 1}, [&failed](Result<Hosting::Reply> r) {
      if (!r.ok() && r.error().message.find("wait for a reply already") != std::string::npos) ++failed;
    });
  EXPECT_EQ(failed, 3);
  acme_->stop();
}

}  // namespace
}  // namespace entente::federation
