// The HTTP(S) + WebSocket server on Beast (see server.h for the contract).
//
// Shape: one acceptor coroutine; each admitted socket gets its own strand and
// one coroutine (Connection::run) that owns the stream (plain or TLS, one
// AnyStream type: detail/any_stream.h), the read buffer and the parser. Handlers and WebSocket users reach a connection from
// other threads only through small mutex-guarded "cores" (ResponseSlot,
// WsCore) that post a wake-up to the strand while the connection is alive and
// become inert once it is gone, so nothing is ever posted to a finished
// io_context. stop() counts every spawned coroutine (the gate) and returns
// after the last one has finished and the threads have joined.

#include "http/server.h"

// GCC 12 misreports Asio's coroutine-frame allocator (aligned operator new
// paired with its own aligned delete) as a mismatched new/delete where frames
// are destroyed inline; the pairing is Asio's and is correct.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <boost/asio/experimental/awaitable_operators.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>
#include <type_traits>
#include <unordered_map>

#include "base/log.h"
#include "http/detail/any_stream.h"
#include "http/detail/net.h"
#include "http/detail/text.h"
#include "http/detail/tls.h"
#include "net/address.h"

namespace entente::http {
namespace {

using namespace detail;  // NOLINT: the aliases net, beast, bhttp, websocket, ssl, tcp
using std::chrono::milliseconds;
using namespace net::experimental::awaitable_operators;  // NOLINT: `&&` on awaitables

// After an error response, how long and how much of the client's remaining
// input is read and discarded before closing: closing with unread input makes
// the kernel send RST, which can destroy the response before the client reads it.
constexpr milliseconds kLinger{500};
constexpr size_t kLingerBytes = 1u << 20;
// A TLS close_notify exchange must not hold a connection slot for long.
constexpr milliseconds kTlsShutdown{500};
// stop(): how long connections get to close gracefully before their sockets are closed.
constexpr std::chrono::seconds kStopGrace{2};
// Size of the read that waits for a request's first bytes.
constexpr size_t kFirstRead = 4096;
// RFC 6455: a close reason is at most 123 bytes.
constexpr size_t kMaxCloseReason = 123;

void report_exception(const std::exception_ptr& e, const char* where) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    base::logf(base::LogLevel::error, "http", "%s ended by an exception: %s\n", where, ex.what());
  } catch (...) {
    base::logf(base::LogLevel::error, "http", "%s ended by an unknown exception\n", where);
  }
}

using inet::address_key;  // per-address budgets (net/address.h)

std::string endpoint_string(const tcp::endpoint& ep) {
  const auto addr = ep.address();
  std::string out = addr.is_v6() ? "[" + addr.to_string() + "]" : addr.to_string();
  return out + ":" + std::to_string(ep.port());
}

Response internal_error(std::string_view detail) {
  return Response::problem(500, "Internal Server Error", detail);
}

struct Counters {
  std::atomic<uint64_t> open{0};
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> refused_per_address{0};
  std::atomic<uint64_t> handshake_timeouts{0};
  std::atomic<uint64_t> websockets_open{0};
  std::atomic<uint64_t> tls_failures{0};
  std::atomic<uint64_t> bad_requests{0};
};

// What the server knows of a live connection: its strand and the timers that
// other threads use (by posting to the strand) to resume its coroutine.
// Owned by shared_ptr: by the connection's coroutine, the server's registry,
// and any wake-up handler still queued on the strand.
class ConnectionBase : public std::enable_shared_from_this<ConnectionBase> {
 public:
  explicit ConnectionBase(const net::any_io_executor& ex)
      : executor_(ex), wake_(ex), writer_wake_(ex), reader_wake_(ex) {}
  virtual ~ConnectionBase() = default;
  ConnectionBase(const ConnectionBase&) = delete;
  ConnectionBase& operator=(const ConnectionBase&) = delete;

  // On the strand. Graceful: finish the request in flight, then close;
  // WebSockets close with 1001. Force: close the socket now.
  virtual void shutdown(bool force) = 0;

  const net::any_io_executor& executor() const { return executor_; }

  // Any thread, while the connection is alive (callers guarantee it with a
  // core's `gone` flag): runs `fn` on the strand.
  template <class F>
  void post(F&& fn) {
    net::post(executor_, [self = shared_from_this(), fn = std::forward<F>(fn)]() mutable { fn(); });
  }
  void post_wake() {
    post([this] { wake_.cancel(); });
  }
  void post_writer_wake() {
    post([this] { writer_wake_.cancel(); });
  }
  void post_reader_wake() {
    post([this] { reader_wake_.cancel(); });
  }

 protected:
  // Suspends until the timer is cancelled (a wake-up); callers loop on their
  // condition, so a stale wake-up only costs a re-check.
  static net::awaitable<void> sleep(net::steady_timer& timer) {
    timer.expires_at(net::steady_timer::time_point::max());
    co_await timer.async_wait(use_tuple);
  }

  net::any_io_executor executor_;
  net::steady_timer wake_;         // a response arrived, or shutdown
  net::steady_timer writer_wake_;  // WebSocket: messages queued, close requested
  net::steady_timer reader_wake_;  // WebSocket: resume_reading(), writer finished
};

