#include "contracts/ledger.h"

#include <algorithm>
#include <limits>

#include "contracts/canonical.h"
#include "rapidjson/document.h"

namespace entente::contracts {

namespace {

constexpr std::string_view kVersionPrefix = "v/";
constexpr std::string_view kUsagePrefix = "u/";
constexpr size_t kIdLength = 18;  // "c-" + 16 hex digits

Error no_contract(std::string_view id) {
  return make_error(Errc::not_found, "no contract " + std::string(id.substr(0, 40)));
}

// The load as CPU microseconds ("load_us"); "load_seconds" (whole
// seconds) is what an older ledger wrote, read when load_us is absent.
std::string usage_json(uint64_t tuples, uint64_t load_us) {
  return "{\"load_seconds\":" + std::to_string(load_us / 1'000'000) + ",\"load_us\":" + std::to_string(load_us) +
         ",\"tuples\":" + std::to_string(tuples) + "}";
}

uint64_t saturating_add(uint64_t a, uint64_t b) {
  return b > std::numeric_limits<uint64_t>::max() - a ? std::numeric_limits<uint64_t>::max() : a + b;
}

// Why a contract that covers a stream is not in force now.
std::string not_in_force_reason(const Contract& c, int64_t now_ms) {
  const Version& cur = c.current();
  const std::string what = "stream contract " + c.id;
  switch (c.state_at(now_ms)) {
    case State::expired: return what + " expired at " + format_time(cur.terms.valid_until_ms);
    case State::revoked: return what + " was revoked by " + cur.by + ": " + cur.reason;
    case State::rejected: return what + " was rejected by " + cur.by;
    case State::active:
      if (now_ms < cur.terms.valid_from_ms) return what + " starts at " + format_time(cur.terms.valid_from_ms);
      return what + " is not signed by both parties";
    default: return what + " is " + std::string(state_name(cur.state)) + ", not active";
  }
}

}  // namespace

std::string version_key(std::string_view id, uint64_t number) {
  std::string key(kVersionPrefix);
  key += id;
  key += '/';
  store::put_key_u64(key, number);
  return key;
}

std::string usage_key(std::string_view id) { return std::string(kUsagePrefix) + std::string(id); }

Result<std::unique_ptr<Ledger>> Ledger::open(store::Store& store) {
  std::unique_ptr<Ledger> ledger(new Ledger(store));
  ENTENTE_RETURN_IF_ERROR(ledger->load());
  return ledger;
}

Status Ledger::load() {
  std::lock_guard lock(mu_);
  Status failed;
  Status scanned = store_.scan(store::Cf::contracts, kVersionPrefix, [&](std::string_view key, std::string_view value) {
    auto corrupt = [&](const std::string& why) {
      failed = make_error(Errc::corrupt, "contracts ledger: " + why);
      return false;
    };
    if (key.size() != kVersionPrefix.size() + kIdLength + 1 + 8 || key[kVersionPrefix.size() + kIdLength] != '/') {
      return corrupt("malformed version key of " + std::to_string(key.size()) + " bytes");
    }
    const std::string id(key.substr(kVersionPrefix.size(), kIdLength));
    if (!valid_contract_id(id)) return corrupt("malformed contract id in a version key");
    const uint64_t number = store::get_key_u64(key.substr(key.size() - 8));
    auto v = version_from_text(value);
    if (!v.ok()) return corrupt("version " + std::to_string(number) + " of " + id + ": " + v.error().message);
    Contract& c = contracts_[id];
    c.id = id;
    if (v->number != number || number != c.history.size() + 1) {
      return corrupt("contract " + id + " has version " + std::to_string(v->number) + " under key number " +
                     std::to_string(number) + " after " + std::to_string(c.history.size()) + " versions");
    }
    c.history.push_back(std::move(*v));
    return true;
  });
  ENTENTE_RETURN_IF_ERROR(scanned);
  ENTENTE_RETURN_IF_ERROR(failed);

  scanned = store_.scan(store::Cf::contracts, kUsagePrefix, [&](std::string_view key, std::string_view value) {
    const std::string_view id = key.substr(kUsagePrefix.size());
    rapidjson::Document doc;
    doc.Parse(value.data(), value.size());
    const auto tuples = doc.IsObject() ? doc.FindMember("tuples") : rapidjson::Value::ConstMemberIterator();
    const auto load = doc.IsObject() ? doc.FindMember("load_seconds") : rapidjson::Value::ConstMemberIterator();
    const auto load_us = doc.IsObject() ? doc.FindMember("load_us") : rapidjson::Value::ConstMemberIterator();
    if (doc.HasParseError() || !doc.IsObject() || tuples == doc.MemberEnd() || !tuples->value.IsUint64() ||
        load == doc.MemberEnd() || !load->value.IsUint64() ||
        (load_us != doc.MemberEnd() && !load_us->value.IsUint64())) {
      failed = make_error(Errc::corrupt, "contracts ledger: malformed usage of " + std::string(id.substr(0, 40)));
      return false;
    }
    const uint64_t us = load_us != doc.MemberEnd() ? load_us->value.GetUint64()
                                                   : saturating_add(0, load->value.GetUint64() * 1'000'000);
    usage_[std::string(id)] = Counters{tuples->value.GetUint64(), us, false};
    return true;
  });
  ENTENTE_RETURN_IF_ERROR(scanned);
  return failed;
}

Result<Contract> Ledger::get(std::string_view id) const {
  std::lock_guard lock(mu_);
  const auto it = contracts_.find(id);
  if (it == contracts_.end()) return no_contract(id);
  return it->second;
}

std::vector<Contract> Ledger::list(const ContractFilter& filter, int64_t now_ms) const {
  std::lock_guard lock(mu_);
  std::vector<Contract> out;
  for (const auto& [id, c] : contracts_) {
    if (c.history.empty()) continue;
    if (filter.kind && c.kind() != *filter.kind) continue;
    if (filter.state && c.state_at(now_ms) != *filter.state) continue;
    if (!filter.peer.empty()) {
      auto [a, b] = parties(c.current().terms);
      if (filter.peer != a && filter.peer != b) continue;
    }
    out.push_back(c);
  }
  return out;
}

Status Ledger::append_locked(const std::string& id, const Version& v) {
  const auto it = contracts_.find(id);
  const Contract fresh{id, {}};
  const Contract& c = it != contracts_.end() ? it->second : fresh;
  ENTENTE_RETURN_IF_ERROR(check_transition(c, v, v.by));
  const std::string json = version_to_json(v);
  if (gate_) ENTENTE_RETURN_IF_ERROR(gate_(id, v, json));
  ENTENTE_RETURN_IF_ERROR(store_.put(store::Cf::contracts, version_key(id, v.number), json, store::Durability::synced));
  Contract& stored = contracts_[id];
  stored.id = id;
  stored.history.push_back(v);
  return Status::Ok();
}

void Ledger::set_gate(Gate gate) {
  std::lock_guard lock(mu_);
  gate_ = std::move(gate);
}

uint64_t Ledger::versions(std::string_view id) const {
  std::lock_guard lock(mu_);
  auto it = contracts_.find(id);
  return it == contracts_.end() ? 0 : it->second.history.size();
}

Status Ledger::append(const std::string& id, const Version& v) {
  std::lock_guard lock(mu_);
  return append_locked(id, v);
}

Result<Contract> Ledger::apply(const std::string& id, const Version& v, std::string_view from,
                               const certs::TrustStore& trust, certs::Clock::time_point now) {
  std::lock_guard lock(mu_);
  const auto it = contracts_.find(id);
  const Contract fresh{id, {}};
  ENTENTE_RETURN_IF_ERROR(check_next(it != contracts_.end() ? it->second : fresh, v, from, trust, now));
  ENTENTE_RETURN_IF_ERROR(append_locked(id, v));
  return contracts_.find(id)->second;
}

Result<Contract> Ledger::find_stream_contract(std::string_view provider, std::string_view consumer,
                                              std::string_view stream, int64_t now_ms) const {
  std::lock_guard lock(mu_);
  // Which contract governs when none is in force (docs/contracts.md,
  // Enforcement): one both parties signed (it shared the stream, or will)
  // before one still negotiated, before one rejected; among equals, the
  // most recent. So a revoked contract, not an offer rejected after it,
  // explains a refusal.
  auto rank = [now_ms](const Contract& c) {
    const State st = c.state_at(now_ms);
    const bool signed_by_both = std::any_of(c.history.begin(), c.history.end(),
                                            [](const Version& v) { return v.state == State::active; });
    if (st == State::active && now_ms < c.current().terms.valid_from_ms) return 4;  // starts later
    if (signed_by_both) return 3;                                                  // revoked or expired
    if (st == State::proposed || st == State::countered || st == State::accepted) return 2;
    if (st == State::rejected) return 0;
    return 1;  // revoked before it was countersigned, or expired unsigned
  };
  // When it last changed: a signed contract that expired ended at valid_until.
  auto changed_at = [now_ms](const Contract& c) {
    const Version& cur = c.current();
    if (c.state_at(now_ms) == State::expired) return std::max(cur.at_ms, cur.terms.valid_until_ms);
    return cur.at_ms;
  };
  const Contract* best = nullptr;      // in force, latest valid_from
  const Contract* governs = nullptr;   // covering, not in force: see rank
  for (const auto& [id, c] : contracts_) {
    if (c.history.empty() || c.kind() != Kind::stream) continue;
    const StreamTerms& s = c.current().terms.stream;
    if (s.provider != provider || s.consumer != consumer) continue;
    if (!std::binary_search(s.streams.begin(), s.streams.end(), stream)) continue;
    if (c.in_force(now_ms)) {
      if (best == nullptr || c.current().terms.valid_from_ms > best->current().terms.valid_from_ms) best = &c;
      continue;
    }
    if (governs == nullptr) {
      governs = &c;
      continue;
    }
    const int r = rank(c), g = rank(*governs);
    if (r > g || (r == g && changed_at(c) >= changed_at(*governs))) governs = &c;
  }
  if (best != nullptr) return *best;
  if (governs == nullptr) {
    return make_error(Errc::not_found, "no active stream contract from " + std::string(provider) + " to " +
                                           std::string(consumer) + " covers stream " + std::string(stream));
  }
  return make_error(Errc::permission_denied, not_in_force_reason(*governs, now_ms));
}

Status Ledger::add_usage(std::string_view id, uint64_t tuples) {
  std::lock_guard lock(mu_);
  if (contracts_.find(id) == contracts_.end()) return no_contract(id);
  auto it = usage_.find(id);
  if (it == usage_.end()) it = usage_.emplace(std::string(id), Counters{}).first;
  Counters& u = it->second;
  u.tuples = tuples > std::numeric_limits<uint64_t>::max() - u.tuples ? std::numeric_limits<uint64_t>::max()
                                                                       : u.tuples + tuples;
  u.dirty = true;
  return Status::Ok();
}

Status Ledger::add_load(std::string_view id, uint64_t cpu_us) {
  std::lock_guard lock(mu_);
  const auto c = contracts_.find(id);
  if (c == contracts_.end()) return no_contract(id);
  if (c->second.current().terms.kind != Kind::hosting)
    return make_error(Errc::invalid_argument, "contract " + std::string(id.substr(0, 40)) + " is not a hosting contract");
  auto it = usage_.find(id);
  if (it == usage_.end()) it = usage_.emplace(std::string(id), Counters{}).first;
  it->second.load_us = saturating_add(it->second.load_us, cpu_us);
  it->second.dirty = true;
  return Status::Ok();
}

Status Ledger::add_usage_with(const std::map<std::string, uint64_t>& tuples, store::WriteBatch with) {
  std::lock_guard lock(mu_);
  std::map<std::string, uint64_t> totals;
  for (const auto& [id, n] : tuples) {
    if (contracts_.find(id) == contracts_.end()) continue;
    const auto it = usage_.find(id);
    const uint64_t before = it == usage_.end() ? 0 : it->second.tuples;
    const uint64_t after = n > std::numeric_limits<uint64_t>::max() - before ? std::numeric_limits<uint64_t>::max()
                                                                             : before + n;
    totals[id] = after;
    with.put(store::Cf::contracts, usage_key(id),
             usage_json(after, it == usage_.end() ? 0 : it->second.load_us));
  }
  if (with.empty()) return Status::Ok();
  // In memory only once written: a failed write counts nothing, and the
  // caller keeps its marks to try again.
  ENTENTE_RETURN_IF_ERROR(store_.write(with, store::Durability::buffered));
  for (const auto& [id, after] : totals) {
    Counters& u = usage_[id];
    u.tuples = after;
    u.dirty = false;  // just written, with everything counted so far
  }
  return Status::Ok();
}

Status Ledger::flush_usage() {
  std::lock_guard lock(mu_);
  store::WriteBatch batch;
  for (const auto& [id, u] : usage_) {
    if (u.dirty) batch.put(store::Cf::contracts, usage_key(id), usage_json(u.tuples, u.load_us));
  }
  if (batch.empty()) return Status::Ok();
  ENTENTE_RETURN_IF_ERROR(store_.write(batch, store::Durability::buffered));
  for (auto& [id, u] : usage_) u.dirty = false;
  return Status::Ok();
}

Result<Usage> Ledger::usage(std::string_view id) const {
  std::lock_guard lock(mu_);
  const auto c = contracts_.find(id);
  if (c == contracts_.end()) return no_contract(id);
  Usage out;
  if (const auto it = usage_.find(id); it != usage_.end()) {
    out.tuples = it->second.tuples;
    out.load_seconds = static_cast<double>(it->second.load_us) / 1e6;
  }
  const Terms& t = c->second.current().terms;
  out.cost_credits = t.kind == Kind::stream
                         ? static_cast<double>(out.tuples) * static_cast<double>(t.stream.price_per_million) / 1e6
                         : out.load_seconds * static_cast<double>(t.hosting.price_min);
  return out;
}

}  // namespace entente::contracts
