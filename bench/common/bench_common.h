#pragma once
// What broker_bench and federation_bench share: how they reach a node (client
// options, bearer token, one request), the bench tuple and its binary
// batches, latency percentiles and the reading of their command lines. Both
// benches print their own JSON lines; nothing here prints to stdout.

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "http/client.h"
#include "engine/batch.h"

namespace entente::bench {

using Clock = std::chrono::steady_clock;

// One node's API, as a bench reaches it.
struct Node {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  bool tls = false;
  std::string ca_file;  // with tls: what the node's certificate is checked against
  std::string token;    // bearer token ("" sends an empty one)
};

// Client options for `node`, with a 30 s timeout: a loaded node may take a
// while to answer, and a bench should measure that rather than fail.
http::ClientOptions client_options(const Node& node);
// The authorization header for `node`'s token.
std::vector<std::pair<std::string, std::string>> auth(const Node& node);
// One JSON request on a connection of its own.
Result<http::ClientResponse> call(const Node& node, const std::string& method, const std::string& target,
                                          const std::string& body = {});
// The node's ingest_durability ("fsync" or "process"), from the
// entente_ingest_durability{mode=...} gauge of its /metrics; "unknown" when
// it does not say (an older node).
std::string durability_mode(const Node& node);

// Wall-clock nanoseconds: what tuples are stamped with to measure latency
// across processes on one machine.
int64_t now_ns();

// The bench tuple: about 100 bytes encoded (two int64 and an 80-byte
// string). kSchemaJson is its schema as POST /v1/streams takes it.
extern const char* const kSchemaJson;
const std::string& payload();
engine::SchemaPtr schema();
// `rows` tuples k = base, base+1, ..., each stamped ts, encoded as one
// binary batch (what a WebSocket publisher sends).
std::string binary_batch(int rows, int64_t base, int64_t ts);

// Creates stream `name` with the bench schema on `node`; with `replace`, it
// deletes a stream of that name first (a rerun starts from an empty one).
// When it cannot, says why on stderr, prefixed by `prog`, and returns false.
bool create_stream(const Node& node, const std::string& name, bool replace, const char* prog);

// Nearest-rank percentiles of latencies in milliseconds (sorts `ms`); all
// zero when there are none.
struct Percentiles {
  double p50 = 0, p99 = 0, p999 = 0, max = 0;
};
Percentiles percentiles(std::vector<double>& ms);

// Reads a command line of flags and "--name VALUE" options, one at a time:
//   ArgReader r("broker_bench", argc, argv);
//   while (r.next()) { if (r.name() == "--port") node.port = r.port(); ... }
// A missing value ends the process with status 2 and "<prog>: --name needs a
// value" on stderr, as the benches always did. Numbers are read as atoi/atof
// read them (0 for text); each bench checks the ranges it needs.
class ArgReader {
 public:
  ArgReader(const char* prog, int argc, char** argv) : prog_(prog), argc_(argc), argv_(argv) {}
  bool next();                       // moves to the next argument; false at the end
  const std::string& name() const { return name_; }
  std::string value();               // the current option's value
  int integer();                     // the value as an int
  double number();                   // the value as a double
  uint16_t port();                   // the value as a port number

 private:
  const char* prog_;
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string name_;
};

}  // namespace entente::bench
