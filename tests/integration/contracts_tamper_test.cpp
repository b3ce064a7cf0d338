// A peer domain that does not play by the rules (issue 5, "Refused, each
// with a clear error and nothing changed"): the test process is node beta/n1
// on a federation::LinkManager with beta's real key, negotiating with a real
// acme broker by CONTROL messages it writes itself. Tampered signatures,
// tampered terms, a version claiming another author and a changed replay of
// an old version are refused and counted; the ledger does not move. A valid
// acceptance is countersigned by acme, and beta checks that countersignature.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "certs/signing.h"
#include "certs/trust.h"
#include "contracts/contract.h"
#include "federation/link.h"
#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/federation.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;
using federation::FrameType;

// Collects the contract versions acme sends.
class Negotiator final : public federation::LinkHandler {
 public:
  void on_link_up(const certs::Identity&) override {}
  void on_link_down(const certs::Identity&, std::string_view) override {}
  void on_frame(const certs::Identity&, FrameType type, uint32_t, std::string_view payload) override {
    if (type != FrameType::control) return;
    rapidjson::Document d;
    d.Parse(payload.data(), payload.size());
    std::lock_guard lock(mu_);
    if (d.HasParseError() || !d.IsObject() || !d.HasMember("type") || !d["type"].IsString()) {
      errors_.push_back("undecodable CONTROL: " + std::string(payload));
    } else if (std::string_view(d["type"].GetString()) == "contract.version") {
      auto v = contracts::version_from_json(d["version"], "$.version");
      if (v.ok()) versions_.emplace_back(d["id"].GetString(), *v);
      else errors_.push_back(v.error().message);
    }
    cv_.notify_all();
  }

  // The `n`th version acme sent of any contract (waits up to 10 s).
  std::optional<std::pair<std::string, contracts::Version>> version(size_t n) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, 10s, [&] { return versions_.size() > n; })) return std::nullopt;
    return versions_[n];
  }
  std::vector<std::string> errors() {
    std::lock_guard lock(mu_);
    return errors_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::string, contracts::Version>> versions_;
  std::vector<std::string> errors_;
};

std::string version_message(const std::string& id, const contracts::Version& v) {
  return R"({"type":"contract.version","id":")" + id + R"(","version":)" + contracts::version_to_json(v) + "}";
}

// The value of one sample line of /metrics ("name{labels}"), 0 when absent.
double metric(const BrokerProcess& node, const std::string& sample) {
  auto r = node.request("GET", "/metrics", "", kReaderToken);
  const auto at = r.body.find("\n" + sample + " ");
  if (at == std::string::npos) return 0;
  return std::stod(r.body.substr(at + sample.size() + 2));
}

struct AcmeView {
  uint64_t version = 0;
  std::string state, body;
};
AcmeView acme_contract(const FedNode& acme, const std::string& id) {
  AcmeView v;
  auto r = acme.process().request("GET", "/v1/contracts/" + id, "", kReaderToken);
  v.body = r.body;
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  if (!d.HasParseError() && d.IsObject() && d.HasMember("version")) {
    v.version = d["version"].GetUint64();
    v.state = d["state"].GetString();
  }
  return v;
}

