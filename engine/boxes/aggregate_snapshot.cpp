// The snapshot encoding of an Aggregate box's window state
// (detail_aggregate_state.h): writing it, and reading it back with every
// field checked, since a snapshot is input like any other
// (docs/engine.md "State, snapshots and key groups").
#include <algorithm>
#include <string>
#include <vector>

#include "engine/boxes/detail_aggregate_state.h"

namespace entente::engine::boxes::detail::aggregate {

namespace {

constexpr uint8_t kAggregateTag = 0x41;  // 'A': refuses other boxes' snapshots
constexpr uint8_t kAggregateVersion = 1;

void write_pane(const Config& cfg, const WindowState& s, const PaneRef& p, ByteWriter& w) {
  w.svarint(p.pane);
  w.varint(s.slot_stamp[p.slot]);
  w.svarint(s.slot_created[p.slot]);
  const int64_t* c = &s.cells[size_t{p.slot} * cfg.cells];
  for (uint32_t k = 0; k < cfg.cells; ++k) w.svarint(c[k]);
  for (uint32_t k = 0; k < cfg.strings; ++k) w.bytes(s.strs[size_t{p.slot} * cfg.strings + k]);
}

void write_group(const Config& cfg, const WindowState& s, uint32_t gid, ByteWriter& w) {
  const Group& g = s.groups[gid];
  for (const Column& c : s.keys) write_cell(w, c, gid);
  w.fixed64(g.hash);
  w.svarint(g.emitted_end);
  w.varint(g.tuples);
  w.varint(g.panes.size());
  for (const PaneRef& p : g.panes) write_pane(cfg, s, p, w);
}

bool end_ok(int64_t e) { return e == INT64_MIN || (e >= -kFar && e <= kFar); }

// Reads one snapshot into a WindowState: the header, then per key group
// its groups, each read whole and then kept (if its key group is kept) or
// dropped. One reader per restore.
class StateReader {
 public:
  StateReader(const Config& cfg, ByteReader& r, const KeyGroupRange* keep, WindowState& s)
      : cfg_(cfg), r_(r), keep_(keep), s_(s) {
    single_int_key_ = s.keys.size() == 1 && is_int_repr(s.keys[0].type);
    key_.resize(s.keys.size());
    for (size_t k = 0; k < s.keys.size(); ++k) key_[k] = Column(s.keys[k].type);
    cellbuf_.resize(cfg.cells);
  }

  // The tag, the version, the definition's fingerprint and the scalars;
  // empties the state once they are known good. With `join`, a further
  // part of a split box: the state is kept, the scalars must agree (the
  // stamp and the time take the largest).
  Status read_header(bool join = false) {
    uint8_t tag, version, by_count;
    uint64_t cells, strings, nkeys, stamp;
    int64_t size, slide, bound, last_end, now;
    if (!r_.u8(tag) || tag != kAggregateTag) return corrupt("not an aggregate snapshot");
    if (!r_.u8(version) || version != kAggregateVersion) return corrupt("unknown aggregate snapshot version");
    if (!r_.varint(cells) || !r_.varint(strings) || !r_.varint(nkeys) || !r_.svarint(size) ||
        !r_.svarint(slide) || !r_.u8(by_count))
      return corrupt("truncated header");
    if (cells != cfg_.cells || strings != cfg_.strings || nkeys != s_.keys.size() ||
        size != cfg_.window.size || slide != cfg_.window.slide || (by_count != 0) != cfg_.window.by_count)
      return corrupt("snapshot of an aggregate with another definition");
    if (!r_.svarint(bound) || !r_.svarint(last_end) || !r_.svarint(now) || !r_.varint(stamp))
      return corrupt("truncated header");
    if (bound < -kFar || bound > kFar || !end_ok(last_end)) return corrupt("window bound out of range");
    if (join) {
      if (bound != s_.bound || last_end != s_.last_emitted_end)
        return make_error(Errc::invalid_argument, "the parts of the aggregate stand at different windows (bound " +
                                                      std::to_string(s_.bound) + " and " + std::to_string(bound) +
                                                      "): they were not drained to the same point");
      s_.now_ms = std::max(s_.now_ms, now);
      s_.stamp = std::max(s_.stamp, stamp);
      return Status::Ok();
    }
    s_.clear_groups();
    s_.bound = bound;
    s_.last_emitted_end = last_end;
    s_.now_ms = now;
    s_.stamp = stamp;
    return Status::Ok();
  }

