#pragma once
// Metering of stream contracts (docs/contracts.md, "Metering"): a contract
// is charged for the rows a consumer acknowledged as durable, each once.
// DATA is noted with its range and rows before it is sent (note_sent,
// durably); an ACK through N (also one arriving after this node ended the
// channel), or an OPEN from N+1 (the consumer has everything before it,
// refused or not), charges the noted ranges up to N to the contract each
// was sent under (charge_through), in one atomic write with the usage. An
// accepted OPEN also forgets ranges after N: they are sent again and noted
// again.
//
// The ranges are mirrored in the `meta` family under
// "unbilled/DOMAIN/STREAM/<first, 8 bytes big-endian>" -> last (8 bytes),
// rows (8 bytes), contract id, so a restart of this node charges them all
// the same (load()).
//
// Threading: any thread; one mutex, held across the store write so that
// the ranges in memory and in the store change together.

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "base/result.h"
#include "store/store.h"

namespace entente::contracts {
class Ledger;
}

namespace entente::federation {

class Metering final {
 public:
  Metering(store::Store& store, std::function<void(const std::string&)> log);

  // The ledger usage is charged to; without one (no contracts), charged
  // ranges are only erased.
  void set_ledger(contracts::Ledger* ledger) { ledger_ = ledger; }
  // Reads the ranges noted before a restart.
  Status load();

  void note_sent(const std::string& stream, const std::string& domain, const std::string& contract,
                 uint64_t first, uint64_t last, uint64_t rows);
  void charge_through(const std::string& stream, const std::string& domain, uint64_t through,
                      bool forget_after);

  // Ranges noted and not charged for (stream, domain), for tests: first ->
  // {last, rows}.
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> unbilled(const std::string& stream,
                                                              const std::string& domain);

 private:
  struct Unbilled {
    uint64_t last;
    uint64_t rows;
    std::string contract;
  };

  store::Store& store_;
  contracts::Ledger* ledger_ = nullptr;
  std::function<void(const std::string&)> log_;
  std::mutex mu_;
  // Per (stream, consumer domain): first -> range, ranges disjoint.
  std::map<std::pair<std::string, std::string>, std::map<uint64_t, Unbilled>> unbilled_;  // REQUIRES: mu_
};

}  // namespace entente::federation
