// The REST routes of docs/api/openapi.yaml. Every error is problem+json.
#include <charconv>
#include <chrono>
#include <mutex>
#include <string_view>

#include "broker/detail/ingest.h"
#include "broker/detail/json_in.h"
#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "federation/peering.h"
#include "engine/codec.h"
#include "engine/network.h"
#include "entente_version.h"
#include "rapidjson/document.h"
#include "rapidjson/error/en.h"

namespace entente::broker {
std::string_view openapi_json();  // generated from docs/api/openapi.yaml
}

namespace entente::broker::detail {

using http::Request;
using http::Respond;
using http::Response;

Response problem_for(const Error& e) {
  switch (e.code) {
    case Errc::not_found: return Response::problem(404, "Not Found", e.message);
    case Errc::already_exists: return Response::problem(409, "Conflict", e.message);
    case Errc::conflict: return Response::problem(409, "Conflict", e.message);
    case Errc::permission_denied: return Response::problem(403, "Forbidden", e.message);
    case Errc::limit_exceeded: return Response::problem(409, "Limit Reached", e.message);
    case Errc::unavailable: {
      auto r = Response::problem(503, "Service Unavailable", e.message);
      r.headers.emplace_back("Retry-After", "1");
      return r;
    }
    case Errc::io_error:
    case Errc::corrupt: return Response::problem(500, "Internal Server Error", e.message);
    default: return Response::problem(400, "Bad Request", e.message);
  }
}

namespace {

std::string diagnostics_members(const Diagnostics& diag) {
  JsonOut j;
  j.begin_array();
  for (auto& d : diag.items()) j.begin_object().key("path").str(d.path).key("message").str(d.message).end_object();
  j.end_array();
  return "\"errors\":" + j.take();
}

std::string rfc3339(int64_t ms) {
  std::time_t t = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms % 1000));
  return buf;
}

void write_retention(JsonOut& j, const store::Retention& r) {
  j.key("retention").begin_object();
  j.key("max_tuples").u64(r.max_tuples).key("max_bytes").u64(r.max_bytes).key("max_age_ms").i64(r.max_age_ms);
  j.end_object();
}


void write_checkpoint(JsonOut& j, const CheckpointInfo& c) {
  j.begin_object();
  j.key("query").str(c.query).key("id").u64(c.id).key("bytes").u64(c.bytes);
  if (c.taken_ms) j.key("taken_at").str(rfc3339(c.taken_ms));
  j.key("duration_ms").dbl(c.duration_ms);
  j.end_object();
}

void write_import(JsonOut& j, const ImportInfo& i) {
  j.begin_object();
  j.key("stream").str(i.stream).key("owner").str(i.owner).key("state").str(i.state);
  j.key("reason").str(i.reason);
  // A read of another node of this domain names that node.
  if (!i.node.empty()) j.key("node").str(i.node);
  j.key("schema");
  if (i.schema) j.raw(engine::schema_to_json(*i.schema));
  else j.null();
  j.key("next_seq").u64(i.next_seq).key("acked").u64(i.acked).key("tuples").u64(i.tuples);
  j.end_object();
}

std::string import_json(const ImportInfo& i) {
  JsonOut j;
  write_import(j, i);
  return j.take();
}

}  // namespace

std::string query_json(const std::shared_ptr<QueryRunner>& q, const std::string& placement,
                       const Peering* peering) {
  const auto& m = q->meta();
  auto info = q->info();
  JsonOut j;
  j.begin_object();
  j.key("name").str(m.name);
  j.key("state").str(info.state);
  j.key("inputs").begin_array();
  for (auto& s : m.inputs) j.str(s);
  j.end_array();
  // Inputs that are another domain's streams, with their import's state:
  // a refusal by the owner shows here.
  j.key("imports").begin_array();
  if (peering) {
    for (auto& s : m.inputs) {
      if (auto imp = peering->import_info(s)) write_import(j, *imp);
    }
  }
  j.end_array();
  j.key("outputs").begin_array();
  for (auto& s : m.outputs) j.str(s);
  j.end_array();
  j.key("network").raw(m.network_json);
  j.key("boxes").begin_array();
  for (size_t i = 0; i < info.boxes.size(); ++i) {
    const auto& b = info.boxes[i];
    j.begin_object();
    j.key("id").str(b.id).key("type").str(b.type).key("placement").str(placement);
    j.key("tuples_in").u64(b.stats.tuples_in).key("tuples_out").u64(b.stats.tuples_out);
    j.key("tuples_in_per_s").dbl(i < info.tuples_in_per_s.size() ? info.tuples_in_per_s[i] : 0.0);
    j.key("tuples_out_per_s").dbl(i < info.tuples_out_per_s.size() ? info.tuples_out_per_s[i] : 0.0);
    j.key("cpu_ns_per_tuple").dbl(b.stats.cpu_ns_per_tuple()).key("selectivity").dbl(b.stats.selectivity());
    j.key("bytes_out").u64(b.stats.bytes_out).key("late_dropped").u64(b.stats.late_dropped);
    j.key("state_bytes").u64(b.stats.state_bytes);
    j.end_object();
  }
  j.end_array();
  j.key("positions").begin_object();
  for (size_t i = 0; i < m.inputs.size() && i < info.positions.size(); ++i) j.key(m.inputs[i]).u64(info.positions[i]);
  j.end_object();
  j.key("lag_tuples").u64(info.lag_tuples);
  // What the runner costs here (cpu_load.h): what a hosting contract's
  // max_load is compared with, and what hosting meters.
  j.key("load").begin_object().key("cpu_ms_per_s").dbl(info.cpu_ms_per_s).key("cpu_seconds").dbl(info.cpu_seconds);
  j.key("window_s").u64(kLoadWindowSeconds).end_object();
  j.key("checkpoint");
  if (info.checkpoint) write_checkpoint(j, *info.checkpoint);
  else j.null();
  j.key("created_at").str(rfc3339(m.created_ms));
  j.end_object();
  return j.take();
}

