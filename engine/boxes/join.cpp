// Join: windowed equi-join of two inputs (port 0 = left, port 1 = right)
// (docs/boxes-windowed.md#join).
//
// Rows are consumed in the deterministic order of OrderedInputs (event
// time, then input index, then arrival), released by the watermarks. Each
// released row probes the rows buffered on the other side, then is buffered
// on its own side; a pair is therefore produced exactly once, when its later
// row (in that order) is processed, and output rows come out sorted by
// event time. Because rows enter a side's buffer in event-time order, the
// rows that can no longer match are always a prefix of it: purging is an
// index bump, and the buffer is compacted once the purged prefix outweighs
// the live rows.
#include <algorithm>
#include <numeric>

#include "engine/boxes/boxes.h"
#include "engine/boxes/detail_keyed_state.h"
#include "engine/detail/options.h"
#include "engine/expr.h"
#include "engine/serde.h"
#include "rapidjson/document.h"

namespace entente::engine::boxes {

namespace {

using detail::floor_div;
using detail::HashIndex;
using engine::detail::Need;
using engine::detail::OptionReader;

constexpr uint8_t kJoinTag = 0x4a;  // 'J'
constexpr uint8_t kJoinVersion = 1;
constexpr size_t kMaxJoinKeys = 16;

struct JoinConfig {
  std::vector<size_t> keys[2];
  bool interval = false;
  int64_t size = 0;   // tumbling
  int64_t lower = 0;  // interval: right.time - left.time in [lower, upper]
  int64_t upper = 0;
  SchemaPtr joined;                 // left fields, then right fields (renamed)
  std::optional<Expr> predicate;    // over `joined`
  std::vector<size_t> projection;   // indexes into `joined`; empty: all
  // The predicate compiled over just the joined fields it reads
  // (pred_fields, indexes into `joined`, in order), so that a release step
  // gathers only those columns for every candidate pair.
  std::optional<Expr> pred_narrow;
  std::vector<size_t> pred_fields;
  SchemaPtr pred_schema;
};

// Compiles cfg.predicate again over just the joined fields it reads.
void narrow_predicate(JoinConfig& cfg) {
  if (!cfg.predicate) return;
  const Schema& joined = *cfg.joined;
  std::vector<size_t> keep = cfg.predicate->fields();
  auto schema_of = [&](const std::vector<size_t>& idx) {
    std::vector<Field> fields;
    for (size_t i : idx) fields.push_back(joined.field(i));
    return make_schema(std::move(fields));
  };
  SchemaPtr narrow = schema_of(keep);
  auto e = Expr::compile(cfg.predicate->text(), *narrow);
  if (!e.ok()) return;
  cfg.pred_narrow = std::move(*e);
  cfg.pred_fields = std::move(keep);
  cfg.pred_schema = std::move(narrow);
}

// Removes rows [0, n) of `c`, keeping its buffers' capacity.
void drop_prefix(Column& c, size_t n) {
  const auto k = static_cast<ptrdiff_t>(n);
  switch (c.type) {
    case Type::Int64:
    case Type::Timestamp: c.ints.erase(c.ints.begin(), c.ints.begin() + k); break;
    case Type::Double: c.doubles.erase(c.doubles.begin(), c.doubles.begin() + k); break;
    case Type::Bool: c.bools.erase(c.bools.begin(), c.bools.begin() + k); break;
    case Type::String: {
      const uint32_t first = c.offsets[n];
      c.chars.erase(0, first);
      c.offsets.erase(c.offsets.begin(), c.offsets.begin() + k);
      for (uint32_t& o : c.offsets) o -= first;
      break;
    }
  }
}

// The buffered rows of one input.
struct Side {
  std::vector<Column> cols;
  std::vector<EventTime> times;
  std::vector<uint64_t> hashes;
  std::vector<uint32_t> prev;  // the next older row with the same key, or kNone
  size_t base = 0;             // rows [0, base) are purged
  HashIndex index;             // key -> newest row

  size_t rows() const { return times.size(); }
  size_t live() const { return rows() - base; }
};

class JoinBox final : public BoxBase {
 public:
  JoinBox(SchemaPtr left, SchemaPtr right, SchemaPtr output, JoinConfig cfg)
      : BoxBase({left, right}, {std::move(output)}), cfg_(std::move(cfg)), ordered_({left, right}) {
    for (int s = 0; s < 2; ++s)
      for (const Field& f : input_schemas_[s]->fields()) sides_[s].cols.emplace_back(f.type);
    int_key_ = cfg_.keys[0].size() == 1 && is_int_repr(input_schemas_[0]->field(cfg_.keys[0][0]).type) &&
               is_int_repr(input_schemas_[1]->field(cfg_.keys[1][0]).type);
  }

  std::string_view type() const override { return "join"; }
  bool keyed() const override { return true; }

