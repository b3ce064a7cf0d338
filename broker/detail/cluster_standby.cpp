// Warm standbys of fragments being moved to this node (docs/cluster.md,
// "Moving a fragment"). While a fragment still runs on its node, the move
// asks this node, a follower of the fragment's state stream and outputs,
// for a standby: the fragment built over those copies, its last checkpoint
// restored and the journal replayed as it grows (QueryRunner::warm), its
// outputs counted, never written. When the leadership of the streams
// passes here, the take-over promotes the standby instead of restoring the
// checkpoint then: the state was rebuilt before the pause, so the pause
// does not grow with it.
//
//   POST   /v1/queries/{q}/fragments/{f}/standby  builds one (202) or says
//                                                 how far it is (200; once
//                                                 the take-over continued
//                                                 from it, "promoted")
//   GET    the same path                          how far it is
//   DELETE the same path                          drops it (a move rolled back)
//
// One thread warms every standby of the node in turn; a standby nobody
// asked about for kStandbyIdle is dropped (its move gave up).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "cluster/catalog.h"
#include "engine/fragments.h"

namespace entente::broker::detail {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxStandbys = 16;
constexpr auto kStandbyIdle = std::chrono::seconds(120);
constexpr auto kStandbyPeriod = std::chrono::milliseconds(2);

}  // namespace

http::Response NodeImpl::standby_status(const std::string& query, const std::string& fragment, int code) {
  const std::string runner = engine::fragment_network_name(query, fragment);
  std::lock_guard lock(standby_mu_);
  auto it = standbys_.find(runner);
  if (it == standbys_.end())
    return http::Response::problem(404, "Not Found", "no standby of fragment " + fragment.substr(0, 64) +
                                                         " of query '" + query.substr(0, 100) + "' on " +
                                                         config_.node);
  it->second.touched = Clock::now();
  JsonOut j;
  j.begin_object().key("query").str(query).key("fragment").str(fragment).key("node").str(config_.node);
  const Standby& s = it->second;
  j.key("state").str(s.promoted  ? "promoted"
                     : s.taken   ? "taking_over"
                     : !s.runner ? (s.error.empty() ? "building" : "failed")
                                 : s.error.empty() ? "warm" : "waiting");
  j.key("journal_next").u64(s.journal_next);
  if (!s.error.empty()) j.key("error").str(s.error);
  j.end_object();
  return http::Response::json(code, j.take());
}

void NodeImpl::standby_route(const http::Request& req, const PathParams& params, const http::Respond& answer) {
  const std::string& query = params.at(0);
  const std::string& fragment = params.at(1);
  const std::string runner = engine::fragment_network_name(query, fragment);
  if (req.method == "GET") {
    answer(standby_status(query, fragment, 200));
    return;
  }
  if (req.method == "DELETE") {
    std::shared_ptr<QueryRunner> dropped;
    {
      std::lock_guard lock(standby_mu_);
      auto it = standbys_.find(runner);
      if (it == standbys_.end()) {
        answer(standby_status(query, fragment, 404));
        return;
      }
      dropped = it->second.runner;
      standbys_.erase(it);
    }
    if (dropped) drop_standby(dropped);
    answer(http::Response{204, "application/json", "", {}});
    return;
  }
  if (!catalog_ || !peering_) {
    answer(http::Response::problem(409, "Conflict", "a standby needs a domain of several nodes"));
    return;
  }
  bool known = false;
  {
    std::lock_guard lock(standby_mu_);
    auto it = standbys_.find(runner);
    if (it != standbys_.end() && !it->second.runner && !it->second.taken &&
        (it->second.promoted || !it->second.error.empty())) {
      standbys_.erase(it);  // it failed, or served a move before: built again
      it = standbys_.end();
    }
    known = it != standbys_.end();
    if (!known && standby_stopping_) {
      answer(http::Response::problem(503, "Service Unavailable", config_.node + " is stopping"));
      return;
    }
    if (!known && standbys_.size() >= kMaxStandbys) {
      answer(http::Response::problem(503, "Service Unavailable", std::to_string(kMaxStandbys) +
                                                                 " standbys warm on " + config_.node +
                                                                 " already; retry later"));
      return;
    }
  }
  if (known) {
    answer(standby_status(query, fragment, 200));
    return;
  }
  if (auto refused = build_standby(query, fragment)) {
    answer(std::move(*refused));
    return;
  }
  answer(standby_status(query, fragment, 202));
}

std::optional<http::Response> NodeImpl::build_standby(const std::string& query, const std::string& fragment) {
  const std::string runner = engine::fragment_network_name(query, fragment);
  auto entry = cut_entry(query, true);
  std::string placed;
  if (entry)
    for (const auto& [f, n] : entry->fragments)
      if (f == fragment) placed = n;
  if (placed.empty())
    return http::Response::problem(404, "Not Found", "no fragment " + fragment.substr(0, 64) + " of query '" +
                                                         query.substr(0, 100) + "' in domain " + config_.domain);
  if (placed == config_.node || find_query(runner))
    return http::Response::problem(409, "Conflict", "fragment " + fragment + " of query '" + query + "' runs on " +
                                                        config_.node + " already");
  QueryMeta meta;
  meta.name = runner;
  meta.query = query;
  meta.fragment = fragment;
  const std::string body = fragment_body_of(meta);
  if (body.empty())
    return http::Response::problem(409, "Conflict", "the query's catalog entry has no body for fragment " + fragment);
  {
    std::lock_guard lock(standby_mu_);
    if (!standbys_.count(runner)) standbys_[runner] = Standby{nullptr, 0, {}, Clock::now()};
    standby_cv_.notify_all();
    if (!standby_thread_.joinable()) standby_thread_ = std::thread([this] { standby_loop(); });
  }
  run_fragment(query, fragment, body, FragmentRun::standby, [this, runner](Result<std::shared_ptr<QueryRunner>> r, bool) {
    std::lock_guard lock(standby_mu_);
    auto it = standbys_.find(runner);
    if (it == standbys_.end() || it->second.runner) {
      if (r.ok()) (*r)->stop();  // dropped meanwhile
      return;
    }
    if (!r.ok()) {
      it->second.error = r.error().message;
      log_line(LogLevel::warn, "cluster", "a standby of fragment " + runner + " cannot be built here: " + r.error().message);
      return;
    }
    it->second.runner = *r;
    standby_cv_.notify_all();
  });
  return std::nullopt;
}