namespace {

// Splits "/v1/streams/x/tuples" into segments.
std::vector<std::string_view> segments(std::string_view path) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < path.size()) {
    if (path[i] == '/') {
      ++i;
      continue;
    }
    size_t j = path.find('/', i);
    if (j == std::string_view::npos) j = path.size();
    out.push_back(path.substr(i, j - i));
    i = j;
  }
  return out;
}

// Decodes %XX escapes in one path segment ("acme%2Fbids" -> "acme/bids"), so
// a stream of another domain can be named in a URL. A malformed escape is
// kept as it is: the name then matches nothing and the answer is a 404.
std::string percent_decode(std::string_view s) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

}  // namespace

std::string stream_json(const NodeImpl& node, const StreamPtr& s) {
  const auto& m = s->meta();
  JsonOut j;
  j.begin_object();
  j.key("name").str(m.name);
  j.key("schema").raw(engine::schema_to_json(*m.schema));
  j.key("event_time");
  if (m.event_time.empty()) j.null();
  else j.str(m.event_time);
  j.key("producer").str(m.producer);
  // The node that appends it (docs/cluster.md): in a domain of several
  // nodes the others forward its writes there.
  j.key("node").str(node.config().node);
  // When an append is acknowledged (a stream from before the choice: the
  // node's ingest_durability).
  j.key("durability").str(m.durability.empty() ? std::string(ingest_durability_name(node.config().ingest_durability))
                                                : m.durability);
  auto first = store::StreamLog::first(const_cast<NodeImpl&>(node).store(), m.id);
  // What readers see (next_seq), and what this node's log holds
  // (durable_next_seq): more while its in-sync followers have not
  // acknowledged the rest (docs/cluster.md, "Replicated stream logs").
  const uint64_t next = s->visible_next();
  const uint64_t first_seq = first.ok() && *first ? std::min((*first)->first, next) : next;
  j.key("first_seq").u64(first_seq);
  j.key("next_seq").u64(next);
  j.key("durable_next_seq").u64(std::max(next, s->committed_next()));
  j.key("tuples").u64(next - first_seq);
  // Publishers whose named batches it remembers (docs/api.md, "Publishing
  // exactly once"); on a follower's copy, those copied from the leader.
  j.key("producers_remembered").u64(s->producer_count());
  write_retention(j, m.retention);
  if (auto r = node.replication_json(m.name)) j.key("replication").raw(*r);
  j.key("created_at").str(rfc3339(m.created_ms));
  j.end_object();
  return j.take();
}

// The path as sent, still percent-encoded, so that "acme%2Fbids" stays one
// segment; match_routes decodes each segment itself.
std::string routing_path(const http::Request& req) {
  if (req.target.empty()) return req.path;
  return req.target.substr(0, req.target.find('?'));
}