  // The groups stored under key group `kg`.
  Status read_key_group(uint32_t kg) {
    uint64_t ngroups;
    if (!r_.varint(ngroups) || ngroups > r_.remaining()) return corrupt("truncated group list");
    keep_group_ = keep_ == nullptr || keep_->contains(kg);
    for (uint64_t gi = 0; gi < ngroups; ++gi) {
      Group g;
      ENTENTE_RETURN_IF_ERROR(read_group(kg, g));
      if (keep_group_) ENTENTE_RETURN_IF_ERROR(add_group(std::move(g)));
    }
    return Status::Ok();
  }

  Status finish() const { return r_.empty() ? Status::Ok() : Status(corrupt("trailing bytes")); }

 private:
  // One group's key (into key_), header and panes.
  Status read_group(uint32_t kg, Group& g) {
    for (Column& c : key_) {
      c.clear();
      if (!read_cell(r_, c)) return corrupt("truncated group key");
    }
    uint64_t npanes;
    panes_read_ = 0;
    if (!r_.fixed64(g.hash) || !r_.svarint(g.emitted_end) || !r_.varint(g.tuples) || !r_.varint(npanes) ||
        npanes > r_.remaining())
      return corrupt("truncated group");
    if (!end_ok(g.emitted_end)) return corrupt("window bound out of range");
    g.key_group = key_group_of(g.hash);
    if (g.key_group != kg) return corrupt("group stored under the wrong key group");
    // Lets the box's group lookup trust the hash of a single int key alone.
    if (single_int_key_ && g.hash != hash_int(key_[0].ints[0]))
      return corrupt("group hash does not match its key");
    for (uint64_t pi = 0; pi < npanes; ++pi) ENTENTE_RETURN_IF_ERROR(read_pane(g));
    return Status::Ok();
  }

  // The next pane of group `g`, after prev_pane_: into a slot of the
  // arena, appended to g.panes, if the group is kept; read and dropped
  // otherwise.
  Status read_pane(Group& g) {
    int64_t pane, created;
    uint64_t pstamp;
    if (!r_.svarint(pane) || !r_.varint(pstamp) || !r_.svarint(created)) return corrupt("truncated pane");
    if (panes_read_ > 0 && pane <= prev_pane_) return corrupt("panes out of order");
    ++panes_read_;
    prev_pane_ = pane;
    // Pane start times stay within the supported range.
    if (pane < -kTimeLimit / cfg_.window.pane || pane > kTimeLimit / cfg_.window.pane)
      return corrupt("pane out of range");
    if (pstamp >= s_.stamp) return corrupt("pane stamp out of range");
    for (auto& c : cellbuf_)
      if (!r_.svarint(c)) return corrupt("truncated pane cells");
    if (cellbuf_[0] <= 0) return corrupt("empty pane");
    if (!keep_group_) {
      for (uint32_t k = 0; k < cfg_.strings; ++k)
        if (!r_.bytes(scratch_)) return corrupt("truncated pane strings");
      return Status::Ok();
    }
    const uint32_t slot = s_.alloc_slot_raw(cfg_);
    s_.slot_stamp[slot] = pstamp;
    s_.slot_created[slot] = created;
    std::copy(cellbuf_.begin(), cellbuf_.end(),
              s_.cells.begin() + static_cast<ptrdiff_t>(size_t{slot} * cfg_.cells));
    for (uint32_t k = 0; k < cfg_.strings; ++k)
      if (!r_.bytes(s_.strs[size_t{slot} * cfg_.strings + k])) return corrupt("truncated pane strings");
    g.panes.push_back(PaneRef{pane, slot});
    return Status::Ok();
  }

