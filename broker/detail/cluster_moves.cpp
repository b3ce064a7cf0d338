// A fragment slid to another node of its domain while it runs
// (docs/cluster.md, "Moving a fragment"): POST
// /v1/queries/{query}/fragments/{fragment}/move {"node": TARGET}.
//
// The move is a planned failover of the fragment's streams: the target
// becomes an in-sync follower of the fragment's state stream and outputs
// (it holds the fragment's checkpoints and journal before anything stops),
// the fragment checkpoints, stops here, and once the target holds every
// record this node wrote, the streams' leadership passes to it (epoch + 1,
// as a failover). The target then takes the fragment over exactly as after
// a failure (cluster_takeover.cpp): the last checkpoint, the journal after
// it, outputs continuing under the same sequence numbers. A step that
// fails before the leadership passes rolls back: the fragment runs here
// again from its own state stream. The move runs on its own thread, one at
// a time per node, since it waits on replication and on the target.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <optional>
#include <thread>

#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "cluster/catalog.h"
#include "cluster/membership.h"
#include "engine/fragments.h"
#include "federation/peering.h"
#include "rapidjson/document.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace entente::broker::detail {
namespace {

using Clock = std::chrono::steady_clock;

// Bounds of each wait of a move.
constexpr auto kFollowWait = std::chrono::seconds(30);    // the target catching up as a follower
constexpr auto kCheckpointWait = std::chrono::seconds(15);
constexpr auto kReplicatedWait = std::chrono::seconds(10);  // the last records reaching the followers
constexpr auto kReconnectWait = std::chrono::seconds(1);    // the target's copy reconnecting, in the pause
constexpr auto kTakeoverWait = std::chrono::seconds(30);    // the target running the fragment
constexpr size_t kMaxQueuedMoves = 16;
// A forwarded move's answer: the sum of the steps' bounds, and some.
constexpr int64_t kMoveAnswerWaitMs = 300'000;
// The target's standby: built and caught up (a large checkpoint restores
// in this time), then within this many journal entries of the source.
constexpr auto kWarmWait = std::chrono::seconds(60);
constexpr uint64_t kWarmSlack = 16;



double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

void NodeImpl::move_fragment_route(const http::Request& req, const PathParams& params, const http::Respond& answer) {
  const std::string& query = params.at(0);
  const std::string& fragment = params.at(1);
  if (!catalog_ || !membership_ || !peering_) {
    answer(http::Response::problem(409, "Conflict", "moving a fragment needs a domain of several nodes (a `cluster` "
                                                    "and a `federation` section)"));
    return;
  }
  // A node of another domain: hosting under a contract (cluster_hosting.cpp).
  if (host_fragment_route(req, params, answer)) return;
  rapidjson::Document d;
  d.Parse(req.body.data(), req.body.size());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("node") || !d["node"].IsString() ||
      d["node"].GetStringLength() == 0 || d["node"].GetStringLength() > 64) {
    answer(http::Response::problem(400, "Bad Request", "$.node: the node to move the fragment to (a string of 1 to "
                                                       "64 characters) is required"));
    return;
  }
  const std::string to = d["node"].GetString();
  auto entry = cut_entry(query, true);
  if (!entry) {
    answer(http::Response::problem(404, "Not Found", "no query '" + query.substr(0, 100) + "' cut into fragments in "
                                                     "domain " + config_.domain));
    return;
  }
  std::string from;
  for (const auto& [f, n] : entry->fragments)
    if (f == fragment) from = n;
  if (from.empty()) {
    std::string known;
    for (const auto& [f, _] : entry->fragments) known += (known.empty() ? "" : ", ") + f;
    answer(http::Response::problem(404, "Not Found", "query '" + query + "' has no fragment '" +
                                                     fragment.substr(0, 64) + "' (its fragments: " + known + ")"));
    return;
  }
  const cluster::MembershipView view = membership_->view();
  auto member = std::find_if(view.members.begin(), view.members.end(),
                             [&](const cluster::Member& m) { return m.record.node == to; });
  if (member == view.members.end()) {
    std::string known;
    for (const auto& m : view.members) known += (known.empty() ? "" : ", ") + m.record.node;
    answer(http::Response::problem(400, "Bad Request", "$.node: " + to + " is not a node of domain " + config_.domain +
                                                       " (its nodes: " + known + ")"));
    return;
  }
  if (auto refused = refuse_if_held(*entry, "moving fragment " + fragment)) {
    answer(std::move(*refused));
    return;
  }
  // Hosted in another domain (cluster_hosted.cpp): a move back to the node
  // that relays its results takes it back.
  if (fragment_hosted_in_entry(entry->json, fragment)) {
    if (from != config_.node) {
      forward(req, from, answer, std::nullopt, kMoveAnswerWaitMs);
      return;
    }
    if (to != config_.node) {
      answer(http::Response::problem(409, "Conflict", "fragment " + fragment + " of query '" + query +
                                                      "' runs in another domain for " + config_.node +
                                                      ": move it back to " + config_.node + " first"));
      return;
    }
    const std::string runner = engine::fragment_network_name(query, fragment);
    post_hosted([this, runner, answer] { answer(take_back(runner, "moved back on request")); });
    return;
  }
  if (to == from) {
    answer(http::Response::problem(409, "Conflict", "fragment " + fragment + " of query '" + query + "' runs on " +
                                                    to + " already"));
    return;
  }
  if (!member->up) {
    answer(http::Response::problem(503, "Service Unavailable", "$.node: " + to + " is down; nothing moved"));
    return;
  }
  // The move runs on the fragment's node; its steps are bounded (above),
  // and with a large state they take more than a forward's usual 30 s.
  if (from != config_.node) {
    forward(req, from, answer, std::nullopt, kMoveAnswerWaitMs);
    return;
  }
  auto q = find_query(engine::fragment_network_name(query, fragment));
  if (!q) {
    answer(http::Response::problem(409, "Conflict", "fragment " + fragment + " of query '" + query +
                                                    "' is placed on " + from + " but does not run there now; "
                                                    "nothing moved"));
    return;
  }
  // A fragment reading a stream appended by users runs where that stream
  // is led (the failover keeps them together): it moves with it, not alone.
  const QueryMeta meta = q->meta();
  for (size_t i = 0; i < meta.inputs.size(); ++i) {
    if (std::find(meta.internal_inputs.begin(), meta.internal_inputs.end(), i) != meta.internal_inputs.end()) continue;
    answer(http::Response::problem(409, "Conflict", "fragment " + fragment + " reads stream " + meta.inputs[i] +
                                                    ", which this node leads: a fragment reading a query input "
                                                    "runs next to it and cannot move without it"));
    return;
  }
  std::lock_guard lock(move_mu_);
  const std::string key = query + "/" + fragment;
  if (move_stopping_) {
    answer(http::Response::problem(503, "Service Unavailable", config_.node + " is stopping; nothing moved"));
    return;
  }
  if (moving_.count(key)) {
    answer(http::Response::problem(409, "Conflict", "fragment " + fragment + " of query '" + query +
                                                    "' is being moved already"));
    return;
  }
  if (move_queue_.size() >= kMaxQueuedMoves) {
    answer(http::Response::problem(503, "Service Unavailable", std::to_string(kMaxQueuedMoves) +
                                                               " moves wait on " + config_.node + " already; retry "
                                                               "later"));
    return;
  }
  moving_.insert(key);
  // The target's answers about the fragment are read with the caller's
  // credentials.
  http::Request get;
  get.method = "GET";
  get.target = get.path = "/v1/queries/" + query + "/fragments/" + fragment;
  get.remote = req.remote;
  for (const auto& h : req.headers)
    if (h.first == "authorization") get.headers.push_back(h);
  move_queue_.push_back(FragmentMove{query, fragment, to, std::move(get), answer});
  if (!move_thread_.joinable()) move_thread_ = std::thread([this] { move_loop(); });
  move_cv_.notify_one();
}