const std::vector<RouteInfo>& api_routes() {
  using N = NodeImpl;
  constexpr std::optional<Role> kPublic;
  // Order matters only for the Allow header, which lists a path's methods
  // in this order.
  static const std::vector<RouteInfo> routes = {
      {"GET", "/v1/health", kPublic, false, &N::get_health},
      {"GET", "/metrics", Role::reader, false, &N::get_metrics},
      {"GET", "/v1/openapi.json", kPublic, false, &N::get_openapi},
      {"GET", "/ui", kPublic, false, &N::get_ui},
      {"GET", "/ui/{file}", kPublic, false, &N::get_ui},
      {"POST", "/v1/ui/session", Role::reader, false, &N::post_ui_session},
      {"DELETE", "/v1/ui/session", kPublic, false, &N::delete_ui_session},
      {"GET", "/v1/ui/live", Role::reader, true, nullptr},
      {"GET", "/v1/streams", Role::reader, false, &N::list_streams_route},
      {"POST", "/v1/streams", Role::admin, false, &N::create_stream_route},
      {"GET", "/v1/streams/{name}", Role::reader, false, &N::get_stream},
      {"DELETE", "/v1/streams/{name}", Role::admin, false, &N::delete_stream_route},
      {"POST", "/v1/streams/{name}/tuples", Role::publisher, false, &N::post_tuples},
      {"GET", "/v1/streams/{name}/subscribe", Role::reader, true, nullptr},
      {"GET", "/v1/streams/{name}/publish", Role::publisher, true, nullptr},
      {"GET", "/v1/queries", Role::reader, false, &N::list_queries_route},
      {"POST", "/v1/queries", Role::admin, false, &N::deploy_query_route},
      {"GET", "/v1/queries/{name}", Role::reader, false, &N::get_query},
      {"DELETE", "/v1/queries/{name}", Role::admin, false, &N::delete_query_route},
      // A query over its lifetime (query_lifecycle.cpp).
      {"PUT", "/v1/queries/{name}", Role::admin, false, &N::replace_query_route},
      {"POST", "/v1/queries/{name}/stop", Role::admin, false, &N::stop_query_route},
      {"POST", "/v1/queries/{name}/start", Role::admin, false, &N::start_query_route},
      {"PUT", "/v1/queries/{name}/fragments/{fragment}", Role::admin, false, &N::put_fragment_route},
      {"GET", "/v1/queries/{name}/fragments/{fragment}", Role::reader, false, &N::get_fragment_route},
      {"DELETE", "/v1/queries/{name}/fragments/{fragment}", Role::admin, false, &N::delete_fragment_route},
      {"POST", "/v1/queries/{name}/fragments/{fragment}/stop", Role::admin, false, &N::stop_fragment_route},
      {"POST", "/v1/queries/{name}/fragments/{fragment}/start", Role::admin, false, &N::start_fragment_route},
      {"POST", "/v1/queries/{name}/fragments/{fragment}/move", Role::admin, false, &N::move_fragment_route},
      {"POST", "/v1/queries/{name}/fragments/{fragment}/standby", Role::admin, false, &N::standby_route},
      {"GET", "/v1/queries/{name}/fragments/{fragment}/standby", Role::reader, false, &N::standby_route},
      {"DELETE", "/v1/queries/{name}/fragments/{fragment}/standby", Role::admin, false, &N::standby_route},
      {"POST", "/v1/queries/{name}/fragments/{fragment}/split", Role::admin, false, &N::split_fragment_route},
      {"POST", "/v1/queries/{name}/fragments/{fragment}/merge", Role::admin, false, &N::merge_fragment_route},
      {"POST", "/v1/queries/{name}/fragments/{fragment}/state", Role::admin, false, &N::fragment_state_route},
      {"GET", "/v1/checkpoints", Role::reader, false, &N::list_checkpoints},
      {"POST", "/v1/checkpoints", Role::admin, false, &N::take_checkpoints},
      {"POST", "/v1/admin/backup", Role::admin, false, &N::post_backup},
      {"GET", "/v1/peers", Role::reader, false, &N::get_peers},
      {"GET", "/v1/nodes", Role::reader, false, &N::get_nodes},
      {"DELETE", "/v1/nodes/{node}", Role::admin, false, &N::delete_node},
      {"GET", "/v1/imports", Role::reader, false, &N::list_imports},
      {"POST", "/v1/imports", Role::admin, false, &N::create_import_route},
      {"GET", "/v1/imports/{domain}/{name}", Role::reader, false, &N::get_import},
      {"DELETE", "/v1/imports/{domain}/{name}", Role::admin, false, &N::delete_import_route},
      {"GET", "/v1/contracts", Role::reader, false, &N::list_contracts},
      {"POST", "/v1/contracts", Role::admin, false, &N::propose_contract},
      {"GET", "/v1/contracts/{id}", Role::reader, false, &N::get_contract},
      {"POST", "/v1/contracts/{id}/counter", Role::admin, false, &N::counter_contract},
      {"POST", "/v1/contracts/{id}/accept", Role::admin, false, &N::accept_contract},
      {"POST", "/v1/contracts/{id}/reject", Role::admin, false, &N::reject_contract},
      {"POST", "/v1/contracts/{id}/revoke", Role::admin, false, &N::revoke_contract},
      {"GET", "/v1/contracts/{id}/usage", Role::reader, false, &N::get_contract_usage},
  };
  return routes;
}

std::vector<const RouteInfo*> match_routes(std::string_view path, PathParams& params) {
  const auto seg = segments(path);
  std::vector<const RouteInfo*> out;
  for (const auto& r : api_routes()) {
    if (!out.empty()) {
      // Templates never overlap: the others with a match's template are
      // its other methods.
      if (std::string_view(r.path) == out.front()->path) out.push_back(&r);
      continue;
    }
    const auto pat = segments(r.path);
    if (pat.size() != seg.size()) continue;
    PathParams values;
    bool match = true;
    for (size_t i = 0; i < pat.size() && match; ++i) {
      if (pat[i].starts_with('{')) values.push_back(percent_decode(seg[i]));
      else match = pat[i] == seg[i];
    }
    if (!match) continue;
    params = std::move(values);
    out.push_back(&r);
  }
  return out;
}

namespace {

// The "id" (a contract), "name" (a stream, a query) or "stream" (an import) of a creation's
// answer; "-" when it has neither.
std::string created_id(const std::string& body) {
  rapidjson::Document doc;
  doc.Parse(body.data(), body.size());
  if (doc.HasParseError() || !doc.IsObject()) return "-";
  for (const char* key : {"id", "name", "stream"}) {
    auto it = doc.FindMember(key);
    if (it != doc.MemberEnd() && it->value.IsString())
      return std::string(it->value.GetString(), std::min<size_t>(it->value.GetStringLength(), 200));
  }
  return "-";
}

// A refused request, collapsed with its repeats (base/log.h): the client's
// address without its port, so that one client retrying is one line.
void log_refused(const Request& req, const std::string& why) {
  const size_t colon = req.remote.rfind(':');
  base::log_refusal("api", "refused " + req.method.substr(0, 20) + " " + req.path.substr(0, 200) + " from " +
                               req.remote.substr(0, colon) + ": " + why);
}

// Every admin request that may change state (not a GET) is audited: who
// (the token's name), what (method and route), on what (the path's ids, or
// the id or name a creation answered with), and the status.
Respond audited(Respond answer, const std::string& token, const std::string& action, const PathParams& params) {
  std::string object;
  for (const auto& p : params) object += (object.empty() ? "" : "/") + p.substr(0, 200);
  return [answer = std::move(answer), token, action, object](Response r) {
    std::string what = object;
    if (what.empty() && r.status / 100 == 2) what = created_id(r.body);
    base::log_audit(token, action, what, std::to_string(r.status));
    answer(std::move(r));
  };
}

}  // namespace