std::shared_ptr<QueryRunner> NodeImpl::take_standby(const std::string& name) {
  std::lock_guard lock(standby_mu_);
  auto it = standbys_.find(name);
  if (it == standbys_.end() || !it->second.runner) return nullptr;
  auto runner = std::move(it->second.runner);
  it->second.runner = nullptr;
  it->second.taken = true;
  return runner;
}

void NodeImpl::standby_taken(const std::string& name, bool promoted) {
  std::lock_guard lock(standby_mu_);
  auto it = standbys_.find(name);
  if (it == standbys_.end() || !it->second.taken) return;
  if (!promoted) {
    standbys_.erase(it);
    return;
  }
  it->second.taken = false;
  it->second.promoted = true;
  it->second.touched = Clock::now();
}

void NodeImpl::standby_loop() {
  for (;;) {
    std::vector<std::pair<std::string, std::shared_ptr<QueryRunner>>> work;
    std::vector<std::shared_ptr<QueryRunner>> idle;
    {
      std::unique_lock lock(standby_mu_);
      // Asleep while there is nothing to warm (a node that was a move's
      // target once would otherwise wake 500 times a second for good).
      standby_cv_.wait(lock, [this] { return standby_stopping_ || !standbys_.empty(); });
      standby_cv_.wait_for(lock, kStandbyPeriod, [this] { return standby_stopping_; });
      if (standby_stopping_) return;
      const auto now = Clock::now();
      for (auto it = standbys_.begin(); it != standbys_.end();) {
        if (now - it->second.touched > kStandbyIdle) {
          log_line(LogLevel::warn, "cluster", "the standby of fragment " + it->first + " was not asked about for " +
                   std::to_string(std::chrono::seconds(kStandbyIdle).count()) + " s: dropped");
          if (it->second.runner) idle.push_back(it->second.runner);
          it = standbys_.erase(it);
          continue;
        }
        if (it->second.runner) work.emplace_back(it->first, it->second.runner);
        ++it;
      }
    }
    for (auto& r : idle) drop_standby(r);
    std::vector<std::shared_ptr<QueryRunner>> stopped;  // could not go on
    for (const auto& [name, runner] : work) {
      auto r = runner->warm();
      std::lock_guard lock(standby_mu_);
      auto it = standbys_.find(name);
      if (it == standbys_.end() || it->second.runner != runner) continue;  // taken or dropped meanwhile
      if (r.ok()) {
        it->second.journal_next = *r;
        it->second.error.clear();
        continue;
      }
      it->second.error = r.error().message;
      if (r.error().code == Errc::unavailable) continue;  // an input range not copied yet
      // It cannot go on (its copy lost records it had not read): the move
      // builds a new one when it asks again.
      log_line(LogLevel::warn, "cluster", "the standby of fragment " + name + " stops: " + r.error().message);
      it->second.runner = nullptr;
      stopped.push_back(runner);
    }
    for (auto& r : stopped) drop_standby(r);
  }
}

void NodeImpl::drop_standby(const std::shared_ptr<QueryRunner>& runner) {
  runner->stop();
  // The reads of other nodes' streams it opened (a move rolled back, or
  // gave up), unless a fragment here reads them too: an import nobody
  // reads would hold the producer's retention for nothing.
  const QueryMeta& meta = runner->meta();
  auto another_standby_reads = [&](const std::string& in) {
    std::lock_guard lock(standby_mu_);
    for (const auto& [_, s] : standbys_) {
      if (!s.runner || s.runner == runner) continue;
      const auto& ins = s.runner->meta().inputs;
      if (std::find(ins.begin(), ins.end(), in) != ins.end()) return true;
    }
    return false;
  };
  for (auto i : meta.internal_inputs) {
    const std::string& in = meta.inputs[i];
    if (!in.starts_with("@") || is_replica(in) || !readers_of(in).empty() || another_standby_reads(in)) continue;
    if (Status st = delete_import(in); !st.ok() && st.error().code != Errc::not_found)
      log_line(LogLevel::warn, "cluster", "the standby of fragment " + meta.name + " is dropped; its read " + in + " stays: " +
               st.error().message);
  }
}

void NodeImpl::stop_standbys() {
  std::map<std::string, Standby> left;
  {
    std::lock_guard lock(standby_mu_);
    standby_stopping_ = true;
    left.swap(standbys_);
  }
  standby_cv_.notify_all();
  if (standby_thread_.joinable()) standby_thread_.join();
  for (auto& [_, s] : left)
    if (s.runner) s.runner->stop();
}

}  // namespace entente::broker::detail
