#include "contracts/hosting.h"

#include <algorithm>

#include "certs/certs.h"
#include "contracts/canonical.h"

namespace entente::contracts {

namespace {

// Why a hosting contract is not in force at `now_ms`.
std::string not_in_force(const Contract& c, int64_t now_ms) {
  const Version& cur = c.current();
  std::string why;
  switch (c.state_at(now_ms)) {
    case State::expired: why = "expired at " + format_time(cur.terms.valid_until_ms); break;
    case State::revoked: why = "revoked by " + cur.by + ": " + cur.reason; break;
    case State::rejected: why = "rejected by " + cur.by; break;
    case State::active:
      why = now_ms < cur.terms.valid_from_ms ? "starts " + format_time(cur.terms.valid_from_ms)
                                             : "not signed by both parties";
      break;
    default: why = std::string(state_name(cur.state)) + ", not active"; break;
  }
  return "contract " + c.id + " is not in force (" + why + ")";
}

}  // namespace

Result<HostingGrant> may_host(const Ledger& ledger, const HostingRequest& r, int64_t now_ms) {
  if (!certs::valid_name(r.owner) || !certs::valid_name(r.host)) {
    return make_error(Errc::invalid_argument, "hosting request names an invalid owner or host domain");
  }
  if (r.box_kind.empty() || r.box_kind.size() > 64) {
    return make_error(Errc::invalid_argument, "hosting request names no box kind");
  }
  if (r.load < 1 || r.load > kMaxLoad || r.hosted_load > kMaxLoad) {
    return make_error(Errc::invalid_argument, "hosting request load must be 1.." + std::to_string(kMaxLoad) +
                                                  " and hosted load at most " + std::to_string(kMaxLoad) +
                                                  " CPU ms/s");
  }
  ContractFilter filter;
  filter.kind = Kind::hosting;
  filter.peer = r.host;
  std::vector<Contract> all = ledger.list(filter, now_ms);
  std::vector<const Contract*> between;
  for (const auto& c : all) {
    const HostingTerms& h = c.current().terms.hosting;
    if (h.host == r.host && h.owner == r.owner) between.push_back(&c);
  }
  if (between.empty()) {
    return make_error(Errc::not_found, "no hosting contract from host " + r.host + " for owner " + r.owner);
  }
  // Medusa: the cheapest contract first.
  std::sort(between.begin(), between.end(), [](const Contract* a, const Contract* b) {
    const uint64_t pa = a->current().terms.hosting.price_min, pb = b->current().terms.hosting.price_min;
    return pa != pb ? pa < pb : a->id < b->id;
  });
  const Contract* first_in_force = nullptr;
  const Contract* first_with_kind = nullptr;
  for (const Contract* c : between) {
    if (!c->in_force(now_ms)) continue;
    if (first_in_force == nullptr) first_in_force = c;
    const HostingTerms& h = c->current().terms.hosting;
    if (!std::binary_search(h.box_kinds.begin(), h.box_kinds.end(), r.box_kind)) continue;
    if (first_with_kind == nullptr) first_with_kind = c;
    if (r.load + r.hosted_load > h.max_load) continue;
    return HostingGrant{c->id, h.price_min, h.price_max, h.max_load, h.notice_seconds,
                        c->current().terms.valid_until_ms};
  }
  // No: the most specific reason, about the cheapest contract it concerns.
  if (first_with_kind != nullptr) {
    return make_error(Errc::permission_denied,
                      "load " + std::to_string(r.load) + " + " + std::to_string(r.hosted_load) +
                          " hosted exceeds contract " + first_with_kind->id + "'s maximum " +
                          std::to_string(first_with_kind->current().terms.hosting.max_load) + " CPU ms/s");
  }
  if (first_in_force != nullptr) {
    return make_error(Errc::permission_denied,
                      "box kind '" + r.box_kind + "' is not in contract " + first_in_force->id);
  }
  return make_error(Errc::permission_denied, not_in_force(*between.front(), now_ms));
}

Result<HostingGrant> may_host_fragment(const Ledger& ledger, const FragmentHostingRequest& r, int64_t now_ms) {
  if (r.box_kinds.empty()) return make_error(Errc::invalid_argument, "hosting request names no box kind");
  // Each kind on its own first: the refusal of the first kind no contract
  // permits is the most specific reason.
  for (const std::string& kind : r.box_kinds) {
    auto g = may_host(ledger, HostingRequest{r.owner, r.host, kind, r.load, r.hosted_load}, now_ms);
    if (!g.ok()) return g.error();
  }
  std::vector<std::string> kinds = r.box_kinds;
  std::sort(kinds.begin(), kinds.end());
  kinds.erase(std::unique(kinds.begin(), kinds.end()), kinds.end());
  ContractFilter filter;
  filter.kind = Kind::hosting;
  filter.peer = r.host;
  const std::vector<Contract> all = ledger.list(filter, now_ms);
  const Contract* best = nullptr;
  for (const Contract& c : all) {
    const HostingTerms& h = c.current().terms.hosting;
    if (h.host != r.host || h.owner != r.owner || !c.in_force(now_ms)) continue;
    if (r.load + r.hosted_load > h.max_load) continue;
    // box_kinds are stored sorted (terms.h).
    if (!std::includes(h.box_kinds.begin(), h.box_kinds.end(), kinds.begin(), kinds.end())) continue;
    if (best != nullptr) {
      const uint64_t pb = best->current().terms.hosting.price_min;
      if (h.price_min > pb || (h.price_min == pb && c.id > best->id)) continue;
    }
    best = &c;
  }
  if (best == nullptr) {
    std::string each;
    for (size_t i = 0; i < kinds.size(); ++i) each += (i ? ", " : "") + kinds[i];
    return make_error(Errc::permission_denied, "no one hosting contract from host " + r.host + " for owner " +
                                                   r.owner + " permits every box kind of the fragment (" + each +
                                                   ")");
  }
  const HostingTerms& h = best->current().terms.hosting;
  return HostingGrant{best->id, h.price_min, h.price_max, h.max_load, h.notice_seconds,
                      best->current().terms.valid_until_ms};
}

}  // namespace entente::contracts
