// The dashboard (docs/dashboard.md): its static files at /ui/, the session
// cookie a browser trades its token for, and the bearer token a browser
// offers in a WebSocket subprotocol.
#include <openssl/rand.h>

#include <algorithm>

#include "broker/detail/json_in.h"
#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "broker/detail/ui_assets.h"
#include "rapidjson/document.h"

namespace entente::broker::detail {

using http::Request;
using http::Respond;
using http::Response;

namespace {

constexpr std::string_view kUiProtocol = "entente.v1";
constexpr std::string_view kBearerProtocol = "entente.bearer.";

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The comma-separated entries of a Sec-WebSocket-Protocol header.
std::vector<std::string_view> offered_protocols(const Request& req) {
  std::vector<std::string_view> out;
  auto h = req.header("sec-websocket-protocol");
  if (!h) return out;
  std::string_view rest = *h;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    out.push_back(trim(rest.substr(0, comma)));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
  }
  return out;
}

// Every page is revalidated (no-cache) against its ETag, so that a new
// build's files are picked up at once and an unchanged one costs a 304.
// The policy lets the page load only its own files and talk only to its
// own node.
void add_ui_headers(Response& r, const UiAsset& a) {
  r.headers.emplace_back("ETag", std::string(a.etag));
  r.headers.emplace_back("Cache-Control", "no-cache");
  r.headers.emplace_back("X-Content-Type-Options", "nosniff");
  r.headers.emplace_back("Referrer-Policy", "no-referrer");
  r.headers.emplace_back("Content-Security-Policy",
                         "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                         "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'");
}

std::string session_cookie(std::string_view id, int64_t max_age_s, bool secure) {
  std::string c = std::string(kUiSessionCookie) + "=" + std::string(id) +
                  "; Path=/; Max-Age=" + std::to_string(max_age_s) + "; HttpOnly; SameSite=Strict";
  if (secure) c += "; Secure";
  return c;
}

}  // namespace

// --- UiSessions

std::optional<std::string> UiSessions::create(std::string token, std::chrono::seconds ttl) {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) return std::nullopt;
  std::string id = hex_of(std::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
  const auto now = Clock::now();
  std::lock_guard lock(mu_);
  purge_locked(now);
  if (sessions_.size() >= kMaxUiSessions) {
    auto soonest = std::min_element(sessions_.begin(), sessions_.end(), [](const auto& a, const auto& b) {
      return a.second.expires < b.second.expires;
    });
    sessions_.erase(soonest);
  }
  sessions_[id] = Entry{std::move(token), now + ttl};
  return id;
}

std::optional<std::string> UiSessions::token_of(std::string_view id) {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) return std::nullopt;
  if (it->second.expires <= Clock::now()) {
    sessions_.erase(it);
    return std::nullopt;
  }
  return it->second.token;
}

void UiSessions::drop(std::string_view id) {
  std::lock_guard lock(mu_);
  if (auto it = sessions_.find(id); it != sessions_.end()) sessions_.erase(it);
}

void UiSessions::purge_locked(Clock::time_point now) {
  std::erase_if(sessions_, [now](const auto& e) { return e.second.expires <= now; });
}

std::optional<std::string_view> cookie_value(std::string_view header, std::string_view name) {
  while (!header.empty()) {
    const size_t semi = header.find(';');
    std::string_view pair = trim(header.substr(0, semi));
    header = semi == std::string_view::npos ? std::string_view() : header.substr(semi + 1);
    const size_t eq = pair.find('=');
    if (eq != std::string_view::npos && trim(pair.substr(0, eq)) == name) return trim(pair.substr(eq + 1));
  }
  return std::nullopt;
}

// --- routes

void NodeImpl::get_ui(const Request& req, const PathParams& params, const Respond& answer) {
  // "/ui" has no trailing slash: the page's relative links need one.
  if (params.empty() && !req.path.ends_with('/')) {
    Response r = Response::problem(301, "Moved Permanently", "the dashboard is at /ui/");
    r.headers.emplace_back("Location", "/ui/");
    answer(std::move(r));
    return;
  }
  const std::string_view name = params.empty() ? "index.html" : std::string_view(params[0]);
  const UiAsset* a = ui_asset(name);
  if (!a) {
    answer(Response::problem(404, "Not Found",
                             "the dashboard has no file '" + std::string(name.substr(0, 100)) + "'"));
    return;
  }
  Response r;
  if (auto inm = req.header("if-none-match"); inm && inm->find(a->etag) != std::string_view::npos) {
    r.status = 304;
  } else {
    r.status = 200;
    r.content_type = std::string(a->content_type);
    if (req.method != "HEAD") r.body = std::string(a->body);
  }
  add_ui_headers(r, *a);
  answer(std::move(r));
}

