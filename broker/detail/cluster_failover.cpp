// Failover of stream leaders (docs/cluster.md, "Failover"): when the node
// leading a replicated stream is down (its etcd lease expired), the
// controller names the first up member of the stream's in-sync set leader,
// with a compare-and-set on the catalog entry that raises its epoch. That
// follower's copy holds every acknowledged tuple (an append is answered
// only once every in-sync member holds it), so it becomes the stream: same
// log, same sequence numbers, same remembered producers.
//
// Fencing. A follower pulls its copy from the node the catalog names, so a
// deposed leader cannot push anything into the new epoch. What remains is a
// deposed leader answering its own publishers: it acknowledges an append
// only while (1) the catalog names it, and (2) its etcd lease is current and
// is the lease recorded in the entry. A failover needs the lease to have
// expired, and a node whose lease expired registers under a new id: before
// it acknowledges again it must write that id into the entry, a
// compare-and-set that fails if a failover changed the entry meanwhile.

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "broker/detail/node_impl.h"
#include "cluster/catalog.h"
#include "cluster/membership.h"
#include "federation/peering.h"

namespace entente::broker::detail {
namespace {

std::string key_of(const std::string& stream) { return "streams/" + stream; }

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// The node a fragment's streams (`members`) move to from `down`: one that
// already leads some of them since (a pass that moved only part of them),
// else the first node up in the in-sync set of every member `down` leads;
// empty when there is none (they wait together).
std::string group_successor(const std::vector<std::string>& members, const std::map<std::string, StreamEntry>& by_name,
                            const std::set<std::string>& up, const std::string& down) {
  std::vector<const StreamEntry*> left;
  for (const auto& m : members) {
    auto it = by_name.find(m);
    if (it == by_name.end()) return {};  // not all there yet
    if (it->second.node != down && up.count(it->second.node)) {
      const std::string& moved = it->second.node;
      // Moved already: the rest follow if they can.
      for (const auto& other : members) {
        const StreamEntry& o = by_name.at(other);
        if (o.node == down && !contains(o.in_sync, moved)) return {};
      }
      return moved;
    }
    if (it->second.node == down) left.push_back(&it->second);
  }
  if (left.empty()) return {};
  for (const auto& n : left.back()->in_sync) {
    if (!up.count(n)) continue;
    bool everywhere = true;
    for (const StreamEntry* e : left) everywhere &= contains(e->in_sync, n);
    if (everywhere) return n;
  }
  return {};
}

}  // namespace

std::optional<Error> NodeImpl::leadership_fence(const std::string& stream) const {
  if (!catalog_ || !membership_) return std::nullopt;
  const std::string retry = "; the batch is not acknowledged: retry it under its producer number";
  // Just started and not read the catalog yet: the stream's log here may
  // be one a failover superseded while this node was away.
  if (catalog_->revision() == 0) {
    const std::string why = catalog_->problem();
    return Error{Errc::unavailable, config_.node + " has not read the domain's catalog yet" +
                                        (why.empty() ? std::string() : " (" + why + ")") +
                                        ", so it does not know who leads stream '" + stream + "'" + retry};
  }
  auto e = catalog_->get(key_of(stream));
  if (!e) return std::nullopt;
  auto parsed = stream_entry_from_json(e->value);
  if (!parsed.ok()) return std::nullopt;
  if (parsed->node != config_.node) {
    return Error{Errc::unavailable, "stream '" + stream + "' is led by " + parsed->node + " now (epoch " +
                                        std::to_string(parsed->epoch) + "), not by " + config_.node + retry};
  }
  if (parsed->replicas.empty()) return std::nullopt;  // no one could take it over
  const int64_t lease = membership_->lease_id();
  if (lease == 0) {
    return Error{Errc::unavailable, config_.node + " cannot confirm its lease in etcd, so another node may lead "
                                                   "stream '" + stream + "' by now" + retry};
  }
  if (parsed->lease != lease) {
    return Error{Errc::unavailable, config_.node + " registered again in etcd and is confirming that it still "
                                                   "leads stream '" + stream + "'" + retry};
  }
  return std::nullopt;
}

void NodeImpl::confirm_leadership() {
  const int64_t lease = membership_->lease_id();
  if (lease == 0 || !catalog_->synced()) return;
  for (const auto& e : catalog_->list("streams/")) {
    auto parsed = stream_entry_from_json(e.value);
    if (!parsed.ok() || parsed->node != config_.node || parsed->replicas.empty() || parsed->lease == lease) continue;
    StreamEntry next = *parsed;
    next.lease = lease;
    // Fails when a failover (or anything) changed the entry since it was
    // read: the next look sees who leads.
    // Not waited for: this may run on the catalog's watch, which brings the
    // change (and with it the acknowledgements) when it comes.
    (void)catalog_->update(e.key, stream_catalog_entry(next), e.mod_revision);
  }
}

void NodeImpl::fail_over_streams(const cluster::MembershipView& view) {
  if (!view.is_controller || !catalog_->synced()) return;
  std::set<std::string> up;
  for (const auto& m : view.members)
    if (m.up) up.insert(m.record.node);
  const auto entries = catalog_->list("streams/");
  std::map<std::string, StreamEntry> by_name;
  for (const auto& e : entries) {
    auto parsed = stream_entry_from_json(e.value);
    if (parsed.ok()) by_name[parsed->meta.name] = *parsed;
  }
  // A fragment's streams move together: the node that takes them over
  // runs the fragment, and its copy of the state stream must be the one
  // that holds the journal of its copies of the outputs.
  const auto groups = fragment_stream_groups();
  for (const auto& e : entries) {
    auto parsed = stream_entry_from_json(e.value);
    if (!parsed.ok() || parsed->replicas.empty() || up.count(parsed->node)) continue;
    const std::string& name = parsed->meta.name;
    std::string chosen;
    if (auto g = groups.find(name); g != groups.end()) {
      chosen = group_successor(g->second.writes, by_name, up, parsed->node);
    } else {
      for (const auto& n : parsed->in_sync)
        if (up.count(n)) {
          chosen = n;
          break;
        }
    }
    if (chosen.empty()) {
      // Only a member of the in-sync set is sure to hold every
      // acknowledged tuple: the stream waits for its leader.
      std::lock_guard lock(failover_mu_);
      if (failover_waiting_.insert(name + "#" + std::to_string(parsed->epoch)).second) {
        base::logf(LogLevel::warn, "cluster",
                     "stream '%s' waits for its leader %s: no member of its in-sync set is up to take "
                     "it over\n", name.c_str(), parsed->node.c_str());
      }
      continue;
    }
    StreamEntry next = *parsed;
    next.node = chosen;
    next.epoch = parsed->epoch + 1;
    next.lease = 0;  // the new leader records its own
    next.replicas.clear();
    for (const auto& r : parsed->replicas)
      if (r != chosen) next.replicas.push_back(r);
    next.replicas.push_back(parsed->node);  // it comes back as a follower
    // The other followers copy the new leader's log afresh; each joins the
    // set again once it holds all of it.
    next.in_sync.clear();
    auto rev = catalog_->update(e.key, stream_catalog_entry(next), e.mod_revision);
    if (!rev.ok()) continue;  // changed meanwhile: looked at again next tick
    base::logf(LogLevel::warn, "cluster", "stream '%s': leader %s is down; %s leads it from epoch %llu\n", name.c_str(),
                 parsed->node.c_str(), chosen.c_str(), static_cast<unsigned long long>(next.epoch));
    metrics_
        .counter("entente_stream_failovers_total",
                 "Times the controller passed a stream's leadership to a follower because its leader was down",
                 {{"stream", name}})
        .inc();
  }
  join_split_groups(groups, by_name, up);
}

void NodeImpl::join_split_groups(const std::map<std::string, FragmentGroup>& groups,
                                 const std::map<std::string, StreamEntry>& by_name, const std::set<std::string>& up) {
  // A fragment's streams led by two nodes, or apart from the query input
  // it reads (a failover moved some while the others' follower was out of
  // their in-sync set, and their leader came back): they move to the
  // input's leader (else the state stream's) once that node is in their
  // in-sync sets again, and the fragment is taken over there. Their leader
  // is up: it is deposed as a failover would (epoch + 1), and its run of
  // the fragment, fenced already, gives them up.
  std::set<std::string> seen;
  for (const auto& [stream, group] : groups) {
    const std::string& state = group.writes.back();
    if (!seen.insert(state).second) continue;
    auto s = by_name.find(state);
    if (s == by_name.end() || !up.count(s->second.node)) continue;
    std::string target = s->second.node;
    // A fragment reading a query input runs where that input is led: the
    // group goes there (the input's followers are the group's).
    if (!group.input.empty()) {
      auto in = by_name.find(group.input);
      if (in != by_name.end() && up.count(in->second.node)) target = in->second.node;
    }
    for (const auto& m : group.writes) {
      auto it = by_name.find(m);
      if (it == by_name.end() || it->second.node == target || !up.count(it->second.node) ||
          !contains(it->second.in_sync, target))
        continue;
      auto e = catalog_->get("streams/" + m);
      if (!e) continue;
      auto parsed = stream_entry_from_json(e->value);
      if (!parsed.ok() || parsed->node != it->second.node) continue;
      StreamEntry next = *parsed;
      next.node = target;
      next.epoch = parsed->epoch + 1;
      next.lease = 0;
      next.replicas.clear();
      for (const auto& r : parsed->replicas)
        if (r != target) next.replicas.push_back(r);
      next.replicas.push_back(parsed->node);
      next.in_sync.clear();
      if (!catalog_->update(e->key, stream_catalog_entry(next), e->mod_revision).ok()) continue;
      base::logf(LogLevel::info, "cluster", "stream '%s': %s leads it from epoch %llu, with the rest of its fragment's "
                           "streams (%s led it)\n", m.c_str(), target.c_str(),
                   static_cast<unsigned long long>(next.epoch), parsed->node.c_str());
    }
  }
}

void NodeImpl::reconcile_leadership() {
  if (!catalog_ || !catalog_->synced() || !peering_) return;
  std::lock_guard serial(leadership_mu_);
  for (const auto& e : catalog_->list("streams/")) {
    auto parsed = stream_entry_from_json(e.value);
    if (!parsed.ok() || parsed->replicas.empty()) continue;
    const std::string& name = parsed->meta.name;
    if (parsed->node == config_.node) {
      if (find_stream(name)) continue;
      // The copy this node kept of the stream, under the name of the
      // leader it copied from.
      const std::string mirror = replica_of(name);
      if (mirror.empty() || !find_stream(mirror)) continue;
      // Fragments here reading the copy stop while it becomes the stream,
      // and run again reading the stream (cluster_takeover.cpp).
      std::vector<std::pair<QueryMeta, std::string>> readers;
      for (const auto& q : list_queries()) {
        const QueryMeta& m = q->meta();
        if (m.fragment.empty() || std::find(m.inputs.begin(), m.inputs.end(), mirror) == m.inputs.end()) continue;
        std::string body = fragment_body_of(m);
        if (!body.empty() && detach_query(m.name).ok()) readers.emplace_back(m, std::move(body));
      }
      // Nothing more from the old leader.
      if (Status st = peering_->forget_import(mirror); !st.ok() && st.error().code != Errc::not_found) {
        for (const auto& [m, body] : readers) rerun_fragment(m, body);
        continue;
      }
      auto s = adopt_replica(mirror, parsed->meta);
      for (const auto& [m, body] : readers) rerun_fragment(m, body);
      if (s.ok()) confirm_leadership();  // acknowledges from now on
      if (!s.ok()) {
        base::logf(LogLevel::info, "cluster", "stream '%s': taking over from copy %s: %s\n", name.c_str(), mirror.c_str(),
                     s.error().message.c_str());
        continue;
      }
      base::logf(LogLevel::info, "cluster", "stream '%s': this node leads it from epoch %llu, its log through sequence "
                           "number %llu (copied from %s)\n", name.c_str(),
                   static_cast<unsigned long long>(parsed->epoch),
                   static_cast<unsigned long long>((*s)->committed_next() - 1), mirror.c_str());
      continue;
    }
    if (!contains(parsed->replicas, config_.node)) continue;
    // This node led the stream before a failover: what it holds past the
    // new leader's log was never acknowledged. It is discarded, and the
    // stream copied again from the new leader.
    StreamPtr s = find_stream(name);
    if (!s || s->meta().producer != "api") continue;
    if (Status st = delete_stream(name, parsed->node); !st.ok()) {
      base::logf(LogLevel::info, "cluster", "stream '%s' is led by %s now; this node's old log stays until %s\n",
                   name.c_str(), parsed->node.c_str(), st.error().message.c_str());
      continue;
    }
    base::logf(LogLevel::warn, "cluster", "stream '%s' is led by %s since epoch %llu: this node's old log is discarded "
                         "and the stream copied again as a follower\n", name.c_str(), parsed->node.c_str(),
                 static_cast<unsigned long long>(parsed->epoch));
  }
}

}  // namespace entente::broker::detail
