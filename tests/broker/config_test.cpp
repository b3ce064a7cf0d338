// Node configuration: a full file, defaults, every validation error with the
// key it names, relative path resolution, the documented example files,
// load_config's file errors, and hash_token.
#include "broker/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace entente::broker {
namespace {

namespace fs = std::filesystem;

constexpr const char* kHashA = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
constexpr const char* kHashB = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

// A minimal valid configuration with `fragment` spliced in as extra
// top-level keys (it starts with a comma when non-empty).
std::string minimal(const std::string& api = R"({"listen": "127.0.0.1:8443", "tls": false})",
                    const std::string& fragment = "") {
  return R"({"domain": "acme", "node": "n1", "api": )" + api +
         R"(, "data_dir": "/var/lib/entente/n1",
            "tokens": [{"name": "ops", "role": "admin", "sha256": ")" +
         std::string(kHashA) + R"("}])" + fragment + "}";
}

// The error message of parsing `json`, or "" when it parsed.
std::string error_of(const std::string& json, const std::string& base = "/etc/entente") {
  auto r = parse_config(json, base);
  return r.ok() ? std::string() : r.error().message;
}

TEST(Config, FullFileWithEveryKey) {
  const std::string json = R"({
    "domain": "acme",
    "node": "n-1",
    "api": {
      "listen": "10.1.2.3:8443",
      "tls": {"cert": "/etc/entente/n1.pem", "key": "/etc/entente/n1.key"},
      "limits": {"max_body_bytes": "8MiB", "max_header_bytes": 32768, "read_timeout": "5s",
                 "idle_timeout": "2m", "max_connections": 100, "ws_max_message_bytes": "1MiB",
                 "ws_send_buffer_bytes": "4MiB", "ws_ping_interval": "250ms"}
    },
    "data_dir": "/var/lib/entente/n1",
    "tokens": [
      {"name": "ops", "role": "admin", "sha256": ")" +
                           std::string(kHashA) + R"("},
      {"name": "ci-publisher", "role": "publisher", "sha256": ")" +
                           std::string(kHashB) + R"("}
    ],
    "retention": {"max_tuples": 1000000, "max_bytes": "2GiB", "max_age": "7d"},
    "checkpoint_interval": "500ms",
    "retention_check_interval": "250ms",
    "ingest_durability": "process",
    "threads": {"network": 2, "engine": 3},
    "limits": {"ingest_queue_bytes": "32MiB", "query_max_lag_tuples": 5000, "max_streams": 10,
               "max_queries": 5}
  })";
  auto r = parse_config(json, "/etc/entente");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const NodeConfig& c = *r;
  EXPECT_EQ(c.domain, "acme");
  EXPECT_EQ(c.node, "n-1");
  EXPECT_EQ(c.listen_address, "10.1.2.3");
  EXPECT_EQ(c.listen_port, 8443);
  EXPECT_TRUE(c.tls);
  EXPECT_EQ(c.tls_cert_file, "/etc/entente/n1.pem");
  EXPECT_EQ(c.tls_key_file, "/etc/entente/n1.key");
  EXPECT_EQ(c.limits.max_body_bytes, 8u << 20);
  EXPECT_EQ(c.limits.max_header_bytes, 32768u);
  EXPECT_EQ(c.limits.read_timeout_ms, 5000);
  EXPECT_EQ(c.limits.idle_timeout_ms, 120000);
  EXPECT_EQ(c.limits.max_connections, 100u);
  EXPECT_EQ(c.limits.ws_max_message_bytes, 1u << 20);
  EXPECT_EQ(c.limits.ws_send_buffer_bytes, 4u << 20);
  EXPECT_EQ(c.limits.ws_ping_interval_ms, 250);
  EXPECT_EQ(c.data_dir, "/var/lib/entente/n1");
  ASSERT_EQ(c.tokens.size(), 2u);
  EXPECT_EQ(c.tokens[0].name, "ops");
  EXPECT_EQ(c.tokens[0].role, Role::admin);
  EXPECT_EQ(c.tokens[0].sha256, kHashA);
  EXPECT_EQ(c.tokens[1].name, "ci-publisher");
  EXPECT_EQ(c.tokens[1].role, Role::publisher);
  EXPECT_EQ(c.retention.max_tuples, 1000000u);
  EXPECT_EQ(c.retention.max_bytes, 2ull << 30);
  EXPECT_EQ(c.retention.max_age_ms, 7 * 24 * 3600 * 1000LL);
  EXPECT_EQ(c.checkpoint_interval_ms, 500);
  EXPECT_EQ(c.retention_check_interval_ms, 250);
  EXPECT_EQ(c.ingest_durability, IngestDurability::process);
  EXPECT_EQ(c.network_threads, 2);
  EXPECT_EQ(c.engine_threads, 3);
  EXPECT_EQ(c.ingest_queue_bytes, 32u << 20);
  EXPECT_EQ(c.query_max_lag_tuples, 5000u);
  EXPECT_EQ(c.max_streams, 10u);
  EXPECT_EQ(c.max_queries, 5u);
}