// The handoff of one response from a handler (any thread) to the connection.
struct ResponseSlot {
  std::mutex mu;
  ConnectionBase* conn = nullptr;  // valid while !gone
  bool gone = false;               // the connection stopped waiting; deliveries are dropped
  bool delivered = false;
  std::optional<Response> response;
};

// Shared by every copy of one Respond callback. A handler that drops the
// callback without calling it would hang the connection; the destructor
// answers 500 instead.
class Responder {
 public:
  explicit Responder(std::shared_ptr<ResponseSlot> slot) : slot_(std::move(slot)) {}
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;
  ~Responder() { deliver(internal_error("the request handler did not answer")); }

  void deliver(Response response) {
    std::lock_guard lock(slot_->mu);
    if (slot_->delivered) return;
    slot_->delivered = true;
    if (slot_->gone) return;
    slot_->response = std::move(response);
    slot_->conn->post_wake();
  }

 private:
  std::shared_ptr<ResponseSlot> slot_;
};

struct Outgoing {
  std::string data;
  bool binary = false;
};

// The thread-safe half of an accepted WebSocket: the send queue and the
// requests (close, resume) that other threads make. The connection's
// coroutine drains it; `gone` is set when the coroutine ends, after which
// every call is a no-op answering `closed`.
struct WsCore {
  explicit WsCore(ConnectionBase* c, size_t limit) : conn(c), limit_bytes(limit) {}

  mutable std::mutex mu;
  ConnectionBase* conn;  // valid while !gone
  const size_t limit_bytes;
  bool gone = false;
  bool closed = false;  // close requested or the connection ended: sends are refused
  std::optional<websocket::close_reason> close_request;
  std::deque<Outgoing> queue;
  size_t queue_bytes = 0;     // bytes in `queue`
  size_t inflight_bytes = 0;  // bytes taken by the writer, not yet written
  bool writer_idle = false;   // the writer sleeps; the next send must wake it
  std::function<void()> on_drain;
  std::atomic<uint64_t> resumes{0};

  WebSocket::SendResult send(std::string message, bool binary) {
    std::lock_guard lock(mu);
    if (closed || gone) return WebSocket::SendResult::closed;
    const size_t size = message.size();
    // A message larger than the whole buffer still goes when nothing else is
    // queued: otherwise one large record could never reach any subscriber.
    const size_t held = queue_bytes + inflight_bytes;
    if (held > 0 && held + size > limit_bytes) return WebSocket::SendResult::overflow;
    queue.push_back(Outgoing{std::move(message), binary});
    queue_bytes += size;
    if (writer_idle) {
      writer_idle = false;
      conn->post_writer_wake();
    }
    return WebSocket::SendResult::ok;
  }

  void close(uint16_t code, std::string reason) {
    std::deque<Outgoing> discarded;  // freed outside the lock
    std::lock_guard lock(mu);
    if (closed || gone) return;
    closed = true;
    if (reason.size() > kMaxCloseReason) reason.resize(kMaxCloseReason);
    websocket::close_reason cr;
    cr.code = code;
    cr.reason = std::move(reason);
    close_request = std::move(cr);
    discarded.swap(queue);
    queue_bytes = 0;
    if (writer_idle) {
      writer_idle = false;
      conn->post_writer_wake();
    }
  }
};

class WsHandle final : public WebSocket {
 public:
  explicit WsHandle(std::shared_ptr<WsCore> core) : core_(std::move(core)) {}

  SendResult send(std::string message, bool binary) override {
    return core_->send(std::move(message), binary);
  }
  void close(uint16_t code, std::string reason) override { core_->close(code, std::move(reason)); }
  size_t queued_bytes() const override {
    std::lock_guard lock(core_->mu);
    return core_->queue_bytes + core_->inflight_bytes;
  }
  void set_on_drain(std::function<void()> fn) override {
    std::function<void()> old;  // destroyed outside the lock
    std::lock_guard lock(core_->mu);
    old = std::move(core_->on_drain);
    if (!core_->gone) core_->on_drain = std::move(fn);
  }
  void resume_reading() override {
    core_->resumes.fetch_add(1);
    std::lock_guard lock(core_->mu);
    if (!core_->gone) core_->conn->post_reader_wake();
  }

 private:
  std::shared_ptr<WsCore> core_;
};

// The listener and everything connections share. Server::Impl derives from it.
struct ServerCore {
  ServerCore(ServerOptions o, Handler& h, tcp::endpoint ep)
      : options(std::move(o)),
        handler(h),
        endpoint(ep),
        ioc(options.threads),
        acceptor(net::make_strand(ioc)) {}

  ServerOptions options;
  Handler& handler;
  tcp::endpoint endpoint;
  net::io_context ioc;  // before every Asio object: destroyed last
  ServerCertificate certificate;  // outlives `tls`, which calls it
  std::optional<ssl::context> tls;
  tcp::acceptor acceptor;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  Counters counters;
  uint16_t port = 0;

  std::mutex mu;
  std::condition_variable cv;
  size_t tasks = 0;  // REQUIRES mu: spawned coroutines not yet finished (the gate)
  bool started = false;
  bool stopping = false;
  bool stopped = false;
  std::unordered_map<ConnectionBase*, std::shared_ptr<ConnectionBase>> connections;
  // Open connections by address_key(); entries are removed at zero.
  std::mutex per_address_mu;
  std::unordered_map<std::string, size_t> per_address;  // REQUIRES per_address_mu

