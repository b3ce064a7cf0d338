// Domain CAs and node certificates: what init_domain and issue_node write,
// the files' modes, refusals, and what read_certificate / describe report.

#include "certs/certs.h"
#include "certs/detail/ossl.h"

#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>

namespace entente::certs {
namespace {

namespace fs = std::filesystem;

using detail::PkeyPtr;
using detail::X509Ptr;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

unsigned mode_of(const fs::path& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return 0xffff;
  return st.st_mode & 07777;
}

std::vector<X509Ptr> load_all(const fs::path& p) {
  std::vector<X509Ptr> out;
  FILE* f = std::fopen(p.c_str(), "rb");
  if (f == nullptr) return out;
  while (X509* x = PEM_read_X509(f, nullptr, nullptr, nullptr)) out.emplace_back(x);
  std::fclose(f);
  ERR_clear_error();
  return out;
}

X509Ptr load(const fs::path& p) {
  auto all = load_all(p);
  return all.empty() ? nullptr : std::move(all.front());
}

PkeyPtr load_key(const fs::path& p) {
  FILE* f = std::fopen(p.c_str(), "rb");
  if (f == nullptr) return nullptr;
  PkeyPtr key(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  return key;
}

class CertsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("entente-certs-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  fs::path dir_;
};

TEST_F(CertsTest, InitDomainWritesASelfSignedCa) {
  const fs::path ca = dir_ / "acme-ca";
  ASSERT_TRUE(init_domain("acme", ca).ok());
  EXPECT_EQ(mode_of(ca / "ca.key"), 0600u);
  EXPECT_EQ(mode_of(ca / "ca.crt"), 0644u);

  auto info = read_certificate(ca / "ca.crt");
  ASSERT_TRUE(info.ok()) << info.error().message;
  EXPECT_EQ(info->subject, "CN=acme Entente CA,O=acme");
  EXPECT_EQ(info->issuer, info->subject);
  EXPECT_TRUE(info->is_ca);
  EXPECT_FALSE(info->identity.has_value());
  EXPECT_EQ(info->key_type, "EC P-256");
  EXPECT_EQ(info->sha256_fingerprint.size(), 32u * 3 - 1);
  const auto days =
      std::chrono::duration_cast<std::chrono::hours>(info->not_after - info->not_before).count() / 24;
  EXPECT_EQ(days, 3650);

  X509Ptr cert = load(ca / "ca.crt");
  ASSERT_TRUE(cert);
  // basicConstraints critical CA:TRUE, pathlen:0; keyUsage critical certSign + CRL.
  const int bc = X509_get_ext_by_NID(cert.get(), NID_basic_constraints, -1);
  ASSERT_GE(bc, 0);
  EXPECT_EQ(X509_EXTENSION_get_critical(X509_get_ext(cert.get(), bc)), 1);
  EXPECT_EQ(X509_get_pathlen(cert.get()), 0);
  const int ku = X509_get_ext_by_NID(cert.get(), NID_key_usage, -1);
  ASSERT_GE(ku, 0);
  EXPECT_EQ(X509_EXTENSION_get_critical(X509_get_ext(cert.get(), ku)), 1);
  EXPECT_EQ(X509_get_key_usage(cert.get()), static_cast<uint32_t>(KU_KEY_CERT_SIGN | KU_CRL_SIGN));
  EXPECT_NE(X509_get0_subject_key_id(cert.get()), nullptr);
  EXPECT_EQ(X509_self_signed(cert.get(), 1), 1);
  // The key on disk is the certificate's key.
  PkeyPtr key = load_key(ca / "ca.key");
  ASSERT_TRUE(key);
  EXPECT_EQ(X509_check_private_key(cert.get(), key.get()), 1);
  // A random serial of up to 128 bits: two CAs never share one.
  ASSERT_TRUE(init_domain("acme", dir_ / "second").ok());
  X509Ptr other = load(dir_ / "second" / "ca.crt");
  EXPECT_NE(ASN1_INTEGER_cmp(X509_get0_serialNumber(cert.get()), X509_get0_serialNumber(other.get())), 0);
  EXPECT_GE(ASN1_STRING_length(X509_get0_serialNumber(cert.get())), 8);
  EXPECT_LE(ASN1_STRING_length(X509_get0_serialNumber(cert.get())), 16);
}

TEST_F(CertsTest, ModesDoNotDependOnTheUmask) {
  const mode_t old = ::umask(0);
  Status open_umask = init_domain("acme", dir_ / "a");
  ::umask(077);
  Status strict_umask = init_domain("acme", dir_ / "b");
  ::umask(old);
  ASSERT_TRUE(open_umask.ok());
  ASSERT_TRUE(strict_umask.ok());
  EXPECT_EQ(mode_of(dir_ / "a" / "ca.key"), 0600u);
  EXPECT_EQ(mode_of(dir_ / "a" / "ca.crt"), 0644u);
  EXPECT_EQ(mode_of(dir_ / "b" / "ca.key"), 0600u);
  EXPECT_EQ(mode_of(dir_ / "b" / "ca.crt"), 0644u);
  // No temporary files are left behind.
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "a")) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 2u);
}

