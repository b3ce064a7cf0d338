#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// Streams of one node: their catalog entries, their sequence numbers, their
// committed records and the taps (subscribers, query inputs) that follow
// them live. Ingest assigns sequence numbers and submits the record to the
// group commit under the stream's lock, so the log holds every stream's
// tuples in sequence order; the record becomes visible (committed head moves,
// taps see it) only after it is durable.

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "broker/config.h"
#include "broker/metrics.h"
#include "engine/batch.h"
#include "engine/types.h"
#include "store/group_commit.h"
#include "store/store.h"
#include "store/stream_log.h"

namespace entente::broker::detail {

// One durable record of a stream: tuples first..last.
struct Record {
  uint64_t first = 0;
  uint64_t last = 0;
  std::shared_ptr<const engine::Batch> batch;    // seqs first..last
  std::shared_ptr<const std::string> encoded;    // engine binary encoding of batch
  size_t rows() const { return static_cast<size_t>(last - first + 1); }
  // The tuples as NDJSON lines ({"_seq":..,"_time":..,fields}), rendered
  // once and shared by every JSON subscriber.
  const std::string& ndjson() const;

 private:
  mutable std::once_flag ndjson_once_;
  mutable std::string ndjson_;
};
using RecordPtr = std::shared_ptr<const Record>;

// Follows a stream's committed records. on_record runs on the group-commit
// thread, in sequence order, with no gaps: it must be short (queue, signal).
class Tap {
 public:
  virtual ~Tap() = default;
  virtual void on_record(const RecordPtr& record) = 0;
  // The stream is being deleted.
  virtual void on_stream_closed() = 0;
  // The stream's feed stopped: an import's owner refused or ended it, and
  // records come again only if the import is opened again. The stream stays
  // readable. `cause` says why in a few words, first thing ("revoked c-…
  // by acme"), for a WebSocket close reason's 123 bytes; `reason` is the
  // whole text.
  virtual void on_feed_ended(const std::string& cause, const std::string& reason) {
    (void)cause;
    (void)reason;
  }
};

// A publisher's name for one batch (docs/api.md, "Publishing exactly once"):
// who sends it and its number for it.
struct ProducerTag {
  std::string id;    // 1..64 of [A-Za-z0-9._:-]
  uint64_t seq = 0;  // >= 1
};

// A named batch as the nodes of a domain copy it (docs/cluster.md,
// "Replicated stream logs"): the publisher's name for it, the tuples it was
// stored under, and the floor of its producer (every number up to it is
// forgotten).
struct NamedRecord {
  ProducerTag tag;
  uint64_t first = 0;
  uint64_t last = 0;
  uint64_t floor = 0;
};

// The answer to an append: where the batch's tuples are, and whether they
// were stored by an earlier send of the same batch.
struct Appended {
  uint64_t first = 0;
  uint64_t last = 0;
  bool duplicate = false;
};

struct StreamMeta {
  std::string name;
  store::StreamId id;
  engine::SchemaPtr schema;
  std::string event_time;     // empty: ingest time
  std::string producer;       // "api" or "query:NAME"
  store::Retention retention;
  int64_t created_ms = 0;
};

class Stream final {
 public:
  Stream(StreamMeta meta, uint64_t next_seq);
  const StreamMeta& meta() const { return meta_; }
  // Next sequence number to be made visible (= 1 + last committed).
  uint64_t committed_next() const { return committed_next_.load(std::memory_order_acquire); }
  bool closed() const { return closed_.load(std::memory_order_acquire); }

  // Assigns sequence numbers to `batch` (rows must be > 0), appends it to the
  // log through `gc`, and, once durable, makes it visible and calls `done`
  // with the record. Sequence numbers are released when the submission is
  // refused (Errc::unavailable). `extra` operations (a query's journal) are
  // written in the same atomic write.
  using Done = std::function<void(const Status&, const RecordPtr&)>;
  Status append(engine::Batch batch, store::GroupCommit& gc, store::Admission admission,
                store::WriteBatch extra, Done done);

