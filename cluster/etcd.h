#pragma once
// A client of etcd (v3.4) over its v3 JSON gateway (POST /v3/kv/range,
// /v3/kv/put, /v3/kv/deleterange, /v3/kv/txn, /v3/lease/grant,
// /v3/lease/keepalive, /v3/lease/revoke, /v3/watch), on the project's own
// HTTP client: no gRPC. Keys and values are bytes (base64 on the wire).
// docs/cluster.md says why etcd and what a node does while it is unreachable.
//
// Threading: every member may be called from any thread; each call borrows
// one of a few pooled connections. A call that fails on one endpoint (connect
// refused, timeout, connection closed, or an answer that the member cannot
// serve: gRPC UNAVAILABLE, "no leader") is retried once on the next endpoint;
// when every endpoint failed it returns Errc::unavailable with the reasons.
// An answer from etcd that is an error (a gRPC status in the JSON body)
// becomes invalid_argument / not_found / ... with etcd's message.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"

namespace entente::cluster {

struct EtcdOptions {
  // "http://host:port" or "https://host:port" (then `ca_file` verifies the
  // server); at least one.
  std::vector<std::string> endpoints;
  std::string ca_file;
  int64_t timeout_ms = 2'000;  // per request (a watch waits longer: see watch)
};

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;  // 0: the key does not exist (in a compare)
  int64_t lease = 0;    // 0: none
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;  // the store's revision when read
  int64_t count = 0;     // keys in range (may exceed kvs.size() with a limit)
  bool more = false;
};

// One condition of a transaction: target(key) op number/value.
struct Compare {
  enum class Target : uint8_t { version, create_revision, mod_revision, value, lease };
  enum class Op : uint8_t { equal, not_equal, greater, less };
  std::string key;
  Target target = Target::version;
  Op op = Op::equal;
  int64_t number = 0;   // version, revisions, lease
  std::string value;    // Target::value
};

// One operation of a transaction.
struct TxnOp {
  enum class Kind : uint8_t { put, erase, get };
  Kind kind = Kind::put;
  std::string key;
  std::string value;    // put
  int64_t lease = 0;    // put
  bool prefix = false;  // erase, get: every key starting with `key`

  // Spelled out, since brace-initialising some members only trips
  // -Wmissing-field-initializers.
  static TxnOp put_op(std::string key, std::string value, int64_t lease = 0) {
    return TxnOp{Kind::put, std::move(key), std::move(value), lease, false};
  }
  static TxnOp erase_op(std::string key, bool prefix = false) {
    return TxnOp{Kind::erase, std::move(key), {}, 0, prefix};
  }
  static TxnOp get_op(std::string key, bool prefix = false) {
    return TxnOp{Kind::get, std::move(key), {}, 0, prefix};
  }
};

struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;
  std::vector<RangeResult> gets;  // one per get op of the branch taken, in order
};

struct WatchEvent {
  enum class Type : uint8_t { put, erase };
  Type type = Type::put;
  KeyValue kv;  // for erase: key and mod_revision
};

class Etcd final {
 public:
  // Validates the options (endpoints parse); connects lazily.
  // Errors: invalid_argument naming the endpoint.
  static Result<std::unique_ptr<Etcd>> create(EtcdOptions options);
  ~Etcd();
  Etcd(const Etcd&) = delete;
  Etcd& operator=(const Etcd&) = delete;

  Result<RangeResult> get(std::string_view key);
  // Every key starting with `prefix`, in key order; limit 0: all.
  Result<RangeResult> get_prefix(std::string_view prefix, int64_t limit = 0);
  // Returns the revision of the write.
  Result<int64_t> put(std::string_view key, std::string_view value, int64_t lease = 0);
  // Returns how many keys were deleted.
  Result<int64_t> erase(std::string_view key);
  Result<int64_t> erase_prefix(std::string_view prefix);
  Result<TxnResult> txn(const std::vector<Compare>& compares, const std::vector<TxnOp>& success,
                        const std::vector<TxnOp>& failure = {});

  // A lease of `ttl_s` seconds; returns its ID.
  Result<int64_t> grant_lease(int64_t ttl_s);
  // Renews the lease; returns the TTL left (seconds). Errc::not_found when
  // the lease has expired or was revoked.
  Result<int64_t> keep_alive(int64_t lease);
  Status revoke_lease(int64_t lease);

  // Watches `key` (or every key under it when `prefix`) from
  // `start_revision` (0: from now), blocking the calling thread: each
  // batch of events goes to `on_events` with the revision it completes.
  // Returns OK when `stop` becomes true (checked at least every 200 ms once
  // the watch is open; opening it is bounded by timeout_ms) or
  // `on_events` returns false; Errc::unavailable when the connection broke
  // or etcd is unreachable (the caller re-watches from the last revision
  // + 1); Errc::conflict when `start_revision` was compacted away (the
  // caller re-reads and watches from the read's revision + 1).
  using OnEvents = std::function<bool(const std::vector<WatchEvent>& events, int64_t revision)>;
  Status watch(std::string_view key, bool prefix, int64_t start_revision, const OnEvents& on_events,
               const std::atomic<bool>& stop);

 private:
  struct Impl;
  explicit Etcd(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The end of the range of keys starting with `prefix` (etcd's range_end):
// the prefix with its last byte incremented, dropping trailing 0xff bytes.
std::string prefix_end(std::string_view prefix);

}  // namespace entente::cluster