TEST_F(CertsTest, InitDomainRefusesToOverwriteUnlessForced) {
  ASSERT_TRUE(init_domain("acme", dir_).ok());
  const std::string key_before = slurp(dir_ / "ca.key");
  Status again = init_domain("acme", dir_);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, Errc::already_exists);
  EXPECT_NE(again.error().message.find((dir_ / "ca.key").string()), std::string::npos)
      << again.error().message;
  EXPECT_NE(again.error().message.find("--force"), std::string::npos);
  EXPECT_EQ(slurp(dir_ / "ca.key"), key_before);

  // Only the certificate left: still refused, the key is not recreated.
  fs::remove(dir_ / "ca.key");
  Status crt_only = init_domain("acme", dir_);
  ASSERT_FALSE(crt_only.ok());
  EXPECT_EQ(crt_only.error().code, Errc::already_exists);
  EXPECT_FALSE(fs::exists(dir_ / "ca.key"));

  CaOptions force;
  force.force = true;
  ASSERT_TRUE(init_domain("acme", dir_, force).ok());
  EXPECT_NE(slurp(dir_ / "ca.key"), key_before);
  EXPECT_EQ(mode_of(dir_ / "ca.key"), 0600u);
}

TEST_F(CertsTest, InitDomainRejectsBadNamesAndOptions) {
  for (const char* bad : {"", "Acme", "1acme", "ac me", "acme.com", "a_b"}) {
    Status s = init_domain(bad, dir_ / "x");
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.error().code, Errc::invalid_argument);
    EXPECT_NE(s.error().message.find("domain name '" + std::string(bad) + "'"), std::string::npos);
  }
  EXPECT_FALSE(init_domain(std::string(64, 'a'), dir_ / "x").ok());
  // The longest name fits although "<name> Entente CA" exceeds the 64
  // characters X.520 allows a CN: the CN is then the bare name.
  Status longest = init_domain(std::string(63, 'a'), dir_ / "x");
  ASSERT_TRUE(longest.ok()) << longest.error().message;
  auto info = read_certificate(dir_ / "x" / "ca.crt");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->subject, "CN=" + std::string(63, 'a') + ",O=" + std::string(63, 'a'));
  EXPECT_TRUE(issue_node(std::string(63, 'a'), std::string(63, 'b'), dir_ / "x", dir_ / "x").ok());
  for (int days : {0, -1, 36501}) {
    CaOptions o;
    o.days = days;
    Status s = init_domain("acme", dir_ / "y", o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.error().code, Errc::invalid_argument);
    EXPECT_NE(s.error().message.find("outside 1..36500"), std::string::npos) << s.error().message;
  }
  EXPECT_FALSE(fs::exists(dir_ / "y"));
}