void NodeImpl::move_loop() {
  for (;;) {
    FragmentMove m;
    {
      std::unique_lock lock(move_mu_);
      move_cv_.wait(lock, [this] { return move_stopping_ || !move_queue_.empty(); });
      if (move_stopping_) {
        for (auto& left : move_queue_)
          left.answer(http::Response::problem(503, "Service Unavailable", config_.node + " is stopping; nothing "
                                                                          "moved"));
        move_queue_.clear();
        return;
      }
      m = std::move(move_queue_.front());
      move_queue_.pop_front();
    }
    http::Response r = run_move(m);
    {
      std::lock_guard lock(move_mu_);
      moving_.erase(m.query + "/" + m.fragment);
    }
    m.answer(std::move(r));
  }
}

void NodeImpl::stop_moves() {
  {
    std::lock_guard lock(move_mu_);
    move_stopping_ = true;
  }
  move_cv_.notify_all();
  if (move_thread_.joinable()) move_thread_.join();
}

bool NodeImpl::move_wait(Clock::duration bound, const std::function<bool()>& done) {
  const auto until = Clock::now() + bound;
  for (;;) {
    if (done()) return true;
    {
      std::lock_guard lock(move_mu_);
      if (move_stopping_) return false;
    }
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

Result<bool> NodeImpl::edit_stream_entry(const std::string& stream, const std::function<bool(StreamEntry&)>& edit) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto e = catalog_->get("streams/" + stream);
    if (!e) return make_error(Errc::not_found, "stream '" + stream + "' has no catalog entry");
    auto parsed = stream_entry_from_json(e->value);
    if (!parsed.ok()) return parsed.error();
    StreamEntry next = *parsed;
    if (!edit(next)) return false;
    auto rev = catalog_->update(e->key, stream_catalog_entry(next), e->mod_revision);
    if (rev.ok()) {
      catalog_->wait_for(*rev, config_.cluster.etcd_timeout_ms);
      return true;
    }
    if (rev.error().code != Errc::conflict) return rev.error();
  }
  return make_error(Errc::unavailable, "stream '" + stream + "': its catalog entry kept changing");
}

