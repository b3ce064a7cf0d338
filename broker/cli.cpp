#include "broker/cli.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/log.h"
#include "broker/cli_api.h"
#include "broker/cli_check.h"
#include "broker/config.h"
#include "http/client.h"
#include "broker/node.h"
#include "broker/service_notify.h"
#include "certs/cli.h"
#include "entente_version.h"
#include "rapidjson/document.h"

namespace entente::broker {

namespace {

constexpr const char* kUsage =
    "usage: entente <command> [options]\n"
    "\n"
    "commands:\n"
    "  broker --config FILE   run one node of a domain (see docs/configuration.md)\n"
    "  broker --check [--running] --config FILE\n"
    "                         validate a configuration without starting\n"
    "  backup --config FILE --out DIR\n"
    "                         a consistent copy of a running node's store, to restore\n"
    "                         from (entente backup --help; docs/operations.md)\n"
    "  certs <command> ...    domain CAs and node certificates (entente certs --help)\n"
    "  token-hash TOKEN       print the SHA-256 of a token, as the configuration stores it\n"
    "  subscribe [options] STREAM\n"
    "                         follow a stream over WebSocket, one NDJSON line per tuple\n"
    "                         (entente subscribe --help)\n"
    "\n"
    "commands that speak to a running node's REST API (entente streams --help; docs/cli.md):\n"
    "  streams list | show NAME | create NAME --schema FILE|JSON [...] | delete NAME\n"
    "  queries list | show NAME | deploy --file FILE | delete NAME\n"
    "  nodes | peers | checkpoint\n"
    "  contracts list [--awaiting-me] | show ID | propose ... | counter ID ... | accept ID\n"
    "            | reject ID | revoke ID --reason TEXT | usage ID\n"
    "  publish STREAM [--file F]   NDJSON tuples, in batches a retry never stores twice\n"
    "  imports list | show DOMAIN/NAME | create DOMAIN/NAME | delete DOMAIN/NAME\n"
    "  with the global options --url http(s)://HOST:PORT, --token TOKEN, --ca FILE,\n"
    "  --profile NAME (else ENTENTE_URL, ENTENTE_TOKEN, ENTENTE_CA, ENTENTE_PROFILE),\n"
    "  --timeout DURATION and --json, before or after the command words\n"
    "\n"
    "options:\n"
    "  -h, --help             this text\n"
    "  --version              the version\n"
    "\n"
    "exit codes: 0 success; 1 a failure (for API commands: the node refused); 2 a usage\n"
    "or configuration error; API commands also: 3 the node could not be reached (connect,\n"
    "TLS, timeout), 4 not found (404), 5 conflict (409)\n";

constexpr const char* kBrokerUsage =
    "usage: entente broker --config FILE [--log-format text|json]\n"
    "       entente broker --check [--running] --config FILE\n"
    "\n"
    "Runs one node: the API listener, the streams, the deployed queries and their\n"
    "checkpoints. SIGTERM or SIGINT stops it cleanly: it stops accepting, drains,\n"
    "checkpoints every query and exits 0. SIGHUP reloads FILE: API tokens, the\n"
    "certificates and keys, pinned CAs and peers change at once; what needs a restart\n"
    "is named in the log and kept; an invalid FILE changes nothing (docs/operations.md).\n"
    "--log-format json writes each log line on stderr as one JSON object (default: the\n"
    "file's log_format, else text).\n"
    "\n"
    "--check validates FILE without starting: the configuration (with the key of its\n"
    "problem), every certificate and key (readable, matching, valid now, issued by the\n"
    "domain's CA) and the listen ports (free). Exit 0 with an \"ok\" line; 2 when FILE\n"
    "does not load; 1 listing every problem with certificates, keys, ports, data_dir.\n"
    "With --running (the node runs, and FILE is to be reloaded with SIGHUP) the listen\n"
    "ports are not checked: the node holds them.\n";

// systemd's Type=notify (packaging/systemd/entente.service): READY once the
// API listens, RELOADING around a SIGHUP, STOPPING on the way out.
void tell_service_manager(std::string_view state) {
  if (Status s = notify_service(state); !s.ok()) {
    base::logf(base::LogLevel::warn, "node", "%s", s.error().message.c_str());
  }
}

// SIGHUP: reads the configuration again and applies what a running node
// can change. Every outcome is logged: what changed, what was kept (needs a
// restart), or why nothing changed. Returns the outcome for the audit line.
const char* reload(Node& node, const std::string& config_path) {
  base::logf(base::LogLevel::info, "node", "SIGHUP: reloading %s", config_path.c_str());
  auto config = load_config(config_path);
  if (!config.ok()) {
    base::logf(base::LogLevel::warn, "node", "reload refused, nothing changed: %s: %s",
                 config_path.c_str(), config.error().message.c_str());
    return "refused";
  }
  std::vector<std::string> changes, kept;
  if (Status s = node.reload(std::move(config).value(), changes, kept); !s.ok()) {
    base::logf(base::LogLevel::warn, "node", "reload refused, nothing changed: %s",
                 s.error().message.c_str());
    return "refused";
  }
  for (const auto& c : changes) base::logf(base::LogLevel::info, "node", "reload: %s", c.c_str());
  for (const auto& k : kept) {
    base::logf(base::LogLevel::warn, "node", "reload: %s changed but is not reloaded; restart to apply it",
                 k.c_str());
  }
  base::logf(base::LogLevel::info, "node", "reload done: %zu change(s), %zu setting(s) need a restart",
               changes.size(), kept.size());
  return "done";
}

// Reads --log-format's value; false (after saying why) when it is neither.
bool read_log_format(std::string_view v, std::optional<base::LogFormat>& out) {
  out = base::parse_log_format(v);
  if (!out) {
    std::fprintf(stderr, "entente broker: --log-format must be text or json, not '%.*s'\n%s",
                 static_cast<int>(std::min<size_t>(v.size(), 40)), v.data(), kBrokerUsage);
  }
  return out.has_value();
}

int run_broker(const std::vector<std::string_view>& args) {
  std::string config_path;
  std::optional<base::LogFormat> log_format;  // over the file's log_format
  bool check_only = false;
  CheckPorts ports = CheckPorts::yes;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "-h" || args[i] == "--help") {
      std::fputs(kBrokerUsage, stdout);
      return 0;
    }
    if (args[i] == "--check") {
      check_only = true;
    } else if (args[i] == "--running") {
      ports = CheckPorts::no;
    } else if (args[i] == "--config" && i + 1 < args.size()) {
      config_path = std::string(args[++i]);
    } else if (args[i].rfind("--config=", 0) == 0) {
      config_path = std::string(args[i].substr(9));
    } else if (args[i] == "--log-format" || args[i].rfind("--log-format=", 0) == 0) {
      const bool split = args[i] == "--log-format" && i + 1 < args.size();
      if (!read_log_format(split ? args[++i] : args[i].substr(std::min<size_t>(args[i].size(), 13)), log_format))
        return 2;
    } else {
      std::fprintf(stderr, "entente broker: unknown argument '%.*s'\n%s", static_cast<int>(args[i].size()),
                   args[i].data(), kBrokerUsage);
      return 2;
    }
  }
  if (config_path.empty()) {
    std::fprintf(stderr, "entente broker: --config FILE is required\n%s", kBrokerUsage);
    return 2;
  }
  if (ports == CheckPorts::no && !check_only) {
    std::fprintf(stderr, "entente broker: --running goes with --check\n%s", kBrokerUsage);
    return 2;
  }
  if (check_only) return check_config_file(config_path, ports);
  auto config = load_config(config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "entente broker: %s: %s\n", config_path.c_str(), config.error().message.c_str());
    return 2;
  }
  // Every thread started from here on inherits the blocked signals; this
  // thread alone waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const std::string who = config->domain + "/" + config->node;
  base::process_log().set_node(who);
  base::process_log().set_format(log_format.value_or(config->log_format));
  base::process_log().set_level(config->log_level);
  const bool tls = config->tls;
  const std::string address = config->listen_address;
  auto node = Node::open(std::move(config).value());
  if (!node.ok()) {
    std::fprintf(stderr, "entente broker: %s: %s\n", who.c_str(), node.error().message.c_str());
    return 1;
  }
  if (Status s = (*node)->start(); !s.ok()) {
    std::fprintf(stderr, "entente broker: %s: %s\n", who.c_str(), s.error().message.c_str());
    (*node)->stop();
    return 1;
  }
  const bool v6 = address.find(':') != std::string::npos;
  std::printf("entente: node %s listening on %s://%s%s%s:%u\n", who.c_str(), tls ? "https" : "http",
              v6 ? "[" : "", address.c_str(), v6 ? "]" : "", static_cast<unsigned>((*node)->api_port()));
  std::fflush(stdout);
  tell_service_manager("READY=1\nSTATUS=serving");
  int sig = 0;
  for (;;) {
    sigwait(&signals, &sig);
    if (sig != SIGHUP) break;
    tell_service_manager("RELOADING=1");
    base::log_audit("-", "config.reload", config_path, reload(**node, config_path));  // SIGHUP: no token
    tell_service_manager("READY=1\nSTATUS=serving");
  }
  tell_service_manager("STOPPING=1");
  base::logf(base::LogLevel::info, "node", "stopping (%s)", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (*node)->stop();
  base::log(base::LogLevel::info, "node", "stopped");
  return 0;
}

