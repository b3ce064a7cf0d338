// Map: computes a new row from each input row (docs/boxes.md#map).
#include <set>

#include "engine/boxes/boxes.h"
#include "engine/boxes/detail_stateless_common.h"

namespace entente::engine::boxes {

namespace {

inline constexpr size_t kMaxMapFields = 1024;

// Stateless: its snapshot is the base state. Bare field references forward
// the input column (shared, not copied); other expressions are evaluated a
// column at a time.
class MapBox final : public StatelessBoxBase {
 public:
  MapBox(SchemaPtr input, SchemaPtr output, std::vector<Expr> exprs, std::optional<Expr> time)
      : StatelessBoxBase(SnapshotTag::map, {std::move(input)}, {std::move(output)}),
        exprs_(std::move(exprs)),
        time_(std::move(time)) {
    forward_.reserve(exprs_.size());
    for (const auto& e : exprs_) forward_.push_back(e.field_index());
  }

  std::string_view type() const override { return "map"; }

  void on_batch(size_t /*port*/, const Batch& batch, Emitter& out) override {
    if (batch.empty()) return;
    std::vector<ColumnPtr> cols;
    cols.reserve(exprs_.size());
    for (size_t i = 0; i < exprs_.size(); ++i)
      cols.push_back(forward_[i] >= 0 ? batch.columns[static_cast<size_t>(forward_[i])] : exprs_[i].eval(batch));
    Batch o = batch.project(output_schemas_[0], std::move(cols));
    if (!time_) {
      emit(out, 0, std::move(o));
      return;
    }
    // Re-stamped rows may fall below the watermark already sent downstream;
    // those would break its promise, so they count as late.
    ColumnPtr t = time_->eval(batch);
    o.event_time = RowVector<EventTime>::alias(t, t->ints);  // shared, not copied
    const Batch& kept = drop_late(o, output_watermark(), stats_.late_dropped, scratch_, idx_);
    if (&kept == &o)
      emit(out, 0, std::move(o));
    else
      emit(out, 0, std::move(scratch_));
  }

 private:
  std::vector<Expr> exprs_;
  std::vector<int> forward_;  // input column index for bare field references, else -1
  std::optional<Expr> time_;
  Batch scratch_;
  std::vector<uint32_t> idx_;
};

}  // namespace

std::unique_ptr<Box> make_map(const rapidjson::Value& options, const BoxBuildContext& ctx) {
  detail::OptionReader r(options_of(options), ctx.path + ".options", *ctx.diag);
  Diagnostics& diag = *ctx.diag;
  const bool inputs_ok = check_input_count(ctx, "map", 1, 1);
  bool good = inputs_ok;
  std::vector<Field> fields;
  std::vector<Expr> exprs;
  const rapidjson::Value* list = r.value("fields", detail::Need::required);
  if (list != nullptr) {
    const std::string path = r.path_of("fields");
    if (!list->IsArray() || list->Empty() || list->Size() > kMaxMapFields) {
      diag.error(path, "expected an array of 1 to " + std::to_string(kMaxMapFields) +
                           " objects {\"name\": ..., \"expr\": ...}");
      good = false;
    } else {
      std::set<std::string> names;
      for (rapidjson::SizeType i = 0; i < list->Size(); ++i) {
        const std::string fpath = path + "[" + std::to_string(i) + "]";
        detail::OptionReader fr(&(*list)[i], fpath, diag);
        auto name = fr.string("name", detail::Need::required);
        auto text = fr.string("expr", detail::Need::required);
        fr.finish();
        if (!fr.ok() || !name || !text) {
          good = false;
          continue;
        }
        if (!names.insert(*name).second) {
          diag.error(fpath + ".name", "field '" + *name + "' is defined twice");
          good = false;
        }
        if (!inputs_ok) continue;
        auto e = Expr::compile(*text, *ctx.inputs[0]);
        if (!e.ok()) {
          diag.error(fpath + ".expr", e.error().message);
          good = false;
          continue;
        }
        fields.push_back({*name, e->type()});
        exprs.push_back(std::move(e).value());
      }
    }
  }
  std::optional<Expr> time;
  if (auto text = r.string("event_time", detail::Need::optional); text && inputs_ok) {
    auto e = Expr::compile(*text, *ctx.inputs[0]);
    if (!e.ok()) {
      diag.error(r.path_of("event_time"), e.error().message);
      good = false;
    } else if (!is_int_repr(e->type())) {
      diag.error(r.path_of("event_time"), "event_time must be a timestamp or int64 expression, but '" +
                                              *text + "' is " + std::string(type_name(e->type())));
      good = false;
    } else {
      time = std::move(e).value();
    }
  }
  r.finish();
  if (!good || !r.ok()) return nullptr;
  auto schema = Schema::make(std::move(fields));
  if (!schema.ok()) {
    diag.error(r.path_of("fields"), schema.error().message);
    return nullptr;
  }
  return std::make_unique<MapBox>(ctx.inputs[0], std::make_shared<const Schema>(std::move(schema).value()),
                                  std::move(exprs), std::move(time));
}

}  // namespace entente::engine::boxes
