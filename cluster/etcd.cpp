// The etcd client (see etcd.h): JSON requests to etcd's v3 gateway over
// pooled http::Client connections, failover between endpoints, answers read
// with the tree's one JSON reader and bounded in size and in keys.
//
// The gateway speaks proto3 JSON: bytes are base64, int64 and uint64 fields
// are JSON strings ("revision":"12"), and a field equal to its zero value
// (0, false, "", an empty list) is left out, so every reader here treats a
// missing field as zero.

#include "cluster/etcd.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <mutex>
#include <utility>

#include "base/json_read.h"
#include "base/json_text.h"
#include "http/client.h"

namespace entente::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using rapidjson::Value;

// Bounds on what etcd may send: an answer's body (etcd's own request limit
// is 1.5 MiB per value, so this holds ranges of many values), the keys one
// range may return (more is limit_exceeded: read with a limit instead), one
// message of a watch stream.
constexpr uint64_t kMaxAnswerBytes = 64u << 20;
constexpr int64_t kMaxKvs = 100'000;
constexpr size_t kMaxWatchMessageBytes = 64u << 20;
// Idle connections kept per endpoint; more concurrent calls connect anew
// and close after use.
constexpr size_t kMaxIdlePerEndpoint = 4;
// How often a blocked watch looks at its stop flag (the header promises 200).
constexpr int64_t kWatchPollMs = 100;
// A pooled connection that fails sooner than this fraction of the timeout
// was most likely closed while idle (etcd restarted, or its keep-alive
// expired): the call is retried once on a fresh connection to the same
// endpoint. One that timed out is not retried there (a paused etcd would
// double the wait).
constexpr int64_t kStaleFailureFraction = 2;

// ---- base64 (RFC 4648, with padding), the gateway's encoding of bytes

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string b64_encode(std::string_view in) {
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= in.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8) |
                       uint32_t(uint8_t(in[i + 2]));
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == in.size()) {
    const uint32_t v = uint32_t(uint8_t(in[i])) << 16;
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += "==";
  } else if (i + 2 == in.size()) {
    const uint32_t v = (uint32_t(uint8_t(in[i])) << 16) | (uint32_t(uint8_t(in[i + 1])) << 8);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;  // '-' and '_': the URL alphabet, which Go also accepts
  if (c == '/' || c == '_') return 63;
  return -1;
}

// Decodes padded or unpadded base64; nullopt on anything else.
std::optional<std::string> b64_decode(std::string_view in) {
  while (!in.empty() && in.back() == '=') in.remove_suffix(1);
  if (in.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(in.size() / 4 * 3 + 2);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    const int v = b64_value(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xff);
    }
  }
  return out;
}

// ---- endpoints

struct Endpoint {
  std::string name;  // "127.0.0.1:2379", in messages
  http::ClientOptions client;
};

// "http://host:port" or "https://host:port" (a trailing '/' allowed; the
// port defaults to 2379; an IPv6 address in brackets).
Result<Endpoint> parse_endpoint(std::string_view url, const EtcdOptions& options) {
  auto bad = [&](std::string_view why) {
    return make_error(Errc::invalid_argument,
                      "etcd endpoint '" + std::string(url) + "': " + std::string(why));
  };
  Endpoint e;
  std::string_view rest = url;
  if (rest.starts_with("http://")) {
    rest.remove_prefix(7);
  } else if (rest.starts_with("https://")) {
    rest.remove_prefix(8);
    e.client.tls = true;
    e.client.ca_file = options.ca_file;
  } else {
    return bad("must start with http:// or https://");
  }
  if (rest.ends_with("/")) rest.remove_suffix(1);
  if (rest.empty()) return bad("no host");
  std::string_view host = rest;
  std::string_view port;
  if (rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad("unclosed '['");
    host = rest.substr(1, close - 1);
    const std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("expected ':' after ']'");
      port = after.substr(1);
    }
  } else if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty()) return bad("no host");
  for (char c : host) {
    if (c == '/' || c == '@' || c == '?' || c == '#' || static_cast<unsigned char>(c) <= 32) {
      return bad("a path, user or query is not allowed, only scheme://host:port");
    }
  }
  uint32_t port_number = 2379;
  if (!port.empty() || rest.back() == ':') {
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), port_number);
    if (ec != std::errc() || ptr != port.data() + port.size() || port_number == 0 ||
        port_number > 65535) {
      return bad("the port must be a number from 1 to 65535");
    }
  }
  e.client.host = std::string(host);
  e.client.port = static_cast<uint16_t>(port_number);
  e.client.timeout_ms = options.timeout_ms;
  e.client.max_body_bytes = kMaxAnswerBytes;
  e.name = (host.find(':') != std::string_view::npos ? "[" + e.client.host + "]" : e.client.host) +
           ":" + std::to_string(port_number);
  return e;
}

