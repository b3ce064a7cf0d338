// The `entente` commands that speak to a node's REST API (see cli_api.h and
// docs/cli.md): the global options and where each setting comes from, one
// blocking keep-alive connection per command, and a human form of every
// answer (aligned tables, `key: value` lines) next to the answer as received
// (--json). Everything read is bounded: files, the profile file, names,
// answers, and the time of each request.
#include "broker/cli_api.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/json_read.h"
#include "base/result.h"
#include "base/units.h"
#include "broker/cli_api_parts.h"
#include "broker/detail/json_out.h"
#include "http/client.h"
#include "rapidjson/document.h"

namespace entente::broker {
namespace cli {

// What `entente streams --help` (or any of these commands with --help) prints.
constexpr const char* kApiUsage =
    "usage: entente [global options] <command> [options]\n"
    "\n"
    "Commands that speak to a running node's REST API (docs/cli.md):\n"
    "  streams list [--internal]      the streams of the node's domain\n"
    "  streams show NAME              one stream\n"
    "  streams create NAME --schema FILE|JSON [--event-time FIELD] [--node N]\n"
    "                 [--replication 1..3] [--durability fsync|replicated|process]\n"
    "                 [--max-tuples N] [--max-bytes SIZE] [--max-age DURATION]\n"
    "  streams delete NAME\n"
    "  queries list\n"
    "  queries show NAME\n"
    "  queries deploy --file FILE [--start-from earliest|latest]\n"
    "                                 a query network as POST /v1/queries takes it (- : stdin)\n"
    "  queries replace NAME --file FILE [--drop-state BOX,...] [--start-from earliest|latest]\n"
    "                                 a new network; unchanged boxes keep their state\n"
    "  queries stop NAME              checkpoint and stop reading (state and positions kept)\n"
    "  queries start NAME             resume a stopped query where it stopped\n"
    "  queries move NAME FRAGMENT --to NODE|DOMAIN/NODE [--cold]\n"
    "                                 move a running fragment (to a peer domain: under a hosting\n"
    "                                 contract; --cold: its state in the pause, no standby first)\n"
    "  queries split NAME FRAGMENT --nodes N1,N2[,...]\n"
    "                                 split a keyed fragment's key groups equally over the nodes\n"
    "  queries merge NAME FRAGMENT    merge a split fragment's parts back into one\n"
    "  queries delete NAME            the query and its output streams\n"
    "  nodes                          the nodes of the node's domain\n"
    "  nodes remove NODE              forget a node that is down for good (it leads and runs nothing)\n"
    "  peers                          the node's peer links (a node with federation)\n"
    "  contracts list [--awaiting-me] [--state STATE] [--peer DOMAIN] [--kind stream|hosting]\n"
    "                                 --awaiting-me: offers this domain has to answer\n"
    "  contracts show ID              one contract with its history\n"
    "  contracts propose [--kind stream|hosting] TERMS --until TIME [--dry-run]\n"
    "                                 TERMS of a stream contract: --consumer D | --provider D\n"
    "                                 (this node's domain is the other), --streams a,b,\n"
    "                                 [--fields a,b] [--predicate EXPR] [--price N] [--rate-cap N];\n"
    "                                 of a hosting one: --owner D | --host D, --box-kinds a,b,\n"
    "                                 --max-load N [--price-min N] [--price-max N] [--notice S];\n"
    "                                 --from/--until: RFC 3339, now, or from now (30d)\n"
    "  contracts counter ID TERMS [--version N] [--dry-run]\n"
    "                                 the terms on the table, changed where TERMS say\n"
    "  contracts accept ID [--version N]\n"
    "  contracts reject ID [--reason TEXT] [--version N]\n"
    "  contracts revoke ID --reason TEXT [--version N]\n"
    "  contracts usage ID             tuples delivered (or CPU hosted) and their cost\n"
    "  publish STREAM [--file F] [--batch N] [--producer-id ID] [--first-batch N] [--retries N]\n"
    "                                 NDJSON tuples (a file or stdin) in batches that a retry\n"
    "                                 never stores twice\n"
    "  imports list | show DOMAIN/NAME | delete DOMAIN/NAME\n"
    "  imports create DOMAIN/NAME     import another domain's stream (or NAME --node N)\n"
    "  checkpoint                     checkpoint every query of the node now\n"
    "  checkpoint list                the latest checkpoint of each query\n"
    "\n"
    "global options (before or after the command; a flag beats the environment,\n"
    "which beats the profile):\n"
    "  --url http(s)://HOST:PORT      the node's API               (ENTENTE_URL)\n"
    "  --token TOKEN                  the bearer token             (ENTENTE_TOKEN)\n"
    "  --ca FILE                      the CA that issued the node's API certificate (ENTENTE_CA)\n"
    "  --profile NAME                 a profile of $XDG_CONFIG_HOME/entente/profiles.json, else\n"
    "                                 of ~/.config/entente/profiles.json (ENTENTE_PROFILE)\n"
    "  --timeout DURATION             the most a request may take (default 30s, at most 1h)\n"
    "  --json                         print the node's JSON answer as received\n"
    "\n"
    "exit codes:\n"
    "  0 success                      3 the node could not be reached (connect, TLS, timeout)\n"
    "  1 the node refused             4 not found (404)\n"
    "  2 usage or configuration error 5 conflict (409)\n";

using detail::JsonOut;

// Bounds on what a command reads, sends and waits for (and kMaxRequestBody).
// A schema of the API's 1024 fields with long names fits many times over.
constexpr uint64_t kMaxSchemaBytes = 1u << 20;
constexpr uint64_t kMaxProfileFile = 1u << 20;
// The largest answer read (a listing of many contracts with their histories).
constexpr uint64_t kMaxAnswerBytes = 64u << 20;
constexpr int64_t kDefaultTimeoutMs = 30 * base::kSecondMs;
constexpr int64_t kMaxTimeoutMs = base::kHourMs;
constexpr size_t kMaxUrlBytes = 2048;
constexpr size_t kMaxTokenBytes = 4096;
// A name in a request path: a stream (DOMAIN/NAME, @NODE/NAME), a query, a
// contract id. The API's own limits are lower; this one keeps paths sane.
constexpr size_t kMaxNameBytes = 255;
constexpr size_t kMaxProfileName = 64;
// Lines of a validation problem's `errors` shown under its detail.
constexpr size_t kMaxErrorLines = 20;

// ------------------------------------------------------------ text

// `s` safe to print on a terminal: control bytes (an escape sequence in a
// name or a detail the node relays) become '?'.
std::string printable(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) c = '?';
  }
  return out;
}

