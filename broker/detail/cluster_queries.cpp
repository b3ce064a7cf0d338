// The domain's queries in a cluster (docs/cluster.md, "Queries in a domain
// of several nodes"): a query runs on one node, which the domain's catalog
// names; it is deployed through any node, placed by the controller (or by
// the query's "placement"), and read or deleted through any node. In a
// domain of several nodes a query placed whole on one node runs there as a
// cut of one fragment (kWholeQueryFragment), so that it fails over.

#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "cluster/catalog.h"
#include "cluster/membership.h"
#include "engine/fragments.h"
#include "engine/network.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace entente::broker::detail {
namespace {

std::string query_key_of(std::string_view name) { return "queries/" + std::string(name); }
std::string stream_key_of(std::string_view name) { return "streams/" + std::string(name); }


// A query's catalog entry: where it runs and which streams it writes.
std::string query_entry_json(const std::string& node, const std::vector<std::string>& outputs) {
  JsonOut j;
  j.begin_object().key("node").str(node).key("outputs").begin_array();
  for (const auto& o : outputs) j.str(o);
  j.end_array().end_object();
  return j.take();
}

std::optional<std::string> node_of_entry(const std::string& json) {
  rapidjson::Document d;
  d.Parse(json.data(), json.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("node") || !d["node"].IsString()) return std::nullopt;
  return std::string(d["node"].GetString(), d["node"].GetStringLength());
}

http::Response unavailable(std::string detail) {
  http::Response r = http::Response::problem(503, "Service Unavailable", detail);
  r.headers.emplace_back("Retry-After", "1");
  return r;
}

}  // namespace

Result<QueryPlacement> read_placement(std::string_view body) {
  QueryPlacement p;
  rapidjson::Document d;
  d.Parse(body.data(), body.size());
  if (d.HasParseError() || !d.IsObject()) {
    p.network_json = std::string(body);  // the engine reports the problem
    return p;
  }
  auto it = d.FindMember("placement");
  if (it == d.MemberEnd()) {
    p.network_json = std::string(body);
    return p;
  }
  const rapidjson::Value& v = it->value;
  if (!v.IsObject() || v.MemberCount() != 1 || !(v.HasMember("node") || v.HasMember("fragments"))) {
    return make_error(Errc::invalid_argument,
                      "$.placement: expected {\"node\": NODE} or {\"fragments\": [{\"name\", \"node\", \"boxes\"}, ...]}");
  }
  if (v.HasMember("node")) {
    const rapidjson::Value& n = v["node"];
    if (!n.IsString() || n.GetStringLength() == 0 || n.GetStringLength() > 63) {
      return make_error(Errc::invalid_argument, "$.placement.node: expected the name of a node of this domain");
    }
    p.node.assign(n.GetString(), n.GetStringLength());
  } else {
    p.fragments_json = json_text(v["fragments"]);
  }
  d.RemoveMember("placement");
  p.network_json = json_text(d);
  return p;
}

