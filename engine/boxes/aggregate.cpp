// Aggregate: group-by aggregation over tumbling or sliding windows, by event
// time or by tuple count, with Aurora's slack and timeout
// (docs/boxes-windowed.md#aggregate).
//
// State layout. Groups are dense ids into columnar key storage, found
// through a HashIndex on the key hash (engine/hash.h, so the key group of a
// group is the one a Split box by key hash routes it by). Each group owns a
// short, sorted list of panes; a pane is a slot of accumulator cells in one
// arena. Time windows are unions of panes of width gcd(size, slide), so a
// row updates exactly one pane however many windows contain it; closing a
// window combines its panes. Count windows use panes of gcd(size, slide)
// tuples in the same way.
//
// Files. Options are read into a Config in aggregate_options.cpp
// (detail_aggregate_config.h); the window state (groups, panes, slots) is
// a WindowState (detail_aggregate_state.h) whose snapshot encoding is in
// aggregate_snapshot.cpp; this file is the box that runs a Config over a
// WindowState: the per-batch path (on_batch and the per-row kernels) and
// the closing of windows (on_watermark, on_tick), which share this
// translation unit so that the one inlines into the other.
//
// Inlining. GCC inlines within a translation unit up to a growth budget in
// proportion to its size, and this one reaches it: moving cold code (the
// options, the snapshot) out shrank the budget and left init_cells and
// top_better out of line in the window-closing path, 2-3 % more engine
// instructions for NEXMark q5 (callgrind). The few helpers that path needs
// inlined say so ([[gnu::always_inline]]) rather than depend on what else
// the file holds.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <map>

#include "engine/boxes/boxes.h"
#include "engine/boxes/detail_aggregate_config.h"
#include "engine/boxes/detail_aggregate_state.h"
#include "engine/boxes/detail_keyed_state.h"
#include "engine/expr.h"
#include "engine/serde.h"

namespace entente::engine::boxes {

namespace {

using detail::kFar;
using detail::floor_div;
using detail::aggregate::AggSpec;
using detail::aggregate::Config;
using detail::aggregate::Fn;
using detail::aggregate::Group;
using detail::aggregate::PaneRef;
using detail::aggregate::TopOrder;
using detail::aggregate::WindowState;

constexpr uint32_t kNoSlot = UINT32_MAX;
// emit_empty never fills a gap of more windows than this (bounds the work
// one watermark can cause; documented).
constexpr int64_t kMaxEmptyWindows = int64_t{1} << 20;

// max_by/min_by cells: [by value, ordering time of the pick, picked value];
// a time of kNoPick means no row yet.
constexpr int64_t kNoPick = INT64_MAX;

inline int64_t dbl_bits(double d) { return std::bit_cast<int64_t>(d); }
inline double bits_dbl(int64_t i) { return std::bit_cast<double>(i); }
inline int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

// One Aggregate box: a Config, the WindowState it runs, and per-batch
// scratch. Like every box, called by one thread at a time (its executor's).
class AggregateBox final : public BoxBase {
 public:
  AggregateBox(SchemaPtr input, SchemaPtr output, Config cfg)
      : BoxBase({input}, {std::move(output)}), cfg_(std::move(cfg)) {
    for (size_t k : cfg_.key_cols) state_.keys.emplace_back(input->field(k).type);
    res_cells_.resize(cfg_.cells);
    res_strs_.resize(cfg_.strings);
    single_int_key_ = cfg_.key_cols.size() == 1 && is_int_repr(input->field(cfg_.key_cols[0]).type);
  }

  std::string_view type() const override { return "aggregate"; }
  bool keyed() const override { return true; }

  void on_batch(size_t /*port*/, const Batch& b, Emitter& out) override {
    if (b.empty()) return;
    prepare_values(b);
    if (cfg_.window.by_count) {
      count_batch(b, out);
    } else if (unkeyed_time()) {
      time_batch_unkeyed(b);
    } else {
      time_batch(b);
    }
  }

  void on_watermark(size_t port, EventTime wm, Emitter& out) override {
    const EventTime in = update_input_watermark(port, wm);
    if (cfg_.window.by_count) {
      emit_watermark(out, in);
      return;
    }
    close_until(detail::sub_clamped(in, cfg_.slack), out);
    if (in == kMaxWatermark) {
      emit_watermark(out, kMaxWatermark);
    } else {
      // Every row still to come belongs to a window ending after state_.bound,
      // and is stamped end - 1.
      emit_watermark(out, next_end_after(state_.bound) - 1);
    }
  }

  void on_tick(int64_t now_ms, Emitter& out) override {
    state_.now_ms = now_ms;
    if (cfg_.timeout <= 0 || cfg_.window.by_count) return;
    expire(out);
  }

  std::string snapshot() const override;
  Status restore(std::string_view bytes, const KeyGroupRange* keep) override;
  Status restore_joined(const std::vector<std::string_view>& parts,
                        const std::vector<KeyGroupRange>& ranges) override;

 private:
  // ---- per-batch input ---------------------------------------------------

  void prepare_values(const Batch& b) {
    values_.resize(cfg_.aggs.size());
    by_values_.resize(cfg_.aggs.size());
    evaluated_.resize(cfg_.aggs.size());
    for (size_t j = 0; j < cfg_.aggs.size(); ++j) {
      const AggSpec& a = cfg_.aggs[j];
      by_values_[j] = a.is_by() ? &b.column(static_cast<size_t>(a.by_field)) : nullptr;
      if (a.fn == Fn::count) {
        values_[j] = nullptr;
      } else if (a.field >= 0) {
        values_[j] = &b.column(static_cast<size_t>(a.field));
      } else {
        evaluated_[j] = a.expr->eval(b);
        values_[j] = evaluated_[j].get();
      }
    }
    if (unkeyed_time()) {
      // time_batch_unkeyed() reads no hashes and sets slots only where it
      // hands rows to the per-row kernels.
      if (slots_.size() < b.rows()) slots_.resize(b.rows(), kNoSlot);
      return;
    }
    // time_batch() hashes a single int key itself, only on a change of key.
    if (!(single_int_key_ && !cfg_.window.by_count)) hash_rows(b, cfg_.key_cols, hashes_);
    slots_.assign(b.rows(), kNoSlot);
  }

  // Time windows without group_by: one group, rows handled in runs per pane.
  bool unkeyed_time() const { return cfg_.key_cols.empty() && !cfg_.window.by_count; }

  // The only group of an aggregate without group_by (hash 0, as hash_rows
  // gives for no key columns), created if new.
  uint32_t unkeyed_group() {
    if (!state_.groups.empty()) return 0;
    Group g;
    g.hash = 0;
    g.key_group = key_group_of(0);
    state_.groups.push_back(std::move(g));
    state_.index.insert(0, 0);
    return 0;
  }