  void enter() {
    std::lock_guard lock(mu);
    ++tasks;
  }
  void leave() {
    std::lock_guard lock(mu);
    if (--tasks == 0) cv.notify_all();
  }
  // False once stop() began: the connection must end at once.
  bool add_connection(const std::shared_ptr<ConnectionBase>& c) {
    std::lock_guard lock(mu);
    if (stopping) return false;
    connections.emplace(c.get(), c);
    return true;
  }
  void remove_connection(ConnectionBase* c) {
    std::shared_ptr<ConnectionBase> last;  // released outside the lock
    std::lock_guard lock(mu);
    auto it = connections.find(c);
    if (it == connections.end()) return;
    last = std::move(it->second);
    connections.erase(it);
  }
  void shutdown_all(bool force) {
    std::vector<std::shared_ptr<ConnectionBase>> all;
    {
      std::lock_guard lock(mu);
      for (auto& [p, c] : connections) all.push_back(c);
    }
    for (auto& c : all) {
      net::post(c->executor(), [c, force] { c->shutdown(force); });
    }
  }

  net::awaitable<void> accept_loop();
  void spawn_connection(tcp::socket socket, std::string address_key);
  // False when `key` holds max_connections_per_address already.
  bool admit_address(const std::string& key) {
    std::lock_guard lock(per_address_mu);
    size_t& n = per_address[key];
    if (n >= options.max_connections_per_address) return false;
    ++n;
    return true;
  }
  void release_address(const std::string& key) {
    std::lock_guard lock(per_address_mu);
    auto it = per_address.find(key);
    if (it != per_address.end() && --it->second == 0) per_address.erase(it);
  }
};

class Connection final : public ConnectionBase {
 public:

  Connection(ServerCore& core, tcp::socket socket)
      : ConnectionBase(socket.get_executor()),
        core_(core),
        handshake_deadline_(std::chrono::steady_clock::now() +
                            milliseconds(core.options.handshake_timeout_ms)) {
    error_code ec;
    const auto remote = socket.remote_endpoint(ec);
    if (!ec) remote_ = endpoint_string(remote);
    if (core.tls) {
      stream_.emplace(std::move(socket), *core.tls);
    } else {
      stream_.emplace(std::move(socket));
    }
  }

  net::awaitable<void> run() {
    if (!core_.add_connection(shared_from_this())) co_return;
    struct Unregister {
      ServerCore& core;
      ConnectionBase* conn;
      ~Unregister() { core.remove_connection(conn); }
    } unregister{core_, this};

    if (tls_) {
      lowest().expires_at(handshake_deadline_);
      idle_ = true;  // nothing to finish yet: a graceful shutdown may cut the handshake
      auto [ec] = co_await stream_->async_handshake(ssl::stream_base::server, use_tuple);
      idle_ = false;
      if (ec) {
        core_.counters.tls_failures.fetch_add(1);
        if (ec == beast::error::timeout) core_.counters.handshake_timeouts.fetch_add(1);
        co_return;
      }
    }
    co_await serve_http();
  }

  void shutdown(bool force) override {
    shutting_down_ = true;
    if (force) {
      forced_ = true;
      error_code ec;
      lowest().socket().close(ec);
      wake_.cancel();
      writer_wake_.cancel();
      reader_wake_.cancel();
      return;
    }
    if (ws_core_) {
      ws_core_->close(1001, "going away");
    } else if (idle_) {
      // Between requests: nothing is lost by closing now.
      lowest().cancel();
    }
  }

 private:
  beast::tcp_stream& lowest() {
    if (ws_) return ws_->next_layer().lowest();
    return stream_->lowest();
  }