  // Adds group `g` with key key_ to the state, refusing a second group of
  // the same key.
  Status add_group(Group g) {
    const bool dup = s_.index.find(g.hash, [&](uint32_t other) {
      for (size_t k = 0; k < s_.keys.size(); ++k)
        if (!cell_equal(s_.keys[k], other, key_[k], 0)) return false;
      return true;
    }) != HashIndex::kNone;
    if (dup) return corrupt("duplicate group");
    const uint32_t gid = static_cast<uint32_t>(s_.groups.size());
    for (size_t k = 0; k < s_.keys.size(); ++k) s_.keys[k].append_from(key_[k], 0);
    if (!g.panes.empty()) ++s_.live_groups;
    if (!cfg_.window.by_count)
      for (const PaneRef& p : g.panes) s_.pane_groups[p.pane].push_back(gid);
    s_.index.insert(g.hash, gid);
    s_.groups.push_back(std::move(g));
    return Status::Ok();
  }

  const Config& cfg_;
  ByteReader& r_;
  const KeyGroupRange* keep_;
  WindowState& s_;
  bool single_int_key_ = false;
  bool keep_group_ = true;   // the key group being read is kept
  uint64_t panes_read_ = 0;  // of the group being read
  int64_t prev_pane_ = 0;    // the last of them
  std::vector<Column> key_;  // the key of the group being read, one row
  std::vector<int64_t> cellbuf_;
  std::string scratch_;
};

}  // namespace

void write_window_state(const Config& cfg, const WindowState& s, ByteWriter& w) {
  w.u8(kAggregateTag);
  w.u8(kAggregateVersion);
  w.varint(cfg.cells);
  w.varint(cfg.strings);
  w.varint(s.keys.size());
  w.svarint(cfg.window.size);
  w.svarint(cfg.window.slide);
  w.u8(cfg.window.by_count ? 1 : 0);
  w.svarint(s.bound);
  w.svarint(s.last_emitted_end);
  w.svarint(s.now_ms);
  w.varint(s.stamp);
  std::vector<std::vector<uint32_t>> by_group(kKeyGroups);
  for (uint32_t gid = 0; gid < s.groups.size(); ++gid)
    if (!s.group_dead(s.groups[gid])) by_group[s.groups[gid].key_group].push_back(gid);
  for (uint32_t kg = 0; kg < kKeyGroups; ++kg) {
    w.varint(by_group[kg].size());
    for (uint32_t gid : by_group[kg]) write_group(cfg, s, gid, w);
  }
}

Status read_window_state(const Config& cfg, ByteReader& r, const KeyGroupRange* keep, WindowState& s) {
  StateReader reader(cfg, r, keep, s);
  ENTENTE_RETURN_IF_ERROR(reader.read_header());
  for (uint32_t kg = 0; kg < kKeyGroups; ++kg) ENTENTE_RETURN_IF_ERROR(reader.read_key_group(kg));
  return reader.finish();
}

Status read_joined_window_states(const Config& cfg, const std::vector<ByteReader*>& readers,
                                 const std::vector<KeyGroupRange>& ranges, WindowState& s) {
  if (readers.empty() || readers.size() != ranges.size())
    return make_error(Errc::invalid_argument, "joining aggregate states: as many parts as ranges are needed");
  std::vector<StateReader> parts;
  parts.reserve(readers.size());
  for (size_t i = 0; i < readers.size(); ++i) parts.emplace_back(cfg, *readers[i], &ranges[i], s);
  // Every header first: a pane's stamp must be below the joined counter.
  for (size_t i = 0; i < parts.size(); ++i) ENTENTE_RETURN_IF_ERROR(parts[i].read_header(i > 0));
  for (uint32_t kg = 0; kg < kKeyGroups; ++kg)
    for (auto& part : parts) ENTENTE_RETURN_IF_ERROR(part.read_key_group(kg));
  for (auto& part : parts) ENTENTE_RETURN_IF_ERROR(part.finish());
  return Status::Ok();
}

}  // namespace entente::engine::boxes::detail::aggregate
