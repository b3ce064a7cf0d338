// Cutting a query network into fragments (docs/query-networks.md, "Cutting
// a query into fragments"): connected sets of its boxes, each run by its own
// Executor on one node, joined by internal streams. This is the pure,
// engine-level cut: it validates a placement completely and writes, for
// each fragment, a complete query network of its own. Where the fragments
// run and how internal streams travel is the broker's business.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/network.h"
#include "rapidjson/fwd.h"

namespace entente::engine {

// Bounds of a placement.
inline constexpr size_t kMaxFragments = 64;
inline constexpr size_t kMaxFragmentNameLength = 32;
inline constexpr size_t kMaxNodeNameLength = 63;

// One element of "placement": {"fragments": [...]}, as the user wrote it.
struct FragmentSpec {
  std::string name;                // [a-z][a-z0-9-]*, at most 32, no "--"
  std::string node;                // [a-z][a-z0-9-]*, at most 63; empty: not said
  std::vector<std::string> boxes;  // box ids of the network
};

// One fragment of a valid cut.
struct FragmentPlan {
  std::string name;  // as in the spec
  std::string node;  // as in the spec (not checked against any node list)
  // A complete query network named "<query>--<fragment>": the fragment's
  // boxes with their original JSON, the query inputs they read (original
  // JSON), one "manual" input per internal stream read, the query outputs
  // they produce (original JSON) and one output per internal stream written.
  std::string network_json;
  QueryNetwork network;  // network_json, parsed
  std::vector<std::string> inputs;   // query input names read (network order)
  std::vector<std::string> outputs;  // query output names written (network order)
  std::vector<std::string> reads;    // internal streams read (each an input of network_json)
  std::vector<std::string> writes;   // internal streams written (each an output of network_json)
};

// An arc between fragments: one box output port whose rows some other
// fragment consumes. One per producing port, however many fragments and
// boxes it feeds.
struct InternalArc {
  std::string stream;         // the internal stream's name
  std::string from_fragment;  // writes it (output `stream` of its network)
  std::string from;           // producing port, always "box.port"
  std::vector<std::string> to_fragments;  // read it (input `stream`), in placement order
  SchemaPtr schema;           // the producing port's schema
};

struct QueryCut {
  std::vector<FragmentPlan> fragments;  // in placement order
  std::vector<InternalArc> arcs;        // by producing box (topological), then port
  // Indexes into `fragments`, every producer before its consumers (ties in
  // placement order): an order in which to start a pipeline.
  std::vector<size_t> pipeline_order;
};

// Reads the value of "$.placement.fragments" (an array of {"name", "node",
// "boxes"}) into specs. Checks only the JSON shape (types, missing and
// unknown fields, at most kMaxFragments entries, at most 1000 boxes each);
// cut_query checks the rest. Problems go to `diag` under
// "$.placement.fragments[i]...".
Result<std::vector<FragmentSpec>> read_fragment_specs(const rapidjson::Value& fragments, Diagnostics& diag);
// The same from a whole query document (the network with its "placement"):
// reads its "$.placement.fragments", which must be present.
Result<std::vector<FragmentSpec>> read_fragment_specs(std::string_view query_document, Diagnostics& diag);

// Cuts `net` into `fragments`. Checks every rule (names, every box in
// exactly one fragment, each fragment non-empty and connected, no cycle
// between fragments, generated names within their limits) and reports
// every violation to `diag` with its path in the query document
// ("$.placement.fragments[1].boxes[0]"); on any, returns an error and
// nothing else. Deterministic: the same network and specs give the same
// names and bytes. `connected` false lets a fragment's boxes form groups
// with no arc between them: a split join's router, one split box per side
// (engine/splits.h); a user's placement is always checked.
Result<QueryCut> cut_query(const QueryNetwork& net, const std::vector<FragmentSpec>& fragments, Diagnostics& diag,
                           bool connected = true);

// One fragment named `name` holding every box of `net`: its cut is one
// network that behaves as `net` does (same inputs, outputs, boxes, arcs).
std::vector<FragmentSpec> whole_query_fragment(const QueryNetwork& net, std::string name, std::string node);

// The network name of fragment `fragment` of query `query`:
// "<query>--<fragment>" (unique, since fragment names have no "--").
std::string fragment_network_name(std::string_view query, std::string_view fragment);
// The internal stream carrying box `box`'s output port `port` in query
// `query`: "<query>--<box>_<port>" when that is a valid stream name of at
// most 63 characters and `box` has no "--"; otherwise "<first 40 characters
// of query>--<16 hex digits of a stable hash of (query, box, port)>".
std::string internal_stream_name(std::string_view query, std::string_view box, size_t port);

// --- Carrying an arc across an internal stream (docs/query-networks.md,
// "Cutting a query into fragments"). Between fragments on two nodes the
// rows travel through a log, so the producer's output watermark
// (Executor::output_watermark) must travel in it too, at the same places
// among the rows as in the whole network. An internal stream's schema is
// the producing port's with two more fields: the watermark the producer
// had sent before the row, and whether the row is only a watermark (a
// mark: its other values are zero and it is not a row of the query).

// The producing port's fields, then "_wm" (int64) and "_wm_only" (bool)
// (renamed "_wm_1", ... when the port has a field of that name).
SchemaPtr internal_stream_schema(const Schema& port);
// The rows of `batch` (the port's schema) as rows of `internal`, each
// after watermark `wm`. Shares batch's columns, event times and seqs.
Batch internal_rows(const SchemaPtr& internal, const Batch& batch, EventTime wm);
// One mark: "the watermark is now `wm`".
Batch internal_mark(const SchemaPtr& internal, EventTime wm);
// Feeds rows of an internal stream to `exec`'s input `input` (its schema
// `port`, its watermarks "manual"): before each run of data rows the
// input's watermark is advanced to theirs, then the run is pushed (as
// `port` rows, with their event times); a mark advances the watermark.
// A batch whose schema is not internal_stream_schema(*port) throws
// std::invalid_argument (the broker checks schemas before).
void push_internal(Executor& exec, size_t input, const SchemaPtr& port, const Batch& internal);

}  // namespace entente::engine
