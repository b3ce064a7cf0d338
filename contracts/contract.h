#pragma once
// A contract between two domains and its negotiation (docs/architecture.md,
// "Contracts"): every change is a numbered Version; the state machine says
// who may make which change; apply() is the one check both local changes
// and versions received from the peer domain go through.
//
//   proposed -> countered (any number of times) -> accepted -> active
//   proposed | countered -> rejected            accepted | active -> revoked
//   expired is derived from valid_until, never recorded.
//
// Plain values and pure functions; no threading concerns. The Ledger
// (contracts/ledger.h) persists them.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "certs/signing.h"
#include "certs/trust.h"
#include "contracts/terms.h"
#include "base/result.h"
#include "rapidjson/fwd.h"

namespace entente::contracts {

enum class State : uint8_t { proposed, countered, accepted, active, rejected, revoked, expired };
std::string_view state_name(State s);  // "proposed", ...
// invalid_argument for a name that is not a state.
Result<State> state_from_name(std::string_view name);

inline constexpr size_t kMaxReasonBytes = 1024;
// A negotiation longer than this is refused: every input has a bound.
inline constexpr uint64_t kMaxVersions = 1000;

struct Version {
  uint64_t number = 0;  // 1, 2, ... every change
  // The state recorded by this change: proposed, countered, accepted, active,
  // rejected or revoked.
  State state = State::proposed;
  std::string by;   // domain that made the change
  int64_t at_ms = 0;  // when it was made (by's clock), Unix milliseconds
  Terms terms;      // the terms on the table after this change
  // The version number whose terms this version is about: its own number for
  // proposed/countered; the offer accepted for accepted/active; the offer
  // rejected; the offer in force for revoked.
  uint64_t offer = 0;
  // accepted: the acceptor's; active: the acceptor's, then the countersigner's.
  std::vector<certs::Signature> signatures;
  std::string reason;  // reject/revoke reason, <= 1 KiB

  friend bool operator==(const Version&, const Version&) = default;
};

struct Contract {
  std::string id;                // "c-" + 16 lower-case hex digits, given by the proposer
  std::vector<Version> history;  // number i+1 at index i

  // REQUIRES: !history.empty().
  const Version& current() const { return history.back(); }
  Kind kind() const { return current().terms.kind; }
  // State at `now_ms`: accepted/active become expired once now >= valid_until;
  // otherwise the recorded state (an accepted or active contract that has
  // not started yet shows as such; in_force() says it is not in force).
  State state_at(int64_t now_ms) const;
  // Active, both signatures, and valid_from <= now < valid_until.
  bool in_force(int64_t now_ms) const;
  // A hosting contract revoked while in force, with notice_seconds in the
  // terms in force: when its revocation takes effect for the runs it
  // covers (the revocation's time plus the notice, at most valid_until).
  // The host keeps running what it hosts until then; nothing new is placed
  // under it (in_force is false from the revocation). 0 otherwise.
  int64_t notice_until_ms() const;
  bool in_notice(int64_t now_ms) const { return now_ms < notice_until_ms(); }
};

// A fresh random id: "c-" + 16 lower-case hex digits.
std::string new_contract_id();
bool valid_contract_id(std::string_view id);

// The message a domain signs to accept offer `offer_version` of contract
// `id`: the canonical JSON of
//   {"id":ID,"kind":"stream"|"hosting","terms":{...},"version":N}.
std::string signing_message(const std::string& id, uint64_t offer_version, const Terms& terms);

// Pure transitions: each returns the next Version made by `self` (the domain
// acting) at `now_ms`, or the error saying why it may not be made; none
// changes the contract. `on_version` is the version the actor saw; when it
// is not the current one the error is Errc::conflict "contract c-… is at
// version 5, not 3". Pass the result to apply() (with from = self) to record
// it. Terms are validated (invalid_argument with paths).
Result<Version> propose(std::string_view self, const Terms& terms, int64_t now_ms);
Result<Version> counter(const Contract& c, std::string_view self, uint64_t on_version, const Terms& terms,
                        int64_t now_ms);
// Signs signing_message(id, on_version, terms) with `signer` (its domain acts).
Result<Version> accept(const Contract& c, const certs::Signer& signer, uint64_t on_version, int64_t now_ms);
// The offerer's signature on an accepted offer: state active, both signatures.
Result<Version> countersign(const Contract& c, const certs::Signer& signer, uint64_t on_version,
                            int64_t now_ms);
Result<Version> reject(const Contract& c, std::string_view self, uint64_t on_version, std::string reason,
                       int64_t now_ms);
Result<Version> revoke(const Contract& c, std::string_view self, uint64_t on_version, std::string reason,
                       int64_t now_ms);

// The whole check of a next version `v` made by `from` (the authenticated
// peer domain, or self for a local change): its number is current + 1
// (else conflict), its `by` is `from` and `from` may make this transition
// (else permission_denied), counters carry well-formed terms of the same
// kind and parties, accept/reject/revoke/active carry the terms they are
// about, and signatures are exactly the ones the state needs, each valid
// for signing_message(id, offer, terms) at `now` under `trust` (else
// permission_denied saying which check failed). For a new contract,
// c.history is empty and c.id is set.
Status check_next(const Contract& c, const Version& v, std::string_view from, const certs::TrustStore& trust,
                  certs::Clock::time_point now = certs::Clock::now());
// check_next without the signature verification: the state machine's rules
// alone (the Ledger checks them on every append).
Status check_transition(const Contract& c, const Version& v, std::string_view from);
// check_next, then appends `v`. On error `c` is unchanged.
Status apply(Contract& c, Version v, std::string_view from, const certs::TrustStore& trust,
             certs::Clock::time_point now = certs::Clock::now());

// The version as JSON (canonical form, so that both ledgers hold identical
// bytes): {"at_ms","by","number","offer","reason","signatures":[{"algorithm",
// "certificate","domain","node","value"}],"state","terms"}.
std::string version_to_json(const Version& v);
// Parses and bounds every field; path-named errors (invalid_argument).
// Terms are validated; transition rules are apply()'s business.
Result<Version> version_from_json(const rapidjson::Value& v, std::string_view path = "$");
// Parses a whole text (at most 1 MiB).
Result<Version> version_from_text(std::string_view text);

// The API view: {"id","kind","parties":[a,b],"state" (at now),"in_force",
// "version" (current number),"terms" (current),"history":[versions]}.
// REQUIRES: !c.history.empty().
std::string contract_to_json(const Contract& c, int64_t now_ms);

}  // namespace entente::contracts
