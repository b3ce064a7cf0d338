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
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <map>
#include <numeric>

#include "engine/boxes/boxes.h"
#include "engine/boxes/detail_keyed_state.h"
#include "engine/detail/options.h"
#include "engine/expr.h"
#include "engine/serde.h"
#include "rapidjson/document.h"

namespace entente::engine::boxes {

namespace {

using detail::kFar;
using detail::floor_div;
using engine::detail::Need;
using engine::detail::OptionReader;

constexpr uint8_t kAggregateTag = 0x41;  // 'A': refuses other boxes' snapshots
constexpr uint8_t kAggregateVersion = 1;
constexpr uint32_t kNoSlot = UINT32_MAX;
// emit_empty never fills a gap of more windows than this (bounds the work
// one watermark can cause; documented).
constexpr int64_t kMaxEmptyWindows = int64_t{1} << 20;
constexpr size_t kMaxAggregates = 64;
constexpr size_t kMaxGroupBy = 16;
// `top.k` at most this (documented): k beyond the groups of a window keeps
// them all anyway.
constexpr int64_t kMaxTopK = int64_t{1} << 20;

enum class Fn : uint8_t { count, sum, min, max, avg, first, last, max_by, min_by };

// max_by/min_by cells: [by value, ordering time of the pick, picked value];
// a time of kNoPick means no row yet.
constexpr int64_t kNoPick = INT64_MAX;

struct AggSpec {
  Fn fn = Fn::count;
  std::optional<Expr> expr;  // the aggregated value; absent for count
  int field = -1;            // the input field, when expr is a bare field
  Type in_type = Type::Int64;
  Type out_type = Type::Int64;
  std::string name;
  uint32_t cell = 0;               // first cell in a slot
  uint32_t str = UINT32_MAX;       // string index in a slot (string min/max/first/last/*_by)
  int by_field = -1;               // max_by/min_by: the input field ranked
  Type by_type = Type::Int64;
  bool is_string() const { return in_type == Type::String && fn != Fn::count; }
  bool is_by() const { return fn == Fn::max_by || fn == Fn::min_by; }
};

struct WindowSpec {
  bool by_count = false;
  bool sliding = false;
  int64_t size = 0;   // ms or tuples
  int64_t slide = 0;  // ms or tuples (tumbling: size)
  int64_t pane = 0;   // gcd(size, slide)
};

// `top`: per window, only the groups ranked among the best `k` by
// aggregate `agg` (SQL RANK() <= k: ties at the k-th value all stay).
enum class TopOrder : uint8_t { desc, asc };
struct TopSpec {
  int agg = -1;  // index into Config::aggs; -1: no ranking, every group
  int64_t k = 1;
  TopOrder order = TopOrder::desc;
};

struct Config {
  std::vector<size_t> key_cols;
  WindowSpec window;
  std::vector<AggSpec> aggs;
  int64_t slack = 0;
  int64_t timeout = 0;  // 0: none
  bool emit_empty = false;
  TopSpec top;
  uint32_t cells = 1;  // per slot; cell 0 counts the slot's rows
  uint32_t strings = 0;
};

inline int64_t dbl_bits(double d) { return std::bit_cast<int64_t>(d); }
inline double bits_dbl(int64_t i) { return std::bit_cast<double>(i); }
inline int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}

struct PaneRef {
  int64_t pane;
  uint32_t slot;
};

struct Group {
  uint64_t hash = 0;
  uint32_t key_group = 0;
  uint32_t mark = 0;                    // scratch: last collection epoch
  int64_t emitted_end = INT64_MIN;      // time-out: windows ending <= this were emitted
  uint64_t tuples = 0;                  // count windows: rows seen
  std::vector<PaneRef> panes;           // sorted by pane index
};

class AggregateBox final : public BoxBase {
 public:
  AggregateBox(SchemaPtr input, SchemaPtr output, Config cfg)
      : BoxBase({input}, {std::move(output)}), cfg_(std::move(cfg)) {
    for (size_t k : cfg_.key_cols) keys_.emplace_back(input->field(k).type);
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
      // Every row still to come belongs to a window ending after bound_,
      // and is stamped end - 1.
      emit_watermark(out, next_end_after(bound_) - 1);
    }
  }

  void on_tick(int64_t now_ms, Emitter& out) override {
    now_ms_ = now_ms;
    if (cfg_.timeout <= 0 || cfg_.window.by_count) return;
    expire(out);
  }

