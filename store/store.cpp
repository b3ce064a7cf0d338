// Store: RocksDB behind the narrow interface of store.h. WriteBatch keeps its
// operations in a compact private encoding (no column family handles exist
// before a Store does); Store::write translates it into one rocksdb::WriteBatch.

#include "store/store.h"

#include <fcntl.h>
#include <unistd.h>

#include <rocksdb/cache.h>
#include <rocksdb/convenience.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/utilities/checkpoint.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <filesystem>
#include <system_error>
#include <utility>

namespace entente::store {
namespace {

// RocksDB's status as an Error: the code a caller branches on, RocksDB's own
// message for the person reading it, and `context` saying what was attempted.
Error to_error(const rocksdb::Status& s, const std::string& context) {
  Errc code = Errc::io_error;
  if (s.IsCorruption()) {
    code = Errc::corrupt;
  } else if (s.IsNotFound()) {
    code = Errc::not_found;
  } else if (s.IsInvalidArgument()) {
    code = Errc::invalid_argument;
  } else if (s.IsNotSupported()) {
    code = Errc::unsupported;
  } else if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain() || s.IsShutdownInProgress() ||
             s.IsIncomplete()) {
    code = Errc::unavailable;
  }
  return make_error(code, context + ": " + s.ToString());
}

constexpr std::array<std::string_view, kCfCount> kCfNames = {"catalog", "contracts",
                                                             "checkpoints", "log", "meta"};

// Operation tags of the WriteBatch encoding:
//   tag (u8) | cf (u8) | varint key size | key [| varint value size | value]
// erase_range stores the end key as its value.
enum class Op : uint8_t { put = 1, erase = 2, erase_range = 3 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Reads what put_varint wrote. The encoding is produced only by WriteBatch in
// this process, so a malformed one is a programming error (asserted).
uint64_t get_varint(std::string_view rep, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    assert(pos < rep.size());
    const auto byte = static_cast<uint8_t>(rep[pos++]);
    v |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) break;
  }
  return v;
}

std::string_view get_slice(std::string_view rep, size_t& pos) {
  const uint64_t n = get_varint(rep, pos);
  assert(pos + n <= rep.size());
  std::string_view s = rep.substr(pos, n);
  pos += n;
  return s;
}

rocksdb::Slice slice(std::string_view s) { return {s.data(), s.size()}; }
std::string_view view(const rocksdb::Slice& s) { return {s.data(), s.size()}; }

// The smallest key greater than every key starting with `prefix`; empty when
// there is none (the prefix is all 0xff bytes).
std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(end.back());
    if (c != 0xff) {
      ++c;
      return end;
    }
    end.pop_back();
  }
  return end;
}

// When RocksDB could not take the store's lock file: who holds it. RocksDB
// locks `LOCK` with a POSIX record lock (fcntl F_SETLK), so F_GETLK names
// the process holding it; a lock held by this very process is invisible to
// F_GETLK, and RocksDB says so itself ("lock hold by current process").
// nullopt when the failure is not about the lock.
std::optional<Error> lock_error(const rocksdb::Status& s, const std::string& path) {
  if (!s.IsIOError()) return std::nullopt;
  // RocksDB's two messages (env/fs_posix.cc, LockFile).
  const std::string text = s.ToString();
  const bool by_us = text.find("lock hold by current process") != std::string::npos;
  if (!by_us && text.find("While lock file") == std::string::npos) return std::nullopt;
  const std::string lock_file = (std::filesystem::path(path) / "LOCK").string();
  if (by_us) {
    return make_error(Errc::unavailable, "store '" + path + "' is open already in this process, which holds its lock file '" +
                                             lock_file + "'");
  }
  std::string holder = "another process";
  if (const int fd = ::open(lock_file.c_str(), O_RDWR | O_CLOEXEC); fd >= 0) {
    struct flock probe {};
    probe.l_type = F_WRLCK;
    probe.l_whence = SEEK_SET;
    if (::fcntl(fd, F_GETLK, &probe) == 0 && probe.l_type != F_UNLCK && probe.l_pid > 0) {
      holder += " (pid " + std::to_string(probe.l_pid) + ")";
    }
    ::close(fd);
  }
  return make_error(Errc::unavailable, "store '" + path + "' is in use by " + holder + ", which holds its lock file '" +
                                           lock_file + "' (RocksDB: " + text + ")");
}

}  // namespace

std::string_view cf_name(Cf cf) noexcept {
  const auto i = static_cast<size_t>(cf);
  return i < kCfNames.size() ? kCfNames[i] : std::string_view("unknown");
}

