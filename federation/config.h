#pragma once
// The `federation` section of a node's configuration (docs/configuration.md,
// docs/federation.md): the peer-link listener, this node's certificate, the
// pinned CA of every peer domain, and what this node's streams export.

#include <cstdint>
#include <string>
#include <vector>

namespace entente::federation {

struct PeerNodeConfig {
  std::string node;
  std::string host;   // empty with port 0: accepted, never dialed
  uint16_t port = 0;
};

struct PeerDomainConfig {
  std::string domain;
  std::string ca_file;  // the pinned CA of that domain
  std::vector<PeerNodeConfig> nodes;
};

struct ExportConfig {
  std::string stream;               // a stream of this node
  std::vector<std::string> to;      // domains that may import it
  std::vector<std::string> fields;  // projection, in this order; empty: all
};

struct FederationConfig {
  bool enabled = false;  // the section is present
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;
  std::string cert_file;
  std::string key_file;
  std::string ca_file;  // this domain's CA: pins the node's own domain
  int64_t heartbeat_interval_ms = 250;
  int64_t failure_timeout_ms = 1000;
  uint32_t max_frame = 1u << 20;
  uint32_t import_window = 8u << 20;  // byte credit an import grants
  // The listener's budget (docs/configuration.md): accepted connections in
  // all, from one address, and whose peer certificate is not verified yet
  // (the rest of max_connections is kept for verified peers); and how long
  // TLS + HELLO may take.
  size_t max_connections = 256;
  size_t max_connections_per_address = 16;
  size_t max_handshaking_connections = 64;
  int64_t handshake_timeout_ms = 5000;
  std::vector<PeerDomainConfig> peers;
  std::vector<ExportConfig> exports;
};

}  // namespace entente::federation
