// http::Upstream (asynchronous client to another node), forward_request and
// the WebSocket proxy, against real in-process servers (plain and TLS), a
// listener that never answers, a scripted server that closes a kept-alive
// connection under a request, and a TCP proxy that cuts a link.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/upstream.h"
#include "tests/http/http_test_certs.h"
#include "tests/http/http_test_support.h"
#include "tests/support/tcp_proxy.h"

namespace entente::http {
namespace {

using testing::TestHandler;
using testing::TestPki;
using testing::wait_until;
using std::chrono::milliseconds;
using std::chrono::seconds;

// ---------------------------------------------------------------------------
// Helpers

Result<ClientResponse> call(Upstream& up, const UpstreamTarget& t, const std::string& method,
                            const std::string& path, const std::string& body = {},
                            HeaderList headers = {}) {
  std::promise<Result<ClientResponse>> p;
  auto f = p.get_future();
  up.request(t, method, path, std::move(headers), body,
             [&p](Result<ClientResponse> r) { p.set_value(std::move(r)); });
  return f.get();
}

std::unique_ptr<Upstream> make_upstream(UpstreamOptions o = {}) {
  auto up = Upstream::create(o);
  EXPECT_TRUE(up.ok());
  return up.ok() ? std::move(*up) : nullptr;
}

UpstreamTarget plain_target(uint16_t port) {
  UpstreamTarget t;
  t.host = "127.0.0.1";
  t.port = port;
  return t;
}

ServerOptions tls_options(const TestPki& pki) {
  ServerOptions o = testing::plain_options();
  o.tls = true;
  o.cert_file = pki.cert_file;
  o.key_file = pki.key_file;
  return o;
}

// A loopback listener that accepts nothing and answers nothing: the kernel
// completes the TCP handshake, then silence.
class SilentListener {
 public:
  SilentListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "cannot listen";
    }
    port_ = ntohs(a.sin_port);
  }
  ~SilentListener() { ::close(fd_); }
  uint16_t port() const { return port_; }

 protected:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// Answers the first request of each connection (200 "ok", kept alive) and
// closes the connection without answering when its second request arrives:
// a node that closed an idle keep-alive connection just as it was reused.
class ScriptedServer final : public SilentListener {
 public:
  ScriptedServer() : thread_([this] { loop(); }) {}
  ~ScriptedServer() {
    stop_ = true;
    thread_.join();
  }
  int connections() const { return connections_.load(); }
  std::vector<std::string> methods() {
    std::lock_guard lock(mu_);
    return methods_;
  }

 private:
  static bool wait_readable(int fd, int ms) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, ms) > 0;
  }
  void loop() {
    while (!stop_) {
      if (!wait_readable(fd_, 50)) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      connections_.fetch_add(1);
      serve(c);
      ::close(c);
    }
  }
  // Reads one request (header and Content-Length body); false at EOF.
  bool read_request(int c, std::string& buf, std::string& method) {
    for (;;) {
      const size_t end = buf.find("\r\n\r\n");
      if (end != std::string::npos) {
        size_t length = 0;
        const size_t cl = buf.find("Content-Length: ");
        if (cl != std::string::npos && cl < end) length = std::stoul(buf.substr(cl + 16));
        if (buf.size() >= end + 4 + length) {
          method = buf.substr(0, buf.find(' '));
          buf.erase(0, end + 4 + length);
          return true;
        }
      }
      if (stop_ || !wait_readable(c, 5000)) return false;
      char tmp[4096];
      const ssize_t n = ::recv(c, tmp, sizeof tmp, 0);
      if (n <= 0) return false;
      buf.append(tmp, static_cast<size_t>(n));
    }
  }
  void serve(int c) {
    std::string buf;
    for (int served = 0;; ++served) {
      std::string method;
      if (!read_request(c, buf, method)) return;
      {
        std::lock_guard lock(mu_);
        methods_.push_back(method);
      }
      if (served > 0) return;  // closed under the second request
      const std::string res = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok";
      ::send(c, res.data(), res.size(), MSG_NOSIGNAL);
    }
  }

  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::mutex mu_;
  std::vector<std::string> methods_;
  std::thread thread_;
};

// What an Upstream WebSocket reported.
struct UpRecord {
  std::mutex mu;
  std::condition_variable cv;
  bool opened = false;
  std::vector<std::pair<std::string, bool>> messages;
  bool closed = false;
  uint16_t code = 0;
  std::string reason;