constexpr const char* kSubscribeUsage =
    "usage: entente subscribe [--host H] --port P [--tls --ca FILE] [--from SEQ] [--count N]\n"
    "                         [--timeout-ms MS] STREAM\n"
    "\n"
    "Follows STREAM and prints each tuple as an NDJSON line ({\"_seq\":..,\"_time\":..,fields}).\n"
    "The token comes from the ENTENTE_TOKEN environment variable (role reader or above).\n"
    "--from SEQ resumes at a sequence number (0: the oldest retained; default: new tuples only);\n"
    "--count N stops after N tuples; --timeout-ms stops after that long without a tuple.\n"
    "In a domain of several nodes, when the stream's leadership moves (close 4010) it resumes\n"
    "where it stopped, through the same node.\n";

// After a close 4010 (`reason` "led by NODE now; resume with from=SEQ"):
// subscribes again where the node said, through the same node, which
// relays to the new leader (it may still be taking the stream over: tried
// for 5 s).
Result<std::unique_ptr<http::WsClient>> resume_moved(const http::ClientOptions& o, const std::string& encoded,
                                                     const std::vector<std::pair<std::string, std::string>>& headers,
                                                     const std::string& reason, uint64_t last_seq) {
  const size_t at = reason.rfind("from=");
  const std::string from = at == std::string::npos ? std::to_string(last_seq + 1) : reason.substr(at + 5);
  const std::string target = "/v1/streams/" + encoded + "/subscribe?format=json&from=" + from;
  auto ws = http::WsClient::connect(o, target, headers);
  for (int tries = 0; !ws.ok() && tries < 50; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ws = http::WsClient::connect(o, target, headers);
  }
  return ws;
}

