// Machinery shared by the Executor and the Scheduler: building a network's
// boxes, stamping pushed batches with event times, input watermarks, the
// cheap clock used for per-box CPU accounting, and the snapshot format.
// Private to engine/.
#pragma once
#if !defined(ENTENTE_IN_ENGINE)
#error "engine/detail/ is private to engine/ (docs/architecture.md)"
#endif

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/detail/network_def.h"

namespace entente::engine::detail {

// Builds a fresh instance of every box of `def`, in def.boxes order. Fails
// only if a factory refuses a definition that validated before (a bug).
Result<std::vector<std::unique_ptr<Box>>> build_boxes(const NetworkDef& def);

// The batch that a push of `b` into input `in` delivers: `b` itself when the
// caller set the event times, else `scratch` filled with `b`'s columns
// (shared, not copied) and event times copied from the input's time field.
// Throws std::invalid_argument when `b` does not have the input's schema or
// is malformed: pushing such a batch is a programming error of the caller,
// not a data error (data from outside is checked when it is decoded).
const Batch& stamp_input(const NetworkInput& in, const Batch& b, Batch& scratch);
// The same, also setting `max_t` to the delivered batch's highest event time
// (kMinTime when empty), found while the times are copied.
const Batch& stamp_input(const NetworkInput& in, const Batch& b, Batch& scratch, EventTime& max_t);
// For a batch the caller hands over: stamps `b` itself (no copy of its
// sequence numbers or columns) and returns its highest event time. Throws
// as stamp_input does.
EventTime stamp_input_in_place(const NetworkInput& in, Batch& b);

// Highest event time in `b`; kMinTime when empty.
EventTime max_event_time(const Batch& b) noexcept;

// Watermark bookkeeping of one network input.
struct InputClock {
  EventTime max_seen = kMinTime;
  EventTime watermark = kMinTime;

  // After a push whose highest event time is `max_t`: the automatic
  // watermark (max seen - lag), if the input uses them and it advanced.
  std::optional<EventTime> observe(const NetworkInput& in, EventTime max_t) noexcept;
  // An explicit watermark; nullopt unless it advances.
  std::optional<EventTime> advance(EventTime wm) noexcept {
    if (wm <= watermark) return std::nullopt;
    watermark = wm;
    return wm;
  }
};

// Per-box CPU accounting reads this once before and once after each call
// into a box (per batch, never per row). steady_clock is read through the
// vDSO in ~20 ns, where CLOCK_THREAD_CPUTIME_ID is a system call costing
// several times that; the price is that time a thread spends preempted is
// counted too.
inline int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Snapshot of a whole network: the inputs' clocks and every box's state,
// keyed by box id. Format (ByteWriter): "ENTN", version varint, inputs
// (name, max_seen, watermark), boxes (id, type, state bytes).
void write_network_snapshot(const NetworkDef& def, const std::vector<InputClock>& clocks,
                            const std::vector<std::unique_ptr<Box>>& boxes, std::string& out);
// Decodes `bytes` into fresh boxes and clocks for `def`; refuses a snapshot
// of another network (different inputs or box ids) or corrupt bytes. On
// failure nothing of the caller's is touched. With `keep`, keyed boxes keep
// only the state of those key groups (Box::restore; box splitting).
Status read_network_snapshot(const NetworkDef& def, std::string_view bytes, std::vector<InputClock>& clocks,
                             std::vector<std::unique_ptr<Box>>& boxes, const KeyGroupRange* keep = nullptr);

}  // namespace entente::engine::detail
