// The domain's streams in a cluster (docs/cluster.md, "Streams in a domain
// of several nodes"): each stream has one leader node, where it is appended
// and its log kept; the domain's catalog in etcd says which. Any node
// answers for any stream: it forwards what belongs to the leader.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "broker/detail/ingest.h"
#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "http/upstream.h"
#include "cluster/catalog.h"
#include "cluster/membership.h"
#include "engine/codec.h"
#include "federation/peering.h"
#include "rapidjson/document.h"

namespace entente::broker::detail {
namespace {

// The header a forwarded request carries: the nodes it passed, in order.
// A request is forwarded at most kMaxHops times, so two nodes whose views
// of the catalog disagree cannot bounce it forever.
constexpr const char* kForwardedHeader = "entente-forwarded-by";
constexpr size_t kMaxHops = 2;

size_t hops_of(const http::Request& req) {
  auto h = req.header(kForwardedHeader);
  if (!h || h->empty()) return 0;
  return static_cast<size_t>(std::count(h->begin(), h->end(), ',')) + 1;
}

std::string stream_key_of(std::string_view name) { return "streams/" + std::string(name); }

}  // namespace

Result<StreamEntry> stream_entry_from_json(std::string_view json) {
  rapidjson::Document d;
  d.Parse(json.data(), json.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("node") || !d["node"].IsString() ||
      !d.HasMember("meta") || !d["meta"].IsObject()) {
    return make_error(Errc::corrupt, "a stream's catalog entry is not {\"node\", \"meta\"}");
  }
  StreamEntry e;
  e.node = d["node"].GetString();
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  d["meta"].Accept(w);
  ENTENTE_ASSIGN_OR_RETURN(e.meta, stream_meta_from_json({sb.GetString(), sb.GetSize()}));
  for (const char* key : {"replicas", "in_sync"}) {
    auto& out = std::string_view(key) == "replicas" ? e.replicas : e.in_sync;
    if (d.HasMember(key) && d[key].IsArray()) {
      for (const auto& r : d[key].GetArray())
        if (r.IsString() && out.size() < 3) out.emplace_back(r.GetString(), r.GetStringLength());
    }
  }
  if (d.HasMember("epoch") && d["epoch"].IsUint64()) e.epoch = d["epoch"].GetUint64();
  if (d.HasMember("lease") && d["lease"].IsInt64()) e.lease = d["lease"].GetInt64();
  return e;
}

namespace {

// A stream led by another node, as listed here: what the catalog says,
// without the positions only its leader knows (GET /v1/streams/{name},
// forwarded there, has them).
std::string remote_stream_json(const StreamEntry& e) {
  JsonOut j;
  j.begin_object().key("name").str(e.meta.name);
  j.key("schema").raw(engine::schema_to_json(*e.meta.schema));
  j.key("event_time");
  if (e.meta.event_time.empty()) j.null();
  else j.str(e.meta.event_time);
  j.key("producer").str(e.meta.producer).key("node").str(e.node).end_object();
  return j.take();
}

http::Response catalog_unavailable(const std::string& why, std::string_view what) {
  http::Response r = http::Response::problem(
      503, "Service Unavailable",
      std::string(what) + " waits for the domain's catalog in etcd, which this node cannot reach now (" + why +
          "); tuples keep flowing meanwhile");
  r.headers.emplace_back("Retry-After", "1");
  return r;
}

}  // namespace

std::string stream_catalog_entry(const StreamEntry& e) {
  JsonOut j;
  j.begin_object().key("node").str(e.node).key("meta").raw(stream_meta_to_json(e.meta));
  if (!e.replicas.empty()) {
    j.key("replicas").begin_array();
    for (const auto& r : e.replicas) j.str(r);
    j.end_array().key("in_sync").begin_array();
    for (const auto& r : e.in_sync) j.str(r);
    j.end_array().key("epoch").u64(e.epoch).key("lease").i64(e.lease);
  }
  j.end_object();
  return j.take();
}

std::string stream_catalog_entry(const StreamMeta& meta, const std::string& node,
                                 const std::vector<std::string>& replicas) {
  StreamEntry e;
  e.node = node;
  e.meta = meta;
  e.replicas = replicas;
  return stream_catalog_entry(e);
}

Status NodeImpl::catalog_not_read(const std::string& stream) const {
  if (!catalog_ || catalog_->revision() != 0 || stream_leader(stream) || find_stream(stream)) return {};
  return make_error(Errc::unavailable, "finding stream '" + stream.substr(0, 100) +
                                           "' waits for the domain's catalog in etcd, which this node has not "
                                           "read yet (" + catalog_->problem() + ")");
}

std::optional<std::string> NodeImpl::etcd_problem() const {
  if (!catalog_->synced()) return catalog_->problem();
  // A paused or partitioned etcd leaves the watch silent rather than
  // broken: the membership's ticks notice first.
  if (auto v = membership_->view(); v.etcd_error) return *v.etcd_error;
  return std::nullopt;
}

std::string NodeImpl::least_loaded_node(const cluster::MembershipView& view) const {
  // By the catalog, which is current to the last write the controller's
  // watch saw (the members' load reports lag a tick): the up node that
  // leads the fewest streams and runs the fewest queries; then the one
  // using the least CPU; then by name.
  std::map<std::string, size_t> weight;
  for (const auto& m : view.members) {
    if (m.up) weight[m.record.node] = 0;
  }
  for (const auto& e : catalog_->list("streams/")) {
    if (auto parsed = stream_entry_from_json(e.value); parsed.ok() && weight.count(parsed->node)) {
      weight[parsed->node]++;
    }
  }
  for (const auto& e : catalog_->list("queries/")) {
    rapidjson::Document d;
    d.Parse(e.value.data(), e.value.size());
    if (d.IsObject() && d.HasMember("node") && d["node"].IsString() && weight.count(d["node"].GetString())) {
      weight[d["node"].GetString()]++;
    }
    // A query cut across nodes weighs one per fragment on each node.
    if (auto cut = cut_entry(e.key.substr(std::string("queries/").size()))) {
      for (const auto& f : cut->fragments)
        if (weight.count(f.second)) weight[f.second]++;
    }
  }
  std::string best;
  double best_cpu = 0;
  for (const auto& m : view.members) {
    if (!m.up) continue;
    const double cpu = m.load ? m.load->cpu : 0;
    const std::string& n = m.record.node;
    if (best.empty() || weight[n] < weight[best] || (weight[n] == weight[best] && cpu < best_cpu)) {
      best = n;
      best_cpu = cpu;
    }
  }
  return best.empty() ? config_.node : best;
}

engine::SchemaPtr NodeImpl::domain_stream_schema(const std::string& name) const {
  if (auto s = find_stream(name)) return s->meta().schema;
  if (!catalog_) return nullptr;
  auto e = catalog_->get(stream_key_of(name));
  if (!e) return nullptr;
  auto parsed = stream_entry_from_json(e->value);
  return parsed.ok() ? parsed->meta.schema : nullptr;
}

std::vector<std::string> NodeImpl::list_streams_led_by(const std::string& node) const {
  std::vector<std::string> out;
  if (!catalog_) return out;
  for (const auto& e : catalog_->list("streams/")) {
    if (auto parsed = stream_entry_from_json(e.value); parsed.ok() && parsed->node == node) {
      out.push_back("stream " + parsed->meta.name);
    }
  }
  for (const auto& e : catalog_->list("queries/")) {
    rapidjson::Document d;
    d.Parse(e.value.data(), e.value.size());
    const std::string name = e.key.substr(std::string("queries/").size());
    if (d.IsObject() && d.HasMember("node") && d["node"].IsString() && d["node"].GetString() == node) {
      out.push_back("query " + name);
    }
    if (auto cut = cut_entry(name)) {
      for (const auto& f : cut->fragments)
        if (f.second == node) out.push_back("fragment " + name + "/" + f.first);
    }
  }
  return out;
}

std::optional<std::string> NodeImpl::stream_leader(const std::string& stream) const {
  if (!catalog_) return std::nullopt;
  auto e = catalog_->get(stream_key_of(stream));
  if (!e) return std::nullopt;
  auto parsed = stream_entry_from_json(e->value);
  if (!parsed.ok()) return std::nullopt;
  return parsed->node;
}

bool NodeImpl::forward_if_elsewhere(const http::Request& req, const RouteInfo& route, const PathParams& params,
                                    const http::Respond& answer) {
  if (!catalog_ || params.empty()) return false;
  const std::string_view path = route.path;
  if (!path.starts_with("/v1/streams/{name}")) return false;
  auto leader = stream_leader(params[0]);
  if (req.method == "DELETE" && path == "/v1/streams/{name}" &&
      (!leader || *leader == config_.node || !membership_ || !member_up(membership_->view(), *leader))) {
    // Left by a replacement whose node did not live to finish it
    // (cluster_replace.cpp): no run writes it. Dropped by its leader, or
    // by any node while its leader is down.
    if (auto query = replacement_leftover(params[0]); query && readers_of(params[0]).empty()) {
      drop_streams_of_query(*query, {params[0]});
      answer(http::Response{204, "application/json", "", {}});
      return true;
    }
  }
  if (!leader && !find_stream(params[0]) && catalog_->revision() == 0) {
    // Not read the domain's catalog yet (just started, or etcd is down
    // since): "no such stream" would be a guess.
    answer(catalog_unavailable(catalog_->problem(), "finding stream '" + params[0].substr(0, 100) + "'"));
    return true;
  }
  if (leader && *leader == config_.node && !find_stream(params[0]) && !replica_of(params[0]).empty()) {
    // Named leader by a failover a moment ago: its copy becomes the stream
    // (reconcile_leadership) within milliseconds.
    http::Response r = http::Response::problem(503, "Service Unavailable",
                                               config_.node + " is taking stream '" + params[0].substr(0, 100) +
                                                   "' over from its copy; retry");
    r.headers.emplace_back("Retry-After", "1");
    answer(std::move(r));
    return true;
  }
  if (!leader || *leader == config_.node) return false;
  if (hops_of(req) >= kMaxHops) {
    answer(http::Response::problem(508, "Loop Detected",
                                   "stream '" + params[0] + "' is led by " + *leader +
                                       " in this node's catalog, but the request was forwarded here by " +
                                       std::string(*req.header(kForwardedHeader)) + "; the nodes' catalogs "
                                       "disagree for now (retry)"));
    return true;
  }
  forward(req, *leader, answer);
  return true;
}

std::optional<http::Response> NodeImpl::choose_followers(int replication, const cluster::MembershipView& view,
                                                         std::vector<std::string>& followers) const {
  // As many other nodes as asked (by default one when the domain has two
  // or more nodes and peer links), those holding the fewest streams and
  // copies first.
  size_t members = 0, up = 0;
  std::map<std::string, size_t> weight;
  for (const auto& m : view.members) {
    ++members;
    if (!m.up) continue;
    ++up;
    if (m.record.node != config_.node) weight[m.record.node] = 0;
  }
  if (replication == 0) replication = peering_ && up >= 2 ? 2 : 1;
  if (replication > 1 && !peering_) {
    return http::Response::problem(400, "Bad Request", "$.replication: copies travel over the peer links, and "
                                                       "this node has no federation section");
  }
  if (static_cast<size_t>(replication) > members) {
    return http::Response::problem(400, "Bad Request", "$.replication: " + std::to_string(replication) +
                                                           " copies need as many nodes; domain " + config_.domain +
                                                           " has " + std::to_string(members));
  }
  if (static_cast<size_t>(replication) > up) {
    http::Response r = http::Response::problem(503, "Service Unavailable",
                                               "$.replication: " + std::to_string(replication) + " copies need as "
                                               "many nodes up; " + std::to_string(up) + " are");
    r.headers.emplace_back("Retry-After", "1");
    return r;
  }
  for (const auto& e : catalog_->list("streams/")) {
    auto parsed = stream_entry_from_json(e.value);
    if (!parsed.ok()) continue;
    if (weight.count(parsed->node)) weight[parsed->node]++;
    for (const auto& r : parsed->replicas)
      if (weight.count(r)) weight[r]++;
  }
  std::vector<std::pair<size_t, std::string>> order;
  for (const auto& [n, w] : weight) order.emplace_back(w, n);
  std::sort(order.begin(), order.end());
  for (size_t i = 0; i + 1 < static_cast<size_t>(replication) && i < order.size(); ++i)
    followers.push_back(order[i].second);
  return std::nullopt;
}

void NodeImpl::cluster_create_stream(const http::Request& req, const http::Respond& answer) {
  std::string node;
  int replication = 0;
  auto spec = parse_stream_spec(req.body, config_, &node, &replication);
  if (!spec.ok()) {
    answer(http::Response::problem(400, "Bad Request", spec.error().message));
    return;
  }
  StreamMeta meta = std::move(spec).value();
  if (auto why = etcd_problem()) {
    answer(catalog_unavailable(*why, "creating a stream"));
    return;
  }
  if (auto leader = stream_leader(meta.name)) {
    answer(http::Response::problem(409, "Conflict", "stream '" + meta.name + "' exists in domain " +
                                                        config_.domain + " (led by " + *leader + ")"));
    return;
  }
  const cluster::MembershipView view = membership_->view();
  if (!node.empty()) {
    auto it = std::find_if(view.members.begin(), view.members.end(),
                           [&](const cluster::Member& m) { return m.record.node == node; });
    if (it == view.members.end()) {
      std::string known;
      for (const auto& m : view.members) known += (known.empty() ? "" : ", ") + m.record.node;
      answer(http::Response::problem(400, "Bad Request", "$.node: " + node.substr(0, 63) +
                                                             " is not a node of domain " + config_.domain +
                                                             " (its nodes: " + known + ")"));
      return;
    }
    if (!it->up) {
      http::Response r = http::Response::problem(503, "Service Unavailable",
                                                 "$.node: " + node + " is down; a stream it is to lead "
                                                 "cannot be created until it is back");
      r.headers.emplace_back("Retry-After", "1");
      answer(std::move(r));
      return;
    }
  } else if (view.is_controller) {
    node = least_loaded_node(view);
  } else if (view.controller.empty()) {
    http::Response r = http::Response::problem(503, "Service Unavailable",
                                               "domain " + config_.domain + " has no controller at the moment to "
                                               "place the stream (give \"node\" to place it yourself)");
    r.headers.emplace_back("Retry-After", "1");
    answer(std::move(r));
    return;
  } else {
    // The controller decides where.
    if (hops_of(req) >= kMaxHops) {
      answer(http::Response::problem(508, "Loop Detected", "the request to create stream '" + meta.name +
                                                               "' was forwarded too many times"));
      return;
    }
    forward(req, view.controller, answer);
    return;
  }
  if (node != config_.node) {
    // Forwarded with the placement written in, so the leader creates it.
    rapidjson::Document d;
    d.Parse(req.body.data(), req.body.size());
    d.RemoveMember("node");
    d.AddMember("node", rapidjson::Value(node.c_str(), d.GetAllocator()), d.GetAllocator());
    rapidjson::StringBuffer sb;
    rapidjson::Writer<rapidjson::StringBuffer> w(sb);
    d.Accept(w);
    forward(req, node, answer, std::string(sb.GetString(), sb.GetSize()));
    return;
  }
  std::vector<std::string> followers;
  if (auto problem = choose_followers(replication, view, followers)) {
    answer(std::move(*problem));
    return;
  }
  // This node leads it: the catalog entry first (the domain's one truth:
  // two nodes creating the same name cannot both win), then the stream.
  if (meta.durability.empty()) meta.durability = default_durability(config_, 1 + followers.size());
  StreamEntry entry;
  entry.node = config_.node;
  entry.meta = meta;
  entry.replicas = followers;
  // In the in-sync set from the start: they hold the whole (empty) log, so
  // the first appends already wait for them.
  entry.in_sync = followers;
  entry.lease = membership_->lease_id();
  auto rev = catalog_->create(stream_key_of(meta.name), stream_catalog_entry(entry));
  if (!rev.ok()) {
    if (rev.error().code == Errc::unavailable) answer(catalog_unavailable(rev.error().message, "creating a stream"));
    else answer(problem_for(rev.error()));
    return;
  }
  auto s = create_stream(std::move(meta));
  if (!s.ok()) {
    (void)catalog_->erase(stream_key_of(spec->name), *rev);
    answer(problem_for(s.error()));
    return;
  }
  catalog_->wait_for(*rev, config_.cluster.etcd_timeout_ms);
  http::Response r = http::Response::json(201, stream_json(*this, *s));
  r.headers.emplace_back("Location", "/v1/streams/" + (*s)->meta().name);
  answer(std::move(r));
}

void NodeImpl::cluster_list_streams(const http::Request& req, const http::Respond& answer) {
  const bool internal = list_internal_streams(req);
  JsonOut j;
  j.begin_object().key("streams").begin_array();
  std::set<std::string> listed;
  for (auto& s : list_streams()) {
    if (!internal && (is_internal_stream(s->meta().name) || is_replica(s->meta().name))) continue;
    j.raw(stream_json(*this, s));
    listed.insert(s->meta().name);
  }
  for (const auto& e : catalog_->list("streams/")) {
    auto parsed = stream_entry_from_json(e.value);
    if (!parsed.ok() || listed.count(parsed->meta.name) || parsed->node == config_.node) continue;
    if (!internal && is_internal_stream(parsed->meta.name)) continue;
    j.raw(remote_stream_json(*parsed));
  }
  j.end_array();
  if (!catalog_->synced()) {
    j.key("catalog").begin_object().key("current").boolean(false).key("problem").str(catalog_->problem());
    j.end_object();
  }
  j.end_object();
  answer(http::Response::json(200, j.take()));
}

Status NodeImpl::cluster_delete_stream(const std::string& name) {
  // The local checks first (a stream read by a query, or a query's output,
  // is not deleted), then the catalog entry, then the log.
  StreamPtr s = find_stream(name);
  // What delete_stream refuses, it refuses with its own message.
  if (!s || s->meta().producer != "api" || !readers_of(name).empty()) return delete_stream(name);
  auto e = catalog_->get(stream_key_of(name));
  if (e) {
    if (auto why = etcd_problem()) {
      return make_error(Errc::unavailable, "deleting a stream waits for the domain's catalog in etcd: " + *why);
    }
    auto rev = catalog_->erase(stream_key_of(name), e->mod_revision);
    if (!rev.ok() && rev.error().code != Errc::not_found) return rev.error();
  }
  return delete_stream(name);
}

void NodeImpl::reconcile_streams() {
  if (!catalog_ || !catalog_->synced()) return;
  // Queries placed here that are not here, once deployed (an entry with
  // outputs): deleted while etcd could not be told.
  for (const auto& e : catalog_->list("queries/")) {
    rapidjson::Document d;
    d.Parse(e.value.data(), e.value.size());
    if (d.HasParseError() || !d.IsObject() || !d.HasMember("node") || !d["node"].IsString() ||
        d["node"].GetString() != config_.node) {
      continue;
    }
    const std::string name = e.key.substr(std::string("queries/").size());
    {
      // Being deployed right now: its entry is not stale.
      std::lock_guard lock(deploying_mu_);
      if (deploying_.count(name)) continue;
    }
    // Also an entry whose write timed out but was applied later, the
    // deploy having answered 503 meanwhile.
    if (!find_query(name)) (void)catalog_->erase(e.key, e.mod_revision);
  }
  // Cut entries whose creation etcd did not confirm in time (the deploy
  // answered 503), applied later: nothing of them was deployed.
  std::vector<std::pair<std::string, std::string>> unsure;
  {
    std::lock_guard lock(deploying_mu_);
    const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    for (auto it = unsure_cut_entries_.begin(); it != unsure_cut_entries_.end();) {
      if (now - it->second.since_ms > kUnsureCutEntryMs) {
        it = unsure_cut_entries_.erase(it);
        continue;
      }
      if (!deploying_.count(it->first)) unsure.emplace_back(it->first, it->second.json);
      ++it;
    }
  }
  for (const auto& [name, json] : unsure) {
    auto e = catalog_->get("queries/" + name);
    if (!e || e->value != json) continue;
    // Held across the erase: a deploy of the same name again, which would
    // write the same entry, waits for it.
    std::lock_guard lock(deploying_mu_);
    if (deploying_.count(name) || !unsure_cut_entries_.count(name)) continue;
    if (catalog_->erase(e->key, e->mod_revision).ok()) {
      base::logf(LogLevel::info, "cluster", "query '%s': its catalog entry, written after its deploy answered 503, is "
                           "removed (nothing of it was deployed)\n", name.c_str());
      unsure_cut_entries_.erase(name);
    }
  }
  for (const auto& s : list_streams()) {
    const StreamMeta& m = s->meta();
    if (m.producer == "import") continue;
    {
      // A fragment's, being deployed: its entry comes with its followers.
      std::lock_guard lock(takeover_mu_);
      if (registering_.count(m.name)) continue;
    }
    if (catalog_->get(stream_key_of(m.name))) continue;
    auto rev = catalog_->create(stream_key_of(m.name), stream_catalog_entry(m, config_.node));
    if (!rev.ok() && rev.error().code == Errc::already_exists) {
      base::logf(LogLevel::warn, "cluster",
                   "stream '%s' of this node is led by another node in the domain's catalog; this "
                   "node's copy is not reachable through the others until one of the two is deleted\n",
                   m.name.c_str());
    }
  }
  for (const auto& e : catalog_->list("streams/")) {
    auto parsed = stream_entry_from_json(e.value);
    if (!parsed.ok() || parsed->node != config_.node || find_stream(parsed->meta.name)) continue;
    // Led here since a failover, its copy not adopted yet
    // (reconcile_leadership): not an entry left behind. (Erasing it would
    // have it created again without its followers.)
    if (parsed->epoch > 1 || !replica_of(parsed->meta.name).empty()) continue;
    if (parsed->meta.producer != "api") {
      // The output of a query deleted here while etcd could not be told.
      (void)catalog_->erase(e.key, e.mod_revision);
      continue;
    }
    // In the catalog as led here, but not here: this node stopped between
    // the two writes of its creation.
    auto s = create_stream(parsed->meta);
    if (s.ok()) base::logf(LogLevel::info, "cluster", "stream '%s' created from the domain's catalog\n", parsed->meta.name.c_str());
  }
}

Result<http::UpstreamTarget> NodeImpl::target_of(const std::string& node) const {
  const cluster::MembershipView view = membership_->view();
  auto it = std::find_if(view.members.begin(), view.members.end(),
                         [&](const cluster::Member& m) { return m.record.node == node; });
  if (it == view.members.end()) {
    return make_error(Errc::unavailable, "node " + node + " of domain " + config_.domain +
                                             " is not in this node's view of the domain yet");
  }
  const std::string& url = it->record.api_url;
  http::UpstreamTarget t;
  t.tls = url.starts_with("https://");
  const std::string hostport = url.substr(t.tls ? 8 : 7);
  const size_t colon = hostport.rfind(':');
  if (colon == std::string::npos) return make_error(Errc::corrupt, "node " + node + "'s API address is " + url);
  t.host = hostport.substr(0, colon);
  if (t.host.size() > 2 && t.host.front() == '[') t.host = t.host.substr(1, t.host.size() - 2);
  t.port = static_cast<uint16_t>(std::strtoul(hostport.c_str() + colon + 1, nullptr, 10));
  t.ca_file = config_.cluster.api_ca_file;
  return t;
}

http::ForwardOptions NodeImpl::forward_options(const http::Request& req) const {
  http::ForwardOptions o;
  o.pass_headers = {"entente-producer-id", "entente-producer-seq"};
  auto prior = req.header(kForwardedHeader);
  o.extra_headers.emplace_back(kForwardedHeader,
                               prior && !prior->empty() ? std::string(*prior) + "," + config_.node : config_.node);
  return o;
}

void NodeImpl::forward(const http::Request& req, const std::string& node, const http::Respond& answer,
                       std::optional<std::string> body, int64_t timeout_ms) {
  metrics_
      .counter("entente_cluster_forwarded_total",
               "Requests and WebSocket sessions this node forwarded to another node of the domain",
               {{"node", node}, {"kind", "http"}})
      .inc();
  auto target = target_of(node);
  if (!target.ok()) {
    answer(problem_for(target.error()));
    return;
  }
  target->request_timeout_ms = timeout_ms;
  if (!body) {
    http::forward_request(*upstream_, *target, req, answer, forward_options(req));
    return;
  }
  http::Request copy = req;
  copy.body = std::move(*body);
  http::forward_request(*upstream_, *target, copy, answer, forward_options(req));
}

std::shared_ptr<http::WebSocketSession> NodeImpl::forward_websocket(const http::Request& req,
                                                                    const std::string& node,
                                                                    http::Response& reject) {
  if (hops_of(req) >= kMaxHops) {
    reject = http::Response::problem(508, "Loop Detected", "the WebSocket was forwarded too many times; the "
                                                           "nodes' catalogs disagree for now (retry)");
    return nullptr;
  }
  metrics_
      .counter("entente_cluster_forwarded_total",
               "Requests and WebSocket sessions this node forwarded to another node of the domain",
               {{"node", node}, {"kind", "websocket"}})
      .inc();
  auto target = target_of(node);
  if (!target.ok()) {
    reject = problem_for(target.error());
    return nullptr;
  }
  return http::make_websocket_proxy(*upstream_, *target, req, forward_options(req));
}

}  // namespace entente::broker::detail