// ---- reading answers

// The problem with an answer that does not have the shape etcd gives.
Error bad_answer(const std::string& where, std::string_view why) {
  return make_error(Errc::corrupt, "etcd " + where + ": unexpected answer: " + std::string(why));
}

const Value* member(const Value& obj, const char* name) {
  if (!obj.IsObject()) return nullptr;
  const auto it = obj.FindMember(name);
  return it == obj.MemberEnd() ? nullptr : &it->value;
}

// An int64 field: a JSON string of digits (proto3 JSON) or a number;
// missing: 0.
Result<int64_t> read_int(const Value& obj, const char* name, const std::string& where) {
  const Value* v = member(obj, name);
  if (v == nullptr || v->IsNull()) return int64_t{0};
  if (v->IsInt64()) return v->GetInt64();
  if (v->IsString()) {
    const std::string_view s(v->GetString(), v->GetStringLength());
    int64_t out = 0;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    if (ec == std::errc() && ptr == s.data() + s.size() && !s.empty()) return out;
  }
  return bad_answer(where, std::string("'") + name + "' is not a 64-bit integer");
}

bool read_bool(const Value& obj, const char* name) {
  const Value* v = member(obj, name);
  return v != nullptr && v->IsBool() && v->GetBool();
}

std::string read_string(const Value& obj, const char* name) {
  const Value* v = member(obj, name);
  if (v == nullptr || !v->IsString()) return {};
  return std::string(v->GetString(), v->GetStringLength());
}

// A bytes field (base64); missing: empty.
Result<std::string> read_bytes(const Value& obj, const char* name, const std::string& where) {
  const Value* v = member(obj, name);
  if (v == nullptr || v->IsNull()) return std::string();
  if (!v->IsString()) return bad_answer(where, std::string("'") + name + "' is not a string");
  auto out = b64_decode(std::string_view(v->GetString(), v->GetStringLength()));
  if (!out) return bad_answer(where, std::string("'") + name + "' is not base64");
  return std::move(*out);
}

int64_t header_revision(const Value& obj) {
  const Value* h = member(obj, "header");
  if (h == nullptr) return 0;
  auto r = read_int(*h, "revision", "");
  return r.ok() ? *r : 0;
}

Result<KeyValue> read_kv(const Value& v, const std::string& where) {
  if (!v.IsObject()) return bad_answer(where, "a key-value is not an object");
  KeyValue kv;
  ENTENTE_ASSIGN_OR_RETURN(kv.key, read_bytes(v, "key", where));
  ENTENTE_ASSIGN_OR_RETURN(kv.value, read_bytes(v, "value", where));
  ENTENTE_ASSIGN_OR_RETURN(kv.create_revision, read_int(v, "create_revision", where));
  ENTENTE_ASSIGN_OR_RETURN(kv.mod_revision, read_int(v, "mod_revision", where));
  ENTENTE_ASSIGN_OR_RETURN(kv.version, read_int(v, "version", where));
  ENTENTE_ASSIGN_OR_RETURN(kv.lease, read_int(v, "lease", where));
  return kv;
}

