#include "certs/certs.h"

#include <openssl/core_names.h>
#include <openssl/pem.h>
#include <openssl/rand.h>

#include <string>
#include <system_error>

#include "certs/detail/ossl.h"

namespace entente::certs {

namespace {

using detail::BignumPtr;
using detail::BioPtr;
using detail::ErrorScope;
using detail::ExtensionPtr;
using detail::GeneralNamePtr;
using detail::GeneralNamesPtr;
using detail::openssl_error;
using detail::PkeyPtr;
using detail::X509Ptr;

constexpr size_t kMaxPemBytes = 1 << 20;  // a certificate or key file; real ones are ~1-4 KiB
constexpr size_t kMaxSans = 64;
constexpr int kMaxCaDays = 36500;
constexpr int kMaxNodeDays = 3650;
constexpr auto kClockSkew = std::chrono::minutes(5);
constexpr std::string_view kCaSuffix = " Entente CA";
constexpr size_t kMaxCommonName = 64;

Result<PkeyPtr> generate_key(KeyType type) {
  PkeyPtr key(type == KeyType::ed25519 ? EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519")
                                       : EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (!key) return make_error(Errc::io_error, openssl_error("cannot generate a key"));
  return key;
}

// Ed25519 signs the message itself (no separate digest); EC signs SHA-256.
const EVP_MD* digest_for(EVP_PKEY* signer) {
  return EVP_PKEY_is_a(signer, "ED25519") || EVP_PKEY_is_a(signer, "ED448") ? nullptr : EVP_sha256();
}

Status set_random_serial(X509* cert) {
  unsigned char bytes[16];
  BignumPtr bn;
  do {
    if (RAND_bytes(bytes, sizeof bytes) != 1) {
      return make_error(Errc::io_error, openssl_error("cannot draw a random serial number"));
    }
    bytes[0] &= 0x7f;  // DER INTEGER: keep it positive
    bn.reset(BN_bin2bn(bytes, sizeof bytes, nullptr));
    if (!bn) return make_error(Errc::io_error, openssl_error("cannot make a serial number"));
  } while (BN_is_zero(bn.get()));
  if (BN_to_ASN1_INTEGER(bn.get(), X509_get_serialNumber(cert)) == nullptr) {
    return make_error(Errc::io_error, openssl_error("cannot set the serial number"));
  }
  return Status::Ok();
}

Status set_validity(X509* cert, Clock::time_point not_before, int days) {
  const Clock::time_point not_after = not_before + std::chrono::hours(24) * days;
  if (ASN1_TIME_set(X509_getm_notBefore(cert), Clock::to_time_t(not_before)) == nullptr ||
      ASN1_TIME_set(X509_getm_notAfter(cert), Clock::to_time_t(not_after)) == nullptr) {
    return make_error(Errc::invalid_argument, openssl_error("cannot set the validity period"));
  }
  return Status::Ok();
}

Status set_subject(X509* cert, std::string_view organization, std::string_view common_name) {
  X509_NAME* name = X509_get_subject_name(cert);
  auto add = [&](int nid, std::string_view value) {
    return X509_NAME_add_entry_by_NID(name, nid, MBSTRING_UTF8,
                                      reinterpret_cast<const unsigned char*>(value.data()),
                                      static_cast<int>(value.size()), -1, 0) == 1;
  };
  if (!add(NID_organizationName, organization) || !add(NID_commonName, common_name)) {
    return make_error(Errc::invalid_argument, openssl_error("cannot set the subject name"));
  }
  return Status::Ok();
}

// Adds an extension given in OpenSSL's configuration syntax ("critical,CA:TRUE").
Status add_extension(X509* cert, X509V3_CTX* ctx, int nid, const char* value) {
  ExtensionPtr ext(X509V3_EXT_nconf_nid(nullptr, ctx, nid, value));
  if (!ext || X509_add_ext(cert, ext.get(), -1) != 1) {
    return make_error(Errc::io_error,
                      openssl_error(std::string("cannot add the ") + OBJ_nid2ln(nid) + " extension"));
  }
  return Status::Ok();
}

Status sign(X509* cert, EVP_PKEY* signer) {
  if (X509_sign(cert, signer, digest_for(signer)) <= 0) {
    return make_error(Errc::io_error, openssl_error("cannot sign the certificate"));
  }
  return Status::Ok();
}

Result<std::string> private_key_pem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return make_error(Errc::io_error, openssl_error("cannot encode the private key"));
  }
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// An encrypted key would make OpenSSL prompt on the terminal; refuse instead.
int no_password(char*, int, int, void*) { return -1; }

Result<PkeyPtr> read_private_key(const std::filesystem::path& path) {
  ENTENTE_ASSIGN_OR_RETURN(std::string pem, detail::read_file(path, kMaxPemBytes));
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  PkeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, no_password, nullptr) : nullptr);
  OPENSSL_cleanse(pem.data(), pem.size());
  if (!key) {
    return make_error(Errc::parse_error,
                      openssl_error(path.string() + " is not an unencrypted PEM private key"));
  }
  return key;
}

