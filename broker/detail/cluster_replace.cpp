// Replacing the network of a query of a domain of several nodes
// (docs/cluster.md, "Replacing a query's network"). There a query deployed
// whole runs as a cut of one fragment, whose journal and checkpoints are in
// its state stream and whose catalog entry holds the network a node taking
// it over runs. The new network runs as the fragment's next generation
// (`all` → `all-2` → `all-3`: its own runner and state stream), beside the
// old one until the entry names it:
//
//   1. The node running the fragment checks the new network against the
//      old one as a replacement on one node does (which boxes keep their
//      state, inputs, outputs), and marks the entry "replacing".
//   2. The old run stops where it stands (QueryRunner::stopped_state).
//   3. The kept boxes' state is carried to the new network
//      (engine::carry_snapshot), and the new generation is deployed from
//      it, its outputs of the same names taken on at the old numbers, then
//      checkpointed into its new state stream (held by the followers) and
//      left stopped.
//   4. One compare-and-set of the entry names the new generation, its
//      network and outputs: the replacement is done. Before it, a failure
//      (or this node's death) leaves the old generation the entry's, run
//      again from its own state stream (here, or by the node taking it
//      over); after it, the new one is, run from its checkpoint.
//   5. The new generation starts (unless the query is stopped); the old
//      one's state stream and the outputs it no longer writes are dropped.
//
// A query cut into several fragments is not replaced (501): its state
// would have to be carried across a new cut.

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <memory>

#include "broker/detail/json_out.h"
#include "broker/detail/node_calls.h"
#include "broker/detail/node_impl.h"
#include "cluster/catalog.h"
#include "cluster/membership.h"
#include "engine/fragments.h"
#include "engine/network.h"
#include "engine/splits.h"
#include "rapidjson/document.h"
#include "store/stream_log.h"