  UpstreamWebSocketCallbacks callbacks() {
    UpstreamWebSocketCallbacks cb;
    cb.on_open = [this] {
      std::lock_guard lock(mu);
      opened = true;
      cv.notify_all();
    };
    cb.on_message = [this](std::string data, bool binary) {
      std::lock_guard lock(mu);
      messages.emplace_back(std::move(data), binary);
      cv.notify_all();
    };
    cb.on_close = [this](uint16_t c, std::string r) {
      std::lock_guard lock(mu);
      EXPECT_FALSE(closed) << "on_close twice";
      closed = true;
      code = c;
      reason = std::move(r);
      cv.notify_all();
    };
    return cb;
  }
  bool wait(const std::function<bool()>& pred, milliseconds timeout = seconds(10)) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, timeout, pred);
  }
};

// ---------------------------------------------------------------------------
// The node behind the proxy: TestHandler's HTTP routes, and WebSocket
// routes that record what the proxy passed on.
//   /ws/echo     echoes; records the upgrade's headers and the close it got
//   /ws/closer   on "close CODE REASON" closes with that code and reason
//   /ws/produce  on open sends `n` numbered messages of `size` bytes as fast
//                as its send buffer allows (continuing on drain)
class BackHandler final : public Handler {
 public:
  struct Seen {
    std::mutex mu;
    std::string authorization;
    std::string forwarded_by;
    std::string target;
    std::atomic<int> close_code{0};
    std::string close_reason;
    std::atomic<int> sessions_closed{0};
    std::atomic<int> produced{0};
    std::atomic<int> overflows{0};
    std::atomic<int> received{0};  // /ws/stall: messages in order
    std::atomic<bool> stalled{true};
    std::shared_ptr<WebSocket> stall_ws;
  };

  class Session final : public WebSocketSession {
   public:
    Session(std::string route, int n, size_t size, Seen& seen)
        : route_(std::move(route)), n_(n), size_(size), seen_(seen) {}
    void on_open(std::shared_ptr<WebSocket> ws) override {
      ws_ = ws;
      if (route_ == "/ws/produce") {
        ws->set_on_drain([this] { produce(); });
        produce();
      }
    }
    bool on_message(std::string_view data, bool binary) override {
      if (route_ == "/ws/stall") {
        // Records the order; reads nothing more while `stalled`.
        if (data.substr(0, data.find(':')) == std::to_string(seen_.received.load())) {
          seen_.received.fetch_add(1);
        }
        {
          std::lock_guard lock(seen_.mu);
          seen_.stall_ws = ws_;
        }
        return !seen_.stalled.load();
      }
      if (route_ == "/ws/closer" && data.rfind("close ", 0) == 0) {
        const std::string rest(data.substr(6));
        const size_t sp = rest.find(' ');
        ws_->close(static_cast<uint16_t>(std::stoi(rest.substr(0, sp))),
                   sp == std::string::npos ? "" : rest.substr(sp + 1));
        return true;
      }
      ws_->send(std::string(data), binary);
      return true;
    }
    void on_close_received(uint16_t code, std::string_view reason) override {
      std::lock_guard lock(seen_.mu);
      seen_.close_reason = std::string(reason);
      seen_.close_code = code;
    }
    void on_close() override {
      seen_.sessions_closed.fetch_add(1);
      ws_.reset();
    }

   private:
    // On the connection's strand (on_open, on_drain).
    void produce() {
      while (next_ < n_) {
        std::string m = std::to_string(next_) + ":";
        m.resize(size_, 'p');
        const auto r = ws_->send(std::move(m), true);
        if (r == WebSocket::SendResult::overflow) {
          seen_.overflows.fetch_add(1);
          return;
        }
        if (r == WebSocket::SendResult::closed) return;
        ++next_;
        seen_.produced.fetch_add(1);
      }
    }
    std::string route_;
    int n_;
    size_t size_;
    Seen& seen_;
    int next_ = 0;
    std::shared_ptr<WebSocket> ws_;
  };

  void handle(Request&& r, Respond respond) override { http.handle(std::move(r), std::move(respond)); }
  std::shared_ptr<WebSocketSession> upgrade(const Request& r, Response& reject) override {
    {
      std::lock_guard lock(seen.mu);
      seen.authorization = std::string(r.header("authorization").value_or(""));
      seen.forwarded_by = std::string(r.header("entente-forwarded-by").value_or(""));
      seen.target = r.target;
    }
    if (r.path == "/ws/echo" || r.path == "/ws/closer" || r.path == "/ws/produce" ||
        r.path == "/ws/stall") {
      const int n = std::stoi(std::string(r.param("n").value_or("0")));
      const size_t size = std::stoul(std::string(r.param("size").value_or("0")));
      return std::make_shared<Session>(r.path, n, size, seen);
    }
    reject = Response::problem(404, "Not Found", "no WebSocket route " + r.path);
    return nullptr;
  }

