#include "certs/signing.h"

#include <openssl/pem.h>

#include "certs/detail/ossl.h"

namespace entente::certs {

namespace {

using detail::BioPtr;
using detail::ErrorScope;
using detail::openssl_error;
using detail::PkeyPtr;
using detail::X509Ptr;

using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, detail::Deleter<EVP_MD_CTX_free>>;

constexpr size_t kMaxKeyFileBytes = 64 * 1024;
constexpr size_t kMaxCertFileBytes = 1 << 20;

constexpr char kBase64Alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// An encrypted key would make OpenSSL prompt on the terminal; refuse instead.
int no_password(char*, int, int, void*) { return -1; }

// The algorithm name for a key, or empty when signing with it is unsupported.
std::string algorithm_of(EVP_PKEY* key) {
  if (EVP_PKEY_is_a(key, "ED25519")) return std::string(kAlgEd25519);
  if (EVP_PKEY_is_a(key, "EC")) {
    char group[64] = {};
    size_t len = 0;
    if (EVP_PKEY_get_utf8_string_param(key, "group", group, sizeof group, &len) == 1) {
      const std::string_view g(group, len);
      if (g == "prime256v1" || g == "P-256") return std::string(kAlgEcdsaP256);
    }
  }
  return {};
}

// Ed25519 signs the message itself; ECDSA signs its SHA-256 digest.
const EVP_MD* digest_for(std::string_view algorithm) {
  return algorithm == kAlgEd25519 ? nullptr : EVP_sha256();
}

std::string who(const Signature& sig) { return sig.domain + "/" + sig.node; }

Status denied(std::string message) { return make_error(Errc::permission_denied, std::move(message)); }

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  auto at = [&](size_t k) { return static_cast<unsigned>(static_cast<unsigned char>(bytes[k])); };
  for (; i + 3 <= bytes.size(); i += 3) {
    const unsigned n = (at(i) << 16) | (at(i + 1) << 8) | at(i + 2);
    out += kBase64Alphabet[(n >> 18) & 63];
    out += kBase64Alphabet[(n >> 12) & 63];
    out += kBase64Alphabet[(n >> 6) & 63];
    out += kBase64Alphabet[n & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest == 1) {
    const unsigned n = at(i) << 16;
    out += kBase64Alphabet[(n >> 18) & 63];
    out += kBase64Alphabet[(n >> 12) & 63];
    out += "==";
  } else if (rest == 2) {
    const unsigned n = (at(i) << 16) | (at(i + 1) << 8);
    out += kBase64Alphabet[(n >> 18) & 63];
    out += kBase64Alphabet[(n >> 12) & 63];
    out += kBase64Alphabet[(n >> 6) & 63];
    out += '=';
  }
  return out;
}

Result<std::string> base64_decode(std::string_view text) {
  auto bad = [](const std::string& why) { return make_error(Errc::invalid_argument, "bad base64: " + why); };
  if (text.empty()) return bad("empty");
  if (text.size() % 4 != 0) return bad("length is not a multiple of 4");
  size_t pad = 0;
  if (text.back() == '=') pad = text[text.size() - 2] == '=' ? 2 : 1;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int v[4];
    for (size_t k = 0; k < 4; ++k) {
      const bool padding = last && k >= 4 - pad;
      v[k] = padding ? 0 : base64_value(text[i + k]);
      if (v[k] < 0) return bad("character " + std::to_string(i + k) + " is not in the standard alphabet");
    }
    const unsigned n = (static_cast<unsigned>(v[0]) << 18) | (static_cast<unsigned>(v[1]) << 12) |
                       (static_cast<unsigned>(v[2]) << 6) | static_cast<unsigned>(v[3]);
    out += static_cast<char>((n >> 16) & 0xff);
    if (!(last && pad == 2)) out += static_cast<char>((n >> 8) & 0xff);
    if (!(last && pad >= 1)) out += static_cast<char>(n & 0xff);
    // Bits under the padding must be zero, so that each byte string has
    // exactly one encoding.
    if (last && pad == 2 && (n & 0xffff) != 0) return bad("non-zero bits under the padding");
    if (last && pad == 1 && (n & 0xff) != 0) return bad("non-zero bits under the padding");
  }
  return out;
}

Result<Signer> Signer::load(const std::filesystem::path& key_file, const std::filesystem::path& cert_file) {
  ErrorScope errors;
  auto invalid = [](const Error& e) { return make_error(Errc::invalid_argument, e.message); };

  auto key_pem = detail::read_file(key_file, kMaxKeyFileBytes);
  if (!key_pem.ok()) return invalid(key_pem.error());
  BioPtr bio(BIO_new_mem_buf(key_pem->data(), static_cast<int>(key_pem->size())));
  PkeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, no_password, nullptr) : nullptr);
  OPENSSL_cleanse(key_pem->data(), key_pem->size());
  if (!key) {
    return make_error(Errc::invalid_argument,
                      openssl_error(key_file.string() + " is not an unencrypted PEM private key"));
  }

  auto cert_pem = detail::read_file(cert_file, kMaxCertFileBytes);
  if (!cert_pem.ok()) return invalid(cert_pem.error());
  auto cert = detail::parse_certificate(*cert_pem, cert_file.string());
  if (!cert.ok()) return invalid(cert.error());
  X509* leaf = cert->get();
  if (X509_check_private_key(leaf, key.get()) != 1) {
    return make_error(Errc::invalid_argument,
                      key_file.string() + " is not the key of the certificate in " + cert_file.string());
  }
  const auto sans = detail::scan_sans(leaf);
  if (sans.entente_uris.size() != 1) {
    return make_error(Errc::invalid_argument, cert_file.string() + " carries " +
                                                  std::to_string(sans.entente_uris.size()) +
                                                  " entente:// identities; a node certificate carries one");
  }
  auto identity = parse_identity(sans.entente_uris.front());
  if (!identity.ok()) {
    return make_error(Errc::invalid_argument, cert_file.string() + ": " + identity.error().message);
  }
  std::string algorithm = algorithm_of(key.get());
  if (algorithm.empty()) {
    return make_error(Errc::invalid_argument,
                      key_file.string() + " is neither an EC P-256 nor an Ed25519 key");
  }
  std::string leaf_pem = detail::pem_of(leaf);
  if (leaf_pem.empty()) return make_error(Errc::io_error, openssl_error("cannot encode " + cert_file.string()));

  Signer s;
  s.key_ = std::shared_ptr<EVP_PKEY>(key.release(), EVP_PKEY_free);
  s.identity_ = std::move(*identity);
  s.algorithm_ = std::move(algorithm);
  s.certificate_pem_ = std::move(leaf_pem);
  return s;
}

