#include "broker/detail/query.h"

#include <chrono>
#include <cstdio>
#include <future>
#include <numeric>
#include <thread>

#include "base/log.h"
#include "engine/codec.h"
#include "engine/fragments.h"
#include "engine/serde.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"
#include "store/stream_log.h"

namespace entente::broker::detail {

namespace {

constexpr size_t kTapRecords = 64;        // live records kept per input
constexpr int kStepsPerRun = 64;          // bounded work per scheduling
constexpr size_t kMaxPendingJournal = 4096;
constexpr size_t kMaxHeldRows = 64 * 1024;  // output rows a run holds back for one flush
constexpr size_t kMaxRowsPerRecord = 8192;  // rows of one output record
constexpr uint8_t kCheckpointVersion = 1;
// How long an output waits for its journal to be replicated when the
// answer is "unavailable" (the node has not read the domain's catalog yet
// after a restart, or etcd cannot be told), asking again every
// kStateRetryMs, before the runner fails.
constexpr int64_t kStateRetryMs = 200;
constexpr int64_t kStateGiveUpMs = 15'000;
// How long stopped_state waits for the rows it counts to reach the logs of
// its outputs (appends already submitted to the group commit).
constexpr auto kStoppedOutputsWait = std::chrono::seconds(10);

int64_t wall_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::string journal_prefix(uint64_t query_id) {
  std::string k = "J";
  store::put_key_u64(k, query_id);
  return k;
}

std::string journal_key(uint64_t query_id, uint64_t seq) {
  std::string k = journal_prefix(query_id);
  store::put_key_u64(k, seq);
  return k;
}

std::string checkpoint_owner(const QueryMeta& m) { return "query/" + m.name; }

// Rows [offset, offset + count) of `b`; shares columns when it is all of b.
engine::Batch slice(const engine::Batch& b, size_t offset, size_t count) {
  if (offset == 0 && count == b.rows()) return b;
  std::vector<uint32_t> rows(count);
  std::iota(rows.begin(), rows.end(), static_cast<uint32_t>(offset));
  return b.take(rows);
}

// Appends one state row to `b`.
void add_state_row(engine::BatchBuilder& b, int64_t kind, int64_t a, int64_t bb, int64_t c, int64_t d,
                   std::string_view data, int64_t now_ms) {
  b.column(0).ints.push_back(kind);
  b.column(1).ints.push_back(a);
  b.column(2).ints.push_back(bb);
  b.column(3).ints.push_back(c);
  b.column(4).ints.push_back(d);
  b.column(5).append_str(data);
  b.event_time().push_back(now_ms);
  b.seq().push_back(0);
}

// One row of a state stream (layout in query.h), checked.
struct StateRow {
  uint64_t seq = 0;
  int64_t kind = 0, a = 0, b = 0, c = 0, d = 0;
  std::string_view data;  // into the record's batch
};

// Decodes the state record `rec` (of a runner with `inputs` inputs) into
// `rows`; `batch` keeps the bytes the rows point into. `what` names the
// stream in errors.
Status decode_state_record(const store::LogRecord& rec, size_t inputs, const std::string& what,
                           engine::Batch& batch, std::vector<StateRow>& rows) {
  rows.clear();
  std::string_view in = rec.payload;
  auto b = engine::decode_batch(in);
  if (!b.ok() || !(*b->schema == *state_stream_schema()) || b->rows() != rec.last - rec.first + 1)
    return make_error(Errc::corrupt, what + ": the record at " + std::to_string(rec.first) + " is corrupt" +
                                         (b.ok() ? std::string() : ": " + b.error().message));
  batch = std::move(b).value();
  const auto &kind = batch.columns[0]->ints, &a = batch.columns[1]->ints, &bb = batch.columns[2]->ints,
             &c = batch.columns[3]->ints, &d = batch.columns[4]->ints;
  for (size_t row = 0; row < batch.rows(); ++row) {
    StateRow r{rec.first + row, kind[row], a[row], bb[row], c[row], d[row], {}};
    auto bad = [&](const std::string& why) {
      return make_error(Errc::corrupt, what + ": row " + std::to_string(r.seq) + " " + why);
    };
    if (r.kind == kStateJournal) {
      if (r.a < 0 || r.b < 0 || static_cast<uint64_t>(r.b) >= inputs || r.c < 0 || r.d < r.c)
        return bad("is a corrupt journal entry");
    } else if (r.kind == kStateCheckpoint) {
      if (r.a <= 0 || r.b < 0 || r.c <= 0 || r.b >= r.c || r.d < 0) return bad("is a corrupt checkpoint chunk");
      r.data = batch.columns[5]->str(row);
    } else {
      return bad("has unknown kind " + std::to_string(r.kind));
    }
    rows.push_back(r);
  }
  return Status::Ok();
}

// What a waiting engine worker learns from a state append: durable here
// (and its last seq), then released by the followers or not.
struct StateWait {
  std::mutex mu;
  std::condition_variable cv;
  bool durable = false;
  bool done = false;
  uint64_t last = 0;
  Status status = Status::Ok();
  void finish(const Status& st) {
    {
      std::lock_guard lock(mu);
      done = true;
      status = st;
    }
    cv.notify_all();
  }
};

}  // namespace

// ---------------------------------------------------------------- EnginePool

EnginePool::EnginePool(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { work(); });
}

EnginePool::~EnginePool() { stop(); }

void EnginePool::schedule(std::shared_ptr<QueryRunner> runner) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    ready_.push_back(std::move(runner));
  }
  cv_.notify_one();
}

void EnginePool::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
    ready_.clear();
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void EnginePool::work() {
  for (;;) {
    std::shared_ptr<QueryRunner> r;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !ready_.empty(); });
      if (stopping_) return;
      r = std::move(ready_.front());
      ready_.pop_front();
    }
    // Cleared before running, so input that arrives meanwhile schedules
    // the runner again instead of being missed.
    r->scheduled_.store(false, std::memory_order_release);
    r->run_some();
  }
}

// ------------------------------------------------------------------ InputTap

class QueryRunner::InputTap final : public Tap {
 public:
  explicit InputTap(std::weak_ptr<QueryRunner> runner) : runner_(std::move(runner)) {}

  void on_record(const RecordPtr& record) override {
    {
      std::lock_guard lock(mu_);
      // Bounded: a runner that has fallen behind reads from the log instead.
      if (records_.size() == kTapRecords) records_.pop_front();
      records_.push_back(record);
    }
    if (auto r = runner_.lock()) r->schedule();
  }
  void on_stream_closed() override {}

  // The record holding `pos`, dropping older ones; nullptr when not here.
  RecordPtr find(uint64_t pos) {
    std::lock_guard lock(mu_);
    while (!records_.empty() && records_.front()->last < pos) records_.pop_front();
    if (!records_.empty() && records_.front()->first <= pos) return records_.front();
    return nullptr;
  }

 private:
  std::weak_ptr<QueryRunner> runner_;
  std::mutex mu_;
  std::deque<RecordPtr> records_;
};

// --------------------------------------------------------------- QueryMeta

std::string query_meta_to_json(const QueryMeta& m) {
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  w.StartObject();
  w.Key("name");
  w.String(m.name.c_str(), static_cast<rapidjson::SizeType>(m.name.size()));
  w.Key("id");
  w.Uint64(m.id);
  w.Key("network");
  w.String(m.network_json.c_str(), static_cast<rapidjson::SizeType>(m.network_json.size()));
  w.Key("inputs");
  w.StartArray();
  for (auto& s : m.inputs) w.String(s.c_str(), static_cast<rapidjson::SizeType>(s.size()));
  w.EndArray();
  w.Key("outputs");
  w.StartArray();
  for (auto& s : m.outputs) w.String(s.c_str(), static_cast<rapidjson::SizeType>(s.size()));
  w.EndArray();
  w.Key("start");
  w.StartArray();
  for (auto v : m.start) w.Uint64(v);
  w.EndArray();
  w.Key("created_ms");
  w.Int64(m.created_ms);
  if (!m.fragment.empty()) {
    w.Key("query");
    w.String(m.query.c_str(), static_cast<rapidjson::SizeType>(m.query.size()));
    w.Key("fragment");
    w.String(m.fragment.c_str(), static_cast<rapidjson::SizeType>(m.fragment.size()));
    w.Key("internal_inputs");
    w.StartArray();
    for (auto i : m.internal_inputs) w.Uint(i);
    w.EndArray();
    w.Key("internal_outputs");
    w.StartArray();
    for (auto o : m.internal_outputs) w.Uint(o);
    w.EndArray();
  }
  if (!m.state_stream.empty()) {
    w.Key("state_stream");
    w.String(m.state_stream.c_str(), static_cast<rapidjson::SizeType>(m.state_stream.size()));
  }
  if (m.stopped) {
    w.Key("stopped");
    w.Bool(true);
  }
  w.EndObject();
  return {sb.GetString(), sb.GetSize()};
}