  TestHandler http;
  Seen seen;
};

// The forwarding node: every request and upgrade goes to `target`. Keeps
// the client-side WebSocket handle to look at its queue.
class FrontHandler final : public Handler {
 public:
  FrontHandler(Upstream& up, UpstreamTarget target) : up_(up), target_(std::move(target)) {
    options.pass_headers = {"x-test"};
    options.extra_headers = {{"entente-forwarded-by", "node-a"}};
  }

  class Tap final : public WebSocketSession {
   public:
    Tap(std::shared_ptr<WebSocketSession> inner, FrontHandler& h) : inner_(std::move(inner)), h_(h) {}
    void on_open(std::shared_ptr<WebSocket> ws) override {
      {
        std::lock_guard lock(h_.mu);
        h_.client_ws = ws;
      }
      inner_->on_open(std::move(ws));
    }
    bool on_message(std::string_view d, bool b) override { return inner_->on_message(d, b); }
    void on_close_received(uint16_t c, std::string_view r) override { inner_->on_close_received(c, r); }
    void on_close() override { inner_->on_close(); }

   private:
    std::shared_ptr<WebSocketSession> inner_;
    FrontHandler& h_;
  };

  void handle(Request&& r, Respond respond) override {
    forward_request(up_, target_, r, std::move(respond), options);
  }
  std::shared_ptr<WebSocketSession> upgrade(const Request& r, Response&) override {
    return std::make_shared<Tap>(make_websocket_proxy(up_, target_, r, options), *this);
  }
  std::shared_ptr<WebSocket> client() {
    std::lock_guard lock(mu);
    return client_ws;
  }

  ForwardOptions options;
  std::mutex mu;
  std::shared_ptr<WebSocket> client_ws;

 private:
  Upstream& up_;
  UpstreamTarget target_;
};

// ---------------------------------------------------------------------------
// HTTP requests

TEST(HttpUpstream, ConcurrentRequestsFromManyThreadsShareKeptAliveConnections) {
  TestHandler handler;
  auto server = testing::start_server(testing::plain_options(), handler);
  ASSERT_NE(server, nullptr);
  UpstreamOptions o;
  o.threads = 2;
  o.max_idle_per_target = 8;
  auto up = make_upstream(o);
  const auto target = plain_target(server->port());

  constexpr int kThreads = 8;
  constexpr int kEach = 25;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < kEach; ++j) {
        auto r = call(*up, target, "GET", "/hello");
        if (r.ok() && r->status == 200 && r->body == R"({"hello":"world"})") ok.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kThreads * kEach);
  // At most one connection per request in flight at once; the rest reused.
  EXPECT_LE(server->stats().connections_accepted, static_cast<uint64_t>(kThreads));
  EXPECT_EQ(up->stats().connections_opened, server->stats().connections_accepted);
  EXPECT_GE(up->stats().reused, static_cast<uint64_t>(kThreads * kEach - kThreads));
}

TEST(HttpUpstream, SequentialRequestsUseOneConnection) {
  TestHandler handler;
  auto server = testing::start_server(testing::plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto up = make_upstream();
  const auto target = plain_target(server->port());
  for (int i = 0; i < 20; ++i) {
    auto r = call(*up, target, i % 2 ? "GET" : "POST", "/inspect?i=" + std::to_string(i), "b",
                  {{"content-type", "text/plain"}, {"x-test", "v"}});
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->body, std::string(i % 2 ? "GET" : "POST") + "|/inspect|i=" + std::to_string(i) +
                           ";|text/plain|v|b|local");
  }
  EXPECT_EQ(server->stats().connections_accepted, 1u);
  EXPECT_EQ(up->stats().idle_connections, 1u);
}

TEST(HttpUpstream, IdlePoolIsBoundedPerTarget) {
  TestHandler handler;
  auto server = testing::start_server(testing::plain_options(), handler);
  ASSERT_NE(server, nullptr);
  UpstreamOptions o;
  o.max_idle_per_target = 2;
  auto up = make_upstream(o);
  const auto target = plain_target(server->port());
  // Six requests held open at once need six connections; two are kept.
  std::vector<std::future<Result<ClientResponse>>> held;
  for (int i = 0; i < 6; ++i) {
    held.push_back(std::async(std::launch::async, [&] { return call(*up, target, "GET", "/hold"); }));
  }
  ASSERT_TRUE(wait_until([&] { return handler.held_count() == 6; }));
  handler.release_held();
  for (auto& f : held) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->status, 200);
  }
  EXPECT_EQ(server->stats().connections_accepted, 6u);
  EXPECT_EQ(up->stats().idle_connections, 2u);
  EXPECT_TRUE(wait_until([&] { return server->stats().connections_open == 2; }));
}