// The "detail" of a problem+json body, or the body itself (bounded).
std::string problem_text(std::string_view body) {
  const std::string_view key = "\"detail\":\"";
  size_t at = body.find(key);
  if (at != std::string_view::npos) {
    std::string out;
    for (size_t i = at + key.size(); i < body.size() && body[i] != '"'; ++i) {
      if (body[i] == '\\' && i + 1 < body.size()) ++i;
      out += body[i];
    }
    return out;
  }
  return std::string(body.substr(0, 300));
}

// Says what failed when the subscription could not start, and what to
// change: the node's raw error ("HTTP 500: ", "TLS handshake ... failed:
// wrong version number") alone does not tell an operator which option is
// wrong. Probes the node once more when the scheme may be the problem.
std::string explain_connect_failure(const http::ClientOptions& o, const Error& e, const std::string& stream,
                                    bool have_token) {
  const std::string at = o.host + ":" + std::to_string(o.port);
  const std::string& m = e.message;
  auto starts = [&](std::string_view p) { return m.rfind(p, 0) == 0; };
  if (m.find("Connection refused") != std::string::npos) {
    return "nothing listens at " + at + " (" + m +
           "); check --host and --port (the node prints its address when "
           "it starts)";
  }
  if (starts("resolve ")) return "cannot resolve --host " + o.host + " (" + m + ")";
  if (starts("HTTP 401")) {
    return have_token
               ? "the node at " + at + " refused the token in ENTENTE_TOKEN: " + problem_text(m.substr(10))
               : "the node at " + at + " needs a token: set ENTENTE_TOKEN (role reader or above)";
  }
  if (starts("HTTP 403")) return "the token may not read " + stream + ": " + problem_text(m.substr(10));
  if (starts("HTTP 404"))
    return "no stream " + stream + " on the node at " + at + ": " + problem_text(m.substr(10));
  if (starts("HTTP 4") || (starts("HTTP 5") && m.size() > 10)) {
    return "the node at " + at + " refused the subscription: " + m.substr(0, 9) + " " +
           problem_text(m.substr(10));
  }
  // The rest may be a scheme mismatch: ask the node in the other scheme.
  http::ClientOptions other = o;
  other.tls = !o.tls;
  other.verify_peer = false;
  other.timeout_ms = std::min<int64_t>(o.timeout_ms, 3000);
  auto probe = http::Client::connect(other);
  const bool other_works = probe.ok() && (*probe)->request("GET", "/v1/health").ok();
  if (!o.tls && other_works) {
    return "the node at " + at +
           " answered with TLS; pass --tls (and --ca FILE, the CA certificate of the node's "
           "domain, e.g. the ca.crt that 'entente certs' wrote)";
  }
  if (o.tls && other_works) {
    return "the node at " + at + " speaks plain HTTP, not TLS; drop --tls";
  }
  if (o.tls && m.find("certificate verify failed") != std::string::npos) {
    return "the node's certificate is not trusted (" + m +
           "); pass --ca FILE with the CA certificate of the "
           "node's domain" +
           (o.ca_file.empty() ? std::string() : " (not " + o.ca_file + ")");
  }
  if (o.tls && (m.find("hostname mismatch") != std::string::npos ||
                m.find("IP address mismatch") != std::string::npos)) {
    return "the node's certificate does not name " + o.host + " (" + m +
           "); use a --host its certificate "
           "names (entente certs show)";
  }
  if (starts("HTTP ")) {
    return "the node at " + at + " refused the subscription without saying why (" + m +
           "); its log may tell more";
  }
  return m;
}

