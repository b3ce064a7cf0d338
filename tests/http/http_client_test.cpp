// The clients' TLS verification and error reporting, the server's TLS
// credential checks, and the transport's small pure functions.

#include <gtest/gtest.h>

#include <string>

#include "tests/http/http_test_certs.h"
#include "tests/http/http_test_support.h"

namespace entente::http {
namespace {

using testing::client_options;
using testing::plain_options;
using testing::start_server;
using testing::TestHandler;
using testing::TestPki;

ServerOptions tls_options(const TestPki& pki) {
  auto o = plain_options();
  o.tls = true;
  o.cert_file = pki.cert_file;
  o.key_file = pki.key_file;
  return o;
}

TEST(HttpClient, TlsRequestVerifiedByIpAddress) {
  TestPki pki;
  TestHandler handler;
  auto server = start_server(tls_options(pki), handler);
  ASSERT_NE(server, nullptr);
  auto o = client_options(*server);
  o.tls = true;
  o.ca_file = pki.ca_file;
  auto client = Client::connect(o);
  ASSERT_TRUE(client.ok()) << client.error().message;
  for (int i = 0; i < 3; ++i) {
    auto r = (*client)->request("POST", "/inspect", "tls body", "text/plain");
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->status, 200u);
    EXPECT_EQ(r->body, "POST|/inspect||text/plain|-|tls body|local");
  }
  EXPECT_EQ(server->stats().connections_accepted, 1u);
}

TEST(HttpClient, TlsVerifiedByHostName) {
  TestPki pki;
  TestHandler handler;
  auto server = start_server(tls_options(pki), handler);
  ASSERT_NE(server, nullptr);
  auto o = client_options(*server);
  o.tls = true;
  o.ca_file = pki.ca_file;
  o.server_name = "localhost";
  auto client = Client::connect(o);
  ASSERT_TRUE(client.ok()) << client.error().message;
  auto r = (*client)->request("GET", "/hello");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 200u);
}

TEST(HttpClient, WrongCaFailsWithAClearError) {
  TestPki pki;
  TestHandler handler;
  auto server = start_server(tls_options(pki), handler);
  ASSERT_NE(server, nullptr);
  auto o = client_options(*server);
  o.tls = true;
  o.ca_file = pki.other_ca_file;
  auto client = Client::connect(o);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.error().code, Errc::io_error);
  EXPECT_NE(client.error().message.find("TLS handshake"), std::string::npos)
      << client.error().message;
  EXPECT_NE(client.error().message.find("certificate verify failed"), std::string::npos)
      << client.error().message;
  auto ws = WsClient::connect(o, "/ws/echo");
  ASSERT_FALSE(ws.ok());
  EXPECT_NE(ws.error().message.find("certificate verify failed"), std::string::npos);
  EXPECT_EQ(handler.requests.load(), 0);
  EXPECT_TRUE(testing::wait_until([&] { return server->stats().tls_handshake_failures == 2; }));
  // Without verification the same server is reachable.
  o.verify_peer = false;
  auto unverified = Client::connect(o);
  ASSERT_TRUE(unverified.ok()) << unverified.error().message;
  EXPECT_TRUE((*unverified)->request("GET", "/hello").ok());
}

TEST(HttpClient, NameMismatchFails) {
  TestPki pki;
  TestHandler handler;
  auto server = start_server(tls_options(pki), handler);
  ASSERT_NE(server, nullptr);
  auto o = client_options(*server);
  o.tls = true;
  o.ca_file = pki.ca_file;
  o.server_name = "other.example";
  auto client = Client::connect(o);
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.error().message.find("hostname mismatch"), std::string::npos)
      << client.error().message;
}

TEST(HttpClient, PlainClientAgainstTlsServerFails) {
  TestPki pki;
  TestHandler handler;
  auto server = start_server(tls_options(pki), handler);
  ASSERT_NE(server, nullptr);
  auto client = Client::connect(client_options(*server));
  ASSERT_TRUE(client.ok());  // TCP connects; the handshake fails on the server
  auto r = (*client)->request("GET", "/hello");
  EXPECT_FALSE(r.ok());
  EXPECT_TRUE(testing::wait_until([&] { return server->stats().tls_handshake_failures == 1; }));
}

