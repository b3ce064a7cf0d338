#include "broker/detail/ingest.h"

#include <signal.h>
#include <unistd.h>

#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "base/json_read.h"
#include "broker/detail/json_in.h"
#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "engine/codec.h"
#include "rapidjson/document.h"

namespace entente::broker::detail {

namespace {

http::Response row_problem(const std::string& message) {
  // Engine messages read "row N, field 'f': why" or "row N: why".
  JsonOut j;
  j.begin_array().begin_object();
  std::string_view m = message;
  if (m.rfind("row ", 0) == 0) {
    size_t i = 4;
    uint64_t row = 0;
    while (i < m.size() && std::isdigit(static_cast<unsigned char>(m[i]))) row = row * 10 + (m[i++] - '0');
    j.key("row").u64(row);
    const std::string_view fkey = ", field '";
    if (m.substr(i, fkey.size()) == fkey) {
      size_t end = m.find('\'', i + fkey.size());
      if (end != std::string_view::npos) j.key("field").str(m.substr(i + fkey.size(), end - i - fkey.size()));
    }
  }
  j.key("message").str(message).end_object().end_array();
  return http::Response::problem(400, "Bad Request", "the batch was rejected, nothing was stored: " + message,
                                 "\"errors\":" + j.take());
}

// A duplicate key (or too deep nesting) in row `row` of a batch, whose
// object's path is `row_path`: "row N, field 'K': given twice" for a key of
// the row itself, as the engine says of a schema field given twice.
std::string duplicate_message(const JsonProblem& p, size_t row, const std::string& row_path) {
  if (!p.key.empty() && p.path == row_path + "." + p.key)
    return "row " + std::to_string(row) + ", field '" + p.key.substr(0, 64) + "': given twice";
  return "row " + std::to_string(row) + ": " + p.message();
}

// One rule for the members a subscriber's rows carry besides the fields
// (docs/api.md): `_seq` is the node's to assign, never the publisher's; `_time`
// sets the event time only of a stream that has no event-time field (there
// the field is the event time, and a second source of it is refused).
std::optional<std::string> reserved_member_problem(const rapidjson::Value& rows, const StreamMeta& meta) {
  for (rapidjson::SizeType r = 0; r < rows.Size(); ++r) {
    const auto& row = rows[r];
    if (!row.IsObject()) continue;  // rows_from_json says what is wrong
    for (auto m = row.MemberBegin(); m != row.MemberEnd(); ++m) {
      const std::string_view key(m->name.GetString(), m->name.GetStringLength());
      if (key == "_seq")
        return "row " + std::to_string(r) +
               ", field '_seq': sequence numbers are assigned by the node; a published row may not carry one";
      if (key == "_time" && !meta.event_time.empty())
        return "row " + std::to_string(r) + ", field '_time': the event time of stream '" + meta.name +
               "' is its field '" + meta.event_time + "'; a row may not set it otherwise";
    }
  }
  return std::nullopt;
}

// ENTENTE_TEST_KILL_AFTER_COMMIT=N, for tests only: the process kills itself
// (SIGKILL) once a batch named with producer number N is durable, before it
// is acknowledged: the lost answer a publisher's retry has to survive.
// 0 (unset) normally.
uint64_t kill_after_commit_of() {
  static const uint64_t seq = [] {
    const char* v = std::getenv("ENTENTE_TEST_KILL_AFTER_COMMIT");
    uint64_t n = 0;
    if (v != nullptr) std::from_chars(v, v + std::strlen(v), n);
    return n;
  }();
  return seq;
}

// A duration or a size of a REST body, in the grammars of base/units.h
// (the same as node.json's and box options'); the first problem as an
// Error "PATH: MESSAGE".
Result<int64_t> duration_ms(const rapidjson::Value& v, const std::string& path) {
  Diagnostics diag;
  auto d = base::read_duration_ms(v, path, diag);
  if (!d) return make_error(Errc::invalid_argument, diag.to_string());
  return *d;
}

Result<uint64_t> size_bytes(const rapidjson::Value& v, const std::string& path) {
  Diagnostics diag;
  auto n = base::read_size_bytes(v, path, diag);
  if (!n) return make_error(Errc::invalid_argument, diag.to_string());
  return *n;
}

}  // namespace

std::string default_durability(const NodeConfig& config, size_t copies) {
  if (config.ingest_durability == IngestDurability::fsync) return "fsync";
  return copies > 1 ? "replicated" : "process";
}

Result<StreamMeta> parse_stream_spec(std::string_view body, const NodeConfig& config, std::string* node,
                                     int* replication) {
  rapidjson::Document d;
  ENTENTE_RETURN_IF_ERROR(read_json_body(body, d));
  if (!d.IsObject()) return make_error(Errc::invalid_argument, "$: expected an object with name and schema");
  StreamMeta m;
  m.producer = "api";
  m.retention = {config.retention.max_tuples, config.retention.max_bytes, config.retention.max_age_ms};
  bool have_schema = false;
  for (auto it = d.MemberBegin(); it != d.MemberEnd(); ++it) {
    std::string key(it->name.GetString(), it->name.GetStringLength());
    const auto& v = it->value;
    if (key == "name") {
      if (!v.IsString()) return make_error(Errc::invalid_argument, "$.name: expected a string");
      m.name.assign(v.GetString(), v.GetStringLength());
      if (Status s = check_stream_name(m.name); !s.ok())
        return make_error(Errc::invalid_argument, "$.name: " + s.error().message);
    } else if (key == "schema") {
      auto s = engine::schema_from_json(v, "$.schema");
      if (!s.ok()) return s.error();
      if (s->size() == 0) return make_error(Errc::invalid_argument, "$.schema: a stream needs at least one field");
      m.schema = std::make_shared<const engine::Schema>(std::move(s).value());
      have_schema = true;
    } else if (key == "event_time") {
      if (v.IsNull()) continue;
      if (!v.IsString()) return make_error(Errc::invalid_argument, "$.event_time: expected a field name or null");
      m.event_time.assign(v.GetString(), v.GetStringLength());
    } else if (key == "retention") {
      if (!v.IsObject()) return make_error(Errc::invalid_argument, "$.retention: expected an object");
      for (auto r = v.MemberBegin(); r != v.MemberEnd(); ++r) {
        std::string rk(r->name.GetString(), r->name.GetStringLength());
        if (rk == "max_tuples") {
          if (!r->value.IsUint64())
            return make_error(Errc::invalid_argument, "$.retention." + rk + ": expected a non-negative integer");
          m.retention.max_tuples = r->value.GetUint64();
        } else if (rk == "max_bytes") {
          ENTENTE_ASSIGN_OR_RETURN(m.retention.max_bytes, size_bytes(r->value, "$.retention.max_bytes"));
        } else if (rk == "max_age") {
          ENTENTE_ASSIGN_OR_RETURN(m.retention.max_age_ms, duration_ms(r->value, "$.retention.max_age"));
        } else {
          return make_error(Errc::invalid_argument,
                            "$.retention." + rk.substr(0, 64) + ": unknown key (max_tuples, max_bytes, max_age)");
        }
      }
    } else if (key == "node" && node != nullptr) {
      if (!v.IsString() || v.GetStringLength() == 0 || v.GetStringLength() > 63)
        return make_error(Errc::invalid_argument, "$.node: expected the name of a node of this domain");
      node->assign(v.GetString(), v.GetStringLength());
    } else if (key == "durability") {
      if (!v.IsString() || !durability_of(std::string_view(v.GetString(), v.GetStringLength())))
        return make_error(Errc::invalid_argument, "$.durability: expected \"fsync\", \"replicated\" or "
                                                  "\"process\" (when an append is acknowledged)");
      m.durability.assign(v.GetString(), v.GetStringLength());
    } else if (key == "replication") {
      if (!v.IsInt() || v.GetInt() < 1 || v.GetInt() > 3)
        return make_error(Errc::invalid_argument, "$.replication: expected 1, 2 or 3 (copies of the log, on as many "
                                                  "nodes)");
      if (replication != nullptr) *replication = v.GetInt();
    } else {
      return make_error(Errc::invalid_argument, "$." + key.substr(0, 64) +
                                                    ": unknown key (name, schema, event_time, retention, node, "
                                                    "replication, durability)");
    }
  }
  if (m.name.empty()) return make_error(Errc::invalid_argument, "$.name: required");
  if (!have_schema) return make_error(Errc::invalid_argument, "$.schema: required");
  if (!m.event_time.empty()) {
    auto idx = m.schema->index_of(m.event_time);
    if (!idx) return make_error(Errc::invalid_argument, "$.event_time: '" + m.event_time + "' is not a field of the schema");
    if (!engine::is_int_repr(m.schema->field(*idx).type))
      return make_error(Errc::invalid_argument, "$.event_time: '" + m.event_time + "' must be a timestamp or int64 field");
  }
  return m;
}

Result<std::optional<ProducerTag>> producer_of(const http::Request& req) {
  auto id = req.header("entente-producer-id");
  if (!id) id = req.param("producer_id");
  auto seq = req.header("entente-producer-seq");
  if (!seq) seq = req.param("producer_seq");
  if (!id && !seq) return std::optional<ProducerTag>();
  if (!id || !seq)
    return make_error(Errc::invalid_argument,
                      std::string(id ? "Entente-Producer-Seq" : "Entente-Producer-Id") +
                          " is missing: a producer names a batch with both its id and the batch's number");
  if (id->empty() || id->size() > store::StreamLog::kMaxProducerBytes)
    return make_error(Errc::invalid_argument, "Entente-Producer-Id must be 1 to " +
                                                  std::to_string(store::StreamLog::kMaxProducerBytes) + " characters");
  for (char c : *id) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == ':' || c == '-'))
      return make_error(Errc::invalid_argument,
                        "Entente-Producer-Id may contain only A-Z, a-z, 0-9, '.', '_', ':' and '-'");
  }
  ProducerTag tag;
  tag.id.assign(*id);
  auto [p, ec] = std::from_chars(seq->data(), seq->data() + seq->size(), tag.seq);
  if (ec != std::errc() || p != seq->data() + seq->size() || tag.seq == 0)
    return make_error(Errc::invalid_argument, "Entente-Producer-Seq must be an integer from 1 to 2^64-1, not '" +
                                                  std::string(seq->substr(0, 40)) + "'");
  return std::optional<ProducerTag>(std::move(tag));
}