Status check_fragments(QueryPlacement& placement, const engine::QueryNetwork& net,
                       const std::vector<std::string>& nodes, const std::string& here,
                       const std::function<std::string(const std::string&)>& leader_of, Diagnostics& diag) {
  if (placement.fragments_json.empty()) return {};
  rapidjson::Document d;
  d.Parse(placement.fragments_json.data(), placement.fragments_json.size());
  auto specs = engine::read_fragment_specs(d, diag);
  std::optional<engine::QueryCut> cut;
  if (specs.ok()) {
    // Every fragment on a node of the domain.
    for (size_t i = 0; i < specs->size(); ++i) {
      const std::string& node = (*specs)[i].node;
      if (node.empty() || std::find(nodes.begin(), nodes.end(), node) != nodes.end()) continue;
      std::string known;
      for (const auto& n : nodes) known += (known.empty() ? "" : ", ") + n;
      diag.error("$.placement.fragments[" + std::to_string(i) + "].node",
                 node + " is not a node of this domain (its nodes: " + known + ")");
    }
    if (auto c = engine::cut_query(net, *specs, diag); c.ok()) cut = std::move(c).value();
  }
  if (!diag.ok() || !cut) return make_error(Errc::invalid_argument, "the placement is invalid");
  // A fragment without a node goes next to what it reads, producers first.
  std::map<std::string, std::string> node_of;  // fragment -> node
  for (size_t f : cut->pipeline_order) {
    engine::FragmentPlan& p = cut->fragments[f];
    if (p.node.empty()) {
      for (const auto& in_name : p.inputs) {
        const auto& in = net.inputs()[*net.input_index(in_name)];
        if (p.node.empty()) p.node = leader_of(in.stream.empty() ? in.name : in.stream);
      }
      for (const auto& stream : p.reads) {
        for (const auto& a : cut->arcs)
          if (a.stream == stream && p.node.empty()) p.node = node_of[a.from_fragment];
      }
      if (p.node.empty()) p.node = here;
    }
    node_of[p.name] = p.node;
  }
  std::set<std::string> used;
  for (const auto& p : cut->fragments) used.insert(p.node);
  if (used.size() == 1) {
    placement.node = *used.begin();
    placement.fragments_json.clear();
    return {};
  }
  // On several nodes: the query is cut (cluster_deploy_cut), every node said.
  JsonOut j;
  j.begin_array();
  for (size_t i = 0; i < specs->size(); ++i) {
    j.begin_object().key("name").str((*specs)[i].name).key("node").str(node_of[(*specs)[i].name]);
    j.key("boxes").begin_array();
    for (const auto& b : (*specs)[i].boxes) j.str(b);
    j.end_array().end_object();
  }
  j.end_array();
  placement.fragments_json = j.take();
  return {};
}

std::optional<QueryPlacement> whole_query_as_cut(const engine::QueryNetwork& net, const std::string& node) {
  const auto specs = engine::whole_query_fragment(net, kWholeQueryFragment, node);
  Diagnostics diag;
  if (!engine::cut_query(net, specs, diag).ok()) return std::nullopt;
  QueryPlacement p;
  p.node = node;
  JsonOut j;
  j.begin_array().begin_object().key("name").str(specs[0].name).key("node").str(node).key("boxes").begin_array();
  for (const auto& b : specs[0].boxes) j.str(b);
  j.end_array().end_object().end_array();
  p.fragments_json = j.take();
  return p;
}

std::string with_placement(std::string_view network_json, const std::string& node) {
  rapidjson::Document d;
  d.Parse(network_json.data(), network_json.size());
  rapidjson::Value p(rapidjson::kObjectType);
  p.AddMember("node", rapidjson::Value(node.c_str(), d.GetAllocator()), d.GetAllocator());
  d.AddMember("placement", p, d.GetAllocator());
  return json_text(d);
}