TEST(Config, DefaultsForEverythingOptional) {
  auto r = parse_config(minimal(), "/etc/entente");
  ASSERT_TRUE(r.ok()) << r.error().message;
  const NodeConfig d;
  EXPECT_FALSE(r->tls);
  EXPECT_EQ(r->listen_address, "127.0.0.1");
  EXPECT_EQ(r->listen_port, 8443);
  EXPECT_EQ(r->limits.max_body_bytes, d.limits.max_body_bytes);
  EXPECT_EQ(r->limits.max_header_bytes, d.limits.max_header_bytes);
  EXPECT_EQ(r->limits.read_timeout_ms, 10'000);
  EXPECT_EQ(r->limits.idle_timeout_ms, 60'000);
  EXPECT_EQ(r->limits.max_connections, d.limits.max_connections);
  EXPECT_EQ(r->limits.ws_max_message_bytes, d.limits.ws_max_message_bytes);
  EXPECT_EQ(r->limits.ws_send_buffer_bytes, d.limits.ws_send_buffer_bytes);
  EXPECT_EQ(r->limits.ws_ping_interval_ms, 15'000);
  EXPECT_EQ(r->retention.max_tuples, 0u);
  EXPECT_EQ(r->retention.max_bytes, 1ull << 30);
  EXPECT_EQ(r->retention.max_age_ms, 24 * 3600 * 1000LL);
  EXPECT_EQ(r->checkpoint_interval_ms, 1000);
  EXPECT_EQ(r->retention_check_interval_ms, 5000);
  // Acknowledged tuples survive a power loss unless the operator opts out.
  EXPECT_EQ(r->ingest_durability, IngestDurability::fsync);
  EXPECT_EQ(r->network_threads, 1);
  EXPECT_EQ(r->engine_threads, 1);
  EXPECT_EQ(r->ingest_queue_bytes, d.ingest_queue_bytes);
  EXPECT_EQ(r->query_max_lag_tuples, d.query_max_lag_tuples);
  EXPECT_EQ(r->max_streams, d.max_streams);
  EXPECT_EQ(r->max_queries, d.max_queries);
}

TEST(Config, ListenForms) {
  auto v6 = parse_config(minimal(R"({"listen": "[::1]:9000", "tls": false})"), "/");
  ASSERT_TRUE(v6.ok()) << v6.error().message;
  EXPECT_EQ(v6->listen_address, "::1");
  EXPECT_EQ(v6->listen_port, 9000);

  auto local = parse_config(minimal(R"({"listen": "localhost:0", "tls": false})"), "/");
  ASSERT_TRUE(local.ok()) << local.error().message;
  EXPECT_EQ(local->listen_address, "127.0.0.1");
  EXPECT_EQ(local->listen_port, 0);  // ephemeral

  auto loop8 = parse_config(minimal(R"({"listen": "127.8.9.10:65535", "tls": false})"), "/");
  ASSERT_TRUE(loop8.ok()) << loop8.error().message;
  EXPECT_EQ(loop8->listen_port, 65535);

  auto any6 =
      parse_config(minimal(R"({"listen": "[::]:443", "tls": {"cert": "c.pem", "key": "k.pem"}})"), "/");
  ASSERT_TRUE(any6.ok()) << any6.error().message;
  EXPECT_EQ(any6->listen_address, "::");
}

TEST(Config, ListenErrorsNameTheKey) {
  auto api = [](const std::string& listen) {
    return minimal(R"({"listen": ")" + listen + R"(", "tls": false})");
  };
  EXPECT_EQ(error_of(api("localhost")), R"(api.listen: expected "host:port", got "localhost")");
  EXPECT_EQ(error_of(api("127.0.0.1:")), R"(api.listen: expected "host:port", got "127.0.0.1:")");
  EXPECT_EQ(error_of(api("127.0.0.1:http")), R"(api.listen: expected "host:port", got "127.0.0.1:http")");
  EXPECT_EQ(error_of(api("127.0.0.1:65536")), "api.listen: the port must be 0..65535, got 65536");
  EXPECT_EQ(error_of(api("::1:8443")),
            R"(api.listen: an IPv6 address needs brackets, as in "[::1]:8443"; got "::1:8443")");
  EXPECT_EQ(error_of(api("[::1]8443")), R"(api.listen: expected "host:port", got "[::1]8443")");
  EXPECT_EQ(error_of(api("[nope]:1")), R"(api.listen: "nope" is not an IPv6 address)");
  EXPECT_EQ(error_of(api("example.com:80")),
            R"(api.listen: the host must be an IP address or localhost, got "example.com")");
  EXPECT_EQ(error_of(minimal(R"({"listen": 8443, "tls": false})")),
            "api.listen: expected a string, got 8443");
  EXPECT_EQ(error_of(minimal(R"({"tls": false})")), "api.listen: required");
}

TEST(Config, PlainHttpOnlyOnLoopback) {
  EXPECT_EQ(error_of(minimal(R"({"listen": "10.0.0.1:8080", "tls": false})")),
            "api.tls: plain HTTP is allowed only on a loopback address; 10.0.0.1 is not "
            "(give api.tls.cert and api.tls.key)");
  EXPECT_EQ(error_of(minimal(R"({"listen": "0.0.0.0:8080", "tls": false})")),
            "api.tls: plain HTTP is allowed only on a loopback address; 0.0.0.0 is not "
            "(give api.tls.cert and api.tls.key)");
  EXPECT_NE(error_of(minimal(R"({"listen": "[::]:8080", "tls": false})")), "");
  EXPECT_EQ(error_of(minimal(R"({"listen": "[::ffff:127.0.0.1]:8080", "tls": false})")), "");
  EXPECT_EQ(error_of(minimal(R"({"listen": "10.0.0.1:8080", "tls": true})")),
            R"(api.tls: expected {"cert": ..., "key": ...} or false, got true)");
  EXPECT_EQ(
      error_of(minimal(R"({"listen": "10.0.0.1:8080"})")),
      R"(api.tls: required: {"cert": "...pem", "key": "...key"}, or false for plain HTTP on a loopback address)");
  EXPECT_EQ(error_of(minimal(R"({"listen": "10.0.0.1:8080", "tls": {"cert": "a.pem"}})")),
            "api.tls.key: required");
  EXPECT_EQ(error_of(minimal(R"({"listen": "10.0.0.1:8080", "tls": {"cert": "", "key": "k"}})")),
            "api.tls.cert: must not be empty");
}

TEST(Config, RelativePathsResolveAgainstBaseDir) {
  auto r = parse_config(R"({"domain": "acme", "node": "n1",
      "api": {"listen": "10.0.0.1:8443", "tls": {"cert": "certs/n1.pem", "key": "./certs/../keys/n1.key"}},
      "data_dir": "data/n1",
      "tokens": [{"name": "ops", "role": "admin", "sha256": ")" +
                            std::string(kHashA) + R"("}]})",
                        "/etc/entente");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->tls_cert_file, "/etc/entente/certs/n1.pem");
  EXPECT_EQ(r->tls_key_file, "/etc/entente/keys/n1.key");
  EXPECT_EQ(r->data_dir, "/etc/entente/data/n1");

  // An empty or relative base is taken from the current directory.
  auto rel = parse_config(minimal(), "");
  ASSERT_TRUE(rel.ok());
  EXPECT_EQ(rel->data_dir, "/var/lib/entente/n1");  // absolute stays as is
  auto cwd = parse_config(R"({"domain": "acme", "node": "n1", "api": {"listen": "127.0.0.1:1", "tls": false},
      "data_dir": "d", "tokens": [{"name": "ops", "role": "admin", "sha256": ")" +
                              std::string(kHashA) + R"("}]})",
                          "");
  ASSERT_TRUE(cwd.ok());
  EXPECT_EQ(cwd->data_dir, (fs::current_path() / "d").lexically_normal().string());
}

