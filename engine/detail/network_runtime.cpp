#include "engine/detail/network_runtime.h"

#include <algorithm>
#include <span>
#include <stdexcept>

#include "engine/serde.h"

namespace entente::engine::detail {

Result<std::vector<std::unique_ptr<Box>>> build_boxes(const NetworkDef& def) {
  std::vector<std::unique_ptr<Box>> boxes;
  boxes.reserve(def.boxes.size());
  for (const BoxDef& bd : def.boxes) {
    Diagnostics diag;
    BoxBuildContext ctx{bd.path(), bd.input_schemas, &diag};
    auto box = bd.factory(*bd.options, ctx);
    if (!box) {
      return make_error(Errc::invalid_argument, "box '" + bd.id + "' could not be built again: " +
                                                    (diag.ok() ? std::string("no reason given") : diag.to_string()));
    }
    boxes.push_back(std::move(box));
  }
  return boxes;
}

namespace {

[[noreturn]] void bad_push(const NetworkInput& in, const std::string& why) {
  throw std::invalid_argument("bad batch pushed into input '" + in.name + "': " + why);
}

void check_schema(const NetworkInput& in, const Batch& b) {
  if (b.schema == nullptr || (b.schema != in.schema && !(*b.schema == *in.schema)))
    throw std::invalid_argument("batch pushed into input '" + in.name + "' has schema (" +
                                (b.schema ? b.schema->to_string() : std::string("none")) +
                                "), the input's is (" + in.schema->to_string() + ")");
}

// The column that gives the input's event times. The schema was checked at
// validation: the field exists and is int64 or timestamp. Rows are counted
// by the column, so a caller need not fill event_time itself.
const ColumnPtr& time_column(const NetworkInput& in, const Batch& b) {
  size_t field = *in.schema->index_of(in.time_field);
  if (b.columns.size() != in.schema->size() || b.columns[field] == nullptr) bad_push(in, "missing columns");
  return b.columns[field];
}

// The highest of `v` (kMinTime when empty). Four independent chains: the
// loop is bound by the latency of max, not by loads.
EventTime max_of(std::span<const EventTime> v) noexcept {
  EventTime m[4] = {kMinTime, kMinTime, kMinTime, kMinTime};
  size_t i = 0;
  for (; i + 4 <= v.size(); i += 4)
    for (size_t k = 0; k < 4; ++k) m[k] = std::max(m[k], v[i + k]);
  for (; i < v.size(); ++i) m[0] = std::max(m[0], v[i]);
  return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

// `b`'s event times become the values of its time column, shared with the
// column (columns are immutable), not copied.
EventTime stamp_from_column(const NetworkInput& in, Batch& b) {
  const ColumnPtr& times = time_column(in, b);
  b.event_time = RowVector<EventTime>::alias(times, times->ints);
  return max_of(times->ints);
}

void check_shape(const NetworkInput& in, const Batch& b) {
  if (Status st = b.validate(Batch::Check::shape); !st.ok()) bad_push(in, st.error().message);
}

}  // namespace

const Batch& stamp_input(const NetworkInput& in, const Batch& b, Batch& scratch, EventTime& max_t) {
  check_schema(in, b);
  if (in.time_field.empty()) {
    check_shape(in, b);
    max_t = max_event_time(b);
    return b;
  }
  scratch.schema = b.schema;
  scratch.columns = b.columns;
  scratch.seq = b.seq;  // shared, not copied
  max_t = stamp_from_column(in, scratch);
  check_shape(in, scratch);
  return scratch;
}

const Batch& stamp_input(const NetworkInput& in, const Batch& b, Batch& scratch) {
  EventTime max_t = kMinTime;
  return stamp_input(in, b, scratch, max_t);
}

EventTime stamp_input_in_place(const NetworkInput& in, Batch& b) {
  check_schema(in, b);
  EventTime max_t = kMinTime;
  if (in.time_field.empty()) {
    max_t = max_event_time(b);
  } else {
    max_t = stamp_from_column(in, b);
  }
  check_shape(in, b);
  return max_t;
}

EventTime max_event_time(const Batch& b) noexcept { return max_of(b.event_time); }

std::optional<EventTime> InputClock::observe(const NetworkInput& in, EventTime max_t) noexcept {
  if (max_t <= max_seen) return std::nullopt;
  max_seen = max_t;
  if (!in.auto_watermark) return std::nullopt;
  EventTime wm = max_seen < kMinTime + in.watermark_lag_ms ? kMinTime : max_seen - in.watermark_lag_ms;
  return advance(wm);
}

namespace {
constexpr std::string_view kMagic = "ENTN";
constexpr uint64_t kVersion = 1;
}  // namespace

void write_network_snapshot(const NetworkDef& def, const std::vector<InputClock>& clocks,
                            const std::vector<std::unique_ptr<Box>>& boxes, std::string& out) {
  ByteWriter w(out);
  w.raw(kMagic.data(), kMagic.size());
  w.varint(kVersion);
  w.varint(def.inputs.size());
  for (size_t i = 0; i < def.inputs.size(); ++i) {
    w.bytes(def.inputs[i].name);
    w.i64(clocks[i].max_seen);
    w.i64(clocks[i].watermark);
  }
  w.varint(def.boxes.size());
  std::string state;
  for (size_t b = 0; b < def.boxes.size(); ++b) {
    w.bytes(def.boxes[b].id);
    w.bytes(def.boxes[b].type);
    state.clear();
    state = boxes[b]->snapshot();
    boxes[b]->stats().state_bytes = state.size();  // shown with the box's load
    w.bytes(state);
  }
}

Status read_network_snapshot(const NetworkDef& def, std::string_view bytes, std::vector<InputClock>& clocks,
                             std::vector<std::unique_ptr<Box>>& boxes, const KeyGroupRange* keep) {
  auto corrupt = [](std::string what) { return make_error(Errc::corrupt, "network snapshot: " + what); };
  ByteReader r(bytes);
  char magic[4];
  uint64_t version = 0;
  if (!r.raw(magic, 4) || std::string_view(magic, 4) != kMagic) return corrupt("bad magic");
  if (!r.varint(version)) return corrupt("truncated header");
  if (version != kVersion) return make_error(Errc::unsupported, "network snapshot: version " + std::to_string(version));

  uint64_t n_inputs = 0;
  if (!r.varint(n_inputs)) return corrupt("truncated input count");
  if (n_inputs != def.inputs.size())
    return make_error(Errc::invalid_argument, "network snapshot has " + std::to_string(n_inputs) +
                                                  " inputs; this network has " + std::to_string(def.inputs.size()));
  std::vector<InputClock> new_clocks(def.inputs.size());
  for (size_t i = 0; i < def.inputs.size(); ++i) {
    std::string_view name;
    if (!r.bytes(name) || !r.i64(new_clocks[i].max_seen) || !r.i64(new_clocks[i].watermark))
      return corrupt("truncated input " + std::to_string(i));
    if (name != def.inputs[i].name)
      return make_error(Errc::invalid_argument, "network snapshot has input '" + std::string(name) +
                                                    "' where this network has '" + def.inputs[i].name + "'");
  }

  uint64_t n_boxes = 0;
  if (!r.varint(n_boxes)) return corrupt("truncated box count");
  if (n_boxes != def.boxes.size())
    return make_error(Errc::invalid_argument, "network snapshot has " + std::to_string(n_boxes) +
                                                  " boxes; this network has " + std::to_string(def.boxes.size()));
  ENTENTE_ASSIGN_OR_RETURN(auto fresh, build_boxes(def));
  for (size_t b = 0; b < def.boxes.size(); ++b) {
    std::string_view id, type, state;
    if (!r.bytes(id) || !r.bytes(type) || !r.bytes(state)) return corrupt("truncated box " + std::to_string(b));
    if (id != def.boxes[b].id || type != def.boxes[b].type)
      return make_error(Errc::invalid_argument, "network snapshot has box '" + std::string(id) + "' (" +
                                                    std::string(type) + ") where this network has '" +
                                                    def.boxes[b].id + "' (" + def.boxes[b].type + ")");
    if (Status st = fresh[b]->restore(state, keep); !st.ok())
      return make_error(st.error().code, "restoring box '" + def.boxes[b].id + "': " + st.error().message);
  }
  if (!r.empty()) return corrupt(std::to_string(r.remaining()) + " trailing bytes");
  clocks = std::move(new_clocks);
  boxes = std::move(fresh);
  return Status::Ok();
}

}  // namespace entente::engine::detail
