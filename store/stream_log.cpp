// Stream logs and chunked checkpoints: key layouts over the Store. Every value
// read back is checked before use; a malformed one is Errc::corrupt.

#include "store/stream_log.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>

namespace entente::store {
namespace {

constexpr char kLogTag = 'L';
constexpr size_t kLogPrefixBytes = 1 + 8;
constexpr size_t kLogKeyBytes = kLogPrefixBytes + 8;
constexpr size_t kLogHeaderBytes = 8 + 8;  // last seq, append time

std::string log_prefix(StreamId stream) {
  std::string p;
  p.reserve(kLogKeyBytes);
  p.push_back(kLogTag);
  put_key_u64(p, stream.value);
  return p;
}

std::string log_key(StreamId stream, uint64_t first) {
  std::string k = log_prefix(stream);
  put_key_u64(k, first);
  return k;
}

// The first key after every key of the stream's log.
std::string log_end(StreamId stream) {
  if (stream.value == std::numeric_limits<uint64_t>::max()) return std::string(1, kLogTag + 1);
  return log_prefix(StreamId{stream.value + 1});
}

Error corrupt_record(StreamId stream, std::string_view key, const std::string& why) {
  std::string where = "stream " + std::to_string(stream.value);
  if (key.size() == kLogKeyBytes) where += " record " + std::to_string(get_key_u64(key.substr(9)));
  return make_error(Errc::corrupt, "stream log of " + where + " is corrupt: " + why);
}

// Decodes a record's header; the payload is the rest of `value`.
Result<LogRecord> decode_header(StreamId stream, std::string_view key, std::string_view value) {
  if (key.size() != kLogKeyBytes) {
    return corrupt_record(stream, key, "key of " + std::to_string(key.size()) +
                                           " bytes, expected " + std::to_string(kLogKeyBytes));
  }
  if (value.size() < kLogHeaderBytes) {
    return corrupt_record(stream, key, "value of " + std::to_string(value.size()) +
                                           " bytes is shorter than the " +
                                           std::to_string(kLogHeaderBytes) + "-byte header");
  }
  LogRecord r;
  r.first = get_key_u64(key.substr(kLogPrefixBytes));
  r.last = get_key_u64(value);
  r.append_ms = static_cast<int64_t>(get_key_u64(value.substr(8)));
  if (r.last < r.first) {
    return corrupt_record(stream, key, "last sequence " + std::to_string(r.last) +
                                           " precedes first " + std::to_string(r.first));
  }
  return r;
}

uint64_t tuple_count(uint64_t first, uint64_t last) {
  const uint64_t span = last - first;
  return span == std::numeric_limits<uint64_t>::max() ? span : span + 1;
}

// --- producers ------------------------------------------------------------
constexpr char kProducerTag = 'P';

std::string producers_prefix(StreamId stream) {
  std::string p;
  p.push_back(kProducerTag);
  put_key_u64(p, stream.value);
  return p;
}

std::string producers_end(StreamId stream) {
  if (stream.value == std::numeric_limits<uint64_t>::max()) return std::string(1, kProducerTag + 1);
  return producers_prefix(StreamId{stream.value + 1});
}

std::string producer_prefix(StreamId stream, std::string_view producer) {
  assert(!producer.empty() && producer.size() <= StreamLog::kMaxProducerBytes);
  std::string p = producers_prefix(stream);
  p.push_back(static_cast<char>(producer.size()));
  p.append(producer);
  return p;
}

std::string producer_key(StreamId stream, std::string_view producer, uint64_t producer_seq) {
  std::string k = producer_prefix(stream, producer);
  put_key_u64(k, producer_seq);
  return k;
}

// --- checkpoints ----------------------------------------------------------
// Key: owner | '\0' | id (u64 BE) | chunk (u32 BE)
// Value: chunk count of the checkpoint (u32 BE) | chunk bytes. The count lets
// a reader tell a complete checkpoint from a damaged one.
constexpr size_t kCheckpointSuffixBytes = 1 + 8 + 4;
constexpr size_t kChunkHeaderBytes = 4;

void put_u32(std::string& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>(v >> shift));
}

uint32_t get_u32(std::string_view b) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<uint8_t>(b[i]);
  return v;
}

std::string owner_prefix(std::string_view owner) {
  assert(owner.find('\0') == std::string_view::npos);
  std::string p(owner);
  p.push_back('\0');
  return p;
}

