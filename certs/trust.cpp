#include "certs/trust.h"

#include <openssl/x509_vfy.h>

#include <map>
#include <string>

#include "certs/detail/ossl.h"

namespace entente::certs {

namespace {

constexpr size_t kMaxCaFileBytes = 1 << 20;
// Leaf + pinned CA; the pinned CAs have pathlen:0, the bound keeps a
// hostile chain from making the verifier walk far.
constexpr int kMaxVerifyDepth = 4;

Verdict refuse(std::string label, std::string reason) {
  Verdict v;
  v.refusal = std::move(label);
  v.reason = std::move(reason);
  return v;
}

}  // namespace

// Pinned CA certificates by domain. Written only by pin() (start-up, one
// thread); afterwards verify() reads the map and shares the X509 objects,
// whose reference counts and extension caches OpenSSL keeps thread-safe.
struct TrustStore::Impl {
  std::map<std::string, detail::X509Ptr, std::less<>> cas;
};

TrustStore::TrustStore() : impl_(std::make_unique<Impl>()) {}
TrustStore::~TrustStore() = default;
TrustStore::TrustStore(TrustStore&&) noexcept = default;
TrustStore& TrustStore::operator=(TrustStore&&) noexcept = default;

Status TrustStore::pin(std::string_view domain, const std::filesystem::path& ca_file) {
  auto pem = detail::read_file(ca_file, kMaxCaFileBytes);
  if (!pem.ok()) {
    return make_error(Errc::invalid_argument,
                      "cannot pin the CA of domain " + std::string(domain) + ": " + pem.error().message);
  }
  Status s = pin_pem(domain, *pem);
  if (!s.ok()) return make_error(s.error().code, ca_file.string() + ": " + s.error().message);
  return s;
}

Status TrustStore::pin_pem(std::string_view domain, std::string_view ca_pem) {
  detail::ErrorScope errors;
  if (!impl_) impl_ = std::make_unique<Impl>();
  if (!valid_name(domain)) {
    return make_error(Errc::invalid_argument, "domain name '" + std::string(domain) +
                                                  "' is not [a-z][a-z0-9-]* of at most 63 characters");
  }
  if (impl_->cas.find(domain) != impl_->cas.end()) {
    return make_error(Errc::invalid_argument, "domain " + std::string(domain) + " has a pinned CA already");
  }
  auto certs = detail::parse_certificates(ca_pem, "the CA of domain " + std::string(domain), 2);
  if (!certs.ok()) {
    if (certs.error().code == Errc::limit_exceeded) {
      return make_error(Errc::invalid_argument, "the CA of domain " + std::string(domain) +
                                                    " must be exactly one certificate, found several");
    }
    return make_error(Errc::invalid_argument, certs.error().message);
  }
  if (certs->size() != 1) {
    return make_error(Errc::invalid_argument, "the CA of domain " + std::string(domain) +
                                                  " must be exactly one certificate, found " +
                                                  std::to_string(certs->size()));
  }
  detail::X509Ptr ca = std::move(certs->front());
  const std::string subject = detail::name_line(X509_get_subject_name(ca.get()));
  if (!detail::is_ca_certificate(ca.get()) || X509_check_ca(ca.get()) != 1) {
    return make_error(Errc::invalid_argument, "the certificate pinned for domain " + std::string(domain) +
                                                  " (" + subject + ") is not a CA certificate");
  }
  if (X509_self_signed(ca.get(), 1) != 1) {
    return make_error(Errc::invalid_argument, "the certificate pinned for domain " + std::string(domain) +
                                                  " (" + subject + ") is not self-signed");
  }
  impl_->cas.emplace(std::string(domain), std::move(ca));
  return Status::Ok();
}

bool TrustStore::pinned(std::string_view domain) const {
  return impl_ && impl_->cas.find(domain) != impl_->cas.end();
}

Verdict TrustStore::verify(X509* leaf, STACK_OF(X509) * untrusted,
                           std::optional<std::string_view> expected_domain, Clock::time_point now) const {
  // Called from TLS verify callbacks: nothing this function queues may
  // remain on the thread's error queue.
  detail::ErrorScope errors;
  if (leaf == nullptr) return refuse("no_identity", "no certificate was presented");
  const std::string subject = detail::name_line(X509_get_subject_name(leaf));
  // Checked first: presenting the domain CA itself (which has no identity)
  // is the likelier mistake, and "is a CA" says more than "no identity".
  if (detail::is_ca_certificate(leaf)) {
    return refuse("is_ca", "certificate " + subject + " is a CA certificate, not a node certificate");
  }
  const detail::SubjectAltNames sans = detail::scan_sans(leaf);
  if (sans.entente_uris.empty()) {
    return refuse("no_identity", "certificate " + subject + " carries no entente:// identity");
  }
  if (sans.entente_uris.size() > 1) {
    return refuse("no_identity", "certificate " + subject + " carries " +
                                     std::to_string(sans.entente_uris.size()) +
                                     " entente:// identities; a node has exactly one");
  }
  auto parsed = parse_identity(sans.entente_uris.front());
  if (!parsed.ok()) {
    return refuse("no_identity", "certificate " + subject + ": " + parsed.error().message);
  }
  const Identity& id = *parsed;
  const std::string who = "certificate of " + id.uri();
  if (expected_domain && *expected_domain != id.domain) {
    return refuse("wrong_domain",
                  who + " names domain " + id.domain + ", expected domain " + std::string(*expected_domain));
  }
  if (!pinned(id.domain)) {
    return refuse("not_pinned", who + ": domain " + id.domain + " has no pinned CA");
  }
  X509* ca = impl_->cas.find(id.domain)->second.get();

  // A store holding only this domain's CA: the chain can end nowhere else.
  detail::StorePtr store(X509_STORE_new());
  detail::StoreCtxPtr ctx(X509_STORE_CTX_new());
  if (!store || !ctx || X509_STORE_add_cert(store.get(), ca) != 1 ||
      X509_STORE_CTX_init(ctx.get(), store.get(), leaf, untrusted) != 1) {
    return refuse("untrusted_chain", detail::openssl_error(who + ": cannot set up the verification"));
  }
  X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx.get());
  X509_VERIFY_PARAM_set_time(param, Clock::to_time_t(now));
  X509_VERIFY_PARAM_set_depth(param, kMaxVerifyDepth);
  // No purpose is set: a node is the TLS client of one link and the server
  // of another, and the identity and CA checks above replace the purpose.
  if (X509_verify_cert(ctx.get()) == 1) {
    Verdict ok;
    ok.identity = id;
    return ok;
  }
  const int error = X509_STORE_CTX_get_error(ctx.get());
  const int depth = X509_STORE_CTX_get_error_depth(ctx.get());
  X509* failing = X509_STORE_CTX_get_current_cert(ctx.get());
  const std::string whose =
      depth <= 0 ? who : "the pinned CA of domain " + id.domain + " (checking " + who + ")";
  if (error == X509_V_ERR_CERT_HAS_EXPIRED) {
    const auto at = detail::to_time_point(X509_get0_notAfter(failing != nullptr ? failing : leaf));
    return refuse("expired", whose + " expired at " + (at ? detail::iso8601(*at) : "(unreadable time)"));
  }
  if (error == X509_V_ERR_CERT_NOT_YET_VALID) {
    const auto at = detail::to_time_point(X509_get0_notBefore(failing != nullptr ? failing : leaf));
    return refuse("not_yet_valid",
                  whose + " is not valid before " + (at ? detail::iso8601(*at) : "(unreadable time)"));
  }
  return refuse("untrusted_chain", who + " does not chain to the pinned CA of domain " + id.domain + ": " +
                                       X509_verify_cert_error_string(error));
}

}  // namespace entente::certs
