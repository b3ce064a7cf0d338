#include "federation/contracting.h"

#include <rapidjson/document.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"
#include "contracts/contract.h"

namespace entente::federation {
namespace {

using contracts::Contract;
using contracts::State;
using contracts::Version;

constexpr size_t kMaxSyncEntries = 100000;
constexpr std::chrono::seconds kRefusalLogWindow{10};
// meta: offers in this domain's name that came back from the peer.
constexpr std::string_view kReturnedPrefix = "contract_returned/";

int64_t unix_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// `held`: the sender's latest version of the contract.
std::string version_message(const std::string& id, const Version& v, uint64_t held) {
  const std::string version = contracts::version_to_json(v);
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  w.StartObject();
  w.Key("type");
  w.String("contract.version");
  w.Key("id");
  w.String(id.data(), static_cast<rapidjson::SizeType>(id.size()));
  w.Key("version");
  w.RawValue(version.data(), version.size(), rapidjson::kObjectType);
  w.Key("held");
  w.Uint64(held);
  w.EndObject();
  return std::string(sb.GetString(), sb.GetSize());
}

std::string returned_key(std::string_view id, uint64_t number) {
  std::string key(kReturnedPrefix);
  key.append(id).push_back('/');
  store::put_key_u64(key, number);
  return key;
}

}  // namespace

std::string other_party(const Contract& c, std::string_view self) {
  auto [a, b] = contracts::parties(c.current().terms);
  return a == self ? b : a;
}

Result<std::unique_ptr<Contracting>> Contracting::open(store::Store& store, certs::Signer signer,
                                                       std::shared_ptr<const certs::TrustStore> trust,
                                                       std::vector<std::string> peer_domains,
                                                       base::Registry& metrics, Hooks hooks) {
  ENTENTE_ASSIGN_OR_RETURN(auto ledger, contracts::Ledger::open(store));
  return std::unique_ptr<Contracting>(new Contracting(store, std::move(ledger), std::move(signer),
                                                      std::move(trust), std::move(peer_domains),
                                                      metrics, std::move(hooks)));
}

// entente_contract_valid_until_seconds of a contract accepted or in force
// (an operator alerts before it ends; ended ones are left out).
static void write_valid_until(base::MetricsWriter& w, const Contract& c, std::string_view self) {
  w.gauge("entente_contract_valid_until_seconds",
          "When an accepted or active contract's terms end, Unix seconds (exclusive)",
          {{"contract", c.id}, {"peer", other_party(c, self)}},
          static_cast<double>(c.current().terms.valid_until_ms) / 1000.0);
}

Contracting::Contracting(store::Store& store, std::unique_ptr<contracts::Ledger> ledger,
                         certs::Signer signer, std::shared_ptr<const certs::TrustStore> trust,
                         std::vector<std::string> peer_domains, base::Registry& metrics, Hooks hooks)
    : store_(store),
      ledger_(std::move(ledger)),
      signer_(std::move(signer)),
      trust_(std::move(trust)),
      self_(signer_.identity().domain),
      peer_domains_(std::move(peer_domains)),
      metrics_(metrics),
      hooks_(std::move(hooks)) {
  collector_ = metrics_.add_collector([this](base::MetricsWriter& w) {
    const int64_t now = unix_now_ms();
    std::map<State, uint64_t> by_state;
    for (const Contract& c : ledger_->list({}, now)) {
      ++by_state[c.state_at(now)];
      if (c.state_at(now) == State::accepted || c.state_at(now) == State::active) write_valid_until(w, c, self_);
      auto u = ledger_->usage(c.id);
      if (!u.ok()) continue;
      const base::Labels labels{{"contract", c.id}, {"peer", other_party(c, self_)}};
      if (c.kind() == contracts::Kind::stream) {
        w.counter("entente_contract_tuples_total",
                  "Tuples delivered under a stream contract (this node's side)", labels,
                  static_cast<double>(u->tuples));
      } else {
        w.counter("entente_contract_load_seconds_total", "CPU-seconds hosted under a hosting contract",
                  labels, static_cast<double>(u->load_seconds));
      }
      w.counter("entente_contract_cost_credits_total",
                "What a contract's usage costs at its price, in credits", labels, u->cost_credits);
    }
    for (State st : {State::proposed, State::countered, State::accepted, State::active,
                     State::rejected, State::revoked, State::expired}) {
      w.gauge("entente_contracts", "Contracts in the ledger by state",
              {{"state", std::string(contracts::state_name(st))}},
              static_cast<double>(by_state[st]));
    }
  });
}

Contracting::~Contracting() { metrics_.remove_collector(collector_); }

bool Contracting::is_peer_domain(std::string_view domain) const {
  return std::find(peer_domains_.begin(), peer_domains_.end(), domain) != peer_domains_.end();
}

// ---------------------------------------------------------------------------
// The admin's actions.

Result<Contracting::Outcome> Contracting::record(const std::string& id, const Version& v) {
  ENTENTE_ASSIGN_OR_RETURN(Contract c, ledger_->apply(id, v, self_, *trust_));
  metrics_
      .counter("entente_contract_versions_total", "Contract versions recorded, by who made them",
               {{"by", "self"}})
      .inc();
  if (hooks_.changed) hooks_.changed(c);
  Outcome out;
  out.delivered = send_version(other_party(c, self_), id, v);
  out.contract = std::move(c);
  return out;
}

Result<contracts::Version> Contracting::check_propose(const contracts::Terms& terms) const {
  auto [a, b] = contracts::parties(terms);
  if (a != self_ && b != self_) {
    return make_error(Errc::permission_denied, "this node is of domain " + self_ +
                                                   ", which is not a party of the terms (" + a +
                                                   ", " + b + ")");
  }
  const std::string peer = a == self_ ? b : a;
  if (!is_peer_domain(peer)) {
    return make_error(Errc::not_found,
                      "domain " + peer +
                          " is not a peer of this node (federation.peers lists its CA and "
                          "addresses); a contract can only be negotiated with a configured peer");
  }
  return contracts::propose(self_, terms, unix_now_ms());
}

Result<contracts::Version> Contracting::check_counter(const std::string& id, uint64_t on_version,
                                                      const contracts::Terms& terms) const {
  ENTENTE_ASSIGN_OR_RETURN(Contract c, ledger_->get(id));
  return contracts::counter(c, self_, on_version, terms, unix_now_ms());
}

Result<Contracting::Outcome> Contracting::propose(const contracts::Terms& terms) {
  ENTENTE_ASSIGN_OR_RETURN(Version v, check_propose(terms));
  return record(contracts::new_contract_id(), v);
}

Result<Contracting::Outcome> Contracting::counter(const std::string& id, uint64_t on_version,
                                                  const contracts::Terms& terms) {
  ENTENTE_ASSIGN_OR_RETURN(Version v, check_counter(id, on_version, terms));
  return record(id, v);
}

Result<Contracting::Outcome> Contracting::accept(const std::string& id, uint64_t on_version) {
  ENTENTE_ASSIGN_OR_RETURN(Contract c, ledger_->get(id));
  ENTENTE_ASSIGN_OR_RETURN(Version v, contracts::accept(c, signer_, on_version, unix_now_ms()));
  return record(id, v);
}

Result<Contracting::Outcome> Contracting::reject(const std::string& id, uint64_t on_version,
                                                 std::string reason) {
  ENTENTE_ASSIGN_OR_RETURN(Contract c, ledger_->get(id));
  ENTENTE_ASSIGN_OR_RETURN(Version v, contracts::reject(c, self_, on_version, std::move(reason),
                                                        unix_now_ms()));
  return record(id, v);
}

Result<Contracting::Outcome> Contracting::revoke(const std::string& id, uint64_t on_version,
                                                 std::string reason) {
  ENTENTE_ASSIGN_OR_RETURN(Contract c, ledger_->get(id));
  ENTENTE_ASSIGN_OR_RETURN(Version v, contracts::revoke(c, self_, on_version, std::move(reason),
                                                        unix_now_ms()));
  return record(id, v);
}

void Contracting::flush_usage() {
  if (Status s = ledger_->flush_usage(); !s.ok() && hooks_.log) {
    hooks_.log("contracts: writing usage failed: " + s.error().message);
  }
  std::string summary;
  {
    std::lock_guard lock(sync_mu_);
    summary = take_refusal_summary(std::chrono::steady_clock::now());
  }
  if (!summary.empty() && hooks_.log) hooks_.log(summary);
}

// ---------------------------------------------------------------------------
// The link.

bool Contracting::send_version(const std::string& domain, const std::string& id, const Version& v) {
  if (!hooks_.send_to_domain) return false;
  const bool sent = hooks_.send_to_domain(domain, version_message(id, v, v.number));
  if (sent) count_message("version", "sent");
  return sent;
}

void Contracting::count_message(const char* type, const char* direction) {
  metrics_
      .counter("entente_contract_messages_total",
               "Contract CONTROL messages sent to and received from peer domains, by type",
               {{"type", type}, {"direction", direction}})
      .inc();
}

void Contracting::send_sync(const certs::Identity& peer) {
  contracts::ContractFilter f;
  f.peer = peer.domain;
  rapidjson::StringBuffer sb;
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  w.StartObject();
  w.Key("type");
  w.String("contract.sync");
  w.Key("have");
  w.StartObject();
  for (const Contract& c : ledger_->list(f, unix_now_ms())) {
    w.Key(c.id.data(), static_cast<rapidjson::SizeType>(c.id.size()));
    w.Uint64(c.current().number);
  }
  w.EndObject();
  w.EndObject();
  if (hooks_.send_to_peer && hooks_.send_to_peer(peer, std::string(sb.GetString(), sb.GetSize()))) {
    count_message("sync", "sent");
  }
}

void Contracting::on_link_up(const certs::Identity& peer) {
  if (!is_peer_domain(peer.domain)) return;
  {
    // A new link starts a new exchange: what was asked or refused on the
    // last one may go through now.
    std::lock_guard lock(sync_mu_);
    peers_[peer.domain] = PeerSync{};
  }
  send_sync(peer);
}

std::string Contracting::take_refusal_summary(std::chrono::steady_clock::time_point now) {
  if (now - refusal_window_ < kRefusalLogWindow) return {};
  std::string summary;
  if (refusals_unlogged_ > 0) {
    summary = "contracts: " + std::to_string(refusals_unlogged_) +
              " more refused contract messages were not logged in the last " +
              std::to_string(kRefusalLogWindow.count()) +
              " s (entente_contract_refusals_total counts every one)";
  }
  refusal_window_ = now;
  refusal_lines_ = 0;
  refusals_unlogged_ = 0;
  return summary;
}

void Contracting::refused(const certs::Identity& peer, const std::string& reason,
                          const std::string& label) {
  metrics_
      .counter("entente_contract_refusals_total",
               "Contract messages from a peer domain that were refused, by reason",
               {{"reason", label}})
      .inc();
  if (!hooks_.log) return;
  // A peer that keeps sending what this node refuses must not fill the log.
  std::string summary;
  bool log_this = false;
  {
    std::lock_guard lock(sync_mu_);
    summary = take_refusal_summary(std::chrono::steady_clock::now());
    log_this = refusal_lines_ < kRefusalLogBurst;
    if (log_this) {
      ++refusal_lines_;
    } else {
      ++refusals_unlogged_;
    }
  }
  if (!summary.empty()) hooks_.log(summary);
  if (log_this) hooks_.log("contracts: refused a message from " + peer.uri() + ": " + reason);
}

void Contracting::on_control(const certs::Identity& peer, std::string_view message) {
  rapidjson::Document doc;
  doc.Parse(message.data(), message.size());
  if (doc.HasParseError() || !doc.IsObject() || !doc.HasMember("type") || !doc["type"].IsString()) {
    refused(peer, "not a JSON object with a string 'type'", "malformed");
    return;
  }
  const std::string_view type(doc["type"].GetString(), doc["type"].GetStringLength());
  if (!is_peer_domain(peer.domain)) {
    refused(peer, "domain " + peer.domain + " is not a peer this node negotiates with",
            "not_a_peer");
    return;
  }
  if (type == "contract.sync") {
    if (!doc.HasMember("have") || !doc["have"].IsObject()) {
      refused(peer, "contract.sync without a 'have' object", "malformed");
      return;
    }
    on_sync(peer, doc["have"]);
    return;
  }
  if (type == "contract.version") {
    if (!doc.HasMember("id") || !doc["id"].IsString() || !doc.HasMember("version")) {
      refused(peer, "contract.version without 'id' and 'version'", "malformed");
      return;
    }
    uint64_t held = 0;  // absent: the sender did not say (an older node)
    if (auto it = doc.FindMember("held"); it != doc.MemberEnd()) {
      if (!it->value.IsUint64()) {
        refused(peer, "contract.version with a 'held' that is not an unsigned integer", "malformed");
        return;
      }
      held = it->value.GetUint64();
    }
    on_version(peer, std::string(doc["id"].GetString(), doc["id"].GetStringLength()),
               doc["version"], held);
    return;
  }
  refused(peer, "unknown message type '" + std::string(type.substr(0, 64)) + "'", "unknown_type");
}

void Contracting::on_sync(const certs::Identity& peer, const rapidjson::Value& have) {
  if (have.MemberCount() > kMaxSyncEntries) {
    refused(peer, "contract.sync lists " + std::to_string(have.MemberCount()) + " contracts",
            "limit");
    return;
  }
  count_message("sync", "received");
  contracts::ContractFilter f;
  f.peer = peer.domain;
  const std::vector<Contract> mine = ledger_->list(f, unix_now_ms());
  std::map<std::string_view, uint64_t> ours;
  for (const Contract& c : mine) ours[c.id] = c.current().number;
  // One lookup per contract, not a scan of `have` per contract.
  std::map<std::string_view, uint64_t> theirs;
  for (auto it = have.MemberBegin(); it != have.MemberEnd(); ++it) {
    if (it->value.IsUint64()) theirs[{it->name.GetString(), it->name.GetStringLength()}] = it->value.GetUint64();
  }
  auto theirs_of = [&](const std::string& id) -> uint64_t {
    auto it = theirs.find(id);
    return it == theirs.end() ? 0 : it->second;
  };
  // What to send, and which contracts the peer caught up with.
  std::vector<const Contract*> behind;
  std::vector<const Contract*> caught_up;
  {
    std::lock_guard lock(sync_mu_);
    PeerSync& ps = peers_[peer.domain];
    // The contracts the peer holds more of than this node (lost ones too):
    // it sends them when it gets this node's sync.
    ps.catching_up.clear();
    ps.caught_any = false;
    for (const auto& [id, number] : theirs) {
      if (!contracts::valid_contract_id(id)) continue;
      auto held = ours.find(id);
      if (number > (held == ours.end() ? 0 : held->second)) ps.catching_up.emplace(id);
    }
    for (const Contract& c : mine) {
      if (theirs_of(c.id) < c.current().number) {
        behind.push_back(&c);
        ps.sent_behind.insert(c.id);
      } else if (ps.sent_behind.erase(c.id) > 0) {
        caught_up.push_back(&c);
      }
    }
  }
  for (const Contract* c : behind) {
    const uint64_t current = c->current().number;
    for (uint64_t n = theirs_of(c->id) + 1; n <= current; ++n) {
      if (!hooks_.send_to_peer(peer, version_message(c->id, c->history[n - 1], current))) return;
      count_message("version", "sent");
    }
  }
  // The peer now holds what it was sent (it had lost it: a restore).
  for (const Contract* c : caught_up) {
    if (hooks_.log) {
      hooks_.log("contracts: " + peer.domain + " now holds version " + std::to_string(c->current().number) +
                 " of " + c->id + ", as this node does");
    }
    if (hooks_.changed) hooks_.changed(*c);
  }
}

void Contracting::ask_for_gap(const certs::Identity& peer, const std::string& id, uint64_t current) {
  {
    std::lock_guard lock(sync_mu_);
    auto& stuck = peers_[peer.domain].stuck_at;
    // Ids of contracts this node does not hold come from the peer: bound
    // what they may cost (forgetting only allows one more ask each).
    if (stuck.size() >= kMaxSyncEntries) stuck.clear();
    auto [it, fresh] = stuck.try_emplace(id, current);
    // Asking again at the same number brings the same versions, and the
    // same refusal: the loop a restored data directory used to start.
    if (!fresh && it->second == current) return;
    it->second = current;
  }
  send_sync(peer);
}

bool Contracting::returned_offer(const std::string& id, const Version& v) const {
  auto mark = store_.get(store::Cf::meta, returned_key(id, v.number));
  // When the mark cannot be read, assume the worst: no countersignature.
  if (!mark.ok()) return true;
  return mark->has_value() && **mark == contracts::version_to_json(v);
}

void Contracting::on_version(const certs::Identity& peer, const std::string& id,
                             const rapidjson::Value& json, uint64_t held) {
  count_message("version", "received");
  auto v = incoming_version(peer, id, json);
  if (!v) return;
  held = std::max(held, v->number);
  // Already held (a resend after a sync), or a gap to be filled first.
  auto existing = ledger_->get(id);
  const uint64_t current = existing.ok() ? existing->current().number : 0;
  if (v->number <= current) {
    if (!(existing->history[v->number - 1] == *v)) {
      refused(peer, "contract " + id + " version " + std::to_string(v->number) +
                        " differs from the version this domain holds",
              "diverged");
    }
    return;
  }
  if (v->number > current + 1) {
    ask_for_gap(peer, id, current);
    return;
  }
  auto recorded = record_incoming(peer, id, *v, current);
  if (!recorded) return;
  note_recorded(peer, id, *v, held, *recorded);
  // The peer accepted this domain's offer: countersign it, since these are
  // the terms this domain offered.
  if (v->state == State::accepted && v->offer >= 1 && v->offer <= recorded->history.size() &&
      recorded->history[v->offer - 1].by == self_) {
    // The peer holds later versions: after a restore, this domain's own
    // countersignature is among them, and comes next.
    if (held > v->number) return;
    countersign_accepted(peer, id, *v, *recorded);
  }
}

std::optional<Version> Contracting::incoming_version(const certs::Identity& peer, const std::string& id,
                                                     const rapidjson::Value& json) {
  auto v = contracts::version_from_json(json, "$.version");
  if (!v.ok()) {
    refused(peer, "contract " + id.substr(0, 64) + ": " + v.error().message, "malformed");
    return std::nullopt;
  }
  if (!contracts::valid_contract_id(id)) {
    refused(peer, "'" + id.substr(0, 64) + "' is not a contract id", "malformed");
    return std::nullopt;
  }
  // Only contracts between the peer's domain and this one are this node's business.
  if (auto [a, b] = contracts::parties(v->terms);
      !((a == self_ && b == peer.domain) || (b == self_ && a == peer.domain))) {
    refused(peer, "contract " + id + " binds " + a + " and " + b + ", not " + peer.domain +
                      " and " + self_,
            "not_a_party");
    return std::nullopt;
  }
  return std::move(*v);
}

std::optional<Contract> Contracting::record_incoming(const certs::Identity& peer, const std::string& id,
                                                     const Version& v, uint64_t current) {
  // A version in this domain's name that the peer holds and this node does
  // not: this node lost it (its data directory was restored from an older
  // copy). It passes the checks of a local change, signatures included.
  const bool returned = v.by == self_;
  bool marked = false;
  if (returned && (v.state == State::proposed || v.state == State::countered)) {
    // Marked before it is recorded: a crash in between leaves a mark
    // without the version, never the version without its mark.
    Status m = store_.put(store::Cf::meta, returned_key(id, v.number), contracts::version_to_json(v),
                          store::Durability::synced);
    if (!m.ok()) {
      if (hooks_.log) hooks_.log("contracts: cannot record version " + std::to_string(v.number) + " of " + id +
                                 " from " + peer.domain + ": " + m.error().message);
      return std::nullopt;
    }
    marked = true;
  }
  auto recorded = ledger_->apply(id, v, returned ? self_ : peer.domain, *trust_);
  if (recorded.ok()) return std::move(*recorded);
  if (marked) (void)store_.erase(store::Cf::meta, returned_key(id, v.number), store::Durability::synced);
  {
    // Asking for this version again would only bring it back.
    std::lock_guard lock(sync_mu_);
    PeerSync& ps = peers_[peer.domain];
    if (ps.stuck_at.size() >= kMaxSyncEntries) ps.stuck_at.clear();
    ps.stuck_at[id] = current;
    ps.catching_up.erase(id);
  }
  const Errc code = recorded.error().code;
  refused(peer,
          (returned ? "contract " + id + " version " + std::to_string(v.number) + " in the name of " + self_ +
                          ": "
                    : std::string()) +
              recorded.error().message,
          code == Errc::permission_denied ? "not_permitted"
          : code == Errc::conflict        ? "conflict"
                                          : "invalid");
  return std::nullopt;
}

void Contracting::note_recorded(const certs::Identity& peer, const std::string& id, const Version& v,
                                uint64_t held, const Contract& recorded) {
  const bool returned = v.by == self_;
  metrics_
      .counter("entente_contract_versions_total", "Contract versions recorded, by who made them",
               {{"by", returned ? "self_returned" : "peer"}})
      .inc();
  if (hooks_.log) {
    hooks_.log(returned ? "contracts: got back version " + std::to_string(v.number) + " of " + id + " (" +
                              std::string(contracts::state_name(v.state)) + " by " + self_ + ") from " +
                              peer.domain + ", which this node had lost (a restored data directory?)"
                        : "contracts: " + peer.domain + " made version " + std::to_string(v.number) +
                              " of " + id + " (" + std::string(contracts::state_name(v.state)) + ")");
  }
  if (hooks_.changed) hooks_.changed(recorded);
  bool sync_now = false;
  if (held == v.number) {
    std::lock_guard lock(sync_mu_);
    PeerSync& ps = peers_[peer.domain];
    ps.stuck_at.erase(id);
    if (ps.catching_up.erase(id) > 0) {
      ps.caught_any = true;
      sync_now = ps.catching_up.empty();
    }
  }
  // Caught up with everything the peer showed: it learns so from a sync.
  if (sync_now) send_sync(peer);
}

void Contracting::countersign_accepted(const certs::Identity& peer, const std::string& id, const Version& v,
                                       const Contract& recorded) {
  const Version& offer = recorded.history[v.offer - 1];
  if (returned_offer(id, offer)) {
    if (hooks_.log) {
      hooks_.log("contracts: " + peer.domain + " accepted version " + std::to_string(v.offer) + " of " + id +
                 ", an offer in this domain's name that this node got back from " + peer.domain +
                 " and cannot tell it made; it does not countersign it (revoke the contract and propose "
                 "again if these are the terms to agree)");
    }
    return;
  }
  auto signed_version = contracts::countersign(recorded, signer_, v.number, unix_now_ms());
  if (!signed_version.ok()) {
    if (hooks_.log) {
      hooks_.log("contracts: countersigning " + id + " failed: " + signed_version.error().message);
    }
    return;
  }
  auto out = record(id, *signed_version);
  if (!out.ok() && hooks_.log) {
    hooks_.log("contracts: recording the countersignature of " + id + " failed: " + out.error().message);
  }
}

}  // namespace entente::federation