  void on_batch(size_t port, const Batch& b, Emitter& /*out*/) override {
    if (b.empty()) return;
    // Rows below their input's watermark would come after rows already
    // released: late. So are rows outside the supported time range.
    const EventTime wm = port_wm_[port];
    size_t late = 0;
    for (EventTime t : b.event_time)
      late += (t < wm || t < -detail::kTimeLimit || t > detail::kTimeLimit) ? 1 : 0;
    if (late == 0) {
      ordered_.add(port, b);
      return;
    }
    stats_.late_dropped += late;
    if (late == b.rows()) return;
    keep_.clear();
    for (uint32_t i = 0; i < b.rows(); ++i) {
      const EventTime t = b.event_time[i];
      if (!(t < wm || t < -detail::kTimeLimit || t > detail::kTimeLimit)) keep_.push_back(i);
    }
    ordered_.add(port, b.take(keep_));
  }

  void on_watermark(size_t port, EventTime wm, Emitter& out) override {
    if (wm > port_wm_[port]) port_wm_[port] = wm;
    update_input_watermark(port, wm);
    ordered_.set_watermark(port, wm);
    const EventTime w = ordered_.watermark();
    ordered_.release_ranges(
        [&](size_t input, const Batch& b, size_t begin, size_t end) { process_run(input, b, begin, end); });
    purge(w == kMaxWatermark ? detail::kFar : w);
    flush(out);
    compact_if_worth();
    emit_watermark(out, w);
  }

  std::string snapshot() const override;
  Status restore(std::string_view bytes, const KeyGroupRange* keep) override;
  Status restore_joined(const std::vector<std::string_view>& parts, const std::vector<KeyGroupRange>& ranges) override;

 private:
  // Side `s`'s chains and index, rebuilt from its rows (`view`: the same
  // rows as a batch, for key comparisons).
  void rebuild_chains(int s, const Batch& view) {
    Side& dst = sides_[s];
    dst.prev.clear();
    dst.index.clear(dst.rows());
    for (uint32_t id = 0; id < dst.rows(); ++id) {
      const uint32_t prev = dst.index.find(dst.hashes[id], [&](uint32_t c) { return key_equal(s, c, view, s, id); });
      dst.prev.push_back(prev);
      if (prev == HashIndex::kNone) dst.index.insert(dst.hashes[id], id);
      else dst.index.replace(dst.hashes[id], prev, id);
    }
  }

  // True if buffered row `id` of side `s` has the key of row `row` of `b`
  // (whose key columns are those of side `bs`).
  bool key_equal(int s, uint32_t id, const Batch& b, int bs, size_t row) const {
    const auto& sk = cfg_.keys[s];
    const auto& bk = cfg_.keys[bs];
    for (size_t k = 0; k < sk.size(); ++k)
      if (!detail::cell_equal(sides_[s].cols[sk[k]], id, b.column(bk[k]), row)) return false;
    return true;
  }

  // key_equal for a single integer key (the common shape): one load each.
  bool int_key_equal(int s, uint32_t id, const Batch& b, int bs, size_t row) const {
    return sides_[s].cols[cfg_.keys[s][0]].ints[id] == b.column(cfg_.keys[bs][0]).ints[row];
  }

  // The start of the tumbling window holding `t`. Rows arrive in time
  // order, so the previous answer almost always holds: this saves the
  // integer division (tens of cycles) per row and per purge.
  int64_t window_start(int64_t t) {
    if (t < win_lo_ || t >= win_lo_ + cfg_.size) win_lo_ = floor_div(t, cfg_.size) * cfg_.size;
    return win_lo_;
  }

  // The earliest time a buffered row of side `s` may have and still match
  // a row at a time >= `now` of the other side.
  int64_t oldest_useful(int s, int64_t now) {
    now = detail::clamp_time(now);  // watermarks may be kMinTime or kMaxWatermark
    // Tumbling: a row matches only rows of its own window, which must end after now.
    if (!cfg_.interval) return window_start(now);
    // left l matches r with r.t <= l.t + upper; right r matches l with l.t <= r.t - lower.
    return s == 0 ? now - cfg_.upper : now + cfg_.lower;
  }

  // Marks the rows that can no longer match as purged (an index bump; the
  // pending pairs may still refer to them, so nothing moves here).
  void purge(int64_t now) {
    for (int s = 0; s < 2; ++s) {
      Side& side = sides_[s];
      const int64_t keep_from = oldest_useful(s, now);
      while (side.base < side.rows() && side.times[side.base] < keep_from) ++side.base;
    }
  }

  // REQUIRES: no pending pairs (they hold row ids that compaction renumbers).
  void compact_if_worth() {
    for (int s = 0; s < 2; ++s)
      if (sides_[s].base >= 4096 && sides_[s].base >= sides_[s].live()) compact(s);
  }