TEST(Config, RequiredKeysAndNames) {
  EXPECT_EQ(error_of(R"({"node": "n1"})"), "domain: required");
  EXPECT_EQ(error_of(R"({"domain": "acme"})"), "node: required");
  EXPECT_EQ(error_of(R"({"domain": "acme", "node": "n1"})"), "api: required");
  EXPECT_EQ(error_of(R"({"domain": "acme", "node": "n1", "api": {"listen": "127.0.0.1:1", "tls": false}})"),
            "data_dir: required");
  EXPECT_EQ(error_of(R"({"domain": "acme", "node": "n1", "api": {"listen": "127.0.0.1:1", "tls": false},
                         "data_dir": "/d"})"),
            "tokens: required");
  EXPECT_EQ(error_of(R"({"domain": "Acme", "node": "n1"})"),
            R"(domain: expected [a-z][a-z0-9-]*, at most 63 characters, got "Acme")");
  EXPECT_EQ(error_of(R"({"domain": "acme", "node": "1n"})"),
            R"(node: expected [a-z][a-z0-9-]*, at most 63 characters, got "1n")");
  EXPECT_EQ(error_of(R"({"domain": ")" + std::string(64, 'a') + R"("})").substr(0, 30),
            "domain: expected [a-z][a-z0-9-");
  EXPECT_EQ(error_of(R"({"domain": ")" + std::string(63, 'a') + R"(", "node": 7})"),
            "node: expected a string, got 7");
  EXPECT_EQ(error_of(R"({"domain": "acme", "node": "n1", "api": [], "data_dir": "/d"})"),
            "api: expected an object, got an array");
  EXPECT_EQ(error_of(minimal(R"({"listen": "127.0.0.1:1", "tls": false})", R"(, "data_dir": "/x")")),
            "data_dir: given twice");
}

TEST(Config, UnknownKeysAreRejectedWithASuggestion) {
  EXPECT_EQ(error_of(minimal(R"({"listen": "127.0.0.1:1", "tls": false, "limts": {}})")),
            "api.limts: unknown key (did you mean limits?)");
  EXPECT_EQ(
      error_of(minimal(R"({"listen": "127.0.0.1:1", "tls": false})", R"(, "chekpoint_interval": "1s")")),
      "chekpoint_interval: unknown key (did you mean checkpoint_interval?)");
  EXPECT_EQ(error_of(minimal(R"({"listen": "127.0.0.1:1", "tls": false})", R"(, "colour": 1)")),
            "colour: unknown key; known keys: domain, node, api, data_dir, tokens, retention, "
            "checkpoint_interval, retention_check_interval, ingest_durability, threads, limits, federation, cluster, "
            "log_level, log_format");
  EXPECT_EQ(error_of(minimal(R"({"listen": "127.0.0.1:1", "tls": false, "limits": {"read_timout": "1s"}})")),
            "api.limits.read_timout: unknown key (did you mean read_timeout?)");
  EXPECT_EQ(error_of(minimal(R"({"listen": "127.0.0.1:1", "tls": {"cert": "c", "key": "k", "ca": "x"}})")),
            "api.tls.ca: unknown key; known keys: cert, key");
  // A key with odd characters is shown quoted and escaped.
  EXPECT_EQ(error_of(minimal(R"({"listen": "127.0.0.1:1", "tls": false})", R"(, "a b\n": 1)")),
            R"("a b\x0a": unknown key; known keys: domain, node, api, data_dir, tokens, retention, )"
            "checkpoint_interval, retention_check_interval, ingest_durability, threads, limits, federation, cluster, "
            "log_level, log_format");
}

TEST(Config, LogLevelAndFormat) {
  const std::string api = R"({"listen": "127.0.0.1:1", "tls": false})";
  auto defaults = parse_config(minimal(api), "/etc/entente");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->log_level, base::LogLevel::info);
  EXPECT_EQ(defaults->log_format, base::LogFormat::text);
  auto set = parse_config(minimal(api, R"(, "log_level": "debug", "log_format": "json")"), "/etc/entente");
  ASSERT_TRUE(set.ok()) << set.error().message;
  EXPECT_EQ(set->log_level, base::LogLevel::debug);
  EXPECT_EQ(set->log_format, base::LogFormat::json);
  EXPECT_EQ(error_of(minimal(api, R"(, "log_level": "verbose")")),
            R"(log_level: expected error, warn, info or debug, got "verbose")");
  EXPECT_EQ(error_of(minimal(api, R"(, "log_format": "yaml")")), R"(log_format: expected text or json, got "yaml")");
  EXPECT_EQ(error_of(minimal(api, R"(, "log_format": 1)")), "log_format: expected a string, got 1");
}

TEST(Config, Tokens) {
  auto tokens = [](const std::string& list) {
    return R"({"domain": "acme", "node": "n1", "api": {"listen": "127.0.0.1:1", "tls": false},
               "data_dir": "/d", "tokens": )" +
           list + "}";
  };
  const std::string a = kHashA, b = kHashB;
  EXPECT_EQ(error_of(tokens(R"([{"name": "ops", "role": "admin", "sha256": ")" + a + R"("},
                                {"name": "p", "role": "publisher", "sha256": ")" +
                            b + R"("},
                                {"name": "r", "role": "root", "sha256": ")" +
                            std::string(64, 'c') + R"("}])")),
            R"(tokens[2].role: expected one of admin, publisher, reader, got "root")");
  EXPECT_EQ(
      error_of(tokens(R"([{"name": "ops", "role": "admin", "sha256": ")" + std::string(64, 'A') + R"("}])")),
      "tokens[0].sha256: expected 64 lowercase hex characters (sha256sum of the token)");
  EXPECT_EQ(error_of(tokens(R"([{"name": "ops", "role": "admin", "sha256": "abc"}])")),
            "tokens[0].sha256: expected 64 lowercase hex characters (sha256sum of the token)");
  EXPECT_EQ(error_of(tokens(R"([{"name": "ops", "role": "reader", "sha256": ")" + a + R"("}])")),
            "tokens: at least one token with role admin is required");
  EXPECT_EQ(error_of(tokens("[]")), "tokens: at least one token with role admin is required");
  EXPECT_EQ(error_of(tokens("{}")), "tokens: expected an array of tokens, got an object");
  EXPECT_EQ(error_of(tokens(R"([{"role": "admin", "sha256": ")" + a + R"("}])")), "tokens[0].name: required");
  EXPECT_EQ(error_of(tokens(R"([{"name": "ops", "sha256": ")" + a + R"("}])")), "tokens[0].role: required");
  EXPECT_EQ(error_of(tokens(R"([{"name": "ops", "role": "admin"}])")), "tokens[0].sha256: required");
  EXPECT_EQ(error_of(tokens(R"([{"name": "ops", "role": "admin", "sha256": ")" + a + R"(", "token": "x"}])")),
            "tokens[0].token: unknown key; known keys: name, role, sha256");
  EXPECT_EQ(error_of(tokens(R"([{"name": "ops", "role": "admin", "sha256": ")" + a + R"("},
                                {"name": "ops", "role": "reader", "sha256": ")" +
                            b + R"("}])")),
            R"(tokens[1].name: "ops" is also the name of tokens[0])");
  EXPECT_EQ(error_of(tokens(R"([{"name": "ops", "role": "admin", "sha256": ")" + a + R"("},
                                {"name": "ro", "role": "reader", "sha256": ")" +
                            a + R"("}])")),
            "tokens[1].sha256: the same hash as tokens[0]; each token must be distinct");
  EXPECT_EQ(error_of(tokens(R"([{"name": "Ops", "role": "admin", "sha256": ")" + a + R"("}])")),
            R"(tokens[0].name: expected [a-z][a-z0-9-]*, at most 63 characters, got "Ops")");

  // 1000 tokens are allowed, 1001 are not.
  auto many = [&](int n) {
    std::string list = "[";
    for (int i = 0; i < n; ++i) {
      if (i) list += ",";
      list += R"({"name": "t)" + std::to_string(i) + R"(", "role": "admin", "sha256": ")" +
              hash_token(std::to_string(i)) + R"("})";
    }
    return tokens(list + "]");
  };
  EXPECT_EQ(error_of(many(1000)), "");
  EXPECT_EQ(error_of(many(1001)), "tokens: 1001 tokens; the limit is 1000");
}

