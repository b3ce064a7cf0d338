// net/tls.h: the one TLS context set-up. The API's profile (TLS 1.2 with
// AEAD suites and 1.3, no client certificate) and the peer links' (mutual
// TLS 1.3 only, a verify callback, no resumption) come out of it as each
// listener had them; a bad file is named with its key and the caller's label.
#include "net/tls.h"

#include <openssl/ssl.h>

#include <boost/asio/ssl/context.hpp>
#include <gtest/gtest.h>
#include <string>

#include "tests/http/http_test_certs.h"

namespace entente::inet {
namespace {

namespace ssl = boost::asio::ssl;

int refuse_all(X509_STORE_CTX*, void*) { return 0; }

// The suites before TLS 1.3 a context offers, by name.
std::vector<std::string> tls12_suites(ssl::context& ctx) {
  std::vector<std::string> out;
  STACK_OF(SSL_CIPHER)* ciphers = SSL_CTX_get_ciphers(ctx.native_handle());
  for (int i = 0; i < sk_SSL_CIPHER_num(ciphers); ++i) {
    const SSL_CIPHER* c = sk_SSL_CIPHER_value(ciphers, i);
    const std::string name = SSL_CIPHER_get_name(c);
    if (name.rfind("TLS_", 0) != 0) out.push_back(name);  // TLS 1.3 suites are named TLS_*
  }
  return out;
}

TEST(TlsContext, ApiProfileIsTls12AeadAnd13WithoutClientCertificates) {
  http::testing::TestPki pki;
  ssl::context ctx(ssl::context::tls_server);
  TlsContextOptions o;
  o.cert_file = pki.cert_file;
  o.key_file = pki.key_file;
  const Status s = configure_tls_context(ctx, o);
  ASSERT_TRUE(s.ok()) << s.error().message;
  SSL_CTX* native = ctx.native_handle();
  EXPECT_EQ(SSL_CTX_get_min_proto_version(native), TLS1_2_VERSION);
  EXPECT_EQ(SSL_CTX_get_max_proto_version(native), 0);  // up to the newest, 1.3
  EXPECT_EQ(SSL_CTX_get_verify_mode(native), SSL_VERIFY_NONE);
  const auto suites = tls12_suites(ctx);
  ASSERT_EQ(suites.size(), 6u);
  for (const auto& name : suites) {
    EXPECT_EQ(name.rfind("ECDHE-", 0), 0u) << name;
    EXPECT_TRUE(name.find("GCM") != std::string::npos || name.find("CHACHA20-POLY1305") != std::string::npos)
        << name;
  }
  EXPECT_NE(SSL_CTX_get_session_cache_mode(native), SSL_SESS_CACHE_OFF);
}

TEST(TlsContext, PeerLinkProfileIsMutualTls13WithoutResumption) {
  http::testing::TestPki pki;
  ssl::context ctx(ssl::context::tls);
  TlsContextOptions o;
  o.versions = TlsVersions::tls13_only;
  o.cert_file = pki.cert_file;
  o.key_file = pki.key_file;
  o.peer = PeerCheck::require;
  o.verify_callback = refuse_all;
  o.session_resumption = false;
  o.label = "federation ";
  const Status s = configure_tls_context(ctx, o);
  ASSERT_TRUE(s.ok()) << s.error().message;
  SSL_CTX* native = ctx.native_handle();
  EXPECT_EQ(SSL_CTX_get_min_proto_version(native), TLS1_3_VERSION);
  EXPECT_EQ(SSL_CTX_get_max_proto_version(native), TLS1_3_VERSION);
  EXPECT_EQ(SSL_CTX_get_verify_mode(native), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT);
  EXPECT_EQ(SSL_CTX_get_session_cache_mode(native), SSL_SESS_CACHE_OFF);
  EXPECT_NE(SSL_CTX_get_options(native) & SSL_OP_NO_TICKET, 0u);
}

TEST(TlsContext, ClientVerifiesAgainstItsCaFileOrNotAtAll) {
  http::testing::TestPki pki;
  ssl::context verifying(ssl::context::tls_client);
  TlsContextOptions o;
  o.presents_certificate = false;
  o.peer = PeerCheck::verify;
  o.ca_file = pki.ca_file;
  ASSERT_TRUE(configure_tls_context(verifying, o).ok());
  EXPECT_EQ(SSL_CTX_get_verify_mode(verifying.native_handle()), SSL_VERIFY_PEER);

  o.ca_file = pki.path("missing-ca.pem");
  ssl::context missing(ssl::context::tls_client);
  const Status s = configure_tls_context(missing, o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message, "ca_file " + o.ca_file + ": No such file or directory");

  ssl::context trusting(ssl::context::tls_client);
  o.peer = PeerCheck::none;
  ASSERT_TRUE(configure_tls_context(trusting, o).ok());
  EXPECT_EQ(SSL_CTX_get_verify_mode(trusting.native_handle()), SSL_VERIFY_NONE);
}

TEST(TlsContext, BadFilesAreNamedWithTheLabel) {
  http::testing::TestPki pki;
  TlsContextOptions o;
  o.versions = TlsVersions::tls13_only;
  o.label = "federation ";
  o.cert_file = pki.path("missing.pem");
  o.key_file = pki.key_file;
  {
    ssl::context ctx(ssl::context::tls);
    const Status s = configure_tls_context(ctx, o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code, Errc::invalid_argument);
    EXPECT_EQ(s.error().message, "federation cert_file " + o.cert_file + ": No such file or directory");
  }
  o.cert_file = pki.write_text("garbage.pem", "not PEM\n");
  {
    ssl::context ctx(ssl::context::tls);
    const Status s = configure_tls_context(ctx, o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().message.rfind("federation cert_file " + o.cert_file + ": ", 0), 0u) << s.error().message;
  }
  o.cert_file = pki.ca_file;  // a certificate the key does not belong to
  {
    ssl::context ctx(ssl::context::tls);
    const Status s = configure_tls_context(ctx, o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().message.rfind("federation key_file " + o.key_file + ": ", 0), 0u) << s.error().message;
    EXPECT_NE(s.error().message.find(pki.ca_file), std::string::npos) << s.error().message;
  }
  o.cert_file.clear();
  {
    ssl::context ctx(ssl::context::tls);
    const Status s = configure_tls_context(ctx, o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().message, "federation cert_file is empty");
  }
}

// What a reload loads is checked, and named, as at start-up.
TEST(TlsContext, CredentialsForAReloadAreCheckedLikeAContext) {
  http::testing::TestPki pki;
  auto loaded = load_tls_credentials(pki.cert_file, pki.key_file, "federation ");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  ASSERT_NE(loaded->cert, nullptr);
  ASSERT_NE(loaded->key, nullptr);
  EXPECT_EQ(X509_check_private_key(loaded->cert, loaded->key), 1);
  // It can be put into a context (a reload) like the files themselves.
  ssl::context ctx(ssl::context::tls);
  EXPECT_EQ(SSL_CTX_use_cert_and_key(ctx.native_handle(), loaded->cert, loaded->key, loaded->chain, 1), 1);

  auto mismatched = load_tls_credentials(pki.ca_file, pki.key_file, "federation ");
  ASSERT_FALSE(mismatched.ok());
  EXPECT_EQ(mismatched.error().message.rfind("federation key_file " + pki.key_file + ": ", 0), 0u)
      << mismatched.error().message;
  auto missing = load_tls_credentials(pki.path("none.pem"), pki.key_file, "");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message, "cert_file " + pki.path("none.pem") + ": No such file or directory");
}

}  // namespace
}  // namespace entente::inet
