// Acknowledging what the followers hold (docs/cluster.md, "Replicated
// stream logs"): a publisher's append to a stream with followers is
// answered once every follower in the stream's in-sync set holds it
// durably. The set is in the domain's catalog, so whoever later chooses a
// new leader chooses among followers that hold every acknowledged tuple.
// The leader takes a follower out of the set, in etcd, before it stops
// waiting for it: when its channel closes, or when an append waited
// kReplicaWaitMs for it. A follower joins the set once it holds the whole
// log (checked at each membership tick).
//
// The same set bounds what readers see: a stream's visible head
// (Stream::visible_next) is below what every in-sync follower holds, so a
// tuple a subscriber, a query or an export saw survives the leader. It
// moves at each acknowledgement and when the set changes; records that
// wait for it longer than kReplicaWaitMs take the followers they wait for
// out of the set, as a waiting append does.

#include <algorithm>
#include <cstdio>
#include <limits>

#include "broker/detail/node_impl.h"
#include "cluster/catalog.h"
#include "federation/acknowledgements.h"
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

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

// Below what every in-sync follower holds; no bound when none is in sync.
uint64_t visible_bound(const std::vector<ReplicaState>& states) {
  uint64_t bound = Stream::kNoBound;
  for (const auto& r : states)
    if (r.in_sync) bound = std::min(bound, r.acked + 1);
  return bound;
}

}  // namespace

void NodeImpl::refresh_visible(const StreamPtr& s, bool from_log) {
  if (s->meta().producer == "import") return;  // a mirror or a copy: never bounded
  const std::string& name = s->meta().name;
  std::lock_guard lock(visible_mu_);
  uint64_t bound = Stream::kNoBound;
  if (catalog_) {
    // Not read yet (just started, etcd down since): what is hidden stays
    // so. Led by another node now: this node's readers are sent there.
    if (catalog_->revision() == 0) return;
    if (auto states = replica_states(name)) bound = visible_bound(*states);  // led here
    else if (auto leader = stream_leader(name); leader && *leader != config_.node) return;
  }
  // false: records hidden since a restart wait for the replication
  // thread's next look, which may read the log.
  (void)s->set_visible_bound(bound, from_log ? store_.get() : nullptr);
}

void NodeImpl::bound_visible_to(const std::string& stream, const std::vector<std::string>& in_sync) {
  StreamPtr s = find_stream(stream);
  if (!s || !peering_) return;
  std::lock_guard lock(visible_mu_);
  const auto readers = peering_->internal_readers(stream);
  uint64_t bound = Stream::kNoBound;
  for (const auto& node : in_sync) {
    uint64_t acked = 0;
    for (const auto& r : readers)
      if (r.node == node) acked = r.acked;
    bound = std::min(bound, acked + 1);
  }
  (void)s->set_visible_bound(bound);
}

bool NodeImpl::is_follower(const std::string& stream, const std::string& node) const {
  auto states = replica_states(stream);
  if (!states) return false;
  return std::any_of(states->begin(), states->end(), [&](const ReplicaState& r) { return r.node == node; });
}

// The rule at a restart: the leader may hold tuples its in-sync followers
// never received (stored, not acknowledged, when it stopped). Which
// followers are in sync is in etcd, not read yet; what each follower
// acknowledged is in this node's store. So every stream some node of the
// domain read (a follower, or a fragment of a query) shows only what all of
// them acknowledged, until the catalog is read: then the bound is what the
// in-sync followers hold (followers acknowledge where they stand when they
// reopen their copies), and those that do not come back leave the set
// after kReplicaWaitMs, releasing the rest.
void NodeImpl::hold_unreplicated() {
  if (!config_.cluster.enabled || !config_.federation.enabled) return;
  federation::Acknowledgements acks(*store_);
  if (Status st = acks.load(); !st.ok()) {
    base::logf(LogLevel::warn, "cluster", "reading what followers acknowledged: %s (streams show their whole log)\n",
                 st.error().message.c_str());
    return;
  }
  std::shared_lock lock(catalog_mu_);
  for (auto& [name, s] : streams_) {
    if (s->meta().producer == "import") continue;
    uint64_t held = Stream::kNoBound;
    for (const auto& [party, through] : acks.of(name)) {
      // "@NODE": a node of this domain (federation's ack_party).
      if (!party.empty() && party[0] == '@') held = std::min(held, through + 1);
    }
    if (held != Stream::kNoBound) s->hold_from(held);
  }
}

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
  // "process": acknowledged once the leader holds it; the followers copy
  // it after (docs/cluster.md, "Durability per stream").
  if (StreamPtr s = find_stream(stream); s && s->meta().durability == "process") {
    release(Status::Ok());
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
  if (StreamPtr s = find_stream(stream)) refresh_visible(s, false);
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
    // Records waiting to be visible: released as far as the followers hold
    // them (here the log may be read), and past the bound the followers
    // they wait for leave the set, as for a waiting append.
    const int64_t now_ms = steady_ms();
    for (const auto& s : list_streams()) {
      if (!s->hidden_wait()) continue;
      refresh_visible(s, true);
      auto w = s->hidden_wait();
      if (w && now_ms - w->since_ms >= kReplicaWaitMs) recheck.insert(s->meta().name);
    }
    for (const auto& s : recheck) recheck_in_sync(s);
    lock.lock();
  }
}

void NodeImpl::recheck_in_sync(const std::string& s) {
  // The members an overdue append, or an overdue hidden record, waits for
  // leave the set (with those whose channel closed), in etcd, before anyone
  // stops waiting.
  std::set<std::string> leave;
  const auto states = replica_states(s);  // not under repl_mu_: it takes the catalog's and peering's locks
  const auto now = Clock::now();
  bool waiting = false;
  {
    std::lock_guard l(repl_mu_);
    auto it = repl_waiters_.find(s);
    waiting = it != repl_waiters_.end();
    if (waiting && states) {
      for (const auto& w : it->second) {
        if (now < w.deadline) continue;
        for (const auto& r : *states)
          if (r.in_sync && r.acked < w.last) leave.insert(r.node);
      }
    }
  }
  StreamPtr stream = find_stream(s);
  bool hidden_late = false;
  if (auto w = stream ? stream->hidden_wait() : std::nullopt; w && steady_ms() - w->since_ms >= kReplicaWaitMs) {
    hidden_late = true;
    if (states) {
      for (const auto& r : *states)
        if (r.in_sync && r.acked < w->through) leave.insert(r.node);
    }
  }
  if (!waiting && !hidden_late) return;  // answered and released meanwhile
  auto changed = update_in_sync(s, leave, false);
  if (changed.ok()) {
    if (stream) refresh_visible(stream, true);
    check_replication(s);
    return;
  }
  // etcd did not take it: appends past the give-up bound are answered
  // that they are stored here but not acknowledged; hidden records stay
  // hidden, and the next tick asks again.
  std::vector<std::function<void(const Status&)>> failed;
  {
    std::lock_guard l(repl_mu_);
    if (auto it = repl_waiters_.find(s); it != repl_waiters_.end()) {
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
    if (hidden_late) repl_recheck_.insert(s);
  }
  for (auto& f : failed)
    f(make_error(Errc::unavailable, "stored on the stream's leader, but a follower in its in-sync set did not "
                                    "acknowledge it and the domain's catalog could not be told (" +
                                        changed.error().message + "); retry the batch under its producer "
                                        "number"));
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