std::string checkpoint_key(std::string_view owner, uint64_t id, uint32_t chunk) {
  std::string k = owner_prefix(owner);
  put_key_u64(k, id);
  put_u32(k, chunk);
  return k;
}

struct ChunkKey {
  std::string_view owner;
  uint64_t id = 0;
  uint32_t chunk = 0;
};

Result<ChunkKey> parse_chunk_key(std::string_view key) {
  if (key.size() < kCheckpointSuffixBytes || key[key.size() - kCheckpointSuffixBytes] != '\0') {
    return make_error(Errc::corrupt, "checkpoint key of " + std::to_string(key.size()) +
                                         " bytes does not have the owner|0|id|chunk layout");
  }
  const size_t n = key.size() - kCheckpointSuffixBytes;
  return ChunkKey{key.substr(0, n), get_key_u64(key.substr(n + 1)), get_u32(key.substr(n + 9))};
}

Error corrupt_checkpoint(std::string_view owner, uint64_t id, const std::string& why) {
  return make_error(Errc::corrupt, "checkpoint " + std::to_string(id) + " of '" +
                                       std::string(owner) + "' is corrupt: " + why);
}

}  // namespace

// ---------------------------------------------------------------------------
// StreamLog

void StreamLog::add_append(WriteBatch& batch, StreamId stream, uint64_t first, uint64_t last,
                           int64_t append_ms, std::string_view payload) {
  assert(last >= first);
  std::string header;
  put_key_u64(header, last);
  put_key_u64(header, static_cast<uint64_t>(append_ms));
  batch.put(Cf::log, log_key(stream, first), header, payload);
}

Status StreamLog::read(const Store& store, StreamId stream, uint64_t from, size_t max_records,
                       size_t max_bytes, std::vector<LogRecord>& out) {
  const std::string prefix = log_prefix(stream);
  std::string start = log_key(stream, from);
  // The record containing `from` begins at or before it.
  ENTENTE_ASSIGN_OR_RETURN(auto before, store.seek_for_prev(Cf::log, prefix, start));
  if (before) {
    ENTENTE_ASSIGN_OR_RETURN(LogRecord r, decode_header(stream, before->first, before->second));
    if (r.last >= from) start = std::move(before->first);
  }
  size_t records = 0;
  size_t bytes = 0;
  Status failure;
  ENTENTE_RETURN_IF_ERROR(store.scan(
      Cf::log, prefix,
      [&](std::string_view key, std::string_view value) {
        auto r = decode_header(stream, key, value);
        if (!r.ok()) {
          failure = r.error();
          return false;
        }
        const std::string_view payload = value.substr(kLogHeaderBytes);
        // At least one record, then stop before exceeding the byte budget.
        if (records > 0 && bytes + payload.size() > max_bytes) return false;
        r->payload.assign(payload);
        out.push_back(std::move(*r));
        ++records;
        bytes += payload.size();
        return records < max_records && bytes < max_bytes;
      },
      start));
  return failure;
}

Result<std::optional<LogRecord>> StreamLog::first(const Store& store, StreamId stream) {
  std::optional<Result<LogRecord>> found;
  ENTENTE_RETURN_IF_ERROR(store.scan(Cf::log, log_prefix(stream),
                                     [&](std::string_view key, std::string_view value) {
                                       found.emplace(decode_header(stream, key, value));
                                       return false;
                                     }));
  if (!found) return std::optional<LogRecord>();
  if (!found->ok()) return found->error();
  return std::optional<LogRecord>(std::move(found->value()));
}

Result<std::optional<LogRecord>> StreamLog::last(const Store& store, StreamId stream) {
  ENTENTE_ASSIGN_OR_RETURN(
      auto found, store.seek_for_prev(Cf::log, log_prefix(stream),
                                      log_key(stream, std::numeric_limits<uint64_t>::max())));
  if (!found) return std::optional<LogRecord>();
  ENTENTE_ASSIGN_OR_RETURN(LogRecord r, decode_header(stream, found->first, found->second));
  return std::optional<LogRecord>(std::move(r));
}

