// The HTTP side of the Beast server: routing of requests to a Handler,
// keep-alive, delayed answers, limits, timeouts, connection refusal, stop().
// Real sockets on 127.0.0.1, ephemeral ports.

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "tests/http/http_test_support.h"
#include "tests/support/raw_tcp.h"

namespace entente::http {
namespace {

using namespace std::chrono_literals;
using testing::client_options;
using testing::plain_options;
using testing::start_server;
using testing::TestHandler;
using testing::wait_until;

std::unique_ptr<Client> connect(const Server& server) {
  auto c = Client::connect(client_options(server));
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(HttpServer, KeepAliveServesSeveralRequestsOnOneConnection) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < 5; ++i) {
    auto r = client->request("GET", "/hello");
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->status, 200u);
    EXPECT_EQ(r->body, R"({"hello":"world"})");
    EXPECT_EQ(r->header("content-type").value_or(""), "application/json");
  }
  EXPECT_EQ(server->stats().connections_accepted, 1u);
  EXPECT_EQ(handler.requests.load(), 5);
}

TEST(HttpServer, RequestIsDecodedForTheHandler) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  auto r = client->request("POST", "/insp%65ct?name=a%20b&x=1+2&flag", "payload",
                           "Application/JSON; charset=utf-8", {{"X-Test", "hdr"}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 200u);
  EXPECT_EQ(r->body, "POST|/inspect|name=a b;x=1 2;flag=;|application/json|hdr|payload|local");
  EXPECT_EQ(r->header("content-type").value_or(""), "text/plain");
  EXPECT_EQ(r->header("x-reply").value_or(""), "yes");
}

TEST(HttpServer, MalformedPercentEncodingIs400) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  auto r = client->request("GET", "/a%zz");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 400u);
  EXPECT_EQ(r->header("content-type").value_or(""), "application/problem+json");
  EXPECT_NE(r->body.find("malformed request target"), std::string::npos) << r->body;
  EXPECT_EQ(handler.requests.load(), 0);
}

TEST(HttpServer, RespondFromAnotherThreadLater) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  for (int i = 0; i < 3; ++i) {
    auto r = client->request("GET", "/delayed");
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->status, 200u);
    EXPECT_EQ(r->body, R"({"delayed":true})");
  }
  handler.join();
}

TEST(HttpServer, HandlerThatDropsOrThrowsGets500AndTheConnectionSurvives) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  auto dropped = client->request("GET", "/drop");
  ASSERT_TRUE(dropped.ok()) << dropped.error().message;
  EXPECT_EQ(dropped->status, 500u);
  EXPECT_NE(dropped->body.find("did not answer"), std::string::npos) << dropped->body;
  auto thrown = client->request("GET", "/throw");
  ASSERT_TRUE(thrown.ok()) << thrown.error().message;
  EXPECT_EQ(thrown->status, 500u);
  EXPECT_NE(thrown->body.find("boom"), std::string::npos) << thrown->body;
  auto ok = client->request("GET", "/hello");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->status, 200u);
}

TEST(HttpServer, ProblemResponseIsEscapedJson) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  auto r = client->request("GET", "/problem");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 409u);
  EXPECT_EQ(r->header("content-type").value_or(""), "application/problem+json");
  EXPECT_EQ(r->body,
            R"({"type":"about:blank","title":"Conflict","status":409,"detail":"stream \"a\"\nexists","errors":[1,2]})");
}

TEST(HttpServer, ConnectionCloseIsRespected) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  auto r = client->request("GET", "/hello", {}, "application/json", {{"Connection", "close"}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 200u);
  EXPECT_EQ(r->header("connection").value_or(""), "close");
  auto again = client->request("GET", "/hello");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, Errc::io_error);
  EXPECT_TRUE(wait_until([&] { return server->stats().connections_open == 0; }));
}

TEST(HttpServer, ExpectContinueGetsAnInterimResponse) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  auto interim = client->raw(
      "POST /inspect HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n");
  ASSERT_TRUE(interim.ok()) << interim.error().message;
  EXPECT_EQ(interim->status, 100u);
  auto final_response = client->raw("abcd");
  ASSERT_TRUE(final_response.ok()) << final_response.error().message;
  EXPECT_EQ(final_response->status, 200u);
  EXPECT_EQ(final_response->body, "POST|/inspect|||-|abcd|local");
}

