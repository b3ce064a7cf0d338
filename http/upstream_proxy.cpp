// Forwarding a server request or WebSocket to another node through an
// Upstream (see upstream.h). Only the public interfaces of server.h and
// upstream.h: no Asio or Beast here.

#include <mutex>
#include <optional>

#include "base/json_read.h"
#include "http/upstream.h"

namespace entente::http {
namespace {

// The node's response headers a forwarded answer keeps; the rest (Server,
// Date, Connection, Content-Length) are the forwarding server's own.
constexpr std::string_view kPassedResponseHeaders[] = {"retry-after", "location", "allow", "etag",
                                                       "www-authenticate"};
// What Upstream reports when it is stopped (upstream.cpp says the same).
constexpr std::string_view kStoppedMessage = "the forwarding client stopped";
constexpr size_t kMaxCloseReason = 123;
// The close code for a node that cannot be reached or went away: 1013 "try
// again later" (a temporary condition: reconnect). 1014 "bad gateway" would
// say it better, but Beast, and with it our own clients, refuse it as reserved.
constexpr uint16_t kNodeUnavailable = 1013;

HeaderList forward_headers(const Request& r, const ForwardOptions& o, bool websocket) {
  HeaderList out;
  auto pass = [&](std::string_view name) {
    for (const auto& [k, v] : r.headers) {
      if (k == name) out.emplace_back(k, v);
    }
  };
  pass("authorization");
  if (!websocket) {
    pass("accept");
    pass("content-type");
  }
  for (const auto& name : o.pass_headers) {
    if (name != "authorization" && name != "accept" && name != "content-type") pass(name);
  }
  for (const auto& h : o.extra_headers) out.push_back(h);
  return out;
}

Response gateway_problem(const std::string& where, const Error& e) {
  unsigned status = 502;
  std::string_view title = "Bad Gateway";
  if (e.code == Errc::unavailable && e.message == kStoppedMessage) {
    status = 503;
    title = "Service Unavailable";
  } else if (e.code == Errc::unavailable) {
    status = 504;
    title = "Gateway Timeout";
  }
  Response r = Response::problem(status, title, "node " + where + ": " + e.message);
  if (status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

// Cuts `s` to at most `max` bytes without splitting a UTF-8 sequence.
std::string cut_utf8(std::string s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  s.resize(n);
  return s;
}

// "HTTP 404: <body>" → "HTTP 404: <the problem's detail>" when the body is
// problem+json: a close reason has room for 123 bytes only.
std::string refusal_reason(unsigned status, const std::string& reason) {
  const std::string prefix = "HTTP " + std::to_string(status) + ": ";
  if (reason.rfind(prefix, 0) != 0) return reason;
  rapidjson::Document doc;
  const std::string_view body = std::string_view(reason).substr(prefix.size());
  if (!base::read_json(body, doc) && doc.IsObject()) {
    auto it = doc.FindMember("detail");
    if (it != doc.MemberEnd() && it->value.IsString()) {
      return prefix + std::string(it->value.GetString(), it->value.GetStringLength());
    }
  }
  return reason;
}

struct Pending {
  std::string data;
  bool binary = false;
};

// Joins one accepted client WebSocket (server side) and one upstream
// WebSocket. Its state is guarded by `mu_`: the server calls it on the
// client connection's strand, the Upstream on its own thread. Calls into
// either WebSocket never call back synchronously, so they are made under
// the lock. At most one message per direction waits here (the one that
// found the other side's queue full), so memory is bounded by the two send
// buffers plus two messages.
class WsProxy final : public WebSocketSession, public std::enable_shared_from_this<WsProxy> {
 public:
  WsProxy(Upstream& upstream, UpstreamTarget target, std::string path, HeaderList headers)
      : upstream_(upstream),
        target_(std::move(target)),
        path_(std::move(path)),
        headers_(std::move(headers)) {}

  void on_open(std::shared_ptr<WebSocket> ws) override {
    std::weak_ptr<WsProxy> weak = weak_from_this();
    std::lock_guard lock(mu_);
    down_ = ws;
    ws->set_on_drain([weak] {
      if (auto self = weak.lock()) self->on_down_drain();
    });
    // The upstream's callbacks own the proxy: after the client has gone, a
    // message still waiting for the node's queue must go, then the close.
    // No cycle: the Upstream drops them when that WebSocket ends.
    auto self = shared_from_this();
    UpstreamWebSocketCallbacks cb;
    cb.on_message = [self](std::string data, bool binary) {
      self->on_up_message(std::move(data), binary);
    };
    cb.on_drain = [self] { self->on_up_drain(); };
    cb.on_close = [self](uint16_t code, std::string reason) {
      self->on_up_close(code, std::move(reason));
    };
    // Its callbacks come from the Upstream's threads and wait for mu_.
    up_ = upstream_.websocket(target_, path_, headers_, std::move(cb));
    if (!up_) {
      up_closed_ = true;
      down_->close(1001, "going away");  // the forwarding node is stopping
    }
  }

  bool on_message(std::string_view data, bool binary) override {
    std::lock_guard lock(mu_);
    if (up_closed_ || !up_) return true;  // the client is being closed
    if (up_->send(std::string(data), binary) == WebSocket::SendResult::overflow) {
      // Kept here, and the client is not read until the node's queue drains.
      to_up_ = Pending{std::string(data), binary};
      return false;
    }
    return true;
  }

  void on_close_received(uint16_t code, std::string_view reason) override {
    std::lock_guard lock(mu_);
    client_close_ = {code, std::string(reason)};
  }

  void on_close() override {
    std::lock_guard lock(mu_);
    down_closed_ = true;
    to_down_.reset();
    if (!client_close_) client_close_ = {1001, "the client went away"};
    if (!up_ || up_closed_) {
      down_.reset();
      return;
    }
    // What the client sent before its close still goes first.
    if (!to_up_) up_->close(client_close_->first, client_close_->second);
    up_->resume_reading();  // nothing to hold back for any more
    down_.reset();
  }

 private:
  void on_up_message(std::string data, bool binary) {
    std::lock_guard lock(mu_);
    if (down_closed_ || !down_) return;
    // A copy: send() consumes its argument even when it refuses it.
    if (down_->send(data, binary) == WebSocket::SendResult::overflow) {
      // Kept here, and the node is not read until the client's buffer drains.
      to_down_ = Pending{std::move(data), binary};
      up_->pause_reading();
    }
  }

  void on_down_drain() {
    std::lock_guard lock(mu_);
    if (down_closed_ || !down_) return;
    if (to_down_) {
      const auto r = down_->send(to_down_->data, to_down_->binary);
      if (r == WebSocket::SendResult::overflow) return;  // the next drain
      to_down_.reset();
      if (up_ && !up_closed_) up_->resume_reading();
    }
    if (up_close_ && down_->queued_bytes() == 0) {
      down_->close(up_close_->first, up_close_->second);
      up_close_.reset();
    }
  }

  void on_up_drain() {
    std::lock_guard lock(mu_);
    if (!up_ || up_closed_) return;
    if (to_up_) {
      const auto r = up_->send(to_up_->data, to_up_->binary);
      if (r == WebSocket::SendResult::overflow) return;  // the next drain
      to_up_.reset();
      if (down_closed_) {
        up_->close(client_close_->first, client_close_->second);
      } else if (down_) {
        down_->resume_reading();
      }
    }
  }

  void on_up_close(uint16_t code, std::string reason) {
    std::lock_guard lock(mu_);
    up_closed_ = true;
    to_up_.reset();
    if (down_closed_ || !down_) return;
    const unsigned refused = up_ ? up_->refused_status() : 0;
    const uint16_t mapped = proxied_close_code(code, refused);
    if (refused != 0) {
      reason = refusal_reason(refused, reason);
    } else if (mapped == kNodeUnavailable && code != kNodeUnavailable) {
      reason = "node " + target_.address() + ": " + reason;
    }
    reason = cut_utf8(std::move(reason), kMaxCloseReason);
    down_->resume_reading();  // a client held back must see the close
    // The node's last messages reach the client before its close.
    if (to_down_ || down_->queued_bytes() > 0) {
      up_close_ = {mapped, std::move(reason)};
    } else {
      down_->close(mapped, std::move(reason));
    }
  }

  Upstream& upstream_;
  const UpstreamTarget target_;
  const std::string path_;
  const HeaderList headers_;

  std::mutex mu_;
  std::shared_ptr<WebSocket> down_;          // REQUIRES mu_; the client
  std::shared_ptr<UpstreamWebSocket> up_;    // REQUIRES mu_; the node
  bool down_closed_ = false;                 // REQUIRES mu_
  bool up_closed_ = false;                   // REQUIRES mu_
  std::optional<Pending> to_up_;             // REQUIRES mu_
  std::optional<Pending> to_down_;           // REQUIRES mu_
  std::optional<std::pair<uint16_t, std::string>> client_close_;  // REQUIRES mu_
  std::optional<std::pair<uint16_t, std::string>> up_close_;  // REQUIRES mu_: after the drain
};

}  // namespace

uint16_t proxied_close_code(uint16_t upstream_code, unsigned refused_status) {
  if (refused_status >= 400 && refused_status <= 599) {
    return static_cast<uint16_t>(4000 + refused_status);
  }
  if (refused_status != 0) return kNodeUnavailable;
  // Codes that must not appear in a close frame (RFC 6455 §7.4): 1005 "no
  // status", 1006 "abnormal", 1015 "TLS failure"; and those Beast-based
  // clients refuse as reserved (1004, 1014 up to 2999) or out of range.
  if (upstream_code < 1000 || (upstream_code >= 1004 && upstream_code <= 1006) ||
      (upstream_code >= 1014 && upstream_code <= 2999) || upstream_code >= 5000) {
    return kNodeUnavailable;
  }
  return upstream_code;
}

void forward_request(Upstream& upstream, const UpstreamTarget& target, const Request& request,
                     Respond respond, const ForwardOptions& options) {
  upstream.request(
      target, request.method, request.target, forward_headers(request, options, false),
      request.body,
      [respond = std::move(respond), where = target.address()](Result<ClientResponse> res) {
        if (!res.ok()) {
          respond(gateway_problem(where, res.error()));
          return;
        }
        Response out;
        out.status = res->status;
        out.content_type = std::string(res->header("content-type").value_or(""));
        out.body = std::move(res->body);
        for (const auto& [name, value] : res->headers) {
          for (std::string_view passed : kPassedResponseHeaders) {
            if (name == passed) out.headers.emplace_back(name, value);
          }
        }
        respond(std::move(out));
      });
}

std::shared_ptr<WebSocketSession> make_websocket_proxy(Upstream& upstream,
                                                       const UpstreamTarget& target,
                                                       const Request& request,
                                                       const ForwardOptions& options) {
  return std::make_shared<WsProxy>(upstream, target, request.target,
                                   forward_headers(request, options, true));
}

}  // namespace entente::http
