#pragma once
// A TCP proxy on loopback for fault tests: forwards bytes both ways between
// each accepted connection and a target port, and can freeze (stop
// forwarding but keep connections open: a silent peer), cut (close every
// connection: a broken link) and block (close new connections at once: a
// peer that is unreachable), for every connection or only for those whose
// client (the dialer) matches a predicate on its source port (see
// tests/support/tcp_owner.h to tell which process a port belongs to). Runs
// its own io thread; header-only, for tests.

// GCC 12 misreports Asio's coroutine-frame allocator as a mismatched
// new/delete (see federation/link.cpp); scoped to this header.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <thread>
#include <vector>

namespace entente::testing {

class TcpProxy {
 public:
  TcpProxy() : acceptor_(io_) {}
  ~TcpProxy() { stop(); }
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  // Listens on 127.0.0.1:0 (see port()) and forwards to 127.0.0.1:target.
  void start(uint16_t target) {
    namespace net = boost::asio;
    using tcp = net::ip::tcp;
    target_ = target;
    const tcp::endpoint ep(net::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(ep.protocol());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    acceptor_.bind(ep);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    net::co_spawn(io_, accept_loop(), net::detached);
    thread_ = std::thread([this] { io_.run(); });
  }

  uint16_t port() const { return port_; }

  void freeze() { frozen_ = true; }
  void thaw() { frozen_ = false; }
  // Closes every open connection; new ones are still accepted.
  void cut() { run_on_io([this] { close_all(); }); }
  // While blocked, new connections are closed as soon as they arrive.
  void block(bool on) { blocked_ = on; }

  // The client's source port (127.0.0.1:PORT, the dialer's end) of a
  // connection, for the predicates below.
  using ClientFilter = std::function<bool(uint16_t client_port)>;
  // Closes the open connections whose client matches `match`.
  void cut_clients(ClientFilter match) {
    run_on_io([this, &match] {
      for (auto& weak : pairs_) {
        auto p = weak.lock();
        if (!p || !match(p->client_port)) continue;
        boost::system::error_code ignored;
        p->client.close(ignored);
        p->server.close(ignored);
      }
    });
  }
  // While set, a new connection whose client matches `match` is closed as
  // soon as it arrives (called on the proxy's thread, once per connection);
  // an empty filter lets every one through again.
  void refuse_clients(ClientFilter match) {
    run_on_io([this, &match] { refuse_ = std::move(match); });
  }

  void stop() {
    if (!thread_.joinable()) return;
    run_on_io([this] {
      boost::system::error_code ignored;
      acceptor_.close(ignored);
      close_all();
      stopping_ = true;
    });
    io_.stop();
    thread_.join();
  }

 private:
  using Socket = boost::asio::ip::tcp::socket;
  struct Pair {
    explicit Pair(boost::asio::io_context& io) : client(io), server(io) {}
    Socket client;
    Socket server;
    uint16_t client_port = 0;
  };

  template <class F>
  void run_on_io(F f) {
    std::promise<void> done;
    boost::asio::post(io_, [&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }

  void close_all() {
    for (auto& weak : pairs_) {
      if (auto p = weak.lock()) {
        boost::system::error_code ignored;
        p->client.close(ignored);
        p->server.close(ignored);
      }
    }
    pairs_.clear();
  }

  boost::asio::awaitable<void> accept_loop() {
    namespace net = boost::asio;
    using tcp = net::ip::tcp;
    constexpr auto use_tuple = net::as_tuple(net::use_awaitable);
    for (;;) {
      auto p = std::make_shared<Pair>(io_);
      auto [ec] = co_await acceptor_.async_accept(p->client, use_tuple);
      if (ec) co_return;
      if (blocked_ || stopping_) continue;  // `p` goes: the connection closes
      boost::system::error_code rec;
      p->client_port = p->client.remote_endpoint(rec).port();
      if (rec || (refuse_ && refuse_(p->client_port))) continue;
      auto [cec] = co_await p->server.async_connect(
          tcp::endpoint(net::ip::make_address("127.0.0.1"), target_), use_tuple);
      if (cec) continue;
      pairs_.push_back(p);
      net::co_spawn(io_, pump(p, true), net::detached);
      net::co_spawn(io_, pump(p, false), net::detached);
    }
  }

  boost::asio::awaitable<void> pump(std::shared_ptr<Pair> p, bool upstream) {
    namespace net = boost::asio;
    constexpr auto use_tuple = net::as_tuple(net::use_awaitable);
    Socket& from = upstream ? p->client : p->server;
    Socket& to = upstream ? p->server : p->client;
    std::vector<char> buf(64 * 1024);
    net::steady_timer pause(io_);
    for (;;) {
      while (frozen_) {
        pause.expires_after(std::chrono::milliseconds(5));
        co_await pause.async_wait(use_tuple);
        if (!from.is_open()) co_return;
      }
      auto [ec, n] = co_await from.async_read_some(net::buffer(buf), use_tuple);
      if (ec) break;
      // Bytes read just before a freeze are held until the thaw.
      while (frozen_) {
        pause.expires_after(std::chrono::milliseconds(5));
        co_await pause.async_wait(use_tuple);
        if (!to.is_open()) co_return;
      }
      auto [wec, wn] = co_await net::async_write(to, net::buffer(buf.data(), n), use_tuple);
      if (wec) break;
    }
    boost::system::error_code ignored;
    p->client.close(ignored);
    p->server.close(ignored);
  }

  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::thread thread_;
  uint16_t target_ = 0;
  uint16_t port_ = 0;
  std::atomic<bool> frozen_{false};
  std::atomic<bool> blocked_{false};
  bool stopping_ = false;  // io thread
  std::vector<std::weak_ptr<Pair>> pairs_;  // io thread
  ClientFilter refuse_;                     // io thread
};

}  // namespace entente::testing

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