  // Drops the purged prefix of side `s` physically and rebuilds its index.
  void compact(int s) {
    Side& side = sides_[s];
    const size_t base = side.base;
    // In place: the buffers keep their capacity, which the side refills
    // to before the next compaction (fresh columns would grow back by
    // reallocating and copying several times).
    for (Column& c : side.cols) drop_prefix(c, base);
    side.times.erase(side.times.begin(), side.times.begin() + static_cast<ptrdiff_t>(base));
    side.hashes.erase(side.hashes.begin(), side.hashes.begin() + static_cast<ptrdiff_t>(base));
    side.prev.erase(side.prev.begin(), side.prev.begin() + static_cast<ptrdiff_t>(base));
    for (uint32_t& p : side.prev) p = (p == HashIndex::kNone || p < base) ? HashIndex::kNone : p - static_cast<uint32_t>(base);
    side.base = 0;
    rebuild_index(s);
  }

  // Index of side `s` from its rows: each key maps to its newest row.
  void rebuild_index(int s) {
    Side& side = sides_[s];
    // Sized for as many keys as the index held before (stale ones
    // included): the side refills to about that between compactions, and
    // growing back to it by doubling would rehash every entry several times.
    side.index.clear(std::max(side.rows(), side.index.size()));
    for (uint32_t id = 0; id < side.rows(); ++id) {
      const uint32_t prev = side.prev[id];
      if (prev == HashIndex::kNone) side.index.insert(side.hashes[id], id);
      else side.index.replace(side.hashes[id], prev, id);
    }
  }

  // One run of released rows of input `x`, rows [begin, end) of `rows`, in
  // order. Pairs are recorded as (left id, right id) into the side buffers
  // (the run's own rows are buffered below, so they have ids too); flush()
  // gathers the output columns for all pairs of a release step at once.
  void process_run(size_t x_port, const Batch& rows, size_t begin, size_t end) {
    if (int_key_) process_run_impl<true>(static_cast<int>(x_port), rows, begin, end);
    else process_run_impl<false>(static_cast<int>(x_port), rows, begin, end);
  }

  // hashes_[i - begin] = the key hash of row i of `rows` (side `x`'s keys),
  // as hash_rows() computes it.
  template <bool kIntKey>
  void hash_range(int x, const Batch& rows, size_t begin, size_t end) {
    hashes_.resize(end - begin);
    const auto& keys = cfg_.keys[x];
    if constexpr (kIntKey) {
      const int64_t* v = rows.column(keys[0]).ints.data();
      for (size_t i = begin; i < end; ++i) hashes_[i - begin] = hash_int(v[i]);
    } else {
      for (size_t i = begin; i < end; ++i) {
        uint64_t h = hash_value(rows.column(keys[0]), i);
        for (size_t k = 1; k < keys.size(); ++k) h = hash_combine(h, hash_value(rows.column(keys[k]), i));
        hashes_[i - begin] = h;
      }
    }
  }

  template <bool kIntKey>
  void process_run_impl(int x, const Batch& rows, size_t begin, size_t end) {
    const int o = 1 - x;
    purge(rows.event_time[begin]);
    hash_range<kIntKey>(x, rows, begin, end);
    Side& other = sides_[o];
    Side& own = sides_[x];
    std::vector<uint32_t>& pair_other = pairs_[o];
    std::vector<uint32_t>& pair_own = pairs_[x];
    const uint32_t own_next = static_cast<uint32_t>(own.rows());
    ins_.clear();
    for (uint32_t i = static_cast<uint32_t>(begin); i < end; ++i) {
      const uint64_t h = hashes_[i - begin];
      if (!owned_.contains(key_group_of(h))) continue;  // not this instance's (after a split)
      const uint32_t own_id = own_next + static_cast<uint32_t>(ins_.size());
      ins_.push_back(i);
      const EventTime t = rows.event_time[i];
      // Tumbling: buffered times never exceed t, so u shares t's window iff u >= its start.
      const int64_t win_start = cfg_.interval ? 0 : window_start(t);
      uint32_t id = other.index.find(h, [&](uint32_t c) {
        if constexpr (kIntKey) return int_key_equal(o, c, rows, x, i);
        else return key_equal(o, c, rows, x, i);
      });
      // Newest to oldest; buffered times never exceed t.
      const size_t mark = pair_other.size();
      for (; id != HashIndex::kNone && id >= other.base; id = other.prev[id]) {
        const EventTime u = other.times[id];
        bool hit;
        if (!cfg_.interval) {
          if (u < win_start) break;
          hit = true;
        } else if (x == 1) {  // t is the right row's, u a left row's: t - u in [lower, upper]
          if (t - u > cfg_.upper) break;
          hit = t - u >= cfg_.lower;
        } else {  // t is the left row's, u a right row's: u - t in [lower, upper]
          if (u - t < cfg_.lower) break;
          hit = u - t <= cfg_.upper;
        }
        if (!hit) continue;
        pair_other.push_back(id);
        out_times_.push_back(std::max(u, t));
        out_groups_.push_back(key_group_of(h));
      }
      // Oldest match first.
      std::reverse(pair_other.begin() + static_cast<ptrdiff_t>(mark), pair_other.end());
      pair_own.resize(pair_other.size(), own_id);
    }
    // Buffer this run's rows on their side.
    if (ins_.empty()) return;
    if (ins_.size() == end - begin) {
      for (size_t c = 0; c < own.cols.size(); ++c) own.cols[c].append_range(rows.column(c), begin, end);
    } else {
      for (size_t c = 0; c < own.cols.size(); ++c) own.cols[c].gather_from(rows.column(c), ins_);
    }
    for (uint32_t i : ins_) {
      const uint32_t id = static_cast<uint32_t>(own.times.size());
      own.times.push_back(rows.event_time[i]);
      const uint64_t h = hashes_[i - begin];
      own.hashes.push_back(h);
      const uint32_t prev = own.index.find(h, [&](uint32_t c) {
        if constexpr (kIntKey) return int_key_equal(x, c, rows, x, i);
        else return key_equal(x, c, rows, x, i);
      });
      own.prev.push_back(prev);
      if (prev == HashIndex::kNone) own.index.insert(h, id);
      else own.index.replace(h, prev, id);
    }
  }