  // The group of row `row` of `b` (hash `h`), created if new.
  uint32_t group_of(const Batch& b, size_t row, uint64_t h) {
    uint32_t id;
    if (single_int_key_) {
      // hash_int is a bijection: equal hashes are equal keys (restore()
      // checks stored hashes against their keys), so the key column is not
      // read.
      id = state_.index.find(h, [](uint32_t) { return true; });
    } else {
      id = state_.index.find(h, [&](uint32_t g) {
        for (size_t k = 0; k < state_.keys.size(); ++k)
          if (!detail::cell_equal(state_.keys[k], g, b.column(cfg_.key_cols[k]), row)) return false;
        return true;
      });
    }
    if (id != detail::HashIndex::kNone) return id;
    id = static_cast<uint32_t>(state_.groups.size());
    for (size_t k = 0; k < state_.keys.size(); ++k)
      state_.keys[k].append_from(b.column(cfg_.key_cols[k]), row);
    Group g;
    g.hash = h;
    g.key_group = key_group_of(h);
    state_.groups.push_back(std::move(g));
    state_.index.insert(h, id);
    return id;
  }

  // The slot of pane `pane` of group `gid`, created if new.
  uint32_t pane_slot(uint32_t gid, int64_t pane) {
    auto& panes = state_.groups[gid].panes;
    size_t k = panes.size();
    while (k > 0 && panes[k - 1].pane > pane) --k;
    if (k > 0 && panes[k - 1].pane == pane) return panes[k - 1].slot;
    if (panes.empty()) {
      ++state_.live_groups;
      // Room for one window's panes at once: one allocation, not a doubling series.
      if (panes.capacity() == 0)
        panes.reserve(static_cast<size_t>(std::min<int64_t>(cfg_.window.size / cfg_.window.pane + 1, 8)));
    }
    const uint32_t slot = alloc_slot();
    panes.insert(panes.begin() + static_cast<ptrdiff_t>(k), PaneRef{pane, slot});
    if (!cfg_.window.by_count) {
      // Rows mostly arrive pane after pane: remember the last pane's list
      // (map nodes are stable; time batches reset this, close_until erases).
      if (pane != cached_pane_ || cached_pane_gids_ == nullptr) {
        cached_pane_gids_ = &state_.pane_groups[pane];
        cached_pane_ = pane;
      }
      cached_pane_gids_->push_back(gid);
    }
    return slot;
  }

  uint32_t alloc_slot() {
    const uint32_t s = state_.alloc_slot_raw(cfg_);
    state_.slot_stamp[s] = state_.stamp++;
    state_.slot_created[s] = state_.now_ms;
    init_cells(&state_.cells[size_t{s} * cfg_.cells]);
    for (uint32_t j = 0; j < cfg_.strings; ++j) state_.strs[size_t{s} * cfg_.strings + j].clear();
    return s;
  }

  // Identity values, so that updates need no "first row" test.
  [[gnu::always_inline]] void init_cells(int64_t* c) const {
    c[0] = 0;
    for (const AggSpec& a : cfg_.aggs) {
      int64_t* v = c + a.cell;
      switch (a.fn) {
        case Fn::count: break;
        case Fn::sum:
        case Fn::avg: v[0] = 0; break;  // 0 and 0.0 share the bit pattern
        case Fn::min:
        case Fn::max: {
          const bool mn = a.fn == Fn::min;
          if (a.in_type == Type::String) v[0] = 0;  // has-value flag
          else if (a.in_type == Type::Double) v[0] = dbl_bits(mn ? HUGE_VAL : -HUGE_VAL);
          else if (a.in_type == Type::Bool) v[0] = mn ? 1 : 0;
          else v[0] = mn ? INT64_MAX : INT64_MIN;
          break;
        }
        case Fn::first: v[0] = INT64_MAX; if (!a.is_string()) v[1] = 0; break;
        case Fn::last: v[0] = INT64_MIN; if (!a.is_string()) v[1] = 0; break;
        case Fn::max_by:
        case Fn::min_by: v[0] = 0; v[1] = kNoPick; v[2] = 0; break;
      }
    }
  }

  // Applies rows [from, to) of the prepared batch to their slots, one tight
  // loop per aggregate. `order` is the ordering time of first/last (event
  // time; null for count windows, where arrival decides).
  void update_rows(size_t from, size_t to, const EventTime* order) {
    const uint32_t K = cfg_.cells;
    int64_t* cells = state_.cells.data();
    const uint32_t* slots = slots_.data();
    for (size_t j = 0; j < cfg_.aggs.size(); ++j) {
      const AggSpec& a = cfg_.aggs[j];
      const Column* col = values_[j];
      const uint32_t off = a.cell;
      switch (a.fn) {
        case Fn::count: break;
        case Fn::sum:
        case Fn::avg:
          if (a.in_type == Type::Double) {
            const double* v = col->doubles.data();
            for (size_t i = from; i < to; ++i) {
              if (slots[i] == kNoSlot) continue;
              int64_t& c = cells[size_t{slots[i]} * K + off];
              c = dbl_bits(bits_dbl(c) + v[i]);
            }
          } else {
            const int64_t* v = col->ints.data();
            for (size_t i = from; i < to; ++i) {
              if (slots[i] == kNoSlot) continue;
              int64_t& c = cells[size_t{slots[i]} * K + off];
              c = wrap_add(c, v[i]);
            }
          }
          break;
        case Fn::min:
        case Fn::max: update_minmax(a, col, from, to); break;
        case Fn::first:
        case Fn::last: update_firstlast(a, col, from, to, order); break;
        case Fn::max_by:
        case Fn::min_by:
          for (size_t i = from; i < to; ++i)
            if (slots[i] != kNoSlot) offer_by(a, col, by_values_[j], slots[i], i, order ? order[i] : 0);
          break;
      }
    }
    for (size_t i = from; i < to; ++i)
      if (slots[i] != kNoSlot) ++cells[size_t{slots[i]} * K];
  }

  // The `by` value of row i as cell bits.
  static int64_t by_bits(const Column& c, size_t i) {
    switch (c.type) {
      case Type::Double: return dbl_bits(c.doubles[i]);
      case Type::Bool: return c.bools[i];
      default: return c.ints[i];
    }
  }

  // > 0 if `by` value v ranks above `cur` for max_by/min_by, 0 if they tie.
  // NaN ranks below every number (for both), so it is picked only when
  // every row's value is NaN.
  static int by_cmp(const AggSpec& a, int64_t v, int64_t cur) {
    int r;
    if (a.by_type == Type::Double) {
      const double x = bits_dbl(v), y = bits_dbl(cur);
      const bool nx = std::isnan(x), ny = std::isnan(y);
      if (nx || ny) return nx == ny ? 0 : (nx ? -1 : 1);
      r = x < y ? -1 : (x > y ? 1 : 0);
    } else {
      r = v < cur ? -1 : (v > cur ? 1 : 0);
    }
    return a.fn == Fn::min_by ? -r : r;
  }

