// `entente publish` (NDJSON from a file or stdin into a stream, in batches
// named with a producer id and number, so that a batch sent again after a
// lost answer is not stored twice: docs/api.md, "Publishing exactly once")
// and `entente imports` (GET/POST/DELETE /v1/imports). See docs/cli.md.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "base/json_read.h"
#include "broker/cli_api_parts.h"
#include "broker/detail/json_out.h"

namespace entente::broker::cli {
namespace {

// Bounds of publish: a line (one tuple), a batch in tuples and bytes (well
// under the node's default api.limits.max_body_bytes), the retries of one
// batch, and the wait between two.
constexpr size_t kMaxLineBytes = 1u << 20;
constexpr uint64_t kDefaultBatchTuples = 500;
constexpr uint64_t kMaxBatchTuples = 10'000;
constexpr size_t kMaxBatchBytes = 4u << 20;
constexpr uint64_t kDefaultRetries = 10;
constexpr uint64_t kMaxRetries = 100;
constexpr int64_t kFirstBackoffMs = 100;
constexpr int64_t kMaxBackoffMs = 2'000;
constexpr size_t kMaxProducerId = 64;

// Lines of a file or stdin, each at most kMaxLineBytes; counts them.
class LineReader final {
 public:
  explicit LineReader(std::FILE* f) : f_(f) {}

  // The next line without its '\n'; nullopt at the end. An error when a
  // line is too long or the read fails.
  Result<std::optional<std::string>> next() {
    std::string line;
    int c = 0;
    // One thread reads the file: no locking per character.
    while ((c = getc_unlocked(f_)) != EOF && c != '\n') {
      if (line.size() == kMaxLineBytes)
        return make_error(Errc::limit_exceeded, "line " + std::to_string(number_ + 1) + ": longer than " +
                                                    std::to_string(kMaxLineBytes) + " bytes");
      line += static_cast<char>(c);
    }
    if (std::ferror(f_)) return make_error(Errc::io_error, std::strerror(errno));
    if (c == EOF && line.empty()) return std::optional<std::string>();
    ++number_;
    return std::optional<std::string>(std::move(line));
  }
  uint64_t number() const { return number_; }

