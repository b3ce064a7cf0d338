#pragma once
#if !defined(ENTENTE_IN_HTTP)
#error "http/detail/ is private to http/ (docs/architecture.md)"
#endif
// Text helpers for the HTTP transport: percent-decoding, request-target
// splitting, media types and JSON string escaping. Pure functions, no I/O.

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace entente::http::detail {

// Decodes %XX escapes (and '+' as a space when `plus_as_space`, for query
// strings). nullopt for a malformed escape or a decoded NUL byte, which no
// route accepts and which would truncate C strings further down.
std::optional<std::string> percent_decode(std::string_view in, bool plus_as_space);

// Splits a request target ("/v1/streams/a%20b?from=3&x") into its decoded
// path and decoded query parameters. False when an escape is malformed or the
// target is not in origin form (does not start with '/').
bool split_target(std::string_view target, std::string& path,
                  std::vector<std::pair<std::string, std::string>>& query);

std::string to_lower(std::string_view s);

// "Application/JSON; charset=utf-8" → "application/json".
std::string media_type(std::string_view content_type);

// Appends `s` as a JSON string literal (with quotes): base::append_json_string
// (control characters escaped, invalid UTF-8 replaced by U+FFFD).
void append_json_string(std::string& out, std::string_view s);

// True when `s` may be sent as a header value (no CR, LF or NUL).
bool is_header_safe(std::string_view s);
// True when `s` is an RFC 9110 token: a method or a header name.
bool is_token(std::string_view s);
// True when `s` may be sent as a request target: not empty, no control
// characters, spaces or DEL.
bool is_target(std::string_view s);

// Why a request's Transfer-Encoding makes its framing unusable (RFC 9112
// §6.1), given every Transfer-Encoding field value in order: 400 when
// chunked is not the final coding (the body's length cannot be determined)
// or is applied twice; 501 for a coding this server does not implement
// (anything but chunked). nullopt when the codings are exactly "chunked".
struct FramingRefusal {
  unsigned status = 400;
  std::string detail;
};
std::optional<FramingRefusal> check_transfer_codings(const std::vector<std::string_view>& values);

// True when `host` may be a Host field value (RFC 9110 §7.2): a reg-name,
// an IP literal in brackets or an IPv4 address, with an optional port; only
// the characters those allow (empty is allowed too). Not a full parse:
// enough to refuse whitespace, '/', '@' and the like.
bool is_host_value(std::string_view host);

// True when `key` is a Sec-WebSocket-Key as RFC 6455 §4.1 requires: the
// base64 encoding of exactly 16 bytes (22 base64 characters and "==").
bool is_websocket_key(std::string_view key);

}  // namespace entente::http::detail
