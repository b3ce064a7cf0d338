// Union: N inputs of one schema -> one output, in deterministic order
// (docs/boxes.md#union). The same box serves merge (engine/boxes/merge.cpp).
#include <string>

#include "engine/boxes/detail_stateless_ordered.h"

namespace entente::engine::boxes {

namespace {

// State: the rows not yet released (OrderedInputs) and each input's own
// watermark, which decides what is late. Lateness is judged per input, not
// against the minimum over inputs, so that whether a row is dropped does not
// depend on how the inputs' batches interleaved in time.
class OrderedBox final : public EnvelopeBoxBase {
 public:
  OrderedBox(std::string_view type, SnapshotTag tag, std::vector<SchemaPtr> inputs,
             std::unique_ptr<RunCombiner> combiner)
      : EnvelopeBoxBase(tag, inputs, {inputs[0]}),
        type_(type),
        ordered_(inputs),
        port_wm_(inputs.size(), kMinTime),
        combiner_(std::move(combiner)) {}

  std::string_view type() const override { return type_; }

  void on_batch(size_t port, const Batch& batch, Emitter& /*out*/) override {
    if (batch.empty()) return;
    ordered_.add(port, drop_late(batch, port_wm_[port], stats_.late_dropped, scratch_, idx_));
    scratch_ = Batch();
  }

  void on_watermark(size_t port, EventTime wm, Emitter& out) override {
    if (wm > port_wm_[port]) port_wm_[port] = wm;
    update_input_watermark(port, wm);
    const EventTime w = ordered_.set_watermark(port, wm);
    if (w <= output_watermark()) return;
    if (combiner_) {
      ordered_.release([&](size_t input, const Batch& run) { combiner_->add(input, run); });
      emit(out, 0, combiner_->finish());
    } else {
      ordered_.release([&](size_t, const Batch& run) { runs_.push_back(run); });
      if (!runs_.empty()) emit(out, 0, concat(output_schemas_[0], runs_));
      runs_.clear();
    }
    emit_watermark(out, w);
  }

  // Own state: varint inputs | i64 watermark per input | OrderedInputs.
  std::string snapshot() const override {
    std::string out;
    snapshot_head(out);
    ByteWriter w(out);
    w.varint(port_wm_.size());
    for (EventTime t : port_wm_) w.i64(t);
    ordered_.snapshot(out);
    return out;
  }

  Status restore(std::string_view bytes, const KeyGroupRange* /*keep*/) override {
    std::vector<EventTime> wms;
    OrderedInputs ordered(input_schemas_);
    return restore_envelope(
        bytes,
        [&](ByteReader& r) -> Status {
          uint64_t n = 0;
          if (!r.varint(n) || n != port_wm_.size())
            return make_error(Errc::corrupt, "snapshot does not match this box's inputs");
          wms.resize(n);
          for (auto& t : wms)
            if (!r.i64(t)) return make_error(Errc::corrupt, "snapshot truncated in watermarks");
          std::string_view rest = r.rest();
          ENTENTE_RETURN_IF_ERROR(ordered.restore(rest));
          r = ByteReader(rest);
          return Status::Ok();
        },
        [&] {
          port_wm_ = std::move(wms);
          ordered_ = std::move(ordered);
        });
  }

 private:
  std::string type_;
  OrderedInputs ordered_;
  std::vector<EventTime> port_wm_;
  std::unique_ptr<RunCombiner> combiner_;
  std::vector<Batch> runs_;
  Batch scratch_;
  std::vector<uint32_t> idx_;
};

}  // namespace

std::unique_ptr<Box> make_ordered_box(std::string_view type, SnapshotTag tag, std::vector<SchemaPtr> inputs,
                                      std::unique_ptr<RunCombiner> combiner) {
  return std::make_unique<OrderedBox>(type, tag, std::move(inputs), std::move(combiner));
}

std::unique_ptr<Box> make_union(const rapidjson::Value& options, const BoxBuildContext& ctx) {
  detail::OptionReader r(options_of(options), ctx.path + ".options", *ctx.diag);
  r.finish();  // union has no options
  const bool inputs_ok = check_input_count(ctx, "union", 2) && check_same_schemas(ctx, "union");
  if (!inputs_ok || !r.ok()) return nullptr;
  return make_ordered_box("union", SnapshotTag::union_, ctx.inputs, nullptr);
}

}  // namespace entente::engine::boxes