TEST_F(CertsTest, InitDomainReportsAnUnwritableDirectory) {
  spit(dir_ / "file", "not a directory");
  Status s = init_domain("acme", dir_ / "file" / "ca");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::io_error);
  EXPECT_NE(s.error().message.find((dir_ / "file").string()), std::string::npos) << s.error().message;
}

TEST_F(CertsTest, IssueNodeWritesTheChainTheKeyAndTheCa) {
  ASSERT_TRUE(init_domain("acme", dir_ / "ca").ok());
  NodeOptions o;
  o.sans = {"127.0.0.1", "::1", "localhost", "n1.acme.example"};
  const auto before = Clock::now();
  Status s = issue_node("acme", "n1", dir_ / "ca", dir_ / "n1", o);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(mode_of(dir_ / "n1" / "node.key"), 0600u);
  EXPECT_EQ(mode_of(dir_ / "n1" / "node.crt"), 0644u);
  EXPECT_EQ(slurp(dir_ / "n1" / "ca.crt"), slurp(dir_ / "ca" / "ca.crt"));

  auto info = read_certificate(dir_ / "n1" / "node.crt");
  ASSERT_TRUE(info.ok()) << info.error().message;
  ASSERT_TRUE(info->identity.has_value());
  EXPECT_EQ(*info->identity, (Identity{"acme", "n1"}));
  EXPECT_EQ(info->subject, "CN=n1,O=acme");
  EXPECT_EQ(info->issuer, "CN=acme Entente CA,O=acme");
  EXPECT_FALSE(info->is_ca);
  EXPECT_EQ(info->dns_names, (std::vector<std::string>{"localhost", "n1.acme.example"}));
  EXPECT_EQ(info->ip_addresses, (std::vector<std::string>{"127.0.0.1", "::1"}));
  EXPECT_EQ(info->key_type, "EC P-256");
  // Valid from five minutes ago (clock skew) for the default 397 days.
  EXPECT_LE(info->not_before, before - std::chrono::minutes(5) + std::chrono::seconds(1));
  EXPECT_GE(info->not_before, before - std::chrono::minutes(5) - std::chrono::seconds(5));
  EXPECT_EQ(info->not_after - info->not_before, std::chrono::hours(24 * 397));

  // node.crt: the node certificate, then the CA.
  auto chain = load_all(dir_ / "n1" / "node.crt");
  ASSERT_EQ(chain.size(), 2u);
  X509Ptr ca = load(dir_ / "ca" / "ca.crt");
  EXPECT_EQ(X509_cmp(chain[1].get(), ca.get()), 0);
  X509* leaf = chain[0].get();
  EXPECT_EQ(X509_verify(leaf, X509_get0_pubkey(ca.get())), 1);
  EXPECT_EQ(X509_check_issued(ca.get(), leaf), X509_V_OK);
  EXPECT_EQ(X509_get_key_usage(leaf), static_cast<uint32_t>(KU_DIGITAL_SIGNATURE));
  EXPECT_EQ(X509_get_extended_key_usage(leaf), static_cast<uint32_t>(XKU_SSL_SERVER | XKU_SSL_CLIENT));
  EXPECT_EQ(X509_check_ca(leaf), 0);
  ASSERT_NE(X509_get0_authority_key_id(leaf), nullptr);
  EXPECT_EQ(ASN1_OCTET_STRING_cmp(X509_get0_authority_key_id(leaf), X509_get0_subject_key_id(ca.get())), 0);
  EXPECT_NE(X509_get0_subject_key_id(leaf), nullptr);
  PkeyPtr key = load_key(dir_ / "n1" / "node.key");
  ASSERT_TRUE(key);
  EXPECT_EQ(X509_check_private_key(leaf, key.get()), 1);
}

