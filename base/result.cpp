#include "base/result.h"

namespace entente {

namespace {
class EntenteCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "entente"; }
  std::string message(int c) const override {
    switch (static_cast<Errc>(c)) {
      case Errc::ok: return "ok";
      case Errc::invalid_argument: return "invalid argument";
      case Errc::parse_error: return "parse error";
      case Errc::type_error: return "type error";
      case Errc::not_found: return "not found";
      case Errc::corrupt: return "corrupt data";
      case Errc::limit_exceeded: return "limit exceeded";
      case Errc::unsupported: return "unsupported";
      case Errc::already_exists: return "already exists";
      case Errc::unavailable: return "unavailable";
      case Errc::io_error: return "i/o error";
      case Errc::conflict: return "conflict";
      case Errc::permission_denied: return "permission denied";
    }
    return "unknown error";
  }
};
}  // namespace

const std::error_category& entente_category() noexcept {
  static const EntenteCategory category;
  return category;
}

std::string Diagnostics::to_string() const {
  std::string out;
  for (const auto& d : items_) {
    if (!out.empty()) out += '\n';
    out += d.path;
    out += ": ";
    out += d.message;
  }
  return out;
}

}  // namespace entente
