// The API over HTTPS with the node's certificate, against a real broker
// process: clients that trust the node's CA get through (HTTP, WebSocket,
// curl); a client that trusts another CA, or speaks plain HTTP, does not,
// and the failed handshakes are counted.
#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>

#include "tests/http/http_test_certs.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

class BrokerTls : public ::testing::Test {
 protected:
  static BrokerOptions tls_options(const http::testing::TestPki& pki) {
    BrokerOptions o;
    o.tls = true;
    o.cert_file = pki.cert_file;
    o.key_file = pki.key_file;
    o.ca_file = pki.ca_file;
    return o;
  }
  void SetUp() override { ASSERT_TRUE(broker_.start()) << broker_.last_error(); }
  http::testing::TestPki pki_;
  BrokerProcess broker_{tls_options(pki_)};
};

TEST_F(BrokerTls, TrustedClientsGetThrough) {
  EXPECT_EQ(broker_.request("GET", "/v1/health", "", "").status, 200u);
  ASSERT_EQ(broker_.request("POST", "/v1/streams", R"({"name":"t","schema":[{"name":"a","type":"int64"}]})").status,
            201u);
  ASSERT_EQ(broker_.request("POST", "/v1/streams/t/tuples", "[{\"a\":1},{\"a\":2}]", kPublisherToken).status, 200u);
  auto r = read_stream(broker_, "t", 1, 2);
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.tuples.size(), 2u);
  std::string out;
  ASSERT_EQ(run_command("curl -sS -f --cacert " + pki_.ca_file + " https://127.0.0.1:" +
                            std::to_string(broker_.port()) + "/v1/health",
                        out),
            0)
      << out;
  EXPECT_NE(out.find("\"status\":\"ok\""), std::string::npos);
}

TEST_F(BrokerTls, UntrustedOrPlainClientsAreRefused) {
  auto o = broker_.client_options();
  o.ca_file = pki_.other_ca_file;
  auto c = http::Client::connect(o);
  if (c.ok()) {
    auto r = (*c)->request("GET", "/v1/health");
    EXPECT_FALSE(r.ok());
  }
  o = broker_.client_options();
  o.tls = false;
  auto plain = http::Client::connect(o);
  if (plain.ok()) {
    auto r = (*plain)->request("GET", "/v1/health");
    EXPECT_TRUE(!r.ok() || r->status != 200);
  }
  // curl without the CA refuses the node's certificate.
  std::string out;
  EXPECT_NE(run_command("curl -sS -f https://127.0.0.1:" + std::to_string(broker_.port()) + "/v1/health 2>&1", out), 0);
  // The node keeps serving and counted the failed handshakes.
  auto m = broker_.request("GET", "/metrics", "", kReaderToken);
  ASSERT_EQ(m.status, 200u);
  EXPECT_NE(m.body.find("entente_api_tls_handshake_failures_total"), std::string::npos);
  EXPECT_EQ(m.body.find("entente_api_tls_handshake_failures_total 0\n"), std::string::npos) << m.body;
}

// Issue 11, point 10: the API speaks TLS 1.3, and TLS 1.2 only with ECDHE
// key exchange and an AEAD cipher (docs/api.md). Every TLS 1.2 suite that
// the node's ECDSA certificate could serve is tried alone with OpenSSL's own
// client: exactly the AES-GCM and ChaCha20-Poly1305 ones get through; the
// CBC ones (ECDHE-ECDSA-AES128-SHA, -SHA256, -SHA384 ...) are refused.
TEST_F(BrokerTls, OffersTls13AndOnlyAeadSuitesOfTls12) {
  const std::string s_client = "echo | timeout 20 openssl s_client -connect 127.0.0.1:" +
                               std::to_string(broker_.port()) + " -CAfile " + pki_.ca_file + " ";
  // The negotiated "TLSv1.x, Cipher is NAME", or "" when no handshake
  // ("New, (NONE), Cipher is (NONE)"). The exit status is not used: it may
  // be 1 after a handshake that worked, when the node answers the client's
  // close with a reset.
  auto negotiated = [&](const std::string& args) {
    std::string out;
    run_command(s_client + args + " 2>&1", out);
    const auto at = out.find("New, TLSv1.");
    if (at == std::string::npos) return std::string();
    std::string line = out.substr(at + 5, out.find('\n', at) - at - 5);
    return line.find("(NONE)") == std::string::npos ? line : std::string();
  };
  EXPECT_EQ(negotiated("-tls1_3").rfind("TLSv1.3, Cipher is TLS_", 0), 0u);
  EXPECT_EQ(negotiated("-tls1_1"), "");
  std::string list;
  ASSERT_EQ(run_command("openssl ciphers -tls1_2 aECDSA", list), 0) << list;
  std::set<std::string> offered;
  int tried = 0;
  std::istringstream suites(list.substr(0, list.find('\n')));
  for (std::string suite; std::getline(suites, suite, ':');) {
    if (suite.rfind("TLS_", 0) == 0) continue;  // a TLS 1.3 suite
    ++tried;
    const std::string got = negotiated("-tls1_2 -cipher " + suite);
    if (!got.empty()) {
      EXPECT_EQ(got, "TLSv1.2, Cipher is " + suite);
      offered.insert(suite);
    }
  }
  EXPECT_GE(tried, 6);
  EXPECT_EQ(offered, (std::set<std::string>{"ECDHE-ECDSA-AES128-GCM-SHA256",
                                            "ECDHE-ECDSA-AES256-GCM-SHA384",
                                            "ECDHE-ECDSA-CHACHA20-POLY1305"}));
  // A client offering only CBC suites is refused, and the node keeps serving.
  EXPECT_EQ(negotiated("-tls1_2 -cipher ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA:"
                       "ECDHE-ECDSA-AES128-SHA256:ECDHE-ECDSA-AES256-SHA384"),
            "");
  EXPECT_EQ(broker_.request("GET", "/v1/health", "", "").status, 200u);
}

}  // namespace
}  // namespace entente::testing
