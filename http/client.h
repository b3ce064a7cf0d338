#pragma once
// Blocking HTTP(S) and WebSocket clients on Beast, for integration tests,
// benchmarks and the CLI. One connection per object, not thread-safe; every
// operation has a timeout. Free of Asio/Beast types, like server.h.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"

namespace entente::http {

struct ClientOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  bool tls = false;
  std::string ca_file;        // PEM; verify the server's chain against it
  bool verify_peer = true;    // false: accept any certificate (tests of bad certs)
  std::string server_name;    // SNI / host check; empty: host
  int64_t timeout_ms = 10'000;
  // The largest response body request() reads; a larger one is io_error
  // and closes the connection. (A streamed body is read piece by piece:
  // its pieces are bounded, the whole is not.)
  uint64_t max_body_bytes = 256u << 20;
};

// A piece of a streamed response body (Client::read_stream).
struct BodyPiece {
  std::string data;
  bool end = false;  // the body is complete: the connection is free again
};

struct ClientResponse {
  unsigned status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names lowercased
  std::string body;
  std::optional<std::string_view> header(std::string_view lower_name) const;
};

class Client final {
 public:
  // Errors: io_error (connect, TLS handshake: with the reason).
  static Result<std::unique_ptr<Client>> connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends one request (keep-alive) and reads the response. `headers` are
  // extra ("authorization", "Bearer x"). Errors: io_error, including a
  // connection closed by the server (the caller may reconnect).
  Result<ClientResponse> request(std::string_view method, std::string_view target,
                                 std::string_view body = {},
                                 std::string_view content_type = "application/json",
                                 const std::vector<std::pair<std::string, std::string>>& headers = {});
  // Writes raw bytes and reads one response: for malformed-request tests.
  Result<ClientResponse> raw(std::string_view bytes);

  // A response read incrementally, for bodies that come in pieces and may
  // never end (a chunked stream of JSON objects, e.g. an etcd watch).
  // start_stream() sends the request and reads the status and headers
  // (within timeout_ms); the returned body is empty. read_stream() then
  // returns the next bytes of the body (at most `max_bytes`), or `end`;
  // Errc::unavailable when nothing came within `timeout_ms`: the read stays
  // pending and the connection usable, so the caller may check a stop flag
  // and call again. io_error when the connection broke. Until `end`, the
  // connection serves nothing else (request() fails); a stream left
  // unfinished leaves the connection unusable.
  Result<ClientResponse> start_stream(
      std::string_view method, std::string_view target, std::string_view body = {},
      std::string_view content_type = "application/json",
      const std::vector<std::pair<std::string, std::string>>& headers = {});
  Result<BodyPiece> read_stream(int64_t timeout_ms, size_t max_bytes = 64u << 10);

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct WsMessage {
  std::string data;
  bool binary = false;
  bool closed = false;       // the server closed: code and reason set
  uint16_t close_code = 0;
  std::string close_reason;
};

class WsClient final {
 public:
  // Performs the upgrade. Errors: io_error; a refused upgrade is
  // Errc::not_found / invalid_argument with "HTTP 401: <body>" in the message.
  static Result<std::unique_ptr<WsClient>> connect(
      const ClientOptions& options, std::string_view target,
      const std::vector<std::pair<std::string, std::string>>& headers = {});
  ~WsClient();
  WsClient(const WsClient&) = delete;
  WsClient& operator=(const WsClient&) = delete;

  Status send(std::string_view data, bool binary = false);
  // Next message, or a close; Errc::unavailable on timeout (the connection
  // stays usable), io_error when the connection broke.
  Result<WsMessage> receive(int64_t timeout_ms);
  // Stops answering pings (to test keepalive). Default: answered.
  void set_auto_pong(bool on);
  Status close(uint16_t code = 1000);

 private:
  struct Impl;
  explicit WsClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace entente::http