TEST(Config, DurationsAndSizes) {
  auto with = [](const std::string& fragment) {
    return minimal(R"({"listen": "127.0.0.1:1", "tls": false})", ", " + fragment);
  };
  auto r = parse_config(
      with(R"("checkpoint_interval": "10ms", "retention": {"max_bytes": 4096, "max_age": "90m"})"), "/");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->checkpoint_interval_ms, 10);
  EXPECT_EQ(r->retention.max_bytes, 4096u);
  EXPECT_EQ(r->retention.max_age_ms, 90 * 60 * 1000);
  auto kib = parse_config(
      with(R"("retention": {"max_bytes": "512KiB"}, "limits": {"ingest_queue_bytes": "8GiB"})"), "/");
  ASSERT_TRUE(kib.ok()) << kib.error().message;
  EXPECT_EQ(kib->retention.max_bytes, 512u * 1024);
  EXPECT_EQ(kib->ingest_queue_bytes, size_t{8} << 30);

  EXPECT_EQ(error_of(with(R"("checkpoint_interval": "5ms")")),
            R"(checkpoint_interval: must be 10ms to 1h, got "5ms")");
  EXPECT_EQ(error_of(with(R"("checkpoint_interval": "2h")")),
            R"(checkpoint_interval: must be 10ms to 1h, got "2h")");
  // A JSON integer is milliseconds, as in a query network's box options
  // (base/units.h: one grammar everywhere).
  auto bare = parse_config(with(R"("checkpoint_interval": 1000)"), "/");
  ASSERT_TRUE(bare.ok()) << bare.error().message;
  EXPECT_EQ(bare->checkpoint_interval_ms, 1000);
  auto min = parse_config(with(R"("checkpoint_interval": "2min", "retention": {"max_age": "7d"})"), "/");
  ASSERT_TRUE(min.ok()) << min.error().message;
  EXPECT_EQ(min->checkpoint_interval_ms, 120'000);
  EXPECT_EQ(min->retention.max_age_ms, 7 * 86'400'000LL);
  EXPECT_EQ(error_of(with(R"("checkpoint_interval": 5)")), "checkpoint_interval: must be 10ms to 1h, got 5");
  EXPECT_EQ(error_of(with(R"("checkpoint_interval": -1000)")),
            R"(checkpoint_interval: expected a duration such as "250ms", "10s", "5m", "24h", got -1000)");
  EXPECT_EQ(error_of(with(R"("checkpoint_interval": "1000")")),
            R"(checkpoint_interval: expected a duration such as "250ms", "10s", "5m", "24h", got "1000")");
  EXPECT_EQ(error_of(with(R"("checkpoint_interval": "1 s")")),
            R"(checkpoint_interval: expected a duration such as "250ms", "10s", "5m", "24h", got "1 s")");
  EXPECT_EQ(error_of(with(R"("checkpoint_interval": "-1s")")),
            R"(checkpoint_interval: expected a duration such as "250ms", "10s", "5m", "24h", got "-1s")");
  EXPECT_EQ(error_of(with(R"("checkpoint_interval": "99999999999999999999999h")")),
            R"(checkpoint_interval: must be 10ms to 1h, got "99999999999999999999999h")");
  EXPECT_EQ(
      error_of(with(R"("retention": {"max_bytes": "1GB"})")),
      R"(retention.max_bytes: "1GB" is ambiguous; write binary units (KiB, MiB, GiB, TiB) or a number of bytes)");
  EXPECT_EQ(error_of(with(R"("retention": {"max_bytes": 0})")),
            "retention.max_bytes: must be 1 byte to 1024TiB, got 0");
  EXPECT_EQ(
      error_of(with(R"("retention": {"max_bytes": -5})")),
      R"(retention.max_bytes: expected a size: a number of bytes or a string such as "512KiB", "64MiB", "1GiB", got -5)");
  EXPECT_EQ(
      error_of(with(R"("retention": {"max_bytes": 1.5})")),
      R"(retention.max_bytes: expected a size: a number of bytes or a string such as "512KiB", "64MiB", "1GiB", got 1.5)");
  EXPECT_EQ(error_of(with(R"("retention": {"max_bytes": "99999999999GiB"})")),
            R"(retention.max_bytes: must be at most 1024TiB, got "99999999999GiB")");
  EXPECT_EQ(error_of(with(R"("retention": {"max_tuples": -1})")),
            "retention.max_tuples: expected an integer 0..1125899906842624, got -1");
  EXPECT_EQ(error_of(with(R"("retention": {"max_age": "0s"})")),
            R"(retention.max_age: must be 10ms to 3650d, got "0s")");
  EXPECT_EQ(error_of(with(R"("api": 1)")), "api: given twice");
  EXPECT_EQ(
      error_of(minimal(R"({"listen": "127.0.0.1:1", "tls": false, "limits": {"max_header_bytes": "512B"}})")),
      R"(api.limits.max_header_bytes: must be 1KiB to 1MiB, got "512B")");
  EXPECT_EQ(
      error_of(minimal(R"({"listen": "127.0.0.1:1", "tls": false, "limits": {"ws_ping_interval": "1ms"}})")),
      R"(api.limits.ws_ping_interval: must be 10ms to 1h, got "1ms")");
  EXPECT_EQ(error_of(minimal(R"({"listen": "127.0.0.1:1", "tls": false, "limits": {"max_connections": 0}})")),
            "api.limits.max_connections: must be 1..1000000, got 0");
}

