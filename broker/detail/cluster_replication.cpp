// Acknowledging what the followers hold (docs/cluster.md, "Replicated
// stream logs"): a publisher's append to a stream with followers is
// answered once every follower in the stream's in-sync set holds it
// durably. The set is in the domain's catalog, so whoever later chooses a
// new leader chooses among followers that hold every acknowledged tuple.
// The leader takes a follower out of the set, in etcd, before it stops
// waiting for it: when its channel closes, or when an append waited
// kReplicaWaitMs for it. A follower joins the set once it holds the whole
// log (checked at each membership tick).

#include <algorithm>
#include <cstdio>
#include <limits>

#include "broker/detail/node_impl.h"
#include "federation/peering.h"

namespace entente::broker::detail {
namespace {

using Clock = std::chrono::steady_clock;

// How long an append waits for an in-sync follower before that follower
// leaves the set.
constexpr int64_t kReplicaWaitMs = 1000;
// How long past that an append waits for etcd to record the change; then
// it is answered 503 (stored on the leader, not acknowledged).
constexpr int64_t kReplicaGiveUpMs = 5000;
// How often the waiting appends are looked at without an acknowledgement.
constexpr auto kReplicationTick = std::chrono::milliseconds(20);

}  // namespace

void NodeImpl::when_replicated(const std::string& stream, uint64_t last,
                               std::function<void(const Status&)> release) {
  if (!catalog_ || !peering_) {
    release(Status::Ok());
    return;
  }
  if (auto fence = leadership_fence(stream)) {
    release(*fence);
    return;
  }
  auto states = replica_states(stream);
  bool wait = false;
  if (states) {
    for (const auto& r : *states) wait |= r.in_sync && r.acked < last;
  }
  if (!wait) {
    release(Status::Ok());
    return;
  }
  {
    std::lock_guard lock(repl_mu_);
    if (!repl_stopping_) {
      repl_waiters_[stream].push_back(
          {last, Clock::now() + std::chrono::milliseconds(kReplicaWaitMs), std::move(release)});
      release = nullptr;
    }
  }
  if (release) {
    release(Status::Ok());  // stopping: durable here, and the answer must go
    return;
  }
  // An acknowledgement may have come between the look above and the wait.
  check_replication(stream);
}

void NodeImpl::on_replica_ack(const std::string& stream) {
  bool look;
  {
    std::lock_guard lock(repl_mu_);
    look = repl_waiters_.count(stream) != 0;
  }
  if (look) check_replication(stream);
}

void NodeImpl::check_replication(const std::string& stream) {
  auto states = replica_states(stream);
  std::vector<std::function<void(const Status&)>> released;
  // Deposed (or not sure any more that it leads): nothing waiting is
  // acknowledged.
  if (auto fence = leadership_fence(stream)) {
    {
      std::lock_guard lock(repl_mu_);
      if (auto it = repl_waiters_.find(stream); it != repl_waiters_.end()) {
        for (auto& w : it->second) released.push_back(std::move(w.release));
        repl_waiters_.erase(it);
      }
    }
    for (auto& r : released) r(*fence);
    return;
  }
  {
    std::lock_guard lock(repl_mu_);
    uint64_t held = std::numeric_limits<uint64_t>::max();  // by every in-sync follower
    bool closed = false;
    if (states) {
      for (const auto& r : *states) {
        if (!r.in_sync) continue;
        held = std::min(held, r.acked);
        // A follower that has not opened its copy yet (a new stream) is
        // waited for up to the bound, like a slow one.
        closed |= r.opened && !r.connected;
      }
    }
    auto it = repl_waiters_.find(stream);
    if (it == repl_waiters_.end()) return;
    auto& ws = it->second;
    const auto now = Clock::now();
    bool late = false;
    for (auto w = ws.begin(); w != ws.end();) {
      if (!states || w->last <= held) {
        released.push_back(std::move(w->release));
        w = ws.erase(w);
        continue;
      }
      late |= now >= w->deadline;
      ++w;
    }
    if (ws.empty()) repl_waiters_.erase(it);
    // A member to take out of the set: the replication thread asks etcd.
    if (closed || late) {
      repl_recheck_.insert(stream);
      repl_cv_.notify_one();
    }
  }
  // Outside the lock: an answer may come back here.
  for (auto& r : released) r(Status::Ok());
}

void NodeImpl::replication_loop() {
  std::unique_lock lock(repl_mu_);
  while (!repl_stopping_) {
    repl_cv_.wait_for(lock, kReplicationTick);
    if (repl_stopping_) break;
    std::set<std::string> streams;
    for (const auto& [s, _] : repl_waiters_) streams.insert(s);
    std::set<std::string> recheck = std::exchange(repl_recheck_, {});
    lock.unlock();
    for (const auto& s : streams) check_replication(s);
    for (const auto& s : recheck) {
      // The members an overdue append waits for leave the set (with those
      // whose channel closed), in etcd, before anyone stops waiting.
      std::set<std::string> leave;
      const auto states = replica_states(s);  // not under repl_mu_: it takes the catalog's and peering's locks
      {
        std::lock_guard l(repl_mu_);
        auto it = repl_waiters_.find(s);
        if (it == repl_waiters_.end()) continue;
        const auto now = Clock::now();
        for (const auto& w : it->second) {
          if (!states || now < w.deadline) continue;
          for (const auto& r : *states)
            if (r.in_sync && r.acked < w.last) leave.insert(r.node);
        }
      }
      auto changed = update_in_sync(s, leave, false);
      if (changed.ok()) {
        check_replication(s);
        continue;
      }
      // etcd did not take it: appends past the give-up bound are answered
      // that they are stored here but not acknowledged.
      std::vector<std::function<void(const Status&)>> failed;
      {
        std::lock_guard l(repl_mu_);
        auto it = repl_waiters_.find(s);
        if (it == repl_waiters_.end()) continue;
        const auto give_up = std::chrono::milliseconds(kReplicaGiveUpMs);
        for (auto w = it->second.begin(); w != it->second.end();) {
          if (Clock::now() >= w->deadline + give_up) {
            failed.push_back(std::move(w->release));
            w = it->second.erase(w);
          } else {
            ++w;
          }
        }
        if (it->second.empty()) repl_waiters_.erase(it);
        else repl_recheck_.insert(s);
      }
      for (auto& f : failed)
        f(make_error(Errc::unavailable, "stored on the stream's leader, but a follower in its in-sync set did not "
                                        "acknowledge it and the domain's catalog could not be told (" +
                                            changed.error().message + "); retry the batch under its producer "
                                            "number"));
    }
    lock.lock();
  }
}

void NodeImpl::stop_replication() {
  std::map<std::string, std::vector<ReplicaWaiter>> waiting;
  {
    std::lock_guard lock(repl_mu_);
    repl_stopping_ = true;
    waiting.swap(repl_waiters_);
  }
  repl_cv_.notify_all();
  if (repl_thread_.joinable()) repl_thread_.join();
  for (auto& [_, ws] : waiting)
    for (auto& w : ws)
      w.release(make_error(Errc::unavailable, "the node is stopping: stored on the stream's leader, not yet "
                                              "acknowledged by its in-sync followers; retry the batch under its "
                                              "producer number"));
}

}  // namespace entente::broker::detail