TEST(HttpServer, HeadAnswersWithTheHeaderOnly) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  auto head = client->request("HEAD", "/hello");
  ASSERT_TRUE(head.ok()) << head.error().message;
  EXPECT_EQ(head->status, 200u);
  EXPECT_EQ(head->header("content-length").value_or(""), "17");
  EXPECT_TRUE(head->body.empty());
  auto get = client->request("GET", "/hello");  // the connection is still in step
  ASSERT_TRUE(get.ok()) << get.error().message;
  EXPECT_EQ(get->body, R"({"hello":"world"})");
}

TEST(HttpServer, OversizedBodyIs413AndCloses) {
  TestHandler handler;
  auto options = plain_options();
  options.max_body_bytes = 1024;
  auto server = start_server(options, handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  auto r = client->request("POST", "/inspect", std::string(64 * 1024, 'b'));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 413u);
  EXPECT_EQ(r->header("content-type").value_or(""), "application/problem+json");
  EXPECT_NE(r->body.find("exceeds 1024 bytes"), std::string::npos) << r->body;
  EXPECT_EQ(handler.requests.load(), 0);
  EXPECT_FALSE(client->request("GET", "/hello").ok());
  EXPECT_EQ(server->stats().bad_requests, 1u);
  // The limit is on the body only: a body within it is served.
  auto fresh = connect(*server);
  ASSERT_NE(fresh, nullptr);
  auto small = fresh->request("POST", "/inspect", std::string(1024, 'b'));
  ASSERT_TRUE(small.ok()) << small.error().message;
  EXPECT_EQ(small->status, 200u);
}

TEST(HttpServer, OversizedHeaderIs431) {
  TestHandler handler;
  auto options = plain_options();
  options.max_header_bytes = 1024;
  auto server = start_server(options, handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  auto r = client->request("GET", "/hello", {}, "", {{"X-Big", std::string(4000, 'h')}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 431u);
  EXPECT_EQ(r->header("content-type").value_or(""), "application/problem+json");
  EXPECT_EQ(handler.requests.load(), 0);
}

TEST(HttpServer, GarbageIs400AndTheServerKeepsServing) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  auto r = client->raw(std::string("\x01\x02\x03 nonsense\r\n\r\n"));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 400u);
  EXPECT_EQ(r->header("content-type").value_or(""), "application/problem+json");
  EXPECT_NE(r->body.find("malformed HTTP request"), std::string::npos) << r->body;
  auto bad_length = connect(*server);
  ASSERT_NE(bad_length, nullptr);
  auto r2 = bad_length->raw("POST /inspect HTTP/1.1\r\nHost: x\r\nContent-Length: nope\r\n\r\n");
  ASSERT_TRUE(r2.ok()) << r2.error().message;
  EXPECT_EQ(r2->status, 400u);
  EXPECT_EQ(server->stats().bad_requests, 2u);
  auto fresh = connect(*server);
  ASSERT_NE(fresh, nullptr);
  auto ok = fresh->request("GET", "/hello");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->status, 200u);
}

