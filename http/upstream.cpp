// Asynchronous clients to another node (see upstream.h for the contract).
//
// Shape, as in server.cpp: one io_context with the Upstream's threads; each
// request and each WebSocket is one coroutine on its own strand, counted by
// a gate that stop() waits on. Other threads reach a live WebSocket only
// through its mutex-guarded core (UpWsCore), which posts wake-ups to the
// strand while the coroutine runs and goes inert when it ends, so nothing is
// ever posted to a stopped io_context. Idle keep-alive connections wait in a
// per-target pool (bounded) and are only touched under its mutex.

#include "http/upstream.h"

// GCC 12 misreports Asio's coroutine-frame allocator; see server.cpp.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

#include <sys/socket.h>

#include <boost/asio/experimental/awaitable_operators.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "base/log.h"
#include "http/detail/net.h"
#include "http/detail/text.h"
#include "http/detail/tls.h"
#include "http/detail/upstream_conn.h"

namespace entente::http {
namespace {

using namespace detail;  // NOLINT: the aliases net, beast, bhttp, websocket, ssl, tcp
using namespace net::experimental::awaitable_operators;  // NOLINT: `||` on awaitables
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// RFC 6455: a close reason is at most 123 bytes.
constexpr size_t kMaxCloseReason = 123;
// Client frames are masked through a buffer of this size (see client.cpp).
constexpr size_t kWsWriteBuffer = 64u << 10;

void report_exception(const std::exception_ptr& e, const char* where) {
  if (!e) return;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    base::logf(base::LogLevel::error, "http", "upstream %s ended by an exception: %s\n", where, ex.what());
  } catch (...) {
    base::logf(base::LogLevel::error, "http", "upstream %s ended by an unknown exception\n", where);
  }
}

// Runs a user callback; an exception is reported, never unwound through a
// network thread.
template <class F>
void guarded(const char* what, F&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    base::logf(base::LogLevel::error, "http", "upstream %s callback failed: %s\n", what, e.what());
  } catch (...) {
    base::logf(base::LogLevel::error, "http", "upstream %s callback failed\n", what);
  }
}

// Methods that RFC 9110 §9.2.1 calls safe: resending one cannot change
// anything. PUT and DELETE are idempotent too, but a resent DELETE answers
// 404 after a first one that succeeded unseen, so they are not resent.
bool is_safe_method(std::string_view m) { return m == "GET" || m == "HEAD" || m == "OPTIONS"; }

// The errors by which a pooled connection shows that the node closed it
// while it was idle.
bool is_stale_connection(const error_code& ec) {
  return ec == bhttp::error::end_of_stream || ec == net::error::eof ||
         ec == net::error::connection_reset || ec == net::error::broken_pipe ||
         ec == ssl::error::stream_truncated;
}

Status check_request(std::string_view method, std::string_view target, const HeaderList& headers) {
  if (!is_token(method)) return make_error(Errc::invalid_argument, "invalid method");
  if (!target.starts_with('/') || !is_target(target)) {  // origin form: another node's path
    return make_error(Errc::invalid_argument, "invalid request target '" + std::string(target) + "'");
  }
  for (const auto& [name, value] : headers) {
    if (!is_token(name) || !is_header_safe(value)) {
      return make_error(Errc::invalid_argument, "header '" + name + "' is not a valid header");
    }
  }
  return {};
}

// Cuts `s` to at most `max` bytes without splitting a UTF-8 sequence.
std::string cut_utf8(std::string s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  s.resize(n);
  return s;
}

ClientResponse to_client_response(bhttp::response<bhttp::string_body>&& res) {
  ClientResponse out;
  out.status = res.result_int();
  for (const auto& field : res) {
    out.headers.emplace_back(to_lower(field.name_string()), std::string(field.value()));
  }
  out.body = std::move(res.body());
  return out;
}

std::string target_key(const UpstreamTarget& t) {
  return (t.tls ? "https://" : "http://") + t.address() + "|" + t.server_name + "|" + t.ca_file +
         (t.verify_peer ? "|v" : "|n");
}

