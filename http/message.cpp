// Request/Response helpers and address classification: the parts of
// server.h that need no network code.

#include <arpa/inet.h>

#include <cstring>

#include "http/detail/text.h"
#include "http/server.h"

namespace entente::http {

std::optional<std::string_view> Request::param(std::string_view name) const {
  for (const auto& [k, v] : query) {
    if (k == name) return std::string_view(v);
  }
  return std::nullopt;
}

std::optional<std::string_view> Request::header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers) {
    if (k == lower_name) return std::string_view(v);
  }
  return std::nullopt;
}

Response Response::json(unsigned status, std::string body) {
  Response r;
  r.status = status;
  r.content_type = "application/json";
  r.body = std::move(body);
  return r;
}

Response Response::problem(unsigned status, std::string_view title, std::string_view detail,
                           std::string_view extra_members) {
  Response r;
  r.status = status;
  r.content_type = "application/problem+json";
  std::string& b = r.body;
  b.reserve(64 + title.size() + detail.size() + extra_members.size());
  b += "{\"type\":\"about:blank\",\"title\":";
  detail::append_json_string(b, title);
  b += ",\"status\":";
  b += std::to_string(status);
  b += ",\"detail\":";
  detail::append_json_string(b, detail);
  if (!extra_members.empty()) {
    b += ',';
    b += extra_members;
  }
  b += '}';
  return r;
}

bool is_loopback_address(std::string_view address) {
  if (detail::to_lower(address) == "localhost") return true;
  std::string text(address);
  // Accept the bracketed form used in URLs ("[::1]").
  if (text.size() >= 2 && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
  }
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    static const unsigned char kLoopback[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
    if (std::memcmp(v6.s6_addr, kLoopback, 16) == 0) return true;
    // An IPv4-mapped loopback (::ffff:127.x.y.z).
    static const unsigned char kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    return std::memcmp(v6.s6_addr, kMapped, 12) == 0 && v6.s6_addr[12] == 127;
  }
  return false;
}

}  // namespace entente::http