NodeImpl::AuthResult NodeImpl::authenticate(const Request& req, Role needed) const {
  AuthResult r;
  auto h = req.header("authorization");
  if (!h || h->size() < 7 || !(h->substr(0, 7) == "Bearer " || h->substr(0, 7) == "bearer ")) {
    r.problem = Response::problem(401, "Unauthorized",
                                  h ? "the Authorization header must be 'Bearer <token>'"
                                    : "this resource needs a bearer token (Authorization: Bearer <token>)");
    r.problem.headers.emplace_back("WWW-Authenticate", "Bearer");
    log_refused(req, h ? "the Authorization header is not 'Bearer <token>'" : "no bearer token");
    return r;
  }
  const std::string digest = hash_token(h->substr(7));
  std::vector<TokenEntry> tokens;
  {
    std::lock_guard lock(tokens_mu_);  // a reload may replace them
    tokens = config_.tokens;
  }
  const TokenEntry* found = nullptr;
  for (const auto& t : tokens) {
    // Constant-time comparison of the digests.
    unsigned char diff = t.sha256.size() != digest.size();
    for (size_t i = 0; i < digest.size() && i < t.sha256.size(); ++i)
      diff |= static_cast<unsigned char>(t.sha256[i] ^ digest[i]);
    if (!diff) found = &t;
  }
  if (!found) {
    r.problem = Response::problem(401, "Unauthorized", "the bearer token is not valid for this node");
    r.problem.headers.emplace_back("WWW-Authenticate", "Bearer error=\"invalid_token\"");
    log_refused(req, "the bearer token is not valid for this node");
    return r;
  }
  // admin > publisher > reader: a higher role may do what a lower one may.
  if (static_cast<int>(found->role) < static_cast<int>(needed)) {
    r.problem = Response::problem(403, "Forbidden",
                                  "token '" + found->name + "' has role " + std::string(role_name(found->role)) +
                                      "; this needs role " + std::string(role_name(needed)));
    log_refused(req, "token '" + found->name + "' has role " + std::string(role_name(found->role)));
    return r;
  }
  r.ok = true;
  r.role = found->role;
  r.name = found->name;
  return r;
}

void NodeImpl::handle(Request&& req, Respond respond) {
  const auto t0 = std::chrono::steady_clock::now();
  PathParams params;
  const auto routes = match_routes(routing_path(req), params);
  const std::string route = routes.empty() ? "" : routes.front()->path;
  const std::string method = req.method;
  // Wraps the answer with the request metrics.
  Respond answer = [this, respond = std::move(respond), route, method, t0](Response r) {
    const std::string label = route.empty() ? "unmatched" : route;
    metrics_
        .counter("entente_api_requests_total", "API requests by route, method and status",
                 {{"route", label}, {"method", method}, {"status", std::to_string(r.status)}})
        .inc();
    metrics_
        .histogram("entente_api_request_duration_seconds", "API request latency by route", {{"route", label}},
                   latency_buckets())
        .observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    respond(std::move(r));
  };
  if (routes.empty()) {
    answer(Response::problem(404, "Not Found", "no resource at " + req.path.substr(0, 200)));
    return;
  }
  // Method check, with Allow listing what the route takes.
  std::string allow;
  const RouteInfo* chosen = nullptr;
  bool ws_route = false;
  for (const RouteInfo* ri : routes) {
    if (!allow.empty()) allow += ", ";
    allow += ri->method;
    ws_route |= ri->websocket;
    if (method == ri->method && !ri->websocket) chosen = ri;
  }
  if (!chosen) {
    Response r = ws_route ? Response::problem(426, "Upgrade Required", route + " is a WebSocket endpoint")
                          : Response::problem(405, "Method Not Allowed",
                                              method.substr(0, 20) + " is not allowed on " + route + " (allowed: " +
                                                  allow + ")");
    if (ws_route) r.headers.emplace_back("Upgrade", "websocket");
    else r.headers.emplace_back("Allow", allow);
    answer(std::move(r));
    return;
  }
  if (chosen->role) {
    if (auto p = browser_bearer(req, *chosen)) {
      answer(std::move(*p));
      return;
    }
    auto a = authenticate(req, *chosen->role);
    if (!a.ok) {
      answer(std::move(a.problem));
      return;
    }
    if (chosen->role == Role::admin && method != "GET")
      answer = audited(std::move(answer), a.name, method + " " + route, params);
  }
  // In a domain of several nodes, what concerns a stream another node
  // leads is answered there (docs/cluster.md).
  if (forward_if_elsewhere(req, *chosen, params, answer)) return;
  (this->*chosen->handler)(req, params, answer);
}

