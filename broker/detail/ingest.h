#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// Stream definitions and tuple ingest, shared by the REST routes and the
// WebSocket publisher.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "broker/config.h"
#include "broker/detail/streams.h"
#include "http/server.h"

namespace entente::broker::detail {

class NodeImpl;

// Parses a POST /v1/streams body into a stream definition (name, schema,
// event_time, retention; defaults from the node's configuration).
// `node` (when given) receives the body's "node": the node that is to lead
// the stream (docs/cluster.md); without it that key is unknown.
// `node` and `replication` receive "node" and "replication" (1 to 3; 0 when
// absent); "node" is refused when `node` is null.
// A new stream's durability when its creation names none: the node's
// ingest_durability, "fsync", or with "process" and followers
// ("replicated": the followers hold it in their process too).
std::string default_durability(const NodeConfig& config, size_t copies);
Result<StreamMeta> parse_stream_spec(std::string_view body, const NodeConfig& config, std::string* node = nullptr,
                                     int* replication = nullptr);

enum class IngestFormat : uint8_t { ndjson, json_array, binary };

struct IngestResult {
  std::optional<http::Response> problem;  // set when refused
  uint64_t count = 0, first = 0, last = 0;
  bool duplicate = false;  // stored by an earlier send of the same named batch
};

// How a publisher names its batches (docs/api.md, "Publishing exactly
// once"): the headers Entente-Producer-Id and Entente-Producer-Seq, or the
// query parameters producer_id and producer_seq. nullopt when the request
// names none; invalid_argument when it names half, or badly.
Result<std::optional<ProducerTag>> producer_of(const http::Request& req);

// Parses `body`, checks backpressure, appends the tuples as one record and
// calls `done` once they are durable, or at once with the problem. The
// batch is accepted whole or not at all. With `producer`, a batch the stream
// has stored before under the same name is not appended again: `done` gets
// the sequence numbers it was stored under, with duplicate set. `done` may
// run on the group-commit thread.
void ingest(NodeImpl& node, const StreamPtr& stream, IngestFormat format, std::string body,
            const std::optional<ProducerTag>& producer, std::function<void(IngestResult)> done);

// The answer to a stored batch, as POST .../tuples sends it and the
// WebSocket publisher's "ack" holds it.
std::string ingest_answer_json(const IngestResult& r, const std::optional<ProducerTag>& producer);

}  // namespace entente::broker::detail
