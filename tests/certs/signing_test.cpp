// Signer and verify_signature: both key types, every way a signature can be
// refused, and the load-time checks of a node's key and certificate.

#include "certs/signing.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>

namespace entente::certs {
namespace {

namespace fs = std::filesystem;

class SigningTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::random_device rd;
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("entente-signing-" + std::to_string(rd()) + std::to_string(rd())));
    const fs::path& d = *dir_;
    ASSERT_TRUE(init_domain("beta", d / "beta-ca").ok());
    ASSERT_TRUE(init_domain("acme", d / "acme-ca").ok());
    ASSERT_TRUE(init_domain("beta", d / "evil-ca").ok());  // not pinned anywhere
    ASSERT_TRUE(issue_node("beta", "n1", d / "beta-ca", d / "beta-n1").ok());
    NodeOptions ed;
    ed.key = KeyType::ed25519;
    ASSERT_TRUE(issue_node("beta", "n2", d / "beta-ca", d / "beta-n2", ed).ok());
    ASSERT_TRUE(issue_node("acme", "n1", d / "acme-ca", d / "acme-n1").ok());
    ASSERT_TRUE(issue_node("beta", "n1", d / "evil-ca", d / "evil-n1").ok());
    NodeOptions old;
    old.not_before = Clock::from_time_t(1700000000);  // 2023-11-14
    old.days = 30;
    ASSERT_TRUE(issue_node("beta", "old", d / "beta-ca", d / "beta-old", old).ok());
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  void SetUp() override {
    ASSERT_TRUE(trust_.pin("beta", *dir_ / "beta-ca" / "ca.crt").ok());
    ASSERT_TRUE(trust_.pin("acme", *dir_ / "acme-ca" / "ca.crt").ok());
  }
  static Signer load(const std::string& node_dir) {
    auto s = Signer::load(*dir_ / node_dir / "node.key", *dir_ / node_dir / "node.crt");
    EXPECT_TRUE(s.ok()) << s.error().message;
    return std::move(s).value();
  }

  static fs::path* dir_;
  TrustStore trust_;
};
fs::path* SigningTest::dir_ = nullptr;

constexpr std::string_view kMessage = R"({"id":"c-0123456789abcdef","version":3})";

TEST_F(SigningTest, EcdsaSignsAndVerifies) {
  Signer s = load("beta-n1");
  EXPECT_EQ(s.identity(), (Identity{"beta", "n1"}));
  auto sig = s.sign(kMessage);
  ASSERT_TRUE(sig.ok()) << sig.error().message;
  EXPECT_EQ(sig->domain, "beta");
  EXPECT_EQ(sig->node, "n1");
  EXPECT_EQ(sig->algorithm, "ecdsa-p256-sha256");
  EXPECT_NE(sig->certificate.find("BEGIN CERTIFICATE"), std::string::npos);
  // The leaf only: the CA copy in node.crt is not carried.
  EXPECT_EQ(sig->certificate.find("BEGIN CERTIFICATE"), sig->certificate.rfind("BEGIN CERTIFICATE"));
  Status v = verify_signature(trust_, *sig, kMessage);
  EXPECT_TRUE(v.ok()) << v.error().message;
}

TEST_F(SigningTest, Ed25519SignsAndVerifies) {
  Signer s = load("beta-n2");
  EXPECT_EQ(s.algorithm(), "ed25519");
  auto sig = s.sign(kMessage);
  ASSERT_TRUE(sig.ok());
  EXPECT_EQ(sig->algorithm, "ed25519");
  EXPECT_EQ(base64_decode(sig->value)->size(), 64u);
  EXPECT_TRUE(verify_signature(trust_, *sig, kMessage).ok());
  // Ed25519 is deterministic: the same message signs to the same bytes.
  EXPECT_EQ(s.sign(kMessage)->value, sig->value);
}

TEST_F(SigningTest, FlippedMessageByteFails) {
  for (const char* node : {"beta-n1", "beta-n2"}) {
    auto sig = load(node).sign(kMessage);
    ASSERT_TRUE(sig.ok());
    std::string other(kMessage);
    other[other.size() - 2] = '4';
    Status v = verify_signature(trust_, *sig, other);
    ASSERT_FALSE(v.ok()) << node;
    EXPECT_EQ(v.error().code, Errc::permission_denied);
    EXPECT_EQ(v.error().message, "signature of beta/" + std::string(node).substr(5) + " does not verify");
  }
}

TEST_F(SigningTest, FlippedSignatureByteFails) {
  for (const char* node : {"beta-n1", "beta-n2"}) {
    auto sig = load(node).sign(kMessage);
    ASSERT_TRUE(sig.ok());
    std::string raw = *base64_decode(sig->value);
    raw[raw.size() / 2] = static_cast<char>(raw[raw.size() / 2] ^ 0x01);
    sig->value = base64_encode(raw);
    Status v = verify_signature(trust_, *sig, kMessage);
    ASSERT_FALSE(v.ok()) << node;
    EXPECT_EQ(v.error().code, Errc::permission_denied);
    EXPECT_NE(v.error().message.find("does not verify"), std::string::npos) << v.error().message;
  }
}

TEST_F(SigningTest, NodeOfAnotherDomainClaimingThisDomainFails) {
  auto sig = load("acme-n1").sign(kMessage);
  ASSERT_TRUE(sig.ok());
  sig->domain = "beta";
  Status v = verify_signature(trust_, *sig, kMessage);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.error().code, Errc::permission_denied);
  EXPECT_NE(v.error().message.find("certificate of beta/n1 is not trusted"), std::string::npos)
      << v.error().message;
  EXPECT_NE(v.error().message.find("expected domain beta"), std::string::npos) << v.error().message;
}

