#pragma once
// The node's durable state: one RocksDB instance with a column family per
// concern (docs/architecture.md, "Where state lives"). The store persists
// bytes under keys; it knows nothing of streams' schemas, box types or
// contracts. Callers encode.
//
// Thread-safety: every member function may be called from any thread.
// Lifecycle: open() → use → destroy. Destroying the Store closes RocksDB; the
// caller must have stopped every thread that uses it (and every GroupCommit).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace entente::store {

// Column families. The names on disk are the enumerator names.
enum class Cf : uint8_t { catalog = 0, contracts = 1, checkpoints = 2, log = 3, meta = 4 };
inline constexpr int kCfCount = 5;
std::string_view cf_name(Cf cf) noexcept;

// Whether a write must be on stable storage (WAL fsync'd) before the call
// returns. Anything acknowledged to a client is written with `synced`.
enum class Durability : uint8_t { buffered, synced };

struct StoreOptions {
  std::string path;                       // data directory; created when missing
  size_t write_buffer_bytes = 64u << 20;  // memtable size per column family
  size_t block_cache_bytes = 64u << 20;
};

// An atomic group of writes across column families.
class WriteBatch final {
 public:
  WriteBatch();
  ~WriteBatch();
  WriteBatch(WriteBatch&&) noexcept;
  WriteBatch& operator=(WriteBatch&&) noexcept;

  void put(Cf cf, std::string_view key, std::string_view value);
  // The same with the value given as two pieces, written one after the
  // other without first joining them (a header and a large payload).
  void put(Cf cf, std::string_view key, std::string_view value_head, std::string_view value_tail);
  void erase(Cf cf, std::string_view key);
  // Erases keys in [begin, end).
  void erase_range(Cf cf, std::string_view begin, std::string_view end);
  // Appends every operation of `other` to this batch (group commit).
  void append(const WriteBatch& other);
  size_t count() const noexcept;
  size_t bytes() const noexcept;  // approximate encoded size
  bool empty() const noexcept { return count() == 0; }

 private:
  friend class Store;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// What Store::backup wrote.
struct BackupInfo {
  std::string path;       // the new directory
  uint64_t sequence = 0;  // a RocksDB sequence number the copy contains (every write up to it)
  uint64_t bytes = 0;     // the size of the files in the copy
};

struct StoreStats {
  uint64_t live_bytes = 0;   // approximate on-disk size of all families
  uint64_t wal_syncs = 0;    // fsyncs of the write-ahead log since open
  uint64_t writes = 0;       // write() calls since open
};

class Store final {
 public:
  // Opens (creating when missing) the database at options.path with all
  // column families. Errors: io_error (with RocksDB's message), corrupt;
  // unavailable when another process (or this one) has the store open:
  // the message names the lock file and, when it can tell, the process
  // that holds it ("store '/d/store' is in use by another process (pid
  // 4242), which holds its lock file '/d/store/LOCK'").
  static Result<std::unique_ptr<Store>> open(const StoreOptions& options);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  Status put(Cf cf, std::string_view key, std::string_view value, Durability d);
  Status erase(Cf cf, std::string_view key, Durability d);
  Status write(const WriteBatch& batch, Durability d);
  // nullopt when the key does not exist.
  Result<std::optional<std::string>> get(Cf cf, std::string_view key) const;

  // Visits keys >= `start` that begin with `prefix`, in key order, until `fn`
  // returns false or the prefix ends. `start` empty means `prefix`.
  using Visitor = std::function<bool(std::string_view key, std::string_view value)>;
  Status scan(Cf cf, std::string_view prefix, const Visitor& fn,
              std::string_view start = {}) const;
  // The last key <= `key` that begins with `prefix` (for "the record that
  // contains sequence number N" lookups). nullopt when there is none.
  Result<std::optional<std::pair<std::string, std::string>>> seek_for_prev(
      Cf cf, std::string_view prefix, std::string_view key) const;

  // A consistent copy of the whole store, every column family at one point
  // in its history (a RocksDB checkpoint), written while the store is in
  // use: everything written before the call is in it. `dir` must be an
  // absolute path that does not exist; its parent must. Store::open opens
  // the copy like any store. Table files are hard links when `dir` is on
  // the same filesystem (the copy then costs little space until the store
  // compacts them away), copies otherwise. Blocks for a memtable flush and
  // the copying: call it off latency-sensitive threads. Errors:
  // invalid_argument (a relative path), already_exists, not_found (no
  // parent), io_error.
  Result<BackupInfo> backup(const std::string& dir) const;

  // Approximate bytes on disk + in memtables of keys in [begin, end).
  uint64_t approximate_size(Cf cf, std::string_view begin, std::string_view end) const;
  StoreStats stats() const;
  const std::string& path() const;

 private:
  struct Impl;
  explicit Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Big-endian fixed-width integers so that keys sort numerically.
void put_key_u64(std::string& key, uint64_t v);
uint64_t get_key_u64(std::string_view bytes);  // REQUIRES: bytes.size() >= 8

}  // namespace entente::store
