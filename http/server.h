#pragma once
// The node's HTTP(S) + WebSocket listener, on Boost.Beast. This header is
// deliberately free of Asio/Beast types: the broker's routes and the server's
// transport compile separately.
//
// One coroutine per connection on its own strand; every read has a deadline
// and every body a limit; connections over the limit are refused before a
// session object exists. Requests are handed to a Handler; the Handler answers
// through a Respond callback, possibly later and from another thread (e.g.
// after a group commit). One request per connection is in flight at a time
// (no pipelining): the next request is read after the response is written.
//
// Lifecycle: create() → start() → stop_accepting() → stop(). stop() closes
// every connection (WebSockets with 1001 "going away") and joins the
// network threads. The destructor calls stop().

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"

namespace entente::http {

struct Request {
  std::string method;        // "GET", "POST", ... as received
  std::string target;        // raw request target
  std::string path;          // percent-decoded path, without the query string
  std::vector<std::pair<std::string, std::string>> query;  // decoded parameters
  std::vector<std::pair<std::string, std::string>> headers;  // names lowercased
  std::string content_type;  // media type only, lowercased ("application/json")
  std::string body;
  std::string remote;        // "127.0.0.1:53122"
  bool websocket = false;    // an upgrade request

  // First value of a query parameter / header (name lowercased for headers).
  std::optional<std::string_view> param(std::string_view name) const;
  std::optional<std::string_view> header(std::string_view lower_name) const;
};

struct Response {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra: Retry-After, Location, Allow

  static Response json(unsigned status, std::string body);
  // RFC 7807 problem+json: {"type":"about:blank","title":...,"status":...,"detail":...}
  // `extra_members` is a JSON object's inner text added to the object
  // ("\"errors\":[...]"), or empty.
  static Response problem(unsigned status, std::string_view title, std::string_view detail,
                          std::string_view extra_members = {});
};

// Thread-safe; call exactly once, from any thread.
using Respond = std::function<void(Response)>;

// The server side of an accepted WebSocket. Thread-safe.
class WebSocket {
 public:
  enum class SendResult : uint8_t { ok, overflow, closed };
  virtual ~WebSocket() = default;
  // Queues one message. `overflow`: queuing it would exceed the connection's
  // send buffer (ApiLimits::ws_send_buffer_bytes) while other messages are
  // still queued; nothing was queued and the caller decides (a subscriber
  // closes with 4001). A message larger than the buffer is queued when the
  // queue is empty. `closed`: gone.
  virtual SendResult send(std::string message, bool binary) = 0;
  // Discards queued messages, sends a close frame with code and reason
  // (reason at most 123 bytes), and ends the connection.
  virtual void close(uint16_t code, std::string reason) = 0;
  virtual size_t queued_bytes() const = 0;
  // Called (on the connection's strand) whenever the send queue becomes
  // empty after having held messages; for pacing a catch-up read.
  virtual void set_on_drain(std::function<void()> fn) = 0;
  // Resumes reading after on_message returned false (see WebSocketSession).
  virtual void resume_reading() = 0;
};

// One accepted WebSocket's events, called on the connection's strand, in
// order: on_open, on_message*, on_close (exactly once, also after close()).
class WebSocketSession {
 public:
  virtual ~WebSocketSession() = default;
  virtual void on_open(std::shared_ptr<WebSocket> ws) = 0;
  // Return false to stop reading further messages until
  // WebSocket::resume_reading() (a publisher with too much in flight).
  virtual bool on_message(std::string_view data, bool binary) = 0;
  // The client's close frame (its code, 1000-4999, and reason), just before
  // on_close; not called when the connection ended without one. For a proxy
  // that passes the close on (http/upstream.h).
  virtual void on_close_received(uint16_t /*code*/, std::string_view /*reason*/) {}
  virtual void on_close() = 0;
};

class Handler {
 public:
  virtual ~Handler() = default;
  // A plain request. Must call `respond` exactly once.
  virtual void handle(Request&& request, Respond respond) = 0;
  // An upgrade request: return a session to accept, or nullptr and set
  // `reject` to refuse (401, 404, ...) with an ordinary HTTP response.
  virtual std::shared_ptr<WebSocketSession> upgrade(const Request& request,
                                                    Response& reject) = 0;
  // After an accepted upgrade: the subprotocol to answer with
  // (Sec-WebSocket-Protocol), one the request offered, or "" for none.
  virtual std::string subprotocol(const Request& /*request*/) const { return {}; }
};

struct ServerOptions {
  std::string address = "127.0.0.1";
  uint16_t port = 0;             // 0: ephemeral
  bool tls = true;
  std::string cert_file;         // PEM chain
  std::string key_file;          // PEM private key
  int threads = 1;
  size_t max_body_bytes = 16u << 20;
  size_t max_header_bytes = 16u << 10;
  int64_t read_timeout_ms = 10'000;
  int64_t idle_timeout_ms = 60'000;
  size_t max_connections = 1024;
  // Connections one client address may hold at once (an IPv6 client: its
  // /64), so that one address cannot take every slot.
  size_t max_connections_per_address = 64;
  // From accept: the TLS handshake and the first request's header must be
  // complete within this, so that connections that say nothing are dropped
  // long before read_timeout_ms or idle_timeout_ms.
  int64_t handshake_timeout_ms = 5'000;
  size_t ws_max_message_bytes = 16u << 20;
  size_t ws_send_buffer_bytes = 8u << 20;
  int64_t ws_ping_interval_ms = 15'000;  // ping when idle; no pong within 2 intervals: close
};

struct ServerStats {
  uint64_t connections_open = 0;
  uint64_t connections_accepted = 0;
  uint64_t connections_refused = 0;  // over max_connections
  uint64_t connections_refused_per_address = 0;  // over max_connections_per_address
  uint64_t handshake_timeouts = 0;   // no TLS handshake + first request header in time
  uint64_t websockets_open = 0;
  uint64_t tls_handshake_failures = 0;
  uint64_t bad_requests = 0;         // unparsable HTTP, over header/body limits
};

class Server final {
 public:
  // Errors: invalid_argument (bad address, unreadable cert/key with the
  // reason), io_error (bind failed: "127.0.0.1:8443: address in use").
  static Result<std::unique_ptr<Server>> create(ServerOptions options, Handler& handler);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and starts the network threads.
  Status start();
  uint16_t port() const;  // the bound port, after start()
  // Presents `cert_file` and `key_file` to the TLS handshakes from now on
  // (connections already open keep theirs); true when the certificate is
  // another than before. invalid_argument naming the file when the pair
  // cannot be used, conflict without TLS; then nothing changed.
  // Thread-safe.
  Result<bool> reload_certificate(const std::string& cert_file, const std::string& key_file);
  // The same checks without replacing anything.
  Status check_certificate(const std::string& cert_file, const std::string& key_file) const;
  void stop_accepting();
  void stop();
  ServerStats stats() const;

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_address(std::string_view address);

}  // namespace entente::http