// Columns on a terminal: UTF-8 continuation bytes take none.
size_t display_width(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

// A number as a person reads it: integers whole, others with at most three
// decimals and no trailing zeros.
std::string number_text(double v) {
  char buf[64];
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  std::snprintf(buf, sizeof buf, "%.3f", v);
  std::string s = buf;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// Unix milliseconds as RFC 3339 UTC, with milliseconds when they are not 0.
std::string time_text(int64_t ms) {
  const std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[96];
  if (ms % 1000 == 0) {
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                  tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
  } else {
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                  tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  }
  return buf;
}

// A whole decimal number, nothing else around it.
std::optional<uint64_t> parse_uint(std::string_view s) {
  uint64_t v = 0;
  if (s.empty()) return std::nullopt;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

void Table::add(std::vector<std::string> row) {
  for (auto& cell : row) cell = printable(cell);
  rows_.push_back(std::move(row));
}

void Table::print() const {
  std::vector<size_t> width;
  for (const auto& row : rows_) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], display_width(row[i]));
  }
  for (const auto& row : rows_) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(width[i] - display_width(row[i]) + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

void Fields::print() const {
  size_t width = 0;
  for (const auto& [k, v] : items_) width = std::max(width, k.size() + 1);
  for (const auto& [k, v] : items_) {
    std::printf("%s:%*s%s\n", k.c_str(), static_cast<int>(width - k.size() + 1), "", v.c_str());
  }
}

// ------------------------------------------------------------ JSON answers

const Value* get(const Value& o, std::string_view key) {
  if (!o.IsObject()) return nullptr;
  const auto it = o.FindMember(Value(rapidjson::StringRef(key.data(), key.size())));
  return it == o.MemberEnd() ? nullptr : &it->value;
}

std::string compact(const Value& v) { return detail::json_text(v); }

// A value as one cell: "-" for null or absent, strings as they are, arrays
// of scalars joined with ", ", objects as compact JSON.
std::string text_of(const Value* v) {
  if (v == nullptr || v->IsNull()) return "-";
  if (v->IsString())
    return v->GetStringLength() == 0 ? "-" : std::string(v->GetString(), v->GetStringLength());
  if (v->IsBool()) return v->GetBool() ? "true" : "false";
  if (v->IsUint64()) return std::to_string(v->GetUint64());
  if (v->IsInt64()) return std::to_string(v->GetInt64());
  if (v->IsNumber()) return number_text(v->GetDouble());
  if (v->IsArray()) {
    std::vector<std::string> parts;
    for (const auto& e : v->GetArray())
      parts.push_back(e.IsObject() || e.IsArray() ? compact(e) : text_of(&e));
    return parts.empty() ? "-" : join(parts, ", ");
  }
  return compact(*v);
}

std::string field(const Value& o, std::string_view key) { return text_of(get(o, key)); }

uint64_t uint_of(const Value& o, std::string_view key) {
  const Value* v = get(o, key);
  return v && v->IsUint64() ? v->GetUint64() : 0;
}

size_t size_of(const Value& o, std::string_view key) {
  const Value* v = get(o, key);
  return v && v->IsArray() ? v->Size() : 0;
}

// Each element of the array `key` of `o`; nothing when there is none.
Value::ConstArray array_of(const Value& o, std::string_view key) {
  static const Value kEmpty(rapidjson::kArrayType);
  const Value* v = get(o, key);
  return (v && v->IsArray() ? *v : kEmpty).GetArray();
}

// "auction:int64, price:int64".
std::string schema_text(const Value* schema) {
  if (schema == nullptr || !schema->IsArray()) return "-";
  std::vector<std::string> parts;
  for (const auto& f : schema->GetArray()) parts.push_back(field(f, "name") + ":" + field(f, "type"));
  return join(parts, ", ");
}

// Adds `key` of `o` to `f` when `o` has it.
void add_member(Fields& f, const Value& o, std::string_view key) {
  if (const Value* v = get(o, key)) f.add(std::string(key), text_of(v));
}

// An answer the commands do not understand: the node is of another version,
// or something between answered instead of it.
Exit unexpected(std::string_view what) {
  std::fprintf(stderr, "entente: the node's answer has no %.*s; --json shows it as received\n",
               static_cast<int>(what.size()), what.data());
  return Exit::refused;
}

// ------------------------------------------------------------ files

// The contents of `path` ("-": standard input), at most `limit` bytes;
// `what` names it in messages ("--file q.json").
Result<std::string> read_bounded(const std::string& path, uint64_t limit, const std::string& what,
                                 std::string_view why_limit) {
  std::FILE* f = path == "-" ? stdin : std::fopen(path.c_str(), "rb");
  if (f == nullptr) return make_error(Errc::invalid_argument, what + ": " + std::strerror(errno));
  std::string out;
  char buf[64 << 10];
  size_t n = 0;
  bool over = false;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) {
    if (out.size() + n > limit) {
      over = true;
      break;
    }
    out.append(buf, n);
  }
  const int read_errno = std::ferror(f) ? errno : 0;
  if (f != stdin) std::fclose(f);
  if (over) {
    return make_error(Errc::limit_exceeded,
                      what + ": larger than " + base::size_text(limit) + " (" + std::string(why_limit) + ")");
  }
  if (read_errno != 0) return make_error(Errc::invalid_argument, what + ": " + std::strerror(read_errno));
  return out;
}

// ------------------------------------------------------------ the command line

// The options every API command takes, wherever they stand.
struct GlobalFlags {
  std::optional<std::string> url;
  std::optional<std::string> token;
  std::optional<std::string> ca;
  std::optional<std::string> profile;
  std::optional<std::string> timeout;
  Output output = Output::table;
  bool help = false;
};

std::optional<std::string>* global_slot(GlobalFlags& g, std::string_view name) {
  if (name == "--url") return &g.url;
  if (name == "--token") return &g.token;
  if (name == "--ca") return &g.ca;
  if (name == "--profile") return &g.profile;
  if (name == "--timeout") return &g.timeout;
  return nullptr;
}

// "--url" from "--url" or "--url=VALUE".
std::string_view flag_name(std::string_view arg) {
  if (arg.rfind("--", 0) != 0) return arg;
  return arg.substr(0, arg.find('='));
}

bool is_global_flag(std::string_view arg) {
  GlobalFlags scratch;
  const std::string_view name = flag_name(arg);
  return global_slot(scratch, name) != nullptr || name == "--json";
}

constexpr std::string_view kGroups[] = {"streams",   "queries",    "nodes",   "peers",
                                        "contracts", "checkpoint", "publish", "imports"};

struct SplitArgs {
  GlobalFlags globals;
  std::vector<std::string_view> rest;  // the command's words and options, in order
};

// Takes the global options out of `args`, wherever they stand.
Result<SplitArgs> split_globals(const std::vector<std::string_view>& args) {
  SplitArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    const std::string_view name = flag_name(a);
    if (a == "-h" || a == "--help") {
      out.globals.help = true;
    } else if (a == "--json") {
      out.globals.output = Output::json;
    } else if (auto* slot = global_slot(out.globals, name)) {
      if (slot->has_value()) return make_error(Errc::invalid_argument, std::string(name) + " is given twice");
      if (a.size() > name.size()) {
        *slot = std::string(a.substr(name.size() + 1));
      } else if (i + 1 < args.size()) {
        *slot = std::string(args[++i]);
      } else {
        return make_error(Errc::invalid_argument, "a value is missing after " + std::string(name));
      }
    } else {
      out.rest.push_back(a);
    }
  }
  return out;
}

Result<CommandLine> parse_options(const std::vector<std::string_view>& args,
                                  const std::vector<OptionSpec>& spec) {
  CommandLine out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (a.size() < 2 || a[0] != '-') {
      out.words.emplace_back(a);
      continue;
    }
    const std::string_view name = flag_name(a);
    const OptionSpec* known = nullptr;
    for (const auto& s : spec)
      if (s.name == name) known = &s;
    if (known == nullptr) return make_error(Errc::invalid_argument, "unknown option '" + printable(a) + "'");
    const std::string key(name);
    if (out.values.count(key) || out.switches.count(key))
      return make_error(Errc::invalid_argument, key + " is given twice");
    if (!known->takes_value) {
      if (a.size() > name.size()) return make_error(Errc::invalid_argument, key + " takes no value");
      out.switches.insert(key);
    } else if (a.size() > name.size()) {
      out.values[key] = std::string(a.substr(name.size() + 1));
    } else if (i + 1 < args.size()) {
      out.values[key] = std::string(args[++i]);
    } else {
      return make_error(Errc::invalid_argument, "a value is missing after " + key);
    }
  }
  return out;
}

// A name for a request path, percent-encoding the slash of "acme/bids";
// refused when it holds anything a name of the API cannot.
Result<std::string> path_name(std::string_view name, std::string_view what) {
  if (name.empty() || name.size() > kMaxNameBytes) {
    return make_error(Errc::invalid_argument,
                      std::string(what) + " must be 1 to " + std::to_string(kMaxNameBytes) + " characters");
  }
  std::string out;
  for (char c : name) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '_' || c == '.' || c == '@';
    if (c == '/') {
      out += "%2F";
    } else if (plain) {
      out += c;
    } else {
      return make_error(Errc::invalid_argument,
                        std::string(what) + " '" + printable(name) + "' has a character no name has");
    }
  }
  return out;
}

// ------------------------------------------------------------ settings

struct NodeUrl {
  bool tls = false;
  std::string host;  // without the brackets of an IPv6 address
  uint16_t port = 0;
};

