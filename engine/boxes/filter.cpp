// Filter: Aurora's m predicates -> m+1 outputs (docs/boxes.md#filter).
#include "engine/boxes/boxes.h"
#include "engine/boxes/detail_stateless_common.h"

namespace entente::engine::boxes {

namespace {

// Stateless: its snapshot is the base state (sequence counters, watermarks).
class FilterBox final : public StatelessBoxBase {
 public:
  FilterBox(SchemaPtr input, std::vector<Expr> predicates, bool drop_unmatched)
      : StatelessBoxBase(SnapshotTag::filter, {input},
                        std::vector<SchemaPtr>(predicates.size() + (drop_unmatched ? 0 : 1), input)),
        router_(std::move(predicates), !drop_unmatched) {}

  std::string_view type() const override { return "filter"; }

  void on_batch(size_t /*port*/, const Batch& batch, Emitter& out) override {
    router_.route(batch, [&](size_t port, Batch b) { emit(out, port, std::move(b)); });
  }

 private:
  PredicateRouter router_;
};

}  // namespace

std::unique_ptr<Box> make_filter(const rapidjson::Value& options, const BoxBuildContext& ctx) {
  detail::OptionReader r(options_of(options), ctx.path + ".options", *ctx.diag);
  const bool inputs_ok = check_input_count(ctx, "filter", 1, 1);
  std::optional<std::vector<Expr>> preds;
  if (inputs_ok) preds = read_predicates(r, "predicates", *ctx.inputs[0]);
  else r.value("predicates", detail::Need::optional);
  auto drop = r.boolean("drop_unmatched", detail::Need::optional);
  r.finish();
  if (!inputs_ok || !r.ok() || !preds) return nullptr;
  return std::make_unique<FilterBox>(ctx.inputs[0], std::move(*preds), drop.value_or(false));
}

}  // namespace entente::engine::boxes