  // Whether a candidate (by value v, ordering time t) replaces the pick in
  // cells `c`: a better `by`, or an equal one at an earlier time (equal
  // times: the earlier arrival, which is already there, stays).
  static bool by_takes(const AggSpec& a, int64_t v, int64_t t, const int64_t* c) {
    if (c[1] == kNoPick) return true;
    const int r = by_cmp(a, v, c[0]);
    return r > 0 || (r == 0 && t < c[1]);
  }

  // Offers row i (ordering time t) to the max_by/min_by `a` of slot s.
  void offer_by(const AggSpec& a, const Column* col, const Column* by, uint32_t s, size_t i, int64_t t) {
    int64_t* c = &state_.cells[size_t{s} * cfg_.cells + a.cell];
    const int64_t v = by_bits(*by, i);
    if (!by_takes(a, v, t, c)) return;
    c[0] = v;
    c[1] = t;
    switch (a.in_type) {
      case Type::Int64:
      case Type::Timestamp: c[2] = col->ints[i]; break;
      case Type::Double: c[2] = dbl_bits(col->doubles[i]); break;
      case Type::Bool: c[2] = col->bools[i]; break;
      case Type::String: state_.strs[size_t{s} * cfg_.strings + a.str].assign(col->str(i)); break;
    }
  }

  void update_minmax(const AggSpec& a, const Column* col, size_t from, size_t to) {
    const uint32_t K = cfg_.cells;
    const bool mn = a.fn == Fn::min;
    for (size_t i = from; i < to; ++i) {
      const uint32_t s = slots_[i];
      if (s == kNoSlot) continue;
      int64_t& c = state_.cells[size_t{s} * K + a.cell];
      switch (a.in_type) {
        case Type::Int64:
        case Type::Timestamp: {
          const int64_t v = col->ints[i];
          if (mn ? v < c : v > c) c = v;
          break;
        }
        case Type::Double: {
          const double v = col->doubles[i];
          if (mn ? v < bits_dbl(c) : v > bits_dbl(c)) c = dbl_bits(v);
          break;
        }
        case Type::Bool: {
          const int64_t v = col->bools[i];
          if (mn ? v < c : v > c) c = v;
          break;
        }
        case Type::String: {
          std::string& cur = state_.strs[size_t{s} * cfg_.strings + a.str];
          const std::string_view v = col->str(i);
          if (c == 0 || (mn ? v < cur : v > cur)) {
            cur.assign(v);
            c = 1;
          }
          break;
        }
      }
    }
  }

  void update_firstlast(const AggSpec& a, const Column* col, size_t from, size_t to,
                        const EventTime* order) {
    const uint32_t K = cfg_.cells;
    const bool first = a.fn == Fn::first;
    for (size_t i = from; i < to; ++i) {
      const uint32_t s = slots_[i];
      if (s == kNoSlot) continue;
      int64_t* c = &state_.cells[size_t{s} * K + a.cell];
      const int64_t t = order ? order[i] : 0;
      if (first ? !(t < c[0]) : !(t >= c[0])) continue;
      c[0] = t;
      switch (a.in_type) {
        case Type::Int64:
        case Type::Timestamp: c[1] = col->ints[i]; break;
        case Type::Double: c[1] = dbl_bits(col->doubles[i]); break;
        case Type::Bool: c[1] = col->bools[i]; break;
        case Type::String: state_.strs[size_t{s} * cfg_.strings + a.str].assign(col->str(i)); break;
      }
    }
  }

  // Applies rows [from, to) of the prepared batch, all of slot `s` (time
  // windows without group_by), with the same result as update_rows(): per
  // aggregate one pass with the accumulator in a register, or the run's
  // best row offered once; string min/max and first/last use the per-row
  // kernels.
  void update_run(uint32_t s, size_t from, size_t to, const EventTime* order) {
    int64_t* base = &state_.cells[size_t{s} * cfg_.cells];
    base[0] += static_cast<int64_t>(to - from);
    bool slots_set = false;
    auto use_per_row = [&] {
      if (slots_set) return;
      std::fill(slots_.begin() + static_cast<ptrdiff_t>(from), slots_.begin() + static_cast<ptrdiff_t>(to), s);
      slots_set = true;
    };
    // max_by/min_by over the same `by` field share the run's pick.
    int pick_by = -1;
    Fn pick_fn = Fn::count;
    size_t pick = 0;
    run_extremes_.clear();
    for (size_t j = 0; j < cfg_.aggs.size(); ++j) {
      const AggSpec& a = cfg_.aggs[j];
      const Column* col = values_[j];
      int64_t* c = base + a.cell;
      const bool mn = a.fn == Fn::min;
      switch (a.fn) {
        case Fn::count: break;
        case Fn::sum:
        case Fn::avg:
          if (a.in_type == Type::Double) {
            double acc = bits_dbl(c[0]);
            for (size_t i = from; i < to; ++i) acc += col->doubles[i];
            c[0] = dbl_bits(acc);
          } else {
            uint64_t acc = static_cast<uint64_t>(c[0]);
            for (size_t i = from; i < to; ++i) acc += static_cast<uint64_t>(col->ints[i]);
            c[0] = static_cast<int64_t>(acc);
          }
          break;
        case Fn::min:
        case Fn::max:
          switch (a.in_type) {
            case Type::Int64:
            case Type::Timestamp: {
              const int64_t m = run_extreme(a.field, *col, mn, from, to);
              c[0] = mn ? std::min(c[0], m) : std::max(c[0], m);
              break;
            }
            case Type::Double: {
              double m = bits_dbl(c[0]);
              const double* v = col->doubles.data();
              for (size_t i = from; i < to; ++i)
                if (mn ? v[i] < m : v[i] > m) m = v[i];
              c[0] = dbl_bits(m);
              break;
            }
            case Type::Bool: {
              int64_t m = c[0];
              const uint8_t* v = col->bools.data();
              for (size_t i = from; i < to; ++i) m = mn ? std::min<int64_t>(m, v[i]) : std::max<int64_t>(m, v[i]);
              c[0] = m;
              break;
            }
            case Type::String:
              use_per_row();
              update_minmax(a, col, from, to);
              break;
          }
          break;
        case Fn::first:
        case Fn::last:
          use_per_row();
          update_firstlast(a, col, from, to, order);
          break;
        case Fn::max_by:
        case Fn::min_by:
          if (pick_by != a.by_field || pick_fn != a.fn) {
            pick = run_pick(a, *by_values_[j], from, to, order);
            pick_by = a.by_field;
            pick_fn = a.fn;
          }
          offer_by(a, col, by_values_[j], s, pick, order ? order[pick] : 0);
          break;
      }
    }
    if (slots_set)
      std::fill(slots_.begin() + static_cast<ptrdiff_t>(from), slots_.begin() + static_cast<ptrdiff_t>(to), kNoSlot);
  }

