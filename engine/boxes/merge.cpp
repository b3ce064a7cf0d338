// Merge: recombines the outputs of a split box (docs/boxes.md#merge), as a
// deterministic union or by combining partial aggregates.
#include <algorithm>
#include <cmath>
#include <optional>
#include <set>
#include <tuple>

#include "engine/boxes/detail_stateless_ordered.h"

namespace entente::engine::boxes {

namespace {

inline constexpr size_t kMaxMergeInputs = 1024;
// `top.k` at most this, as the aggregate's `top`.
inline constexpr int64_t kMaxMergeTopK = int64_t{1} << 20;

enum class CombineFn : uint8_t { sum, min, max, first, last };

bool same_value(const Column& a, size_t i, const Column& b, size_t j) noexcept {
  switch (a.type) {
    case Type::Int64:
    case Type::Timestamp: return a.ints[i] == b.ints[j];
    case Type::Double: {
      const double x = a.doubles[i];
      const double y = b.doubles[j];
      return x == y || (std::isnan(x) && std::isnan(y));
    }
    case Type::Bool: return a.bools[i] == b.bools[j];
    case Type::String: return a.str(i) == b.str(j);
  }
  return false;
}

// True if a[i] < b[j]. NaN is never less, so it neither wins a min nor a
// max against a number that came first.
bool less_value(const Column& a, size_t i, const Column& b, size_t j) noexcept {
  switch (a.type) {
    case Type::Int64:
    case Type::Timestamp: return a.ints[i] < b.ints[j];
    case Type::Double: return a.doubles[i] < b.doubles[j];
    case Type::Bool: return a.bools[i] < b.bools[j];
    case Type::String: return a.str(i) < b.str(j);
  }
  return false;
}

// Combines partial-aggregate rows that share an event time and a group key.
// Rows come in release order (event time, input index, arrival), so a new
// group key is first seen in that order, and all rows of one event time
// arrive within one release step. What each output field takes:
//   group_by and unlisted fields: the group's first row;
//   sum: the sum (int64 wraps around like two's complement, double adds);
//   min/max: the smallest/largest value, the earliest on ties;
//   first/last: the group's first/last row in release order.
class PartialCombiner final : public RunCombiner {
 public:
  PartialCombiner(SchemaPtr schema, std::vector<size_t> keys, std::vector<std::pair<size_t, CombineFn>> aggs)
      : schema_(std::move(schema)), keys_(std::move(keys)), aggs_(std::move(aggs)), builder_(schema_) {
    agg_of_field_.assign(schema_->size(), -1);
    for (size_t a = 0; a < aggs_.size(); ++a) agg_of_field_[aggs_[a].first] = static_cast<int>(a);
  }

  void add(size_t /*input*/, const Batch& run) override {
    if (run.empty()) return;
    const auto part = static_cast<uint32_t>(parts_.size());
    parts_.push_back(run);
    hash_rows(run, keys_, hashes_);
    for (size_t r = 0; r < run.rows(); ++r) {
      const EventTime t = run.event_time[r];
      if (!groups_.empty() && t != time_) flush_time();
      time_ = t;
      add_row(part, static_cast<uint32_t>(r), hashes_[r]);
    }
  }

  Batch finish() override {
    flush_time();
    parts_.clear();
    return builder_.finish();
  }

 private:
  struct Ref {
    uint32_t part = 0;
    uint32_t row = 0;
  };
  struct Slot {
    Ref ref;  // min/max: the row holding the value so far
    int64_t i = 0;
    double d = 0;
  };
  struct Group {
    Ref first;
    Ref last;
    uint64_t hash = 0;
  };
  struct Bucket {
    uint32_t gen = 0;  // valid only when equal to gen_
    uint32_t group = 0;
  };

  const Column& col(Ref ref, size_t f) const { return parts_[ref.part].column(f); }

  bool same_key(Ref a, Ref b) const {
    for (size_t k : keys_)
      if (!same_value(col(a, k), a.row, col(b, k), b.row)) return false;
    return true;
  }

  void add_row(uint32_t part, uint32_t row, uint64_t hash) {
    const Ref ref{part, row};
    if (groups_.size() * 2 >= table_.size()) grow();
    const size_t mask = table_.size() - 1;
    size_t pos = static_cast<size_t>(hash) & mask;
    for (;; pos = (pos + 1) & mask) {
      Bucket& bk = table_[pos];
      if (bk.gen != gen_) {
        bk.gen = gen_;
        bk.group = static_cast<uint32_t>(groups_.size());
        new_group(ref, hash);
        return;
      }
      Group& g = groups_[bk.group];
      if (g.hash == hash && same_key(g.first, ref)) {
        update_group(bk.group, ref);
        return;
      }
    }
  }

