#pragma once
// Stream logs in the `log` column family: each stream's tuples, appended in
// records (one record = one ingested batch, tuples first..last), kept until
// retention removes them. Subscribers resume from any retained sequence
// number; query runners replay from their checkpoint's positions.
//
// Key:   'L' | stream id (u64 BE) | first seq (u64 BE)
// Value: last seq (u64 BE) | append time ms (u64 BE) | payload (opaque bytes)
//
// The payload is opaque to the store (the broker puts an encoded engine batch
// there). All functions are stateless and thread-safe; ordering of appends
// is the caller's (see GroupCommit).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "store/store.h"

namespace entente::store {

struct StreamId {
  uint64_t value = 0;
  friend bool operator==(StreamId, StreamId) = default;
};

struct LogRecord {
  uint64_t first = 0;  // first sequence number in the record
  uint64_t last = 0;   // last sequence number (inclusive); last >= first
  int64_t append_ms = 0;
  std::string payload;
};

struct Retention {
  uint64_t max_tuples = 0;  // 0: unlimited
  uint64_t max_bytes = 0;   // 0: unlimited (approximate: payload bytes)
  int64_t max_age_ms = 0;   // 0: unlimited
};

struct TrimResult {
  uint64_t records_removed = 0;
  uint64_t tuples_removed = 0;
  uint64_t bytes_removed = 0;
  uint64_t first_retained = 0;  // first seq still in the log (0 when empty)
  // Payload bytes of the records still in the log that were counted (those
  // committed before the trim began): the caller's running count when it
  // passed one, else what the trim counted. 0 when retention has no byte bound.
  uint64_t bytes_retained = 0;
};

class StreamLog {
 public:
  // Adds the append of one record to `batch`. REQUIRES: last >= first.
  static void add_append(WriteBatch& batch, StreamId stream, uint64_t first, uint64_t last,
                         int64_t append_ms, std::string_view payload);

  // Reads records in order, starting with the record that contains `from`
  // (or the first retained record after it), until `max_records` records or
  // `max_bytes` payload bytes (at least one record is returned when any
  // exists). Appends to `out`.
  static Status read(const Store& store, StreamId stream, uint64_t from, size_t max_records,
                     size_t max_bytes, std::vector<LogRecord>& out);

  // The first / last record's header (payload left empty); nullopt when the
  // stream's log is empty.
  static Result<std::optional<LogRecord>> first(const Store& store, StreamId stream);
  static Result<std::optional<LogRecord>> last(const Store& store, StreamId stream);

  // Removes the oldest records while any retention bound is exceeded, never
  // removing a record whose last seq >= `pin` (the smallest position a
  // consumer still needs; pass UINT64_MAX when nothing pins). Synced.
  // With a byte bound the payload bytes in the log must be known: pass the
  // caller's running count as `retained_bytes`, or nullopt to have them
  // counted by reading the whole log (then keep result.bytes_retained and
  // add what is appended, so later checks read only what they remove).
  static Result<TrimResult> trim(Store& store, StreamId stream, const Retention& retention,
                                 uint64_t pin, int64_t now_ms,
                                 std::optional<uint64_t> retained_bytes = std::nullopt);

  // Removes every record that starts before `seq` (a query fragment's state
  // stream once a checkpoint makes them useless; docs/cluster.md, "A
  // fragment's state stream"), never the newest record (it carries the
  // stream's next sequence number across restarts). Synced. The result
  // counts what was removed; first_retained is the first seq still there.
  static Result<TrimResult> erase_before(Store& store, StreamId stream, uint64_t seq);

  // Removes the whole log of a stream (stream deleted). Synced.
  static Status drop(Store& store, StreamId stream);

  // Payload bytes of the stream's retained records (approximate, from
  // RocksDB's size estimates).
  static uint64_t approximate_bytes(const Store& store, StreamId stream);

  // --- Idempotent publishers (docs/api.md, "Publishing exactly once").
  // What a stream remembers of the batches publishers named: for producer P
  // and its batch number N, the sequence numbers the batch was stored
  // under. Written in the same WriteBatch as the batch's record, so that a
  // record and the memory of who sent it are durable together or not at
  // all; kept apart from the records, so that retention trimming a record
  // does not forget that it was stored. drop() removes them with the log.
  //
  // Key:   'P' | stream id (u64 BE) | producer length (u8) | producer | N (u64 BE)
  // Value: first seq (u64 BE) | last seq (u64 BE) | append time ms (u64 BE)
  // N = 0 (numbers start at 1) holds the producer's floor instead: every
  // number up to it is forgotten. Value: floor (u64 BE).
  struct ProducerBatch {
    std::string producer;
    uint64_t producer_seq = 0;  // 0: this entry is the floor
    uint64_t first = 0;         // the floor, when producer_seq == 0
    uint64_t last = 0;
    int64_t append_ms = 0;
  };
  static constexpr size_t kMaxProducerBytes = 64;
  // REQUIRES: 1 <= producer.size() <= kMaxProducerBytes, producer_seq >= 1.
  static void add_producer_batch(WriteBatch& batch, StreamId stream, std::string_view producer,
                                 uint64_t producer_seq, uint64_t first, uint64_t last, int64_t append_ms);
  static void add_forget_producer_batch(WriteBatch& batch, StreamId stream, std::string_view producer,
                                        uint64_t producer_seq);
  static void add_producer_floor(WriteBatch& batch, StreamId stream, std::string_view producer,
                                 uint64_t floor);
  // Forgets everything of one producer.
  static void add_forget_producer(WriteBatch& batch, StreamId stream, std::string_view producer);
  // Every entry of the stream's producers, by producer then number.
  static Status producer_batches(const Store& store, StreamId stream, std::vector<ProducerBatch>& out);
};

// Box/query checkpoints in the `checkpoints` column family, chunked so that a
// large snapshot is not one huge RocksDB value.
// Key: owner | '\0' | id (u64 BE) | chunk (u32 BE)
class Checkpoints {
 public:
  static constexpr size_t kChunkBytes = 1u << 20;
  // REQUIRES: owner contains no '\0'.
  static void add_put(WriteBatch& batch, std::string_view owner, uint64_t id,
                      std::string_view bytes);
  // Removes every checkpoint of `owner` with an id < `id`.
  static void add_erase_before(WriteBatch& batch, std::string_view owner, uint64_t id);
  // Removes every checkpoint of `owner`.
  static void add_erase_all(WriteBatch& batch, std::string_view owner);

  struct Entry {
    uint64_t id = 0;
    std::string bytes;
  };
  // The newest complete checkpoint of `owner`; nullopt when there is none.
  static Result<std::optional<Entry>> latest(const Store& store, std::string_view owner);

  struct Info {
    std::string owner;
    uint64_t id = 0;
    uint64_t bytes = 0;
  };
  static Result<std::vector<Info>> list(const Store& store);
};

}  // namespace entente::store