// A RangeResponse; more than kMaxKvs keys is limit_exceeded.
Result<RangeResult> read_range(const Value& obj, const std::string& where) {
  RangeResult out;
  out.revision = header_revision(obj);
  ENTENTE_ASSIGN_OR_RETURN(out.count, read_int(obj, "count", where));
  out.more = read_bool(obj, "more");
  if (const Value* kvs = member(obj, "kvs"); kvs != nullptr) {
    if (!kvs->IsArray()) return bad_answer(where, "'kvs' is not an array");
    if (kvs->Size() > static_cast<rapidjson::SizeType>(kMaxKvs)) {
      return make_error(Errc::limit_exceeded, "etcd " + where + ": more than " +
                                                  std::to_string(kMaxKvs) +
                                                  " keys in one range; read it with a limit");
    }
    out.kvs.reserve(kvs->Size());
    for (const Value& v : kvs->GetArray()) {
      ENTENTE_ASSIGN_OR_RETURN(KeyValue kv, read_kv(v, where));
      out.kvs.push_back(std::move(kv));
    }
  }
  return out;
}

// An error answer ({"error":"...","message":"...","code":N}, or in a
// stream {"error":{"grpc_code":N,"message":"..."}}) as an Error: the gRPC
// status code decides the Errc, etcd's message is kept.
Error etcd_error(const std::string& where, unsigned http_status, const Value* doc,
                 std::string_view body) {
  int64_t code = -1;
  std::string message;
  if (doc != nullptr && doc->IsObject()) {
    const Value* inner = member(*doc, "error");
    const Value& e = inner != nullptr && inner->IsObject() ? *inner : *doc;
    if (const Value* c = member(e, "code"); c != nullptr && c->IsInt64()) code = c->GetInt64();
    if (const Value* c = member(e, "grpc_code"); c != nullptr && c->IsInt64()) code = c->GetInt64();
    message = read_string(e, "message");
    if (message.empty()) message = read_string(e, "error");
  }
  if (message.empty()) {
    message = "HTTP " + std::to_string(http_status) + ": " +
              std::string(body.substr(0, std::min<size_t>(body.size(), 200)));
  }
  Errc errc = Errc::io_error;
  switch (code) {
    case 3: errc = Errc::invalid_argument; break;   // INVALID_ARGUMENT
    case 5: errc = Errc::not_found; break;          // NOT_FOUND
    case 6: errc = Errc::already_exists; break;     // ALREADY_EXISTS
    case 7: case 16: errc = Errc::permission_denied; break;  // PERMISSION_DENIED, UNAUTHENTICATED
    case 8: errc = Errc::limit_exceeded; break;     // RESOURCE_EXHAUSTED (request too large)
    case 9: case 11: errc = Errc::conflict; break;  // FAILED_PRECONDITION, OUT_OF_RANGE (compacted)
    case 12: errc = Errc::unsupported; break;       // UNIMPLEMENTED
    case 1: case 4: case 10: case 14: errc = Errc::unavailable; break;  // CANCELLED, DEADLINE, ABORTED, UNAVAILABLE
    default:
      if (http_status == 503) errc = Errc::unavailable;
      else if (http_status >= 400 && http_status < 500) errc = Errc::invalid_argument;
      break;
  }
  return make_error(errc, "etcd " + where + ": " + message);
}

// ---- writing requests (keys and values are base64, so only their quotes
// are JSON syntax; numbers go as strings, like the gateway writes them)

void add_bytes(std::string& out, const char* name, std::string_view bytes) {
  out += '"';
  out += name;
  out += "\":\"";
  out += b64_encode(bytes);
  out += '"';
}

void add_int(std::string& out, const char* name, int64_t v) {
  out += '"';
  out += name;
  out += "\":\"";
  out += std::to_string(v);
  out += '"';
}