Result<QueryMeta> query_meta_from_json(std::string_view json) {
  rapidjson::Document d;
  d.Parse(json.data(), json.size());
  auto bad = [] { return make_error(Errc::corrupt, "catalog: a query record is malformed"); };
  if (d.HasParseError() || !d.IsObject()) return bad();
  QueryMeta m;
  auto get = [&](const char* k) -> const rapidjson::Value* {
    auto it = d.FindMember(k);
    return it == d.MemberEnd() ? nullptr : &it->value;
  };
  const auto *name = get("name"), *id = get("id"), *net = get("network"), *in = get("inputs"),
             *out = get("outputs"), *start = get("start"), *created = get("created_ms");
  if (!name || !name->IsString() || !id || !id->IsUint64() || !net || !net->IsString() || !in ||
      !in->IsArray() || !out || !out->IsArray() || !start || !start->IsArray() || !created ||
      !created->IsInt64())
    return bad();
  m.name = name->GetString();
  m.id = id->GetUint64();
  m.network_json.assign(net->GetString(), net->GetStringLength());
  for (auto& v : in->GetArray()) {
    if (!v.IsString()) return bad();
    m.inputs.emplace_back(v.GetString());
  }
  for (auto& v : out->GetArray()) {
    if (!v.IsString()) return bad();
    m.outputs.emplace_back(v.GetString());
  }
  for (auto& v : start->GetArray()) {
    if (!v.IsUint64()) return bad();
    m.start.push_back(v.GetUint64());
  }
  if (m.start.size() != m.inputs.size()) return bad();
  m.created_ms = created->GetInt64();
  // A fragment's fields (absent from whole queries and older records).
  if (const auto* f = get("fragment")) {
    const auto *q = get("query"), *ii = get("internal_inputs"), *io = get("internal_outputs");
    if (!f->IsString() || !q || !q->IsString() || !ii || !ii->IsArray() || !io || !io->IsArray()) return bad();
    m.fragment = f->GetString();
    m.query = q->GetString();
    for (auto& v : ii->GetArray()) {
      if (!v.IsUint() || v.GetUint() >= m.inputs.size()) return bad();
      m.internal_inputs.push_back(v.GetUint());
    }
    for (auto& v : io->GetArray()) {
      if (!v.IsUint() || v.GetUint() >= m.outputs.size()) return bad();
      m.internal_outputs.push_back(v.GetUint());
    }
  }
  // Absent from whole queries and from fragments deployed before state
  // streams existed (those keep their journal in the store).
  if (const auto* st = get("state_stream")) {
    if (!st->IsString()) return bad();
    m.state_stream = st->GetString();
  }
  // Absent unless the query was stopped (POST /v1/queries/{name}/stop).
  if (const auto* stopped = get("stopped")) {
    if (!stopped->IsBool()) return bad();
    m.stopped = stopped->GetBool();
  }
  return m;
}

std::string state_stream_name(const std::string& runner) { return runner + "--state"; }

Status StateCheckpoints::feed(const store::LogRecord& rec) {
  std::string_view in = rec.payload;
  auto b = engine::decode_batch(in);
  if (!b.ok() || !(*b->schema == *state_stream_schema()) || b->rows() != rec.last - rec.first + 1)
    return make_error(Errc::corrupt, "the record at " + std::to_string(rec.first) + " is not a state record");
  const auto &kind = b->columns[0]->ints, &id = b->columns[1]->ints, &index = b->columns[2]->ints,
             &count = b->columns[3]->ints;
  for (size_t row = 0; row < b->rows(); ++row) {
    if (kind[row] != kStateCheckpoint || count[row] <= 0) continue;
    // As QueryRunner::load_state: a chunk that does not continue the
    // checkpoint being read starts over or is skipped.
    if (index[row] == 0) {
      reading_ = true;
      id_ = static_cast<uint64_t>(id[row]);
      count_ = static_cast<uint64_t>(count[row]);
      chunks_ = 0;
      first_ = rec.first + row;
    } else if (!reading_ || id_ != static_cast<uint64_t>(id[row]) || count_ != static_cast<uint64_t>(count[row]) ||
               chunks_ != static_cast<uint64_t>(index[row])) {
      reading_ = false;
      continue;
    }
    if (++chunks_ == count_) {
      complete_first_ = first_;
      reading_ = false;
    }
  }
  return Status::Ok();
}

engine::SchemaPtr state_stream_schema() {
  static const engine::SchemaPtr schema = engine::make_schema({{"kind", engine::Type::Int64},
                                                               {"a", engine::Type::Int64},
                                                               {"b", engine::Type::Int64},
                                                               {"c", engine::Type::Int64},
                                                               {"d", engine::Type::Int64},
                                                               {"data", engine::Type::String}});
  return schema;
}

// --------------------------------------------------------------- QueryRunner

QueryRunner::QueryRunner(QueryMeta meta, std::vector<StreamPtr> inputs,
                         std::vector<StreamPtr> outputs, Env env)
    : meta_(std::move(meta)),
      inputs_(std::move(inputs)),
      outputs_(std::move(outputs)),
      env_(env),
      positions_(new std::atomic<uint64_t>[inputs_.size()]),
      pins_(new std::atomic<uint64_t>[inputs_.size()]) {}

QueryRunner::~QueryRunner() = default;

Result<std::shared_ptr<QueryRunner>> QueryRunner::create(QueryMeta meta,
                                                         std::vector<StreamPtr> inputs,
                                                         std::vector<StreamPtr> outputs, Env env,
                                                         StreamPtr state) {
  Diagnostics diag;
  auto net = engine::QueryNetwork::parse(meta.network_json, diag);
  if (!net.ok()) return make_error(Errc::invalid_argument, diag.to_string());
  std::shared_ptr<QueryRunner> r(
      new QueryRunner(std::move(meta), std::move(inputs), std::move(outputs), env));
  r->network_ = std::move(net).value();
  if (r->network_.inputs().size() != r->inputs_.size() ||
      r->network_.outputs().size() != r->outputs_.size())
    return make_error(Errc::corrupt, "query '" + r->meta_.name + "': inputs or outputs do not match its network");
  if (r->meta_.state_stream.empty() != (state == nullptr) ||
      (state && !(*state->meta().schema == *state_stream_schema())))
    return make_error(Errc::corrupt, "query '" + r->meta_.name + "': state stream '" + r->meta_.state_stream +
                                         "' is missing or is not a state stream");
  r->state_log_ = std::move(state);
  r->internal_in_.resize(r->inputs_.size());
  r->internal_out_.assign(r->outputs_.size(), false);
  r->out_watermark_.assign(r->outputs_.size(), engine::kMinTime);
  for (auto i : r->meta_.internal_inputs) r->internal_in_.at(i) = r->network_.inputs()[i].schema;
  for (auto o : r->meta_.internal_outputs) r->internal_out_.at(o) = true;
  QueryRunner* self = r.get();
  auto exec = engine::Executor::create(r->network_, [self](size_t out, const engine::Batch& b) {
    if (b.rows() == 0) return;
    if (!self->internal_out_[out]) {
      self->pending_out_[out].push_back(b);
      return;
    }
    // The rows go after the watermark that preceded them here.
    const engine::EventTime wm = self->executor_->output_watermark(out);
    self->out_watermark_[out] = wm;
    self->pending_out_[out].push_back(engine::internal_rows(self->outputs_[out]->meta().schema, b, wm));
  });
  if (!exec.ok()) return exec.error();
  r->executor_ = std::move(exec).value();
  r->pending_out_.resize(r->outputs_.size());
  r->pos_ = r->meta_.start;
  r->out_next_.assign(r->outputs_.size(), 1);
  for (size_t i = 0; i < r->inputs_.size(); ++i) {
    r->positions_[i].store(r->pos_[i]);
    r->pins_[i].store(r->pos_[i]);
    r->taps_.push_back(std::make_shared<InputTap>(r));
  }
  return r;
}