bool NodeImpl::json_body(const Request& req, const Respond& answer) const {
  if (req.content_type == "application/json") return true;
  answer(Response::problem(415, "Unsupported Media Type",
                           "the body must be application/json, not '" + req.content_type.substr(0, 100) + "'"));
  return false;
}

// --- /v1/health, /v1/openapi.json, /metrics

void NodeImpl::get_health(const Request&, const PathParams&, const Respond& answer) {
  JsonOut j;
  j.begin_object().key("status").str("ok").key("domain").str(config_.domain).key("node").str(config_.node);
  j.key("version").str(kBuildVersion).key("uptime_s").dbl((wall_clock_ms() - started_ms_) / 1000.0).end_object();
  answer(Response::json(200, j.take()));
}

void NodeImpl::get_openapi(const Request&, const PathParams&, const Respond& answer) {
  answer(Response::json(200, std::string(openapi_json())));
}

void NodeImpl::get_metrics(const Request&, const PathParams&, const Respond& answer) {
  Response r;
  r.status = 200;
  r.content_type = "text/plain; version=0.0.4";
  read_import_states();
  r.body = metrics_.render();
  answer(std::move(r));
}

// --- /v1/streams

void NodeImpl::list_streams_route(const Request& req, const PathParams&, const Respond& answer) {
  if (catalog_) {
    cluster_list_streams(req, answer);
    return;
  }
  const bool internal = list_internal_streams(req);
  JsonOut j;
  j.begin_object().key("streams").begin_array();
  for (auto& s : list_streams()) {
    if (internal || !is_internal_stream(s->meta().name)) j.raw(stream_json(*this, s));
  }
  j.end_array().end_object();
  answer(Response::json(200, j.take()));
}

void NodeImpl::create_stream_route(const Request& req, const PathParams&, const Respond& answer) {
  if (!json_body(req, answer)) return;
  if (catalog_) {
    cluster_create_stream(req, answer);
    return;
  }
  int replication = 0;
  auto spec = parse_stream_spec(req.body, config_, nullptr, &replication);
  if (!spec.ok()) {
    answer(Response::problem(400, "Bad Request", spec.error().message));
    return;
  }
  if (replication > 1) {
    answer(Response::problem(400, "Bad Request", "$.replication: domain " + config_.domain + " is one node, " +
                                                     config_.node + " (no cluster section): one copy only"));
    return;
  }
  if (spec->durability.empty()) spec->durability = default_durability(config_, 1);
  auto s = create_stream(std::move(spec).value());
  if (!s.ok()) {
    answer(problem_for(s.error()));
    return;
  }
  Response r = Response::json(201, stream_json(*this, *s));
  r.headers.emplace_back("Location", "/v1/streams/" + (*s)->meta().name);
  answer(std::move(r));
}

void NodeImpl::get_stream(const Request&, const PathParams& params, const Respond& answer) {
  const std::string& name = params.at(0);
  auto s = find_stream(name);
  if (!s) answer(Response::problem(404, "Not Found", "no stream '" + name.substr(0, 100) + "'"));
  else answer(Response::json(200, stream_json(*this, s)));
}

void NodeImpl::delete_stream_route(const Request&, const PathParams& params, const Respond& answer) {
  Status st = catalog_ ? cluster_delete_stream(params.at(0)) : delete_stream(params.at(0));
  if (!st.ok()) answer(problem_for(st.error()));
  else answer(Response{204, "application/json", "", {}});
}

void NodeImpl::post_tuples(const Request& req, const PathParams& params, const Respond& answer) {
  const std::string& name = params.at(0);
  auto s = find_stream(name);
  if (!s) {
    answer(Response::problem(404, "Not Found", "no stream '" + name.substr(0, 100) + "'"));
    return;
  }
  IngestFormat format;
  if (req.content_type == "application/x-ndjson" || req.content_type == "application/ndjson") {
    format = IngestFormat::ndjson;
  } else if (req.content_type == "application/json") {
    format = IngestFormat::json_array;
  } else {
    answer(Response::problem(415, "Unsupported Media Type",
                             "tuples are application/x-ndjson or application/json (an array), not '" +
                                 req.content_type.substr(0, 100) + "'"));
    return;
  }
  auto producer = producer_of(req);
  if (!producer.ok()) {
    answer(Response::problem(400, "Bad Request", producer.error().message));
    return;
  }
  ingest(*this, s, format, req.body, *producer, [answer, producer = *producer](IngestResult r) {
    if (r.problem) {
      answer(std::move(*r.problem));
      return;
    }
    answer(Response::json(200, ingest_answer_json(r, producer)));
  });
}

// --- /v1/queries

void NodeImpl::list_queries_route(const Request&, const PathParams&, const Respond& answer) {
  const std::string placement = config_.domain + "/" + config_.node;
  JsonOut j;
  j.begin_object().key("queries").begin_array();
  for (auto& q : list_queries()) {
    // A fragment shows under its query (cluster_list_queries).
    if (q->meta().fragment.empty()) j.raw(query_json(q, placement, peering_.get()));
  }
  if (catalog_) {
    std::vector<std::string> others;
    cluster_list_queries(others);
    for (const auto& o : others) j.raw(o);
  }
  j.end_array().end_object();
  answer(Response::json(200, j.take()));
}