  // 431 / 413 / 400 for the parse errors that are the client's fault; 0 for
  // the ones that just end the connection (EOF, timeout, reset).
  static unsigned parse_error_status(const error_code& ec) {
    if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow) return 431;
    if (ec == bhttp::error::body_limit) return 413;
    if (ec.category() != bhttp::make_error_code(bhttp::error::bad_method).category()) return 0;
    if (ec == bhttp::error::end_of_stream || ec == bhttp::error::partial_message ||
        ec == bhttp::error::need_more || ec == bhttp::error::need_buffer) {
      return 0;
    }
    return 400;
  }

  static std::string_view status_title(unsigned status) {
    switch (status) {
      case 400: return "Bad Request";
      case 413: return "Content Too Large";
      case 426: return "Upgrade Required";
      case 431: return "Request Header Fields Too Large";
      case 501: return "Not Implemented";
      default: return "Error";
    }
  }

  net::awaitable<void> serve_http() {
    const auto& opt = core_.options;
    bool first = true;
    for (;;) {
      if (shutting_down_) break;
      // Wait for the next request's first bytes under the idle deadline; the
      // request as a whole then gets read_timeout_ms, so a slow sender cannot
      // hold the slot. A fresh connection's first request header must be
      // complete by the handshake deadline: a client that has not said what
      // it wants by then is not worth a slot.
      if (buffer_.size() == 0) {
        if (first) {
          lowest().expires_at(handshake_deadline_);
        } else {
          lowest().expires_after(milliseconds(opt.idle_timeout_ms));
        }
        idle_ = true;
        auto [ec, n] = co_await stream_->async_read_some(buffer_.prepare(kFirstRead), use_tuple);
        idle_ = false;
        if (ec) {
          if (first && ec == beast::error::timeout) core_.counters.handshake_timeouts.fetch_add(1);
          co_return;
        }
        buffer_.commit(n);
      }
      const auto read_deadline =
          std::chrono::steady_clock::now() + milliseconds(opt.read_timeout_ms);
      lowest().expires_at(first ? std::min(read_deadline, handshake_deadline_) : read_deadline);
      parser_.emplace();
      parser_->header_limit(static_cast<uint32_t>(
          std::min<size_t>(opt.max_header_bytes, std::numeric_limits<uint32_t>::max())));
      parser_->body_limit(opt.max_body_bytes);
      {
        auto [ec, n] = co_await bhttp::async_read_header(*stream_, buffer_, *parser_, use_tuple);
        if (ec) {
          if (first && ec == beast::error::timeout) core_.counters.handshake_timeouts.fetch_add(1);
          co_await fail_request(ec);
          co_return;
        }
      }
      // The body has read_timeout_ms, also on a connection's first request.
      if (first) lowest().expires_at(read_deadline);
      first = false;
      // Framing and Host are judged before any body is read: bytes whose
      // place in the stream is in doubt must never be read as the next request.
      if (std::optional<Response> refusal = check_header(parser_->get())) {
        core_.counters.bad_requests.fetch_add(1);
        co_await write_error(std::move(*refusal));
        co_return;
      }
      if (!parser_->is_done()) {
        // curl and others wait up to a second for "100 Continue" before sending a large body.
        const auto expect = parser_->get()[bhttp::field::expect];
        if (beast::iequals(expect, "100-continue")) {
          bhttp::response<bhttp::empty_body> cont{bhttp::status::continue_, parser_->get().version()};
          auto [wec, wn] = co_await bhttp::async_write(*stream_, cont, use_tuple);
          if (wec) co_return;
        }
        auto [ec, n] = co_await bhttp::async_read(*stream_, buffer_, *parser_, use_tuple);
        if (ec) {
          co_await fail_request(ec);
          co_return;
        }
      }

      auto& msg = parser_->get();
      Request request;
      if (!split_target(msg.target(), request.path, request.query)) {
        core_.counters.bad_requests.fetch_add(1);
        co_await write_error(400, "malformed request target");
        co_return;
      }
      request.method = std::string(msg.method_string());
      request.target = std::string(msg.target());
      request.headers.reserve(std::distance(msg.begin(), msg.end()));
      for (const auto& field : msg) {
        request.headers.emplace_back(to_lower(field.name_string()), std::string(field.value()));
      }
      request.content_type = media_type(msg[bhttp::field::content_type]);
      request.remote = remote_;
      request.websocket = websocket::is_upgrade(msg);
      head_ = msg.method() == bhttp::verb::head;
      if (request.websocket) {
        // The handshake is checked here, before the handler, so that every
        // refusal is problem+json and a malformed key never gets 101.
        if (std::optional<Response> refusal = check_websocket_handshake(msg)) {
          core_.counters.bad_requests.fetch_add(1);
          co_await write_error(std::move(*refusal));
          co_return;
        }
        co_await serve_websocket(std::move(request));
        co_return;
      }
      request.body = std::move(msg.body());
      bool keep_alive = msg.keep_alive();

      std::optional<Response> response = co_await call_handler(std::move(request));
      if (!response || forced_) co_return;
      keep_alive = keep_alive && !shutting_down_;
      if (!co_await write_response(std::move(*response), keep_alive)) co_return;
      if (!keep_alive) break;
    }
    co_await close_gracefully();
  }

  net::awaitable<void> fail_request(const error_code& ec) {
    const unsigned status = parse_error_status(ec);
    if (status == 0) co_return;
    core_.counters.bad_requests.fetch_add(1);
    std::string detail = ec.message();
    if (status == 413) {
      detail = "the request body exceeds " + std::to_string(core_.options.max_body_bytes) + " bytes";
    } else if (status == 431) {
      detail = "the request header exceeds " + std::to_string(core_.options.max_header_bytes) +
               " bytes";
    } else {
      detail = "malformed HTTP request: " + detail;
    }
    co_await write_error(status, detail);
  }

  // RFC 9112 §3.2 and §6.1. A refusal ends the connection: what follows a
  // request with doubtful framing cannot be told apart from a next request.
  static std::optional<Response> check_header(const bhttp::request_header<>& h) {
    const size_t hosts = h.count(bhttp::field::host);
    if (hosts > 1) return refusal(400, "the request has more than one Host header field");
    // HTTP/1.0 predates Host; such clients are still served (docs/api.md).
    if (hosts == 0 && h.version() >= 11) {
      return refusal(400, "an HTTP/1.1 request must have a Host header field");
    }
    if (hosts == 1 && !is_host_value(h[bhttp::field::host])) {
      return refusal(400, "the Host header field is not a host name or address with an optional port");
    }
    const auto [te_begin, te_end] = h.equal_range(bhttp::field::transfer_encoding);
    if (te_begin == te_end) return std::nullopt;
    if (h.count(bhttp::field::content_length) > 0) {
      return refusal(400, "the request has both Transfer-Encoding and Content-Length");
    }
    if (h.version() < 11) {
      return refusal(400, "Transfer-Encoding is not allowed in an HTTP/1.0 request");
    }
    std::vector<std::string_view> values;
    for (auto it = te_begin; it != te_end; ++it) values.emplace_back(it->value());
    if (auto bad = check_transfer_codings(values)) return refusal(bad->status, bad->detail);
    return std::nullopt;
  }

  // RFC 6455 §4.2.1 for an upgrade request (GET, HTTP/1.1, Connection and
  // Upgrade already checked by websocket::is_upgrade, Host by check_header).
  static std::optional<Response> check_websocket_handshake(const bhttp::request_header<>& h) {
    if (h.count(bhttp::field::sec_websocket_key) != 1 ||
        !is_websocket_key(h[bhttp::field::sec_websocket_key])) {
      return refusal(400,
                     "Sec-WebSocket-Key must be the base64 encoding of 16 bytes (RFC 6455 §4.1)");
    }
    if (h.count(bhttp::field::sec_websocket_version) != 1 ||
        h[bhttp::field::sec_websocket_version] != "13") {
      Response r = refusal(426, "the WebSocket protocol version must be 13 (Sec-WebSocket-Version)");
      r.headers.emplace_back("Sec-WebSocket-Version", "13");
      return r;
    }
    return std::nullopt;
  }

  static Response refusal(unsigned status, std::string_view detail) {
    return Response::problem(status, status_title(status), detail);
  }

  // Answers a request that ends the connection, then lingers so the client can read it.
  net::awaitable<void> write_error(unsigned status, std::string_view detail) {
    co_await write_error(refusal(status, detail));
  }
  net::awaitable<void> write_error(Response response) {
    head_ = false;
    if (!co_await write_response(std::move(response), false)) {
      co_return;
    }
    error_code ec;
    lowest().socket().shutdown(tcp::socket::shutdown_send, ec);
    lowest().expires_after(kLinger);
    size_t total = 0;
    buffer_.clear();
    while (total < kLingerBytes) {
      auto [rec, n] = co_await lowest().async_read_some(buffer_.prepare(kFirstRead), use_tuple);
      if (rec) break;
      total += n;
    }
  }

  // The request goes to the handler; the coroutine sleeps until the
  // Respond callback (any thread, any time) fills the slot. nullopt: forced shutdown.
  net::awaitable<std::optional<Response>> call_handler(Request request) {
    auto slot = std::make_shared<ResponseSlot>();
    slot->conn = this;
    // The slot goes inert when this frame ends, however it ends.
    struct Release {
      ResponseSlot& slot;
      ~Release() {
        std::lock_guard lock(slot.mu);
        slot.gone = true;
      }
    } release{*slot};
    {
      auto responder = std::make_shared<Responder>(slot);
      Respond respond = [responder](Response r) { responder->deliver(std::move(r)); };
      try {
        core_.handler.handle(std::move(request), std::move(respond));
      } catch (const std::exception& e) {
        responder->deliver(internal_error(std::string("the request handler failed: ") + e.what()));
      }
    }
    for (;;) {
      {
        std::lock_guard lock(slot->mu);
        if (slot->response) co_return std::move(*slot->response);
      }
      if (forced_) co_return std::nullopt;
      co_await sleep(wake_);
    }
  }

  net::awaitable<bool> write_response(Response r, bool keep_alive) {
    unsigned status = r.status;
    if (status < 100 || status > 999) {
      r = internal_error("the handler answered with an invalid status");
      status = 500;
    }
    bhttp::response<bhttp::string_body> res;
    res.result(status);
    res.version(parser_ && parser_->get().version() == 10 ? 10 : 11);
    res.set(bhttp::field::server, "entente");
    const bool bodyless = status < 200 || status == 204 || status == 304;
    if (!bodyless) {
      res.set(bhttp::field::content_type,
              is_header_safe(r.content_type) && !r.content_type.empty() ? r.content_type
                                                                        : "application/octet-stream");
      res.body() = std::move(r.body);
    }
    for (const auto& [name, value] : r.headers) {
      if (name.empty() || !is_header_safe(name) || name.find(':') != std::string::npos ||
          !is_header_safe(value)) {
        continue;  // a handler bug must not become header injection
      }
      res.insert(name, value);
    }
    res.keep_alive(keep_alive);
    res.prepare_payload();
    lowest().expires_after(milliseconds(core_.options.read_timeout_ms));
    if (head_) {
      bhttp::response_serializer<bhttp::string_body> sr{res};
      auto [ec, n] = co_await bhttp::async_write_header(*stream_, sr, use_tuple);
      co_return !ec;
    }
    auto [ec, n] = co_await bhttp::async_write(*stream_, res, use_tuple);
    co_return !ec;
  }

  net::awaitable<void> close_gracefully() {
    if (forced_) co_return;
    if (tls_) {
      lowest().expires_after(kTlsShutdown);
      auto [ec] = co_await stream_->async_shutdown(use_tuple);
      (void)ec;  // the peer may just close; either way the connection is over
    } else {
      error_code ec;
      lowest().socket().shutdown(tcp::socket::shutdown_send, ec);
    }
  }

  net::awaitable<void> serve_websocket(Request request) {
    const auto& opt = core_.options;
    Response reject = Response::problem(403, "Forbidden", "the WebSocket upgrade was refused");
    std::shared_ptr<WebSocketSession> session;
    try {
      session = core_.handler.upgrade(request, reject);
    } catch (const std::exception& e) {
      reject = internal_error(std::string("the upgrade handler failed: ") + e.what());
    }
    if (!session) {
      if (co_await write_response(std::move(reject), false)) co_await close_gracefully();
      co_return;
    }

    ws_.emplace(std::move(*stream_));
    stream_.reset();
    // The WebSocket stream keeps its own deadlines; tcp_stream's must be off.
    lowest().expires_never();
    websocket::stream_base::timeout timeouts{};
    timeouts.handshake_timeout = milliseconds(opt.read_timeout_ms);
    // Beast pings after half the idle timeout without traffic and closes at
    // the full timeout: a ping every interval, and a peer that answers none
    // within two intervals is disconnected.
    timeouts.idle_timeout = milliseconds(2 * opt.ws_ping_interval_ms);
    timeouts.keep_alive_pings = true;
    ws_->set_option(timeouts);
    websocket::permessage_deflate pmd;
    pmd.server_enable = false;  // compression costs more CPU than it saves on loopback/LAN
    pmd.client_enable = false;
    ws_->set_option(pmd);
    ws_->read_message_max(opt.ws_max_message_bytes);
    ws_->auto_fragment(false);
    // The subprotocol the handler chose among those offered: a browser
    // that offered any fails the handshake unless one is echoed.
    std::string protocol;
    try {
      protocol = core_.handler.subprotocol(request);
    } catch (...) {
      report_exception(std::current_exception(), "subprotocol");
    }
    ws_->set_option(websocket::stream_base::decorator([protocol](websocket::response_type& res) {
      res.set(bhttp::field::server, "entente");
      if (!protocol.empty() && is_header_safe(protocol) && res.result() == bhttp::status::switching_protocols)
        res.set(bhttp::field::sec_websocket_protocol, protocol);
      // Beast checks the handshake again and answers its own refusals in
      // plain text; check_websocket_handshake should leave it none, but
      // should one come, it is problem+json like every other refusal.
      if (res.result() != bhttp::status::switching_protocols) {
        const unsigned status = res.result_int();
        Response p = Response::problem(status, std::string(bhttp::obsolete_reason(res.result())),
                                       "WebSocket handshake refused: " + res.body());
        res.set(bhttp::field::content_type, p.content_type);
        res.body() = std::move(p.body);
        res.keep_alive(false);
        res.prepare_payload();
      }
    }));
    {
      auto [ec] = co_await ws_->async_accept(parser_->release(), use_tuple);
      if (ec) co_return;
    }
    buffer_.clear();

    ws_core_ = std::make_shared<WsCore>(this, opt.ws_send_buffer_bytes);
    core_.counters.websockets_open.fetch_add(1);
    session_ = std::move(session);
    if (shutting_down_) ws_core_->close(1001, "going away");
    guarded("on_open", [&] { session_->on_open(std::make_shared<WsHandle>(ws_core_)); });

    co_await (read_loop() && write_loop());

    {
      std::function<void()> drain;  // may own the session's handle: freed outside the lock
      std::deque<Outgoing> discarded;
      {
        std::lock_guard lock(ws_core_->mu);
        ws_core_->gone = true;
        ws_core_->closed = true;
        drain = std::move(ws_core_->on_drain);
        discarded.swap(ws_core_->queue);
        ws_core_->queue_bytes = 0;
        ws_core_->inflight_bytes = 0;
      }
    }
    // The peer's close frame: the one it began with, or its answer to ours.
    if (const auto& cr = ws_->reason(); cr.code != websocket::close_code::none) {
      const std::string_view reason(cr.reason.data(), cr.reason.size());
      guarded("on_close_received", [&] { session_->on_close_received(cr.code, reason); });
    }
    guarded("on_close", [&] { session_->on_close(); });
    session_.reset();
    core_.counters.websockets_open.fetch_sub(1);
  }

  // Runs a WebSocketSession callback; an exception closes the connection
  // with 1011 instead of unwinding through the network thread.
  template <class F>
  bool guarded(const char* what, F&& fn) {
    try {
      fn();
      return true;
    } catch (const std::exception& e) {
      base::logf(base::LogLevel::error, "http", "WebSocket %s failed: %s\n", what, e.what());
    } catch (...) {
      base::logf(base::LogLevel::error, "http", "WebSocket %s failed\n", what);
    }
    ws_core_->close(1011, "internal error");
    return false;
  }

  net::awaitable<void> read_loop() {
    for (;;) {
      if (writer_done_ || forced_) break;
      auto [ec, n] = co_await ws_->async_read(ws_buffer_, use_tuple);
      if (ec) break;
      // Read before on_message: a resume_reading() made inside it counts.
      const uint64_t resumes = ws_core_->resumes.load();
      bool more = false;
      const std::string_view data(static_cast<const char*>(ws_buffer_.data().data()),
                                  ws_buffer_.size());
      guarded("on_message", [&] { more = session_->on_message(data, ws_->got_binary()); });
      ws_buffer_.consume(ws_buffer_.size());
      if (!more) {
        while (ws_core_->resumes.load() == resumes && !writer_done_ && !forced_) {
          co_await sleep(reader_wake_);
        }
      }
    }
    reader_done_ = true;
    {
      std::deque<Outgoing> discarded;  // nobody will read them now
      std::lock_guard lock(ws_core_->mu);
      ws_core_->closed = true;
      discarded.swap(ws_core_->queue);
      ws_core_->queue_bytes = 0;
    }
    writer_wake_.cancel();
    // A write stuck on a peer that stopped reading would keep the connection
    // alive; the connection is over, so abort it. A close handshake in
    // progress is left to finish (it is bounded by the handshake timeout).
    if (writer_state_ == WriterState::writing) {
      error_code ec;
      lowest().socket().close(ec);
    }
  }

  net::awaitable<void> write_loop() {
    std::deque<Outgoing> batch;
    for (;;) {
      std::optional<websocket::close_reason> close;
      bool sleep_now = false;
      {
        std::lock_guard lock(ws_core_->mu);
        if (ws_core_->close_request) {
          close = std::move(ws_core_->close_request);
          ws_core_->close_request.reset();
        } else if (!ws_core_->queue.empty()) {
          batch.swap(ws_core_->queue);
          ws_core_->inflight_bytes = ws_core_->queue_bytes;
          ws_core_->queue_bytes = 0;
        } else if (reader_done_ || forced_) {
          break;
        } else {
          ws_core_->writer_idle = true;
          sleep_now = true;
        }
      }
      if (close) {
        writer_state_ = WriterState::closing;
        auto [ec] = co_await ws_->async_close(*close, use_tuple);
        (void)ec;  // closed either way; the reader sees the end
        break;
      }
      if (sleep_now) {
        co_await sleep(writer_wake_);
        continue;
      }
      // Write the batch back to back; a close() in between discards the rest.
      bool failed = false;
      writer_state_ = WriterState::writing;
      while (!batch.empty()) {
        Outgoing& m = batch.front();
        ws_->binary(m.binary);
        auto [ec, n] = co_await ws_->async_write(net::buffer(m.data), use_tuple);
        if (ec) {
          failed = true;
          break;
        }
        const size_t size = m.data.size();
        batch.pop_front();
        std::lock_guard lock(ws_core_->mu);
        ws_core_->inflight_bytes -= size;
        if (ws_core_->close_request) break;
      }
      writer_state_ = WriterState::idle;
      if (!batch.empty()) {
        batch.clear();
        std::lock_guard lock(ws_core_->mu);
        ws_core_->inflight_bytes = 0;
      }
      if (failed) {
        std::lock_guard lock(ws_core_->mu);
        ws_core_->closed = true;
        break;
      }
      std::function<void()> drain;
      {
        std::lock_guard lock(ws_core_->mu);
        if (ws_core_->queue.empty() && !ws_core_->closed) drain = ws_core_->on_drain;
      }
      if (drain) guarded("on_drain", drain);
    }
    writer_done_ = true;
    writer_state_ = WriterState::idle;
    if (!reader_done_) {
      // After a failed write, or a close handshake that ended without the
      // reader noticing, the socket is of no further use: end the read.
      error_code ec;
      if (!ws_->is_open()) lowest().socket().close(ec);
    }
    reader_wake_.cancel();
  }

  enum class WriterState : uint8_t { idle, writing, closing };

  ServerCore& core_;
  const std::chrono::steady_clock::time_point handshake_deadline_;
  const bool tls_ = core_.tls.has_value();
  std::optional<AnyStream> stream_;                 // the HTTP phase
  std::optional<websocket::stream<AnyStream>> ws_;  // after an accepted upgrade
  beast::flat_buffer buffer_;
  beast::flat_buffer ws_buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::string remote_;
  std::shared_ptr<WsCore> ws_core_;
  std::shared_ptr<WebSocketSession> session_;
  // Strand-only state.
  bool idle_ = false;  // waiting for the next request's first byte
  bool head_ = false;  // answering a HEAD request: header only
  bool shutting_down_ = false;
  bool forced_ = false;
  bool reader_done_ = false;
  bool writer_done_ = false;
  WriterState writer_state_ = WriterState::idle;
};

