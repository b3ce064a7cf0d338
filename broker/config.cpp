// Node configuration: parsing and validation (see broker/config.h and
// docs/configuration.md). Every check returns the first problem it finds as an
// Error whose message starts with the key path ("api.limits.read_timeout: ..."),
// so `entente broker` can stop with one line that says what to fix.
#include "broker/config.h"

#include <arpa/inet.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>

#include "base/units.h"
#include "rapidjson/document.h"
#include "rapidjson/error/en.h"

namespace entente::broker {
namespace {

namespace fs = std::filesystem;
using rapidjson::Value;

// A configuration file is a few KiB; 1000 tokens fit in ~150 KiB.
constexpr size_t kMaxConfigBytes = 4u << 20;
constexpr size_t kMaxTokens = 1000;
constexpr size_t kMaxNameChars = 63;
constexpr size_t kMaxPathChars = 4096;
using base::duration_text;
using base::kDayMs;
using base::kGiB;
using base::kKiB;
using base::kMiB;
using base::kTiB;
using base::size_text;
using base::kHourMs;
using base::kMinuteMs;
using base::kSecondMs;
// The shortest interval anything may be set to: below it a timer fires more
// often than it can do useful work.
constexpr int64_t kMinIntervalMs = 10;
// Each retention pass scans every stream's log headers: more often than this
// would spend the store's read bandwidth on finding nothing to trim.
constexpr int64_t kMinRetentionCheckMs = 100;

Error config_error(const std::string& path, const std::string& message) {
  return make_error(Errc::invalid_argument, path + ": " + message);
}

// A string for a message: quoted, cut at 64 characters, control characters
// escaped, so a hostile or broken file cannot mangle the start-up log.
std::string show(std::string_view s) {
  constexpr size_t kMaxShown = 64;
  std::string out = "\"";
  size_t n = 0;
  for (char c : s) {
    if (n++ == kMaxShown) {
      out += "...";
      break;
    }
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

// What a JSON value is, for "expected X, got Y" messages.
std::string describe(const Value& v) {
  if (v.IsNull()) return "null";
  if (v.IsBool()) return v.GetBool() ? "true" : "false";
  if (v.IsString()) return show({v.GetString(), v.GetStringLength()});
  if (v.IsObject()) return "an object";
  if (v.IsArray()) return "an array";
  if (v.IsUint64()) return std::to_string(v.GetUint64());
  if (v.IsInt64()) return std::to_string(v.GetInt64());
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v.GetDouble());
  return ec == std::errc() ? std::string(buf, end) : "a number";
}

std::string_view view(const Value& v) { return {v.GetString(), v.GetStringLength()}; }

// Levenshtein distance, for "did you mean" on misspelt keys. Keys are short.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// [a-z][a-z0-9-]*, at most 63 characters: domain, node and token names.
bool valid_name(std::string_view s) {
  if (s.empty() || s.size() > kMaxNameChars || s[0] < 'a' || s[0] > 'z') return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; });
}

// The members of one JSON object, checked up front: every key known, none
// given twice. Reading a key then only has to check its value.
class ObjectReader {
 public:
  static Result<ObjectReader> open(const Value& v, std::string path,
                                   std::initializer_list<std::string_view> known) {
    if (!v.IsObject()) return config_error(path, "expected an object, got " + describe(v));
    std::set<std::string_view> seen;
    for (auto it = v.MemberBegin(); it != v.MemberEnd(); ++it) {
      const std::string_view key = view(it->name);
      const std::string key_path = join(path, key);
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        return config_error(key_path, "unknown key" + suggestion(key, known));
      }
      if (!seen.insert(key).second) return config_error(key_path, "given twice");
    }
    return ObjectReader(v, std::move(path));
  }

  // The value of `key`, or nullptr when absent.
  const Value* get(std::string_view key) const {
    for (auto it = obj_->MemberBegin(); it != obj_->MemberEnd(); ++it) {
      if (view(it->name) == key) return &it->value;
    }
    return nullptr;
  }
  Result<const Value*> required(std::string_view key) const {
    if (const Value* v = get(key)) return v;
    return config_error(path_of(key), "required");
  }
  std::string path_of(std::string_view key) const { return join(path_, key); }

 private:
  ObjectReader(const Value& v, std::string path) : obj_(&v), path_(std::move(path)) {}

  static std::string join(const std::string& path, std::string_view key) {
    // Keys are shown raw when they are plain identifiers, quoted otherwise.
    const bool plain = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
             c == '-' || c == '$';
    });
    const std::string shown = plain && key.size() <= 64 ? std::string(key) : show(key);
    return path.empty() ? shown : path + "." + shown;
  }

  static std::string suggestion(std::string_view key, std::initializer_list<std::string_view> known) {
    std::string_view best;
    size_t best_d = std::numeric_limits<size_t>::max();
    for (std::string_view k : known) {
      const size_t d = edit_distance(key, k);
      if (d < best_d) best_d = d, best = k;
    }
    // Close enough to be a typo: at most 2 edits, and fewer than half the word.
    if (best_d <= 2 && best_d * 2 < std::max(key.size(), best.size())) {
      return " (did you mean " + std::string(best) + "?)";
    }
    std::string list;
    for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
    return "; known keys: " + list;
  }

  const Value* obj_;
  std::string path_;
};

Result<std::string> read_string(const Value& v, const std::string& path) {
  if (!v.IsString()) return config_error(path, "expected a string, got " + describe(v));
  return std::string(view(v));
}

Result<std::string> read_name(const Value& v, const std::string& path) {
  ENTENTE_ASSIGN_OR_RETURN(std::string s, read_string(v, path));
  if (!valid_name(s)) {
    return config_error(path, "expected [a-z][a-z0-9-]*, at most 63 characters, got " + show(s));
  }
  return s;
}

// An integer in [min, max].
Result<uint64_t> read_uint(const Value& v, const std::string& path, uint64_t min, uint64_t max) {
  if (!v.IsUint64()) {
    return config_error(path, "expected an integer " + std::to_string(min) + ".." + std::to_string(max) +
                                  ", got " + describe(v));
  }
  const uint64_t n = v.GetUint64();
  if (n < min || n > max) {
    return config_error(
        path, "must be " + std::to_string(min) + ".." + std::to_string(max) + ", got " + std::to_string(n));
  }
  return n;
}

