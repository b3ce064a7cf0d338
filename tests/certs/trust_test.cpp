// TrustStore: per-domain CA pins and the checks a peer certificate must pass,
// with the refusal label and reason for each way it can fail.

#include "certs/detail/ossl.h"
#include "certs/trust.h"

#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace entente::certs {
namespace {

namespace fs = std::filesystem;

using detail::PkeyPtr;
using detail::X509Ptr;
struct StackFree {
  void operator()(STACK_OF(X509) * s) const { sk_X509_pop_free(s, X509_free); }
};
using StackPtr = std::unique_ptr<STACK_OF(X509), StackFree>;

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A presented chain as a TLS peer would send it: the leaf and the rest.
struct Chain {
  X509Ptr leaf;
  StackPtr rest{sk_X509_new_null()};
};

Chain load_chain(const fs::path& p) {
  Chain c;
  FILE* f = std::fopen(p.c_str(), "rb");
  if (f == nullptr) return c;
  while (X509* x = PEM_read_X509(f, nullptr, nullptr, nullptr)) {
    if (!c.leaf) {
      c.leaf.reset(x);
    } else {
      sk_X509_push(c.rest.get(), x);
    }
  }
  std::fclose(f);
  ERR_clear_error();
  return c;
}

PkeyPtr load_key(const fs::path& p) {
  FILE* f = std::fopen(p.c_str(), "rb");
  if (f == nullptr) return nullptr;
  PkeyPtr key(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  return key;
}

// A leaf signed by the CA in `ca_dir` with exactly the URI SANs given (none,
// several, malformed): certificates `entente certs` refuses to make.
X509Ptr make_raw_leaf(const fs::path& ca_dir, const std::vector<std::string>& uris) {
  Chain ca = load_chain(ca_dir / "ca.crt");
  PkeyPtr ca_key = load_key(ca_dir / "ca.key");
  PkeyPtr key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  X509Ptr x(X509_new());
  X509_set_version(x.get(), X509_VERSION_3);
  ASN1_INTEGER_set(X509_get_serialNumber(x.get()), 42);
  X509_gmtime_adj(X509_getm_notBefore(x.get()), -300);
  X509_gmtime_adj(X509_getm_notAfter(x.get()), 86400);
  X509_set_pubkey(x.get(), key.get());
  X509_NAME* name = X509_get_subject_name(x.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("raw"), -1, -1,
                             0);
  X509_set_issuer_name(x.get(), X509_get_subject_name(ca.leaf.get()));
  if (!uris.empty()) {
    GENERAL_NAMES* names = sk_GENERAL_NAME_new_null();
    for (const auto& uri : uris) {
      GENERAL_NAME* gn = GENERAL_NAME_new();
      ASN1_IA5STRING* s = ASN1_IA5STRING_new();
      ASN1_STRING_set(s, uri.data(), static_cast<int>(uri.size()));
      GENERAL_NAME_set0_value(gn, GEN_URI, s);
      sk_GENERAL_NAME_push(names, gn);
    }
    X509_add1_ext_i2d(x.get(), NID_subject_alt_name, names, 0, X509V3_ADD_DEFAULT);
    GENERAL_NAMES_free(names);
  }
  X509_sign(x.get(), ca_key.get(), EVP_sha256());
  return x;
}

class TrustTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::random_device rd;
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("entente-trust-" + std::to_string(rd()) + std::to_string(rd())));
    const fs::path& d = *dir_;
    ASSERT_TRUE(init_domain("acme", d / "acme-ca").ok());
    ASSERT_TRUE(init_domain("globex", d / "globex-ca").ok());
    ASSERT_TRUE(init_domain("initech", d / "initech-ca").ok());
    // An attacker's CA that calls itself acme.
    ASSERT_TRUE(init_domain("acme", d / "evil-ca").ok());
    NodeOptions o;
    o.sans = {"127.0.0.1", "localhost"};
    ASSERT_TRUE(issue_node("acme", "n1", d / "acme-ca", d / "acme-n1", o).ok());
    ASSERT_TRUE(issue_node("globex", "g1", d / "globex-ca", d / "globex-g1", o).ok());
    ASSERT_TRUE(issue_node("initech", "i1", d / "initech-ca", d / "initech-i1", o).ok());
    ASSERT_TRUE(issue_node("acme", "n1", d / "evil-ca", d / "evil-n1", o).ok());
    NodeOptions old = o;
    old.not_before = Clock::from_time_t(1700000000);  // 2023-11-14T22:13:20Z
    old.days = 30;
    ASSERT_TRUE(issue_node("acme", "old", d / "acme-ca", d / "acme-old", old).ok());
    ASSERT_TRUE(issue_node("acme", "old", d / "evil-ca", d / "evil-old", old).ok());
    NodeOptions future = o;
    future.not_before = Clock::now() + std::chrono::hours(48);
    ASSERT_TRUE(issue_node("acme", "future", d / "acme-ca", d / "acme-future", future).ok());
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  void SetUp() override {
    ASSERT_TRUE(store_.pin("acme", *dir_ / "acme-ca" / "ca.crt").ok());
    ASSERT_TRUE(store_.pin("globex", *dir_ / "globex-ca" / "ca.crt").ok());
  }
  static fs::path path(const std::string& name) { return *dir_ / name; }