// http(s)://HOST[:PORT][/]: a name, an IPv4 address or [IPv6]; the port
// defaults to 80 or 443. No path, query, fragment or user.
Result<NodeUrl> parse_url(std::string_view url) {
  auto bad = [&](const std::string& why) {
    return make_error(Errc::invalid_argument,
                      "'" + printable(url.substr(0, 200)) + "' is not a node's URL: " + why);
  };
  if (url.size() > kMaxUrlBytes) return bad("longer than " + std::to_string(kMaxUrlBytes) + " bytes");
  NodeUrl out;
  std::string_view rest;
  if (url.rfind("https://", 0) == 0) {
    out.tls = true;
    rest = url.substr(8);
  } else if (url.rfind("http://", 0) == 0) {
    rest = url.substr(7);
  } else {
    return bad("expected http://HOST:PORT or https://HOST:PORT");
  }
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (rest.find_first_of("/?#@") != std::string_view::npos)
    return bad("only a scheme, a host and a port (the commands add the paths)");
  std::string_view host = rest, port;
  if (!rest.empty() && rest[0] == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) return bad("an IPv6 address without its ']'");
    host = rest.substr(1, close - 1);
    const std::string_view after = rest.substr(close + 1);
    if (!after.empty() && after[0] != ':') return bad("expected ':PORT' after the IPv6 address");
    if (!after.empty()) port = after.substr(1);
  } else if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty()) return bad("no host");
  for (char c : host) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '.' || c == ':' || c == '_';
    if (!ok) return bad("the host has a character no host name has");
  }
  out.host = std::string(host);
  out.port = out.tls ? 443 : 80;
  if (!port.empty() || rest.back() == ':') {
    const auto p = parse_uint(port);
    if (!p || *p == 0 || *p > 65535) return bad("the port must be 1 to 65535");
    out.port = static_cast<uint16_t>(*p);
  }
  return out;
}

// A profile of the profile file: what it sets.
struct Profile {
  std::string file;
  std::string name;
  std::optional<std::string> url;
  std::optional<std::string> token;
  std::optional<std::string> ca;  // made absolute against the file's folder
};

// $XDG_CONFIG_HOME/entente/profiles.json, else $HOME/.config/entente/profiles.json.
std::optional<std::string> profiles_file() {
  // The XDG base directory spec ignores a relative XDG_CONFIG_HOME.
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg != nullptr && xdg[0] == '/')
    return std::string(xdg) + "/entente/profiles.json";
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0')
    return std::string(home) + "/.config/entente/profiles.json";
  return std::nullopt;
}

// The profile `name` (named by `named_by`: "--profile" or "ENTENTE_PROFILE").
Result<Profile> load_profile(const std::string& name, const std::string& named_by) {
  const std::string who = "profile '" + printable(name) + "' (" + named_by + ")";
  if (name.empty() || name.size() > kMaxProfileName)
    return make_error(Errc::invalid_argument, who + ": a profile name is 1 to 64 characters");
  const auto file = profiles_file();
  if (!file)
    return make_error(Errc::invalid_argument, who +
                                                  ": neither XDG_CONFIG_HOME nor HOME is set, so there is "
                                                  "no profile file to read");
  Profile p;
  p.file = *file;
  p.name = name;
  auto text = read_bounded(*file, kMaxProfileFile, *file, "no profile file needs more");
  if (!text.ok()) return make_error(Errc::invalid_argument, who + ": cannot read " + text.error().message);
  rapidjson::Document d;
  if (auto problem = base::read_json(*text, d))
    return make_error(Errc::invalid_argument, *file + ": " + problem->message());
  Diagnostics diag;
  base::JsonObjectReader top(&d, "$", diag);
  const Value* profiles = top.value("profiles", base::Need::required);
  top.finish();
  if (profiles != nullptr && !profiles->IsObject())
    diag.error("$.profiles", "expected an object of profiles by name");
  if (!diag.ok()) return make_error(Errc::invalid_argument, *file + ": " + diag.to_string());
  const Value* entry = get(*profiles, name);
  if (entry == nullptr) {
    std::vector<std::string> names;
    for (auto it = profiles->MemberBegin(); it != profiles->MemberEnd(); ++it)
      names.push_back(printable(std::string_view(it->name.GetString(), it->name.GetStringLength())));
    return make_error(Errc::invalid_argument,
                      "no profile '" + printable(name) + "' (" + named_by + ") in " + *file +
                          (names.empty() ? " (it has none)" : " (it has: " + join(names, ", ") + ")"));
  }
  base::JsonObjectReader r(entry, "$.profiles." + printable(name), diag);
  p.url = r.string("url", base::Need::optional);
  p.token = r.string("token", base::Need::optional);
  p.ca = r.string("ca", base::Need::optional);
  r.finish();
  if (!diag.ok()) return make_error(Errc::invalid_argument, *file + ": " + diag.to_string());
  // A relative CA path is the profile file's neighbour, wherever the
  // command runs.
  if (p.ca && !p.ca->empty() && (*p.ca)[0] != '/')
    p.ca = (std::filesystem::path(*file).parent_path() / *p.ca).lexically_normal().string();
  return p;
}

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return std::nullopt;
  return std::string(v);
}

// A setting and where it came from ("--url", "ENTENTE_URL", "profile 'acme'").
struct Sourced {
  std::string value;
  std::string from;
};

std::optional<Sourced> pick(const std::optional<std::string>& flag, const char* flag_name,
                            const char* env_name, const std::optional<Profile>& profile,
                            std::optional<std::string> Profile::*member) {
  if (flag) return Sourced{*flag, flag_name};
  if (auto e = env(env_name)) return Sourced{*e, env_name};
  if (profile && (*profile).*member)
    return Sourced{*((*profile).*member), "profile '" + printable(profile->name) + "' of " + profile->file};
  return std::nullopt;
}

// Warns when a profile file holding a token is readable by others, as ssh
// does for a private key (the command goes on: the file is the user's).
void check_profile_mode(const Profile& p) {
  struct stat st {};
  if (::stat(p.file.c_str(), &st) != 0 || (st.st_mode & 077) == 0) return;
  std::fprintf(stderr,
               "entente: warning: %s holds a token and others may read it (mode %03o); chmod 600 it\n",
               p.file.c_str(), static_cast<unsigned>(st.st_mode & 0777));
}

Result<int64_t> read_timeout(const std::optional<std::string>& flag) {
  if (!flag) return kDefaultTimeoutMs;
  // An integer is milliseconds, as everywhere durations are read.
  base::DurationParse d = base::parse_duration(*flag);
  if (all_digits(*flag)) {
    const auto ms = parse_uint(*flag);
    d.outcome = ms ? base::DurationParse::Outcome::ok : base::DurationParse::Outcome::too_large;
    d.ms = static_cast<int64_t>(std::min<uint64_t>(ms.value_or(0), static_cast<uint64_t>(kMaxTimeoutMs) + 1));
  }
  if (!d.ok() || d.ms <= 0 || d.ms > kMaxTimeoutMs) {
    return make_error(
        Errc::invalid_argument,
        "--timeout '" + printable(*flag) + "' is not a duration from 1ms to 1h (\"500ms\", \"30s\", \"5m\")");
  }
  return d.ms;
}

// Flags, then the environment, then the profile, setting by setting.
Result<Settings> resolve_settings(const GlobalFlags& g) {
  std::optional<Profile> profile;
  if (g.profile) {
    ENTENTE_ASSIGN_OR_RETURN(profile, load_profile(*g.profile, "--profile"));
  } else if (auto name = env("ENTENTE_PROFILE")) {
    ENTENTE_ASSIGN_OR_RETURN(profile, load_profile(*name, "ENTENTE_PROFILE"));
  }
  const auto url = pick(g.url, "--url", "ENTENTE_URL", profile, &Profile::url);
  const auto token = pick(g.token, "--token", "ENTENTE_TOKEN", profile, &Profile::token);
  const auto ca = pick(g.ca, "--ca", "ENTENTE_CA", profile, &Profile::ca);
  if (!url) {
    if (profile) {
      return make_error(Errc::invalid_argument,
                        "profile '" + printable(profile->name) + "' of " + profile->file +
                            " has no \"url\", and neither --url nor ENTENTE_URL is given");
    }
    return make_error(
        Errc::invalid_argument,
        "no node to speak to: give --url http(s)://HOST:PORT, set ENTENTE_URL, or name a profile "
        "(--profile NAME or ENTENTE_PROFILE) of " +
            profiles_file().value_or("$XDG_CONFIG_HOME/entente/profiles.json"));
  }
  auto parsed = parse_url(url->value);
  if (!parsed.ok()) return make_error(Errc::invalid_argument, url->from + ": " + parsed.error().message);
  Settings s;
  s.url = url->value;
  s.client.host = parsed->host;
  s.client.port = parsed->port;
  s.client.tls = parsed->tls;
  s.client.max_body_bytes = kMaxAnswerBytes;
  ENTENTE_ASSIGN_OR_RETURN(s.client.timeout_ms, read_timeout(g.timeout));
  if (token) {
    if (token->value.size() > kMaxTokenBytes)
      return make_error(Errc::invalid_argument, "the token (" + token->from + ") is longer than 4096 bytes");
    for (char c : token->value) {
      const auto u = static_cast<unsigned char>(c);
      if (u <= 0x20 || u >= 0x7f)
        return make_error(Errc::invalid_argument,
                          "the token (" + token->from + ") has a character other than printable ASCII");
    }
    s.token = token->value;
    s.token_from = token->from;
    if (profile && !g.token && !env("ENTENTE_TOKEN")) check_profile_mode(*profile);
  }
  // The CA matters for https only; an unreadable one is a setting to fix,
  // not a node that cannot be reached.
  if (ca && parsed->tls) {
    if (::access(ca->value.c_str(), R_OK) != 0)
      return make_error(Errc::invalid_argument,
                        "the CA file " + ca->value + " (" + ca->from + "): " + std::strerror(errno));
    s.client.ca_file = ca->value;
  }
  return s;
}