Result<TrimResult> StreamLog::trim(Store& store, StreamId stream, const Retention& retention,
                                   uint64_t pin, int64_t now_ms,
                                   std::optional<uint64_t> retained_bytes) {
  if (retention.max_age_ms < 0) {
    return make_error(Errc::invalid_argument,
                      "retention max_age_ms must be >= 0, got " +
                          std::to_string(retention.max_age_ms));
  }
  TrimResult result;
  ENTENTE_ASSIGN_OR_RETURN(auto newest, last(store, stream));
  if (!newest) return result;
  const std::string prefix = log_prefix(stream);

  // Payload bytes retained now. Only counted when bounded and the caller
  // does not know them: it reads the whole log.
  uint64_t bytes = retained_bytes.value_or(0);
  Status failure;
  if (retention.max_bytes != 0 && !retained_bytes) {
    ENTENTE_RETURN_IF_ERROR(store.scan(Cf::log, prefix, [&](std::string_view k, std::string_view v) {
      auto r = decode_header(stream, k, v);
      if (!r.ok()) {
        failure = r.error();
        return false;
      }
      bytes += v.size() - kLogHeaderBytes;
      return true;
    }));
    ENTENTE_RETURN_IF_ERROR(failure);
  }
  // Records older than this are expired (none when the subtraction overflows).
  int64_t cutoff = std::numeric_limits<int64_t>::min();
  if (retention.max_age_ms != 0 && __builtin_sub_overflow(now_ms, retention.max_age_ms, &cutoff)) {
    cutoff = std::numeric_limits<int64_t>::min();
  }

  std::optional<uint64_t> last_removed_first;
  ENTENTE_RETURN_IF_ERROR(store.scan(Cf::log, prefix, [&](std::string_view k, std::string_view v) {
    auto r = decode_header(stream, k, v);
    if (!r.ok()) {
      failure = r.error();
      return false;
    }
    // Records appended after `newest` was read are not accounted for: keep them.
    const bool counted = r->first <= newest->last;
    const uint64_t retained_tuples = counted ? tuple_count(r->first, newest->last) : 0;
    const uint64_t payload = v.size() - kLogHeaderBytes;
    const bool over = counted && ((retention.max_tuples != 0 && retained_tuples > retention.max_tuples) ||
                                  (retention.max_bytes != 0 && bytes > retention.max_bytes) ||
                                  (retention.max_age_ms != 0 && r->append_ms < cutoff));
    if (!over || r->last >= pin) {
      result.first_retained = r->first;
      return false;
    }
    ++result.records_removed;
    result.tuples_removed += tuple_count(r->first, r->last);
    result.bytes_removed += payload;
    bytes -= std::min(bytes, payload);
    last_removed_first = r->first;
    return true;
  }));
  ENTENTE_RETURN_IF_ERROR(failure);
  if (retention.max_bytes != 0) result.bytes_retained = bytes;
  if (!last_removed_first) return result;

  // One range ending just after the last removed record's key: a record
  // appended meanwhile (a larger first seq) lies outside it.
  WriteBatch batch;
  const std::string end = *last_removed_first == std::numeric_limits<uint64_t>::max()
                              ? log_end(stream)
                              : log_key(stream, *last_removed_first + 1);
  batch.erase_range(Cf::log, log_key(stream, 0), end);
  ENTENTE_RETURN_IF_ERROR(store.write(batch, Durability::synced));
  return result;
}

Result<TrimResult> StreamLog::erase_before(Store& store, StreamId stream, uint64_t seq) {
  TrimResult result;
  ENTENTE_ASSIGN_OR_RETURN(auto newest, last(store, stream));
  if (!newest) return result;
  seq = std::min(seq, newest->first);
  Status failure;
  std::optional<uint64_t> last_removed_first;
  ENTENTE_RETURN_IF_ERROR(store.scan(Cf::log, log_prefix(stream), [&](std::string_view k, std::string_view v) {
    auto r = decode_header(stream, k, v);
    if (!r.ok()) {
      failure = r.error();
      return false;
    }
    if (r->first >= seq) {
      result.first_retained = r->first;
      return false;
    }
    ++result.records_removed;
    result.tuples_removed += tuple_count(r->first, r->last);
    result.bytes_removed += v.size() - kLogHeaderBytes;
    last_removed_first = r->first;
    return true;
  }));
  ENTENTE_RETURN_IF_ERROR(failure);
  if (!last_removed_first) return result;
  // Ends just after the last removed record's key, as trim does: seq <=
  // the newest record's first, so last_removed_first + 1 cannot overflow.
  WriteBatch batch;
  batch.erase_range(Cf::log, log_key(stream, 0), log_key(stream, *last_removed_first + 1));
  ENTENTE_RETURN_IF_ERROR(store.write(batch, Durability::synced));
  return result;
}