// Creates `dir` when missing; io_error naming it.
Status ensure_directory(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return make_error(Errc::io_error, "cannot create directory " + dir.string() + ": " + ec.message());
  if (!std::filesystem::is_directory(dir, ec)) {
    return make_error(Errc::io_error, dir.string() + " is not a directory");
  }
  return Status::Ok();
}

Status refuse_existing(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::exists(std::filesystem::symlink_status(path, ec))) {
    return make_error(Errc::already_exists, path.string() + " exists already (use --force to overwrite)");
  }
  return Status::Ok();
}

std::string name_entry(X509_NAME* name, int nid) {
  const int index = X509_NAME_get_index_by_NID(name, nid, -1);
  if (index < 0) return {};
  const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, index));
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, data);
  if (n < 0) return {};
  std::string out(reinterpret_cast<char*>(utf8), static_cast<size_t>(n));
  OPENSSL_free(utf8);
  return out;
}

// The domain a CA certificate belongs to: its O, or its CN without the
// " Entente CA" suffix.
std::string ca_domain(X509* ca) {
  X509_NAME* subject = X509_get_subject_name(ca);
  std::string org = name_entry(subject, NID_organizationName);
  if (!org.empty()) return org;
  std::string cn = name_entry(subject, NID_commonName);
  if (cn.size() > kCaSuffix.size() &&
      cn.compare(cn.size() - kCaSuffix.size(), kCaSuffix.size(), kCaSuffix) == 0) {
    cn.resize(cn.size() - kCaSuffix.size());
  }
  return cn;
}

Status add_names(GENERAL_NAMES* names, int type, std::string_view value) {
  GeneralNamePtr name(GENERAL_NAME_new());
  ASN1_IA5STRING* text = ASN1_IA5STRING_new();
  if (!name || text == nullptr || ASN1_STRING_set(text, value.data(), static_cast<int>(value.size())) != 1) {
    ASN1_IA5STRING_free(text);
    return make_error(Errc::io_error, openssl_error("cannot build a subjectAltName"));
  }
  GENERAL_NAME_set0_value(name.get(), type, text);
  if (sk_GENERAL_NAME_push(names, name.get()) <= 0) {
    return make_error(Errc::io_error, openssl_error("cannot build a subjectAltName"));
  }
  name.release();  // owned by the stack now
  return Status::Ok();
}

Status add_ip(GENERAL_NAMES* names, const std::vector<unsigned char>& bytes) {
  GeneralNamePtr name(GENERAL_NAME_new());
  ASN1_OCTET_STRING* octets = ASN1_OCTET_STRING_new();
  if (!name || octets == nullptr ||
      ASN1_OCTET_STRING_set(octets, bytes.data(), static_cast<int>(bytes.size())) != 1) {
    ASN1_OCTET_STRING_free(octets);
    return make_error(Errc::io_error, openssl_error("cannot build a subjectAltName"));
  }
  GENERAL_NAME_set0_value(name.get(), GEN_IPADD, octets);
  if (sk_GENERAL_NAME_push(names, name.get()) <= 0) {
    return make_error(Errc::io_error, openssl_error("cannot build a subjectAltName"));
  }
  name.release();
  return Status::Ok();
}