namespace entente::broker::detail {

// ------------------------------------------------- replicated stream logs

std::optional<std::vector<ReplicaState>> NodeImpl::replica_states(const std::string& stream) const {
  if (!catalog_) return std::nullopt;
  auto e = catalog_->get(stream_key_of(stream));
  if (!e) return std::nullopt;
  auto parsed = stream_entry_from_json(e->value);
  if (!parsed.ok() || parsed->node != config_.node) return std::nullopt;
  StreamPtr s = find_stream(stream);
  const uint64_t head = s ? s->committed_next() - 1 : 0;
  std::vector<federation::Exports::InternalReader> readers;
  if (peering_) readers = peering_->internal_readers(stream);
  std::vector<ReplicaState> out;
  for (const auto& node : parsed->replicas) {
    ReplicaState r{node, 0, 0, false, false, false};
    for (const auto& reader : readers) {
      if (reader.node != node) continue;
      r.acked = reader.acked;
      r.connected = reader.connected;
      r.opened = true;
    }
    r.lag_tuples = head > r.acked ? head - r.acked : 0;
    r.in_sync = std::find(parsed->in_sync.begin(), parsed->in_sync.end(), node) != parsed->in_sync.end();
    out.push_back(std::move(r));
  }
  return out;
}

std::optional<std::string> NodeImpl::replication_json(const std::string& stream) const {
  auto states = replica_states(stream);
  if (!states) return std::nullopt;
  uint64_t epoch = 1;
  if (auto e = catalog_->get(stream_key_of(stream)))
    if (auto parsed = stream_entry_from_json(e->value); parsed.ok()) epoch = parsed->epoch;
  JsonOut j;
  j.begin_object().key("factor").u64(1 + states->size()).key("epoch").u64(epoch).key("replicas").begin_array();
  for (const auto& r : *states) {
    j.begin_object().key("node").str(r.node).key("acked").u64(r.acked).key("lag_tuples").u64(r.lag_tuples);
    j.key("connected").boolean(r.connected).key("in_sync").boolean(r.in_sync).end_object();
  }
  j.end_array().end_object();
  return j.take();
}

Result<bool> NodeImpl::update_in_sync(const std::string& stream, const std::set<std::string>& leave, bool join) {
  auto e = catalog_->get(stream_key_of(stream));
  if (!e) return false;
  auto parsed = stream_entry_from_json(e->value);
  if (!parsed.ok() || parsed->node != config_.node || parsed->replicas.empty()) return false;
  StreamPtr s = find_stream(stream);
  const uint64_t head = s ? s->committed_next() - 1 : 0;
  std::vector<federation::Exports::InternalReader> readers;
  if (peering_) readers = peering_->internal_readers(stream);
  std::vector<std::string> next;
  std::vector<std::string> left, joined;
  for (const auto& node : parsed->replicas) {
    bool connected = false, opened = false;
    uint64_t acked = 0;
    for (const auto& r : readers) {
      if (r.node != node) continue;
      connected = r.connected;
      acked = r.acked;
      opened = true;
    }
    const bool member = std::find(parsed->in_sync.begin(), parsed->in_sync.end(), node) != parsed->in_sync.end();
    // One that never opened its copy (a new stream) leaves only once an
    // append waited the bound for it.
    if (member && ((opened && !connected) || leave.count(node))) {
      left.push_back(node);
    } else if (member) {
      next.push_back(node);
    } else if (join && connected && acked >= head) {
      // Holds the whole log: appends from now on wait for it too.
      next.push_back(node);
      joined.push_back(node);
    }
  }
  if (left.empty() && joined.empty()) return false;
  // A joining follower bounds what readers see before etcd counts it in.
  if (!joined.empty()) bound_visible_to(stream, next);
  StreamEntry updated = *parsed;
  updated.in_sync = next;
  const std::string json = stream_catalog_entry(updated);
  ENTENTE_ASSIGN_OR_RETURN(int64_t rev, catalog_->update(stream_key_of(stream), json, e->mod_revision));
  catalog_->wait_for(rev, config_.cluster.etcd_timeout_ms);
  for (const auto& n : left) {
    base::logf(LogLevel::warn, "cluster", "follower %s of stream '%s' leaves the in-sync set (%s)\n", n.c_str(),
                 stream.c_str(), leave.count(n) ? "an append waited for it too long" : "its channel is closed");
    metrics_
        .counter("entente_stream_replica_left_in_sync_total",
                 "Times a follower left a stream's in-sync set (too slow, or its channel closed)",
                 {{"stream", stream}, {"node", n}})
        .inc();
  }
  for (const auto& n : joined)
    base::logf(LogLevel::info, "cluster", "follower %s of stream '%s' joins the in-sync set\n", n.c_str(), stream.c_str());
  return true;
}

std::vector<std::string> NodeImpl::streams_with_followers() const {
  std::vector<std::string> out;
  if (!catalog_) return out;
  for (const auto& e : catalog_->list("streams/")) {
    auto parsed = stream_entry_from_json(e.value);
    if (parsed.ok() && parsed->node == config_.node && !parsed->replicas.empty()) out.push_back(parsed->meta.name);
  }
  return out;
}

std::string NodeImpl::replica_of(const std::string& stream) const {
  std::lock_guard lock(replicas_mu_);
  for (const auto& m : replicas_) {
    const size_t slash = m.find('/');
    if (slash != std::string::npos && m.compare(slash + 1, std::string::npos, stream) == 0) return m;
  }
  return {};
}

bool NodeImpl::is_replica(const std::string& name) const {
  std::lock_guard lock(replicas_mu_);
  return replicas_.count(name) != 0;
}

void NodeImpl::reconcile_replicas() {
  if (!catalog_ || !catalog_->synced() || !peering_) return;
  std::set<std::string> wanted;
  for (const auto& e : catalog_->list("streams/")) {
    auto parsed = stream_entry_from_json(e.value);
    if (!parsed.ok() || parsed->node == config_.node ||
        std::find(parsed->replicas.begin(), parsed->replicas.end(), config_.node) == parsed->replicas.end())
      continue;
    const std::string& name = parsed->meta.name;
    const std::string mirror = "@" + parsed->node + "/" + name;
    wanted.insert(mirror);
    bool known;
    {
      std::lock_guard lock(replicas_mu_);
      known = replicas_.insert(mirror).second == false;
    }
    if (!known) {
      // Recorded before it is created, so a crash in between leaves a
      // record that the next pass completes or drops.
      if (Status st = store_->put(store::Cf::catalog, "replica/" + mirror, "", store::Durability::synced); !st.ok()) {
        std::lock_guard lock(replicas_mu_);
        replicas_.erase(mirror);
        continue;
      }
    }
    if (StreamPtr copy = find_stream(mirror)) {
      // Durable on the follower as the stream asks: synced for "fsync".
      copy->set_durability(durability_of(parsed->meta.durability));
      // Fallen behind what the leader keeps (a fragment's state stream is
      // trimmed to its last checkpoint): this copy can never catch up, so
      // it is copied afresh from the first tuple the leader holds.
      auto info = peering_->import_info(mirror);
      if (info && info->state == "refused" && info->reason.find("no longer retained") != std::string::npos &&
          readers_of(mirror).empty()) {
        base::logf(LogLevel::info, "cluster", "replica %s: %s; copied again from the first tuple the leader holds\n",
                     mirror.c_str(), info->reason.c_str());
        (void)delete_import(mirror);
      }
      continue;
    }
    (void)dial_domain_node(parsed->node);
    peering_->create_internal_import(name, parsed->node, parsed->meta.schema,
                                     [this, mirror, d = durability_of(parsed->meta.durability)](Result<ImportInfo> r) {
      if (StreamPtr copy = find_stream(mirror)) copy->set_durability(d);
      if (!r.ok() && r.error().code != Errc::already_exists)
        base::logf(LogLevel::info, "cluster", "replica %s: %s (tried again at the next tick)\n", mirror.c_str(),
                     r.error().message.c_str());
    });
  }
  // Copies no entry names any more (the stream was deleted, or has other
  // followers now): dropped once nothing here reads them.
  std::vector<std::string> stale;
  {
    std::lock_guard lock(replicas_mu_);
    for (const auto& m : replicas_)
      if (!wanted.count(m)) stale.push_back(m);
  }
  for (const auto& m : stale) {
    if (!readers_of(m).empty()) continue;
    // The copy of a stream this node leads now but has not adopted yet
    // (reconcile_leadership makes it the stream): it is the stream's log.
    // Dropping it here, while the entry already names this node, left the
    // stream led by a node without its log (a fragment's state stream: the
    // fragment then ran nowhere).
    if (const size_t slash = m.find('/'); slash != std::string::npos) {
      const std::string stream = m.substr(slash + 1);
      if (!find_stream(stream) && stream_leader(stream).value_or("") == config_.node) continue;
    }
    if (find_stream(m)) {
      if (Status st = delete_import(m); !st.ok() && st.error().code != Errc::not_found) continue;
    } else {
      (void)peering_->forget_import(m);
    }
    if (store_->erase(store::Cf::catalog, "replica/" + m, store::Durability::synced).ok()) {
      std::lock_guard lock(replicas_mu_);
      replicas_.erase(m);
    }
  }
}

}  // namespace entente::broker::detail