  static fs::path* dir_;
  TrustStore store_;
};
fs::path* TrustTest::dir_ = nullptr;

TEST_F(TrustTest, TrustsNodesOfEachPinnedDomain) {
  EXPECT_TRUE(store_.pinned("acme"));
  EXPECT_TRUE(store_.pinned("globex"));
  EXPECT_FALSE(store_.pinned("initech"));
  Chain acme = load_chain(path("acme-n1") / "node.crt");
  Chain globex = load_chain(path("globex-g1") / "node.crt");
  ASSERT_TRUE(acme.leaf && globex.leaf);

  Verdict v = store_.verify(acme.leaf.get(), acme.rest.get(), "acme");
  ASSERT_TRUE(v.ok()) << v.refusal << ": " << v.reason;
  EXPECT_EQ(*v.identity, (Identity{"acme", "n1"}));
  EXPECT_TRUE(v.refusal.empty());
  // With no chain presented, and with no expectation of the domain.
  EXPECT_TRUE(store_.verify(acme.leaf.get(), nullptr, "acme").ok());
  Verdict any = store_.verify(globex.leaf.get(), nullptr, std::nullopt);
  ASSERT_TRUE(any.ok()) << any.reason;
  EXPECT_EQ(*any.identity, (Identity{"globex", "g1"}));
}

TEST_F(TrustTest, RefusesACertificateOfAnotherDomain) {
  Chain globex = load_chain(path("globex-g1") / "node.crt");
  Verdict v = store_.verify(globex.leaf.get(), globex.rest.get(), "acme");
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.refusal, "wrong_domain");
  EXPECT_EQ(v.reason, "certificate of entente://globex/g1 names domain globex, expected domain acme");
}

TEST_F(TrustTest, RefusesAnAttackerCaThatCallsItselfTheDomain) {
  Chain evil = load_chain(path("evil-n1") / "node.crt");
  // Even with the attacker's CA presented in the chain.
  Verdict v = store_.verify(evil.leaf.get(), evil.rest.get(), "acme");
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.refusal, "untrusted_chain");
  EXPECT_NE(
      v.reason.find("certificate of entente://acme/n1 does not chain to the pinned CA of domain acme: "),
      std::string::npos)
      << v.reason;
  // An expired certificate of the attacker is still an untrusted chain,
  // not "expired": the chain is checked first.
  Chain evil_old = load_chain(path("evil-old") / "node.crt");
  Verdict old = store_.verify(evil_old.leaf.get(), evil_old.rest.get(), "acme");
  EXPECT_EQ(old.refusal, "untrusted_chain") << old.reason;
}

TEST_F(TrustTest, RefusesADomainWithoutPin) {
  Chain initech = load_chain(path("initech-i1") / "node.crt");
  Verdict v = store_.verify(initech.leaf.get(), initech.rest.get(), std::nullopt);
  EXPECT_EQ(v.refusal, "not_pinned");
  EXPECT_EQ(v.reason, "certificate of entente://initech/i1: domain initech has no pinned CA");
  // The CA of an unpinned domain does not help another domain either.
  EXPECT_EQ(store_.verify(initech.leaf.get(), initech.rest.get(), "acme").refusal, "wrong_domain");
}