  // Appends to `dst` the joined field `j` of the pairs (left[k], right[k]).
  void gather_joined(Column& dst, size_t j, std::span<const uint32_t> left, std::span<const uint32_t> right) const {
    const size_t nl = input_schemas_[0]->size();
    if (j < nl) dst.gather_from(sides_[0].cols[j], left);
    else dst.gather_from(sides_[1].cols[j - nl], right);
  }

  // Orders the pairs of the release step by event time, then key group,
  // then as found (docs/boxes-windowed.md, "Join"): the order a split of
  // the join into key-group ranges, recombined by a merge, gives too.
  // Times are already in order, and most runs of one time are short and
  // in order: each is checked, and sorted in place only if it is not.
  void order_by_key_group() {
    const size_t n = out_times_.size();
    for (size_t run = 0; run < n;) {
      size_t end = run + 1;
      bool ordered = true;
      for (; end < n && out_times_[end] == out_times_[run]; ++end)
        ordered = ordered && out_groups_[end] >= out_groups_[end - 1];
      if (!ordered) sort_run(run, end);
      run = end;
    }
    out_groups_.clear();
  }

  // Stable sort of pairs [b, e) (one event time) by key group: insertion
  // for short runs, counting over the 128 groups for long ones.
  void sort_run(size_t b, size_t e) {
    uint32_t* g = out_groups_.data();
    uint32_t* l = pairs_[0].data();
    uint32_t* r = pairs_[1].data();
    if (e - b <= 32) {
      for (size_t i = b + 1; i < e; ++i) {
        const uint32_t gi = g[i], li = l[i], ri = r[i];
        size_t j = i;
        for (; j > b && g[j - 1] > gi; --j) {
          g[j] = g[j - 1];
          l[j] = l[j - 1];
          r[j] = r[j - 1];
        }
        g[j] = gi;
        l[j] = li;
        r[j] = ri;
      }
      return;
    }
    uint32_t start[kKeyGroups + 1] = {};
    for (size_t i = b; i < e; ++i) ++start[g[i] + 1];
    for (uint32_t k = 0; k < kKeyGroups; ++k) start[k + 1] += start[k];
    scratch_.resize(2 * (e - b));
    for (size_t i = b; i < e; ++i) {
      const uint32_t at = start[g[i]]++;
      scratch_[2 * at] = l[i];
      scratch_[2 * at + 1] = r[i];
    }
    for (size_t k = 0; k < e - b; ++k) {
      l[b + k] = scratch_[2 * k];
      r[b + k] = scratch_[2 * k + 1];
    }
    // (The groups are not read again: order_by_key_group clears them.)
  }

