#pragma once
// A node's configuration (`entente broker --config node.json`), documented in
// docs/configuration.md. parse_config validates everything before anything
// starts; the first problem found is returned with the JSON key that holds it
// ("api.listen: ..."), so start-up can stop with one clear message.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "broker/federation_config.h"
#include "cluster/config.h"
#include "base/log.h"
#include "base/result.h"

namespace entente::broker {

using cluster::ClusterConfig;

enum class Role : uint8_t { reader = 0, publisher = 1, admin = 2 };
std::string_view role_name(Role r) noexcept;

struct TokenEntry {
  std::string name;    // who holds it, for logs and metrics ("ci-publisher")
  Role role = Role::reader;
  std::string sha256;  // lowercase hex SHA-256 of the token's bytes (64 chars)
};

struct ApiLimits {
  size_t max_body_bytes = 16u << 20;
  size_t max_header_bytes = 16u << 10;
  int64_t read_timeout_ms = 10'000;   // a request's headers + body must arrive within this
  int64_t idle_timeout_ms = 60'000;   // keep-alive connection with no request
  size_t max_connections = 1024;
  size_t max_connections_per_address = 64;  // one client address (IPv6: its /64)
  int64_t handshake_timeout_ms = 5'000;     // accept to TLS handshake + first request header
  size_t ws_max_message_bytes = 16u << 20;
  size_t ws_send_buffer_bytes = 8u << 20;  // per subscriber; overflow closes it
  int64_t ws_ping_interval_ms = 15'000;
};

// How an ingest acknowledgement is made durable (docs/configuration.md,
// key ingest_durability).
//   fsync:   every group commit's WAL write is fsynced before the ack; an
//            acknowledged tuple survives a power loss or kernel crash.
//   process: the group commit writes the WAL (into the OS page cache) before
//            the ack, without fsync; an acknowledged tuple survives a crash
//            or SIGKILL of the broker, not a power loss or kernel crash.
// Catalog changes and query checkpoints are fsynced in either mode.
enum class IngestDurability : uint8_t { fsync = 0, process = 1 };
std::string_view ingest_durability_name(IngestDurability d) noexcept;

struct RetentionConfig {
  uint64_t max_tuples = 0;  // 0: unlimited
  uint64_t max_bytes = 1ull << 30;
  int64_t max_age_ms = 24 * 3600 * 1000LL;
};

struct NodeConfig {
  std::string domain;  // [a-z][a-z0-9-]*, at most 63 chars
  std::string node;    // same rule
  // API listener.
  std::string listen_address = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: an ephemeral port (printed at start-up)
  bool tls = true;           // false is allowed only on a loopback address
  std::string tls_cert_file; // PEM; required when tls
  std::string tls_key_file;  // PEM; required when tls
  std::string data_dir;      // RocksDB lives in data_dir/store
  std::vector<TokenEntry> tokens;  // at least one admin
  ApiLimits limits;
  RetentionConfig retention;
  int64_t checkpoint_interval_ms = 1000;
  // The log on stderr (docs/operations.md, "Logs"); --log-format overrides
  // log_format. Read at start-up.
  base::LogLevel log_level = base::LogLevel::info;
  base::LogFormat log_format = base::LogFormat::text;
  IngestDurability ingest_durability = IngestDurability::fsync;
  // How often stream logs are trimmed to their retention. Trimming reads a
  // log's record headers (and, with a byte bound, sums its sizes), so it
  // runs periodically rather than on every append.
  int64_t retention_check_interval_ms = 5000;
  int network_threads = 1;   // Asio io_context threads
  int engine_threads = 1;    // worker threads for query boxes
  size_t ingest_queue_bytes = 64u << 20;  // queued for the group commit; over it: 503
  size_t query_max_lag_tuples = 1u << 20; // a query this far behind: ingest answers 429
  size_t max_streams = 1024;
  size_t max_queries = 256;
  FederationConfig federation;  // docs/federation.md
  cluster::ClusterConfig cluster;  // docs/cluster.md; disabled: a one-node domain
};

// Parses and validates. `base_dir` resolves relative file paths (the config
// file's directory). Errors: invalid_argument / parse_error naming the key.
Result<NodeConfig> parse_config(std::string_view json, std::string_view base_dir);
Result<NodeConfig> load_config(const std::string& path);

// Lowercase hex SHA-256 of `token`, as stored in the configuration.
std::string hash_token(std::string_view token);

}  // namespace entente::broker
