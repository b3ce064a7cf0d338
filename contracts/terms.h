#pragma once
// The terms of a contract (docs/architecture.md, "Contracts"): what a
// stream contract shares, or what a hosting contract lets move, for which
// validity interval.
// Every number is an integer so that the canonical form is unambiguous;
// money is in abstract credits; times are Unix milliseconds, whole seconds.
//
// Plain values; no threading concerns.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"
#include "rapidjson/fwd.h"

namespace entente::engine {
class Schema;
}

namespace entente::contracts {

enum class Kind : uint8_t { stream, hosting };
std::string_view kind_name(Kind k);  // "stream" | "hosting"

// Limits of the terms (docs/contracts.md).
inline constexpr size_t kMaxStreams = 64;
inline constexpr size_t kMaxFields = 256;
inline constexpr size_t kMaxPredicateBytes = 4096;
inline constexpr size_t kMaxBoxKinds = 64;
inline constexpr uint64_t kMaxRateCap = 1'000'000'000;       // tuples per second
inline constexpr uint64_t kMaxPrice = 1'000'000'000'000;     // credits
inline constexpr uint64_t kMaxLoad = 1'000'000;              // CPU ms per second
inline constexpr uint64_t kMaxNoticeSeconds = 366ull * 86400;
inline constexpr int64_t kMaxValiditySpanMs = 3653ll * 86400 * 1000;  // 10 years

struct StreamTerms {
  std::string provider;              // domain sharing the streams
  std::string consumer;              // domain receiving them
  std::vector<std::string> streams;  // provider's stream names without domain prefix; sorted, unique, 1..64
  std::vector<std::string> fields;   // projection, in output order; unique, <= 256; empty = every field
  std::string predicate;             // expression text (engine/expr.h); empty = every tuple; <= 4 KiB
  uint64_t rate_cap = 0;             // tuples per second across the contract's streams; 0 = none
  uint64_t price_per_million = 0;    // credits per million tuples delivered

  friend bool operator==(const StreamTerms&, const StreamTerms&) = default;
};

struct HostingTerms {
  std::string host;                    // domain running the boxes
  std::string owner;                   // domain whose boxes move
  std::vector<std::string> box_kinds;  // engine box types; sorted, unique, 1..64
  uint64_t max_load = 0;               // CPU ms per second, 1..1'000'000
  uint64_t price_min = 0;              // credits per load unit (one CPU-second)
  uint64_t price_max = 0;              // price_min <= price_max
  uint64_t notice_seconds = 0;         // before the host may hand boxes back / a revoke takes effect
  // Privacy: always false in v1; terms with either set are refused.
  bool host_may_subscribe = false;
  bool host_may_export = false;

  friend bool operator==(const HostingTerms&, const HostingTerms&) = default;
};

struct Terms {
  Kind kind = Kind::stream;
  int64_t valid_from_ms = 0;   // inclusive
  int64_t valid_until_ms = 0;  // exclusive; > valid_from; span <= 10 years
  StreamTerms stream;          // when kind == stream (default-valued otherwise)
  HostingTerms hosting;        // when kind == hosting (default-valued otherwise)

  friend bool operator==(const Terms&, const Terms&) = default;
};

// Parses the "terms" object of an API body:
//   {"kind":"stream","provider":"acme","consumer":"beta","streams":["bids"],
//    "fields":[...],"predicate":"...","rate_cap":0,"price_per_million":0,
//    "valid_from":"2026-12-01T00:00:00Z","valid_until":...}
//   {"kind":"hosting","host":...,"owner":...,"box_kinds":[...],"max_load":N,
//    "price_min":N,"price_max":N,"notice_seconds":N,"host_may_subscribe":false,
//    "host_may_export":false,"valid_from":...,"valid_until":...}
// Times are RFC 3339 UTC strings or integer Unix milliseconds (whole
// seconds). Optional: fields, predicate, rate_cap, price_per_million,
// price_min, price_max, notice_seconds, host_may_*. Unknown fields are
// refused. Every problem is reported at once, one "path: message" per line
// (invalid_argument), e.g. "$.terms.streams[2]: invalid stream name 'B!'".
Result<Terms> terms_from_json(const rapidjson::Value& v, std::string_view path = "$.terms");

// Checks every rule terms_from_json checks, on terms built in code or
// received from a peer.
Status validate_terms(const Terms& t, std::string_view path = "$.terms");

// Canonical JSON of the terms: the form above with every field present
// (fields of the other kind absent), keys sorted, times as RFC 3339.
// REQUIRES: validate_terms(t) is ok.
std::string canonical_terms(const Terms& t);

// The provider's catalog, as far as the terms need it: the schema of its
// stream `name` (without the domain prefix), or null when it has none.
using StreamSchemaLookup = std::function<std::shared_ptr<const engine::Schema>(const std::string& name)>;

// Checks stream terms against the provider's catalog, which only the
// provider's node knows: every stream exists, each of them has every
// projected field, and the predicate compiles against each one's schema
// (engine::Expr, the checker enforcement uses) to a bool. Adds one
// diagnostic per problem to `diag`, e.g.
//   $.terms.fields[2]: stream acme/bids has no field 'prise'
//   $.terms.predicate: does not compile against acme/bids: trailing input '&&' at 1:12
// `given_streams`, when not empty, is the streams array as the admin wrote
// it (t.streams is sorted): paths name those positions.
// REQUIRES: validate_terms(t) is ok and t.kind == Kind::stream.
void check_stream_catalog(const Terms& t, const StreamSchemaLookup& schema_of, Diagnostics& diag,
                          const std::vector<std::string>& given_streams = {},
                          std::string_view path = "$.terms");

// The two domains a contract binds: (provider, consumer) or (host, owner).
std::pair<std::string, std::string> parties(const Terms& t);

// The broker's stream name rule (broker/detail/streams.h check_stream_name,
// restated because contracts/ may not include broker/): [a-z][a-z0-9_-]*, at
// most 63 characters.
bool valid_stream_name(std::string_view name);

}  // namespace entente::contracts
