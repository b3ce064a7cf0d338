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

// A read of a stream of another node of this node's own domain
// (docs/federation.md, "Reading a stream of another node of the domain")
// mirrors it as "@NODE/NAME": '@' starts no stream, domain or node name, so
// the mirror cannot clash with a user's stream ("bids") or with a mirror of
// another domain's stream ("beta/bids"). nullopt for any other name.
inline std::string internal_mirror_name(const std::string& node, const std::string& stream) {
  return "@" + node + "/" + stream;
}
inline std::optional<std::pair<std::string, std::string>> split_internal_mirror(std::string_view s) {
  if (s.empty() || s[0] != '@') return std::nullopt;
  auto parts = split_stream(s.substr(1));
  if (!parts) return std::nullopt;
  return parts;
}

// Whom the owner keeps acknowledgements for (export-ack/STREAM/PARTY): an
// importing domain, or, for a node of the owner's own domain, "@NODE" (each
// node of the domain reads on its own; '@' starts no domain name).
inline std::string ack_party(const std::string& self_domain, const std::string& peer_domain,
                             const std::string& peer_node) {
  return peer_domain == self_domain ? "@" + peer_node : peer_domain;
}
inline bool is_internal_party(std::string_view party) { return !party.empty() && party[0] == '@'; }

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
