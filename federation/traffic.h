#pragma once
// Tuples received from and sent to each peer node, for GET /v1/peers.
// Threading: any thread; one mutex.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace entente::federation {

class Traffic final {
 public:
  void count(const std::string& peer, uint64_t in, uint64_t out) {
    std::lock_guard lock(mu_);
    auto& c = tuples_[peer];
    c.first += in;
    c.second += out;
  }
  // {in, out} for the peer node `peer` (its identity URI).
  std::pair<uint64_t, uint64_t> tuples(const std::string& peer) const {
    std::lock_guard lock(mu_);
    auto it = tuples_.find(peer);
    return it == tuples_.end() ? std::pair<uint64_t, uint64_t>{0, 0} : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::pair<uint64_t, uint64_t>> tuples_;  // REQUIRES: mu_
};

}  // namespace entente::federation