// ------------------------------------------------------------ requests

Reply Api::call(std::string_view method, const std::string& target, std::string_view body) {
  Reply out;
  const bool reused = client_ != nullptr;
  if (!client_ && (out.exit = connect()) != Exit::ok) return out;
  Headers headers;
  if (!settings_.token.empty()) headers.emplace_back("authorization", "Bearer " + settings_.token);
  auto r = client_->request(method, target, body, "application/json", headers);
  if (!r.ok() && reused && method == "GET" && r.error().code == Errc::io_error) {
    // The node may have closed the idle connection; a GET may be sent again.
    client_.reset();
    if ((out.exit = connect()) != Exit::ok) return out;
    r = client_->request(method, target, body, "application/json", headers);
  }
  if (!r.ok()) {
    client_.reset();
    const bool io = r.error().code == Errc::io_error;
    std::fprintf(
        stderr, "entente: %.*s %s: %s%s\n", static_cast<int>(method.size()), method.data(), target.c_str(),
        printable(r.error().message).c_str(),
        io && method != "GET" ? " (the node may or may not have done it: look before trying again)" : "");
    out.exit = io ? Exit::unreachable : Exit::usage;
    return out;
  }
  out.status = r->status;
  if (r->status >= 200 && r->status < 300) {
    out.body = std::move(r->body);
    return out;
  }
  report_refusal(method, target, *r);
  out.exit = exit_for(r->status);
  return out;
}

Result<http::ClientResponse> Api::send(std::string_view method, const std::string& target,
                                       std::string_view body, std::string_view content_type,
                                       const Headers& extra) {
  if (!client_) {
    auto c = http::Client::connect(settings_.client);
    if (!c.ok()) return std::move(c).error();
    client_ = std::move(c).value();
  }
  Headers headers = extra;
  if (!settings_.token.empty()) headers.emplace_back("authorization", "Bearer " + settings_.token);
  auto r = client_->request(method, target, body, content_type, headers);
  if (!r.ok()) client_.reset();
  return r;
}

void Api::report_unreachable(const Error& e) const {
  std::fprintf(stderr, "entente: cannot reach the node at %s: %s%s\n", printable(settings_.url).c_str(),
               printable(e.message).c_str(), connect_hint(e.message).c_str());
}

Exit Api::connect() {
  auto c = http::Client::connect(settings_.client);
  if (c.ok()) {
    client_ = std::move(c).value();
    return Exit::ok;
  }
  report_unreachable(c.error());
  // A CA file that is not a certificate is a setting to fix.
  return c.error().code == Errc::io_error ? Exit::unreachable : Exit::usage;
}

// What to change, when the error says.
std::string Api::connect_hint(const std::string& m) const {
  if (m.find("certificate verify failed") != std::string::npos)
    return "; give --ca FILE (or ENTENTE_CA, or \"ca\" in the profile): the CA that issued the node's "
           "certificate";
  if (settings_.client.tls && m.find("wrong version number") != std::string::npos)
    return "; the node may speak plain HTTP: try an http:// URL";
  return "";
}

void Api::report_refusal(std::string_view method, const std::string& target,
                         const http::ClientResponse& r) const {
  rapidjson::Document d;
  std::string detail;
  const bool json = !base::read_json(r.body, d).has_value() && d.IsObject();
  if (json && get(d, "detail") && get(d, "detail")->IsString()) {
    detail = field(d, "detail");
  } else if (json && get(d, "title") && get(d, "title")->IsString()) {
    detail = field(d, "title");
  } else {
    detail = r.body.substr(0, 300);
  }
  if (detail.empty()) detail = "(no detail)";
  std::fprintf(stderr, "entente: %.*s %s: %u: %s\n", static_cast<int>(method.size()), method.data(),
               target.c_str(), r.status, printable(detail).c_str());
  size_t shown = 0;
  static const Value kNone;
  for (const auto& e : array_of(json ? static_cast<const Value&>(d) : kNone, "errors")) {
    if (shown++ == kMaxErrorLines) {
      std::fprintf(stderr, "  ... %zu more\n", size_of(d, "errors") - kMaxErrorLines);
      break;
    }
    const std::string where = get(e, "path")  ? field(e, "path")
                              : get(e, "row") ? "row " + field(e, "row")
                                              : "-";
    std::fprintf(stderr, "  %s: %s\n", printable(where).c_str(), printable(field(e, "message")).c_str());
  }
  if (r.status == 401) {
    std::fprintf(
        stderr, "entente: %s\n",
        settings_.token.empty()
            ? "no token was sent: give --token TOKEN, set ENTENTE_TOKEN, or put \"token\" in the profile"
            : ("the node does not know the token from " + settings_.token_from).c_str());
  }
}

// Prints an answer: as received with --json, else by `format`.
Exit emit(const Api& api, const Reply& r, Formatter format) {
  if (api.output() == Output::json) {
    std::fwrite(r.body.data(), 1, r.body.size(), stdout);
    if (!r.body.empty() && r.body.back() != '\n') std::fputc('\n', stdout);
    return Exit::ok;
  }
  rapidjson::Document d;
  if (auto problem = base::read_json(r.body, d)) {
    std::fprintf(stderr, "entente: the node's answer is not JSON: %s\n",
                 printable(problem->message()).c_str());
    return Exit::refused;
  }
  return format(d);
}

// GET `target`, printed by `format`.
Exit get_and_print(Api& api, const std::string& target, Formatter format) {
  const Reply r = api.call("GET", target);
  return r.exit == Exit::ok ? emit(api, r, format) : r.exit;
}

// A 204's confirmation: a line for a person, nothing for a script.
Exit done(const Api& api, const std::string& what) {
  if (api.output() == Output::table) std::printf("%s\n", printable(what).c_str());
  return Exit::ok;
}

// ------------------------------------------------------------ streams

std::string retention_text(const Value* r) {
  if (r == nullptr || !r->IsObject()) return "-";
  const uint64_t tuples = uint_of(*r, "max_tuples"), bytes = uint_of(*r, "max_bytes");
  const Value* age = get(*r, "max_age_ms");
  return "max_tuples " + (tuples ? std::to_string(tuples) : std::string("0 (no bound)")) + ", max_bytes " +
         (bytes ? base::size_text(bytes) : std::string("0 (no bound)")) + ", max_age " +
         (age && age->IsInt64() ? base::duration_text(age->GetInt64()) : text_of(age));
}

std::string replication_text(const Value& r) {
  std::string out = "factor " + field(r, "factor") + ", epoch " + field(r, "epoch");
  for (const auto& f : array_of(r, "replicas")) {
    const Value* in_sync = get(f, "in_sync");
    const Value* connected = get(f, "connected");
    out += "; " + field(f, "node") + " acked " + field(f, "acked") + " lag " + field(f, "lag_tuples") +
           (in_sync && in_sync->IsBool() && in_sync->GetBool() ? " in sync" : " not in sync") +
           (connected && connected->IsBool() && !connected->GetBool() ? " disconnected" : "");
  }
  return out;
}

Exit print_stream(const Value& s) {
  if (!s.IsObject() || !get(s, "name")) return unexpected("stream");
  Fields f;
  for (const char* key : {"name", "node", "producer"}) add_member(f, s, key);
  f.add("schema", schema_text(get(s, "schema")));
  const Value* et = get(s, "event_time");
  f.add("event_time", et && et->IsString() ? text_of(et) : "- (the time the node receives a tuple)");
  for (const char* key :
       {"durability", "first_seq", "next_seq", "durable_next_seq", "tuples", "producers_remembered"})
    add_member(f, s, key);
  f.add("retention", retention_text(get(s, "retention")));
  if (const Value* r = get(s, "replication"); r && r->IsObject()) f.add("replication", replication_text(*r));
  add_member(f, s, "created_at");
  f.print();
  return Exit::ok;
}