// A size in the one grammar of base/units.h, the same as a REST body's: an
// integer number of bytes, or a string "<integer><unit>" with unit B, KiB,
// MiB, GiB or TiB. "1GB" is refused rather than guessed at.
Result<uint64_t> read_size(const Value& v, const std::string& path, uint64_t min, uint64_t max) {
  const std::string expected =
      "expected a size: a number of bytes or a string such as \"512KiB\", \"64MiB\", \"1GiB\", got ";
  uint64_t n = 0;
  if (v.IsUint64()) {
    n = v.GetUint64();
  } else if (v.IsString()) {
    const std::string_view s = view(v);
    const base::SizeParse p = base::parse_size(s);
    switch (p.outcome) {
      case base::SizeParse::Outcome::ok:
        n = p.bytes;
        break;
      case base::SizeParse::Outcome::malformed:
        return config_error(path, expected + show(s));
      case base::SizeParse::Outcome::ambiguous:
        return config_error(path, show(s) +
                                      " is ambiguous; write binary units (KiB, MiB, GiB, TiB) "
                                      "or a number of bytes");
      case base::SizeParse::Outcome::too_large:
        return config_error(path, "must be at most " + size_text(max) + ", got " + show(s));
    }
  } else {
    return config_error(path, expected + describe(v));
  }
  if (n < min || n > max) {
    return config_error(path, "must be " + size_text(min) + " to " + size_text(max) + ", got " +
                                  (v.IsString() ? show(view(v)) : std::to_string(n)));
  }
  return n;
}

// A duration in the one grammar of base/units.h, the same as a box option's:
// an integer of milliseconds, or a string "<integer><unit>" with unit ms, s,
// m or min, h or d.
Result<int64_t> read_duration(const Value& v, const std::string& path, int64_t min_ms, int64_t max_ms) {
  const std::string expected = "expected a duration such as \"250ms\", \"10s\", \"5m\", \"24h\", got ";
  const std::string range = "must be " + duration_text(min_ms) + " to " + duration_text(max_ms);
  if (v.IsUint64()) {
    const uint64_t n = v.GetUint64();
    if (n < static_cast<uint64_t>(min_ms) || n > static_cast<uint64_t>(max_ms)) {
      return config_error(path, range + ", got " + std::to_string(n));
    }
    return static_cast<int64_t>(n);
  }
  if (!v.IsString()) return config_error(path, expected + describe(v));
  const std::string_view s = view(v);
  const base::DurationParse d = base::parse_duration(s);
  if (d.outcome == base::DurationParse::Outcome::malformed) return config_error(path, expected + show(s));
  if (!d.ok() || d.ms < min_ms || d.ms > max_ms) return config_error(path, range + ", got " + show(s));
  return d.ms;
}

// A file path from the configuration, made absolute against `base`.
Result<std::string> read_path(const Value& v, const std::string& path, const fs::path& base) {
  ENTENTE_ASSIGN_OR_RETURN(std::string s, read_string(v, path));
  if (s.empty()) return config_error(path, "must not be empty");
  if (s.size() > kMaxPathChars) {
    return config_error(path, "longer than " + std::to_string(kMaxPathChars) + " characters");
  }
  if (s.find('\0') != std::string::npos) return config_error(path, "must not contain a NUL character");
  fs::path p(s);
  if (p.is_relative()) p = base / p;
  return p.lexically_normal().string();
}

bool is_loopback(const std::string& host) {
  in_addr a4{};
  if (inet_pton(AF_INET, host.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
  in6_addr a6{};
  if (inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
    static constexpr uint8_t kLoopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    static constexpr uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (std::memcmp(a6.s6_addr, kLoopback, 16) == 0) return true;
    // ::ffff:127.x.y.z is IPv4 loopback seen through an IPv6 socket.
    return std::memcmp(a6.s6_addr, kMappedPrefix, 12) == 0 && a6.s6_addr[12] == 127;
  }
  return false;
}

// "host:port": the host an IPv4 address, "[IPv6]" or "localhost" (as
// 127.0.0.1), or, when `names` (a peer's address, resolved when dialing), a
// DNS name. A listener binds an address, so its host is never a name.
Status read_endpoint(const Value& v, const std::string& path, bool names, std::string& host_out,
                     uint16_t& port_out) {
  ENTENTE_ASSIGN_OR_RETURN(std::string s, read_string(v, path));
  const std::string expected = "expected \"host:port\", got " + show(s);
  std::string host, port;
  if (!s.empty() && s[0] == '[') {
    const size_t close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') {
      return config_error(path, expected);
    }
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
    in6_addr a6{};
    if (inet_pton(AF_INET6, host.c_str(), &a6) != 1) {
      return config_error(path, show(host) + " is not an IPv6 address");
    }
  } else {
    const size_t colon = s.rfind(':');
    if (colon == std::string::npos) return config_error(path, expected);
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
    if (host.find(':') != std::string::npos) {
      return config_error(path, "an IPv6 address needs brackets, as in \"[::1]:8443\"; got " + show(s));
    }
    in_addr a4{};
    if (host == "localhost") {
      host = "127.0.0.1";
    } else if (inet_pton(AF_INET, host.c_str(), &a4) != 1) {
      const bool dns = names && !host.empty() && host.size() <= 253 &&
                       std::all_of(host.begin(), host.end(), [](char c) {
                         return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                                c == '-' || c == '.';
                       });
      if (!dns) {
        return config_error(path, names ? "the host must be an IP address or a DNS name, got " + show(host)
                                        : "the host must be an IP address or localhost, got " + show(host));
      }
    }
  }
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return config_error(path, expected);
  }
  const unsigned long p = std::stoul(port);
  if (p > 65535) return config_error(path, "the port must be 0..65535, got " + port);
  if (names && p == 0) return config_error(path, "a peer's port cannot be 0");
  host_out = host;
  port_out = static_cast<uint16_t>(p);
  return {};
}

Status read_listen(const Value& v, const std::string& path, NodeConfig& cfg) {
  return read_endpoint(v, path, false, cfg.listen_address, cfg.listen_port);
}