std::optional<QueryPlacement> NodeImpl::place_query(const Request& req, const std::string& body,
                                                    const Respond& answer) {
  auto placement = read_placement(body);
  if (!placement.ok()) {
    answer(problem_for(placement.error()));
    return std::nullopt;
  }
  // Where it runs: a network the engine refuses is answered by the
  // deploy, with every problem.
  Diagnostics ignored;
  auto net = engine::QueryNetwork::parse(placement->network_json, ignored);
  if (net.ok()) {
    Diagnostics diag;
    auto leader_of = [this](const std::string& stream) -> std::string {
      if (!catalog_) return config_.node;
      return stream_leader(stream).value_or("");
    };
    if (Status st = check_fragments(*placement, *net, domain_nodes(), config_.node, leader_of, diag); !st.ok()) {
      if (diag.ok()) answer(problem_for(st.error()));
      else
        answer(Response::problem(400, "Bad Request",
                                 st.error().message + ": " + std::to_string(diag.size()) + " problem(s), first: " +
                                     diag.items().front().path + ": " + diag.items().front().message,
                                 diagnostics_members(diag)));
      return std::nullopt;
    }
  }
  if (!catalog_ && !placement->node.empty() && placement->node != config_.node) {
    answer(Response::problem(400, "Bad Request", "$.placement.node: domain " + config_.domain + " is one node, " +
                                                     config_.node + " (no cluster section)"));
    return std::nullopt;
  }
  if (catalog_ && net.ok() && !cluster_place_query(req, *placement, *net, answer)) return std::nullopt;
  return std::move(placement).value();
}

void NodeImpl::deploy_query_route(const Request& req, const PathParams&, const Respond& answer) {
  if (!json_body(req, answer)) return;
  if (rapidjson::Document doc; auto p = read_json(req.body, doc)) {
    // As a validation problem, with its path in `errors`.
    Diagnostics diag;
    diag.error(p->path, p->why);
    answer(Response::problem(400, "Bad Request", p->message(), diagnostics_members(diag)));
    return;
  }
  // "start_from" read, input schemas filled in from the streams.
  auto options = query_body(req, false, answer);
  if (!options) return;
  auto placement = place_query(req, options->network_json, answer);
  if (!placement) return;
  auto deploy = [this, body = placement->network_json, options = std::move(*options), answer]() {
    Diagnostics diag;
    auto q = deploy_query(body, diag, nullptr, &options);
    if (catalog_) {
      Diagnostics names;
      if (auto net = engine::QueryNetwork::parse(body, names); net.ok()) cluster_query_deployed(net->name(), q);
    }
    if (!q.ok()) {
      if (!diag.ok())
        answer(Response::problem(400, "Bad Request",
                                 q.error().message + ": " + std::to_string(diag.size()) +
                                     " problem(s), first: " + diag.items().front().path + ": " +
                                     diag.items().front().message,
                                 diagnostics_members(diag)));
      else
        answer(problem_for(q.error()));
      return;
    }
    Response r = Response::json(201, query_json(*q, config_.domain + "/" + config_.node, peering_.get()));
    r.headers.emplace_back("Location", "/v1/queries/" + (*q)->meta().name);
    answer(std::move(r));
  };
  // Inputs naming another domain's stream that this node does not import
  // yet are imported first; the owner's refusal fails the deploy.
  struct Remote {
    std::string path;
    std::string stream;
    engine::SchemaPtr schema;
  };
  std::vector<Remote> remote;
  if (peering_) {
    Diagnostics ignored;
    auto net = engine::QueryNetwork::parse(placement->network_json, ignored);
    if (net.ok()) {
      for (size_t i = 0; i < net->inputs().size(); ++i) {
        const auto& in = net->inputs()[i];
        if (in.stream.empty() || !peering_->is_remote(in.stream) || find_stream(in.stream)) continue;
        remote.push_back({"$.inputs[" + std::to_string(i) + "].stream", in.stream, in.schema});
      }
    }
  }
  if (remote.empty()) {
    deploy();
    return;
  }
  // A deploy that fails before it starts gives its placement back.
  auto undo_placement = [this, body = placement->network_json](const Error& e) {
    if (!catalog_) return;
    Diagnostics names;
    if (auto net = engine::QueryNetwork::parse(body, names); net.ok()) {
      cluster_query_deployed(net->name(), Result<std::shared_ptr<QueryRunner>>(e));
    }
  };
  auto joined = join_imports(remote.size(), [deploy, answer, undo_placement](const Status& st) {
    if (!st.ok()) {
      undo_placement(st.error());
      answer(problem_for(st.error()));
      return;
    }
    deploy();
  });
  for (const auto& r : remote) {
    peering_->create_import(r.stream, r.schema,
                            [joined, path = r.path](Result<ImportInfo> res) { joined(std::move(res), path); });
  }
}

std::function<void(Result<ImportInfo>, const std::string& what)> join_imports(size_t n,
                                                                              std::function<void(const Status&)> done) {
  struct Join {
    std::mutex mu;
    size_t left;
    bool over = false;
    std::function<void(const Status&)> done;
  };
  auto join = std::make_shared<Join>();
  join->left = n;
  join->done = std::move(done);
  return [join](Result<ImportInfo> res, const std::string& what) {
    const bool ok = res.ok() || res.error().code == Errc::already_exists;
    {
      std::lock_guard lock(join->mu);
      if (join->over) return;
      if (ok && --join->left != 0) return;
      join->over = true;
    }
    if (ok) {
      join->done(Status::Ok());
      return;
    }
    Error e = res.error();
    e.message = what + ": " + e.message;
    join->done(e);
  };
}