TEST(HttpUpstream, NoAnswerTimesOut) {
  SilentListener silent;
  UpstreamOptions o;
  o.request_timeout_ms = 300;
  auto up = make_upstream(o);
  const auto start = std::chrono::steady_clock::now();
  auto r = call(*up, plain_target(silent.port()), "GET", "/hello");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unavailable);
  EXPECT_NE(r.error().message.find("no answer from 127.0.0.1:" + std::to_string(silent.port()) +
                                   " within 300 ms"),
            std::string::npos)
      << r.error().message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(5));
}

TEST(HttpUpstream, ConnectionRefusedIsAnIoError) {
  uint16_t port;
  {
    SilentListener gone;  // a port that was free a moment ago
    port = gone.port();
  }
  auto up = make_upstream();
  auto r = call(*up, plain_target(port), "GET", "/hello");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::io_error);
  EXPECT_NE(r.error().message.find("connect to 127.0.0.1:" + std::to_string(port)), std::string::npos)
      << r.error().message;
}

TEST(HttpUpstream, ConnectionClosedByTheServerWhileIdleIsNotReused) {
  TestHandler handler;
  ServerOptions so = testing::plain_options();
  so.idle_timeout_ms = 200;
  auto server = testing::start_server(so, handler);
  ASSERT_NE(server, nullptr);
  auto up = make_upstream();
  const auto target = plain_target(server->port());
  ASSERT_TRUE(call(*up, target, "GET", "/hello").ok());
  ASSERT_TRUE(wait_until([&] { return server->stats().connections_open == 0; }));
  // Not a resend: the pooled connection is seen closed before anything is sent.
  auto r = call(*up, target, "POST", "/inspect", "x", {{"content-type", "text/plain"}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(server->stats().connections_accepted, 2u);
  EXPECT_EQ(up->stats().retried, 0u);
}

TEST(HttpUpstream, SafeRequestIsResentOnceWhenThePooledConnectionDiesUnderIt) {
  ScriptedServer node;
  auto up = make_upstream();
  const auto target = plain_target(node.port());
  ASSERT_TRUE(call(*up, target, "GET", "/a").ok());
  auto r = call(*up, target, "GET", "/b");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->body, "ok");
  EXPECT_EQ(up->stats().retried, 1u);
  EXPECT_EQ(node.connections(), 2);
  EXPECT_EQ(node.methods(), (std::vector<std::string>{"GET", "GET", "GET"}));
}

TEST(HttpUpstream, PostIsNotResentWhenThePooledConnectionDiesUnderIt) {
  ScriptedServer node;
  auto up = make_upstream();
  const auto target = plain_target(node.port());
  ASSERT_TRUE(call(*up, target, "GET", "/a").ok());
  auto r = call(*up, target, "POST", "/v1/streams/s/records", "{}", {{"content-type", "application/json"}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::io_error);
  EXPECT_NE(r.error().message.find("it is not resent, as it may have been applied"), std::string::npos)
      << r.error().message;
  EXPECT_EQ(up->stats().retried, 0u);
  EXPECT_EQ(node.methods(), (std::vector<std::string>{"GET", "POST"}));
  EXPECT_EQ(node.connections(), 1);
}

TEST(HttpUpstream, ResponseOverTheLimitIsAnError) {
  TestHandler handler;
  auto server = testing::start_server(testing::plain_options(), handler);
  ASSERT_NE(server, nullptr);
  UpstreamOptions o;
  o.max_response_bytes = 20;
  auto up = make_upstream(o);
  const auto target = plain_target(server->port());
  auto r = call(*up, target, "GET", "/inspect");  // "GET|/inspect||-||local": 22 bytes
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::limit_exceeded);
  EXPECT_NE(r.error().message.find("exceeds 20 bytes"), std::string::npos) << r.error().message;
  // The half-read connection was dropped, not pooled: the next answer is whole.
  auto again = call(*up, target, "GET", "/hello");  // 17 bytes
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->body, R"({"hello":"world"})");
  EXPECT_EQ(server->stats().connections_accepted, 2u);
}