bool NodeImpl::cluster_place_query(const http::Request& req, const QueryPlacement& placement,
                                   const engine::QueryNetwork& net, const http::Respond& answer) {
  const std::string& name = net.name();
  if (auto why = etcd_problem()) {
    answer(unavailable("deploying a query waits for the domain's catalog in etcd, which this node cannot reach "
                       "now (" + *why + "); tuples keep flowing meanwhile"));
    return false;
  }
  if (name.find("--") != std::string::npos) {
    answer(http::Response::problem(400, "Bad Request",
                                   "$.name: '--' is reserved for the fragments of a query cut across nodes"));
    return false;
  }
  if (auto e = catalog_->get(query_key_of(name))) {
    answer(http::Response::problem(409, "Conflict", "query '" + name + "' exists in domain " + config_.domain +
                                                        " (on " + node_of_entry(e->value).value_or("?") + ")"));
    return false;
  }
  for (size_t o = 0; o < net.outputs().size(); ++o) {
    if (auto leader = stream_leader(net.outputs()[o].name)) {
      answer(http::Response::problem(409, "Conflict", "$.outputs[" + std::to_string(o) + "].name: stream '" +
                                                          net.outputs()[o].name + "' exists already (led by " +
                                                          *leader + ")"));
      return false;
    }
  }
  if (!placement.fragments_json.empty()) {
    cluster_deploy_cut(req, placement, net, answer);
    return false;
  }
  const cluster::MembershipView view = membership_->view();
  std::string node = placement.node;
  if (!node.empty()) {
    auto it = std::find_if(view.members.begin(), view.members.end(),
                           [&](const cluster::Member& m) { return m.record.node == node; });
    if (it == view.members.end()) {
      std::string known;
      for (const auto& m : view.members) known += (known.empty() ? "" : ", ") + m.record.node;
      answer(http::Response::problem(400, "Bad Request", "$.placement.node: " + node + " is not a node of domain " +
                                                             config_.domain + " (its nodes: " + known + ")"));
      return false;
    }
    if (!it->up) {
      answer(unavailable("$.placement.node: " + node + " is down; the query can be deployed there once it is back"));
      return false;
    }
  } else if (view.is_controller) {
    // A query reads its inputs where they are appended: it goes to the
    // node that leads them. Inputs on several nodes need the query cut
    // into fragments, which only the user can say how.
    std::set<std::string> leaders;
    std::string which;
    for (const auto& in : net.inputs()) {
      const std::string stream = in.stream.empty() ? in.name : in.stream;
      if (auto leader = stream_leader(stream)) {
        leaders.insert(*leader);
        which += (which.empty() ? "" : ", ") + stream + " on " + *leader;
      }
    }
    if (leaders.size() > 1) {
      answer(http::Response::problem(409, "Conflict", "the query's inputs are appended on different nodes (" +
                                                          which + "); cut the query into fragments, each next "
                                                          "to the inputs it reads: \"placement\": {\"fragments\": "
                                                          "[{\"name\", \"node\", \"boxes\"}, ...]}"));
      return false;
    }
    node = leaders.empty() ? config_.node : *leaders.begin();
  } else if (view.controller.empty()) {
    answer(unavailable("domain " + config_.domain + " has no controller at the moment to place the query (give "
                       "\"placement\": {\"node\": NODE} to place it yourself)"));
    return false;
  } else {
    forward(req, view.controller, answer);
    return false;
  }
  if (view.members.size() > 1) {
    // In a domain of several nodes a whole query is a cut of one fragment
    // on the node chosen: its journal and checkpoints go to a replicated
    // state stream, and another node runs it when this one dies
    // (docs/cluster.md, "Whole queries fail over too"). This node
    // coordinates the deploy, wherever the fragment goes.
    if (auto cut = whole_query_as_cut(net, node)) {
      // It reads its inputs where they are appended, as a whole query
      // does (the node would not find them).
      for (size_t i = 0; i < net.inputs().size(); ++i) {
        const auto& in = net.inputs()[i];
        const std::string stream = in.stream.empty() ? in.name : in.stream;
        if (stream.find('/') != std::string::npos) continue;  // another domain's: imported there
        if (auto leader = stream_leader(stream); leader && *leader != node) {
          answer(http::Response::problem(
              400, "Bad Request",
              "$.inputs[" + std::to_string(i) + "]" + (in.stream.empty() ? ".name" : ".stream") + ": no stream '" +
                  stream + "' on " + node + " (" + *leader + " leads it): a query runs on the node that leads "
                  "its inputs; place it there, or leave \"placement\" out"));
          return false;
        }
      }
      cut->network_json = placement.network_json;
      cluster_deploy_cut(req, *cut, net, answer);
      return false;
    }
  }
  if (node != config_.node) {
    forward(req, node, answer, with_placement(placement.network_json, node));
    return false;
  }
  {
    std::lock_guard lock(deploying_mu_);
    if (!deploying_.insert(name).second) {
      answer(http::Response::problem(409, "Conflict", "query '" + name + "' is being deployed"));
      return false;
    }
  }
  auto rev = catalog_->create(query_key_of(name), query_entry_json(config_.node, {}));
  if (!rev.ok()) {
    std::lock_guard lock(deploying_mu_);
    deploying_.erase(name);
    if (rev.error().code == Errc::unavailable) {
      answer(unavailable("deploying a query waits for the domain's catalog in etcd: " + rev.error().message));
    } else {
      answer(problem_for(rev.error()));
    }
    return false;
  }
  return true;
}

