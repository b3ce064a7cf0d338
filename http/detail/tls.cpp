#include "http/detail/tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "base/openssl_error.h"
#include "net/tls.h"

namespace entente::http::detail {
namespace {

using base::openssl_reason;

bool is_ip_literal(const std::string& name) {
  error_code ec;
  net::ip::make_address(name, ec);
  return !ec;
}

}  // namespace

Status configure_server_context(ssl::context& ctx, const std::string& cert_file,
                                const std::string& key_file) {
  inet::TlsContextOptions o;  // TLS 1.2 (AEAD suites) and 1.3; the client's certificate is not asked for
  o.cert_file = cert_file;
  o.key_file = key_file;
  return inet::configure_tls_context(ctx, o);
}

Status configure_client_context(ssl::context& ctx, const std::string& ca_file, bool verify_peer) {
  inet::TlsContextOptions o;
  o.presents_certificate = false;
  o.peer = verify_peer ? inet::PeerCheck::verify : inet::PeerCheck::none;
  o.ca_file = ca_file;
  return inet::configure_tls_context(ctx, o);
}

Status configure_client_connection(SSL* ssl, const std::string& name, bool verify_peer) {
  const bool ip = is_ip_literal(name);
  if (!ip && !name.empty() && SSL_set_tlsext_host_name(ssl, name.c_str()) != 1) {
    return make_error(Errc::invalid_argument,
                      "server name '" + name + "': " + openssl_reason("rejected for SNI"));
  }
  if (!verify_peer) return {};
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  const int rc = ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name.c_str())
                    : X509_VERIFY_PARAM_set1_host(param, name.c_str(), name.size());
  if (rc != 1) {
    return make_error(Errc::invalid_argument,
                      "server name '" + name + "': " + openssl_reason("not a valid host name"));
  }
  return {};
}

std::string handshake_failure(SSL* ssl, const error_code& ec) {
  std::string out = ec.message();
  const long verify = SSL_get_verify_result(ssl);
  if (verify != X509_V_OK) {
    out += " (";
    out += X509_verify_cert_error_string(verify);
    out += ")";
  }
  return out;
}

}  // namespace entente::http::detail

namespace entente::http::detail {

ServerCertificate::ServerCertificate() = default;
ServerCertificate::~ServerCertificate() = default;

namespace {
std::string der_of(X509* cert) {
  unsigned char* der = nullptr;
  const int n = cert == nullptr ? -1 : i2d_X509(cert, &der);
  if (n <= 0) return {};
  std::string out(reinterpret_cast<const char*>(der), static_cast<size_t>(n));
  OPENSSL_free(der);
  return out;
}
}  // namespace

void ServerCertificate::attach(ssl::context& ctx) {
  SSL_CTX_set_cert_cb(ctx.native_handle(), &ServerCertificate::on_handshake, this);
  std::lock_guard lock(mu_);
  current_der_ = der_of(SSL_CTX_get0_certificate(ctx.native_handle()));
}

Result<bool> ServerCertificate::load(const std::string& cert_file, const std::string& key_file) {
  // The same checks and messages as at start-up (net/tls.h).
  ENTENTE_ASSIGN_OR_RETURN(inet::TlsCredentials loaded, inet::load_tls_credentials(cert_file, key_file, ""));
  auto pair = std::make_shared<const Pair>(std::move(loaded));
  std::string der = der_of(pair->cert);
  std::lock_guard lock(mu_);
  const bool changed = der != current_der_;
  current_ = std::move(pair);
  current_der_ = std::move(der);
  return changed;
}

int ServerCertificate::on_handshake(SSL* ssl, void* self) {
  auto* me = static_cast<ServerCertificate*>(self);
  std::shared_ptr<const Pair> pair;
  {
    std::lock_guard lock(me->mu_);
    pair = me->current_;
  }
  if (!pair) return 1;  // the context's own
  // Copied into the connection (reference counts), so the pair may be
  // replaced while this connection lives.
  return SSL_use_cert_and_key(ssl, pair->cert, pair->key, pair->chain, 1) == 1 ? 1 : 0;
}

}  // namespace entente::http::detail