  void flush(Emitter& out) {
    if (out_times_.empty()) return;
    order_by_key_group();
    std::span<const uint32_t> left(pairs_[0]), right(pairs_[1]);
    std::vector<EventTime> times = std::move(out_times_);
    out_times_.clear();
    if (cfg_.predicate) {
      // Evaluate over the fields the predicate reads, then keep the pairs it selects.
      const bool narrow = cfg_.pred_narrow.has_value();
      const SchemaPtr& ps = narrow ? cfg_.pred_schema : cfg_.joined;
      Batch b(ps);
      for (size_t f = 0; f < ps->size(); ++f) {
        auto col = std::make_shared<Column>(ps->field(f).type);
        col->reserve(left.size());
        gather_joined(*col, narrow ? cfg_.pred_fields[f] : f, left, right);
        b.columns.push_back(std::move(col));
      }
      b.event_time = std::move(times);
      b.seq = std::vector<Seq>(b.rows(), 0);
      sel_.clear();
      (narrow ? *cfg_.pred_narrow : *cfg_.predicate).select(b, sel_);
      if (sel_.empty()) {
        clear_pairs();
        return;
      }
      if (!narrow && cfg_.projection.empty()) {
        emit_pairs_done(out, sel_.size() == b.rows() ? std::move(b) : b.take(sel_));
        return;
      }
      times = b.event_time.release();
      if (sel_.size() != times.size()) {
        for (size_t k = 0; k < sel_.size(); ++k) {
          pairs_[0][k] = pairs_[0][sel_[k]];
          pairs_[1][k] = pairs_[1][sel_[k]];
          times[k] = times[sel_[k]];
        }
        pairs_[0].resize(sel_.size());
        pairs_[1].resize(sel_.size());
        times.resize(sel_.size());
      }
      left = std::span<const uint32_t>(pairs_[0]);
      right = std::span<const uint32_t>(pairs_[1]);
    }
    const SchemaPtr& schema = cfg_.projection.empty() ? cfg_.joined : output_schema(0);
    Batch b(schema);
    for (size_t f = 0; f < schema->size(); ++f) {
      const size_t j = cfg_.projection.empty() ? f : cfg_.projection[f];
      auto col = std::make_shared<Column>(schema->field(f).type);
      col->reserve(left.size());
      gather_joined(*col, j, left, right);
      b.columns.push_back(std::move(col));
    }
    b.event_time = std::move(times);
    b.seq = std::vector<Seq>(b.rows(), 0);
    emit_pairs_done(out, std::move(b));
  }

  void clear_pairs() {
    pairs_[0].clear();
    pairs_[1].clear();
  }

  // REQUIRES: `b` has the output schema.
  void emit_pairs_done(Emitter& out, Batch b) {
    clear_pairs();
    emit(out, 0, std::move(b));
  }

  JoinConfig cfg_;
  OrderedInputs ordered_;
  Side sides_[2];
  EventTime port_wm_[2] = {kMinTime, kMinTime};
  // The key groups this instance owns: all, or what restore(keep) kept.
  KeyGroupRange owned_;
  // Scratch.
  std::vector<uint32_t> keep_;
  std::vector<uint64_t> hashes_;
  std::vector<uint32_t> ins_;
  // Pairs found in the current release step: pairs_[0][k] (a left row id)
  // with pairs_[1][k] (a right row id) at out_times_[k].
  std::vector<uint32_t> pairs_[2];
  std::vector<uint32_t> sel_;
  std::vector<EventTime> out_times_;
  std::vector<uint32_t> out_groups_;  // the key group of each pair
  std::vector<uint32_t> scratch_;     // sort_run()'s
  bool int_key_ = false;
  // window_start()'s last answer: [win_lo_, win_lo_ + size) holds the last
  // time asked about (empty before the first).
  int64_t win_lo_ = detail::kFar;
};

// Snapshot: base state, tag, version, owned range, input watermarks, the
// rows OrderedInputs still holds, then per key group and per side the
// buffered rows with their position in the side's buffer (so that restore
// rebuilds the buffers in their original, time-ordered sequence).
std::string JoinBox::snapshot() const {
  std::string out;
  snapshot_base(out);
  ByteWriter w(out);
  w.u8(kJoinTag);
  w.u8(kJoinVersion);
  w.varint(owned_.begin);
  w.varint(owned_.end);
  w.i64(port_wm_[0]);
  w.i64(port_wm_[1]);
  ordered_.snapshot(out);
  std::vector<uint32_t> by_group[2][kKeyGroups];
  for (int s = 0; s < 2; ++s)
    for (uint32_t id = static_cast<uint32_t>(sides_[s].base); id < sides_[s].rows(); ++id)
      by_group[s][key_group_of(sides_[s].hashes[id])].push_back(id);
  for (uint32_t kg = 0; kg < kKeyGroups; ++kg) {
    for (int s = 0; s < 2; ++s) {
      const Side& side = sides_[s];
      w.varint(by_group[s][kg].size());
      for (uint32_t id : by_group[s][kg]) {
        w.varint(id - side.base);
        w.svarint(side.times[id]);
        for (const Column& c : side.cols) detail::write_cell(w, c, id);
      }
    }
  }
  return out;
}

Status JoinBox::restore(std::string_view bytes, const KeyGroupRange* keep) {
  std::string_view in = bytes;
  ENTENTE_RETURN_IF_ERROR(restore_base(in));
  ByteReader r(in);
  uint8_t tag, version;
  uint64_t ob, oe;
  EventTime wm0, wm1;
  if (!r.u8(tag) || tag != kJoinTag) return detail::corrupt("not a join snapshot");
  if (!r.u8(version) || version != kJoinVersion) return detail::corrupt("unknown join snapshot version");
  if (!r.varint(ob) || !r.varint(oe) || ob > oe || oe > kKeyGroups || !r.i64(wm0) || !r.i64(wm1))
    return detail::corrupt("truncated header");
  std::string_view rest = r.rest();
  OrderedInputs ordered({input_schemas_[0], input_schemas_[1]});
  ENTENTE_RETURN_IF_ERROR(ordered.restore(rest));
  r = ByteReader(rest);

  KeyGroupRange owned{static_cast<uint32_t>(ob), static_cast<uint32_t>(oe)};
  if (keep != nullptr) {
    owned.begin = std::max(owned.begin, keep->begin);
    owned.end = std::max(owned.begin, std::min(owned.end, keep->end));
  }
  // Rows as read (grouped by key group), with their positions.
  Side fresh[2];
  std::vector<uint64_t> pos[2];
  for (int s = 0; s < 2; ++s)
    for (const Field& f : input_schemas_[s]->fields()) fresh[s].cols.emplace_back(f.type);
  for (uint32_t kg = 0; kg < kKeyGroups; ++kg) {
    for (int s = 0; s < 2; ++s) {
      uint64_t count;
      if (!r.varint(count) || count > r.remaining()) return detail::corrupt("truncated row list");
      Side& side = fresh[s];
      for (uint64_t k = 0; k < count; ++k) {
        uint64_t p;
        int64_t t;
        if (!r.varint(p) || !r.svarint(t)) return detail::corrupt("truncated row");
        if (t < -detail::kTimeLimit || t > detail::kTimeLimit) return detail::corrupt("row time out of range");
        for (Column& c : side.cols)
          if (!detail::read_cell(r, c)) return detail::corrupt("truncated row");
        side.times.push_back(t);
        pos[s].push_back(p);
      }
    }
  }
  if (!r.empty()) return detail::corrupt("trailing bytes");

  // Order each side by position; check the keys' groups; drop other groups.
  for (int s = 0; s < 2; ++s) {
    Side& src = fresh[s];
    const size_t n = src.rows();
    std::vector<uint32_t> order(n);
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return pos[s][a] < pos[s][b]; });
    for (size_t k = 1; k < n; ++k)
      if (pos[s][order[k]] == pos[s][order[k - 1]]) return detail::corrupt("duplicate row position");
    Batch tmp(input_schemas_[s]);
    for (Column& c : src.cols) tmp.columns.push_back(std::make_shared<Column>(std::move(c)));
    tmp.event_time = std::move(src.times);
    tmp.seq = std::vector<Seq>(n, 0);
    std::vector<uint64_t> h;
    hash_rows(tmp, cfg_.keys[s], h);
    std::vector<uint32_t> kept;
    kept.reserve(n);
    for (size_t k = 0; k < n; ++k) {
      const uint32_t id = order[k];
      if (k > 0 && tmp.event_time[id] < tmp.event_time[order[k - 1]])
        return detail::corrupt("buffered rows out of time order");
      if (owned.contains(key_group_of(h[id]))) kept.push_back(id);
    }
    Side& dst = sides_[s];
    dst = Side{};
    for (size_t c = 0; c < tmp.columns.size(); ++c) {
      dst.cols.emplace_back(tmp.column(c).type);
      dst.cols.back().gather_from(tmp.column(c), kept);
    }
    for (uint32_t id : kept) {
      dst.times.push_back(tmp.event_time[id]);
      dst.hashes.push_back(h[id]);
    }
    // Chains: each row's predecessor is the previous row with the same key.
    rebuild_chains(s, tmp.take(kept));
  }
  ordered_ = std::move(ordered);
  owned_ = owned;
  port_wm_[0] = wm0;
  port_wm_[1] = wm1;
  return Status::Ok();
}

