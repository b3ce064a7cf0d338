#include "http/detail/text.h"

#include <cstdint>

#include "base/json_text.h"

namespace entente::http::detail {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::optional<std::string> percent_decode(std::string_view in, bool plus_as_space) {
  std::string out;
  out.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    char c = in[i];
    if (c == '%') {
      if (i + 2 >= in.size()) return std::nullopt;
      const int hi = hex_value(in[i + 1]);
      const int lo = hex_value(in[i + 2]);
      if (hi < 0 || lo < 0) return std::nullopt;
      c = static_cast<char>(hi * 16 + lo);
      i += 2;
    } else if (c == '+' && plus_as_space) {
      c = ' ';
    }
    if (c == '\0') return std::nullopt;
    out.push_back(c);
  }
  return out;
}

bool split_target(std::string_view target, std::string& path,
                  std::vector<std::pair<std::string, std::string>>& query) {
  if (target.empty() || target.front() != '/') return false;
  const size_t q = target.find('?');
  auto decoded_path = percent_decode(target.substr(0, q), false);
  if (!decoded_path) return false;
  path = std::move(*decoded_path);
  query.clear();
  if (q == std::string_view::npos) return true;
  std::string_view rest = target.substr(q + 1);
  // A fragment is never sent by a conforming client; ignore it if present.
  if (const size_t hash = rest.find('#'); hash != std::string_view::npos) {
    rest = rest.substr(0, hash);
  }
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view part = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view{} : rest.substr(amp + 1);
    if (part.empty()) continue;
    const size_t eq = part.find('=');
    auto name = percent_decode(part.substr(0, eq), true);
    auto value = percent_decode(
        eq == std::string_view::npos ? std::string_view{} : part.substr(eq + 1), true);
    if (!name || !value) return false;
    query.emplace_back(std::move(*name), std::move(*value));
  }
  return true;
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string media_type(std::string_view content_type) {
  const size_t semi = content_type.find(';');
  std::string_view t = content_type.substr(0, semi);
  while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
  return to_lower(t);
}

void append_json_string(std::string& out, std::string_view s) { base::append_json_string(out, s); }

bool is_header_safe(std::string_view s) {
  for (char c : s) {
    if (c == '\r' || c == '\n' || c == '\0') return false;
  }
  return true;
}

bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c <= 32 || c >= 127 || c == ':' || c == '(' || c == ')' || c == ',' || c == '/' ||
        c == ';' || c == '<' || c == '=' || c == '>' || c == '?' || c == '@' || c == '[' ||
        c == '\\' || c == ']' || c == '{' || c == '}' || c == '"') {
      return false;
    }
  }
  return true;
}

bool is_target(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (static_cast<unsigned char>(c) <= 32 || c == 127) return false;
  }
  return true;
}

std::optional<FramingRefusal> check_transfer_codings(const std::vector<std::string_view>& values) {
  // The field is a comma-separated list that may span several field lines;
  // empty list elements are allowed and ignored (RFC 9110 §5.6.1).
  std::vector<std::string> codings;
  for (std::string_view v : values) {
    size_t start = 0;
    while (start <= v.size()) {
      size_t end = v.find(',', start);
      if (end == std::string_view::npos) end = v.size();
      std::string_view item = v.substr(start, end - start);
      while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
      while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
      if (!item.empty()) codings.push_back(to_lower(item));
      start = end + 1;
    }
  }
  auto quoted = [](std::string_view s) {
    std::string out = "'";
    // Bounded: a hostile header must not make the detail large.
    out += s.substr(0, 64);
    out += s.size() > 64 ? "...'" : "'";
    return out;
  };
  if (codings.empty() || codings.back() != "chunked") {
    return FramingRefusal{400, "Transfer-Encoding " +
                                   quoted(codings.empty() ? std::string() : codings.back()) +
                                   " does not end with chunked: the body's length cannot be "
                                   "determined"};
  }
  for (size_t i = 0; i + 1 < codings.size(); ++i) {
    if (codings[i] == "chunked") {
      return FramingRefusal{400, "Transfer-Encoding applies chunked more than once"};
    }
    return FramingRefusal{501, "transfer coding " + quoted(codings[i]) +
                                   " is not supported; only chunked is"};
  }
  return std::nullopt;
}

bool is_host_value(std::string_view host) {
  for (char c : host) {
    const bool alnum = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    // unreserved, sub-delims, pct-encoded's '%', the port's ':' and an IP literal's brackets
    static constexpr std::string_view kOther = "-._~!$&'()*+,;=%:[]";
    if (!alnum && kOther.find(c) == std::string_view::npos) return false;
  }
  return true;
}

bool is_websocket_key(std::string_view key) {
  // 16 bytes encode to 22 significant characters and two '=' of padding.
  if (key.size() != 24 || key[22] != '=' || key[23] != '=') return false;
  for (size_t i = 0; i < 22; ++i) {
    const char c = key[i];
    const bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (!alpha && c != '+' && c != '/') return false;
  }
  return true;
}

}  // namespace entente::http::detail