TEST(HttpUpstream, TlsWithTheRightCaAndWithAWrongOne) {
  TestPki pki;
  TestHandler handler;
  auto server = testing::start_server(tls_options(pki), handler);
  ASSERT_NE(server, nullptr);
  auto up = make_upstream();
  UpstreamTarget t = plain_target(server->port());
  t.tls = true;
  t.ca_file = pki.ca_file;
  for (int i = 0; i < 3; ++i) {
    auto r = call(*up, t, "GET", "/hello");
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->status, 200);
  }
  EXPECT_EQ(server->stats().connections_accepted, 1u);

  UpstreamTarget wrong = t;
  wrong.ca_file = pki.other_ca_file;
  auto r = call(*up, wrong, "GET", "/hello");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::io_error);
  EXPECT_NE(r.error().message.find("TLS handshake with 127.0.0.1:" + std::to_string(server->port()) +
                                   " failed"),
            std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("certificate"), std::string::npos) << r.error().message;

  UpstreamTarget wrong_name = t;
  wrong_name.server_name = "elsewhere.example";
  auto n = call(*up, wrong_name, "GET", "/hello");
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.error().message.find("hostname mismatch"), std::string::npos) << n.error().message;
}

TEST(HttpUpstream, StopAnswersOutstandingRequestsAndRefusesNewOnes) {
  TestHandler handler;
  auto server = testing::start_server(testing::plain_options(), handler);
  ASSERT_NE(server, nullptr);
  auto up = make_upstream();
  const auto target = plain_target(server->port());
  auto held = std::async(std::launch::async, [&] { return call(*up, target, "GET", "/hold"); });
  ASSERT_TRUE(wait_until([&] { return handler.held_count() == 1; }));
  up->stop();
  auto r = held.get();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unavailable);
  auto after = call(*up, target, "GET", "/hello");
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.error().code, Errc::unavailable);
  handler.release_held();
}

// ---------------------------------------------------------------------------
// forward_request, through a forwarding server

TEST(HttpUpstream, ForwardPassesTheRequestAndTheAnswer) {
  TestPki pki;
  BackHandler back_handler;
  auto back = testing::start_server(tls_options(pki), back_handler);
  ASSERT_NE(back, nullptr);
  auto up = make_upstream();
  UpstreamTarget t = plain_target(back->port());
  t.tls = true;
  t.ca_file = pki.ca_file;
  FrontHandler front_handler(*up, t);
  auto front = testing::start_server(testing::plain_options(), front_handler);
  ASSERT_NE(front, nullptr);

  auto client = Client::connect(testing::client_options(*front));
  ASSERT_TRUE(client.ok());
  auto r = (*client)->request("PUT", "/inspect?a=1&b=x%20y", "body!", "text/plain",
                              {{"x-test", "passed"}, {"x-other", "dropped"}});
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "PUT|/inspect|a=1;b=x y;|text/plain|passed|body!|local");
  EXPECT_EQ(r->header("content-type").value_or(""), "text/plain");
  EXPECT_FALSE(r->header("x-reply"));  // not among the passed response headers

  auto p = (*client)->request("GET", "/problem");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->status, 409);
  EXPECT_EQ(p->header("content-type").value_or(""), "application/problem+json");
  EXPECT_NE(p->body.find(R"("errors":[1,2])"), std::string::npos) << p->body;
}

TEST(HttpUpstream, ForwardToAnUnreachableNodeIs502AndToASilentOneIs504) {
  uint16_t port;
  {
    SilentListener gone;
    port = gone.port();
  }
  SilentListener silent;
  UpstreamOptions o;
  o.request_timeout_ms = 300;
  auto up = make_upstream(o);
  FrontHandler to_gone(*up, plain_target(port));
  FrontHandler to_silent(*up, plain_target(silent.port()));
  auto front_gone = testing::start_server(testing::plain_options(), to_gone);
  auto front_silent = testing::start_server(testing::plain_options(), to_silent);
  ASSERT_NE(front_gone, nullptr);
  ASSERT_NE(front_silent, nullptr);

  auto c1 = Client::connect(testing::client_options(*front_gone));
  ASSERT_TRUE(c1.ok());
  auto r = (*c1)->request("POST", "/v1/streams", "{}");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->status, 502);
  EXPECT_EQ(r->header("content-type").value_or(""), "application/problem+json");
  EXPECT_NE(r->body.find("node 127.0.0.1:" + std::to_string(port) + ": connect to 127.0.0.1:" +
                         std::to_string(port)),
            std::string::npos)
      << r->body;

  auto c2 = Client::connect(testing::client_options(*front_silent));
  ASSERT_TRUE(c2.ok());
  auto s = (*c2)->request("GET", "/v1/streams");
  ASSERT_TRUE(s.ok()) << s.error().message;
  EXPECT_EQ(s->status, 504);
  EXPECT_NE(s->body.find("within 300 ms"), std::string::npos) << s->body;

  up->stop();
  auto stopped = (*c2)->request("GET", "/v1/streams");
  ASSERT_TRUE(stopped.ok()) << stopped.error().message;
  EXPECT_EQ(stopped->status, 503);
  EXPECT_EQ(stopped->header("retry-after").value_or(""), "1");
}