namespace entente::broker::detail {
namespace {

using namespace node_calls;

constexpr int64_t kReplaceAnswerWaitMs = 120'000;

// The fragment's next generation: all → all-2 → all-3.
std::string next_generation(const std::string& fragment) {
  const size_t dash = fragment.rfind('-');
  if (dash != std::string::npos && dash + 1 < fragment.size() &&
      fragment.find_first_not_of("0123456789", dash + 1) == std::string::npos && fragment.size() - dash <= 6)
    return fragment.substr(0, dash) + "-" + std::to_string(std::stoul(fragment.substr(dash + 1)) + 1);
  return fragment + "-2";
}

// The network document under the name `name`.
std::string renamed(std::string_view network_json, const std::string& name) {
  rapidjson::Document d;
  d.Parse(network_json.data(), network_json.size());
  if (d.HasParseError() || !d.IsObject()) return std::string(network_json);
  d.RemoveMember("name");
  d.AddMember("name", rapidjson::Value(name.c_str(), d.GetAllocator()), d.GetAllocator());
  return json_text(d);
}

// The body of the only fragment of a query (what the entry keeps).
std::string lone_fragment_body(const std::string& network_json) {
  JsonOut j;
  j.begin_object().key("network").raw(network_json).key("reads").begin_array().end_array();
  j.key("writes").begin_array().end_array().end_object();
  return j.take();
}

// ENTENTE_TEST_KILL_IN_REPLACE=NODE:STEP, for tests only: node NODE
// kills itself (SIGKILL) at STEP of a replacement, `stopped` (the old
// network stopped), `deployed` (the new one deployed, held) or `named`
// (the entry names it): the node's death the steps above must survive.
// Unset normally.
void kill_if_testing(const std::string& node, const char* step) {
  static const std::string at = [] {
    const char* v = std::getenv("ENTENTE_TEST_KILL_IN_REPLACE");
    return v != nullptr ? std::string(v) : std::string();
  }();
  if (!at.empty() && at == node + ":" + step) ::kill(::getpid(), SIGKILL);
}

http::Response conflict(std::string detail) { return http::Response::problem(409, "Conflict", std::move(detail)); }

}  // namespace

bool NodeImpl::replacement_live(const CutEntry& entry) const {
  if (entry.replacing.empty()) return false;
  if (entry.replacing == config_.node) {
    std::lock_guard lock(lifecycle_jobs_mu_);
    return replacing_.count(query_of_entry(entry)) != 0;
  }
  return membership_ && member_up(membership_->view(), entry.replacing);
}

void NodeImpl::cluster_replace(const http::Request& req, const CutEntry& entry, QueryOptions options,
                               const http::Respond& answer) {
  const std::string query = query_of_entry(entry);
  if (entry.fragments.size() != 1) {
    answer(http::Response::problem(
        501, "Not Implemented",
        "query '" + query + "' is cut into " + std::to_string(entry.fragments.size()) + " fragments: replacing "
        "the network of a query cut across nodes is not supported yet (a query deployed whole is replaced with its "
        "state). Stop it, delete it and deploy the new network with \"start_from\" set to where it stood (GET "
        "/v1/queries/{name} shows each input's position)"));
    return;
  }
  const auto& [fragment, node] = entry.fragments[0];
  // Where it runs: its state is there.
  if (node != config_.node) {
    forward(req, node, answer, std::nullopt, kReplaceAnswerWaitMs);
    return;
  }
  if (auto why = etcd_problem()) {
    answer(unavailable("replacing a query's network waits for the domain's catalog in etcd, which this node cannot "
                       "reach now (" + *why + ")"));
    return;
  }
  if (entry.state != "running") {
    answer(conflict("query '" + query + "' is " + entry.state + "; its network is replaced once it runs"));
    return;
  }
  if (auto refused = refuse_if_held(entry, "replacing its network", /*stopped_too=*/false)) {
    answer(std::move(*refused));
    return;
  }
  if (const std::string busy = busy_fragment_of(entry.json); !busy.empty()) {
    answer(conflict("replacing the network of query '" + query + "': " + busy));
    return;
  }
  {
    std::lock_guard lock(lifecycle_jobs_mu_);
    if (!replacing_.insert(query).second) {
      answer(conflict("query '" + query + "' is being replaced"));
      return;
    }
  }
  const http::Request caller = sub_request(req, "GET", "/", "");
  const bool posted = post_lifecycle([this, caller, query, fragment, options = std::move(options), answer] {
    auto refused = run_cluster_replace(query, fragment, options);
    count_replacement(query, refused ? refused->status : 200);
    {
      std::lock_guard lock(lifecycle_jobs_mu_);
      replacing_.erase(query);
    }
    if (refused) {
      answer(std::move(*refused));
      return;
    }
    auto now = cut_entry(query, true);
    if (!now) answer(http::Response::problem(404, "Not Found", "query '" + query + "' was deleted meanwhile"));
    else get_cut_query(caller, *now, answer);
  });
  if (!posted) {
    std::lock_guard lock(lifecycle_jobs_mu_);
    replacing_.erase(query);
    answer(unavailable(config_.node + " is stopping"));
  }
}

std::optional<http::Response> NodeImpl::run_cluster_replace(const std::string& query, const std::string& fragment,
                                                            const QueryOptions& options) {
  const std::string old_runner = engine::fragment_network_name(query, fragment);
  auto old = find_query(old_runner);
  if (!old)
    return conflict("fragment " + fragment + " of query '" + query + "' is placed on " + config_.node +
                    " but does not run there now; nothing replaced");
  const std::string was = old->info().state;
  if (was != "running" && was != "stopped")
    return conflict("query '" + query + "' is " + was + "; delete it and deploy it again");

  // 1. The plan, as on one node: nothing changes when it is refused.
  auto planned = plan_cluster_replace(query, fragment, *old, options);
  if (auto* refusal = std::get_if<http::Response>(&planned)) return std::move(*refusal);
  const ClusterReplacePlan& plan = std::get<ClusterReplacePlan>(planned);
  const QueryReplacement& r = plan.r;
  const std::string& generation = plan.generation;
  const std::string& new_runner = plan.new_runner;

  // 2. Marked, then the old run stops where it stands. Until the entry
  // names the new generation, this node's tick does not run the old one
  // again (rerunning_), nor does a node taking it over (it is up).
  const int64_t etcd_ms = config_.cluster.etcd_timeout_ms;
  auto mark = [&](bool on) {
    return edit_query_entry(*catalog_, query, [&](rapidjson::Document& d) {
      d.RemoveMember("replacing");
      if (on) set_member(d, "replacing", rapidjson::Value(config_.node.c_str(), d.GetAllocator()));
      return true;
    }, etcd_ms);
  };
  if (!mark(true)) return unavailable("the query's catalog entry could not be marked; nothing replaced");
  {
    std::lock_guard lock(takeover_mu_);
    rerunning_.insert(old_runner);
  }
  const QueryMeta old_meta = old->meta();
  const std::string old_body = fragment_body_of(old_meta);
  auto give_back = [&](int status, const std::string& why) {
    // The old generation runs again from its state stream, as a
    // take-over would (rerun_fragment clears rerunning_).
    rerun_fragment(old_meta, old_body);
    mark(false);
    log_line(LogLevel::warn, "query", "replacing the network of query '" + query + "': " + why);
    return http::Response::problem(status, status == 409 ? "Conflict" : "Replace Failed",
                                   why + "; the query goes on with its old network");
  };
  if (Status st = detach_query(old_runner); !st.ok()) {
    {
      std::lock_guard lock(takeover_mu_);
      rerunning_.erase(old_runner);
    }
    mark(false);
    return unavailable("stopping the old network: " + st.error().message + "; nothing replaced");
  }
  auto st = old->stopped_state(true);
  if (!st.ok()) return give_back(503, "the old network's state: " + st.error().message);
  kill_if_testing(config_.node, "stopped");

  // 3. Its state carried over; the new generation deployed beside, held.
  auto snapshot = engine::carry_snapshot(*plan.from, st->snapshot, *plan.to, r.kept_boxes, r.input_from);
  if (!snapshot.ok()) return give_back(409, "carrying the state over: " + snapshot.error().message);
  auto seed = std::make_shared<FragmentOf::Seed>();
  seed->state.snapshot = std::move(*snapshot);
  for (size_t i = 0; i < r.input_from.size(); ++i)
    seed->state.positions.push_back(r.input_from[i] ? st->positions[*r.input_from[i]] : r.meta.start[i]);
  std::vector<std::string> created;  // the new generation's streams that did not exist
  for (size_t o = 0; o < r.output_from.size(); ++o) {
    seed->state.out_next.push_back(r.output_from[o] ? st->out_next[*r.output_from[o]] : 1);
    if (r.output_from[o]) seed->adopt.insert(r.meta.outputs[o]);
    else created.push_back(r.meta.outputs[o]);
  }
  created.push_back(state_stream_name(new_runner));
  const std::string body = lone_fragment_body(plan.new_network);
  auto deployed = std::make_shared<std::promise<Result<std::shared_ptr<QueryRunner>>>>();
  auto got = deployed->get_future();
  run_fragment(query, generation, body, FragmentRun::replacement,
               [deployed](Result<std::shared_ptr<QueryRunner>> q, bool) { deployed->set_value(std::move(q)); }, seed);
  auto fresh = got.get();
  auto undeploy = [&] {
    (void)detach_query(new_runner);
    drop_streams_of_query(query, created);
  };
  if (!fresh.ok()) {
    undeploy();
    return give_back(fresh.error().code == Errc::invalid_argument ? 400 : 409,
                     "deploying the new network: " + fresh.error().message);
  }

  kill_if_testing(config_.node, "deployed");

  // 4. The entry names it: done.
  bool stopped = false;
  const bool named = name_generation(query, plan, body, stopped);
  if (!named) {
    undeploy();
    return give_back(503, "the query's catalog entry could not be updated");
  }

  kill_if_testing(config_.node, "named");

  // 5. It runs; what only the old generation had goes (its state stream
  // first: the tick runs no fragment without one).
  if (!stopped) {
    if (auto started = start_query(new_runner); !started.ok())
      log_line(LogLevel::warn, "query", "query '" + query + "': its new network did not start (" +
                                            started.error().message + "); this node's tick starts it");
  }
  std::vector<std::string> dropped = r.dropped;
  dropped.push_back(old_meta.state_stream);
  drop_streams_of_query(query, dropped);
  {
    std::lock_guard lock(takeover_mu_);
    rerunning_.erase(old_runner);
  }
  log_line(LogLevel::info, "query", "query '" + query + "': network replaced (" + old_runner + " → " + new_runner +
                                        ", " + std::to_string(r.kept_boxes.size()) + " boxes kept their state)");
  return std::nullopt;
}

void NodeImpl::count_replacement(const std::string& query, int status) {
  metrics_
      .counter("entente_query_replacements_total",
               "Replacements of a query's network (PUT /v1/queries/{name}) this node ran, by outcome: replaced, "
               "refused (nothing changed) or failed (the old network goes on)",
               {{"query", query}, {"outcome", status < 300 ? "replaced" : status < 500 ? "refused" : "failed"}})
      .inc();
}

std::variant<ClusterReplacePlan, http::Response> NodeImpl::plan_cluster_replace(const std::string& query,
                                                                                const std::string& fragment,
                                                                                const QueryRunner& old,
                                                                                const QueryOptions& options) {
  Diagnostics diag;
  auto net = engine::QueryNetwork::parse(options.network_json, diag);
  if (!net.ok()) return problem_with(make_error(Errc::invalid_argument, "the query network is invalid"), diag);
  if (net->name() != query)
    diag.error("$.name", "'" + net->name() + "' is not the query's name '" + query + "': a replacement keeps it");
  ClusterReplacePlan plan;
  plan.generation = next_generation(fragment);
  plan.new_runner = engine::fragment_network_name(query, plan.generation);
  plan.new_network = renamed(options.network_json, plan.new_runner);
  Diagnostics names;
  auto to = engine::QueryNetwork::parse(plan.new_network, names);
  if (!to.ok())
    return conflict("the new network's run, '" + plan.new_runner + "', is no valid query name: " + names.to_string());
  Diagnostics ignored;
  auto from = engine::QueryNetwork::parse(old.meta().network_json, ignored);
  if (!from.ok()) return http::Response::problem(500, "Internal Server Error", "its stored network does not parse");
  plan.to = std::move(to).value();
  plan.from = std::move(from).value();
  QueryReplacement& r = plan.r;
  r.meta = old.meta();
  r.meta.inputs.clear();
  r.meta.outputs.clear();
  r.meta.start.clear();
  Status boxes = plan_kept_boxes(*plan.from, *plan.to, options, r, diag);
  std::string refused;
  {
    std::unique_lock lock(catalog_mu_);
    plan_inputs(*plan.to, old.meta(), options, r, diag, refused);
    plan_outputs(*plan.to, old.meta(), r, diag, refused);
  }
  // A new output is a new stream of the domain.
  for (size_t o = 0; o < r.meta.outputs.size() && refused.empty(); ++o) {
    if (r.output_from[o]) continue;
    if (auto leader = stream_leader(r.meta.outputs[o]))
      refused = "$.outputs[" + std::to_string(o) + "].name: stream '" + r.meta.outputs[o] +
                "' exists already (led by " + *leader + ")";
  }
  if (!diag.ok())
    return problem_with(make_error(Errc::invalid_argument, "the new network does not fit query '" + query + "'"),
                        diag);
  if (!boxes.ok()) return problem_for(boxes.error());
  if (!refused.empty()) return conflict(refused);
  return plan;
}

bool NodeImpl::name_generation(const std::string& query, const ClusterReplacePlan& plan, const std::string& body,
                               bool& stopped) {
  return edit_query_entry(*catalog_, query, [&](rapidjson::Document& d) {
    if (!d.HasMember("fragments") || !d["fragments"].IsArray() || d["fragments"].Size() != 1) return false;
    auto& a = d.GetAllocator();
    rapidjson::Value f(rapidjson::kObjectType);
    f.AddMember("name", rapidjson::Value(plan.generation.c_str(), a), a);
    f.AddMember("node", rapidjson::Value(config_.node.c_str(), a), a);
    rapidjson::Value ids(rapidjson::kArrayType);
    for (const auto& id : plan.to->box_ids()) ids.PushBack(rapidjson::Value(id.c_str(), a), a);
    f.AddMember("boxes", ids, a);
    rapidjson::Document b(&a);
    b.Parse(body.data(), body.size());
    f.AddMember("body", rapidjson::Value(b, a), a);
    d["fragments"][0] = f;
    rapidjson::Value outs(rapidjson::kArrayType);
    for (const auto& o : plan.r.meta.outputs) outs.PushBack(rapidjson::Value(o.c_str(), a), a);
    set_member(d, "outputs", std::move(outs));
    d.RemoveMember("replacing");
    stopped = d.HasMember("stopped") && d["stopped"].IsBool() && d["stopped"].GetBool();
    return true;
  }, config_.cluster.etcd_timeout_ms);
}

std::optional<std::string> NodeImpl::replacement_leftover(const std::string& name) const {
  // Only what etcd says now: a copy of the catalog may lag the deploy or
  // the replacement that made the stream.
  if (!catalog_ || etcd_problem()) return std::nullopt;
  auto e = catalog_->read("streams/" + name);
  if (!e.ok() || !*e) return std::nullopt;
  auto stream = stream_entry_from_json((*e)->value);
  if (!stream.ok() || !stream->meta.producer.starts_with("query:")) return std::nullopt;
  const std::string query = stream->meta.producer.substr(6);
  for (const auto& q : list_queries()) {
    const auto& outs = q->meta().outputs;
    if (q->meta().state_stream == name || std::find(outs.begin(), outs.end(), name) != outs.end())
      return std::nullopt;
  }
  // Its query runs (a query being deployed or deleted has streams its
  // entry does not name yet, or any more), no replacement under way.
  auto entry = cut_entry(query, true);
  if (!entry || entry->state != "running" || replacement_live(*entry)) return std::nullopt;
  if (std::find(entry->outputs.begin(), entry->outputs.end(), name) != entry->outputs.end()) return std::nullopt;
  for (const auto& [f, _] : entry->fragments)
    if (state_stream_name(engine::fragment_network_name(query, f)) == name) return std::nullopt;
  return query;
}

void NodeImpl::drop_streams_of_query(const std::string& query, const std::vector<std::string>& names) {
  for (const auto& name : names) {
    StreamPtr s;
    {
      std::unique_lock lock(catalog_mu_);
      auto it = streams_.find(name);
      if (it == streams_.end() || it->second->meta().producer != "query:" + query) {
        // Not here (led by a node that died): its entry goes, and with
        // it the followers' copies.
        lock.unlock();
        (void)catalog_->erase("streams/" + name);
        continue;
      }
      if (Status st = store_->erase(store::Cf::catalog, node_stream_key(name), store::Durability::synced); !st.ok()) {
        log_line(LogLevel::warn, "query", "dropping stream '" + name + "': " + st.error().message);
        continue;
      }
      s = it->second;
      streams_.erase(it);
    }
    s->close();
    if (Status st = store::StreamLog::drop(*store_, s->meta().id); !st.ok())
      log_line(LogLevel::warn, "query", "dropping the log of '" + name + "': " + st.error().message);
    // Its followers drop their copies with the entry.
    (void)catalog_->erase("streams/" + name);
  }
}

}  // namespace entente::broker::detail
