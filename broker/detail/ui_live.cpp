// The dashboard's live updates: see ui_live.h and docs/dashboard.md.
#include "broker/detail/ui_live.h"

#include <algorithm>
#include <atomic>

#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "rapidjson/document.h"

namespace entente::broker::detail {

namespace {

using Clock = std::chrono::steady_clock;

// Why `path` may not be watched, or "" when it may: a GET route of the
// API's own table under /v1/ that is not itself a WebSocket. Only
// characters of a path segment; no query string (none of the resources
// the page shows needs one).
std::string refusal(const std::string& path) {
  if (path.size() > kMaxLivePath) return "a path longer than " + std::to_string(kMaxLivePath) + " bytes";
  if (!path.starts_with("/v1/")) return "'" + path.substr(0, 64) + "' is not under /v1/";
  const bool plain = std::all_of(path.begin(), path.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '/' || c == '-' ||
           c == '_' || c == '.' || c == '%';
  });
  if (!plain || path.find("..") != std::string::npos) return "'" + path.substr(0, 64) + "' is not a plain path";
  PathParams params;
  for (const RouteInfo* r : match_routes(path, params)) {
    if (std::string_view(r->method) == "GET" && !r->websocket) return {};
  }
  return "no GET resource at " + path.substr(0, 64);
}

// The parts of one snapshot, filled by the routes' answers (on any thread).
struct Gather {
  std::mutex mu;
  size_t remaining = 0;             // REQUIRES: mu
  std::vector<http::Response> got;  // REQUIRES: mu; one per watched path, in order
};

}  // namespace

class UiLive::Session final : public http::WebSocketSession, public std::enable_shared_from_this<Session> {
 public:
  Session(NodeImpl& node, std::string authorization, std::string remote)
      : node_(node), authorization_(std::move(authorization)), remote_(std::move(remote)) {}

  void on_open(std::shared_ptr<http::WebSocket> ws) override {
    std::lock_guard lock(mu_);
    ws_ = std::move(ws);
  }

  bool on_message(std::string_view data, bool binary) override {
    std::string problem = binary ? "messages are JSON text" : set_watch(data);
    if (!problem.empty()) {
      JsonOut j;
      j.begin_object().key("type").str("error").key("detail").str(problem).end_object();
      send(j.take());
    }
    return true;
  }

  void on_close() override {
    std::lock_guard lock(mu_);
    ws_.reset();
    closed_ = true;
  }

  bool closed() {
    std::lock_guard lock(mu_);
    return closed_;
  }

  // Called by the hub's thread: asks every watched resource once the
  // interval has passed and the previous snapshot went out.
  void tick(Clock::time_point now) {
    std::vector<std::string> watch;
    {
      std::lock_guard lock(mu_);
      if (closed_ || !ws_ || watch_.empty() || in_flight_ || now < due_) return;
      in_flight_ = true;
      due_ = now + interval_;
      watch = watch_;
    }
    auto gather = std::make_shared<Gather>();
    gather->remaining = watch.size();
    gather->got.resize(watch.size());
    std::weak_ptr<Session> weak = shared_from_this();
    for (size_t i = 0; i < watch.size(); ++i) {
      http::Request r;
      r.method = "GET";
      r.target = watch[i];
      r.path = watch[i];
      r.remote = remote_;
      r.headers.emplace_back("authorization", authorization_);
      node_.handle(std::move(r), [weak, gather, watch, i](http::Response resp) {
        std::unique_lock lock(gather->mu);
        gather->got[i] = std::move(resp);
        if (--gather->remaining != 0) return;
        lock.unlock();
        if (auto s = weak.lock()) s->deliver(watch, gather->got);
      });
    }
  }

