#pragma once
// The one TLS context set-up of the tree: the API listener and its clients
// (http/) and the peer links (federation/) make their contexts here, each
// with its own profile (docs/api.md, docs/protocol.md). What differs between
// them is a parameter; how a profile is applied, and the messages that name
// a bad file, are the same for both. Declared without Asio's headers.

#include <openssl/types.h>
#include <openssl/x509.h>

#include <cstdint>
#include <memory>
#include <string>

#include "base/result.h"

namespace boost::asio::ssl {
class context;
}

namespace entente::inet {

enum class TlsVersions : uint8_t {
  // TLS 1.3, and TLS 1.2 for clients that lack it, restricted to the suites
  // of TlsContextOptions::tls12_ciphers (the API).
  tls12_and_13,
  // TLS 1.3 only (the peer links: both ends are Entente nodes).
  tls13_only,
};

enum class PeerCheck : uint8_t {
  // The peer's certificate is not asked for (a server) or not checked (a
  // client told not to verify).
  none,
  // A client checks the server's certificate against ca_file, or against the
  // system's store when ca_file is empty.
  verify,
  // Both ends present a certificate and check the other's; a handshake
  // without one fails. verify_callback decides what is trusted.
  require,
};

// TLS 1.2 with forward-secret ECDHE key exchange and AEAD ciphers only:
// OpenSSL's default list would also offer CBC suites, whose
// MAC-then-encrypt construction is the source of the padding-oracle attacks
// (Lucky Thirteen and its successors). TLS 1.3 suites are all AEAD; its
// defaults are kept. docs/api.md lists what is offered.
inline constexpr const char* kAeadTls12Ciphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

struct TlsContextOptions {
  TlsVersions versions = TlsVersions::tls12_and_13;
  // The TLS 1.2 suites (OpenSSL's cipher-list syntax); unused with tls13_only.
  std::string tls12_ciphers = kAeadTls12Ciphers;
  // Whether this end presents a certificate: cert_file (the PEM chain) and
  // key_file (its PEM key) are then required. An API client presents none.
  bool presents_certificate = true;
  std::string cert_file;
  std::string key_file;
  PeerCheck peer = PeerCheck::none;
  std::string ca_file;  // with PeerCheck::verify
  // With verify or require, when set: replaces OpenSSL's chain building
  // (SSL_CTX_set_cert_verify_callback); 1 accepts the peer, 0 refuses it.
  int (*verify_callback)(X509_STORE_CTX*, void*) = nullptr;
  // Off: no session cache and no tickets, so every connection runs the
  // whole handshake and its certificate check.
  bool session_resumption = true;
  // Put before the key name in messages: "federation " gives
  // "federation cert_file /etc/n1.crt: no start line".
  std::string label;
};

// Applies `o` to a fresh context: versions and suites, then the
// certificate and key (checked to match), then the peer check.
// invalid_argument naming the file and OpenSSL's (or the system's) reason
// when a file is missing, unreadable or malformed, or the key does not
// match the certificate.
Status configure_tls_context(boost::asio::ssl::context& ctx, const TlsContextOptions& o);

// A certificate chain and its key, loaded and checked exactly as
// configure_tls_context does (same checks, same messages), held until a
// reload puts them into a context (SSL_CTX_use_cert_and_key) or into each
// new connection (SSL_use_cert_and_key). The scratch context that loaded
// them owns the objects; copies share it.
struct TlsCredentials {
  std::shared_ptr<boost::asio::ssl::context> holder;
  X509* cert = nullptr;
  EVP_PKEY* key = nullptr;
  STACK_OF(X509)* chain = nullptr;  // the intermediates; may be null
};

// `label` as in TlsContextOptions. invalid_argument as configure_tls_context.
Result<TlsCredentials> load_tls_credentials(const std::string& cert_file, const std::string& key_file,
                                           const std::string& label);

}  // namespace entente::inet
