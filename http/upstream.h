#pragma once
// Asynchronous HTTP(S) and WebSocket clients for a server that forwards
// requests to another node of its domain (docs/cluster.md:
// every node answers every API call; what belongs to another node goes over
// the intra-domain link), and the forwarding helpers on top of them.
//
// Unlike client.h (blocking, one connection per object), an Upstream owns
// its own network threads; callers never block: a request completes through
// a callback, a WebSocket reports through callbacks and accepts sends from
// any thread. Free of Asio/Beast types, like server.h and client.h.
//
// Lifecycle: Upstream::create() starts its threads; stop() (or the
// destructor) aborts every connection, calls every outstanding callback
// (requests: Errc::unavailable; WebSockets: on_close 1001) and joins the
// threads. Callbacks run on the Upstream's threads and must not block.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"
#include "http/client.h"
#include "http/server.h"

namespace entente::http {

using HeaderList = std::vector<std::pair<std::string, std::string>>;

// Where a forwarded request goes: another node's API listener.
struct UpstreamTarget {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  bool tls = false;
  std::string ca_file;      // PEM; verify the node's chain against it
  bool verify_peer = true;  // false: accept any certificate (tests only)
  std::string server_name;  // SNI / name the certificate must match; empty: host
  // Bounds a request to this target instead of the Upstream's
  // request_timeout_ms when positive (an operation known to take long,
  // such as moving a fragment with a large state).
  int64_t request_timeout_ms = 0;
  std::string address() const;  // "host:port", for messages
};

struct UpstreamOptions {
  int threads = 1;
  // Idle keep-alive connections kept per target; more are closed when they
  // come back. An idle connection older than idle_keep_ms is not reused.
  size_t max_idle_per_target = 4;
  int64_t idle_keep_ms = 30'000;
  int64_t connect_timeout_ms = 5'000;   // resolve + TCP connect + TLS handshake
  int64_t request_timeout_ms = 30'000;  // writing a request and reading its response
  size_t max_response_bytes = 16u << 20;  // body; over it: Errc::limit_exceeded
  size_t max_response_header_bytes = 64u << 10;
  int64_t ws_handshake_timeout_ms = 10'000;  // the upgrade; also bounds the close handshake
  size_t ws_max_message_bytes = 16u << 20;   // a larger incoming message ends the connection (1009)
  size_t ws_send_buffer_bytes = 8u << 20;    // UpstreamWebSocket::send's bound
  int64_t ws_ping_interval_ms = 15'000;      // ping when idle; no answer within 2 intervals: closed
};

struct UpstreamStats {
  uint64_t connections_opened = 0;  // TCP connections made (HTTP and WebSocket)
  uint64_t requests = 0;            // HTTP requests completed with a response
  uint64_t reused = 0;              // requests sent on a pooled connection
  uint64_t retried = 0;             // safe requests resent after a stale pooled connection
  uint64_t idle_connections = 0;    // in the pool now
  uint64_t websockets_open = 0;
};

// One client WebSocket to an upstream node. Thread-safe. Its callbacks
// (UpstreamWebSocketCallbacks) run on the Upstream's threads, one at a time,
// in order: on_open, (on_message | on_drain)*, on_close exactly once.
class UpstreamWebSocket {
 public:
  virtual ~UpstreamWebSocket() = default;
  // Queues one message; it goes out once the upgrade is done (messages sent
  // before are kept, in order). `overflow`: queuing it would exceed
  // ws_send_buffer_bytes while others are queued, nothing was queued (a
  // message larger than the buffer goes when the queue is empty), as
  // WebSocket::send. `closed`: close() was called or the connection ended.
  virtual WebSocket::SendResult send(std::string data, bool binary) = 0;
  // Sends a close frame with `code` and `reason` (cut to 123 bytes) after
  // the messages already queued, then ends the connection; on_close follows.
  virtual void close(uint16_t code, std::string reason) = 0;
  // Stops reading from the upstream until resume_reading(): the node's own
  // send buffer then fills, which is its backpressure. While paused no ping
  // is answered either, so a pause longer than the node's keepalive ends
  // the connection.
  virtual void pause_reading() = 0;
  virtual void resume_reading() = 0;
  virtual size_t queued_bytes() const = 0;
  // The HTTP status of a refused upgrade (on_close then says "HTTP 404:
  // <body>"), 0 when the upgrade was not refused by a status.
  virtual unsigned refused_status() const = 0;
};

struct UpstreamWebSocketCallbacks {
  std::function<void()> on_open;
  std::function<void(std::string data, bool binary)> on_message;
  // The send queue became empty after having held messages.
  std::function<void()> on_drain;
  // The code and reason of the node's close frame; or ours when we closed
  // first; 1006 and what failed when the connection failed, broke or the
  // upgrade was refused (then refused_status() != 0); 1001 "going away"
  // when the Upstream stops.
  std::function<void(uint16_t code, std::string reason)> on_close;
};

class Upstream final {
 public:
  // invalid_argument for out-of-range options.
  static Result<std::unique_ptr<Upstream>> create(UpstreamOptions options = {});
  ~Upstream();
  Upstream(const Upstream&) = delete;
  Upstream& operator=(const Upstream&) = delete;

