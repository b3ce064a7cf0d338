// Failover of a query's fragments (docs/cluster.md, "Failover of a query's
// fragments"). A fragment's outputs and its state stream (its journal and
// checkpoints) are replicated to the same followers; when the fragment's
// node is down, the controller passes the leadership of those streams to an
// in-sync follower (cluster_failover.cpp), and that node, now leading the
// fragment's state stream, runs the fragment: the same recovery as a
// restart (the last checkpoint, then the journal replayed in its order), so
// the outputs continue under the same sequence numbers and a reader drops
// nothing and sees nothing twice. The move is written into the query's
// catalog entry (a compare-and-set, so one node wins) with the reason.
//
// Around it: fragments reading an internal stream from the node that
// failed read it from its new leader; a node that comes back and finds its
// fragment placed elsewhere removes its own (stale) run of it.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iterator>
#include <map>
#include <set>

#include "broker/detail/json_out.h"
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




// How often a fragment that failed on its state stream is run again.
constexpr int64_t kRestartFailedMs = 5'000;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The outputs a fragment's PUT body declares (its network's outputs).
std::vector<std::string> outputs_of(const rapidjson::Value& body) {
  std::vector<std::string> out;
  if (!body.IsObject() || !body.HasMember("network") || !body["network"].IsObject()) return out;
  const auto& net = body["network"];
  if (!net.HasMember("outputs") || !net["outputs"].IsArray()) return out;
  for (const auto& o : net["outputs"].GetArray())
    if (o.IsObject() && o.HasMember("name") && o["name"].IsString()) out.emplace_back(o["name"].GetString());
  return out;
}

// The streams of this domain a fragment's network reads that are not
// internal streams (they must be led where the fragment runs).
std::vector<std::string> user_inputs_of(const rapidjson::Value& body, const std::string& domain) {
  std::vector<std::string> out;
  if (!body.IsObject() || !body.HasMember("network") || !body["network"].IsObject()) return out;
  const auto& net = body["network"];
  std::set<std::string> internal;
  if (body.HasMember("reads") && body["reads"].IsArray())
    for (const auto& r : body["reads"].GetArray())
      if (r.IsObject() && r.HasMember("stream") && r["stream"].IsString()) internal.insert(r["stream"].GetString());
  if (!net.HasMember("inputs") || !net["inputs"].IsArray()) return out;
  for (const auto& in : net["inputs"].GetArray()) {
    if (!in.IsObject() || !in.HasMember("name") || !in["name"].IsString()) continue;
    const std::string name = in["name"].GetString();
    if (internal.count(name)) continue;
    std::string stream = in.HasMember("stream") && in["stream"].IsString() ? in["stream"].GetString() : name;
    if (stream.rfind(domain + "/", 0) == 0) stream = stream.substr(domain.size() + 1);
    if (stream.find('/') != std::string::npos) continue;  // another domain's: imported
    out.push_back(stream);
  }
  return out;
}

}  // namespace

bool member_up(const cluster::MembershipView& view, const std::string& node) {
  for (const auto& m : view.members)
    if (m.record.node == node) return m.up;
  return false;
}

std::map<std::string, NodeImpl::FragmentGroup> NodeImpl::fragment_stream_groups() const {
  std::map<std::string, FragmentGroup> groups;
  if (!catalog_) return groups;
  for (const auto& e : catalog_->list("queries/")) {
    rapidjson::Document d;
    d.Parse(e.value.data(), e.value.size());
    if (d.HasParseError() || !d.IsObject() || !d.HasMember("fragments") || !d["fragments"].IsArray() ||
        !d.HasMember("query") || !d["query"].IsString())
      continue;
    const std::string query = d["query"].GetString();
    for (const auto& f : d["fragments"].GetArray()) {
      if (!f.IsObject() || !f.HasMember("name") || !f["name"].IsString() || !f.HasMember("body")) continue;
      FragmentGroup g;
      g.writes = outputs_of(f["body"]);
      g.writes.push_back(state_stream_name(engine::fragment_network_name(query, f["name"].GetString())));
      const auto inputs = user_inputs_of(f["body"], config_.domain);
      if (!inputs.empty()) g.input = inputs.front();
      for (const auto& m : g.writes) groups[m] = g;
    }
  }
  return groups;
}

