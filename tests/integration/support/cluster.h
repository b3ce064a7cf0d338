#pragma once
// What the cluster integration tests share (docs/cluster.md): waiting for
// an end state, and the "cluster" member of a node's configuration for a
// test's own etcd (tests/support/etcd_process.h).

#include <chrono>
#include <functional>
#include <string>

#include "tests/support/etcd_process.h"
#include "tests/support/eventually.h"

namespace entente::testing {

// eventually(pred, timeout) of tests/support/eventually.h, in seconds.
inline bool eventually(double seconds, const std::function<bool()>& done) {
  return eventually(done, std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
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
