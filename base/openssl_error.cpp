#include "base/openssl_error.h"

#include <openssl/err.h>

namespace entente::base {
namespace {

// The reason string of `code`; OpenSSL's whole error line when it has no
// reason string for it (a code from a provider it does not name).
std::string reason_of(unsigned long code) {
  if (const char* reason = ERR_reason_error_string(code)) return reason;
  char buf[256];
  ERR_error_string_n(code, buf, sizeof buf);
  return buf;
}

}  // namespace

std::string openssl_reason(std::string_view fallback) {
  unsigned long last = 0;
  while (unsigned long e = ERR_get_error()) last = e;
  if (last == 0) return std::string(fallback);
  return reason_of(last);
}

std::string openssl_error(std::string_view what) {
  const unsigned long code = ERR_peek_last_error();
  std::string out(what);
  if (code != 0) out += ": " + reason_of(code);
  return out;
}

}  // namespace entente::base