void NodeImpl::take_over_fragments(const cluster::MembershipView& view) {
  if (!catalog_ || !catalog_->synced() || !peering_) return;
  std::lock_guard serial(takeover_serial_mu_);
  std::set<std::string> up;
  for (const auto& m : view.members)
    if (m.up) up.insert(m.record.node);
  for (const auto& e : catalog_->list("queries/")) {
    rapidjson::Document d;
    d.Parse(e.value.data(), e.value.size());
    if (d.HasParseError() || !d.IsObject() || !d.HasMember("fragments") || !d["fragments"].IsArray() ||
        !d.HasMember("query") || !d["query"].IsString())
      continue;
    if (!d.HasMember("state") || !d["state"].IsString() || std::string_view(d["state"].GetString()) != "running")
      continue;
    const std::string query = d["query"].GetString();
    auto& fragments = d["fragments"];
    for (rapidjson::SizeType i = 0; i < fragments.Size(); ++i) {
      auto& f = fragments[i];
      if (!f.IsObject() || !f.HasMember("name") || !f["name"].IsString() || !f.HasMember("node") ||
          !f["node"].IsString() || !f.HasMember("body") || !f["body"].IsObject())
        continue;
      const std::string name = f["name"].GetString();
      const std::string from = f["node"].GetString();
      // A fragment runs where its state stream is led: this node, after a
      // failover that moved the stream while its node was down (it may be
      // back by now, as a follower of the streams it led).
      if (from == config_.node) continue;
      const std::string runner = engine::fragment_network_name(query, name);
      const std::string state = state_stream_name(runner);
      // The node leading the fragment's state stream now runs it, once it
      // holds every stream the fragment writes and reads.
      auto state_leader = stream_leader(state);
      if (!state_leader || *state_leader != config_.node) continue;
      std::string missing;
      std::vector<std::string> needed = outputs_of(f["body"]);
      needed.push_back(state);
      for (const auto& s : needed)
        if (!find_stream(s) || stream_leader(s).value_or("") != config_.node) missing = s;
      for (const auto& s : user_inputs_of(f["body"], config_.domain))
        if (!find_stream(s) || stream_leader(s).value_or("") != config_.node) missing = s;
      if (!missing.empty()) {
        std::lock_guard lock(takeover_mu_);
        if (takeover_waiting_.insert(runner + "#" + missing).second)
          log_line(LogLevel::warn, "cluster", "fragment " + name + " of query '" + query + "' (on " + from + (up.count(from) ? "" : ", which is down") + ") waits for " +
                   config_.node + " to lead stream '" + missing + "' before running here");
        continue;
      }
      if (find_query(runner)) continue;
      // The move, in the entry: one node wins the compare-and-set.
      auto& alloc = d.GetAllocator();
      f["node"].SetString(config_.node.c_str(), static_cast<rapidjson::SizeType>(config_.node.size()), alloc);
      if (!d.HasMember("moves") || !d["moves"].IsArray()) {
        d.RemoveMember("moves");
        d.AddMember("moves", rapidjson::Value(rapidjson::kArrayType), alloc);
      }
      // Moved on request (cluster_moves.cpp): the source marked it.
      const bool requested = f.HasMember("moving") && f["moving"].IsString() &&
                             f["moving"].GetString() == config_.node;
      const std::string why =
          requested     ? "moved on request (POST /v1/queries/" + query + "/fragments/" + name + "/move)"
          : up.count(from) ? from + " was down (its etcd lease expired) and its streams failed over"
                           : from + " is down (its etcd lease expired)";
      f.RemoveMember("moving");
      rapidjson::Value move(rapidjson::kObjectType);
      move.AddMember("fragment", rapidjson::Value(name.c_str(), alloc), alloc);
      move.AddMember("from", rapidjson::Value(from.c_str(), alloc), alloc);
      move.AddMember("to", rapidjson::Value(config_.node.c_str(), alloc), alloc);
      move.AddMember("at_ms", rapidjson::Value(static_cast<int64_t>(now_ms())), alloc);
      move.AddMember("reason", rapidjson::Value(why.c_str(), alloc), alloc);
      // (Entries written before moves_total existed: the moves they kept.)
      const uint64_t total = d.HasMember("moves_total") && d["moves_total"].IsUint64() ? d["moves_total"].GetUint64()
                                                                                       : d["moves"].Size();
      d["moves"].PushBack(move, alloc);
      // The record stays bounded: the last 20 moves, and how many there were.
      while (d["moves"].Size() > 20) d["moves"].Erase(d["moves"].Begin());
      d.RemoveMember("moves_total");
      d.AddMember("moves_total", rapidjson::Value(total + 1), alloc);
      const std::string body = json_text(f["body"]);
      auto rev = catalog_->update(e.key, json_text(d), e.mod_revision);
      if (!rev.ok()) break;  // changed meanwhile: looked at again at the next tick
      log_line(LogLevel::info, "cluster", "fragment " + name + " of query '" + query + "': " + why + "; " + config_.node +
               " runs it from its replicated checkpoint and journal");
      if (requested) {
        metrics_.counter("entente_fragment_moves_total", "Fragments this node took over on request (a move)",
                         {{"query", query}})
            .inc();
      } else {
        metrics_
            .counter("entente_fragment_takeovers_total",
                     "Fragments this node took over from a node that was down", {{"query", query}})
            .inc();
      }
      QueryMeta meta;
      meta.name = runner;
      meta.query = query;
      meta.fragment = name;
      run_fragment(query, name, body, FragmentRun::takeover,
                   [this, meta](Result<std::shared_ptr<QueryRunner>> q, bool) {
                     if (q.ok()) {
                       log_line(LogLevel::info, "cluster", "fragment " + meta.name + " runs on " + config_.node + " (taken over)");
                       return;
                     }
                     if (fragment_lost(meta.name, q.error())) return;
                     // Tried again at each tick (run_placed_fragments); at
                     // once when a copy of an input it reads is being made.
                     log_line(LogLevel::warn, "cluster", "taking over fragment " + meta.name + " failed (tried again): " + q.error().message);
                     retry_soon_if_copying(q.error());
                   });
      break;  // the entry changed: the rest at the next look
    }
  }
}

