#pragma once
// The hosting check (docs/architecture.md, "Contracts"): may a box of kind
// K, owned by domain O, with load L, move to host domain H now? And may a
// fragment, several boxes of several kinds moving together? The functions
// the fragment-moving code calls (docs/cluster.md, "Moving a fragment to
// another domain"); they answer from the ledger alone.

#include <cstdint>
#include <string>
#include <vector>

#include "contracts/ledger.h"
#include "base/result.h"

namespace entente::contracts {

struct HostingRequest {
  std::string owner;         // domain whose box moves
  std::string host;          // domain that would run it
  std::string box_kind;      // engine box type, e.g. "filter"
  uint64_t load = 0;         // the box's load, CPU ms per second (1..1'000'000)
  uint64_t hosted_load = 0;  // what `host` already runs for `owner` under contracts (0..1'000'000)
};

// The contract that permits a move, with the terms the move runs under.
struct HostingGrant {
  std::string contract_id;
  uint64_t price_min = 0;  // credits per CPU-second
  uint64_t price_max = 0;
  uint64_t max_load = 0;   // CPU ms per second
  uint64_t notice_seconds = 0;
  int64_t valid_until_ms = 0;
};

// Yes (the cheapest in-force contract that permits the move: lowest
// price_min, then id) or no with the reason:
//   not_found          "no hosting contract from host gamma for owner acme"
//   permission_denied  "contract c-… is not in force (starts 2026-…)",
//                      "box kind 'join' is not in contract c-…",
//                      "load 300 + 800 hosted exceeds contract c-…'s maximum
//                       1000 CPU ms/s"
//   invalid_argument   a malformed request.
Result<HostingGrant> may_host(const Ledger& ledger, const HostingRequest& request, int64_t now_ms);

// A fragment: boxes of several kinds that move together and run under one
// contract.
struct FragmentHostingRequest {
  std::string owner;
  std::string host;
  std::vector<std::string> box_kinds;  // 1.. kinds (repeats allowed)
  uint64_t load = 0;         // the fragment's load, CPU ms per second (1..1'000'000)
  uint64_t hosted_load = 0;  // what `host` already runs for `owner` (0..1'000'000)
};

// Yes with the cheapest in-force contract (lowest price_min, then id) that
// permits every kind of the fragment and whose maximum covers load +
// hosted_load; or no: may_host's answer for the first kind (in the order
// given) that no contract permits, else, when each kind is permitted by
// some contract but no one contract permits them all, permission_denied
// "no one hosting contract from host beta for owner acme permits every box
// kind of the fragment (aggregate, join)". invalid_argument for no kind.
Result<HostingGrant> may_host_fragment(const Ledger& ledger, const FragmentHostingRequest& request,
                                       int64_t now_ms);

}  // namespace entente::contracts
