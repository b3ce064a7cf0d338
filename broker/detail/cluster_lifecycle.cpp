// Stopping and starting a query of a domain of several nodes (docs/cluster.md,
// "Stopping and starting a query"). Every query there runs as fragments
// (a whole query as a cut of one), each on its node, perhaps with a warm
// standby on another and a node ready to take it over. The domain's
// catalog says whether the query is stopped, so that every one of them
// agrees:
//
//   1. The node the request reaches writes "stopped": true (or removes it)
//      in the query's entry, by compare-and-set on what etcd holds now.
//   2. It asks each fragment's node to stop (or start) its run of the
//      fragment: POST /v1/queries/{query}/fragments/{fragment}/stop|start.
//      A run stops as a whole query of one node does (QueryRunner::pause):
//      what it consumed reaches its outputs, and a checkpoint is taken in
//      its state stream, which its followers hold.
//   3. A node that did not get the request (down, cut off) agrees with the
//      entry at its next membership tick (run_placed_fragments); a node
//      taking a fragment over (a failover, a move) reads the entry and
//      recovers the fragment stopped (FragmentOf::stopped).
//
// A stopped query keeps its place: a move, a split or a merge of one of
// its fragments is refused until it starts again, and a query with a
// fragment hosted in another domain is not stopped (the host's run is
// not stopped by this domain's nodes): its fragment is moved back first.

#include <deque>
#include <memory>
#include <mutex>

#include "broker/detail/json_out.h"
#include "broker/detail/node_calls.h"
#include "broker/detail/node_impl.h"
#include "cluster/catalog.h"
#include "engine/fragments.h"
#include "rapidjson/document.h"

namespace entente::broker::detail {
namespace {

using namespace node_calls;

std::string query_key_of(std::string_view name) { return "queries/" + std::string(name); }

}  // namespace

std::optional<http::Response> NodeImpl::refuse_if_held(const CutEntry& entry, const std::string& what,
                                                       bool stopped_too) const {
  const std::string query = query_of_entry(entry);
  if (replacement_live(entry))
    return http::Response::problem(409, "Conflict", "query '" + query + "' is having its network replaced (on " +
                                                        entry.replacing + "): " + what + " waits until that is done");
  if (!stopped_too || !entry.stopped) return std::nullopt;
  return http::Response::problem(409, "Conflict", "query '" + query + "' is stopped: " + what +
                                                      " waits until it is started (POST /v1/queries/" + query +
                                                      "/start)");
}

std::string NodeImpl::busy_fragment_of(const std::string& entry_json) {
  rapidjson::Document d;
  d.Parse(entry_json.data(), entry_json.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("fragments") || !d["fragments"].IsArray()) return {};
  for (const auto& f : d["fragments"].GetArray()) {
    if (!f.IsObject() || !f.HasMember("name") || !f["name"].IsString()) continue;
    const std::string name = f["name"].GetString();
    const std::string node = f.HasMember("node") && f["node"].IsString() ? f["node"].GetString() : "";
    if (f.HasMember("hosted"))
      return "fragment " + name + " runs in another domain under a hosting contract, which this domain's nodes "
             "do not stop: move it back to " + node + " first (POST /v1/queries/{name}/fragments/" + name +
             "/move {\"node\": \"" + node + "\"})";
    if (f.HasMember("moving") && f["moving"].IsString())
      return "fragment " + name + " is moving to " + f["moving"].GetString() + "; try again once it has moved";
  }
  return {};
}

Result<CutEntry> NodeImpl::set_cut_stopped(const std::string& query, bool stopped) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    // What etcd holds now: this node's copy may lag a move's or a
    // failover's write, and the compare-and-set would only fail on it.
    ENTENTE_ASSIGN_OR_RETURN(auto e, catalog_->read(query_key_of(query)));
    if (!e) return make_error(Errc::not_found, "no query '" + query + "' in domain " + config_.domain);
    rapidjson::Document d;
    d.Parse(e->value.data(), e->value.size());
    if (d.HasParseError() || !d.IsObject())
      return make_error(Errc::corrupt, "query '" + query + "': its catalog entry does not parse");
    d.RemoveMember("stopped");
    if (stopped) d.AddMember("stopped", true, d.GetAllocator());
    const std::string text = json_text(d);
    auto rev = text == e->value ? Result<int64_t>(e->mod_revision) : catalog_->update(e->key, text, e->mod_revision);
    if (rev.ok()) {
      catalog_->wait_for(*rev, config_.cluster.etcd_timeout_ms);
      auto written = cut_entry(query);
      if (!written || written->revision < *rev) {
        // This node's copy has not caught up: the entry as written.
        written = cut_entry(query, true);
      }
      if (!written) return make_error(Errc::not_found, "query '" + query + "' was deleted meanwhile");
      return std::move(*written);
    }
    if (rev.error().code != Errc::conflict) return rev.error();
  }
  return make_error(Errc::unavailable, "query '" + query + "': its catalog entry kept changing; try again");
}