void NodeImpl::retry_soon_if_copying(const Error& e) {
  if (e.code == Errc::unavailable && e.message.find(kNotCopiedYet) != std::string::npos && membership_)
    membership_->tick_soon();
}

std::string NodeImpl::fragment_body_of(const QueryMeta& meta) const {
  auto e = cut_entry(meta.query);
  if (!e) return {};
  rapidjson::Document d;
  d.Parse(e->json.data(), e->json.size());
  if (!d.IsObject() || !d.HasMember("fragments") || !d["fragments"].IsArray()) return {};
  for (const auto& f : d["fragments"].GetArray())
    if (f.IsObject() && f.HasMember("name") && f["name"].IsString() && f["name"].GetString() == meta.fragment &&
        f.HasMember("body") && f["body"].IsObject())
      return json_text(f["body"]);
  return {};
}

void NodeImpl::restart_fragment(const QueryMeta& meta, const std::string& why) {
  const std::string body = fragment_body_of(meta);
  if (body.empty()) return;
  if (Status st = detach_query(meta.name); !st.ok()) {
    log_line(LogLevel::warn, "cluster", "fragment " + meta.name + ": restarting it (" + why + "): " + st.error().message);
    return;
  }
  log_line(LogLevel::info, "cluster", "fragment " + meta.name + " restarts from its checkpoint and journal: " + why);
  rerun_fragment(meta, body);
}

void NodeImpl::rerun_fragment(const QueryMeta& meta, const std::string& body) {
  run_fragment(meta.query, meta.fragment, body, FragmentRun::takeover,
               [this, meta, body](Result<std::shared_ptr<QueryRunner>> r, bool) {
                 const std::string& name = meta.name;
                 const auto& inputs = meta.inputs;
                 {
                   std::lock_guard lock(takeover_mu_);
                   rerunning_.erase(name);
                 }
                 if (!r.ok()) {
                   if (fragment_lost(name, r.error())) return;
                   // Tried again at each tick while the catalog places it
                   // here (run_placed_fragments).
                   log_line(LogLevel::warn, "cluster", "restarting fragment " + name + " failed (tried again): " + r.error().message);
                   retry_soon_if_copying(r.error());
                   return;
                 }
                 // The mirrors it read before and reads no more (a
                 // follower's copy is the replication's to drop).
                 for (const auto& in : inputs) {
                   if (!in.starts_with("@") || is_replica(in)) continue;
                   const auto& now = (*r)->meta().inputs;
                   if (std::find(now.begin(), now.end(), in) == now.end()) (void)delete_import(in);
                 }
               });
}

