// The WebSocket side of the Beast server with the blocking WsClient: echo,
// refusal, send-buffer overflow and close codes, pausing reads, keepalive,
// and on_close exactly once.

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "tests/http/http_test_certs.h"
#include "tests/http/http_test_support.h"
#include "tests/support/raw_tcp.h"

namespace entente::http {
namespace {

using namespace std::chrono_literals;
using testing::client_options;
using testing::plain_options;
using testing::start_server;
using testing::TestHandler;
using testing::TestPki;
using testing::wait_until;

std::unique_ptr<WsClient> ws_connect(const ClientOptions& options, std::string_view target) {
  auto c = WsClient::connect(options, target);
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(HttpWebSocket, EchoTextAndBinary) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto ws = ws_connect(client_options(*server), "/ws/echo");
  ASSERT_NE(ws, nullptr);
  EXPECT_TRUE(wait_until([&] { return server->stats().websockets_open == 1; }));
  ASSERT_TRUE(ws->send("hello").ok());
  auto m = ws->receive(3000);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->data, "hello");
  EXPECT_FALSE(m->binary);
  const std::string bytes("\x00\x01\xff", 3);
  ASSERT_TRUE(ws->send(bytes, true).ok());
  m = ws->receive(3000);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->data, bytes);
  EXPECT_TRUE(m->binary);
  // Many messages back to back arrive whole and in order.
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(ws->send("m" + std::to_string(i)).ok());
  for (int i = 0; i < 200; ++i) {
    m = ws->receive(3000);
    ASSERT_TRUE(m.ok()) << m.error().message;
    ASSERT_EQ(m->data, "m" + std::to_string(i));
  }
  EXPECT_GT(handler.ws.drains.load(), 0);
  ASSERT_TRUE(ws->close().ok());
  EXPECT_TRUE(wait_until([&] { return handler.ws.closed.load() == 1; }));
  EXPECT_TRUE(wait_until([&] { return server->stats().websockets_open == 0; }));
  EXPECT_EQ(handler.ws.opened.load(), 1);
}

TEST(HttpWebSocket, ReceiveTimeoutLeavesTheConnectionUsable) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto ws = ws_connect(client_options(*server), "/ws/echo");
  ASSERT_NE(ws, nullptr);
  auto nothing = ws->receive(50);
  ASSERT_FALSE(nothing.ok());
  EXPECT_EQ(nothing.error().code, Errc::unavailable);
  ASSERT_TRUE(ws->send("after timeout").ok());
  auto m = ws->receive(3000);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->data, "after timeout");
}

TEST(HttpWebSocket, RefusedUpgradeReportsStatusAndBody) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto denied = WsClient::connect(client_options(*server), "/ws/deny");
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.error().code, Errc::invalid_argument);
  EXPECT_NE(denied.error().message.find("HTTP 401"), std::string::npos) << denied.error().message;
  EXPECT_NE(denied.error().message.find("missing token"), std::string::npos);
  auto missing = WsClient::connect(client_options(*server), "/ws/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, Errc::not_found);
  EXPECT_NE(missing.error().message.find("HTTP 404"), std::string::npos);
  EXPECT_EQ(handler.ws.opened.load(), 0);
  EXPECT_EQ(server->stats().websockets_open, 0u);
}