TEST(ContractsTamper, ForgedOrAlteredVersionsAreRefusedAndNothingChanges) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");  // this test process
  acme.pins(beta, "", beta.ca_file());
  ASSERT_TRUE(acme.start()) << acme.last_error();
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "bids"));

  const certs::Identity owner{"acme", "n1"};
  Negotiator beta_side;
  auto started = hand_link(beta, acme, beta_side);
  ASSERT_TRUE(started.ok()) << started.error().message;
  std::unique_ptr<federation::LinkManager> links = std::move(*started);
  // beta's own checks of acme's versions pin the same CAs as its link.
  auto trust = std::make_shared<certs::TrustStore>();
  ASSERT_TRUE(trust->pin("acme", acme.ca_file()).ok());
  ASSERT_TRUE(trust->pin("beta", beta.ca_file()).ok());
  auto signer = certs::Signer::load(beta.key_file(), beta.cert_file());
  ASSERT_TRUE(signer.ok()) << signer.error().message;

  // acme's admin proposes; the version reaches beta over the link.
  const int64_t now_s = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  const std::string terms = R"({"kind":"stream","provider":"acme","consumer":"beta","streams":["bids"],)"
                            R"("price_per_million":7,"valid_from":)" +
                            std::to_string((now_s - 60) * 1000) + R"(,"valid_until":)" +
                            std::to_string((now_s + 3600) * 1000) + "}";
  auto proposed = acme.process().request("POST", "/v1/contracts", "{\"terms\":" + terms + "}");
  ASSERT_EQ(proposed.status, 201u) << proposed.body;
  auto v1 = beta_side.version(0);
  ASSERT_TRUE(v1.has_value()) << "acme never sent its proposal";
  const std::string id = v1->first;
  contracts::Contract c{id, {v1->second}};
  ASSERT_TRUE(contracts::check_next(contracts::Contract{id, {}}, v1->second, "acme", *trust).ok());

  auto accepted = contracts::accept(c, *signer, 1, now_s * 1000);
  ASSERT_TRUE(accepted.ok()) << accepted.error().message;

  auto send = [&](const contracts::Version& v) {
    ASSERT_TRUE(links->send(owner, FrameType::control, 0, version_message(id, v)).ok());
  };
  auto expect_refused = [&](const contracts::Version& v, const std::string& label, const char* what) {
    const std::string sample = "entente_contract_refusals_total{reason=\"" + label + "\"}";
    const double before = metric(acme.process(), sample);
    send(v);
    EXPECT_TRUE(eventually(5s, [&] { return metric(acme.process(), sample) >= before + 1; }))
        << what << ": not counted as " << label << "; acme's log:\n" << acme.process().stderr_text();
    auto now = acme_contract(acme, id);
    EXPECT_EQ(now.version, 1u) << what << " changed acme's ledger: " << now.body;
    EXPECT_EQ(now.state, "proposed") << now.body;
  };

  // A signature with one character changed.
  contracts::Version forged = *accepted;
  char& ch = forged.signatures[0].value[10];
  ch = ch == 'A' ? 'B' : 'A';
  expect_refused(forged, "not_permitted", "a tampered signature");

  // Terms changed after signing (a lower price), signature kept.
  contracts::Version cheaper = *accepted;
  cheaper.terms.stream.price_per_million = 1;
  expect_refused(cheaper, "invalid", "terms altered under a valid signature");

  // A version that claims acme made it.
  contracts::Version impostor = *accepted;
  impostor.by = "acme";
  expect_refused(impostor, "not_permitted", "a version claiming another author");

  // The genuine acceptance: acme records it and countersigns.
  send(*accepted);
  auto v3 = beta_side.version(1);
  ASSERT_TRUE(v3.has_value()) << "acme never countersigned; stderr:\n" << acme.process().stderr_text();
  EXPECT_EQ(v3->second.state, contracts::State::active);
  ASSERT_TRUE(contracts::apply(c, *accepted, "beta", *trust).ok());
  Status countersigned = contracts::apply(c, v3->second, "acme", *trust);
  EXPECT_TRUE(countersigned.ok()) << "beta cannot verify acme's countersignature: "
                                  << countersigned.error().message;
  EXPECT_TRUE(eventually(5s, [&] { return acme_contract(acme, id).state == "active"; }));

  // Replays: the same version again is a duplicate (ignored); an altered
  // version 2, validly signed, is refused as a divergence.
  send(*accepted);
  auto later = contracts::accept(contracts::Contract{id, {v1->second}}, *signer, 1, now_s * 1000 + 5000);
  ASSERT_TRUE(later.ok());
  const std::string diverged = "entente_contract_refusals_total{reason=\"diverged\"}";
  send(*later);
  EXPECT_TRUE(eventually(5s, [&] { return metric(acme.process(), diverged) >= 1; }));
  auto end = acme_contract(acme, id);
  EXPECT_EQ(end.version, 3u) << end.body;
  EXPECT_EQ(end.state, "active") << end.body;
  EXPECT_EQ(metric(acme.process(), "entente_contracts{state=\"active\"}"), 1);
  const std::string metrics = acme.process().request("GET", "/metrics", "", kReaderToken).body;
  EXPECT_NE(metrics.find("\nentente_contract_tuples_total{contract=\"" + id + "\",peer=\"beta\"} 0\n"),
            std::string::npos)
      << metrics;
  EXPECT_TRUE(beta_side.errors().empty()) << beta_side.errors().front();
  EXPECT_EQ(acme.process().request("GET", "/v1/health").status, 200u);
}

}  // namespace
}  // namespace entente::testing