bool NodeImpl::mark_fragment_moving(const std::string& query, const std::string& fragment, const std::string& to) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto e = catalog_->get("queries/" + query);
    if (!e) return false;
    rapidjson::Document d;
    d.Parse(e->value.data(), e->value.size());
    if (d.HasParseError() || !d.IsObject() || !d.HasMember("fragments") || !d["fragments"].IsArray()) return false;
    for (auto& f : d["fragments"].GetArray()) {
      if (!f.IsObject() || !f.HasMember("name") || !f["name"].IsString() || f["name"].GetString() != fragment)
        continue;
      f.RemoveMember("moving");
      if (!to.empty()) f.AddMember("moving", rapidjson::Value(to.c_str(), d.GetAllocator()), d.GetAllocator());
    }
    auto rev = catalog_->update(e->key, json_text(d), e->mod_revision);
    if (rev.ok()) {
      catalog_->wait_for(*rev, config_.cluster.etcd_timeout_ms);
      return true;
    }
  }
  return false;
}

void NodeImpl::record_move_pause(const std::string& query, const std::string& fragment, const std::string& to,
                                 double pause_ms) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    auto e = catalog_->get("queries/" + query);
    if (!e) return;
    rapidjson::Document d;
    d.Parse(e->value.data(), e->value.size());
    if (d.HasParseError() || !d.IsObject() || !d.HasMember("moves") || !d["moves"].IsArray()) return;
    auto& moves = d["moves"];
    // The last move of the fragment, written by the target's take-over.
    rapidjson::Value* last = nullptr;
    for (auto& mv : moves.GetArray())
      if (mv.IsObject() && mv.HasMember("fragment") && mv["fragment"].IsString() && mv["fragment"].GetString() == fragment)
        last = &mv;
    if (!last || !last->HasMember("to") || !(*last)["to"].IsString() || (*last)["to"].GetString() != to ||
        last->HasMember("pause_ms"))
      return;
    last->AddMember("pause_ms", rapidjson::Value(pause_ms), d.GetAllocator());
    if (catalog_->update(e->key, json_text(d), e->mod_revision).ok()) return;
  }
}

bool NodeImpl::in_sync_everywhere(const std::vector<std::string>& streams, const std::string& node) const {
  for (const auto& s : streams) {
    auto e = catalog_->get("streams/" + s);
    if (!e) return false;
    auto parsed = stream_entry_from_json(e->value);
    if (!parsed.ok() || !contains(parsed->in_sync, node)) return false;
  }
  return true;
}