void QueryRunner::fail(const std::string& why) {
  state_ = "failed: " + why;
  base::logf(base::LogLevel::error, "query", "query '%s' failed: %s\n", meta_.name.c_str(), why.c_str());
}

Status QueryRunner::read_range(size_t input, uint64_t first, uint64_t last,
                               std::vector<engine::Batch>& out) {
  uint64_t pos = first;
  while (pos <= last) {
    std::vector<store::LogRecord> recs;
    ENTENTE_RETURN_IF_ERROR(store::StreamLog::read(*env_.store, inputs_[input]->meta().id, pos, 16,
                                                   8u << 20, recs));
    if (recs.empty() || recs.front().first > pos) {
      const std::string what = "stream '" + inputs_[input]->meta().name + "': tuple " + std::to_string(pos);
      // Not there yet (a mirror created for a takeover fills from its
      // owner): tried again later. Before what the log holds: gone.
      const uint64_t held = inputs_[input]->committed_next();
      if (pos >= held)
        return make_error(Errc::unavailable, what + " " + kNotCopiedYet + " (" +
                                                 (held > 1 ? "it holds up to " + std::to_string(held - 1)
                                                           : std::string("it holds nothing yet")) +
                                                 ")");
      return make_error(Errc::conflict, what + " is no longer in the log (the oldest it holds is " +
                                            std::to_string(recs.empty() ? held : recs.front().first) + ")");
    }
    for (auto& rec : recs) {
      if (rec.first > pos) break;
      std::string_view bytes = rec.payload;
      auto b = engine::decode_batch(bytes);
      if (!b.ok()) return make_error(Errc::corrupt, "stream '" + inputs_[input]->meta().name + "' log: " + b.error().message);
      const uint64_t end = std::min(rec.last, last);
      out.push_back(slice(*b, pos - rec.first, end - pos + 1));
      pos = end + 1;
      if (pos > last) break;
    }
  }
  return Status::Ok();
}

Status QueryRunner::restore_snapshot(uint64_t id, std::string_view bytes) {
  engine::ByteReader r(bytes);
  uint8_t version = 0;
  uint64_t n_in = 0, n_out = 0, journal = 0;
  auto corrupt = [&] {
    return make_error(Errc::corrupt, "query '" + meta_.name + "': checkpoint " + std::to_string(id) + " is corrupt");
  };
  if (!r.u8(version) || version != kCheckpointVersion || !r.varint(n_in) || n_in != inputs_.size())
    return corrupt();
  for (auto& p : pos_)
    if (!r.varint(p)) return corrupt();
  if (!r.varint(n_out) || n_out != outputs_.size()) return corrupt();
  for (auto& o : out_next_)
    if (!r.varint(o)) return corrupt();
  std::string_view snap;
  if (!r.varint(journal) || !r.bytes(snap)) return corrupt();
  ENTENTE_RETURN_IF_ERROR(executor_->restore(snap));
  // A checkpoint is taken between steps, after which every internal
  // output had written its watermark (push_input).
  for (size_t o = 0; o < outputs_.size(); ++o)
    if (internal_out_[o]) out_watermark_[o] = executor_->output_watermark(o);
  journal_next_ = journal;
  next_checkpoint_id_ = std::max(next_checkpoint_id_, id + 1);
  CheckpointInfo info{meta_.name, id, bytes.size(), 0, 0};
  std::lock_guard cl(cp_mu_);
  last_checkpoint_ = info;
  return Status::Ok();
}

Status QueryRunner::load_state(std::vector<std::pair<uint64_t, JournalEntry>>& entries, uint64_t* end) {
  const std::string what = "query '" + meta_.name + "': state stream '" + meta_.state_stream + "'";
  // The checkpoint being read (chunks in order) and the last complete one.
  struct Assembly {
    uint64_t id = 0, count = 0, journal_next = 0, first_seq = 0;
    std::string bytes;
    uint64_t chunks = 0;
  };
  std::optional<Assembly> reading, complete;
  std::vector<std::pair<uint64_t, JournalEntry>> journal;
  uint64_t from = 0;
  engine::Batch batch;
  std::vector<StateRow> rows;
  for (;;) {
    std::vector<store::LogRecord> recs;
    ENTENTE_RETURN_IF_ERROR(store::StreamLog::read(*env_.store, state_log_->meta().id, from, 64, 8u << 20, recs));
    if (recs.empty()) break;
    for (const auto& rec : recs) {
      ENTENTE_RETURN_IF_ERROR(decode_state_record(rec, inputs_.size(), what, batch, rows));
      for (const StateRow& r : rows) {
        if (r.kind == kStateJournal) {
          journal.emplace_back(static_cast<uint64_t>(r.a),
                               JournalEntry{static_cast<uint32_t>(r.b), static_cast<uint64_t>(r.c),
                                            static_cast<uint64_t>(r.d)});
          continue;
        }
        const auto id = static_cast<uint64_t>(r.a), index = static_cast<uint64_t>(r.b),
                   count = static_cast<uint64_t>(r.c);
        next_checkpoint_id_ = std::max(next_checkpoint_id_, id + 1);
        // A chunk that does not continue the checkpoint being read starts
        // over (an earlier one cut short by a crash is left behind).
        if (index == 0) {
          reading = Assembly{id, count, static_cast<uint64_t>(r.d), r.seq, {}, 0};
        } else if (!reading || reading->id != id || reading->count != count || reading->chunks != index) {
          reading.reset();
          continue;
        }
        reading->bytes.append(r.data);
        if (++reading->chunks == reading->count) {
          complete = std::move(reading);
          reading.reset();
        }
      }
      from = rec.last + 1;
    }
  }
  if (end) *end = from;
  uint64_t next = 0;
  if (complete) {
    ENTENTE_RETURN_IF_ERROR(restore_snapshot(complete->id, complete->bytes));
    if (journal_next_ != complete->journal_next)
      return make_error(Errc::corrupt, what + ": checkpoint " + std::to_string(complete->id) + " says journal " +
                                           std::to_string(complete->journal_next) + " but holds " +
                                           std::to_string(journal_next_));
    next = journal_next_;
    state_trim_.store(complete->first_seq, std::memory_order_release);
  } else {
    // No checkpoint yet: each input starts where its first journal entry
    // does (meta.start on the node that deployed the fragment; a node
    // taking it over only knows its own start positions).
    std::vector<bool> seen(inputs_.size(), false);
    for (const auto& entry : journal) {
      const JournalEntry& e = entry.second;
      if (seen[e.input]) continue;
      seen[e.input] = true;
      pos_[e.input] = e.first;
    }
  }
  // The journal after the checkpoint, contiguous from its journal_next.
  for (auto& [seq, e] : journal) {
    if (seq < next) continue;  // before the checkpoint
    if (seq != next)
      return make_error(Errc::corrupt, what + ": journal entry " + std::to_string(next) + " is missing (found " +
                                           std::to_string(seq) + ")");
    entries.emplace_back(seq, e);
    ++next;
  }
  return Status::Ok();
}