// "key" and "range_end" of a key or of every key under a prefix. The empty
// prefix is the whole key space: key "\0", range_end "\0" (etcd refuses an
// empty key).
void add_range(std::string& out, std::string_view key, bool prefix) {
  if (prefix) {
    add_bytes(out, "key", key.empty() ? std::string_view("\0", 1) : key);
    out += ',';
    add_bytes(out, "range_end", prefix_end(key));
  } else {
    add_bytes(out, "key", key);
  }
}

// A RangeRequest's fields; `limit` 0 asks for one more key than the bound,
// so that a range over it is noticed.
std::string range_request(std::string_view key, bool prefix, int64_t limit) {
  std::string out = "{";
  add_range(out, key, prefix);
  if (prefix) {
    out += ',';
    add_int(out, "limit", limit > 0 ? limit : kMaxKvs + 1);
  }
  out += '}';
  return out;
}

std::string op_request(const TxnOp& op) {
  std::string out;
  switch (op.kind) {
    case TxnOp::Kind::put:
      out = "{\"request_put\":{";
      add_bytes(out, "key", op.key);
      out += ',';
      add_bytes(out, "value", op.value);
      if (op.lease != 0) {
        out += ',';
        add_int(out, "lease", op.lease);
      }
      out += "}}";
      break;
    case TxnOp::Kind::erase:
      out = "{\"request_delete_range\":{";
      add_range(out, op.key, op.prefix);
      out += "}}";
      break;
    case TxnOp::Kind::get:
      out = "{\"request_range\":" + range_request(op.key, op.prefix, 0) + "}";
      break;
  }
  return out;
}

std::string compare_request(const Compare& c) {
  static constexpr const char* kTargets[] = {"VERSION", "CREATE", "MOD", "VALUE", "LEASE"};
  static constexpr const char* kFields[] = {"version", "create_revision", "mod_revision", "value",
                                            "lease"};
  static constexpr const char* kOps[] = {"EQUAL", "NOT_EQUAL", "GREATER", "LESS"};
  const auto target = static_cast<size_t>(c.target);
  std::string out = "{";
  add_bytes(out, "key", c.key);
  out += ",\"target\":\"";
  out += kTargets[target];
  out += "\",\"result\":\"";
  out += kOps[static_cast<size_t>(c.op)];
  out += "\",";
  if (c.target == Compare::Target::value) {
    add_bytes(out, kFields[target], c.value);
  } else {
    add_int(out, kFields[target], c.number);
  }
  out += '}';
  return out;
}

std::string ops_request(const std::vector<TxnOp>& ops) {
  std::string out = "[";
  for (size_t i = 0; i < ops.size(); ++i) {
    if (i > 0) out += ',';
    out += op_request(ops[i]);
  }
  out += ']';
  return out;
}

// ---- the watch stream

// Splits a stream of concatenated JSON objects (whitespace between them)
// into whole objects, without parsing: braces outside strings are counted.
class ObjectSplitter {
 public:
  // Appends `bytes`; complete objects go to `out`. corrupt when something
  // other than an object starts at top level; limit_exceeded when one
  // object grows over the bound.
  Status feed(std::string_view bytes, std::vector<std::string>& out) {
    for (char c : bytes) {
      if (depth_ == 0) {
        if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
        if (c != '{') return make_error(Errc::corrupt, "a watch message does not start with '{'");
      }
      if (current_.size() >= kMaxWatchMessageBytes) {
        return make_error(Errc::limit_exceeded,
                          "a watch message over " + std::to_string(kMaxWatchMessageBytes) + " bytes");
      }
      current_ += c;
      if (in_string_) {
        if (escaped_) {
          escaped_ = false;
        } else if (c == '\\') {
          escaped_ = true;
        } else if (c == '"') {
          in_string_ = false;
        }
        continue;
      }
      if (c == '"') {
        in_string_ = true;
      } else if (c == '{' || c == '[') {
        ++depth_;
      } else if ((c == '}' || c == ']') && --depth_ == 0) {
        out.push_back(std::move(current_));
        current_.clear();
      }
    }
    return {};
  }

