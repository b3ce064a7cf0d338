// GroupCommit: a queue of (batch, callback) under one mutex, drained by one
// committer thread that merges what is queued into one Store::write.

#include "store/group_commit.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace entente::store {

struct GroupCommit::Impl {
  struct Entry {
    WriteBatch batch;
    Done done;
    size_t bytes = 0;
    Durability durability = Durability::synced;
  };

  Impl(Store& s, GroupCommitOptions o) : store(s), options(o) {}

  Store& store;
  const GroupCommitOptions options;

  mutable std::mutex mutex;
  std::condition_variable work_cv;  // committer: something queued, or stopping
  std::condition_variable room_cv;  // Admission::wait submitters: bytes freed, or stopping
  std::deque<Entry> queue;          // REQUIRES: mutex held (as every field below)
  size_t pending_bytes = 0;         // queued + being written
  bool started = false;
  bool stopping = false;
  GroupCommitStats stats;
  std::mutex stop_mutex;  // serialises stop(): one caller joins, later ones return
  std::thread committer;

  // Admits a batch when it fits, or when nothing is pending (a batch larger
  // than the bound must still be writable).
  bool has_room(size_t bytes) const {
    return pending_bytes == 0 || pending_bytes + bytes <= options.max_pending_bytes;
  }

  // Takes the next group: at least one entry, then more while the group
  // stays within max_group_bytes. Returns empty when stopped and drained.
  std::vector<Entry> take_group() {
    std::unique_lock lock(mutex);
    work_cv.wait(lock, [&] { return !queue.empty() || stopping; });
    std::vector<Entry> group;
    size_t bytes = 0;
    while (!queue.empty() &&
           (group.empty() || bytes + queue.front().bytes <= options.max_group_bytes)) {
      bytes += queue.front().bytes;
      group.push_back(std::move(queue.front()));
      queue.pop_front();
    }
    return group;
  }

  void commit(std::vector<Entry>& group) {
    size_t bytes = 0;
    Durability durability = Durability::buffered;
    for (const auto& e : group) {
      bytes += e.bytes;
      if (e.durability == Durability::synced) durability = Durability::synced;
    }
    const auto t0 = std::chrono::steady_clock::now();
    Status status;
    if (group.size() == 1) {
      status = store.write(group.front().batch, durability);
    } else {
      WriteBatch merged = std::move(group.front().batch);
      for (size_t i = 1; i < group.size(); ++i) merged.append(group[i].batch);
      status = store.write(merged, durability);
    }
    const auto ns = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count());
    {
      std::lock_guard lock(mutex);
      pending_bytes -= bytes;
      ++stats.groups;
      if (durability == Durability::synced) ++stats.synced_groups;
      stats.last_group_ns = ns;
      stats.total_write_ns += ns;
      if (status.ok()) {
        stats.batches += group.size();
        stats.bytes += bytes;
      }
    }
    room_cv.notify_all();
    // Outside the lock: a callback may submit (with Admission::reject).
    for (auto& e : group) {
      if (e.done) e.done(status);
    }
  }

  void run() {
    for (;;) {
      std::vector<Entry> group = take_group();
      if (group.empty()) return;
      commit(group);
    }
  }
};

GroupCommit::GroupCommit(Store& store, GroupCommitOptions options)
    : impl_(std::make_unique<Impl>(store, options)) {}

GroupCommit::~GroupCommit() { stop(); }

void GroupCommit::start() {
  std::lock_guard lock(impl_->mutex);
  if (impl_->started || impl_->stopping) return;
  impl_->started = true;
  impl_->committer = std::thread([impl = impl_.get()] { impl->run(); });
}

void GroupCommit::stop() {
  std::lock_guard stop_lock(impl_->stop_mutex);
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->work_cv.notify_all();
  impl_->room_cv.notify_all();
  if (impl_->committer.joinable()) {
    impl_->committer.join();
  } else {
    // Never started: acknowledge what was queued on this thread, so that
    // stop() keeps its promise either way.
    impl_->run();
  }
}

Status GroupCommit::submit(WriteBatch batch, Done done, Admission admission,
                           std::optional<Durability> durability) {
  const size_t bytes = batch.bytes();
  {
    std::unique_lock lock(impl_->mutex);
    if (!impl_->stopping && !impl_->has_room(bytes)) {
      if (admission == Admission::reject) {
        ++impl_->stats.rejected;
        return make_error(Errc::unavailable,
                          "ingest queue full (" + std::to_string(impl_->pending_bytes) +
                              " bytes queued, limit " +
                              std::to_string(impl_->options.max_pending_bytes) + ")");
      }
      impl_->room_cv.wait(lock, [&] { return impl_->stopping || impl_->has_room(bytes); });
    }
    if (impl_->stopping) {
      return make_error(Errc::unavailable, "the write queue is stopping; nothing more is accepted");
    }
    impl_->pending_bytes += bytes;
    impl_->queue.push_back(
        Impl::Entry{std::move(batch), std::move(done), bytes, durability.value_or(impl_->options.durability)});
  }
  impl_->work_cv.notify_one();
  return Status::Ok();
}

GroupCommitStats GroupCommit::stats() const {
  std::lock_guard lock(impl_->mutex);
  GroupCommitStats s = impl_->stats;
  s.pending_bytes = impl_->pending_bytes;
  return s;
}

}  // namespace entente::store