void NodeImpl::get_query(const Request& req, const PathParams& params, const Respond& answer) {
  const std::string& name = params.at(0);
  if (auto cut = find_query(name) ? std::nullopt : cut_entry(name, true)) {
    get_cut_query(req, *cut, answer);
    return;
  }
  if (forward_query_if_elsewhere(req, name, answer)) return;
  auto q = find_query(name);
  if (!q) answer(Response::problem(404, "Not Found", "no query '" + name.substr(0, 100) + "'"));
  else answer(Response::json(200, query_json(q, config_.domain + "/" + config_.node, peering_.get())));
}

void NodeImpl::delete_query_route(const Request& req, const PathParams& params, const Respond& answer) {
  if (auto cut = find_query(params.at(0)) ? std::nullopt : cut_entry(params.at(0), true)) {
    delete_cut_query(req, *cut, answer);
    return;
  }
  if (forward_query_if_elsewhere(req, params.at(0), answer)) return;
  Status st = catalog_ ? cluster_delete_query(params.at(0)) : delete_query(params.at(0));
  if (!st.ok()) answer(problem_for(st.error()));
  else answer(Response{204, "application/json", "", {}});
}

// --- /v1/peers, /v1/imports

namespace {

// GET /v1/peers: this node, its refusal counters, every peer node's link
// and tuples, and the latest refused connections.
std::string peers_json(const federation::PeersReport& r) {
  JsonOut j;
  j.begin_object();
  j.key("self").str(r.self);
  j.key("listen").str(r.listen);
  j.key("refusals").begin_object();
  for (const auto& [label, n] : r.refusals) j.key(label).u64(n);
  j.end_object();
  j.key("peers").begin_array();
  for (const auto& peer : r.peers) {
    const federation::PeerStatus& p = peer.link;
    j.begin_object();
    j.key("identity").str(p.identity.uri());
    j.key("domain").str(p.identity.domain);
    j.key("node").str(p.identity.node);
    j.key("state").str(p.state);
    j.key("dialed").boolean(p.dialed);
    j.key("address").str(p.address);
    j.key("rtt_us").i64(p.rtt_us);
    j.key("last_heartbeat_ms").i64(p.last_heartbeat_ms);
    j.key("bytes_in").u64(p.bytes_in);
    j.key("bytes_out").u64(p.bytes_out);
    j.key("frames_in").u64(p.frames_in);
    j.key("frames_out").u64(p.frames_out);
    j.key("tuples_in").u64(peer.tuples_in);
    j.key("tuples_out").u64(peer.tuples_out);
    j.key("connects").u64(p.connects);
    j.key("last_error").str(p.last_error);
    j.key("refusal").str(p.refusal);
    j.end_object();
  }
  j.end_array();
  // Connections this listener refused (or whose client refused this node),
  // by the identity their certificate claimed, or by address.
  j.key("refused").begin_array();
  for (const auto& x : r.refused) {
    j.begin_object();
    j.key("identity").str(x.identity);
    j.key("address").str(x.address);
    j.key("refusal").str(x.refusal);
    j.key("reason").str(x.reason);
    j.key("by").str(x.by_peer ? "peer" : "this_node");
    j.key("count").u64(x.count);
    j.key("last_ms").i64(x.last_ms);
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.take();
}

}  // namespace

void NodeImpl::get_peers(const Request&, const PathParams&, const Respond& answer) {
  if (!peering_) {
    answer(Response::problem(404, "Not Found", "this node has no federation section in its configuration"));
    return;
  }
  answer(Response::json(200, peers_json(peering_->peers_report())));
}

void NodeImpl::list_imports(const Request&, const PathParams&, const Respond& answer) {
  JsonOut j;
  j.begin_object().key("imports").begin_array();
  if (peering_) {
    for (const auto& i : peering_->imports())
      if (!hosted_hidden(i.stream)) write_import(j, i);  // a hosted run's copies are not this node's
  }
  j.end_array().end_object();
  answer(Response::json(200, j.take()));
}

void NodeImpl::create_import_route(const Request& req, const PathParams&, const Respond& answer) {
  if (!json_body(req, answer)) return;
  rapidjson::Document doc;
  if (auto p = read_json(req.body, doc)) {
    answer(Response::problem(400, "Bad Request", p->message()));
    return;
  }
  // {"stream": "NAME", "node": "NODE"}: a stream that node NODE of this
  // domain leads, read over the peer link into "@NODE/NAME"
  // (docs/federation.md, "Reading a stream of another node of the domain").
  const bool internal = doc.IsObject() && doc.HasMember("node");
  if (!doc.IsObject() || !doc.HasMember("stream") || !doc["stream"].IsString() ||
      doc.MemberCount() != (internal ? 2u : 1u) || (internal && !doc["node"].IsString())) {
    answer(Response::problem(400, "Bad Request",
                             "the body must be {\"stream\": \"DOMAIN/NAME\"} or, for a stream of another node "
                             "of this domain, {\"stream\": \"NAME\", \"node\": \"NODE\"}"));
    return;
  }
  if (!peering_) {
    answer(Response::problem(404, "Not Found", "this node has no federation section in its configuration"));
    return;
  }
  const std::string stream(doc["stream"].GetString(), doc["stream"].GetStringLength());
  if (stream.size() > 200) {
    answer(Response::problem(400, "Bad Request", "the stream name is longer than 200 bytes"));
    return;
  }
  const std::string node = internal ? std::string(doc["node"].GetString(), doc["node"].GetStringLength()) : "";
  if (node.size() > 63) {
    answer(Response::problem(400, "Bad Request", "the node name is longer than 63 bytes"));
    return;
  }
  const std::string mirror = internal ? "@" + node + "/" + stream : stream;
  if (find_stream(mirror)) {
    answer(Response::problem(409, "Conflict", "stream " + mirror + " exists on this node already"));
    return;
  }
  auto done = [answer](Result<ImportInfo> r) {
    if (!r.ok()) {
      answer(problem_for(r.error()));
      return;
    }
    Response resp = Response::json(201, import_json(*r));
    resp.headers.emplace_back("Location", "/v1/imports/" + r->stream);
    answer(std::move(resp));
  };
  if (internal) peering_->create_internal_import(stream, node, nullptr, std::move(done));
  else peering_->create_import(stream, nullptr, std::move(done));
}

void NodeImpl::get_import(const Request&, const PathParams& params, const Respond& answer) {
  const std::string name = params.at(0) + "/" + params.at(1);
  auto i = peering_ && !hosted_hidden(name) ? peering_->import_info(name) : std::nullopt;
  if (!i) answer(Response::problem(404, "Not Found", "no import of " + name.substr(0, 200)));
  else answer(Response::json(200, import_json(*i)));
}

void NodeImpl::delete_import_route(const Request&, const PathParams& params, const Respond& answer) {
  Status st = delete_import(params.at(0) + "/" + params.at(1));
  if (!st.ok()) answer(problem_for(st.error()));
  else answer(Response{204, "application/json", "", {}});
}

// --- /v1/checkpoints, /v1/admin/backup

void NodeImpl::list_checkpoints(const Request&, const PathParams&, const Respond& answer) {
  auto list = store::Checkpoints::list(*store_);
  if (!list.ok()) {
    answer(problem_for(list.error()));
    return;
  }
  JsonOut j;
  j.begin_object().key("checkpoints").begin_array();
  for (auto& c : *list) {
    std::string q = c.owner.rfind("query/", 0) == 0 ? c.owner.substr(6) : c.owner;
    j.begin_object().key("query").str(q).key("id").u64(c.id).key("bytes").u64(c.bytes).end_object();
  }
  // The runners that keep theirs in a state stream (fragments, and whole
  // queries of a domain of several nodes): their latest that counts.
  for (const auto& q : list_queries()) {
    const QueryMeta& m = q->meta();
    if (m.state_stream.empty()) continue;
    auto info = q->info();
    if (!info.checkpoint) continue;
    j.begin_object().key("query").str(m.name).key("id").u64(info.checkpoint->id);
    j.key("bytes").u64(info.checkpoint->bytes).key("state_stream").str(m.state_stream).end_object();
  }
  j.end_array().end_object();
  answer(Response::json(200, j.take()));
}

void NodeImpl::take_checkpoints(const Request&, const PathParams&, const Respond& answer) {
  checkpoint_all([answer](std::vector<Result<CheckpointInfo>> results) {
    JsonOut j;
    j.begin_object().key("checkpoints").begin_array();
    std::string failures;
    for (auto& r : results) {
      if (r.ok()) write_checkpoint(j, *r);
      else failures += (failures.empty() ? "" : "; ") + r.error().message;
    }
    j.end_array().end_object();
    if (!failures.empty()) answer(Response::problem(500, "Checkpoint Failed", failures));
    else answer(Response::json(200, j.take()));
  });
}

void NodeImpl::post_backup(const Request& req, const PathParams&, const Respond& answer) {
  if (!json_body(req, answer)) return;
  rapidjson::Document doc;
  doc.Parse(req.body.data(), req.body.size());
  if (doc.HasParseError() || !doc.IsObject() || doc.MemberCount() != 1 || !doc.HasMember("dir") ||
      !doc["dir"].IsString()) {
    answer(Response::problem(400, "Bad Request",
                             "the body must be {\"dir\": \"/absolute/path/of/a/new/directory\"}"));
    return;
  }
  const std::string dir(doc["dir"].GetString(), doc["dir"].GetStringLength());
  if (dir.size() > 4096 || dir.find('\0') != std::string::npos) {
    answer(Response::problem(400, "Bad Request", "$.dir is not a path (longer than 4096 bytes, or a NUL)"));
    return;
  }
  backup(dir, [answer](Result<BackupResult> r) {
    if (!r.ok()) {
      // A directory that cannot be made is the request's fault, not the node's.
      answer(r.error().code == Errc::not_found ? Response::problem(400, "Bad Request", r.error().message)
                                               : problem_for(r.error()));
      return;
    }
    JsonOut j;
    j.begin_object().key("dir").str(r->dir).key("store").str(r->store.path);
    j.key("rocksdb_sequence").u64(r->store.sequence).key("bytes").u64(r->store.bytes);
    j.key("created_at").str(rfc3339(r->created_ms)).end_object();
    answer(Response::json(201, j.take()));
  });
}

}  // namespace entente::broker::detail
