#pragma once
// A domain of three real broker processes (acme/n1..n3) sharing one real
// etcd, each with its own peer-link listener and certificate from `entente
// certs` and none configured to dial another (they find each other through
// the membership): the fixture of the cluster tests that need peer links
// (docs/cluster.md). SetUp returns once every node lists the three up.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/cluster.h"
#include "tests/integration/support/federation.h"
#include "tests/support/etcd_process.h"

namespace entente::testing {

class ThreeNodeDomain : public ::testing::Test {
 protected:
  // `etcd_name` names the test's etcd (its temporary directory);
  // `extra_config` is added to each node's configuration before the
  // cluster section (top-level members followed by ", ", or empty).
  explicit ThreeNodeDomain(std::string etcd_name, std::string extra_config = {})
      : etcd_name_(std::move(etcd_name)), extra_config_(std::move(extra_config)) {}

  void SetUp() override {
    if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
    etcd_ = std::make_unique<EtcdProcess>(etcd_name_);
    ASSERT_TRUE(etcd_->start()) << etcd_->last_error();
    for (const char* name : {"n1", "n2", "n3"}) {
      FedNode& n = fed_.add("acme", name);
      n.config_extra(extra_config_ + cluster_section(*etcd_));
      nodes_.push_back(&n);
    }
    ASSERT_TRUE(fed_.start_all()) << fed_.last_error();
    ASSERT_TRUE(eventually(20.0, [&] { return all_up(); })) << "the nodes do not all see each other up";
  }

  BrokerProcess& node(int i) { return nodes_.at(static_cast<size_t>(i - 1))->process(); }
  std::vector<const BrokerProcess*> processes() const {
    std::vector<const BrokerProcess*> out;
    for (const FedNode* n : nodes_) out.push_back(&n->process());
    return out;
  }
  bool all_up() const { return domain_up(processes(), 3); }

  // Waits up to 20 s until every follower of `stream` (read through node
  // `via`) is connected and in sync, and there is one: a node killed then
  // leaves another to take the stream over without a loss. Call under
  // ASSERT_NO_FATAL_FAILURE.
  void await_followers_in_sync(int via, const std::string& stream) {
    std::string body;
    ASSERT_TRUE(eventually(20.0, [&] {
      body = node(via).request("GET", "/v1/streams/" + stream, {}, kReaderToken).body;
      rapidjson::Document d;
      d.Parse(body.c_str());
      if (!d.IsObject() || !d.HasMember("replication") || !d["replication"].HasMember("replicas")) return false;
      for (const auto& r : d["replication"]["replicas"].GetArray())
        if (!r["in_sync"].GetBool() || !r["connected"].GetBool()) return false;
      return !d["replication"]["replicas"].Empty();
    })) << stream << "'s followers are not in sync: " << body;
  }

  Federation fed_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::vector<FedNode*> nodes_;

 private:
  std::string etcd_name_, extra_config_;
};

}  // namespace entente::testing
