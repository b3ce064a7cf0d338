#pragma once
// Reads a stream over a real WebSocket subscription (JSON frames) and parses
// each tuple's line, for integration tests.

#include <cstdint>
#include <string>
#include <vector>

#include "tests/integration/support/broker_process.h"

namespace entente::testing {

struct Tuple {
  uint64_t seq = 0;
  std::string line;  // the NDJSON line as received
};

// Subscribes from `from` and reads until `until_seq` (inclusive) has arrived
// or `timeout_ms` passes. Frames are kept as they came (frames[i] = the lines
// of one record).
struct ReadResult {
  std::vector<Tuple> tuples;
  std::vector<std::vector<Tuple>> frames;
  bool closed = false;
  uint16_t close_code = 0;
  std::string close_reason;
  std::string error;
};
ReadResult read_stream(const BrokerProcess& broker, const std::string& stream, uint64_t from, uint64_t until_seq,
                       int64_t timeout_ms = 20000);

// Splits NDJSON into lines and reads each line's "_seq".
std::vector<Tuple> parse_lines(const std::string& ndjson);

// The stream's next_seq from GET /v1/streams/{name}.
uint64_t next_seq(const BrokerProcess& broker, const std::string& stream);

}  // namespace entente::testing