// ---------------------------------------------------------------------------
// Upstream WebSockets, directly

TEST(HttpUpstream, WebSocketEchoesTextAndBinaryAndReportsItsOwnClose) {
  BackHandler back_handler;
  auto back = testing::start_server(testing::plain_options(), back_handler);
  ASSERT_NE(back, nullptr);
  auto up = make_upstream();
  UpRecord rec;
  auto ws = up->websocket(plain_target(back->port()), "/ws/echo", {{"authorization", "Bearer t"}},
                          rec.callbacks());
  ASSERT_NE(ws, nullptr);
  // Sent before the upgrade completes: queued and delivered in order.
  EXPECT_EQ(ws->send("one", false), WebSocket::SendResult::ok);
  EXPECT_EQ(ws->send(std::string("\x00\x01\x02", 3), true), WebSocket::SendResult::ok);
  ASSERT_TRUE(rec.wait([&] { return rec.messages.size() == 2; }));
  {
    std::lock_guard lock(rec.mu);
    EXPECT_TRUE(rec.opened);
    EXPECT_EQ(rec.messages[0], std::make_pair(std::string("one"), false));
    EXPECT_EQ(rec.messages[1], std::make_pair(std::string("\x00\x01\x02", 3), true));
  }
  ws->close(4100, "done here");
  ASSERT_TRUE(rec.wait([&] { return rec.closed; }));
  EXPECT_EQ(rec.code, 4100);
  EXPECT_EQ(rec.reason, "done here");
  EXPECT_TRUE(wait_until([&] { return back_handler.seen.close_code.load() == 4100; }));
  EXPECT_EQ(ws->send("late", false), WebSocket::SendResult::closed);
  std::lock_guard lock(back_handler.seen.mu);
  EXPECT_EQ(back_handler.seen.authorization, "Bearer t");
}

TEST(HttpUpstream, WebSocketRefusedUpgradeGivesTheStatus) {
  BackHandler back_handler;
  auto back = testing::start_server(testing::plain_options(), back_handler);
  ASSERT_NE(back, nullptr);
  auto up = make_upstream();
  UpRecord rec;
  auto ws = up->websocket(plain_target(back->port()), "/ws/missing", {}, rec.callbacks());
  ASSERT_NE(ws, nullptr);
  ASSERT_TRUE(rec.wait([&] { return rec.closed; }));
  EXPECT_FALSE(rec.opened);
  EXPECT_EQ(rec.code, 1006);
  EXPECT_EQ(ws->refused_status(), 404u);
  EXPECT_EQ(rec.reason.rfind("HTTP 404: ", 0), 0u) << rec.reason;
  EXPECT_NE(rec.reason.find("no WebSocket route /ws/missing"), std::string::npos) << rec.reason;
}

TEST(HttpUpstream, WebSocketSendQueueIsBounded) {
  SilentListener silent;  // the upgrade never completes: nothing is written
  UpstreamOptions o;
  o.ws_send_buffer_bytes = 1000;
  o.ws_handshake_timeout_ms = 300;
  auto up = make_upstream(o);
  UpRecord rec;
  auto ws = up->websocket(plain_target(silent.port()), "/ws/echo", {}, rec.callbacks());
  ASSERT_NE(ws, nullptr);
  EXPECT_EQ(ws->send(std::string(600, 'a'), false), WebSocket::SendResult::ok);
  EXPECT_EQ(ws->send(std::string(600, 'b'), false), WebSocket::SendResult::overflow);
  EXPECT_EQ(ws->queued_bytes(), 600u);
  ASSERT_TRUE(rec.wait([&] { return rec.closed; }));
  EXPECT_EQ(rec.code, 1006);
  EXPECT_NE(rec.reason.find("WebSocket handshake with 127.0.0.1:" + std::to_string(silent.port())),
            std::string::npos)
      << rec.reason;
  EXPECT_EQ(ws->send("x", false), WebSocket::SendResult::closed);
}

// ---------------------------------------------------------------------------
// The WebSocket proxy: client → front (plain) → node (TLS)

struct ProxyChain {
  TestPki pki;
  BackHandler back_handler;
  std::unique_ptr<Server> back;
  std::unique_ptr<Upstream> up;
  std::unique_ptr<FrontHandler> front_handler;
  std::unique_ptr<Server> front;
  entente::testing::TcpProxy link;  // between the front and the node, to cut