int run_subscribe(const std::vector<std::string_view>& args) {
  http::ClientOptions o;
  std::string stream, from;
  uint64_t count = 0;
  int64_t idle_ms = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) return {};
      return std::string(args[++i]);
    };
    const auto a = args[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kSubscribeUsage, stdout);
      return 0;
    } else if (a == "--host") {
      o.host = value();
    } else if (a == "--port") {
      const std::string v = value();
      char* end = nullptr;
      const unsigned long port = std::strtoul(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || port == 0 || port > 65535) {
        std::fprintf(stderr, "entente subscribe: --port '%s' is not a port (1..65535)\n%s", v.c_str(),
                     kSubscribeUsage);
        return 2;
      }
      o.port = static_cast<uint16_t>(port);
    } else if (a == "--tls") {
      o.tls = true;
    } else if (a == "--ca") {
      o.ca_file = value();
    } else if (a == "--from") {
      from = value();
    } else if (a == "--count") {
      count = std::strtoull(value().c_str(), nullptr, 10);
    } else if (a == "--timeout-ms") {
      idle_ms = std::strtoll(value().c_str(), nullptr, 10);
    } else if (!a.empty() && a[0] != '-' && stream.empty()) {
      stream = std::string(a);
    } else {
      std::fprintf(stderr, "entente subscribe: unexpected argument '%.*s'\n%s", static_cast<int>(a.size()), a.data(),
                   kSubscribeUsage);
      return 2;
    }
  }
  if (stream.empty() || o.port == 0) {
    std::fprintf(stderr, "entente subscribe: STREAM and --port are required\n%s", kSubscribeUsage);
    return 2;
  }
  const char* token = std::getenv("ENTENTE_TOKEN");
  std::vector<std::pair<std::string, std::string>> headers;
  if (token) headers.emplace_back("authorization", std::string("Bearer ") + token);
  // A stream of another domain ("acme/bids") goes in the path as one
  // segment, its slash percent-encoded.
  std::string encoded;
  for (char c : stream) encoded += c == '/' ? std::string("%2F") : std::string(1, c);
  std::string target = "/v1/streams/" + encoded + "/subscribe?format=json";
  if (!from.empty()) target += "&from=" + from;
  if (o.tls && !o.ca_file.empty()) {
    if (std::FILE* f = std::fopen(o.ca_file.c_str(), "rb")) {
      std::fclose(f);
    } else {
      std::fprintf(stderr, "entente subscribe: --ca %s: %s\n", o.ca_file.c_str(), std::strerror(errno));
      return 2;
    }
  }
  auto ws = http::WsClient::connect(o, target, headers);
  if (!ws.ok()) {
    std::fprintf(stderr, "entente subscribe: %s\n",
                 explain_connect_failure(o, ws.error(), stream, token != nullptr).c_str());
    return 1;
  }
  uint64_t seen = 0;
  uint64_t last_seq = 0;  // of the last tuple printed, for the resume hint
  auto resume_hint = [&]() -> std::string {
    if (last_seq == 0) return "";
    return "; to continue where this stopped, pass --from " + std::to_string(last_seq + 1);
  };
  auto last = std::chrono::steady_clock::now();
  while (count == 0 || seen < count) {
    auto m = (*ws)->receive(200);
    if (!m.ok()) {
      if (m.error().code == Errc::unavailable) {
        if (idle_ms > 0 && std::chrono::steady_clock::now() - last > std::chrono::milliseconds(idle_ms)) break;
        continue;
      }
      std::fprintf(stderr, "entente subscribe: the connection to the node at %s:%u broke (%s)%s\n",
                   o.host.c_str(), static_cast<unsigned>(o.port), m.error().message.c_str(),
                   resume_hint().c_str());
      return 1;
    }
    if (m->closed && m->close_code == 4010) {
      // The stream is led by another node now (a move or a failover).
      std::fprintf(stderr, "entente subscribe: %s; resuming\n", m->close_reason.c_str());
      auto next = resume_moved(o, encoded, headers, m->close_reason, last_seq);
      if (!next.ok()) {
        std::fprintf(stderr, "entente subscribe: resuming: %s%s\n", next.error().message.c_str(),
                     resume_hint().c_str());
        return 1;
      }
      ws = std::move(next);
      continue;
    }
    if (m->closed) {
      std::string why = m->close_reason;
      if (m->close_code == 1001) why += " (the node is stopping or restarting)";
      if (m->close_code == 4001) why += " (this client read too slowly for the node's send buffer)";
      std::fprintf(stderr, "entente subscribe: closed by the node: %u %s%s\n", m->close_code, why.c_str(),
                   m->close_code == 1000 ? "" : resume_hint().c_str());
      return m->close_code == 1000 ? 0 : 1;
    }
    last = std::chrono::steady_clock::now();
    std::string_view data = m->data;
    while (!data.empty() && (count == 0 || seen < count)) {
      size_t nl = data.find('\n');
      std::string_view line = data.substr(0, nl);
      if (!line.empty()) {
        if (line.rfind("{\"_seq\":", 0) == 0) last_seq = std::strtoull(line.data() + 8, nullptr, 10);
        std::fwrite(line.data(), 1, line.size(), stdout);
        std::fputc('\n', stdout);
        ++seen;
      }
      if (nl == std::string_view::npos) break;
      data.remove_prefix(nl + 1);
    }
    std::fflush(stdout);
  }
  (void)(*ws)->close();
  return 0;
}