void NodeImpl::cluster_query_deployed(const std::string& name, const Result<std::shared_ptr<QueryRunner>>& q) {
  {
    // Only a deploy cluster_place_query placed here has an entry to finish.
    std::lock_guard lock(deploying_mu_);
    if (!deploying_.count(name)) return;
  }
  struct Done {
    NodeImpl* node;
    const std::string& name;
    ~Done() {
      std::lock_guard lock(node->deploying_mu_);
      node->deploying_.erase(name);
    }
  } done{this, name};
  auto e = catalog_->get(query_key_of(name));
  if (!q.ok()) {
    // Undo the placement; the query is not anywhere.
    (void)catalog_->erase(query_key_of(name));
    return;
  }
  int64_t last = 0;
  if (auto rev = catalog_->update(query_key_of(name), query_entry_json(config_.node, (*q)->meta().outputs),
                                  e ? e->mod_revision : 0);
      rev.ok()) {
    last = *rev;
  }
  // Its outputs are streams this node leads (reconcile_streams catches
  // what fails here).
  for (const auto& o : (*q)->meta().outputs) {
    if (auto s = find_stream(o)) {
      if (auto rev = catalog_->create(stream_key_of(o), stream_catalog_entry(s->meta(), config_.node)); rev.ok()) {
        last = std::max(last, *rev);
      }
    }
  }
  // Read-your-writes: a listing through this node shows them at once.
  if (last != 0) catalog_->wait_for(last, config_.cluster.etcd_timeout_ms);
}

bool NodeImpl::forward_query_if_elsewhere(const http::Request& req, const std::string& name,
                                          const http::Respond& answer) {
  if (!catalog_ || find_query(name)) return false;
  auto e = catalog_->get(query_key_of(name));
  if (!e && catalog_->revision() != 0) {
    // Deployed through another node a moment ago, its watch event on the
    // way: etcd itself says.
    if (auto r = catalog_->read(query_key_of(name)); r.ok()) e = *r;
  }
  if (!e && catalog_->revision() == 0) {
    answer(unavailable("finding query '" + name.substr(0, 100) + "' waits for the domain's catalog in etcd, "
                       "which this node has not read yet (" + catalog_->problem() + ")"));
    return true;
  }
  if (!e) return false;
  auto node = node_of_entry(e->value);
  if (!node || *node == config_.node) return false;
  forward(req, *node, answer);
  return true;
}

void NodeImpl::cluster_list_queries(std::vector<std::string>& extra_json) const {
  std::set<std::string> local;
  for (const auto& q : list_queries()) local.insert(q->meta().name);
  for (const auto& e : catalog_->list("queries/")) {
    const std::string name = e.key.substr(std::string("queries/").size());
    if (local.count(name)) continue;
    if (auto cut = cut_entry(name)) {
      JsonOut j;
      j.begin_object().key("name").str(name).key("state").str(cut->state);
      // A whole query run as a cut of one fragment: where it runs.
      if (cut->fragments.size() == 1) j.key("node").str(cut->fragments[0].second);
      j.key("fragments").begin_array();
      for (const auto& [f, n] : cut->fragments) j.begin_object().key("name").str(f).key("node").str(n).end_object();
      j.end_array().end_object();
      extra_json.push_back(j.take());
      continue;
    }
    JsonOut j;
    j.begin_object().key("name").str(name).key("node").str(node_of_entry(e.value).value_or(""));
    j.end_object();
    extra_json.push_back(j.take());
  }
}

Status NodeImpl::cluster_delete_query(const std::string& name) {
  auto q = find_query(name);
  std::vector<std::string> outputs = q ? q->meta().outputs : std::vector<std::string>{};
  ENTENTE_RETURN_IF_ERROR(delete_query(name));
  (void)catalog_->erase(query_key_of(name));
  for (const auto& o : outputs) (void)catalog_->erase(stream_key_of(o));
  return {};
}

}  // namespace entente::broker::detail