  std::string snapshot() const override;
  Status restore(std::string_view bytes, const KeyGroupRange* keep) override;

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
    if (!groups_.empty()) return 0;
    Group g;
    g.hash = 0;
    g.key_group = key_group_of(0);
    groups_.push_back(std::move(g));
    index_.insert(0, 0);
    return 0;
  }

  // The group of row `row` of `b` (hash `h`), created if new.
  uint32_t group_of(const Batch& b, size_t row, uint64_t h) {
    uint32_t id;
    if (single_int_key_) {
      // hash_int is a bijection: equal hashes are equal keys (restore()
      // checks stored hashes against their keys), so the key column is not
      // read.
      id = index_.find(h, [](uint32_t) { return true; });
    } else {
      id = index_.find(h, [&](uint32_t g) {
        for (size_t k = 0; k < keys_.size(); ++k)
          if (!detail::cell_equal(keys_[k], g, b.column(cfg_.key_cols[k]), row)) return false;
        return true;
      });
    }
    if (id != detail::HashIndex::kNone) return id;
    id = static_cast<uint32_t>(groups_.size());
    for (size_t k = 0; k < keys_.size(); ++k) keys_[k].append_from(b.column(cfg_.key_cols[k]), row);
    Group g;
    g.hash = h;
    g.key_group = key_group_of(h);
    groups_.push_back(std::move(g));
    index_.insert(h, id);
    return id;
  }

  // The slot of pane `pane` of group `gid`, created if new.
  uint32_t pane_slot(uint32_t gid, int64_t pane) {
    auto& panes = groups_[gid].panes;
    size_t k = panes.size();
    while (k > 0 && panes[k - 1].pane > pane) --k;
    if (k > 0 && panes[k - 1].pane == pane) return panes[k - 1].slot;
    if (panes.empty()) {
      ++live_groups_;
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
        cached_pane_gids_ = &pane_groups_[pane];
        cached_pane_ = pane;
      }
      cached_pane_gids_->push_back(gid);
    }
    return slot;
  }

  uint32_t alloc_slot() {
    const uint32_t s = alloc_slot_raw();
    slot_stamp_[s] = stamp_++;
    slot_created_[s] = now_ms_;
    init_cells(&cells_[size_t{s} * cfg_.cells]);
    for (uint32_t j = 0; j < cfg_.strings; ++j) strs_[size_t{s} * cfg_.strings + j].clear();
    return s;
  }

  // A slot whose contents the caller sets.
  uint32_t alloc_slot_raw() {
    uint32_t s;
    if (!free_slots_.empty()) {
      s = free_slots_.back();
      free_slots_.pop_back();
    } else {
      s = static_cast<uint32_t>(slot_stamp_.size());
      slot_stamp_.push_back(0);
      slot_created_.push_back(0);
      cells_.resize(cells_.size() + cfg_.cells);
      strs_.resize(strs_.size() + cfg_.strings);
    }
    return s;
  }

  void free_slot(uint32_t s) { free_slots_.push_back(s); }

  // Identity values, so that updates need no "first row" test.
  void init_cells(int64_t* c) const {
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
    int64_t* cells = cells_.data();
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
    int64_t* c = &cells_[size_t{s} * cfg_.cells + a.cell];
    const int64_t v = by_bits(*by, i);
    if (!by_takes(a, v, t, c)) return;
    c[0] = v;
    c[1] = t;
    switch (a.in_type) {
      case Type::Int64:
      case Type::Timestamp: c[2] = col->ints[i]; break;
      case Type::Double: c[2] = dbl_bits(col->doubles[i]); break;
      case Type::Bool: c[2] = col->bools[i]; break;
      case Type::String: strs_[size_t{s} * cfg_.strings + a.str].assign(col->str(i)); break;
    }
  }

  void update_minmax(const AggSpec& a, const Column* col, size_t from, size_t to) {
    const uint32_t K = cfg_.cells;
    const bool mn = a.fn == Fn::min;
    for (size_t i = from; i < to; ++i) {
      const uint32_t s = slots_[i];
      if (s == kNoSlot) continue;
      int64_t& c = cells_[size_t{s} * K + a.cell];
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
          std::string& cur = strs_[size_t{s} * cfg_.strings + a.str];
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
      int64_t* c = &cells_[size_t{s} * K + a.cell];
      const int64_t t = order ? order[i] : 0;
      if (first ? !(t < c[0]) : !(t >= c[0])) continue;
      c[0] = t;
      switch (a.in_type) {
        case Type::Int64:
        case Type::Timestamp: c[1] = col->ints[i]; break;
        case Type::Double: c[1] = dbl_bits(col->doubles[i]); break;
        case Type::Bool: c[1] = col->bools[i]; break;
        case Type::String: strs_[size_t{s} * cfg_.strings + a.str].assign(col->str(i)); break;
      }
    }
  }

  // Applies rows [from, to) of the prepared batch, all of slot `s` (time
  // windows without group_by), with the same result as update_rows(): per
  // aggregate one pass with the accumulator in a register, or the run's
  // best row offered once; string min/max and first/last use the per-row
  // kernels.
  void update_run(uint32_t s, size_t from, size_t to, const EventTime* order) {
    int64_t* base = &cells_[size_t{s} * cfg_.cells];
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
      size_t i = from;
      while (v[i] != m) ++i;
      best = i;
      if (!order) return best;  // arrival order decides
      bt = order[i];
      for (++i; i < to; ++i)
        if (v[i] == m && order[i] < bt) {
          best = i;
          bt = order[i];
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
      if (last_end <= bound_) {
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
      if (last_end <= groups_[gid].emitted_end) {
        ++stats_.late_dropped;
        continue;
      }
      // Most rows land in their group's newest pane.
      const auto& panes = groups_[gid].panes;
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
      if (last_end <= bound_ || last_end <= groups_[gid].emitted_end) {
        stats_.late_dropped += j - i;
      } else {
        update_run(pane_slot(gid, pane), i, j, et);
      }
      i = j;
    }
  }

  // Closes every window with end <= `bound` (a watermark minus the slack).
  void close_until(int64_t bound, Emitter& out) {
    if (bound <= bound_) return;
    const auto& w = cfg_.window;
    const int64_t pw = w.pane;
    int64_t e = next_end_after(bound_);
    while (true) {
      auto it = pane_groups_.lower_bound(floor_div(e - w.size, pw));
      if (it == pane_groups_.end()) break;
      e = std::max(e, first_end_containing(it->first * pw));
      if (e > bound) break;
      emit_window(e);
      e += w.slide;
    }
    bound_ = bound;
    // Panes before the start of the first window still open are done with.
    const int64_t keep_from = bound >= kFar ? INT64_MAX : floor_div(next_end_after(bound) - w.size, pw);
    cached_pane_gids_ = nullptr;
    while (!pane_groups_.empty() && pane_groups_.begin()->first < keep_from) {
      auto node = pane_groups_.extract(pane_groups_.begin());
      for (uint32_t gid : node.mapped()) drop_panes_before(gid, keep_from);
    }
    flush(out);
    maybe_compact();
  }

  void drop_panes_before(uint32_t gid, int64_t pane) {
    Group& g = groups_[gid];
    size_t k = 0;
    while (k < g.panes.size() && g.panes[k].pane < pane) free_slot(g.panes[k++].slot);
    if (k == 0) return;
    g.panes.erase(g.panes.begin(), g.panes.begin() + static_cast<ptrdiff_t>(k));
    if (g.panes.empty()) --live_groups_;
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
    const Group& g = groups_[gid];
    bool any = false;
    uint64_t st = UINT64_MAX;
    int64_t cr = INT64_MAX;
    init_cells(res_cells_.data());
    for (auto& s : res_strs_) s.clear();
    for (const PaneRef& p : g.panes) {
      if (p.pane < p0) continue;
      if (p.pane >= p1) break;
      any = true;
      if (stamp) st = std::min(st, slot_stamp_[p.slot]);
      if (created) cr = std::min(cr, slot_created_[p.slot]);
      merge_slot(p.slot);
    }
    if (stamp) *stamp = st;
    if (created) *created = cr;
    return any;
  }

  void merge_slot(uint32_t slot) {
    const int64_t* c = &cells_[size_t{slot} * cfg_.cells];
    const std::string* ss = cfg_.strings ? &strs_[size_t{slot} * cfg_.strings] : nullptr;
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
    for (size_t k = 0; k < keys_.size(); ++k) {
      if (has_group) out_rows_.cols[c]->append_from(keys_[k], gid);
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
    if (last_emitted_end_ != INT64_MIN) {
      int64_t e = last_emitted_end_ + cfg_.window.slide;
      for (int64_t k = 0; e < end && k < kMaxEmptyWindows; e += cfg_.window.slide, ++k) {
        init_cells(res_cells_.data());
        append_row(0, false, e - cfg_.window.size, e, e - 1);
      }
    }
    last_emitted_end_ = std::max(last_emitted_end_, end);
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
    for (auto it = pane_groups_.lower_bound(p0); it != pane_groups_.end() && it->first < p1; ++it) {
      for (uint32_t gid : it->second) {
        Group& g = groups_[gid];
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
  bool top_better(int64_t x, int64_t y) const {
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
    if (!keys_.empty()) {
      pick_gids_.clear();
      for (const Pick& p : picks_) pick_gids_.push_back(p.gid);
      for (const Column& k : keys_) out_rows_.cols[c++]->gather_from(k, pick_gids_);
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
    for (uint32_t gid = 0; gid < groups_.size(); ++gid) {
      Group& g = groups_[gid];
      if (g.panes.empty()) continue;
      int64_t after = std::max(bound_, g.emitted_end);
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
          if (slot_created_[p.slot] == INT64_MIN) slot_created_[p.slot] = now_ms_;
          stamp = std::min(stamp, slot_stamp_[p.slot]);
          created = std::min(created, slot_created_[p.slot]);
        }
        // Wide arithmetic: tick times are arbitrary int64 (and restored ones unchecked).
        if (static_cast<__int128>(now_ms_) - created < cfg_.timeout) break;
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
      groups_[d.pick.gid].emitted_end = std::max(groups_[d.pick.gid].emitted_end, d.end);
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
      const uint64_t idx = groups_[gid].tuples++;
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
      if (groups_[gid].panes.empty()) groups_[gid].tuples = 0;
    }
    update_rows(seg, n, nullptr);
    flush(out);
    maybe_compact();
  }

  // ---- compaction, snapshot ------------------------------------------------

  bool group_dead(const Group& g) const {
    return g.panes.empty() && g.tuples == 0 && g.emitted_end <= bound_;
  }

  // Forgets groups without state once they outnumber the live ones, so
  // memory follows the live key set, not every key ever seen.
  void maybe_compact() {
    if (groups_.size() < 1024 || groups_.size() < 2 * live_groups_ + 1024) return;
    std::vector<uint32_t> keep;
    std::vector<uint32_t> remap(groups_.size(), detail::HashIndex::kNone);
    for (uint32_t gid = 0; gid < groups_.size(); ++gid) {
      if (group_dead(groups_[gid])) continue;
      remap[gid] = static_cast<uint32_t>(keep.size());
      keep.push_back(gid);
    }
    rebuild(keep);
    for (auto& [pane, gids] : pane_groups_)
      for (uint32_t& g : gids) g = remap[g];
  }

  // Keeps only groups `keep` (in that order), renumbered from 0.
  void rebuild(const std::vector<uint32_t>& keep) {
    std::vector<Column> keys;
    for (const Column& c : keys_) {
      keys.emplace_back(c.type);
      keys.back().gather_from(c, keep);
    }
    keys_ = std::move(keys);
    std::vector<Group> groups;
    groups.reserve(keep.size());
    for (uint32_t gid : keep) groups.push_back(std::move(groups_[gid]));
    groups_ = std::move(groups);
    index_.clear(groups_.size());
    for (uint32_t gid = 0; gid < groups_.size(); ++gid) index_.insert(groups_[gid].hash, gid);
    live_groups_ = 0;
    for (const Group& g : groups_) live_groups_ += g.panes.empty() ? 0 : 1;
  }

  void clear_state() {
    for (Column& c : keys_) c = Column(c.type);
    groups_.clear();
    index_.clear();
    pane_groups_.clear();
    cached_pane_gids_ = nullptr;
    cells_.clear();
    strs_.clear();
    slot_stamp_.clear();
    slot_created_.clear();
    free_slots_.clear();
    live_groups_ = 0;
  }

  Config cfg_;
  bool single_int_key_ = false;
  // Groups: key columns (row = group id), per-group state, hash index.
  std::vector<Column> keys_;
  std::vector<Group> groups_;
  detail::HashIndex index_;
  size_t live_groups_ = 0;
  // Time windows: pane index -> groups with a slot in that pane.
  std::map<int64_t, std::vector<uint32_t>> pane_groups_;
  int64_t cached_pane_ = 0;                         // pane_slot(): the last pane's
  std::vector<uint32_t>* cached_pane_gids_ = nullptr;  // list in pane_groups_
  // Slot arena: cfg_.cells cells and cfg_.strings strings per slot.
  std::vector<int64_t> cells_;
  std::vector<std::string> strs_;
  std::vector<uint64_t> slot_stamp_;   // creation order (first arrival)
  std::vector<int64_t> slot_created_;  // processing time of creation
  std::vector<uint32_t> free_slots_;
  uint64_t stamp_ = 0;
  // Windows with end <= bound_ are closed (input watermark - slack).
  int64_t bound_ = -kFar;
  int64_t last_emitted_end_ = INT64_MIN;  // emit_empty
  int64_t now_ms_ = INT64_MIN;            // last tick; INT64_MIN before the first
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

// Snapshot: base state, tag, version, a fingerprint of the definition, the
// scalars, then per key group (0..kKeyGroups-1) its groups with their keys
// and panes. Grouping by key group lets restore() keep a subset.
std::string AggregateBox::snapshot() const {
  std::string out;
  snapshot_base(out);
  ByteWriter w(out);
  w.u8(kAggregateTag);
  w.u8(kAggregateVersion);
  w.varint(cfg_.cells);
  w.varint(cfg_.strings);
  w.varint(keys_.size());
  w.svarint(cfg_.window.size);
  w.svarint(cfg_.window.slide);
  w.u8(cfg_.window.by_count ? 1 : 0);
  w.svarint(bound_);
  w.svarint(last_emitted_end_);
  w.svarint(now_ms_);
  w.varint(stamp_);
  std::vector<std::vector<uint32_t>> by_group(kKeyGroups);
  for (uint32_t gid = 0; gid < groups_.size(); ++gid)
    if (!group_dead(groups_[gid])) by_group[groups_[gid].key_group].push_back(gid);
  for (uint32_t kg = 0; kg < kKeyGroups; ++kg) {
    w.varint(by_group[kg].size());
    for (uint32_t gid : by_group[kg]) {
      const Group& g = groups_[gid];
      for (const Column& c : keys_) detail::write_cell(w, c, gid);
      w.fixed64(g.hash);
      w.svarint(g.emitted_end);
      w.varint(g.tuples);
      w.varint(g.panes.size());
      for (const PaneRef& p : g.panes) {
        w.svarint(p.pane);
        w.varint(slot_stamp_[p.slot]);
        w.svarint(slot_created_[p.slot]);
        const int64_t* c = &cells_[size_t{p.slot} * cfg_.cells];
        for (uint32_t k = 0; k < cfg_.cells; ++k) w.svarint(c[k]);
        for (uint32_t k = 0; k < cfg_.strings; ++k) w.bytes(strs_[size_t{p.slot} * cfg_.strings + k]);
      }
    }
  }
  return out;
}

Status AggregateBox::restore(std::string_view bytes, const KeyGroupRange* keep) {
  std::string_view in = bytes;
  ENTENTE_RETURN_IF_ERROR(restore_base(in));
  ByteReader r(in);
  uint8_t tag, version, by_count;
  uint64_t cells, strings, nkeys, stamp;
  int64_t size, slide, bound, last_end, now;
  if (!r.u8(tag) || tag != kAggregateTag) return detail::corrupt("not an aggregate snapshot");
  if (!r.u8(version) || version != kAggregateVersion) return detail::corrupt("unknown aggregate snapshot version");
  if (!r.varint(cells) || !r.varint(strings) || !r.varint(nkeys) || !r.svarint(size) || !r.svarint(slide) ||
      !r.u8(by_count))
    return detail::corrupt("truncated header");
  if (cells != cfg_.cells || strings != cfg_.strings || nkeys != keys_.size() || size != cfg_.window.size ||
      slide != cfg_.window.slide || (by_count != 0) != cfg_.window.by_count)
    return detail::corrupt("snapshot of an aggregate with another definition");
  if (!r.svarint(bound) || !r.svarint(last_end) || !r.svarint(now) || !r.varint(stamp))
    return detail::corrupt("truncated header");
  auto end_ok = [](int64_t e) { return e == INT64_MIN || (e >= -kFar && e <= kFar); };
  if (bound < -kFar || bound > kFar || !end_ok(last_end)) return detail::corrupt("window bound out of range");

  clear_state();
  bound_ = bound;
  last_emitted_end_ = last_end;
  now_ms_ = now;
  stamp_ = stamp;
  std::vector<int64_t> cellbuf(cfg_.cells);
  std::vector<Column> key(keys_.size());
  std::string scratch;
  for (size_t k = 0; k < keys_.size(); ++k) key[k] = Column(keys_[k].type);
  for (uint32_t kg = 0; kg < kKeyGroups; ++kg) {
    uint64_t ngroups;
    if (!r.varint(ngroups) || ngroups > r.remaining()) return detail::corrupt("truncated group list");
    const bool keep_group = keep == nullptr || keep->contains(kg);
    for (uint64_t gi = 0; gi < ngroups; ++gi) {
      for (Column& c : key) {
        c.clear();
        if (!detail::read_cell(r, c)) return detail::corrupt("truncated group key");
      }
      Group g;
      uint64_t npanes;
      if (!r.fixed64(g.hash) || !r.svarint(g.emitted_end) || !r.varint(g.tuples) || !r.varint(npanes) ||
          npanes > r.remaining())
        return detail::corrupt("truncated group");
      if (!end_ok(g.emitted_end)) return detail::corrupt("window bound out of range");
      g.key_group = key_group_of(g.hash);
      if (g.key_group != kg) return detail::corrupt("group stored under the wrong key group");
      if (single_int_key_ && g.hash != hash_int(key[0].ints[0]))
        return detail::corrupt("group hash does not match its key");
      int64_t prev = INT64_MIN;
      for (uint64_t pi = 0; pi < npanes; ++pi) {
        int64_t pane, created;
        uint64_t pstamp;
        if (!r.svarint(pane) || !r.varint(pstamp) || !r.svarint(created))
          return detail::corrupt("truncated pane");
        if (pi > 0 && pane <= prev) return detail::corrupt("panes out of order");
        // Pane start times stay within the supported range.
        if (pane < -detail::kTimeLimit / cfg_.window.pane || pane > detail::kTimeLimit / cfg_.window.pane)
          return detail::corrupt("pane out of range");
        if (pstamp >= stamp_) return detail::corrupt("pane stamp out of range");
        prev = pane;
        for (auto& c : cellbuf)
          if (!r.svarint(c)) return detail::corrupt("truncated pane cells");
        if (cellbuf[0] <= 0) return detail::corrupt("empty pane");
        if (!keep_group) {
          for (uint32_t k = 0; k < cfg_.strings; ++k)
            if (!r.bytes(scratch)) return detail::corrupt("truncated pane strings");
          continue;
        }
        const uint32_t slot = alloc_slot_raw();
        slot_stamp_[slot] = pstamp;
        slot_created_[slot] = created;
        std::copy(cellbuf.begin(), cellbuf.end(),
                  cells_.begin() + static_cast<ptrdiff_t>(size_t{slot} * cfg_.cells));
        for (uint32_t k = 0; k < cfg_.strings; ++k)
          if (!r.bytes(strs_[size_t{slot} * cfg_.strings + k])) return detail::corrupt("truncated pane strings");
        g.panes.push_back(PaneRef{pane, slot});
      }
      if (!keep_group) continue;
      const bool dup = index_.find(g.hash, [&](uint32_t other) {
        for (size_t k = 0; k < keys_.size(); ++k)
          if (!detail::cell_equal(keys_[k], other, key[k], 0)) return false;
        return true;
      }) != detail::HashIndex::kNone;
      if (dup) return detail::corrupt("duplicate group");
      const uint32_t gid = static_cast<uint32_t>(groups_.size());
      for (size_t k = 0; k < keys_.size(); ++k) keys_[k].append_from(key[k], 0);
      if (!g.panes.empty()) ++live_groups_;
      if (!cfg_.window.by_count)
        for (const PaneRef& p : g.panes) pane_groups_[p.pane].push_back(gid);
      index_.insert(g.hash, gid);
      groups_.push_back(std::move(g));
    }
  }
  if (!r.empty()) return detail::corrupt("trailing bytes");
  return Status::Ok();
}

// ---- factory ----------------------------------------------------------------

const rapidjson::Value* options_or_null(const rapidjson::Value& v) { return v.IsNull() ? nullptr : &v; }

std::optional<Fn> parse_fn(std::string_view s) {
  if (s == "count") return Fn::count;
  if (s == "sum") return Fn::sum;
  if (s == "min") return Fn::min;
  if (s == "max") return Fn::max;
  if (s == "avg") return Fn::avg;
  if (s == "first") return Fn::first;
  if (s == "last") return Fn::last;
  if (s == "max_by") return Fn::max_by;
  if (s == "min_by") return Fn::min_by;
  return std::nullopt;
}

bool read_window(OptionReader& top, Config& cfg) {
  const rapidjson::Value* v = top.value("window", Need::required);
  if (v == nullptr) return false;
  const std::string path = top.path_of("window");
  Diagnostics& diag = top.diag();
  OptionReader r(v, path, diag);
  const size_t before = diag.size();
  auto type = r.choice("type", Need::required, {"tumbling", "sliding"});
  auto by = r.choice("by", Need::optional, {"time", "count"});
  WindowSpec& w = cfg.window;
  w.by_count = by.value_or("time") == "count";
  w.sliding = type.value_or("tumbling") == "sliding";
  auto read_span = [&](std::string_view key, Need need) -> std::optional<int64_t> {
    if (w.by_count) return r.int64(key, need, 1, detail::kSpanLimit);
    const rapidjson::Value* x = r.value(key, need);
    if (x == nullptr) return std::nullopt;
    auto d = engine::detail::parse_duration_ms(*x, r.path_of(key), diag);
    if (!d) return std::nullopt;
    if (*d <= 0 || *d > detail::kSpanLimit) {
      diag.error(r.path_of(key), "window " + std::string(key) + " must be between 1 ms and 2^40 ms");
      return std::nullopt;
    }
    return d;
  };
  auto size = read_span("size", Need::required);
  std::optional<int64_t> slide;
  if (w.sliding) {
    slide = read_span("slide", Need::required);
  } else if (r.has("slide")) {
    r.value("slide", Need::optional);
    diag.error(r.path_of("slide"), "'slide' applies only to sliding windows");
  }
  r.finish();
  if (diag.size() != before || !size || (w.sliding && !slide)) return false;
  w.size = *size;
  w.slide = w.sliding ? *slide : *size;
  if (w.slide > w.size) {
    diag.error(r.path_of("slide"), "slide must not exceed size (every row must fall in a window)");
    return false;
  }
  w.pane = std::gcd(w.size, w.slide);
  return true;
}

}  // namespace

std::unique_ptr<Box> make_aggregate(const rapidjson::Value& options, const BoxBuildContext& ctx) {
  Diagnostics& diag = *ctx.diag;
  const size_t before = diag.size();
  engine::detail::OptionReader r(options_or_null(options), ctx.path + ".options", diag);
  if (ctx.inputs.size() != 1) {
    diag.error(ctx.path, "aggregate takes exactly 1 input, got " + std::to_string(ctx.inputs.size()));
    return nullptr;
  }
  const Schema& in = *ctx.inputs[0];
  Config cfg;
  std::vector<Field> out_fields;

  auto group_by = r.strings("group_by", Need::optional);
  if (group_by) {
    if (group_by->size() > kMaxGroupBy) diag.error(r.path_of("group_by"), "at most 16 group_by fields");
    for (size_t i = 0; i < group_by->size(); ++i) {
      auto idx = in.index_of((*group_by)[i]);
      if (!idx) {
        diag.error(r.path_of("group_by") + "[" + std::to_string(i) + "]",
                   "unknown field '" + (*group_by)[i] + "'; input has " + in.to_string());
        continue;
      }
      if (std::find(cfg.key_cols.begin(), cfg.key_cols.end(), *idx) != cfg.key_cols.end()) {
        diag.error(r.path_of("group_by") + "[" + std::to_string(i) + "]", "field '" + (*group_by)[i] + "' listed twice");
        continue;
      }
      cfg.key_cols.push_back(*idx);
      out_fields.push_back(in.field(*idx));
    }
  }
  const bool window_ok = read_window(r, cfg);
  if (window_ok && !cfg.window.by_count) {
    out_fields.push_back({"window_start", Type::Timestamp});
    out_fields.push_back({"window_end", Type::Timestamp});
  }

  const rapidjson::Value* aggs = r.value("aggregates", Need::required);
  if (aggs != nullptr && (!aggs->IsArray() || aggs->Empty() || aggs->Size() > kMaxAggregates)) {
    diag.error(r.path_of("aggregates"), "expected an array of 1 to 64 aggregates");
    aggs = nullptr;
  }
  if (aggs != nullptr) {
    for (rapidjson::SizeType i = 0; i < aggs->Size(); ++i) {
      const std::string apath = r.path_of("aggregates") + "[" + std::to_string(i) + "]";
      engine::detail::OptionReader ar(&(*aggs)[i], apath, diag);
      const size_t abefore = diag.size();
      auto fn_name = ar.choice("fn", Need::required,
                               {"count", "sum", "min", "max", "avg", "first", "last", "max_by", "min_by"});
      auto field = ar.string("field", Need::optional);
      auto expr_text = ar.string("expr", Need::optional);
      auto by = ar.string("by", Need::optional);
      auto as = ar.string("as", Need::optional);
      ar.finish();
      if (diag.size() != abefore || !fn_name) continue;
      AggSpec a;
      a.fn = *parse_fn(*fn_name);
      if (a.is_by()) {
        if (!by) {
          diag.error(apath, *fn_name + " needs 'by' (the field whose largest or smallest value picks the row)");
          continue;
        }
        auto idx = in.index_of(*by);
        if (!idx) {
          diag.error(apath + ".by", "unknown field '" + *by + "'; input has " + in.to_string());
          continue;
        }
        a.by_field = static_cast<int>(*idx);
        a.by_type = in.field(*idx).type;
        if (a.by_type == Type::String) {
          diag.error(apath + ".by", *fn_name + " ranks by an int64, double, bool or timestamp field, got string");
          continue;
        }
      } else if (by) {
        diag.error(apath + ".by", "'by' applies only to max_by and min_by");
        continue;
      }
      if (a.fn == Fn::count) {
        if (field || expr_text) {
          diag.error(apath, "count takes neither 'field' nor 'expr' (fields are never null)");
          continue;
        }
        a.out_type = Type::Int64;
        a.name = as.value_or("count");
      } else {
        if (field.has_value() == expr_text.has_value()) {
          diag.error(apath, *fn_name + " needs exactly one of 'field' and 'expr'");
          continue;
        }
        if (field) {
          auto idx = in.index_of(*field);
          if (!idx) {
            diag.error(apath + ".field", "unknown field '" + *field + "'; input has " + in.to_string());
            continue;
          }
          a.field = static_cast<int>(*idx);
          a.in_type = in.field(*idx).type;
          a.name = as.value_or(*fn_name + "_" + *field);
        } else {
          auto e = Expr::compile(*expr_text, in);
          if (!e.ok()) {
            diag.error(apath + ".expr", e.error().message);
            continue;
          }
          a.in_type = e->type();
          a.field = e->field_index();
          a.expr = std::move(*e);
          if (!as) {
            diag.error(apath, "an aggregate over an expression needs 'as' (its output name)");
            continue;
          }
          a.name = *as;
        }
        if ((a.fn == Fn::sum || a.fn == Fn::avg) && !is_numeric(a.in_type)) {
          diag.error(apath, *fn_name + " needs an int64 or double value, got " + std::string(type_name(a.in_type)));
          continue;
        }
        a.out_type = a.fn == Fn::avg ? Type::Double : a.in_type;
      }
      out_fields.push_back({a.name, a.out_type});
      cfg.aggs.push_back(std::move(a));
    }
  }

  const bool by_count = window_ok && cfg.window.by_count;
  if (const auto* s = r.value("slack", Need::optional)) {
    if (by_count) {
      diag.error(r.path_of("slack"), "count windows follow arrival order; slack applies only to time windows");
    } else if (auto d = engine::detail::parse_duration_ms(*s, r.path_of("slack"), diag)) {
      if (*d > detail::kSpanLimit) diag.error(r.path_of("slack"), "slack must be at most 2^40 ms");
      cfg.slack = *d;
    }
  }
  if (const auto* t = r.value("timeout", Need::optional)) {
    if (by_count) {
      diag.error(r.path_of("timeout"), "timeout applies only to time windows");
    } else if (auto d = engine::detail::parse_duration_ms(*t, r.path_of("timeout"), diag)) {
      if (*d <= 0) diag.error(r.path_of("timeout"), "timeout must be positive");
      cfg.timeout = *d;
    }
  }
  if (const rapidjson::Value* t = r.value("top", Need::optional)) {
    const std::string tpath = r.path_of("top");
    engine::detail::OptionReader tr(t, tpath, diag);
    const size_t tbefore = diag.size();
    auto by = tr.string("by", Need::required);
    auto k = tr.int64("k", Need::optional, 1, kMaxTopK);
    auto order = tr.choice("order", Need::optional, {"desc", "asc"});
    tr.finish();
    if (by_count)
      diag.error(tpath, "top ranks the groups of one time window; count windows close per group");
    if (cfg.timeout > 0)
      diag.error(tpath, "top needs every group of a window at once; a timeout emits groups one by one");
    if (diag.size() == tbefore && by) {
      auto it = std::find_if(cfg.aggs.begin(), cfg.aggs.end(), [&](const AggSpec& a) { return a.name == *by; });
      if (it == cfg.aggs.end()) {
        std::string names;
        for (const AggSpec& a : cfg.aggs) names += (names.empty() ? "" : ", ") + a.name;
        diag.error(tpath + ".by", "'" + *by + "' is not an aggregate of this box (aggregates: " + names + ")");
      } else if (it->out_type == Type::String) {
        diag.error(tpath + ".by", "top ranks by an int64, double, bool or timestamp aggregate; '" + *by +
                                      "' is a string");
      } else {
        cfg.top.agg = static_cast<int>(it - cfg.aggs.begin());
        cfg.top.k = k.value_or(1);
        cfg.top.order = order.value_or("desc") == "asc" ? TopOrder::asc : TopOrder::desc;
      }
    }
  }
  auto emit_empty = r.boolean("emit_empty", Need::optional);
  if (emit_empty.value_or(false)) {
    if (!cfg.key_cols.empty() || (group_by && !group_by->empty()))
      diag.error(r.path_of("emit_empty"), "emit_empty needs an empty group_by (which groups would be empty?)");
    if (by_count) diag.error(r.path_of("emit_empty"), "emit_empty applies only to time windows");
    for (const AggSpec& a : cfg.aggs)
      if (a.fn != Fn::count && a.fn != Fn::sum && a.fn != Fn::avg)
        diag.error(r.path_of("emit_empty"), "emit_empty allows only count, sum and avg ('" + a.name +
                                                "' has no value in an empty window)");
    cfg.emit_empty = true;
  }
  r.finish();

  auto schema = Schema::make(out_fields);
  if (!schema.ok() && diag.size() == before) diag.error(r.path_of("aggregates"), "output schema: " + schema.error().message);
  if (diag.size() != before || !window_ok || !schema.ok()) return nullptr;

  // Cell layout of a slot.
  uint32_t cell = 1, str = 0;
  for (AggSpec& a : cfg.aggs) {
    a.cell = cell;
    switch (a.fn) {
      case Fn::count: break;
      case Fn::sum:
      case Fn::avg: cell += 1; break;
      case Fn::min:
      case Fn::max:
        cell += 1;
        if (a.in_type == Type::String) a.str = str++;
        break;
      case Fn::first:
      case Fn::last:
        if (a.in_type == Type::String) {
          cell += 1;
          a.str = str++;
        } else {
          cell += 2;
        }
        break;
      case Fn::max_by:
      case Fn::min_by:
        cell += 3;
        if (a.in_type == Type::String) a.str = str++;
        break;
    }
  }
  cfg.cells = cell;
  cfg.strings = str;
  return std::make_unique<AggregateBox>(ctx.inputs[0], std::make_shared<const Schema>(std::move(*schema)),
                                        std::move(cfg));
}

}  // namespace entente::engine::boxes