Status NodeImpl::move_follow(const std::vector<std::string>& streams, const std::string& to,
                             std::vector<std::string>& added) {
  for (const auto& s : streams) {
    auto r = edit_stream_entry(s, [&](StreamEntry& e) {
      if (e.node != config_.node || contains(e.replicas, to)) return false;
      e.replicas.push_back(to);
      return true;
    });
    if (!r.ok()) return make_error(r.error().code, "making " + to + " a follower of " + s + ": " + r.error().message);
    if (*r) added.push_back(s);
  }
  if (!move_wait(kFollowWait, [&] { return in_sync_everywhere(streams, to); }))
    return make_error(Errc::unavailable, to + " did not catch up with the fragment's streams within " +
                                             std::to_string(std::chrono::seconds(kFollowWait).count()) + " s");
  return Status::Ok();
}

void NodeImpl::undo_move_follow(const std::vector<std::string>& added, const std::string& to) {
  for (const auto& s : added)
    (void)edit_stream_entry(s, [&](StreamEntry& e) {
      auto it = std::find(e.replicas.begin(), e.replicas.end(), to);
      if (it == e.replicas.end()) return false;
      e.replicas.erase(it);
      e.in_sync.erase(std::remove(e.in_sync.begin(), e.in_sync.end(), to), e.in_sync.end());
      return true;
    });
}

Status NodeImpl::move_checkpoint(QueryRunner& q) {
  auto done = std::make_shared<std::promise<Result<CheckpointInfo>>>();
  auto got = done->get_future();
  q.request_checkpoint([done](const Result<CheckpointInfo>& r) { done->set_value(r); });
  if (got.wait_for(kCheckpointWait) != std::future_status::ready)
    return make_error(Errc::unavailable, "the fragment did not checkpoint within " +
                                             std::to_string(std::chrono::seconds(kCheckpointWait).count()) + " s");
  if (auto r = got.get(); !r.ok())
    return make_error(r.error().code, "checkpointing the fragment: " + r.error().message);
  return Status::Ok();
}

Status NodeImpl::move_replicate(const std::vector<std::string>& streams, const std::string& to) {
  // The in-sync set keeps a follower that died until an append waits for
  // it too long, and none comes while the fragment is stopped: a target
  // whose copy's channel has closed (killed, or its link cut) is not
  // waited for nor handed the streams, since if it does not come back no
  // one is in sync to take them over and the fragment would stop until it
  // does. A channel that reopens at once (a link redialed) is waited for,
  // briefly: the fragment is stopped meanwhile.
  std::string closed;
  auto connected = [&] {
    for (const auto& s : streams) {
      bool open = false;
      if (auto states = replica_states(s))
        for (const auto& r : *states)
          if (r.node == to) open = r.connected;
      if (!open) {
        closed = s;
        return false;
      }
    }
    return true;
  };
  std::optional<Clock::time_point> closed_since;
  auto gone = [&] {
    if (connected()) {
      closed_since.reset();
      return false;
    }
    if (!closed_since) closed_since = Clock::now();
    return Clock::now() - *closed_since >= kReconnectWait;
  };
  auto gone_error = [&] {
    return make_error(Errc::unavailable, to + "'s copy of " + closed + " is not connected (" + to +
                                             " died or the link to it is down)");
  };
  for (const auto& s : streams) {
    StreamPtr st = find_stream(s);
    if (!st || st->committed_next() <= 1) continue;
    auto released = std::make_shared<std::promise<Status>>();
    auto f = released->get_future();
    when_replicated(s, st->committed_next() - 1, [released](const Status& r) { released->set_value(r); });
    const auto until = Clock::now() + kReplicatedWait;
    while (f.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready) {
      if (gone()) return gone_error();
      if (Clock::now() >= until) return make_error(Errc::unavailable, s + " did not reach its followers");
    }
    if (Status r = f.get(); !r.ok()) return make_error(r.error().code, s + ": " + r.error().message);
  }
  // A target that fell out of an in-sync set meanwhile (an acknowledgement
  // late under load) joins it again once it holds the log, which grows no
  // more: it is waited for.
  bool lost = false;
  if (!move_wait(kReplicatedWait, [&] { return (lost = gone()) || in_sync_everywhere(streams, to); }) || lost)
    return lost ? gone_error()
                : make_error(Errc::unavailable, to + " is not in the in-sync sets of the fragment's streams");
  closed_since.reset();
  if (!move_wait(kReconnectWait, connected)) return gone_error();
  return Status::Ok();
}