  void new_group(Ref ref, uint64_t hash) {
    groups_.push_back({ref, ref, hash});
    for (const auto& [f, fn] : aggs_) {
      Slot s;
      s.ref = ref;
      if (fn == CombineFn::sum) {
        const Column& c = col(ref, f);
        if (c.type == Type::Double) s.d = c.doubles[ref.row];
        else s.i = c.ints[ref.row];
      }
      slots_.push_back(s);
    }
  }

  void update_group(uint32_t g, Ref ref) {
    groups_[g].last = ref;
    Slot* s = slots_.data() + static_cast<size_t>(g) * aggs_.size();
    for (size_t a = 0; a < aggs_.size(); ++a) {
      const size_t f = aggs_[a].first;
      const Column& c = col(ref, f);
      switch (aggs_[a].second) {
        case CombineFn::sum:
          if (c.type == Type::Double) s[a].d += c.doubles[ref.row];
          else
            s[a].i = static_cast<int64_t>(static_cast<uint64_t>(s[a].i) + static_cast<uint64_t>(c.ints[ref.row]));
          break;
        case CombineFn::min:
          if (less_value(c, ref.row, col(s[a].ref, f), s[a].ref.row)) s[a].ref = ref;
          break;
        case CombineFn::max:
          if (less_value(col(s[a].ref, f), s[a].ref.row, c, ref.row)) s[a].ref = ref;
          break;
        case CombineFn::first:
        case CombineFn::last: break;
      }
    }
  }

  void grow() {
    const size_t size = table_.empty() ? 64 : table_.size() * 2;
    std::vector<Bucket> table(size);
    const size_t mask = size - 1;
    for (size_t g = 0; g < groups_.size(); ++g) {
      size_t pos = static_cast<size_t>(groups_[g].hash) & mask;
      while (table[pos].gen == gen_) pos = (pos + 1) & mask;
      table[pos] = {gen_, static_cast<uint32_t>(g)};
    }
    // Fresh buckets carry generation 0, which gen_ never is.
    table_ = std::move(table);
  }

  // Appends one output row per group of the current event time, in
  // first-seen order.
  void flush_time() {
    if (groups_.empty()) return;
    const size_t nf = schema_->size();
    for (size_t g = 0; g < groups_.size(); ++g) {
      const Group& grp = groups_[g];
      const Slot* s = slots_.data() + g * aggs_.size();
      for (size_t f = 0; f < nf; ++f) {
        Column& out = builder_.column(f);
        const int a = agg_of_field_[f];
        if (a < 0) {
          out.append_from(col(grp.first, f), grp.first.row);
          continue;
        }
        switch (aggs_[static_cast<size_t>(a)].second) {
          case CombineFn::sum:
            if (out.type == Type::Double) out.doubles.push_back(s[a].d);
            else out.ints.push_back(s[a].i);
            break;
          case CombineFn::min:
          case CombineFn::max: out.append_from(col(s[a].ref, f), s[a].ref.row); break;
          case CombineFn::first: out.append_from(col(grp.first, f), grp.first.row); break;
          case CombineFn::last: out.append_from(col(grp.last, f), grp.last.row); break;
        }
      }
      builder_.event_time().push_back(time_);
      builder_.seq().push_back(0);
    }
    groups_.clear();
    slots_.clear();
    // Invalidates every bucket at once; on wrap-around clear for real.
    if (++gen_ == 0) {
      for (auto& b : table_) b.gen = 0;
      gen_ = 1;
    }
  }

  SchemaPtr schema_;
  std::vector<size_t> keys_;
  std::vector<std::pair<size_t, CombineFn>> aggs_;
  std::vector<int> agg_of_field_;  // aggregate index per field, -1 if none
  BatchBuilder builder_;
  std::vector<Batch> parts_;  // the runs of the current release step
  std::vector<uint64_t> hashes_;
  std::vector<Group> groups_;  // of the current event time
  std::vector<Slot> slots_;    // groups_.size() * aggs_.size()
  std::vector<Bucket> table_;
  uint32_t gen_ = 1;
  EventTime time_ = kMinTime;
};

// Union with `top`: keeps, of the rows of each event time, those with
// fewer than `k` rows of that time ranked strictly above them by field
// `by` (SQL RANK() <= k), in release order. After a hash split of an
// aggregate with `top`, each part keeps its own best groups of a window
// (a superset of the window's best, since a group beaten by fewer than k
// groups in all is beaten by fewer than k in its part); this ranks them
// again all together, as the unsplit aggregate did. The rows of one window
// share its event time (end - 1), and all rows of one event time come in
// one release step.
class TopRanker final : public RunCombiner {
 public:
  TopRanker(SchemaPtr schema, size_t by, int64_t k, bool asc)
      : schema_(std::move(schema)), by_(by), k_(static_cast<size_t>(k)), asc_(asc), builder_(schema_) {}

