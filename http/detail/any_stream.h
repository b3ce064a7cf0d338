#pragma once
#if !defined(ENTENTE_IN_HTTP)
#error "http/detail/ is private to http/ (docs/architecture.md)"
#endif
// One stream type for a TCP connection with or without TLS: what the
// server's, the client's and the upstream's HTTP and WebSocket code runs
// over. Beast's algorithms (the HTTP parser and serializer ops, the
// WebSocket stream) are templates on their stream; over a plain
// beast::tcp_stream and a beast::ssl_stream they were compiled twice, and
// the TLS stream's own ops once more per handler type. Over AnyStream they
// are compiled once, and the reads, writes, handshakes and teardowns of the
// two streams below once, in any_stream.cpp, for type-erased handlers
// (net::any_completion_handler, which keeps each handler's executor). Under
// ASan + UBSan the transport's three files took 447, 274 and 240 s (server,
// upstream, client: a third of that build's compile time) and now 53, 56
// and 41 s, and any_stream.cpp 25 s (docs/architecture.md, "Build time").
//
// A read or write completes on the connection's executor, as the stream
// below completes it; each costs one small allocation for the erased
// handler, nothing next to a system call.

#include <array>
#include <cstddef>
#include <optional>

#include <boost/asio/any_completion_handler.hpp>

#include "http/detail/net.h"

namespace entente::http::detail {

class AnyStream {
 public:
  using executor_type = net::any_io_executor;
  using IoHandler = net::any_completion_handler<void(error_code, std::size_t)>;
  using DoneHandler = net::any_completion_handler<void(error_code)>;

  // Up to this many buffers of a write go to the stream below at once (the
  // rest in the next write_some: a write may be partial).
  static constexpr std::size_t kMaxWriteBuffers = 16;
  struct WriteBuffers {
    std::array<net::const_buffer, kMaxWriteBuffers> buffers{};
    std::size_t count = 0;
    const net::const_buffer* begin() const { return buffers.data(); }
    const net::const_buffer* end() const { return buffers.data() + count; }
  };

  explicit AnyStream(tcp::socket socket);                     // plain
  AnyStream(tcp::socket socket, ssl::context& context);       // TLS
  AnyStream(AnyStream&&) noexcept;
  AnyStream& operator=(AnyStream&&) = delete;
  ~AnyStream();

  executor_type get_executor() noexcept;
  bool tls() const { return tls_.has_value(); }
  // The TCP stream below: its deadlines, its socket.
  beast::tcp_stream& lowest();
  // The TLS session (null when plain), to configure before the handshake.
  SSL* native_handle();

  template <class MutableBufferSequence, class Token>
  auto async_read_some(const MutableBufferSequence& buffers, Token&& token) {
    return net::async_initiate<Token, void(error_code, std::size_t)>(
        [this](auto handler, net::mutable_buffer b) { start_read(b, IoHandler(std::move(handler))); }, token,
        first_buffer(buffers));
  }

  template <class ConstBufferSequence, class Token>
  auto async_write_some(const ConstBufferSequence& buffers, Token&& token) {
    return net::async_initiate<Token, void(error_code, std::size_t)>(
        [this](auto handler, const WriteBuffers& b) { start_write(b, IoHandler(std::move(handler))); }, token,
        gather(buffers));
  }

  // The TLS handshake; a plain stream completes at once without an error.
  template <class Token>
  auto async_handshake(ssl::stream_base::handshake_type type, Token&& token) {
    return net::async_initiate<Token, void(error_code)>(
        [this, type](auto handler) { start_handshake(type, DoneHandler(std::move(handler))); }, token);
  }

  // The TLS close_notify; a plain stream completes at once without an error.
  template <class Token>
  auto async_shutdown(Token&& token) {
    return net::async_initiate<Token, void(error_code)>(
        [this](auto handler) { start_shutdown(DoneHandler(std::move(handler))); }, token);
  }

  // The WebSocket close's teardown (Beast finds it by ADL, below).
  void start_teardown(beast::role_type role, DoneHandler handler);
  void teardown(beast::role_type role, error_code& ec);
  // Closes the socket (beast::close_socket, below).
  void close();

 private:
  template <class MutableBufferSequence>
  static net::mutable_buffer first_buffer(const MutableBufferSequence& buffers) {
    for (auto it = net::buffer_sequence_begin(buffers); it != net::buffer_sequence_end(buffers); ++it) {
      net::mutable_buffer b(*it);
      if (b.size() > 0) return b;
    }
    return {};
  }
  template <class ConstBufferSequence>
  static WriteBuffers gather(const ConstBufferSequence& buffers) {
    WriteBuffers out;
    for (auto it = net::buffer_sequence_begin(buffers);
         it != net::buffer_sequence_end(buffers) && out.count < kMaxWriteBuffers; ++it) {
      net::const_buffer b(*it);
      if (b.size() > 0) out.buffers[out.count++] = b;
    }
    return out;
  }

  void start_read(net::mutable_buffer buffer, IoHandler handler);
  void start_write(const WriteBuffers& buffers, IoHandler handler);
  void start_handshake(ssl::stream_base::handshake_type type, DoneHandler handler);
  void start_shutdown(DoneHandler handler);
  void complete_now(DoneHandler handler);  // posted: never inside the initiating call
  // The erased handler, as the stream below sees it (any_stream.cpp).
  template <class Handler>
  struct Resume;

  std::optional<beast::tcp_stream> plain_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;
};

// Beast's customization points for a WebSocket stream over AnyStream.
template <class TeardownHandler>
void async_teardown(beast::role_type role, AnyStream& stream, TeardownHandler&& handler) {
  stream.start_teardown(role, AnyStream::DoneHandler(std::forward<TeardownHandler>(handler)));
}
inline void teardown(beast::role_type role, AnyStream& stream, error_code& ec) { stream.teardown(role, ec); }
inline void beast_close_socket(AnyStream& stream) { stream.close(); }

}  // namespace entente::http::detail