constexpr const char* kBackupUsage =
    "usage: entente backup --config FILE --out DIR [--host H] [--port P] [--ca FILE]\n"
    "                      [--server-name NAME] [--token-file FILE] [--timeout-ms MS]\n"
    "\n"
    "Asks the running node that FILE configures for a consistent copy of its store\n"
    "(POST /v1/admin/backup: a RocksDB checkpoint, taken while the node serves) and\n"
    "waits for it. The node writes DIR itself: DIR must not exist, and must be on the\n"
    "node's machine where the node's user may write (a path on the same filesystem as\n"
    "data_dir costs little: table files are hard links). DIR then serves as a\n"
    "data_dir: stop the node, put DIR in place of its data_dir, start it\n"
    "(docs/operations.md, \"Backup and restore\").\n"
    "\n"
    "The admin token comes from --token-file or the ENTENTE_TOKEN environment variable.\n"
    "The node's address is its api.listen; --host/--port override it (needed when\n"
    "api.listen has port 0). With api.tls, --ca names the CA that issued the node's\n"
    "API certificate and --server-name the name in it (default: the host).\n";

// The "detail" of a problem+json answer, or the body itself.
std::string problem_detail(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.data(), body.size());
  if (!d.HasParseError() && d.IsObject() && d.HasMember("detail") && d["detail"].IsString()) return d["detail"].GetString();
  return body.substr(0, 500);
}

