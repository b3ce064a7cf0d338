#pragma once
// What the cluster integration tests share (docs/cluster.md): waiting for
// an end state, and the "cluster" member of a node's configuration for a
// test's own etcd (tests/support/etcd_process.h).

#include <chrono>
#include <functional>
#include <string>
#include <thread>

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

}  // namespace entente::testing