Status read_api_limits(const Value& v, const std::string& path, ApiLimits& lim) {
  ENTENTE_ASSIGN_OR_RETURN(ObjectReader r,
                           ObjectReader::open(v, path,
                                              {"max_body_bytes", "max_header_bytes", "read_timeout",
                                               "idle_timeout", "max_connections", "max_connections_per_address",
                                               "handshake_timeout", "ws_max_message_bytes",
                                               "ws_send_buffer_bytes", "ws_ping_interval"}));
  if (const Value* x = r.get("max_body_bytes")) {
    ENTENTE_ASSIGN_OR_RETURN(lim.max_body_bytes, read_size(*x, r.path_of("max_body_bytes"), 1, kGiB));
  }
  if (const Value* x = r.get("max_header_bytes")) {
    ENTENTE_ASSIGN_OR_RETURN(lim.max_header_bytes, read_size(*x, r.path_of("max_header_bytes"), kKiB, kMiB));
  }
  if (const Value* x = r.get("read_timeout")) {
    ENTENTE_ASSIGN_OR_RETURN(lim.read_timeout_ms,
                             read_duration(*x, r.path_of("read_timeout"), kMinIntervalMs, kHourMs));
  }
  if (const Value* x = r.get("idle_timeout")) {
    ENTENTE_ASSIGN_OR_RETURN(lim.idle_timeout_ms,
                             read_duration(*x, r.path_of("idle_timeout"), kMinIntervalMs, kDayMs));
  }
  if (const Value* x = r.get("max_connections")) {
    ENTENTE_ASSIGN_OR_RETURN(lim.max_connections, read_uint(*x, r.path_of("max_connections"), 1, 1'000'000));
  }
  if (const Value* x = r.get("max_connections_per_address")) {
    ENTENTE_ASSIGN_OR_RETURN(lim.max_connections_per_address,
                             read_uint(*x, r.path_of("max_connections_per_address"), 1, 1'000'000));
  } else {
    // The default leaves one address at most a quarter of a smaller budget.
    lim.max_connections_per_address =
        std::min(lim.max_connections_per_address, std::max<size_t>(1, lim.max_connections / 4));
  }
  if (const Value* x = r.get("handshake_timeout")) {
    ENTENTE_ASSIGN_OR_RETURN(lim.handshake_timeout_ms,
                             read_duration(*x, r.path_of("handshake_timeout"), kMinIntervalMs, kHourMs));
  }
  if (const Value* x = r.get("ws_max_message_bytes")) {
    ENTENTE_ASSIGN_OR_RETURN(lim.ws_max_message_bytes,
                             read_size(*x, r.path_of("ws_max_message_bytes"), 1, kGiB));
  }
  if (const Value* x = r.get("ws_send_buffer_bytes")) {
    ENTENTE_ASSIGN_OR_RETURN(lim.ws_send_buffer_bytes,
                             read_size(*x, r.path_of("ws_send_buffer_bytes"), kKiB, kGiB));
  }
  if (const Value* x = r.get("ws_ping_interval")) {
    ENTENTE_ASSIGN_OR_RETURN(lim.ws_ping_interval_ms,
                             read_duration(*x, r.path_of("ws_ping_interval"), kMinIntervalMs, kHourMs));
  }
  return {};
}

Status read_api(const Value& v, const std::string& path, const fs::path& base, NodeConfig& cfg) {
  ENTENTE_ASSIGN_OR_RETURN(ObjectReader r, ObjectReader::open(v, path, {"listen", "tls", "limits"}));
  ENTENTE_ASSIGN_OR_RETURN(const Value* listen, r.required("listen"));
  ENTENTE_RETURN_IF_ERROR(read_listen(*listen, r.path_of("listen"), cfg));

  const std::string tls_path = r.path_of("tls");
  const Value* tls = r.get("tls");
  if (tls == nullptr) {
    return config_error(tls_path,
                        "required: {\"cert\": \"...pem\", \"key\": \"...key\"}, or false for "
                        "plain HTTP on a loopback address");
  }
  if (tls->IsFalse()) {
    if (!is_loopback(cfg.listen_address)) {
      return config_error(tls_path, "plain HTTP is allowed only on a loopback address; " +
                                        cfg.listen_address + " is not (give " + tls_path + ".cert and " +
                                        tls_path + ".key)");
    }
    cfg.tls = false;
  } else if (tls->IsObject()) {
    ENTENTE_ASSIGN_OR_RETURN(ObjectReader t, ObjectReader::open(*tls, tls_path, {"cert", "key"}));
    ENTENTE_ASSIGN_OR_RETURN(const Value* cert, t.required("cert"));
    ENTENTE_ASSIGN_OR_RETURN(cfg.tls_cert_file, read_path(*cert, t.path_of("cert"), base));
    ENTENTE_ASSIGN_OR_RETURN(const Value* key, t.required("key"));
    ENTENTE_ASSIGN_OR_RETURN(cfg.tls_key_file, read_path(*key, t.path_of("key"), base));
    cfg.tls = true;
  } else {
    return config_error(tls_path, "expected {\"cert\": ..., \"key\": ...} or false, got " + describe(*tls));
  }

  if (const Value* lim = r.get("limits")) {
    ENTENTE_RETURN_IF_ERROR(read_api_limits(*lim, r.path_of("limits"), cfg.limits));
  }
  return {};
}

Result<IngestDurability> read_ingest_durability(const Value& v, const std::string& path) {
  const std::string expected = "expected \"fsync\" (survives power loss) or \"process\" (survives a crash "
                               "of the broker process only)";
  if (!v.IsString()) return config_error(path, expected + ", got " + describe(v));
  const std::string_view s = view(v);
  if (s == "fsync") return IngestDurability::fsync;
  if (s == "process") return IngestDurability::process;
  std::string hint;
  for (std::string_view known : {std::string_view("fsync"), std::string_view("process")}) {
    const size_t d = edit_distance(s, known);
    if (d <= 2 && d * 2 < std::max(s.size(), known.size())) hint = " (did you mean " + std::string(known) + "?)";
  }
  return config_error(path, expected + ", got " + show(s) + hint);
}

Result<Role> read_role(const Value& v, const std::string& path) {
  const std::string expected = "expected one of admin, publisher, reader";
  if (!v.IsString()) return config_error(path, expected + ", got " + describe(v));
  const std::string_view s = view(v);
  if (s == "admin") return Role::admin;
  if (s == "publisher") return Role::publisher;
  if (s == "reader") return Role::reader;
  return config_error(path, expected + ", got " + show(s));
}

