#pragma once
#if !defined(ENTENTE_IN_HTTP)
#error "http/detail/ is private to http/ (docs/architecture.md)"
#endif
// The API's TLS profile, for the server and the clients: contexts restricted
// to TLS 1.3 and TLS 1.2 with ECDHE + AEAD suites only (no CBC), made by the
// tree's one TLS context set-up (net/tls.h); the server's replaceable
// certificate; and client-side peer verification by host name or IP address.

#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "base/result.h"
#include "http/detail/net.h"
#include "net/tls.h"

namespace entente::http::detail {

// A server context with `cert_file` (PEM chain) and `key_file` (PEM key).
// invalid_argument naming the file and the reason when either is unreadable,
// malformed, or the key does not match the certificate.
Status configure_server_context(ssl::context& ctx, const std::string& cert_file,
                                const std::string& key_file);

// The certificate and key a server presents, replaceable while it serves
// (a configuration reload). attach() makes the context ask for them at
// each handshake; until the first load() the context's own are used.
// Connections already established keep theirs. Thread-safe; outlives the
// contexts it is attached to.
class ServerCertificate final {
 public:
  ServerCertificate();
  ~ServerCertificate();
  ServerCertificate(const ServerCertificate&) = delete;
  ServerCertificate& operator=(const ServerCertificate&) = delete;

  void attach(ssl::context& ctx);
  // Loads and checks the pair; the next handshakes present it. True when
  // its certificate differs from the one presented so far.
  // invalid_argument as configure_server_context; then nothing changed.
  Result<bool> load(const std::string& cert_file, const std::string& key_file);

 private:
  using Pair = inet::TlsCredentials;
  static int on_handshake(SSL* ssl, void* self);
  std::mutex mu_;
  std::shared_ptr<const Pair> current_;  // REQUIRES: mu_
  std::string current_der_;              // REQUIRES: mu_; the certificate presented
};

// A client context that verifies the peer against `ca_file` (when
// `verify_peer`). invalid_argument when the CA file cannot be used.
Status configure_client_context(ssl::context& ctx, const std::string& ca_file, bool verify_peer);

// Sets SNI (DNS names only, as RFC 6066 requires) and the name or IP address
// the peer's certificate must match, on one client connection.
Status configure_client_connection(SSL* ssl, const std::string& name, bool verify_peer);

// A readable reason for a failed client handshake: the asio error plus, when
// verification failed, OpenSSL's verification result ("self-signed
// certificate", "hostname mismatch").
std::string handshake_failure(SSL* ssl, const error_code& ec);

}  // namespace entente::http::detail