Exit print_stream_list(const Value& d) {
  const Value* streams = get(d, "streams");
  if (streams == nullptr || !streams->IsArray()) return unexpected("'streams' list");
  if (const Value* c = get(d, "catalog"); c && c->IsObject())
    std::fprintf(stderr, "entente: warning: the domain's catalog may be stale: %s\n",
                 printable(field(*c, "problem")).c_str());
  if (streams->Empty()) {
    std::printf("no streams\n");
    return Exit::ok;
  }
  Table t({"NAME", "NODE", "PRODUCER", "FIELDS", "TUPLES", "FIRST_SEQ", "NEXT_SEQ"});
  for (const auto& s : streams->GetArray()) {
    t.add({field(s, "name"), field(s, "node"), field(s, "producer"), std::to_string(size_of(s, "schema")),
           field(s, "tuples"), field(s, "first_seq"), field(s, "next_seq")});
  }
  t.print();
  return Exit::ok;
}

// The schema for POST /v1/streams: inline JSON ("[...]") or a file of it.
Result<std::string> read_schema(const std::string& arg) {
  const size_t first = arg.find_first_not_of(" \t\r\n");
  std::string text;
  if (first != std::string::npos && arg[first] == '[') {
    text = arg;
  } else {
    ENTENTE_ASSIGN_OR_RETURN(text,
                             read_bounded(arg, kMaxSchemaBytes, "--schema " + printable(arg),
                                          "no schema needs more; give a file of a JSON array of fields"));
  }
  if (text.size() > kMaxSchemaBytes)
    return make_error(Errc::limit_exceeded, "--schema: larger than " + base::size_text(kMaxSchemaBytes));
  rapidjson::Document d;
  if (auto problem = base::read_json(text, d))
    return make_error(Errc::invalid_argument, "--schema: " + problem->message());
  if (!d.IsArray()) {
    return make_error(Errc::invalid_argument,
                      "--schema: expected a JSON array of fields "
                      "([{\"name\": \"price\", \"type\": \"int64\"}, ...]), not " +
                          std::string(base::json_kind(d)));
  }
  return compact(d);
}

// Writes a size or duration option as the API takes it: an integer as a
// number, a spelling with a unit as a string; refused here when the
// grammar (base/units.h) refuses it.
Status write_unit_value(JsonOut& j, std::string_view key, const std::string& v, bool is_size) {
  if (all_digits(v)) {
    const auto n = parse_uint(v);
    if (!n) return make_error(Errc::invalid_argument, "--" + std::string(key) + " '" + v + "' is too large");
    j.key(key).u64(*n);
    return {};
  }
  const bool ok = is_size ? base::parse_size(v).ok() : base::parse_duration(v).ok();
  if (!ok) {
    return make_error(
        Errc::invalid_argument,
        is_size ? "--max-bytes '" + printable(v) + "' is not a size (\"64MiB\", \"1GiB\", bytes)"
                : "--max-age '" + printable(v) + "' is not a duration (\"10s\", \"24h\", \"7d\", ms)");
  }
  j.key(key).str(v);
  return {};
}

// The body of POST /v1/streams from `streams create`'s options.
Result<std::string> stream_create_body(const CommandLine& c) {
  const std::string* schema_arg = c.value("--schema");
  if (schema_arg == nullptr)
    return make_error(Errc::invalid_argument, "streams create needs --schema FILE|JSON");
  ENTENTE_ASSIGN_OR_RETURN(const std::string schema, read_schema(*schema_arg));
  JsonOut j;
  j.begin_object().key("name").str(c.words[0]).key("schema").raw(schema);
  if (const auto* v = c.value("--event-time")) j.key("event_time").str(*v);
  if (const auto* v = c.value("--node")) j.key("node").str(*v);
  if (const auto* v = c.value("--replication")) {
    const auto n = parse_uint(*v);
    if (!n || *n < 1 || *n > 3)
      return make_error(Errc::invalid_argument,
                        "--replication must be 1, 2 or 3, not '" + printable(*v) + "'");
    j.key("replication").u64(*n);
  }
  if (const auto* v = c.value("--durability")) {
    if (*v != "fsync" && *v != "replicated" && *v != "process")
      return make_error(Errc::invalid_argument,
                        "--durability must be fsync, replicated or process, not '" + printable(*v) + "'");
    j.key("durability").str(*v);
  }
  const auto* tuples = c.value("--max-tuples");
  const auto* bytes = c.value("--max-bytes");
  const auto* age = c.value("--max-age");
  if (tuples || bytes || age) {
    j.key("retention").begin_object();
    if (tuples) {
      const auto n = parse_uint(*tuples);
      if (!n)
        return make_error(Errc::invalid_argument,
                          "--max-tuples must be a whole number, not '" + printable(*tuples) + "'");
      j.key("max_tuples").u64(*n);
    }
    if (bytes) ENTENTE_RETURN_IF_ERROR(write_unit_value(j, "max_bytes", *bytes, true));
    if (age) ENTENTE_RETURN_IF_ERROR(write_unit_value(j, "max_age", *age, false));
    j.end_object();
  }
  j.end_object();
  return j.take();
}

Exit usage_error(const std::string& message) {
  std::fprintf(stderr, "entente: %s\n", message.c_str());
  return Exit::usage;
}

Exit streams_list(Api& api, const CommandLine& c) {
  return get_and_print(api, c.has("--internal") ? "/v1/streams?internal=true" : "/v1/streams",
                       print_stream_list);
}

Exit streams_show(Api& api, const CommandLine& c) {
  const auto name = path_name(c.words[0], "a stream name");
  if (!name.ok()) return usage_error(name.error().message);
  return get_and_print(api, "/v1/streams/" + *name, print_stream);
}

Exit streams_create(Api& api, const CommandLine& c) {
  const auto body = stream_create_body(c);
  if (!body.ok()) return usage_error(body.error().message);
  const Reply r = api.call("POST", "/v1/streams", *body);
  return r.exit == Exit::ok ? emit(api, r, print_stream) : r.exit;
}

Exit streams_delete(Api& api, const CommandLine& c) {
  const auto name = path_name(c.words[0], "a stream name");
  if (!name.ok()) return usage_error(name.error().message);
  const Reply r = api.call("DELETE", "/v1/streams/" + *name);
  return r.exit == Exit::ok ? done(api, "deleted stream " + c.words[0]) : r.exit;
}

// ------------------------------------------------------------ queries

// Where a query runs: its `node`, its fragments' nodes, or the node of its
// boxes ("acme/n1").
std::string query_node(const Value& q) {
  if (const Value* n = get(q, "node"); n && n->IsString()) return text_of(n);
  if (size_of(q, "fragments") > 0) {
    std::vector<std::string> parts;
    for (const auto& f : array_of(q, "fragments")) parts.push_back(field(f, "name") + "@" + field(f, "node"));
    return join(parts, ", ");
  }
  for (const auto& b : array_of(q, "boxes")) {
    const std::string placement = field(b, "placement");
    const size_t slash = placement.find('/');
    return slash == std::string::npos ? placement : placement.substr(slash + 1);
  }
  return "-";
}

Exit print_query_list(const Value& d) {
  const Value* queries = get(d, "queries");
  if (queries == nullptr || !queries->IsArray()) return unexpected("'queries' list");
  if (queries->Empty()) {
    std::printf("no queries\n");
    return Exit::ok;
  }
  Table t({"NAME", "STATE", "NODE", "INPUTS", "OUTPUTS", "LAG_TUPLES"});
  for (const auto& q : queries->GetArray()) {
    t.add({field(q, "name"), field(q, "state"), query_node(q), field(q, "inputs"), field(q, "outputs"),
           field(q, "lag_tuples")});
  }
  t.print();
  return Exit::ok;
}

std::string checkpoint_text(const Value* c) {
  if (c == nullptr || !c->IsObject()) return "- (none yet)";
  std::string out = "id " + field(*c, "id") + ", " + base::size_text(uint_of(*c, "bytes"));
  if (get(*c, "taken_at")) out += ", taken " + field(*c, "taken_at");
  return out;
}

std::string positions_text(const Value* p) {
  if (p == nullptr || !p->IsObject() || p->MemberCount() == 0) return "-";
  std::vector<std::string> parts;
  for (auto it = p->MemberBegin(); it != p->MemberEnd(); ++it)
    parts.push_back(std::string(it->name.GetString(), it->name.GetStringLength()) + " " +
                    text_of(&it->value));
  return join(parts, ", ");
}