  // The same for a stream whose numbers another node assigns (an import's
  // mirror): `batch` holds tuples first.. first + rows - 1 of the owner's
  // numbering. `first` must be the next number, except while the stream has
  // never held a tuple, when it may start anywhere (the owner had trimmed
  // what came before). conflict otherwise.
  // `encoded`, when given, is the engine encoding of `batch` exactly as it
  // is (sequence numbers first.. included), e.g. the bytes that arrived from
  // the owner: stored as they are instead of encoding the batch again.
  Status append_at(uint64_t first, engine::Batch batch, store::GroupCommit& gc,
                   store::Admission admission, Done done,
                   std::shared_ptr<const std::string> encoded = nullptr);
  // The same with `extra` operations (an import's position) written in the
  // same atomic write.
  Status append_at(uint64_t first, engine::Batch batch, store::GroupCommit& gc,
                   store::Admission admission, store::WriteBatch extra, Done done,
                   std::shared_ptr<const std::string> encoded = nullptr);
  // Next sequence number append_at expects.
  uint64_t next_seq() const;

  // --- Idempotent appends. Per producer the stream remembers the
  // sequence numbers of its last kProducerWindow stored batches (in memory
  // and in the log family, written atomically with each record), for at
  // most kMaxProducers producers (the least recently used is forgotten).
  static constexpr size_t kProducerWindow = 64;
  static constexpr size_t kMaxProducers = 1024;
  using AppendedDone = std::function<void(const Status&, const Appended&)>;

  // Answers a batch `tag` names that the stream knows of: stored (`done` is
  // called now with duplicate = true), still being written (`done` is called
  // with its outcome once it is durable), or older than what is remembered
  // of the producer (`done` now with Errc::conflict). Returns false and
  // leaves `done` alone when the batch is new.
  bool recall(const ProducerTag& tag, AppendedDone& done);
  // Appends `batch` unless recall() knows it: then answers as recall does.
  // Errors as append(); on error `done` is not called.
  Status append_once(engine::Batch batch, const ProducerTag& tag, store::GroupCommit& gc,
                     store::Admission admission, AppendedDone done);
  // The remembered producers, read from the store at start-up.
  // REQUIRES: no append has begun.
  void load_producers(std::vector<store::StreamLog::ProducerBatch> entries);
  size_t producer_count() const;
  // append_at for a copy of a stream another node of the domain leads:
  // also remembers `named` (the batches the leader's publishers named
  // whose last tuple is among these) as append_once would have, window and
  // floors included, written in the same atomic write as the tuples, so
  // that recall() answers their retries once this stream is the leader's
  // and load_producers() finds them after a restart. A batch already
  // remembered is left as it is.
  Status append_at_named(uint64_t first, engine::Batch batch, store::GroupCommit& gc,
                         store::Admission admission, store::WriteBatch extra, std::vector<NamedRecord> named,
                         Done done, std::shared_ptr<const std::string> encoded = nullptr);
  // Appends to `out` the named batches remembered (stored or being
  // written) whose last tuple is in first..last, by ascending last: what a
  // copy needs of the tuples first..last.
  void named_batches(uint64_t first, uint64_t last, std::vector<NamedRecord>& out) const;

  // Adds a tap; records committed from now on reach it. Returns the
  // committed head at the moment it was added (so the caller knows where
  // live records start).
  uint64_t add_tap(const std::shared_ptr<Tap>& tap);
  void remove_tap(const Tap* tap);
  void close();  // calls on_stream_closed on every tap, refuses appends
  // Calls on_feed_ended(cause, reason) on every tap (an import's mirror
  // whose owner refused or ended the import).
  void end_feed(const std::string& cause, const std::string& reason);

  Counter* tuples_in = nullptr;   // set by the registry
  Counter* bytes_in = nullptr;

  // Payload bytes in the stream's log, for retention by bytes, so that a
  // retention check reads only the records it removes. Unknown (nullopt)
  // until the first check has counted them; then kept up to date by every
  // commit and trim. Approximate by the records committed while the first
  // count ran (they are left out, so retention keeps slightly more).
  std::optional<uint64_t> log_bytes() const;
  void set_log_bytes(uint64_t bytes);
  void trimmed_log_bytes(uint64_t bytes);