 private:
  std::string current_;
  size_t depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
};

}  // namespace

std::string prefix_end(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  // No key is greater than every key with this prefix: "\0" is etcd's
  // "to the end of the key space".
  return std::string(1, '\0');
}

// ---------------------------------------------------------------------------

struct Etcd::Impl {
  EtcdOptions options;
  std::vector<Endpoint> endpoints;

  std::mutex mu;
  // Idle connections per endpoint. GUARDED_BY(mu)
  std::vector<std::vector<std::unique_ptr<http::Client>>> idle;
  // The endpoint that answered last: calls start there. GUARDED_BY(mu)
  size_t preferred = 0;

  // An idle connection to endpoint `e`, or nullptr.
  std::unique_ptr<http::Client> take_idle(size_t e) {
    std::lock_guard lock(mu);
    auto& pool = idle[e];
    if (pool.empty()) return nullptr;
    auto c = std::move(pool.back());
    pool.pop_back();
    return c;
  }

  void give_back(size_t e, std::unique_ptr<http::Client> c) {
    std::lock_guard lock(mu);
    preferred = e;
    if (idle[e].size() < kMaxIdlePerEndpoint) idle[e].push_back(std::move(c));
  }

  void drop_idle(size_t e) {
    std::vector<std::unique_ptr<http::Client>> dropped;
    std::lock_guard lock(mu);
    dropped.swap(idle[e]);
  }

  size_t first_endpoint() {
    std::lock_guard lock(mu);
    return preferred;
  }

  // One POST to endpoint `e`: a pooled connection, or a fresh one when the
  // pooled one turns out to be stale. Transport failures only; the answer
  // may be an HTTP error.
  Result<http::ClientResponse> post_to(size_t e, std::string_view path, const std::string& body) {
    std::unique_ptr<http::Client> conn = take_idle(e);
    if (conn) {
      const auto start = Clock::now();
      auto r = conn->request("POST", path, body);
      const auto elapsed =
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      if (r.ok()) return finish(e, std::move(conn), std::move(r));
      if (elapsed * kStaleFailureFraction >= options.timeout_ms) return r.error();
      drop_idle(e);  // the others were likely closed as well
    }
    ENTENTE_ASSIGN_OR_RETURN(conn, http::Client::connect(endpoints[e].client));
    auto r = conn->request("POST", path, body);
    if (!r.ok()) return r.error();
    return finish(e, std::move(conn), std::move(r));
  }

  Result<http::ClientResponse> finish(size_t e, std::unique_ptr<http::Client> conn,
                                      Result<http::ClientResponse> r) {
    const auto connection = r->header("connection");
    if (!(connection && *connection == "close")) give_back(e, std::move(conn));
    return r;
  }

  // POSTs `body` to `path`, on the preferred endpoint first, then on each
  // other once; parses a 200 answer, turns any other into etcd's error.
  Result<rapidjson::Document> call(std::string_view path, const std::string& body) {
    const size_t n = endpoints.size();
    const size_t first = first_endpoint();
    std::string reasons;
    for (size_t i = 0; i < n; ++i) {
      const size_t e = (first + i) % n;
      auto r = post_to(e, path, body);
      if (!r.ok()) {
        if (!reasons.empty()) reasons += "; ";
        reasons += r.error().message;
        continue;
      }
      const std::string where = endpoints[e].name + " " + std::string(path);
      rapidjson::Document doc;
      const auto problem = base::read_json(r->body, doc);
      if (r->status != 200) {
        Error error = etcd_error(where, r->status, problem ? nullptr : &doc, r->body);
        // A member that cannot serve ("no leader", shutting down): another may.
        if (error.code != Errc::unavailable) return error;
        if (!reasons.empty()) reasons += "; ";
        reasons += error.message;
        continue;
      }
      if (problem) return bad_answer(where, problem->message());
      if (!doc.IsObject()) return bad_answer(where, "not a JSON object");
      return doc;
    }
    return make_error(Errc::unavailable, "etcd unavailable: " + reasons);
  }