// A query run whole on one node: its fields, then its boxes.
void print_runner(const Value& q) {
  Fields f;
  for (const char* key : {"name", "state", "inputs", "outputs", "lag_tuples"}) add_member(f, q, key);
  f.add("node", query_node(q));
  f.add("positions", positions_text(get(q, "positions")));
  if (const Value* l = get(q, "load"); l && l->IsObject())
    f.add("load", field(*l, "cpu_ms_per_s") + " CPU ms/s over " + field(*l, "window_s") + " s, " +
                      field(*l, "cpu_seconds") + " CPU s in all");
  for (const auto& i : array_of(q, "imports")) {
    const std::string reason = field(i, "reason");
    f.add("import", field(i, "stream") + " " + field(i, "state") +
                        (reason == "-" || reason.empty() ? "" : ": " + reason));
  }
  f.add("checkpoint", checkpoint_text(get(q, "checkpoint")));
  add_member(f, q, "created_at");
  f.print();
  if (size_of(q, "boxes") == 0) return;
  std::printf("\n");
  Table t({"BOX", "TYPE", "TUPLES_IN", "TUPLES_OUT", "SELECTIVITY", "CPU_NS_PER_TUPLE", "STATE_BYTES"});
  for (const auto& b : array_of(q, "boxes")) {
    t.add({field(b, "id"), field(b, "type"), field(b, "tuples_in"), field(b, "tuples_out"),
           field(b, "selectivity"), field(b, "cpu_ns_per_tuple"), field(b, "state_bytes")});
  }
  t.print();
}

// A query cut into fragments (or run whole in a domain of several nodes):
// its fields, then its fragments.
void print_cut_query(const Value& q) {
  Fields f;
  for (const char* key : {"name", "state", "node", "outputs", "moves_total"}) add_member(f, q, key);
  f.print();
  std::printf("\n");
  Table t({"FRAGMENT", "NODE", "STATE", "LAG_TUPLES", "CHECKPOINT", "ERROR"});
  for (const auto& fr : array_of(q, "fragments")) {
    const Value* runner = get(fr, "runner");
    const bool has = runner && runner->IsObject();
    t.add({field(fr, "name"), field(fr, "node"), has ? field(*runner, "state") : "-",
           has ? field(*runner, "lag_tuples") : "-",
           has && get(*runner, "checkpoint") && get(*runner, "checkpoint")->IsObject()
               ? "id " + field(*get(*runner, "checkpoint"), "id")
               : "-",
           field(fr, "error")});
  }
  t.print();
}

Exit print_query(const Value& q) {
  if (!q.IsObject() || !get(q, "name")) return unexpected("query");
  if (get(q, "fragments"))
    print_cut_query(q);
  else
    print_runner(q);
  return Exit::ok;
}

Exit queries_list(Api& api, const CommandLine&) {
  return get_and_print(api, "/v1/queries", print_query_list);
}

Exit queries_show(Api& api, const CommandLine& c) {
  const auto name = path_name(c.words[0], "a query name");
  if (!name.ok()) return usage_error(name.error().message);
  return get_and_print(api, "/v1/queries/" + *name, print_query);
}

// The query network in --file, with --start-from and --drop-state (a
// comma-separated list) set in it; the document's text to send, or a
// usage error's message.
Result<std::string> network_of(const CommandLine& c, std::string_view command) {
  const std::string* file = c.value("--file");
  if (file == nullptr) {
    return Error{Errc::invalid_argument,
                 std::string(command) + " needs --file FILE (a query network; - for stdin)"};
  }
  auto text = read_bounded(*file, kMaxRequestBody, "--file " + printable(*file),
                           "the most a node takes with its default api.limits.max_body_bytes; nothing was sent");
  if (!text.ok()) return text.error();
  rapidjson::Document d;
  if (auto problem = base::read_json(*text, d))
    return Error{Errc::invalid_argument, "--file " + printable(*file) + ": " + problem->message()};
  if (!d.IsObject()) {
    return Error{Errc::invalid_argument, "--file " + printable(*file) +
                                             ": expected a query network, a JSON object with name, inputs, "
                                             "boxes, arcs and outputs (docs/query-networks.md), not " +
                                             std::string(base::json_kind(d))};
  }
  const std::string* from = c.value("--start-from");
  const std::string* drop = c.value("--drop-state");
  // Otherwise the document goes as written: the node reports its problems
  // with paths into it.
  if (from == nullptr && drop == nullptr) return std::move(text).value();
  auto& a = d.GetAllocator();
  if (from != nullptr) {
    if (*from != "earliest" && *from != "latest") {
      return Error{Errc::invalid_argument,
                   "--start-from: earliest or latest (a sequence number per input goes in the file's "
                   "\"start_from\", docs/query-networks.md), not '" + printable(*from) + "'"};
    }
    d.RemoveMember("start_from");
    d.AddMember("start_from", rapidjson::Value(from->c_str(), a), a);
  }
  if (drop != nullptr) {
    rapidjson::Value boxes(rapidjson::kArrayType);
    for (size_t at = 0; at <= drop->size();) {
      const size_t comma = std::min(drop->find(',', at), drop->size());
      if (comma > at) boxes.PushBack(rapidjson::Value(drop->substr(at, comma - at).c_str(), a), a);
      at = comma + 1;
    }
    d.RemoveMember("drop_state");
    d.AddMember("drop_state", boxes, a);
  }
  return detail::json_text(d);
}

Exit queries_deploy(Api& api, const CommandLine& c) {
  const auto body = network_of(c, "queries deploy");
  if (!body.ok()) return usage_error(body.error().message);
  const Reply r = api.call("POST", "/v1/queries", *body);
  return r.exit == Exit::ok ? emit(api, r, print_query) : r.exit;
}

Exit queries_replace(Api& api, const CommandLine& c) {
  const auto name = path_name(c.words[0], "a query name");
  if (!name.ok()) return usage_error(name.error().message);
  const auto body = network_of(c, "queries replace");
  if (!body.ok()) return usage_error(body.error().message);
  const Reply r = api.call("PUT", "/v1/queries/" + *name, *body);
  return r.exit == Exit::ok ? emit(api, r, print_query) : r.exit;
}

// POST /v1/queries/NAME/stop or /start.
Exit queries_lifecycle(Api& api, const CommandLine& c, std::string_view action) {
  const auto name = path_name(c.words[0], "a query name");
  if (!name.ok()) return usage_error(name.error().message);
  const Reply r = api.call("POST", "/v1/queries/" + *name + "/" + std::string(action));
  return r.exit == Exit::ok ? emit(api, r, print_query) : r.exit;
}
Exit queries_stop(Api& api, const CommandLine& c) { return queries_lifecycle(api, c, "stop"); }
Exit queries_start(Api& api, const CommandLine& c) { return queries_lifecycle(api, c, "start"); }

Exit queries_delete(Api& api, const CommandLine& c) {
  const auto name = path_name(c.words[0], "a query name");
  if (!name.ok()) return usage_error(name.error().message);
  const Reply r = api.call("DELETE", "/v1/queries/" + *name);
  return r.exit == Exit::ok ? done(api, "deleted query " + c.words[0] + " and its output streams") : r.exit;
}

// ------------------------------------------------------------ nodes, peers, checkpoint

Exit print_nodes(const Value& d) {
  if (!d.IsObject() || !get(d, "nodes")) return unexpected("'nodes' list");
  Fields f;
  for (const char* key : {"domain", "cluster", "self", "controller"}) add_member(f, d, key);
  if (const Value* e = get(d, "etcd"); e && e->IsObject()) {
    const Value* reachable = get(*e, "reachable");
    f.add("etcd", reachable && reachable->IsBool() && reachable->GetBool()
                      ? "reachable"
                      : "unreachable: " + field(*e, "error"));
  }
  for (const auto& w : array_of(d, "warnings")) f.add("warning", text_of(&w));
  f.print();
  std::printf("\n");
  Table t({"NODE", "STATE", "ROLE", "API", "VERSION", "CPU", "LAG_TUPLES", "STREAMS", "FRAGMENTS"});
  for (const auto& n : array_of(d, "nodes")) {
    const Value* load = get(n, "load");
    const bool has_load = load && load->IsObject();
    t.add({field(n, "node"), field(n, "state"), field(n, "role"), field(n, "api"), field(n, "version"),
           has_load ? field(*load, "cpu") : "-", has_load ? field(*load, "lag_tuples") : "-",
           std::to_string(size_of(n, "streams_led")), std::to_string(size_of(n, "fragments"))});
  }
  t.print();
  return Exit::ok;
}