  explicit ProxyChain(size_t send_buffer = 8u << 20) {
    ServerOptions bo = tls_options(pki);
    bo.ws_send_buffer_bytes = send_buffer;
    back = testing::start_server(bo, back_handler);
    link.start(back->port());
    UpstreamOptions uo;
    uo.ws_send_buffer_bytes = send_buffer;
    up = make_upstream(uo);
    UpstreamTarget t = plain_target(link.port());
    t.tls = true;
    t.ca_file = pki.ca_file;
    t.server_name = "localhost";
    front_handler = std::make_unique<FrontHandler>(*up, t);
    ServerOptions fo = testing::plain_options();
    fo.ws_send_buffer_bytes = send_buffer;
    front = testing::start_server(fo, *front_handler);
  }
  ~ProxyChain() {
    if (front) front->stop();
    if (up) up->stop();
    link.stop();
    if (back) back->stop();
  }

  std::unique_ptr<WsClient> connect(const std::string& target,
                                    const HeaderList& headers = {{"authorization", "Bearer tok"}},
                                    int64_t timeout_ms = 5000) {
    ClientOptions o = testing::client_options(*front);
    o.timeout_ms = timeout_ms;
    auto c = WsClient::connect(o, target, headers);
    EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
    return c.ok() ? std::move(*c) : nullptr;
  }
};

// Receives until a message or a close arrives.
Result<WsMessage> next(WsClient& c) { return c.receive(10'000); }

TEST(HttpUpstream, ProxyEchoesBothWaysAndPassesHeaders) {
  ProxyChain chain;
  auto c = chain.connect("/ws/echo?x=1");
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->send("hello").ok());
  auto m = next(*c);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->data, "hello");
  EXPECT_FALSE(m->binary);
  const std::string bin("\xff\x00\xfe", 3);
  ASSERT_TRUE(c->send(bin, true).ok());
  m = next(*c);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->data, bin);
  EXPECT_TRUE(m->binary);
  std::lock_guard lock(chain.back_handler.seen.mu);
  EXPECT_EQ(chain.back_handler.seen.authorization, "Bearer tok");
  EXPECT_EQ(chain.back_handler.seen.forwarded_by, "node-a");
  EXPECT_EQ(chain.back_handler.seen.target, "/ws/echo?x=1");
}

TEST(HttpUpstream, ProxyPassesTheClientsCloseToTheNode) {
  ProxyChain chain;
  auto c = chain.connect("/ws/echo");
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->send("last").ok());
  ASSERT_TRUE(c->close(4005).ok());
  ASSERT_TRUE(wait_until([&] { return chain.back_handler.seen.close_code.load() != 0; }, seconds(10)));
  EXPECT_EQ(chain.back_handler.seen.close_code.load(), 4005);
  EXPECT_TRUE(wait_until([&] { return chain.up->stats().websockets_open == 0; }));
}

TEST(HttpUpstream, ProxyPassesTheNodesCloseToTheClient) {
  ProxyChain chain;
  auto c = chain.connect("/ws/closer");
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->send("before").ok());
  auto m = next(*c);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->data, "before");
  ASSERT_TRUE(c->send("close 4001 slow consumer: send buffer full; resume with from=7").ok());
  m = next(*c);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_TRUE(m->closed);
  EXPECT_EQ(m->close_code, 4001);
  EXPECT_EQ(m->close_reason, "slow consumer: send buffer full; resume with from=7");
}

TEST(HttpUpstream, ProxyClosesWith4000PlusStatusWhenTheNodeRefusesTheUpgrade) {
  ProxyChain chain;
  auto c = chain.connect("/ws/missing");
  ASSERT_NE(c, nullptr);
  auto m = next(*c);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_TRUE(m->closed);
  EXPECT_EQ(m->close_code, 4404);
  EXPECT_EQ(m->close_reason, "HTTP 404: no WebSocket route /ws/missing");
}

TEST(HttpUpstream, ProxyClosesWith1013WhenTheNodeIsUnreachableOrItsLinkBreaks) {
  ProxyChain chain;
  auto c = chain.connect("/ws/echo");
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->send("ping").ok());
  auto m = next(*c);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->data, "ping");
  chain.link.cut();
  m = next(*c);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_TRUE(m->closed);
  EXPECT_EQ(m->close_code, 1013);
  const std::string node = "node 127.0.0.1:" + std::to_string(chain.link.port()) + ": ";
  EXPECT_EQ(m->close_reason.rfind(node, 0), 0u) << m->close_reason;

  chain.link.block(true);
  auto c2 = chain.connect("/ws/echo");
  ASSERT_NE(c2, nullptr);
  m = next(*c2);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_TRUE(m->closed);
  EXPECT_EQ(m->close_code, 1013);
  EXPECT_EQ(m->close_reason.rfind(node, 0), 0u) << m->close_reason;
}

