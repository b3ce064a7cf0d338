// One contract ledger per domain (docs/cluster.md, "One ledger per domain"):
// acme is three real broker processes sharing one real etcd; beta is one
// node. A stream contract negotiated between beta and acme's n3 is in
// force on every node of acme, and n1, which leads the stream (and was not
// part of the negotiation), enforces it: beta imports acme/bids under it,
// with no configured export anywhere.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/contracts.h"
#include "tests/integration/support/cluster.h"
#include "tests/integration/support/federation.h"
#include "tests/integration/support/ws_reader.h"
#include "tests/support/etcd_process.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;

class ClusterContracts : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
    etcd_ = std::make_unique<EtcdProcess>("etcd-contracts");
    ASSERT_TRUE(etcd_->start()) << etcd_->last_error();
    beta_ = &fed_.add("beta", "n1");
    for (const char* name : {"n1", "n2", "n3"}) {
      FedNode& n = fed_.add("acme", name);
      n.pins(*beta_);  // no export: only a contract shares bids
      n.config_extra(R"("checkpoint_interval": "200ms", )" + cluster_section(*etcd_));
      acme_.push_back(&n);
    }
    beta_->pins(*acme_[1]);  // beta lists acme/n2 alone
    ASSERT_TRUE(fed_.start_all()) << fed_.last_error();
    ASSERT_TRUE(eventually(20s, [&] {
      for (FedNode* n : acme_) {
        auto r = n->process().try_request("GET", "/v1/nodes", {}, kReaderToken);
        if (!r.ok() || r->status != 200) return false;
        rapidjson::Document d;
        d.Parse(r->body.c_str());
        if (!d.IsObject() || d["nodes"].Size() != 3) return false;
        for (const auto& m : d["nodes"].GetArray()) {
          if (std::string(m["state"].GetString()) != "up") return false;
        }
      }
      return true;
    }));
  }

  FedNode& acme(int i) { return *acme_.at(static_cast<size_t>(i - 1)); }

  std::unique_ptr<EtcdProcess> etcd_;
  Federation fed_;
  FedNode* beta_ = nullptr;
  std::vector<FedNode*> acme_;
};

TEST_F(ClusterContracts, AContractNegotiatedThroughOneNodeIsInForceOnEveryNodeAndEnforcedByTheLeader) {
  auto created = acme(2).process().request(
      "POST", "/v1/streams",
      R"({"name":"bids","event_time":"date_time","node":"n1","schema":)" + std::string(kBidsSchema) + "}");
  ASSERT_EQ(created.status, 201u) << created.body;
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme(3), *beta_));
  // Proposed through n3; beta accepts; n3 countersigns.
  auto proposed = acme(3).process().request(
      "POST", "/v1/contracts", "{\"terms\":" + stream_terms(1, seconds_from_now(-60), seconds_from_now(3600)) + "}");
  ASSERT_EQ(proposed.status, 201u) << proposed.body;
  const std::string id = parse_contract(proposed.status, proposed.body).id;
  ASSERT_EQ(wait_version(*beta_, id, 1).status, 200u);
  auto accepted = act(*beta_, id, "accept", R"({"version":1})");
  ASSERT_EQ(accepted.status, 200u) << accepted.body;
  // Active on every node of acme, each with the same three versions.
  const ContractView on3 = wait_version(acme(3), id, 3);
  ASSERT_EQ(on3.state, "active") << on3.body;
  for (int i : {1, 2}) {
    const ContractView v = wait_version(acme(i), id, 3);
    EXPECT_EQ(v.state, "active") << "acme/n" << i << ": " << v.body;
    EXPECT_EQ(v.history, on3.history) << "acme/n" << i;
  }
  // Enforced by n1, which leads bids: beta imports it through n2 (moved to
  // n1) under the contract, fields projected as agreed.
  ASSERT_NO_FATAL_FAILURE(publish(acme(1), "bids", 0, 500));
  ASSERT_NO_FATAL_FAILURE(wait_linked(*beta_, acme(2)));
  auto imported = import_stream(*beta_, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body;
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(*beta_, "acme/bids", 501));
  const ImportView iv = get_import(beta_->process(), "acme/bids");
  EXPECT_EQ(iv.owner, "entente://acme/n1") << iv.body;
  EXPECT_EQ(schema_names(beta_->process().request("GET", "/v1/streams/" + url_name("acme/bids"), {}, kReaderToken).body),
            (std::vector<std::string>{"auction", "price"}));
  // Revoked through n2: every node, and the flow, follow.
  auto revoked = act(acme(2), id, "revoke", R"({"version":3,"reason":"audit"})");
  ASSERT_EQ(revoked.status, 200u) << revoked.body;
  for (int i : {1, 3}) {
    const ContractView v = wait_version(acme(i), id, 4);
    EXPECT_EQ(v.state, "revoked") << "acme/n" << i << ": " << v.body;
  }
  EXPECT_EQ(wait_version(*beta_, id, 4).state, "revoked");
}

}  // namespace
}  // namespace entente::testing
