#pragma once
// Stream definitions and tuple ingest, shared by the REST routes and the
// WebSocket publisher.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "broker/config.h"
#include "broker/detail/streams.h"
#include "broker/http/server.h"

namespace entente::broker::detail {

class NodeImpl;

// Parses a POST /v1/streams body into a stream definition (name, schema,
// event_time, retention; defaults from the node's configuration).
Result<StreamMeta> parse_stream_spec(std::string_view body, const NodeConfig& config);

enum class IngestFormat : uint8_t { ndjson, json_array, binary };

struct IngestResult {
  std::optional<http::Response> problem;  // set when refused
  uint64_t count = 0, first = 0, last = 0;
};

// Parses `body`, checks backpressure, appends the tuples as one record and
// calls `done` once they are durable, or at once with the problem. The
// batch is accepted whole or not at all. `done` may run on the group-commit
// thread.
void ingest(NodeImpl& node, const StreamPtr& stream, IngestFormat format, std::string body,
            std::function<void(IngestResult)> done);

}  // namespace entente::broker::detail