// RFC 6455 §4.2.1: the handshake is checked before the upgrade handler, and
// every refusal is problem+json: a key that is not the base64 of 16 bytes
// or no key is 400, a missing or other Sec-WebSocket-Version is 426 naming
// version 13. Only a well-formed upgrade gets 101.
TEST(HttpWebSocket, MalformedUpgradesAreRefusedWithProblemJson) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  const std::string head =
      "GET /ws/echo HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n";
  const std::string good_key = "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
  const std::string v13 = "Sec-WebSocket-Version: 13\r\n";
  struct Case {
    std::string headers;
    unsigned status;
    std::string detail;
  };
  const Case cases[] = {
      {"Sec-WebSocket-Key: abc\r\n" + v13, 400, "Sec-WebSocket-Key"},
      {"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=\r\n" + v13, 400, "Sec-WebSocket-Key"},
      {"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ!!\r\n" + v13, 400, "Sec-WebSocket-Key"},
      {"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZSBsb25nZXI=\r\n" + v13, 400, "Sec-WebSocket-Key"},
      {v13, 400, "Sec-WebSocket-Key"},
      {good_key + good_key + v13, 400, "Sec-WebSocket-Key"},
      {good_key, 426, "version must be 13"},
      {good_key + "Sec-WebSocket-Version: 8\r\n", 426, "version must be 13"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.headers);
    auto x = entente::testing::raw_exchange(server->port(), head + c.headers + "\r\n");
    ASSERT_TRUE(x.connected);
    EXPECT_TRUE(x.closed) << x.received;
    EXPECT_EQ(x.received.rfind("HTTP/1.1 " + std::to_string(c.status) + " ", 0), 0u) << x.received;
    EXPECT_NE(x.received.find("Content-Type: application/problem+json"), std::string::npos)
        << x.received;
    EXPECT_NE(x.received.find(c.detail), std::string::npos) << x.received;
    if (c.status == 426) {
      EXPECT_NE(x.received.find("Sec-WebSocket-Version: 13\r\n"), std::string::npos) << x.received;
    }
  }
  EXPECT_EQ(handler.ws.opened.load(), 0);
  // The same request with a good key and version is upgraded.
  entente::testing::RawTcp ok("127.0.0.1", server->port());
  ASSERT_TRUE(ok.connected());
  ASSERT_TRUE(ok.send_all(head + good_key + v13 + "\r\n"));
  std::string got;
  ok.read_until_closed(got, 500ms);  // stays open: read what came
  EXPECT_EQ(got.rfind("HTTP/1.1 101 ", 0), 0u) << got;
  EXPECT_NE(got.find("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), std::string::npos) << got;
  EXPECT_TRUE(wait_until([&] { return handler.ws.opened.load() == 1; }));
}

TEST(HttpWebSocket, UpgradeSeesHeadersAndQuery) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto without = WsClient::connect(client_options(*server), "/ws/echo?auth=required");
  ASSERT_FALSE(without.ok());
  EXPECT_NE(without.error().message.find("HTTP 403"), std::string::npos);
  auto with = WsClient::connect(client_options(*server), "/ws/echo?auth=required",
                                {{"X-Token", "secret"}});
  ASSERT_TRUE(with.ok()) << with.error().message;
}

TEST(HttpWebSocket, OverflowThenCloseReachesTheClientWithCodeAndReason) {
  TestHandler handler;
  auto options = plain_options();
  options.ws_send_buffer_bytes = 64 * 1024;
  auto server = start_server(options, handler);
  ASSERT_NE(server, nullptr);
  auto ws = ws_connect(client_options(*server), "/ws/flood");
  ASSERT_NE(ws, nullptr);
  // closed_sends is the last thing on_open records.
  ASSERT_TRUE(wait_until([&] { return handler.ws.closed_sends.load() == 1; }));
  EXPECT_EQ(handler.ws.overflows.load(), 1);
  // 64 KiB hold four 16 KiB messages; the fifth overflows.
  EXPECT_EQ(handler.ws.sent_before_overflow.load(), 4);
  int data_messages = 0;
  for (;;) {
    auto m = ws->receive(3000);
    ASSERT_TRUE(m.ok()) << m.error().message;
    if (m->closed) {
      EXPECT_EQ(m->close_code, 4001);
      EXPECT_EQ(m->close_reason, "slow consumer");
      break;
    }
    EXPECT_EQ(m->data.size(), 16u * 1024);
    ++data_messages;
  }
  EXPECT_LE(data_messages, 4);
  EXPECT_TRUE(wait_until([&] { return handler.ws.closed.load() == 1; }));
  auto handle = handler.ws.handle();
  ASSERT_NE(handle, nullptr);
  EXPECT_EQ(handle->send("late", false), WebSocket::SendResult::closed);
  EXPECT_EQ(handle->queued_bytes(), 0u);
  handle->close(1000, "again");  // no effect, no second on_close
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(handler.ws.closed.load(), 1);
  auto after = ws->receive(100);
  EXPECT_FALSE(after.ok());
}

TEST(HttpWebSocket, SendOverflowsWhileTheClientDoesNotRead) {
  TestHandler handler;
  auto options = plain_options();
  options.ws_send_buffer_bytes = 256 * 1024;
  auto server = start_server(options, handler);
  ASSERT_NE(server, nullptr);
  auto ws = ws_connect(client_options(*server), "/ws/echo");
  ASSERT_NE(ws, nullptr);
  ASSERT_TRUE(wait_until([&] { return handler.ws.handle() != nullptr; }));
  auto handle = handler.ws.handle();
  const std::string chunk(64 * 1024, 'y');
  // The kernel's socket buffers absorb some megabytes; the queue fills after that.
  bool overflowed = false;
  for (int i = 0; i < 4096 && !overflowed; ++i) {
    const auto r = handle->send(chunk, true);
    ASSERT_NE(r, WebSocket::SendResult::closed);
    overflowed = r == WebSocket::SendResult::overflow;
    if (!overflowed && i % 16 == 15) std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(overflowed);
  EXPECT_GT(handle->queued_bytes(), 0u);
  EXPECT_LE(handle->queued_bytes(), 256u * 1024);
  handle->close(4001, "slow consumer");
  for (int i = 0; i < 10'000; ++i) {
    auto m = ws->receive(3000);
    ASSERT_TRUE(m.ok()) << m.error().message;
    if (m->closed) {
      EXPECT_EQ(m->close_code, 4001);
      EXPECT_EQ(m->close_reason, "slow consumer");
      break;
    }
  }
  EXPECT_TRUE(wait_until([&] { return handler.ws.closed.load() == 1; }));
}

TEST(HttpWebSocket, PausedReadingResumes) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto ws = ws_connect(client_options(*server), "/ws/pause");
  ASSERT_NE(ws, nullptr);
  ASSERT_TRUE(ws->send("one").ok());
  ASSERT_TRUE(ws->send("two").ok());
  ASSERT_TRUE(wait_until([&] { return handler.ws.messages.load() == 1; }));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(handler.ws.messages.load(), 1);
  handler.ws.handle()->resume_reading();
  EXPECT_TRUE(wait_until([&] { return handler.ws.messages.load() == 2; }));
}