  // One HTTP/1.1 request; `done` is called exactly once, on an Upstream
  // thread, or on the calling thread before request() returns when the
  // arguments are invalid or the Upstream is stopped. `headers` are extra ("authorization", ...);
  // Content-Type is among them when the body has one. Errors:
  // invalid_argument (method, target, header), io_error (connect, TLS
  // verification, a broken connection: with host:port and the reason),
  // unavailable (timed out; stopped), limit_exceeded (response too large).
  // Retries: a request goes on a pooled keep-alive connection when one is
  // idle; when that connection turns out to be closed by the node before
  // any byte of the response, a GET, HEAD or OPTIONS is sent once more on a
  // fresh connection; any other method is not (it may have been applied)
  // and fails with io_error saying so.
  void request(const UpstreamTarget& target, std::string method, std::string path_and_query,
               HeaderList headers, std::string body,
               std::function<void(Result<ClientResponse>)> done);

  // Opens a WebSocket to `target` (path_and_query: "/v1/streams/a/subscribe?from=3").
  // A failure to connect is reported through on_close; nullptr (and no
  // callback) when the Upstream is stopped or the arguments are invalid.
  std::shared_ptr<UpstreamWebSocket> websocket(const UpstreamTarget& target,
                                               std::string path_and_query, HeaderList headers,
                                               UpstreamWebSocketCallbacks callbacks);

  void stop();
  UpstreamStats stats() const;

 private:
  struct Impl;
  explicit Upstream(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
// Forwarding a server request to another node.

struct ForwardOptions {
  // Request headers passed on besides Authorization, Accept and
  // Content-Type (lowercase names).
  std::vector<std::string> pass_headers;
  // Added to every forwarded request or upgrade ("entente-forwarded-by").
  HeaderList extra_headers;
};

// Forwards `request` (method, target with its query, body, Content-Type,
// Authorization, Accept and options.pass_headers) to `target` and answers
// through `respond` with the node's status, Content-Type, body and its
// Retry-After, Location, Allow, ETag and WWW-Authenticate headers. When the
// node cannot answer: 502 Bad Gateway (unreachable, TLS failure, broken
// connection, response too large), 504 Gateway Timeout (no answer in
// request_timeout_ms), 503 with Retry-After: 1 (the Upstream is stopping);
// problem+json whose detail names the node's address and the reason.
void forward_request(Upstream& upstream, const UpstreamTarget& target, const Request& request,
                     Respond respond, const ForwardOptions& options = {});

// The WebSocketSession for Handler::upgrade() that joins the accepted client
// WebSocket to a WebSocket opened on `target` (same target and query as
// `request`; Authorization and options' headers passed on). Messages flow
// both ways unchanged (text or binary); neither side is buffered without
// bound: when the node's send queue is full the client is not read
// (on_message returns false) until it drains, and when the client's send
// buffer is full the node is not read until it drains. Closes pass through
// with their code and reason, after what was already queued; besides:
//   the node refused the upgrade  → client closed with 4000 + status
//                                   (4404, 4401, 4403, 4429, 4503...), reason
//                                   "HTTP 404: <detail of the node's problem>";
//   the node unreachable or gone  → 1013 (try again later), reason naming
//                                   the node and what failed (1014 "bad
//                                   gateway" is refused by Beast clients);
//   the client went without a close frame → the node gets 1001.
std::shared_ptr<WebSocketSession> make_websocket_proxy(Upstream& upstream,
                                                       const UpstreamTarget& target,
                                                       const Request& request,
                                                       const ForwardOptions& options = {});

// The close code a proxied client sees for an upstream close (see above).
uint16_t proxied_close_code(uint16_t upstream_code, unsigned refused_status);

}  // namespace entente::http
