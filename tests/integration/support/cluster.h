#pragma once
// A domain of several real broker processes sharing one real etcd, for the
// cluster integration tests (docs/cluster.md):
//
//   EtcdProcess etcd("etcd-x");
//   ASSERT_TRUE(etcd.start());
//   ClusterNodes c(etcd, {"n1", "n2", "n3"});
//   ASSERT_TRUE(c.start());
//   ASSERT_TRUE(eventually(20, [&] { return c.all_listed(); }));
//
// Not thread-safe; used from the test's thread.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/support/etcd_process.h"

namespace entente::testing {

// Polls `done` every 100 ms until it holds or `seconds` pass; returns
// whether it held. Tests wait for end states, never fixed sleeps.
inline bool eventually(double seconds, const std::function<bool()>& done) {
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

// The "cluster" member of a node's configuration: `etcd`, a short lease so
// failures show quickly, and an optional key prefix.
inline std::string cluster_section(const EtcdProcess& etcd, const std::string& lease_ttl = "2s",
                                   const std::string& prefix = "") {
  return R"("cluster": {"etcd": [")" + etcd.endpoint() + R"("], "lease_ttl": ")" + lease_ttl +
         R"(", "etcd_timeout": "500ms")" + (prefix.empty() ? std::string() : R"(, "prefix": ")" + prefix + "\"") +
         "}";
}

// Nodes n1..nN of domain acme, each with `extra` top-level configuration
// (without a leading comma) besides the cluster section.
class ClusterNodes {
 public:
  ClusterNodes(const EtcdProcess& etcd, std::vector<std::string> names, const std::string& extra = "",
               const std::string& lease_ttl = "2s", const std::string& prefix = "") {
    for (const auto& name : names) {
      BrokerOptions o;
      o.node = name;
      o.extra_config = (extra.empty() ? std::string() : extra + ", ") + cluster_section(etcd, lease_ttl, prefix);
      nodes_.push_back(std::make_unique<BrokerProcess>(o));
    }
  }

  bool start() {
    for (auto& n : nodes_) {
      if (!n->start()) return false;
    }
    return true;
  }

  size_t size() const { return nodes_.size(); }
  BrokerProcess& at(size_t i) { return *nodes_.at(i); }
  // "n2" → the second node.
  BrokerProcess& node(const std::string& name) { return *nodes_.at(static_cast<size_t>(name.back() - '1')); }

  // Every running node lists every node, the running ones up and the
  // others down, and names a controller.
  bool all_listed() {
    for (auto& n : nodes_) {
      if (n->pid() <= 0) continue;
      auto r = n->try_request("GET", "/v1/nodes", {}, kReaderToken);
      if (!r.ok() || r->status != 200) return false;
      rapidjson::Document d;
      d.Parse(r->body.c_str());
      if (!d.IsObject() || !d.HasMember("nodes") || d["nodes"].Size() != nodes_.size() ||
          !d["controller"].IsString()) {
        return false;
      }
      for (const auto& m : d["nodes"].GetArray()) {
        const bool running = node(m["node"].GetString()).pid() > 0;
        if (running != (std::string(m["state"].GetString()) == "up")) return false;
      }
    }
    return true;
  }

 private:
  std::vector<std::unique_ptr<BrokerProcess>> nodes_;
};

}  // namespace entente::testing
