// Client::start_stream / read_stream: a response body read piece by piece
// as a server sends it (a chunked body that may never end, like an etcd
// watch), with timeouts that leave the connection usable.
//
// The server is a plain socket driven step by step by the test, so that
// each chunk goes out exactly when the test says.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "http/client.h"

namespace entente::http {
namespace {

using Clock = std::chrono::steady_clock;

// Accepts one connection and runs the steps the test queues, in order:
// read one request's header, send bytes, close.
class ScriptedServer {
 public:
  ScriptedServer() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listen_fd_, 4) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      throw std::runtime_error("cannot listen on 127.0.0.1");
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~ScriptedServer() {
    {
      std::lock_guard lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (fd_ >= 0) ::close(fd_);
    ::close(listen_fd_);
  }

  uint16_t port() const { return port_; }

  void read_request() { push([this] { return read_header(); }); }
  void send(std::string bytes) {
    push([this, bytes = std::move(bytes)] {
      return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
    });
  }
  void send_chunk(const std::string& data) {
    char size[32];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    send(size + data + "\r\n");
  }
  void close_connection() {
    push([this] {
      ::shutdown(fd_, SHUT_RDWR);
      return true;
    });
  }
  // Waits until every queued step ran; the requests' headers read so far.
  std::vector<std::string> drain() {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [this] { return steps_.empty() && !busy_; });
    return requests_;
  }

 private:
  void push(std::function<bool()> step) {
    {
      std::lock_guard lock(mu_);
      steps_.push_back(std::move(step));
    }
    cv_.notify_all();
  }

  bool read_header() {
    std::string text;
    char c;
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (text.find("\r\n\r\n") == std::string::npos && Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      if (::recv(fd_, &c, 1, 0) != 1) return false;
      text += c;
    }
    // The body, by its Content-Length (the client sends no other kind).
    size_t length = 0;
    if (const size_t at = text.find("Content-Length: "); at != std::string::npos) {
      length = std::stoul(text.substr(at + 16));
    }
    std::string body;
    while (body.size() < length && Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      if (::recv(fd_, &c, 1, 0) != 1) return false;
      body += c;
    }
    std::lock_guard lock(mu_);
    requests_.push_back(text + body);
    return true;
  }

  void run() {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 10'000) > 0) fd_ = ::accept(listen_fd_, nullptr, nullptr);
    for (;;) {
      std::function<bool()> step;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return quit_ || !steps_.empty(); });
        if (steps_.empty()) return;
        step = std::move(steps_.front());
        steps_.pop_front();
        busy_ = true;
      }
      if (fd_ >= 0) step();
      {
        std::lock_guard lock(mu_);
        busy_ = false;
      }
      cv_.notify_all();
    }
  }

  int listen_fd_ = -1;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<bool()>> steps_;
  std::vector<std::string> requests_;
  bool busy_ = false;
  bool quit_ = false;
  std::thread thread_;
};

constexpr const char* kChunkedHead =
    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

std::unique_ptr<Client> connect_to(const ScriptedServer& server, int64_t timeout_ms = 5'000) {
  ClientOptions o;
  o.port = server.port();
  o.timeout_ms = timeout_ms;
  auto c = Client::connect(o);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return c.ok() ? std::move(*c) : nullptr;
}

// Reads pieces until `want` bytes arrived (or 5 s passed).
std::string read_bytes(Client& c, size_t want) {
  std::string got;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (got.size() < want && Clock::now() < deadline) {
    auto piece = c.read_stream(200);
    if (!piece.ok()) {
      if (piece.error().code == Errc::unavailable) continue;
      ADD_FAILURE() << piece.error().message;
      break;
    }
    got += piece->data;
    if (piece->end) break;
  }
  return got;
}