 private:
  void publish(const RecordPtr& record);
  // REQUIRES: append_mu_. Appends with sequence numbers first.., first
  // being next_seq_.
  Status append_locked(uint64_t first, engine::Batch batch, store::GroupCommit& gc,
                       store::Admission admission, store::WriteBatch extra, Done done,
                       std::shared_ptr<const std::string> encoded = nullptr);

  StreamMeta meta_;
  // What is remembered of one producer.
  struct Producer {
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> stored;  // its number -> first, last
    std::map<uint64_t, std::vector<AppendedDone>> pending;     // being written -> retries waiting
    uint64_t floor = 0;  // every number <= floor is forgotten
    uint64_t used = 0;   // recency (producer_tick_ when last used)
  };
  enum class Recall : uint8_t { unknown, stored, pending, forgotten };
  // REQUIRES: producers_mu_. Adds `done` to the waiters when pending.
  Recall recall_locked(const ProducerTag& tag, Appended& found, uint64_t& floor, AppendedDone& done);
  // Called on the committer thread when a named batch is durable or failed.
  void producer_done(const ProducerTag& tag, const Status& st, const Appended& a, const AppendedDone& done);
  // What remembering new batches changes in memory once their write is
  // submitted (in the write already): numbers out of the window,
  // producers' new floors, producers forgotten whole.
  struct Remembering {
    std::vector<std::pair<std::string, uint64_t>> evicted;  // producer, number
    std::map<std::string, uint64_t> floors;
    std::vector<std::string> victims;
  };
  // REQUIRES: producers_mu_. Remembers batch `tag` (tuples first..last) as
  // being written and adds to `extra` its entry and what falls out of the
  // window (the producer's floor raised to at least `floor`), or the least
  // recently used producer when there are too many.
  void remember_locked(const ProducerTag& tag, uint64_t first, uint64_t last, uint64_t floor,
                       store::WriteBatch& extra, Remembering& r);
  // REQUIRES: producers_mu_. The write was submitted: applies `r`.
  void remembered_locked(const Remembering& r);
  // REQUIRES: producers_mu_. The write was refused: forgets batch `tag`
  // (ending at `last`); returns the retries that waited for it.
  std::vector<AppendedDone> unremember_locked(const ProducerTag& tag, uint64_t last);
  // REQUIRES: producers_mu_.
  void erase_named_locked(uint64_t last, const std::string& producer, uint64_t seq);

  mutable std::mutex append_mu_;        // orders seq assignment with submission
  uint64_t next_seq_;                   // REQUIRES: append_mu_
  bool ever_appended_;                  // REQUIRES: append_mu_
  std::atomic<uint64_t> committed_next_;
  std::atomic<int64_t> log_bytes_{-1};  // -1: not counted yet
  std::atomic<bool> closed_{false};
  std::mutex taps_mu_;
  std::vector<std::weak_ptr<Tap>> taps_;
  // After append_mu_ when both are held; alone on the committer thread
  // (which must never wait for append_mu_: an appender holding it may wait
  // for the committer).
  mutable std::mutex producers_mu_;
  std::map<std::string, Producer, std::less<>> producers_;  // REQUIRES: producers_mu_
  uint64_t producer_tick_ = 0;                               // REQUIRES: producers_mu_
  // The batches of producers_ (stored or being written) by their last
  // tuple, so that a copy's reader finds those of a range without a scan.
  struct NamedAt {
    std::string producer;
    uint64_t seq = 0;
    uint64_t first = 0;
  };
  std::map<uint64_t, NamedAt> named_by_last_;  // REQUIRES: producers_mu_
};
using StreamPtr = std::shared_ptr<Stream>;

// Catalog record of a stream, as JSON in the `catalog` family under
// "stream/<name>".
std::string stream_meta_to_json(const StreamMeta& m);
Result<StreamMeta> stream_meta_from_json(std::string_view json);

// Validates a stream name: [a-z][a-z0-9_-]*, at most 63 characters.
Status check_stream_name(std::string_view name);

}  // namespace entente::broker::detail