TEST(HttpClient, UnreadableCredentialsNameTheFileAndReason) {
  TestPki pki;
  TestHandler handler;
  auto o = tls_options(pki);
  o.cert_file = pki.path("missing.pem");
  auto missing = Server::create(o, handler);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, Errc::invalid_argument);
  EXPECT_NE(missing.error().message.find("missing.pem"), std::string::npos);
  EXPECT_NE(missing.error().message.find("No such file"), std::string::npos)
      << missing.error().message;

  o = tls_options(pki);
  o.key_file = pki.write_text("garbage.key", "not a key\n");
  auto garbage = Server::create(o, handler);
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.error().message.find("key_file"), std::string::npos);
  EXPECT_NE(garbage.error().message.find("garbage.key"), std::string::npos)
      << garbage.error().message;

  o = tls_options(pki);
  o.cert_file = pki.write_text("garbage.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n");
  auto bad_cert = Server::create(o, handler);
  ASSERT_FALSE(bad_cert.ok());
  EXPECT_NE(bad_cert.error().message.find("garbage.pem"), std::string::npos);

  o = tls_options(pki);
  o.cert_file = pki.ca_file;  // a certificate that does not match the key
  auto mismatch = Server::create(o, handler);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.error().message.find("does not match"), std::string::npos)
      << mismatch.error().message;
}

TEST(HttpClient, ConnectRefusedIsIoError) {
  TestHandler handler;
  uint16_t port = 0;
  {
    auto server = start_server(plain_options(), handler);
    ASSERT_NE(server, nullptr);
    port = server->port();
  }
  ClientOptions o;
  o.port = port;
  auto client = Client::connect(o);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.error().code, Errc::io_error);
  EXPECT_NE(client.error().message.find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << client.error().message;
}

TEST(HttpClient, RejectsInvalidRequestParts) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto client = Client::connect(client_options(*server));
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->request("GET", "/a b").error().code, Errc::invalid_argument);
  EXPECT_EQ((*client)->request("GE T", "/").error().code, Errc::invalid_argument);
  EXPECT_EQ((*client)->request("GET", "/", {}, "", {{"X-A", "v\r\nInjected: 1"}}).error().code,
            Errc::invalid_argument);
  auto ok = (*client)->request("GET", "/hello");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
}

TEST(HttpClient, LoopbackAddresses) {
  EXPECT_TRUE(is_loopback_address("127.0.0.1"));
  EXPECT_TRUE(is_loopback_address("127.1.2.3"));
  EXPECT_TRUE(is_loopback_address("::1"));
  EXPECT_TRUE(is_loopback_address("[::1]"));
  EXPECT_TRUE(is_loopback_address("localhost"));
  EXPECT_TRUE(is_loopback_address("::ffff:127.0.0.1"));
  EXPECT_FALSE(is_loopback_address("0.0.0.0"));
  EXPECT_FALSE(is_loopback_address("10.0.0.1"));
  EXPECT_FALSE(is_loopback_address("::"));
  EXPECT_FALSE(is_loopback_address("128.0.0.1"));
  EXPECT_FALSE(is_loopback_address("localhost.example"));
  EXPECT_FALSE(is_loopback_address(""));
}

TEST(HttpClient, ProblemEscapesControlCharactersAndInvalidUtf8) {
  auto p = Response::problem(400, "Bad \"input\"", std::string("tab\there \x01 \xff end"));
  EXPECT_EQ(p.status, 400u);
  EXPECT_EQ(p.content_type, "application/problem+json");
  EXPECT_EQ(p.body,
            "{\"type\":\"about:blank\",\"title\":\"Bad \\\"input\\\"\",\"status\":400,"
            "\"detail\":\"tab\\there \\u0001 \xEF\xBF\xBD end\"}");
  auto j = Response::json(201, "{}");
  EXPECT_EQ(j.status, 201u);
  EXPECT_EQ(j.content_type, "application/json");
  EXPECT_EQ(j.body, "{}");
}

TEST(HttpClient, RequestAccessors) {
  Request r;
  r.query = {{"from", "3"}, {"from", "4"}};
  r.headers = {{"authorization", "Bearer x"}};
  EXPECT_EQ(r.param("from").value_or(""), "3");
  EXPECT_FALSE(r.param("to").has_value());
  EXPECT_EQ(r.header("authorization").value_or(""), "Bearer x");
  EXPECT_FALSE(r.header("Authorization").has_value());
}

}  // namespace
}  // namespace entente::http