Exit print_peers(const Value& d) {
  if (!d.IsObject() || !get(d, "peers")) return unexpected("'peers' list");
  Fields f;
  add_member(f, d, "self");
  add_member(f, d, "listen");
  std::vector<std::string> refusals;
  if (const Value* r = get(d, "refusals"); r && r->IsObject())
    for (auto it = r->MemberBegin(); it != r->MemberEnd(); ++it)
      refusals.push_back(std::string(it->name.GetString(), it->name.GetStringLength()) + " " +
                         text_of(&it->value));
  f.add("refusals", refusals.empty() ? "none" : join(refusals, ", "));
  f.print();
  std::printf("\n");
  if (size_of(d, "peers") == 0) {
    std::printf("no peers\n");
  } else {
    Table t({"IDENTITY", "STATE", "ADDRESS", "RTT_US", "BYTES_IN", "BYTES_OUT", "CONNECTS", "LAST_ERROR"});
    for (const auto& p : array_of(d, "peers")) {
      const std::string err = field(p, "last_error");
      t.add({field(p, "identity"), field(p, "state"), field(p, "address"), field(p, "rtt_us"),
             field(p, "bytes_in"), field(p, "bytes_out"), field(p, "connects"), err.empty() ? "-" : err});
    }
    t.print();
  }
  if (size_of(d, "refused") == 0) return Exit::ok;
  std::printf("\nrefused connections, newest first:\n");
  Table t({"IDENTITY", "ADDRESS", "REFUSAL", "BY", "COUNT", "REASON"});
  for (const auto& r : array_of(d, "refused")) {
    t.add({field(r, "identity"), field(r, "address"), field(r, "refusal"), field(r, "by"), field(r, "count"),
           field(r, "reason")});
  }
  t.print();
  return Exit::ok;
}

Exit print_checkpoints(const Value& d) {
  const Value* list = get(d, "checkpoints");
  if (list == nullptr || !list->IsArray()) return unexpected("'checkpoints' list");
  if (list->Empty()) {
    std::printf("no queries: nothing to checkpoint\n");
    return Exit::ok;
  }
  Table t({"QUERY", "ID", "BYTES", "DURATION_MS", "TAKEN_AT"});
  for (const auto& c : list->GetArray())
    t.add({field(c, "query"), field(c, "id"), field(c, "bytes"), field(c, "duration_ms"),
           field(c, "taken_at")});
  t.print();
  return Exit::ok;
}

Exit nodes(Api& api, const CommandLine&) { return get_and_print(api, "/v1/nodes", print_nodes); }
Exit peers(Api& api, const CommandLine&) { return get_and_print(api, "/v1/peers", print_peers); }

Exit checkpoint_list(Api& api, const CommandLine&) {
  return get_and_print(api, "/v1/checkpoints", print_checkpoints);
}

Exit checkpoint(Api& api, const CommandLine&) {
  const Reply r = api.call("POST", "/v1/checkpoints");
  return r.exit == Exit::ok ? emit(api, r, print_checkpoints) : r.exit;
}

// ------------------------------------------------------------ contracts

// The domain that made the contract's current version.
std::string current_by(const Value& c) {
  const auto history = array_of(c, "history");
  const uint64_t version = uint_of(c, "version");
  if (version >= 1 && version <= history.Size())
    return field(history[static_cast<rapidjson::SizeType>(version - 1)], "by");
  return history.Empty() ? "-" : field(history[history.Size() - 1], "by");
}

// The party of `c` that is not `domain`.
std::string other_party(const Value& c, const std::string& domain) {
  for (const auto& p : array_of(c, "parties"))
    if (p.IsString() && text_of(&p) != domain) return text_of(&p);
  return "-";
}

// Whether the next step of `c` is `domain`'s admin's: an offer on the table
// (proposed or countered) that the other party made, which only `domain`
// may accept, counter or reject (docs/contracts.md, "States"). An accepted
// offer is countersigned by its maker's node on its own, and an active one
// may be revoked by either party at any time: neither waits for anyone.
bool awaits(const Value& c, const std::string& domain) {
  const std::string state = field(c, "state");
  return (state == "proposed" || state == "countered") && current_by(c) != domain;
}

// Who may do what next, in words.
std::string next_step(const Value& c) {
  const std::string state = field(c, "state"), by = current_by(c), other = other_party(c, by);
  if (state == "proposed" || state == "countered")
    return other + " may accept, counter or reject version " + field(c, "version");
  if (state == "accepted") return other + "'s node countersigns it on its own";
  if (state == "active") return "either party may revoke it";
  return "none (" + state + ")";
}

Exit print_contract_list(const Value& d) {
  const Value* list = get(d, "contracts");
  if (list == nullptr || !list->IsArray()) return unexpected("'contracts' list");
  if (list->Empty()) {
    std::printf("no contracts\n");
    return Exit::ok;
  }
  Table t({"ID", "KIND", "PARTIES", "STATE", "VERSION", "BY", "IN_FORCE", "VALID_UNTIL"});
  for (const auto& c : list->GetArray()) {
    const Value* terms = get(c, "terms");
    t.add({field(c, "id"), field(c, "kind"), field(c, "parties"), field(c, "state"), field(c, "version"),
           current_by(c), field(c, "in_force"), terms ? field(*terms, "valid_until") : "-"});
  }
  t.print();
  return Exit::ok;
}

Exit print_contract(const Value& c) {
  if (!c.IsObject() || !get(c, "id")) return unexpected("contract");
  Fields f;
  for (const char* key : {"id", "kind", "parties", "state", "in_force", "version", "notice_until"})
    add_member(f, c, key);
  f.add("by", current_by(c));
  f.add("next", next_step(c));
  if (const Value* terms = get(c, "terms"); terms && terms->IsObject()) {
    for (auto it = terms->MemberBegin(); it != terms->MemberEnd(); ++it)
      f.add("terms." + printable(std::string_view(it->name.GetString(), it->name.GetStringLength())),
            text_of(&it->value));
  }
  for (const auto& p : array_of(c, "catalog_problems"))
    f.add("catalog_problem", field(p, "path") + ": " + field(p, "message"));
  f.print();
  std::printf("\n");
  Table t({"VERSION", "STATE", "BY", "OFFER", "AT", "SIGNED_BY", "REASON"});
  for (const auto& v : array_of(c, "history")) {
    std::vector<std::string> signers;
    for (const auto& s : array_of(v, "signatures")) signers.push_back(field(s, "domain"));
    const Value* at = get(v, "at_ms");
    const std::string reason = field(v, "reason");
    t.add({field(v, "number"), field(v, "state"), field(v, "by"), field(v, "offer"),
           at && at->IsInt64() ? time_text(at->GetInt64()) : "-", signers.empty() ? "-" : join(signers, ", "),
           reason.empty() ? "-" : reason});
  }
  t.print();
  return Exit::ok;
}

// A filter value for the query string: letters, digits and '-' only.
Result<std::string> filter_value(const CommandLine& c, std::string_view option) {
  const std::string* v = c.value(option);
  if (v == nullptr) return std::string();
  if (v->empty() || v->size() > 64)
    return make_error(Errc::invalid_argument, std::string(option) + " needs a value of 1 to 64 characters");
  for (char ch : *v) {
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-'))
      return make_error(Errc::invalid_argument,
                        std::string(option) + " '" + printable(*v) + "' is not a state, domain or kind");
  }
  return *v;
}

// The contracts whose next step is this domain's: the node's own domain
// from GET /v1/health, the list filtered here.
Exit print_awaiting(const Api& api, const Reply& list, const std::string& domain) {
  rapidjson::Document d;
  if (auto problem = base::read_json(list.body, d)) {
    std::fprintf(stderr, "entente: the node's answer is not JSON: %s\n",
                 printable(problem->message()).c_str());
    return Exit::refused;
  }
  Value* contracts = d.IsObject() && d.HasMember("contracts") ? &d["contracts"] : nullptr;
  if (contracts == nullptr || !contracts->IsArray()) return unexpected("'contracts' list");
  for (auto it = contracts->Begin(); it != contracts->End();) {
    if (awaits(*it, domain))
      ++it;
    else
      it = contracts->Erase(it);
  }
  if (api.output() == Output::json) {
    std::printf("%s\n", compact(d).c_str());
    return Exit::ok;
  }
  if (contracts->Empty()) {
    std::printf("no contracts await %s\n", printable(domain).c_str());
    return Exit::ok;
  }
  return print_contract_list(d);
}