// RFC 9112 §6.1: a request whose body length the server cannot determine
// from Transfer-Encoding is refused (400: chunked is not the final coding;
// 501: a coding the server does not implement) and the connection closed,
// so a request hidden in the body is never read as the next request.
TEST(HttpServer, UnsupportedTransferEncodingIsRefusedAndTheBodyIsNeverRead) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  const std::string hidden = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::pair<std::string, unsigned> cases[] = {
      {"gzip", 400}, {"xchunked", 400}, {"chunked, identity", 400}, {"gzip, chunked", 501},
      {"chunked, chunked", 400}, {"", 400}};
  for (const auto& [coding, status] : cases) {
    SCOPED_TRACE("Transfer-Encoding: " + coding);
    auto x = entente::testing::raw_exchange(
        server->port(),
        "POST /inspect HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + coding + "\r\n\r\n" + hidden);
    ASSERT_TRUE(x.connected);
    EXPECT_TRUE(x.closed) << x.received;
    EXPECT_EQ(entente::testing::count_responses(x.received), 1) << x.received;
    EXPECT_EQ(x.received.rfind("HTTP/1.1 " + std::to_string(status) + " ", 0), 0u) << x.received;
    EXPECT_NE(x.received.find("Content-Type: application/problem+json"), std::string::npos)
        << x.received;
    EXPECT_NE(x.received.find("Connection: close"), std::string::npos) << x.received;
  }
  EXPECT_EQ(handler.requests.load(), 0);
  // The same coding split over two field lines is one list: gzip, chunked.
  auto split = entente::testing::raw_exchange(
      server->port(),
      "POST /inspect HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n"
      "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + hidden);
  EXPECT_EQ(split.received.rfind("HTTP/1.1 501 ", 0), 0u) << split.received;
  EXPECT_EQ(entente::testing::count_responses(split.received), 1) << split.received;
  EXPECT_EQ(handler.requests.load(), 0);
  EXPECT_EQ(server->stats().bad_requests, 7u);
}

// A message with both Transfer-Encoding and Content-Length is refused with
// 400 and the connection closed, whichever comes first and whatever the coding.
TEST(HttpServer, TransferEncodingWithContentLengthIs400AndCloses) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  const std::string hidden = "GET /hello HTTP/1.1\r\nHost: x\r\n\r\n";
  const std::string heads[] = {
      "Content-Length: 5\r\nTransfer-Encoding: gzip\r\n",
      "Transfer-Encoding: gzip\r\nContent-Length: 5\r\n",
      "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
      "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
  };
  for (const auto& head : heads) {
    SCOPED_TRACE(head);
    auto x = entente::testing::raw_exchange(
        server->port(), "POST /inspect HTTP/1.1\r\nHost: x\r\n" + head + "\r\n0\r\n\r\n" + hidden);
    ASSERT_TRUE(x.connected);
    EXPECT_TRUE(x.closed) << x.received;
    EXPECT_EQ(entente::testing::count_responses(x.received), 1) << x.received;
    EXPECT_EQ(x.received.rfind("HTTP/1.1 400 ", 0), 0u) << x.received;
    EXPECT_NE(x.received.find("Content-Type: application/problem+json"), std::string::npos)
        << x.received;
  }
  // HTTP/1.0 has no Transfer-Encoding: its framing is faulty (RFC 9112 §6.1).
  auto old = entente::testing::raw_exchange(
      server->port(), "POST /inspect HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + hidden);
  EXPECT_TRUE(old.closed);
  EXPECT_EQ(old.received.rfind("HTTP/1.0 400 ", 0), 0u) << old.received;
  EXPECT_EQ(entente::testing::count_responses(old.received), 1) << old.received;
  EXPECT_EQ(handler.requests.load(), 0);
}

TEST(HttpServer, ChunkedBodiesAreStillRead) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  auto r = client->raw(
      "POST /inspect HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\n\r\n"
      "2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 200u);
  EXPECT_EQ(r->body, "POST|/inspect|||-|abcd|local");
  auto again = client->request("GET", "/hello");  // still in step
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->status, 200u);
}

// RFC 9112 §3.2: an HTTP/1.1 request without Host, or any request with two,
// is refused with 400. HTTP/1.0 predates Host and is served without it.
TEST(HttpServer, MissingOrDuplicateHostIs400) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto none = entente::testing::raw_exchange(server->port(), "GET /hello HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(none.closed);
  EXPECT_EQ(none.received.rfind("HTTP/1.1 400 ", 0), 0u) << none.received;
  EXPECT_NE(none.received.find("Content-Type: application/problem+json"), std::string::npos);
  EXPECT_NE(none.received.find("Host header field"), std::string::npos) << none.received;
  auto two = entente::testing::raw_exchange(
      server->port(), "GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n");
  EXPECT_TRUE(two.closed);
  EXPECT_EQ(two.received.rfind("HTTP/1.1 400 ", 0), 0u) << two.received;
  EXPECT_NE(two.received.find("more than one Host"), std::string::npos) << two.received;
  for (const char* bad : {"a b", "x/y", "user@x", "x?y"}) {
    auto x = entente::testing::raw_exchange(
        server->port(), std::string("GET /hello HTTP/1.1\r\nHost: ") + bad + "\r\n\r\n");
    EXPECT_TRUE(x.closed);
    EXPECT_EQ(x.received.rfind("HTTP/1.1 400 ", 0), 0u) << bad << ": " << x.received;
  }
  for (const char* good : {"127.0.0.1:8443", "[::1]:8443", "node-1.example", ""}) {
    auto c = Client::connect(client_options(*server));
    ASSERT_TRUE(c.ok());
    auto r = (*c)->raw(std::string("GET /hello HTTP/1.1\r\nHost: ") + good + "\r\n\r\n");
    ASSERT_TRUE(r.ok()) << good << ": " << r.error().message;
    EXPECT_EQ(r->status, 200u) << good;
  }
  EXPECT_EQ(handler.requests.load(), 4);
  handler.requests = 0;
  auto old = entente::testing::raw_exchange(server->port(), "GET /hello HTTP/1.0\r\n\r\n");
  EXPECT_EQ(old.received.rfind("HTTP/1.0 200 ", 0), 0u) << old.received;
  EXPECT_NE(old.received.find(R"({"hello":"world"})"), std::string::npos) << old.received;
  EXPECT_EQ(handler.requests.load(), 1);
}