// The parts of a split join joined (merging a split fragment back): each
// part restored keeping its range; their input watermarks must agree (the
// parts were drained to one point); each side's buffered rows are the
// parts' merged by time (a key's rows are all in one part, in their
// order), the rows the inputs still hold the parts' own key groups', and
// the base state (sequence counters, watermarks) the first part's.
Status JoinBox::restore_joined(const std::vector<std::string_view>& parts, const std::vector<KeyGroupRange>& ranges) {
  if (parts.empty() || parts.size() != ranges.size())
    return make_error(Errc::invalid_argument, "restoring a join from its parts: " + std::to_string(parts.size()) +
                                                  " snapshots for " + std::to_string(ranges.size()) + " ranges");
  std::vector<std::unique_ptr<JoinBox>> from;
  for (size_t p = 0; p < parts.size(); ++p) {
    auto box = std::make_unique<JoinBox>(input_schemas_[0], input_schemas_[1], output_schema(0), cfg_);
    ENTENTE_RETURN_IF_ERROR(box->restore(parts[p], &ranges[p]));
    for (int s = 0; s < 2; ++s)
      if (!from.empty() && box->port_wm_[s] != from[0]->port_wm_[s])
        return make_error(Errc::invalid_argument, "restoring a join from its parts: part " + std::to_string(p) +
                                                      " stands at another watermark than part 0 (input " +
                                                      std::to_string(s) + ")");
    from.push_back(std::move(box));
  }
  // The inputs' held rows: each part's own key groups (a part restored
  // from the unsplit join's snapshot holds all of its rows).
  // (Added before the watermarks are set: a held row may be below its own
  // input's watermark, held back by the other input's.)
  OrderedInputs ordered({input_schemas_[0], input_schemas_[1]});
  std::vector<uint64_t> h;
  std::vector<uint32_t> rows;
  for (size_t p = 0; p < from.size(); ++p)
    for (int s = 0; s < 2; ++s)
      for (const Batch& b : from[p]->ordered_.held(static_cast<size_t>(s))) {
        hash_rows(b, cfg_.keys[s], h);
        rows.clear();
        for (uint32_t r = 0; r < b.rows(); ++r)
          if (ranges[p].contains(key_group_of(h[r]))) rows.push_back(r);
        if (!rows.empty()) ordered.add(static_cast<size_t>(s), rows.size() == b.rows() ? b : b.take(rows));
      }
  for (int s = 0; s < 2; ++s) ordered.set_watermark(static_cast<size_t>(s), from[0]->ordered_.watermark(size_t(s)));
  // Each side's rows, merged by time (stable: part order on ties).
  for (int s = 0; s < 2; ++s) {
    struct At {
      EventTime t;
      uint32_t part, id;
    };
    std::vector<At> all;
    for (size_t p = 0; p < from.size(); ++p) {
      const Side& side = from[p]->sides_[s];
      for (size_t id = side.base; id < side.rows(); ++id)
        all.push_back({side.times[id], static_cast<uint32_t>(p), static_cast<uint32_t>(id)});
    }
    std::stable_sort(all.begin(), all.end(), [](const At& a, const At& b) { return a.t < b.t; });
    Side& dst = sides_[s];
    dst = Side{};
    for (const Field& f : input_schemas_[s]->fields()) dst.cols.emplace_back(f.type);
    for (const At& a : all) {
      const Side& src = from[a.part]->sides_[s];
      for (size_t c = 0; c < dst.cols.size(); ++c) dst.cols[c].append_from(src.cols[c], a.id);
      dst.times.push_back(a.t);
      dst.hashes.push_back(src.hashes[a.id]);
    }
    Batch view(input_schemas_[s]);
    for (const Column& c : dst.cols) view.columns.push_back(std::make_shared<Column>(c));
    view.event_time = dst.times;
    view.seq = std::vector<Seq>(dst.rows(), 0);
    rebuild_chains(s, view);
  }
  std::string_view base = parts[0];
  ENTENTE_RETURN_IF_ERROR(restore_base(base));
  ordered_ = std::move(ordered);
  owned_ = {ranges.front().begin, ranges.back().end};
  port_wm_[0] = from[0]->port_wm_[0];
  port_wm_[1] = from[0]->port_wm_[1];
  win_lo_ = detail::kFar;
  return Status::Ok();
}

