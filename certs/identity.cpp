#include "certs/certs.h"

namespace entente::certs {

bool valid_name(std::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  if (name.front() < 'a' || name.front() > 'z') return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
    if (!ok) return false;
  }
  return true;
}

Result<Identity> parse_identity(std::string_view uri) {
  constexpr std::string_view kScheme = "entente://";
  if (uri.substr(0, kScheme.size()) != kScheme) {
    return make_error(Errc::invalid_argument,
                      "identity '" + std::string(uri) + "' does not start with entente://");
  }
  const std::string_view rest = uri.substr(kScheme.size());
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos) {
    return make_error(Errc::invalid_argument,
                      "identity '" + std::string(uri) + "' is not entente://DOMAIN/NODE");
  }
  Identity id{std::string(rest.substr(0, slash)), std::string(rest.substr(slash + 1))};
  if (!valid_name(id.domain)) {
    return make_error(Errc::invalid_argument, "identity '" + std::string(uri) + "': domain '" +
                                                  id.domain +
                                                  "' is not [a-z][a-z0-9-]* of at most 63");
  }
  if (!valid_name(id.node)) {
    return make_error(Errc::invalid_argument, "identity '" + std::string(uri) + "': node '" +
                                                  id.node +
                                                  "' is not [a-z][a-z0-9-]* of at most 63");
  }
  return id;
}

}  // namespace entente::certs