  // The stream of a watch, on the first endpoint that accepts it.
  Result<std::unique_ptr<http::Client>> open_watch(const std::string& body, std::string& where) {
    const size_t n = endpoints.size();
    const size_t first = first_endpoint();
    std::string reasons;
    for (size_t i = 0; i < n; ++i) {
      const size_t e = (first + i) % n;
      auto conn = http::Client::connect(endpoints[e].client);
      Result<http::ClientResponse> head =
          conn.ok() ? (*conn)->start_stream("POST", "/v3/watch", body) : conn.error();
      if (!head.ok()) {
        if (!reasons.empty()) reasons += "; ";
        reasons += head.error().message;
        continue;
      }
      where = endpoints[e].name + " /v3/watch";
      if (head->status != 200) {
        // An error answer is short: read it whole, bounded.
        std::string text;
        while (text.size() < (64u << 10)) {
          auto piece = (*conn)->read_stream(options.timeout_ms);
          if (!piece.ok()) break;
          text += piece->data;
          if (piece->end) break;
        }
        rapidjson::Document doc;
        const bool parsed = !base::read_json(text, doc);
        return etcd_error(where, head->status, parsed ? &doc : nullptr, text);
      }
      return std::move(*conn);
    }
    return make_error(Errc::unavailable, "etcd unavailable: " + reasons);
  }
};

