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
//   {"type":"contract.version","id":"c-…","version":{…},"held":N}  one
//       version; `held` is the sender's latest version of that contract
//       (more follow when it is larger; absent from older senders).
// A version whose number skips ahead answers with a sync, so a gap is
// filled by the sender; a duplicate is ignored. When the peer accepts an
// offer this domain made, this node countersigns it at once (it offered
// those terms): the contract becomes active with both signatures.
//
// After a restore (docs/operations.md) the peer holds versions this
// domain made and this node lost. They come back like the peer's own and
// are recorded when they pass every check a local change passes, the
// signatures included: the peer cannot forge this domain's acceptance or
// countersignature. Offers and reasons carry no signature, so an offer
// in this domain's name that came from the peer is marked in the store,
// and this node never countersigns an acceptance of it. Once every
// contract the peer's sync showed ahead is caught up, this node syncs
// again; the peer, seeing it holds what it was sent, runs `changed`
// (imports refused meanwhile try again).
//
// Nothing loops: a gap asks for a sync once per version held (until the
// link comes up again), a refused version is not asked for again, and
// refusals are logged at most kRefusalLogBurst times per 10 s (the rest
// are counted in entente_contract_refusals_total and summed up in one
// line). entente_contract_messages_total counts what is sent and received.
//
// Ownership: owned by Peering (federation/peering.h); borrows the Store. Threading: API calls on
// Asio threads, link events on the io thread; the Ledger serialises
// changes, and sending happens after the ledger's lock is released. The
// sync state has its own mutex, never held while sending or calling a hook.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/metrics.h"
#include "rapidjson/fwd.h"
#include "certs/certs.h"
#include "certs/signing.h"
#include "certs/trust.h"
#include "contracts/ledger.h"
#include "base/result.h"
#include "store/store.h"

namespace entente::federation {

class Contracting final {
 public:
  struct Hooks {
    // Sends a CONTROL message to one node of `domain` whose link is up;
    // false when none is.
    std::function<bool(const std::string& domain, const std::string& message)> send_to_domain;
    // Sends a CONTROL message to one peer node; false when its link is down.
    std::function<bool(const certs::Identity& peer, const std::string& message)> send_to_peer;
    // After every version recorded (local or from the peer), and when the
    // peer's sync shows it caught up with versions this node sent it (a
    // restored peer): enforcement re-checks the flows under the contract,
    // and imports refused under it try again.
    std::function<void(const contracts::Contract&)> changed;
    std::function<void(const std::string&)> log;
  };

  // `peer_domains`: the domains this node may negotiate with (its
  // configured peers other than its own domain).
  static Result<std::unique_ptr<Contracting>> open(store::Store& store, certs::Signer signer,
                                                    std::shared_ptr<const certs::TrustStore> trust,
                                                    std::vector<std::string> peer_domains,
                                                    base::Registry& metrics, Hooks hooks);

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

  // Writes usage counted since the last flush (the timer calls it), and
  // logs how many refusals went unlogged once their window is over.
  void flush_usage();

  // Refusal log lines per window; the rest are counted and summed up.
  static constexpr int kRefusalLogBurst = 10;

 private:
  Contracting(store::Store& store, std::unique_ptr<contracts::Ledger> ledger, certs::Signer signer,
              std::shared_ptr<const certs::TrustStore> trust, std::vector<std::string> peer_domains,
              base::Registry& metrics, Hooks hooks);

  // Records a local version and sends it to the other party.
  Result<Outcome> record(const std::string& id, const contracts::Version& v);
  bool send_version(const std::string& domain, const std::string& id, const contracts::Version& v);
  void send_sync(const certs::Identity& peer);
  void on_sync(const certs::Identity& peer, const rapidjson::Value& have);
  void on_version(const certs::Identity& peer, const std::string& id, const rapidjson::Value& version,
                  uint64_t held);
  // The steps of on_version. The version the message carries, when it is
  // well formed and binds the peer's domain and this one (else refused).
  std::optional<contracts::Version> incoming_version(const certs::Identity& peer, const std::string& id,
                                                     const rapidjson::Value& json);
  // Records the next version `v` (the ledger is at `current`); refuses it
  // and remembers not to ask for it again when the ledger does not take it.
  std::optional<contracts::Contract> record_incoming(const certs::Identity& peer, const std::string& id,
                                                     const contracts::Version& v, uint64_t current);
  // Metrics, log, hooks and the sync state after `v` was recorded.
  void note_recorded(const certs::Identity& peer, const std::string& id, const contracts::Version& v,
                     uint64_t held, const contracts::Contract& recorded);
  // The peer accepted an offer in this domain's name: countersigns it,
  // unless it is an offer that came back after a restore.
  void countersign_accepted(const certs::Identity& peer, const std::string& id, const contracts::Version& v,
                            const contracts::Contract& recorded);
  // A gap before version current + 1 of `id`: asks the peer for a sync,
  // unless this node asked already at `current` (or refused the version
  // after it) since the link came up.
  void ask_for_gap(const certs::Identity& peer, const std::string& id, uint64_t current);
  // Whether offer `v` (version v.number of `id`, made in this domain's
  // name) came back from the peer rather than from this node's admin.
  bool returned_offer(const std::string& id, const contracts::Version& v) const;
  bool is_peer_domain(std::string_view domain) const;
  void refused(const certs::Identity& peer, const std::string& reason, const std::string& label);
  void count_message(const char* type, const char* direction);
  // The summary line of refusals left out, once their window is over ("" if none).
  std::string take_refusal_summary(std::chrono::steady_clock::time_point now);  // REQUIRES: sync_mu_ held

  // What the sync protocol knows of one peer domain.
  struct PeerSync {
    // Contracts the peer's last sync showed it holds more versions of than
    // this node; when the last of them is caught up (caught_any), this
    // node syncs again so that the peer learns it.
    std::set<std::string, std::less<>> catching_up;
    bool caught_any = false;
    // Contract -> the version this node held when a gap made it ask for a
    // sync or when it refused the next version: not asked again at that
    // number until the link comes up again.
    std::map<std::string, uint64_t, std::less<>> stuck_at;
    // Contracts this node sent versions of in answer to the peer's sync;
    // when a later sync shows the peer holds them, `changed` runs.
    std::set<std::string, std::less<>> sent_behind;
  };

  store::Store& store_;
  std::unique_ptr<contracts::Ledger> ledger_;
  certs::Signer signer_;
  std::shared_ptr<const certs::TrustStore> trust_;
  std::string self_;
  std::vector<std::string> peer_domains_;
  base::Registry& metrics_;
  Hooks hooks_;
  uint64_t collector_ = 0;  // /metrics: contracts by state, usage per contract

  std::mutex sync_mu_;
  std::map<std::string, PeerSync, std::less<>> peers_;  // by peer domain; guarded by sync_mu_
  // The refusal log's window (guarded by sync_mu_).
  std::chrono::steady_clock::time_point refusal_window_{};
  int refusal_lines_ = 0;
  uint64_t refusals_unlogged_ = 0;
};

// The other party of a contract, seen from `self`.
std::string other_party(const contracts::Contract& c, std::string_view self);

}  // namespace entente::federation