std::string key_description(X509* cert) {
  EVP_PKEY* key = X509_get0_pubkey(cert);
  if (key == nullptr) return "unknown";
  if (EVP_PKEY_is_a(key, "ED25519")) return "Ed25519";
  if (EVP_PKEY_is_a(key, "ED448")) return "Ed448";
  if (EVP_PKEY_is_a(key, "EC")) {
    char group[64] = {};
    size_t len = 0;
    if (EVP_PKEY_get_utf8_string_param(key, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof group, &len) != 1) {
      return "EC";
    }
    const std::string g(group, len);
    if (g == "prime256v1" || g == "P-256") return "EC P-256";
    if (g == "secp384r1" || g == "P-384") return "EC P-384";
    if (g == "secp521r1" || g == "P-521") return "EC P-521";
    return "EC " + g;
  }
  if (EVP_PKEY_is_a(key, "RSA")) return "RSA " + std::to_string(EVP_PKEY_get_bits(key));
  const char* name = EVP_PKEY_get0_type_name(key);
  return name != nullptr ? name : "unknown";
}

std::string fingerprint(X509* cert) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (X509_digest(cert, EVP_sha256(), md, &len) != 1) return {};
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    if (i > 0) out += ':';
    out += kHex[md[i] >> 4];
    out += kHex[md[i] & 15];
  }
  return out;
}

// "3 days", "1 day", "5 hours", "12 minutes".
std::string span(Clock::duration d) {
  using namespace std::chrono;
  const auto secs = duration_cast<seconds>(d).count();
  auto plural = [](long long n, const char* unit) {
    return std::to_string(n) + " " + unit + (n == 1 ? "" : "s");
  };
  if (secs >= 86400) return plural(secs / 86400, "day");
  if (secs >= 3600) return plural(secs / 3600, "hour");
  if (secs >= 60) return plural(secs / 60, "minute");
  return plural(secs, "second");
}

}  // namespace

