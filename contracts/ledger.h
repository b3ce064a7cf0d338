#pragma once
// The contracts ledger (docs/architecture.md, "Where state lives" and
// "Contracts"): every version of every contract this domain is party to,
// in the store's `contracts` column family, plus what each contract carried
// (usage).
//
// Keys:  v/<id>/<number, 8 bytes big-endian> -> version JSON (canonical),
//        written with Durability::synced before append() returns;
//        u/<id> -> {"load_seconds":N,"load_us":N,"tuples":N}, written by flush_usage()
//        with Durability::buffered (a crash may lose the usage counted since
//        the last flush, never a contract version), or by add_usage_with()
//        at once, atomically with what the caller marks counted.
//
// Ownership: borrows the Store, which must outlive the Ledger.
// Threading: every member may be called from any thread (one mutex; it is
// held across the synced write of append() so versions land in order).
// Lifecycle: open() loads everything; there is nothing to stop.

#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "certs/trust.h"
#include "contracts/contract.h"
#include "base/result.h"
#include "store/store.h"

namespace entente::contracts {

struct ContractFilter {
  std::optional<State> state;  // state at `now` (expired included)
  std::string peer;            // the other party; empty = any
  std::optional<Kind> kind;
};

struct Usage {
  uint64_t tuples = 0;         // tuples delivered under a stream contract
  double load_seconds = 0;     // CPU-seconds hosted under a hosting contract
  double cost_credits = 0;     // at the contract's current price (see usage())
};

class Ledger final {
 public:
  // Loads every contract and usage record. corrupt when a stored version
  // does not parse or numbers have a gap; io_error from the store.
  static Result<std::unique_ptr<Ledger>> open(store::Store& store);
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Called under the ledger's lock once a version passed every check and
  // before it is stored: a domain of several nodes records it in the
  // domain's one ledger first (docs/cluster.md, "One ledger per domain"),
  // so two nodes cannot store different versions under one number. An
  // error refuses the version; nothing is stored. `json` is the version's
  // stored form (version_to_json).
  using Gate = std::function<Status(const std::string& id, const Version& v, const std::string& json)>;
  void set_gate(Gate gate);
  // How many versions of contract `id` this ledger holds (0: none).
  uint64_t versions(std::string_view id) const;

  // not_found "no contract c-…".
  Result<Contract> get(std::string_view id) const;
  // Contracts matching `filter` at `now_ms`, by id.
  std::vector<Contract> list(const ContractFilter& filter, int64_t now_ms) const;

  // Persists `v` as the next version of contract `id` (a new contract when
  // v.number == 1), then records it in memory. conflict when v.number is
  // not current + 1 (or 1 for an id not seen yet); the transition rules
  // (without signatures) are checked too, with from = v.by.
  Status append(const std::string& id, const Version& v);

  // check_next (signatures included) against the contract as it is now,
  // then append, under one lock: the check and the write cannot interleave
  // with another change. Returns the contract as recorded.
  Result<Contract> apply(const std::string& id, const Version& v, std::string_view from,
                         const certs::TrustStore& trust, certs::Clock::time_point now = certs::Clock::now());

  // The in-force stream contract from `provider` to `consumer` covering
  // `stream` at `now_ms` (several: the one with the latest valid_from).
  // not_found "no active stream contract from acme to beta covers stream
  // bids" when no contract (in any state) covers it; permission_denied with
  // the reason when one does but is not in force ("stream contract c-…
  // expired at 2026-…", "… starts at …", "… was revoked by acme: …",
  // "… is countered, not active"). Of several covering contracts none of
  // which is in force, the reason names the one that governs: one signed
  // by both parties (not started yet first, then the latest to end) before
  // one under negotiation, before a rejected one.
  Result<Contract> find_stream_contract(std::string_view provider, std::string_view consumer,
                                        std::string_view stream, int64_t now_ms) const;

  // Counts tuples delivered under contract `id` (in memory; saturating).
  // not_found for an unknown contract.
  Status add_usage(std::string_view id, uint64_t tuples);
  // Counts CPU time hosted under hosting contract `id` (in memory,
  // saturating; flush_usage writes it): the host's measure, counted by the
  // host and by the owner it reports to (docs/cluster.md, "The hosted
  // run"). not_found for an unknown contract, invalid_argument for a
  // stream contract.
  Status add_load(std::string_view id, uint64_t cpu_us);
  // Adds tuples to the usage of several contracts (contract id -> tuples)
  // and writes their new counts at once, in one atomic write together with
  // `with` (what marks those tuples counted), so that a count and its mark
  // cannot part in a crash: each tuple is counted once. Buffered: a killed
  // process loses nothing (RocksDB's log is written before it returns); a
  // machine crash may lose the last writes, count and mark together.
  // Contracts the ledger does not hold are left out.
  Status add_usage_with(const std::map<std::string, uint64_t>& tuples, store::WriteBatch with);
  // Writes the usage of every contract changed since the last flush.
  Status flush_usage();
  // Usage so far (flushed or not) and its cost: stream contracts
  // tuples * price_per_million / 1e6; hosting contracts load_seconds *
  // price_min (the bounded price's floor, until moves negotiate a price).
  Result<Usage> usage(std::string_view id) const;

 private:
  explicit Ledger(store::Store& store) : store_(store) {}
  Status load();
  Status append_locked(const std::string& id, const Version& v);  // REQUIRES: mu_ held

  struct Counters {
    uint64_t tuples = 0;
    uint64_t load_us = 0;  // CPU microseconds hosted
    bool dirty = false;
  };

  store::Store& store_;
  mutable std::mutex mu_;
  std::map<std::string, Contract, std::less<>> contracts_;  // guarded by mu_
  Gate gate_;  // guarded by mu_
  std::map<std::string, Counters, std::less<>> usage_;      // guarded by mu_
};

// Store keys of the ledger (exposed for tests and tools).
std::string version_key(std::string_view id, uint64_t number);
std::string usage_key(std::string_view id);

}  // namespace entente::contracts