void put_key_u64(std::string& key, uint64_t v) {
  for (int shift = 56; shift >= 0; shift -= 8) key.push_back(static_cast<char>(v >> shift));
}

uint64_t get_key_u64(std::string_view bytes) {
  assert(bytes.size() >= 8);
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(bytes[i]);
  return v;
}

// ---------------------------------------------------------------------------
// WriteBatch

// The operations live in parts shared between batches: append() shares the
// other batch's parts instead of copying them, which is what lets GroupCommit
// merge hundreds of 100 KB records without copying them. A part is written
// only while this batch is its sole owner; otherwise a new part is started.
struct WriteBatch::Impl {
  std::vector<std::shared_ptr<std::string>> parts;
  size_t count = 0;
  size_t bytes = 0;

  std::string& tail() {
    if (parts.empty() || parts.back().use_count() != 1) {
      parts.push_back(std::make_shared<std::string>());
    }
    return *parts.back();
  }

  // `value` is null for an erase; `value_tail` continues the value.
  void add(Op op, Cf cf, std::string_view key, const std::string_view* value,
           std::string_view value_tail = {}) {
    std::string& rep = tail();
    const size_t before = rep.size();
    const size_t value_size = value != nullptr ? value->size() + value_tail.size() : 0;
    // One growth step for the whole operation, not one per piece.
    if (rep.capacity() < before + 24 + key.size() + value_size) {
      rep.reserve(std::max(2 * rep.capacity(), before + 24 + key.size() + value_size));
    }
    rep.push_back(static_cast<char>(op));
    rep.push_back(static_cast<char>(cf));
    put_varint(rep, key.size());
    rep.append(key);
    if (value != nullptr) {
      put_varint(rep, value_size);
      rep.append(*value);
      rep.append(value_tail);
    }
    bytes += rep.size() - before;
    ++count;
  }
};

WriteBatch::WriteBatch() : impl_(std::make_unique<Impl>()) {}
WriteBatch::~WriteBatch() = default;
// A moved-from batch holds no Impl (so that moving never allocates); it is
// empty and becomes usable again on the next put.
WriteBatch::WriteBatch(WriteBatch&& other) noexcept = default;
WriteBatch& WriteBatch::operator=(WriteBatch&& other) noexcept = default;

void WriteBatch::put(Cf cf, std::string_view key, std::string_view value) {
  if (!impl_) impl_ = std::make_unique<Impl>();
  impl_->add(Op::put, cf, key, &value);
}
void WriteBatch::put(Cf cf, std::string_view key, std::string_view value_head,
                     std::string_view value_tail) {
  if (!impl_) impl_ = std::make_unique<Impl>();
  impl_->add(Op::put, cf, key, &value_head, value_tail);
}
void WriteBatch::erase(Cf cf, std::string_view key) {
  if (!impl_) impl_ = std::make_unique<Impl>();
  impl_->add(Op::erase, cf, key, nullptr);
}
void WriteBatch::erase_range(Cf cf, std::string_view begin, std::string_view end) {
  if (!impl_) impl_ = std::make_unique<Impl>();
  impl_->add(Op::erase_range, cf, begin, &end);
}
void WriteBatch::append(const WriteBatch& other) {
  if (!other.impl_ || other.impl_->count == 0) return;
  if (!impl_) impl_ = std::make_unique<Impl>();
  // Copy the list first: appending a batch to itself must not read the
  // vector it grows.
  const std::vector<std::shared_ptr<std::string>> shared = other.impl_->parts;
  impl_->parts.insert(impl_->parts.end(), shared.begin(), shared.end());
  impl_->count += other.impl_->count;
  impl_->bytes += other.impl_->bytes;
}
size_t WriteBatch::count() const noexcept { return impl_ ? impl_->count : 0; }
size_t WriteBatch::bytes() const noexcept { return impl_ ? impl_->bytes : 0; }

// ---------------------------------------------------------------------------
// Store

struct Store::Impl {
  std::string path;
  std::unique_ptr<rocksdb::DB> db;
  std::array<rocksdb::ColumnFamilyHandle*, kCfCount> handles{};
  // `default` and families found on disk that this version does not know:
  // opened because RocksDB requires it, never used, released on close.
  std::vector<rocksdb::ColumnFamilyHandle*> unused;
  std::atomic<uint64_t> writes{0};
  std::atomic<uint64_t> wal_syncs{0};

  ~Impl() {
    if (!db) return;
    for (auto* h : handles) {
      if (h != nullptr) db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    }
    for (auto* h : unused) db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    db->Close().PermitUncheckedError();
  }