TEST_F(TrustTest, RefusesExpiredAndNotYetValidCertificates) {
  Chain old = load_chain(path("acme-old") / "node.crt");
  Verdict expired = store_.verify(old.leaf.get(), old.rest.get(), "acme");
  EXPECT_EQ(expired.refusal, "expired");
  EXPECT_EQ(expired.reason, "certificate of entente://acme/old expired at 2023-12-14T22:13:20Z");
  EXPECT_FALSE(expired.identity.has_value());
  // In its own time `now` the certificate was valid, but the CA (made
  // today) was not yet: the refusal names the CA.
  Verdict then = store_.verify(old.leaf.get(), old.rest.get(), "acme", Clock::from_time_t(1701000000));
  EXPECT_EQ(then.refusal, "not_yet_valid");
  EXPECT_NE(then.reason.find("the pinned CA of domain acme"), std::string::npos) << then.reason;

  Chain future = load_chain(path("acme-future") / "node.crt");
  Verdict early = store_.verify(future.leaf.get(), future.rest.get(), "acme");
  EXPECT_EQ(early.refusal, "not_yet_valid");
  EXPECT_NE(early.reason.find("certificate of entente://acme/future is not valid before "), std::string::npos)
      << early.reason;
  EXPECT_TRUE(store_.verify(future.leaf.get(), nullptr, "acme", Clock::now() + std::chrono::hours(72)).ok());

  // A current certificate checked far in the future has expired too.
  Chain n1 = load_chain(path("acme-n1") / "node.crt");
  EXPECT_EQ(
      store_.verify(n1.leaf.get(), nullptr, "acme", Clock::now() + std::chrono::hours(24 * 400)).refusal,
      "expired");
}

TEST_F(TrustTest, RefusesACaCertificatePresentedAsANode) {
  Chain ca = load_chain(path("acme-ca") / "ca.crt");
  Verdict v = store_.verify(ca.leaf.get(), nullptr, "acme");
  EXPECT_EQ(v.refusal, "is_ca");
  EXPECT_EQ(v.reason, "certificate CN=acme Entente CA,O=acme is a CA certificate, not a node certificate");
}

TEST_F(TrustTest, RefusesCertificatesWithoutExactlyOneIdentity) {
  X509Ptr none = make_raw_leaf(path("acme-ca"), {});
  Verdict v = store_.verify(none.get(), nullptr, "acme");
  EXPECT_EQ(v.refusal, "no_identity");
  EXPECT_EQ(v.reason, "certificate CN=raw carries no entente:// identity");

  X509Ptr web = make_raw_leaf(path("acme-ca"), {"https://acme.example/n1"});
  EXPECT_EQ(store_.verify(web.get(), nullptr, "acme").refusal, "no_identity");

  X509Ptr two = make_raw_leaf(path("acme-ca"), {"entente://acme/n1", "entente://acme/n2"});
  Verdict both = store_.verify(two.get(), nullptr, "acme");
  EXPECT_EQ(both.refusal, "no_identity");
  EXPECT_NE(both.reason.find("carries 2 entente:// identities"), std::string::npos) << both.reason;

  X509Ptr bad = make_raw_leaf(path("acme-ca"), {"entente://Acme/n1"});
  Verdict malformed = store_.verify(bad.get(), nullptr, "acme");
  EXPECT_EQ(malformed.refusal, "no_identity");
  EXPECT_NE(malformed.reason.find("domain 'Acme'"), std::string::npos) << malformed.reason;

  // The raw leaf helper itself makes chains the store accepts.
  X509Ptr good = make_raw_leaf(path("acme-ca"), {"entente://acme/raw"});
  EXPECT_TRUE(store_.verify(good.get(), nullptr, "acme").ok());

  EXPECT_EQ(store_.verify(nullptr, nullptr, "acme").refusal, "no_identity");
}