Status NodeImpl::move_hand_over(const std::vector<std::string>& streams, const std::string& to,
                                const std::string& what) {
  // Every stream of the fragment passes in one transaction (one etcd write
  // in the pause, and never half of them), each only if its entry is the
  // one read: this node leads it and `to` is in sync.
  for (int attempt = 0; attempt < 5; ++attempt) {
    std::vector<cluster::Catalog::Update> updates;
    std::string why;
    for (const auto& s : streams) {
      // The cached entries first; after a conflict, etcd's own.
      std::optional<cluster::CatalogEntry> e;
      if (attempt == 0) {
        e = catalog_->get("streams/" + s);
      } else if (auto fresh = catalog_->read("streams/" + s); fresh.ok()) {
        e = std::move(*fresh);
      }
      auto parsed = e ? stream_entry_from_json(e->value) : Result<StreamEntry>(make_error(Errc::not_found, "gone"));
      if (!parsed.ok() || parsed->node != config_.node || !contains(parsed->in_sync, to)) {
        why = !parsed.ok() ? "its entry is " + parsed.error().message
                           : parsed->node != config_.node ? "it is led by " + parsed->node + " now"
                                                          : to + " is not in its in-sync set";
        why = s + ": " + why;
        break;
      }
      StreamEntry next = *parsed;
      next.node = to;
      next.epoch += 1;
      next.lease = 0;  // the new leader records its own
      next.replicas.erase(std::remove(next.replicas.begin(), next.replicas.end(), to), next.replicas.end());
      next.replicas.push_back(config_.node);  // this node follows it from now on
      next.in_sync.clear();
      updates.push_back({e->key, stream_catalog_entry(next), e->mod_revision});
    }
    if (!why.empty()) return make_error(Errc::unavailable, "passing the leadership to " + to + ": " + why);
    auto rev = catalog_->update_all(updates);
    if (rev.ok()) {
      catalog_->wait_for(*rev, config_.cluster.etcd_timeout_ms);
      return Status::Ok();
    }
    if (rev.error().code != Errc::conflict)
      return make_error(rev.error().code, "passing the leadership to " + to + ": " + rev.error().message);
    // An entry changed under it (an in-sync set updated): read again.
  }
  log_line(LogLevel::warn, "cluster", what + ": the entries of its streams kept changing");
  return make_error(Errc::unavailable, "passing the leadership to " + to + ": the entries of the fragment's streams "
                                       "kept changing");
}

http::Response NodeImpl::standby_request(const FragmentMove& m, const std::string& method) {
  http::Request r = m.get;
  r.method = method;
  r.target = r.path = m.get.path + "/standby";
  auto answered = std::make_shared<std::promise<http::Response>>();
  auto f = answered->get_future();
  forward(r, m.to, [answered](http::Response resp) { answered->set_value(std::move(resp)); });
  if (f.wait_for(std::chrono::seconds(5)) != std::future_status::ready)
    return http::Response::problem(504, "Gateway Timeout", m.to + " did not answer within 5 s");
  return f.get();
}

namespace {

// A forward's answer that the target did not give: it could not be
// reached (502) or did not answer in time (504). The target's own
// refusals (409, 503, ...) are answers.
bool unreachable(const http::Response& r) { return r.status == 502 || r.status == 504; }

}  // namespace

Status NodeImpl::move_warm(const FragmentMove& m, const QueryRunner& q) {
  http::Response r = standby_request(m, "POST");
  if (r.status != 200 && r.status != 202)
    return make_error(unreachable(r) ? Errc::io_error : Errc::unavailable,
                      "no standby on " + m.to + ": " + std::to_string(r.status) + " " + r.body);
  std::string last;
  bool gone = false;
  const bool caught_up = move_wait(kWarmWait, [&] {
    http::Response g = standby_request(m, "GET");
    if (unreachable(g)) {
      last = std::to_string(g.status) + " " + g.body;
      gone = true;
      return true;
    }
    rapidjson::Document d;
    d.Parse(g.body.data(), g.body.size());
    if (g.status != 200 || !d.IsObject() || !d.HasMember("state") || !d["state"].IsString() ||
        !d.HasMember("journal_next") || !d["journal_next"].IsUint64()) {
      last = std::to_string(g.status) + " " + g.body;
      return g.status == 404;  // gone: stop waiting
    }
    last = json_text(d);
    if (std::string_view(d["state"].GetString()) == "failed") return true;
    return std::string_view(d["state"].GetString()) == "warm" &&
           d["journal_next"].GetUint64() + kWarmSlack >= q.journal_next();
  });
  if (gone) return make_error(Errc::io_error, m.to + " does not answer: " + last);
  if (!caught_up || last.find(R"("state":"warm")") == std::string::npos)
    return make_error(Errc::unavailable, "the standby on " + m.to + " did not catch up within " +
                                             std::to_string(std::chrono::seconds(kWarmWait).count()) + " s: " + last);
  return Status::Ok();
}

