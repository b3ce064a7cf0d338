#include "broker/detail/contracting.h"

#include <rapidjson/document.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "broker/detail/json_out.h"
#include "contracts/contract.h"

namespace entente::broker::detail {
namespace {

using contracts::Contract;
using contracts::State;
using contracts::Version;

constexpr size_t kMaxSyncEntries = 100000;

int64_t unix_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string version_message(const std::string& id, const Version& v) {
  JsonOut j;
  j.begin_object().key("type").str("contract.version").key("id").str(id);
  j.key("version").raw(contracts::version_to_json(v)).end_object();
  return j.take();
}

}  // namespace

std::string other_party(const Contract& c, std::string_view self) {
  auto [a, b] = contracts::parties(c.current().terms);
  return a == self ? b : a;
}

Result<std::unique_ptr<Contracting>> Contracting::open(store::Store& store, certs::Signer signer,
                                                       std::shared_ptr<const certs::TrustStore> trust,
                                                       std::vector<std::string> peer_domains,
                                                       Registry& metrics, Hooks hooks) {
  ENTENTE_ASSIGN_OR_RETURN(auto ledger, contracts::Ledger::open(store));
  return std::unique_ptr<Contracting>(new Contracting(std::move(ledger), std::move(signer),
                                                      std::move(trust), std::move(peer_domains),
                                                      metrics, std::move(hooks)));
}

Contracting::Contracting(std::unique_ptr<contracts::Ledger> ledger, certs::Signer signer,
                         std::shared_ptr<const certs::TrustStore> trust,
                         std::vector<std::string> peer_domains, Registry& metrics, Hooks hooks)
    : ledger_(std::move(ledger)),
      signer_(std::move(signer)),
      trust_(std::move(trust)),
      self_(signer_.identity().domain),
      peer_domains_(std::move(peer_domains)),
      metrics_(metrics),
      hooks_(std::move(hooks)) {
  collector_ = metrics_.add_collector([this](MetricsWriter& w) {
    const int64_t now = unix_now_ms();
    std::map<State, uint64_t> by_state;
    for (const Contract& c : ledger_->list({}, now)) {
      ++by_state[c.state_at(now)];
      auto u = ledger_->usage(c.id);
      if (!u.ok()) continue;
      const Labels labels{{"contract", c.id}, {"peer", other_party(c, self_)}};
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
}

// ---------------------------------------------------------------------------
// The link.

bool Contracting::send_version(const std::string& domain, const std::string& id, const Version& v) {
  if (!hooks_.send_to_domain) return false;
  return hooks_.send_to_domain(domain, version_message(id, v));
}

void Contracting::send_sync(const certs::Identity& peer) {
  contracts::ContractFilter f;
  f.peer = peer.domain;
  JsonOut j;
  j.begin_object().key("type").str("contract.sync").key("have").begin_object();
  for (const Contract& c : ledger_->list(f, unix_now_ms())) j.key(c.id).u64(c.current().number);
  j.end_object().end_object();
  if (hooks_.send_to_peer) (void)hooks_.send_to_peer(peer, j.take());
}

void Contracting::on_link_up(const certs::Identity& peer) {
  if (!is_peer_domain(peer.domain)) return;
  send_sync(peer);
}

void Contracting::refused(const certs::Identity& peer, const std::string& reason,
                          const std::string& label) {
  metrics_
      .counter("entente_contract_refusals_total",
               "Contract messages from a peer domain that were refused, by reason",
               {{"reason", label}})
      .inc();
  if (hooks_.log) hooks_.log("contracts: refused a message from " + peer.uri() + ": " + reason);
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
    on_version(peer, std::string(doc["id"].GetString(), doc["id"].GetStringLength()),
               doc["version"]);
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
  contracts::ContractFilter f;
  f.peer = peer.domain;
  for (const Contract& c : ledger_->list(f, unix_now_ms())) {
    uint64_t theirs = 0;
    auto it = have.FindMember(c.id.c_str());
    if (it != have.MemberEnd() && it->value.IsUint64()) theirs = it->value.GetUint64();
    for (uint64_t n = theirs + 1; n <= c.current().number; ++n) {
      if (!hooks_.send_to_peer(peer, version_message(c.id, c.history[n - 1]))) return;
    }
  }
}

void Contracting::on_version(const certs::Identity& peer, const std::string& id,
                             const rapidjson::Value& json) {
  auto v = contracts::version_from_json(json, "$.version");
  if (!v.ok()) {
    refused(peer, "contract " + id.substr(0, 64) + ": " + v.error().message, "malformed");
    return;
  }
  if (!contracts::valid_contract_id(id)) {
    refused(peer, "'" + id.substr(0, 64) + "' is not a contract id", "malformed");
    return;
  }
  // Only contracts between the peer's domain and this one are this node's business.
  if (auto [a, b] = contracts::parties(v->terms);
      !((a == self_ && b == peer.domain) || (b == self_ && a == peer.domain))) {
    refused(peer, "contract " + id + " binds " + a + " and " + b + ", not " + peer.domain +
                      " and " + self_,
            "not_a_party");
    return;
  }
  // Already held (a resend after a sync), or a gap to be filled first.
  if (auto held = ledger_->get(id); held.ok()) {
    const uint64_t current = held->current().number;
    if (v->number <= current) {
      if (!(held->history[v->number - 1] == *v)) {
        refused(peer, "contract " + id + " version " + std::to_string(v->number) +
                          " differs from the version this domain holds",
                "diverged");
      }
      return;
    }
    if (v->number > current + 1) {
      send_sync(peer);
      return;
    }
  } else if (v->number > 1) {
    send_sync(peer);
    return;
  }
  auto recorded = ledger_->apply(id, *v, peer.domain, *trust_);
  if (!recorded.ok()) {
    const Errc code = recorded.error().code;
    refused(peer, recorded.error().message,
            code == Errc::permission_denied ? "not_permitted"
            : code == Errc::conflict        ? "conflict"
                                            : "invalid");
    return;
  }
  metrics_
      .counter("entente_contract_versions_total", "Contract versions recorded, by who made them",
               {{"by", "peer"}})
      .inc();
  if (hooks_.log) {
    hooks_.log("contracts: " + peer.domain + " made version " + std::to_string(v->number) +
               " of " + id + " (" + std::string(contracts::state_name(v->state)) + ")");
  }
  if (hooks_.changed) hooks_.changed(*recorded);
  // The peer accepted this domain's offer: countersign it, since these are
  // the terms this domain offered.
  if (v->state == State::accepted && v->offer >= 1 && v->offer <= recorded->history.size() &&
      recorded->history[v->offer - 1].by == self_) {
    auto signed_version = contracts::countersign(*recorded, signer_, v->number, unix_now_ms());
    if (!signed_version.ok()) {
      if (hooks_.log) {
        hooks_.log("contracts: countersigning " + id + " failed: " +
                   signed_version.error().message);
      }
      return;
    }
    auto out = record(id, *signed_version);
    if (!out.ok() && hooks_.log) {
      hooks_.log("contracts: recording the countersignature of " + id +
                 " failed: " + out.error().message);
    }
  }
}

}  // namespace entente::broker::detail
