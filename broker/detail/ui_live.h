#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// The dashboard's live updates (docs/dashboard.md, "Live updates"): a
// WebSocket at /v1/ui/live on which the page names the GET resources it
// shows ({"watch": ["/v1/nodes", "/v1/peers", ...], "interval_ms": 1000})
// and the node pushes a snapshot of all of them every interval. Each
// resource is answered by the API's own route, with the session's token,
// so a snapshot holds exactly what the REST call would, forwarded within a
// domain of several nodes as usual, and a token removed by a reload ends
// the session (close 4401).
//
// One thread for all sessions, started with the first; at most
// kMaxLiveSessions at a time. Thread-safe.

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/server.h"

namespace entente::broker::detail {

class NodeImpl;

inline constexpr size_t kMaxLiveSessions = 64;
inline constexpr size_t kMaxLiveWatch = 32;           // resources per session
inline constexpr size_t kMaxLivePath = 256;           // bytes per resource path
inline constexpr int64_t kLiveIntervalMinMs = 250;
inline constexpr int64_t kLiveIntervalMaxMs = 60000;
inline constexpr int64_t kLiveIntervalDefaultMs = 1000;
inline constexpr uint16_t kCloseTokenInvalid = 4401;  // the session's token no longer authenticates

class UiLive final {
 public:
  explicit UiLive(NodeImpl& node) : node_(node) {}
  ~UiLive() { stop(); }
  UiLive(const UiLive&) = delete;
  UiLive& operator=(const UiLive&) = delete;

  // A session for an accepted upgrade whose bearer token is `authorization`
  // (the whole header value); nullptr with `reject` set (503) at the limit
  // or once stopped.
  std::shared_ptr<http::WebSocketSession> open(std::string authorization, std::string remote,
                                               http::Response& reject);
  // Ends the thread; open sessions get no more snapshots (the server's stop
  // closes them). Idempotent.
  void stop();

  class Session;

 private:
  void loop();

  NodeImpl& node_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;                         // REQUIRES: mu_
  std::thread thread_;                            // started by the first open()
  std::vector<std::weak_ptr<Session>> sessions_;  // REQUIRES: mu_
};

}  // namespace entente::broker::detail
