// Aggregate options: parsing and checking them against the input schema
// into a Config, with the cell layout of a slot (docs/boxes-windowed.md#aggregate).
// The box itself is in aggregate.cpp.
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

using detail::aggregate::kMaxAggregates;
using detail::aggregate::kMaxGroupBy;
using detail::aggregate::kMaxTopK;
using detail::aggregate::make_aggregate_box;
using detail::aggregate::AggSpec;
using detail::aggregate::Config;
using detail::aggregate::Fn;
using detail::aggregate::TopOrder;
using detail::aggregate::TopSpec;
using detail::aggregate::WindowSpec;
using engine::detail::Need;
using engine::detail::OptionReader;

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
  return make_aggregate_box(ctx.inputs[0], std::make_shared<const Schema>(std::move(*schema)), std::move(cfg));
}

}  // namespace entente::engine::boxes
