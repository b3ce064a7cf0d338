// Acknowledging what the followers hold (docs/cluster.md, "Replicated
// stream logs"): a publisher's append to a stream with followers is
// answered once every follower in the in-sync set holds it durably. A
// follower that does not within kReplicaWaitMs leaves the set, so that a
// slow or cut-off follower costs the publishers one wait, not every one;
// it rejoins once it holds the whole log.

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
// How often waiting appends are looked at without an acknowledgement.
constexpr auto kReplicationTick = std::chrono::milliseconds(20);

}  // namespace

bool NodeImpl::replica_lagging(const std::string& stream, const std::string& node) const {
  std::lock_guard lock(repl_mu_);
  return repl_lagging_.count({stream, node}) != 0;
}

void NodeImpl::when_replicated(const std::string& stream, uint64_t last, std::function<void()> release) {
  if (!catalog_ || !peering_) {
    release();
    return;
  }
  auto states = replica_states(stream);
  bool wait = false;
  if (states) {
    for (const auto& r : *states) wait |= r.in_sync && r.acked < last;
  }
  if (!wait) {
    release();
    return;
  }
  {
    std::lock_guard lock(repl_mu_);
    if (repl_stopping_) {
      release = [r = std::move(release)] { r(); };
    } else {
      repl_waiters_[stream].push_back(
          {last, Clock::now() + std::chrono::milliseconds(kReplicaWaitMs), std::move(release)});
      release = nullptr;
    }
  }
  if (release) {
    release();
    return;
  }
  // An acknowledgement may have come between the look above and the wait.
  check_replication(stream);
}

void NodeImpl::on_replica_ack(const std::string& stream, const std::string& node, uint64_t through) {
  (void)through;
  bool look;
  {
    std::lock_guard lock(repl_mu_);
    look = repl_waiters_.count(stream) != 0 || repl_lagging_.count({stream, node}) != 0;
  }
  if (look) check_replication(stream);
}

void NodeImpl::check_replication(const std::string& stream) {
  auto states = replica_states(stream);
  std::vector<std::function<void()>> released;
  std::vector<std::string> left, rejoined;
  {
    std::lock_guard lock(repl_mu_);
    const auto now = Clock::now();
    StreamPtr s = find_stream(stream);
    const uint64_t head = s ? s->committed_next() - 1 : 0;
    uint64_t held = std::numeric_limits<uint64_t>::max();  // by every in-sync follower
    if (states) {
      for (const auto& r : *states) {
        // A lagging follower that holds the whole log is back in the set.
        if (repl_lagging_.count({stream, r.node}) && r.connected && r.acked >= head) {
          repl_lagging_.erase({stream, r.node});
          rejoined.push_back(r.node);
          continue;  // it need not hold what earlier appends wait for
        }
        if (r.in_sync) held = std::min(held, r.acked);
      }
    }
    auto it = repl_waiters_.find(stream);
    if (it != repl_waiters_.end()) {
      auto& ws = it->second;
      for (auto w = ws.begin(); w != ws.end();) {
        if (!states || w->last <= held) {
          released.push_back(std::move(w->release));
          w = ws.erase(w);
          continue;
        }
        if (now >= w->deadline) {
          // Whoever is in sync and still lacks it leaves the set.
          for (const auto& r : *states) {
            if (r.in_sync && r.acked < w->last && repl_lagging_.insert({stream, r.node}).second)
              left.push_back(r.node);
          }
          released.push_back(std::move(w->release));
          w = ws.erase(w);
          continue;
        }
        ++w;
      }
      if (ws.empty()) repl_waiters_.erase(it);
    }
  }
  for (const auto& n : left) {
    std::fprintf(stderr,
                 "entente: follower %s of stream '%s' leaves the in-sync set: it did not acknowledge within %lld "
                 "ms; appends no longer wait for it until it holds the whole log\n",
                 n.c_str(), stream.c_str(), static_cast<long long>(kReplicaWaitMs));
    metrics_
        .counter("entente_stream_replica_left_in_sync_total",
                 "Times a follower left a stream's in-sync set for not keeping up", {{"stream", stream}, {"node", n}})
        .inc();
  }
  for (const auto& n : rejoined)
    std::fprintf(stderr, "entente: follower %s of stream '%s' is back in the in-sync set\n", n.c_str(),
                 stream.c_str());
  // Outside the lock: an answer may come back here.
  for (auto& r : released) r();
}

void NodeImpl::replication_loop() {
  std::unique_lock lock(repl_mu_);
  while (!repl_stopping_) {
    repl_cv_.wait_for(lock, kReplicationTick);
    if (repl_stopping_) break;
    std::set<std::string> streams;
    for (const auto& [s, _] : repl_waiters_) streams.insert(s);
    for (const auto& [s, _] : repl_lagging_) streams.insert(s);
    lock.unlock();
    for (const auto& s : streams) check_replication(s);
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
    for (auto& w : ws) w.release();
}

}  // namespace entente::broker::detail
