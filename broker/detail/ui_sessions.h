#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// The dashboard's short-lived sessions (docs/dashboard.md): POST
// /v1/ui/session trades a bearer token for a random id sent back as an
// HttpOnly cookie, because a browser cannot put an Authorization header on
// a WebSocket. The id stands for the token it was made from: each use is
// authenticated with that token again, so a token removed by a reload ends
// its sessions too.
//
// Thread-safe. In memory only: a restart ends every session.

#include <chrono>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace entente::broker::detail {

inline constexpr std::string_view kUiSessionCookie = "entente_session";
inline constexpr size_t kMaxUiSessions = 1024;
inline constexpr std::chrono::seconds kUiSessionDefaultTtl{600};
inline constexpr std::chrono::seconds kUiSessionMaxTtl{3600};

class UiSessions final {
 public:
  using Clock = std::chrono::steady_clock;

  // A new session for `token`, ending after `ttl`; its id (64 hex digits).
  // At kMaxUiSessions live sessions the one ending soonest is dropped.
  // nullopt only when the system's random source fails.
  std::optional<std::string> create(std::string token, std::chrono::seconds ttl);
  // The token of a live session.
  std::optional<std::string> token_of(std::string_view id);
  void drop(std::string_view id);

 private:
  struct Entry {
    std::string token;
    Clock::time_point expires;
  };
  // REQUIRES: mu_ held.
  void purge_locked(Clock::time_point now);

  std::mutex mu_;
  std::map<std::string, Entry, std::less<>> sessions_;  // REQUIRES: mu_
};

// The value of cookie `name` in a Cookie header ("a=1; entente_session=…").
std::optional<std::string_view> cookie_value(std::string_view header, std::string_view name);

}  // namespace entente::broker::detail