Status QueryRunner::recover() {
  std::lock_guard lock(mu_);
  std::vector<std::pair<uint64_t, JournalEntry>> entries;
  if (state_log_) {
    ENTENTE_RETURN_IF_ERROR(load_state(entries));
  } else {
    const std::string owner = checkpoint_owner(meta_);
    ENTENTE_ASSIGN_OR_RETURN(auto cp, store::Checkpoints::latest(*env_.store, owner));
    if (cp) ENTENTE_RETURN_IF_ERROR(restore_snapshot(cp->id, cp->bytes));
    const std::string prefix = journal_prefix(meta_.id);
    Status bad_entry = Status::Ok();
    ENTENTE_RETURN_IF_ERROR(env_.store->scan(
        store::Cf::log, prefix,
        [&](std::string_view key, std::string_view value) {
          engine::ByteReader r(value);
          uint64_t input = 0;
          JournalEntry e{};
          if (key.size() != prefix.size() + 8 || !r.varint(input) || !r.varint(e.first) ||
              !r.varint(e.last) || input >= inputs_.size() || e.last < e.first) {
            bad_entry = make_error(Errc::corrupt, "query '" + meta_.name + "': a journal entry is corrupt");
            return false;
          }
          e.input = static_cast<uint32_t>(input);
          entries.emplace_back(store::get_key_u64(key.substr(prefix.size())), e);
          return true;
        },
        journal_key(meta_.id, journal_next_)));
    ENTENTE_RETURN_IF_ERROR(bad_entry);
  }
  for (size_t i = 0; i < inputs_.size(); ++i) pins_[i].store(pos_[i]);

  std::deque<std::pair<uint64_t, JournalEntry>> pending(entries.begin(), entries.end());
  ENTENTE_RETURN_IF_ERROR(replay(pending));
  for (size_t o = 0; o < outputs_.size(); ++o) {
    // With a state stream, the journal may lead further than the outputs
    // (it is written first): replay appended the rest. In the store, both
    // are written in one atomic write and must match.
    const uint64_t have = outputs_[o]->committed_next();
    if (state_log_ ? out_next_[o] < have : out_next_[o] != have)
      return make_error(Errc::corrupt, "query '" + meta_.name + "': output '" + meta_.outputs[o] +
                                           "' has tuples up to " + std::to_string(have - 1) +
                                           " but recovery reproduced up to " + std::to_string(out_next_[o] - 1));
  }
  return Status::Ok();
}

Status QueryRunner::replay(std::deque<std::pair<uint64_t, JournalEntry>>& entries) {
  // The journal in its original order: the same pushes give the same
  // outputs; the ones already in the output logs are dropped by seq.
  while (!entries.empty()) {
    const auto& [seq, e] = entries.front();
    if (e.first != pos_[e.input])
      return make_error(Errc::corrupt, "query '" + meta_.name + "': journal entry " + std::to_string(seq) +
                                           " starts at " + std::to_string(e.first) + ", expected " +
                                           std::to_string(pos_[e.input]));
    std::vector<engine::Batch> batches;
    ENTENTE_RETURN_IF_ERROR(read_range(e.input, e.first, e.last, batches));
    for (auto& b : batches) push_input(e.input, std::move(b));
    pos_[e.input] = e.last + 1;
    journal_next_ = seq + 1;
    entries.pop_front();
    if (!flush_outputs(/*replaying=*/true)) return make_error(Errc::io_error, state_);
  }
  for (size_t i = 0; i < inputs_.size(); ++i) positions_[i].store(pos_[i]);
  return Status::Ok();
}

// ------------------------------------------------------------ warm standby

void QueryRunner::begin_warm() {
  std::lock_guard lock(mu_);
  warm_ = true;
  state_ = "warm";
}

Status QueryRunner::warm_read() {
  const std::string what = "query '" + meta_.name + "': state stream copy '" + state_log_->meta().name + "'";
  engine::Batch batch;
  std::vector<StateRow> rows;
  for (;;) {
    std::vector<store::LogRecord> recs;
    ENTENTE_RETURN_IF_ERROR(store::StreamLog::read(*env_.store, state_log_->meta().id, warm_from_, 64, 8u << 20, recs));
    if (recs.empty()) return Status::Ok();
    // Trimmed past what this standby read: it cannot go on.
    if (recs.front().first > warm_from_)
      return make_error(Errc::conflict, what + ": records " + std::to_string(warm_from_) + " to " +
                                            std::to_string(recs.front().first - 1) + " were trimmed before the "
                                            "standby read them");
    for (const auto& rec : recs) {
      ENTENTE_RETURN_IF_ERROR(decode_state_record(rec, inputs_.size(), what, batch, rows));
      for (const StateRow& r : rows) {
        if (r.seq < warm_from_) continue;
        if (r.kind == kStateCheckpoint) {
          next_checkpoint_id_ = std::max(next_checkpoint_id_, static_cast<uint64_t>(r.a) + 1);
          continue;
        }
        const auto seq = static_cast<uint64_t>(r.a);
        if (seq < warm_expect_) continue;
        if (seq > warm_expect_)
          return make_error(Errc::conflict, what + ": journal entry " + std::to_string(warm_expect_) +
                                                " is missing (found " + std::to_string(seq) + ")");
        warm_pending_.emplace_back(seq, JournalEntry{static_cast<uint32_t>(r.b), static_cast<uint64_t>(r.c),
                                                     static_cast<uint64_t>(r.d)});
        ++warm_expect_;
      }
      warm_from_ = rec.last + 1;
    }
  }
}

Result<uint64_t> QueryRunner::warm() {
  std::lock_guard lock(mu_);
  if (!warm_) return make_error(Errc::conflict, "query '" + meta_.name + "' is not a warm standby");
  if (!warm_loaded_) {
    // The last checkpoint the copy holds, and the journal after it.
    std::vector<std::pair<uint64_t, JournalEntry>> entries;
    ENTENTE_RETURN_IF_ERROR(load_state(entries, &warm_from_));
    for (size_t i = 0; i < inputs_.size(); ++i) pins_[i].store(pos_[i]);
    warm_pending_.assign(entries.begin(), entries.end());
    warm_expect_ = entries.empty() ? journal_next_ : entries.back().first + 1;
    warm_loaded_ = true;
  } else {
    ENTENTE_RETURN_IF_ERROR(warm_read());
  }
  ENTENTE_RETURN_IF_ERROR(replay(warm_pending_));
  return journal_next_;
}

Status QueryRunner::promote(const std::vector<StreamPtr>& inputs, std::vector<StreamPtr> outputs, StreamPtr state) {
  std::lock_guard lock(mu_);
  if (!warm_ || !warm_loaded_) return make_error(Errc::conflict, "query '" + meta_.name + "' is not a warm standby");
  if (inputs != inputs_)
    return make_error(Errc::conflict, "query '" + meta_.name + "': its inputs are read from other streams now");
  if (outputs.size() != outputs_.size() || !state || state->meta().id != state_log_->meta().id)
    return make_error(Errc::conflict, "query '" + meta_.name + "': the streams taken over are not the ones the "
                                      "standby read");
  for (size_t o = 0; o < outputs.size(); ++o)
    if (!outputs[o] || outputs[o]->meta().id != outputs_[o]->meta().id)
      return make_error(Errc::conflict, "query '" + meta_.name + "': output '" + meta_.outputs[o] +
                                            "' is not the copy the standby read");
  // The rest of the journal, from the same log (adopted under its name).
  state_log_ = std::move(state);
  ENTENTE_RETURN_IF_ERROR(warm_read());
  ENTENTE_RETURN_IF_ERROR(replay(warm_pending_));
  // Every output the journal led to is in the log (the source stopped
  // cleanly): the standby continues exactly where the log ends.
  for (size_t o = 0; o < outputs.size(); ++o) {
    const uint64_t have = outputs[o]->committed_next();
    if (out_next_[o] != have)
      return make_error(Errc::conflict, "query '" + meta_.name + "': output '" + meta_.outputs[o] +
                                            "' holds tuples up to " + std::to_string(have - 1) +
                                            " but the standby reproduced up to " + std::to_string(out_next_[o] - 1));
  }
  outputs_ = std::move(outputs);
  warm_ = false;
  state_ = "running";
  return Status::Ok();
}