Status read_tokens(const Value& v, const std::string& path, NodeConfig& cfg) {
  if (!v.IsArray()) return config_error(path, "expected an array of tokens, got " + describe(v));
  if (v.Size() > kMaxTokens) {
    return config_error(path,
                        std::to_string(v.Size()) + " tokens; the limit is " + std::to_string(kMaxTokens));
  }
  cfg.tokens.clear();
  for (rapidjson::SizeType i = 0; i < v.Size(); ++i) {
    const std::string item = path + "[" + std::to_string(i) + "]";
    ENTENTE_ASSIGN_OR_RETURN(ObjectReader r, ObjectReader::open(v[i], item, {"name", "role", "sha256"}));
    TokenEntry t;
    ENTENTE_ASSIGN_OR_RETURN(const Value* name, r.required("name"));
    ENTENTE_ASSIGN_OR_RETURN(t.name, read_name(*name, r.path_of("name")));
    ENTENTE_ASSIGN_OR_RETURN(const Value* role, r.required("role"));
    ENTENTE_ASSIGN_OR_RETURN(t.role, read_role(*role, r.path_of("role")));
    ENTENTE_ASSIGN_OR_RETURN(const Value* sha, r.required("sha256"));
    ENTENTE_ASSIGN_OR_RETURN(t.sha256, read_string(*sha, r.path_of("sha256")));
    const bool hex = t.sha256.size() == 64 && std::all_of(t.sha256.begin(), t.sha256.end(), [](char c) {
                       return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                     });
    if (!hex) {
      return config_error(r.path_of("sha256"),
                          "expected 64 lowercase hex characters (sha256sum of the token)");
    }
    for (size_t j = 0; j < cfg.tokens.size(); ++j) {
      const std::string other = path + "[" + std::to_string(j) + "]";
      if (cfg.tokens[j].name == t.name) {
        return config_error(r.path_of("name"), show(t.name) + " is also the name of " + other);
      }
      if (cfg.tokens[j].sha256 == t.sha256) {
        // One token with two entries would have an ambiguous role.
        return config_error(r.path_of("sha256"),
                            "the same hash as " + other + "; each token must be distinct");
      }
    }
    cfg.tokens.push_back(std::move(t));
  }
  if (std::none_of(cfg.tokens.begin(), cfg.tokens.end(),
                   [](const TokenEntry& t) { return t.role == Role::admin; })) {
    return config_error(path, "at least one token with role admin is required");
  }
  return {};
}

Status read_retention(const Value& v, const std::string& path, RetentionConfig& ret) {
  ENTENTE_ASSIGN_OR_RETURN(ObjectReader r,
                           ObjectReader::open(v, path, {"max_tuples", "max_bytes", "max_age"}));
  if (const Value* x = r.get("max_tuples")) {
    ENTENTE_ASSIGN_OR_RETURN(ret.max_tuples, read_uint(*x, r.path_of("max_tuples"), 0, uint64_t{1} << 50));
  }
  if (const Value* x = r.get("max_bytes")) {
    ENTENTE_ASSIGN_OR_RETURN(ret.max_bytes, read_size(*x, r.path_of("max_bytes"), 1, kTiB << 10));
  }
  if (const Value* x = r.get("max_age")) {
    ENTENTE_ASSIGN_OR_RETURN(ret.max_age_ms,
                             read_duration(*x, r.path_of("max_age"), kMinIntervalMs, 3650 * kDayMs));
  }
  return {};
}

// "log_level": error|warn|info|debug; "log_format": text|json (either absent: the default).
Status read_log_settings(const Value* level, const Value* format, NodeConfig& cfg) {
  if (level) {
    ENTENTE_ASSIGN_OR_RETURN(std::string s, read_string(*level, "log_level"));
    auto l = base::parse_log_level(s);
    if (!l) return config_error("log_level", "expected error, warn, info or debug, got " + show(s));
    cfg.log_level = *l;
  }
  if (format) {
    ENTENTE_ASSIGN_OR_RETURN(std::string s, read_string(*format, "log_format"));
    auto f = base::parse_log_format(s);
    if (!f) return config_error("log_format", "expected text or json, got " + show(s));
    cfg.log_format = *f;
  }
  return {};
}

Status read_threads(const Value& v, const std::string& path, NodeConfig& cfg) {
  ENTENTE_ASSIGN_OR_RETURN(ObjectReader r, ObjectReader::open(v, path, {"network", "engine"}));
  if (const Value* x = r.get("network")) {
    ENTENTE_ASSIGN_OR_RETURN(uint64_t n, read_uint(*x, r.path_of("network"), 1, 64));
    cfg.network_threads = static_cast<int>(n);
  }
  if (const Value* x = r.get("engine")) {
    ENTENTE_ASSIGN_OR_RETURN(uint64_t n, read_uint(*x, r.path_of("engine"), 1, 64));
    cfg.engine_threads = static_cast<int>(n);
  }
  return {};
}

