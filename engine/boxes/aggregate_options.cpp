// Aggregate options: reading them and checking them against the input
// schema into a Config, with the cell layout of a slot
// (docs/boxes-windowed.md#aggregate). One named step per option, called in
// the order the options are documented, so that the diagnostics come in
// that order. The box itself is in aggregate.cpp.
#include <algorithm>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "engine/boxes/boxes.h"
#include "engine/boxes/detail_aggregate_config.h"
#include "engine/boxes/detail_keyed_state.h"
#include "engine/detail/options.h"
#include "engine/expr.h"
#include "rapidjson/document.h"

namespace entente::engine::boxes {

namespace {

using detail::aggregate::AggSpec;
using detail::aggregate::Config;
using detail::aggregate::Fn;
using detail::aggregate::kMaxAggregates;
using detail::aggregate::kMaxGroupBy;
using detail::aggregate::kMaxTopK;
using detail::aggregate::TopOrder;
using detail::aggregate::WindowSpec;
using engine::detail::Need;
using engine::detail::OptionReader;

// What the steps of make_aggregate share: the options being read, the
// input schema, and what is built from them (the Config and the output
// fields, in output order).
struct Parse {
  OptionReader& r;
  const Schema& in;
  Diagnostics& diag;
  Config cfg;
  std::vector<Field> out_fields;
  bool group_by_named = false;  // group_by listed at least one name (valid or not)
  bool window_ok = false;
  bool by_count() const { return window_ok && cfg.window.by_count; }
};

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

// `group_by`: the key columns, each an input field named once.
void read_group_by(Parse& p) {
  auto group_by = p.r.strings("group_by", Need::optional);
  if (!group_by) return;
  p.group_by_named = !group_by->empty();
  const std::string path = p.r.path_of("group_by");
  if (group_by->size() > kMaxGroupBy) p.diag.error(path, "at most 16 group_by fields");
  for (size_t i = 0; i < group_by->size(); ++i) {
    const std::string& name = (*group_by)[i];
    const std::string ipath = path + "[" + std::to_string(i) + "]";
    auto idx = p.in.index_of(name);
    if (!idx) {
      p.diag.error(ipath, "unknown field '" + name + "'; input has " + p.in.to_string());
      continue;
    }
    if (std::find(p.cfg.key_cols.begin(), p.cfg.key_cols.end(), *idx) != p.cfg.key_cols.end()) {
      p.diag.error(ipath, "field '" + name + "' listed twice");
      continue;
    }
    p.cfg.key_cols.push_back(*idx);
    p.out_fields.push_back(p.in.field(*idx));
  }
}

// `window`: type, by, size and slide; the pane width follows. Returns false
// (having reported why) if the window is unusable.
bool read_window(OptionReader& top, WindowSpec& w) {
  const rapidjson::Value* v = top.value("window", Need::required);
  if (v == nullptr) return false;
  const std::string path = top.path_of("window");
  Diagnostics& diag = top.diag();
  OptionReader r(v, path, diag);
  const size_t before = diag.size();
  auto type = r.choice("type", Need::required, {"tumbling", "sliding"});
  auto by = r.choice("by", Need::optional, {"time", "count"});
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

// The keys of one entry of `aggregates`, as written.
struct AggregateKeys {
  std::string fn_name;
  std::optional<std::string> field, expr, by, as;
};

// max_by/min_by: the ranked field `by` (a number, bool or timestamp);
// other functions take no `by`. Returns false having reported why.
bool read_ranking(AggSpec& a, const AggregateKeys& k, const std::string& apath, const Schema& in,
                  Diagnostics& diag) {
  if (!a.is_by()) {
    if (!k.by) return true;
    diag.error(apath + ".by", "'by' applies only to max_by and min_by");
    return false;
  }
  if (!k.by) {
    diag.error(apath, k.fn_name + " needs 'by' (the field whose largest or smallest value picks the row)");
    return false;
  }
  auto idx = in.index_of(*k.by);
  if (!idx) {
    diag.error(apath + ".by", "unknown field '" + *k.by + "'; input has " + in.to_string());
    return false;
  }
  a.by_field = static_cast<int>(*idx);
  a.by_type = in.field(*idx).type;
  if (a.by_type == Type::String) {
    diag.error(apath + ".by", k.fn_name + " ranks by an int64, double, bool or timestamp field, got string");
    return false;
  }
  return true;
}

// The aggregated value (`field` or `expr`, none for count), the output name
// and type. Returns false having reported why.
bool read_value(AggSpec& a, AggregateKeys& k, const std::string& apath, const Schema& in, Diagnostics& diag) {
  if (a.fn == Fn::count) {
    if (k.field || k.expr) {
      diag.error(apath, "count takes neither 'field' nor 'expr' (fields are never null)");
      return false;
    }
    a.out_type = Type::Int64;
    a.name = k.as.value_or("count");
    return true;
  }
  if (k.field.has_value() == k.expr.has_value()) {
    diag.error(apath, k.fn_name + " needs exactly one of 'field' and 'expr'");
    return false;
  }
  if (k.field) {
    auto idx = in.index_of(*k.field);
    if (!idx) {
      diag.error(apath + ".field", "unknown field '" + *k.field + "'; input has " + in.to_string());
      return false;
    }
    a.field = static_cast<int>(*idx);
    a.in_type = in.field(*idx).type;
    a.name = k.as.value_or(k.fn_name + "_" + *k.field);
  } else {
    auto e = Expr::compile(*k.expr, in);
    if (!e.ok()) {
      diag.error(apath + ".expr", e.error().message);
      return false;
    }
    a.in_type = e->type();
    a.field = e->field_index();
    a.expr = std::move(*e);
    if (!k.as) {
      diag.error(apath, "an aggregate over an expression needs 'as' (its output name)");
      return false;
    }
    a.name = *k.as;
  }
  if ((a.fn == Fn::sum || a.fn == Fn::avg) && !is_numeric(a.in_type)) {
    diag.error(apath,
               k.fn_name + " needs an int64 or double value, got " + std::string(type_name(a.in_type)));
    return false;
  }
  a.out_type = a.fn == Fn::avg ? Type::Double : a.in_type;
  return true;
}

// One entry of `aggregates`; nullopt (reported) if it is unusable.
std::optional<AggSpec> read_aggregate(const rapidjson::Value& v, const std::string& apath, const Schema& in,
                                      Diagnostics& diag) {
  OptionReader ar(&v, apath, diag);
  const size_t before = diag.size();
  auto fn_name = ar.choice("fn", Need::required,
                           {"count", "sum", "min", "max", "avg", "first", "last", "max_by", "min_by"});
  AggregateKeys k;
  k.field = ar.string("field", Need::optional);
  k.expr = ar.string("expr", Need::optional);
  k.by = ar.string("by", Need::optional);
  k.as = ar.string("as", Need::optional);
  ar.finish();
  if (diag.size() != before || !fn_name) return std::nullopt;
  k.fn_name = *fn_name;
  AggSpec a;
  a.fn = *parse_fn(k.fn_name);
  if (!read_ranking(a, k, apath, in, diag) || !read_value(a, k, apath, in, diag)) return std::nullopt;
  return a;
}

// `aggregates`: 1 to 64 entries, each adding an output field.
void read_aggregates(Parse& p) {
  const rapidjson::Value* aggs = p.r.value("aggregates", Need::required);
  if (aggs == nullptr) return;
  if (!aggs->IsArray() || aggs->Empty() || aggs->Size() > kMaxAggregates) {
    p.diag.error(p.r.path_of("aggregates"), "expected an array of 1 to 64 aggregates");
    return;
  }
  for (rapidjson::SizeType i = 0; i < aggs->Size(); ++i) {
    const std::string apath = p.r.path_of("aggregates") + "[" + std::to_string(i) + "]";
    auto a = read_aggregate((*aggs)[i], apath, p.in, p.diag);
    if (!a) continue;
    p.out_fields.push_back({a->name, a->out_type});
    p.cfg.aggs.push_back(std::move(*a));
  }
}

// `slack` and `timeout`: durations, for time windows only.
void read_timing(Parse& p) {
  if (const auto* s = p.r.value("slack", Need::optional)) {
    if (p.by_count()) {
      p.diag.error(p.r.path_of("slack"),
                   "count windows follow arrival order; slack applies only to time windows");
    } else if (auto d = engine::detail::parse_duration_ms(*s, p.r.path_of("slack"), p.diag)) {
      if (*d > detail::kSpanLimit) p.diag.error(p.r.path_of("slack"), "slack must be at most 2^40 ms");
      p.cfg.slack = *d;
    }
  }
  if (const auto* t = p.r.value("timeout", Need::optional)) {
    if (p.by_count()) {
      p.diag.error(p.r.path_of("timeout"), "timeout applies only to time windows");
    } else if (auto d = engine::detail::parse_duration_ms(*t, p.r.path_of("timeout"), p.diag)) {
      if (*d <= 0) p.diag.error(p.r.path_of("timeout"), "timeout must be positive");
      p.cfg.timeout = *d;
    }
  }
}

// `top`: rank the groups of each time window by one non-string aggregate.
void read_top(Parse& p) {
  const rapidjson::Value* t = p.r.value("top", Need::optional);
  if (t == nullptr) return;
  const std::string tpath = p.r.path_of("top");
  OptionReader tr(t, tpath, p.diag);
  const size_t before = p.diag.size();
  auto by = tr.string("by", Need::required);
  auto k = tr.int64("k", Need::optional, 1, kMaxTopK);
  auto order = tr.choice("order", Need::optional, {"desc", "asc"});
  tr.finish();
  if (p.by_count())
    p.diag.error(tpath, "top ranks the groups of one time window; count windows close per group");
  if (p.cfg.timeout > 0)
    p.diag.error(tpath, "top needs every group of a window at once; a timeout emits groups one by one");
  if (p.diag.size() != before || !by) return;
  const auto& aggs = p.cfg.aggs;
  auto it = std::find_if(aggs.begin(), aggs.end(), [&](const AggSpec& a) { return a.name == *by; });
  if (it == aggs.end()) {
    std::string names;
    for (const AggSpec& a : aggs) names += (names.empty() ? "" : ", ") + a.name;
    p.diag.error(tpath + ".by", "'" + *by + "' is not an aggregate of this box (aggregates: " + names + ")");
  } else if (it->out_type == Type::String) {
    p.diag.error(tpath + ".by",
                 "top ranks by an int64, double, bool or timestamp aggregate; '" + *by + "' is a string");
  } else {
    p.cfg.top.agg = static_cast<int>(it - aggs.begin());
    p.cfg.top.k = k.value_or(1);
    p.cfg.top.order = order.value_or("desc") == "asc" ? TopOrder::asc : TopOrder::desc;
  }
}

// `emit_empty`: rows for empty time windows, without group_by, of
// aggregates that have a value in an empty window.
void read_emit_empty(Parse& p) {
  auto emit_empty = p.r.boolean("emit_empty", Need::optional);
  if (!emit_empty.value_or(false)) return;
  const std::string path = p.r.path_of("emit_empty");
  if (!p.cfg.key_cols.empty() || p.group_by_named)
    p.diag.error(path, "emit_empty needs an empty group_by (which groups would be empty?)");
  if (p.by_count()) p.diag.error(path, "emit_empty applies only to time windows");
  for (const AggSpec& a : p.cfg.aggs)
    if (a.fn != Fn::count && a.fn != Fn::sum && a.fn != Fn::avg)
      p.diag.error(path, "emit_empty allows only count, sum and avg ('" + a.name +
                             "' has no value in an empty window)");
  p.cfg.emit_empty = true;
}

// The cell layout of a slot: cell 0 counts rows, then each aggregate's
// cells; string values get a string index of their own.
void lay_out_cells(Config& cfg) {
  uint32_t cell = 1, str = 0;
  for (AggSpec& a : cfg.aggs) {
    a.cell = cell;
    switch (a.fn) {
      case Fn::count:
        break;
      case Fn::sum:
      case Fn::avg:
        cell += 1;
        break;
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
}

}  // namespace

std::unique_ptr<Box> make_aggregate(const rapidjson::Value& options, const BoxBuildContext& ctx) {
  Diagnostics& diag = *ctx.diag;
  const size_t before = diag.size();
  OptionReader r(options_or_null(options), ctx.path + ".options", diag);
  if (ctx.inputs.size() != 1) {
    diag.error(ctx.path, "aggregate takes exactly 1 input, got " + std::to_string(ctx.inputs.size()));
    return nullptr;
  }
  Parse p{r, *ctx.inputs[0], diag, Config{}, {}};
  read_group_by(p);
  p.window_ok = read_window(r, p.cfg.window);
  if (p.window_ok && !p.cfg.window.by_count) {
    p.out_fields.push_back({"window_start", Type::Timestamp});
    p.out_fields.push_back({"window_end", Type::Timestamp});
  }
  read_aggregates(p);
  read_timing(p);
  read_top(p);
  read_emit_empty(p);
  r.finish();

  auto schema = Schema::make(p.out_fields);
  if (!schema.ok() && diag.size() == before)
    diag.error(r.path_of("aggregates"), "output schema: " + schema.error().message);
  if (diag.size() != before || !p.window_ok || !schema.ok()) return nullptr;
  lay_out_cells(p.cfg);
  return detail::aggregate::make_aggregate_box(
      ctx.inputs[0], std::make_shared<const Schema>(std::move(*schema)), std::move(p.cfg));
}

}  // namespace entente::engine::boxes