Exit contracts_list(Api& api, const CommandLine& c) {
  std::string target = "/v1/contracts";
  char sep = '?';
  static constexpr std::pair<std::string_view, std::string_view> kFilters[] = {
      {"--state", "state"}, {"--peer", "peer"}, {"--kind", "kind"}};
  for (const auto& [option, param] : kFilters) {
    const auto v = filter_value(c, option);
    if (!v.ok()) return usage_error(v.error().message);
    if (v->empty()) continue;
    target += sep + std::string(param) + "=" + *v;
    sep = '&';
  }
  if (!c.has("--awaiting-me")) return get_and_print(api, target, print_contract_list);
  const Reply health = api.call("GET", "/v1/health");
  if (health.exit != Exit::ok) return health.exit;
  rapidjson::Document h;
  const Value* domain = base::read_json(health.body, h) ? nullptr : get(h, "domain");
  if (domain == nullptr || !domain->IsString()) return unexpected("domain in GET /v1/health");
  const Reply list = api.call("GET", target);
  if (list.exit != Exit::ok) return list.exit;
  return print_awaiting(api, list, text_of(domain));
}

Exit contracts_show(Api& api, const CommandLine& c) {
  const auto id = path_name(c.words[0], "a contract id");
  if (!id.ok()) return usage_error(id.error().message);
  return get_and_print(api, "/v1/contracts/" + *id, print_contract);
}

// ------------------------------------------------------------ dispatch

struct Command {
  std::string_view group;
  std::string_view action;     // "" for a command of one word
  size_t words = 0;            // arguments after the command's words
  std::string_view arguments;  // for messages: "NAME"
  std::vector<OptionSpec> options;
  Runner run = nullptr;
};

std::vector<OptionSpec> with(std::vector<OptionSpec> options, std::initializer_list<OptionSpec> more) {
  options.insert(options.end(), more);
  return options;
}

const std::vector<Command>& commands() {
  static const std::vector<Command> kCommands = {
      {"streams", "list", 0, "", {{"--internal", false}}, streams_list},
      {"streams", "show", 1, "NAME", {}, streams_show},
      {"streams",
       "create",
       1,
       "NAME",
       {{"--schema", true},
        {"--event-time", true},
        {"--node", true},
        {"--replication", true},
        {"--durability", true},
        {"--max-tuples", true},
        {"--max-bytes", true},
        {"--max-age", true}},
       streams_create},
      {"streams", "delete", 1, "NAME", {}, streams_delete},
      {"queries", "list", 0, "", {}, queries_list},
      {"queries", "show", 1, "NAME", {}, queries_show},
      {"queries", "deploy", 0, "", {{"--file", true}, {"--start-from", true}}, queries_deploy},
      {"queries",
       "replace",
       1,
       "NAME",
       {{"--file", true}, {"--start-from", true}, {"--drop-state", true}},
       queries_replace},
      {"queries", "stop", 1, "NAME", {}, queries_stop},
      {"queries", "move", 2, "NAME FRAGMENT", {{"--to", true}, {"--cold", false}}, queries_move},
      {"queries", "split", 2, "NAME FRAGMENT", {{"--nodes", true}}, queries_split},
      {"queries", "merge", 2, "NAME FRAGMENT", {}, queries_merge},
      {"queries", "start", 1, "NAME", {}, queries_start},
      {"queries", "delete", 1, "NAME", {}, queries_delete},
      // Before the group's command of one word, which takes the rest.
      {"nodes", "remove", 1, "NODE", {}, nodes_remove},
      {"nodes", "", 0, "", {}, nodes},
      {"peers", "", 0, "", {}, peers},
      {"contracts",
       "list",
       0,
       "",
       {{"--awaiting-me", false}, {"--state", true}, {"--peer", true}, {"--kind", true}},
       contracts_list},
      {"contracts", "show", 1, "ID", {}, contracts_show},
      {"contracts", "propose", 0, "", with(contract_terms_options(), {{"--kind", true}}), contracts_propose},
      {"contracts", "counter", 1, "ID", with(contract_terms_options(), {{"--version", true}}),
       contracts_counter},
      {"contracts", "accept", 1, "ID", {{"--version", true}}, contracts_accept},
      {"contracts", "reject", 1, "ID", {{"--version", true}, {"--reason", true}}, contracts_reject},
      {"contracts", "revoke", 1, "ID", {{"--version", true}, {"--reason", true}}, contracts_revoke},
      {"contracts", "usage", 1, "ID", {}, contracts_usage},
      {"publish",
       "",
       1,
       "STREAM",
       {{"--file", true},
        {"--batch", true},
        {"--producer-id", true},
        {"--first-batch", true},
        {"--retries", true}},
       publish},
      {"imports", "list", 0, "", {}, imports_list},
      {"imports", "show", 1, "DOMAIN/NAME", {}, imports_show},
      {"imports", "create", 1, "DOMAIN/NAME", {{"--node", true}}, imports_create},
      {"imports", "delete", 1, "DOMAIN/NAME", {}, imports_delete},
      {"checkpoint", "list", 0, "", {}, checkpoint_list},
      {"checkpoint", "", 0, "", {}, checkpoint},
  };
  return kCommands;
}

// The command `rest` names, and the arguments after its words; an error
// saying what was expected otherwise.
Result<std::pair<const Command*, std::vector<std::string_view>>> find_command(
    const std::vector<std::string_view>& rest) {
  if (rest.empty()) return make_error(Errc::invalid_argument, "which command? (entente --help)");
  const std::string_view group = rest[0];
  std::vector<std::string> actions;
  for (const auto& c : commands()) {
    if (c.group != group) continue;
    if (c.action.empty()) return std::pair{&c, std::vector<std::string_view>(rest.begin() + 1, rest.end())};
    if (rest.size() > 1 && rest[1] == c.action)
      return std::pair{&c, std::vector<std::string_view>(rest.begin() + 2, rest.end())};
    actions.emplace_back(c.action);
  }
  if (actions.empty())
    return make_error(Errc::invalid_argument, "unknown command '" + printable(group) + "' (entente --help)");
  return make_error(Errc::invalid_argument,
                    std::string(group) + ": expected " + join(actions, ", ") + " after '" +
                        std::string(group) + "'" +
                        (rest.size() > 1 ? ", not '" + printable(rest[1]) + "'" : ""));
}

}  // namespace cli

using namespace cli;

bool is_api_command(const std::vector<std::string_view>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    if (!is_global_flag(a)) {
      for (std::string_view g : kGroups)
        if (a == g) return true;
      // After a global option, whatever follows is this command line's to
      // judge (and to refuse with its own usage).
      return i > 0;
    }
    if (a != "--json" && a.find('=') == std::string_view::npos) ++i;  // its value
  }
  return !args.empty();
}

int run_api_command(const std::vector<std::string_view>& args) {
  auto split = split_globals(args);
  if (!split.ok()) {
    std::fprintf(stderr, "entente: %s\n%s", split.error().message.c_str(), kApiUsage);
    return static_cast<int>(Exit::usage);
  }
  if (split->globals.help) {
    std::fputs(kApiUsage, stdout);
    return static_cast<int>(Exit::ok);
  }
  auto found = find_command(split->rest);
  if (!found.ok()) {
    std::fprintf(stderr, "entente: %s\n%s", found.error().message.c_str(), kApiUsage);
    return static_cast<int>(Exit::usage);
  }
  const Command& cmd = *found->first;
  const std::string name = std::string(cmd.group) + (cmd.action.empty() ? "" : " " + std::string(cmd.action));
  auto line = parse_options(found->second, cmd.options);
  if (line.ok() && line->words.size() != cmd.words) {
    line = make_error(Errc::invalid_argument,
                      cmd.words == 0 ? "takes no argument, not '" + printable(line->words[0]) + "'"
                                     : "needs " + std::string(cmd.arguments) +
                                           (line->words.empty() ? "" : ", and only that"));
  }
  if (!line.ok()) {
    std::fprintf(stderr, "entente %s: %s\n%s", name.c_str(), line.error().message.c_str(), kApiUsage);
    return static_cast<int>(Exit::usage);
  }
  auto settings = resolve_settings(split->globals);
  if (!settings.ok()) {
    std::fprintf(stderr, "entente: %s\n", settings.error().message.c_str());
    return static_cast<int>(Exit::usage);
  }
  Api api(std::move(settings).value(), split->globals.output);
  const Exit e = cmd.run(api, *line);
  std::fflush(stdout);
  return static_cast<int>(e);
}

}  // namespace entente::broker
