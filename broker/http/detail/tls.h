#pragma once
// TLS setup shared by the server and the clients: contexts restricted to
// TLS 1.3 and TLS 1.2 with ECDHE + AEAD suites only (no CBC), credentials loaded with errors that name the file and OpenSSL's
// reason, and client-side peer verification by host name or IP address.

#include <string>
#include <string_view>

#include "broker/http/detail/net.h"
#include "engine/result.h"

namespace entente::broker::http::detail {

// The reason of the most recent OpenSSL error on this thread ("no start
// line"), or `fallback` when the queue is empty. Clears the queue.
std::string openssl_reason(std::string_view fallback);

// A server context with `cert_file` (PEM chain) and `key_file` (PEM key).
// invalid_argument naming the file and the reason when either is unreadable,
// malformed, or the key does not match the certificate.
Status configure_server_context(ssl::context& ctx, const std::string& cert_file,
                                const std::string& key_file);

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

}  // namespace entente::broker::http::detail
