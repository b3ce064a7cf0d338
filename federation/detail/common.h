#pragma once
#if !defined(ENTENTE_IN_FEDERATION)
#error "federation/detail/ is private to federation/ (docs/architecture.md)"
#endif
// Small pieces the federation layer's files share. Private to federation/.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace entente::federation::detail {

using Clock = std::chrono::steady_clock;

// Unix time in ms (contracts' validity is wall-clock time).
inline int64_t wall_clock_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// "beta/bids" -> {"beta", "bids"}; nullopt without a slash.
inline std::optional<std::pair<std::string, std::string>> split_stream(std::string_view s) {
  const auto slash = s.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == s.size()) return std::nullopt;
  return std::make_pair(std::string(s.substr(0, slash)), std::string(s.substr(slash + 1)));
}

// Callbacks collected under a lock and run when this object goes, after the
// lock (declared later) is released: an API callback may come back into the
// federation layer (a deploy reads import states) and must find no lock held.
class Deferred {
 public:
  Deferred() = default;
  Deferred(const Deferred&) = delete;
  Deferred& operator=(const Deferred&) = delete;
  ~Deferred() {
    for (auto& f : calls_) f();
  }
  void add(std::function<void()> f) { calls_.push_back(std::move(f)); }

 private:
  std::vector<std::function<void()>> calls_;
};

}  // namespace entente::federation::detail