  // The smallest (mn) or largest value of int column `col` (input field
  // `field`, or -1 for an expression) over rows [from, to) (from < to),
  // remembered for the run so that max(x) and max_by(_, x) scan x once.
  int64_t run_extreme(int field, const Column& col, bool mn, size_t from, size_t to) {
    if (field >= 0)
      for (const RunExtreme& r : run_extremes_)
        if (r.field == field && r.mn == mn) return r.value;
    const int64_t* v = col.ints.data();
    // Four independent chains: the loop is bound by the min/max latency.
    int64_t m[4] = {v[from], v[from], v[from], v[from]};
    size_t i = from;
    if (mn) {
      for (; i + 4 <= to; i += 4)
        for (int k = 0; k < 4; ++k) m[k] = std::min(m[k], v[i + k]);
      for (; i < to; ++i) m[0] = std::min(m[0], v[i]);
    } else {
      for (; i + 4 <= to; i += 4)
        for (int k = 0; k < 4; ++k) m[k] = std::max(m[k], v[i + k]);
      for (; i < to; ++i) m[0] = std::max(m[0], v[i]);
    }
    const int64_t r = mn ? std::min(std::min(m[0], m[1]), std::min(m[2], m[3]))
                         : std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
    if (field >= 0) run_extremes_.push_back(RunExtreme{field, mn, r});
    return r;
  }

  // The row of [from, to) that max_by/min_by `a` picks among those rows
  // (best `by`, then earliest time, then earliest arrival).
  size_t run_pick(const AggSpec& a, const Column& by, size_t from, size_t to, const EventTime* order) {
    size_t best = from;
    int64_t bt = order ? order[from] : 0;
    if (by.type == Type::Int64 || by.type == Type::Timestamp) {
      const int64_t* v = by.ints.data();
      const int64_t m = run_extreme(a.by_field, by, a.fn == Fn::min_by, from, to);
      // The first row holding m (there is one: m is the run's extreme).
      // std::find's unrolled scan: fewer branches per row than a plain
      // loop, and q7's speed no longer hangs on where this loop lands
      // against a fetch boundary (docs/nexmark.md).
      size_t i = static_cast<size_t>(std::find(v + from, v + to, m) - v);
      best = i;
      if (!order) return best;  // arrival order decides
      bt = order[i];
      // The other rows holding m: the earliest in time wins.
      for (const int64_t *p = v + i + 1, *end = v + to; (p = std::find(p, end, m)) != end; ++p) {
        const size_t j = static_cast<size_t>(p - v);
        if (order[j] < bt) {
          best = j;
          bt = order[j];
        }
      }
      return best;
    }
    int64_t bv = by_bits(by, from);
    for (size_t i = from + 1; i < to; ++i) {
      const int64_t x = by_bits(by, i);
      const int64_t t = order ? order[i] : 0;
      const int r = by_cmp(a, x, bv);
      if (r > 0 || (r == 0 && t < bt)) {
        best = i;
        bv = x;
        bt = t;
      }
    }
    return best;
  }

  // ---- time windows --------------------------------------------------------

  // Smallest window end strictly greater than `t`.
  int64_t next_end_after(int64_t t) const {
    const auto& w = cfg_.window;
    return (floor_div(t - w.size, w.slide) + 1) * w.slide + w.size;
  }
  // End of the first window that contains time `t`.
  int64_t first_end_containing(int64_t t) const { return next_end_after(t); }
  // End of the last window that contains time `t`.
  int64_t last_end_containing(int64_t t) const {
    const auto& w = cfg_.window;
    return floor_div(t, w.slide) * w.slide + w.size;
  }

  void time_batch(const Batch& b) {
    const size_t n = b.rows();
    const EventTime* et = b.event_time.data();
    const int64_t pane_w = cfg_.window.pane;
    cached_pane_gids_ = nullptr;
    // Single int key: consecutive rows often share it (hot keys).
    const int64_t* key = single_int_key_ ? b.column(cfg_.key_cols[0]).ints.data() : nullptr;
    int64_t last_key = 0;
    uint32_t last_gid = detail::HashIndex::kNone;
    // The pane of the previous row, [pane_lo, pane_hi], and its last window
    // end (the same for the whole pane): two divisions per pane, not per row.
    int64_t pane_lo = 1, pane_hi = 0, pane = 0, last_end = 0;
    for (size_t i = 0; i < n; ++i) {
      const EventTime t = et[i];
      if (t < pane_lo || t > pane_hi) {
        if (t < -detail::kTimeLimit || t > detail::kTimeLimit) {
          ++stats_.late_dropped;
          continue;
        }
        pane = floor_div(t, pane_w);
        pane_lo = std::max(pane * pane_w, -detail::kTimeLimit);
        pane_hi = std::min(pane * pane_w + pane_w - 1, detail::kTimeLimit);
        last_end = last_end_containing(t);
      }
      if (last_end <= state_.bound) {
        ++stats_.late_dropped;
        continue;
      }
      uint32_t gid;
      if (key == nullptr) {
        gid = group_of(b, i, hashes_[i]);
      } else if (last_gid != detail::HashIndex::kNone && key[i] == last_key) {
        gid = last_gid;
      } else {
        gid = group_of(b, i, hash_int(key[i]));
        last_key = key[i];
        last_gid = gid;
      }
      if (last_end <= state_.groups[gid].emitted_end) {
        ++stats_.late_dropped;
        continue;
      }
      // Most rows land in their group's newest pane.
      const auto& panes = state_.groups[gid].panes;
      slots_[i] = !panes.empty() && panes.back().pane == pane ? panes.back().slot : pane_slot(gid, pane);
    }
    update_rows(0, n, et);
  }