bool NodeImpl::fragment_lost(const std::string& runner, const Error& e) {
  // Only an input trimmed past what the replay needs (QueryRunner::read_range):
  // other conflicts (a stream led elsewhere meanwhile) pass.
  if (e.code != Errc::conflict || e.message.find("is no longer in the log") == std::string::npos) return false;
  const std::string why = e.message +
                          "; the fragment cannot run from its checkpoint and journal, so it stays stopped (an "
                          "input read afresh on this node starts at the oldest tuple its owner still keeps): "
                          "delete the query and deploy it again";
  std::lock_guard lock(takeover_mu_);
  if (fragments_lost_.size() >= 1000 && !fragments_lost_.count(runner)) fragments_lost_.erase(fragments_lost_.begin());
  auto [it, added] = fragments_lost_.emplace(runner, why);
  if (added) log_line(LogLevel::warn, "cluster", "fragment " + runner + " cannot run on " + config_.node + ": " + why);
  return true;
}

void NodeImpl::run_placed_fragments() {
  if (!catalog_ || !catalog_->synced()) return;
  std::set<std::string> placed;  // the runners placed here
  for (const auto& e : catalog_->list("queries/")) {
    rapidjson::Document d;
    d.Parse(e.value.data(), e.value.size());
    if (d.HasParseError() || !d.IsObject() || !d.HasMember("fragments") || !d["fragments"].IsArray() ||
        !d.HasMember("query") || !d["query"].IsString() || !d.HasMember("state") || !d["state"].IsString() ||
        std::string_view(d["state"].GetString()) != "running")
      continue;
    const std::string query = d["query"].GetString();
    // Marked by a replacement of this node that is not under way (it
    // restarted meanwhile): the mark goes.
    if (d.HasMember("replacing") && d["replacing"].IsString() && d["replacing"].GetString() == config_.node) {
      bool under_way;
      {
        std::lock_guard lock(lifecycle_jobs_mu_);
        under_way = replacing_.count(query) != 0;
      }
      if (!under_way)
        (void)edit_query_entry(*catalog_, query, [this](rapidjson::Document& doc) {
          if (!doc.HasMember("replacing") || !doc["replacing"].IsString() ||
              doc["replacing"].GetString() != config_.node)
            return false;
          doc.RemoveMember("replacing");
          return true;
        }, config_.cluster.etcd_timeout_ms);
    }
    for (const auto& f : d["fragments"].GetArray()) {
      if (!f.IsObject() || !f.HasMember("name") || !f["name"].IsString() || !f.HasMember("node") ||
          !f["node"].IsString() || f["node"].GetString() != config_.node || !f.HasMember("body") ||
          !f["body"].IsObject())
        continue;
      // Run by a node of another domain (cluster_hosted.cpp): its results
      // come here through the relay, not from a run here. Without a run of
      // it here (this node restarted), taken back.
      if (f.HasMember("hosted")) {
        const std::string runner = engine::fragment_network_name(query, f["name"].GetString());
        if (!fragment_is_hosted(runner))
          take_back_after_restart(query, f["name"].GetString(), json_text(f["body"]), json_text(f["hosted"]));
        continue;
      }
      QueryMeta meta;
      meta.query = query;
      meta.fragment = f["name"].GetString();
      meta.name = engine::fragment_network_name(query, meta.fragment);
      placed.insert(meta.name);
      // Placed here, not running, its state here: a restart or a takeover
      // that failed, or a run removed on a stale copy of the catalog. (A
      // fragment being deleted has lost its state stream already.)
      if (!find_stream(state_stream_name(meta.name)) ||
          stream_leader(state_stream_name(meta.name)).value_or("") != config_.node)
        continue;
      if (auto q = find_query(meta.name)) {
        // Stopped or started through the entry by a request that did not
        // reach this node (cluster_lifecycle.cpp).
        const bool stopped = d.HasMember("stopped") && d["stopped"].IsBool() && d["stopped"].GetBool();
        if (const std::string state = q->info().state;
            (stopped && state == "running") || (!stopped && state == "stopped")) {
          agree_with_entry(query, meta.name, stopped);
          continue;
        }
        // Failed on its state stream (etcd away longer than the runner
        // waits, a follower's answer lost): run again from it, at most
        // every kRestartFailedMs, once etcd answers.
        const std::string state = q->info().state;
        if (!state.starts_with("failed: state stream") || etcd_problem()) continue;
        const int64_t now = now_ms();
        {
          std::lock_guard lock(takeover_mu_);
          int64_t& last = failed_restarts_[meta.name];
          if (now - last < kRestartFailedMs) continue;
          last = now;
        }
        restart_fragment(q->meta(), "it " + state.substr(0, 200));
        continue;
      }
      {
        std::lock_guard lock(takeover_mu_);
        // Never runs from its state (fragment_lost): not tried again.
        if (fragments_lost_.count(meta.name)) continue;
        if (!rerunning_.insert(meta.name).second) continue;  // under way
      }
      log_line(LogLevel::warn, "cluster", "fragment " + meta.name + " is placed on " + config_.node + " but does not run: running it");
      rerun_fragment(meta, json_text(f["body"]));
    }
  }
  // A lost fragment no longer placed here (its query deleted, or running
  // elsewhere) is forgotten.
  std::lock_guard lock(takeover_mu_);
  for (auto it = fragments_lost_.begin(); it != fragments_lost_.end();)
    it = placed.count(it->first) ? std::next(it) : fragments_lost_.erase(it);
}

