#pragma once
// What the cluster integration tests share (docs/cluster.md): waiting for
// an end state, and the "cluster" member of a node's configuration for a
// test's own etcd (tests/support/etcd_process.h).

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
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

// True when GET /v1/nodes on every one of `nodes` lists `count` nodes up.
inline bool domain_up(const std::vector<const BrokerProcess*>& nodes, int count) {
  for (const BrokerProcess* n : nodes) {
    auto r = n->try_request("GET", "/v1/nodes", {}, kReaderToken);
    if (!r.ok() || r->status != 200) return false;
    rapidjson::Document d;
    d.Parse(r->body.c_str());
    if (!d.IsObject() || !d.HasMember("nodes") || !d["nodes"].IsArray()) return false;
    int up = 0;
    for (const auto& m : d["nodes"].GetArray()) up += std::string(m["state"].GetString()) == "up";
    if (up != count) return false;
  }
  return true;
}

// Batch `b` of the cluster tests' {"auction", "price"} streams as a JSON
// array: `rows` tuples, auction b * 1000 + k and price k for k < rows, so
// that the checker can tell which batch a tuple came from.
inline std::string auction_batch(int b, int rows) {
  std::string body = "[";
  for (int k = 0; k < rows; ++k) {
    if (k) body += ",";
    body += R"({"auction":)" + std::to_string(b * 1000 + k) + R"(,"price":)" + std::to_string(k) + "}";
  }
  return body + "]";
}

// POSTs `body` to `target` (a named batch: its producer number makes a
// resend safe) through the running processes of `nodes` in turn, from
// `start`, until one answers 200; 502, 503, 504, 429 and a broken
// connection mean "not stored, or not known" and are tried again. Returns
// "" once stored, else what went wrong (another answer, or 60 s passed).
inline std::string post_through_any(const std::vector<const BrokerProcess*>& nodes, size_t start,
                                    const std::string& target, const std::string& body) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (size_t attempt = 0; std::chrono::steady_clock::now() < deadline; ++attempt) {
    const BrokerProcess& via = *nodes[(start + attempt) % nodes.size()];
    if (via.pid() <= 0) continue;
    auto r = via.try_request("POST", target, body, kPublisherToken);
    if (r.ok() && r->status == 200) return "";
    if (r.ok() && r->status != 502 && r->status != 503 && r->status != 504 && r->status != 429)
      return "through port " + std::to_string(via.port()) + ": " + std::to_string(r->status) + " " + r->body;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "not stored within 60 s";
}

}  // namespace entente::testing
