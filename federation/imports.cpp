#include "federation/imports.h"

#include <rapidjson/document.h>

#include <algorithm>

#include "contracts/contract.h"
#include "engine/codec.h"
#include "federation/detail/common.h"
#include "federation/traffic.h"
#include "federation/wire.h"

namespace entente::federation {
namespace {

using detail::Clock;
using detail::Deferred;

// meta: "import-pos/DOMAIN/NAME" -> the owner's next sequence number an
// import expects (8 bytes big-endian), kept while the mirror's own numbers
// differ from the owner's (a predicate filtered tuples out).
constexpr const char* kImportPosPrefix = "import-pos/";

std::string import_pos_key(const std::string& mirror) { return std::string(kImportPosPrefix) + mirror; }

// Why an import's feed ended, in a few words and first: the close reason of
// the mirror's WebSocket subscribers holds 123 bytes ("revoked c-… by acme").
std::string feed_end_cause(const std::string& domain, const std::string& owner_reason) {
  constexpr std::string_view kContract = "stream contract c-";
  const size_t at = owner_reason.find(kContract);
  if (at != std::string::npos && owner_reason.size() >= at + kContract.size() + 16) {
    const std::string id = owner_reason.substr(at + kContract.size() - 2, 18);
    const std::string_view rest = std::string_view(owner_reason).substr(at + kContract.size() + 16);
    constexpr std::string_view kRevoked = " was revoked by ";
    constexpr std::string_view kExpired = " expired at ";
    if (rest.substr(0, kRevoked.size()) == kRevoked) {
      const std::string_view by = rest.substr(kRevoked.size(), rest.find(':', kRevoked.size()) - kRevoked.size());
      return "revoked " + id + " by " + std::string(by.substr(0, 63));
    }
    if (rest.substr(0, kExpired.size()) == kExpired) {
      return "expired " + id + " at " + std::string(rest.substr(kExpired.size(), 20));
    }
  }
  return "refused by " + domain + ": " + owner_reason;
}

// RESET moved (docs/federation.md, "Imports from a domain of several
// nodes"): moves followed before an OPEN_OK, beyond which the import is
// refused; how long a named node's link may take to come up before the
// configured nodes are tried again; when a refused mirror tries again.
constexpr uint32_t kMaxMoves = 3;
constexpr auto kMovedLinkWait = std::chrono::seconds(10);
constexpr auto kMovesRetry = std::chrono::seconds(10);
// How soon a node that still names an import's lost owner as the stream's
// leader is asked again (Import::lost_owner).
constexpr auto kLostOwnerRetry = std::chrono::milliseconds(500);

Errc errc_for(WireError code) {
  switch (code) {
    case WireError::not_exported: return Errc::permission_denied;
    case WireError::not_found: return Errc::not_found;
    case WireError::bad_position: return Errc::conflict;
    default: return Errc::unavailable;
  }
}

}  // namespace

struct Imports::Import {
  std::string name;    // "beta/bids"; "@n1/bids" for a read of node n1 of this domain
  std::string domain;  // "beta"; this node's own domain for a read of one of its nodes
  std::string remote;  // the stream as OPEN names it: "beta/bids"
  std::string node;    // a read of a node of this domain: that node; else empty
  HostStreamPtr mirror;          // null until the owner first accepted
  engine::SchemaPtr expected;    // a query's declared schema, for a new import
  base::Counter* tuples_in = nullptr;  // entente_import_tuples_total{stream}, set once