Status read_node_limits(const Value& v, const std::string& path, NodeConfig& cfg) {
  ENTENTE_ASSIGN_OR_RETURN(ObjectReader r, ObjectReader::open(v, path,
                                                              {"ingest_queue_bytes", "query_max_lag_tuples",
                                                               "max_streams", "max_queries"}));
  if (const Value* x = r.get("ingest_queue_bytes")) {
    ENTENTE_ASSIGN_OR_RETURN(cfg.ingest_queue_bytes,
                             read_size(*x, r.path_of("ingest_queue_bytes"), kKiB, 64 * kGiB));
  }
  if (const Value* x = r.get("query_max_lag_tuples")) {
    ENTENTE_ASSIGN_OR_RETURN(cfg.query_max_lag_tuples,
                             read_uint(*x, r.path_of("query_max_lag_tuples"), 1, uint64_t{1} << 40));
  }
  if (const Value* x = r.get("max_streams")) {
    ENTENTE_ASSIGN_OR_RETURN(cfg.max_streams, read_uint(*x, r.path_of("max_streams"), 1, 100'000));
  }
  if (const Value* x = r.get("max_queries")) {
    ENTENTE_ASSIGN_OR_RETURN(cfg.max_queries, read_uint(*x, r.path_of("max_queries"), 1, 100'000));
  }
  return {};
}

// A list of [a-z][a-z0-9-]* names, 1..max, none repeated.
Result<std::vector<std::string>> read_names(const Value& v, const std::string& path, size_t max) {
  if (!v.IsArray()) return config_error(path, "expected an array of names, got " + describe(v));
  if (v.Empty() || v.Size() > max) {
    return config_error(path, "expected 1 to " + std::to_string(max) + " names, got " + std::to_string(v.Size()));
  }
  std::vector<std::string> out;
  for (rapidjson::SizeType i = 0; i < v.Size(); ++i) {
    const std::string p = path + "[" + std::to_string(i) + "]";
    ENTENTE_ASSIGN_OR_RETURN(std::string n, read_name(v[i], p));
    if (std::find(out.begin(), out.end(), n) != out.end()) return config_error(p, show(n) + " is listed twice");
    out.push_back(std::move(n));
  }
  return out;
}

// federation.listen and the link's own certificate, key and domain CA.
Status read_link_identity(const ObjectReader& r, const fs::path& base, FederationConfig& f) {
  ENTENTE_ASSIGN_OR_RETURN(const Value* listen, r.required("listen"));
  ENTENTE_RETURN_IF_ERROR(read_endpoint(*listen, r.path_of("listen"), false, f.listen_host, f.listen_port));
  ENTENTE_ASSIGN_OR_RETURN(const Value* cert, r.required("cert_file"));
  ENTENTE_ASSIGN_OR_RETURN(f.cert_file, read_path(*cert, r.path_of("cert_file"), base));
  ENTENTE_ASSIGN_OR_RETURN(const Value* key, r.required("key_file"));
  ENTENTE_ASSIGN_OR_RETURN(f.key_file, read_path(*key, r.path_of("key_file"), base));
  ENTENTE_ASSIGN_OR_RETURN(const Value* ca, r.required("ca_file"));
  ENTENTE_ASSIGN_OR_RETURN(f.ca_file, read_path(*ca, r.path_of("ca_file"), base));
  return {};
}

// Heartbeats and failure detection, then frame and window sizes, each pair
// checked against each other.
Status read_link_timing_and_sizes(const ObjectReader& r, FederationConfig& f) {
  if (const Value* x = r.get("heartbeat_interval")) {
    ENTENTE_ASSIGN_OR_RETURN(f.heartbeat_interval_ms, read_duration(*x, r.path_of("heartbeat_interval"), 10, 10'000));
  }
  if (const Value* x = r.get("failure_timeout")) {
    ENTENTE_ASSIGN_OR_RETURN(f.failure_timeout_ms, read_duration(*x, r.path_of("failure_timeout"), 20, 300'000));
  }
  if (f.failure_timeout_ms <= f.heartbeat_interval_ms) {
    return config_error(r.path_of("failure_timeout"), "must be longer than heartbeat_interval (" +
                                                          duration_text(f.heartbeat_interval_ms) + "), got " +
                                                          duration_text(f.failure_timeout_ms));
  }
  if (const Value* x = r.get("max_frame")) {
    ENTENTE_ASSIGN_OR_RETURN(uint64_t n, read_size(*x, r.path_of("max_frame"), 4096, 16u << 20));
    f.max_frame = static_cast<uint32_t>(n);
  }
  if (const Value* x = r.get("import_window")) {
    ENTENTE_ASSIGN_OR_RETURN(uint64_t n, read_size(*x, r.path_of("import_window"), 64u << 10, 256u << 20));
    f.import_window = static_cast<uint32_t>(n);
  }
  if (f.import_window < f.max_frame) {
    // A window smaller than one frame could never carry a full DATA frame.
    return config_error(r.path_of("import_window"), "must be at least max_frame (" + size_text(f.max_frame) +
                                                        "), got " + size_text(f.import_window));
  }
  return {};
}

// The listener's connection budgets: in all, per address, and still in their
// handshake; the defaults of the last two follow the first.
Status read_link_budgets(const ObjectReader& r, FederationConfig& f) {
  if (const Value* x = r.get("max_connections")) {
    ENTENTE_ASSIGN_OR_RETURN(f.max_connections, read_uint(*x, r.path_of("max_connections"), 1, 100'000));
  }
  if (const Value* x = r.get("max_connections_per_address")) {
    ENTENTE_ASSIGN_OR_RETURN(f.max_connections_per_address,
                             read_uint(*x, r.path_of("max_connections_per_address"), 1, 100'000));
  }
  if (const Value* x = r.get("max_handshaking_connections")) {
    ENTENTE_ASSIGN_OR_RETURN(f.max_handshaking_connections,
                             read_uint(*x, r.path_of("max_handshaking_connections"), 1, 100'000));
  } else {
    // The default keeps three quarters of a smaller budget for verified peers too.
    f.max_handshaking_connections = std::min(f.max_handshaking_connections,
                                             std::max<size_t>(1, f.max_connections / 4));
  }
  if (f.max_handshaking_connections > f.max_connections) {
    return config_error(r.path_of("max_handshaking_connections"),
                        "must be at most max_connections (" + std::to_string(f.max_connections) + "), got " +
                            std::to_string(f.max_handshaking_connections));
  }
  if (!r.get("max_connections_per_address")) {
    // The default leaves one address at most half of the unverified share,
    // so that it alone cannot keep other peers from starting a handshake.
    f.max_connections_per_address = std::min(f.max_connections_per_address,
                                             std::max<size_t>(1, f.max_handshaking_connections / 2));
  }
  return {};
}

// federation.peers[i].nodes: each node of a peer domain once, with an
// optional address to dial.
Status read_peer_nodes(const Value& nodes, const std::string& np, PeerDomainConfig& d) {
  if (!nodes.IsArray()) return config_error(np, "expected an array, got " + describe(nodes));
  if (nodes.Size() > 64) return config_error(np, "at most 64 nodes, got " + std::to_string(nodes.Size()));
  for (rapidjson::SizeType k = 0; k < nodes.Size(); ++k) {
    const std::string kp = np + "[" + std::to_string(k) + "]";
    ENTENTE_ASSIGN_OR_RETURN(ObjectReader nr, ObjectReader::open(nodes[k], kp, {"node", "address"}));
    PeerNodeConfig n;
    ENTENTE_ASSIGN_OR_RETURN(const Value* nn, nr.required("node"));
    ENTENTE_ASSIGN_OR_RETURN(n.node, read_name(*nn, nr.path_of("node")));
    for (const auto& other : d.nodes) {
      if (other.node == n.node) return config_error(nr.path_of("node"), show(n.node) + " is listed twice");
    }
    if (const Value* a = nr.get("address")) {
      ENTENTE_RETURN_IF_ERROR(read_endpoint(*a, nr.path_of("address"), true, n.host, n.port));
    }
    d.nodes.push_back(std::move(n));
  }
  return {};
}

// federation.peers: each peer domain once, with its pinned CA (our own
// domain's defaults to ca_file) and its nodes.
Status read_peers(const Value& peers, const std::string& pp, const fs::path& base, const NodeConfig& cfg,
                  FederationConfig& f) {
  if (!peers.IsArray()) return config_error(pp, "expected an array, got " + describe(peers));
  if (peers.Size() > 64) return config_error(pp, "at most 64 peer domains, got " + std::to_string(peers.Size()));
  for (rapidjson::SizeType i = 0; i < peers.Size(); ++i) {
    const std::string p = pp + "[" + std::to_string(i) + "]";
    ENTENTE_ASSIGN_OR_RETURN(ObjectReader pr, ObjectReader::open(peers[i], p, {"domain", "ca_file", "nodes"}));
    PeerDomainConfig d;
    ENTENTE_ASSIGN_OR_RETURN(const Value* dom, pr.required("domain"));
    ENTENTE_ASSIGN_OR_RETURN(d.domain, read_name(*dom, pr.path_of("domain")));
    for (const auto& other : f.peers) {
      if (other.domain == d.domain) return config_error(pr.path_of("domain"), show(d.domain) + " is listed twice");
    }
    if (const Value* c = pr.get("ca_file")) {
      ENTENTE_ASSIGN_OR_RETURN(d.ca_file, read_path(*c, pr.path_of("ca_file"), base));
    } else if (d.domain == cfg.domain) {
      d.ca_file = f.ca_file;
    } else {
      return config_error(pr.path_of("ca_file"), "required: the pinned CA certificate of domain " + d.domain);
    }
    if (const Value* nodes = pr.get("nodes")) {
      ENTENTE_RETURN_IF_ERROR(read_peer_nodes(*nodes, pr.path_of("nodes"), d));
    }
    f.peers.push_back(std::move(d));
  }
  return {};
}

// federation.exports[i]: a stream name, the peer domains it goes to (each
// listed in federation.peers), and optionally the fields they see.
Result<ExportConfig> read_export(const Value& v, const std::string& p, const FederationConfig& f) {
  ENTENTE_ASSIGN_OR_RETURN(ObjectReader er, ObjectReader::open(v, p, {"stream", "to", "fields"}));
  ExportConfig e;
  ENTENTE_ASSIGN_OR_RETURN(const Value* st, er.required("stream"));
  ENTENTE_ASSIGN_OR_RETURN(e.stream, read_string(*st, er.path_of("stream")));
  const bool stream_ok = !e.stream.empty() && e.stream.size() <= 63 && e.stream[0] >= 'a' && e.stream[0] <= 'z' &&
                         std::all_of(e.stream.begin(), e.stream.end(), [](char c) {
                           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
                         });
  if (!stream_ok) {
    return config_error(er.path_of("stream"), "expected a stream name [a-z][a-z0-9_-]*, at most 63 characters, got " +
                                                  show(e.stream));
  }
  ENTENTE_ASSIGN_OR_RETURN(const Value* to, er.required("to"));
  ENTENTE_ASSIGN_OR_RETURN(e.to, read_names(*to, er.path_of("to"), 64));
  for (size_t k = 0; k < e.to.size(); ++k) {
    const bool peer = std::any_of(f.peers.begin(), f.peers.end(),
                                  [&](const PeerDomainConfig& d) { return d.domain == e.to[k]; });
    if (!peer) {
      return config_error(er.path_of("to") + "[" + std::to_string(k) + "]",
                          show(e.to[k]) + " is not a domain in federation.peers");
    }
  }
  if (const Value* fields = er.get("fields")) {
    const std::string fp = er.path_of("fields");
    if (!fields->IsArray()) return config_error(fp, "expected an array of field names, got " + describe(*fields));
    if (fields->Size() > 1024) return config_error(fp, "at most 1024 fields");
    for (rapidjson::SizeType k = 0; k < fields->Size(); ++k) {
      const std::string kp = fp + "[" + std::to_string(k) + "]";
      ENTENTE_ASSIGN_OR_RETURN(std::string name, read_string((*fields)[k], kp));
      if (name.empty() || name.size() > 64) return config_error(kp, "expected a field name, got " + show(name));
      if (std::find(e.fields.begin(), e.fields.end(), name) != e.fields.end()) {
        return config_error(kp, show(name) + " is listed twice");
      }
      e.fields.push_back(std::move(name));
    }
  }
  return e;
}

// federation.exports, read after the peers they name.
Status read_exports(const Value& exports, const std::string& ep, FederationConfig& f) {
  if (!exports.IsArray()) return config_error(ep, "expected an array, got " + describe(exports));
  if (exports.Size() > 1024) return config_error(ep, "at most 1024 exports, got " + std::to_string(exports.Size()));
  for (rapidjson::SizeType i = 0; i < exports.Size(); ++i) {
    ENTENTE_ASSIGN_OR_RETURN(ExportConfig e, read_export(exports[i], ep + "[" + std::to_string(i) + "]", f));
    f.exports.push_back(std::move(e));
  }
  return {};
}

// The federation section, in the order its errors are reported: identity,
// timing and sizes, budgets, handshake timeout, peers, exports.
Status read_federation(const Value& v, const std::string& path, const fs::path& base, NodeConfig& cfg) {
  ENTENTE_ASSIGN_OR_RETURN(
      ObjectReader r, ObjectReader::open(v, path,
                                         {"listen", "cert_file", "key_file", "ca_file", "heartbeat_interval",
                                          "failure_timeout", "max_frame", "import_window", "max_connections",
                                          "max_connections_per_address", "max_handshaking_connections",
                                          "handshake_timeout", "peers", "exports"}));
  FederationConfig& f = cfg.federation;
  f.enabled = true;
  ENTENTE_RETURN_IF_ERROR(read_link_identity(r, base, f));
  ENTENTE_RETURN_IF_ERROR(read_link_timing_and_sizes(r, f));
  ENTENTE_RETURN_IF_ERROR(read_link_budgets(r, f));
  if (const Value* x = r.get("handshake_timeout")) {
    ENTENTE_ASSIGN_OR_RETURN(f.handshake_timeout_ms, read_duration(*x, r.path_of("handshake_timeout"), 10, 300'000));
  }
  if (const Value* peers = r.get("peers")) {
    ENTENTE_RETURN_IF_ERROR(read_peers(*peers, r.path_of("peers"), base, cfg, f));
  }
  if (const Value* exports = r.get("exports")) {
    ENTENTE_RETURN_IF_ERROR(read_exports(*exports, r.path_of("exports"), f));
  }
  return {};
}

// cluster.etcd: "http://host:port" or "https://host:port", 1..16, each once.
Status read_etcd_endpoints(const Value& v, const std::string& path, ClusterConfig& c) {
  if (!v.IsArray() || v.Empty() || v.Size() > 16) {
    const std::string got = !v.IsArray() ? describe(v) : v.Empty() ? "none" : std::to_string(v.Size());
    return config_error(path, "expected 1 to 16 endpoints such as [\"http://127.0.0.1:2379\"], got " + got);
  }
  for (rapidjson::SizeType i = 0; i < v.Size(); ++i) {
    const std::string p = path + "[" + std::to_string(i) + "]";
    if (!v[i].IsString()) return config_error(p, "expected a string, got " + describe(v[i]));
    const std::string url(view(v[i]));
    const bool https = url.starts_with("https://");
    if (!https && !url.starts_with("http://")) {
      return config_error(p, "expected http://host:port or https://host:port, got " + show(url));
    }
    rapidjson::Value rest;
    const std::string hostport = url.substr(https ? 8 : 7);
    rest.SetString(hostport.data(), static_cast<rapidjson::SizeType>(hostport.size()));
    std::string host;
    uint16_t port = 0;
    ENTENTE_RETURN_IF_ERROR(read_endpoint(rest, p, true, host, port));
    if (std::find(c.etcd_endpoints.begin(), c.etcd_endpoints.end(), url) != c.etcd_endpoints.end()) {
      return config_error(p, show(url) + " is listed twice");
    }
    c.etcd_endpoints.push_back(url);
  }
  return {};
}

// cluster.prefix: printable ASCII, starting and ending with '/'.
Result<std::string> read_cluster_prefix(const Value& v, const std::string& path) {
  ENTENTE_ASSIGN_OR_RETURN(std::string s, read_string(v, path));
  const bool printable = std::all_of(s.begin(), s.end(), [](char ch) { return ch > ' ' && ch < 0x7f; });
  if (s.size() < 2 || s.size() > 200 || s.front() != '/' || s.back() != '/' || !printable) {
    return config_error(path, "expected a key prefix of 2 to 200 printable characters that starts and "
                              "ends with '/', such as \"/entente/acme/\", got " + show(s));
  }
  return s;
}

// The cluster section (docs/cluster.md): etcd and the membership lease.
Status read_cluster(const Value& v, const std::string& path, const fs::path& base, NodeConfig& cfg) {
  ENTENTE_ASSIGN_OR_RETURN(
      ObjectReader r, ObjectReader::open(v, path,
                                         {"etcd", "etcd_ca_file", "prefix", "lease_ttl", "etcd_timeout",
                                          "advertise_host", "advertise_peer_port", "api_ca_file"}));
  ClusterConfig& c = cfg.cluster;
  c.enabled = true;
  ENTENTE_ASSIGN_OR_RETURN(const Value* etcd, r.required("etcd"));
  ENTENTE_RETURN_IF_ERROR(read_etcd_endpoints(*etcd, r.path_of("etcd"), c));
  if (const Value* x = r.get("etcd_ca_file")) {
    ENTENTE_ASSIGN_OR_RETURN(c.etcd_ca_file, read_path(*x, r.path_of("etcd_ca_file"), base));
  }
  const bool any_https = std::any_of(c.etcd_endpoints.begin(), c.etcd_endpoints.end(),
                                     [](const std::string& u) { return u.starts_with("https://"); });
  if (any_https && c.etcd_ca_file.empty()) {
    return config_error(r.path_of("etcd_ca_file"), "required with an https:// endpoint (the CA that "
                                                   "verifies etcd's certificate)");
  }
  c.prefix = "/entente/" + cfg.domain + "/";
  if (const Value* x = r.get("prefix")) {
    ENTENTE_ASSIGN_OR_RETURN(c.prefix, read_cluster_prefix(*x, r.path_of("prefix")));
  }
  if (const Value* x = r.get("lease_ttl")) {
    ENTENTE_ASSIGN_OR_RETURN(c.lease_ttl_ms, read_duration(*x, r.path_of("lease_ttl"), 1'000, 300'000));
    if (c.lease_ttl_ms % 1000 != 0) {
      return config_error(r.path_of("lease_ttl"), "etcd leases count whole seconds; got " +
                                                      std::to_string(c.lease_ttl_ms) + " ms");
    }
  }
  if (const Value* x = r.get("etcd_timeout")) {
    ENTENTE_ASSIGN_OR_RETURN(c.etcd_timeout_ms, read_duration(*x, r.path_of("etcd_timeout"), 50, 60'000));
  }
  if (c.etcd_timeout_ms >= c.lease_ttl_ms) {
    return config_error(r.path_of("etcd_timeout"), "must be shorter than lease_ttl (" +
                                                       std::to_string(c.lease_ttl_ms) +
                                                       " ms), or a slow etcd would cost the node its lease");
  }
  if (const Value* x = r.get("advertise_host")) {
    ENTENTE_ASSIGN_OR_RETURN(c.advertise_host, read_string(*x, r.path_of("advertise_host")));
    rapidjson::Value probe;
    const std::string hostport = c.advertise_host + ":1";
    probe.SetString(hostport.data(), static_cast<rapidjson::SizeType>(hostport.size()));
    uint16_t port = 0;
    std::string host;
    if (!read_endpoint(probe, r.path_of("advertise_host"), true, host, port).ok()) {
      return config_error(r.path_of("advertise_host"), "expected an IP address or a DNS name, got " +
                                                           show(c.advertise_host));
    }
  } else if (cfg.listen_address == "0.0.0.0" || cfg.listen_address == "::") {
    return config_error(r.path_of("advertise_host"), "required when api.listen is a wildcard address (" +
                                                         cfg.listen_address +
                                                         "): the address the other nodes reach this one at");
  } else {
    c.advertise_host = cfg.listen_address;
  }
  if (const Value* x = r.get("advertise_peer_port")) {
    if (!x->IsUint() || x->GetUint() == 0 || x->GetUint() > 65535)
      return config_error(r.path_of("advertise_peer_port"), "expected a port, 1 to 65535");
    c.advertise_peer_port = static_cast<uint16_t>(x->GetUint());
  }
  if (const Value* x = r.get("api_ca_file")) {
    ENTENTE_ASSIGN_OR_RETURN(c.api_ca_file, read_path(*x, r.path_of("api_ca_file"), base));
  } else if (cfg.tls) {
    // Read after the federation section, whose CA is the default.
    if (cfg.federation.ca_file.empty()) {
      return config_error(r.path_of("api_ca_file"), "required when the API uses TLS and there is no "
                                                    "federation.ca_file: the CA that verifies the other nodes' "
                                                    "API certificates when requests are forwarded to them");
    }
    c.api_ca_file = cfg.federation.ca_file;
  }
  return {};
}

// 1-based line and column of byte `offset`, for syntax errors.
std::pair<size_t, size_t> line_column(std::string_view text, size_t offset) {
  size_t line = 1, col = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n')
      ++line, col = 1;
    else
      ++col;
  }
  return {line, col};
}

}  // namespace

std::string_view ingest_durability_name(IngestDurability d) noexcept {
  switch (d) {
    case IngestDurability::fsync:
      return "fsync";
    case IngestDurability::process:
      return "process";
  }
  return "unknown";
}

std::string_view role_name(Role r) noexcept {
  switch (r) {
    case Role::reader:
      return "reader";
    case Role::publisher:
      return "publisher";
    case Role::admin:
      return "admin";
  }
  return "unknown";
}

Result<NodeConfig> parse_config(std::string_view json, std::string_view base_dir) {
  if (json.size() > kMaxConfigBytes) {
    return make_error(Errc::limit_exceeded, "the configuration is " + std::to_string(json.size()) +
                                                " bytes; the limit is " + size_text(kMaxConfigBytes));
  }
  rapidjson::Document doc;
  // Iterative parsing: a file of nested brackets cannot exhaust the stack.
  doc.Parse<rapidjson::kParseValidateEncodingFlag | rapidjson::kParseIterativeFlag>(json.data(), json.size());
  if (doc.HasParseError()) {
    auto [line, col] = line_column(json, doc.GetErrorOffset());
    return make_error(Errc::parse_error, "JSON syntax error at line " + std::to_string(line) + ", column " +
                                             std::to_string(col) + ": " +
                                             rapidjson::GetParseError_En(doc.GetParseError()));
  }
  std::error_code ec;
  fs::path base = base_dir.empty() ? fs::current_path(ec) : fs::path(base_dir);
  if (ec) return make_error(Errc::io_error, "cannot determine the current directory: " + ec.message());
  if (base.is_relative()) {
    base = fs::absolute(base, ec);
    if (ec)
      return make_error(Errc::io_error, "cannot resolve " + std::string(base_dir) + ": " + ec.message());
  }

  if (!doc.IsObject()) return config_error("config", "expected a JSON object, got " + describe(doc));
  ENTENTE_ASSIGN_OR_RETURN(
      ObjectReader r,
      ObjectReader::open(doc, "",
                         {"domain", "node", "api", "data_dir", "tokens", "retention", "checkpoint_interval",
                          "retention_check_interval", "ingest_durability", "threads", "limits",
                          "federation", "cluster", "log_level", "log_format"}));
  NodeConfig cfg;
  ENTENTE_ASSIGN_OR_RETURN(const Value* domain, r.required("domain"));
  ENTENTE_ASSIGN_OR_RETURN(cfg.domain, read_name(*domain, "domain"));
  ENTENTE_ASSIGN_OR_RETURN(const Value* node, r.required("node"));
  ENTENTE_ASSIGN_OR_RETURN(cfg.node, read_name(*node, "node"));
  ENTENTE_ASSIGN_OR_RETURN(const Value* api, r.required("api"));
  ENTENTE_RETURN_IF_ERROR(read_api(*api, "api", base, cfg));
  ENTENTE_ASSIGN_OR_RETURN(const Value* data_dir, r.required("data_dir"));
  ENTENTE_ASSIGN_OR_RETURN(cfg.data_dir, read_path(*data_dir, "data_dir", base));
  ENTENTE_ASSIGN_OR_RETURN(const Value* tokens, r.required("tokens"));
  ENTENTE_RETURN_IF_ERROR(read_tokens(*tokens, "tokens", cfg));
  if (const Value* x = r.get("retention"))
    ENTENTE_RETURN_IF_ERROR(read_retention(*x, "retention", cfg.retention));
  if (const Value* x = r.get("checkpoint_interval")) {
    ENTENTE_ASSIGN_OR_RETURN(cfg.checkpoint_interval_ms,
                             read_duration(*x, "checkpoint_interval", kMinIntervalMs, kHourMs));
  }
  if (const Value* x = r.get("retention_check_interval")) {
    ENTENTE_ASSIGN_OR_RETURN(cfg.retention_check_interval_ms,
                             read_duration(*x, "retention_check_interval", kMinRetentionCheckMs, kHourMs));
  }
  if (const Value* x = r.get("ingest_durability")) {
    ENTENTE_ASSIGN_OR_RETURN(cfg.ingest_durability, read_ingest_durability(*x, "ingest_durability"));
  }
  ENTENTE_RETURN_IF_ERROR(read_log_settings(r.get("log_level"), r.get("log_format"), cfg));
  if (const Value* x = r.get("threads")) ENTENTE_RETURN_IF_ERROR(read_threads(*x, "threads", cfg));
  if (const Value* x = r.get("limits")) ENTENTE_RETURN_IF_ERROR(read_node_limits(*x, "limits", cfg));
  if (const Value* x = r.get("federation")) ENTENTE_RETURN_IF_ERROR(read_federation(*x, "federation", base, cfg));
  if (const Value* x = r.get("cluster")) ENTENTE_RETURN_IF_ERROR(read_cluster(*x, "cluster", base, cfg));
  return cfg;
}

Result<NodeConfig> load_config(const std::string& path) {
  std::error_code ec;
  const fs::path file = fs::absolute(path, ec);
  if (ec) return make_error(Errc::io_error, "cannot read " + path + ": " + ec.message());
  if (fs::is_directory(file, ec))
    return make_error(Errc::io_error, "cannot read " + path + ": Is a directory");
  std::ifstream in(file, std::ios::binary);
  if (!in) return make_error(Errc::io_error, "cannot read " + path + ": " + std::strerror(errno));
  // Read one byte past the limit so that an oversized file is reported, not
  // truncated; a FIFO or device cannot make this read forever.
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) return make_error(Errc::io_error, "cannot read " + path + ": " + std::strerror(errno));
  text.resize(static_cast<size_t>(in.gcount()));
  // Messages name the key, not the file: the caller says which file it read.
  return parse_config(text, file.parent_path().string());
}

std::string hash_token(std::string_view token) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(token.data(), token.size(), digest, &len, EVP_sha256(), nullptr) != 1) {
    // SHA-256 is built into every OpenSSL 3 provider; failing here means the
    // library is unusable, which no caller can recover from.
    throw std::runtime_error("EVP_Digest(SHA-256) failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * len);
  for (unsigned int i = 0; i < len; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 15];
  }
  return out;
}

}  // namespace entente::broker