TEST_F(CertsTest, Ed25519AndP256MixInEveryCombination) {
  for (KeyType ca_key : {KeyType::ec_p256, KeyType::ed25519}) {
    for (KeyType node_key : {KeyType::ec_p256, KeyType::ed25519}) {
      const std::string tag =
          std::to_string(static_cast<int>(ca_key)) + std::to_string(static_cast<int>(node_key));
      CaOptions co;
      co.key = ca_key;
      ASSERT_TRUE(init_domain("acme", dir_ / ("ca" + tag), co).ok());
      NodeOptions no;
      no.key = node_key;
      no.sans = {"localhost"};
      Status s = issue_node("acme", "n1", dir_ / ("ca" + tag), dir_ / ("n" + tag), no);
      ASSERT_TRUE(s.ok()) << s.error().message;
      auto ca_info = read_certificate(dir_ / ("ca" + tag) / "ca.crt");
      auto node_info = read_certificate(dir_ / ("n" + tag) / "node.crt");
      ASSERT_TRUE(ca_info.ok() && node_info.ok());
      EXPECT_EQ(ca_info->key_type, ca_key == KeyType::ed25519 ? "Ed25519" : "EC P-256");
      EXPECT_EQ(node_info->key_type, node_key == KeyType::ed25519 ? "Ed25519" : "EC P-256");
      X509Ptr ca = load(dir_ / ("ca" + tag) / "ca.crt");
      X509Ptr leaf = load(dir_ / ("n" + tag) / "node.crt");
      EXPECT_EQ(X509_verify(leaf.get(), X509_get0_pubkey(ca.get())), 1) << tag;
      EXPECT_EQ(X509_self_signed(ca.get(), 1), 1) << tag;
    }
  }
}

TEST_F(CertsTest, IssueNodeRefusesACaOfAnotherDomain) {
  ASSERT_TRUE(init_domain("acme", dir_ / "ca").ok());
  Status s = issue_node("globex", "n1", dir_ / "ca", dir_ / "n1");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::invalid_argument);
  EXPECT_NE(s.error().message.find("'acme'"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("'globex'"), std::string::npos) << s.error().message;
  EXPECT_FALSE(fs::exists(dir_ / "n1" / "node.key"));
}

TEST_F(CertsTest, IssueNodeRejectsBadSans) {
  ASSERT_TRUE(init_domain("acme", dir_ / "ca").ok());
  for (const std::string& bad : std::vector<std::string>{
           "bad_name", "-lead.example", "trail-.example", "a..b", ".example", "example.", "1.2.3",
           "256.1.1.1", "*.example.com", "fe80::1%eth0", "[::1]", "", "host name",
           std::string(64, 'a') + ".example", "https://example.com", std::string(254, 'a')}) {
    NodeOptions o;
    o.sans = {"localhost", bad};
    Status s = issue_node("acme", "n1", dir_ / "ca", dir_ / "n1", o);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.error().code, Errc::invalid_argument);
    EXPECT_NE(s.error().message.find("'" + bad + "'"), std::string::npos) << s.error().message;
    EXPECT_FALSE(fs::exists(dir_ / "n1" / "node.key")) << bad;
  }
  NodeOptions many;
  for (int i = 0; i < 65; ++i) many.sans.push_back("h" + std::to_string(i));
  Status s = issue_node("acme", "n1", dir_ / "ca", dir_ / "n1", many);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("at most 64"), std::string::npos) << s.error().message;
  many.sans.pop_back();
  EXPECT_TRUE(issue_node("acme", "n1", dir_ / "ca", dir_ / "n1", many).ok());
}

TEST_F(CertsTest, IssueNodeRejectsBadNamesAndDays) {
  ASSERT_TRUE(init_domain("acme", dir_ / "ca").ok());
  Status bad_node = issue_node("acme", "N1", dir_ / "ca", dir_ / "n1");
  ASSERT_FALSE(bad_node.ok());
  EXPECT_NE(bad_node.error().message.find("node name 'N1'"), std::string::npos);
  NodeOptions o;
  o.days = 3651;
  Status long_lived = issue_node("acme", "n1", dir_ / "ca", dir_ / "n1", o);
  ASSERT_FALSE(long_lived.ok());
  EXPECT_NE(long_lived.error().message.find("outside 1..3650"), std::string::npos);
}

