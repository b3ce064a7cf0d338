#pragma once
#if !defined(ENTENTE_IN_HTTP)
#error "http/detail/ is private to http/ (docs/architecture.md)"
#endif
// Shared Asio/Beast includes and namespace aliases for the transport's
// implementation files. Never included from server.h / client.h, which stay
// free of Boost types.

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>

namespace entente::http::detail {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace websocket = boost::beast::websocket;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using error_code = boost::system::error_code;

// Coroutine completion token that reports errors as values (a tuple whose
// first element is the error_code) instead of throwing: an I/O error ends a
// connection, it is not exceptional.
inline constexpr auto use_tuple = net::as_tuple(net::use_awaitable);

}  // namespace entente::http::detail