std::string ingest_answer_json(const IngestResult& r, const std::optional<ProducerTag>& producer) {
  JsonOut j;
  j.begin_object().key("count").u64(r.count).key("first_seq").u64(r.first).key("last_seq").u64(r.last);
  if (producer) j.key("producer_seq").u64(producer->seq).key("duplicate").boolean(r.duplicate);
  j.end_object();
  return j.take();
}

namespace {

// The callback that turns the outcome of an append into the answer: run once
// the batch is durable (or failed), or at once for a named batch stored
// before, on the group-commit thread or the caller's.
Stream::AppendedDone answer_when_appended(std::function<void(IngestResult)> done,
                                          const std::optional<ProducerTag>& producer) {
  const uint64_t seq_to_kill = kill_after_commit_of();
  const uint64_t producer_seq = producer ? producer->seq : 0;
  return [done = std::move(done), seq_to_kill, producer_seq](const Status& st, const Appended& a) {
    IngestResult res;
    if (!st.ok()) {
      if (st.error().code == Errc::conflict) {
        res.problem = http::Response::problem(409, "Conflict", st.error().message);
      } else if (st.error().code == Errc::unavailable) {
        res.problem = http::Response::problem(503, "Service Unavailable", st.error().message + "; retry later");
        res.problem->headers.emplace_back("Retry-After", "1");
      } else {
        res.problem = http::Response::problem(500, "Internal Server Error",
                                              "the tuples were not stored: " + st.error().message);
      }
    } else {
      res.count = a.last - a.first + 1;
      res.first = a.first;
      res.last = a.last;
      res.duplicate = a.duplicate;
      // Test-only fault (ENTENTE_TEST_KILL_AFTER_COMMIT): the node dies
      // after the batch is durable and before anyone is told.
      if (seq_to_kill != 0 && producer_seq == seq_to_kill && !a.duplicate) ::kill(::getpid(), SIGKILL);
    }
    done(std::move(res));
  };
}

// A binary body (engine/codec.h): exactly one batch of the stream's schema.
// Its event times are the event-time column's, or `now`.
std::optional<http::Response> read_binary_batch(const std::string& body, const StreamMeta& meta, int64_t now,
                                                engine::Batch& batch) {
  std::string_view in = body;
  auto b = engine::decode_batch(in, 1u << 22);
  if (!b.ok()) return http::Response::problem(400, "Bad Request", "binary batch: " + b.error().message);
  if (!in.empty()) {
    return http::Response::problem(400, "Bad Request",
                                   "binary batch: " + std::to_string(in.size()) + " bytes after the batch");
  }
  if (!(*b->schema == *meta.schema)) {
    return http::Response::problem(400, "Bad Request", "binary batch: schema " + b->schema->to_string() +
                                                           " is not the stream's " + meta.schema->to_string());
  }
  batch = std::move(b).value();
  batch.schema = meta.schema;
  const size_t n = batch.rows();
  if (!meta.event_time.empty()) {
    // The event-time column's values are the event times (shared, not copied).
    const auto& col = batch.columns[*meta.schema->index_of(meta.event_time)];
    batch.event_time = engine::RowVector<engine::EventTime>::alias(col, col->ints);
  } else {
    batch.event_time.reset().assign(n, now);
  }
  return std::nullopt;
}

// An NDJSON body parsed in place into `doc`, an array of its rows (blank
// lines skipped); `body` must outlive `doc`.
std::optional<http::Response> read_ndjson_rows(std::string& body, rapidjson::Document& doc) {
  doc.SetArray();
  auto& alloc = doc.GetAllocator();
  size_t row = 0;
  size_t start = 0;
  body.push_back('\n');
  while (start < body.size()) {
    size_t end = body.find('\n', start);
    body[end] = '\0';
    char* line = body.data() + start;
    size_t len = end - start;
    start = end + 1;
    bool blank = true;
    for (size_t i = 0; i < len && blank; ++i) blank = std::isspace(static_cast<unsigned char>(line[i])) != 0;
    if (blank) continue;
    rapidjson::Document one(&alloc);
    if (auto p = read_json_insitu(line, one)) {
      return row_problem(p->code == Errc::parse_error ? "row " + std::to_string(row) + ": " + p->why
                                                      : duplicate_message(*p, row, "$"));
    }
    doc.PushBack(static_cast<rapidjson::Value&>(one).Move(), alloc);
    ++row;
  }
  return std::nullopt;
}

// A JSON array or NDJSON body: rows of the stream's fields, checked as a
// whole (one bad row refuses the batch).
std::optional<http::Response> read_json_batch(std::string& body, IngestFormat format, const StreamMeta& meta,
                                              int64_t now, engine::Batch& batch) {
  rapidjson::Document doc;
  if (format == IngestFormat::json_array) {
    body.push_back('\0');
    if (auto p = read_json_insitu(body.data(), doc)) {
      return p->element ? row_problem(duplicate_message(*p, *p->element, "$[" + std::to_string(*p->element) + "]"))
                        : http::Response::problem(400, "Bad Request", p->message());
    }
    if (!doc.IsArray()) {
      return http::Response::problem(400, "Bad Request", "an application/json body must be an array of objects");
    }
  } else if (auto problem = read_ndjson_rows(body, doc)) {
    return problem;
  }
  if (doc.Empty()) return http::Response::problem(400, "Bad Request", "the body holds no tuples");
  if (auto why = reserved_member_problem(doc, meta)) return row_problem(*why);
  auto b = engine::rows_from_json(meta.schema, doc, meta.event_time, now);
  if (!b.ok()) return row_problem(b.error().message);
  batch = std::move(b).value();
  return std::nullopt;
}

// Backpressure: a query that has fallen this far behind would otherwise
// let the log (and its replay on restart) grow without bound.
std::optional<http::Response> lagging_reader_problem(NodeImpl& node, const StreamMeta& meta) {
  const size_t max_lag = node.config().query_max_lag_tuples;
  for (auto& q : node.readers_of(meta.name)) {
    const uint64_t lag = q->lag_tuples();
    if (lag > max_lag) {
      // A failed query still holds its input's log; say so, since retrying
      // will not help until it is deleted (or redeployed).
      const std::string state = q->info().state;
      const bool failed = state.rfind("failed", 0) == 0;
      auto r = http::Response::problem(
          429, "Too Many Requests",
          "query '" + q->meta().name + "' is " + std::to_string(lag) +
              " tuples behind on its inputs (limit " + std::to_string(max_lag) + ")" +
              (failed ? "; it has " + state + ", so delete or redeploy it to accept more"
                      : "; retry later"));
      r.headers.emplace_back("Retry-After", "1");
      return r;
    }
  }
  return std::nullopt;
}

// The answer to an append the stream refused before submitting it.
http::Response append_refused(const Status& s) {
  if (s.error().code == Errc::unavailable) {
    auto r = http::Response::problem(503, "Service Unavailable", s.error().message + "; retry later");
    r.headers.emplace_back("Retry-After", "1");
    return r;
  }
  if (s.error().code == Errc::not_found) return http::Response::problem(404, "Not Found", s.error().message);
  return http::Response::problem(400, "Bad Request", s.error().message);
}

}  // namespace