// retention_check_interval: how often stream logs are trimmed; 100ms .. 1h,
// in the duration format of checkpoint_interval.
TEST(Config, RetentionCheckInterval) {
  auto with = [](const std::string& fragment) {
    return minimal(R"({"listen": "127.0.0.1:1", "tls": false})", ", " + fragment);
  };
  auto low = parse_config(with(R"("retention_check_interval": "100ms")"), "/");
  ASSERT_TRUE(low.ok()) << low.error().message;
  EXPECT_EQ(low->retention_check_interval_ms, 100);
  auto high = parse_config(with(R"("retention_check_interval": "1h")"), "/");
  ASSERT_TRUE(high.ok()) << high.error().message;
  EXPECT_EQ(high->retention_check_interval_ms, 3600 * 1000);
  auto minutes = parse_config(with(R"("retention_check_interval": "2m")"), "/");
  ASSERT_TRUE(minutes.ok()) << minutes.error().message;
  EXPECT_EQ(minutes->retention_check_interval_ms, 120 * 1000);

  EXPECT_EQ(error_of(with(R"("retention_check_interval": "99ms")")),
            R"(retention_check_interval: must be 100ms to 1h, got "99ms")");
  EXPECT_EQ(error_of(with(R"("retention_check_interval": "61m")")),
            R"(retention_check_interval: must be 100ms to 1h, got "61m")");
  EXPECT_EQ(error_of(with(R"("retention_check_interval": "0s")")),
            R"(retention_check_interval: must be 100ms to 1h, got "0s")");
  EXPECT_EQ(error_of(with(R"("retention_check_interval": 5)")),
            "retention_check_interval: must be 100ms to 1h, got 5");
  EXPECT_EQ(
      error_of(with(R"("retention_check_interval": "5 s")")),
      R"(retention_check_interval: expected a duration such as "250ms", "10s", "5m", "24h", got "5 s")");
  EXPECT_EQ(error_of(with(R"("retention_check_interval": null)")),
            R"(retention_check_interval: expected a duration such as "250ms", "10s", "5m", "24h", got null)");
  EXPECT_EQ(error_of(with(R"("retention_check_interval": "1s", "retention_check_interval": "2s")")),
            "retention_check_interval: given twice");
  // Close misspellings get a suggestion, like every other key.
  EXPECT_EQ(error_of(with(R"("retention_check_intervall": "1s")")),
            "retention_check_intervall: unknown key (did you mean retention_check_interval?)");
  // The per-stream retention bounds and the check interval are separate keys.
  EXPECT_EQ(error_of(with(R"("retention": {"check_interval": "1s"})")),
            "retention.check_interval: unknown key; known keys: max_tuples, max_bytes, max_age");
}

// ingest_durability: "fsync" (the default) or "process".
TEST(Config, IngestDurability) {
  auto with = [](const std::string& fragment) {
    return minimal(R"({"listen": "127.0.0.1:1", "tls": false})", ", " + fragment);
  };
  auto fsync = parse_config(with(R"("ingest_durability": "fsync")"), "/");
  ASSERT_TRUE(fsync.ok()) << fsync.error().message;
  EXPECT_EQ(fsync->ingest_durability, IngestDurability::fsync);
  auto process = parse_config(with(R"("ingest_durability": "process")"), "/");
  ASSERT_TRUE(process.ok()) << process.error().message;
  EXPECT_EQ(process->ingest_durability, IngestDurability::process);

  const std::string expected =
      R"(ingest_durability: expected "fsync" (survives power loss) or "process" (survives a crash of the )"
      R"(broker process only), got )";
  EXPECT_EQ(error_of(with(R"("ingest_durability": "none")")), expected + R"("none")");
  // Values are case-sensitive, like every other enumerated value.
  EXPECT_EQ(error_of(with(R"("ingest_durability": "FSYNC")")), expected + R"("FSYNC")");
  EXPECT_EQ(error_of(with(R"("ingest_durability": "fsnyc")")), expected + R"("fsnyc" (did you mean fsync?))");
  EXPECT_EQ(error_of(with(R"("ingest_durability": "proces")")), expected + R"("proces" (did you mean process?))");
  EXPECT_EQ(error_of(with(R"("ingest_durability": true)")), expected + "true");
  EXPECT_EQ(error_of(with(R"("ingest_durability": null)")), expected + "null");
  EXPECT_EQ(error_of(with(R"("ingest_durability": "")")), expected + R"("")");
  EXPECT_EQ(error_of(with(R"("ingest_durability": "fsync", "ingest_durability": "process")")),
            "ingest_durability: given twice");
  EXPECT_EQ(error_of(with(R"("ingest_durabilty": "process")")),
            "ingest_durabilty: unknown key (did you mean ingest_durability?)");
  // A hostile value is cut and escaped in the message.
  EXPECT_EQ(error_of(with(R"("ingest_durability": "a\n)" + std::string(100, 'x') + "\"")),
            expected + "\"a\\x0a" + std::string(62, 'x') + "...\"");
  EXPECT_EQ(ingest_durability_name(IngestDurability::fsync), "fsync");
  EXPECT_EQ(ingest_durability_name(IngestDurability::process), "process");
}