// ---- factory ----------------------------------------------------------------

const rapidjson::Value* options_or_null(const rapidjson::Value& v) { return v.IsNull() ? nullptr : &v; }

bool read_join_window(OptionReader& top, JoinConfig& cfg) {
  const rapidjson::Value* v = top.value("window", Need::required);
  if (v == nullptr) return false;
  Diagnostics& diag = top.diag();
  const size_t before = diag.size();
  OptionReader r(v, top.path_of("window"), diag);
  auto type = r.choice("type", Need::optional, {"tumbling", "interval"});
  cfg.interval = type.value_or("tumbling") == "interval";
  auto span_ok = [&](std::string_view key, int64_t x, int64_t min) {
    if (x < min || x > detail::kSpanLimit) {
      diag.error(r.path_of(key), std::string(key) + " must be between " + std::to_string(min) + " and 2^40 ms");
      return false;
    }
    return true;
  };
  if (!cfg.interval) {
    if (const auto* s = r.value("size", Need::required)) {
      auto d = engine::detail::parse_duration_ms(*s, r.path_of("size"), diag);
      if (d && span_ok("size", *d, 1)) cfg.size = *d;
    }
    for (std::string_view k : {"lower", "upper"})
      if (r.value(k, Need::optional) != nullptr)
        diag.error(r.path_of(k), std::string(k).append(" applies only to interval windows"));
  } else {
    if (r.value("size", Need::optional) != nullptr)
      diag.error(r.path_of("size"), "'size' applies only to tumbling windows");
    int64_t lower = 0, upper = 0;
    const auto* lo = r.value("lower", Need::required);
    const auto* up = r.value("upper", Need::required);
    bool good = lo && up;
    if (lo) good = detail::parse_signed_duration(*lo, r.path_of("lower"), diag, lower) && good;
    if (up) good = detail::parse_signed_duration(*up, r.path_of("upper"), diag, upper) && good;
    if (good && span_ok("lower", lower, -detail::kSpanLimit) && span_ok("upper", upper, -detail::kSpanLimit)) {
      if (lower > upper) diag.error(r.path_of("lower"), "lower must not exceed upper");
      cfg.lower = lower;
      cfg.upper = upper;
    }
  }
  r.finish();
  return diag.size() == before;
}