TEST(HttpServer, HalfARequestIsDisconnectedAfterTheReadTimeout) {
  TestHandler handler;
  auto options = plain_options();
  options.read_timeout_ms = 200;
  auto server = start_server(options, handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  const auto start = std::chrono::steady_clock::now();
  auto r = client->raw("GET /hello HTTP/1.1\r\nHost: x\r\n");
  const auto elapsed = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::io_error);
  EXPECT_GE(elapsed, 150ms);
  EXPECT_LT(elapsed, 3s);
  EXPECT_EQ(handler.requests.load(), 0);
  EXPECT_TRUE(wait_until([&] { return server->stats().connections_open == 0; }));
}

TEST(HttpServer, IdleKeepAliveConnectionIsClosed) {
  TestHandler handler;
  auto options = plain_options();
  options.idle_timeout_ms = 150;
  auto server = start_server(options, handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->request("GET", "/hello").ok());
  EXPECT_TRUE(wait_until([&] { return server->stats().connections_open == 0; }, 3s));
  EXPECT_FALSE(client->request("GET", "/hello").ok());
}

TEST(HttpServer, ConnectionsOverTheLimitAreRefused) {
  TestHandler handler;
  auto options = plain_options();
  options.max_connections = 1;
  auto server = start_server(options, handler);
  ASSERT_NE(server, nullptr);
  auto first = connect(*server);
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(first->request("GET", "/hello").ok());
  auto second = Client::connect(client_options(*server));
  if (second.ok()) {
    auto r = (*second)->request("GET", "/hello");
    EXPECT_FALSE(r.ok());
  }
  EXPECT_TRUE(wait_until([&] { return server->stats().connections_refused == 1; }));
  EXPECT_EQ(handler.requests.load(), 1);
  first.reset();
  ASSERT_TRUE(wait_until([&] { return server->stats().connections_open == 0; }));
  auto third = connect(*server);
  ASSERT_NE(third, nullptr);
  auto r = third->request("GET", "/hello");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 200u);
}

// One address may hold only max_connections_per_address: more are closed
// on accept and counted, and other addresses are served meanwhile.
TEST(HttpServer, ConnectionsFromOneAddressOverItsShareAreRefused) {
  TestHandler handler;
  auto options = plain_options();
  options.max_connections_per_address = 2;
  auto server = start_server(options, handler);
  ASSERT_NE(server, nullptr);
  entente::testing::RawTcp a("127.0.0.1", server->port(), "127.0.0.2");
  entente::testing::RawTcp b("127.0.0.1", server->port(), "127.0.0.2");
  ASSERT_TRUE(a.connected() && b.connected());
  ASSERT_TRUE(wait_until([&] { return server->stats().connections_open == 2; }));
  entente::testing::RawTcp c("127.0.0.1", server->port(), "127.0.0.2");
  ASSERT_TRUE(c.connected());
  EXPECT_TRUE(c.closed_within(3s));
  EXPECT_EQ(server->stats().connections_refused_per_address, 1u);
  EXPECT_EQ(server->stats().connections_refused, 0u);
  auto client = connect(*server);  // from 127.0.0.1
  ASSERT_NE(client, nullptr);
  auto r = client->request("GET", "/hello");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 200u);
  // A place given back is taken again.
  a = entente::testing::RawTcp();
  ASSERT_TRUE(wait_until([&] { return server->stats().connections_open == 2; }));
  auto again = entente::testing::raw_exchange(server->port(), "GET /hello HTTP/1.0\r\n\r\n", 3s,
                                              "127.0.0.2");
  EXPECT_EQ(again.received.rfind("HTTP/1.0 200 ", 0), 0u) << again.received;
}

// A fresh connection's first request header must be complete within
// handshake_timeout_ms of accept, however long read_timeout_ms is; later
// requests on a kept-alive connection are not bound by it.
TEST(HttpServer, FirstRequestHeaderMustArriveWithinTheHandshakeTimeout) {
  TestHandler handler;
  auto options = plain_options();
  options.handshake_timeout_ms = 300;
  options.read_timeout_ms = 10'000;
  auto server = start_server(options, handler);
  ASSERT_NE(server, nullptr);
  const auto start = std::chrono::steady_clock::now();
  entente::testing::RawTcp idle("127.0.0.1", server->port());
  entente::testing::RawTcp partial("127.0.0.1", server->port());
  ASSERT_TRUE(idle.connected() && partial.connected());
  ASSERT_TRUE(partial.send_all("GET /hello HTTP/1.1\r\nHost: x\r\n"));
  EXPECT_TRUE(idle.closed_within(5s));
  EXPECT_TRUE(partial.closed_within(5s));
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 5s);
  EXPECT_TRUE(wait_until([&] { return server->stats().handshake_timeouts == 2; }));
  EXPECT_EQ(handler.requests.load(), 0);
  // A client that asks at once is served, and may wait longer than the
  // handshake deadline before its next request.
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->request("GET", "/hello").ok());
  std::this_thread::sleep_for(600ms);
  auto later = client->request("GET", "/hello");
  ASSERT_TRUE(later.ok()) << later.error().message;
  EXPECT_EQ(later->status, 200u);
}