bool NodeImpl::cluster_lifecycle(const http::Request& req, const std::string& name, bool stop,
                                 const http::Respond& answer) {
  if (find_query(name)) return false;  // a whole query of this node
  auto entry = cut_entry(name, true);
  if (!entry) return forward_query_if_elsewhere(req, name, answer);
  const char* verb = stop ? "stopping" : "starting";
  if (auto why = etcd_problem()) {
    answer(unavailable(std::string(verb) + " a query waits for the domain's catalog in etcd, which this node "
                       "cannot reach now (" + *why + ")"));
    return true;
  }
  if (entry->state != "running") {
    answer(http::Response::problem(409, "Conflict", "query '" + name + "' is " + entry->state + "; " + verb +
                                                        " it waits until it runs"));
    return true;
  }
  if (auto refused = refuse_if_held(*entry, std::string(verb) + " it", /*stopped_too=*/false)) {
    answer(std::move(*refused));
    return true;
  }
  if (std::string busy = busy_fragment_of(entry->json); !busy.empty()) {
    answer(http::Response::problem(409, "Conflict", std::string(verb) + " query '" + name + "': " + busy));
    return true;
  }
  auto written = set_cut_stopped(name, stop);
  if (!written.ok()) {
    answer(written.error().code == Errc::unavailable ? unavailable(std::string(verb) + " query '" + name + "': " +
                                                                   written.error().message)
                                                     : problem_for(written.error()));
    return true;
  }
  // Every fragment's node, at once; the answer once all of them said.
  struct Join {
    std::mutex mu;
    size_t left;
    std::string failed;  // "fragment F on N: why; ..."
  };
  auto join = std::make_shared<Join>();
  join->left = written->fragments.size();
  const http::Request caller = sub_request(req, "GET", "/", "");
  auto entry_now = std::make_shared<CutEntry>(std::move(written).value());
  for (const auto& [fname, fnode] : entry_now->fragments) {
    http::Request call = sub_request(caller, "POST", fragment_target(name, fname) + (stop ? "/stop" : "/start"), "");
    forward(call, fnode, [this, join, entry_now, caller, answer, name, stop, fname = fname, fnode = fnode](
                             http::Response r) {
      {
        std::lock_guard lock(join->mu);
        if (!success(r))
          join->failed += (join->failed.empty() ? "" : "; ") + ("fragment " + fname + " on " + fnode + ": " +
                                                                 std::to_string(r.status) + " " + detail_of(r));
        if (--join->left != 0) return;
      }
      if (join->failed.empty()) {
        get_cut_query(caller, *entry_now, answer);
        return;
      }
      // Said in the catalog all the same: the nodes that did not answer
      // agree with it at their next tick, or on taking a fragment over.
      answer(unavailable("query '" + name + "' is marked " + (stop ? "stopped" : "started") + " in domain " +
                         config_.domain + "'s catalog, and the nodes that did not answer follow that within a few "
                         "seconds; not yet done: " + join->failed.substr(0, 1000) + ". Retry to see it done"));
    });
  }
  return true;
}

// ------------------------------------------------- a fragment on its node