Result<Signature> Signer::sign(std::string_view message) const {
  ErrorScope errors;
  if (message.size() > kMaxSignedMessageBytes) {
    return make_error(Errc::limit_exceeded, "a signed message is at most " +
                                                std::to_string(kMaxSignedMessageBytes) + " bytes");
  }
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, digest_for(algorithm_), nullptr, key_.get()) != 1) {
    return make_error(Errc::io_error, openssl_error("cannot start signing"));
  }
  const auto* data = reinterpret_cast<const unsigned char*>(message.data());
  size_t len = 0;
  if (EVP_DigestSign(ctx.get(), nullptr, &len, data, message.size()) != 1) {
    return make_error(Errc::io_error, openssl_error("cannot size the signature"));
  }
  std::string raw(len, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(raw.data()), &len, data, message.size()) != 1) {
    return make_error(Errc::io_error, openssl_error("cannot sign"));
  }
  raw.resize(len);  // DER ECDSA signatures vary in length
  Signature sig;
  sig.domain = identity_.domain;
  sig.node = identity_.node;
  sig.algorithm = algorithm_;
  sig.certificate = certificate_pem_;
  sig.value = base64_encode(raw);
  return sig;
}

Status verify_signature(const TrustStore& trust, const Signature& sig, std::string_view message,
                        Clock::time_point now) {
  ErrorScope errors;
  if (sig.certificate.size() > kMaxSignatureCertBytes) {
    return make_error(Errc::limit_exceeded, "certificate of a signature is larger than " +
                                                std::to_string(kMaxSignatureCertBytes) + " bytes");
  }
  if (sig.value.size() > kMaxSignatureValueBytes) {
    return make_error(Errc::limit_exceeded, "signature value is longer than " +
                                                std::to_string(kMaxSignatureValueBytes) + " characters");
  }
  if (message.size() > kMaxSignedMessageBytes) {
    return make_error(Errc::limit_exceeded, "a signed message is at most " +
                                                std::to_string(kMaxSignedMessageBytes) + " bytes");
  }
  // Names go into messages; keep those readable and bounded.
  if (!valid_name(sig.domain) || !valid_name(sig.node)) {
    return denied("signature names an invalid domain or node");
  }
  if (sig.algorithm != kAlgEcdsaP256 && sig.algorithm != kAlgEd25519) {
    return denied("unknown signature algorithm '" + sig.algorithm.substr(0, 64) + "'");
  }
  auto raw = base64_decode(sig.value);
  if (!raw.ok()) return denied("signature of " + who(sig) + ": " + raw.error().message);

  auto cert = detail::parse_certificate(sig.certificate, "certificate of " + who(sig));
  if (!cert.ok()) return denied(cert.error().message);
  const Verdict verdict = trust.verify(cert->get(), nullptr, sig.domain, now);
  if (!verdict.ok()) return denied("certificate of " + who(sig) + " is not trusted: " + verdict.reason);
  if (verdict.identity->node != sig.node) {
    return denied("certificate of " + who(sig) + " belongs to " + verdict.identity->domain + "/" +
                  verdict.identity->node);
  }
  EVP_PKEY* key = X509_get0_pubkey(cert->get());
  if (key == nullptr || algorithm_of(key) != sig.algorithm) {
    return denied("signature of " + who(sig) + " names algorithm " + sig.algorithm +
                  ", which is not the certificate's key type");
  }
  MdCtxPtr ctx(EVP_MD_CTX_new());
  if (!ctx || EVP_DigestVerifyInit(ctx.get(), nullptr, digest_for(sig.algorithm), nullptr, key) != 1) {
    return make_error(Errc::io_error, openssl_error("cannot start verifying a signature"));
  }
  const int rc = EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(raw->data()), raw->size(),
                                  reinterpret_cast<const unsigned char*>(message.data()), message.size());
  if (rc != 1) return denied("signature of " + who(sig) + " does not verify");
  return Status::Ok();
}

}  // namespace entente::certs
