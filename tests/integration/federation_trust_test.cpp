// What two domains' admins see when one pins the wrong CA for the other
// (issue 11, point 13): real `entente broker` processes with certificates
// made by `entente certs`, real mutual TLS on the peer links. Both sides'
// GET /v1/peers say why the link does not come up, with the refusal's
// label, also the side that was refused and only received a TLS alert; the
// refusing side lists and logs the identity the untrusted certificate
// claimed.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/federation.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;

std::string member(const rapidjson::Value& v, const char* key) {
  return v.IsObject() && v.HasMember(key) && v[key].IsString() ? v[key].GetString() : "";
}

// One peer entry or one refused entry of GET /v1/peers, as text members.
struct Entry {
  std::string identity, address, state, refusal, last_error, reason, by;
};

struct Peers {
  std::string body;
  std::vector<Entry> peers, refused;
  std::map<std::string, uint64_t> refusals;

  const Entry* peer(const std::string& identity) const {
    for (const auto& p : peers)
      if (p.identity == identity) return &p;
    return nullptr;
  }
};

Peers peers_of(const FedNode& n) {
  Peers out;
  auto r = n.process().try_request("GET", "/v1/peers", "", kReaderToken);
  if (!r.ok()) {
    out.body = r.error().message;
    return out;
  }
  out.body = r->body;
  rapidjson::Document d;
  d.Parse(out.body.c_str());
  if (d.HasParseError() || !d.IsObject()) return out;
  auto entries = [&](const char* key, std::vector<Entry>& into) {
    if (!d.HasMember(key) || !d[key].IsArray()) return;
    for (const auto& p : d[key].GetArray()) {
      into.push_back({member(p, "identity"), member(p, "address"), member(p, "state"), member(p, "refusal"),
                      member(p, "last_error"), member(p, "reason"), member(p, "by")});
    }
  };
  entries("peers", out.peers);
  entries("refused", out.refused);
  if (d.HasMember("refusals") && d["refusals"].IsObject()) {
    for (const auto& m : d["refusals"].GetObject())
      if (m.value.IsUint64()) out.refusals[m.name.GetString()] = m.value.GetUint64();
  }
  return out;
}

bool has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(FederationTrust, WrongPinnedCaShowsTheReasonOnBothSides) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  // beta pins a CA that calls itself acme but did not sign acme's
  // certificate; acme pins beta correctly. Both dial each other.
  beta.pins(acme, acme.federation_address(), fed.impostor_ca("acme"));
  acme.pins(beta);
  ASSERT_TRUE(fed.start_all()) << fed.last_error();

  // beta refuses acme's certificate itself (on the link it dials and on the
  // one acme dials): its peer entry for acme says so, with the reason.
  Peers b;
  EXPECT_TRUE(eventually(15s,
                         [&] {
                           b = peers_of(beta);
                           const Entry* p = b.peer(acme.identity());
                           return p && p->state == "refused" && p->refusal == "untrusted_chain" &&
                                  has(p->last_error, "does not chain to the pinned CA of domain acme");
                         }))
      << "beta GET /v1/peers: " << b.body;

  // The accepting side lists the refused client by the identity its
  // certificate claimed, not only by address.
  EXPECT_TRUE(eventually(15s,
                         [&] {
                           b = peers_of(beta);
                           for (const auto& r : b.refused)
                             if (r.identity == acme.identity() && r.refusal == "untrusted_chain" &&
                                 r.by == "this_node" && has(r.address, "127.0.0.1:") &&
                                 has(r.reason, "does not chain"))
                               return true;
                           return false;
                         }))
      << "beta GET /v1/peers: " << b.body;
  EXPECT_TRUE(
      has(beta.process().stderr_text(), "refused " + acme.identity() + " (as its certificate claims) from "))
      << beta.process().stderr_text();

  // acme was refused: it only received a TLS alert, and says what it means.
  Peers a;
  EXPECT_TRUE(eventually(15s,
                         [&] {
                           a = peers_of(acme);
                           const Entry* p = a.peer(beta.identity());
                           return p && p->state == "refused" && p->refusal == "untrusted_chain" &&
                                  has(p->last_error, "refused this node's certificate") &&
                                  has(p->last_error, "unknown ca") &&
                                  has(p->last_error, "the CA it pins for domain acme");
                         }))
      << "acme GET /v1/peers: " << a.body << "\nacme stderr:\n"
      << acme.process().stderr_text();
  EXPECT_GE(a.refusals["refused_by_peer"], 1u) << a.body;
  // And it saw beta abort the handshake of the link beta dialed: listed by
  // address, refused by the peer.
  EXPECT_TRUE(eventually(15s,
                         [&] {
                           a = peers_of(acme);
                           for (const auto& r : a.refused)
                             if (r.by == "peer" && r.refusal == "untrusted_chain" &&
                                 has(r.reason, "refused this node's certificate"))
                               return true;
                           return false;
                         }))
      << "acme GET /v1/peers: " << a.body;

  // It never comes up, and neither node shows a bare "connecting".
  const auto until = std::chrono::steady_clock::now() + 2s;
  while (std::chrono::steady_clock::now() < until) {
    a = peers_of(acme);
    b = peers_of(beta);
    const Entry* pa = a.peer(beta.identity());
    const Entry* pb = b.peer(acme.identity());
    ASSERT_TRUE(pa && pb) << a.body << "\n" << b.body;
    EXPECT_NE(pa->state, "up") << a.body;
    EXPECT_NE(pb->state, "up") << b.body;
    EXPECT_FALSE(pa->state == "connecting" && pa->last_error.empty()) << a.body;
    std::this_thread::sleep_for(200ms);
  }
}

}  // namespace
}  // namespace entente::testing