TEST(HttpWebSocket, PeerThatStopsAnsweringPingsIsDisconnected) {
  TestHandler handler;
  auto options = plain_options();
  options.ws_ping_interval_ms = 100;
  auto server = start_server(options, handler);
  ASSERT_NE(server, nullptr);
  auto alive = ws_connect(client_options(*server), "/ws/echo");
  ASSERT_NE(alive, nullptr);
  auto silent = ws_connect(client_options(*server), "/ws/echo");
  ASSERT_NE(silent, nullptr);
  silent->set_auto_pong(false);
  // The live client keeps reading (and so answers pings) for six intervals.
  const auto until = std::chrono::steady_clock::now() + 600ms;
  while (std::chrono::steady_clock::now() < until) {
    auto m = alive->receive(20);
    ASSERT_FALSE(m.ok());
    ASSERT_EQ(m.error().code, Errc::unavailable) << m.error().message;
  }
  EXPECT_EQ(handler.ws.closed.load(), 1);  // only the silent one
  EXPECT_EQ(server->stats().websockets_open, 1u);
  ASSERT_TRUE(alive->send("still here").ok());
  auto m = alive->receive(3000);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->data, "still here");
}

TEST(HttpWebSocket, ClientDisconnectCallsOnCloseOnce) {
  TestHandler handler;
  auto server = start_server(plain_options(), handler);
  ASSERT_NE(server, nullptr);
  {
    auto ws = ws_connect(client_options(*server), "/ws/echo");
    ASSERT_NE(ws, nullptr);
    ASSERT_TRUE(ws->send("x").ok());
  }  // destroyed without a close frame
  EXPECT_TRUE(wait_until([&] { return handler.ws.closed.load() == 1; }));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(handler.ws.closed.load(), 1);
  EXPECT_EQ(server->stats().websockets_open, 0u);
}

TEST(HttpWebSocket, OverTls) {
  TestPki pki;
  TestHandler handler;
  auto options = plain_options();
  options.tls = true;
  options.cert_file = pki.cert_file;
  options.key_file = pki.key_file;
  auto server = start_server(options, handler);
  ASSERT_NE(server, nullptr);
  auto copts = client_options(*server);
  copts.tls = true;
  copts.ca_file = pki.ca_file;
  auto ws = ws_connect(copts, "/ws/echo");
  ASSERT_NE(ws, nullptr);
  const std::string big(1 << 20, 'z');
  ASSERT_TRUE(ws->send(big, true).ok());
  auto m = ws->receive(5000);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->data, big);
  std::thread stopper([&] { server->stop(); });
  auto closed = ws->receive(3000);
  stopper.join();
  ASSERT_TRUE(closed.ok()) << closed.error().message;
  EXPECT_TRUE(closed->closed);
  EXPECT_EQ(closed->close_code, 1001);
  EXPECT_EQ(handler.ws.closed.load(), 1);
}

TEST(HttpWebSocket, MessageOverTheLimitClosesTheConnection) {
  TestHandler handler;
  auto options = plain_options();
  options.ws_max_message_bytes = 1024;
  auto server = start_server(options, handler);
  ASSERT_NE(server, nullptr);
  auto ws = ws_connect(client_options(*server), "/ws/echo");
  ASSERT_NE(ws, nullptr);
  ASSERT_TRUE(ws->send(std::string(4096, 'q')).ok());
  auto m = ws->receive(3000);
  if (m.ok()) {
    EXPECT_TRUE(m->closed);
    EXPECT_EQ(m->close_code, 1009);  // message too big
  }
  EXPECT_TRUE(wait_until([&] { return handler.ws.closed.load() == 1; }));
  EXPECT_EQ(handler.ws.messages.load(), 0);
}

}  // namespace
}  // namespace entente::http