Status QueryRunner::promote_to(uint64_t journal_next, std::vector<StreamPtr> outputs,
                               std::vector<std::string> output_names, StreamPtr state, std::string state_name) {
  std::lock_guard lock(mu_);
  if (!warm_ || !warm_loaded_) return make_error(Errc::conflict, "query '" + meta_.name + "' is not a warm standby");
  if (outputs.size() != outputs_.size() || output_names.size() != outputs.size() || !state ||
      !(*state->meta().schema == *state_stream_schema()))
    return make_error(Errc::invalid_argument, "query '" + meta_.name + "': the streams to write are not one per "
                                              "output and a state stream");
  ENTENTE_RETURN_IF_ERROR(warm_read());
  ENTENTE_RETURN_IF_ERROR(replay(warm_pending_));
  if (journal_next_ < journal_next)
    return make_error(Errc::unavailable, "query '" + meta_.name + "': the standby replayed the journal up to " +
                                             std::to_string(journal_next_) + " of " + std::to_string(journal_next));
  if (journal_next_ > journal_next)
    return make_error(Errc::conflict, "query '" + meta_.name + "': the standby's journal runs to " +
                                          std::to_string(journal_next_) + ", past the owner's " +
                                          std::to_string(journal_next));
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (!outputs[o] || !(*outputs[o]->meta().schema == *outputs_[o]->meta().schema))
      return make_error(Errc::invalid_argument, "query '" + meta_.name + "': output '" + output_names[o] +
                                                    "' does not have the output's schema");
    if (out_next_[o] != outputs[o]->committed_next())
      return make_error(Errc::conflict, "query '" + meta_.name + "': output '" + output_names[o] + "' starts at " +
                                            std::to_string(outputs[o]->committed_next()) +
                                            " but the standby reproduced up to " + std::to_string(out_next_[o] - 1));
  }
  outputs_ = std::move(outputs);
  meta_.outputs = std::move(output_names);
  state_log_ = std::move(state);
  meta_.state_stream = std::move(state_name);
  state_trim_.store(0, std::memory_order_release);  // the copy's, not the new stream's
  warm_ = false;
  state_ = "running";
  return Status::Ok();
}

void QueryRunner::start() {
  if (meta_.stopped) {
    // Stopped by its administrator: recovered, consuming nothing.
    stopped_.store(true, std::memory_order_release);
    std::lock_guard lock(mu_);
    if (state_ == "running") state_ = "stopped";
    std::lock_guard cache(info_mu_);
    info_cache_.state = state_;
    return;
  }
  for (size_t i = 0; i < inputs_.size(); ++i) inputs_[i]->add_tap(taps_[i]);
  schedule();
}

Result<CheckpointInfo> QueryRunner::pause() {
  stop();
  std::promise<Result<CheckpointInfo>> promise;
  auto fut = promise.get_future();
  {
    std::lock_guard lock(mu_);
    if (state_ != "running") return make_error(Errc::conflict, "query '" + meta_.name + "' is " + state_);
    // What it consumed reaches its outputs before the checkpoint says so.
    bool any = !journal_pending_.empty();
    for (auto& p : pending_out_) any |= !p.empty();
    if (any && !flush_outputs(false)) return make_error(Errc::io_error, state_);
    auto waiters = take_waiters();
    checkpoint_wanted_.store(false);
    waiters.push_back([&promise](const Result<CheckpointInfo>& r) { promise.set_value(r); });
    take_checkpoint(std::move(waiters));
    state_ = "stopped";
    std::lock_guard cache(info_mu_);
    info_cache_.state = state_;
    info_cache_.positions = pos_;
  }
  return fut.get();
}

// A checkpoint's first fields: its version, the input positions and the
// outputs' next sequence numbers. REQUIRES: mu_.
std::string QueryRunner::checkpoint_head() const {
  std::string bytes;
  engine::ByteWriter w(bytes);
  w.u8(kCheckpointVersion);
  w.varint(pos_.size());
  for (auto p : pos_) w.varint(p);
  w.varint(out_next_.size());
  for (auto o : out_next_) w.varint(o);
  return bytes;
}

void QueryRunner::add_checkpoint(store::WriteBatch& wb) {
  std::lock_guard lock(mu_);
  std::string bytes = checkpoint_head();
  engine::ByteWriter w(bytes);
  w.varint(journal_next_);
  w.bytes(executor_->snapshot());
  const uint64_t id = next_checkpoint_id_++;
  const std::string owner = checkpoint_owner(meta_);
  store::Checkpoints::add_put(wb, owner, id, bytes);
  store::Checkpoints::add_erase_before(wb, owner, id);
  wb.erase_range(store::Cf::log, journal_key(meta_.id, 0), journal_key(meta_.id, journal_next_));
}

void QueryRunner::stop() {
  stopped_.store(true, std::memory_order_release);
  for (size_t i = 0; i < inputs_.size(); ++i) inputs_[i]->remove_tap(taps_[i].get());
  std::lock_guard lock(mu_);  // waits for a run_some in progress
}

void QueryRunner::schedule() {
  if (stopped_.load(std::memory_order_acquire)) return;
  if (scheduled_.exchange(true, std::memory_order_acq_rel)) return;
  env_.pool->schedule(shared_from_this());
}

bool QueryRunner::step(size_t i) {
  std::vector<engine::Batch> batches;
  uint64_t last;
  if (RecordPtr rec = taps_[i]->find(pos_[i])) {
    last = rec->last;
    batches.push_back(slice(*rec->batch, pos_[i] - rec->first, rec->last - pos_[i] + 1));
  } else {
    // Behind the live records: read one log record's worth.
    std::vector<store::LogRecord> recs;
    Status s = store::StreamLog::read(*env_.store, inputs_[i]->meta().id, pos_[i], 1, 8u << 20, recs);
    if (!s.ok()) {
      fail(s.error().message);
      return false;
    }
    if (recs.empty() || recs.front().first > pos_[i] || recs.front().last < pos_[i]) {
      fail("stream '" + inputs_[i]->meta().name + "': tuple " + std::to_string(pos_[i]) +
           " is no longer in the log" +
           (!recs.empty() && recs.front().first > pos_[i]
                ? " (the oldest it holds is " + std::to_string(recs.front().first) + ")"
                : std::string()));
      return false;
    }
    last = std::min(recs.front().last, inputs_[i]->visible_next() - 1);
    s = read_range(i, pos_[i], last, batches);
    if (!s.ok()) {
      fail(s.error().message);
      return false;
    }
  }
  journal_pending_.push_back({static_cast<uint32_t>(i), pos_[i], last});
  for (auto& b : batches) push_input(i, std::move(b));
  pos_[i] = last + 1;
  positions_[i].store(pos_[i], std::memory_order_release);
  return true;
}

void QueryRunner::push_input(size_t input, engine::Batch&& batch) {
  if (internal_in_[input]) engine::push_internal(*executor_, input, internal_in_[input], batch);
  else executor_->push(input, std::move(batch));
  // A watermark that moved without rows goes out as a mark: the consumer
  // needs it to close its windows as the whole query would. Deterministic
  // (once per push that moved it), so recovery writes the same marks.
  for (size_t o = 0; o < outputs_.size(); ++o) {
    if (!internal_out_[o]) continue;
    const engine::EventTime wm = executor_->output_watermark(o);
    if (wm <= out_watermark_[o]) continue;
    out_watermark_[o] = wm;
    pending_out_[o].push_back(engine::internal_mark(outputs_[o]->meta().schema, wm));
  }
}