TEST_F(CertsTest, IssueNodeRefusesToOverwriteUnlessForced) {
  ASSERT_TRUE(init_domain("acme", dir_ / "ca").ok());
  ASSERT_TRUE(issue_node("acme", "n1", dir_ / "ca", dir_ / "n1").ok());
  const std::string before = slurp(dir_ / "n1" / "node.crt");
  Status again = issue_node("acme", "n1", dir_ / "ca", dir_ / "n1");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, Errc::already_exists);
  EXPECT_EQ(slurp(dir_ / "n1" / "node.crt"), before);
  NodeOptions force;
  force.force = true;
  ASSERT_TRUE(issue_node("acme", "n1", dir_ / "ca", dir_ / "n1", force).ok());
  EXPECT_NE(slurp(dir_ / "n1" / "node.crt"), before);
  EXPECT_EQ(mode_of(dir_ / "n1" / "node.key"), 0600u);

  // A node directory holding another domain CA's ca.crt is a conflict too.
  ASSERT_TRUE(init_domain("acme", dir_ / "ca2").ok());
  fs::create_directories(dir_ / "n2");
  fs::copy_file(dir_ / "ca" / "ca.crt", dir_ / "n2" / "ca.crt");
  Status stale_ca = issue_node("acme", "n2", dir_ / "ca2", dir_ / "n2");
  ASSERT_FALSE(stale_ca.ok());
  EXPECT_EQ(stale_ca.error().code, Errc::already_exists);
  EXPECT_NE(stale_ca.error().message.find((dir_ / "n2" / "ca.crt").string()), std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ / "n2" / "node.key"));
}

TEST_F(CertsTest, IssueNodeIntoTheCaDirectoryKeepsItsCaCertificate) {
  ASSERT_TRUE(init_domain("acme", dir_).ok());
  const std::string ca_before = slurp(dir_ / "ca.crt");
  Status s = issue_node("acme", "n1", dir_, dir_);
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(slurp(dir_ / "ca.crt"), ca_before);
  EXPECT_TRUE(fs::exists(dir_ / "node.crt"));
}

TEST_F(CertsTest, IssueNodeReportsAMissingOrMismatchedCa) {
  Status missing = issue_node("acme", "n1", dir_ / "nowhere", dir_ / "n1");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, Errc::not_found);
  EXPECT_NE(missing.error().message.find((dir_ / "nowhere" / "ca.crt").string()), std::string::npos);

  ASSERT_TRUE(init_domain("acme", dir_ / "ca").ok());
  ASSERT_TRUE(init_domain("acme", dir_ / "other").ok());
  fs::copy_file(dir_ / "other" / "ca.key", dir_ / "ca" / "ca.key", fs::copy_options::overwrite_existing);
  Status mismatch = issue_node("acme", "n1", dir_ / "ca", dir_ / "n1");
  ASSERT_FALSE(mismatch.ok());
  EXPECT_EQ(mismatch.error().code, Errc::invalid_argument);
  EXPECT_NE(mismatch.error().message.find("is not the key of"), std::string::npos)
      << mismatch.error().message;

  spit(dir_ / "ca" / "ca.key", "-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n");
  Status garbage = issue_node("acme", "n1", dir_ / "ca", dir_ / "n1");
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.error().code, Errc::parse_error);

  // A node certificate is not a CA.
  ASSERT_TRUE(init_domain("acme", dir_ / "ca3").ok());
  ASSERT_TRUE(issue_node("acme", "n1", dir_ / "ca3", dir_ / "n3").ok());
  fs::create_directories(dir_ / "fake");
  fs::copy_file(dir_ / "n3" / "node.crt", dir_ / "fake" / "ca.crt");
  fs::copy_file(dir_ / "n3" / "node.key", dir_ / "fake" / "ca.key");
  Status not_ca = issue_node("acme", "n2", dir_ / "fake", dir_ / "n2");
  ASSERT_FALSE(not_ca.ok());
  EXPECT_NE(not_ca.error().message.find("is not a CA certificate"), std::string::npos)
      << not_ca.error().message;
}