// What `entente backup` was asked for on its command line.
struct BackupArgs {
  std::string config_path, out, token_file, host, ca, server_name;
  long port = -1;
  int64_t timeout_ms = 600'000;
};

// Reads the command line into `b`; an exit code when the command ends here
// (0 after --help, 2 with a message on stderr for a bad argument).
std::optional<int> read_backup_args(const std::vector<std::string_view>& args, BackupArgs& b) {
  for (size_t i = 0; i < args.size(); ++i) {
    const auto a = args[i];
    auto value = [&]() -> std::optional<std::string> {
      if (i + 1 >= args.size()) return std::nullopt;
      return std::string(args[++i]);
    };
    std::optional<std::string> v;
    if (a == "-h" || a == "--help") {
      std::fputs(kBackupUsage, stdout);
      return 0;
    }
    const bool known = a == "--config" || a == "--out" || a == "--host" || a == "--port" || a == "--ca" ||
                       a == "--server-name" || a == "--token-file" || a == "--timeout-ms";
    if (!known || !(v = value())) {
      std::fprintf(stderr, "entente backup: %s '%.*s'\n%s", known ? "a value is missing after" : "unknown argument",
                   static_cast<int>(a.size()), a.data(), kBackupUsage);
      return 2;
    }
    if (a == "--config") b.config_path = *v;
    else if (a == "--out") b.out = *v;
    else if (a == "--host") b.host = *v;
    else if (a == "--ca") b.ca = *v;
    else if (a == "--server-name") b.server_name = *v;
    else if (a == "--token-file") b.token_file = *v;
    else if (a == "--port" || a == "--timeout-ms") {
      char* end = nullptr;
      const long long n = std::strtoll(v->c_str(), &end, 10);
      const bool is_port = a == "--port";
      if (v->empty() || *end != '\0' || n <= 0 || (is_port && n > 65535)) {
        std::fprintf(stderr, "entente backup: %.*s must be a positive integer%s, not '%s'\n",
                     static_cast<int>(a.size()), a.data(), is_port ? " up to 65535" : "", v->c_str());
        return 2;
      }
      if (is_port) b.port = static_cast<long>(n);
      else b.timeout_ms = n;
    }
  }
  if (b.config_path.empty() || b.out.empty()) {
    std::fprintf(stderr, "entente backup: --config FILE and --out DIR are required\n%s", kBackupUsage);
    return 2;
  }
  return std::nullopt;
}

// The admin token from --token-file (trailing line ends and spaces dropped)
// or ENTENTE_TOKEN; nullopt, with a message on stderr, when there is none.
std::optional<std::string> read_backup_token(const std::string& token_file) {
  std::string token;
  if (!token_file.empty()) {
    std::ifstream f(token_file);
    std::stringstream ss;
    ss << f.rdbuf();
    if (!f) {
      std::fprintf(stderr, "entente backup: cannot read the token file '%s'\n", token_file.c_str());
      return std::nullopt;
    }
    token = ss.str();
    while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
  } else if (const char* t = std::getenv("ENTENTE_TOKEN")) {
    token = t;
  }
  if (token.empty()) {
    std::fputs("entente backup: no admin token: set ENTENTE_TOKEN or give --token-file FILE\n", stderr);
    return std::nullopt;
  }
  return token;
}

// Where and how to reach the node: its api.listen unless --host/--port say
// otherwise, with TLS as it serves it; nullopt, with a message on stderr,
// when the configuration and the arguments do not say enough.
std::optional<http::ClientOptions> backup_client_options(const BackupArgs& b, const NodeConfig& config) {
  http::ClientOptions o;
  o.host = b.host.empty() ? config.listen_address : b.host;
  // A node listening on every address answers on loopback.
  if (b.host.empty() && o.host == "0.0.0.0") o.host = "127.0.0.1";
  if (b.host.empty() && o.host == "::") o.host = "::1";
  o.port = static_cast<uint16_t>(b.port > 0 ? b.port : config.listen_port);
  if (o.port == 0) {
    std::fputs("entente backup: the configuration's api.listen has port 0 (chosen at start-up, printed in the "
               "node's \"listening on\" line): give --port P\n",
               stderr);
    return std::nullopt;
  }
  o.tls = config.tls;
  o.ca_file = b.ca;
  o.server_name = b.server_name;
  o.timeout_ms = b.timeout_ms;
  if (o.tls && o.ca_file.empty()) {
    std::fputs("entente backup: the node serves its API over TLS: give --ca FILE, the CA that issued its "
               "certificate\n",
               stderr);
    return std::nullopt;
  }
  return o;
}