TEST(Config, ThreadsAndNodeLimits) {
  auto with = [](const std::string& fragment) {
    return minimal(R"({"listen": "127.0.0.1:1", "tls": false})", ", " + fragment);
  };
  EXPECT_EQ(error_of(with(R"("threads": {"network": 0})")), "threads.network: must be 1..64, got 0");
  EXPECT_EQ(error_of(with(R"("threads": {"engine": 65})")), "threads.engine: must be 1..64, got 65");
  EXPECT_EQ(error_of(with(R"("threads": {"engine": "2"})")),
            R"(threads.engine: expected an integer 1..64, got "2")");
  EXPECT_EQ(error_of(with(R"("threads": {"io": 2})")),
            "threads.io: unknown key; known keys: network, engine");
  EXPECT_EQ(error_of(with(R"("limits": {"max_streams": 0})")),
            "limits.max_streams: must be 1..100000, got 0");
  EXPECT_EQ(error_of(with(R"("limits": {"max_querys": 3})")),
            "limits.max_querys: unknown key (did you mean max_queries?)");
  EXPECT_EQ(error_of(with(R"("limits": {"query_max_lag_tuples": 0})")),
            "limits.query_max_lag_tuples: must be 1..1099511627776, got 0");
}

TEST(Config, MalformedDocuments) {
  auto r = parse_config("{\"domain\": \"acme\",\n  \"node\": }", "/");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::parse_error);
  EXPECT_EQ(r.error().message, "JSON syntax error at line 2, column 11: Invalid value.");
  EXPECT_EQ(
      error_of(R"({"domain": "acme"} {})"),
      "JSON syntax error at line 1, column 20: The document root must not be followed by other values.");
  EXPECT_EQ(error_of("[1, 2]"), "config: expected a JSON object, got an array");
  EXPECT_EQ(error_of(""), "JSON syntax error at line 1, column 1: The document is empty.");
  // Invalid UTF-8 is refused, not passed on to file names and logs.
  EXPECT_EQ(error_of("{\"domain\": \"\xff\"}").substr(0, 28), "JSON syntax error at line 1,");
  // Deep nesting does not exhaust the stack (the parser is iterative).
  EXPECT_EQ(error_of("{\"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}"),
            "x: unknown key; known keys: domain, node, api, data_dir, tokens, retention, "
            "checkpoint_interval, retention_check_interval, ingest_durability, threads, limits, federation, cluster, "
            "log_level, log_format");
  const auto big = parse_config(std::string((4u << 20) + 1, ' '), "/");
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, Errc::limit_exceeded);
  // A NUL inside a path would silently cut the file name.
  EXPECT_EQ(error_of(R"({"domain": "acme", "node": "n1", "api": {"listen": "127.0.0.1:1", "tls": false},
                         "data_dir": "/d\u0000x"})"),
            "data_dir: must not contain a NUL character");
}

TEST(Config, ErrorsAreInvalidArgument) {
  auto r = parse_config(minimal(R"({"listen": "nope", "tls": false})"), "/");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::invalid_argument);
}

// The documented example files parse, so docs/configuration.md does not rot.
// The federation section: listener, certificate, pinned CAs, exports.
std::string federation(const std::string& members) {
  return minimal(R"({"listen": "127.0.0.1:8443", "tls": false})",
                 R"(, "federation": {"listen": "0.0.0.0:7443", "cert_file": "certs/n1/node.crt",
                     "key_file": "certs/n1/node.key", "ca_file": "certs/ca/ca.crt")" +
                     members + "}");
}

TEST(Config, FederationSection) {
  auto cfg = parse_config(federation(R"(, "heartbeat_interval": "100ms", "failure_timeout": "2s",
      "max_frame": "256KiB", "import_window": "4MiB",
      "peers": [{"domain": "beta", "ca_file": "/pins/beta.crt",
                 "nodes": [{"node": "n1", "address": "beta-n1.example:7443"}, {"node": "n2"}]},
                {"domain": "acme", "nodes": [{"node": "n2", "address": "[::1]:7444"}]}],
      "exports": [{"stream": "bids", "to": ["beta"], "fields": ["auction", "price"]}])"),
                          "/etc/entente");
  ASSERT_TRUE(cfg.ok()) << cfg.error().message;
  const FederationConfig& f = cfg->federation;
  EXPECT_TRUE(f.enabled);
  EXPECT_EQ(f.listen_host, "0.0.0.0");
  EXPECT_EQ(f.listen_port, 7443);
  EXPECT_EQ(f.cert_file, "/etc/entente/certs/n1/node.crt");
  EXPECT_EQ(f.heartbeat_interval_ms, 100);
  EXPECT_EQ(f.failure_timeout_ms, 2000);
  EXPECT_EQ(f.max_frame, 256u << 10);
  EXPECT_EQ(f.import_window, 4u << 20);
  ASSERT_EQ(f.peers.size(), 2u);
  EXPECT_EQ(f.peers[0].ca_file, "/pins/beta.crt");
  EXPECT_EQ(f.peers[0].nodes[0].host, "beta-n1.example");
  EXPECT_EQ(f.peers[0].nodes[0].port, 7443);
  EXPECT_EQ(f.peers[0].nodes[1].port, 0) << "a node without an address is accepted, never dialed";
  EXPECT_EQ(f.peers[1].ca_file, "/etc/entente/certs/ca/ca.crt") << "the own domain defaults to ca_file";
  EXPECT_EQ(f.peers[1].nodes[0].host, "::1");
  ASSERT_EQ(f.exports.size(), 1u);
  EXPECT_EQ(f.exports[0].fields, (std::vector<std::string>{"auction", "price"}));

  auto none = parse_config(minimal(), "/etc/entente");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->federation.enabled);
}

TEST(Config, FederationErrorsNameTheKey) {
  EXPECT_EQ(error_of(minimal(R"({"listen": "127.0.0.1:8443", "tls": false})", R"(, "federation": {"listen": "127.0.0.1:7443"})")),
            "federation.cert_file: required");
  EXPECT_EQ(error_of(federation(R"(, "peers": [{"domain": "beta"}])")),
            "federation.peers[0].ca_file: required: the pinned CA certificate of domain beta");
  EXPECT_EQ(error_of(federation(R"(, "peers": [{"domain": "beta", "ca_file": "b.crt"}, {"domain": "beta", "ca_file": "c.crt"}])")),
            R"(federation.peers[1].domain: "beta" is listed twice)");
  EXPECT_EQ(error_of(federation(R"(, "peers": [{"domain": "beta", "ca_file": "b.crt", "nodes": [{"node": "n1", "address": "beta:0"}]}])")),
            "federation.peers[0].nodes[0].address: a peer's port cannot be 0");
  EXPECT_EQ(error_of(federation(R"(, "peers": [{"domain": "beta", "ca_file": "b.crt", "nodes": [{"node": "n1", "address": "be ta:1"}]}])")),
            R"(federation.peers[0].nodes[0].address: the host must be an IP address or a DNS name, got "be ta")");
  EXPECT_EQ(error_of(federation(R"(, "exports": [{"stream": "bids", "to": ["gamma"]}])")),
            R"(federation.exports[0].to[0]: "gamma" is not a domain in federation.peers)");
  EXPECT_EQ(error_of(federation(R"(, "exports": [{"stream": "Bids", "to": ["acme"]}])")),
            R"(federation.exports[0].stream: expected a stream name [a-z][a-z0-9_-]*, at most 63 characters, got "Bids")");
  EXPECT_EQ(error_of(federation(R"(, "heartbeat_interval": "1s", "failure_timeout": "500ms")")),
            "federation.failure_timeout: must be longer than heartbeat_interval (1s), got 500ms");
  EXPECT_EQ(error_of(federation(R"(, "max_frame": "8MiB", "import_window": "1MiB")")),
            "federation.import_window: must be at least max_frame (8MiB), got 1MiB");
  EXPECT_EQ(error_of(federation(R"(, "peer": [])")), "federation.peer: unknown key (did you mean peers?)");
}