  std::mutex mu;
  std::string state = "connecting";      // REQUIRES: mu
  std::string reason;                    // REQUIRES: mu
  std::optional<certs::Identity> owner;  // REQUIRES: mu; the node in use
  uint32_t channel = 0;                  // REQUIRES: mu; 0: no channel
  uint64_t generation = 0;               // REQUIRES: mu; bumps per OPEN
  // REQUIRES: mu. The generation of the last channel the owner ended with
  // RESET: what it sent before still gets acknowledged as it becomes
  // durable, so the owner charges it (docs/protocol.md §9.3).
  uint64_t ended_generation = 0;
  bool asked_from_start = false;  // REQUIRES: mu; OPEN had from_seq 0
  // The first sequence number a new mirror wants (create's `from_seq`);
  // 0: the oldest the owner retains.
  uint64_t start_seq = 0;
  size_t node_index = 0;          // REQUIRES: mu; next node of the domain to try
  // REQUIRES: mu. The node a RESET moved named: OPENs go there while it is
  // set, whether or not it is configured; `moved_since` is when it was
  // named or its link went down (kMovedLinkWait).
  std::optional<certs::Identity> moved_to;
  std::string moved_address;             // REQUIRES: mu; its host:port
  Clock::time_point moved_since{};       // REQUIRES: mu
  uint32_t moves = 0;                    // REQUIRES: mu; followed since the last OPEN_OK
  // REQUIRES: mu. A configured node whose link went down under this
  // import's channel (or, for a read of a node of this domain, the node
  // it was redirected from), until the next OPEN_OK: a node that still
  // names it as the stream's leader is asked again kLostOwnerRetry later
  // (on_moved).
  std::optional<certs::Identity> lost_owner;
  std::string route;                     // REQUIRES: mu; "n2 -> n1", for a refusal
  uint64_t next_expected = 0;     // REQUIRES: mu; next owner seq to accept (incl. in flight)
  // REQUIRES: mu. The owner filtered tuples out: the mirror's numbers are
  // its own, and the owner's position is kept under import-pos/NAME.
  bool diverged = false;
  uint64_t window = 0;           // REQUIRES: mu; credit the owner still has
  uint64_t acked = 0;            // REQUIRES: mu
  uint64_t tuples = 0;           // REQUIRES: mu
  Clock::time_point retry_at{};  // REQUIRES: mu; re-open then, when set
  struct Pending {
    Done done;
    Clock::time_point deadline;
  };
  std::vector<Pending> pending;  // REQUIRES: mu
};

Imports::Imports(Host& host, Wire& wire, Traffic& traffic, Options options)
    : host_(host), wire_(wire), traffic_(traffic), options_(std::move(options)) {}

Imports::~Imports() = default;

namespace {

base::Counter& import_counter(Host& host, const std::string& stream) {
  return host.metrics().counter("entente_import_tuples_total", "Tuples received from another domain's stream",
                                {{"stream", stream}});
}

}  // namespace

Status Imports::load() {
  // Where imports whose mirror numbers its own rows stand at their owner.
  std::map<std::string, uint64_t> positions;
  ENTENTE_RETURN_IF_ERROR(host_.store().scan(
      store::Cf::meta, kImportPosPrefix, [&positions](std::string_view key, std::string_view value) {
        if (value.size() >= 8) {
          positions[std::string(key.substr(std::char_traits<char>::length(kImportPosPrefix)))] =
              store::get_key_u64(value);
        }
        return true;
      }));
  std::lock_guard lock(mu_);
  for (auto& s : host_.mirrors()) {
    auto parts = detail::split_stream(s->name());
    if (!parts) continue;
    auto imp = std::make_shared<Import>();
    imp->name = s->name();
    imp->tuples_in = &import_counter(host_, imp->name);
    imp->domain = parts->first;
    imp->remote = imp->name;
    if (auto internal = detail::split_internal_mirror(s->name())) {
      imp->domain = options_.self.domain;
      imp->node = internal->first;
      imp->remote = options_.self.domain + "/" + internal->second;
    }
    imp->mirror = s;
    imp->next_expected = s->next_seq();
    if (auto pos = positions.find(imp->name); pos != positions.end()) {
      imp->next_expected = pos->second;
      imp->diverged = true;
    }
    // Everything before it is durable here: acknowledged, as far as the
    // owner is concerned (the next OPEN starts after it).
    imp->acked = imp->next_expected - 1;
    imports_[imp->name] = imp;
  }
  return {};
}

// ---------------------------------------------------------------------------
// The API.

void Imports::create(const std::string& stream, engine::SchemaPtr expected, Done done,
                     std::chrono::milliseconds timeout, uint64_t from_seq) {
  auto parts = detail::split_stream(stream);
  if (!parts) {
    done(make_error(Errc::invalid_argument, "'" + stream + "' is not DOMAIN/NAME"));
    return;
  }
  if (detail::split_internal_mirror(stream)) {
    done(make_error(Errc::invalid_argument, "'" + stream.substr(0, 80) +
                                                "' names a read of a node of this domain; ask for NAME and the node"));
    return;
  }
  if (parts->first == options_.self.domain) {
    done(make_error(Errc::invalid_argument,
                    stream + " is a stream of this node's own domain; use it as '" + parts->second + "'"));
    return;
  }
  if (domain_config(*options_.peers(), parts->first) == nullptr) {
    done(make_error(Errc::not_found, "domain " + parts->first + " is not a configured peer (federation.peers)"));
    return;
  }
  start(stream, parts->first, stream, "", std::move(expected), std::move(done), timeout, from_seq);
}

void Imports::create_internal(const std::string& stream, const std::string& node, engine::SchemaPtr expected,
                              Done done, std::chrono::milliseconds timeout) {
  // Names as the link layer and the catalog have them: this keeps
  // "@NODE/NAME" unambiguous and bounded.
  if (!certs::valid_name(node)) {
    done(make_error(Errc::invalid_argument,
                    "node name '" + node.substr(0, 80) + "' is not [a-z][a-z0-9-]* of at most 63 characters"));
    return;
  }
  if (stream.empty() || stream.size() > 63 || stream.find('/') != std::string::npos || stream[0] == '@') {
    done(make_error(Errc::invalid_argument, "'" + stream.substr(0, 80) + "' is not the name of a stream of domain " +
                                                options_.self.domain + " (NAME, without a domain)"));
    return;
  }
  if (node == options_.self.node) {
    done(make_error(Errc::invalid_argument, "stream " + stream + " of node " + node +
                                                " is this node's own; read it as '" + stream + "'"));
    return;
  }
  start(detail::internal_mirror_name(node, stream), options_.self.domain, options_.self.domain + "/" + stream, node,
        std::move(expected), std::move(done), timeout);
}

void Imports::start(const std::string& mirror, std::string domain, std::string stream, std::string node,
                    engine::SchemaPtr expected, Done done, std::chrono::milliseconds timeout, uint64_t from_seq) {
  std::shared_ptr<Import> imp, existing;
  {
    std::lock_guard lock(mu_);
    if (auto it = imports_.find(mirror); it != imports_.end()) {
      existing = it->second;
    } else {
      imp = std::make_shared<Import>();
      imp->name = mirror;
      imp->tuples_in = &import_counter(host_, mirror);
      imp->domain = std::move(domain);
      imp->remote = std::move(stream);
      imp->node = std::move(node);
      imp->expected = std::move(expected);
      imp->start_seq = from_seq;
      imports_[mirror] = imp;
    }
  }
  if (!imp) {
    {
      // Being opened (a follower's copy of a stream that a fragment on
      // this node also reads, say): answered with it, once the owner
      // accepted or refused.
      std::lock_guard il(existing->mu);
      if (!existing->mirror && existing->state != "refused") {
        existing->pending.push_back({std::move(done), Clock::now() + timeout});
        return;
      }
    }
    // Outside the lock: the callback may read import states.
    done(make_error(Errc::already_exists, "stream " + mirror + " is imported already"));
    return;
  }
  {
    std::lock_guard lock(imp->mu);
    imp->pending.push_back({std::move(done), Clock::now() + timeout});
  }
  open(imp);
}

std::vector<ImportInfo> Imports::list() const {
  std::vector<ImportPtr> all;
  {
    std::lock_guard lock(mu_);
    for (auto& [n, imp] : imports_) all.push_back(imp);
  }
  std::vector<ImportInfo> out;
  for (auto& imp : all) {
    std::lock_guard lock(imp->mu);
    if (!imp->mirror) continue;  // still being created
    out.push_back(info_of(*imp));
  }
  return out;
}

std::optional<ImportInfo> Imports::info(const std::string& stream) const {
  ImportPtr imp;
  {
    std::lock_guard lock(mu_);
    auto it = imports_.find(stream);
    if (it == imports_.end()) return std::nullopt;
    imp = it->second;
  }
  std::lock_guard lock(imp->mu);
  if (!imp->mirror) return std::nullopt;
  return info_of(*imp);
}

Status Imports::forget(const std::string& stream) {
  ImportPtr imp;
  {
    std::lock_guard lock(mu_);
    auto it = imports_.find(stream);
    if (it == imports_.end() || !it->second->mirror) return make_error(Errc::not_found, "no import of " + stream);
    imp = it->second;
    imports_.erase(it);
  }
  std::lock_guard lock(imp->mu);
  if (imp->channel != 0 && imp->owner) {
    (void)wire_.send(*imp->owner, FrameType::reset, imp->channel, encode(Reset{WireError::none, "import deleted"}));
    std::lock_guard maps(mu_);
    import_channels_.erase({imp->owner->uri(), imp->channel});
  }
  imp->channel = 0;
  ++imp->generation;
  (void)host_.store().erase(store::Cf::meta, import_pos_key(imp->name), store::Durability::synced);
  return {};
}

Status Imports::redirect(const std::string& mirror, const std::string& node) {
  ImportPtr imp;
  {
    std::lock_guard lock(mu_);
    auto it = imports_.find(mirror);
    if (it == imports_.end()) return make_error(Errc::not_found, "no import of " + mirror);
    imp = it->second;
  }
  bool reopen = false;
  {
    std::lock_guard lock(imp->mu);
    if (imp->node.empty())
      return make_error(Errc::invalid_argument, mirror + " is an import of domain " + imp->domain +
                                                    ", not a read of a node of this domain");
    if (imp->node == node) return {};
    if (imp->channel != 0 && imp->owner) {
      (void)wire_.send(*imp->owner, FrameType::reset, imp->channel,
                       encode(Reset{WireError::none, "read from " + node + " now, which leads " + imp->remote}));
      std::lock_guard maps(mu_);
      import_channels_.erase({imp->owner->uri(), imp->channel});
    }
    imp->channel = 0;
    ++imp->generation;
    host_.log("federation: " + mirror + ": " + imp->node + " no longer leads " + imp->remote + "; reading it from " +
              node + " from sequence number " + std::to_string(imp->mirror ? imp->mirror->next_seq() : 0));
    // A node whose copy of the catalog lags may still name the old one
    // (moved): asked again shortly rather than waiting kMovedLinkWait on
    // the link to a node that is down (on_moved).
    imp->lost_owner = certs::Identity{imp->domain, imp->node};
    imp->node = node;
    imp->moved_to.reset();
    imp->state = "connecting";
    imp->reason = "node " + node + " leads " + imp->remote + " now";
    imp->retry_at = {};
    reopen = true;
  }
  if (reopen) open(imp);
  return {};
}

ImportInfo Imports::info_of(const Import& imp) const {
  // REQUIRES: imp.mu held by the caller.
  ImportInfo i;
  i.stream = imp.name;
  i.owner = imp.owner ? imp.owner->uri() : "";
  i.node = imp.node;
  i.state = imp.state;
  i.reason = imp.reason;
  i.schema = imp.mirror ? imp.mirror->schema() : imp.expected;
  i.next_seq = imp.mirror ? imp.mirror->next_seq() : 0;
  i.acked = imp.acked;
  i.tuples = imp.tuples;
  return i;
}

const PeerDomainConfig* Imports::domain_config(const std::vector<PeerDomainConfig>& peers,
                                               const std::string& domain) const {
  const PeerDomainConfig* found = nullptr;
  for (const auto& d : peers) {
    if (d.domain == domain) found = &d;
  }
  return found;
}

// ---------------------------------------------------------------------------
// Opening a channel.

void Imports::open(const ImportPtr& imp) {
  std::lock_guard lock(imp->mu);
  if (imp->channel != 0) return;
  const auto peers = options_.peers();
  // A read of a node of this domain goes to that node (dialed as a
  // configured peer, or as a member of the domain: docs/cluster.md).
  const PeerDomainConfig* domain = imp->node.empty() ? domain_config(*peers, imp->domain) : nullptr;
  if (domain == nullptr && imp->node.empty()) return;
  // The node a RESET moved named, once its link is up; else the first
  // node of the domain, from node_index on, whose link is up.
  std::optional<certs::Identity> owner;
  if (!imp->node.empty() && !imp->moved_to) {
    const certs::Identity id{imp->domain, imp->node};
    if (!wire_.is_up(id)) {
      if (imp->state != "refused") {
        imp->state = "connecting";
        imp->reason = "no link to " + id.uri() + " is up";
      }
      return;
    }
    owner = id;
  }
  if (imp->moved_to) {
    if (!wire_.is_up(*imp->moved_to)) {
      imp->state = "connecting";
      imp->reason = "waiting for the link to " + imp->moved_to->uri() + " at " + imp->moved_address +
                    ", which leads " + imp->name + " (route " + imp->route + ")";
      return;
    }
    owner = imp->moved_to;
  }
  for (size_t i = imp->node_index; !owner && domain != nullptr && i < domain->nodes.size(); ++i) {
    certs::Identity id{imp->domain, domain->nodes[i].node};
    if (wire_.is_up(id)) {
      owner = id;
      imp->node_index = i;
      break;
    }
  }
  if (!owner) {
    if (imp->state != "refused") {
      imp->state = "connecting";
      imp->reason = "no link to a node of domain " + imp->domain + " is up";
    }
    return;
  }
  auto channel = wire_.new_channel(*owner);
  if (!channel.ok()) return;
  Open open;
  open.stream = imp->remote;
  // Nothing stored and no position kept: from the oldest the owner retains.
  // Appends still in the group commit count: next_seq(), not committed_next().
  // Unless the numbering diverged (a predicate), the mirror's next number is
  // where the owner resumes.
  const uint64_t mirror_next = imp->mirror ? imp->mirror->next_seq() : 1;
  bool fresh = mirror_next <= 1 && !imp->diverged;
  if (imp->mirror && !imp->diverged) imp->next_expected = mirror_next;
  // A new mirror asked to start at a position: from there.
  if (fresh && imp->start_seq > 0 && imp->tuples == 0) {
    imp->next_expected = imp->start_seq;
    fresh = false;
  }
  open.from_seq = fresh ? 0 : imp->next_expected;
  open.credit = options_.window;
  imp->window = open.credit;
  imp->asked_from_start = fresh;
  imp->owner = owner;
  imp->channel = *channel;
  ++imp->generation;
  imp->retry_at = {};
  {
    std::lock_guard maps(mu_);
    import_channels_[{owner->uri(), *channel}] = imp;
  }
  if (!wire_.send(*owner, FrameType::open, *channel, encode(open)).ok()) {
    std::lock_guard maps(mu_);
    import_channels_.erase({owner->uri(), *channel});
    imp->channel = 0;
  }
}

// ---------------------------------------------------------------------------
// Frames.

bool Imports::on_frame(const certs::Identity& peer, FrameType type, uint32_t channel, std::string_view payload) {
  auto imp = find_by_channel({peer.uri(), channel});
  if (!imp) return false;
  Deferred later;  // before the lock: runs after it is released
  std::lock_guard lock(imp->mu);
  const Channel ch{imp->generation, imp->owner.value_or(certs::Identity{}), imp->channel};
  if (type == FrameType::open_ok) {
    on_open_ok(imp, ch, payload, later);
  } else if (type == FrameType::reset) {
    on_reset(imp, ch, payload, later);
  } else if ((type == FrameType::data || type == FrameType::data_named) && imp->state == "active" &&
             imp->mirror) {
    on_data(imp, ch, type, payload);
  }
  return true;
}

void Imports::drop_channel(Import& imp, const Channel& ch) {
  {
    std::lock_guard maps(mu_);
    import_channels_.erase({ch.owner.uri(), ch.id});
  }
  imp.channel = 0;
  ++imp.generation;
}

void Imports::reset_and_retry(Import& imp, const Channel& ch, WireError code, const std::string& reason,
                              std::chrono::milliseconds after) {
  (void)wire_.send(ch.owner, FrameType::reset, ch.id, encode(Reset{code, reason}));
  drop_channel(imp, ch);
  imp.state = "connecting";
  imp.reason = reason;
  imp.retry_at = Clock::now() + after;
}

void Imports::finish_pending(Import& imp, const Result<ImportInfo>& r, Deferred& later) {
  // REQUIRES: imp.mu held. The callbacks run through `later`, once every
  // lock is released.
  auto pending = std::move(imp.pending);
  imp.pending.clear();
  for (auto& p : pending) later.add([done = std::move(p.done), r] { done(r); });
}

void Imports::refuse(const ImportPtr& imp, const Error& error, Deferred& later) {
  imp->state = "refused";
  imp->reason = error.message;
  finish_pending(*imp, error, later);
  if (!imp->mirror) {
    std::lock_guard maps(mu_);
    imports_.erase(imp->name);
  }
}

void Imports::on_open_ok(const ImportPtr& imp, const Channel& ch, std::string_view payload, Deferred& later) {
  auto ok = decode_open_ok(payload);
  if (!ok.ok()) {
    reset_and_retry(*imp, ch, WireError::protocol, ok.error().message, std::chrono::seconds(1));
    return;
  }
  rapidjson::Document doc;
  doc.Parse(ok->schema_json.data(), ok->schema_json.size());
  auto schema = doc.HasParseError() ? Result<engine::Schema>(make_error(Errc::parse_error, "schema is not JSON"))
                                    : engine::schema_from_json(doc);
  if (!schema.ok()) {
    reset_and_retry(*imp, ch, WireError::protocol, "the owner's schema: " + schema.error().message,
                    std::chrono::seconds(1));
    return;
  }
  auto sp = std::make_shared<const engine::Schema>(std::move(*schema));
  const engine::SchemaPtr want = imp->mirror ? imp->mirror->schema() : imp->expected;
  if (want && !(*want == *sp)) {
    const std::string why = imp->name + " has schema " + sp->to_string() + " at its owner, but " +
                            (imp->mirror ? "this node's mirror has " : "the query declares ") + want->to_string();
    (void)wire_.send(ch.owner, FrameType::reset, ch.id, encode(Reset{WireError::none, why}));
    drop_channel(*imp, ch);
    refuse(imp, Error{Errc::conflict, why}, later);
    return;
  }
  if (!imp->mirror) {
    // A position left by an earlier import of this name (deleted just
    // before a crash) does not belong to the new mirror.
    if (auto stale = host_.store().get(store::Cf::meta, import_pos_key(imp->name)); !stale.ok() || *stale) {
      (void)host_.store().erase(store::Cf::meta, import_pos_key(imp->name), store::Durability::synced);
    }
    auto mirror = host_.create_mirror(imp->name, sp);
    if (!mirror.ok()) {
      (void)wire_.send(ch.owner, FrameType::reset, ch.id, encode(Reset{WireError::internal, mirror.error().message}));
      drop_channel(*imp, ch);
      refuse(imp, mirror.error(), later);
      return;
    }
    imp->mirror = *mirror;
  }
  if (imp->asked_from_start) imp->next_expected = ok->first_seq;
  imp->moves = 0;
  imp->lost_owner.reset();
  imp->route.clear();
  imp->state = "active";
  imp->reason.clear();
  host_.log("federation: importing " + imp->name + " from " + ch.owner.uri() + " at " +
            std::to_string(imp->next_expected));
  finish_pending(*imp, info_of(*imp), later);
}

void Imports::on_reset(const ImportPtr& imp, const Channel& ch, std::string_view payload, Deferred& later) {
  auto r = decode_reset(payload);
  const WireError code = r.ok() ? r->code : WireError::protocol;
  const std::string reason = r.ok() ? r->reason : r.error().message;
  imp->ended_generation = ch.generation;
  drop_channel(*imp, ch);
  if (code == WireError::moved) {
    on_moved(imp, ch, reason, later);
    return;
  }
  // The node a move named no longer has it: back to the configured nodes.
  if (imp->moved_to && *imp->moved_to == ch.owner && code == WireError::not_found) imp->moved_to.reset();
  // Another node of the domain may serve the stream (a read of a node of
  // this domain asks that node only).
  if (code == WireError::not_found && imp->node.empty()) {
    const auto peers = options_.peers();
    const PeerDomainConfig* domain = domain_config(*peers, imp->domain);
    if (domain && imp->node_index + 1 < domain->nodes.size()) {
      ++imp->node_index;
      imp->retry_at = Clock::now();
      return;
    }
  }
  const bool final_refusal =
      code == WireError::not_exported || code == WireError::not_found || code == WireError::bad_position;
  const std::string why = imp->domain + " refused " + imp->name + ": " + reason;
  imp->reason = why;
  if (!final_refusal) {
    imp->state = "connecting";
    imp->retry_at = Clock::now() + std::chrono::seconds(1);
    return;
  }
  host_.log("federation: " + why);
  // The mirror's live subscribers learn why nothing more comes.
  if (imp->mirror) {
    later.add([mirror = imp->mirror, cause = feed_end_cause(imp->domain, reason), why] {
      mirror->end_feed(cause, why);
    });
  }
  refuse(imp, Error{errc_for(code), why}, later);
}

void Imports::on_moved(const ImportPtr& imp, const Channel& ch, const std::string& reason, Deferred& later) {
  // decode_reset checked the form; the address is only where to dial: the
  // node there must still prove it is DOMAIN/NODE under DOMAIN's pinned CA.
  auto where = parse_moved(reason);
  if (!where.ok()) {
    imp->state = "connecting";
    imp->reason = imp->domain + " refused " + imp->name + ": " + where.error().message;
    imp->retry_at = Clock::now() + std::chrono::seconds(1);
    return;
  }
  const certs::Identity to{imp->domain, where->node};
  const std::string address = where->host.find(':') != std::string::npos
                                  ? "[" + where->host + "]:" + std::to_string(where->port)
                                  : where->host + ":" + std::to_string(where->port);
  // The node asked still names the configured node whose link just went
  // down: its domain has not moved the stream yet (a dead leader is
  // declared dead when its lease expires, docs/cluster.md). Ask again
  // shortly rather than wait on that link, which may never come back.
  if (imp->lost_owner && to == *imp->lost_owner && !wire_.is_up(to)) {
    imp->state = "connecting";
    imp->reason = ch.owner.uri() + " says " + to.uri() + " leads " + imp->name + ", and the link to it is down: asking " +
                  imp->domain + " again in " + std::to_string(kLostOwnerRetry.count()) + " ms";
    imp->node_index = 0;
    imp->retry_at = Clock::now() + kLostOwnerRetry;
    return;
  }
  // This node itself: the node asked has seen the stream move here (this
  // node is to adopt its copy, or just did). Dialing itself would only
  // make a link it drops as a duplicate, again and again; the domain's
  // catalog settles who reads what (docs/cluster.md), so ask again later.
  if (to == options_.self) {
    imp->state = "connecting";
    imp->reason = ch.owner.uri() + " says this node leads " + imp->name + ": asking " + imp->domain + " again in " +
                  std::to_string(kLostOwnerRetry.count()) + " ms";
    imp->node_index = 0;
    imp->retry_at = Clock::now() + kLostOwnerRetry;
    return;
  }
  imp->route += (imp->route.empty() ? ch.owner.node : std::string()) + " -> " + where->node;
  std::string problem;
  if (to == ch.owner) {
    problem = ch.owner.uri() + " named itself";
  } else if (imp->moves >= kMaxMoves) {
    problem = "moved " + std::to_string(imp->moves + 1) + " times without reaching the node that leads it";
  } else if (Status s = wire_.add_dial_target(to, where->host, where->port); !s.ok() && !wire_.is_up(to)) {
    problem = "cannot dial " + to.uri() + " at " + address + ": " + s.error().message;
  }
  if (!problem.empty()) {
    const std::string why = imp->domain + " refused " + imp->name + ": " + problem + " (route " + imp->route +
                            "); trying the configured nodes again in " +
                            std::to_string(std::chrono::seconds(kMovesRetry).count()) + " s";
    imp->moved_to.reset();
    imp->moves = 0;
    imp->route.clear();
    imp->node_index = 0;
    host_.log("federation: " + why);
    refuse(imp, Error{Errc::unavailable, why}, later);
    if (imp->mirror) imp->retry_at = Clock::now() + kMovesRetry;
    return;
  }
  ++imp->moves;
  imp->moved_to = to;
  imp->moved_address = address;
  imp->moved_since = Clock::now();
  imp->state = "connecting";
  imp->reason = ch.owner.uri() + " says " + to.uri() + " at " + address + " leads " + imp->name;
  host_.log("federation: " + imp->name + ": " + imp->reason);
  // Opens there at the next tick if its link is up; else when it comes up.
  imp->retry_at = Clock::now();
}

Result<engine::Batch> Imports::checked_rows(const Import& imp, const Data& d) const {
  std::string_view body = d.body;
  auto batch = engine::decode_batch(body);
  const uint64_t last = d.first_seq + d.count - 1;
  // The body holds the rows of first..last that passed the owner's filter
  // (all of them when nothing filters), each with its own number, ascending.
  bool numbered = batch.ok() && batch->seq.size() == batch->rows();
  if (numbered) {
    uint64_t prev = d.first_seq - 1;
    for (uint64_t seq : batch->seq) {
      if (seq <= prev || seq > last) {
        numbered = false;
        break;
      }
      prev = seq;
    }
  }
  if (!batch.ok() || !body.empty() || batch->rows() > d.count || !numbered ||
      !batch->validate(engine::Batch::Check::full).ok() || !(*batch->schema == *imp.mirror->schema())) {
    return make_error(Errc::invalid_argument, "DATA " + std::to_string(d.first_seq) + " of " + imp.name +
                                                  " does not hold tuples of " + std::to_string(d.first_seq) +
                                                  ".." + std::to_string(last) + " in order, of the stream's schema");
  }
  return std::move(*batch);
}

void Imports::on_data(const ImportPtr& imp, const Channel& ch, FrameType type, std::string_view payload) {
  // The owner may not send beyond the credit it was given (docs/protocol.md §8).
  if (payload.size() > imp->window) {
    reset_and_retry(*imp, ch, WireError::flow_control,
                    "DATA of " + std::to_string(payload.size()) + " bytes with a credit of " +
                        std::to_string(imp->window),
                    std::chrono::seconds(1));
    return;
  }
  imp->window -= payload.size();
  if (type == FrameType::data_named && imp->node.empty()) {
    // Publishers' names are the owner's business, copied only between the
    // nodes of one domain (docs/protocol.md §5.12): another domain's owner
    // sending them breaks the protocol.
    reset_and_retry(*imp, ch, WireError::protocol,
                    "DATA_NAMED on " + imp->name + ", which is not a read of a node of this domain",
                    std::chrono::seconds(1));
    return;
  }
  auto d = type == FrameType::data_named ? decode_data_named(payload) : decode_data(payload);
  if (!d.ok()) {
    reset_and_retry(*imp, ch, WireError::protocol, d.error().message, std::chrono::seconds(1));
    return;
  }
  auto batch = checked_rows(*imp, *d);
  if (!batch.ok()) {
    reset_and_retry(*imp, ch, WireError::protocol, batch.error().message, std::chrono::seconds(1));
    return;
  }
  uint64_t first = d->first_seq;
  const uint64_t last = first + d->count - 1;
  const uint32_t credit_back = static_cast<uint32_t>(payload.size());
  if (last < imp->next_expected) {
    // All duplicates (a resend after a reconnect): drop, return the credit.
    if (wire_.send(ch.owner, FrameType::credit, ch.id, encode(Credit{credit_back})).ok()) {
      imp->window += credit_back;
    }
    return;
  }
  engine::Batch rows = std::move(*batch);
  // The tuples the DATA covers, every one of them there, under the owner's
  // numbers: the mirror may take them under those same numbers.
  bool whole = rows.rows() == d->count;
  if (first < imp->next_expected) {
    // Some are duplicates: keep those not stored yet.
    std::vector<uint32_t> keep;
    for (size_t i = 0; i < rows.rows(); ++i) {
      if (rows.seq[i] >= imp->next_expected) keep.push_back(static_cast<uint32_t>(i));
    }
    rows = rows.take(keep);
    first = imp->next_expected;
    whole = whole && rows.rows() == last - first + 1;
  } else if (first > imp->next_expected &&
             !(imp->asked_from_start && imp->tuples == 0 && !imp->diverged && imp->mirror->next_seq() <= 1)) {
    reset_and_retry(*imp, ch, WireError::protocol,
                    "DATA starts at " + std::to_string(first) + ", expected " + std::to_string(imp->next_expected),
                    std::chrono::milliseconds(100));
    return;
  }
  // The owner's bytes are stored as they are when they hold exactly the
  // tuples first..last under those numbers (no duplicate prefix cut).
  std::shared_ptr<const std::string> as_received;
  if (whole && first == d->first_seq) as_received = std::make_shared<const std::string>(std::move(d->body));
  // The named batches completed by tuples stored now; those ending before
  // `first` came with the tuples already stored.
  std::erase_if(d->named, [first](const NamedBatch& b) { return b.last < first; });
  const size_t n = rows.rows();
  if (Status s = store_rows(imp, ch, std::move(rows), first, last, whole, std::move(as_received),
                            std::move(d->named));
      !s.ok()) {
    return;  // store_rows reset the channel
  }
  // Credit comes back as soon as the write is queued (its own queue bound
  // caps memory; a full queue resets the channel), so the owner keeps
  // sending while the sync runs. ACK waits for durability.
  if (wire_.send(ch.owner, FrameType::credit, ch.id, encode(Credit{credit_back})).ok()) {
    imp->window += credit_back;
  }
  imp->tuples += n;
  imp->next_expected = last + 1;
  traffic_.count(ch.owner.uri(), n, 0);
  if (imp->tuples_in) imp->tuples_in->inc(n);
}

Status Imports::store_rows(const ImportPtr& imp, const Channel& ch, engine::Batch rows, uint64_t first,
                           uint64_t last, bool whole, std::shared_ptr<const std::string> as_received,
                           std::vector<NamedBatch> named) {
  std::weak_ptr<Import> weak = imp;
  // ACK once the tuples (or the position past filtered ones) are durable.
  auto on_durable = [this, weak, ch, last](const Status& st) {
    auto imp = weak.lock();
    if (!imp) return;
    std::lock_guard lock(imp->mu);
    if (!st.ok()) {
      imp->reason = "storing " + imp->name + " failed: " + st.error().message;
      return;
    }
    imp->acked = std::max(imp->acked, last);
    // The channel is gone; unless the owner ended it, nobody waits for this.
    if (imp->generation != ch.generation && imp->ended_generation != ch.generation) return;
    // Durable now: the owner may release everything through `last`.
    (void)wire_.send(ch.owner, FrameType::ack, ch.id, encode(Ack{last}));
  };
  // The owner's position is kept apart from the mirror whenever the two
  // numberings differ, in the same atomic write as the rows.
  store::WriteBatch position;
  auto keep_position = [&] {
    std::string v;
    store::put_key_u64(v, last + 1);
    position.put(store::Cf::meta, import_pos_key(imp->name), v);
  };
  Status s;
  bool diverges = imp->diverged;
  const size_t n = rows.rows();
  if (n == 0) {
    // Every tuple of the range was filtered out: only the position moves,
    // through the write queue so that ACKs keep the commit order.
    keep_position();
    diverges = true;
    s = host_.submit(std::move(position), std::move(on_durable));
  } else {
    const uint64_t mirror_next = imp->mirror->next_seq();
    // The owner's numbers are kept while they fit: the run continues the
    // mirror (or starts an empty one that never diverged).
    const bool same_numbers = whole && (first == mirror_next || (mirror_next == 1 && !imp->diverged));
    if (whole && !same_numbers && !imp->diverged) {
      // The owner's numbers are the mirror's until a predicate first filters
      // a row out: whole tuples at another number are a bookkeeping fault,
      // never a reason to number them anew (that would store them twice).
      // The next OPEN starts from the mirror's next number (open).
      const std::string why = "DATA " + std::to_string(first) + " of " + imp->name +
                              " does not continue the mirror at " + std::to_string(mirror_next);
      reset_and_retry(*imp, ch, WireError::internal, why, std::chrono::milliseconds(100));
      return make_error(Errc::conflict, why);
    }
    const uint64_t at = same_numbers ? first : mirror_next;
    if (!same_numbers) {
      as_received.reset();
      // Names point at the owner's numbers: a mirror numbering rows itself
      // (only under a contract's predicate, never between the nodes of a
      // domain) cannot use them.
      named.clear();
    }
    if (at + n != last + 1) {
      keep_position();
      diverges = true;
    }
    s = imp->mirror->append_at(at, std::move(rows), std::move(position), std::move(named),
                               std::move(on_durable), std::move(as_received));
  }
  if (!s.ok()) {
    // The write queue is full (or the mirror is going): start over from
    // what is stored, a little later; the owner keeps everything unacked.
    reset_and_retry(*imp, ch, WireError::internal, "importer busy: " + s.error().message,
                    std::chrono::milliseconds(200));
    return s;
  }
  imp->diverged = diverges;
  return {};
}

// ---------------------------------------------------------------------------
// Link events and the timer.

std::vector<Imports::ImportPtr> Imports::imports_of(const std::string& domain) const {
  std::vector<ImportPtr> out;
  std::lock_guard lock(mu_);
  for (const auto& [name, imp] : imports_) {
    if (imp->domain == domain) out.push_back(imp);
  }
  return out;
}

Imports::ImportPtr Imports::find_by_channel(const ChannelKey& key) const {
  std::lock_guard lock(mu_);
  auto it = import_channels_.find(key);
  return it == import_channels_.end() ? nullptr : it->second;
}

void Imports::on_link_up(const certs::Identity& peer) {
  // Imports of the peer's domain without a channel open one now.
  for (auto& imp : imports_of(peer.domain)) {
    {
      std::lock_guard lock(imp->mu);
      if (imp->channel != 0) continue;
      imp->node_index = 0;
    }
    open(imp);
  }
}

bool Imports::other_node_up(const std::string& domain, const certs::Identity& except) const {
  const auto peers = options_.peers();
  const PeerDomainConfig* d = domain_config(*peers, domain);
  if (d == nullptr) return false;
  return std::any_of(d->nodes.begin(), d->nodes.end(), [&](const auto& n) {
    const certs::Identity id{domain, n.node};
    return id != except && wire_.is_up(id);
  });
}

void Imports::on_link_down(const certs::Identity& peer, std::string_view reason) {
  const std::string uri = peer.uri();
  std::vector<ImportPtr> imports;
  {
    std::lock_guard lock(mu_);
    for (auto it = import_channels_.begin(); it != import_channels_.end();) {
      if (it->first.first == uri) {
        imports.push_back(it->second);
        it = import_channels_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // A channel the owner ended belonged to this link: a later link may use
  // its number for another stream, so nothing more is acknowledged on it.
  for (auto& imp : imports_of(peer.domain)) {
    std::lock_guard lock(imp->mu);
    if (imp->owner && *imp->owner == peer) imp->ended_generation = 0;
    // The node a move named has kMovedLinkWait to come back.
    if (imp->moved_to && *imp->moved_to == peer) imp->moved_since = Clock::now();
  }
  for (auto& imp : imports) {
    std::lock_guard lock(imp->mu);
    imp->channel = 0;
    ++imp->generation;
    if (imp->state != "refused") {
      imp->state = "connecting";
      imp->reason = "link to " + uri + " down: " + std::string(reason);
      // A configured node of another domain served it: that node may be
      // gone for good while its domain moves the stream to another node
      // (docs/federation.md, "Imports from a domain of several nodes"), so
      // the other configured nodes, when a link to one is up, are asked at
      // once rather than waiting for this link alone. (A node a move named
      // keeps kMovedLinkWait, in tick().)
      if (imp->node.empty() && !imp->moved_to && other_node_up(imp->domain, peer)) {
        imp->lost_owner = peer;
        imp->node_index = 0;
        imp->retry_at = Clock::now();
      }
    }
  }
}

void Imports::retry_refused(const contracts::Contract& c) {
  const auto& t = c.current().terms;
  if (t.kind != contracts::Kind::stream || t.stream.consumer != options_.self.domain ||
      !c.in_force(detail::wall_clock_ms())) {
    return;
  }
  std::vector<ImportPtr> covered;
  {
    std::lock_guard lock(mu_);
    for (auto& [name, imp] : imports_) {
      if (imp->domain != t.stream.provider) continue;
      auto parts = detail::split_stream(name);
      if (parts && std::find(t.stream.streams.begin(), t.stream.streams.end(), parts->second) !=
                       t.stream.streams.end()) {
        covered.push_back(imp);
      }
    }
  }
  // An import the owner refused is tried again under the new contract, from
  // where its mirror stands.
  for (auto& imp : covered) {
    std::lock_guard lock(imp->mu);
    if (imp->state != "refused" || imp->channel != 0) continue;
    imp->state = "connecting";
    imp->reason = "trying again under stream contract " + c.id;
    imp->node_index = 0;
    imp->retry_at = Clock::now();
    host_.log("federation: " + imp->name + ": " + imp->reason);
  }
}

void Imports::tick() {
  std::vector<ImportPtr> all;
  {
    std::lock_guard maps(mu_);
    for (auto& [n, imp] : imports_) all.push_back(imp);
  }
  const auto now = Clock::now();
  for (auto& imp : all) {
    bool reopen = false;
    bool forget = false;
    Deferred later;
    {
      std::lock_guard il(imp->mu);
      for (auto it = imp->pending.begin(); it != imp->pending.end();) {
        if (it->deadline > now) {
          ++it;
          continue;
        }
        Error e{Errc::unavailable, "no answer about " + imp->name + " from domain " + imp->domain +
                                       (imp->reason.empty() ? std::string() : " (" + imp->reason + ")")};
        later.add([done = std::move(it->done), e] { done(e); });
        it = imp->pending.erase(it);
        forget = !imp->mirror;
      }
      // The node a move named did not link in time (unreachable, or not
      // who it was said to be): the configured nodes are asked again.
      if (imp->channel == 0 && imp->moved_to && now - imp->moved_since >= kMovedLinkWait &&
          !wire_.is_up(*imp->moved_to)) {
        imp->reason = imp->moved_to->uri() + " at " + imp->moved_address + " was not reached in " +
                      std::to_string(std::chrono::seconds(kMovedLinkWait).count()) +
                      " s; asking the configured nodes of " + imp->domain + " again";
        host_.log("federation: " + imp->name + ": " + imp->reason);
        // Not dialed forever: a later move may name it again.
        wire_.remove_dial_target(*imp->moved_to);
        imp->moved_to.reset();
        imp->node_index = 0;
        imp->retry_at = now;
      }
      if (imp->channel == 0 && imp->retry_at != Clock::time_point{} && imp->retry_at <= now) {
        imp->retry_at = {};
        reopen = true;
      }
    }
    if (forget) {
      std::lock_guard maps(mu_);
      for (auto it = import_channels_.begin(); it != import_channels_.end();) {
        it = it->second == imp ? import_channels_.erase(it) : std::next(it);
      }
      imports_.erase(imp->name);
      continue;
    }
    if (reopen) open(imp);
  }
}

}  // namespace entente::federation
