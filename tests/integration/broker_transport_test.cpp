// The API and federation listeners of real broker processes against a
// client that controls every byte (tests/support/raw_tcp.h): requests whose
// framing cannot be trusted are refused before their body is read, so a
// request hidden in a body never runs; HTTP/1.1 without Host and malformed
// WebSocket handshakes are refused with problem+json; and a flood of idle
// connections from one address locks out neither a client nor a peer.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/federation.h"
#include "tests/support/raw_tcp.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;

// A counter's value in GET /metrics (`labels` as written there, e.g.
// "{reason=\"handshake\"}"); -1 when absent.
double metric(const BrokerProcess& b, const std::string& name, const std::string& labels = "") {
  auto r = b.try_request("GET", "/metrics", "", kReaderToken);
  if (!r.ok() || r->status != 200) return -1;
  const std::string key = "\n" + name + labels + " ";
  const std::string text = "\n" + r->body;
  const auto at = text.find(key);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + key.size()));
}

std::string status_line(const std::string& response) {
  return response.substr(0, response.find("\r\n"));
}

// What a client sees when its request is refused: one response, the status,
// problem+json, and the connection closed after it.
void expect_refused(const RawExchange& x, unsigned status) {
  ASSERT_TRUE(x.connected);
  EXPECT_TRUE(x.closed) << "the connection stayed open after: " << x.received;
  EXPECT_EQ(count_responses(x.received), 1) << x.received;
  EXPECT_EQ(x.received.rfind("HTTP/1.1 " + std::to_string(status) + " ", 0), 0u) << x.received;
  EXPECT_NE(x.received.find("Content-Type: application/problem+json"), std::string::npos)
      << x.received;
  EXPECT_NE(x.received.find("\"status\":" + std::to_string(status)), std::string::npos)
      << x.received;
}

// RFC 9112 §6.1 (issue 11, point 4). A POST whose Transfer-Encoding the
// server does not implement, or that has Transfer-Encoding and
// Content-Length both, carries an admin's "create stream" request in its
// body. Before the fix the body was read as the next request on the
// connection and the stream was created.
TEST(BrokerTransport, RequestHiddenInABodyWithUnusableFramingNeverRuns) {
  BrokerProcess broker;
  ASSERT_TRUE(broker.start()) << broker.last_error();
  const std::string auth = std::string("Authorization: Bearer ") + kAdminToken + "\r\n";
  struct Case {
    std::string framing;
    unsigned status;
  };
  const Case cases[] = {
      {"Transfer-Encoding: gzip\r\n", 400},
      {"Transfer-Encoding: xchunked\r\n", 400},
      {"Transfer-Encoding: chunked, identity\r\n", 400},
      {"Transfer-Encoding: gzip, chunked\r\n", 501},
      {"Transfer-Encoding: gzip\r\nContent-Length: 0\r\n", 400},
      {"Content-Length: 0\r\nTransfer-Encoding: gzip\r\n", 400},
  };
  int n = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.framing);
    const std::string name = "smuggled" + std::to_string(n++);
    const std::string body = R"({"name":")" + name + R"(","schema":[{"name":"a","type":"int64"}]})";
    const std::string hidden = "POST /v1/streams HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
                               "Content-Type: application/json\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body;
    auto x = raw_exchange(broker.port(), "POST /v1/streams HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
                                             "Content-Type: application/json\r\n" + c.framing +
                                             "\r\n" + hidden);
    expect_refused(x, c.status);
    EXPECT_EQ(x.received.find("201 Created"), std::string::npos) << x.received;
    EXPECT_EQ(broker.request("GET", "/v1/streams/" + name, "", kReaderToken).status, 404u)
        << "the hidden request ran";
  }
  // A chunked body is read as before, and the node keeps serving.
  const std::string body = R"({"name":"chunked","schema":[{"name":"a","type":"int64"}]})";
  char size[16];
  std::snprintf(size, sizeof size, "%zx", body.size());
  auto ok = raw_exchange(broker.port(),
                         "POST /v1/streams HTTP/1.1\r\nHost: 127.0.0.1\r\n" + auth +
                             "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                             "Connection: close\r\n\r\n" + size + "\r\n" + body + "\r\n0\r\n\r\n");
  EXPECT_EQ(status_line(ok.received), "HTTP/1.1 201 Created") << ok.received;
  EXPECT_EQ(broker.request("GET", "/v1/streams/chunked", "", kReaderToken).status, 200u);
  EXPECT_GE(metric(broker, "entente_api_bad_requests_total"), 6.0);
}