TEST(HttpServer, StopWithOpenConnectionsFinishesPromptly) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto idle = connect(*server);
  ASSERT_NE(idle, nullptr);
  ASSERT_TRUE(idle->request("GET", "/hello").ok());
  auto fresh = connect(*server);  // connected, nothing sent
  ASSERT_NE(fresh, nullptr);
  auto ws = WsClient::connect(client_options(*server), "/ws/echo");
  ASSERT_TRUE(ws.ok()) << ws.error().message;
  ASSERT_TRUE(wait_until([&] { return server->stats().websockets_open == 1; }));
  const auto start = std::chrono::steady_clock::now();
  std::thread stopper([&] { server->stop(); });
  // The WebSocket client answers the server's close frame.
  auto msg = (*ws)->receive(3000);
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1500ms);
  ASSERT_TRUE(msg.ok()) << msg.error().message;
  EXPECT_TRUE(msg->closed);
  EXPECT_EQ(msg->close_code, 1001);
  EXPECT_EQ(msg->close_reason, "going away");
  EXPECT_EQ(handler.ws.closed.load(), 1);
  EXPECT_EQ(server->stats().connections_open, 0u);
  EXPECT_FALSE(idle->request("GET", "/hello").ok());
}

TEST(HttpServer, StopWaitsForAnAnswerInFlightThenForcesAfterTheGrace) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  std::thread requester([&] {
    auto client = Client::connect(client_options(*server));
    ASSERT_TRUE(client.ok());
    auto r = (*client)->request("GET", "/hold");
    EXPECT_FALSE(r.ok());  // never answered: stop() closes it after the grace period
  });
  ASSERT_TRUE(wait_until([&] { return handler.held_count() == 1; }));
  const auto start = std::chrono::steady_clock::now();
  server->stop();
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, 4s);
  requester.join();
  // A late answer to a stopped server is dropped, not a crash.
  handler.release_held();
}

TEST(HttpServer, StopAcceptingRefusesNewConnectionsButServesOpenOnes) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto client = connect(*server);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->request("GET", "/hello").ok());
  const uint16_t port = server->port();
  server->stop_accepting();
  auto options = client_options(*server);
  options.port = port;
  EXPECT_TRUE(wait_until([&] { return !Client::connect(options).ok(); }));
  auto r = client->request("GET", "/hello");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 200u);
}

TEST(HttpServer, CreateRejectsBadOptions) {
  TestHandler handler;
  auto options = plain_options();
  options.address = "not-an-address";
  auto bad_address = Server::create(options, handler);
  ASSERT_FALSE(bad_address.ok());
  EXPECT_EQ(bad_address.error().code, Errc::invalid_argument);
  EXPECT_NE(bad_address.error().message.find("not-an-address"), std::string::npos);
  options = plain_options();
  options.threads = 0;
  EXPECT_FALSE(Server::create(options, handler).ok());
  options = plain_options();
  options.read_timeout_ms = 0;
  EXPECT_FALSE(Server::create(options, handler).ok());
  options = plain_options();
  options.handshake_timeout_ms = 0;
  EXPECT_FALSE(Server::create(options, handler).ok());
  options = plain_options();
  options.max_connections_per_address = 0;
  EXPECT_FALSE(Server::create(options, handler).ok());
}

TEST(HttpServer, BindFailureIsIoErrorNamingTheAddress) {
  TestHandler handler;
  auto first = start_server(plain_options(), handler);
  ASSERT_NE(first, nullptr);
  auto options = plain_options();
  options.port = first->port();
  auto second = Server::create(options, handler);
  ASSERT_TRUE(second.ok());
  auto started = (*second)->start();
  ASSERT_FALSE(started.ok());
  EXPECT_EQ(started.error().code, Errc::io_error);
  EXPECT_NE(started.error().message.find("127.0.0.1:" + std::to_string(first->port())),
            std::string::npos)
      << started.error().message;
}

}  // namespace
}  // namespace entente::http
