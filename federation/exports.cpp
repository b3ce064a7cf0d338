#include "federation/exports.h"

#include <algorithm>

#include "contracts/canonical.h"
#include "contracts/contract.h"
#include "contracts/ledger.h"
#include "engine/codec.h"
#include "federation/acknowledgements.h"
#include "federation/detail/common.h"
#include "federation/messages.h"
#include "federation/metering.h"
#include "federation/rate_limiter.h"
#include "federation/wire.h"

namespace entente::federation {
namespace {

using detail::wall_clock_ms;

// Channels ended by this node (a contract no longer in force) whose late
// acknowledgements are still charged, at most this many at once.
constexpr size_t kMaxEndedChannels = 1024;

}  // namespace

Exports::Exports(Host& host, ExportSender::Context ctx, Options options)
    : host_(host), ctx_(ctx), options_(std::move(options)) {}

Exports::~Exports() { stop(); }

void Exports::stop() {
  std::vector<std::shared_ptr<ExportSender>> senders;
  {
    std::lock_guard lock(mu_);
    for (auto& [k, s] : senders_) senders.push_back(s);
    senders_.clear();
  }
  for (auto& s : senders) s->stop();
}

size_t Exports::open_channels() const {
  std::lock_guard lock(mu_);
  return senders_.size();
}

std::vector<std::pair<std::string, std::shared_ptr<RateLimiter>>> Exports::limiters() const {
  std::lock_guard lock(mu_);
  return {limiters_.begin(), limiters_.end()};
}

// ---------------------------------------------------------------------------
// OPEN, in steps: decode, what permits it, the stream, its terms, where to
// start; then OPEN_OK and the sender.

void Exports::on_open(const certs::Identity& peer, uint32_t channel, std::string_view payload) {
  auto open = decode_open(payload);
  if (!open.ok()) {
    refuse(peer, channel, "", {WireError::protocol, open.error().message, false});
    return;
  }
  {
    std::lock_guard lock(mu_);
    if (senders_.count({peer.uri(), channel})) {
      refuse(peer, channel, open->stream,
             {WireError::protocol, "channel " + std::to_string(channel) + " is in use", false});
      return;
    }
  }
  const certs::Identity& self = options_.self;
  auto parts = detail::split_stream(open->stream);
  if (!parts || parts->first != self.domain) {
    refuse(peer, channel, open->stream,
           {WireError::not_found,
            "this node is " + self.uri() + "; it serves streams of domain " + self.domain + ", not " + open->stream,
            false});
    return;
  }
  const std::string& name = parts->second;
  // A node of this domain: the link authenticated it under the domain's
  // own CA; nothing is metered between the nodes of one domain.
  const bool internal = peer.domain == self.domain;
  // The consumer holds everything before from_seq, whatever the answer: what
  // it received of that under a contract is charged now, even when this
  // OPEN is refused (the contract ended while tuples were in flight).
  if (open->from_seq > 1 && !internal) ctx_.metering.charge_through(name, peer.domain, open->from_seq - 1, false);
  Permit permit;
  if (internal) {
    // The whole stream: every field, every tuple, the owner's numbers.
  } else if (auto refused = permit_for(peer, open->stream, name, permit)) {
    refuse(peer, channel, open->stream, *refused);
    return;
  }
  // A follower copying the stream reads up to what the log holds; every
  // other reader up to what the followers hold (docs/cluster.md).
  HostStreamPtr stream = internal ? host_.find_stream_to_copy(name, peer.node) : nullptr;
  if (!stream) stream = host_.find_stream(name);
  if (!stream) {
    refuse(peer, channel, open->stream, not_here(peer, open->stream, name));
    return;
  }
  ExportSender::Terms terms;
  if (auto refused = terms_for(permit, *stream, open->stream, terms)) {
    refuse(peer, channel, open->stream, *refused);
    return;
  }
  Position at{};
  if (auto refused = position_for(*stream, open->stream, open->from_seq, at)) {
    refuse(peer, channel, open->stream, *refused);
    return;
  }
  // The consumer holds everything before `from`: what it received of that
  // on an earlier channel is charged now, what came after is sent again.
  if (!internal) ctx_.metering.charge_through(name, peer.domain, at.from - 1, true);
  terms.party = detail::ack_party(self.domain, peer.domain, peer.node);
  // A node of this domain copies the publishers' names with the tuples, so
  // that its copy answers their retries as this node would once it leads
  // the stream (docs/cluster.md); a peer of version 2 gets plain DATA, and
  // another domain never learns who publishes here.
  terms.names = internal && ctx_.wire.version(peer) >= 3;
  // And it holds it durably: an ACK lost with the earlier channel counts
  // now (a follower's copy is then known to be complete).
  if (open->from_seq > 1) ctx_.acks.record(name, terms.party, open->from_seq - 1);
  OpenOk ok;
  ok.schema_json = engine::schema_to_json(*terms.schema);
  ok.first_seq = std::max<uint64_t>(at.first_retained, 1);
  ok.next_seq = std::max<uint64_t>(at.head, ok.first_seq);
  if (!ctx_.wire.send(peer, FrameType::open_ok, channel, encode(ok)).ok()) return;
  start_sender(peer, channel, open->stream, std::move(stream), std::move(terms), at.from, open->credit);
}

// Asked only once the OPEN is permitted, so that where a stream lives is
// told only to a domain it is shared with.
Exports::Refusal Exports::not_here(const certs::Identity& peer, const std::string& stream,
                                   const std::string& name) const {
  const certs::Identity& self = options_.self;
  Refusal none{WireError::not_found, "no stream " + stream + " on " + self.uri(), false};
  const std::optional<StreamLocation> where = host_.locate_stream(name);
  if (!where) return none;
  // About to be led here (a failover named this node a moment ago): not
  // a final answer; the reader asks again (internal is not final).
  if (where->node == self.node)
    return Refusal{WireError::internal,
                   stream + " is led by " + self.uri() + " from now on, which is not ready to serve it yet (a "
                   "failover just moved it here): open it again in a moment",
                   false};
  // The catalog's "host:port" in the form a moved RESET carries, checked
  // as the importer will check it.
  const std::string reason = where->node + "@" + where->peer_address;
  if (auto moved = parse_moved(reason); !moved.ok()) {
    host_.log("federation: " + stream + " is led by " + where->node + ", but its peer address cannot be sent: " +
              moved.error().message);
    return none;
  }
  if (ctx_.wire.version(peer) >= 2) return Refusal{WireError::moved, reason, false};
  // A version-1 importer does not know `moved`: not_found sends it to its
  // next configured node, and the reason tells its admin which one to add.
  return Refusal{WireError::not_found,
                 "no stream " + stream + " on " + self.uri() + ": it is led by node " + where->node +
                     ", whose peer link is at " + where->peer_address +
                     " (list that node in federation.peers, or upgrade the importing node to protocol version 2)",
                 false};
}

void Exports::refuse(const certs::Identity& peer, uint32_t channel, const std::string& stream, const Refusal& r) {
  (void)ctx_.wire.send(peer, FrameType::reset, channel, encode(Reset{r.code, r.reason}));
  if (r.logged) host_.log("federation: refused " + peer.uri() + " opening " + stream + ": " + r.reason);
}

// Deny by default, and before saying whether the stream exists: an
// in-force stream contract covers it, or else a configured export.
std::optional<Exports::Refusal> Exports::permit_for(const certs::Identity& peer, const std::string& stream,
                                                    const std::string& name, Permit& out) const {
  // A hosted run's reads (federation/host.h): the whole stream, no terms.
  if (host_.may_read_hosted(name, peer.domain)) return std::nullopt;
  auto covered = ledger_ != nullptr
                     ? ledger_->find_stream_contract(options_.self.domain, peer.domain, name, wall_clock_ms())
                     : Result<contracts::Contract>(Error{Errc::not_found, ""});
  if (covered.ok()) {
    const contracts::StreamTerms& terms = covered->current().terms.stream;
    out.contract = covered->id;
    out.fields = terms.fields;
    out.predicate = terms.predicate;
    out.rate_cap = terms.rate_cap;
    return std::nullopt;
  }
  for (const auto& e : options_.exports) {
    if (e.stream == name && std::find(e.to.begin(), e.to.end(), peer.domain) != e.to.end()) {
      out.fields = e.fields;
      return std::nullopt;
    }
  }
  // Say why a contract does not cover it when one exists (expired,
  // revoked, not yet active); else the plain refusal.
  return Refusal{WireError::not_exported,
                 covered.error().code == Errc::permission_denied
                     ? covered.error().message
                     : "stream " + stream + " is not exported to domain " + peer.domain +
                           " (no stream contract covers it)",
                 true};
}

// The predicate reads the stream's own fields, before the projection: it
// may test a field the consumer does not see.
std::optional<Exports::Refusal> Exports::terms_for(const Permit& permit, const HostStream& stream,
                                                   const std::string& stream_name, ExportSender::Terms& out) {
  const engine::SchemaPtr own = stream.schema();
  if (!permit.predicate.empty()) {
    auto compiled = engine::Expr::compile(permit.predicate, *own);
    std::string problem;
    if (!compiled.ok()) {
      problem = compiled.error().message;
    } else if (compiled->type() != engine::Type::Bool) {
      problem = "it is of type " + std::string(engine::type_name(compiled->type())) + ", not bool";
    }
    if (!problem.empty()) {
      return Refusal{WireError::not_exported,
                     "stream contract " + permit.contract + " has a predicate that does not apply to " +
                         stream_name + ": " + problem,
                     true};
    }
    out.predicate = std::move(*compiled);
  }
  out.schema = own;
  if (!permit.fields.empty()) {
    std::vector<engine::Field> kept;
    for (const auto& f : permit.fields) {
      auto idx = own->index_of(f);
      if (!idx) {
        return Refusal{WireError::not_exported,
                       (permit.contract.empty() ? "the export of " + stream_name
                                                : "stream contract " + permit.contract) +
                           " names field '" + f + "', which the stream does not have (" + own->to_string() + ")",
                       false};
      }
      out.projection.push_back(*idx);
      kept.push_back(own->field(*idx));
    }
    out.schema = engine::make_schema(std::move(kept));
  }
  if (permit.rate_cap > 0) out.limiter = limiter_for(permit.contract, permit.rate_cap);
  out.contract = permit.contract;
  return std::nullopt;
}

// Where to start: from_seq 0 is the oldest retained tuple.
std::optional<Exports::Refusal> Exports::position_for(const HostStream& stream, const std::string& stream_name,
                                                      uint64_t from_seq, Position& out) const {
  out.head = stream.committed_next();
  out.first_retained = out.head;
  auto first = stream.first_retained();
  if (first.ok() && *first) out.first_retained = **first;
  out.from = from_seq == 0 ? out.first_retained : from_seq;
  // A reader may hold more than is visible now (a leader that restarted
  // shows less until its followers acknowledge again): it waits for the
  // rest. Beyond what the log will hold is a wrong position.
  if (out.from > out.head && out.from > stream.next_seq()) {
    return Refusal{WireError::bad_position,
                   "from_seq " + std::to_string(out.from) + " is beyond the head " + std::to_string(out.head) +
                       " of " + stream_name,
                   false};
  }
  if (out.from < out.first_retained) {
    return Refusal{WireError::bad_position,
                   "sequence number " + std::to_string(out.from) + " of " + stream_name +
                       " is no longer retained; the oldest is " + std::to_string(out.first_retained),
                   false};
  }
  return std::nullopt;
}

void Exports::start_sender(const certs::Identity& peer, uint32_t channel, const std::string& stream_name,
                           HostStreamPtr stream, ExportSender::Terms terms, uint64_t from, uint64_t credit) {
  const std::string contract = terms.contract;
  // The link refuses a frame over the peer's own limit; the sender then
  // halves its frames.
  auto sender = std::make_shared<ExportSender>(
      ctx_, peer, channel, stream, std::move(terms), from, credit, options_.max_frame,
      &host_.metrics().counter("entente_export_tuples_total", "Tuples sent to an importing domain",
                               {{"stream", stream->name()}, {"peer", peer.uri()}}));
  {
    std::lock_guard lock(mu_);
    senders_[{peer.uri(), channel}] = sender;
  }
  host_.log("federation: " + peer.uri() + " opened " + stream_name + " from " + std::to_string(from) +
            (peer.domain == options_.self.domain ? " (a node of this domain)"
             : !contract.empty()                 ? " under contract " + contract
             : host_.may_read_hosted(stream->name(), peer.domain) ? " (a hosted run's read)"
                                                                  : " (configured export)"));
  sender->start();
}

std::shared_ptr<RateLimiter> Exports::limiter_for(const std::string& contract, uint64_t per_second) {
  std::lock_guard lock(mu_);
  auto& l = limiters_[contract];
  // A contract's terms do not change once it is in force; the check only
  // guards against a reused id.
  if (!l || l->rate() != per_second) l = std::make_shared<RateLimiter>(per_second);
  return l;
}

// ---------------------------------------------------------------------------
// CREDIT, ACK, RESET.

bool Exports::on_frame(const certs::Identity& peer, FrameType type, uint32_t channel, std::string_view payload) {
  const ChannelKey key{peer.uri(), channel};
  std::shared_ptr<ExportSender> sender;
  bool ended = false;
  {
    std::lock_guard lock(mu_);
    if (auto it = senders_.find(key); it != senders_.end()) {
      sender = it->second;
      if (type == FrameType::reset) senders_.erase(it);
    } else if (auto e = ended_.find(key); e != ended_.end()) {
      // A channel this node ended (its contract is no longer in force):
      // acknowledgements of what it sent still come, and are charged.
      sender = e->second;
      ended = true;
      if (type == FrameType::reset) ended_.erase(e);
    }
  }
  if (!sender) return type != FrameType::reset;  // a closed channel: discarded
  if (type == FrameType::reset) {
    if (!ended) sender->stop();
    // A node of this domain that unsubscribes (RESET none: its read was
    // deleted, its fragment is gone) no longer needs what it did not
    // acknowledge. An importing domain's pin stays: its export or contract
    // says how long.
    if (auto r = decode_reset(payload);
        r.ok() && r->code == WireError::none && peer.domain == options_.self.domain) {
      if (Status s = release_internal_reader(sender->stream()->name(), peer.node); !s.ok()) {
        host_.log("federation: releasing " + peer.uri() + "'s pin on " + sender->stream()->name() + ": " +
                  s.error().message);
      }
    }
  } else if (type == FrameType::credit) {
    if (ended) return true;
    auto c = decode_credit(payload);
    if (c.ok()) sender->on_credit(c->bytes);
  } else if (type == FrameType::ack) {
    auto a = decode_ack(payload);
    if (a.ok()) sender->on_ack(a->through);
    if (ended && sender->all_acknowledged()) {
      std::lock_guard lock(mu_);
      if (auto e = ended_.find(key); e != ended_.end() && e->second == sender) ended_.erase(e);
    }
  }
  return true;
}

void Exports::on_link_down(const certs::Identity& peer) {
  const std::string uri = peer.uri();
  std::vector<std::shared_ptr<ExportSender>> senders;
  {
    std::lock_guard lock(mu_);
    for (auto it = senders_.begin(); it != senders_.end();) {
      if (it->first.first == uri) {
        senders.push_back(it->second);
        it = senders_.erase(it);
      } else {
        ++it;
      }
    }
    // Channel numbers belong to the link: ended channels go with it. What
    // they left uncharged is charged by the consumer's next OPEN.
    for (auto it = ended_.begin(); it != ended_.end();) {
      it = it->first.first == uri ? ended_.erase(it) : std::next(it);
    }
  }
  for (auto& s : senders) s->stop();
}

// ---------------------------------------------------------------------------
// The timer.

void Exports::tick() {
  std::vector<std::shared_ptr<ExportSender>> all;
  {
    std::lock_guard lock(mu_);
    all.reserve(senders_.size());
    for (auto& [k, s] : senders_) all.push_back(s);
  }
  for (auto& s : all) s->tick();
}

std::string Exports::end_reason(const std::string& id, int64_t now) const {
  auto mine = ledger_->get(id);
  if (mine.ok() && mine->state_at(now) == contracts::State::revoked) {
    const auto& v = mine->current();
    return "stream contract " + id + " was revoked by " + v.by + (v.reason.empty() ? "" : ": " + v.reason);
  }
  if (mine.ok() && mine->state_at(now) == contracts::State::expired) {
    return "stream contract " + id + " expired at " + contracts::format_time(mine->current().terms.valid_until_ms);
  }
  return "stream contract " + id + " is no longer in force";
}

void Exports::recheck_contracts() {
  if (ledger_ == nullptr) return;
  std::vector<std::pair<ChannelKey, std::shared_ptr<ExportSender>>> under_contract;
  {
    std::lock_guard lock(mu_);
    for (auto& [k, s] : senders_) {
      if (!s->contract().empty()) under_contract.emplace_back(k, s);
    }
  }
  const int64_t now = wall_clock_ms();
  for (auto& [key, sender] : under_contract) {
    auto mine = ledger_->get(sender->contract());
    if (mine.ok() && mine->in_force(now)) continue;
    // Its contract ended: the channel ends with the reason, which the
    // importing domain shows in its import's (and query's) status.
    const std::string why = end_reason(sender->contract(), now);
    {
      std::lock_guard lock(mu_);
      auto it = senders_.find(key);
      if (it == senders_.end() || it->second != sender) continue;
      senders_.erase(it);
      // Tuples in flight are stored and acknowledged after the end: their
      // acknowledgements are charged to this contract (on_frame).
      if (ended_.size() >= kMaxEndedChannels) ended_.erase(ended_.begin());
      ended_[key] = sender;
    }
    sender->end(WireError::not_exported, why);
    host_.log("federation: ended " + sender->stream()->name() + " to " + sender->peer().uri() + ": " + why);
  }
}

std::optional<uint64_t> Exports::retention_pin(const std::string& stream) const {
  // The domains the stream is shared with now: configured exports and
  // in-force stream contracts. A domain no longer shared with pins nothing.
  std::vector<std::string> domains;
  for (const auto& e : options_.exports) {
    if (e.stream == stream) domains.insert(domains.end(), e.to.begin(), e.to.end());
  }
  if (ledger_ != nullptr) {
    contracts::ContractFilter f;
    f.state = contracts::State::active;
    f.kind = contracts::Kind::stream;
    const int64_t now = wall_clock_ms();
    for (const auto& c : ledger_->list(f, now)) {
      const auto& t = c.current().terms.stream;
      if (t.provider == options_.self.domain && c.in_force(now) &&
          std::find(t.streams.begin(), t.streams.end(), stream) != t.streams.end()) {
        domains.push_back(t.consumer);
      }
    }
  }
  std::optional<uint64_t> pin;
  auto lower = [&pin](uint64_t need) { pin = pin ? std::min(*pin, need) : need; };
  // A domain that never acknowledged was promised only what its open
  // channel was sent (below).
  for (const auto& domain : domains) {
    if (auto a = ctx_.acks.acked(stream, domain)) lower(*a + 1);
  }
  // Nodes of this domain that read the stream keep what they have not
  // acknowledged until they are released (upstream backup for the arcs
  // between a query's fragments, docs/cluster.md).
  for (const auto& [party, through] : ctx_.acks.of(stream)) {
    if (detail::is_internal_party(party)) lower(through + 1);
  }
  std::vector<std::shared_ptr<ExportSender>> open;
  {
    std::lock_guard lock(mu_);
    for (const auto& [key, sender] : senders_) {
      if (sender->stream()->name() == stream) open.push_back(sender);
    }
  }
  // An open channel keeps what it may still have to send again: everything
  // after its last acknowledgement, or from where it started.
  for (const auto& sender : open) lower(sender->unacknowledged_from());
  return pin;
}

std::vector<Exports::InternalReader> Exports::internal_readers(const std::string& stream) const {
  std::vector<InternalReader> out;
  for (const auto& [party, through] : ctx_.acks.of(stream)) {
    if (detail::is_internal_party(party)) out.push_back({party.substr(1), through, false});
  }
  std::lock_guard lock(mu_);
  for (const auto& [key, sender] : senders_) {
    if (sender->stream()->name() != stream || sender->peer().domain != options_.self.domain) continue;
    auto it = std::find_if(out.begin(), out.end(), [&](const InternalReader& r) { return r.node == sender->peer().node; });
    if (it == out.end()) out.push_back({sender->peer().node, 0, true});
    else it->connected = true;
  }
  return out;
}

Status Exports::release_internal_reader(const std::string& stream, const std::string& node) {
  return ctx_.acks.forget(stream, detail::ack_party(options_.self.domain, options_.self.domain, node));
}

}  // namespace entente::federation