bool QueryRunner::flush_outputs(bool replaying) {
  if (warm_) {
    // A warm standby: the copies hold these outputs (or will).
    for (size_t o = 0; o < outputs_.size(); ++o) {
      for (auto& b : pending_out_[o]) out_next_[o] += b.rows();
      pending_out_[o].clear();
    }
    return true;
  }
  if (state_log_) {
    // The journal goes to the state stream first; outputs wait until it is
    // there and in every in-sync copy (query.h), so no output anywhere
    // lacks its journal.
    if (state_failed()) return false;
    bool any = false;
    for (auto& p : pending_out_) any |= !p.empty();
    if (auto rows = journal_rows()) {
      if (!(any ? append_state_and_wait(std::move(*rows)) : append_state(std::move(*rows)))) return false;
    }
  }
  // The journal entries that led here go with the first output record, in
  // one atomic write: an output in the log always has its inputs journaled.
  // (With a state stream, journal_rows() took them already.)
  store::WriteBatch extra;
  for (auto& e : journal_pending_) {
    std::string v;
    engine::ByteWriter w(v);
    w.varint(e.input);
    w.varint(e.first);
    w.varint(e.last);
    extra.put(store::Cf::log, journal_key(meta_.id, journal_next_++), v);
  }
  journal_pending_.clear();
  for (size_t o = 0; o < outputs_.size(); ++o) {
    auto& parts = pending_out_[o];
    if (parts.empty()) continue;
    engine::Batch b = parts.size() == 1 ? std::move(parts[0])
                                        : engine::concat(outputs_[o]->meta().schema, parts);
    parts.clear();
    const uint64_t n = b.rows();
    if (replaying) {
      const uint64_t durable = outputs_[o]->committed_next();
      if (out_next_[o] + n <= durable) {
        out_next_[o] += n;
        continue;
      }
      if (out_next_[o] < durable) b = slice(b, durable - out_next_[o], out_next_[o] + n - durable);
    }
    // At most kMaxRowsPerRecord rows per record: a window that closes over
    // many keys emits them all at once, and a record is what a subscriber's
    // WebSocket message carries whole (a forwarded subscription refused a
    // record of 272,000 rows, over the 16 MiB message limit).
    const size_t rows = b.rows();
    for (size_t off = 0; off < rows; off += kMaxRowsPerRecord) {
      const size_t count = std::min(kMaxRowsPerRecord, rows - off);
      engine::Batch part = count == rows ? std::move(b) : slice(b, off, count);
      Status s = outputs_[o]->append(std::move(part), *env_.gc, store::Admission::wait, std::move(extra), nullptr);
      extra = store::WriteBatch();
      if (!s.ok()) {
        fail("output '" + meta_.outputs[o] + "': " + s.error().message);
        return false;
      }
    }
    out_next_[o] += n;
  }
  if (!extra.empty()) {
    Status s = env_.gc->submit(std::move(extra), nullptr, store::Admission::wait);
    if (!s.ok()) {
      fail("journal: " + s.error().message);
      return false;
    }
  }
  return true;
}

void QueryRunner::run_some() {
  if (stopped_.load(std::memory_order_acquire)) return;
  ThreadCpuSpan cpu(cpu_load_);  // the load (cpu_load.h), whatever path the run returns by
  std::unique_lock lock(mu_);
  if (state_ != "running") return;
  // Outputs (or a full journal) to write. With a state stream each flush
  // that carries outputs waits one round trip to the followers
  // (flush_outputs), so the outputs of the whole run share one, rather
  // than one per step.
  auto flush_due = [this] {
    bool any = false;
    for (auto& p : pending_out_) any |= !p.empty();
    return any || journal_pending_.size() >= kMaxPendingJournal;
  };
  // Bounds what a run holds back: at most kMaxHeldRows output rows.
  auto held_rows = [this] {
    size_t n = 0;
    for (auto& parts : pending_out_)
      for (auto& b : parts) n += b.rows();
    return n;
  };
  bool more = false;
  for (int k = 0; k < kStepsPerRun; ++k) {
    size_t chosen = inputs_.size();
    for (size_t j = 0; j < inputs_.size(); ++j) {
      size_t i = (rr_ + j) % inputs_.size();
      if (pos_[i] < inputs_[i]->visible_next()) {
        chosen = i;
        break;
      }
    }
    if (chosen == inputs_.size()) break;
    rr_ = chosen + 1;
    if (!step(chosen)) return;
    more = k + 1 == kStepsPerRun;
    if (state_log_ && !more && journal_pending_.size() < kMaxPendingJournal && held_rows() < kMaxHeldRows) continue;
    if (flush_due() && !flush_outputs(false)) return;
  }
  if (state_log_ && flush_due() && !flush_outputs(false)) return;
  if (checkpoint_wanted_.exchange(false)) take_checkpoint(take_waiters());
  // What info() answers while a run holds mu_: a runner busy run after run
  // would otherwise never be seen between runs (its boxes stayed empty).
  if (const auto now = std::chrono::steady_clock::now(); now - info_refreshed_ >= kInfoRefresh) {
    info_refreshed_ = now;
    std::lock_guard cache(info_mu_);
    info_cache_.state = state_;
    info_cache_.boxes = executor_->box_stats();
    info_cache_.positions = pos_;
  }
  lock.unlock();
  if (more) schedule();
}

void QueryRunner::take_checkpoint(std::vector<CheckpointDone> dones) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string bytes = checkpoint_head();
  engine::ByteWriter w(bytes);
  if (state_log_) {
    // The state stream's journal stays contiguous (recovery falls back to
    // the previous checkpoint when this one does not complete).
    std::optional<engine::Batch> rows;
    if (state_failed() || ((rows = journal_rows()) && !append_state(std::move(*rows)))) {
      for (auto& d : dones) d(make_error(Errc::io_error, state_));
      return;
    }
  } else {
    // The checkpoint reflects every input consumed so far, so unwritten
    // journal entries are not needed any more.
    journal_pending_.clear();
  }
  w.varint(journal_next_);
  w.bytes(executor_->snapshot());

  // The boxes' rates since the last checkpoint.
  {
    RateSample now{std::chrono::steady_clock::now(), {}, {}};
    for (const auto& b : executor_->box_stats()) {
      now.in.push_back(b.stats.tuples_in);
      now.out.push_back(b.stats.tuples_out);
    }
    if (rate_sample_ && now.at > rate_sample_->at) {
      const double secs = std::chrono::duration<double>(now.at - rate_sample_->at).count();
      std::vector<double> in(now.in.size()), out(now.out.size());
      for (size_t b = 0; b < now.in.size(); ++b) {
        in[b] = static_cast<double>(now.in[b] - std::min(now.in[b], rate_sample_->in[b])) / secs;
        out[b] = static_cast<double>(now.out[b] - std::min(now.out[b], rate_sample_->out[b])) / secs;
      }
      std::lock_guard cl(cp_mu_);
      rate_in_ = std::move(in);
      rate_out_ = std::move(out);
    }
    rate_sample_ = std::move(now);
  }
  if (state_log_) {
    // A node taking over restores the last checkpoint its copy of the
    // state stream holds and reproduces only the outputs after it: its
    // copies of the outputs must hold every one before it, so the
    // checkpoint is written only once the outputs' in-sync followers do.
    for (size_t o = 0; o < outputs_.size(); ++o) {
      if (out_next_[o] <= 1) continue;
      if (Status s = wait_replicated(meta_.outputs[o], out_next_[o] - 1); !s.ok()) {
        for (auto& d : dones)
          d(make_error(s.error().code, "output '" + meta_.outputs[o] + "' not replicated: " + s.error().message));
        return;
      }
    }
  }
  const uint64_t id = next_checkpoint_id_++;
  if (state_log_) {
    checkpoint_to_state(bytes, id, CheckpointInfo{meta_.name, id, bytes.size(), wall_ms(), 0}, pos_, t0,
                        std::move(dones));
    return;
  }
  const std::string owner = checkpoint_owner(meta_);
  store::WriteBatch wb;
  store::Checkpoints::add_put(wb, owner, id, bytes);
  store::Checkpoints::add_erase_before(wb, owner, id);
  wb.erase_range(store::Cf::log, journal_key(meta_.id, 0), journal_key(meta_.id, journal_next_));
  auto positions = pos_;
  CheckpointInfo info{meta_.name, id, bytes.size(), wall_ms(), 0};
  auto self = shared_from_this();
  Status s = env_.gc->submit(
      std::move(wb),
      [self, info, positions, t0, dones](const Status& st) mutable {
        if (!st.ok()) {
          for (auto& d : dones) d(st.error());
          return;
        }
        self->checkpoint_taken(info, positions, t0, dones);
      },
      store::Admission::wait);
  if (!s.ok())
    for (auto& d : dones) d(s.error());
}

