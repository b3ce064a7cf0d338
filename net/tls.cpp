#include "net/tls.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <boost/asio/ssl/context.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/openssl_error.h"

namespace entente::inet {
namespace {

namespace ssl = boost::asio::ssl;
using base::openssl_reason;

// Opens the file to report the OS error (missing, no permission) before
// OpenSSL reports a less specific one.
Status check_readable(const std::string& key, const std::string& path) {
  if (path.empty()) {
    return make_error(Errc::invalid_argument, key + " is empty");
  }
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return make_error(Errc::invalid_argument, key + " " + path + ": " + std::strerror(errno));
  }
  std::fclose(f);
  return {};
}

Status restrict_versions(ssl::context& ctx, const TlsContextOptions& o) {
  SSL_CTX* native = ctx.native_handle();
  if (o.versions == TlsVersions::tls13_only) {
    SSL_CTX_set_min_proto_version(native, TLS1_3_VERSION);
    SSL_CTX_set_max_proto_version(native, TLS1_3_VERSION);
    return {};
  }
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  ctx.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                  ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
  ERR_clear_error();
  if (SSL_CTX_set_cipher_list(native, o.tls12_ciphers.c_str()) != 1) {
    return make_error(Errc::invalid_argument,
                      o.label + "TLS 1.2 cipher list: " + openssl_reason("no cipher could be selected"));
  }
  return {};
}

Status use_certificate(ssl::context& ctx, const TlsContextOptions& o) {
  const std::string cert_key = o.label + "cert_file";
  const std::string key_key = o.label + "key_file";
  ENTENTE_RETURN_IF_ERROR(check_readable(cert_key, o.cert_file));
  ENTENTE_RETURN_IF_ERROR(check_readable(key_key, o.key_file));
  SSL_CTX* native = ctx.native_handle();
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(native, o.cert_file.c_str()) != 1) {
    return make_error(Errc::invalid_argument,
                      cert_key + " " + o.cert_file + ": " + openssl_reason("not a PEM certificate"));
  }
  if (SSL_CTX_use_PrivateKey_file(native, o.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    std::string reason = openssl_reason("not a PEM private key");
    if (reason.find("mismatch") != std::string::npos) {
      reason += " (the key does not match the certificate in cert_file " + o.cert_file + ")";
    }
    return make_error(Errc::invalid_argument, key_key + " " + o.key_file + ": " + reason);
  }
  if (SSL_CTX_check_private_key(native) != 1) {
    return make_error(Errc::invalid_argument, key_key + " " + o.key_file + ": " +
                                                  openssl_reason("does not match the certificate") +
                                                  " (cert_file " + o.cert_file + ")");
  }
  return {};
}

Status check_peer(ssl::context& ctx, const TlsContextOptions& o) {
  SSL_CTX* native = ctx.native_handle();
  switch (o.peer) {
    case PeerCheck::none:
      ctx.set_verify_mode(ssl::verify_none);
      return {};
    case PeerCheck::require:
      SSL_CTX_set_verify(native, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
      if (o.verify_callback != nullptr) SSL_CTX_set_cert_verify_callback(native, o.verify_callback, nullptr);
      return {};
    case PeerCheck::verify:
      break;
  }
  ctx.set_verify_mode(ssl::verify_peer);
  if (o.verify_callback != nullptr) SSL_CTX_set_cert_verify_callback(native, o.verify_callback, nullptr);
  if (o.ca_file.empty()) {
    // No CA named: trust the system's store.
    boost::system::error_code ec;
    ctx.set_default_verify_paths(ec);
    if (ec) {
      return make_error(Errc::invalid_argument, "cannot load the system CA store: " + ec.message());
    }
    return {};
  }
  ENTENTE_RETURN_IF_ERROR(check_readable(o.label + "ca_file", o.ca_file));
  ERR_clear_error();
  if (SSL_CTX_load_verify_locations(native, o.ca_file.c_str(), nullptr) != 1) {
    return make_error(Errc::invalid_argument,
                      o.label + "ca_file " + o.ca_file + ": " + openssl_reason("not a PEM certificate"));
  }
  return {};
}

}  // namespace

Status configure_tls_context(ssl::context& ctx, const TlsContextOptions& o) {
  ENTENTE_RETURN_IF_ERROR(restrict_versions(ctx, o));
  if (o.presents_certificate) ENTENTE_RETURN_IF_ERROR(use_certificate(ctx, o));
  ENTENTE_RETURN_IF_ERROR(check_peer(ctx, o));
  if (!o.session_resumption) {
    // Links live for hours; resumption buys nothing and would skip the
    // per-connection identity check on the resuming side.
    SSL_CTX_set_session_cache_mode(ctx.native_handle(), SSL_SESS_CACHE_OFF);
    SSL_CTX_set_options(ctx.native_handle(), SSL_OP_NO_TICKET);
  }
  return {};
}

Result<TlsCredentials> load_tls_credentials(const std::string& cert_file, const std::string& key_file,
                                           const std::string& label) {
  TlsCredentials c;
  c.holder = std::make_shared<ssl::context>(ssl::context::tls);
  TlsContextOptions o;
  o.cert_file = cert_file;
  o.key_file = key_file;
  o.label = label;
  ENTENTE_RETURN_IF_ERROR(configure_tls_context(*c.holder, o));
  SSL_CTX* native = c.holder->native_handle();
  c.cert = SSL_CTX_get0_certificate(native);
  c.key = SSL_CTX_get0_privatekey(native);
  SSL_CTX_get0_chain_certs(native, &c.chain);
  if (c.cert == nullptr || c.key == nullptr) {
    return make_error(Errc::invalid_argument, label + "cert_file " + cert_file + ": no certificate loaded");
  }
  return c;
}

}  // namespace entente::inet
