// The node as a member of a domain of several nodes (docs/cluster.md):
// connecting to etcd, the membership thread, what the node reports as its
// load, and GET /v1/nodes.

#include <sys/resource.h>

#include <algorithm>
#include <chrono>

#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "entente_version.h"
#include "cluster/catalog.h"
#include "cluster/etcd.h"
#include "cluster/membership.h"
#include "federation/peering.h"
#include "http/upstream.h"

namespace entente::broker::detail {
namespace {

int64_t process_cpu_us() {
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  auto us = [](const timeval& t) { return static_cast<int64_t>(t.tv_sec) * 1'000'000 + t.tv_usec; };
  return us(ru.ru_utime) + us(ru.ru_stime);
}

int64_t steady_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// "host:port", with brackets around an IPv6 host.
std::string host_port(const std::string& host, uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

void write_member(JsonOut& j, const cluster::Member& m) {
  j.begin_object().key("node").str(m.record.node);
  j.key("state").str(m.up ? "up" : "down");
  j.key("role").str(m.controller ? "controller" : "member");
  j.key("api").str(m.record.api_url);
  if (!m.record.peer_address.empty()) j.key("peer").str(m.record.peer_address);
  j.key("version").str(m.record.version).key("started_ms").i64(m.record.started_ms);
  if (m.load) {
    j.key("load").begin_object().key("cpu").dbl(m.load->cpu).key("lag_tuples").u64(m.load->lag_tuples);
    j.end_object();
    j.key("streams_led").begin_array();
    for (const auto& s : m.load->streams_led) j.str(s);
    j.end_array().key("fragments").begin_array();
    for (const auto& f : m.load->fragments) j.str(f);
    j.end_array();
  }
  j.end_object();
}

}  // namespace

cluster::NodeLoad NodeImpl::node_load() {
  cluster::NodeLoad load;
  {
    std::lock_guard lock(load_mu_);
    const int64_t cpu = process_cpu_us(), wall = steady_us();
    if (load_wall_us_ != 0 && wall > load_wall_us_) {
      load.cpu = static_cast<double>(cpu - load_cpu_us_) / static_cast<double>(wall - load_wall_us_);
    }
    load_cpu_us_ = cpu;
    load_wall_us_ = wall;
  }
  for (const auto& s : list_streams()) {
    if (s->meta().producer != "import") load.streams_led.push_back(s->meta().name);
  }
  for (const auto& q : list_queries()) {
    load.fragments.push_back(q->meta().name);
    load.lag_tuples += q->lag_tuples();
  }
  load.tokens = tokens_fingerprint();
  return load;
}

std::string NodeImpl::tokens_fingerprint() const {
  std::vector<std::string> lines;
  {
    std::lock_guard lock(tokens_mu_);  // a reload may replace them
    for (const auto& t : config_.tokens) lines.push_back(std::string(role_name(t.role)) + ":" + t.sha256);
  }
  std::sort(lines.begin(), lines.end());
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  return hash_token(all).substr(0, 16);
}

std::vector<std::string> NodeImpl::domain_nodes() const {
  if (!membership_) return {config_.node};
  std::vector<std::string> out;
  for (const auto& m : membership_->view().members) out.push_back(m.record.node);
  return out;
}

Status NodeImpl::start_cluster() {
  if (!config_.cluster.enabled) return {};
  const auto& c = config_.cluster;
  cluster::EtcdOptions eo;
  eo.endpoints = c.etcd_endpoints;
  eo.ca_file = c.etcd_ca_file;
  eo.timeout_ms = c.etcd_timeout_ms;
  ENTENTE_ASSIGN_OR_RETURN(etcd_, cluster::Etcd::create(std::move(eo)));
  // Forwarded requests wait for the other node as long as an API client
  // would wait for this one.
  http::UpstreamOptions uo;
  uo.request_timeout_ms = std::max<int64_t>(config_.limits.read_timeout_ms, 30'000);
  uo.ws_max_message_bytes = config_.limits.ws_max_message_bytes;
  uo.ws_send_buffer_bytes = config_.limits.ws_send_buffer_bytes;
  uo.ws_ping_interval_ms = config_.limits.ws_ping_interval_ms;
  uo.max_response_bytes = std::max<size_t>(config_.limits.max_body_bytes, 16u << 20);
  ENTENTE_ASSIGN_OR_RETURN(upstream_, http::Upstream::create(uo));
  cluster::NodeRecord self;
  self.node = config_.node;
  self.api_url = std::string(config_.tls ? "https://" : "http://") + host_port(c.advertise_host, port());
  if (peering_)
    self.peer_address = host_port(c.advertise_host, c.advertise_peer_port != 0 ? c.advertise_peer_port : peering_->port());
  self.version = kBuildVersion;
  self.started_ms = started_ms_;
  cluster::MembershipOptions mo;
  mo.prefix = c.prefix;
  mo.lease_ttl_ms = c.lease_ttl_ms;
  // A contract version another node recorded reaches this node's ledger
  // as soon as the watch brings it (and at each tick otherwise).
  catalog_ = std::make_unique<cluster::Catalog>(*etcd_, c.prefix, [this](const std::vector<std::string>& keys) {
    bool contracts = false, streams = false, queries = false;
    for (const auto& k : keys) {
      contracts |= k.starts_with("contracts/");
      streams |= k.starts_with("streams/");
      queries |= k.starts_with("queries/");
    }
    if (contracts) reconcile_contracts();
    // A stream this node now leads, or is to follow, changes at once.
    if (streams) {
      reconcile_leadership();
      reconcile_replicas();
    }
    // And so does a fragment it is to run (a failover), or no longer.
    if (streams || queries) {
      if (membership_) take_over_fragments(membership_->view());
      drop_superseded_fragments();
      follow_moved_reads();
    }
  });
  share_ledger();
  catalog_->start();
  membership_ = std::make_unique<cluster::Membership>(
      *etcd_, std::move(mo), std::move(self), [this] { return node_load(); }, cluster::Membership::RoleFn{},
      [this] {
        confirm_leadership();
        fail_over_streams(membership_->view());
        reconcile_leadership();
        take_over_fragments(membership_->view());
        drop_superseded_fragments();
        follow_moved_reads();
        run_placed_fragments();
        reconcile_streams();
        reconcile_contracts();
        reconcile_replicas();
        // Followers that hold the whole log join their stream's in-sync set.
        for (const auto& s : streams_with_followers()) (void)update_in_sync(s, {}, true);
        dial_internal_sources();
      });
  membership_->start();
  if (peering_) repl_thread_ = std::thread([this] { replication_loop(); });
  metrics_.add_collector([this](MetricsWriter& w) {
    const cluster::MembershipView v = membership_->view();
    size_t up = 0;
    for (const auto& m : v.members) up += m.up;
    w.gauge("entente_cluster_controller", "1 while this node holds the domain's controller lease", {},
            v.is_controller ? 1 : 0);
    w.gauge("entente_cluster_etcd_reachable", "1 when this node's last membership tick reached etcd", {},
            v.etcd_error ? 0 : 1);
    for (const auto& s : list_streams()) {
      if (s->meta().producer == "import") continue;
      auto states = replica_states(s->meta().name);
      if (!states) continue;
      for (const auto& r : *states) {
        w.gauge("entente_stream_replica_lag_tuples",
                "Tuples of a stream this node leads that a follower has not acknowledged as durable",
                {{"stream", s->meta().name}, {"node", r.node}}, static_cast<double>(r.lag_tuples));
        w.gauge("entente_stream_replica_in_sync", "1 while a follower of a stream this node leads is in sync",
                {{"stream", s->meta().name}, {"node", r.node}}, r.in_sync ? 1 : 0);
      }
    }
    w.gauge("entente_cluster_nodes_up", "Nodes of the domain holding a live lease, as this node last read them",
            {}, static_cast<double>(up));
    w.gauge("entente_cluster_catalog_current", "1 while this node's copy of the domain's catalog follows etcd",
            {}, catalog_->synced() ? 1 : 0);
    w.gauge("entente_cluster_catalog_revision", "The etcd revision this node's copy of the catalog reflects", {},
            static_cast<double>(catalog_->revision()));
  });
  return {};
}

void NodeImpl::get_nodes(const http::Request&, const PathParams&, const http::Respond& answer) {
  JsonOut j;
  j.begin_object().key("domain").str(config_.domain);
  if (!membership_) {
    // A one-node domain: this node is all of it, and its own controller.
    cluster::Member self;
    self.record.node = config_.node;
    self.record.api_url = std::string(config_.tls ? "https://" : "http://") +
                          host_port(config_.listen_address, port());
    if (peering_) self.record.peer_address = host_port(config_.federation.listen_host, peering_->port());
    self.record.version = kBuildVersion;
    self.record.started_ms = started_ms_;
    self.up = true;
    self.controller = true;
    self.load = node_load();
    j.key("cluster").boolean(false).key("controller").str(config_.node).key("nodes").begin_array();
    write_member(j, self);
    j.end_array().end_object();
    answer(http::Response::json(200, j.take()));
    return;
  }
  const cluster::MembershipView v = membership_->view();
  // Forwarding authenticates a request twice, here and where it is
  // forwarded: nodes whose tokens differ refuse each other's callers.
  const std::string mine = tokens_fingerprint();
  std::vector<std::string> warnings;
  for (const auto& m : v.members) {
    if (m.up && m.load && !m.load->tokens.empty() && m.load->tokens != mine) {
      warnings.push_back(m.record.node + " accepts other API tokens than " + config_.node +
                         ": requests forwarded between them may be refused (every node of a domain needs the "
                         "same tokens)");
    }
  }
  j.key("cluster").boolean(true).key("self").str(config_.node);
  if (!warnings.empty()) {
    j.key("warnings").begin_array();
    for (const auto& w : warnings) j.str(w);
    j.end_array();
  }
  if (v.controller.empty()) j.key("controller").null();
  else j.key("controller").str(v.controller);
  // The view is what etcd said at the last tick; while etcd cannot be
  // reached it is the last view read, and says since when.
  j.key("etcd").begin_object().key("reachable").boolean(!v.etcd_error.has_value());
  if (v.etcd_error) j.key("error").str(*v.etcd_error).key("since_ms").i64(v.etcd_error_since_ms);
  j.key("read_ms").i64(v.read_ms).end_object();
  j.key("nodes").begin_array();
  for (const auto& m : v.members) write_member(j, m);
  j.end_array().end_object();
  answer(http::Response::json(200, j.take()));
}

void NodeImpl::delete_node(const http::Request&, const PathParams& params, const http::Respond& answer) {
  const std::string& name = params.at(0);
  if (!membership_) {
    answer(http::Response::problem(409, "Conflict", "domain " + config_.domain + " is one node, " + config_.node +
                                                        " (no cluster section); there is no other node to remove"));
    return;
  }
  if (name == config_.node) {
    answer(http::Response::problem(409, "Conflict", "a node does not remove itself: stop " + name +
                                                        " and remove it through another node"));
    return;
  }
  const cluster::MembershipView v = membership_->view();
  auto it = std::find_if(v.members.begin(), v.members.end(),
                         [&](const cluster::Member& m) { return m.record.node == name; });
  if (it == v.members.end()) {
    answer(http::Response::problem(404, "Not Found", "no node '" + name.substr(0, 63) + "' in domain " +
                                                         config_.domain));
    return;
  }
  if (it->up) {
    answer(http::Response::problem(409, "Conflict", name + " is up (it holds its lease); stop it first"));
    return;
  }
  // What the catalog still places on it would be unreachable.
  std::string held;
  for (const auto& s : list_streams_led_by(name)) held += (held.empty() ? "" : ", ") + s;
  if (!held.empty()) {
    answer(http::Response::problem(409, "Conflict", name + " still leads or runs " + held +
                                                        "; delete those first (its data is on that node)"));
    return;
  }
  if (auto why = etcd_problem()) {
    http::Response r = http::Response::problem(503, "Service Unavailable",
                                               "removing a node waits for etcd: " + *why);
    r.headers.emplace_back("Retry-After", "1");
    answer(std::move(r));
    return;
  }
  auto erased = etcd_->erase(config_.cluster.prefix + "nodes/" + name);
  if (!erased.ok()) {
    answer(problem_for(erased.error()));
    return;
  }
  answer(http::Response{204, "application/json", "", {}});
}

}  // namespace entente::broker::detail