// Issue 11, point 11: the listeners' per-address limits and handshake
// deadlines, with their defaults and bounds.
TEST(Config, ConnectionBudgets) {
  auto d = parse_config(federation(""), "/etc/entente");
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->limits.max_connections_per_address, 64u);
  EXPECT_EQ(d->limits.handshake_timeout_ms, 5000);
  EXPECT_EQ(d->federation.max_connections, 256u);
  EXPECT_EQ(d->federation.max_connections_per_address, 16u);
  EXPECT_EQ(d->federation.max_handshaking_connections, 64u);
  EXPECT_EQ(d->federation.handshake_timeout_ms, 5000);

  auto api = parse_config(minimal(R"({"listen": "127.0.0.1:1", "tls": false, "limits":
      {"max_connections_per_address": 4, "handshake_timeout": "750ms"}})"),
                          "/etc/entente");
  ASSERT_TRUE(api.ok()) << api.error().message;
  EXPECT_EQ(api->limits.max_connections_per_address, 4u);
  EXPECT_EQ(api->limits.handshake_timeout_ms, 750);
  EXPECT_EQ(error_of(minimal(R"({"listen": "127.0.0.1:1", "tls": false, "limits": {"max_connections_per_address": 0}})")),
            "api.limits.max_connections_per_address: must be 1..1000000, got 0");
  EXPECT_EQ(error_of(minimal(R"({"listen": "127.0.0.1:1", "tls": false, "limits": {"handshake_timeout": "1ms"}})")),
            R"(api.limits.handshake_timeout: must be 10ms to 1h, got "1ms")");

  auto fed = parse_config(federation(R"(, "max_connections": 32, "max_connections_per_address": 2,
      "max_handshaking_connections": 16, "handshake_timeout": "2s")"),
                          "/etc/entente");
  ASSERT_TRUE(fed.ok()) << fed.error().message;
  EXPECT_EQ(fed->federation.max_connections, 32u);
  EXPECT_EQ(fed->federation.max_connections_per_address, 2u);
  EXPECT_EQ(fed->federation.max_handshaking_connections, 16u);
  EXPECT_EQ(fed->federation.handshake_timeout_ms, 2000);
  // Without max_handshaking_connections, a small budget keeps three quarters for verified peers.
  auto small = parse_config(federation(R"(, "max_connections": 8)"), "/etc/entente");
  ASSERT_TRUE(small.ok()) << small.error().message;
  EXPECT_EQ(small->federation.max_handshaking_connections, 2u);
  EXPECT_EQ(small->federation.max_connections_per_address, 1u) << "half the unverified share";
  auto small_api = parse_config(
      minimal(R"({"listen": "127.0.0.1:1", "tls": false, "limits": {"max_connections": 32}})"), "/etc/entente");
  ASSERT_TRUE(small_api.ok()) << small_api.error().message;
  EXPECT_EQ(small_api->limits.max_connections_per_address, 8u) << "a quarter of max_connections";
  EXPECT_EQ(error_of(federation(R"(, "max_connections": 8, "max_handshaking_connections": 9)")),
            "federation.max_handshaking_connections: must be at most max_connections (8), got 9");
  EXPECT_EQ(error_of(federation(R"(, "max_connections_per_address": 0)")),
            "federation.max_connections_per_address: must be 1..100000, got 0");
}

TEST(Config, ExampleFilesParse) {
  const fs::path examples = fs::path(__FILE__).parent_path() / ".." / ".." / "docs" / "examples";
  auto loopback = load_config((examples / "node-loopback.json").string());
  ASSERT_TRUE(loopback.ok()) << loopback.error().message;
  EXPECT_FALSE(loopback->tls);
  EXPECT_EQ(loopback->listen_address, "127.0.0.1");
  EXPECT_TRUE(fs::path(loopback->data_dir).is_absolute());

  auto tls = load_config((examples / "node-tls.json").string());
  ASSERT_TRUE(tls.ok()) << tls.error().message;
  EXPECT_TRUE(tls->tls);
  EXPECT_TRUE(fs::path(tls->tls_cert_file).is_absolute());
  EXPECT_GE(tls->tokens.size(), 3u);
}

class LoadConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("entente_config_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_ / "conf");
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(LoadConfig, ResolvesAgainstTheFilesDirectory) {
  const fs::path file = dir_ / "conf" / "node.json";
  std::ofstream(file) << R"({"domain": "acme", "node": "n1", "api": {"listen": "127.0.0.1:0", "tls": false},
      "data_dir": "../data", "tokens": [{"name": "ops", "role": "admin", "sha256": ")"
                      << kHashA << R"("}]})";
  auto r = load_config(file.string());
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->data_dir, (dir_ / "data").lexically_normal().string());
}

TEST_F(LoadConfig, FileErrors) {
  const std::string missing = (dir_ / "missing.json").string();
  auto r = load_config(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::io_error);
  EXPECT_EQ(r.error().message, "cannot read " + missing + ": No such file or directory");

  auto d = load_config((dir_ / "conf").string());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().message, "cannot read " + (dir_ / "conf").string() + ": Is a directory");

  const fs::path bad = dir_ / "bad.json";
  std::ofstream(bad) << R"({"domain": "acme", "node": "n1", "api": {"listen": "localhost", "tls": false}})";
  auto b = load_config(bad.string());
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().message, R"(api.listen: expected "host:port", got "localhost")");
}