bool NodeImpl::move_await_target(const FragmentMove& m, bool warm) {
  // The take-over continued from the standby: the target says so at once
  // (asking the runner itself waits for the run it is in, catching up).
  if (warm) {
    bool fell_back = false;
    const bool promoted = move_wait(kTakeoverWait, [&] {
      http::Response g = standby_request(m, "GET");
      if (g.status == 200 && g.body.find(R"("state":"promoted")") != std::string::npos) return true;
      fell_back = g.status == 404;  // taken but not promoted: a recovery
      return fell_back;
    });
    if (promoted && !fell_back) return true;
  }
  // take_over_fragments on the target records the move in the entry.
  auto placed_there = [&] {
    auto e = cut_entry(m.query);
    if (!e) return false;
    for (const auto& [f, n] : e->fragments)
      if (f == m.fragment) return n == m.to;
    return false;
  };
  if (!move_wait(kTakeoverWait, placed_there)) return false;
  return move_wait(kTakeoverWait, [&] {
    auto answered = std::make_shared<std::promise<http::Response>>();
    auto f = answered->get_future();
    forward(m.get, m.to, [answered](http::Response r) { answered->set_value(std::move(r)); });
    if (f.wait_for(std::chrono::seconds(2)) != std::future_status::ready) return false;
    http::Response r = f.get();
    return r.status == 200 && r.body.find(R"("state":"running")") != std::string::npos;
  });
}