TEST(HttpClientStream, PiecesArriveAsSentAndTheConnectionServesAgainAfterTheEnd) {
  ScriptedServer server;
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  server.read_request();
  server.send(kChunkedHead);
  server.send_chunk("{\"created\":true}\n");
  auto head = client->start_stream("POST", "/v3/watch", "{\"create_request\":{}}");
  ASSERT_TRUE(head.ok()) << head.error().message;
  EXPECT_EQ(head->status, 200u);
  EXPECT_EQ(head->header("transfer-encoding").value_or(""), "chunked");
  EXPECT_TRUE(head->body.empty());
  EXPECT_EQ(read_bytes(*client, 17), "{\"created\":true}\n");

  // Nothing more is sent: a timeout, promptly, and the stream goes on.
  const auto start = Clock::now();
  auto quiet = client->read_stream(150);
  ASSERT_FALSE(quiet.ok());
  EXPECT_EQ(quiet.error().code, Errc::unavailable) << quiet.error().message;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));

  // An object split over two chunks, sent after the timeout: it arrives.
  server.send_chunk("{\"events\":");
  server.send_chunk("[1,2]}\n");
  EXPECT_EQ(read_bytes(*client, 17), "{\"events\":[1,2]}\n");

  // While the stream is open, the connection takes no other request.
  auto busy = client->request("GET", "/other");
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.error().code, Errc::io_error);
  EXPECT_NE(busy.error().message.find("still being read"), std::string::npos) << busy.error().message;

  // The last chunk ends the body; the same connection then serves a request.
  server.send("0\r\n\r\n");
  auto end = client->read_stream(5'000);
  ASSERT_TRUE(end.ok()) << end.error().message;
  EXPECT_TRUE(end->end);
  EXPECT_TRUE(end->data.empty());
  server.read_request();
  server.send("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone");
  auto next = client->request("GET", "/next");
  ASSERT_TRUE(next.ok()) << next.error().message;
  EXPECT_EQ(next->body, "done");
  const auto requests = server.drain();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0].rfind("POST /v3/watch HTTP/1.1\r\n", 0), 0u) << requests[0];
  EXPECT_EQ(requests[1].rfind("GET /next HTTP/1.1\r\n", 0), 0u) << requests[1];
}

TEST(HttpClientStream, PiecesAreBoundedByMaxBytes) {
  ScriptedServer server;
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  server.read_request();
  server.send(kChunkedHead);
  const std::string big(1000, 'x');
  server.send_chunk(big);
  ASSERT_TRUE(client->start_stream("GET", "/big").ok());
  std::string got;
  size_t pieces = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (got.size() < big.size() && Clock::now() < deadline) {
    auto piece = client->read_stream(200, 100);
    if (!piece.ok()) continue;
    EXPECT_LE(piece->data.size(), 100u);
    got += piece->data;
    ++pieces;
  }
  EXPECT_EQ(got, big);
  EXPECT_GE(pieces, 10u);
}

TEST(HttpClientStream, ContentLengthBodyEndsTheStream) {
  ScriptedServer server;
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  server.read_request();
  server.send("HTTP/1.1 404 Not Found\r\nContent-Length: 11\r\n\r\nno such key");
  auto head = client->start_stream("GET", "/missing");
  ASSERT_TRUE(head.ok()) << head.error().message;
  EXPECT_EQ(head->status, 404u);
  std::string body;
  bool ended = false;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!ended && Clock::now() < deadline) {
    auto piece = client->read_stream(200);
    if (!piece.ok()) continue;
    body += piece->data;
    ended = piece->end;
  }
  EXPECT_TRUE(ended);
  EXPECT_EQ(body, "no such key");
  // After the end, read_stream has nothing to read.
  auto after = client->read_stream(100);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.error().code, Errc::invalid_argument);
}

TEST(HttpClientStream, ServerClosingMidStreamIsIoError) {
  ScriptedServer server;
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  server.read_request();
  server.send(kChunkedHead);
  server.send_chunk("partial");
  ASSERT_TRUE(client->start_stream("GET", "/stream").ok());
  EXPECT_EQ(read_bytes(*client, 7), "partial");
  server.close_connection();
  Result<BodyPiece> r = make_error(Errc::unavailable, "not read yet");
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!r.ok() && r.error().code == Errc::unavailable && Clock::now() < deadline) {
    r = client->read_stream(200);
  }
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::io_error);
  EXPECT_NE(r.error().message.find("127.0.0.1:" + std::to_string(server.port())), std::string::npos)
      << r.error().message;
  // The connection is done for.
  auto again = client->request("GET", "/x");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code, Errc::io_error);
}

TEST(HttpClientStream, DestroyingTheClientWithAReadPendingIsClean) {
  ScriptedServer server;
  auto client = connect_to(server);
  ASSERT_TRUE(client);
  server.read_request();
  server.send(kChunkedHead);
  ASSERT_TRUE(client->start_stream("GET", "/stream").ok());
  auto r = client->read_stream(50);  // times out with the read left pending
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::unavailable);
  client.reset();  // ASan would report a handler outliving the client
  server.drain();
}

TEST(HttpClientStream, RequestBodyOverMaxBodyBytesIsRefused) {
  ScriptedServer server;
  ClientOptions o;
  o.port = server.port();
  o.max_body_bytes = 16;
  auto client = Client::connect(o);
  ASSERT_TRUE(client.ok()) << client.error().message;
  server.read_request();
  server.send("HTTP/1.1 200 OK\r\nContent-Length: 32\r\n\r\n" + std::string(32, 'y'));
  auto r = (*client)->request("GET", "/large");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::io_error);
  EXPECT_NE(r.error().message.find("body limit"), std::string::npos) << r.error().message;
}

}  // namespace
}  // namespace entente::http
