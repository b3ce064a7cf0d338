#include "http/detail/tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace entente::http::detail {
namespace {

// Opens the file to report the OS error (missing, no permission) before
// OpenSSL reports a less specific one.
Status check_readable(std::string_view key, const std::string& path) {
  if (path.empty()) {
    return make_error(Errc::invalid_argument, std::string(key) + " is empty");
  }
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return make_error(Errc::invalid_argument,
                      std::string(key) + " " + path + ": " + std::strerror(errno));
  }
  std::fclose(f);
  return {};
}

// TLS 1.2 is kept for clients that lack 1.3, but only with forward-secret
// ECDHE key exchange and AEAD ciphers: OpenSSL's default list would also
// offer CBC suites (ECDHE-ECDSA-AES128-SHA, ...-SHA256, ...-SHA384), whose
// MAC-then-encrypt construction is the source of the padding-oracle attacks
// (Lucky Thirteen and its successors). TLS 1.3 suites are all AEAD; its
// defaults are kept. docs/api.md lists what is offered.
constexpr const char* kTls12Ciphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:"
    "ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384:"
    "ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";

Status restrict_protocols(ssl::context& ctx) {
  SSL_CTX_set_min_proto_version(ctx.native_handle(), TLS1_2_VERSION);
  ctx.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                  ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                  ssl::context::single_dh_use);
  ERR_clear_error();
  if (SSL_CTX_set_cipher_list(ctx.native_handle(), kTls12Ciphers) != 1) {
    return make_error(Errc::invalid_argument,
                      "TLS 1.2 cipher list: " + openssl_reason("no cipher could be selected"));
  }
  return {};
}

bool is_ip_literal(const std::string& name) {
  error_code ec;
  net::ip::make_address(name, ec);
  return !ec;
}

}  // namespace

std::string openssl_reason(std::string_view fallback) {
  unsigned long last = 0;
  while (unsigned long e = ERR_get_error()) last = e;
  if (last == 0) return std::string(fallback);
  const char* reason = ERR_reason_error_string(last);
  if (reason != nullptr) return reason;
  char buf[256];
  ERR_error_string_n(last, buf, sizeof buf);
  return buf;
}

Status configure_server_context(ssl::context& ctx, const std::string& cert_file,
                                const std::string& key_file) {
  ENTENTE_RETURN_IF_ERROR(restrict_protocols(ctx));
  ENTENTE_RETURN_IF_ERROR(check_readable("cert_file", cert_file));
  ENTENTE_RETURN_IF_ERROR(check_readable("key_file", key_file));
  SSL_CTX* native = ctx.native_handle();
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(native, cert_file.c_str()) != 1) {
    return make_error(Errc::invalid_argument,
                      "cert_file " + cert_file + ": " + openssl_reason("not a PEM certificate"));
  }
  if (SSL_CTX_use_PrivateKey_file(native, key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    std::string reason = openssl_reason("not a PEM private key");
    if (reason.find("mismatch") != std::string::npos) {
      reason += " (the key does not match the certificate in cert_file " + cert_file + ")";
    }
    return make_error(Errc::invalid_argument, "key_file " + key_file + ": " + reason);
  }
  if (SSL_CTX_check_private_key(native) != 1) {
    return make_error(Errc::invalid_argument,
                      "key_file " + key_file + ": " +
                          openssl_reason("does not match the certificate") + " (cert_file " +
                          cert_file + ")");
  }
  return {};
}

Status configure_client_context(ssl::context& ctx, const std::string& ca_file, bool verify_peer) {
  ENTENTE_RETURN_IF_ERROR(restrict_protocols(ctx));
  if (!verify_peer) {
    ctx.set_verify_mode(ssl::verify_none);
    return {};
  }
  ctx.set_verify_mode(ssl::verify_peer);
  if (ca_file.empty()) {
    // No CA named: trust the system's store.
    error_code ec;
    ctx.set_default_verify_paths(ec);
    if (ec) {
      return make_error(Errc::invalid_argument, "cannot load the system CA store: " + ec.message());
    }
    return {};
  }
  ENTENTE_RETURN_IF_ERROR(check_readable("ca_file", ca_file));
  ERR_clear_error();
  if (SSL_CTX_load_verify_locations(ctx.native_handle(), ca_file.c_str(), nullptr) != 1) {
    return make_error(Errc::invalid_argument,
                      "ca_file " + ca_file + ": " + openssl_reason("not a PEM certificate"));
  }
  return {};
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

// A checked pair, as SSL_use_cert_and_key wants it. The scratch context
// that loaded it owns the objects.
struct ServerCertificate::Pair {
  std::unique_ptr<ssl::context> holder;
  X509* cert = nullptr;
  EVP_PKEY* key = nullptr;
  STACK_OF(X509) * chain = nullptr;
};

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
  // The same checks and messages as at start-up: a scratch context.
  auto pair = std::make_shared<Pair>();
  pair->holder = std::make_unique<ssl::context>(ssl::context::tls_server);
  ENTENTE_RETURN_IF_ERROR(configure_server_context(*pair->holder, cert_file, key_file));
  SSL_CTX* native = pair->holder->native_handle();
  pair->cert = SSL_CTX_get0_certificate(native);
  pair->key = SSL_CTX_get0_privatekey(native);
  SSL_CTX_get0_chain_certs(native, &pair->chain);
  if (pair->cert == nullptr || pair->key == nullptr) {
    return make_error(Errc::invalid_argument, "cert_file " + cert_file + ": no certificate loaded");
  }
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