TEST_F(SigningTest, SignerNodeMustMatchCertificate) {
  auto sig = load("beta-n1").sign(kMessage);
  ASSERT_TRUE(sig.ok());
  sig->node = "n9";
  Status v = verify_signature(trust_, *sig, kMessage);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.error().message, "certificate of beta/n9 belongs to beta/n1");
}

TEST_F(SigningTest, CertificateFromUnpinnedCaFails) {
  auto sig = load("evil-n1").sign(kMessage);
  ASSERT_TRUE(sig.ok());
  Status v = verify_signature(trust_, *sig, kMessage);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.error().code, Errc::permission_denied);
  EXPECT_NE(v.error().message.find("certificate of beta/n1 is not trusted"), std::string::npos);
  EXPECT_NE(v.error().message.find("does not chain to the pinned CA of domain beta"), std::string::npos)
      << v.error().message;
}

TEST_F(SigningTest, ExpiredCertificateFails) {
  auto sig = load("beta-old").sign(kMessage);
  ASSERT_TRUE(sig.ok());
  Status v = verify_signature(trust_, *sig, kMessage);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("certificate of beta/old is not trusted"), std::string::npos);
  EXPECT_NE(v.error().message.find("expired at 2023-12-14T22:13:20Z"), std::string::npos) << v.error().message;
}

TEST_F(SigningTest, BadBase64Fails) {
  auto sig = load("beta-n1").sign(kMessage);
  ASSERT_TRUE(sig.ok());
  for (std::string bad : {sig->value.substr(1), sig->value + "\n", std::string("-_-_"), std::string(""),
                          std::string("QQ=A")}) {
    Signature s = *sig;
    s.value = bad;
    Status v = verify_signature(trust_, s, kMessage);
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_EQ(v.error().code, Errc::permission_denied);
    EXPECT_NE(v.error().message.find("signature of beta/n1: bad base64"), std::string::npos)
        << v.error().message;
  }
}

TEST_F(SigningTest, UnknownOrMismatchedAlgorithmFails) {
  auto sig = load("beta-n1").sign(kMessage);
  ASSERT_TRUE(sig.ok());
  Signature s = *sig;
  s.algorithm = "rsa-pss";
  Status v = verify_signature(trust_, s, kMessage);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.error().message, "unknown signature algorithm 'rsa-pss'");
  s.algorithm = "ed25519";  // the certificate holds an EC key
  v = verify_signature(trust_, s, kMessage);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("not the certificate's key type"), std::string::npos);
}

TEST_F(SigningTest, OversizedFieldsAreRefused) {
  auto sig = load("beta-n1").sign(kMessage);
  ASSERT_TRUE(sig.ok());
  Signature s = *sig;
  s.value = std::string(2000, 'A');
  EXPECT_EQ(verify_signature(trust_, s, kMessage).error().code, Errc::limit_exceeded);
  s = *sig;
  s.certificate = std::string(20000, 'A');
  EXPECT_EQ(verify_signature(trust_, s, kMessage).error().code, Errc::limit_exceeded);
  EXPECT_EQ(verify_signature(trust_, *sig, std::string(kMaxSignedMessageBytes + 1, 'x')).error().code,
            Errc::limit_exceeded);
  s = *sig;
  s.certificate = "not a certificate";
  EXPECT_EQ(verify_signature(trust_, s, kMessage).error().code, Errc::permission_denied);
}

TEST_F(SigningTest, KeyNotMatchingCertificateIsRefusedAtLoad) {
  auto s = Signer::load(*dir_ / "beta-n2" / "node.key", *dir_ / "beta-n1" / "node.crt");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::invalid_argument);
  EXPECT_NE(s.error().message.find("beta-n2/node.key is not the key of the certificate in"), std::string::npos)
      << s.error().message;
}

TEST_F(SigningTest, UnreadableFilesAreRefusedAtLoad) {
  auto s = Signer::load(*dir_ / "nope" / "node.key", *dir_ / "beta-n1" / "node.crt");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Errc::invalid_argument);
  EXPECT_NE(s.error().message.find("nope/node.key"), std::string::npos);
  // A certificate file handed in as the key.
  s = Signer::load(*dir_ / "beta-n1" / "node.crt", *dir_ / "beta-n1" / "node.crt");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("is not an unencrypted PEM private key"), std::string::npos);
  // The CA certificate has no entente:// identity.
  s = Signer::load(*dir_ / "beta-ca" / "ca.key", *dir_ / "beta-ca" / "ca.crt");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("carries 0 entente:// identities"), std::string::npos) << s.error().message;
}

TEST(Base64, RoundTripsAndIsStrict) {
  EXPECT_EQ(base64_encode(""), "");
  EXPECT_EQ(base64_encode("f"), "Zg==");
  EXPECT_EQ(base64_encode("fo"), "Zm8=");
  EXPECT_EQ(base64_encode("foo"), "Zm9v");
  EXPECT_EQ(base64_encode("foob"), "Zm9vYg==");
  EXPECT_EQ(base64_encode(std::string("\xff\xfe\x00", 3)), "//4A");
  EXPECT_EQ(*base64_decode("Zm9vYg=="), "foob");
  EXPECT_EQ(*base64_decode("//4A"), std::string("\xff\xfe\x00", 3));
  EXPECT_FALSE(base64_decode("Zm9vYg").ok());   // no padding
  EXPECT_FALSE(base64_decode("Zm9vYh==").ok());  // non-zero bits under the padding
  EXPECT_FALSE(base64_decode("Zm=v").ok());
  EXPECT_FALSE(base64_decode("Zm9 ").ok());
}

}  // namespace
}  // namespace entente::certs