void NodeImpl::follow_moved_reads() {
  if (!catalog_ || !catalog_->synced() || !peering_) return;
  for (const auto& q : list_queries()) {
    const QueryMeta meta = q->meta();
    if (meta.fragment.empty()) continue;
    for (auto i : meta.internal_inputs) {
      const std::string& mirror = meta.inputs[i];
      if (mirror.size() < 2 || mirror[0] != '@') continue;
      const size_t slash = mirror.find('/');
      if (slash == std::string::npos) continue;
      // The node the read goes to now: the mirror keeps the name of the
      // node it first read, but an earlier move may have redirected it.
      std::string node = mirror.substr(1, slash - 1);
      if (auto info = peering_->import_info(mirror); info && !info->node.empty()) node = info->node;
      const std::string stream = mirror.substr(slash + 1);
      auto e = catalog_->get("streams/" + stream);
      if (!e) continue;
      auto entry = stream_entry_from_json(e->value);
      if (!entry.ok() || entry->node == node) continue;
      const std::string& leader = entry->node;
      const bool follower = std::find(entry->replicas.begin(), entry->replicas.end(), config_.node) !=
                            entry->replicas.end();
      if (leader != config_.node && !follower) {
        (void)dial_domain_node(leader);
        if (Status st = peering_->redirect_internal_import(mirror, leader); !st.ok())
          log_line(LogLevel::warn, "cluster", "fragment " + meta.name + ": reading " + stream + " from " + leader + ": " + st.error().message);
        continue;
      }
      // Led here now (once the copy became the stream), or copied here
      // from its new leader (one channel per stream and node): the
      // fragment restarts reading that.
      if (leader == config_.node && !find_stream(stream)) continue;
      // (the restart)
      restart_fragment(meta, leader == config_.node
                                 ? config_.node + " leads " + stream + " now"
                                 : stream + " is led by " + leader + " now, whose copy this node holds");
      break;
    }
  }
}

void NodeImpl::drop_superseded_fragments() {
  if (!catalog_ || !catalog_->synced()) return;
  for (const auto& q : list_queries()) {
    const QueryMeta meta = q->meta();
    if (meta.fragment.empty()) continue;
    auto e = cut_entry(meta.query);
    if (!e) continue;
    std::string node;
    for (const auto& [fname, fnode] : e->fragments)
      if (fname == meta.fragment) node = fnode;
    if (node.empty() && meta.stopped && e->state == "running" && !replacement_live(*e)) {
      drop_replacement_leftover(meta, *e);
      continue;
    }
    if (node.empty() || node == config_.node) continue;
    // Only once that node runs it: a copy of the catalog that has not
    // seen this node's own takeover yet still names the node that died
    // (or, after a move on request, the node it came from, which is up).
    // The node leading the state stream runs the fragment: never this one.
    if (!membership_ || !member_up(membership_->view(), node)) continue;
    if (stream_leader(state_stream_name(meta.name)).value_or("") == config_.node) continue;
    // Taken over while this node was away: what it wrote since is in no
    // copy, and the streams are led elsewhere now.
    if (Status st = detach_query(meta.name); !st.ok()) {
      log_line(LogLevel::warn, "cluster", "fragment " + meta.name + " runs on " + node + " now; stopping it here: " + st.error().message);
      continue;
    }
    release_fragment_streams(meta);
    log_line(LogLevel::info, "cluster", "fragment " + meta.name + " runs on " + node + " now: this node's run of it is removed, its streams "
             "copied afresh as a follower's");
  }
}

