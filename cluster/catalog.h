#pragma once
// The domain's shared catalog (docs/cluster.md, "The catalog"): every key
// under PREFIX catalog/ in etcd ("streams/NAME", "queries/NAME", ...), each
// a JSON value, mirrored in memory on every node and kept current by one
// watch, so reads cost no round trip to etcd and keep answering, from the
// last state seen, while etcd cannot be reached.
//
// Writes go to etcd directly, as transactions that compare (create only if
// absent; update or delete only at the revision the caller read), so two
// nodes writing the same entry at once cannot both win. A write returns
// the revision it made; wait_for(revision) then makes the cache show it
// (read-your-writes on the node that wrote).
//
// Threading: all members from any thread; one watch thread per Catalog.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/result.h"
#include "cluster/etcd.h"

namespace entente::cluster {

struct CatalogEntry {
  std::string key;    // below the catalog prefix: "streams/bids"
  std::string value;  // JSON
  int64_t mod_revision = 0;
};

class Catalog final {
 public:
  // Called on the watch thread after the cache changed: the keys (below the
  // catalog prefix) that were written or deleted, or every key after a
  // full re-read.
  using OnChange = std::function<void(const std::vector<std::string>& keys)>;

  // `prefix`: the domain's prefix (ends with '/'); entries live under
  // prefix + "catalog/".
  Catalog(Etcd& etcd, std::string prefix, OnChange on_change = {});
  ~Catalog();
  Catalog(const Catalog&) = delete;
  Catalog& operator=(const Catalog&) = delete;

  // Starts the watch thread: a full read, then a watch from the revision
  // after it; a broken watch is followed by a full read again.
  void start();
  void stop();

  // From the cache.
  std::optional<CatalogEntry> get(std::string_view key) const;
  // Every entry whose key starts with `sub` ("streams/"), in key order.
  std::vector<CatalogEntry> list(std::string_view sub) const;
  // The cache holds etcd's catalog as of a watch that is running now.
  bool synced() const { return synced_.load(std::memory_order_acquire); }
  // The revision the cache reflects (0 before the first read).
  int64_t revision() const;
  // Why the cache is not synced (empty when it is).
  std::string problem() const;

  // Reads `key` from etcd itself, not the cache (nullopt: absent).
  Result<std::optional<CatalogEntry>> read(std::string_view key);
  // Creates `key` only if absent. Errors: already_exists, unavailable.
  Result<int64_t> create(std::string_view key, std::string_view value);
  // Replaces `key` only if its mod_revision is still `expected`.
  // Errors: conflict (changed or deleted since), unavailable.
  Result<int64_t> update(std::string_view key, std::string_view value, int64_t expected);
  // Replaces several keys at once, each only if its mod_revision is still
  // its `expected` (one etcd transaction: all or none). Errors: conflict
  // (any changed since), unavailable, invalid_argument (none, or over 64).
  struct Update {
    std::string key;
    std::string value;
    int64_t expected = 0;
  };
  Result<int64_t> update_all(const std::vector<Update>& updates);
  // Deletes `key` only if its mod_revision is still `expected` (0: whatever
  // it is). Errors: conflict, not_found, unavailable.
  Result<int64_t> erase(std::string_view key, int64_t expected = 0);

  // Waits until the cache reflects `revision` or `timeout_ms` passes;
  // returns whether it does.
  bool wait_for(int64_t revision, int64_t timeout_ms) const;

 private:
  void run();
  // Reads every entry; returns the revision read at.
  Result<int64_t> reload();
  void apply(const std::vector<WatchEvent>& events, int64_t revision);
  void set_problem(std::string problem);

  Etcd& etcd_;
  const std::string root_;  // prefix + "catalog/"
  const OnChange on_change_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::map<std::string, CatalogEntry, std::less<>> entries_;  // REQUIRES: mu_
  int64_t revision_ = 0;                                      // REQUIRES: mu_
  std::string problem_ = "not read yet";                      // REQUIRES: mu_
  bool stop_requested_ = false;                               // REQUIRES: mu_
  std::atomic<bool> stopping_{false};
  std::atomic<bool> synced_{false};
  std::thread thread_;
};

}  // namespace entente::cluster