  // time_batch() without group_by: rows come in runs of one pane (event
  // time order, the usual case, makes a run of a whole batch), and a run
  // is late, or not, as a whole (a pane lies within one slide).
  void time_batch_unkeyed(const Batch& b) {
    const size_t n = b.rows();
    const EventTime* et = b.event_time.data();
    const int64_t pane_w = cfg_.window.pane;
    cached_pane_gids_ = nullptr;
    size_t i = 0;
    while (i < n) {
      const EventTime t = et[i];
      if (t < -detail::kTimeLimit || t > detail::kTimeLimit) {
        ++stats_.late_dropped;
        ++i;
        continue;
      }
      const int64_t pane = floor_div(t, pane_w);
      const int64_t lo = std::max(pane * pane_w, -detail::kTimeLimit);
      const int64_t hi = std::min(pane * pane_w + pane_w - 1, detail::kTimeLimit);
      // Rows with t - lo <= hi - lo (unsigned: also catches t < lo), in
      // blocks of 8 with one branch each.
      const uint64_t ulo = static_cast<uint64_t>(lo), span = static_cast<uint64_t>(hi) - ulo;
      size_t j = i + 1;
      while (j + 8 <= n) {
        bool outside = false;
        for (size_t k = 0; k < 8; ++k) outside |= static_cast<uint64_t>(et[j + k]) - ulo > span;
        if (outside) break;
        j += 8;
      }
      while (j < n && static_cast<uint64_t>(et[j]) - ulo <= span) ++j;
      const int64_t last_end = last_end_containing(t);
      const uint32_t gid = unkeyed_group();
      if (last_end <= state_.bound || last_end <= state_.groups[gid].emitted_end) {
        stats_.late_dropped += j - i;
      } else {
        update_run(pane_slot(gid, pane), i, j, et);
      }
      i = j;
    }
  }

  // Closes every window with end <= `bound` (a watermark minus the slack).
  void close_until(int64_t bound, Emitter& out) {
    if (bound <= state_.bound) return;
    const auto& w = cfg_.window;
    const int64_t pw = w.pane;
    int64_t e = next_end_after(state_.bound);
    while (true) {
      auto it = state_.pane_groups.lower_bound(floor_div(e - w.size, pw));
      if (it == state_.pane_groups.end()) break;
      e = std::max(e, first_end_containing(it->first * pw));
      if (e > bound) break;
      emit_window(e);
      e += w.slide;
    }
    state_.bound = bound;
    // Panes before the start of the first window still open are done with.
    const int64_t keep_from = bound >= kFar ? INT64_MAX : floor_div(next_end_after(bound) - w.size, pw);
    cached_pane_gids_ = nullptr;
    while (!state_.pane_groups.empty() && state_.pane_groups.begin()->first < keep_from) {
      auto node = state_.pane_groups.extract(state_.pane_groups.begin());
      for (uint32_t gid : node.mapped()) drop_panes_before(gid, keep_from);
    }
    flush(out);
    maybe_compact();
  }

  void drop_panes_before(uint32_t gid, int64_t pane) {
    Group& g = state_.groups[gid];
    size_t k = 0;
    while (k < g.panes.size() && g.panes[k].pane < pane) state_.free_slot(g.panes[k++].slot);
    if (k == 0) return;
    g.panes.erase(g.panes.begin(), g.panes.begin() + static_cast<ptrdiff_t>(k));
    if (g.panes.empty()) --state_.live_groups;
  }

  struct Pick {
    uint32_t key_group;
    uint64_t stamp;
    uint32_t gid;
    uint32_t row = 0;  // emit_window(): the group's result in win_cells_/win_strs_
    bool operator<(const Pick& o) const {
      return key_group != o.key_group ? key_group < o.key_group : stamp < o.stamp;
    }
  };

  // Combines the panes [p0, p1) of group `gid` into res_cells_/res_strs_.
  // Returns false if it has none. `stamp` gets the earliest pane creation
  // (the group's first arrival in the window), `created` the earliest
  // processing time.
  bool combine(uint32_t gid, int64_t p0, int64_t p1, uint64_t* stamp, int64_t* created) {
    const Group& g = state_.groups[gid];
    bool any = false;
    uint64_t st = UINT64_MAX;
    int64_t cr = INT64_MAX;
    init_cells(res_cells_.data());
    for (auto& s : res_strs_) s.clear();
    for (const PaneRef& p : g.panes) {
      if (p.pane < p0) continue;
      if (p.pane >= p1) break;
      any = true;
      if (stamp) st = std::min(st, state_.slot_stamp[p.slot]);
      if (created) cr = std::min(cr, state_.slot_created[p.slot]);
      merge_slot(p.slot);
    }
    if (stamp) *stamp = st;
    if (created) *created = cr;
    return any;
  }

  void merge_slot(uint32_t slot) {
    const int64_t* c = &state_.cells[size_t{slot} * cfg_.cells];
    const std::string* ss = cfg_.strings ? &state_.strs[size_t{slot} * cfg_.strings] : nullptr;
    int64_t* r = res_cells_.data();
    r[0] += c[0];
    for (const AggSpec& a : cfg_.aggs) {
      const int64_t* v = c + a.cell;
      int64_t* x = r + a.cell;
      switch (a.fn) {
        case Fn::count: break;
        case Fn::sum:
        case Fn::avg:
          if (a.in_type == Type::Double) x[0] = dbl_bits(bits_dbl(x[0]) + bits_dbl(v[0]));
          else x[0] = wrap_add(x[0], v[0]);
          break;
        case Fn::min:
        case Fn::max: {
          const bool mn = a.fn == Fn::min;
          if (a.in_type == Type::String) {
            if (v[0] && (!x[0] || (mn ? ss[a.str] < res_strs_[a.str] : ss[a.str] > res_strs_[a.str]))) {
              res_strs_[a.str] = ss[a.str];
              x[0] = 1;
            }
          } else if (a.in_type == Type::Double) {
            if (mn ? bits_dbl(v[0]) < bits_dbl(x[0]) : bits_dbl(v[0]) > bits_dbl(x[0])) x[0] = v[0];
          } else if (mn ? v[0] < x[0] : v[0] > x[0]) {
            x[0] = v[0];
          }
          break;
        }
        case Fn::first:
        case Fn::last: {
          const bool take = a.fn == Fn::first ? v[0] < x[0] : v[0] >= x[0];
          if (!take) break;
          x[0] = v[0];
          if (a.in_type == Type::String) res_strs_[a.str] = ss[a.str];
          else x[1] = v[1];
          break;
        }
        case Fn::max_by:
        case Fn::min_by:
          // Panes merge in pane order: in time windows earlier panes hold
          // earlier times, in count windows earlier arrivals.
          if (v[1] == kNoPick || !by_takes(a, v[0], v[1], x)) break;
          x[0] = v[0];
          x[1] = v[1];
          if (a.in_type == Type::String) res_strs_[a.str] = ss[a.str];
          else x[2] = v[2];
          break;
      }
    }
  }

  // Output rows being built (flushed as one batch).
  struct OutRows {
    std::vector<std::shared_ptr<Column>> cols;
    std::vector<EventTime> times;
  };

  void ensure_out() {
    if (!out_rows_.cols.empty()) return;
    for (const Field& f : output_schema(0)->fields()) out_rows_.cols.push_back(std::make_shared<Column>(f.type));
  }