TEST(HttpUpstream, ProxyClosesWith1001WhenTheForwardingClientStops) {
  ProxyChain chain;
  auto c = chain.connect("/ws/echo");
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->send("ping").ok());
  auto m = next(*c);
  ASSERT_TRUE(m.ok());
  chain.up->stop();
  m = next(*c);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_TRUE(m->closed);
  EXPECT_EQ(m->close_code, 1001);
  EXPECT_EQ(m->close_reason, "going away");
  // A client arriving after the stop is closed the same way.
  auto c2 = chain.connect("/ws/echo");
  ASSERT_NE(c2, nullptr);
  m = next(*c2);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_TRUE(m->closed);
  EXPECT_EQ(m->close_code, 1001);
}

TEST(HttpUpstream, ProxyHoldsTheNodeBackInsteadOfBufferingForASlowClient) {
  constexpr size_t kBuffer = 256u << 10;
  constexpr size_t kSize = 64u << 10;
  constexpr int kCount = 480;  // 30 MiB; the kernel's socket buffers held 14 MiB here
  ProxyChain chain(kBuffer);
  auto c = chain.connect("/ws/produce?n=" + std::to_string(kCount) + "&size=" + std::to_string(kSize));
  ASSERT_NE(c, nullptr);
  // The client reads nothing: the node must come to a full send buffer,
  // which it can only if the proxy stopped reading it.
  ASSERT_TRUE(wait_until([&] { return chain.back_handler.seen.overflows.load() > 0; }, seconds(30)))
      << "produced " << chain.back_handler.seen.produced.load();
  EXPECT_LT(chain.back_handler.seen.produced.load(), kCount);
  auto client_ws = chain.front_handler->client();
  ASSERT_NE(client_ws, nullptr);
  for (int i = 0; i < 20; ++i) {
    EXPECT_LE(client_ws->queued_bytes(), kBuffer + kSize);
    std::this_thread::sleep_for(milliseconds(10));
  }
  std::fprintf(stderr, "held back after %d of %d messages\n",
               chain.back_handler.seen.produced.load(), kCount);
  // Then everything arrives, in order.
  for (int i = 0; i < kCount; ++i) {
    auto m = next(*c);
    ASSERT_TRUE(m.ok()) << "message " << i << ": " << m.error().message;
    ASSERT_FALSE(m->closed) << "message " << i << ": closed " << m->close_code << " " << m->close_reason;
    ASSERT_EQ(m->data.size(), kSize);
    ASSERT_EQ(m->data.substr(0, m->data.find(':')), std::to_string(i));
  }
  EXPECT_EQ(chain.back_handler.seen.produced.load(), kCount);
}

TEST(HttpUpstream, ProxyStopsReadingTheClientWhileTheNodeDoesNotRead) {
  constexpr size_t kBuffer = 256u << 10;
  constexpr size_t kSize = 64u << 10;
  constexpr int kCount = 800;  // 50 MiB
  ProxyChain chain(kBuffer);
  auto c = chain.connect("/ws/stall", {}, 120'000);
  ASSERT_NE(c, nullptr);
  std::atomic<int> sent{0};
  std::atomic<bool> failed{false};
  std::thread sender([&] {
    for (int i = 0; i < kCount; ++i) {
      std::string m = std::to_string(i) + ":";
      m.resize(kSize, 's');
      if (!c->send(m, true).ok()) {
        failed = true;
        return;
      }
      sent.fetch_add(1);
    }
  });
  // The node reads one message and stops; the client must come to a
  // standstill, which it can only if the proxy stopped reading it too.
  int before = -1;
  bool standstill = false;
  for (int i = 0; i < 100 && !standstill; ++i) {
    std::this_thread::sleep_for(milliseconds(200));
    const int now = sent.load();
    standstill = now == before && now < kCount;
    before = now;
  }
  EXPECT_TRUE(standstill) << "sent " << sent.load();
  EXPECT_EQ(chain.back_handler.seen.received.load(), 1);
  // The node reads again: everything arrives, in order.
  chain.back_handler.seen.stalled = false;
  std::shared_ptr<WebSocket> node_ws;
  {
    std::lock_guard lock(chain.back_handler.seen.mu);
    node_ws = chain.back_handler.seen.stall_ws;
  }
  ASSERT_NE(node_ws, nullptr);
  node_ws->resume_reading();
  sender.join();
  EXPECT_FALSE(failed.load());
  EXPECT_TRUE(wait_until([&] { return chain.back_handler.seen.received.load() == kCount; },
                         seconds(60)))
      << "received in order " << chain.back_handler.seen.received.load();
  std::fprintf(stderr, "client stood still after %d of %d messages\n", before, kCount);
}

}  // namespace
}  // namespace entente::http