// {"dir": DIR} for POST /v1/admin/backup; nullopt, with a message on
// stderr, when DIR holds a control character.
std::optional<std::string> backup_request_body(const std::string& dir) {
  std::string body = "{\"dir\":\"";
  for (char c : dir) {
    if (c == '"' || c == '\\') body += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      std::fprintf(stderr, "entente backup: --out contains a control character\n");
      return std::nullopt;
    }
    body += c;
  }
  body += "\"}";
  return body;
}

int run_backup(const std::vector<std::string_view>& args) {
  BackupArgs b;
  if (auto exit_code = read_backup_args(args, b)) return *exit_code;
  auto config = load_config(b.config_path);
  if (!config.ok()) {
    std::fprintf(stderr, "entente backup: %s: %s\n", b.config_path.c_str(), config.error().message.c_str());
    return 2;
  }
  const auto token = read_backup_token(b.token_file);
  if (!token) return 2;
  const auto o = backup_client_options(b, *config);
  if (!o) return 2;
  // The node resolves the path, not this process: make it absolute here.
  std::error_code ec;
  const std::string dir = std::filesystem::absolute(b.out, ec).lexically_normal().string();
  if (ec) {
    std::fprintf(stderr, "entente backup: --out %s: %s\n", b.out.c_str(), ec.message().c_str());
    return 2;
  }
  auto client = http::Client::connect(*o);
  if (!client.ok()) {
    std::fprintf(stderr, "entente backup: cannot reach the node at %s:%u: %s\n", o->host.c_str(),
                 static_cast<unsigned>(o->port), client.error().message.c_str());
    return 1;
  }
  const auto body = backup_request_body(dir);
  if (!body) return 2;
  auto r = (*client)->request("POST", "/v1/admin/backup", *body, "application/json",
                              {{"authorization", "Bearer " + *token}});
  if (!r.ok()) {
    std::fprintf(stderr, "entente backup: %s\n", r.error().message.c_str());
    return 1;
  }
  if (r->status != 201) {
    std::fprintf(stderr, "entente backup: the node answered %u: %s\n", r->status, problem_detail(r->body).c_str());
    return 1;
  }
  rapidjson::Document d;
  d.Parse(r->body.data(), r->body.size());
  const bool ok = !d.HasParseError() && d.IsObject() && d.HasMember("bytes") && d["bytes"].IsUint64() &&
                  d.HasMember("rocksdb_sequence") && d["rocksdb_sequence"].IsUint64();
  std::printf("entente: backup of %s/%s in %s (%llu bytes, up to RocksDB sequence %llu)\n", config->domain.c_str(),
              config->node.c_str(), dir.c_str(), ok ? static_cast<unsigned long long>(d["bytes"].GetUint64()) : 0ULL,
              ok ? static_cast<unsigned long long>(d["rocksdb_sequence"].GetUint64()) : 0ULL);
  return 0;
}

}  // namespace

int run_cli(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string_view cmd = args[0];
  std::vector<std::string_view> rest(args.begin() + 1, args.end());
  if (cmd == "-h" || cmd == "--help" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "--version" || cmd == "version") {
    std::printf("entente %s\n", kBuildVersion);
    return 0;
  }
  if (is_api_command(args)) return run_api_command(args);
  if (cmd == "broker") return run_broker(rest);
  if (cmd == "backup") return run_backup(rest);
  if (cmd == "subscribe") return run_subscribe(rest);
  if (cmd == "certs") {
    const std::vector<std::string> certs_args(rest.begin(), rest.end());
    std::fflush(stdout);
    return certs::run_certs(certs_args, std::cout, std::cerr);
  }
  if (cmd == "token-hash") {
    if (rest.size() != 1) {
      std::fputs("usage: entente token-hash TOKEN\n", stderr);
      return 2;
    }
    std::printf("%s\n", hash_token(rest[0]).c_str());
    return 0;
  }
  std::fprintf(stderr, "entente: unknown command '%.*s'\n%s", static_cast<int>(cmd.size()), cmd.data(), kUsage);
  return 2;
}

}  // namespace entente::broker