  // Appends the combined result (res_cells_) for group `gid` (or no group,
  // for an empty window) to the output.
  void append_row(uint32_t gid, bool has_group, int64_t start, int64_t end, EventTime t) {
    append_row(gid, has_group, start, end, t, res_cells_.data(), res_strs_.data());
  }

  // Appends one value-carrying cell (min, max, first, last, max_by, min_by)
  // in the aggregate's input type: `v` holds numbers and bools, `strs`
  // the strings.
  static void append_cell(Column& col, const AggSpec& a, int64_t v, const std::string* strs) {
    switch (a.in_type) {
      case Type::Int64:
      case Type::Timestamp: col.ints.push_back(v); break;
      case Type::Double: col.doubles.push_back(bits_dbl(v)); break;
      case Type::Bool: col.bools.push_back(static_cast<uint8_t>(v != 0)); break;
      case Type::String: col.append_str(strs[a.str]); break;
    }
  }

  // The same for a combined result kept elsewhere (`r`: cfg_.cells cells,
  // `strs`: cfg_.strings strings).
  void append_row(uint32_t gid, bool has_group, int64_t start, int64_t end, EventTime t, const int64_t* r,
                  const std::string* strs) {
    ensure_out();
    size_t c = 0;
    for (size_t k = 0; k < state_.keys.size(); ++k) {
      if (has_group) out_rows_.cols[c]->append_from(state_.keys[k], gid);
      ++c;
    }
    if (!cfg_.window.by_count) {
      out_rows_.cols[c++]->ints.push_back(start);
      out_rows_.cols[c++]->ints.push_back(end);
    }
    for (const AggSpec& a : cfg_.aggs) {
      Column& col = *out_rows_.cols[c++];
      const int64_t* x = r + a.cell;
      switch (a.fn) {
        case Fn::count: col.ints.push_back(r[0]); break;
        case Fn::sum:
          if (a.in_type == Type::Double) col.doubles.push_back(bits_dbl(x[0]));
          else col.ints.push_back(x[0]);
          break;
        case Fn::avg: {
          const double sum = a.in_type == Type::Double ? bits_dbl(x[0]) : static_cast<double>(x[0]);
          col.doubles.push_back(r[0] ? sum / static_cast<double>(r[0]) : 0.0);
          break;
        }
        case Fn::min:
        case Fn::max:
        case Fn::first:
        case Fn::last: {
          // first/last keep (time, value) cells; string values live in strs.
          const bool timed = a.fn == Fn::first || a.fn == Fn::last;
          append_cell(col, a, a.is_string() ? 0 : (timed ? x[1] : x[0]), strs);
          break;
        }
        case Fn::max_by:
        case Fn::min_by: append_cell(col, a, x[2], strs); break;
      }
    }
    out_rows_.times.push_back(t);
  }

  // emit_empty: empty rows for the windows between the last emitted one and
  // `end` (only without group_by, so "empty" is well defined).
  void fill_empty_until(int64_t end) {
    if (!cfg_.emit_empty) return;
    if (state_.last_emitted_end != INT64_MIN) {
      int64_t e = state_.last_emitted_end + cfg_.window.slide;
      for (int64_t k = 0; e < end && k < kMaxEmptyWindows; e += cfg_.window.slide, ++k) {
        init_cells(res_cells_.data());
        append_row(0, false, e - cfg_.window.size, e, e - 1);
      }
    }
    state_.last_emitted_end = std::max(state_.last_emitted_end, end);
  }

  // Emits, for window [end - size, end), one row per group with rows in it,
  // ordered by key group, then by the group's first arrival in the window.
  void emit_window(int64_t end) {
    const auto& w = cfg_.window;
    const int64_t p0 = floor_div(end - w.size, w.pane), p1 = floor_div(end, w.pane);
    ++epoch_;
    picks_.clear();
    win_cells_.clear();
    win_strs_.clear();
    const auto& pane_groups = state_.pane_groups;
    for (auto it = pane_groups.lower_bound(p0); it != pane_groups.end() && it->first < p1; ++it) {
      for (uint32_t gid : it->second) {
        Group& g = state_.groups[gid];
        if (g.mark == epoch_) continue;
        g.mark = epoch_;
        if (g.emitted_end >= end) continue;  // emitted early by the time-out
        // Combined now, while the group's panes are in cache, not after the sort.
        uint64_t stamp;
        combine(gid, p0, p1, &stamp, nullptr);
        const uint32_t row = static_cast<uint32_t>(picks_.size());
        win_cells_.insert(win_cells_.end(), res_cells_.begin(), res_cells_.end());
        for (std::string& str : res_strs_) win_strs_.push_back(std::move(str));
        picks_.push_back(Pick{g.key_group, stamp, gid, row});
      }
    }
    if (picks_.empty()) return;
    keep_top();
    sort_picks();
    fill_empty_until(end);
    append_picks(end - w.size, end);
  }

  // The value of non-string aggregate `a` in combined cells `r`, as cell
  // bits (doubles bit-cast), as append_row() writes it.
  static int64_t result_bits(const AggSpec& a, const int64_t* r) {
    const int64_t* x = r + a.cell;
    switch (a.fn) {
      case Fn::count: return r[0];
      case Fn::avg: {
        const double sum = a.in_type == Type::Double ? bits_dbl(x[0]) : static_cast<double>(x[0]);
        return dbl_bits(r[0] ? sum / static_cast<double>(r[0]) : 0.0);
      }
      case Fn::sum:
      case Fn::min:
      case Fn::max: return x[0];
      case Fn::first:
      case Fn::last: return x[1];
      case Fn::max_by:
      case Fn::min_by: return x[2];
    }
    return 0;
  }

  // True if `top` ranks cell bits `x` strictly above `y` (values of the
  // ranked aggregate as result_bits() gives them). NaN ranks below every
  // number in both orders, as for max_by/min_by.
  [[gnu::always_inline]] bool top_better(int64_t x, int64_t y) const {
    const AggSpec& a = cfg_.aggs[static_cast<size_t>(cfg_.top.agg)];
    const bool asc = cfg_.top.order == TopOrder::asc;
    if (a.out_type == Type::Double) {
      const double dx = bits_dbl(x), dy = bits_dbl(y);
      if (std::isnan(dx) || std::isnan(dy)) return !std::isnan(dx) && std::isnan(dy);
      return asc ? dx < dy : dx > dy;
    }
    return asc ? x < y : x > y;  // int64, timestamp, bool (0/1)
  }