Etcd::Etcd(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Etcd::~Etcd() = default;

Result<std::unique_ptr<Etcd>> Etcd::create(EtcdOptions options) {
  if (options.endpoints.empty()) return make_error(Errc::invalid_argument, "etcd: no endpoint");
  if (options.timeout_ms <= 0) {
    return make_error(Errc::invalid_argument, "etcd: timeout_ms must be positive");
  }
  auto impl = std::make_unique<Impl>();
  for (const auto& url : options.endpoints) {
    ENTENTE_ASSIGN_OR_RETURN(Endpoint e, parse_endpoint(url, options));
    impl->endpoints.push_back(std::move(e));
  }
  impl->idle.resize(impl->endpoints.size());
  impl->options = std::move(options);
  return std::unique_ptr<Etcd>(new Etcd(std::move(impl)));
}

Result<RangeResult> Etcd::get(std::string_view key) {
  ENTENTE_ASSIGN_OR_RETURN(auto doc, impl_->call("/v3/kv/range", range_request(key, false, 0)));
  return read_range(doc, "/v3/kv/range");
}

Result<RangeResult> Etcd::get_prefix(std::string_view prefix, int64_t limit) {
  if (limit < 0 || limit > kMaxKvs) {
    return make_error(Errc::invalid_argument,
                      "etcd: limit must be from 0 to " + std::to_string(kMaxKvs));
  }
  ENTENTE_ASSIGN_OR_RETURN(auto doc, impl_->call("/v3/kv/range", range_request(prefix, true, limit)));
  ENTENTE_ASSIGN_OR_RETURN(RangeResult out, read_range(doc, "/v3/kv/range"));
  if (limit == 0 && static_cast<int64_t>(out.kvs.size()) > kMaxKvs) {
    return make_error(Errc::limit_exceeded, "etcd: more than " + std::to_string(kMaxKvs) +
                                                " keys under the prefix; read them with a limit");
  }
  return out;
}

Result<int64_t> Etcd::put(std::string_view key, std::string_view value, int64_t lease) {
  std::string body = "{";
  add_bytes(body, "key", key);
  body += ',';
  add_bytes(body, "value", value);
  if (lease != 0) {
    body += ',';
    add_int(body, "lease", lease);
  }
  body += '}';
  ENTENTE_ASSIGN_OR_RETURN(auto doc, impl_->call("/v3/kv/put", body));
  return header_revision(doc);
}

Result<int64_t> Etcd::erase(std::string_view key) {
  std::string body = "{";
  add_range(body, key, false);
  body += '}';
  ENTENTE_ASSIGN_OR_RETURN(auto doc, impl_->call("/v3/kv/deleterange", body));
  return read_int(doc, "deleted", "/v3/kv/deleterange");
}

Result<int64_t> Etcd::erase_prefix(std::string_view prefix) {
  std::string body = "{";
  add_range(body, prefix, true);
  body += '}';
  ENTENTE_ASSIGN_OR_RETURN(auto doc, impl_->call("/v3/kv/deleterange", body));
  return read_int(doc, "deleted", "/v3/kv/deleterange");
}

Result<TxnResult> Etcd::txn(const std::vector<Compare>& compares, const std::vector<TxnOp>& success,
                            const std::vector<TxnOp>& failure) {
  std::string body = "{\"compare\":[";
  for (size_t i = 0; i < compares.size(); ++i) {
    if (i > 0) body += ',';
    body += compare_request(compares[i]);
  }
  body += "],\"success\":" + ops_request(success) + ",\"failure\":" + ops_request(failure) + "}";
  ENTENTE_ASSIGN_OR_RETURN(auto doc, impl_->call("/v3/kv/txn", body));
  const std::string where = "/v3/kv/txn";
  TxnResult out;
  out.succeeded = read_bool(doc, "succeeded");
  out.revision = header_revision(doc);
  const std::vector<TxnOp>& taken = out.succeeded ? success : failure;
  const Value* responses = member(doc, "responses");
  const size_t n = responses != nullptr && responses->IsArray() ? responses->Size() : 0;
  if (n != taken.size()) {
    return bad_answer(where, std::to_string(n) + " responses to " + std::to_string(taken.size()) +
                                 " operations");
  }
  for (size_t i = 0; i < n; ++i) {
    if (taken[i].kind != TxnOp::Kind::get) continue;
    const Value* range = member((*responses)[static_cast<rapidjson::SizeType>(i)], "response_range");
    if (range == nullptr) return bad_answer(where, "a get without its response_range");
    ENTENTE_ASSIGN_OR_RETURN(RangeResult r, read_range(*range, where));
    if (taken[i].prefix && static_cast<int64_t>(r.kvs.size()) > kMaxKvs) {
      return make_error(Errc::limit_exceeded, "etcd: more than " + std::to_string(kMaxKvs) +
                                                  " keys under a prefix read in a transaction");
    }
    out.gets.push_back(std::move(r));
  }
  return out;
}

Result<int64_t> Etcd::grant_lease(int64_t ttl_s) {
  if (ttl_s <= 0) return make_error(Errc::invalid_argument, "etcd: a lease's TTL must be positive");
  std::string body = "{";
  add_int(body, "TTL", ttl_s);
  body += '}';
  ENTENTE_ASSIGN_OR_RETURN(auto doc, impl_->call("/v3/lease/grant", body));
  if (const std::string error = read_string(doc, "error"); !error.empty()) {
    return make_error(Errc::unavailable, "etcd /v3/lease/grant: " + error);
  }
  ENTENTE_ASSIGN_OR_RETURN(const int64_t id, read_int(doc, "ID", "/v3/lease/grant"));
  if (id == 0) return bad_answer("/v3/lease/grant", "no lease ID");
  return id;
}

Result<int64_t> Etcd::keep_alive(int64_t lease) {
  std::string body = "{";
  add_int(body, "ID", lease);
  body += '}';
  // The gateway answers the keep-alive stream's one request as
  // {"result":{...}}, then ends it because the request body ended.
  ENTENTE_ASSIGN_OR_RETURN(auto doc, impl_->call("/v3/lease/keepalive", body));
  const Value* result = member(doc, "result");
  if (result == nullptr) {
    if (member(doc, "error") != nullptr) return etcd_error("/v3/lease/keepalive", 200, &doc, "");
    return bad_answer("/v3/lease/keepalive", "no result");
  }
  ENTENTE_ASSIGN_OR_RETURN(const int64_t ttl, read_int(*result, "TTL", "/v3/lease/keepalive"));
  if (ttl <= 0) {
    return make_error(Errc::not_found,
                      "etcd: lease " + std::to_string(lease) + " has expired or was revoked");
  }
  return ttl;
}

Status Etcd::revoke_lease(int64_t lease) {
  std::string body = "{";
  add_int(body, "ID", lease);
  body += '}';
  ENTENTE_ASSIGN_OR_RETURN(auto doc, impl_->call("/v3/lease/revoke", body));
  (void)doc;
  return {};
}

Status Etcd::watch(std::string_view key, bool prefix, int64_t start_revision,
                   const OnEvents& on_events, const std::atomic<bool>& stop) {
  std::string body = "{\"create_request\":{";
  add_range(body, key, prefix);
  if (start_revision > 0) {
    body += ',';
    add_int(body, "start_revision", start_revision);
  }
  body += "}}";
  std::string where;
  ENTENTE_ASSIGN_OR_RETURN(std::unique_ptr<http::Client> conn, impl_->open_watch(body, where));

  ObjectSplitter splitter;
  std::vector<std::string> messages;
  while (!stop.load()) {
    auto piece = conn->read_stream(kWatchPollMs);
    if (!piece.ok()) {
      if (piece.error().code == Errc::unavailable) continue;  // nothing yet: look at `stop`
      return make_error(Errc::unavailable, "etcd " + where + ": " + piece.error().message);
    }
    messages.clear();
    if (Status s = splitter.feed(piece->data, messages); !s.ok()) {
      return make_error(s.error().code, "etcd " + where + ": " + s.error().message);
    }
    for (const std::string& text : messages) {
      rapidjson::Document doc;
      if (const auto problem = base::read_json(text, doc)) return bad_answer(where, problem->message());
      const Value* result = member(doc, "result");
      if (result == nullptr) {
        if (member(doc, "error") != nullptr) return etcd_error(where, 200, &doc, text);
        return bad_answer(where, "a message without result");
      }
      ENTENTE_ASSIGN_OR_RETURN(const int64_t compacted, read_int(*result, "compact_revision", where));
      if (compacted > 0) {
        return make_error(Errc::conflict, "etcd " + where + ": revision " +
                                              std::to_string(start_revision) +
                                              " was compacted; the oldest kept is " +
                                              std::to_string(compacted));
      }
      if (read_bool(*result, "canceled")) {
        const std::string reason = read_string(*result, "cancel_reason");
        return make_error(Errc::unavailable,
                          "etcd " + where + ": the watch was canceled" +
                              (reason.empty() ? std::string() : ": " + reason));
      }
      const Value* events = member(*result, "events");
      if (events == nullptr || !events->IsArray() || events->Empty()) continue;  // created, progress
      std::vector<WatchEvent> batch;
      batch.reserve(events->Size());
      for (const Value& ev : events->GetArray()) {
        WatchEvent out;
        out.type = read_string(ev, "type") == "DELETE" ? WatchEvent::Type::erase : WatchEvent::Type::put;
        const Value* kv = member(ev, "kv");
        if (kv == nullptr) return bad_answer(where, "an event without kv");
        ENTENTE_ASSIGN_OR_RETURN(out.kv, read_kv(*kv, where));
        batch.push_back(std::move(out));
      }
      // The revision a batch completes is its last event's: the header's
      // may be later while a catch-up still has batches to send.
      if (!on_events(batch, batch.back().kv.mod_revision)) return {};
    }
    if (piece->end) return make_error(Errc::unavailable, "etcd " + where + ": the watch stream ended");
  }
  return {};
}

}  // namespace entente::cluster