 private:
  // Parses {"watch": [paths], "interval_ms": N}; "" when taken.
  std::string set_watch(std::string_view text) {
    rapidjson::Document d;
    d.Parse(text.data(), text.size());
    if (d.HasParseError() || !d.IsObject()) return "expected a JSON object {\"watch\": [paths], \"interval_ms\": N}";
    for (auto it = d.MemberBegin(); it != d.MemberEnd(); ++it) {
      const std::string_view k(it->name.GetString(), it->name.GetStringLength());
      if (k != "watch" && k != "interval_ms") return "unknown member '" + std::string(k.substr(0, 32)) + "'";
    }
    if (!d.HasMember("watch") || !d["watch"].IsArray()) return "watch: expected an array of paths";
    const auto& w = d["watch"];
    if (w.Size() > kMaxLiveWatch) return "watch: at most " + std::to_string(kMaxLiveWatch) + " paths";
    std::vector<std::string> paths;
    for (const auto& p : w.GetArray()) {
      if (!p.IsString()) return "watch: expected an array of paths";
      std::string path(p.GetString(), p.GetStringLength());
      if (std::string why = refusal(path); !why.empty()) return "watch: " + why;
      if (std::find(paths.begin(), paths.end(), path) == paths.end()) paths.push_back(std::move(path));
    }
    int64_t interval = kLiveIntervalDefaultMs;
    if (d.HasMember("interval_ms")) {
      const auto& v = d["interval_ms"];
      if (!v.IsInt64() || v.GetInt64() < kLiveIntervalMinMs || v.GetInt64() > kLiveIntervalMaxMs) {
        return "interval_ms: expected an integer from " + std::to_string(kLiveIntervalMinMs) + " to " +
               std::to_string(kLiveIntervalMaxMs);
      }
      interval = v.GetInt64();
    }
    std::lock_guard lock(mu_);
    watch_ = std::move(paths);
    interval_ = std::chrono::milliseconds(interval);
    due_ = Clock::now();  // the first snapshot of the new list at once
    return {};
  }

  // One snapshot: {"type":"snapshot","seq":N,"at_ms":T,"parts":{path:
  // {"status":S,"body":JSON or null}}}. A token that no longer
  // authenticates ends the session instead.
  void deliver(const std::vector<std::string>& watch, const std::vector<http::Response>& got) {
    JsonOut j;
    j.begin_object().key("type").str("snapshot").key("seq").u64(++seq_).key("at_ms").i64(wall_clock_ms());
    j.key("parts").begin_object();
    bool unauthorised = false;
    for (size_t i = 0; i < watch.size(); ++i) {
      unauthorised |= got[i].status == 401;
      j.key(watch[i]).begin_object().key("status").u64(got[i].status).key("body");
      const bool json = got[i].content_type.find("json") != std::string::npos && !got[i].body.empty();
      if (json) j.raw(got[i].body);
      else j.null();
      j.end_object();
    }
    j.end_object().end_object();
    std::shared_ptr<http::WebSocket> ws;
    {
      std::lock_guard lock(mu_);
      in_flight_ = false;
      ws = ws_;
    }
    if (!ws) return;
    if (unauthorised) {
      ws->close(kCloseTokenInvalid, "the session's token no longer authenticates; sign in again");
      return;
    }
    // A browser still reading the last one gets the next instead of a queue.
    (void)ws->send(j.take(), false);
  }

  void send(std::string text) {
    std::shared_ptr<http::WebSocket> ws;
    {
      std::lock_guard lock(mu_);
      ws = ws_;
    }
    if (ws) (void)ws->send(std::move(text), false);
  }

  NodeImpl& node_;
  const std::string authorization_;
  const std::string remote_;
  std::atomic<uint64_t> seq_{0};
  std::mutex mu_;
  std::shared_ptr<http::WebSocket> ws_;  // REQUIRES: mu_
  bool closed_ = false;                  // REQUIRES: mu_
  bool in_flight_ = false;               // REQUIRES: mu_
  std::vector<std::string> watch_;       // REQUIRES: mu_
  std::chrono::milliseconds interval_{kLiveIntervalDefaultMs};  // REQUIRES: mu_
  Clock::time_point due_{};              // REQUIRES: mu_
};

std::shared_ptr<http::WebSocketSession> UiLive::open(std::string authorization, std::string remote,
                                                     http::Response& reject) {
  std::lock_guard lock(mu_);
  std::erase_if(sessions_, [](const std::weak_ptr<Session>& w) {
    auto s = w.lock();
    return !s || s->closed();
  });
  if (stopping_ || sessions_.size() >= kMaxLiveSessions) {
    reject = http::Response::problem(503, "Service Unavailable",
                                     stopping_ ? "the node is stopping"
                                               : "at most " + std::to_string(kMaxLiveSessions) +
                                                     " live dashboard sessions at a time");
    return nullptr;
  }
  auto s = std::make_shared<Session>(node_, std::move(authorization), std::move(remote));
  sessions_.push_back(s);
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  cv_.notify_one();
  return s;
}

void UiLive::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void UiLive::loop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(50));
    if (stopping_) break;
    std::vector<std::shared_ptr<Session>> live;
    for (const auto& w : sessions_) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
    lock.unlock();
    const auto now = Clock::now();
    for (const auto& s : live) s->tick(now);
    live.clear();  // the last reference to a closed session goes here, unlocked
    lock.lock();
  }
}

}  // namespace entente::broker::detail