void NodeImpl::post_ui_session(const Request& req, const PathParams&, const Respond& answer) {
  // The route needs a token: handle() authenticated the Authorization
  // header (a cookie never stands for one on a POST), so it is here.
  const std::string token(req.header("authorization")->substr(7));
  auto ttl = kUiSessionDefaultTtl;
  if (!trim(req.body).empty()) {
    if (!json_body(req, answer)) return;
    rapidjson::Document doc;
    if (auto p = read_json(req.body, doc)) {
      answer(Response::problem(400, "Bad Request", p->message()));
      return;
    }
    const bool ok =
        doc.IsObject() && doc.MemberCount() <= 1 &&
        (doc.MemberCount() == 0 || (doc.HasMember("ttl_seconds") && doc["ttl_seconds"].IsInt64()));
    const int64_t v = ok && doc.HasMember("ttl_seconds") ? doc["ttl_seconds"].GetInt64() : ttl.count();
    if (!ok || v < 1 || v > kUiSessionMaxTtl.count()) {
      answer(Response::problem(400, "Bad Request",
                               "the body must be empty or {\"ttl_seconds\": N} with N from 1 to " +
                                   std::to_string(kUiSessionMaxTtl.count())));
      return;
    }
    ttl = std::chrono::seconds(v);
  }
  auto id = ui_sessions_.create(token, ttl);
  if (!id) {
    answer(Response::problem(500, "Internal Server Error", "no random bytes for a session id"));
    return;
  }
  const auto who = authenticate(req, Role::reader);
  JsonOut j;
  j.begin_object().key("token_name").str(who.name).key("role").str(std::string(role_name(who.role)));
  j.key("expires_in_s").i64(ttl.count()).end_object();
  Response r = Response::json(201, j.take());
  r.headers.emplace_back("Set-Cookie", session_cookie(*id, ttl.count(), config_.tls));
  r.headers.emplace_back("Cache-Control", "no-store");
  answer(std::move(r));
}

void NodeImpl::delete_ui_session(const Request& req, const PathParams&, const Respond& answer) {
  if (auto c = req.header("cookie")) {
    if (auto id = cookie_value(*c, kUiSessionCookie)) ui_sessions_.drop(*id);
  }
  Response r;
  r.status = 204;
  r.headers.emplace_back("Set-Cookie", session_cookie("", 0, config_.tls));
  answer(std::move(r));
}

std::optional<Response> NodeImpl::browser_bearer(Request& req, const RouteInfo& route) const {
  if (req.header("authorization")) return std::nullopt;
  std::optional<std::string> token;
  if (req.websocket) {
    const auto offered = offered_protocols(req);
    for (auto p : offered) {
      if (p.starts_with(kBearerProtocol)) token = std::string(p.substr(kBearerProtocol.size()));
    }
    if (token && std::find(offered.begin(), offered.end(), kUiProtocol) == offered.end()) {
      return Response::problem(
          400, "Bad Request",
          "a token offered as the subprotocol entente.bearer.<token> needs the subprotocol "
          "entente.v1 offered with it (the one the node answers with)");
    }
  }
  // A cookie only reads: whatever changes something needs the header,
  // which another site's page cannot make a browser send.
  if (!token && req.method == "GET" && route.role == Role::reader) {
    if (auto c = req.header("cookie")) {
      if (auto id = cookie_value(*c, kUiSessionCookie)) {
        token = ui_sessions_.token_of(*id);
        if (!token) {
          Response r =
              Response::problem(401, "Unauthorized",
                                "the dashboard session has ended or is unknown; POST /v1/ui/session with "
                                "the token again");
          r.headers.emplace_back("WWW-Authenticate", "Bearer error=\"invalid_token\"");
          return r;
        }
      }
    }
  }
  if (token) req.headers.emplace_back("authorization", "Bearer " + *token);
  return std::nullopt;
}

std::string NodeImpl::subprotocol(const Request& req) const {
  for (auto p : offered_protocols(req)) {
    if (p == kUiProtocol) return std::string(kUiProtocol);
  }
  return {};
}

}  // namespace entente::broker::detail