void NodeImpl::stop_fragment_route(const http::Request&, const PathParams& params, const http::Respond& answer) {
  fragment_lifecycle(params.at(0), params.at(1), true, answer);
}

void NodeImpl::start_fragment_route(const http::Request&, const PathParams& params, const http::Respond& answer) {
  fragment_lifecycle(params.at(0), params.at(1), false, answer);
}

void NodeImpl::fragment_lifecycle(const std::string& query, const std::string& fragment, bool stop,
                                  const http::Respond& answer) {
  const std::string runner = engine::fragment_network_name(query, fragment);
  if (!find_query(runner)) {
    answer(http::Response::problem(404, "Not Found", "no fragment " + fragment.substr(0, 40) + " of query '" +
                                                         query.substr(0, 100) + "' runs on " + config_.node));
    return;
  }
  // Off the network thread: a stop waits for a checkpoint that the state
  // stream's followers hold.
  const bool posted = post_lifecycle([this, runner, stop, answer] {
    auto q = stop ? stop_query(runner) : start_query(runner);
    if (!q.ok()) answer(problem_for(q.error()));
    else answer(http::Response::json(200, query_json(*q, config_.domain + "/" + config_.node, peering_.get())));
  });
  if (!posted) answer(unavailable(config_.node + " is stopping"));
}

void NodeImpl::agree_with_entry(const std::string& query, const std::string& runner, bool stopped) {
  {
    std::lock_guard lock(lifecycle_jobs_mu_);
    // One at a time per runner: the tick comes again before it is done.
    if (!lifecycle_pending_.insert(runner).second) return;
  }
  const bool posted = post_lifecycle([this, query, runner, stopped] {
    struct Done {
      NodeImpl* node;
      const std::string& runner;
      ~Done() {
        std::lock_guard lock(node->lifecycle_jobs_mu_);
        node->lifecycle_pending_.erase(runner);
      }
    } done{this, runner};
    // What etcd says now: this node's copy of the entry may lag a start
    // or a stop that another node just wrote.
    auto entry = cut_entry(query, true);
    if (!entry || entry->stopped != stopped) return;
    auto q = find_query(runner);
    if (!q) return;
    const std::string state = q->info().state;
    if (state != (stopped ? "running" : "stopped")) return;  // agrees already, or failed
    auto r = stopped ? stop_query(runner) : start_query(runner);
    if (r.ok())
      log_line(LogLevel::info, "query", "fragment " + runner + " " + (stopped ? "stopped" : "started") +
                                            " as its query's catalog entry says (the request did not reach " +
                                            config_.node + ")");
    else
      log_line(LogLevel::warn, "query", std::string(stopped ? "stopping" : "starting") + " fragment " + runner +
                                            " as its query's catalog entry says: " + r.error().message);
  });
  if (!posted) {
    std::lock_guard lock(lifecycle_jobs_mu_);
    lifecycle_pending_.erase(runner);
  }
}

// ------------------------------------------------------------ the worker

bool NodeImpl::post_lifecycle(std::function<void()> job) {
  std::lock_guard lock(lifecycle_jobs_mu_);
  if (lifecycle_stopping_) return false;
  lifecycle_jobs_.push_back(std::move(job));
  if (!lifecycle_thread_.joinable()) {
    lifecycle_thread_ = std::thread([this] {
      for (;;) {
        std::function<void()> next;
        {
          std::unique_lock lock(lifecycle_jobs_mu_);
          lifecycle_cv_.wait(lock, [this] { return lifecycle_stopping_ || !lifecycle_jobs_.empty(); });
          if (lifecycle_jobs_.empty()) return;  // stopping, nothing left
          next = std::move(lifecycle_jobs_.front());
          lifecycle_jobs_.pop_front();
        }
        next();
      }
    });
  }
  lifecycle_cv_.notify_one();
  return true;
}

void NodeImpl::stop_lifecycle() {
  {
    std::lock_guard lock(lifecycle_jobs_mu_);
    lifecycle_stopping_ = true;
  }
  lifecycle_cv_.notify_all();
  if (lifecycle_thread_.joinable()) lifecycle_thread_.join();
}

}  // namespace entente::broker::detail
