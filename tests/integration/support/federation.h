#pragma once
// Several domains on loopback for federation integration tests
// (docs/federation-spec: the `federation` section of a node's configuration).
//
//   Federation fed;
//   FedNode& acme = fed.add("acme");
//   FedNode& beta = fed.add("beta");
//   fed.link(acme, beta);               // each pins the other's CA and address
//   acme.exports("bids", {"beta"});     // acme shares bids with beta
//   ASSERT_TRUE(fed.start_all()) << fed.last_error();
//   beta.process().request("POST", "/v1/imports", R"({"stream":"acme/bids"})");
//
// Certificates are made by the real `entente certs init-domain` and
// `entente certs issue-node` (ENTENTE_BIN) in a temporary directory that the
// Federation removes. Each node gets a free loopback port for its federation
// listener, chosen when the node is added, so that peers can be configured
// before anything starts and a restarted node keeps its address. A node's
// configuration is written when it first starts; later pins or exports do
// not change a running node.
//
// Not thread-safe; used from the test's thread (Feeder has its own).

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "federation/link.h"
#include "tests/integration/support/broker_process.h"
#include "tests/support/free_port.h"

namespace entente::testing {

// "acme/bids" -> "acme%2Fbids", for URLs.
std::string url_name(const std::string& stream);

// Calls `probe` every 50 ms until it returns true or `timeout` passes;
// returns the last answer.
bool eventually(std::chrono::milliseconds timeout, const std::function<bool()>& probe);

class FedNode {
 public:
  FedNode(std::string domain, std::string node, std::string cert_dir, std::string ca_file, uint16_t federation_port);

  const std::string& domain() const { return domain_; }
  const std::string& node() const { return node_; }
  std::string identity() const { return "entente://" + domain_ + "/" + node_; }
  uint16_t federation_port() const { return federation_port_; }
  std::string federation_address() const { return "127.0.0.1:" + std::to_string(federation_port_); }
  const std::string& ca_file() const { return ca_file_; }  // this domain's CA certificate
  // The node's certificate chain and key, e.g. for a hand-driven peer in
  // the test process that plays this node instead of starting it.
  std::string cert_file() const { return cert_dir_ + "/node.crt"; }
  std::string key_file() const { return cert_dir_ + "/node.key"; }

  // Configuration, before the first start().
  // Pins `peer`'s domain with its CA and lists it at its federation address.
  FedNode& pins(const FedNode& peer) { return pins(peer, peer.federation_address(), peer.ca_file()); }
  // The same with another address (a proxy; "" for none: never dialed) or
  // another CA file (a wrong pin).
  FedNode& pins(const FedNode& peer, const std::string& address, const std::string& ca_file);
  // An export entry: `stream` to the domains `to`, projected on `fields`
  // (empty: all).
  FedNode& exports(const std::string& stream, std::vector<std::string> to, std::vector<std::string> fields = {});
  // Extra members of the federation section, JSON text without braces.
  FedNode& federation_extra(std::string json);
  // Extra top-level configuration members, as BrokerOptions::extra_config.
  FedNode& config_extra(std::string json);
  // Extra members of "api", as BrokerOptions::extra_api.
  FedNode& api_extra(std::string json);

  // The federation section as it is written into the configuration.
  std::string federation_json() const;

  // Writes the configuration (first time) and starts the process.
  bool start();
  bool running() const { return process_ && process_->pid() > 0; }
  // The node's process; it exists after the first start().
  BrokerProcess& process();
  const BrokerProcess& process() const;
  std::string last_error() const;

 private:
  struct PeerEntry {
    std::string ca_file;
    std::vector<std::pair<std::string, std::string>> nodes;  // node, address
  };
  std::string domain_, node_, cert_dir_, ca_file_;
  uint16_t federation_port_;
  std::map<std::string, PeerEntry> peers_;  // by domain
  std::vector<std::string> exports_;        // JSON objects
  std::string federation_extra_, config_extra_, api_extra_;
  std::unique_ptr<BrokerProcess> process_;
  std::string error_;
};

class Federation {
 public:
  Federation();
  ~Federation();
  Federation(const Federation&) = delete;
  Federation& operator=(const Federation&) = delete;

  // A node of `domain`: creates the domain's CA on first use, issues the
  // node's certificate, picks its federation port. Fails the test (and
  // returns a node that cannot start) when `entente certs` fails.
  FedNode& add(const std::string& domain, const std::string& node = "n1");
  // Creates `name`'s CA (once) without any node; returns its ca.crt.
  std::string domain(const std::string& name);
  // A second CA that also calls itself `domain` but signed none of its
  // nodes (what an attacker would make); returns its ca.crt.
  std::string impostor_ca(const std::string& domain);
  // A node that claims `domain` but whose certificate impostor_ca(domain)
  // issued; its own configuration trusts that CA as its domain's.
  FedNode& add_impostor(const std::string& domain, const std::string& node);
  // `a` and `b` pin each other.
  void link(FedNode& a, FedNode& b);
  // Starts every node that is not running; false (see last_error()) at the
  // first that fails.
  bool start_all();
  const std::string& last_error() const { return error_; }

  const std::string& dir() const { return dir_; }
  // The CA certificate of `domain` (made by add()).
  std::string ca_file(const std::string& domain) const { return dir_ + "/" + domain + "-ca/ca.crt"; }