Status init_domain(std::string_view domain, const std::filesystem::path& out_dir, const CaOptions& options) {
  ErrorScope errors;
  if (!valid_name(domain)) {
    return make_error(Errc::invalid_argument, "domain name '" + std::string(domain) +
                                                  "' is not [a-z][a-z0-9-]* of at most 63 characters");
  }
  if (options.days < 1 || options.days > kMaxCaDays) {
    return make_error(Errc::invalid_argument, "CA validity of " + std::to_string(options.days) +
                                                  " days is outside 1.." + std::to_string(kMaxCaDays));
  }
  const auto crt_path = out_dir / "ca.crt";
  const auto key_path = out_dir / "ca.key";
  if (!options.force) {
    ENTENTE_RETURN_IF_ERROR(refuse_existing(key_path));
    ENTENTE_RETURN_IF_ERROR(refuse_existing(crt_path));
  }
  ENTENTE_RETURN_IF_ERROR(ensure_directory(out_dir));

  ENTENTE_ASSIGN_OR_RETURN(PkeyPtr key, generate_key(options.key));
  X509Ptr ca(X509_new());
  if (!ca) return make_error(Errc::io_error, openssl_error("cannot allocate a certificate"));
  if (X509_set_version(ca.get(), X509_VERSION_3) != 1 || X509_set_pubkey(ca.get(), key.get()) != 1) {
    return make_error(Errc::io_error, openssl_error("cannot build the CA certificate"));
  }
  ENTENTE_RETURN_IF_ERROR(set_random_serial(ca.get()));
  ENTENTE_RETURN_IF_ERROR(set_validity(ca.get(), Clock::now() - kClockSkew, options.days));
  // X.520 caps a CN at 64 characters; the longest domain names keep the
  // bare name (the domain is in O either way).
  std::string common_name = std::string(domain) + std::string(kCaSuffix);
  if (common_name.size() > kMaxCommonName) common_name = std::string(domain);
  ENTENTE_RETURN_IF_ERROR(set_subject(ca.get(), domain, common_name));
  if (X509_set_issuer_name(ca.get(), X509_get_subject_name(ca.get())) != 1) {
    return make_error(Errc::io_error, openssl_error("cannot set the issuer name"));
  }
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, ca.get(), ca.get(), nullptr, nullptr, 0);
  // pathlen:0: the CA signs node certificates only, never intermediates.
  ENTENTE_RETURN_IF_ERROR(add_extension(ca.get(), &ctx, NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
  ENTENTE_RETURN_IF_ERROR(add_extension(ca.get(), &ctx, NID_key_usage, "critical,keyCertSign,cRLSign"));
  ENTENTE_RETURN_IF_ERROR(add_extension(ca.get(), &ctx, NID_subject_key_identifier, "hash"));
  ENTENTE_RETURN_IF_ERROR(sign(ca.get(), key.get()));

  ENTENTE_ASSIGN_OR_RETURN(std::string key_pem, private_key_pem(key.get()));
  const std::string crt_pem = detail::pem_of(ca.get());
  if (crt_pem.empty()) return make_error(Errc::io_error, openssl_error("cannot encode the CA certificate"));
  Status written = detail::write_file_atomic(key_path, key_pem, 0600, options.force);
  OPENSSL_cleanse(key_pem.data(), key_pem.size());
  ENTENTE_RETURN_IF_ERROR(written);
  return detail::write_file_atomic(crt_path, crt_pem, 0644, options.force);
}

Status issue_node(std::string_view domain, std::string_view node, const std::filesystem::path& ca_dir,
                  const std::filesystem::path& out_dir, const NodeOptions& options) {
  ErrorScope errors;
  if (!valid_name(domain)) {
    return make_error(Errc::invalid_argument, "domain name '" + std::string(domain) +
                                                  "' is not [a-z][a-z0-9-]* of at most 63 characters");
  }
  if (!valid_name(node)) {
    return make_error(Errc::invalid_argument, "node name '" + std::string(node) +
                                                  "' is not [a-z][a-z0-9-]* of at most 63 characters");
  }
  if (options.days < 1 || options.days > kMaxNodeDays) {
    return make_error(Errc::invalid_argument, "node certificate validity of " + std::to_string(options.days) +
                                                  " days is outside 1.." + std::to_string(kMaxNodeDays));
  }
  if (options.sans.size() > kMaxSans) {
    return make_error(Errc::invalid_argument, std::to_string(options.sans.size()) +
                                                  " subject alternative names; at most " +
                                                  std::to_string(kMaxSans));
  }
  const Identity identity{std::string(domain), std::string(node)};
  GeneralNamesPtr names(sk_GENERAL_NAME_new_null());
  if (!names) return make_error(Errc::io_error, openssl_error("cannot allocate the subjectAltName"));
  ENTENTE_RETURN_IF_ERROR(add_names(names.get(), GEN_URI, identity.uri()));
  for (const std::string& san : options.sans) {
    if (auto ip = detail::parse_ip(san)) {
      ENTENTE_RETURN_IF_ERROR(add_ip(names.get(), *ip));
    } else if (detail::valid_dns_name(san)) {
      ENTENTE_RETURN_IF_ERROR(add_names(names.get(), GEN_DNS, san));
    } else {
      return make_error(
          Errc::invalid_argument,
          "subject alternative name '" + san + "' is neither an IP address nor a DNS name (RFC 1123 labels)");
    }
  }

  const auto ca_crt_path = ca_dir / "ca.crt";
  ENTENTE_ASSIGN_OR_RETURN(std::string ca_pem, detail::read_file(ca_crt_path, kMaxPemBytes));
  ENTENTE_ASSIGN_OR_RETURN(X509Ptr ca, detail::parse_certificate(ca_pem, ca_crt_path.string()));
  ENTENTE_ASSIGN_OR_RETURN(PkeyPtr ca_key, read_private_key(ca_dir / "ca.key"));
  if (!detail::is_ca_certificate(ca.get())) {
    return make_error(Errc::invalid_argument, ca_crt_path.string() + " is not a CA certificate");
  }
  const std::string owner = ca_domain(ca.get());
  if (owner != domain) {
    return make_error(Errc::invalid_argument, "the CA in " + ca_dir.string() + " belongs to domain '" +
                                                  owner + "', not to domain '" + std::string(domain) + "'");
  }
  if (X509_check_private_key(ca.get(), ca_key.get()) != 1) {
    return make_error(Errc::invalid_argument,
                      (ca_dir / "ca.key").string() + " is not the key of " + ca_crt_path.string());
  }
  // The node directory's ca.crt is the same file for every node: an
  // identical copy (or the CA directory itself) is not a conflict.
  const std::string ca_copy_pem = detail::pem_of(ca.get());
  const auto crt_path = out_dir / "node.crt";
  const auto key_path = out_dir / "node.key";
  const auto ca_copy_path = out_dir / "ca.crt";
  bool write_ca_copy = true;
  if (auto existing = detail::read_file(ca_copy_path, kMaxPemBytes); existing.ok()) {
    auto existing_cert = detail::parse_certificate(*existing, ca_copy_path.string());
    if (existing_cert.ok() && X509_cmp(existing_cert->get(), ca.get()) == 0) write_ca_copy = false;
  }
  if (!options.force) {
    ENTENTE_RETURN_IF_ERROR(refuse_existing(key_path));
    ENTENTE_RETURN_IF_ERROR(refuse_existing(crt_path));
    if (write_ca_copy) ENTENTE_RETURN_IF_ERROR(refuse_existing(ca_copy_path));
  }
  ENTENTE_RETURN_IF_ERROR(ensure_directory(out_dir));

  ENTENTE_ASSIGN_OR_RETURN(PkeyPtr key, generate_key(options.key));
  X509Ptr leaf(X509_new());
  if (!leaf) return make_error(Errc::io_error, openssl_error("cannot allocate a certificate"));
  if (X509_set_version(leaf.get(), X509_VERSION_3) != 1 || X509_set_pubkey(leaf.get(), key.get()) != 1 ||
      X509_set_issuer_name(leaf.get(), X509_get_subject_name(ca.get())) != 1) {
    return make_error(Errc::io_error, openssl_error("cannot build the node certificate"));
  }
  ENTENTE_RETURN_IF_ERROR(set_random_serial(leaf.get()));
  ENTENTE_RETURN_IF_ERROR(
      set_validity(leaf.get(), options.not_before.value_or(Clock::now() - kClockSkew), options.days));
  ENTENTE_RETURN_IF_ERROR(set_subject(leaf.get(), domain, node));
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, ca.get(), leaf.get(), nullptr, nullptr, 0);
  ENTENTE_RETURN_IF_ERROR(add_extension(leaf.get(), &ctx, NID_basic_constraints, "critical,CA:FALSE"));
  ENTENTE_RETURN_IF_ERROR(add_extension(leaf.get(), &ctx, NID_key_usage, "critical,digitalSignature"));
  // A node is the TLS server of the links it accepts and the client of the
  // ones it dials.
  ENTENTE_RETURN_IF_ERROR(add_extension(leaf.get(), &ctx, NID_ext_key_usage, "serverAuth,clientAuth"));
  ENTENTE_RETURN_IF_ERROR(add_extension(leaf.get(), &ctx, NID_subject_key_identifier, "hash"));
  ENTENTE_RETURN_IF_ERROR(add_extension(leaf.get(), &ctx, NID_authority_key_identifier, "keyid,issuer"));
  if (X509_add1_ext_i2d(leaf.get(), NID_subject_alt_name, names.get(), 0, X509V3_ADD_DEFAULT) != 1) {
    return make_error(Errc::io_error, openssl_error("cannot add the subjectAltName"));
  }
  ENTENTE_RETURN_IF_ERROR(sign(leaf.get(), ca_key.get()));

  ENTENTE_ASSIGN_OR_RETURN(std::string key_pem, private_key_pem(key.get()));
  const std::string leaf_pem = detail::pem_of(leaf.get());
  if (leaf_pem.empty() || ca_copy_pem.empty()) {
    return make_error(Errc::io_error, openssl_error("cannot encode the node certificate"));
  }
  Status written = detail::write_file_atomic(key_path, key_pem, 0600, options.force);
  OPENSSL_cleanse(key_pem.data(), key_pem.size());
  ENTENTE_RETURN_IF_ERROR(written);
  ENTENTE_RETURN_IF_ERROR(detail::write_file_atomic(crt_path, leaf_pem + ca_copy_pem, 0644, options.force));
  if (write_ca_copy) {
    ENTENTE_RETURN_IF_ERROR(detail::write_file_atomic(ca_copy_path, ca_copy_pem, 0644, options.force));
  }
  return Status::Ok();
}

