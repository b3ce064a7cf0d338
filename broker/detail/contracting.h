#pragma once
// Contract negotiation on this node (docs/contracts.md): the admin's REST
// actions become versions in the ledger, and the versions travel to the
// other domain as CONTROL messages on the federation link
// (docs/protocol.md §13). Both ledgers hold every version; a version from
// the peer goes through the same check as a local one (contracts::
// check_next, signatures included) before it is recorded.
//
// Messages (JSON objects on CONTROL frames):
//   {"type":"contract.sync","have":{"c-…":N,...}}  sent when a link comes up:
//       the versions this node holds of contracts with the peer's domain;
//       the peer answers with every version it holds beyond those.
//   {"type":"contract.version","id":"c-…","version":{…}}  one new version.
// A version whose number skips ahead answers with a sync, so a gap is
// filled by the sender; a duplicate is ignored. When the peer accepts an
// offer this domain made, this node countersigns it at once (it offered
// those terms): the contract becomes active with both signatures.
//
// Ownership: owned by Peering; borrows the Store. Threading: API calls on
// Asio threads, link events on the io thread; the Ledger serialises
// changes, and sending happens after the ledger's lock is released.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "broker/metrics.h"
#include "rapidjson/fwd.h"
#include "certs/certs.h"
#include "certs/signing.h"
#include "certs/trust.h"
#include "contracts/ledger.h"
#include "engine/result.h"
#include "store/store.h"

namespace entente::broker::detail {

class Contracting final {
 public:
  struct Hooks {
    // Sends a CONTROL message to one node of `domain` whose link is up;
    // false when none is.
    std::function<bool(const std::string& domain, const std::string& message)> send_to_domain;
    // Sends a CONTROL message to one peer node; false when its link is down.
    std::function<bool(const certs::Identity& peer, const std::string& message)> send_to_peer;
    // After every version recorded (local or from the peer): enforcement
    // re-checks the flows under the contract.
    std::function<void(const contracts::Contract&)> changed;
    std::function<void(const std::string&)> log;
  };

  // `peer_domains`: the domains this node may negotiate with (its
  // configured peers other than its own domain).
  static Result<std::unique_ptr<Contracting>> open(store::Store& store, certs::Signer signer,
                                                    std::shared_ptr<const certs::TrustStore> trust,
                                                    std::vector<std::string> peer_domains,
                                                    Registry& metrics, Hooks hooks);

  // What an action did: the contract as recorded, and whether the new
  // version reached a node of the other domain now (otherwise it goes when
  // the link is up again).
  struct Outcome {
    contracts::Contract contract;
    bool delivered = false;
  };

  // The admin's actions. Errors: invalid_argument (terms, with paths),
  // not_found (no such contract; an unknown peer domain), conflict (a stale
  // version: "contract c-… is at version 5, not 3"), permission_denied (not
  // this domain's turn, or not a party).
  Result<Outcome> propose(const contracts::Terms& terms);
  Result<Outcome> counter(const std::string& id, uint64_t on_version, const contracts::Terms& terms);
  Result<Outcome> accept(const std::string& id, uint64_t on_version);
  // What propose() or counter() would record, checked the same way (terms,
  // parties, turn, version), recorded and sent nowhere: ?dry_run=true.
  Result<contracts::Version> check_propose(const contracts::Terms& terms) const;
  Result<contracts::Version> check_counter(const std::string& id, uint64_t on_version,
                                           const contracts::Terms& terms) const;
  Result<Outcome> reject(const std::string& id, uint64_t on_version, std::string reason);
  Result<Outcome> revoke(const std::string& id, uint64_t on_version, std::string reason);

  ~Contracting();
  Contracting(const Contracting&) = delete;
  Contracting& operator=(const Contracting&) = delete;

  contracts::Ledger& ledger() { return *ledger_; }
  const std::string& domain() const { return self_; }

  // Link events (io thread).
  void on_link_up(const certs::Identity& peer);
  void on_control(const certs::Identity& peer, std::string_view message);

  // Writes usage counted since the last flush (the timer calls it).
  void flush_usage();

 private:
  Contracting(std::unique_ptr<contracts::Ledger> ledger, certs::Signer signer,
              std::shared_ptr<const certs::TrustStore> trust, std::vector<std::string> peer_domains,
              Registry& metrics, Hooks hooks);

  // Records a local version and sends it to the other party.
  Result<Outcome> record(const std::string& id, const contracts::Version& v);
  bool send_version(const std::string& domain, const std::string& id, const contracts::Version& v);
  void send_sync(const certs::Identity& peer);
  void on_sync(const certs::Identity& peer, const rapidjson::Value& have);
  void on_version(const certs::Identity& peer, const std::string& id, const rapidjson::Value& version);
  bool is_peer_domain(std::string_view domain) const;
  void refused(const certs::Identity& peer, const std::string& reason, const std::string& label);

  std::unique_ptr<contracts::Ledger> ledger_;
  certs::Signer signer_;
  std::shared_ptr<const certs::TrustStore> trust_;
  std::string self_;
  std::vector<std::string> peer_domains_;
  Registry& metrics_;
  Hooks hooks_;
  uint64_t collector_ = 0;  // /metrics: contracts by state, usage per contract
};

// The other party of a contract, seen from `self`.
std::string other_party(const contracts::Contract& c, std::string_view self);

}  // namespace entente::broker::detail