  // `top`: drops from picks_ every group with k or more groups ranked
  // strictly above it, keeping the others in their order. A group stays
  // iff its value is at least as good as the k-th best value (counting
  // ties), so this finds that value and filters once.
  void keep_top() {
    if (cfg_.top.agg < 0 || picks_.size() <= static_cast<uint64_t>(cfg_.top.k)) return;
    const AggSpec& a = cfg_.aggs[static_cast<size_t>(cfg_.top.agg)];
    const size_t K = cfg_.cells;
    auto value = [&](const Pick& p) { return result_bits(a, &win_cells_[p.row * K]); };
    int64_t kth;
    if (cfg_.top.k == 1) {
      kth = value(picks_[0]);
      for (const Pick& p : picks_) {
        const int64_t v = value(p);
        if (top_better(v, kth)) kth = v;
      }
    } else {
      top_values_.clear();
      for (const Pick& p : picks_) top_values_.push_back(value(p));
      const auto nth = top_values_.begin() + static_cast<ptrdiff_t>(cfg_.top.k - 1);
      std::nth_element(top_values_.begin(), nth, top_values_.end(),
                       [this](int64_t x, int64_t y) { return top_better(x, y); });
      kth = *nth;
    }
    std::erase_if(picks_, [&](const Pick& p) { return top_better(kth, value(p)); });
  }

  // append_row() for every pick of emit_window(), column by column.
  void append_picks(int64_t start, int64_t end) {
    const size_t n = picks_.size(), K = cfg_.cells, S = cfg_.strings;
    ensure_out();
    size_t c = 0;
    if (!state_.keys.empty()) {
      pick_gids_.clear();
      for (const Pick& p : picks_) pick_gids_.push_back(p.gid);
      for (const Column& k : state_.keys) out_rows_.cols[c++]->gather_from(k, pick_gids_);
    }
    std::vector<int64_t>& starts = out_rows_.cols[c++]->ints;
    starts.insert(starts.end(), n, start);
    std::vector<int64_t>& ends = out_rows_.cols[c++]->ints;
    ends.insert(ends.end(), n, end);
    for (const AggSpec& a : cfg_.aggs) {
      Column& col = *out_rows_.cols[c++];
      if (a.is_string()) {
        for (const Pick& p : picks_) col.append_str(win_strs_[p.row * S + a.str]);
        continue;
      }
      auto fill = [&](auto& vec, auto convert) {
        const size_t base = vec.size();
        vec.resize(base + n);
        for (size_t i = 0; i < n; ++i) vec[base + i] = convert(result_bits(a, &win_cells_[picks_[i].row * K]));
      };
      switch (a.out_type) {
        case Type::Int64:
        case Type::Timestamp: fill(col.ints, [](int64_t v) { return v; }); break;
        case Type::Double: fill(col.doubles, [](int64_t v) { return bits_dbl(v); }); break;
        case Type::Bool: fill(col.bools, [](int64_t v) { return static_cast<uint8_t>(v != 0); }); break;
        case Type::String: break;  // is_string() above
      }
    }
    out_rows_.times.insert(out_rows_.times.end(), n, end - 1);
  }

  // Sorts picks_ by (key group, stamp): a stable counting sort by key
  // group, then each key group's run by stamp unless it is in order already
  // (the usual case: the pane walk meets groups in arrival order).
  void sort_picks() {
    if (picks_.size() < 64) {
      std::sort(picks_.begin(), picks_.end());
      return;
    }
    std::array<uint32_t, kKeyGroups + 1> start{};
    for (const Pick& p : picks_) ++start[p.key_group + 1];
    for (uint32_t kg = 0; kg < kKeyGroups; ++kg) start[kg + 1] += start[kg];
    sorted_picks_.resize(picks_.size());
    std::array<uint32_t, kKeyGroups> at;
    std::copy(start.begin(), start.end() - 1, at.begin());
    for (const Pick& p : picks_) sorted_picks_[at[p.key_group]++] = p;
    auto by_stamp = [](const Pick& a, const Pick& b) { return a.stamp < b.stamp; };
    for (uint32_t kg = 0; kg < kKeyGroups; ++kg) {
      auto b = sorted_picks_.begin() + start[kg], e = sorted_picks_.begin() + start[kg + 1];
      if (!std::is_sorted(b, e, by_stamp)) std::sort(b, e, by_stamp);
    }
    picks_.swap(sorted_picks_);
  }

  void flush(Emitter& out) {
    if (out_rows_.times.empty()) return;
    Batch b(output_schema(0));
    for (auto& c : out_rows_.cols) b.columns.push_back(std::move(c));
    b.event_time = std::move(out_rows_.times);
    out_rows_ = OutRows{};
    emit(out, 0, std::move(b));
  }

  // Time-out: closes early, per group, the earliest open window whose first
  // row arrived at least `timeout` ms ago (processing time).
  void expire(Emitter& out) {
    const auto& w = cfg_.window;
    struct Due {
      int64_t end;
      Pick pick;
    };
    std::vector<Due> due;
    for (uint32_t gid = 0; gid < state_.groups.size(); ++gid) {
      Group& g = state_.groups[gid];
      if (g.panes.empty()) continue;
      int64_t after = std::max(state_.bound, g.emitted_end);
      while (true) {
        int64_t e = next_end_after(after);
        auto pit = std::lower_bound(g.panes.begin(), g.panes.end(), floor_div(e - w.size, w.pane),
                                    [](const PaneRef& p, int64_t v) { return p.pane < v; });
        if (pit == g.panes.end()) break;
        e = std::max(e, first_end_containing(pit->pane * w.pane));
        const int64_t p0 = floor_div(e - w.size, w.pane), p1 = floor_div(e, w.pane);
        uint64_t stamp = UINT64_MAX;
        int64_t created = INT64_MAX;
        for (PaneRef& p : g.panes) {
          if (p.pane < p0 || p.pane >= p1) continue;
          // A pane made before the first tick starts its clock now.
          if (state_.slot_created[p.slot] == INT64_MIN) state_.slot_created[p.slot] = state_.now_ms;
          stamp = std::min(stamp, state_.slot_stamp[p.slot]);
          created = std::min(created, state_.slot_created[p.slot]);
        }
        // Wide arithmetic: tick times are arbitrary int64 (and restored ones unchecked).
        if (static_cast<__int128>(state_.now_ms) - created < cfg_.timeout) break;
        due.push_back(Due{e, Pick{g.key_group, stamp, gid}});
        after = e;
      }
    }
    if (due.empty()) return;
    std::sort(due.begin(), due.end(), [](const Due& a, const Due& b) {
      return a.end != b.end ? a.end < b.end : a.pick < b.pick;
    });
    for (const Due& d : due) {
      const int64_t p0 = floor_div(d.end - w.size, w.pane), p1 = floor_div(d.end, w.pane);
      fill_empty_until(d.end);
      combine(d.pick.gid, p0, p1, nullptr, nullptr);
      append_row(d.pick.gid, true, d.end - w.size, d.end, d.end - 1);
      state_.groups[d.pick.gid].emitted_end = std::max(state_.groups[d.pick.gid].emitted_end, d.end);
    }
    flush(out);
  }