// RFC 9112 §3.2 (point 7): HTTP/1.1 without Host, or with two, is 400;
// HTTP/1.0 predates Host and is served.
TEST(BrokerTransport, Http11RequestWithoutHostIs400) {
  BrokerProcess broker;
  ASSERT_TRUE(broker.start()) << broker.last_error();
  auto none = raw_exchange(broker.port(), "GET /v1/health HTTP/1.1\r\n\r\n");
  expect_refused(none, 400);
  EXPECT_NE(none.received.find("Host header field"), std::string::npos) << none.received;
  auto two = raw_exchange(broker.port(), "GET /v1/health HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
  expect_refused(two, 400);
  auto old = raw_exchange(broker.port(), "GET /v1/health HTTP/1.0\r\n\r\n");
  EXPECT_EQ(status_line(old.received), "HTTP/1.0 200 OK") << old.received;
  EXPECT_NE(old.received.find("\"status\":\"ok\""), std::string::npos) << old.received;
}

// RFC 6455 §4.2.1 (point 6), on the subscribe route of a real stream with a
// reader's token: a key that is not the base64 of 16 bytes, or none, is 400;
// a missing or other version is 426 with Sec-WebSocket-Version: 13; all are
// problem+json. A well-formed handshake still gets 101.
TEST(BrokerTransport, MalformedWebSocketHandshakesAreRefusedWithProblemJson) {
  BrokerProcess broker;
  ASSERT_TRUE(broker.start()) << broker.last_error();
  ASSERT_EQ(broker.request("POST", "/v1/streams", R"({"name":"t","schema":[{"name":"a","type":"int64"}]})")
                .status,
            201u);
  const std::string head = std::string("GET /v1/streams/t/subscribe HTTP/1.1\r\nHost: 127.0.0.1\r\n") +
                           "Authorization: Bearer " + kReaderToken +
                           "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n";
  const std::string key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
  const std::string v13 = "Sec-WebSocket-Version: 13\r\n";
  auto bad_key = raw_exchange(broker.port(), head + "Sec-WebSocket-Key: abc\r\n" + v13 + "\r\n");
  expect_refused(bad_key, 400);
  EXPECT_NE(bad_key.received.find("Sec-WebSocket-Key"), std::string::npos);
  auto no_key = raw_exchange(broker.port(), head + v13 + "\r\n");
  expect_refused(no_key, 400);
  for (const std::string& version : {std::string(), std::string("Sec-WebSocket-Version: 8\r\n")}) {
    SCOPED_TRACE(version);
    auto x = raw_exchange(broker.port(), head + key + version + "\r\n");
    expect_refused(x, 426);
    EXPECT_NE(x.received.find("Sec-WebSocket-Version: 13\r\n"), std::string::npos) << x.received;
  }
  RawTcp good("127.0.0.1", broker.port());
  ASSERT_TRUE(good.connected());
  ASSERT_TRUE(good.send_all(head + key + v13 + "\r\n"));
  std::string got;
  good.read_until_closed(got, 1s);  // a subscription stays open
  EXPECT_EQ(status_line(got), "HTTP/1.1 101 Switching Protocols") << got;
}

// Point 11. Idle connections from 127.0.0.2 (they never send a byte) try to
// take every slot of acme's API (max_connections 32) and federation
// listener (16). Each address gets at most max_connections_per_address, so
// a client from 127.0.0.1 is served and beta, dialing acme, links, while
// the flood is still connected. The handshake deadline is long here, so
// that it is the per-address limit that does it.
TEST(BrokerTransport, FloodOfIdleConnectionsFromOneAddressLocksOutNeitherClientsNorPeers) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  acme.pins(beta, "", beta.ca_file());  // acme only accepts beta
  beta.pins(acme);                      // beta dials acme
  acme.api_extra(
      R"("limits":{"max_connections":32,"max_connections_per_address":8,"handshake_timeout":"60s"})");
  acme.federation_extra(
      R"("max_connections":16,"max_connections_per_address":4,"max_handshaking_connections":8,)"
      R"("handshake_timeout":"60s")");
  ASSERT_TRUE(acme.start()) << acme.last_error();
  const BrokerProcess& node = acme.process();

  std::vector<RawTcp> flood;
  for (int i = 0; i < 40; ++i) flood.emplace_back("127.0.0.1", node.port(), "127.0.0.2");
  for (int i = 0; i < 20; ++i) flood.emplace_back("127.0.0.1", acme.federation_port(), "127.0.0.2");
  for (const auto& c : flood) ASSERT_TRUE(c.connected());

  // The refusals are counted where operators look.
  EXPECT_TRUE(eventually(20s, [&] {
    return metric(node, "entente_api_connections_refused_per_address_total") >= 32;
  })) << metric(node, "entente_api_connections_refused_per_address_total");
  EXPECT_TRUE(eventually(20s, [&] {
    return metric(node, "entente_federation_refusals_total",
                  "{reason=\"connections_per_address\"}") >= 16;
  }));
  // A client from another address is served.
  auto health = node.try_request("GET", "/v1/health", "", "");
  ASSERT_TRUE(health.ok()) << health.error().message;
  EXPECT_EQ(health->status, 200u);
  EXPECT_EQ(metric(node, "entente_api_connections_refused_total"), 0);
  // And so is a peer.
  ASSERT_TRUE(beta.start()) << beta.last_error();
  wait_linked(acme, beta);
  EXPECT_EQ(get_peers(node).refusals.count("connections"), 0u);
  // The flood is still there: its connections were neither served nor closed.
  for (size_t i = 0; i < 8; ++i) {
    pollfd p{flood[i].fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 0), 0) << "flood connection " << i << " was closed";
  }
}

