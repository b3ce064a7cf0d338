// The stream below an AnyStream (any_stream.h): the only place the plain
// and TLS streams' operations are compiled.

#include "http/detail/any_stream.h"

#include <utility>

#include <boost/asio/dispatch.hpp>

namespace entente::http::detail {

// What the stream below completes: it runs on the connection's executor
// (its associated executor, which Beast's and Asio's ops post to; Boost
// 1.81's any_completion_executor cannot be posted to), then hands the
// result to the erased handler on that handler's own executor (dispatch:
// at once when it is the same one, as it is for every caller here).
template <class Handler>
struct AnyStream::Resume {
  using executor_type = net::any_io_executor;

  Handler handler;
  executor_type executor;

  executor_type get_executor() const noexcept { return executor; }

  template <class... Args>
  void operator()(Args... args) {
    net::dispatch(beast::bind_front_handler(std::move(handler), args...));
  }
};

AnyStream::AnyStream(tcp::socket socket) { plain_.emplace(std::move(socket)); }

AnyStream::AnyStream(tcp::socket socket, ssl::context& context) { tls_.emplace(std::move(socket), context); }

AnyStream::AnyStream(AnyStream&&) noexcept = default;
AnyStream::~AnyStream() = default;

AnyStream::executor_type AnyStream::get_executor() noexcept { return lowest().get_executor(); }

beast::tcp_stream& AnyStream::lowest() { return tls_ ? beast::get_lowest_layer(*tls_) : *plain_; }

SSL* AnyStream::native_handle() { return tls_ ? tls_->native_handle() : nullptr; }

void AnyStream::start_read(net::mutable_buffer buffer, IoHandler handler) {
  if (tls_) {
    tls_->async_read_some(buffer, Resume<IoHandler>{std::move(handler), get_executor()});
  } else {
    plain_->async_read_some(buffer, Resume<IoHandler>{std::move(handler), get_executor()});
  }
}

void AnyStream::start_write(const WriteBuffers& buffers, IoHandler handler) {
  if (tls_) {
    tls_->async_write_some(buffers, Resume<IoHandler>{std::move(handler), get_executor()});
  } else {
    plain_->async_write_some(buffers, Resume<IoHandler>{std::move(handler), get_executor()});
  }
}

void AnyStream::start_handshake(ssl::stream_base::handshake_type type, DoneHandler handler) {
  if (tls_) {
    tls_->async_handshake(type, Resume<DoneHandler>{std::move(handler), get_executor()});
    return;
  }
  complete_now(std::move(handler));
}

void AnyStream::start_shutdown(DoneHandler handler) {
  if (tls_) {
    tls_->async_shutdown(Resume<DoneHandler>{std::move(handler), get_executor()});
    return;
  }
  complete_now(std::move(handler));
}

void AnyStream::complete_now(DoneHandler handler) {
  net::post(get_executor(), beast::bind_front_handler(Resume<DoneHandler>{std::move(handler), get_executor()},
                                                      error_code{}));
}

void AnyStream::start_teardown(beast::role_type role, DoneHandler handler) {
  using beast::websocket::async_teardown;
  if (tls_) {
    async_teardown(role, *tls_, Resume<DoneHandler>{std::move(handler), get_executor()});
  } else {
    async_teardown(role, plain_->socket(), Resume<DoneHandler>{std::move(handler), get_executor()});
  }
}

void AnyStream::teardown(beast::role_type role, error_code& ec) {
  using beast::websocket::teardown;
  if (tls_) {
    teardown(role, *tls_, ec);
  } else {
    teardown(role, plain_->socket(), ec);
  }
}

void AnyStream::close() {
  error_code ignored;
  lowest().socket().close(ignored);
}

}  // namespace entente::http::detail