 private:
  std::FILE* f_;
  uint64_t number_ = 0;
};

// One batch: its NDJSON body and the file line of each of its rows.
struct Batch {
  std::string body;
  std::vector<uint64_t> lines;
};

struct PublishOptions {
  std::string stream_path;  // percent-encoded
  std::string producer;
  uint64_t next_number = 1;
  uint64_t batch_tuples = kDefaultBatchTuples;
  uint64_t retries = kDefaultRetries;
};

// What was published, for the summary.
struct Tally {
  uint64_t tuples = 0, batches = 0, duplicate_batches = 0, duplicate_tuples = 0, retries = 0;
  uint64_t first_seq = 0, last_seq = 0;
};

bool blank(const std::string& line) {
  return std::all_of(line.begin(), line.end(), [](char c) { return c == ' ' || c == '\t' || c == '\r'; });
}

// Fills `b` from `in` up to the batch's bounds; a line that is not a JSON
// object is refused here, with its line number, before anything is sent.
Status read_batch(LineReader& in, uint64_t max_tuples, Batch& b) {
  while (b.lines.size() < max_tuples && b.body.size() < kMaxBatchBytes) {
    ENTENTE_ASSIGN_OR_RETURN(auto line, in.next());
    if (!line) break;
    if (blank(*line)) continue;
    rapidjson::Document d;
    if (auto problem = base::read_json(*line, d))
      return make_error(Errc::invalid_argument,
                        "line " + std::to_string(in.number()) + ": not JSON: " + problem->message());
    if (!d.IsObject())
      return make_error(Errc::invalid_argument, "line " + std::to_string(in.number()) +
                                                    ": expected a JSON object (one tuple), not " +
                                                    std::string(base::json_kind(d)));
    b.body += *line;
    b.body += '\n';
    b.lines.push_back(in.number());
  }
  return {};
}

// The file line of a refused batch's row, from the node's `errors`.
void report_rows(const std::string& body, const Batch& b) {
  rapidjson::Document d;
  if (base::read_json(body, d) || !d.IsObject()) return;
  for (const auto& e : array_of(d, "errors")) {
    const Value* row = get(e, "row");
    if (row && row->IsUint64() && row->GetUint64() < b.lines.size())
      std::fprintf(stderr, "entente publish: the refused row is line %llu of the input\n",
                   static_cast<unsigned long long>(b.lines[row->GetUint64()]));
  }
}

// A failure to connect that trying again cannot mend: a certificate the
// CA given does not verify, TLS to a plain-HTTP node.
bool is_setting_problem(const std::string& m) {
  return m.find("certificate verify failed") != std::string::npos ||
         m.find("wrong version number") != std::string::npos;
}

// Seconds from a Retry-After header, else an exponential backoff.
int64_t wait_ms(const http::ClientResponse* r, uint64_t attempt) {
  if (r != nullptr) {
    if (auto after = r->header("retry-after")) {
      if (auto s = parse_uint(*after)) return static_cast<int64_t>(std::min<uint64_t>(*s, 30)) * 1000;
    }
  }
  return std::min(kMaxBackoffMs, kFirstBackoffMs << std::min<uint64_t>(attempt, 10));
}

// Adds a batch's answer ({"count", "first_seq", "last_seq", "duplicate"})
// to the tally.
Exit account(const std::string& body, const Batch& b, Tally& t) {
  rapidjson::Document d;
  if (base::read_json(body, d) || !d.IsObject() || !get(d, "count")) return unexpected("batch answer");
  const uint64_t count = uint_of(d, "count");
  const Value* dup = get(d, "duplicate");
  ++t.batches;
  t.tuples += count;
  if (dup && dup->IsBool() && dup->GetBool()) {
    ++t.duplicate_batches;
    t.duplicate_tuples += count;
  }
  if (t.first_seq == 0) t.first_seq = uint_of(d, "first_seq");
  t.last_seq = std::max(t.last_seq, uint_of(d, "last_seq"));
  if (count != b.lines.size()) {
    std::fprintf(stderr,
                 "entente publish: warning: the node counted %llu tuples in a batch of %zu lines (lines "
                 "%llu-%llu): was this producer id and number used before for other tuples?\n",
                 static_cast<unsigned long long>(count), b.lines.size(),
                 static_cast<unsigned long long>(b.lines.front()),
                 static_cast<unsigned long long>(b.lines.back()));
  }
  return Exit::ok;
}

// Sends batch `number` until the node answers it other than 429/503, or
// the retries are spent. The same producer id and number each time: a batch
// the node stored before the answer was lost is answered as a duplicate.
Exit send_batch(Api& api, const PublishOptions& o, uint64_t number, const Batch& b, Tally& t) {
  const std::string target = "/v1/streams/" + o.stream_path + "/tuples";
  const Api::Headers headers = {{"entente-producer-id", o.producer},
                                {"entente-producer-seq", std::to_string(number)}};
  for (uint64_t attempt = 0;; ++attempt) {
    auto r = api.send("POST", target, b.body, "application/x-ndjson", headers);
    const bool again = !r.ok() ? r.error().code == Errc::io_error && !is_setting_problem(r.error().message)
                               : r->status == 429 || r->status == 503;
    if (!again || attempt >= o.retries) {
      if (!r.ok()) {
        api.report_unreachable(r.error());
        return Exit::unreachable;
      }
      if (r->status == 200) return account(r->body, b, t);
      api.report_refusal("POST", target, *r);
      report_rows(r->body, b);
      return Api::exit_for(r->status);
    }
    ++t.retries;
    std::fprintf(stderr, "entente publish: batch %llu (lines %llu-%llu): %s; sending it again\n",
                 static_cast<unsigned long long>(number), static_cast<unsigned long long>(b.lines.front()),
                 static_cast<unsigned long long>(b.lines.back()),
                 r.ok() ? ("the node answered " + std::to_string(r->status)).c_str()
                        : printable(r.error().message).c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms(r.ok() ? &*r : nullptr, attempt)));
  }
}

// A producer id of this run: "entente-cli-HOST-PID-RANDOM", within the
// API's 64 characters of A-Z a-z 0-9 . _ : -.
std::string fresh_producer_id() {
  char host[65] = {};
  ::gethostname(host, sizeof host - 1);
  std::string h;
  for (char* c = host; *c && h.size() < 24; ++c) {
    const bool ok = std::isalnum(static_cast<unsigned char>(*c)) || *c == '.' || *c == '_' || *c == '-';
    h += ok ? *c : '_';
  }
  std::random_device rd;
  char tail[32];
  std::snprintf(tail, sizeof tail, "%d-%08x", static_cast<int>(::getpid()), rd());
  return "entente-cli-" + (h.empty() ? std::string("host") : h) + "-" + tail;
}

// A count option from 1 (or 0 when `zero_ok`) to `max`, else `fallback`.
Result<uint64_t> count_option(const CommandLine& c, std::string_view name, uint64_t fallback, uint64_t max,
                              bool zero_ok) {
  const std::string* v = c.value(name);
  if (v == nullptr) return fallback;
  const auto n = parse_uint(*v);
  if (!n || *n > max || (*n == 0 && !zero_ok))
    return make_error(Errc::invalid_argument, std::string(name) + " must be a whole number from " +
                                                  (zero_ok ? "0" : "1") + " to " + std::to_string(max) +
                                                  ", not '" + printable(*v) + "'");
  return *n;
}

Result<PublishOptions> publish_options(const CommandLine& c) {
  PublishOptions o;
  ENTENTE_ASSIGN_OR_RETURN(o.stream_path, path_name(c.words[0], "a stream name"));
  ENTENTE_ASSIGN_OR_RETURN(o.batch_tuples,
                           count_option(c, "--batch", kDefaultBatchTuples, kMaxBatchTuples, false));
  ENTENTE_ASSIGN_OR_RETURN(o.retries, count_option(c, "--retries", kDefaultRetries, kMaxRetries, true));
  ENTENTE_ASSIGN_OR_RETURN(o.next_number, count_option(c, "--first-batch", 1, UINT64_MAX / 2, false));
  if (const std::string* id = c.value("--producer-id")) {
    const bool ok =
        !id->empty() && id->size() <= kMaxProducerId && std::all_of(id->begin(), id->end(), [](char ch) {
          return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == ':' ||
                 ch == '-';
        });
    if (!ok)
      return make_error(Errc::invalid_argument,
                        "--producer-id must be 1 to 64 of A-Z a-z 0-9 . _ : -, not '" + printable(*id) + "'");
    o.producer = *id;
  } else {
    o.producer = fresh_producer_id();
  }
  return o;
}

void print_tally(const Api& api, const std::string& stream, const PublishOptions& o, const Tally& t) {
  if (api.output() == Output::json) {
    detail::JsonOut j;
    j.begin_object().key("stream").str(stream).key("tuples").u64(t.tuples).key("batches").u64(t.batches);
    j.key("duplicate_batches").u64(t.duplicate_batches).key("duplicate_tuples").u64(t.duplicate_tuples);
    j.key("retries").u64(t.retries).key("producer_id").str(o.producer);
    if (t.batches) j.key("first_seq").u64(t.first_seq).key("last_seq").u64(t.last_seq);
    j.end_object();
    std::printf("%s\n", j.take().c_str());
    return;
  }
  if (t.batches == 0) {
    std::printf("nothing to publish: the input has no tuples\n");
    return;
  }
  std::printf("published %llu tuples to %s in %llu batch%s (sequence numbers %llu..%llu)\n",
              static_cast<unsigned long long>(t.tuples), printable(stream).c_str(),
              static_cast<unsigned long long>(t.batches), t.batches == 1 ? "" : "es",
              static_cast<unsigned long long>(t.first_seq), static_cast<unsigned long long>(t.last_seq));
  if (t.duplicate_batches)
    std::printf(
        "%llu of the batches (%llu tuples) were stored before, by an earlier send of producer %s: "
        "not stored again\n",
        static_cast<unsigned long long>(t.duplicate_batches),
        static_cast<unsigned long long>(t.duplicate_tuples), o.producer.c_str());
  if (t.retries) std::printf("%llu retries\n", static_cast<unsigned long long>(t.retries));
}

// Where publishing stopped, and how to go on without storing anything twice.
// A batch the node refused (4xx) was not stored; one without an answer
// (`e` unreachable) may have been.
void report_stop(const PublishOptions& o, uint64_t number, const Batch& b, const Tally& t, Exit e) {
  std::fprintf(
      stderr,
      "entente publish: stopped at batch %llu (lines %llu-%llu); %llu tuples were published before it. ",
      static_cast<unsigned long long>(number), static_cast<unsigned long long>(b.lines.front()),
      static_cast<unsigned long long>(b.lines.back()), static_cast<unsigned long long>(t.tuples));
  if (e == Exit::unreachable) {
    std::fprintf(stderr,
                 "Batch %llu may or may not be stored: the same command with --producer-id %s stores nothing "
                 "twice\n",
                 static_cast<unsigned long long>(number), o.producer.c_str());
  } else {
    std::fprintf(stderr, "Nothing of batch %llu was stored\n", static_cast<unsigned long long>(number));
  }
}

}  // namespace