  // ---- count windows -------------------------------------------------------

  void count_batch(const Batch& b, Emitter& out) {
    const auto& w = cfg_.window;
    const size_t n = b.rows();
    const EventTime wm = input_watermark();
    size_t seg = 0;
    for (size_t i = 0; i < n; ++i) {
      if (b.event_time[i] < wm) {
        ++stats_.late_dropped;
        continue;
      }
      const uint32_t gid = group_of(b, i, hashes_[i]);
      const uint64_t idx = state_.groups[gid].tuples++;
      slots_[i] = pane_slot(gid, static_cast<int64_t>(idx / static_cast<uint64_t>(w.pane)));
      const uint64_t seen = idx + 1;
      const uint64_t size = static_cast<uint64_t>(w.size), slide = static_cast<uint64_t>(w.slide);
      if (seen < size || (seen - size) % slide != 0) continue;
      update_rows(seg, i + 1, nullptr);
      seg = i + 1;
      const int64_t p0 = static_cast<int64_t>((seen - size) / static_cast<uint64_t>(w.pane));
      const int64_t p1 = static_cast<int64_t>(seen / static_cast<uint64_t>(w.pane));
      combine(gid, p0, p1, nullptr, nullptr);
      append_row(gid, true, 0, 0, b.event_time[i]);
      drop_panes_before(gid, static_cast<int64_t>((seen - size + slide) / static_cast<uint64_t>(w.pane)));
      // A tumbling group with nothing pending is as good as new.
      if (state_.groups[gid].panes.empty()) state_.groups[gid].tuples = 0;
    }
    update_rows(seg, n, nullptr);
    flush(out);
    maybe_compact();
  }

  // ---- compaction, snapshot ------------------------------------------------

  // Forgets groups without state once they outnumber the live ones, so
  // memory follows the live key set, not every key ever seen.
  void maybe_compact() {
    if (state_.groups.size() < 1024 || state_.groups.size() < 2 * state_.live_groups + 1024) return;
    std::vector<uint32_t> keep;
    std::vector<uint32_t> remap(state_.groups.size(), detail::HashIndex::kNone);
    for (uint32_t gid = 0; gid < state_.groups.size(); ++gid) {
      if (state_.group_dead(state_.groups[gid])) continue;
      remap[gid] = static_cast<uint32_t>(keep.size());
      keep.push_back(gid);
    }
    rebuild(keep);
    for (auto& [pane, gids] : state_.pane_groups)
      for (uint32_t& g : gids) g = remap[g];
  }

  // Keeps only groups `keep` (in that order), renumbered from 0.
  void rebuild(const std::vector<uint32_t>& keep) {
    std::vector<Column> keys;
    for (const Column& c : state_.keys) {
      keys.emplace_back(c.type);
      keys.back().gather_from(c, keep);
    }
    state_.keys = std::move(keys);
    std::vector<Group> groups;
    groups.reserve(keep.size());
    for (uint32_t gid : keep) groups.push_back(std::move(state_.groups[gid]));
    state_.groups = std::move(groups);
    state_.index.clear(state_.groups.size());
    for (uint32_t gid = 0; gid < state_.groups.size(); ++gid)
      state_.index.insert(state_.groups[gid].hash, gid);
    state_.live_groups = 0;
    for (const Group& g : state_.groups) state_.live_groups += g.panes.empty() ? 0 : 1;
  }

  Config cfg_;
  bool single_int_key_ = false;
  WindowState state_;
  int64_t cached_pane_ = 0;                            // pane_slot(): the last pane's
  std::vector<uint32_t>* cached_pane_gids_ = nullptr;  // list in state_.pane_groups
  uint32_t epoch_ = 0;
  // Scratch.
  std::vector<uint64_t> hashes_;
  std::vector<uint32_t> slots_;
  std::vector<const Column*> values_;
  std::vector<const Column*> by_values_;  // max_by/min_by: the ranked column
  struct RunExtreme {
    int field;
    bool mn;
    int64_t value;
  };
  std::vector<RunExtreme> run_extremes_;  // update_run(): per run
  std::vector<ColumnPtr> evaluated_;
  std::vector<int64_t> res_cells_;
  std::vector<std::string> res_strs_;
  std::vector<Pick> picks_;
  std::vector<int64_t> top_values_;  // keep_top() scratch
  std::vector<Pick> sorted_picks_;
  std::vector<uint32_t> pick_gids_;
  std::vector<int64_t> win_cells_;     // emit_window(): combined results, a row per pick
  std::vector<std::string> win_strs_;
  OutRows out_rows_;
};

// Snapshot: the base state, then the window state (aggregate_snapshot.cpp).
std::string AggregateBox::snapshot() const {
  std::string out;
  snapshot_base(out);
  ByteWriter w(out);
  detail::aggregate::write_window_state(cfg_, state_, w);
  return out;
}

Status AggregateBox::restore(std::string_view bytes, const KeyGroupRange* keep) {
  std::string_view in = bytes;
  ENTENTE_RETURN_IF_ERROR(restore_base(in));
  ByteReader r(in);
  cached_pane_gids_ = nullptr;  // points into the pane map being replaced
  return detail::aggregate::read_window_state(cfg_, r, keep, state_);
}

// The parts of a split aggregate joined: the base state of the first (the
// parts' watermarks agree once drained; their sequence counters number
// their own rows, which a merge renumbered), the key groups of each.
Status AggregateBox::restore_joined(const std::vector<std::string_view>& parts,
                                    const std::vector<KeyGroupRange>& ranges) {
  if (parts.empty() || parts.size() != ranges.size())
    return make_error(Errc::invalid_argument, "restoring an aggregate from its parts: " +
                                                  std::to_string(parts.size()) + " snapshots for " +
                                                  std::to_string(ranges.size()) + " ranges");
  // Each part's base state read past, the first's last so that it stays.
  std::vector<std::string_view> rest(parts.begin(), parts.end());
  for (size_t i = rest.size(); i-- > 0;) ENTENTE_RETURN_IF_ERROR(restore_base(rest[i]));
  std::vector<ByteReader> readers;
  readers.reserve(rest.size());
  for (auto r : rest) readers.emplace_back(r);
  std::vector<ByteReader*> ptrs;
  for (auto& r : readers) ptrs.push_back(&r);
  cached_pane_gids_ = nullptr;  // points into the pane map being replaced
  return detail::aggregate::read_joined_window_states(cfg_, ptrs, ranges, state_);
}

}  // namespace

namespace detail::aggregate {

std::unique_ptr<Box> make_aggregate_box(SchemaPtr input, SchemaPtr output, Config cfg) {
  return std::make_unique<AggregateBox>(std::move(input), std::move(output), std::move(cfg));
}

}  // namespace detail::aggregate

}  // namespace entente::engine::boxes
