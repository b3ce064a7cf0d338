#pragma once
// Test PKI generated at run time with OpenSSL's C API (the `openssl` CLI may
// be absent): a CA, a server certificate it signs for localhost / 127.0.0.1 /
// ::1, and an unrelated second CA for "wrong CA" tests. PEM files in a fresh
// temporary directory, removed by the destructor.

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>

namespace entente::http::testing {

class TestPki {
 public:
  TestPki() {
    std::random_device rd;
    dir_ = std::filesystem::temp_directory_path() /
           ("entente-http-pki-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(dir_);
    Key ca_key = make_key();
    Cert ca = make_cert(ca_key.get(), nullptr, ca_key.get(), "Entente Test CA", true);
    Key server_key = make_key();
    Cert server = make_cert(server_key.get(), ca.get(), ca_key.get(), "localhost", false);
    Key other_key = make_key();
    Cert other = make_cert(other_key.get(), nullptr, other_key.get(), "Other CA", true);
    ca_file = write_cert("ca.pem", ca.get());
    cert_file = write_cert("server.pem", server.get());
    key_file = write_key("server.key", server_key.get());
    other_ca_file = write_cert("other-ca.pem", other.get());
  }
  ~TestPki() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TestPki(const TestPki&) = delete;
  TestPki& operator=(const TestPki&) = delete;

  // Writes `text` to a file in the directory: for malformed-PEM tests.
  std::string write_text(const std::string& name, const std::string& text) const {
    const auto path = (dir_ / name).string();
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) throw std::runtime_error("cannot write " + path);
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
    return path;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  std::string other_ca_file;

 private:
  struct KeyFree {
    void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
  };
  struct CertFree {
    void operator()(X509* c) const { X509_free(c); }
  };
  using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
  using Cert = std::unique_ptr<X509, CertFree>;

  static void check(bool ok, const char* what) {
    if (!ok) throw std::runtime_error(std::string("test PKI: ") + what + " failed");
  }

  static Key make_key() {
    Key key(EVP_EC_gen("P-256"));
    check(key != nullptr, "EVP_EC_gen");
    return key;
  }

  static void add_ext(X509* cert, X509* issuer, int nid, const char* value) {
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    check(ext != nullptr, "X509V3_EXT_conf_nid");
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
  }

  // A certificate for `key`, signed by `issuer_key` (self-signed when `issuer` is null).
  static Cert make_cert(EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key, const char* cn,
                        bool is_ca) {
    static long serial = 1;
    Cert cert(X509_new());
    check(cert != nullptr, "X509_new");
    X509_set_version(cert.get(), 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial++);
    X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert.get()), 7L * 24 * 3600);
    X509_set_pubkey(cert.get(), key);
    X509_NAME* name = X509_get_subject_name(cert.get());
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn),
                               -1, -1, 0);
    X509* signer = issuer != nullptr ? issuer : cert.get();
    X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
    if (is_ca) {
      add_ext(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE");
      add_ext(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
    } else {
      add_ext(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
      add_ext(cert.get(), signer, NID_key_usage, "critical,digitalSignature");
      add_ext(cert.get(), signer, NID_ext_key_usage, "serverAuth");
      add_ext(cert.get(), signer, NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1,IP:::1");
    }
    check(X509_sign(cert.get(), issuer_key, EVP_sha256()) > 0, "X509_sign");
    return cert;
  }

  std::string write_cert(const std::string& name, X509* cert) const {
    const auto p = path(name);
    std::FILE* f = std::fopen(p.c_str(), "wb");
    check(f != nullptr, "fopen");
    const bool ok = PEM_write_X509(f, cert) == 1;
    std::fclose(f);
    check(ok, "PEM_write_X509");
    return p;
  }

  std::string write_key(const std::string& name, EVP_PKEY* key) const {
    const auto p = path(name);
    std::FILE* f = std::fopen(p.c_str(), "wb");
    check(f != nullptr, "fopen");
    const bool ok = PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
    std::fclose(f);
    check(ok, "PEM_write_PrivateKey");
    return p;
  }

  std::filesystem::path dir_;
};

}  // namespace entente::http::testing