void ingest(NodeImpl& node, const StreamPtr& stream, IngestFormat format, std::string body,
            const std::optional<ProducerTag>& producer, std::function<void(IngestResult)> done) {
  const auto& meta = stream->meta();
  // Stored here is not yet acknowledged: the stream's in-sync followers
  // must hold it too (docs/cluster.md, "Replicated stream logs").
  done = [&node, name = meta.name, answer = std::move(done)](IngestResult r) {
    if (r.problem || r.last == 0) {
      answer(std::move(r));
      return;
    }
    const uint64_t last = r.last;
    node.when_replicated(name, last, [answer, r = std::move(r)](const Status& st) mutable {
      if (!st.ok()) {
        r.problem = http::Response::problem(503, "Service Unavailable", st.error().message);
        r.problem->headers.emplace_back("Retry-After", "1");
      }
      answer(std::move(r));
    });
  };
  auto refuse = [&](http::Response r) {
    IngestResult res;
    res.problem = std::move(r);
    done(std::move(res));
  };
  if (meta.producer != "api") {
    refuse(http::Response::problem(409, "Conflict", "stream '" + meta.name + "' is written by " + meta.producer +
                                                        "; it takes no tuples from publishers"));
    return;
  }
  Stream::AppendedDone on_appended = answer_when_appended(done, producer);
  // A named batch sent again is answered before its body is even read.
  if (producer && stream->recall(*producer, on_appended)) return;

  const int64_t now = wall_clock_ms();
  engine::Batch batch;
  auto problem = format == IngestFormat::binary ? read_binary_batch(body, meta, now, batch)
                                                : read_json_batch(body, format, meta, now, batch);
  if (!problem && batch.rows() == 0) {
    problem = http::Response::problem(400, "Bad Request", "the body holds no tuples");
  }
  if (!problem) problem = lagging_reader_problem(node, meta);
  if (problem) {
    refuse(std::move(*problem));
    return;
  }
  Status s = producer ? stream->append_once(std::move(batch), *producer, node.gc(), store::Admission::reject,
                                            std::move(on_appended))
                      : stream->append(std::move(batch), node.gc(), store::Admission::reject, store::WriteBatch(),
                                       [on_appended](const Status& st, const RecordPtr& rec) {
                                         on_appended(st, rec ? Appended{rec->first, rec->last, false} : Appended{});
                                       });
  if (!s.ok()) refuse(append_refused(s));
}

}  // namespace entente::broker::detail