TEST_F(CertsTest, ReadCertificateReportsBadFiles) {
  auto missing = read_certificate(dir_ / "none.pem");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, Errc::not_found);
  EXPECT_NE(missing.error().message.find("none.pem"), std::string::npos);

  spit(dir_ / "text.pem", "hello\n");
  auto text = read_certificate(dir_ / "text.pem");
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.error().code, Errc::parse_error);
  EXPECT_NE(text.error().message.find("no PEM certificate"), std::string::npos) << text.error().message;

  spit(dir_ / "broken.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  auto broken = read_certificate(dir_ / "broken.pem");
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.error().code, Errc::parse_error);

  spit(dir_ / "huge.pem", std::string((1 << 20) + 1, 'x'));
  auto huge = read_certificate(dir_ / "huge.pem");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.error().code, Errc::limit_exceeded);
}

TEST_F(CertsTest, DescribePrintsOneFieldPerLine) {
  ASSERT_TRUE(init_domain("acme", dir_ / "ca").ok());
  NodeOptions o;
  o.sans = {"localhost", "127.0.0.1"};
  o.days = 10;
  o.not_before = Clock::from_time_t(1767225600);  // 2026-01-01T00:00:00Z
  ASSERT_TRUE(issue_node("acme", "n1", dir_ / "ca", dir_ / "n1", o).ok());
  auto info = read_certificate(dir_ / "n1" / "node.crt");
  ASSERT_TRUE(info.ok());
  const auto start = Clock::from_time_t(1767225600);
  const std::string text = describe(*info, start + std::chrono::hours(24 * 3));
  EXPECT_NE(text.find("identity: entente://acme/n1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("subject: CN=n1,O=acme\n"), std::string::npos) << text;
  EXPECT_NE(text.find("issuer: CN=acme Entente CA,O=acme\n"), std::string::npos) << text;
  EXPECT_NE(text.find("ca: no\n"), std::string::npos) << text;
  EXPECT_NE(text.find("dns: localhost\n"), std::string::npos) << text;
  EXPECT_NE(text.find("ip: 127.0.0.1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("not before: 2026-01-01T00:00:00Z\n"), std::string::npos) << text;
  EXPECT_NE(text.find("not after: 2026-01-11T00:00:00Z\n"), std::string::npos) << text;
  EXPECT_NE(text.find("status: valid (expires in 7 days)\n"), std::string::npos) << text;
  EXPECT_NE(text.find("key: EC P-256\n"), std::string::npos) << text;
  EXPECT_NE(text.find("sha256: " + info->sha256_fingerprint + "\n"), std::string::npos) << text;

  EXPECT_NE(describe(*info, start + std::chrono::hours(24 * 12)).find("status: expired (2 days ago)\n"),
            std::string::npos);
  EXPECT_NE(
      describe(*info, start - std::chrono::hours(5)).find("status: not yet valid (starts in 5 hours)\n"),
      std::string::npos);

  auto ca = read_certificate(dir_ / "ca" / "ca.crt");
  ASSERT_TRUE(ca.ok());
  const std::string ca_text = describe(*ca);
  EXPECT_NE(ca_text.find("identity: (none)\n"), std::string::npos) << ca_text;
  EXPECT_NE(ca_text.find("ca: yes\n"), std::string::npos) << ca_text;
  EXPECT_NE(ca_text.find("dns: (none)\n"), std::string::npos) << ca_text;
}

}  // namespace
}  // namespace entente::certs