  void add(size_t /*input*/, const Batch& run) override {
    if (run.empty()) return;
    const auto part = static_cast<uint32_t>(parts_.size());
    parts_.push_back(run);
    for (size_t r = 0; r < run.rows(); ++r) {
      const EventTime t = run.event_time[r];
      if (!refs_.empty() && t != time_) flush_time();
      time_ = t;
      refs_.push_back({part, static_cast<uint32_t>(r)});
    }
  }

  Batch finish() override {
    flush_time();
    parts_.clear();
    return builder_.finish();
  }

 private:
  struct Ref {
    uint32_t part = 0;
    uint32_t row = 0;
  };

  const Column& col(Ref ref) const { return parts_[ref.part].column(by_); }

  // True if row `x` ranks strictly above row `y`. NaN ranks below every
  // number in both orders, as in the aggregate's `top`.
  bool better(Ref x, Ref y) const {
    const Column& cx = col(x);
    const Column& cy = col(y);
    switch (cx.type) {
      case Type::Double: {
        const double dx = cx.doubles[x.row], dy = cy.doubles[y.row];
        if (std::isnan(dx) || std::isnan(dy)) return !std::isnan(dx) && std::isnan(dy);
        return asc_ ? dx < dy : dx > dy;
      }
      case Type::Bool: return asc_ ? cx.bools[x.row] < cy.bools[y.row] : cx.bools[x.row] > cy.bools[y.row];
      case Type::String: return false;  // refused by make_merge
      case Type::Int64:
      case Type::Timestamp: break;
    }
    return asc_ ? cx.ints[x.row] < cy.ints[y.row] : cx.ints[x.row] > cy.ints[y.row];
  }

  void flush_time() {
    if (refs_.empty()) return;
    Ref kth = refs_[0];
    if (refs_.size() > k_) {
      if (k_ == 1) {
        for (const Ref& r : refs_)
          if (better(r, kth)) kth = r;
      } else {
        ranked_ = refs_;
        const auto nth = ranked_.begin() + static_cast<ptrdiff_t>(k_ - 1);
        std::nth_element(ranked_.begin(), nth, ranked_.end(), [this](Ref x, Ref y) { return better(x, y); });
        kth = *nth;
      }
    }
    const bool all = refs_.size() <= k_;
    const size_t nf = schema_->size();
    for (const Ref& r : refs_) {
      if (!all && better(kth, r)) continue;
      for (size_t f = 0; f < nf; ++f) builder_.column(f).append_from(parts_[r.part].column(f), r.row);
      builder_.event_time().push_back(time_);
      builder_.seq().push_back(0);
    }
    refs_.clear();
  }