Exit publish(Api& api, const CommandLine& c) {
  auto o = publish_options(c);
  if (!o.ok()) return usage_error(o.error().message);
  const std::string* file = c.value("--file");
  const std::string path = file ? *file : "-";
  std::FILE* f = path == "-" ? stdin : std::fopen(path.c_str(), "rb");
  if (f == nullptr) return usage_error("--file " + printable(path) + ": " + std::strerror(errno));
  LineReader in(f);
  Tally t;
  Exit e = Exit::ok;
  for (uint64_t number = o->next_number;; ++number) {
    Batch b;
    if (Status s = read_batch(in, o->batch_tuples, b); !s.ok()) {
      std::fprintf(stderr, "entente publish: %s%s: %s\n", file ? "" : "stdin",
                   file ? printable(path).c_str() : "", s.error().message.c_str());
      if (t.batches)
        std::fprintf(stderr, "entente publish: %llu tuples before it were published\n",
                     static_cast<unsigned long long>(t.tuples));
      e = Exit::usage;
      break;
    }
    if (b.lines.empty()) break;
    if ((e = send_batch(api, *o, number, b, t)) != Exit::ok) {
      report_stop(*o, number, b, t, e);
      break;
    }
  }
  if (f != stdin) std::fclose(f);
  if (e == Exit::ok) print_tally(api, c.words[0], *o, t);
  return e;
}

