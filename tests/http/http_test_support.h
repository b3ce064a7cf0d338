#pragma once
// A test Handler with a few routes and WebSocket sessions, and helpers to
// start a Server on an ephemeral loopback port, for the http_* tests.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/client.h"
#include "http/server.h"

namespace entente::http::testing {

// Polls `pred` every few milliseconds until it holds or `timeout` passes.
inline bool wait_until(const std::function<bool()>& pred,
                       std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// What the WebSocket sessions saw, shared with the test.
struct WsRecord {
  std::atomic<int> opened{0};
  std::atomic<int> closed{0};
  std::atomic<int> messages{0};
  std::atomic<int> drains{0};
  std::atomic<int> overflows{0};
  std::atomic<int> sent_before_overflow{0};
  std::atomic<int> closed_sends{0};  // send() answered `closed` after close()
  std::mutex mu;
  std::shared_ptr<WebSocket> last;  // the most recent session's handle
  std::shared_ptr<WebSocket> handle() {
    std::lock_guard lock(mu);
    return last;
  }
};

// Sessions by route:
//   /ws/echo   echoes every message (text or binary) and counts drains
//   /ws/flood  on open sends 16 KiB messages until overflow, then closes 4001
//   /ws/pause  returns false from on_message (the test resumes)
class TestSession final : public WebSocketSession {
 public:
  TestSession(std::string route, WsRecord& record) : route_(std::move(route)), record_(record) {}

  void on_open(std::shared_ptr<WebSocket> ws) override {
    ws_ = ws;
    {
      std::lock_guard lock(record_.mu);
      record_.last = ws;
    }
    record_.opened.fetch_add(1);
    ws->set_on_drain([this] { record_.drains.fetch_add(1); });
    if (route_ == "/ws/flood") {
      const std::string chunk(16 * 1024, 'x');
      for (int i = 0; i < 10'000; ++i) {
        const auto r = ws->send(chunk, true);
        if (r == WebSocket::SendResult::overflow) {
          record_.overflows.fetch_add(1);
          break;
        }
        record_.sent_before_overflow.fetch_add(1);
      }
      ws->close(4001, "slow consumer");
      if (ws->send("after close", false) == WebSocket::SendResult::closed) {
        record_.closed_sends.fetch_add(1);
      }
    }
  }
  bool on_message(std::string_view data, bool binary) override {
    record_.messages.fetch_add(1);
    if (route_ == "/ws/pause") return false;
    ws_->send(std::string(data), binary);
    return true;
  }
  void on_close() override {
    record_.closed.fetch_add(1);
    ws_.reset();
  }

 private:
  std::string route_;
  WsRecord& record_;
  std::shared_ptr<WebSocket> ws_;
};

// Routes:
//   GET  /hello       200 {"hello":"world"}
//   ANY  /inspect     200 the request as JSON-ish text (method, path, params, type, header, body)
//   GET  /delayed     answers from another thread after 50 ms
//   GET  /drop        drops the Respond callback without calling it
//   GET  /throw       throws from handle()
//   GET  /problem     a problem+json with extra members
//   GET  /hold        keeps the callback; answered by release_held()
class TestHandler final : public Handler {
 public:
  ~TestHandler() override { join(); }

  void handle(Request&& r, Respond respond) override {
    requests.fetch_add(1);
    if (r.path == "/hello") {
      respond(Response::json(200, R"({"hello":"world"})"));
    } else if (r.path == "/inspect") {
      std::string out = r.method + "|" + r.path + "|";
      for (const auto& [k, v] : r.query) out += k + "=" + v + ";";
      out += "|" + r.content_type + "|" + std::string(r.header("x-test").value_or("-")) + "|" +
             r.body + "|" + (r.remote.rfind("127.0.0.1:", 0) == 0 ? "local" : r.remote);
      Response resp;
      resp.content_type = "text/plain";
      resp.body = std::move(out);
      resp.headers.emplace_back("X-Reply", "yes");
      respond(std::move(resp));
    } else if (r.path == "/delayed") {
      std::lock_guard lock(mu_);
      threads_.emplace_back([respond = std::move(respond)] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        respond(Response::json(200, R"({"delayed":true})"));
      });
    } else if (r.path == "/drop") {
      // Respond goes out of scope uncalled.
    } else if (r.path == "/throw") {
      throw std::runtime_error("boom");
    } else if (r.path == "/problem") {
      respond(Response::problem(409, "Conflict", "stream \"a\"\nexists", "\"errors\":[1,2]"));
    } else if (r.path == "/hold") {
      std::lock_guard lock(mu_);
      held_.push_back(std::move(respond));
    } else {
      respond(Response::problem(404, "Not Found", "no route " + r.path));
    }
  }

  std::shared_ptr<WebSocketSession> upgrade(const Request& r, Response& reject) override {
    if (r.path == "/ws/deny") {
      reject = Response::problem(401, "Unauthorized", "missing token");
      return nullptr;
    }
    if (r.path == "/ws/echo" || r.path == "/ws/flood" || r.path == "/ws/pause") {
      if (r.header("x-token").value_or("") != "secret" && r.path == "/ws/echo" &&
          r.param("auth").value_or("") == "required") {
        reject = Response::problem(403, "Forbidden", "bad token");
        return nullptr;
      }
      return std::make_shared<TestSession>(r.path, ws);
    }
    reject = Response::problem(404, "Not Found", "no WebSocket route " + r.path);
    return nullptr;
  }

  void release_held() {
    std::vector<Respond> held;
    {
      std::lock_guard lock(mu_);
      held.swap(held_);
    }
    for (auto& r : held) r(Response::json(200, R"({"held":true})"));
  }
  size_t held_count() {
    std::lock_guard lock(mu_);
    return held_.size();
  }
  void join() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mu_);
      threads.swap(threads_);
    }
    for (auto& t : threads) t.join();
  }

  std::atomic<int> requests{0};
  WsRecord ws;

 private:
  std::mutex mu_;
  std::vector<std::thread> threads_;
  std::vector<Respond> held_;
};

inline ServerOptions plain_options() {
  ServerOptions o;
  o.tls = false;
  o.threads = 2;
  o.read_timeout_ms = 2000;
  o.idle_timeout_ms = 5000;
  return o;
}

inline std::unique_ptr<Server> start_server(const ServerOptions& options, Handler& handler) {
  auto server = Server::create(options, handler);
  EXPECT_TRUE(server.ok()) << (server.ok() ? "" : server.error().message);
  if (!server.ok()) return nullptr;
  auto started = (*server)->start();
  EXPECT_TRUE(started.ok()) << (started.ok() ? "" : started.error().message);
  return std::move(*server);
}

inline ClientOptions client_options(const Server& server) {
  ClientOptions o;
  o.host = "127.0.0.1";
  o.port = server.port();
  o.tls = false;
  o.timeout_ms = 5000;
  return o;
}

}  // namespace entente::http::testing
