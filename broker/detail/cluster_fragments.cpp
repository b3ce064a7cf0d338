// Queries cut into fragments across the nodes of a domain (docs/cluster.md,
// "Queries cut into fragments"). The node that receives the deploy is its
// coordinator: it writes the query's catalog entry (its fragments, their
// nodes, the internal streams between them), then deploys the fragments one
// by one, producers first, each on its node through
// PUT /v1/queries/{query}/fragments/{fragment}; a node running a fragment
// reads the internal streams it needs from their producers' nodes over the
// peer links (Peering::create_internal_import) and runs the fragment as a
// query runner of its own (its journal and checkpoints). Reads and deletes
// through any node fan out to the fragments' nodes.

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "broker/detail/json_out.h"
#include "broker/detail/node_calls.h"
#include "broker/detail/node_impl.h"
#include "cluster/catalog.h"
#include "cluster/membership.h"
#include "engine/fragments.h"
#include "engine/network.h"
#include "federation/peering.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace entente::broker::detail {
namespace {

using namespace node_calls;

constexpr size_t kMaxFragmentBody = 1u << 20;

std::string query_key_of(std::string_view name) { return "queries/" + std::string(name); }
std::string stream_key_of(std::string_view name) { return "streams/" + std::string(name); }

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

// ------------------------------------------------------------ the catalog

std::optional<CutEntry> NodeImpl::cut_entry(const std::string& query, bool fresh) const {
  if (!catalog_) return std::nullopt;
  std::optional<cluster::CatalogEntry> e;
  bool read = false, tried = false;
  if (fresh && !etcd_problem()) {
    // A user's read or delete: what etcd says now, not this node's copy,
    // whose watch event of a deploy or delete answered a moment ago
    // through another node may still be on the way.
    tried = true;
    if (auto r = catalog_->read(query_key_of(query)); r.ok()) {
      e = *r;
      read = true;
    }
  }
  if (!read) e = catalog_->get(query_key_of(query));
  if (!e && fresh && !tried) {
    // etcd seemed away: it may answer all the same.
    if (auto r = catalog_->read(query_key_of(query)); r.ok()) e = *r;
  }
  if (!e) return std::nullopt;
  rapidjson::Document d;
  d.Parse(e->value.data(), e->value.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("fragments") || !d["fragments"].IsArray()) return std::nullopt;
  CutEntry c;
  c.revision = e->mod_revision;
  c.json = e->value;
  if (d.HasMember("state") && d["state"].IsString()) c.state = d["state"].GetString();
  c.stopped = d.HasMember("stopped") && d["stopped"].IsBool() && d["stopped"].GetBool();
  if (d.HasMember("replacing") && d["replacing"].IsString()) c.replacing = d["replacing"].GetString();
  for (const auto& f : d["fragments"].GetArray()) {
    if (!f.IsObject() || !f.HasMember("name") || !f.HasMember("node") || !f["name"].IsString() ||
        !f["node"].IsString())
      return std::nullopt;
    c.fragments.push_back({f["name"].GetString(), f["node"].GetString()});
  }
  if (d.HasMember("outputs") && d["outputs"].IsArray()) {
    for (const auto& o : d["outputs"].GetArray())
      if (o.IsString()) c.outputs.emplace_back(o.GetString());
  }
  return c;
}

namespace {

std::string fragment_body(const engine::QueryCut& cut, const engine::FragmentPlan& f);

// The catalog entry of a cut query: its fragments in pipeline order (the
// order to deploy them in; deleted in reverse), the internal streams, the
// query's outputs and a state.
std::string cut_entry_json(const std::string& query, const engine::QueryCut& cut, const std::string& state) {
  JsonOut j;
  j.begin_object();
  j.key("query").str(query);
  j.key("state").str(state);
  j.key("fragments").begin_array();
  for (size_t f : cut.pipeline_order) {
    const auto& p = cut.fragments[f];
    j.begin_object().key("name").str(p.name).key("node").str(p.node).key("boxes").begin_array();
    for (size_t i = 0; i < p.network.box_ids().size(); ++i) j.str(p.network.box_ids()[i]);
    // What a node taking the fragment over deploys (its PUT body).
    j.end_array().key("body").raw(fragment_body(cut, p)).end_object();
  }
  j.end_array();
  j.key("arcs").begin_array();
  for (const auto& a : cut.arcs) {
    j.begin_object().key("stream").str(a.stream).key("from").str(a.from).key("from_fragment").str(a.from_fragment);
    j.key("to_fragments").begin_array();
    for (const auto& t : a.to_fragments) j.str(t);
    j.end_array().end_object();
  }
  j.end_array();
  j.key("outputs").begin_array();
  for (const auto& p : cut.fragments)
    for (const auto& o : p.outputs) j.str(o);
  j.end_array();
  j.end_object();
  return j.take();
}

// PUT /v1/queries/{query}/fragments/{fragment}'s body for fragment `f`.
std::string fragment_body(const engine::QueryCut& cut, const engine::FragmentPlan& f) {
  JsonOut j;
  j.begin_object();
  j.key("network").raw(f.network_json);
  j.key("reads").begin_array();
  for (const auto& stream : f.reads) {
    for (const auto& a : cut.arcs) {
      if (a.stream != stream) continue;
      for (const auto& p : cut.fragments)
        if (p.name == a.from_fragment) j.begin_object().key("stream").str(stream).key("node").str(p.node).end_object();
    }
  }
  j.end_array();
  j.key("writes").begin_array();
  for (const auto& w : f.writes) j.str(w);
  j.end_array();
  j.end_object();
  return j.take();
}

}  // namespace

// ------------------------------------------------------- the coordinator

void NodeImpl::cluster_deploy_cut(const http::Request& req, const QueryPlacement& placement,
                                  const engine::QueryNetwork& net, const http::Respond& answer) {
  const std::string name = net.name();
  Diagnostics diag;
  rapidjson::Document d;
  d.Parse(placement.fragments_json.data(), placement.fragments_json.size());
  auto specs = engine::read_fragment_specs(d, diag);
  if (!specs.ok()) {
    answer(problem_for(specs.error()));
    return;
  }
  auto start_json = cut_start_from(req, net);
  if (!start_json.ok()) {
    answer(problem_for(start_json.error()));
    return;
  }
  // A fragment that names no node runs on the node that got the deploy.
  for (auto& s : *specs)
    if (s.node.empty()) s.node = config_.node;
  auto cut = engine::cut_query(net, *specs, diag);
  if (!cut.ok()) {
    answer(problem_for(cut.error()));
    return;
  }
  const cluster::MembershipView view = membership_->view();
  for (size_t i = 0; i < specs->size(); ++i) {
    const std::string& node = (*specs)[i].node;
    auto it = std::find_if(view.members.begin(), view.members.end(),
                           [&](const cluster::Member& m) { return m.record.node == node; });
    if (it == view.members.end() || !it->up) {
      answer(unavailable("$.placement.fragments[" + std::to_string(i) + "].node: " + node +
                         " is down; the query can be deployed once it is back"));
      return;
    }
  }
  for (const auto& f : cut->fragments) {
    if (f.inputs.empty()) continue;
    // A fragment reads the query's inputs where they are appended.
    for (const auto& in_name : f.inputs) {
      const auto& in = net.inputs()[*net.input_index(in_name)];
      const std::string stream = in.stream.empty() ? in.name : in.stream;
      if (stream.find('/') != std::string::npos) continue;  // another domain's: imported there
      auto leader = stream_leader(stream);
      if (leader && *leader != f.node) {
        answer(http::Response::problem(
            409, "Conflict",
            "$.placement: fragment " + f.name + " on " + f.node + " reads stream " + stream + ", which " + *leader +
                " leads; place the fragment that reads a stream on the node that leads it"));
        return;
      }
    }
  }
  const std::string entry = cut_entry_json(name, *cut, "deploying");
  {
    std::lock_guard lock(deploying_mu_);
    if (!deploying_.insert(name).second) {
      answer(http::Response::problem(409, "Conflict", "query '" + name + "' is being deployed"));
      return;
    }
  }
  auto created = catalog_->create(query_key_of(name), entry);
  if (created.ok()) {
    // Ours now: an earlier write of it that etcd did not confirm can no
    // longer be applied.
    std::lock_guard lock(deploying_mu_);
    unsure_cut_entries_.erase(name);
  } else {
    {
      std::lock_guard lock(deploying_mu_);
      deploying_.erase(name);
      // Not confirmed in time: etcd may still apply it (reconcile_streams).
      if (created.error().code == Errc::unavailable) {
        if (unsure_cut_entries_.size() >= kMaxUnsureCutEntries) unsure_cut_entries_.erase(unsure_cut_entries_.begin());
        unsure_cut_entries_[name] = {entry, now_ms()};
      }
    }
    if (created.error().code == Errc::unavailable)
      answer(unavailable("deploying a query waits for the domain's catalog in etcd: " + created.error().message));
    else if (created.error().code == Errc::already_exists)
      answer(http::Response::problem(409, "Conflict", "query '" + name + "' exists in domain " + config_.domain));
    else
      answer(problem_for(created.error()));
    return;
  }

  // Deploys the fragments one after the other, producers first.
  struct Run {
    engine::QueryCut cut;
    std::string query;
    http::Request req;
    http::Respond answer;
    size_t next = 0;
    std::vector<std::string> bodies;  // each fragment's answer, in pipeline order
    int64_t revision = 0;             // the entry's, as created
    std::string start_json;           // "start_from", if given
  };
  auto run = std::make_shared<Run>();
  run->revision = *created;
  run->cut = std::move(cut).value();
  run->query = name;
  run->start_json = std::move(start_json).value();
  run->req = sub_request(req, "GET", "/", "");
  run->answer = answer;
  auto step = std::make_shared<std::function<void()>>();
  std::weak_ptr<std::function<void()>> weak_step = step;
  *step = [this, run, weak_step]() {
    auto self_step = weak_step.lock();
    if (run->next == run->cut.pipeline_order.size()) {
      // Every fragment runs: the entry says so (by the revision it was
      // created with: this node's copy of the catalog may not show it yet).
      (void)catalog_->update(query_key_of(run->query), cut_entry_json(run->query, run->cut, "running"),
                             run->revision);
      {
        std::lock_guard lock(deploying_mu_);
        deploying_.erase(run->query);
      }
      JsonOut j;
      j.begin_object().key("name").str(run->query).key("state").str("running");
      // A whole query run as a cut of one fragment: where it runs.
      if (run->cut.fragments.size() == 1) j.key("node").str(run->cut.fragments[0].node);
      j.key("fragments").begin_array();
      for (size_t k = 0; k < run->bodies.size(); ++k) {
        const auto& f = run->cut.fragments[run->cut.pipeline_order[k]];
        j.begin_object().key("name").str(f.name).key("node").str(f.node).key("runner").raw(run->bodies[k]).end_object();
      }
      j.end_array().end_object();
      http::Response r = http::Response::json(201, j.take());
      r.headers.emplace_back("Location", "/v1/queries/" + run->query);
      run->answer(std::move(r));
      return;
    }
    const auto& f = run->cut.fragments[run->cut.pipeline_order[run->next]];
    std::string body = fragment_body(run->cut, f);
    if (!run->start_json.empty() && !f.inputs.empty())
      body.insert(body.size() - 1, ",\"start_from\":" + run->start_json);
    http::Request put = sub_request(run->req, "PUT", fragment_target(run->query, f.name), std::move(body));
    forward(put, f.node, [this, run, self_step, fname = f.name, fnode = f.node](http::Response r) {
      if (success(r)) {
        run->bodies.push_back(r.body);
        ++run->next;
        (*self_step)();
        return;
      }
      // Undo: the fragments deployed so far, consumers first, then the entry.
      // A whole query (one fragment) fails as itself, on its node.
      const std::string where = run->cut.fragments.size() == 1 ? "on " + fnode : "fragment " + fname + " on " + fnode;
      http::Response failed = http::Response::problem(
          r.status, r.status == 400 ? "Bad Request" : "Deploy Failed",
          where + ": " + detail_of(r) + " (nothing of query " + run->query + " stays deployed)");
      undo_cut(run->req, run->query, run->cut, run->next,
               [this, run, failed = std::move(failed)]() mutable {
                 (void)catalog_->erase(query_key_of(run->query), run->revision);
                 {
                   std::lock_guard lock(deploying_mu_);
                   deploying_.erase(run->query);
                 }
                 run->answer(std::move(failed));
               });
    });
  };
  // The chain keeps itself alive through the callbacks it hands forward
  // (each holds the next step; the step holds itself only weakly).
  (*step)();
}

Result<std::string> NodeImpl::cut_start_from(const http::Request& req, const engine::QueryNetwork& net) const {
  rapidjson::Document body;
  body.Parse(req.body.data(), req.body.size());
  if (body.HasParseError() || !body.IsObject() || !body.HasMember("start_from")) return std::string();
  // (query_body read it already: it is well-formed.)
  ENTENTE_ASSIGN_OR_RETURN(auto options, read_query_options(req.body, false));
  Diagnostics diag;
  check_start_names(net, &options, diag);
  if (!diag.ok())
    return make_error(Errc::invalid_argument, diag.items().front().path + ": " + diag.items().front().message);
  return json_text(body["start_from"]);
}

void NodeImpl::undo_cut(const http::Request& req, const std::string& query, const engine::QueryCut& cut,
                        size_t deployed, std::function<void()> done) {
  if (deployed == 0) {
    done();
    return;
  }
  const auto& f = cut.fragments[cut.pipeline_order[deployed - 1]];
  http::Request del = sub_request(req, "DELETE", fragment_target(query, f.name), "");
  forward(del, f.node, [this, req, query, cut, deployed, done = std::move(done)](http::Response) mutable {
    undo_cut(req, query, cut, deployed - 1, std::move(done));
  });
}

// ------------------------------------------- reads and deletes of a cut query

void NodeImpl::get_cut_query(const http::Request& req, const CutEntry& entry, const http::Respond& answer) {
  struct Join {
    std::mutex mu;
    size_t left;
    std::vector<http::Response> got;
  };
  auto join = std::make_shared<Join>();
  join->left = entry.fragments.size();
  join->got.resize(entry.fragments.size());
  const std::string query = query_of_entry(entry);
  for (size_t i = 0; i < entry.fragments.size(); ++i) {
    const auto& [fname, fnode] = entry.fragments[i];
    http::Request get = sub_request(req, "GET", fragment_target(query, fname), "");
    forward(get, fnode, [join, i, entry, query, answer](http::Response r) {
      {
        std::lock_guard lock(join->mu);
        join->got[i] = std::move(r);
        if (--join->left != 0) return;
      }
      // Every fragment answered (or its node did not).
      JsonOut j;
      bool all_running = true, all_stopped = true;
      j.begin_object().key("name").str(query);
      std::string fragments;
      JsonOut fj;
      fj.begin_array();
      for (size_t k = 0; k < entry.fragments.size(); ++k) {
        const http::Response& got = join->got[k];
        fj.begin_object().key("name").str(entry.fragments[k].first).key("node").str(entry.fragments[k].second);
        if (success(got)) {
          rapidjson::Document d;
          d.Parse(got.body.data(), got.body.size());
          const std::string_view state =
              d.IsObject() && d.HasMember("state") && d["state"].IsString() ? d["state"].GetString() : "";
          all_running = all_running && state == "running";
          all_stopped = all_stopped && state == "stopped";
          fj.key("runner").raw(got.body);
        } else {
          all_running = all_stopped = false;
          fj.key("runner").null().key("error").str(detail_of(got));
        }
        fj.end_object();
      }
      fj.end_array();
      // Stopped by its administrator: "stopped" once every fragment is.
      const bool as_said = entry.stopped ? all_stopped : all_running;
      j.key("state").str(entry.state != "running" ? entry.state
                         : as_said                ? (entry.stopped ? "stopped" : "running")
                                                  : "degraded");
      // A whole query run as a cut of one fragment: where it runs.
      if (entry.fragments.size() == 1) j.key("node").str(entry.fragments[0].second);
      j.key("fragments").raw(fj.take());
      rapidjson::Document e;
      e.Parse(entry.json.data(), entry.json.size());
      if (e.IsObject() && e.HasMember("arcs")) j.key("arcs").raw(json_text(e["arcs"]));
      // Where fragments went after their nodes failed, and why.
      if (e.IsObject() && e.HasMember("moves")) j.key("moves").raw(json_text(e["moves"]));
      if (e.IsObject() && e.HasMember("moves_total") && e["moves_total"].IsUint64())
        j.key("moves_total").u64(e["moves_total"].GetUint64());
      // The fragments split by key groups (cluster_splits.cpp).
      if (e.IsObject() && e.HasMember("splits")) j.key("splits").raw(split_records_json(e["splits"]));
      j.key("outputs").begin_array();
      for (const auto& o : entry.outputs) j.str(o);
      j.end_array().end_object();
      answer(http::Response::json(200, j.take()));
    });
  }
}

void NodeImpl::delete_cut_query(const http::Request& req, const CutEntry& entry, const http::Respond& answer) {
  if (auto why = etcd_problem()) {
    answer(unavailable("deleting a query waits for the domain's catalog in etcd (" + *why + ")"));
    return;
  }
  // Consumers first: each fragment stops reading before its producer goes.
  struct Run {
    CutEntry entry;
    std::string query;
    http::Request req;
    http::Respond answer;
    size_t left;
  };
  auto run = std::make_shared<Run>(Run{entry, query_of_entry(entry), sub_request(req, "GET", "/", ""), answer,
                                       entry.fragments.size()});
  auto step = std::make_shared<std::function<void()>>();
  std::weak_ptr<std::function<void()>> weak_step = step;
  *step = [this, run, weak_step]() {
    auto self_step = weak_step.lock();
    if (run->left == 0) {
      if (auto e = cut_entry(run->query)) (void)catalog_->erase(query_key_of(run->query), e->revision);
      run->answer(http::Response{204, "application/json", "", {}});
      return;
    }
    const auto& [fname, fnode] = run->entry.fragments[run->left - 1];
    http::Request del = sub_request(run->req, "DELETE", fragment_target(run->query, fname), "");
    forward(del, fnode, [run, self_step, fname = fname, fnode = fnode](http::Response r) {
      if (!success(r) && r.status != 404) {
        run->answer(http::Response::problem(
            r.status, "Delete Failed",
            "fragment " + fname + " on " + fnode + ": " + detail_of(r) + " (the fragments after it in the "
            "pipeline are deleted; retry the DELETE for the rest)"));
        return;
      }
      --run->left;
      (*self_step)();
    });
  };
  (*step)();
}

std::string NodeImpl::query_of_entry(const CutEntry& entry) {
  rapidjson::Document d;
  d.Parse(entry.json.data(), entry.json.size());
  if (d.IsObject() && d.HasMember("query") && d["query"].IsString()) return d["query"].GetString();
  return {};
}

// ------------------------------------------------- a fragment on its node

Status NodeImpl::dial_domain_node(const std::string& node) {
  if (!peering_ || !membership_) return make_error(Errc::unavailable, "this node has no federation or cluster section");
  for (const auto& m : membership_->view().members) {
    if (m.record.node != node) continue;
    const std::string& a = m.record.peer_address;
    const size_t colon = a.rfind(':');
    if (colon == std::string::npos) break;
    std::string host = a.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    const unsigned long port = std::strtoul(a.c_str() + colon + 1, nullptr, 10);
    if (port == 0 || port > 65535) break;
    return peering_->dial_own_node(node, host, static_cast<uint16_t>(port));
  }
  return make_error(Errc::unavailable, "node " + node + " has no peer address in the domain's membership");
}

void NodeImpl::dial_internal_sources() {
  if (!peering_) return;
  std::set<std::string> nodes;
  for (const auto& imp : peering_->imports())
    if (!imp.node.empty()) nodes.insert(imp.node);
  for (const auto& n : nodes) (void)dial_domain_node(n);
}

namespace {

struct FragmentRequest {
  std::string network_json;
  std::vector<std::pair<std::string, std::string>> reads;  // stream, producer node
  std::set<std::string> writes;
  std::string seed_json;  // "seed": a fragment made by a split (cluster_splits.cpp)
  // "start_from" as the query's deploy gave it (a new fragment's inputs
  // that it names start there).
  std::optional<QueryOptions> start;
};

Result<FragmentRequest> read_fragment_request(std::string_view body) {
  auto bad = [](std::string why) { return make_error(Errc::invalid_argument, std::move(why)); };
  // A split's part carries its share of the split fragment's state.
  if (body.size() > kMaxFragmentBody + kMaxFragmentSeedBytes)
    return bad("the body is larger than " + std::to_string((kMaxFragmentBody + kMaxFragmentSeedBytes) >> 20) + " MiB");
  rapidjson::Document d;
  d.Parse(body.data(), body.size());
  if (d.HasParseError() || !d.IsObject()) return bad("expected {\"network\", \"reads\", \"writes\"}");
  FragmentRequest f;
  for (auto it = d.MemberBegin(); it != d.MemberEnd(); ++it) {
    const std::string_view key(it->name.GetString(), it->name.GetStringLength());
    if (key != "network" && key != "reads" && key != "writes" && key != "seed" && key != "start_from")
      return bad("$." + std::string(key) + ": unknown field");
  }
  if (auto it = d.FindMember("start_from"); it != d.MemberEnd()) {
    ENTENTE_ASSIGN_OR_RETURN(f.start, read_query_options("{\"start_from\":" + json_text(it->value) + "}", false));
  }
  if (d.HasMember("seed")) f.seed_json = json_text(d["seed"]);
  else if (body.size() > kMaxFragmentBody) return bad("the body is larger than 1 MiB");
  if (!d.HasMember("network") || !d["network"].IsObject()) return bad("$.network: expected the fragment's network");
  f.network_json = json_text(d["network"]);
  if (!d.HasMember("reads") || !d["reads"].IsArray() || d["reads"].Size() > engine::kMaxFragments * 64)
    return bad("$.reads: expected an array of {\"stream\", \"node\"}");
  for (rapidjson::SizeType i = 0; i < d["reads"].Size(); ++i) {
    const auto& r = d["reads"][i];
    if (!r.IsObject() || r.MemberCount() != 2 || !r.HasMember("stream") || !r["stream"].IsString() ||
        !r.HasMember("node") || !r["node"].IsString())
      return bad("$.reads[" + std::to_string(i) + "]: expected {\"stream\", \"node\"}");
    f.reads.emplace_back(r["stream"].GetString(), r["node"].GetString());
  }
  if (!d.HasMember("writes") || !d["writes"].IsArray() || d["writes"].Size() > 1000)
    return bad("$.writes: expected an array of internal stream names");
  for (rapidjson::SizeType i = 0; i < d["writes"].Size(); ++i) {
    if (!d["writes"][i].IsString()) return bad("$.writes[" + std::to_string(i) + "]: expected a stream name");
    f.writes.insert(d["writes"][i].GetString());
  }
  return f;
}

}  // namespace

void NodeImpl::put_fragment_route(const http::Request& req, const PathParams& params, const http::Respond& answer) {
  const std::string& query = params.at(0);
  const std::string& fragment = params.at(1);
  if (auto q = find_query(engine::fragment_network_name(query, fragment))) {
    // Deployed already (a retried PUT): the same answer.
    answer(http::Response::json(200, query_json(q, config_.domain + "/" + config_.node, peering_.get())));
    return;
  }
  run_fragment(query, fragment, req.body, FragmentRun::fresh,
               [this, answer](Result<std::shared_ptr<QueryRunner>> q, bool bad_request) {
                 if (!q.ok()) {
                   answer(bad_request ? http::Response::problem(400, "Bad Request", q.error().message)
                                      : problem_for(q.error()));
                   return;
                 }
                 answer(http::Response::json(201, query_json(*q, config_.domain + "/" + config_.node,
                                                             peering_.get())));
               });
}

std::vector<std::string> NodeImpl::fragment_followers(const QueryMeta& meta) const {
  std::vector<std::string> followers;
  if (!peering_ || !membership_ || !catalog_) return followers;
  // Next to the stream it reads: whoever takes that stream over can run
  // the fragment, its input local again.
  for (size_t i = 0; i < meta.inputs.size(); ++i) {
    const bool internal = std::find(meta.internal_inputs.begin(), meta.internal_inputs.end(), i) !=
                          meta.internal_inputs.end();
    if (internal) continue;
    if (auto e = catalog_->get(stream_key_of(meta.inputs[i]))) {
      if (auto parsed = stream_entry_from_json(e->value); parsed.ok() && !parsed->replicas.empty())
        return parsed->replicas;
    }
  }
  if (choose_followers(0, membership_->view(), followers)) followers.clear();  // too few nodes up: none
  return followers;
}

void NodeImpl::replicate_fragment_streams(const QueryMeta& meta) {
  // The fragment's streams are led by this node, copied by followers
  // that can take it over (docs/cluster.md, "Failover of a query's
  // fragments").
  const std::vector<std::string> followers = fragment_followers(meta);
  std::vector<std::string> streams = meta.outputs;
  streams.push_back(state_stream_name(meta.name));
  int64_t last = 0;
  for (const auto& o : streams) {
    StreamPtr s = find_stream(o);
    if (!s) continue;
    StreamEntry entry;
    entry.node = config_.node;
    entry.meta = s->meta();
    entry.replicas = followers;
    entry.in_sync = followers;  // they hold the whole (empty) log
    entry.lease = membership_ ? membership_->lease_id() : 0;
    if (!followers.empty()) {
      // Held by the followers before it counts: a sync of its own would
      // only add a disk flush to each step of the fragment.
      entry.meta.durability = "replicated";
      s->set_durability(store::Durability::buffered);
    }
    if (auto rev = catalog_->create(stream_key_of(o), stream_catalog_entry(entry)); rev.ok())
      last = std::max(last, *rev);
  }
  if (last != 0) catalog_->wait_for(last, config_.cluster.etcd_timeout_ms);
}

void NodeImpl::run_fragment(const std::string& query, const std::string& fragment, const std::string& body,
                            FragmentRun how,
                            std::function<void(Result<std::shared_ptr<QueryRunner>>, bool bad_request)> done,
                            std::shared_ptr<const FragmentOf::Seed> seed) {
  // A standby reads its inputs as a take-over would.
  const bool takeover = how == FragmentRun::takeover || how == FragmentRun::standby;
  const bool fresh = !takeover;
  const std::string runner = engine::fragment_network_name(query, fragment);
  auto f = read_fragment_request(body);
  if (!f.ok()) {
    done(f.error(), true);
    return;
  }
  Diagnostics diag;
  auto net = engine::QueryNetwork::parse(f->network_json, diag);
  if (!net.ok()) {
    done(make_error(Errc::invalid_argument, "$.network: " + diag.to_string()), true);
    return;
  }
  if (net->name() != runner) {
    done(make_error(Errc::invalid_argument,
                    "$.network.name: expected '" + runner + "' (the query's name, '--', the fragment's name)"),
         true);
    return;
  }
  auto ctx = std::make_shared<FragmentOf>();
  ctx->query = query;
  ctx->fragment = fragment;
  ctx->writes = f->writes;
  ctx->takeover = how == FragmentRun::takeover;
  ctx->standby = how == FragmentRun::standby;
  ctx->held = how == FragmentRun::replacement;
  if (seed) ctx->seed = std::move(seed);
  if (ctx->takeover) {
    // Its query stopped: it stays stopped where it runs now.
    if (auto e = cut_entry(query)) ctx->stopped = e->stopped;
  }
  if (ctx->standby) {
    // This node's follower copies of the streams the fragment writes.
    for (const auto& o : net->outputs()) ctx->copies[o.name] = replica_of(o.name);
    ctx->copies[state_stream_name(runner)] = replica_of(state_stream_name(runner));
  }
  if (!f->seed_json.empty()) {
    auto seed = read_fragment_seed(f->seed_json);
    if (!seed.ok()) {
      done(seed.error(), true);
      return;
    }
    ctx->seed = std::move(seed).value();
  }
  std::vector<std::pair<std::string, std::string>> remote;  // stream, node
  for (auto [stream, node] : f->reads) {
    // Taken over: read each internal stream where it is led now.
    if (takeover) {
      if (auto leader = stream_leader(stream)) node = *leader;
    }
    if (node == config_.node) {
      ctx->reads[stream] = stream;
    } else {
      ctx->reads[stream] = "@" + node + "/" + stream;
      remote.emplace_back(stream, node);
    }
  }
  // The streams a new fragment creates, registered in the catalog by
  // replicate_fragment_streams alone (node_impl.h, registering_).
  std::vector<std::string> creates;
  if (fresh) {
    for (const auto& o : net->outputs()) creates.push_back(o.name);
    creates.push_back(state_stream_name(runner));
  }
  // Where a new fragment's inputs start: the deploy checked every name in
  // "start_from" against the whole query; this fragment takes the ones
  // naming its inputs.
  std::optional<QueryOptions> start;
  if (how == FragmentRun::fresh && f->start) {
    start = std::move(f->start);
    std::set<std::string> mine;
    for (const auto& in : net->inputs()) {
      mine.insert(in.name);
      if (in.stream.empty()) continue;
      mine.insert(in.stream);
      if (in.stream.rfind(config_.domain + "/", 0) == 0) mine.insert(in.stream.substr(config_.domain.size() + 1));
    }
    std::erase_if(start->start_by, [&mine](const auto& named) { return !mine.count(named.first); });
  }
  auto deploy = [this, ctx, network = f->network_json, done, creates, runner, start]() {
    auto registered = [this, &creates] {
      std::lock_guard lock(takeover_mu_);
      for (const auto& s : creates) registering_.erase(s);
    };
    {
      std::lock_guard lock(takeover_mu_);
      for (const auto& s : creates) registering_.insert(s);
    }
    // Moved here on request: the standby warmed for it (if any).
    if (ctx->takeover) ctx->warm = take_standby(runner);
    Diagnostics diag;
    auto q = deploy_query(network, diag, ctx.get(), start ? &*start : nullptr);
    if (ctx->warm) standby_taken(runner, q.ok() && *q == ctx->warm);
    if (!q.ok()) {
      registered();
      if (diag.ok()) done(q.error(), false);
      else done(make_error(Errc::invalid_argument, q.error().message + ": " + diag.to_string()), true);
      return;
    }
    if (ctx->standby) {
      done(std::move(q), false);
      return;
    }
    {
      std::lock_guard lock(takeover_mu_);
      fragments_lost_.erase(runner);  // runs after all (a query deployed again)
    }
    if (ctx->takeover) {
      done(std::move(q), false);
      return;
    }
    replicate_fragment_streams((*q)->meta());
    registered();
    done(std::move(q), false);
  };
  // Streams of other domains it reads that this node does not import yet
  // (a fragment taken over from a node that imported them): imported here,
  // from the first tuple the owner still holds, which its retention keeps
  // from what the domain has not acknowledged.
  std::vector<std::pair<std::string, engine::SchemaPtr>> imported;
  if (peering_) {
    for (const auto& in : net->inputs())
      if (!in.stream.empty() && peering_->is_remote(in.stream) && !find_stream(in.stream))
        imported.emplace_back(in.stream, in.schema);
  }
  if (remote.empty() && imported.empty()) {
    deploy();
    return;
  }
  if (!peering_) {
    done(make_error(Errc::invalid_argument, "fragment " + fragment + " reads internal streams of other nodes, over "
                                            "peer links: this node has no federation section"),
         true);
    return;
  }
  for (const auto& r : remote) {
    if (!net->input_index(r.first)) {
      done(make_error(Errc::invalid_argument, "$.reads: '" + r.first + "' is not an input of the network"), true);
      return;
    }
  }
  auto joined = join_imports(remote.size() + imported.size(), [deploy, done](const Status& st) {
    if (st.ok()) deploy();
    else done(st.error(), false);
  });
  for (const auto& [stream, schema] : imported) {
    peering_->create_import(stream, schema, [joined, what = "importing " + stream](Result<ImportInfo> r) {
      joined(std::move(r), what);
    });
  }
  for (const auto& [stream, node] : remote) {
    // (A split's router reads the mirror the split fragment read.)
    if ((takeover || ctx->seed) && find_stream("@" + node + "/" + stream)) {
      // Read already (another fragment here reads it too).
      joined(Result<ImportInfo>(ImportInfo{}), "");
      continue;
    }
    (void)dial_domain_node(node);  // create_internal_import waits for the link
    peering_->create_internal_import(
        stream, node, engine::internal_stream_schema(*net->inputs()[*net->input_index(stream)].schema),
        [joined, what = "reading internal stream " + stream + " from " + node](Result<ImportInfo> r) {
          joined(std::move(r), what);
        });
  }
}

void NodeImpl::get_fragment_route(const http::Request&, const PathParams& params, const http::Respond& answer) {
  const std::string runner = engine::fragment_network_name(params.at(0), params.at(1));
  auto q = find_query(runner);
  // Run by a node of another domain for this one (cluster_hosted.cpp).
  if (!q) {
    if (auto hosted = hosted_fragment_json(runner)) {
      answer(http::Response::json(200, *hosted));
      return;
    }
  }
  if (!q) {
    std::string lost;
    {
      // Placed here, but it cannot run: why (GET /v1/queries/{name} shows it).
      std::lock_guard lock(takeover_mu_);
      if (auto it = fragments_lost_.find(runner); it != fragments_lost_.end()) lost = ": " + it->second;
    }
    answer(http::Response::problem(404, "Not Found", "no fragment " + params.at(1).substr(0, 40) + " of query '" +
                                                         params.at(0).substr(0, 100) + "' on " + config_.node +
                                                         lost));
    return;
  }
  answer(http::Response::json(200, query_json(q, config_.domain + "/" + config_.node, peering_.get())));
}

void NodeImpl::delete_fragment_route(const http::Request&, const PathParams& params, const http::Respond& answer) {
  const std::string runner = engine::fragment_network_name(params.at(0), params.at(1));
  auto q = find_query(runner);
  if (!q) {
    answer(http::Response::problem(404, "Not Found", "no fragment " + params.at(1).substr(0, 40) + " of query '" +
                                                         params.at(0).substr(0, 100) + "' on " + config_.node));
    return;
  }
  const QueryMeta meta = q->meta();
  if (Status st = delete_query(runner); !st.ok()) {
    answer(problem_for(st.error()));
    return;
  }
  // What it read from other nodes, and the streams it wrote.
  for (auto i : meta.internal_inputs) {
    const std::string& mirror = meta.inputs[i];
    if (mirror.starts_with("@")) {
      if (Status st = delete_import(mirror); !st.ok() && st.error().code != Errc::not_found) {
        answer(problem_for(st.error()));
        return;
      }
    }
  }
  if (catalog_) {
    for (const auto& o : meta.outputs) (void)catalog_->erase(stream_key_of(o));
    if (!meta.state_stream.empty()) (void)catalog_->erase(stream_key_of(meta.state_stream));
  }
  answer(http::Response{204, "application/json", "", {}});
}

}  // namespace entente::broker::detail