// ------------------------------------------------------------ imports

namespace {

std::string import_reason(const Value& i) {
  const std::string r = field(i, "reason");
  return r.empty() ? "-" : r;
}

Exit print_import(const Value& i) {
  if (!i.IsObject() || !get(i, "stream")) return unexpected("import");
  Fields f;
  for (const char* key : {"stream", "state", "owner", "node"}) add_member(f, i, key);
  f.add("reason", import_reason(i));
  std::vector<std::string> schema;
  for (const auto& s : array_of(i, "schema")) schema.push_back(field(s, "name") + ":" + field(s, "type"));
  f.add("schema", schema.empty() ? "-" : join(schema, ", "));
  for (const char* key : {"next_seq", "acked", "tuples"}) add_member(f, i, key);
  f.print();
  return Exit::ok;
}

Exit print_import_list(const Value& d) {
  const Value* list = get(d, "imports");
  if (list == nullptr || !list->IsArray()) return unexpected("'imports' list");
  if (list->Empty()) {
    std::printf("no imports\n");
    return Exit::ok;
  }
  Table t({"STREAM", "STATE", "OWNER", "NEXT_SEQ", "TUPLES", "REASON"});
  for (const auto& i : list->GetArray())
    t.add({field(i, "stream"), field(i, "state"), field(i, "owner"), field(i, "next_seq"), field(i, "tuples"),
           import_reason(i)});
  t.print();
  return Exit::ok;
}

// "DOMAIN/NAME" as the two path segments of /v1/imports/{domain}/{name}.
Result<std::string> import_path(const std::string& stream) {
  const size_t slash = stream.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == stream.size() ||
      stream.find('/', slash + 1) != std::string::npos)
    return make_error(
        Errc::invalid_argument,
        "an import is named DOMAIN/NAME (the owner's domain and stream), not '" + printable(stream) + "'");
  ENTENTE_ASSIGN_OR_RETURN(const std::string domain, path_name(stream.substr(0, slash), "a domain"));
  ENTENTE_ASSIGN_OR_RETURN(const std::string name, path_name(stream.substr(slash + 1), "a stream name"));
  return domain + "/" + name;
}

}  // namespace

Exit imports_list(Api& api, const CommandLine&) {
  return get_and_print(api, "/v1/imports", print_import_list);
}

Exit imports_show(Api& api, const CommandLine& c) {
  const auto path = import_path(c.words[0]);
  if (!path.ok()) return usage_error(path.error().message);
  return get_and_print(api, "/v1/imports/" + *path, print_import);
}

Exit imports_create(Api& api, const CommandLine& c) {
  const std::string* node = c.value("--node");
  // With --node, NAME alone: a stream another node of this domain leads.
  const auto checked = node ? path_name(c.words[0], "a stream name") : import_path(c.words[0]);
  if (!checked.ok()) return usage_error(checked.error().message);
  if (node) {
    const auto n = path_name(*node, "--node");
    if (!n.ok()) return usage_error(n.error().message);
  }
  detail::JsonOut j;
  j.begin_object().key("stream").str(c.words[0]);
  if (node) j.key("node").str(*node);
  j.end_object();
  const Reply r = api.call("POST", "/v1/imports", j.take());
  return r.exit == Exit::ok ? emit(api, r, print_import) : r.exit;
}

Exit imports_delete(Api& api, const CommandLine& c) {
  const auto path = import_path(c.words[0]);
  if (!path.ok()) return usage_error(path.error().message);
  const Reply r = api.call("DELETE", "/v1/imports/" + *path);
  return r.exit == Exit::ok ? done(api, "deleted import " + c.words[0] + " and its mirror stream") : r.exit;
}

}  // namespace entente::broker::cli