TEST(HashToken, KnownVectors) {
  EXPECT_EQ(hash_token("abc"), kHashA);
  EXPECT_EQ(hash_token("hello"), kHashB);
  EXPECT_EQ(hash_token(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(RoleName, EveryRole) {
  EXPECT_EQ(role_name(Role::admin), "admin");
  EXPECT_EQ(role_name(Role::publisher), "publisher");
  EXPECT_EQ(role_name(Role::reader), "reader");
}

// The cluster section (docs/cluster.md): etcd endpoints, key prefix, lease.
TEST(Config, ClusterSection) {
  auto none = parse_config(minimal(), "/etc/entente");
  ASSERT_TRUE(none.ok()) << none.error().message;
  EXPECT_FALSE(none->cluster.enabled);

  auto defaults = parse_config(minimal(R"({"listen": "127.0.0.1:8443", "tls": false})",
                                       R"(, "cluster": {"etcd": ["http://127.0.0.1:2379"]})"),
                               "/etc/entente");
  ASSERT_TRUE(defaults.ok()) << defaults.error().message;
  const ClusterConfig& d = defaults->cluster;
  EXPECT_TRUE(d.enabled);
  EXPECT_EQ(d.etcd_endpoints, std::vector<std::string>{"http://127.0.0.1:2379"});
  EXPECT_EQ(d.prefix, "/entente/" + defaults->domain + "/");
  EXPECT_EQ(d.lease_ttl_ms, 5000);
  EXPECT_EQ(d.etcd_timeout_ms, 2000);
  EXPECT_EQ(d.advertise_host, "127.0.0.1");
  EXPECT_EQ(d.advertise_peer_port, 0);

  auto full = parse_config(
      minimal(R"({"listen": "0.0.0.0:8443", "tls": {"cert": "api.crt", "key": "api.key"}})",
              R"(, "cluster": {"etcd": ["https://etcd-1.example:2379", "https://10.0.0.2:2379"],
                   "etcd_ca_file": "etcd-ca.crt", "prefix": "/acme/prod/", "lease_ttl": "3s",
                   "etcd_timeout": "500ms", "advertise_host": "n1.acme.example", "advertise_peer_port": 7443,
                   "api_ca_file": "acme-ca.crt"})"),
      "/etc/entente");
  ASSERT_TRUE(full.ok()) << full.error().message;
  const ClusterConfig& f = full->cluster;
  EXPECT_EQ(f.etcd_endpoints.size(), 2u);
  EXPECT_EQ(f.etcd_ca_file, "/etc/entente/etcd-ca.crt");
  EXPECT_EQ(f.prefix, "/acme/prod/");
  EXPECT_EQ(f.lease_ttl_ms, 3000);
  EXPECT_EQ(f.etcd_timeout_ms, 500);
  EXPECT_EQ(f.advertise_host, "n1.acme.example");
  EXPECT_EQ(f.advertise_peer_port, 7443);
  EXPECT_EQ(f.api_ca_file, "/etc/entente/acme-ca.crt");
}

TEST(Config, ClusterErrorsNameTheKey) {
  const std::string api = R"({"listen": "127.0.0.1:8443", "tls": false})";
  auto cluster = [&](const std::string& body) { return error_of(minimal(api, R"(, "cluster": )" + body)); };
  EXPECT_EQ(cluster("{}"), "cluster.etcd: required");
  EXPECT_EQ(cluster(R"({"etcd": []})"),
            R"(cluster.etcd: expected 1 to 16 endpoints such as ["http://127.0.0.1:2379"], got none)");
  EXPECT_EQ(cluster(R"({"etcd": ["127.0.0.1:2379"]})"),
            R"(cluster.etcd[0]: expected http://host:port or https://host:port, got "127.0.0.1:2379")");
  EXPECT_EQ(cluster(R"({"etcd": ["http://127.0.0.1"]})"),
            R"(cluster.etcd[0]: expected "host:port", got "127.0.0.1")");
  EXPECT_EQ(cluster(R"({"etcd": ["http://a:1", "http://a:1"]})"), R"(cluster.etcd[1]: "http://a:1" is listed twice)");
  EXPECT_EQ(cluster(R"({"etcd": ["https://a:1"]})"),
            "cluster.etcd_ca_file: required with an https:// endpoint (the CA that verifies etcd's certificate)");
  EXPECT_EQ(cluster(R"({"etcd": ["http://a:1"], "prefix": "acme"})"),
            R"(cluster.prefix: expected a key prefix of 2 to 200 printable characters that starts and ends with '/', such as "/entente/acme/", got "acme")");
  EXPECT_EQ(cluster(R"({"etcd": ["http://a:1"], "lease_ttl": "1500ms"})"),
            "cluster.lease_ttl: etcd leases count whole seconds; got 1500 ms");
  EXPECT_EQ(cluster(R"({"etcd": ["http://a:1"], "lease_ttl": "2s", "etcd_timeout": "2s"})"),
            "cluster.etcd_timeout: must be shorter than lease_ttl (2000 ms), or a slow etcd would cost the node its lease");
  EXPECT_EQ(cluster(R"({"etcd": ["http://a:1"], "advertise_host": "not a host"})"),
            R"(cluster.advertise_host: expected an IP address or a DNS name, got "not a host")");
  EXPECT_EQ(cluster(R"({"etcd": ["http://a:1"], "advertise_peer_port": 0})"),
            "cluster.advertise_peer_port: expected a port, 1 to 65535");
  EXPECT_EQ(cluster(R"({"etcd": ["http://a:1"], "advertise_peer_port": "7443"})"),
            "cluster.advertise_peer_port: expected a port, 1 to 65535");
  EXPECT_EQ(cluster(R"({"etcd": ["http://a:1"], "leasettl": "2s"})"),
            "cluster.leasettl: unknown key (did you mean lease_ttl?)");
  EXPECT_EQ(error_of(minimal(R"({"listen": "0.0.0.0:8443", "tls": {"cert": "a", "key": "b"}})",
                             R"(, "cluster": {"etcd": ["http://a:1"]})")),
            "cluster.advertise_host: required when api.listen is a wildcard address (0.0.0.0): the address the "
            "other nodes reach this one at");
  EXPECT_EQ(error_of(minimal(R"({"listen": "127.0.0.1:8443", "tls": {"cert": "a", "key": "b"}})",
                             R"(, "cluster": {"etcd": ["http://a:1"]})")),
            "cluster.api_ca_file: required when the API uses TLS and there is no federation.ca_file: the CA that "
            "verifies the other nodes' API certificates when requests are forwarded to them");
}

}  // namespace
}  // namespace entente::broker