  SchemaPtr schema_;
  size_t by_;
  size_t k_;
  bool asc_;
  BatchBuilder builder_;
  std::vector<Batch> parts_;  // the runs of the current release step
  std::vector<Ref> refs_;     // the rows of the current event time, in release order
  std::vector<Ref> ranked_;   // flush_time() scratch
  EventTime time_ = kMinTime;
};

}  // namespace

std::unique_ptr<Box> make_merge(const rapidjson::Value& options, const BoxBuildContext& ctx) {
  detail::OptionReader r(options_of(options), ctx.path + ".options", *ctx.diag);
  Diagnostics& diag = *ctx.diag;
  const bool inputs_ok =
      check_input_count(ctx, "merge", 1, kMaxMergeInputs) && check_same_schemas(ctx, "merge");
  bool good = inputs_ok;
  const auto mode = r.choice("mode", detail::Need::optional, {"union", "combine"});
  if (!mode && r.has("mode")) good = false;
  const bool combine = mode.value_or("union") == "combine";

  std::vector<size_t> keys;
  std::vector<std::pair<size_t, CombineFn>> aggs;
  // Union's `top`: the ranked field, k, ascending.
  std::optional<std::tuple<size_t, int64_t, bool>> top;
  if (const rapidjson::Value* t = r.value("top", detail::Need::optional); t != nullptr) {
    const std::string tpath = r.path_of("top");
    detail::OptionReader tr(t, tpath, diag);
    auto by = tr.string("by", detail::Need::required);
    auto k = tr.int64("k", detail::Need::optional, 1, kMaxMergeTopK);
    auto order = tr.choice("order", detail::Need::optional, {"desc", "asc"});
    tr.finish();
    if (!tr.ok() || !by) {
      good = false;
    } else if (combine) {
      diag.error(tpath, "'top' applies only to mode \"union\"");
      good = false;
    } else if (inputs_ok) {
      const Schema& in = *ctx.inputs[0];
      auto idx = in.index_of(*by);
      if (!idx) {
        diag.error(tpath + ".by", "unknown field '" + *by + "'; input has (" + in.to_string() + ")");
        good = false;
      } else if (in.field(*idx).type == Type::String) {
        diag.error(tpath + ".by", "top ranks by an int64, double, bool or timestamp field; '" + *by + "' is a string");
        good = false;
      } else {
        top.emplace(*idx, k.value_or(1), order.value_or("desc") == "asc");
      }
    }
  }
  if (!combine) {
    for (std::string_view k : {"group_by", "aggregates"}) {
      if (r.value(k, detail::Need::optional) != nullptr) {
        diag.error(r.path_of(k), cat("'", k, "' applies only to mode \"combine\""));
        good = false;
      }
    }
  } else if (!inputs_ok) {
    r.value("group_by", detail::Need::optional);
    r.value("aggregates", detail::Need::optional);
  } else {
    const Schema& in = *ctx.inputs[0];
    auto k = read_field_list(r, "group_by", detail::Need::optional, in, 0);
    if (k) keys = std::move(*k);
    else if (r.has("group_by")) good = false;
    const rapidjson::Value* list = r.value("aggregates", detail::Need::required);
    if (list == nullptr) {
      good = false;
    } else if (!list->IsArray() || list->Empty() || list->Size() > in.size()) {
      diag.error(r.path_of("aggregates"), "expected an array of 1 to " + std::to_string(in.size()) +
                                              " objects {\"field\": ..., \"fn\": ...}");
      good = false;
    } else {
      std::set<size_t> used(keys.begin(), keys.end());
      for (rapidjson::SizeType i = 0; i < list->Size(); ++i) {
        const std::string apath = r.path_of("aggregates") + "[" + std::to_string(i) + "]";
        detail::OptionReader ar(&(*list)[i], apath, diag);
        auto field = ar.string("field", detail::Need::required);
        auto fn = ar.choice("fn", detail::Need::required, {"sum", "min", "max", "first", "last"});
        ar.finish();
        if (!ar.ok()) good = false;
        if (!field || !fn) {
          good = false;
          continue;
        }
        auto idx = in.index_of(*field);
        if (!idx) {
          diag.error(apath + ".field", "unknown field '" + *field + "'; input has (" + in.to_string() + ")");
          good = false;
          continue;
        }
        if (!used.insert(*idx).second) {
          diag.error(apath + ".field", "field '" + *field + "' is already a group_by field or aggregated");
          good = false;
          continue;
        }
        CombineFn f = CombineFn::sum;
        if (*fn == "min") f = CombineFn::min;
        else if (*fn == "max") f = CombineFn::max;
        else if (*fn == "first") f = CombineFn::first;
        else if (*fn == "last") f = CombineFn::last;
        const Type t = in.field(*idx).type;
        if (f == CombineFn::sum && !is_numeric(t)) {
          diag.error(apath + ".fn", "sum needs an int64 or double field, but '" + *field + "' is " +
                                        std::string(type_name(t)));
          good = false;
          continue;
        }
        aggs.emplace_back(*idx, f);
      }
    }
  }
  r.finish();
  if (!good || !r.ok()) return nullptr;
  std::unique_ptr<RunCombiner> combiner;
  if (combine) combiner = std::make_unique<PartialCombiner>(ctx.inputs[0], std::move(keys), std::move(aggs));
  else if (top)
    combiner = std::make_unique<TopRanker>(ctx.inputs[0], std::get<0>(*top), std::get<1>(*top), std::get<2>(*top));
  return make_ordered_box("merge", SnapshotTag::merge, ctx.inputs, std::move(combiner));
}

}  // namespace entente::engine::boxes