Result<CertInfo> read_certificate(const std::filesystem::path& pem_file) {
  ErrorScope errors;
  ENTENTE_ASSIGN_OR_RETURN(std::string pem, detail::read_file(pem_file, kMaxPemBytes));
  ENTENTE_ASSIGN_OR_RETURN(X509Ptr cert, detail::parse_certificate(pem, pem_file.string()));
  CertInfo info;
  info.subject = detail::name_line(X509_get_subject_name(cert.get()));
  info.issuer = detail::name_line(X509_get_issuer_name(cert.get()));
  detail::SubjectAltNames sans = detail::scan_sans(cert.get());
  if (sans.entente_uris.size() == 1) {
    if (auto id = parse_identity(sans.entente_uris.front()); id.ok()) info.identity = std::move(id).value();
  }
  info.is_ca = detail::is_ca_certificate(cert.get());
  info.dns_names = std::move(sans.dns_names);
  info.ip_addresses = std::move(sans.ip_addresses);
  auto not_before = detail::to_time_point(X509_get0_notBefore(cert.get()));
  auto not_after = detail::to_time_point(X509_get0_notAfter(cert.get()));
  if (!not_before || !not_after) {
    return make_error(Errc::parse_error, pem_file.string() + ": the validity period does not parse");
  }
  info.not_before = *not_before;
  info.not_after = *not_after;
  info.key_type = key_description(cert.get());
  info.sha256_fingerprint = fingerprint(cert.get());
  return info;
}