Status StreamLog::drop(Store& store, StreamId stream) {
  WriteBatch batch;
  batch.erase_range(Cf::log, log_prefix(stream), log_end(stream));
  batch.erase_range(Cf::log, producers_prefix(stream), producers_end(stream));
  return store.write(batch, Durability::synced);
}

void StreamLog::add_producer_batch(WriteBatch& batch, StreamId stream, std::string_view producer,
                                   uint64_t producer_seq, uint64_t first, uint64_t last, int64_t append_ms) {
  assert(producer_seq >= 1);
  std::string value;
  put_key_u64(value, first);
  put_key_u64(value, last);
  put_key_u64(value, static_cast<uint64_t>(append_ms));
  batch.put(Cf::log, producer_key(stream, producer, producer_seq), value);
}

void StreamLog::add_forget_producer_batch(WriteBatch& batch, StreamId stream, std::string_view producer,
                                          uint64_t producer_seq) {
  batch.erase(Cf::log, producer_key(stream, producer, producer_seq));
}

void StreamLog::add_producer_floor(WriteBatch& batch, StreamId stream, std::string_view producer,
                                   uint64_t floor) {
  std::string value;
  put_key_u64(value, floor);
  batch.put(Cf::log, producer_key(stream, producer, 0), value);
}

void StreamLog::add_forget_producer(WriteBatch& batch, StreamId stream, std::string_view producer) {
  const std::string begin = producer_prefix(stream, producer);
  std::string end = begin;
  // The producer's keys are begin | u64; begin | 0xFF.. follows them all,
  // and no other producer's key starts with it (the length byte differs or
  // the name does).
  end.append(8, '\xff');
  end.push_back('\xff');
  batch.erase_range(Cf::log, begin, end);
}

Status StreamLog::producer_batches(const Store& store, StreamId stream, std::vector<ProducerBatch>& out) {
  const std::string prefix = producers_prefix(stream);
  Status failure;
  ENTENTE_RETURN_IF_ERROR(store.scan(Cf::log, prefix, [&](std::string_view key, std::string_view value) {
    const auto bad = [&](const std::string& why) {
      failure = make_error(Errc::corrupt, "producer state of stream " + std::to_string(stream.value) +
                                              " is corrupt: " + why);
      return false;
    };
    std::string_view rest = key.substr(prefix.size());
    if (rest.empty()) return bad("a key without a producer");
    const size_t len = static_cast<uint8_t>(rest[0]);
    if (len == 0 || len > kMaxProducerBytes || rest.size() != 1 + len + 8)
      return bad("a key of " + std::to_string(key.size()) + " bytes");
    ProducerBatch b;
    b.producer.assign(rest.substr(1, len));
    b.producer_seq = get_key_u64(rest.substr(1 + len));
    if (b.producer_seq == 0) {
      if (value.size() != 8) return bad("a floor of " + std::to_string(value.size()) + " bytes");
      b.first = get_key_u64(value);
    } else {
      if (value.size() != 24) return bad("an entry of " + std::to_string(value.size()) + " bytes");
      b.first = get_key_u64(value);
      b.last = get_key_u64(value.substr(8));
      b.append_ms = static_cast<int64_t>(get_key_u64(value.substr(16)));
      if (b.last < b.first) return bad("last sequence precedes first");
    }
    out.push_back(std::move(b));
    return true;
  }));
  return failure;
}

uint64_t StreamLog::approximate_bytes(const Store& store, StreamId stream) {
  return store.approximate_size(Cf::log, log_prefix(stream), log_end(stream));
}

// ---------------------------------------------------------------------------
// Checkpoints

void Checkpoints::add_put(WriteBatch& batch, std::string_view owner, uint64_t id,
                          std::string_view bytes) {
  // An empty snapshot is still one (empty) chunk, so that the checkpoint exists.
  const size_t chunks = bytes.empty() ? 1 : (bytes.size() + kChunkBytes - 1) / kChunkBytes;
  assert(chunks <= std::numeric_limits<uint32_t>::max());
  std::string value;
  for (size_t i = 0; i < chunks; ++i) {
    const std::string_view part = bytes.substr(std::min(bytes.size(), i * kChunkBytes), kChunkBytes);
    value.clear();
    value.reserve(kChunkHeaderBytes + part.size());
    put_u32(value, static_cast<uint32_t>(chunks));
    value.append(part);
    batch.put(Cf::checkpoints, checkpoint_key(owner, id, static_cast<uint32_t>(i)), value);
  }
}

