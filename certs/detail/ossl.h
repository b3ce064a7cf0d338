#pragma once
#if !defined(ENTENTE_IN_CERTS)
#error "certs/detail/ is private to certs/ (docs/architecture.md)"
#endif
// Private helpers of certs/: RAII owners for every OpenSSL object the module
// touches, the thread's OpenSSL error queue, ASN1_TIME conversion, SAN
// scanning, bounded file reads and atomic file writes. Not part of the public
// API; only certs/*.cpp include it.

#include <openssl/asn1.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "certs/certs.h"
#include "base/openssl_error.h"
#include "base/result.h"

namespace entente::certs::detail {

// unique_ptr deleter calling an OpenSSL free function.
template <auto Free>
struct Deleter {
  template <class T>
  void operator()(T* p) const noexcept {
    Free(p);
  }
};

using PkeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY_free>>;
using X509Ptr = std::unique_ptr<X509, Deleter<X509_free>>;
using BioPtr = std::unique_ptr<BIO, Deleter<BIO_free_all>>;
using BignumPtr = std::unique_ptr<BIGNUM, Deleter<BN_free>>;
using ExtensionPtr = std::unique_ptr<X509_EXTENSION, Deleter<X509_EXTENSION_free>>;
using GeneralNamesPtr = std::unique_ptr<GENERAL_NAMES, Deleter<GENERAL_NAMES_free>>;
using GeneralNamePtr = std::unique_ptr<GENERAL_NAME, Deleter<GENERAL_NAME_free>>;
using StorePtr = std::unique_ptr<X509_STORE, Deleter<X509_STORE_free>>;
using StoreCtxPtr = std::unique_ptr<X509_STORE_CTX, Deleter<X509_STORE_CTX_free>>;

// Scoped mark on the thread's OpenSSL error queue: whatever OpenSSL pushes
// while it lives is popped when it ends, and errors queued before it stay.
// Every public entry point of certs/ holds one, so that callers (a TLS verify
// callback in particular) never see errors this module caused.
class ErrorScope final {
 public:
  ErrorScope() { ERR_set_mark(); }
  ~ErrorScope() { ERR_pop_to_mark(); }
  ErrorScope(const ErrorScope&) = delete;
  ErrorScope& operator=(const ErrorScope&) = delete;
};

// "<what>: <reason of the latest OpenSSL error>" (or "<what>" alone when the
// queue holds nothing): the tree's one helper, base/openssl_error.h.
using base::openssl_error;

// Reads a whole file of at most `max_bytes`; io_error or limit_exceeded
// naming the path.
Result<std::string> read_file(const std::filesystem::path& path, size_t max_bytes);

// Writes `data` to `path` atomically: a temporary file in the same directory
// is created with `mode` (set before any byte is written), synced, then
// linked into place (refusing an existing file: already_exists) or, with
// `overwrite`, renamed over it. The directory is synced afterwards.
Status write_file_atomic(const std::filesystem::path& path, std::string_view data, unsigned mode,
                         bool overwrite);

// The first certificate of a PEM text; parse_error naming `source`.
Result<X509Ptr> parse_certificate(std::string_view pem, const std::string& source);

// Every certificate of a PEM text (at most `max`); parse_error naming
// `source` when there is none or a block does not parse.
Result<std::vector<X509Ptr>> parse_certificates(std::string_view pem, const std::string& source, size_t max);

std::string pem_of(X509* cert);

// ASN1_TIME (UTCTime or GeneralizedTime) to a time point; nullopt when the
// field is malformed.
std::optional<Clock::time_point> to_time_point(const ASN1_TIME* t);

// "2026-11-01T00:00:00Z".
std::string iso8601(Clock::time_point t);

// One line, RFC 2253 ("CN=n1,O=acme").
std::string name_line(const X509_NAME* name);

// The names of a certificate's subjectAltName extension.
struct SubjectAltNames {
  std::vector<std::string> entente_uris;  // URIs starting with entente://
  std::vector<std::string> dns_names;
  std::vector<std::string> ip_addresses;  // textual, v4 or v6
};
SubjectAltNames scan_sans(X509* cert);

// basicConstraints CA:TRUE.
bool is_ca_certificate(X509* cert);

// True when `value` is a DNS host name by RFC 1123 label rules (letters,
// digits and hyphens; labels of 1..63 characters not starting or ending in a
// hyphen; at most 253 characters; a last label that is not all digits).
bool valid_dns_name(std::string_view value);

// The raw 4 or 16 bytes of an IPv4/IPv6 address in text form, or nullopt.
std::optional<std::vector<unsigned char>> parse_ip(std::string_view value);

}  // namespace entente::certs::detail