// Point 11: a connection that says nothing (or not a whole request header)
// is closed at the handshake deadline, long before the read timeout (10 s),
// on both listeners, and the API counts it.
TEST(BrokerTransport, ConnectionsThatSayNothingAreClosedAtTheHandshakeDeadline) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  acme.api_extra(R"("limits":{"handshake_timeout":"500ms"})");
  acme.federation_extra(R"("handshake_timeout":"500ms")");
  ASSERT_TRUE(acme.start()) << acme.last_error();
  const BrokerProcess& node = acme.process();

  const auto start = std::chrono::steady_clock::now();
  RawTcp idle("127.0.0.1", node.port());
  RawTcp partial("127.0.0.1", node.port());
  RawTcp peer("127.0.0.1", acme.federation_port());
  ASSERT_TRUE(idle.connected() && partial.connected() && peer.connected());
  ASSERT_TRUE(partial.send_all("GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n"));
  EXPECT_TRUE(idle.closed_within(8s));
  EXPECT_TRUE(partial.closed_within(8s));
  EXPECT_TRUE(peer.closed_within(8s));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 400ms);
  EXPECT_LT(took, 8s);
  EXPECT_TRUE(eventually(10s, [&] { return metric(node, "entente_api_handshake_timeouts_total") >= 2; }))
      << metric(node, "entente_api_handshake_timeouts_total");
  EXPECT_TRUE(eventually(10s, [&] { return get_peers(node).refusals["handshake"] >= 1; }));
  // A client that does send its request in time is served.
  EXPECT_EQ(node.request("GET", "/v1/health", "", "").status, 200u);
}

}  // namespace
}  // namespace entente::testing
