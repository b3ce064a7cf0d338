#pragma once
// Which peers a node trusts (docs/architecture.md, "Identity and trust"):
// per domain, that domain's CA certificate, pinned in the node's
// configuration. There is no global trust store: a certificate is checked
// only against the CA of the domain its identity claims.
//
// TrustStore is filled once at start-up and then read concurrently from any
// thread (verify is const and touches no shared mutable state).

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <openssl/types.h>

// STACK_OF(X509) names this type; declared here, at global scope, so that
// the header does not need <openssl/x509.h>.
struct stack_st_X509;

#include "certs/certs.h"
#include "base/result.h"

namespace entente::certs {

// The outcome of checking one peer certificate.
struct Verdict {
  std::optional<Identity> identity;  // set exactly when the peer is trusted
  // When refused: a short stable label for metrics, one of
  //   "no_identity"     no (or more than one) entente:// URI SAN
  //   "is_ca"           a CA certificate presented as a node
  //   "wrong_domain"    the identity names another domain than expected
  //   "not_pinned"      the identity's domain has no pinned CA
  //   "untrusted_chain" does not chain to that domain's pinned CA
  //   "expired"         not_after is before now
  //   "not_yet_valid"   not_before is after now
  std::string refusal;
  // ... and a one-line reason for the log, e.g.
  //   "certificate of entente://acme/n1 does not chain to the pinned CA of
  //    domain acme: unable to get local issuer certificate"
  //   "certificate of entente://acme/n1 expired at 2026-11-01T00:00:00Z"
  std::string reason;

  bool ok() const { return identity.has_value(); }
};

class TrustStore {
 public:
  TrustStore();
  ~TrustStore();
  TrustStore(TrustStore&&) noexcept;
  TrustStore& operator=(TrustStore&&) noexcept;

  // Pins `domain`'s CA from a PEM file (one self-signed CA certificate).
  // invalid_argument naming the file when it is unreadable, not a CA
  // certificate, or the domain is pinned already.
  Status pin(std::string_view domain, const std::filesystem::path& ca_file);
  Status pin_pem(std::string_view domain, std::string_view ca_pem);

  bool pinned(std::string_view domain) const;

  // Verifies a peer's presented certificate `leaf` with `untrusted` (the
  // rest of the presented chain; may be null) at time `now`:
  //   - the leaf carries exactly one entente:// identity, and it is not a CA;
  //   - `expected_domain`, when given, is the identity's domain;
  //   - the identity's domain is pinned, and the leaf chains to that
  //     domain's pinned CA (and no other), valid at `now`.
  Verdict verify(X509* leaf, STACK_OF(X509) * untrusted,
                 std::optional<std::string_view> expected_domain,
                 Clock::time_point now = Clock::now()) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace entente::certs
