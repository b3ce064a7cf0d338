#pragma once
// Two real brokers that negotiate stream contracts over REST, for the
// contract integration tests (docs/contracts.md):
//
//   TwoDomains d;
//   ASSERT_NO_FATAL_FAILURE(d.start());       // acme has "bids", no exports
//   const std::string id = d.agree(stream_terms(1, seconds_from_now(-60),
//                                               seconds_from_now(3600)));
//   import_stream(*d.beta, "acme/bids");      // flows under contract `id`
//
// Not thread-safe; used from the test's thread.

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/federation.h"

namespace entente::testing {

// Unix milliseconds `s` whole seconds from now (terms take whole seconds).
int64_t seconds_from_now(int64_t s);

// The terms of a stream contract from acme to beta on "bids", as JSON.
// `fields` is the projection's JSON array; `extra` more members of the
// terms without the leading comma (e.g. R"("predicate":"price >= 500")").
std::string stream_terms(int64_t price, int64_t from_ms, int64_t until_ms,
                         const std::string& fields = R"(["auction","price"])", const std::string& extra = {});

// A contract as GET /v1/contracts/{id} (or an action's answer) shows it.
struct ContractView {
  unsigned status = 0;
  std::string body;
  std::string id, state;
  uint64_t version = 0;
  bool in_force = false;
  std::string history;              // the "history" array, re-serialised
  std::vector<std::string> states;  // of each version
  size_t last_signatures = 0;
};
ContractView parse_contract(unsigned status, const std::string& body);

// GET /v1/contracts/{id}.
ContractView get_contract(const FedNode& n, const std::string& id, const std::string& token = kReaderToken);
// Waits until `n` holds version `version` of contract `id`.
ContractView wait_version(const FedNode& n, const std::string& id, uint64_t version,
                          std::chrono::milliseconds timeout = std::chrono::seconds(10));
// POST /v1/contracts/{id}/{action} with `body`.
ContractView act(const FedNode& n, const std::string& id, const std::string& action, const std::string& body,
                 const std::string& token = kAdminToken);

// An unsigned integer member of a JSON object; 0 when absent.
uint64_t uint_field(const std::string& body, const char* key);

// Two linked domains; acme has a stream "bids" and no configured exports:
// only a contract can share it.
struct TwoDomains {
  Federation fed;
  FedNode* acme = nullptr;
  FedNode* beta = nullptr;

  void start();
  // Proposes on acme; returns the new contract's id once beta holds it.
  std::string propose(const std::string& terms);
  // propose -> accept by beta -> countersigned by acme: active on both.
  std::string agree(const std::string& terms);
};

}  // namespace entente::testing