TEST_F(TrustTest, LeavesTheThreadsErrorQueueAsItFoundIt) {
  ERR_clear_error();
  Chain evil = load_chain(path("evil-n1") / "node.crt");
  Chain old = load_chain(path("acme-old") / "node.crt");
  EXPECT_FALSE(store_.verify(evil.leaf.get(), evil.rest.get(), "acme").ok());
  EXPECT_FALSE(store_.verify(old.leaf.get(), old.rest.get(), "acme").ok());
  EXPECT_EQ(ERR_peek_error(), 0u);
  TrustStore other;
  EXPECT_FALSE(other.pin_pem("acme", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n").ok());
  EXPECT_EQ(ERR_peek_error(), 0u);

  // An error queued by the caller stays there.
  ERR_raise(ERR_LIB_USER, 7);
  const unsigned long mine = ERR_peek_last_error();
  EXPECT_FALSE(store_.verify(evil.leaf.get(), evil.rest.get(), "acme").ok());
  EXPECT_EQ(ERR_peek_last_error(), mine);
  EXPECT_EQ(ERR_get_error(), mine);
  EXPECT_EQ(ERR_get_error(), 0u);
}

TEST_F(TrustTest, PinRefusesWhatIsNotOneSelfSignedCa) {
  TrustStore s;
  // The node certificate file holds two certificates.
  Status two = s.pin("acme", path("acme-n1") / "node.crt");
  ASSERT_FALSE(two.ok());
  EXPECT_EQ(two.error().code, Errc::invalid_argument);
  EXPECT_NE(two.error().message.find("exactly one certificate"), std::string::npos) << two.error().message;
  EXPECT_NE(two.error().message.find("node.crt"), std::string::npos) << two.error().message;

  // Only the leaf: not a CA.
  Chain n1 = load_chain(path("acme-n1") / "node.crt");
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, n1.leaf.get());
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  const std::string leaf_pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  Status leaf = s.pin_pem("acme", leaf_pem);
  ASSERT_FALSE(leaf.ok());
  EXPECT_NE(leaf.error().message.find("is not a CA certificate"), std::string::npos) << leaf.error().message;

  Status missing = s.pin("acme", path("nowhere.crt"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, Errc::invalid_argument);
  EXPECT_NE(missing.error().message.find("nowhere.crt"), std::string::npos) << missing.error().message;

  Status key_file = s.pin("acme", path("acme-ca") / "ca.key");
  ASSERT_FALSE(key_file.ok());
  EXPECT_NE(key_file.error().message.find("no PEM certificate"), std::string::npos)
      << key_file.error().message;
  EXPECT_FALSE(s.pin_pem("acme", "").ok());

  Status bad_name = s.pin("Acme", path("acme-ca") / "ca.crt");
  ASSERT_FALSE(bad_name.ok());
  EXPECT_NE(bad_name.error().message.find("'Acme'"), std::string::npos);

  EXPECT_FALSE(s.pinned("acme"));
  ASSERT_TRUE(s.pin_pem("acme", slurp(path("acme-ca") / "ca.crt")).ok());
  Status twice = s.pin("acme", path("evil-ca") / "ca.crt");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.error().message.find("domain acme has a pinned CA already"), std::string::npos)
      << twice.error().message;
  // The first pin stays in force.
  Chain evil = load_chain(path("evil-n1") / "node.crt");
  EXPECT_EQ(s.verify(evil.leaf.get(), nullptr, "acme").refusal, "untrusted_chain");
  EXPECT_TRUE(s.verify(n1.leaf.get(), nullptr, "acme").ok());
}

TEST_F(TrustTest, PinningADomainUnderAnotherNameTrustsOnlyItsOwnNodes) {
  // acme's CA pinned as "globex" does not make acme's nodes globex nodes:
  // the identity still names acme, which has no pin here.
  TrustStore s;
  ASSERT_TRUE(s.pin("globex", path("acme-ca") / "ca.crt").ok());
  Chain n1 = load_chain(path("acme-n1") / "node.crt");
  EXPECT_EQ(s.verify(n1.leaf.get(), nullptr, std::nullopt).refusal, "not_pinned");
}

TEST_F(TrustTest, MovedStoreKeepsItsPins) {
  TrustStore moved(std::move(store_));
  Chain n1 = load_chain(path("acme-n1") / "node.crt");
  EXPECT_TRUE(moved.verify(n1.leaf.get(), nullptr, "acme").ok());
  TrustStore assigned;
  assigned = std::move(moved);
  EXPECT_TRUE(assigned.pinned("globex"));
  EXPECT_TRUE(assigned.verify(n1.leaf.get(), nullptr, "acme").ok());
}

TEST_F(TrustTest, VerifiesConcurrentlyFromManyThreads) {
  Chain good = load_chain(path("acme-n1") / "node.crt");
  Chain evil = load_chain(path("evil-n1") / "node.crt");
  Chain globex = load_chain(path("globex-g1") / "node.crt");
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        if (!store_.verify(good.leaf.get(), good.rest.get(), "acme").ok()) ++wrong;
        if (store_.verify(evil.leaf.get(), evil.rest.get(), "acme").refusal != "untrusted_chain") ++wrong;
        if (store_.verify(globex.leaf.get(), nullptr, "acme").refusal != "wrong_domain") ++wrong;
        if (ERR_peek_error() != 0) ++wrong;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

}  // namespace
}  // namespace entente::certs
