#include "broker/detail/streams.h"

#include <algorithm>
#include <chrono>

#include "broker/detail/json_out.h"
#include "engine/codec.h"
#include "rapidjson/document.h"
#include "rapidjson/error/en.h"

namespace entente::broker::detail {

namespace {

int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

int64_t steady_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

// Records read from the log per step when releasing records hidden since
// before a restart.
constexpr size_t kLogRecordsPerStep = 16;
constexpr size_t kLogBytesPerStep = 4u << 20;

}  // namespace

const std::string& Record::ndjson() const {
  std::call_once(ndjson_once_, [this] { engine::batch_to_ndjson(*batch, ndjson_); });
  return ndjson_;
}

std::optional<store::Durability> durability_of(std::string_view mode) {
  if (mode == "fsync") return store::Durability::synced;
  if (mode == "replicated" || mode == "process") return store::Durability::buffered;
  return std::nullopt;
}

std::optional<store::Durability> Stream::durability() const {
  const int d = durability_.load(std::memory_order_relaxed);
  if (d < 0) return std::nullopt;
  return static_cast<store::Durability>(d);
}

void Stream::set_durability(std::optional<store::Durability> d) {
  durability_.store(d ? static_cast<int>(*d) : -1, std::memory_order_relaxed);
}

Stream::Stream(StreamMeta meta, uint64_t next_seq)
    : meta_(std::move(meta)),
      next_seq_(next_seq),
      ever_appended_(next_seq > 1),
      committed_next_(next_seq),
      visible_next_(next_seq) {
  set_durability(durability_of(meta_.durability));
}

Status Stream::append(engine::Batch batch, store::GroupCommit& gc, store::Admission admission,
                      store::WriteBatch extra, Done done) {
  if (batch.rows() == 0) return make_error(Errc::invalid_argument, "an empty batch has no sequence numbers");
  std::lock_guard lock(append_mu_);
  return append_locked(next_seq_, std::move(batch), gc, admission, std::move(extra), std::move(done));
}

Status Stream::append_at(uint64_t first, engine::Batch batch, store::GroupCommit& gc, store::Admission admission,
                         Done done, std::shared_ptr<const std::string> encoded) {
  return append_at(first, std::move(batch), gc, admission, store::WriteBatch(), std::move(done),
                   std::move(encoded));
}

Status Stream::append_at(uint64_t first, engine::Batch batch, store::GroupCommit& gc, store::Admission admission,
                         store::WriteBatch extra, Done done, std::shared_ptr<const std::string> encoded) {
  if (batch.rows() == 0) return make_error(Errc::invalid_argument, "an empty batch has no sequence numbers");
  std::lock_guard lock(append_mu_);
  if (first != next_seq_) {
    if (ever_appended_ || first < next_seq_)
      return make_error(Errc::conflict, "stream '" + meta_.name + "' expects sequence number " +
                                            std::to_string(next_seq_) + ", got " + std::to_string(first));
    // An empty mirror starts where the owner's retained tuples start.
    next_seq_ = first;
    committed_next_.store(first, std::memory_order_release);
    std::lock_guard tl(taps_mu_);
    if (hidden_.empty()) visible_next_.store(std::max(first, visible_next_.load()), std::memory_order_release);
  }
  return append_locked(first, std::move(batch), gc, admission, std::move(extra), std::move(done),
                       std::move(encoded));
}

std::optional<uint64_t> Stream::log_bytes() const {
  const int64_t b = log_bytes_.load(std::memory_order_relaxed);
  if (b < 0) return std::nullopt;
  return static_cast<uint64_t>(b);
}

void Stream::set_log_bytes(uint64_t bytes) {
  log_bytes_.store(static_cast<int64_t>(std::min<uint64_t>(bytes, INT64_MAX)),
                   std::memory_order_relaxed);
}

void Stream::trimmed_log_bytes(uint64_t bytes) {
  // Never below zero: the first count may have missed a record that is now removed.
  int64_t cur = log_bytes_.load(std::memory_order_relaxed);
  while (cur >= 0) {
    const int64_t next = cur - std::min<int64_t>(cur, static_cast<int64_t>(bytes));
    if (log_bytes_.compare_exchange_weak(cur, next, std::memory_order_relaxed)) return;
  }
}

uint64_t Stream::next_seq() const {
  std::lock_guard lock(append_mu_);
  return next_seq_;
}

Status Stream::append_locked(uint64_t first, engine::Batch batch, store::GroupCommit& gc,
                             store::Admission admission, store::WriteBatch extra, Done done,
                             std::shared_ptr<const std::string> encoded) {
  const size_t n = batch.rows();
  if (closed()) return make_error(Errc::not_found, "stream '" + meta_.name + "' was deleted");
  const uint64_t last = first + n - 1;
  if (!encoded) {
    auto& seq = batch.seq.reset();
    seq.resize(n);
    for (size_t i = 0; i < n; ++i) seq[i] = first + i;
    auto fresh = std::make_shared<std::string>();
    engine::encode_batch(batch, *fresh);
    encoded = std::move(fresh);
  }
  auto record = std::make_shared<Record>();
  record->first = first;
  record->last = last;
  record->batch = std::make_shared<const engine::Batch>(std::move(batch));
  record->encoded = encoded;
  store::StreamLog::add_append(extra, meta_.id, first, last, now_ms(), *encoded);
  const size_t bytes = encoded->size();
  Status s = gc.submit(
      std::move(extra),
      [this, self = shared_from_this(), record, done = std::move(done), bytes](const Status& st) {
        // Runs on the committer thread, in submission order: this is what
        // keeps the records a tap sees in sequence order.
        if (st.ok()) {
          committed_next_.store(record->last + 1, std::memory_order_release);
          if (tuples_in) tuples_in->inc(record->rows());
          if (bytes_in) bytes_in->inc(bytes);
          if (log_bytes_.load(std::memory_order_relaxed) >= 0)
            log_bytes_.fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
          publish(record);
        }
        if (done) done(st, record);
      },
      admission, durability());
  if (!s.ok()) return s;
  next_seq_ = last + 1;
  ever_appended_ = true;
  return Status::Ok();
}

Stream::Recall Stream::recall_locked(const ProducerTag& tag, Appended& found, uint64_t& floor,
                                     AppendedDone& done) {
  auto it = producers_.find(tag.id);
  if (it == producers_.end()) return Recall::unknown;
  Producer& p = it->second;
  p.used = ++producer_tick_;
  if (auto s = p.stored.find(tag.seq); s != p.stored.end()) {
    found = Appended{s->second.first, s->second.second, true};
    return Recall::stored;
  }
  if (auto w = p.pending.find(tag.seq); w != p.pending.end()) {
    w->second.push_back(std::move(done));
    return Recall::pending;
  }
  floor = p.floor;
  return tag.seq <= p.floor ? Recall::forgotten : Recall::unknown;
}

namespace {

Error forgotten_error(const std::string& stream, const ProducerTag& tag, uint64_t floor) {
  return make_error(Errc::conflict,
                    "stream '" + stream + "' no longer remembers batch " + std::to_string(tag.seq) + " of producer '" +
                        tag.id + "': it remembers the last " + std::to_string(Stream::kProducerWindow) +
                        " batches of a producer, and has forgotten those numbered " + std::to_string(floor) +
                        " and below; the batch may have been stored (read the stream to know)");
}

}  // namespace

bool Stream::recall(const ProducerTag& tag, AppendedDone& done) {
  Appended found;
  uint64_t floor = 0;
  Recall r;
  {
    std::lock_guard lock(producers_mu_);
    r = recall_locked(tag, found, floor, done);
  }
  switch (r) {
    case Recall::unknown: return false;
    case Recall::pending: return true;
    case Recall::stored: done(Status::Ok(), found); return true;
    case Recall::forgotten: done(forgotten_error(meta_.name, tag, floor), Appended{}); return true;
  }
  return false;
}

Status Stream::append_once(engine::Batch batch, const ProducerTag& tag, store::GroupCommit& gc,
                           store::Admission admission, AppendedDone done) {
  if (batch.rows() == 0) return make_error(Errc::invalid_argument, "an empty batch has no sequence numbers");
  Appended found;
  uint64_t floor = 0;
  Recall r;
  std::unique_lock lock(append_mu_);
  std::unique_lock plock(producers_mu_);
  r = recall_locked(tag, found, floor, done);
  if (r != Recall::unknown) {
    plock.unlock();
    lock.unlock();
    if (r == Recall::stored) done(Status::Ok(), found);
    else if (r == Recall::forgotten) done(forgotten_error(meta_.name, tag, floor), Appended{});
    return Status::Ok();
  }
  if (closed()) return make_error(Errc::not_found, "stream '" + meta_.name + "' was deleted");
  // A new batch: remember it (as being written) and, in the same atomic
  // write as its record, what it was stored under; forget what falls out
  // of the window, or the least recently used producer when there are too
  // many.
  const uint64_t first = next_seq_;
  const uint64_t last = first + batch.rows() - 1;
  store::WriteBatch extra;
  Remembering rem;
  remember_locked(tag, first, last, 0, extra, rem);
  plock.unlock();
  Status s = append_locked(first, std::move(batch), gc, admission, std::move(extra),
                           [this, tag, done](const Status& st, const RecordPtr& rec) {
                             Appended a;
                             if (rec) a = Appended{rec->first, rec->last, false};
                             producer_done(tag, st, a, done);
                           });
  plock.lock();
  if (!s.ok()) {
    // Not submitted: nothing was written. Retries that came meanwhile get
    // the same refusal.
    std::vector<AppendedDone> waiters = unremember_locked(tag, last);
    plock.unlock();
    for (auto& d : waiters) d(s, Appended{});
    return s;
  }
  remembered_locked(rem);
  return Status::Ok();
}

void Stream::remember_locked(const ProducerTag& tag, uint64_t first, uint64_t last, uint64_t floor,
                             store::WriteBatch& extra, Remembering& r) {
  store::StreamLog::add_producer_batch(extra, meta_.id, tag.id, tag.seq, first, last, now_ms());
  auto it = producers_.find(tag.id);
  if (it != producers_.end()) {
    Producer& p = it->second;
    // Batches this write already evicted are the first of `stored` (the
    // oldest go first); they still count as gone.
    const size_t gone = static_cast<size_t>(
        std::count_if(r.evicted.begin(), r.evicted.end(), [&](const auto& e) { return e.first == tag.id; }));
    size_t count = p.stored.size() - gone + p.pending.size() + 1;
    uint64_t old_floor = p.floor;
    if (auto f = r.floors.find(tag.id); f != r.floors.end()) old_floor = std::max(old_floor, f->second);
    uint64_t new_floor = std::max(old_floor, floor);
    for (auto s = std::next(p.stored.begin(), static_cast<std::ptrdiff_t>(gone));
         s != p.stored.end() && count > kProducerWindow; ++s, --count) {
      r.evicted.emplace_back(tag.id, s->first);
      store::StreamLog::add_forget_producer_batch(extra, meta_.id, tag.id, s->first);
      new_floor = std::max(new_floor, s->first);
    }
    if (new_floor != old_floor) {
      store::StreamLog::add_producer_floor(extra, meta_.id, tag.id, new_floor);
      r.floors[tag.id] = new_floor;
    }
  } else {
    if (producers_.size() - r.victims.size() >= kMaxProducers) {
      uint64_t oldest = UINT64_MAX;
      std::string victim;
      for (const auto& [id, p] : producers_) {
        if (p.pending.empty() && p.used < oldest &&
            std::find(r.victims.begin(), r.victims.end(), id) == r.victims.end()) {
          oldest = p.used;
          victim = id;
        }
      }
      if (!victim.empty()) {
        store::StreamLog::add_forget_producer(extra, meta_.id, victim);
        r.victims.push_back(std::move(victim));
      }
    }
    if (floor > 0) {
      store::StreamLog::add_producer_floor(extra, meta_.id, tag.id, floor);
      r.floors[tag.id] = floor;
    }
  }
  Producer& p = producers_[tag.id];
  p.used = ++producer_tick_;
  p.pending[tag.seq];
  named_by_last_[last] = NamedAt{tag.id, tag.seq, first};
}

void Stream::remembered_locked(const Remembering& r) {
  for (const auto& [id, n] : r.evicted) {
    auto it = producers_.find(id);
    if (it == producers_.end()) continue;
    if (auto s = it->second.stored.find(n); s != it->second.stored.end()) {
      erase_named_locked(s->second.second, id, n);
      it->second.stored.erase(s);
    }
  }
  for (const auto& [id, f] : r.floors) {
    if (auto it = producers_.find(id); it != producers_.end())
      it->second.floor = std::max(it->second.floor, f);
  }
  for (const auto& v : r.victims) {
    auto it = producers_.find(v);
    if (it == producers_.end() || !it->second.pending.empty()) continue;
    for (const auto& [n, range] : it->second.stored) erase_named_locked(range.second, v, n);
    producers_.erase(it);
  }
}

std::vector<Stream::AppendedDone> Stream::unremember_locked(const ProducerTag& tag, uint64_t last) {
  std::vector<AppendedDone> waiters;
  erase_named_locked(last, tag.id, tag.seq);
  auto it = producers_.find(tag.id);
  if (it == producers_.end()) return waiters;
  Producer& p = it->second;
  if (auto w = p.pending.find(tag.seq); w != p.pending.end()) {
    waiters = std::move(w->second);
    p.pending.erase(w);
  }
  if (p.pending.empty() && p.stored.empty() && p.floor == 0) producers_.erase(it);
  return waiters;
}

void Stream::erase_named_locked(uint64_t last, const std::string& producer, uint64_t seq) {
  auto it = named_by_last_.find(last);
  if (it != named_by_last_.end() && it->second.producer == producer && it->second.seq == seq) {
    named_by_last_.erase(it);
  }
}

Status Stream::append_at_named(uint64_t first, engine::Batch batch, store::GroupCommit& gc,
                               store::Admission admission, store::WriteBatch extra,
                               std::vector<NamedRecord> named, Done done,
                               std::shared_ptr<const std::string> encoded) {
  Remembering rem;
  std::vector<NamedRecord> fresh;
  {
    std::lock_guard plock(producers_mu_);
    for (auto& n : named) {
      // Sent again (a copy resuming after a reconnect): already known, or
      // older than what is remembered of its producer.
      if (auto it = producers_.find(n.tag.id); it != producers_.end()) {
        const Producer& p = it->second;
        if (p.stored.count(n.tag.seq) || p.pending.count(n.tag.seq) || n.tag.seq <= p.floor) continue;
      }
      remember_locked(n.tag, n.first, n.last, n.floor, extra, rem);
      fresh.push_back(std::move(n));
    }
  }
  // The names become known (stored) once the tuples they name are durable,
  // as those of append_once.
  auto with_names = [this, fresh, done = std::move(done)](const Status& st, const RecordPtr& rec) {
    for (const auto& n : fresh) producer_done(n.tag, st, Appended{n.first, n.last, false}, nullptr);
    if (done) done(st, rec);
  };
  Status s = append_at(first, std::move(batch), gc, admission, std::move(extra), std::move(with_names),
                       std::move(encoded));
  std::vector<AppendedDone> waiters;
  {
    std::lock_guard plock(producers_mu_);
    if (s.ok()) {
      remembered_locked(rem);
    } else {
      for (const auto& n : fresh) {
        auto w = unremember_locked(n.tag, n.last);
        for (auto& d : w) waiters.push_back(std::move(d));
      }
    }
  }
  for (auto& d : waiters) d(s, Appended{});
  return s;
}

void Stream::named_batches(uint64_t first, uint64_t last, std::vector<NamedRecord>& out) const {
  std::lock_guard lock(producers_mu_);
  for (auto it = named_by_last_.lower_bound(first); it != named_by_last_.end() && it->first <= last; ++it) {
    auto p = producers_.find(it->second.producer);
    out.push_back(NamedRecord{ProducerTag{it->second.producer, it->second.seq}, it->second.first, it->first,
                              p != producers_.end() ? p->second.floor : 0});
  }
}

void Stream::producer_done(const ProducerTag& tag, const Status& st, const Appended& a, const AppendedDone& done) {
  std::vector<AppendedDone> waiters;
  {
    std::lock_guard lock(producers_mu_);
    auto it = producers_.find(tag.id);
    if (it != producers_.end()) {
      Producer& p = it->second;
      if (auto w = p.pending.find(tag.seq); w != p.pending.end()) {
        waiters = std::move(w->second);
        p.pending.erase(w);
      }
      if (st.ok()) p.stored[tag.seq] = {a.first, a.last};
    }
    if (!st.ok()) erase_named_locked(a.last, tag.id, tag.seq);
  }
  if (done) done(st, a);
  Appended again = a;
  again.duplicate = true;
  for (auto& d : waiters) d(st, again);
}

void Stream::load_producers(std::vector<store::StreamLog::ProducerBatch> entries) {
  std::lock_guard lock(producers_mu_);
  std::map<std::string, int64_t> newest;
  for (auto& e : entries) {
    Producer& p = producers_[e.producer];
    if (e.producer_seq == 0) {
      p.floor = std::max(p.floor, e.first);
    } else {
      p.stored[e.producer_seq] = {e.first, e.last};
      int64_t& n = newest[e.producer];
      n = std::max(n, e.append_ms);
    }
  }
  for (auto& [id, p] : producers_) {
    // More than a window (batches that completed out of order around an
    // eviction): keep the newest, as appending would have.
    while (p.stored.size() > kProducerWindow) {
      p.floor = std::max(p.floor, p.stored.begin()->first);
      p.stored.erase(p.stored.begin());
    }
  }
  // Recency survives a restart as the order of the producers' newest batches.
  std::vector<std::pair<int64_t, std::string>> order;
  for (auto& [id, p] : producers_) order.emplace_back(newest[id], id);
  std::sort(order.begin(), order.end());
  for (auto& [ms, id] : order) producers_[id].used = ++producer_tick_;
  named_by_last_.clear();
  for (const auto& [id, p] : producers_) {
    for (const auto& [n, range] : p.stored) named_by_last_[range.second] = NamedAt{id, n, range.first};
  }
}

size_t Stream::producer_count() const {
  std::lock_guard lock(producers_mu_);
  return producers_.size();
}

uint64_t Stream::add_tap(const std::shared_ptr<Tap>& tap, TapHead head) {
  std::lock_guard lock(taps_mu_);
  if (head == TapHead::durable) {
    durable_taps_.push_back(tap);
    // Read under taps_mu_: publish() moves committed_next_ before taking
    // the same lock, so records at or after this position reach the tap.
    return committed_next();
  }
  taps_.push_back(tap);
  // The visible head moves under taps_mu_, with the list of taps the
  // records it releases go to.
  return visible_next();
}

void Stream::remove_tap(const Tap* tap) {
  std::lock_guard lock(taps_mu_);
  for (auto* list : {&taps_, &durable_taps_}) {
    std::erase_if(*list, [tap](const std::weak_ptr<Tap>& w) {
      auto p = w.lock();
      return !p || p.get() == tap;
    });
  }
}

void Stream::collect_locked(std::vector<std::weak_ptr<Tap>>& list, std::vector<std::shared_ptr<Tap>>& out) {
  for (auto it = list.begin(); it != list.end();) {
    if (auto p = it->lock()) {
      out.push_back(std::move(p));
      ++it;
    } else {
      it = list.erase(it);
    }
  }
}

// On the committer thread, in sequence order. While visibility is not
// bounded and nothing waits (every single-node domain, every stream without
// an in-sync follower) this is one lock and the taps, as before the two
// heads; otherwise the record waits among the hidden ones.
void Stream::publish(const RecordPtr& record) {
  std::vector<std::shared_ptr<Tap>> live;
  bool release = false;
  {
    std::lock_guard lock(taps_mu_);
    live.reserve(taps_.size() + durable_taps_.size());
    collect_locked(durable_taps_, live);
    if (bound_ == kNoBound && hidden_.empty() && !draining_ && visible_next_.load(std::memory_order_relaxed) >= log_until_) {
      visible_next_.store(record->last + 1, std::memory_order_release);
      collect_locked(taps_, live);
    } else {
      hidden_.emplace_back(record, steady_ms());
      // Released at once when the bound already covers it (and no record
      // hidden since a restart, which needs a log read, comes first).
      release = !draining_ && visible_next_.load(std::memory_order_relaxed) >= log_until_ && releasable_locked();
      draining_ |= release;
    }
  }
  for (auto& t : live) t->on_record(record);
  if (release) (void)drain(nullptr);
}

bool Stream::releasable_locked() const {
  const uint64_t visible = visible_next_.load(std::memory_order_relaxed);
  if (visible < log_until_) return visible < bound_;
  return !hidden_.empty() && hidden_.front().first->last < bound_;
}

bool Stream::set_visible_bound(uint64_t bound, const store::Store* log) {
  {
    std::lock_guard lock(taps_mu_);
    bound_ = bound;
    // A drain in progress looks at the bound again before it stops.
    if (draining_ || !releasable_locked()) return true;
    draining_ = true;
  }
  return drain(log);
}

void Stream::hold_from(uint64_t visible_next) {
  std::lock_guard lock(taps_mu_);
  const uint64_t durable = committed_next();
  if (visible_next >= durable) return;
  visible_next_.store(visible_next, std::memory_order_release);
  log_until_ = durable;
  log_hidden_ms_ = steady_ms();
  bound_ = visible_next;
}

std::optional<Stream::HiddenWait> Stream::hidden_wait() const {
  std::lock_guard lock(taps_mu_);
  const uint64_t visible = visible_next_.load(std::memory_order_relaxed);
  if (visible < log_until_) return HiddenWait{log_hidden_ms_, visible};
  if (hidden_.empty()) return std::nullopt;
  return HiddenWait{hidden_.front().second, hidden_.front().first->last};
}

bool Stream::drain(const store::Store* log) {
  for (;;) {
    std::vector<RecordPtr> released;
    std::vector<std::shared_ptr<Tap>> live;
    uint64_t visible;
    {
      std::lock_guard lock(taps_mu_);
      visible = visible_next_.load(std::memory_order_relaxed);
      if (visible >= log_until_) {
        while (!hidden_.empty() && hidden_.front().first->last < bound_) {
          released.push_back(std::move(hidden_.front().first));
          hidden_.pop_front();
        }
        if (released.empty()) {
          draining_ = false;
          return true;
        }
        visible_next_.store(released.back()->last + 1, std::memory_order_release);
        collect_locked(taps_, live);
      } else if (visible >= bound_ || log == nullptr) {
        draining_ = false;
        return visible >= bound_;
      }
    }
    if (released.empty()) {
      // Hidden since before a restart: only the log holds them. Read
      // outside the lock (only the drainer moves the visible head).
      std::vector<store::LogRecord> recs;
      Status s = store::StreamLog::read(*log, meta_.id, visible, kLogRecordsPerStep, kLogBytesPerStep, recs);
      std::lock_guard lock(taps_mu_);
      for (auto& r : recs) {
        // The first may start before `visible` (hold_from's position is a
        // follower's acknowledgement, not a record boundary): taps slice.
        if (!s.ok() || r.first > visible || r.last < visible || r.last >= log_until_ || r.last >= bound_) break;
        std::string_view in = r.payload;
        auto b = engine::decode_batch(in);
        if (!b.ok()) break;
        auto rec = std::make_shared<Record>();
        rec->first = r.first;
        rec->last = r.last;
        rec->batch = std::make_shared<const engine::Batch>(std::move(b).value());
        rec->encoded = std::make_shared<const std::string>(std::move(r.payload));
        visible = r.last + 1;
        released.push_back(std::move(rec));
      }
      if (released.empty()) {
        // The log does not hold what was hidden (trimmed, or a record that
        // straddles the bound): nothing to deliver, the head moves on to
        // what the bound allows or stays.
        if (!s.ok() || recs.empty() || recs.front().first > visible) {
          log_until_ = visible;  // nothing left to read there
          continue;
        }
        draining_ = false;
        return true;
      }
      visible_next_.store(visible, std::memory_order_release);
      collect_locked(taps_, live);
    }
    // Outside the lock, and only here (draining_): the taps see the
    // released records in order.
    for (const auto& r : released)
      for (auto& t : live) t->on_record(r);
  }
}

void Stream::close_moved(const std::string& to) {
  {
    std::lock_guard lock(append_mu_);
    moved_to_ = to;
  }
  close();
}

std::string Stream::moved_to() const {
  std::lock_guard lock(append_mu_);
  return moved_to_;
}

void Stream::close() {
  {
    std::lock_guard lock(append_mu_);
    closed_.store(true, std::memory_order_release);
  }
  std::vector<std::shared_ptr<Tap>> live;
  {
    std::lock_guard lock(taps_mu_);
    collect_locked(taps_, live);
    collect_locked(durable_taps_, live);
    taps_.clear();
    durable_taps_.clear();
    hidden_.clear();
  }
  for (auto& t : live) t->on_stream_closed();
}

void Stream::end_feed(const std::string& cause, const std::string& reason) {
  std::vector<std::shared_ptr<Tap>> live;
  {
    std::lock_guard lock(taps_mu_);
    collect_locked(taps_, live);
    collect_locked(durable_taps_, live);
  }
  for (auto& t : live) t->on_feed_ended(cause, reason);
}

std::string stream_meta_to_json(const StreamMeta& m) {
  JsonOut j;
  j.begin_object();
  j.key("name").str(m.name).key("id").u64(m.id.value);
  j.key("schema").raw(engine::schema_to_json(*m.schema));
  j.key("event_time").str(m.event_time).key("producer").str(m.producer);
  j.key("retention").begin_object();
  j.key("max_tuples").u64(m.retention.max_tuples).key("max_bytes").u64(m.retention.max_bytes);
  j.key("max_age_ms").i64(m.retention.max_age_ms).end_object();
  j.key("created_ms").i64(m.created_ms);
  if (!m.durability.empty()) j.key("durability").str(m.durability);
  j.end_object();
  return j.take();
}

Result<StreamMeta> stream_meta_from_json(std::string_view json) {
  rapidjson::Document d;
  d.Parse(json.data(), json.size());
  if (d.HasParseError() || !d.IsObject())
    return make_error(Errc::corrupt, "catalog: a stream record is not a JSON object");
  auto str = [&](const char* k) -> const rapidjson::Value* {
    auto it = d.FindMember(k);
    return it != d.MemberEnd() && it->value.IsString() ? &it->value : nullptr;
  };
  auto num = [&](const rapidjson::Value& o, const char* k) -> const rapidjson::Value* {
    auto it = o.FindMember(k);
    return it != o.MemberEnd() && it->value.IsNumber() ? &it->value : nullptr;
  };
  StreamMeta m;
  const auto *name = str("name"), *et = str("event_time"), *prod = str("producer");
  const auto* id = num(d, "id");
  const auto* created = num(d, "created_ms");
  auto sit = d.FindMember("schema");
  auto rit = d.FindMember("retention");
  if (!name || !et || !prod || !id || !created || sit == d.MemberEnd() || rit == d.MemberEnd() ||
      !rit->value.IsObject())
    return make_error(Errc::corrupt, "catalog: a stream record lacks a member");
  m.name = name->GetString();
  m.event_time = et->GetString();
  m.producer = prod->GetString();
  m.id.value = id->GetUint64();
  m.created_ms = created->GetInt64();
  auto schema = engine::schema_from_json(sit->value, "$.schema");
  if (!schema.ok()) return make_error(Errc::corrupt, "catalog: " + schema.error().message);
  m.schema = std::make_shared<const engine::Schema>(std::move(schema).value());
  const auto *mt = num(rit->value, "max_tuples"), *mb = num(rit->value, "max_bytes"),
             *ma = num(rit->value, "max_age_ms");
  if (!mt || !mb || !ma) return make_error(Errc::corrupt, "catalog: a stream's retention is incomplete");
  m.retention = {mt->GetUint64(), mb->GetUint64(), ma->GetInt64()};
  if (const auto* dur = str("durability")) m.durability = dur->GetString();
  return m;
}

Status check_stream_name(std::string_view name) {
  auto bad = [&](std::string why) {
    return make_error(Errc::invalid_argument, "stream name '" + std::string(name.substr(0, 80)) + "' " + why);
  };
  if (name.empty()) return bad("is empty");
  if (name.size() > 63) return bad("is longer than 63 characters");
  if (name[0] < 'a' || name[0] > 'z') return bad("must start with a lowercase letter");
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
      return bad("may contain only a-z, 0-9, '-' and '_'");
  if (name.find("--") != std::string_view::npos)
    return bad("contains '--', which is reserved for the internal streams of queries cut across nodes");
  return Status::Ok();
}

}  // namespace entente::broker::detail