void NodeImpl::drop_replacement_leftover(const QueryMeta& meta, const CutEntry& entry) {
  // The new network of a replacement this node did not live to finish
  // (cluster_replace.cpp): held, never started, named by no entry.
  if (Status st = detach_query(meta.name); !st.ok()) return;
  std::vector<std::string> streams{meta.state_stream};
  for (const auto& o : meta.outputs)
    if (std::find(entry.outputs.begin(), entry.outputs.end(), o) == entry.outputs.end()) streams.push_back(o);
  std::vector<std::string> here;  // led by no other node
  for (const auto& s : streams)
    if (stream_leader(s).value_or(config_.node) == config_.node) here.push_back(s);
  drop_streams_of_query(meta.query, here);
  log_line(LogLevel::info, "cluster", "fragment " + meta.name + ", the new network of a replacement this node did not "
                                      "finish, is removed");
}

void NodeImpl::release_fragment_streams(const QueryMeta& meta) {
  std::vector<std::string> streams = meta.outputs;
  streams.push_back(state_stream_name(meta.name));
  for (const auto& s : streams) {
    if (stream_leader(s).value_or(config_.node) == config_.node) continue;
    // Fragments here reading the old log stop, and run again reading the
    // stream where it is led (or this node's copy of it).
    std::vector<std::pair<QueryMeta, std::string>> readers;
    for (const auto& r : readers_of(s)) {
      const QueryMeta& m = r->meta();
      if (m.fragment.empty()) continue;
      std::string body = fragment_body_of(m);
      if (!body.empty() && detach_query(m.name).ok()) readers.emplace_back(m, std::move(body));
    }
    if (Status st = discard_stream(s); !st.ok() && st.error().code != Errc::not_found)
      log_line(LogLevel::warn, "cluster", "stream '" + s + "' is led elsewhere now; discarding this node's old log: " + st.error().message);
    for (const auto& [m, body] : readers) rerun_fragment(m, body);
  }
  for (auto i : meta.internal_inputs)
    if (meta.inputs[i].starts_with("@")) (void)delete_import(meta.inputs[i]);
}

Status NodeImpl::detach_query(const std::string& name) {
  std::shared_ptr<QueryRunner> q;
  {
    std::unique_lock lock(catalog_mu_);
    auto it = queries_.find(name);
    if (it == queries_.end()) return make_error(Errc::not_found, "no query '" + name + "'");
    q = it->second;
    ENTENTE_RETURN_IF_ERROR(store_->erase(store::Cf::catalog, node_query_key(name), store::Durability::synced));
    queries_.erase(it);
  }
  q->stop();
  return Status::Ok();
}

Status NodeImpl::discard_stream(const std::string& name) {
  StreamPtr s;
  {
    std::unique_lock lock(catalog_mu_);
    auto it = streams_.find(name);
    if (it == streams_.end()) return make_error(Errc::not_found, "no stream '" + name + "'");
    for (auto& [qn, q] : queries_)
      for (auto& in : q->meta().inputs)
        if (in == name)
          return make_error(Errc::conflict, "stream '" + name + "' is read by query '" + qn + "'");
    ENTENTE_RETURN_IF_ERROR(store_->erase(store::Cf::catalog, node_stream_key(name), store::Durability::synced));
    s = it->second;
    streams_.erase(it);
  }
  // (Only logs of streams led elsewhere now come here.)
  s->close_moved(stream_leader(name).value_or(""));
  return store::StreamLog::drop(*store_, s->meta().id);
}

}  // namespace entente::broker::detail