  rocksdb::ColumnFamilyHandle* handle(Cf cf) const { return handles[static_cast<size_t>(cf)]; }

  // "<what> in column family '<cf>' of store '<path>': <RocksDB's message>"
  Error error(const rocksdb::Status& s, std::string_view what, std::optional<Cf> cf) const {
    std::string context(what);
    if (cf) context += " in column family '" + std::string(cf_name(*cf)) + "'";
    return to_error(s, context + " of store '" + path + "'");
  }

  Status finish_write(const rocksdb::Status& s, Durability d, std::string_view what,
                      std::optional<Cf> cf) {
    writes.fetch_add(1, std::memory_order_relaxed);
    if (!s.ok()) return error(s, what, cf);
    if (d == Durability::synced) wal_syncs.fetch_add(1, std::memory_order_relaxed);
    return Status::Ok();
  }

  static rocksdb::WriteOptions write_options(Durability d) {
    rocksdb::WriteOptions wo;
    wo.sync = d == Durability::synced;
    return wo;
  }
};

Store::Store(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Store::~Store() = default;

Result<std::unique_ptr<Store>> Store::open(const StoreOptions& options) {
  namespace fs = std::filesystem;
  if (options.path.empty()) return make_error(Errc::invalid_argument, "store path is empty");
  std::error_code ec;
  if (fs::exists(options.path, ec) && !fs::is_directory(options.path, ec)) {
    return make_error(Errc::io_error,
                      "store path '" + options.path + "' exists and is not a directory");
  }
  fs::create_directories(options.path, ec);
  if (ec) {
    return make_error(Errc::io_error, "cannot create store directory '" + options.path +
                                          "': " + ec.message());
  }

  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  // Every write reaches the OS at once, so a process crash loses nothing;
  // `synced` writes additionally fsync before returning.
  db_options.manual_wal_flush = false;
  // Buffered writes (a replicated stream's, a checkpoint's) are handed to
  // the disk as they accumulate rather than all at the next `synced`
  // write: a node that had copied 10 MB of checkpoints paid 45-90 ms of
  // fsync at the first synced write of a fragment's take-over (the pause of
  // a move, docs/cluster.md). The same for table files.
  db_options.wal_bytes_per_sync = 512u << 10;
  db_options.bytes_per_sync = 1u << 20;
  db_options.max_background_jobs = 2;
  db_options.keep_log_file_num = 4;
  // A rarely written family (catalog) would otherwise pin old WAL files
  // until its memtable fills: bound the WAL so they get flushed.
  db_options.max_total_wal_size = std::max<uint64_t>(4 * options.write_buffer_bytes, 64u << 20);

  rocksdb::BlockBasedTableOptions table;
  table.block_cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  rocksdb::ColumnFamilyOptions cf_options;
  cf_options.write_buffer_size = options.write_buffer_bytes;
  cf_options.level_compaction_dynamic_level_bytes = true;
  cf_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  const auto supported = rocksdb::GetSupportedCompressions();
  cf_options.compression =
      std::find(supported.begin(), supported.end(), rocksdb::kLZ4Compression) != supported.end()
          ? rocksdb::kLZ4Compression
          : rocksdb::kNoCompression;

  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  descriptors.emplace_back(rocksdb::kDefaultColumnFamilyName, cf_options);
  for (auto name : kCfNames) descriptors.emplace_back(std::string(name), cf_options);
  // A database written by a newer version may hold more families; RocksDB
  // refuses to open it unless every family is named. (Fails harmlessly when
  // the database does not exist yet.)
  std::vector<std::string> existing;
  if (rocksdb::DB::ListColumnFamilies(db_options, options.path, &existing).ok()) {
    for (const auto& name : existing) {
      const bool known = std::any_of(descriptors.begin(), descriptors.end(),
                                     [&](const auto& d) { return d.name == name; });
      if (!known) descriptors.emplace_back(name, cf_options);
    }
  }

  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  const rocksdb::Status s = rocksdb::DB::Open(db_options, options.path, descriptors, &handles, &raw);
  if (!s.ok()) {
    if (auto locked = lock_error(s, options.path)) return *locked;
    return to_error(s, "cannot open store at '" + options.path + "'");
  }

  auto impl = std::make_unique<Impl>();
  impl->path = options.path;
  impl->db.reset(raw);
  // handles[i] belongs to descriptors[i]: 0 is `default`, 1..5 ours, then
  // any unknown ones.
  for (size_t i = 0; i < handles.size(); ++i) {
    if (i >= 1 && i <= static_cast<size_t>(kCfCount)) {
      impl->handles[i - 1] = handles[i];
    } else {
      impl->unused.push_back(handles[i]);
    }
  }
  return std::unique_ptr<Store>(new Store(std::move(impl)));
}

Status Store::put(Cf cf, std::string_view key, std::string_view value, Durability d) {
  const auto s = impl_->db->Put(Impl::write_options(d), impl_->handle(cf), slice(key), slice(value));
  return impl_->finish_write(s, d, "put", cf);
}

Status Store::erase(Cf cf, std::string_view key, Durability d) {
  const auto s = impl_->db->Delete(Impl::write_options(d), impl_->handle(cf), slice(key));
  return impl_->finish_write(s, d, "erase", cf);
}

namespace {

// Translates one part of a WriteBatch into `wb`. Stops at the first invalid
// operation, so that nothing of a bad batch is written.
Status translate(std::string_view rep, rocksdb::WriteBatch& wb,
                        const std::array<rocksdb::ColumnFamilyHandle*, kCfCount>& handles) {
  size_t pos = 0;
  while (pos < rep.size()) {
    const auto op = static_cast<Op>(rep[pos]);
    const auto cf = static_cast<Cf>(rep[pos + 1]);
    pos += 2;
    if (static_cast<size_t>(cf) >= static_cast<size_t>(kCfCount)) {
      return make_error(Errc::invalid_argument, "write batch names column family " +
                                                    std::to_string(static_cast<int>(cf)) +
                                                    ", which does not exist");
    }
    auto* h = handles[static_cast<size_t>(cf)];
    const std::string_view key = get_slice(rep, pos);
    rocksdb::Status s;
    switch (op) {
      case Op::put:
        s = wb.Put(h, slice(key), slice(get_slice(rep, pos)));
        break;
      case Op::erase:
        s = wb.Delete(h, slice(key));
        break;
      case Op::erase_range: {
        const std::string_view end = get_slice(rep, pos);
        if (key > end) {
          return make_error(Errc::invalid_argument,
                            "erase_range in column family '" + std::string(cf_name(cf)) +
                                "': the begin key sorts after the end key");
        }
        if (key != end) s = wb.DeleteRange(h, slice(key), slice(end));
        break;
      }
      default:
        assert(false && "unknown write batch op");
        return make_error(Errc::corrupt, "write batch holds an unknown operation");
    }
    if (!s.ok()) return to_error(s, "building a write batch for '" + std::string(cf_name(cf)) + "'");
  }
  return Status::Ok();
}

}  // namespace

Status Store::write(const WriteBatch& batch, Durability d) {
  // One RocksDB batch per thread, cleared and reused: a group commit's
  // multi-megabyte batch then costs one copy, not a fresh allocation whose
  // pages fault in on every write.
  thread_local rocksdb::WriteBatch wb;
  constexpr size_t kKeepBytes = 32u << 20;
  wb.Clear();
  Status built;
  if (batch.impl_) {
    for (const auto& part : batch.impl_->parts) {
      built = translate(*part, wb, impl_->handles);
      if (!built.ok()) break;
    }
  }
  rocksdb::Status s;
  if (built.ok()) s = impl_->db->Write(Impl::write_options(d), &wb);
  // Do not keep an unusually large buffer alive for the thread's lifetime.
  if (wb.GetDataSize() > kKeepBytes) {
    wb = rocksdb::WriteBatch();
  } else {
    wb.Clear();
  }
  if (!built.ok()) return built;
  return impl_->finish_write(s, d, "write of a batch", std::nullopt);
}

Result<std::optional<std::string>> Store::get(Cf cf, std::string_view key) const {
  std::string value;
  const auto s = impl_->db->Get(rocksdb::ReadOptions(), impl_->handle(cf), slice(key), &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  if (!s.ok()) return impl_->error(s, "get", cf);
  return std::optional<std::string>(std::move(value));
}

Status Store::scan(Cf cf, std::string_view prefix, const Visitor& fn,
                   std::string_view start) const {
  rocksdb::ReadOptions ro;
  // The bound lets RocksDB stop at the prefix's end instead of reading (and
  // skipping tombstones) beyond it.
  const std::string upper = prefix_end(prefix);
  rocksdb::Slice upper_slice(upper);
  if (!upper.empty()) ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(impl_->db->NewIterator(ro, impl_->handle(cf)));
  const std::string_view from = start.empty() || start < prefix ? prefix : start;
  for (it->Seek(slice(from)); it->Valid(); it->Next()) {
    const std::string_view key = view(it->key());
    if (key.substr(0, prefix.size()) != prefix) break;
    if (!fn(key, view(it->value()))) break;
  }
  if (!it->status().ok()) return impl_->error(it->status(), "scan", cf);
  return Status::Ok();
}

Result<std::optional<std::pair<std::string, std::string>>> Store::seek_for_prev(
    Cf cf, std::string_view prefix, std::string_view key) const {
  using Found = std::optional<std::pair<std::string, std::string>>;
  rocksdb::ReadOptions ro;
  rocksdb::Slice lower(prefix.data(), prefix.size());
  if (!prefix.empty()) ro.iterate_lower_bound = &lower;
  std::unique_ptr<rocksdb::Iterator> it(impl_->db->NewIterator(ro, impl_->handle(cf)));
  if (key < prefix) return Found();
  if (key.substr(0, prefix.size()) == prefix) {
    it->SeekForPrev(slice(key));
  } else {
    // `key` lies beyond every key with the prefix: the answer is the last of them.
    const std::string end = prefix_end(prefix);
    if (end.empty()) {
      it->SeekToLast();
    } else {
      it->SeekForPrev(slice(end));
      if (it->Valid() && view(it->key()) == end) it->Prev();
    }
  }
  if (!it->status().ok()) return impl_->error(it->status(), "seek_for_prev", cf);
  if (!it->Valid()) return Found();
  const std::string_view found = view(it->key());
  if (found.substr(0, prefix.size()) != prefix) return Found();
  return Found(std::in_place, std::string(found), std::string(view(it->value())));
}

Result<BackupInfo> Store::backup(const std::string& dir) const {
  namespace fs = std::filesystem;
  const fs::path target(dir);
  if (dir.empty() || !target.is_absolute()) {
    return make_error(Errc::invalid_argument, "a backup directory must be an absolute path, not '" + dir + "'");
  }
  std::error_code ec;
  if (fs::exists(fs::symlink_status(target, ec))) {
    return make_error(Errc::already_exists, "backup directory '" + dir + "' exists already; name a new one");
  }
  const fs::path parent = target.parent_path();
  if (!fs::is_directory(parent, ec)) {
    return make_error(Errc::not_found, "the parent of backup directory '" + dir + "' ('" + parent.string() +
                                           "') is not a directory");
  }
  rocksdb::Checkpoint* raw = nullptr;
  rocksdb::Status s = rocksdb::Checkpoint::Create(impl_->db.get(), &raw);
  if (!s.ok()) return impl_->error(s, "backup to '" + dir + "'", std::nullopt);
  std::unique_ptr<rocksdb::Checkpoint> checkpoint(raw);
  BackupInfo info;
  info.path = dir;
  // log_size_for_flush 0: every memtable is flushed first, so the copy's
  // table files hold every write and its WAL only what came during the call.
  s = checkpoint->CreateCheckpoint(dir, 0, &info.sequence);
  if (!s.ok()) return impl_->error(s, "backup to '" + dir + "'", std::nullopt);
  for (const auto& entry : fs::recursive_directory_iterator(target, ec)) {
    std::error_code size_ec;
    const auto size = entry.is_regular_file(size_ec) ? entry.file_size(size_ec) : 0;
    if (!size_ec) info.bytes += size;
  }
  return info;
}

uint64_t Store::approximate_size(Cf cf, std::string_view begin, std::string_view end) const {
  rocksdb::SizeApproximationOptions o;
  o.include_memtables = true;
  o.include_files = true;
  const rocksdb::Range range(slice(begin), slice(end));
  uint64_t size = 0;
  if (!impl_->db->GetApproximateSizes(o, impl_->handle(cf), &range, 1, &size).ok()) return 0;
  return size;
}

StoreStats Store::stats() const {
  StoreStats st;
  for (auto* h : impl_->handles) {
    uint64_t v = 0;
    if (impl_->db->GetIntProperty(h, rocksdb::DB::Properties::kLiveSstFilesSize, &v)) {
      st.live_bytes += v;
    }
    if (impl_->db->GetIntProperty(h, rocksdb::DB::Properties::kCurSizeAllMemTables, &v)) {
      st.live_bytes += v;
    }
  }
  st.wal_syncs = impl_->wal_syncs.load(std::memory_order_relaxed);
  st.writes = impl_->writes.load(std::memory_order_relaxed);
  return st;
}

const std::string& Store::path() const { return impl_->path; }

}  // namespace entente::store
