// Blocking HTTP(S) and WebSocket clients (see client.h). Each object owns an
// io_context that only the calling thread runs: an operation starts an async
// Beast operation and runs the context until it completes or its deadline
// passes. Deadlines on the HTTP client close the connection; the WebSocket
// client's receive() deadline and a streamed response's read_stream()
// deadline do not: the read stays pending and the next call resumes it, so
// a timeout leaves the connection usable.

#include "http/client.h"

#include <chrono>
#include <thread>

#include "http/detail/any_stream.h"
#include "http/detail/net.h"
#include "http/detail/text.h"
#include "http/detail/tls.h"

namespace entente::http {
namespace {

using namespace detail;  // NOLINT: the aliases net, beast, bhttp, websocket, ssl, tcp
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr uint32_t kMaxResponseHeader = 1u << 20;
constexpr size_t kWsMaxMessage = 256u << 20;
// Client frames are masked through a buffer of this size; the default (4 KB)
// would split a batched frame into many small writes.
constexpr size_t kWsWriteBuffer = 64u << 10;

// Runs `ioc` on the calling thread until `done` or `deadline`. False on timeout.
bool run_until(net::io_context& ioc, const bool& done, Clock::time_point deadline) {
  while (!done) {
    if (ioc.stopped()) ioc.restart();
    const auto now = Clock::now();
    if (now >= deadline) return false;
    ioc.run_one_for(deadline - now);
  }
  return true;
}

// Runs `ioc` until an operation whose socket was just closed reports back:
// its handler refers to the caller's stack and must not outlive it.
void finish(net::io_context& ioc, const bool& done) {
  while (!done) {
    if (ioc.stopped()) ioc.restart();
    ioc.run_one();
  }
}

Clock::time_point deadline_after(int64_t ms) { return Clock::now() + milliseconds(ms); }

std::string where(const ClientOptions& o) { return o.host + ":" + std::to_string(o.port); }

Error io_error(const ClientOptions& o, std::string_view what, const error_code& ec) {
  return make_error(Errc::io_error, std::string(what) + " " + where(o) + ": " + ec.message());
}

// Resolves and connects; the socket has TCP_NODELAY set.
Result<tcp::socket> connect_socket(net::io_context& ioc, const ClientOptions& o) {
  if (o.timeout_ms <= 0) return make_error(Errc::invalid_argument, "timeout_ms must be positive");
  const auto deadline = deadline_after(o.timeout_ms);
  tcp::resolver resolver(ioc);
  bool done = false;
  error_code ec;
  tcp::resolver::results_type results;
  resolver.async_resolve(o.host, std::to_string(o.port),
                         [&](error_code e, tcp::resolver::results_type r) {
                           ec = e;
                           results = std::move(r);
                           done = true;
                         });
  if (!run_until(ioc, done, deadline)) {
    resolver.cancel();
    finish(ioc, done);
    return io_error(o, "resolve", beast::error::timeout);
  }
  if (ec) return io_error(o, "resolve", ec);

  beast::tcp_stream stream(ioc);
  stream.expires_at(deadline);
  done = false;
  stream.async_connect(results, [&](error_code e, const tcp::endpoint&) {
    ec = e;
    done = true;
  });
  finish(ioc, done);  // bounded by the stream's deadline
  if (ec) return io_error(o, "connect to", ec);
  stream.expires_never();
  error_code ignored;
  stream.socket().set_option(tcp::no_delay(true), ignored);
  return stream.release_socket();
}

Status make_client_context(std::optional<ssl::context>& ctx, const ClientOptions& o) {
  if (!o.tls) return {};
  ctx.emplace(ssl::context::tls_client);
  return configure_client_context(*ctx, o.ca_file, o.verify_peer);
}

// TLS handshake on a connected stream, verifying the name or address.
Status tls_handshake(net::io_context& ioc, AnyStream& stream, const ClientOptions& o) {
  const std::string& name = o.server_name.empty() ? o.host : o.server_name;
  ENTENTE_RETURN_IF_ERROR(configure_client_connection(stream.native_handle(), name, o.verify_peer));
  stream.lowest().expires_after(milliseconds(o.timeout_ms));
  bool done = false;
  error_code ec;
  stream.async_handshake(ssl::stream_base::client, [&](error_code e) {
    ec = e;
    done = true;
  });
  finish(ioc, done);
  stream.lowest().expires_never();
  if (ec) {
    return make_error(Errc::io_error, "TLS handshake with " + where(o) + " failed: " +
                                          handshake_failure(stream.native_handle(), ec));
  }
  return {};
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

Status check_headers(const std::vector<std::pair<std::string, std::string>>& headers) {
  for (const auto& [name, value] : headers) {
    if (!is_token(name) || !is_header_safe(value)) {
      return make_error(Errc::invalid_argument, "header '" + name + "' is not a valid header");
    }
  }
  return {};
}

}  // namespace

std::optional<std::string_view> ClientResponse::header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers) {
    if (k == lower_name) return std::string_view(v);
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Client

struct Client::Impl {
  net::io_context ioc{1};  // first: destroyed after the streams
  ClientOptions options;
  std::optional<ssl::context> ssl_ctx;
  std::optional<AnyStream> conn;  // plain or TLS
  beast::flat_buffer buffer;
  bool closed = false;  // by the server (Connection: close) or after an error
  // A streamed response (start_stream): its parser writes the body into
  // `piece`. The read outlives a read_stream() that timed out; its result
  // waits in stream_done / stream_ec.
  std::optional<bhttp::response_parser<bhttp::buffer_body>> stream;
  std::vector<char> piece;
  bool stream_pending = false;
  bool stream_done = false;
  error_code stream_ec;

  beast::tcp_stream& lowest() { return conn->lowest(); }

  // Why the connection cannot take a request now, if it cannot.
  Status check_free() const {
    if (closed) return make_error(Errc::io_error, "the connection to " + where(options) + " is closed");
    if (stream) {
      return make_error(Errc::io_error,
                        "a streamed response from " + where(options) + " is still being read");
    }
    return {};
  }

  // Ends the streamed response: the connection serves requests again if
  // the server keeps it alive.
  BodyPiece end_stream(BodyPiece piece_out) {
    if (!stream->get().keep_alive()) closed = true;
    stream.reset();
    piece_out.end = true;
    return piece_out;
  }

  // Checks and writes one request (keep-alive); returns its verb.
  Result<bhttp::verb> send_request(std::string_view method, std::string_view target,
                                   std::string_view body, std::string_view content_type,
                                   const std::vector<std::pair<std::string, std::string>>& headers) {
    if (!is_token(method)) return make_error(Errc::invalid_argument, "invalid method");
    if (!is_target(target)) return make_error(Errc::invalid_argument, "invalid request target");
    if (!is_header_safe(content_type)) return make_error(Errc::invalid_argument, "invalid content type");
    ENTENTE_RETURN_IF_ERROR(check_headers(headers));
    ENTENTE_RETURN_IF_ERROR(check_free());
    bhttp::request<bhttp::string_body> req;
    const bhttp::verb verb = bhttp::string_to_verb(method);
    if (verb == bhttp::verb::unknown) {
      req.method_string(method);
    } else {
      req.method(verb);
    }
    req.target(target);
    req.version(11);
    req.set(bhttp::field::host, options.host + ":" + std::to_string(options.port));
    req.set(bhttp::field::user_agent, "entente-client");
    if (!body.empty() && !content_type.empty()) req.set(bhttp::field::content_type, content_type);
    req.keep_alive(true);  // before the caller's headers, which may say "Connection: close"
    for (const auto& [name, value] : headers) req.set(name, value);
    req.body() = std::string(body);
    req.prepare_payload();
    const error_code ec =
        run([&](auto& stream, auto& handler) { bhttp::async_write(stream, req, handler); });
    if (ec) {
      closed = true;
      return io_error(options, "send the request to", ec);
    }
    return verb;
  }

  // Runs one async operation on the stream, under the deadline.
  template <class Op>
  error_code run(Op&& op) {
    lowest().expires_after(milliseconds(options.timeout_ms));
    bool done = false;
    error_code ec;
    auto handler = [&](error_code e, std::size_t) {
      ec = e;
      done = true;
    };
    op(*conn, handler);
    finish(ioc, done);  // bounded by the stream's deadline
    return ec;
  }

  Result<ClientResponse> read_response(bool head) {
    bhttp::response_parser<bhttp::string_body> parser;
    parser.body_limit(options.max_body_bytes);
    parser.header_limit(kMaxResponseHeader);
    parser.skip(head);
    const error_code ec = run([&](auto& stream, auto& handler) {
      bhttp::async_read(stream, buffer, parser, handler);
    });
    if (ec) {
      closed = true;
      return io_error(options, "read the response from", ec);
    }
    auto res = parser.release();
    if (!res.keep_alive()) closed = true;
    return to_client_response(std::move(res));
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() {
  if (!impl_) return;
  error_code ec;
  impl_->lowest().socket().close(ec);
  // A streamed read still pending refers to the parser: let it report.
  if (impl_->stream_pending) finish(impl_->ioc, impl_->stream_done);
}

Result<std::unique_ptr<Client>> Client::connect(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  ENTENTE_RETURN_IF_ERROR(make_client_context(impl->ssl_ctx, options));
  ENTENTE_ASSIGN_OR_RETURN(tcp::socket socket, connect_socket(impl->ioc, options));
  if (options.tls) {
    impl->conn.emplace(std::move(socket), *impl->ssl_ctx);
    ENTENTE_RETURN_IF_ERROR(tls_handshake(impl->ioc, *impl->conn, options));
  } else {
    impl->conn.emplace(std::move(socket));
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Result<ClientResponse> Client::request(
    std::string_view method, std::string_view target, std::string_view body,
    std::string_view content_type, const std::vector<std::pair<std::string, std::string>>& headers) {
  ENTENTE_ASSIGN_OR_RETURN(const bhttp::verb verb,
                           impl_->send_request(method, target, body, content_type, headers));
  return impl_->read_response(verb == bhttp::verb::head);
}

Result<ClientResponse> Client::start_stream(
    std::string_view method, std::string_view target, std::string_view body,
    std::string_view content_type, const std::vector<std::pair<std::string, std::string>>& headers) {
  Impl& c = *impl_;
  ENTENTE_ASSIGN_OR_RETURN(const bhttp::verb verb,
                           c.send_request(method, target, body, content_type, headers));
  c.stream.emplace();
  c.stream->header_limit(kMaxResponseHeader);
  c.stream->body_limit(boost::none);  // the body may never end; each piece is bounded
  c.stream->skip(verb == bhttp::verb::head);
  const error_code ec = c.run([&](auto& stream, auto& handler) {
    bhttp::async_read_header(stream, c.buffer, *c.stream, handler);
  });
  if (ec) {
    c.closed = true;
    c.stream.reset();
    return io_error(c.options, "read the response from", ec);
  }
  c.lowest().expires_never();  // read_stream() keeps its own deadlines
  ClientResponse out;
  out.status = c.stream->get().result_int();
  for (const auto& field : c.stream->get()) {
    out.headers.emplace_back(to_lower(field.name_string()), std::string(field.value()));
  }
  return out;
}

Result<BodyPiece> Client::read_stream(int64_t timeout_ms, size_t max_bytes) {
  Impl& c = *impl_;
  if (!c.stream) {
    return make_error(Errc::invalid_argument,
                      "no streamed response from " + where(c.options) + " is being read");
  }
  const auto deadline = deadline_after(std::max<int64_t>(timeout_ms, 0));
  for (;;) {
    if (c.stream->is_done()) return c.end_stream({});
    if (!c.stream_pending) {
      // A read_some completes after one successful parse step, which may
      // be a chunk header alone: loop until body bytes or the end come.
      c.piece.resize(std::max<size_t>(max_bytes, 1));
      auto& body = c.stream->get().body();
      body.data = c.piece.data();
      body.size = c.piece.size();
      body.more = true;
      c.stream_pending = true;
      auto handler = [&c](error_code e, std::size_t) {
        c.stream_pending = false;
        c.stream_done = true;
        c.stream_ec = e;
      };
      bhttp::async_read_some(*c.conn, c.buffer, *c.stream, handler);
    }
    if (!run_until(c.ioc, c.stream_done, deadline)) {
      return make_error(Errc::unavailable, "no data from " + where(c.options) + " within " +
                                               std::to_string(timeout_ms) + " ms");
    }
    c.stream_done = false;
    error_code ec = c.stream_ec;
    if (ec == bhttp::error::need_buffer) ec = {};  // the piece is full
    if (ec) {
      c.closed = true;
      c.stream.reset();
      return io_error(c.options, "read the response from", ec);
    }
    const size_t n = c.piece.size() - c.stream->get().body().size;
    if (n > 0) {
      BodyPiece out{std::string(c.piece.data(), n), false};
      if (c.stream->is_done()) return c.end_stream(std::move(out));
      return out;
    }
  }
}

Result<ClientResponse> Client::raw(std::string_view bytes) {
  Impl& c = *impl_;
  ENTENTE_RETURN_IF_ERROR(c.check_free());
  const error_code ec = c.run([&](auto& stream, auto& handler) {
    net::async_write(stream, net::buffer(bytes.data(), bytes.size()), handler);
  });
  if (ec) {
    c.closed = true;
    return io_error(c.options, "send to", ec);
  }
  return c.read_response(false);
}

// ---------------------------------------------------------------------------
// WsClient

struct WsClient::Impl {
  net::io_context ioc{1};  // first: destroyed after the streams
  ClientOptions options;
  std::optional<ssl::context> ssl_ctx;
  std::optional<websocket::stream<AnyStream>> ws;
  beast::flat_buffer rbuf;
  // The read outlives a receive() that timed out; its result waits here.
  bool read_pending = false;
  bool read_done = false;
  error_code read_ec;
  bool closed = false;  // a close frame was received or sent
  bool broken = false;
  bool auto_pong = true;

  template <class F>
  decltype(auto) with(F&& f) {
    return f(*ws);
  }
  beast::tcp_stream& lowest() { return ws->next_layer().lowest(); }

  void start_read() {
    read_pending = true;
    with([&](auto& ws) {
      ws.async_read(rbuf, [this](error_code ec, std::size_t) {
        read_pending = false;
        read_done = true;
        read_ec = ec;
      });
    });
  }

  // Abandons the connection: closes the socket and lets a pending read
  // report, so no handler outlives the object.
  void abort() {
    broken = true;
    error_code ec;
    lowest().socket().close(ec);
    if (read_pending) finish(ioc, read_done);
  }
};

WsClient::WsClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

WsClient::~WsClient() {
  if (!impl_ || !impl_->ws) return;
  impl_->abort();
}

Result<std::unique_ptr<WsClient>> WsClient::connect(
    const ClientOptions& options, std::string_view target,
    const std::vector<std::pair<std::string, std::string>>& headers) {
  if (!is_target(target)) return make_error(Errc::invalid_argument, "invalid request target");
  ENTENTE_RETURN_IF_ERROR(check_headers(headers));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  ENTENTE_RETURN_IF_ERROR(make_client_context(impl->ssl_ctx, options));
  ENTENTE_ASSIGN_OR_RETURN(tcp::socket socket, connect_socket(impl->ioc, options));
  if (options.tls) {
    impl->ws.emplace(std::move(socket), *impl->ssl_ctx);
    ENTENTE_RETURN_IF_ERROR(tls_handshake(impl->ioc, impl->ws->next_layer(), options));
  } else {
    impl->ws.emplace(std::move(socket));
  }

  websocket::response_type res;
  bool done = false;
  error_code ec;
  impl->with([&](auto& ws) {
    websocket::stream_base::timeout timeouts{};
    timeouts.handshake_timeout = milliseconds(options.timeout_ms);  // also bounds close()
    timeouts.idle_timeout = websocket::stream_base::none();
    timeouts.keep_alive_pings = false;
    ws.set_option(timeouts);
    ws.read_message_max(kWsMaxMessage);
    ws.write_buffer_bytes(kWsWriteBuffer);
    ws.auto_fragment(false);
    ws.set_option(websocket::stream_base::decorator([&headers](websocket::request_type& req) {
      req.set(bhttp::field::user_agent, "entente-client");
      for (const auto& [name, value] : headers) req.set(name, value);
    }));
    ws.async_handshake(res, options.host + ":" + std::to_string(options.port), target,
                       [&](error_code e) {
                         ec = e;
                         done = true;
                       });
  });
  finish(impl->ioc, done);  // bounded by the handshake timeout
  if (ec) {
    const unsigned status = res.result_int();
    if (status != 0 && status != 101) {
      const Errc code = status == 404 || status == 410 ? Errc::not_found
                        : status == 429 || status == 503 ? Errc::unavailable
                                                         : Errc::invalid_argument;
      return make_error(code, "HTTP " + std::to_string(status) + ": " + res.body());
    }
    return io_error(options, "WebSocket handshake with", ec);
  }
  return std::unique_ptr<WsClient>(new WsClient(std::move(impl)));
}

Status WsClient::send(std::string_view data, bool binary) {
  Impl& c = *impl_;
  if (c.broken || c.closed) {
    return make_error(Errc::io_error, "the WebSocket to " + where(c.options) + " is closed");
  }
  bool done = false;
  error_code ec;
  c.with([&](auto& ws) {
    ws.binary(binary);
    ws.async_write(net::buffer(data.data(), data.size()), [&](error_code e, std::size_t) {
      ec = e;
      done = true;
    });
  });
  if (!run_until(c.ioc, done, deadline_after(c.options.timeout_ms))) {
    error_code ignored;
    c.lowest().socket().close(ignored);
    finish(c.ioc, done);
    c.broken = true;
    return make_error(Errc::io_error, "send to " + where(c.options) + " timed out");
  }
  if (ec) {
    c.broken = true;
    return io_error(c.options, "send to", ec);
  }
  return {};
}

Result<WsMessage> WsClient::receive(int64_t timeout_ms) {
  Impl& c = *impl_;
  if (c.broken || (c.closed && !c.read_done)) {
    return make_error(Errc::io_error, "the WebSocket to " + where(c.options) + " is closed");
  }
  const auto deadline = deadline_after(std::max<int64_t>(timeout_ms, 0));
  if (!c.read_pending && !c.read_done) {
    if (!c.auto_pong) {
      // Beast answers pings only inside a read, so with auto-pong off no
      // read is started: the socket is left unread and pings go unanswered.
      std::this_thread::sleep_until(deadline);
      return make_error(Errc::unavailable, "not reading: auto-pong is off");
    }
    c.start_read();
  }
  if (!run_until(c.ioc, c.read_done, deadline)) {
    return make_error(Errc::unavailable,
                      "no message within " + std::to_string(timeout_ms) + " ms");
  }
  c.read_done = false;
  // A close frame may arrive just before the connection ends (the reply
  // then fails to go out): report the close the server sent, not the pipe.
  bool close_received = false;
  c.with([&](auto& ws) { close_received = ws.reason().code != websocket::close_code::none; });
  if (c.read_ec == websocket::error::closed || (c.read_ec && close_received)) {
    c.closed = true;
    WsMessage msg;
    msg.closed = true;
    c.with([&](auto& ws) {
      msg.close_code = static_cast<uint16_t>(ws.reason().code);
      msg.close_reason.assign(ws.reason().reason.data(), ws.reason().reason.size());
    });
    return msg;
  }
  if (c.read_ec) {
    c.broken = true;
    return io_error(c.options, "receive from", c.read_ec);
  }
  WsMessage msg;
  msg.data = beast::buffers_to_string(c.rbuf.data());
  c.rbuf.consume(c.rbuf.size());
  c.with([&](auto& ws) { msg.binary = ws.got_binary(); });
  return msg;
}

void WsClient::set_auto_pong(bool on) { impl_->auto_pong = on; }

Status WsClient::close(uint16_t code) {
  Impl& c = *impl_;
  if (c.closed) return {};
  if (c.broken) {
    return make_error(Errc::io_error, "the WebSocket to " + where(c.options) + " is broken");
  }
  bool done = false;
  error_code ec;
  c.with([&](auto& ws) {
    ws.async_close(websocket::close_reason(code), [&](error_code e) {
      ec = e;
      done = true;
    });
  });
  finish(c.ioc, done);  // bounded by the handshake timeout
  // A pending read sees the server's close frame and reports `closed`.
  if (c.read_pending) finish(c.ioc, c.read_done);
  c.closed = true;
  c.read_done = false;
  if (ec && ec != websocket::error::closed) {
    c.broken = true;
    return io_error(c.options, "close the WebSocket to", ec);
  }
  return {};
}

}  // namespace entente::http