http::Response NodeImpl::run_move(const FragmentMove& m) {
  const auto t0 = Clock::now();
  const std::string runner = engine::fragment_network_name(m.query, m.fragment);
  const std::string what = "moving fragment " + m.fragment + " of query '" + m.query + "' to " + m.to;
  auto failed = [&](int status, const std::string& why) {
    log_line(LogLevel::info, "cluster", what + ": " + why);
    return http::Response::problem(status, status == 503 ? "Service Unavailable" : "Conflict", why);
  };
  // Each step is logged as it starts: after a fault (this node or the
  // target killed, their link cut) the log says where the move was.
  auto step = [&](const char* name) { log_line(LogLevel::info, "cluster", what + ": step " + name); };
  auto q = find_query(runner);
  if (!q) return failed(409, "the fragment does not run on " + config_.node + " now; nothing moved");
  const QueryMeta meta = q->meta();
  const std::string body = fragment_body_of(meta);
  if (body.empty()) return failed(409, "the query's catalog entry has no body for the fragment; nothing moved");
  // The state stream first: it decides where the fragment runs.
  std::vector<std::string> streams{state_stream_name(runner)};
  for (const auto& o : meta.outputs) streams.push_back(o);

  // 1. The target holds every stream of the fragment, in sync: the
  // checkpoints and journal reach it before anything stops. 2. A
  // checkpoint now: the target replays only what follows it.
  std::vector<std::string> added;
  step("follow");
  if (Status st = move_follow(streams, m.to, added); !st.ok()) {
    undo_move_follow(added, m.to);
    return failed(503, st.error().message + "; nothing moved");
  }
  const auto t_sync = Clock::now();
  step("checkpoint");
  if (Status st = move_checkpoint(*q); !st.ok()) {
    undo_move_follow(added, m.to);
    return failed(503, st.error().message + "; nothing moved");
  }
  const auto t_checkpoint = Clock::now();
  // The target rebuilds the state from that checkpoint and follows the
  // journal while the fragment still runs here; without a standby it
  // restores the checkpoint after the pause instead (longer).
  step("warm");
  Status warm = move_warm(m, *q);
  // A target that does not answer at all (killed, or its node stopping)
  // would be handed a fragment it cannot run: nothing stopped yet, so
  // nothing moves.
  if (!warm.ok() && warm.error().code == Errc::io_error) {
    (void)standby_request(m, "DELETE");
    undo_move_follow(added, m.to);
    return failed(503, warm.error().message + "; nothing moved");
  }
  if (!warm.ok()) {
    log_line(LogLevel::warn, "cluster", what + ": " + warm.error().message + "; the target restores the checkpoint after the pause");
    (void)standby_request(m, "DELETE");
  }
  const auto t_warm = Clock::now();
  auto undo = [&] {
    if (warm.ok()) (void)standby_request(m, "DELETE");
    undo_move_follow(added, m.to);
  };

  // 3. It stops here. From now on a failure runs it here again.
  step("mark");
  if (!mark_fragment_moving(m.query, m.fragment, m.to)) {
    undo();
    return failed(503, "the query's catalog entry could not be updated; nothing moved");
  }
  const auto t_stopping = Clock::now();
  step("stop");
  if (Status st = detach_query(runner); !st.ok()) {
    (void)mark_fragment_moving(m.query, m.fragment, "");
    undo();
    return failed(503, "stopping the fragment here: " + st.error().message + "; nothing moved");
  }
  const auto t_stop = Clock::now();
  // 4. The target holds every record this node wrote. 5. The leadership
  // passes.
  step("replicate");
  Status st = move_replicate(streams, m.to);
  const auto t_replicated = Clock::now();
  if (st.ok()) step("hand_over");
  if (st.ok()) st = move_hand_over(streams, m.to, what);
  if (!st.ok()) {
    (void)mark_fragment_moving(m.query, m.fragment, "");
    // The streams failed over meanwhile (this node's lease expired under
    // load): the new leader takes the fragment over, as after any failover.
    const std::string leader = stream_leader(streams.front()).value_or(config_.node);
    if (leader != config_.node) {
      undo();
      return failed(503, st.error().message + "; the fragment's streams failed over to " + leader +
                             " meanwhile, which takes it over from its checkpoint and journal");
    }
    rerun_fragment(meta, body);
    undo();
    return failed(503, st.error().message + "; the fragment runs on " + config_.node + " again");
  }
  const auto t_handover = Clock::now();
  log_line(LogLevel::info, "cluster", what + ": " + m.to + " leads its streams; it takes the fragment over");
  step("take_over");

  // 6. The target runs it. 7. This node's logs of the fragment's streams,
  // and its reads of other nodes, go: it copies the streams afresh as a
  // follower.
  const bool running = move_await_target(m, warm.ok());
  const auto t_run = Clock::now();
  release_fragment_streams(meta);
  // GET /v1/queries/{q} shows it with the move.
  if (running) record_move_pause(m.query, m.fragment, m.to, ms_between(t_stop, t_run));

  JsonOut j;
  j.begin_object();
  j.key("query").str(m.query).key("fragment").str(m.fragment).key("from").str(config_.node).key("to").str(m.to);
  j.key("state").str(running ? "moved" : "handed over");
  // The fragment ran nowhere from its stop here to its start there.
  j.key("pause_ms").dbl(ms_between(t_stop, t_run));
  j.key("steps_ms").begin_object();
  j.key("follow").dbl(ms_between(t0, t_sync)).key("checkpoint").dbl(ms_between(t_sync, t_checkpoint));
  j.key("warm").dbl(ms_between(t_checkpoint, t_warm));
  j.key("mark").dbl(ms_between(t_warm, t_stopping)).key("stop").dbl(ms_between(t_stopping, t_stop));
  j.key("replicate").dbl(ms_between(t_stop, t_replicated)).key("hand_over").dbl(ms_between(t_replicated, t_handover));
  j.key("take_over").dbl(ms_between(t_handover, t_run));
  j.end_object();
  j.key("warm_standby").boolean(warm.ok());
  j.key("total_ms").dbl(ms_between(t0, t_run));
  j.end_object();
  log_line(LogLevel::info, "cluster", what + ": " + (running ? "done" : "handed over, not yet running there") + ", paused " +
           std::to_string(static_cast<int64_t>(ms_between(t_stop, t_run))) + " ms");
  return http::Response::json(running ? 200 : 202, j.take());
}

}  // namespace entente::broker::detail