net::awaitable<void> ServerCore::accept_loop() {
  for (;;) {
    auto [ec, socket] =
        co_await acceptor.async_accept(net::any_io_executor(net::make_strand(ioc)), use_tuple);
    if (ec) {
      if (!acceptor.is_open() || ec == net::error::operation_aborted) co_return;
      // Out of descriptors, or a connection reset before accept(): back off
      // briefly instead of spinning.
      net::steady_timer pause(acceptor.get_executor(), milliseconds(20));
      co_await pause.async_wait(use_tuple);
      continue;
    }
    // Refused before any session state exists; the count is checked here,
    // on the acceptor's strand, so admissions cannot race each other.
    if (counters.open.load() >= options.max_connections) {
      counters.refused.fetch_add(1);
      error_code ignored;
      socket.close(ignored);
      continue;
    }
    error_code rec;
    const auto remote = socket.remote_endpoint(rec);
    if (rec) {
      error_code ignored;
      socket.close(ignored);  // gone already (reset before we got to it)
      continue;
    }
    std::string key = address_key(remote.address());
    if (!admit_address(key)) {
      counters.refused_per_address.fetch_add(1);
      error_code ignored;
      socket.close(ignored);
      continue;
    }
    counters.accepted.fetch_add(1);
    counters.open.fetch_add(1);
    spawn_connection(std::move(socket), std::move(key));
  }
}

