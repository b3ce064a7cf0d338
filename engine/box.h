// The box interface: one operator instance of a query network.
//
// Threading: a box is driven by one thread at a time (the executor or a
// scheduler worker); it is not internally synchronised. Lifecycle: built by
// its factory from JSON options (type-checked against its input schemas),
// fed batches and watermarks, snapshotted and restored at any point between
// two calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/batch.h"
#include "engine/hash.h"
#include "rapidjson/fwd.h"

namespace entente::engine {

// Where a box sends what it produces. Implemented by the executor and by
// tests.
class Emitter {
 public:
  virtual ~Emitter() = default;
  // A batch on output `port`, with sequence numbers already assigned.
  virtual void emit(size_t port, Batch batch) = 0;
  // The box's output watermark advanced to `wm` (applies to every port).
  virtual void emit_watermark(EventTime wm) = 0;
};

// Counters of one box. tuples_in, batches_in and cpu_ns are kept by whoever
// drives the box; the rest by the box itself.
struct BoxStats {
  uint64_t batches_in = 0;
  uint64_t tuples_in = 0;
  uint64_t tuples_out = 0;
  uint64_t bytes_out = 0;
  uint64_t late_dropped = 0;  // rows dropped because they came too late
  uint64_t cpu_ns = 0;
  // Bytes of the box's state in the executor's last snapshot (0 before one).
  uint64_t state_bytes = 0;
  double selectivity() const { return tuples_in ? double(tuples_out) / double(tuples_in) : 0.0; }
  double cpu_ns_per_tuple() const { return tuples_in ? double(cpu_ns) / double(tuples_in) : 0.0; }
};

class Box {
 public:
  virtual ~Box() = default;
  Box() = default;
  Box(const Box&) = delete;
  Box& operator=(const Box&) = delete;

  // The box type as written in query networks: "filter", "aggregate", ...
  virtual std::string_view type() const = 0;
  virtual size_t num_inputs() const = 0;
  virtual size_t num_outputs() const = 0;
  virtual const SchemaPtr& output_schema(size_t port) const = 0;

  // A batch arrives on input `port` (its schema is that input's schema).
  virtual void on_batch(size_t port, const Batch& batch, Emitter& out) = 0;
  // The watermark of input `port` advanced to `wm` (monotone per port).
  // kMaxWatermark means the input has ended: flush everything.
  virtual void on_watermark(size_t port, EventTime wm, Emitter& out) = 0;
  // Processing-time tick (monotonic milliseconds), for time-outs. Default:
  // nothing.
  virtual void on_tick(int64_t now_ms, Emitter& out);

  // Serialises all state, including output sequence counters and watermarks,
  // so that restore() into a fresh box of the same definition continues
  // exactly where this one stands.
  virtual std::string snapshot() const = 0;
  // Restores from snapshot() bytes. With `keep`, a keyed box keeps only the
  // state of the key groups in that range (box splitting); other boxes
  // ignore it. Refuses bytes it cannot decode (Errc::corrupt).
  virtual Status restore(std::string_view bytes, const KeyGroupRange* keep = nullptr) = 0;
  // Restores the state of a box that was split by key groups, from its
  // parts (merging a split fragment back, docs/cluster.md "Splitting a
  // fragment"): parts[i] is a snapshot of the instance that owned
  // ranges[i], of which only those key groups are taken; the rest of the
  // state (sequence counters, watermarks) comes from parts[0], the parts
  // having been drained to the same point. The default restores parts[0]
  // for a box that is not keyed and refuses (Errc::unsupported) one that
  // is; keyed boxes that can join their parts override it.
  virtual Status restore_joined(const std::vector<std::string_view>& parts, const std::vector<KeyGroupRange>& ranges);
  // True for boxes whose state is partitioned by key group.
  virtual bool keyed() const { return false; }
  // The last watermark this box sent downstream (kMinTime before any); part
  // of its snapshot, so restored with it. Executor::output_watermark.
  virtual EventTime output_watermark() const noexcept = 0;

  BoxStats& stats() noexcept { return stats_; }
  const BoxStats& stats() const noexcept { return stats_; }

 protected:
  BoxStats stats_;
};

// Common machinery: output schemas, one sequence counter per output port,
// watermark bookkeeping (per input, and the last one sent).
class BoxBase : public Box {
 public:
  size_t num_inputs() const override { return input_schemas_.size(); }
  size_t num_outputs() const override { return output_schemas_.size(); }
  const SchemaPtr& output_schema(size_t port) const override { return output_schemas_[port]; }
  EventTime output_watermark() const noexcept override { return out_wm_; }

 protected:
  BoxBase(std::vector<SchemaPtr> inputs, std::vector<SchemaPtr> outputs);

  // Assigns the next sequence numbers of `port` to `b`'s rows, counts them,
  // and hands the batch on. Empty batches are not sent.
  void emit(Emitter& out, size_t port, Batch b);
  // Sends `wm` downstream if it is above the last one sent.
  void emit_watermark(Emitter& out, EventTime wm);
  // Records input `port`'s watermark; returns the minimum over all inputs.
  EventTime update_input_watermark(size_t port, EventTime wm);
  EventTime input_watermark() const noexcept;  // minimum over inputs

  // Base state (sequence counters and watermarks) to and from bytes; boxes
  // call these first in snapshot()/restore().
  void snapshot_base(std::string& out) const;
  Status restore_base(std::string_view& in);

  std::vector<SchemaPtr> input_schemas_;
  std::vector<SchemaPtr> output_schemas_;

 private:
  std::vector<Seq> next_seq_;
  std::vector<EventTime> in_wm_;
  EventTime out_wm_ = kMinTime;
};

// What a factory gets besides the options object.
struct BoxBuildContext {
  std::string path;               // JSON path of the box, e.g. "$.boxes[3]"
  std::vector<SchemaPtr> inputs;  // one schema per input port, in port order
  Diagnostics* diag = nullptr;    // where to report every problem found
};

// Builds a box from its JSON options, type-checking against ctx.inputs.
// On any problem, reports each one to ctx.diag (path under
// ctx.path + ".options") and returns nullptr.
using BoxFactory = std::unique_ptr<Box> (*)(const rapidjson::Value& options,
                                            const BoxBuildContext& ctx);

// The registry of box types, by name ("filter", "map", ...). nullptr if
// unknown.
BoxFactory find_box_factory(std::string_view type) noexcept;
// Every registered type name, sorted (for error messages and docs).
std::vector<std::string_view> box_type_names();

}  // namespace entente::engine
