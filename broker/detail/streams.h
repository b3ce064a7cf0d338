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
//
// Two heads (docs/cluster.md, "Replicated stream logs"): the durable head
// (committed_next) is what the local log holds; the visible head
// (visible_next) is what readers see. They are equal unless the replication
// code bounds visibility (set_visible_bound) to what the stream's in-sync
// followers hold: records between the two heads then wait in the stream,
// and reach the ordinary taps, in order and without gaps, when the bound
// moves. Only the exporters serving the stream's own followers follow the
// durable head (TapHead::durable), so that copying never waits on itself.

#include <atomic>
#include <cstdint>
#include <deque>
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

// Which head a tap follows (Stream::add_tap).
enum class TapHead : uint8_t {
  visible,  // what readers may see: subscribers, queries, exports, fragments
  durable,  // what the local log holds: only the copies of the stream's followers
};

// Follows a stream's committed records. on_record runs one call at a time,
// in sequence order, with no gaps, on the group-commit thread or, for a
// tap of the visible head of a stream whose visibility waits for its
// followers, on the thread that released the record (a link thread, the
// replication thread): it must be short (queue, signal) and must not call
// back into the stream's visibility.
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
  // When an append is acknowledged (docs/cluster.md, "Durability per
  // stream"): "fsync", "replicated" or "process"; empty for the node's
  // ingest_durability (a stream from before the choice existed).
  std::string durability;
};

// Owned through shared_ptr (the registry's StreamPtr): an append's group
// commit keeps the stream alive until its callback has run, even when the
// stream is deleted (or discarded after a failover) meanwhile.
class Stream final : public std::enable_shared_from_this<Stream> {
 public:
  Stream(StreamMeta meta, uint64_t next_seq);
  const StreamMeta& meta() const { return meta_; }
  // How this stream's appends reach the disk: synced (fsync) or buffered
  // (the write-ahead log, in the OS's cache), or the group commit's default
  // (nullopt). From meta().durability; a follower's copy takes its
  // stream's (set_durability).
  std::optional<store::Durability> durability() const;
  void set_durability(std::optional<store::Durability> d);
  // The durable head: 1 + the last tuple the local log holds. What the
  // stream's followers copy, and what appends and recovery count on; not
  // what readers may see (visible_next).
  uint64_t committed_next() const { return committed_next_.load(std::memory_order_acquire); }
  // The visible head: 1 + the last tuple readers (subscribers, queries,
  // exports) may see; <= committed_next(), equal to it while visibility is
  // not bounded. Never goes down.
  uint64_t visible_next() const { return visible_next_.load(std::memory_order_acquire); }

  // --- Visibility (docs/cluster.md, "Replicated stream logs").
  static constexpr uint64_t kNoBound = UINT64_MAX;
  // Records whose last tuple is below `bound` may be visible; kNoBound
  // (the default, and a stream without in-sync followers): every durable
  // record. The records it releases reach the visible taps now, on this
  // thread, in order. The bound may go down (a follower joins); the visible
  // head does not. `log` is where records hidden since before a restart
  // (hold_from) are read from; without it they stay hidden and the call
  // returns false (the caller asks again from a thread that may read the
  // store).
  bool set_visible_bound(uint64_t bound, const store::Store* log = nullptr);
  // At start-up, before any tap or append: the log's tuples from
  // `visible_next` on stay hidden until set_visible_bound releases them.
  void hold_from(uint64_t visible_next);
  // The oldest record past the visible head, when one waits: since when
  // (steady clock, ms) and the last tuple a follower must hold for it to be
  // released.
  struct HiddenWait {
    int64_t since_ms = 0;
    uint64_t through = 0;
  };
  std::optional<HiddenWait> hidden_wait() const;
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

  // Adds a tap following `head`; records reaching that head from now on
  // reach it. Returns that head at the moment it was added (so the caller
  // knows where live records start).
  uint64_t add_tap(const std::shared_ptr<Tap>& tap, TapHead head = TapHead::visible);
  void remove_tap(const Tap* tap);
  void close();  // calls on_stream_closed on every tap, refuses appends
  // The same, for a log this node drops because the stream is led by node
  // `to` now (a move or a failover): its taps can tell their readers where
  // to go (moved_to()).
  void close_moved(const std::string& to);
  std::string moved_to() const;
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
  // Delivers the hidden records the bound releases, in order, until none
  // is left to release. REQUIRES: draining_ set by this caller, taps_mu_
  // not held. False when records must be read from the log and `log` is null.
  bool drain(const store::Store* log);
  // REQUIRES: taps_mu_. Whether a hidden record may be released now.
  bool releasable_locked() const;
  // REQUIRES: taps_mu_. The live taps of `list` appended to `out`.
  static void collect_locked(std::vector<std::weak_ptr<Tap>>& list, std::vector<std::shared_ptr<Tap>>& out);
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
  std::atomic<int> durability_{-1};  // -1: the group commit's; else a store::Durability
  std::atomic<uint64_t> visible_next_;  // stored under taps_mu_ (add_tap reads it there)
  std::atomic<int64_t> log_bytes_{-1};  // -1: not counted yet
  std::atomic<bool> closed_{false};
  std::string moved_to_;  // REQUIRES: append_mu_ (set before the taps hear of the close)
  // Taps and visibility. Taps are called outside it, by one thread at a
  // time per head: the committer for durable taps and, while nothing is
  // hidden and the bound is kNoBound, for visible taps too; otherwise the
  // thread that set draining_.
  mutable std::mutex taps_mu_;
  std::vector<std::weak_ptr<Tap>> taps_;          // REQUIRES: taps_mu_; visible head
  std::vector<std::weak_ptr<Tap>> durable_taps_;  // REQUIRES: taps_mu_
  uint64_t bound_ = kNoBound;                     // REQUIRES: taps_mu_
  // Durable records past the visible head, in order, with when each was
  // hidden (steady ms); before them, up to log_until_, records hidden since
  // before a restart that only the log holds.
  std::deque<std::pair<RecordPtr, int64_t>> hidden_;  // REQUIRES: taps_mu_
  uint64_t log_until_ = 0;                            // REQUIRES: taps_mu_
  int64_t log_hidden_ms_ = 0;                         // REQUIRES: taps_mu_; when hold_from hid them
  bool draining_ = false;                             // REQUIRES: taps_mu_
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
// The store durability of a stream's durability mode: "fsync" synced,
// "replicated" and "process" buffered; nullopt for "" (the node's).
std::optional<store::Durability> durability_of(std::string_view mode);
Result<StreamMeta> stream_meta_from_json(std::string_view json);

// Validates a stream name: [a-z][a-z0-9_-]*, at most 63 characters.
Status check_stream_name(std::string_view name);

}  // namespace entente::broker::detail
