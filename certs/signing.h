#pragma once
// Signing with a node's key, and verifying a signature against the pinned CA
// of the signing domain (docs/architecture.md, "Identity and trust" and
// "Contracts"). Contracts use it: a domain accepts a contract by signing the
// canonical JSON of its terms, and the other domain checks that signature
// with nothing but its TrustStore.
//
// Algorithms follow the node's key: "ecdsa-p256-sha256" (ECDSA over P-256,
// SHA-256 digest, DER signature) or "ed25519" (Ed25519 over the message
// itself). Signature values travel as standard, padded base64.

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include <openssl/types.h>

#include "certs/certs.h"
#include "certs/trust.h"
#include "base/result.h"

namespace entente::certs {

inline constexpr std::string_view kAlgEcdsaP256 = "ecdsa-p256-sha256";
inline constexpr std::string_view kAlgEd25519 = "ed25519";

// Bounds on what verify_signature reads, so that a peer cannot make it parse
// or hash unbounded input.
inline constexpr size_t kMaxSignatureCertBytes = 16 * 1024;
inline constexpr size_t kMaxSignatureValueBytes = 1024;  // base64 text
inline constexpr size_t kMaxSignedMessageBytes = 1 << 20;

struct Signature {
  std::string domain;       // signing domain, e.g. "beta"
  std::string node;         // signing node, e.g. "n1"
  std::string algorithm;    // kAlgEcdsaP256 | kAlgEd25519
  std::string certificate;  // signer's leaf certificate, PEM
  std::string value;        // signature bytes, base64 (standard alphabet, padded)

  friend bool operator==(const Signature&, const Signature&) = default;
};

// A node's signing key and certificate. Immutable after load(); copies share
// the key; sign() may be called from any thread concurrently.
class Signer {
 public:
  // Loads a node's key (PEM) and certificate (PEM; the first certificate is
  // the leaf) as written by `entente certs issue-node`. invalid_argument
  // naming the file when unreadable, when the key does not match the
  // certificate, or when the certificate carries no (or several) entente://
  // identities, or the key is neither EC P-256 nor Ed25519.
  static Result<Signer> load(const std::filesystem::path& key_file,
                             const std::filesystem::path& cert_file);

  const Identity& identity() const { return identity_; }
  const std::string& algorithm() const { return algorithm_; }
  const std::string& certificate_pem() const { return certificate_pem_; }

  // Signs `message` (at most kMaxSignedMessageBytes). io_error when OpenSSL
  // fails, limit_exceeded for a longer message.
  Result<Signature> sign(std::string_view message) const;

 private:
  Signer() = default;
  std::shared_ptr<EVP_PKEY> key_;
  Identity identity_;
  std::string algorithm_;
  std::string certificate_pem_;  // the leaf only
};

// Checks that `sig.certificate` is a node certificate of `sig.domain`
// trusted by `trust` at `now` (TrustStore::verify with expected domain
// sig.domain, and its identity's node equals sig.node), and that `sig.value`
// is a valid signature of `message` under that certificate's key with the
// named algorithm. Errors (Errc::permission_denied) say which check failed:
// "signature of beta/n1 does not verify", "certificate of beta/n1 is not
// trusted: <verdict reason>", "unknown signature algorithm 'x'",
// "signature of beta/n1: bad base64". Over-long fields: limit_exceeded.
Status verify_signature(const TrustStore& trust, const Signature& sig, std::string_view message,
                        Clock::time_point now = Clock::now());

// Standard base64 with padding. decode refuses anything else (white space,
// the URL-safe alphabet, missing padding, non-zero trailing bits).
std::string base64_encode(std::string_view bytes);
Result<std::string> base64_decode(std::string_view text);

}  // namespace entente::certs