void QueryRunner::checkpoint_taken(CheckpointInfo info, const std::vector<uint64_t>& positions,
                                   std::chrono::steady_clock::time_point t0, std::vector<CheckpointDone>& dones) {
  info.duration_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  for (size_t i = 0; i < positions.size(); ++i) pins_[i].store(positions[i]);
  {
    std::lock_guard cl(cp_mu_);
    last_checkpoint_ = info;
  }
  if (env_.metrics) {
    env_.metrics
        ->histogram("entente_checkpoint_duration_seconds", "Time to snapshot a query and make it durable",
                    {{"query", info.query}}, latency_buckets())
        .observe(info.duration_ms / 1000.0);
    env_.metrics->gauge("entente_checkpoint_bytes", "Size of the last checkpoint", {{"query", info.query}})
        .set(static_cast<double>(info.bytes));
  }
  for (auto& d : dones) d(info);
}

// ------------------------------------------------------ state-stream mode

bool QueryRunner::state_failed() {
  std::string why;
  {
    std::lock_guard lock(state_failure_mu_);
    why = state_failure_;
  }
  if (why.empty()) return false;
  if (state_ == "running") fail("state stream '" + meta_.state_stream + "': " + why);
  return true;
}

std::optional<engine::Batch> QueryRunner::journal_rows() {
  if (journal_pending_.empty()) return std::nullopt;
  engine::BatchBuilder b(state_stream_schema());
  b.reserve(journal_pending_.size());
  const int64_t now = wall_ms();
  for (auto& e : journal_pending_)
    add_state_row(b, kStateJournal, static_cast<int64_t>(journal_next_++), e.input, static_cast<int64_t>(e.first),
                  static_cast<int64_t>(e.last), {}, now);
  journal_pending_.clear();
  return b.finish();
}

bool QueryRunner::append_state(engine::Batch rows) {
  auto self = shared_from_this();
  Status s = state_log_->append(std::move(rows), *env_.gc, store::Admission::wait, store::WriteBatch(),
                                [self](const Status& st, const RecordPtr&) {
                                  if (st.ok()) return;
                                  std::lock_guard lock(self->state_failure_mu_);
                                  if (self->state_failure_.empty()) self->state_failure_ = st.error().message;
                                });
  if (!s.ok()) {
    fail("state stream '" + meta_.state_stream + "': " + s.error().message);
    return false;
  }
  return true;
}

bool QueryRunner::append_state_and_wait(engine::Batch rows) {
  auto w = std::make_shared<StateWait>();
  const auto when = env_.when_replicated;
  const std::string name = meta_.state_stream;
  Status s = state_log_->append(std::move(rows), *env_.gc, store::Admission::wait, store::WriteBatch(),
                                [w, when, name](const Status& st, const RecordPtr& rec) {
                                  // The committer thread: hand over, never wait here.
                                  if (!st.ok() || !when) {
                                    w->finish(st);
                                    return;
                                  }
                                  {
                                    std::lock_guard lock(w->mu);
                                    w->durable = true;
                                    w->last = rec->last;
                                  }
                                  when(name, rec->last, [w](const Status& released) { w->finish(released); });
                                });
  if (!s.ok()) {
    fail("state stream '" + name + "': " + s.error().message);
    return false;
  }
  // Blocks this engine worker (mu_ held): the outputs may not go before.
  // An "unavailable" answer after the record is durable (the catalog not
  // read yet after a restart, etcd briefly away) is asked again, within
  // bounds; "led by another node now" is too, and then fails the runner.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(kStateGiveUpMs);
  for (;;) {
    std::unique_lock lock(w->mu);
    w->cv.wait(lock, [&] { return w->done; });
    if (w->status.ok()) return true;
    const Error err = w->status.error();
    if (!w->durable || err.code != Errc::unavailable || std::chrono::steady_clock::now() >= give_up ||
        stopped_.load(std::memory_order_acquire)) {
      lock.unlock();
      fail("state stream '" + name + "': " + (w->durable ? "not replicated: " : "") + err.message);
      return false;
    }
    w->done = false;
    const uint64_t last = w->last;
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(kStateRetryMs));
    when(name, last, [w](const Status& released) { w->finish(released); });
  }
}

Status QueryRunner::wait_replicated(const std::string& stream, uint64_t last) {
  if (!env_.when_replicated) return Status::Ok();
  // As append_state_and_wait: "unavailable" is asked again, within bounds.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(kStateGiveUpMs);
  for (;;) {
    auto w = std::make_shared<StateWait>();
    env_.when_replicated(stream, last, [w](const Status& released) { w->finish(released); });
    std::unique_lock lock(w->mu);
    w->cv.wait(lock, [&] { return w->done; });
    if (w->status.ok()) return w->status;
    if (w->status.error().code != Errc::unavailable || std::chrono::steady_clock::now() >= give_up ||
        stopped_.load(std::memory_order_acquire))
      return w->status;
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(kStateRetryMs));
  }
}

void QueryRunner::checkpoint_to_state(const std::string& bytes, uint64_t id, CheckpointInfo info,
                                      std::vector<uint64_t> positions, std::chrono::steady_clock::time_point t0,
                                      std::vector<CheckpointDone> dones) {
  // Shared by the chunks' callbacks, which run in order on the committer
  // thread: the first chunk's seq, and the first failure.
  struct Progress {
    std::mutex mu;
    std::optional<Error> error;
    uint64_t first_seq = 0;
  };
  auto progress = std::make_shared<Progress>();
  auto waiting = std::make_shared<std::vector<CheckpointDone>>(std::move(dones));
  auto self = shared_from_this();
  const size_t count = std::max<size_t>(1, (bytes.size() + kStateChunkBytes - 1) / kStateChunkBytes);
  const int64_t now = wall_ms();
  for (size_t k = 0; k < count; ++k) {
    engine::BatchBuilder b(state_stream_schema());
    add_state_row(b, kStateCheckpoint, static_cast<int64_t>(id), static_cast<int64_t>(k),
                  static_cast<int64_t>(count), static_cast<int64_t>(journal_next_),
                  std::string_view(bytes).substr(k * kStateChunkBytes, kStateChunkBytes), now);
    Stream::Done done;
    if (k + 1 < count) {
      done = [progress, k](const Status& st, const RecordPtr& rec) {
        std::lock_guard lock(progress->mu);
        if (!st.ok() && !progress->error) progress->error = st.error();
        if (st.ok() && k == 0) progress->first_seq = rec->first;
      };
    } else {
      done = [self, progress, waiting, k, info, positions, t0](const Status& st, const RecordPtr& rec) {
        std::optional<Error> error;
        uint64_t first = 0;
        {
          std::lock_guard lock(progress->mu);
          if (st.ok() && k == 0) progress->first_seq = rec->first;
          error = st.ok() ? progress->error : std::optional<Error>(st.error());
          first = progress->first_seq;
        }
        if (error) {
          {
            std::lock_guard lock(self->state_failure_mu_);
            if (self->state_failure_.empty()) self->state_failure_ = error->message;
          }
          for (auto& d : *waiting) d(*error);
          return;
        }
        // Taken once every in-sync copy holds it; the records before its
        // first chunk may go then (NodeImpl's retention).
        auto taken = [self, waiting, info, positions, t0, first](const Status& released) {
          if (!released.ok()) {
            for (auto& d : *waiting)
              d(make_error(released.error().code, "state stream '" + self->meta_.state_stream +
                                                      "': checkpoint not replicated: " + released.error().message));
            return;
          }
          self->state_trim_.store(first, std::memory_order_release);
          self->checkpoint_taken(info, positions, t0, *waiting);
        };
        if (self->env_.when_replicated) self->env_.when_replicated(self->meta_.state_stream, rec->last, taken);
        else taken(Status::Ok());
      };
    }
    Status s = state_log_->append(b.finish(), *env_.gc, store::Admission::wait, store::WriteBatch(), std::move(done));
    if (!s.ok()) {
      {
        std::lock_guard lock(state_failure_mu_);
        if (state_failure_.empty()) state_failure_ = s.error().message;
      }
      for (auto& d : *waiting) d(s.error());
      return;
    }
  }
}

