// The window state of an Aggregate box (groups, their panes, the slot arena
// holding the accumulators, the window bound) and its snapshot encoding
// (aggregate_snapshot.cpp). The box that updates it row by row is in
// aggregate.cpp (docs/boxes-windowed.md#aggregate, docs/engine.md "State,
// snapshots and key groups"). Private to engine/boxes.
#pragma once
#if !defined(ENTENTE_IN_ENGINE)
#error "engine/boxes/ is private to engine/ (docs/architecture.md)"
#endif

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/batch.h"
#include "engine/boxes/detail_aggregate_config.h"
#include "engine/boxes/detail_keyed_state.h"
#include "engine/hash.h"
#include "engine/serde.h"

namespace entente::engine::boxes::detail::aggregate {

struct PaneRef {
  int64_t pane;
  uint32_t slot;
};

struct Group {
  uint64_t hash = 0;
  uint32_t key_group = 0;
  uint32_t mark = 0;                // scratch: last collection epoch
  int64_t emitted_end = INT64_MIN;  // time-out: windows ending <= this were emitted
  uint64_t tuples = 0;              // count windows: rows seen
  std::vector<PaneRef> panes;       // sorted by pane index
};

// Everything of an Aggregate box that outlives a batch and goes into its
// snapshot. Groups are dense ids into the key columns; each group owns a
// short list of panes, a pane a slot of accumulator cells in the arena.
// Owned by one box and used on its thread only; the small members below are
// defined here so that the box's per-row code inlines them.
struct WindowState {
  // Groups: key columns (row = group id), per-group state, hash index.
  std::vector<Column> keys;
  std::vector<Group> groups;
  HashIndex index;
  size_t live_groups = 0;  // groups with at least one pane
  // Time windows: pane index -> groups with a slot in that pane.
  std::map<int64_t, std::vector<uint32_t>> pane_groups;
  // Slot arena: Config::cells cells and Config::strings strings per slot.
  std::vector<int64_t> cells;
  std::vector<std::string> strs;
  std::vector<uint64_t> slot_stamp;   // creation order (first arrival)
  std::vector<int64_t> slot_created;  // processing time of creation
  std::vector<uint32_t> free_slots;
  uint64_t stamp = 0;  // the next slot's slot_stamp
  // Windows with end <= bound are closed (input watermark - slack).
  int64_t bound = -kFar;
  int64_t last_emitted_end = INT64_MIN;  // emit_empty
  int64_t now_ms = INT64_MIN;            // last tick; INT64_MIN before the first

  // A slot whose contents the caller sets.
  uint32_t alloc_slot_raw(const Config& cfg) {
    uint32_t s;
    if (!free_slots.empty()) {
      s = free_slots.back();
      free_slots.pop_back();
    } else {
      s = static_cast<uint32_t>(slot_stamp.size());
      slot_stamp.push_back(0);
      slot_created.push_back(0);
      cells.resize(cells.size() + cfg.cells);
      strs.resize(strs.size() + cfg.strings);
    }
    return s;
  }

  void free_slot(uint32_t s) { free_slots.push_back(s); }

  // A group without panes, rows pending or an early emission still to
  // honour: compaction forgets it, a snapshot leaves it out.
  bool group_dead(const Group& g) const { return g.panes.empty() && g.tuples == 0 && g.emitted_end <= bound; }

  // Empties groups and slots; the scalars stay (restore sets them).
  void clear_groups() {
    for (Column& c : keys) c = Column(c.type);
    groups.clear();
    index.clear();
    pane_groups.clear();
    cells.clear();
    strs.clear();
    slot_stamp.clear();
    slot_created.clear();
    free_slots.clear();
    live_groups = 0;
  }
};

// Appends `s` to a snapshot: a tag, a version, a fingerprint of `cfg`, the
// scalars, then per key group (0..kKeyGroups-1) its live groups with their
// keys and panes. Grouping by key group lets a restore keep a subset.
void write_window_state(const Config& cfg, const WindowState& s, ByteWriter& w);

// Replaces `s` by the state that write_window_state() wrote for the same
// `cfg`, keeping only the key groups in `keep` (all if null). The reader
// must hold exactly that state: corrupt if it holds more, less, or a state
// of another definition (Errc::corrupt). On an error after the header `s`
// holds the groups read before it.
Status read_window_state(const Config& cfg, ByteReader& r, const KeyGroupRange* keep, WindowState& s);

// Replaces `s` by the union of the states the readers hold, reader i's
// kept for the key groups of ranges[i] only (the parts of a split box,
// Box::restore_joined). The parts must agree on the window bound and the
// last window emitted (drained to the same watermark); the pane stamp
// counter and the processing time are the largest of theirs.
Status read_joined_window_states(const Config& cfg, const std::vector<ByteReader*>& readers,
                                 const std::vector<KeyGroupRange>& ranges, WindowState& s);

}  // namespace entente::engine::boxes::detail::aggregate
