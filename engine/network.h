// Query networks: the JSON definition (docs/query-networks.md), its complete
// validation, and a synchronous executor that runs one on the calling
// thread. The threaded scheduler is in engine/scheduler.h.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/box.h"

namespace entente::engine {

struct NetworkInput {
  std::string name;
  // The stream the input reads, when it is not `name`: for a broker, a
  // stream of another domain ("beta/bids"). The engine does not use it.
  std::string stream;
  SchemaPtr schema;
  std::string time_field;        // empty: the caller sets event times
  int64_t watermark_lag_ms = 0;  // watermark = max event time seen - lag
  // False ("watermarks": "manual"): only advance_watermark() and finish()
  // move this input's watermark.
  bool auto_watermark = true;
};

struct NetworkOutput {
  std::string name;
  std::string from;  // "box" or "box.port"
  SchemaPtr schema;
};

namespace detail {
struct NetworkDef;
}

// A validated query network definition. Cheap to copy (shared, immutable).
class QueryNetwork {
 public:
  // Parses and validates completely: JSON syntax, unknown fields, unknown
  // box types and options, type errors in expressions, cycles, dangling
  // or doubly-fed arcs, unused boxes. On failure every problem is in
  // `diag` with its JSON path, and the Error summarises them.
  static Result<QueryNetwork> parse(std::string_view json, Diagnostics& diag);

  const std::string& name() const;
  const std::vector<NetworkInput>& inputs() const;
  const std::vector<NetworkOutput>& outputs() const;
  std::optional<size_t> input_index(std::string_view name) const;
  std::optional<size_t> output_index(std::string_view name) const;
  // Box ids in topological order.
  std::vector<std::string> box_ids() const;

  std::shared_ptr<const detail::NetworkDef> def() const { return def_; }

 private:
  std::shared_ptr<const detail::NetworkDef> def_;
};

// Runs a network's boxes synchronously on the calling thread: push() drives
// a batch through every box it reaches before returning. Not thread-safe.
class Executor final {
 public:
  // Receives each batch that reaches output `output` (index into outputs()).
  using Sink = std::function<void(size_t output, const Batch& batch)>;

  static Result<std::unique_ptr<Executor>> create(const QueryNetwork& net, Sink sink);
  ~Executor();

  // Feeds a batch into input `input`. If the input names a time field, the
  // event times are taken from it; then the input's watermark is advanced
  // to max event time seen - lag. Rows below the current input watermark
  // are still delivered; the boxes that care count and drop them.
  // The batch's shape is checked (Batch::Check::shape; a mismatch throws,
  // as a programming error); string contents are trusted, since batches
  // from untrusted bytes arrive through decode_batch or rows_from_json,
  // which check them.
  void push(size_t input, const Batch& batch);
  // The same for a batch the caller hands over: its event times are stamped
  // in place and its sequence numbers are not copied.
  void push(size_t input, Batch&& batch);
  // Advances input's watermark explicitly (ignored if not higher).
  void advance_watermark(size_t input, EventTime wm);
  // Ends every input (watermark kMaxWatermark): all windows close.
  void finish();
  // Processing-time tick to every box (time-outs).
  void tick(int64_t now_ms);

  // The watermark of output `output` (index into outputs()): the last one
  // its box sent downstream, kMinTime before any, kMaxWatermark once
  // finished; restored with a snapshot. Read in the sink, it is the
  // watermark that preceded the batch being delivered; after push() or
  // advance_watermark() returns, the one that followed. When the output
  // feeds another executor (an internal stream between query fragments,
  // engine/fragments.h), advancing that executor's "manual" input to this
  // value after handing it the rows reproduces the watermarks the boxes
  // downstream would see in the whole network. Throws std::out_of_range
  // for an index past outputs().
  EventTime output_watermark(size_t output) const;

  struct BoxInfo {
    std::string id;
    std::string type;
    BoxStats stats;
  };
  std::vector<BoxInfo> box_stats() const;

  // State of every box (keyed by box id) and of the inputs' watermarks.
  std::string snapshot() const;
  // With `keep`, keyed boxes keep only the state of those key groups (one
  // part of a split box, docs/cluster.md "Splitting a fragment"); the
  // other boxes and the inputs' clocks are restored whole.
  Status restore(std::string_view bytes, const KeyGroupRange* keep = nullptr);

 private:
  struct Impl;
  explicit Executor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace entente::engine