void QueryRunner::request_checkpoint(CheckpointDone done) {
  {
    std::lock_guard lock(mu_);
    // A stopped query is checkpointed where it stopped (again: the same).
    if (state_ != "running" && state_ != "stopped") {
      done(make_error(Errc::conflict, "query '" + meta_.name + "' is " + state_));
      return;
    }
    checkpoint_waiters_.push_back(std::move(done));
    checkpoint_wanted_.store(true);
  }
  if (stopped_.load()) {
    // No worker will run it: take it here.
    std::lock_guard lock(mu_);
    if (checkpoint_wanted_.exchange(false)) take_checkpoint(take_waiters());
    return;
  }
  // Force a run even when scheduled_ is set by a run in progress: the
  // request is picked up by whichever run comes next.
  scheduled_.store(false);
  schedule();
}

std::vector<QueryRunner::CheckpointDone> QueryRunner::take_waiters() {
  std::vector<CheckpointDone> waiters = std::move(checkpoint_waiters_);
  checkpoint_waiters_.clear();
  return waiters;
}

Result<CheckpointInfo> QueryRunner::drain_and_checkpoint() {
  std::promise<Result<CheckpointInfo>> promise;
  auto fut = promise.get_future();
  {
    std::lock_guard lock(mu_);
    if (state_ != "running") return make_error(Errc::conflict, "query '" + meta_.name + "' is " + state_);
    for (;;) {
      size_t chosen = inputs_.size();
      for (size_t i = 0; i < inputs_.size(); ++i)
        if (pos_[i] < inputs_[i]->visible_next()) chosen = i;
      if (chosen == inputs_.size()) break;
      if (!step(chosen)) return make_error(Errc::io_error, state_);
      bool any = false;
      for (auto& p : pending_out_) any |= !p.empty();
      if (any && !flush_outputs(false)) return make_error(Errc::io_error, state_);
    }
    auto waiters = take_waiters();
    checkpoint_wanted_.store(false);
    waiters.push_back([&promise](const Result<CheckpointInfo>& r) { promise.set_value(r); });
    take_checkpoint(std::move(waiters));
  }
  return fut.get();
}

Result<QueryRunner::State> QueryRunner::stopped_state(bool with_snapshot) {
  State state;
  std::vector<StreamPtr> outputs;
  {
    std::lock_guard lock(mu_);
    if (state_ != "running" && state_ != "stopped")
      return make_error(Errc::conflict, "query '" + meta_.name + "' is " + state_);
    bool any = !journal_pending_.empty();
    for (auto& p : pending_out_) any |= !p.empty();
    if (any && !flush_outputs(false)) return make_error(Errc::io_error, state_);
    state = State{pos_, out_next_, with_snapshot ? executor_->snapshot() : std::string(), journal_next_,
                  next_checkpoint_id_};
    outputs = outputs_;
  }
  // The rows it counts are in its outputs' logs before the state says so:
  // their appends were submitted to the group commit, which writes them a
  // moment later. A runner seeded with this state continues each output at
  // out_next and checks that the log holds exactly that much (seed()); read
  // at once, a merge back found the merge's last rows still in flight and
  // was refused ("continues at 78; the seed at 85"). The runner is stopped
  // (or gets nothing more), so the wait is for writes already made.
  const auto until = std::chrono::steady_clock::now() + kStoppedOutputsWait;
  for (size_t o = 0; o < outputs.size(); ++o) {
    while (outputs[o]->committed_next() < state.out_next[o]) {
      if (std::chrono::steady_clock::now() >= until)
        return make_error(Errc::unavailable, "query '" + meta_.name + "': output '" + meta_.outputs[o] + "' holds " +
                                                 std::to_string(outputs[o]->committed_next() - 1) + " rows, " +
                                                 std::to_string(state.out_next[o] - 1) + " were written to it; the "
                                                 "rest did not reach its log within 10 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return state;
}

Status QueryRunner::seed(const State& state, bool continue_journal) {
  std::lock_guard lock(mu_);
  if (state.positions.size() != inputs_.size() || state.out_next.size() != outputs_.size())
    return make_error(Errc::invalid_argument, "query '" + meta_.name + "': a seed of " +
                                                  std::to_string(state.positions.size()) + " inputs and " +
                                                  std::to_string(state.out_next.size()) + " outputs, for " +
                                                  std::to_string(inputs_.size()) + " and " +
                                                  std::to_string(outputs_.size()));
  for (size_t o = 0; o < outputs_.size(); ++o)
    if (state.out_next[o] != outputs_[o]->committed_next())  // neither a gap nor a repeat
      return make_error(Errc::invalid_argument, "query '" + meta_.name + "': output '" + meta_.outputs[o] +
                                                    "' continues at " + std::to_string(outputs_[o]->committed_next()) +
                                                    "; the seed at " + std::to_string(state.out_next[o]));
  if (!state.snapshot.empty()) ENTENTE_RETURN_IF_ERROR(executor_->restore(state.snapshot));
  pos_ = state.positions;
  out_next_ = state.out_next;
  if (continue_journal) {
    journal_next_ = state.journal_next;
    next_checkpoint_id_ = std::max(next_checkpoint_id_, state.next_checkpoint_id);
  }
  for (size_t o = 0; o < outputs_.size(); ++o)
    if (internal_out_[o]) out_watermark_[o] = executor_->output_watermark(o);
  for (size_t i = 0; i < inputs_.size(); ++i) {
    positions_[i].store(pos_[i]);
    pins_[i].store(pos_[i]);
  }
  return Status::Ok();
}

QueryInfo QueryRunner::info() const {
  QueryInfo qi;
  {
    // A run can hold mu_ for long: waiting for the followers of its state
    // stream (or of its outputs, before a checkpoint). Waiting for it here
    // deadlocked a node: a /metrics scrape calls this holding the metrics
    // registry's lock, which the peer link thread needed to take in on its
    // way to answering those very followers. So when a run holds mu_, the
    // values read last time, with the positions as they are now.
    std::unique_lock lock(mu_, std::try_to_lock);
    std::lock_guard cache(info_mu_);
    if (lock.owns_lock()) {
      info_cache_.state = state_;
      // Read under mu_, between runs: the executor is not thread-safe.
      info_cache_.boxes = executor_->box_stats();
      info_cache_.positions = pos_;
    } else {
      info_cache_.positions.resize(inputs_.size());
      for (size_t i = 0; i < inputs_.size(); ++i) info_cache_.positions[i] = positions_[i].load(std::memory_order_acquire);
      if (info_cache_.state.empty()) info_cache_.state = "running";
    }
    qi.state = info_cache_.state;
    qi.boxes = info_cache_.boxes;
    qi.positions = info_cache_.positions;
  }
  qi.lag_tuples = lag_tuples();
  const CpuLoad::Reading load = cpu_load_.read();
  qi.cpu_ms_per_s = load.cpu_ms_per_s;
  qi.cpu_seconds = load.cpu_seconds;
  std::lock_guard cl(cp_mu_);
  qi.checkpoint = last_checkpoint_;
  qi.tuples_in_per_s = rate_in_;
  qi.tuples_out_per_s = rate_out_;
  return qi;
}

uint64_t QueryRunner::lag_tuples() const {
  uint64_t lag = 0;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    const uint64_t head = inputs_[i]->visible_next();
    const uint64_t p = positions_[i].load(std::memory_order_acquire);
    if (head > p) lag += head - p;
  }
  return lag;
}

void QueryRunner::add_erase_state(store::WriteBatch& wb, const QueryMeta& meta) {
  store::Checkpoints::add_erase_all(wb, checkpoint_owner(meta));
  wb.erase_range(store::Cf::log, journal_key(meta.id, 0), journal_key(meta.id, UINT64_MAX));
}

}  // namespace entente::broker::detail