 private:
  std::string dir_;
  std::deque<FedNode> nodes_;  // stable addresses
  std::string error_;
};

// One admin request with a longer client timeout, for calls the node may
// answer only after hearing from another domain (up to 10 s by the spec).
Result<http::ClientResponse> slow_request(const BrokerProcess& node, const std::string& method,
                                                  const std::string& target, const std::string& body,
                                                  int64_t timeout_ms = 20000);

// GET /v1/peers, parsed.
struct PeerView {
  std::string identity, domain, node, state, address, last_error;
  bool dialed = false;
  int64_t rtt_us = -1;
  int64_t last_heartbeat_ms = 0;
  uint64_t bytes_in = 0, bytes_out = 0, tuples_in = 0, tuples_out = 0, connects = 0;
};
struct PeersView {
  unsigned status = 0;  // 0: the node did not answer
  std::string body;
  std::string self, listen;
  std::map<std::string, uint64_t> refusals;
  std::vector<PeerView> peers;
  const PeerView* find(const std::string& identity) const;
  // "up" when the peer is up, its state, or "absent".
  std::string state_of(const std::string& identity) const;
};
PeersView get_peers(const BrokerProcess& node);

// GET /v1/imports/DOMAIN/NAME, parsed.
struct ImportView {
  unsigned status = 0;
  std::string body;
  std::string stream, owner, state, reason;
  std::vector<std::string> schema;  // field names
  uint64_t next_seq = 0, acked = 0, tuples = 0;
};
ImportView get_import(const BrokerProcess& node, const std::string& stream);

// Field names of a JSON response's "schema" array ("schema" at the top).
std::vector<std::string> schema_names(const std::string& body);
// The "detail" (or "title") of a problem response.
std::string problem_detail(const std::string& body);

// Publishes rows to a stream from its own thread, one request at a time,
// and records which sequence numbers were acknowledged. A failed request
// (the node is down or restarting) is not retried: the next attempt sends
// the next rows, so a row is never sent twice. After restarting the node,
// call retarget() with its new API port.
class Feeder {
 public:
  // `row(i)` renders row i (0, 1, 2, ...) as one NDJSON line without '\n'.
  Feeder(const BrokerProcess& node, std::string stream, std::function<std::string(uint64_t)> row,
         int rows_per_batch = 50, std::chrono::milliseconds pause = std::chrono::milliseconds(5));
  ~Feeder();
  Feeder(const Feeder&) = delete;
  Feeder& operator=(const Feeder&) = delete;

  void start();
  void stop();
  void retarget(uint16_t api_port) { port_ = api_port; }

  // Tuples acknowledged so far.
  uint64_t acked() const { return acked_count_; }
  // Requests that failed (no connection, or a status other than 200).
  uint64_t failures() const { return failures_; }
  // Acknowledged ranges [first_seq, last_seq] in order; after stop().
  const std::vector<std::pair<uint64_t, uint64_t>>& acked_ranges() const { return ranges_; }
  // Acknowledged rows: seq -> row index; after stop().
  const std::map<uint64_t, uint64_t>& acked_rows() const { return rows_; }
  // Last non-200 answer or connection error, for messages; after stop().
  const std::string& last_failure() const { return last_failure_; }

 private:
  void run();

  http::ClientOptions options_;
  std::string stream_;
  std::function<std::string(uint64_t)> row_;
  int rows_per_batch_;
  std::chrono::milliseconds pause_;
  std::atomic<uint16_t> port_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> acked_count_{0};
  std::atomic<uint64_t> failures_{0};
  std::thread thread_;
  // Written by the feeder thread, read after join.
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;
  std::map<uint64_t, uint64_t> rows_;
  std::string last_failure_;
};

// ---------------------------------------------------------------- bids
// The stream most federation tests share, and the steps they repeat.

inline constexpr int64_t kBidTimeZero = 1'700'000'000'000;
inline constexpr const char* kBidsSchema =
    R"([{"name":"auction","type":"int64"},{"name":"bidder","type":"int64"},)"
    R"({"name":"price","type":"int64"},{"name":"date_time","type":"timestamp"}])";

// Row i of bids: bidder i makes each row unique; the price spreads over 0..999.
int64_t price_of(uint64_t i);
std::string bid(uint64_t i);

// POST /v1/streams NAME with `schema_json` and event time `date_time`.
void create_stream(const FedNode& n, const std::string& name, const std::string& schema_json = kBidsSchema);
// Publishes bids [from, from + count) to `stream` in batches of 200.
void publish(const FedNode& n, const std::string& stream, uint64_t from, uint64_t count);
// Both nodes see each other up in GET /v1/peers.
void wait_linked(const FedNode& a, const FedNode& b,
                 std::chrono::milliseconds timeout = std::chrono::seconds(20));
// An admin POST that the node may answer only after hearing from the owner
// (at most 10 s); a status of 0 and the error in the body when no answer came.
http::ClientResponse post_slow(const FedNode& n, const std::string& target, const std::string& body);
// POST /v1/imports; a 503 (no link up yet) is retried for 10 s as its
// Retry-After invites.
http::ClientResponse import_stream(const FedNode& n, const std::string& stream);
// The import's next_seq reaches `next` (the owner's next_seq), and no further.
void wait_caught_up(const FedNode& importer, const std::string& stream, uint64_t next,
                    std::chrono::milliseconds timeout = std::chrono::seconds(60));

// ---------------------------------------------------------- hand-driven
// Node `self` run by the test process instead of a broker: a
// federation::LinkManager with the certificate `entente certs` made for it,
// pinning its own CA and `peer`'s, dialing `peer`'s federation port, frames
// going to `handler`. Waits (10 s) until the link is up; an error naming
// what failed otherwise. `log` gets the manager's log lines (dropped when
// empty).
Result<std::unique_ptr<federation::LinkManager>> hand_link(const FedNode& self, const FedNode& peer,
                                                           federation::LinkHandler& handler,
                                                           std::function<void(std::string_view)> log = {});

}  // namespace entente::testing