void Checkpoints::add_erase_before(WriteBatch& batch, std::string_view owner, uint64_t id) {
  std::string end = owner_prefix(owner);
  put_key_u64(end, id);
  batch.erase_range(Cf::checkpoints, owner_prefix(owner), end);
}

void Checkpoints::add_erase_all(WriteBatch& batch, std::string_view owner) {
  // owner|'\x01' follows every owner|'\0'|... key.
  std::string end(owner);
  end.push_back('\x01');
  batch.erase_range(Cf::checkpoints, owner_prefix(owner), end);
}

Result<std::optional<Checkpoints::Entry>> Checkpoints::latest(const Store& store,
                                                              std::string_view owner) {
  const std::string prefix = owner_prefix(owner);
  ENTENTE_ASSIGN_OR_RETURN(
      auto newest,
      store.seek_for_prev(Cf::checkpoints, prefix,
                          checkpoint_key(owner, std::numeric_limits<uint64_t>::max(),
                                         std::numeric_limits<uint32_t>::max())));
  if (!newest) return std::optional<Entry>();
  ENTENTE_ASSIGN_OR_RETURN(ChunkKey last_key, parse_chunk_key(newest->first));
  Entry entry;
  entry.id = last_key.id;
  std::string id_prefix = prefix;
  put_key_u64(id_prefix, entry.id);

  uint32_t expected_chunk = 0;
  uint32_t chunk_count = 0;
  Status failure;
  ENTENTE_RETURN_IF_ERROR(store.scan(
      Cf::checkpoints, id_prefix, [&](std::string_view key, std::string_view value) {
        if (key.size() != id_prefix.size() + 4 || value.size() < kChunkHeaderBytes) {
          failure = corrupt_checkpoint(owner, entry.id,
                                       "chunk " + std::to_string(expected_chunk) + " is malformed (" +
                                           std::to_string(value.size()) + "-byte value)");
          return false;
        }
        const uint32_t chunk = get_u32(key.substr(id_prefix.size()));
        const uint32_t count = get_u32(value);
        if (chunk != expected_chunk || (expected_chunk > 0 && count != chunk_count) ||
            chunk >= count) {
          failure = corrupt_checkpoint(owner, entry.id,
                                       "found chunk " + std::to_string(chunk) + " of " +
                                           std::to_string(count) + " where chunk " +
                                           std::to_string(expected_chunk) + " was expected");
          return false;
        }
        chunk_count = count;
        entry.bytes.append(value.substr(kChunkHeaderBytes));
        ++expected_chunk;
        return true;
      }));
  ENTENTE_RETURN_IF_ERROR(failure);
  if (expected_chunk != chunk_count) {
    return corrupt_checkpoint(owner, entry.id,
                              "has " + std::to_string(expected_chunk) + " of its " +
                                  std::to_string(chunk_count) + " chunks");
  }
  return std::optional<Entry>(std::move(entry));
}

Result<std::vector<Checkpoints::Info>> Checkpoints::list(const Store& store) {
  std::vector<Info> out;
  Status failure;
  ENTENTE_RETURN_IF_ERROR(
      store.scan(Cf::checkpoints, {}, [&](std::string_view key, std::string_view value) {
        auto parsed = parse_chunk_key(key);
        if (!parsed.ok()) {
          failure = parsed.error();
          return false;
        }
        if (value.size() < kChunkHeaderBytes) {
          failure = corrupt_checkpoint(parsed->owner, parsed->id,
                                       "chunk " + std::to_string(parsed->chunk) + " has a " +
                                           std::to_string(value.size()) + "-byte value");
          return false;
        }
        if (out.empty() || out.back().owner != parsed->owner || out.back().id != parsed->id) {
          out.push_back(Info{std::string(parsed->owner), parsed->id, 0});
        }
        out.back().bytes += value.size() - kChunkHeaderBytes;
        return true;
      }));
  ENTENTE_RETURN_IF_ERROR(failure);
  return out;
}

}  // namespace entente::store
