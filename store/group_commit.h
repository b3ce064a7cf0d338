#pragma once
// Group commit: many threads submit WriteBatches; one committer thread writes
// everything queued as one RocksDB write with one WAL fsync, then runs the
// submitters' callbacks in submission order. This is what makes synced
// ingest fast: the fsync cost is shared by every request waiting for it.
//
// Ordering: batches are applied, and callbacks run, in the order submit()
// was called. A caller that needs "sequence numbers in log order" assigns
// them and submits under its own lock.
//
// Bounds: the bytes queued and not yet written are limited; submit() with
// Admission::reject answers Errc::unavailable when the queue is over its bound
// (an API turns that into 503 + Retry-After), Admission::wait blocks until
// there is room (for internal producers such as query outputs, which must
// not drop what they computed).
//
// Lifecycle: start() → submit()* → stop(). stop() refuses new submissions,
// writes and acknowledges everything already queued, and joins the thread.
// The destructor calls stop().

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "base/result.h"
#include "store/store.h"

namespace entente::store {

enum class Admission : uint8_t { reject, wait };

struct GroupCommitOptions {
  size_t max_pending_bytes = 64u << 20;  // queued and not yet written
  size_t max_group_bytes = 16u << 20;    // written by one RocksDB write
  Durability durability = Durability::synced;
};

struct GroupCommitStats {
  uint64_t groups = 0;          // RocksDB writes
  uint64_t synced_groups = 0;   // of which synced (one fsync each)
  uint64_t batches = 0;         // submitted batches written
  uint64_t bytes = 0;           // bytes written
  uint64_t rejected = 0;        // submit() calls answered `unavailable`
  uint64_t pending_bytes = 0;   // queued now
  uint64_t last_group_ns = 0;   // duration of the last write + sync
  uint64_t total_write_ns = 0;  // sum of all write + sync durations
};

class GroupCommit final {
 public:
  // Runs on the committer thread after the batch is durable (ok) or failed.
  // Must be short and must not call submit() with Admission::wait.
  using Done = std::function<void(const Status&)>;

  GroupCommit(Store& store, GroupCommitOptions options);
  ~GroupCommit();
  GroupCommit(const GroupCommit&) = delete;
  GroupCommit& operator=(const GroupCommit&) = delete;

  void start();
  void stop();

  // Errors: unavailable (over the bound with Admission::reject, or stopped).
  // On error `done` is not called. `durability`, when given, overrides the
  // options' for this batch: a group is synced when any batch in it asks to
  // be (a synced write makes every earlier write durable too).
  Status submit(WriteBatch batch, Done done, Admission admission = Admission::reject,
                std::optional<Durability> durability = std::nullopt);

  GroupCommitStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace entente::store