std::string describe(const CertInfo& info, Clock::time_point now) {
  auto list = [](const std::vector<std::string>& items) {
    if (items.empty()) return std::string("(none)");
    std::string out;
    for (const auto& item : items) {
      if (!out.empty()) out += ", ";
      out += item;
    }
    return out;
  };
  std::string status;
  if (now > info.not_after) {
    status = "expired (" + span(now - info.not_after) + " ago)";
  } else if (now < info.not_before) {
    status = "not yet valid (starts in " + span(info.not_before - now) + ")";
  } else {
    status = "valid (expires in " + span(info.not_after - now) + ")";
  }
  std::string out;
  out += "identity: " + (info.identity ? info.identity->uri() : std::string("(none)")) + "\n";
  out += "subject: " + info.subject + "\n";
  out += "issuer: " + info.issuer + "\n";
  out += std::string("ca: ") + (info.is_ca ? "yes" : "no") + "\n";
  out += "dns: " + list(info.dns_names) + "\n";
  out += "ip: " + list(info.ip_addresses) + "\n";
  out += "not before: " + detail::iso8601(info.not_before) + "\n";
  out += "not after: " + detail::iso8601(info.not_after) + "\n";
  out += "status: " + status + "\n";
  out += "key: " + info.key_type + "\n";
  out += "sha256: " + info.sha256_fingerprint + "\n";
  return out;
}

}  // namespace entente::certs
