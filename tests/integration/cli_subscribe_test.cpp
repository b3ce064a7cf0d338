// `entente subscribe` as a user runs it, against real nodes (issue 11,
// point 17): when it cannot follow the stream it says what failed and what
// to pass, on stderr, with exit status 1 (2 for a usage error), instead of
// the node's bare answer ("HTTP 500:").
#include <gtest/gtest.h>

#include <string>

#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/federation.h"

namespace entente::testing {
namespace {

struct CliRun {
  int code = -1;
  std::string err;
};

// Runs `entente subscribe ARGS` with ENTENTE_TOKEN=`token` ("" for unset);
// stdout is discarded, stderr kept.
CliRun subscribe(const std::string& args, const std::string& token) {
  CliRun r;
  const std::string env = token.empty() ? "env -u ENTENTE_TOKEN " : "ENTENTE_TOKEN=" + token + " ";
  r.code = run_command(
      env + ENTENTE_BIN + " subscribe --timeout-ms 500 --count 1 " + args + " 2>&1 >/dev/null", r.err);
  return r;
}

bool has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

class SubscribeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    node_ = &certs_.add("acme");
    BrokerOptions o;
    o.tls = true;
    o.cert_file = node_->cert_file();
    o.key_file = node_->key_file();
    o.ca_file = node_->ca_file();
    tls_ = std::make_unique<BrokerProcess>(o);
    ASSERT_TRUE(tls_->start()) << tls_->last_error();
    plain_ = std::make_unique<BrokerProcess>();
    ASSERT_TRUE(plain_->start()) << plain_->last_error();
    for (BrokerProcess* p : {tls_.get(), plain_.get()}) {
      auto r =
          p->request("POST", "/v1/streams", R"({"name":"bids","schema":[{"name":"price","type":"int64"}]})");
      ASSERT_EQ(r.status, 201u) << r.body;
    }
  }

  std::string tls_port() const { return std::to_string(tls_->port()); }
  std::string plain_port() const { return std::to_string(plain_->port()); }

  Federation certs_;
  FedNode* node_ = nullptr;
  std::unique_ptr<BrokerProcess> tls_, plain_;
};

TEST_F(SubscribeCli, WithoutTlsAgainstATlsNodeSaysToPassTls) {
  CliRun r = subscribe("--port " + tls_port() + " bids", kReaderToken);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_TRUE(has(r.err, "the node at 127.0.0.1:" + tls_port() + " answered with TLS; pass --tls")) << r.err;
  EXPECT_TRUE(has(r.err, "--ca FILE")) << r.err;
  EXPECT_FALSE(has(r.err, "HTTP 500")) << r.err;
}

TEST_F(SubscribeCli, TlsOptionsThatDoNotFitTheNodeAreNamed) {
  // Right scheme, right CA: it works (the stream is empty, so it times out
  // and exits 0).
  CliRun ok = subscribe("--tls --ca " + node_->ca_file() + " --port " + tls_port() + " bids", kReaderToken);
  EXPECT_EQ(ok.code, 0) << ok.err;
  // No CA: the node's certificate is not trusted.
  CliRun no_ca = subscribe("--tls --port " + tls_port() + " bids", kReaderToken);
  EXPECT_EQ(no_ca.code, 1) << no_ca.err;
  EXPECT_TRUE(has(no_ca.err, "the node's certificate is not trusted")) << no_ca.err;
  EXPECT_TRUE(has(no_ca.err, "pass --ca FILE")) << no_ca.err;
  // A CA file that does not exist.
  CliRun missing = subscribe("--tls --ca /nonexistent/ca.crt --port " + tls_port() + " bids", kReaderToken);
  EXPECT_EQ(missing.code, 2) << missing.err;
  EXPECT_TRUE(has(missing.err, "--ca /nonexistent/ca.crt: No such file or directory")) << missing.err;
  // --tls against a plain HTTP node.
  CliRun plain =
      subscribe("--tls --ca " + node_->ca_file() + " --port " + plain_port() + " bids", kReaderToken);
  EXPECT_EQ(plain.code, 1) << plain.err;
  EXPECT_TRUE(has(plain.err, "speaks plain HTTP, not TLS; drop --tls")) << plain.err;
}

TEST_F(SubscribeCli, TokenStreamAndAddressProblemsAreNamed) {
  CliRun no_token = subscribe("--port " + plain_port() + " bids", "");
  EXPECT_EQ(no_token.code, 1) << no_token.err;
  EXPECT_TRUE(has(no_token.err, "needs a token: set ENTENTE_TOKEN")) << no_token.err;
  CliRun bad_token = subscribe("--port " + plain_port() + " bids", "not-a-token");
  EXPECT_EQ(bad_token.code, 1) << bad_token.err;
  EXPECT_TRUE(has(bad_token.err, "refused the token in ENTENTE_TOKEN")) << bad_token.err;
  CliRun no_stream = subscribe("--port " + plain_port() + " asks", kReaderToken);
  EXPECT_EQ(no_stream.code, 1) << no_stream.err;
  EXPECT_TRUE(has(no_stream.err, "no stream asks on the node at 127.0.0.1:" + plain_port())) << no_stream.err;
  // A port where nothing listens (a free port, bound and released).
  const std::string closed = std::to_string(free_loopback_port());
  CliRun nobody = subscribe("--port " + closed + " bids", kReaderToken);
  EXPECT_EQ(nobody.code, 1) << nobody.err;
  EXPECT_TRUE(has(nobody.err, "nothing listens at 127.0.0.1:" + closed)) << nobody.err;
  CliRun bad_port = subscribe("--port 70000 bids", kReaderToken);
  EXPECT_EQ(bad_port.code, 2) << bad_port.err;
  EXPECT_TRUE(has(bad_port.err, "--port '70000' is not a port")) << bad_port.err;
}

}  // namespace
}  // namespace entente::testing