// A pooled connection the node closed (or wrote to, e.g. a 408) while it
// was idle: reading without blocking finds EOF or unexpected bytes.
bool idle_connection_alive(UpConn& c) {
  char byte;
  const ssize_t n = ::recv(c.lowest().socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

// Closes a connection on its own strand: a cancelled deadline timer of its
// last request may still have a handler queued there, which must not run
// while another thread destroys the stream.
void discard(std::unique_ptr<UpConn> c) {
  if (!c) return;
  const auto ex = c->lowest().get_executor();
  net::post(ex, [c = std::move(c)]() mutable { c.reset(); });
}

}  // namespace

std::string UpstreamTarget::address() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// ---------------------------------------------------------------------------
// The shared state: threads, gate, pool, TLS contexts. Upstream::Impl.

namespace {

struct UpstreamCore {
  explicit UpstreamCore(UpstreamOptions o) : options(std::move(o)), ioc(options.threads) {}

  UpstreamOptions options;
  net::io_context ioc;  // before every Asio object: destroyed last
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;

  std::mutex mu;
  std::condition_variable cv;
  size_t tasks = 0;  // REQUIRES mu: coroutines not yet finished (the gate)
  bool stopping = false;
  bool stopped = false;
  uint64_t next_task_id = 0;  // REQUIRES mu
  // REQUIRES mu: how to abort each running coroutine (posts to its strand).
  std::unordered_map<uint64_t, std::function<void()>> aborts;
  // REQUIRES mu: idle keep-alive connections by target, oldest first.
  std::unordered_map<std::string, std::deque<std::unique_ptr<UpConn>>> idle;
  size_t idle_count = 0;  // REQUIRES mu
  // REQUIRES mu: client contexts by CA file and verification, made once.
  std::unordered_map<std::string, std::shared_ptr<ssl::context>> contexts;

  std::atomic<uint64_t> connections_opened{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> reused{0};
  std::atomic<uint64_t> retried{0};
  std::atomic<uint64_t> websockets_open{0};

  // Registers a coroutine; 0 once stop() began (then it must not start).
  uint64_t enter(std::function<void()> abort) {
    std::lock_guard lock(mu);
    if (stopping) return 0;
    ++tasks;
    const uint64_t id = ++next_task_id;
    aborts.emplace(id, std::move(abort));
    return id;
  }
  void leave(uint64_t id) {
    std::function<void()> abort;  // may hold the last reference to a session: freed outside
    std::lock_guard lock(mu);
    if (auto it = aborts.find(id); it != aborts.end()) {
      abort = std::move(it->second);
      aborts.erase(it);
    }
    if (--tasks == 0) cv.notify_all();
  }

  Result<std::shared_ptr<ssl::context>> context_for(const UpstreamTarget& t) {
    const std::string key = t.ca_file + (t.verify_peer ? "|v" : "|n");
    std::lock_guard lock(mu);
    if (auto it = contexts.find(key); it != contexts.end()) return it->second;
    auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
    ENTENTE_RETURN_IF_ERROR(configure_client_context(*ctx, t.ca_file, t.verify_peer));
    contexts.emplace(key, ctx);
    return ctx;
  }

  // An idle connection to `key` that still looks open, or nullptr.
  std::unique_ptr<UpConn> take_idle(const std::string& key) {
    std::deque<std::unique_ptr<UpConn>> stale;  // closed after the lock
    std::unique_ptr<UpConn> out;
    {
      std::lock_guard lock(mu);
      auto it = idle.find(key);
      if (it == idle.end()) return nullptr;
      auto& q = it->second;
      const auto oldest = Clock::now() - milliseconds(options.idle_keep_ms);
      while (!q.empty() && !out) {
        std::unique_ptr<UpConn> c = std::move(q.back());  // the most recent: least likely closed
        q.pop_back();
        --idle_count;
        if (c->idle_since >= oldest && idle_connection_alive(*c)) {
          out = std::move(c);
        } else {
          stale.push_back(std::move(c));
        }
      }
      if (q.empty()) idle.erase(it);
    }
    for (auto& c : stale) discard(std::move(c));
    return out;
  }

  void give_back(const std::string& key, std::unique_ptr<UpConn> c) {
    std::unique_ptr<UpConn> extra;  // closed after the lock
    {
      std::lock_guard lock(mu);
      if (stopping) {
        extra = std::move(c);
      } else {
        auto& q = idle[key];
        c->idle_since = Clock::now();
        q.push_back(std::move(c));
        ++idle_count;
        if (q.size() > options.max_idle_per_target) {
          extra = std::move(q.front());
          q.pop_front();
          --idle_count;
        }
      }
    }
    discard(std::move(extra));
  }

  net::awaitable<Result<std::unique_ptr<UpConn>>> connect(const UpstreamTarget& t,
                                                          std::shared_ptr<UpAbort> abort);
};

// ---------------------------------------------------------------------------
// Connecting: resolve, TCP, TLS, all within connect_timeout_ms.

net::awaitable<Result<std::unique_ptr<UpConn>>> UpstreamCore::connect(
    const UpstreamTarget& t, std::shared_ptr<UpAbort> abort) {
  const auto ex = co_await net::this_coro::executor;
  const auto deadline = Clock::now() + milliseconds(options.connect_timeout_ms);
  const std::string where = t.address();
  auto io_failure = [&](std::string_view what, const error_code& ec) {
    if (abort->aborted) return make_error(Errc::unavailable, "the forwarding client stopped");
    if (ec == beast::error::timeout || ec == net::error::timed_out) {
      return make_error(Errc::unavailable, std::string(what) + " " + where + ": timed out after " +
                                               std::to_string(options.connect_timeout_ms) + " ms");
    }
    return make_error(Errc::io_error, std::string(what) + " " + where + ": " + ec.message());
  };

  std::shared_ptr<ssl::context> ctx;
  if (t.tls) {
    auto made = context_for(t);
    if (!made.ok()) co_return made.error();
    ctx = std::move(*made);
  }

  tcp::resolver::results_type endpoints;
  {
    tcp::resolver resolver(ex);
    net::steady_timer timer(ex, deadline);
    abort->timer = &timer;
    auto result = co_await (resolver.async_resolve(t.host, std::to_string(t.port), use_tuple) ||
                            timer.async_wait(use_tuple));
    abort->timer = nullptr;
    if (result.index() == 1) co_return io_failure("resolve", beast::error::timeout);
    auto [ec, found] = std::get<0>(std::move(result));
    if (ec) co_return io_failure("resolve", ec);
    endpoints = std::move(found);
  }

  auto conn = std::make_unique<UpConn>();
  conn->ctx = ctx;
  beast::tcp_stream stream(ex);
  stream.expires_at(deadline);
  abort->stream = &stream;
  auto [cec, ep] = co_await stream.async_connect(endpoints, use_tuple);
  abort->stream = nullptr;
  if (cec || abort->aborted) co_return io_failure("connect to", cec);
  connections_opened.fetch_add(1);
  error_code ignored;
  stream.socket().set_option(tcp::no_delay(true), ignored);
  if (!t.tls) {
    conn->stream.emplace(stream.release_socket());
    co_return conn;
  }
  conn->stream.emplace(stream.release_socket(), *ctx);
  conn->lowest().expires_at(deadline);
  const std::string& name = t.server_name.empty() ? t.host : t.server_name;
  if (Status s = configure_client_connection(conn->stream->native_handle(), name, t.verify_peer);
      !s.ok()) {
    co_return s.error();
  }
  abort->stream = &conn->lowest();
  auto [hec] = co_await conn->stream->async_handshake(ssl::stream_base::client, use_tuple);
  abort->stream = nullptr;
  if (hec) {
    if (abort->aborted || hec == beast::error::timeout) co_return io_failure("TLS handshake with", hec);
    co_return make_error(Errc::io_error, "TLS handshake with " + where + " failed: " +
                                             handshake_failure(conn->stream->native_handle(), hec));
  }
  conn->lowest().expires_never();
  co_return conn;
}

// ---------------------------------------------------------------------------
// HTTP requests.

struct UpRequest {
  UpstreamTarget target;
  std::string key;
  std::string method;
  std::string path;
  HeaderList headers;
  std::string body;
  std::function<void(Result<ClientResponse>)> done;
  bool answered = false;  // the coroutine's strand, then its completion handler

  void answer(Result<ClientResponse> r) {
    answered = true;
    done(std::move(r));
  }
};

struct Exchange {
  error_code ec;
  bool writing = false;  // the error came while sending the request
  std::optional<ClientResponse> response;
  bool keep_alive = false;
};

net::awaitable<Exchange> exchange(UpConn& c, const bhttp::request<bhttp::string_body>& req, int64_t timeout_ms,
                                  const UpstreamOptions& o, bool head) {
  Exchange out;
  c.lowest().expires_after(milliseconds(timeout_ms));
  {
    auto [ec, n] = co_await bhttp::async_write(*c.stream, req, use_tuple);
    out.ec = ec;
  }
  if (out.ec) {
    out.writing = true;
    co_return out;
  }
  bhttp::response_parser<bhttp::string_body> parser;
  parser.body_limit(o.max_response_bytes);
  parser.header_limit(static_cast<uint32_t>(std::min<size_t>(o.max_response_header_bytes, UINT32_MAX)));
  parser.skip(head);
  {
    auto [ec, n] = co_await bhttp::async_read(*c.stream, c.buffer, parser, use_tuple);
    out.ec = ec;
  }
  if (out.ec) co_return out;
  c.lowest().expires_never();
  auto res = parser.release();
  out.keep_alive = res.keep_alive();
  out.response = to_client_response(std::move(res));
  co_return out;
}

}  // namespace

struct Upstream::Impl : UpstreamCore {
  using UpstreamCore::UpstreamCore;
};

Result<std::unique_ptr<Upstream>> Upstream::create(UpstreamOptions options) {
  if (options.threads < 1 || options.threads > 256) {
    return make_error(Errc::invalid_argument, "threads must be between 1 and 256");
  }
  if (options.connect_timeout_ms <= 0 || options.request_timeout_ms <= 0 ||
      options.ws_handshake_timeout_ms <= 0 || options.ws_ping_interval_ms <= 0 ||
      options.idle_keep_ms <= 0) {
    return make_error(Errc::invalid_argument, "timeouts and the ping interval must be positive");
  }
  if (options.max_response_bytes == 0 || options.max_response_header_bytes == 0 ||
      options.ws_max_message_bytes == 0 || options.ws_send_buffer_bytes == 0) {
    return make_error(Errc::invalid_argument, "size limits must be positive");
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->work.emplace(net::make_work_guard(impl->ioc));
  for (int i = 0; i < impl->options.threads; ++i) {
    impl->threads.emplace_back([s = impl.get()] { s->ioc.run(); });
  }
  return std::unique_ptr<Upstream>(new Upstream(std::move(impl)));
}

Upstream::Upstream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Upstream::~Upstream() { stop(); }

void Upstream::stop() {
  Impl& s = *impl_;
  std::deque<std::unique_ptr<UpConn>> idle;  // closed after the lock
  std::vector<std::function<void()>> aborts;
  {
    std::lock_guard lock(s.mu);
    if (s.stopped) return;
    s.stopped = true;
    s.stopping = true;
    for (auto& [key, q] : s.idle) {
      for (auto& c : q) idle.push_back(std::move(c));
    }
    s.idle.clear();
    s.idle_count = 0;
    for (auto& [id, abort] : s.aborts) aborts.push_back(abort);
  }
  for (auto& c : idle) discard(std::move(c));  // run before the threads end
  for (auto& abort : aborts) abort();
  {
    std::unique_lock lock(s.mu);
    s.cv.wait(lock, [&s] { return s.tasks == 0; });
  }
  // Every coroutine has finished; run() drains the stale wake-ups left.
  s.work.reset();
  for (auto& t : s.threads) t.join();
  s.threads.clear();
}

UpstreamStats Upstream::stats() const {
  Impl& s = *impl_;
  UpstreamStats out;
  out.connections_opened = s.connections_opened.load();
  out.requests = s.requests.load();
  out.reused = s.reused.load();
  out.retried = s.retried.load();
  out.websockets_open = s.websockets_open.load();
  std::lock_guard lock(s.mu);
  out.idle_connections = s.idle_count;
  return out;
}

void Upstream::request(const UpstreamTarget& target, std::string method,
                       std::string path_and_query, HeaderList headers, std::string body,
                       std::function<void(Result<ClientResponse>)> done) {
  Impl& s = *impl_;
  if (Status st = check_request(method, path_and_query, headers); !st.ok()) {
    done(st.error());
    return;
  }
  auto req = std::make_shared<UpRequest>();
  req->target = target;
  req->key = target_key(target);
  req->method = std::move(method);
  req->path = std::move(path_and_query);
  req->headers = std::move(headers);
  req->body = std::move(body);
  req->done = std::move(done);

  std::unique_ptr<UpConn> pooled = s.take_idle(req->key);
  // A pooled connection stays on the strand it was made on; a new one gets its own.
  const net::any_io_executor ex =
      pooled ? pooled->lowest().get_executor() : net::any_io_executor(net::make_strand(s.ioc));
  auto abort = std::make_shared<UpAbort>(ex);
  const uint64_t id = s.enter([abort] { abort->post_abort(); });
  if (id == 0) {
    req->done(make_error(Errc::unavailable, "the forwarding client stopped"));
    return;
  }

  auto run = [](UpstreamCore& s, std::shared_ptr<UpRequest> req, std::shared_ptr<UpAbort> abort,
                std::unique_ptr<UpConn> conn) -> net::awaitable<void> {
    bhttp::request<bhttp::string_body> msg;
    const bhttp::verb verb = bhttp::string_to_verb(req->method);
    if (verb == bhttp::verb::unknown) {
      msg.method_string(req->method);
    } else {
      msg.method(verb);
    }
    msg.target(req->path);
    msg.version(11);
    msg.set(bhttp::field::host, req->target.address());
    msg.set(bhttp::field::user_agent, "entente-upstream");
    msg.keep_alive(true);
    for (const auto& [name, value] : req->headers) msg.set(name, value);
    msg.body() = std::move(req->body);
    msg.prepare_payload();
    const bool safe = is_safe_method(req->method);
    const std::string where = req->target.address();
    const int64_t timeout_ms =
        req->target.request_timeout_ms > 0 ? req->target.request_timeout_ms : s.options.request_timeout_ms;

    for (int attempt = 0;; ++attempt) {
      const bool reused = conn != nullptr;
      if (!conn) {
        auto made = co_await s.connect(req->target, abort);
        if (!made.ok()) {
          req->answer(made.error());
          co_return;
        }
        conn = std::move(*made);
      } else {
        s.reused.fetch_add(1);
      }
      abort->stream = &conn->lowest();
      Exchange x = co_await exchange(*conn, msg, timeout_ms, s.options, verb == bhttp::verb::head);
      abort->stream = nullptr;
      if (abort->aborted) {
        req->answer(make_error(Errc::unavailable, "the forwarding client stopped"));
        co_return;
      }
      if (!x.ec) {
        s.requests.fetch_add(1);
        if (x.keep_alive) s.give_back(req->key, std::move(conn));
        req->answer(std::move(*x.response));
        co_return;
      }
      conn.reset();
      if (reused && attempt == 0 && is_stale_connection(x.ec)) {
        if (safe) {
          s.retried.fetch_add(1);
          continue;
        }
        req->answer(make_error(Errc::io_error,
                             "the connection to " + where + " closed before an answer to " +
                                 req->method + " " + req->path +
                                 " came; it is not resent, as it may have been applied"));
        co_return;
      }
      if (x.ec == beast::error::timeout) {
        req->answer(make_error(Errc::unavailable,
                             "no answer from " + where + " within " + std::to_string(timeout_ms) + " ms"));
      } else if (x.ec == bhttp::error::body_limit || x.ec == bhttp::error::header_limit) {
        req->answer(make_error(Errc::limit_exceeded,
                             "the response from " + where + " exceeds " +
                                 std::to_string(x.ec == bhttp::error::body_limit
                                                    ? s.options.max_response_bytes
                                                    : s.options.max_response_header_bytes) +
                                 " bytes"));
      } else {
        req->answer(make_error(Errc::io_error, std::string(x.writing ? "send the request to "
                                                                   : "read the response from ") +
                                                 where + ": " + x.ec.message()));
      }
      co_return;
    }
  };
  net::co_spawn(ex, run(s, req, abort, std::move(pooled)), [&s, id, req](std::exception_ptr e) {
    report_exception(e, "request");
    if (!req->answered) {
      req->answer(make_error(Errc::io_error, "the request to " + req->target.address() + " failed"));
    }
    s.leave(id);
  });
}

// ---------------------------------------------------------------------------
// WebSockets.

namespace {

struct UpOutgoing {
  std::string data;
  bool binary = false;
};

class UpWsSession;

// The thread-safe half of one upstream WebSocket: the send queue and the
// requests (close, pause, resume) other threads make. The session's
// coroutine drains it; `gone` is set when the coroutine ends, after which
// every call is a no-op answering `closed`.
struct UpWsCore {
  explicit UpWsCore(size_t limit) : limit_bytes(limit) {}

  mutable std::mutex mu;
  UpWsSession* session = nullptr;  // REQUIRES mu; valid while !gone
  const size_t limit_bytes;
  bool gone = false;    // REQUIRES mu
  bool closed = false;  // REQUIRES mu: close requested or the connection ended
  std::optional<websocket::close_reason> close_request;  // REQUIRES mu
  std::deque<UpOutgoing> queue;                          // REQUIRES mu
  size_t queue_bytes = 0;                                // REQUIRES mu
  size_t inflight_bytes = 0;  // REQUIRES mu: taken by the writer, not yet written
  bool writer_idle = false;   // REQUIRES mu: the writer sleeps; the next send wakes it
  bool paused = false;        // REQUIRES mu
  std::atomic<unsigned> refused_status{0};
};

// One WebSocket's coroutine, stream and timers; owned by shared_ptr (the
// coroutine's completion, stop()'s abort and queued wake-ups), so it lives
// until the io_context has no more work for it. Strand-only state below.
class UpWsSession final : public std::enable_shared_from_this<UpWsSession> {
 public:
  UpWsSession(UpstreamCore& up, net::any_io_executor ex, UpstreamTarget target,
              std::string path, HeaderList headers, UpstreamWebSocketCallbacks callbacks,
              std::shared_ptr<UpWsCore> core)
      : up_(up),
        executor_(ex),
        target_(std::move(target)),
        path_(std::move(path)),
        headers_(std::move(headers)),
        callbacks_(std::move(callbacks)),
        core_(std::move(core)),
        abort_(std::make_shared<UpAbort>(ex)),
        writer_wake_(ex),
        reader_wake_(ex) {}

  // Any thread, while !core_->gone (callers check under core_->mu).
  void post_writer_wake() {
    net::post(executor_, [self = shared_from_this()] { self->writer_wake_.cancel(); });
  }
  void post_reader_wake() {
    net::post(executor_, [self = shared_from_this()] { self->reader_wake_.cancel(); });
  }
  // stop(): ends the connection; on_close reports 1001 "going away".
  void post_abort() {
    net::post(executor_, [self = shared_from_this()] {
      self->aborted_ = true;
      self->abort_->aborted = true;
      if (self->abort_->timer != nullptr) self->abort_->timer->cancel();
      if (self->abort_->stream != nullptr) {
        error_code ec;
        self->abort_->stream->socket().close(ec);
      }
      self->writer_wake_.cancel();
      self->reader_wake_.cancel();
    });
  }

  net::awaitable<void> run() {
    auto made = co_await up_.connect(target_, abort_);
    if (!made.ok()) {
      if (aborted_) {
        finish(1001, "going away");
      } else {
        finish(1006, made.error().message);
      }
      co_return;
    }
    std::unique_ptr<UpConn> conn = std::move(*made);
    ctx_ = conn->ctx;
    ws_.emplace(std::move(*conn->stream));
    abort_->stream = &ws_->next_layer().lowest();
    co_await session(*ws_);
    // The stream goes now, on the strand: a refused or closed WebSocket can
    // leave Beast's handshake timer armed, and a pending timer would hold
    // stop() (which waits for the io_context's work) until it fires.
    abort_->stream = nullptr;
    ws_.reset();
  }

 private:
  static net::awaitable<void> sleep(net::steady_timer& timer) {
    timer.expires_at(net::steady_timer::time_point::max());
    co_await timer.async_wait(use_tuple);
  }

  template <class WS>
  net::awaitable<void> session(WS& ws) {
    const UpstreamOptions& o = up_.options;
    ws.next_layer().lowest().expires_never();  // the WebSocket keeps its own deadlines
    websocket::stream_base::timeout timeouts{};
    timeouts.handshake_timeout = milliseconds(o.ws_handshake_timeout_ms);  // also bounds close
    timeouts.idle_timeout = milliseconds(2 * o.ws_ping_interval_ms);
    timeouts.keep_alive_pings = true;
    ws.set_option(timeouts);
    ws.read_message_max(o.ws_max_message_bytes);
    ws.write_buffer_bytes(kWsWriteBuffer);
    ws.auto_fragment(false);
    ws.set_option(websocket::stream_base::decorator([this](websocket::request_type& req) {
      req.set(bhttp::field::user_agent, "entente-upstream");
      for (const auto& [name, value] : headers_) req.set(name, value);
    }));
    websocket::response_type res;
    auto [ec] = co_await ws.async_handshake(res, target_.address(), path_, use_tuple);
    if (ec) {
      const unsigned status = res.result_int();
      if (aborted_) {
        finish(1001, "going away");
      } else if (ec == websocket::error::upgrade_declined && status != 0) {
        core_->refused_status.store(status);
        finish(1006, "HTTP " + std::to_string(status) + ": " + res.body());
      } else {
        finish(1006, "WebSocket handshake with " + target_.address() + ": " + ec.message());
      }
      co_return;
    }
    up_.websockets_open.fetch_add(1);
    if (callbacks_.on_open) guarded("on_open", callbacks_.on_open);

    co_await (read_loop(ws) && write_loop(ws));

    up_.websockets_open.fetch_sub(1);
    if (aborted_) {
      finish(1001, "going away");
    } else if (sent_close_) {
      finish(sent_close_->code, std::string(sent_close_->reason.data(), sent_close_->reason.size()));
    } else if (ws.reason().code != websocket::close_code::none) {
      finish(ws.reason().code, std::string(ws.reason().reason.data(), ws.reason().reason.size()));
    } else {
      finish(1006, "the connection to " + target_.address() + " broke: " +
                       (fail_ec_ ? fail_ec_.message() : std::string("closed")));
    }
  }

  template <class WS>
  net::awaitable<void> read_loop(WS& ws) {
    for (;;) {
      for (;;) {
        bool paused = false;
        {
          std::lock_guard lock(core_->mu);
          paused = core_->paused;
        }
        if (!paused || writer_done_ || aborted_) break;
        co_await sleep(reader_wake_);
      }
      if (writer_done_ || aborted_) break;
      auto [ec, n] = co_await ws.async_read(buffer_, use_tuple);
      if (ec) {
        if (!fail_ec_) fail_ec_ = ec;
        break;
      }
      std::string data = beast::buffers_to_string(buffer_.data());
      buffer_.consume(buffer_.size());
      if (callbacks_.on_message) {
        guarded("on_message", [&] { callbacks_.on_message(std::move(data), ws.got_binary()); });
      }
    }
    reader_done_ = true;
    {
      std::deque<UpOutgoing> discarded;  // nobody will read them now
      std::lock_guard lock(core_->mu);
      core_->closed = true;
      discarded.swap(core_->queue);
      core_->queue_bytes = 0;
    }
    writer_wake_.cancel();
    // A write stuck on a node that stopped reading would keep the
    // connection alive; it is over, so abort it. A close handshake in
    // progress is left to finish (bounded by the handshake timeout).
    if (writer_state_ == WriterState::writing) {
      error_code ignored;
      ws.next_layer().lowest().socket().close(ignored);
    }
  }

  template <class WS>
  net::awaitable<void> write_loop(WS& ws) {
    std::deque<UpOutgoing> batch;
    for (;;) {
      std::optional<websocket::close_reason> close;
      bool sleep_now = false;
      {
        std::lock_guard lock(core_->mu);
        if (!core_->queue.empty()) {
          // The queue first: close() sends its frame after what was queued.
          batch.swap(core_->queue);
          core_->inflight_bytes = core_->queue_bytes;
          core_->queue_bytes = 0;
        } else if (core_->close_request) {
          close = std::move(core_->close_request);
          core_->close_request.reset();
        } else if (reader_done_ || aborted_) {
          break;
        } else {
          core_->writer_idle = true;
          sleep_now = true;
        }
      }
      if (close) {
        sent_close_ = *close;
        writer_state_ = WriterState::closing;
        auto [ec] = co_await ws.async_close(*close, use_tuple);
        (void)ec;  // closed either way; the reader sees the end
        break;
      }
      if (sleep_now) {
        co_await sleep(writer_wake_);
        continue;
      }
      bool failed = false;
      writer_state_ = WriterState::writing;
      while (!batch.empty()) {
        UpOutgoing& m = batch.front();
        ws.binary(m.binary);
        auto [ec, n] = co_await ws.async_write(net::buffer(m.data), use_tuple);
        if (ec) {
          if (!fail_ec_) fail_ec_ = ec;
          failed = true;
          break;
        }
        const size_t size = m.data.size();
        batch.pop_front();
        std::lock_guard lock(core_->mu);
        core_->inflight_bytes -= size;
      }
      writer_state_ = WriterState::idle;
      if (failed) {
        batch.clear();
        std::lock_guard lock(core_->mu);
        core_->inflight_bytes = 0;
        core_->closed = true;
        break;
      }
      bool drained = false;
      {
        std::lock_guard lock(core_->mu);
        drained = core_->queue.empty() && !core_->closed;
      }
      if (drained && callbacks_.on_drain) guarded("on_drain", callbacks_.on_drain);
    }
    writer_done_ = true;
    writer_state_ = WriterState::idle;
    if (!reader_done_ && !ws.is_open()) {
      // After a failed write, or a close handshake the reader did not see
      // end: the socket is of no further use.
      error_code ignored;
      ws.next_layer().lowest().socket().close(ignored);
    }
    reader_wake_.cancel();
  }

  // The end: the core goes inert, then on_close (exactly once).
  void finish(uint16_t code, std::string reason) {
    {
      std::deque<UpOutgoing> discarded;
      std::lock_guard lock(core_->mu);
      core_->gone = true;
      core_->closed = true;
      core_->session = nullptr;
      discarded.swap(core_->queue);
      core_->queue_bytes = 0;
      core_->inflight_bytes = 0;
    }
    UpstreamWebSocketCallbacks callbacks = std::move(callbacks_);
    callbacks_ = {};
    if (callbacks.on_close) {
      guarded("on_close", [&] { callbacks.on_close(code, std::move(reason)); });
    }
  }

  enum class WriterState : uint8_t { idle, writing, closing };

  UpstreamCore& up_;
  net::any_io_executor executor_;
  const UpstreamTarget target_;
  const std::string path_;
  const HeaderList headers_;
  UpstreamWebSocketCallbacks callbacks_;
  std::shared_ptr<UpWsCore> core_;
  std::shared_ptr<UpAbort> abort_;
  net::steady_timer writer_wake_;
  net::steady_timer reader_wake_;
  std::shared_ptr<ssl::context> ctx_;  // before ws_: outlives it
  std::optional<websocket::stream<AnyStream>> ws_;
  beast::flat_buffer buffer_;
  bool aborted_ = false;
  bool reader_done_ = false;
  bool writer_done_ = false;
  WriterState writer_state_ = WriterState::idle;
  std::optional<websocket::close_reason> sent_close_;
  error_code fail_ec_;
};

class UpWsHandle final : public UpstreamWebSocket {
 public:
  explicit UpWsHandle(std::shared_ptr<UpWsCore> core) : core_(std::move(core)) {}

  WebSocket::SendResult send(std::string data, bool binary) override {
    UpWsCore& c = *core_;
    std::lock_guard lock(c.mu);
    if (c.closed || c.gone) return WebSocket::SendResult::closed;
    const size_t size = data.size();
    const size_t held = c.queue_bytes + c.inflight_bytes;
    if (held > 0 && held + size > c.limit_bytes) return WebSocket::SendResult::overflow;
    c.queue.push_back(UpOutgoing{std::move(data), binary});
    c.queue_bytes += size;
    if (c.writer_idle) {
      c.writer_idle = false;
      c.session->post_writer_wake();
    }
    return WebSocket::SendResult::ok;
  }
  void close(uint16_t code, std::string reason) override {
    UpWsCore& c = *core_;
    std::lock_guard lock(c.mu);
    if (c.closed || c.gone) return;
    c.closed = true;
    websocket::close_reason cr;
    cr.code = code;
    cr.reason = cut_utf8(std::move(reason), kMaxCloseReason);
    c.close_request = std::move(cr);
    if (c.writer_idle) {
      c.writer_idle = false;
      c.session->post_writer_wake();
    }
  }
  void pause_reading() override {
    std::lock_guard lock(core_->mu);
    core_->paused = true;
  }
  void resume_reading() override {
    std::lock_guard lock(core_->mu);
    if (!core_->paused) return;
    core_->paused = false;
    if (!core_->gone) core_->session->post_reader_wake();
  }
  size_t queued_bytes() const override {
    std::lock_guard lock(core_->mu);
    return core_->queue_bytes + core_->inflight_bytes;
  }
  unsigned refused_status() const override { return core_->refused_status.load(); }

 private:
  std::shared_ptr<UpWsCore> core_;
};

}  // namespace

std::shared_ptr<UpstreamWebSocket> Upstream::websocket(const UpstreamTarget& target,
                                                       std::string path_and_query,
                                                       HeaderList headers,
                                                       UpstreamWebSocketCallbacks callbacks) {
  Impl& s = *impl_;
  if (!check_request("GET", path_and_query, headers).ok()) return nullptr;
  auto core = std::make_shared<UpWsCore>(s.options.ws_send_buffer_bytes);
  const net::any_io_executor ex(net::make_strand(s.ioc));
  auto session = std::make_shared<UpWsSession>(s, ex, target, std::move(path_and_query),
                                               std::move(headers), std::move(callbacks), core);
  core->session = session.get();
  const uint64_t id = s.enter([session] { session->post_abort(); });
  if (id == 0) return nullptr;
  net::co_spawn(ex, session->run(), [&s, id, session](std::exception_ptr e) {
    report_exception(e, "WebSocket");
    s.leave(id);
  });
  return std::make_shared<UpWsHandle>(std::move(core));
}

}  // namespace entente::http