std::optional<std::vector<size_t>> read_keys(OptionReader& r, std::string_view key, const Schema& in) {
  auto names = r.strings(key, Need::required);
  if (!names) return std::nullopt;
  if (names->empty() || names->size() > kMaxJoinKeys) {
    r.diag().error(r.path_of(key), "expected 1 to 16 key fields");
    return std::nullopt;
  }
  std::vector<size_t> out;
  bool good = true;
  for (size_t i = 0; i < names->size(); ++i) {
    auto idx = in.index_of((*names)[i]);
    if (!idx) {
      r.diag().error(r.path_of(key) + "[" + std::to_string(i) + "]",
                     "unknown field '" + (*names)[i] + "'; input has " + in.to_string());
      good = false;
      continue;
    }
    out.push_back(*idx);
  }
  if (!good) return std::nullopt;
  return out;
}

}  // namespace

std::unique_ptr<Box> make_join(const rapidjson::Value& options, const BoxBuildContext& ctx) {
  Diagnostics& diag = *ctx.diag;
  const size_t before = diag.size();
  OptionReader r(options_or_null(options), ctx.path + ".options", diag);
  if (ctx.inputs.size() != 2) {
    diag.error(ctx.path, "join takes exactly 2 inputs (left, right), got " + std::to_string(ctx.inputs.size()));
    return nullptr;
  }
  const Schema& left = *ctx.inputs[0];
  const Schema& right = *ctx.inputs[1];
  JoinConfig cfg;
  auto lk = read_keys(r, "left_keys", left);
  auto rk = read_keys(r, "right_keys", right);
  if (lk && rk) {
    if (lk->size() != rk->size()) {
      diag.error(r.path_of("right_keys"), "left_keys and right_keys must have the same length");
    } else {
      for (size_t i = 0; i < lk->size(); ++i) {
        const Type a = left.field((*lk)[i]).type, b = right.field((*rk)[i]).type;
        if (a != b && !(is_int_repr(a) && is_int_repr(b)))
          diag.error(r.path_of("right_keys") + "[" + std::to_string(i) + "]",
                     "key types differ: left '" + left.field((*lk)[i]).name + "' is " + std::string(type_name(a)) +
                         ", right '" + right.field((*rk)[i]).name + "' is " + std::string(type_name(b)));
      }
      cfg.keys[0] = *lk;
      cfg.keys[1] = *rk;
    }
  }
  const bool window_ok = read_join_window(r, cfg);
  const std::string prefix = r.string("right_prefix", Need::optional).value_or("right_");

  // Joined schema: left fields, then right fields; a right field whose name
  // a left field has already taken gets the prefix.
  std::vector<Field> fields = left.fields();
  for (const Field& f : right.fields()) {
    Field g = f;
    if (left.index_of(f.name)) g.name = prefix + f.name;
    fields.push_back(std::move(g));
  }
  auto joined = Schema::make(fields);
  if (!joined.ok()) {
    diag.error(r.path_of("right_prefix"), "joined schema: " + joined.error().message);
    r.value("predicate", Need::optional);
    r.value("fields", Need::optional);
    r.finish();
    return nullptr;
  }
  cfg.joined = std::make_shared<const Schema>(std::move(*joined));
  if (auto text = r.string("predicate", Need::optional)) {
    auto e = Expr::compile(*text, *cfg.joined);
    if (!e.ok()) diag.error(r.path_of("predicate"), e.error().message);
    else if (e->type() != Type::Bool)
      diag.error(r.path_of("predicate"), "predicate must be bool, got " + std::string(type_name(e->type())));
    else cfg.predicate = std::move(*e);
  }
  SchemaPtr output = cfg.joined;
  if (auto names = r.strings("fields", Need::optional)) {
    std::vector<Field> out_fields;
    for (size_t i = 0; i < names->size(); ++i) {
      auto idx = cfg.joined->index_of((*names)[i]);
      if (!idx) {
        diag.error(r.path_of("fields") + "[" + std::to_string(i) + "]",
                   "unknown field '" + (*names)[i] + "'; the joined schema has " + cfg.joined->to_string());
        continue;
      }
      if (std::find(cfg.projection.begin(), cfg.projection.end(), *idx) != cfg.projection.end()) {
        diag.error(r.path_of("fields") + "[" + std::to_string(i) + "]", "field '" + (*names)[i] + "' listed twice");
        continue;
      }
      cfg.projection.push_back(*idx);
      out_fields.push_back(cfg.joined->field(*idx));
    }
    if (names->empty()) diag.error(r.path_of("fields"), "fields must not be empty");
    output = make_schema(std::move(out_fields));
  }
  r.finish();
  if (diag.size() != before || !window_ok || !lk || !rk) return nullptr;
  narrow_predicate(cfg);
  return std::make_unique<JoinBox>(ctx.inputs[0], ctx.inputs[1], std::move(output), std::move(cfg));
}

}  // namespace entente::engine::boxes
