// SIGHUP reloads a running node's configuration (issue 11, point 14), with
// real `entente broker` processes: API tokens, the API's TLS certificate,
// the federation's pinned CAs, peers and certificate change without a
// restart; what cannot change is named in the log and kept; a broken file
// changes nothing; the node keeps serving throughout and still stops
// cleanly.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "broker/config.h"
#include "http/client.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/federation.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// Replaces every `from` in the node's configuration file with `to`; fails
// the test when `from` is not there (the test would prove nothing).
void edit_config(const BrokerProcess& p, const std::string& from, const std::string& to) {
  std::string text = read_file(p.config_path());
  size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << "'" << from << "' is not in " << text;
  for (; at != std::string::npos; at = text.find(from, at + to.size())) text.replace(at, from.size(), to);
  write_file(p.config_path(), text);
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Sends SIGHUP and waits until the node logged the reload's outcome: "reload
// done" (or, with `expect_refused`, "reload refused"). The process must
// still be running afterwards.
void sighup(const BrokerProcess& p, bool expect_refused = false) {
  const std::string outcome = expect_refused ? "reload refused, nothing changed" : "reload done";
  const size_t before = count_of(p.stderr_text(), outcome);
  ASSERT_EQ(::kill(p.pid(), SIGHUP), 0);
  ASSERT_TRUE(eventually(20s, [&] { return count_of(p.stderr_text(), outcome) > before; }))
      << "no '" << outcome << "' after SIGHUP; stderr:\n"
      << p.stderr_text();
  ASSERT_EQ(::kill(p.pid(), 0), 0) << "the node is gone after SIGHUP";
}

unsigned status_with(const BrokerProcess& p, const std::string& token) {
  auto r = p.try_request("GET", "/v1/streams", "", token);
  return r.ok() ? r->status : 0;
}

TEST(BrokerReload, TokensChangeListenIsKeptAndABrokenFileChangesNothing) {
  BrokerProcess node;
  ASSERT_TRUE(node.start()) << node.last_error();
  auto created =
      node.request("POST", "/v1/streams", R"({"name":"bids","schema":[{"name":"price","type":"int64"}]})");
  ASSERT_EQ(created.status, 201u) << created.body;
  ASSERT_EQ(status_with(node, kAdminToken), 200u);

  // A new admin token replaces the old one; the listen address changes too,
  // which a running node cannot apply.
  const std::string rotated = "rotated-admin-token";
  edit_config(node, broker::hash_token(kAdminToken), broker::hash_token(rotated));
  edit_config(node, "\"listen\":\"127.0.0.1:0\"", "\"listen\":\"127.0.0.1:1\"");
  ASSERT_NO_FATAL_FAILURE(sighup(node));
  EXPECT_EQ(status_with(node, kAdminToken), 401u) << "the replaced token is still accepted";
  EXPECT_EQ(status_with(node, rotated), 200u) << "the new token is refused";
  EXPECT_EQ(status_with(node, kReaderToken), 200u) << "an unchanged token stopped working";
  const std::string log = node.stderr_text();
  EXPECT_NE(log.find("reload: token 'ops' replaced (admin)"), std::string::npos) << log;
  EXPECT_NE(log.find("reload: api.listen changed but is not reloaded; restart to apply it"),
            std::string::npos)
      << log;
  // Still on the port it had, with its data.
  auto streams = node.try_request("GET", "/v1/streams/bids", "", rotated);
  ASSERT_TRUE(streams.ok()) << streams.error().message;
  EXPECT_EQ(streams->status, 200u) << streams->body;

  // A file that does not parse, then one that parses but is invalid (no
  // admin token): nothing changes, the node says why and keeps serving.
  const std::string good = read_file(node.config_path());
  write_file(node.config_path(), good.substr(0, good.size() / 2));
  ASSERT_NO_FATAL_FAILURE(sighup(node, /*expect_refused=*/true));
  EXPECT_EQ(status_with(node, rotated), 200u);
  EXPECT_EQ(status_with(node, kAdminToken), 401u);
  write_file(node.config_path(), good);
  edit_config(node, "\"role\":\"admin\"", "\"role\":\"reader\"");
  ASSERT_NO_FATAL_FAILURE(sighup(node, /*expect_refused=*/true));
  EXPECT_NE(node.stderr_text().find("reload refused, nothing changed: " + node.config_path() + ": tokens"),
            std::string::npos)
      << node.stderr_text();
  EXPECT_EQ(status_with(node, rotated), 200u) << "an invalid file changed the tokens";

  // SIGTERM still stops it cleanly.
  EXPECT_EQ(node.terminate(), 0) << node.stderr_text();
}

// A TLS client that trusts only `ca_file` asks for /v1/health.
Result<http::ClientResponse> health_over_tls(const BrokerProcess& p, const std::string& ca_file) {
  http::ClientOptions o;
  o.port = p.port();
  o.tls = true;
  o.ca_file = ca_file;
  o.timeout_ms = 5000;
  ENTENTE_ASSIGN_OR_RETURN(auto c, http::Client::connect(o));
  return c->request("GET", "/v1/health");
}

TEST(BrokerReload, ApiCertificateIsReplacedForNewConnections) {
  // Certificates from `entente certs`: acme/n1 from acme's CA, and a second
  // certificate for acme/n1 from another CA, so that a client can tell which
  // one the node presents by which CA it trusts.
  Federation certs;
  FedNode& first = certs.add("acme");
  FedNode& second = certs.add_impostor("acme", "n1");
  BrokerOptions o;
  o.tls = true;
  o.cert_file = first.cert_file();
  o.key_file = first.key_file();
  o.ca_file = first.ca_file();
  BrokerProcess node(o);
  ASSERT_TRUE(node.start()) << node.last_error();
  auto before = health_over_tls(node, first.ca_file());
  ASSERT_TRUE(before.ok()) << before.error().message;
  EXPECT_EQ(before->status, 200u);
  // A connection opened before the reload is served after it.
  auto kept = http::Client::connect(node.client_options());
  ASSERT_TRUE(kept.ok()) << kept.error().message;

  edit_config(node, first.cert_file(), second.cert_file());
  edit_config(node, first.key_file(), second.key_file());
  ASSERT_NO_FATAL_FAILURE(sighup(node));
  EXPECT_NE(node.stderr_text().find("reload: API certificate " + second.cert_file() +
                                    ": new connections present the new one"),
            std::string::npos)
      << node.stderr_text();
  auto after = health_over_tls(node, second.ca_file());
  ASSERT_TRUE(after.ok()) << "a client trusting the new certificate's CA: " << after.error().message;
  EXPECT_EQ(after->status, 200u);
  auto old_ca = health_over_tls(node, first.ca_file());
  EXPECT_FALSE(old_ca.ok()) << "the node still presents the old certificate";
  auto on_kept = (*kept)->request("GET", "/v1/health");
  ASSERT_TRUE(on_kept.ok()) << on_kept.error().message;
  EXPECT_EQ(on_kept->status, 200u);

  // A key that does not belong to the certificate: refused, nothing changes.
  edit_config(node, second.key_file(), first.key_file());
  ASSERT_NO_FATAL_FAILURE(sighup(node, /*expect_refused=*/true));
  EXPECT_NE(node.stderr_text().find("reload refused, nothing changed: api.tls: key_file " + first.key_file()),
            std::string::npos)
      << node.stderr_text();
  auto still = health_over_tls(node, second.ca_file());
  ASSERT_TRUE(still.ok()) << still.error().message;
  EXPECT_EQ(still->status, 200u);
  EXPECT_EQ(node.terminate(), 0) << node.stderr_text();
}

// The SHA-256 fingerprint of the certificate a TLS server at `port`
// presents, as `openssl x509 -fingerprint` prints it; the client presents
// `client` (a peer node's certificate, as the peer-link listener wants one).
std::string presented_fingerprint(uint16_t port, const FedNode& client) {
  std::string out;
  run_command("openssl s_client -connect 127.0.0.1:" + std::to_string(port) + " -tls1_3 -cert " +
                  client.cert_file() + " -key " + client.key_file() +
                  " </dev/null 2>/dev/null | openssl x509 -noout -fingerprint -sha256 2>&1",
              out);
  return out;
}

std::string file_fingerprint(const std::string& cert_file) {
  std::string out;
  run_command("openssl x509 -noout -fingerprint -sha256 -in " + cert_file + " 2>&1", out);
  return out;
}

TEST(BrokerReload, PeersPinsAndTheLinkCertificateChangeWithoutARestart) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  FedNode& gamma = fed.add("gamma");
  // acme starts with a wrong pin for beta and without gamma.
  acme.pins(beta, beta.federation_address(), fed.impostor_ca("beta"));
  beta.pins(acme);
  gamma.pins(acme);
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  PeersView a;
  ASSERT_TRUE(eventually(15s,
                         [&] {
                           a = get_peers(acme.process());
                           return a.refusals["untrusted_chain"] >= 1 && a.refusals["not_pinned"] >= 1;
                         }))
      << "acme GET /v1/peers: " << a.body;
  EXPECT_EQ(a.find(gamma.identity()), nullptr) << a.body;

  // The right CA for beta, gamma as a new peer, and a new certificate for
  // acme's peer links (same CA, new key).
  const std::string fresh_dir = fed.dir() + "/acme-n1-renewed";
  std::string out;
  ASSERT_EQ(run_command(std::string(ENTENTE_BIN) + " certs issue-node acme n1 --ca " + fed.dir() +
                            "/acme-ca --san 127.0.0.1,localhost --out " + fresh_dir + " 2>&1",
                        out),
            0)
      << out;
  const std::string old_section = acme.federation_json();
  acme.pins(gamma);
  std::string new_section = acme.federation_json();
  for (const auto& [from, to] : {std::pair{fed.impostor_ca("beta"), beta.ca_file()},
                                 std::pair{acme.cert_file(), fresh_dir + "/node.crt"},
                                 std::pair{acme.key_file(), fresh_dir + "/node.key"}}) {
    const size_t at = new_section.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    new_section.replace(at, from.size(), to);
  }
  ASSERT_NO_FATAL_FAILURE(edit_config(acme.process(), old_section, new_section));
  const uint16_t api_port = acme.process().port();
  ASSERT_NO_FATAL_FAILURE(sighup(acme.process()));
  const std::string log = acme.process().stderr_text();
  EXPECT_NE(log.find("reload: peer " + gamma.identity() + " added at " + gamma.federation_address()),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("reload: pinned CA of domain beta replaced"), std::string::npos) << log;
  EXPECT_NE(log.find("reload: domain gamma pinned"), std::string::npos) << log;
  EXPECT_NE(log.find("reload: federation certificate " + fresh_dir + "/node.crt"), std::string::npos) << log;

  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta));
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, gamma));
  // The peer-link listener presents the renewed certificate.
  EXPECT_EQ(presented_fingerprint(acme.federation_port(), beta), file_fingerprint(fresh_dir + "/node.crt"));
  EXPECT_NE(file_fingerprint(fresh_dir + "/node.crt"), file_fingerprint(acme.cert_file()));
  EXPECT_EQ(acme.process().port(), api_port);

  // A CA file that is not a CA: refused, the links stay up.
  ASSERT_NO_FATAL_FAILURE(edit_config(acme.process(), beta.ca_file(), beta.cert_file()));
  ASSERT_NO_FATAL_FAILURE(sighup(acme.process(), /*expect_refused=*/true));
  EXPECT_NE(acme.process().stderr_text().find("reload refused, nothing changed: federation.peers["),
            std::string::npos)
      << acme.process().stderr_text();
  a = get_peers(acme.process());
  EXPECT_EQ(a.state_of(beta.identity()), "up") << a.body;
  EXPECT_EQ(a.state_of(gamma.identity()), "up") << a.body;
  EXPECT_EQ(acme.process().terminate(), 0) << acme.process().stderr_text();
}

}  // namespace
}  // namespace entente::testing
