#pragma once
// Domain CAs and node certificates (docs/architecture.md, "Identity and trust").
//
// Each domain has its own CA. A node certificate carries the node's identity
// as a URI SAN `entente://DOMAIN/NODE`, plus the DNS names and IP addresses
// of its listeners. Keys are ECDSA P-256 (default) or Ed25519; private keys
// are written with mode 0600 and never overwritten unless asked.
//
// Files:
//   CA directory:   ca.crt (PEM, 0644), ca.key (PEM, 0600)
//   node directory: node.crt (PEM: the node certificate, then the CA
//                   certificate), node.key (PEM, 0600), ca.crt (a copy of
//                   the domain CA, for the node's own domain pin)
//
// Thread-safe: every function is independent; OpenSSL 3 EVP APIs only.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"

namespace entente::certs {

using Clock = std::chrono::system_clock;

// `[a-z][a-z0-9-]*`, at most 63 characters: domain and node names.
bool valid_name(std::string_view name);

// A node's identity: `entente://DOMAIN/NODE`.
struct Identity {
  std::string domain;
  std::string node;

  std::string uri() const { return "entente://" + domain + "/" + node; }
  friend bool operator==(const Identity&, const Identity&) = default;
};

// Parses `entente://DOMAIN/NODE`; invalid_argument saying what is wrong.
Result<Identity> parse_identity(std::string_view uri);

enum class KeyType { ec_p256, ed25519 };

struct CaOptions {
  KeyType key = KeyType::ec_p256;
  int days = 3650;     // 1..36500
  bool force = false;  // overwrite existing files
};

struct NodeOptions {
  KeyType key = KeyType::ec_p256;
  int days = 397;  // 1..3650
  // DNS names and IP addresses (v4 or v6) for the listeners; each goes in
  // the SAN as DNS or IP. At most 64.
  std::vector<std::string> sans;
  // Start of validity; now minus 5 minutes (clock skew) when unset. Tests
  // use it to make certificates that are expired or not yet valid.
  std::optional<Clock::time_point> not_before;
  bool force = false;
};

// Creates a domain CA in `out_dir` (created if missing). already_exists when
// ca.key or ca.crt exists and !force; invalid_argument for a bad name or
// option; io_error naming the path otherwise.
Status init_domain(std::string_view domain, const std::filesystem::path& out_dir,
                   const CaOptions& options = {});

// Issues a certificate for DOMAIN/NODE signed by the CA in `ca_dir` and
// writes node.crt, node.key and ca.crt in `out_dir`. invalid_argument when
// the CA in ca_dir belongs to another domain, or a SAN is neither a DNS name
// nor an IP address.
Status issue_node(std::string_view domain, std::string_view node,
                  const std::filesystem::path& ca_dir, const std::filesystem::path& out_dir,
                  const NodeOptions& options = {});

// What `entente certs show` prints, parsed from the first certificate in a
// PEM file.
struct CertInfo {
  std::string subject;  // one line, RFC 2253
  std::string issuer;
  std::optional<Identity> identity;  // from the entente:// URI SAN
  bool is_ca = false;
  std::vector<std::string> dns_names;
  std::vector<std::string> ip_addresses;
  Clock::time_point not_before;
  Clock::time_point not_after;
  std::string key_type;            // "EC P-256", "Ed25519", ...
  std::string sha256_fingerprint;  // "AB:CD:..." over the DER
};

Result<CertInfo> read_certificate(const std::filesystem::path& pem_file);

// Human-readable, one field per line.
std::string describe(const CertInfo& info, Clock::time_point now = Clock::now());

}  // namespace entente::certs