void ServerCore::spawn_connection(tcp::socket socket, std::string address_key) {
  error_code ec;
  socket.set_option(tcp::no_delay(true), ec);  // small WebSocket frames must not wait for Nagle
  const auto ex = socket.get_executor();
  auto conn = std::make_shared<Connection>(*this, std::move(socket));
  enter();
  net::co_spawn(ex, conn->run(),
                [this, conn, key = std::move(address_key)](std::exception_ptr e) mutable {
                  report_exception(e, "connection");
                  conn.reset();
                  release_address(key);
                  counters.open.fetch_sub(1);
                  leave();
                });
}

}  // namespace

struct Server::Impl : ServerCore {
  using ServerCore::ServerCore;
};

Result<std::unique_ptr<Server>> Server::create(ServerOptions options, Handler& handler) {
  if (options.threads < 1 || options.threads > 256) {
    return make_error(Errc::invalid_argument, "threads must be between 1 and 256");
  }
  if (options.max_connections == 0 || options.max_connections_per_address == 0) {
    return make_error(Errc::invalid_argument,
                      "max_connections and max_connections_per_address must be at least 1");
  }
  if (options.read_timeout_ms <= 0 || options.idle_timeout_ms <= 0 ||
      options.handshake_timeout_ms <= 0 || options.ws_ping_interval_ms <= 0) {
    return make_error(Errc::invalid_argument, "timeouts and the ping interval must be positive");
  }
  if (options.max_header_bytes == 0 || options.max_body_bytes == 0 ||
      options.ws_max_message_bytes == 0) {
    return make_error(Errc::invalid_argument, "size limits must be positive");
  }
  error_code ec;
  std::string host = options.address == "localhost" ? "127.0.0.1" : options.address;
  const auto address = net::ip::make_address(host, ec);
  if (ec) {
    return make_error(Errc::invalid_argument,
                      "address '" + options.address + "' is not an IP address");
  }
  auto impl = std::make_unique<Impl>(options, handler, tcp::endpoint(address, options.port));
  if (options.tls) {
    impl->tls.emplace(ssl::context::tls_server);
    ENTENTE_RETURN_IF_ERROR(
        configure_server_context(*impl->tls, options.cert_file, options.key_file));
    impl->certificate.attach(*impl->tls);
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { stop(); }

Status Server::start() {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    if (s.started || s.stopped) {
      return make_error(Errc::conflict, "the server was started already");
    }
    s.started = true;
  }
  const std::string where = endpoint_string(s.endpoint);
  error_code ec;
  s.acceptor.open(s.endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(s.endpoint, ec);
  if (!ec) s.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    error_code ignored;
    s.acceptor.close(ignored);
    return make_error(Errc::io_error, where + ": " + ec.message());
  }
  s.port = s.acceptor.local_endpoint(ec).port();
  s.work.emplace(net::make_work_guard(s.ioc));
  s.enter();
  net::co_spawn(s.acceptor.get_executor(), s.accept_loop(), [&s](std::exception_ptr e) {
    report_exception(e, "acceptor");
    s.leave();
  });
  s.threads.reserve(s.options.threads);
  for (int i = 0; i < s.options.threads; ++i) {
    s.threads.emplace_back([&s] { s.ioc.run(); });
  }
  return {};
}

uint16_t Server::port() const { return impl_->port; }

Result<bool> Server::reload_certificate(const std::string& cert_file, const std::string& key_file) {
  if (!impl_->tls) return make_error(Errc::conflict, "the API listens without TLS");
  return impl_->certificate.load(cert_file, key_file);
}

Status Server::check_certificate(const std::string& cert_file, const std::string& key_file) const {
  if (!impl_->tls) return make_error(Errc::conflict, "the API listens without TLS");
  ssl::context scratch(ssl::context::tls_server);
  return configure_server_context(scratch, cert_file, key_file);
}

void Server::stop_accepting() {
  Impl& s = *impl_;
  net::post(s.acceptor.get_executor(), [&s] {
    error_code ec;
    s.acceptor.close(ec);
  });
}

void Server::stop() {
  Impl& s = *impl_;
  {
    std::lock_guard lock(s.mu);
    if (s.stopped) return;
    s.stopped = true;
    s.stopping = true;
    if (!s.started) return;
  }
  stop_accepting();
  s.shutdown_all(false);
  {
    std::unique_lock lock(s.mu);
    if (!s.cv.wait_for(lock, kStopGrace, [&s] { return s.tasks == 0; })) {
      lock.unlock();
      s.shutdown_all(true);
      lock.lock();
      s.cv.wait(lock, [&s] { return s.tasks == 0; });
    }
  }
  // Every coroutine has finished; what is left on the queue are stale
  // wake-ups, which run() finishes before returning.
  s.work.reset();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
}

ServerStats Server::stats() const {
  const Counters& c = impl_->counters;
  ServerStats out;
  out.connections_open = c.open.load();
  out.connections_accepted = c.accepted.load();
  out.connections_refused = c.refused.load();
  out.connections_refused_per_address = c.refused_per_address.load();
  out.handshake_timeouts = c.handshake_timeouts.load();
  out.websockets_open = c.websockets_open.load();
  out.tls_handshake_failures = c.tls_failures.load();
  out.bad_requests = c.bad_requests.load();
  return out;
}

}  // namespace entente::http
