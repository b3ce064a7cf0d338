#pragma once
#if !defined(ENTENTE_IN_HTTP)
#error "http/detail/ is private to http/ (docs/architecture.md)"
#endif
// The pieces of http/upstream.cpp that hold Asio objects: one connection to
// a node (plain or TLS) and the handle stop() uses to abort a coroutine.

#include <chrono>
#include <memory>
#include <optional>

#include "http/detail/any_stream.h"
#include "http/detail/net.h"

namespace entente::http::detail {

// A connected (for TLS: handshaken) HTTP connection to a node. Used by one
// coroutine at a time, on the strand its socket was made on; between
// requests it waits in the Upstream's pool.
struct UpConn {
  std::shared_ptr<ssl::context> ctx;  // first: outlives `stream`
  std::optional<AnyStream> stream;     // plain or TLS
  beast::flat_buffer buffer;
  std::chrono::steady_clock::time_point idle_since;

  beast::tcp_stream& lowest() { return stream->lowest(); }
};

// How stop() interrupts one coroutine: post_abort() runs on the coroutine's
// strand, marks it aborted and cancels what it waits on (the resolver's
// timer or the stream it uses). The pointers are set and cleared by the
// coroutine around each wait, on the same strand.
struct UpAbort : std::enable_shared_from_this<UpAbort> {
  explicit UpAbort(net::any_io_executor ex) : executor(std::move(ex)) {}
  net::any_io_executor executor;
  bool aborted = false;                  // strand only
  net::steady_timer* timer = nullptr;    // strand only
  beast::tcp_stream* stream = nullptr;   // strand only

  void post_abort() {
    net::post(executor, [self = shared_from_this()] {
      self->aborted = true;
      if (self->timer != nullptr) self->timer->cancel();
      if (self->stream != nullptr) {
        error_code ec;
        self->stream->socket().close(ec);
      }
    });
  }
};

}  // namespace entente::http::detail
