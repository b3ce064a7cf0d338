// One contract ledger per domain (docs/cluster.md, "One ledger per
// domain"): every version a node of a domain of several nodes stores is
// first recorded in etcd, under the domain's catalog, by a transaction that
// only creates it if that number is free; the other nodes append what they
// find there to their own ledgers. So whichever node negotiated a contract,
// the node that leads the stream enforces it, and every node shows it.

#include <cinttypes>
#include <cstdio>

#include "broker/detail/node_impl.h"
#include "cluster/catalog.h"
#include "contracts/contract.h"
#include "contracts/ledger.h"
#include "federation/contracting.h"
#include "federation/peering.h"
#include "rapidjson/document.h"

namespace entente::broker::detail {
namespace {

// "contracts/ID/000007": zero-padded, so the catalog lists versions in order.
std::string version_key(const std::string& id, uint64_t number) {
  char n[24];
  std::snprintf(n, sizeof n, "%06" PRIu64, number);
  return "contracts/" + id + "/" + n;
}

contracts::Ledger* ledger_of(Peering* peering) {
  if (peering == nullptr || peering->contracting() == nullptr) return nullptr;
  return &peering->contracting()->ledger();
}

}  // namespace

void NodeImpl::share_ledger() {
  contracts::Ledger* ledger = ledger_of(peering_.get());
  if (!catalog_ || ledger == nullptr) return;
  ledger->set_gate([this](const std::string& id, const contracts::Version& v, const std::string& json) -> Status {
    const std::string key = version_key(id, v.number);
    auto rev = catalog_->create(key, json);
    if (rev.ok()) return {};
    if (rev.error().code != Errc::already_exists) {
      return make_error(Errc::unavailable, "recording version " + std::to_string(v.number) + " of contract " + id +
                                               " in the domain's ledger (etcd) failed: " + rev.error().message);
    }
    // Already there: the same version (copied from another node, or this
    // node's own earlier attempt) passes; a different one lost the race.
    auto stored = catalog_->read(key);
    if (stored.ok() && *stored && (*stored)->value == json) return {};
    return make_error(Errc::conflict, "another node of domain " + config_.domain + " recorded version " +
                                          std::to_string(v.number) + " of contract " + id +
                                          " differently first; this one is refused");
  });
}

void NodeImpl::reconcile_contracts() {
  contracts::Ledger* ledger = ledger_of(peering_.get());
  if (!catalog_ || ledger == nullptr || !catalog_->synced()) return;
  std::lock_guard lock(contracts_reconcile_mu_);
  // The domain's versions this node lacks, in order.
  for (const auto& e : catalog_->list("contracts/")) {
    const size_t slash = e.key.rfind('/');
    if (slash == std::string::npos || slash <= 10) continue;
    const std::string id = e.key.substr(10, slash - 10);
    const uint64_t number = std::strtoull(e.key.c_str() + slash + 1, nullptr, 10);
    if (ledger->versions(id) + 1 != number) continue;
    rapidjson::Document d;
    d.Parse(e.value.data(), e.value.size());
    if (d.HasParseError()) continue;
    auto v = contracts::version_from_json(d);
    if (!v.ok()) {
      base::logf(LogLevel::warn, "contracts", "the domain's ledger holds %s, which does not parse: %s\n", e.key.c_str(),
                   v.error().message.c_str());
      continue;
    }
    if (Status s = ledger->append(id, *v); !s.ok()) {
      base::logf(LogLevel::warn, "contracts", "copying %s from the domain's ledger failed: %s\n", e.key.c_str(),
                   s.error().message.c_str());
    }
  }
  // This node's versions the domain lacks: stored before the cluster
  // section, or while etcd could not be told.
  for (const auto& c : ledger->list(contracts::ContractFilter{}, wall_clock_ms())) {
    for (const auto& v : c.history) {
      const std::string key = version_key(c.id, v.number);
      if (!catalog_->get(key)) (void)catalog_->create(key, contracts::version_to_json(v));
    }
  }
}

}  // namespace entente::broker::detail
