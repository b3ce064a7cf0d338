#pragma once
// The nodes of a domain and its controller, kept in etcd (docs/cluster.md,
// "Membership and the controller").
//
// Keys, under the domain's prefix P:
//   P nodes/<node>     the node's record (where its API and peer link are,
//                      when it started); written at every start, no lease,
//                      so a node that died stays listed as down;
//   P alive/<node>     its load, under the node's lease: present while the
//                      node keeps the lease alive;
//   P controller       the controller's name, under its lease; created
//                      only when absent (a transaction), so one node holds
//                      it at a time, and it passes to another node when the
//                      holder's lease expires.
//
// One thread per node ticks every lease_ttl/3, and at once when one of two
// more threads, watching the controller key and the alive/ keys, sees one
// deleted (a node left or its lease expired): it renews the lease (or
// grants a new one when it expired, re-registering), rewrites its load,
// campaigns for the controller key, and reads the members back into the
// view the API serves. When etcd is unreachable the view stays as last read
// and says so (`etcd_error`); the node stops calling itself controller once
// a whole lease TTL has passed without a renewal, because by then etcd may
// have given the role to another node.
//
// Threading: view() and is_controller() from any thread; start() and stop()
// from one.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/result.h"
#include "cluster/etcd.h"

namespace entente::cluster {

// Where a node is reached; written once per start.
struct NodeRecord {
  std::string node;
  std::string api_url;       // "https://host:port" or "http://host:port"
  std::string peer_address;  // "host:port" of the peer link; empty: none
  std::string version;
  int64_t started_ms = 0;    // wall clock
};

// What a node reports about itself at every tick.
struct NodeLoad {
  double cpu = 0;            // cores used by the process over the last tick
  uint64_t lag_tuples = 0;   // input its queries have not processed yet
  std::vector<std::string> streams_led;  // streams appended on this node
  std::vector<std::string> fragments;    // query fragments running here
  // A fingerprint of the node's API tokens (roles and hashes): forwarding
  // needs every node of a domain to accept the same tokens.
  std::string tokens;
};

struct Member {
  NodeRecord record;
  bool up = false;           // its lease is alive
  bool controller = false;
  std::optional<NodeLoad> load;  // while up
};

struct MembershipView {
  std::vector<Member> members;  // by node name
  std::string controller;       // empty: none right now
  bool is_controller = false;   // this node, and its lease is current
  int64_t read_ms = 0;          // wall clock of the last successful read; 0: never
  std::optional<std::string> etcd_error;  // the last tick failed: why
  int64_t etcd_error_since_ms = 0;
};

struct MembershipOptions {
  std::string prefix;  // ends with '/'
  int64_t lease_ttl_ms = 5'000;
};

class Membership final {
 public:
  // Called at every tick, on the membership thread.
  using LoadFn = std::function<NodeLoad()>;
  // Called on the membership thread when this node gains or loses the
  // controller role.
  using RoleFn = std::function<void(bool controller)>;
  // Called after each tick that reached etcd, on a thread of its own (the
  // work thread): however long it takes, the membership thread renews the
  // lease on time (a take-over restoring a large checkpoint from the tick
  // let the lease expire). Ticks that come while it runs are coalesced
  // into one more call.
  using TickFn = std::function<void()>;

  Membership(Etcd& etcd, MembershipOptions options, NodeRecord self, LoadFn load, RoleFn on_role = {},
             TickFn on_tick = {});
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // Starts the thread. The first registration happens on it: a node whose
  // etcd is down still starts, and registers once etcd answers.
  void start();
  // Stops the thread; with `leave`, revokes the lease, so the node shows as
  // down and the controller role passes at once rather than at the lease's
  // expiry.
  void stop(bool leave);

  // Ticks now rather than at the period's end (at most one tick per 20 ms
  // this way): something the tick retries is likely to succeed now.
  void tick_soon();

  MembershipView view() const;
  bool is_controller() const;
  // The lease this node holds, while it is current: granted or renewed
  // (by a request sent) less than one TTL ago, so that etcd cannot have
  // expired it yet. 0 otherwise. A new lease after an expiry is another id.
  int64_t lease_id() const;

  // The record's and load's JSON forms (the values of the keys above).
  static std::string record_json(const NodeRecord& r);
  static Result<NodeRecord> record_from_json(std::string_view json);
  static std::string load_json(const NodeLoad& l);
  static Result<NodeLoad> load_from_json(std::string_view json);

 private:
  void run();
  void tick();
  void work();  // the work thread: on_tick_ once per tick asked for
  // Watches `key` (a prefix when `prefix`); a deletion under it wakes run()
  // at once.
  void watch_for_departures(const std::string& key, bool prefix);
  // Each returns an error when etcd failed; the tick then stops there.
  Status keep_registered();
  Status campaign();
  Status read_members();
  void set_error(const Error& e);
  void set_controller(bool controller);
  int64_t lease_ttl_s() const { return std::max<int64_t>(1, (options_.lease_ttl_ms + 999) / 1000); }

  Etcd& etcd_;
  const MembershipOptions options_;
  const NodeRecord self_;
  const LoadFn load_;
  const RoleFn on_role_;
  const TickFn on_tick_;

  // Owned by the membership thread (or tick_for_test).
  int64_t lease_ = 0;
  bool registered_ = false;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool tick_now_ = false;  // REQUIRES: mu_; the controller key went: tick now
  bool work_due_ = false;  // REQUIRES: mu_; a tick reached etcd: on_tick_ is due
  std::condition_variable work_cv_;
  std::thread work_thread_;
  MembershipView view_;  // REQUIRES: mu_
  std::atomic<bool> controller_{false};
  // When the lease was last granted or renewed (steady clock): the role is
  // only claimed within one TTL of it.
  std::atomic<int64_t> lease_renewed_steady_ms_{0};
  std::atomic<int64_t> lease_id_{0};  // lease_, for other threads
  std::thread thread_;
  std::atomic<bool> watch_stop_{false};
  std::thread watch_thread_;        // the controller key
  std::thread alive_watch_thread_;  // the alive/ keys
};

}  // namespace entente::cluster
