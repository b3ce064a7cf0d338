// Split: routes each row to one of N outputs, by key hash (the router of box
// splitting), by predicate, or round robin (docs/boxes.md#split).
#include <array>

#include "engine/boxes/boxes.h"
#include "engine/boxes/detail_stateless_common.h"

namespace entente::engine::boxes {

namespace {

inline constexpr int64_t kMaxRoundRobinOutputs = 1024;

enum class SplitMode : uint8_t { hash, predicate, round_robin };

// State: only the round-robin row counter (zero in other modes), so that a
// restored box continues the rotation where it stood.
class SplitBox final : public EnvelopeBoxBase {
 public:
  // Hash mode: output i owns ranges[i] (contiguous, covering every key
  // group: make_split checks), exactly the groups a keyed box restored with
  // that range keeps.
  SplitBox(SchemaPtr input, std::vector<size_t> keys, const std::vector<KeyGroupRange>& ranges)
      : EnvelopeBoxBase(SnapshotTag::split, {input}, std::vector<SchemaPtr>(ranges.size(), input)),
        mode_(SplitMode::hash),
        keys_(std::move(keys)),
        idx_(ranges.size()) {
    for (uint32_t i = 0; i < ranges.size(); ++i)
      for (uint32_t g = ranges[i].begin; g < ranges[i].end; ++g) group_out_[g] = i;
  }
  // Predicate mode.
  SplitBox(SchemaPtr input, std::vector<Expr> predicates, bool else_output)
      : EnvelopeBoxBase(SnapshotTag::split, {input},
                        std::vector<SchemaPtr>(predicates.size() + (else_output ? 1 : 0), input)),
        mode_(SplitMode::predicate),
        router_(std::in_place, std::move(predicates), else_output) {}
  // Round-robin mode.
  SplitBox(SchemaPtr input, size_t outputs)
      : EnvelopeBoxBase(SnapshotTag::split, {input}, std::vector<SchemaPtr>(outputs, input)),
        mode_(SplitMode::round_robin),
        idx_(outputs) {}

  std::string_view type() const override { return "split"; }

  void on_batch(size_t /*port*/, const Batch& batch, Emitter& out) override {
    const size_t n = batch.rows();
    if (n == 0) return;
    const size_t outs = num_outputs();
    switch (mode_) {
      case SplitMode::predicate:
        router_->route(batch, [&](size_t port, Batch b) { emit(out, port, std::move(b)); });
        return;
      case SplitMode::hash: {
        for (auto& v : idx_) v.clear();
        hash_rows(batch, keys_, hashes_);
        for (uint32_t r = 0; r < n; ++r) idx_[group_out_[key_group_of(hashes_[r])]].push_back(r);
        break;
      }
      case SplitMode::round_robin: {
        for (auto& v : idx_) v.clear();
        size_t o = static_cast<size_t>(counter_ % outs);
        for (uint32_t r = 0; r < n; ++r) {
          idx_[o].push_back(r);
          if (++o == outs) o = 0;
        }
        counter_ += n;
        break;
      }
    }
    for (size_t o = 0; o < outs; ++o) {
      if (idx_[o].empty()) continue;
      emit(out, o, idx_[o].size() == n ? batch : batch.take(idx_[o]));
    }
  }

  void on_watermark(size_t port, EventTime wm, Emitter& out) override {
    emit_watermark(out, update_input_watermark(port, wm));
  }

  // Own state: varint round-robin counter.
  std::string snapshot() const override {
    std::string out;
    snapshot_head(out);
    ByteWriter(out).varint(counter_);
    return out;
  }

  Status restore(std::string_view bytes, const KeyGroupRange* /*keep*/) override {
    uint64_t counter = 0;
    return restore_envelope(
        bytes,
        [&](ByteReader& r) -> Status {
          if (!r.varint(counter)) return make_error(Errc::corrupt, "split snapshot truncated");
          if (mode_ != SplitMode::round_robin && counter != 0)
            return make_error(Errc::corrupt, "split snapshot has a row counter but the box is not round robin");
          return Status::Ok();
        },
        [&] { counter_ = counter; });
  }

 private:
  SplitMode mode_;
  std::vector<size_t> keys_;
  std::array<uint32_t, kKeyGroups> group_out_{};
  std::optional<PredicateRouter> router_;
  uint64_t counter_ = 0;
  std::vector<std::vector<uint32_t>> idx_;  // rows per output, reused
  std::vector<uint64_t> hashes_;
};

// "ranges": [[begin, end], ...]: non-empty, in order, each starting where
// the one before ends, from 0 to kKeyGroups. nullopt (reported) otherwise.
std::optional<std::vector<KeyGroupRange>> read_key_group_ranges(const rapidjson::Value& v, const std::string& path,
                                                               Diagnostics& diag) {
  if (!v.IsArray() || v.Empty() || v.Size() > kKeyGroups) {
    diag.error(path, "expected an array of 1 to " + std::to_string(kKeyGroups) + " [begin, end] key-group ranges");
    return std::nullopt;
  }
  std::vector<KeyGroupRange> out;
  uint32_t next = 0;
  for (rapidjson::SizeType i = 0; i < v.Size(); ++i) {
    const std::string at = path + "[" + std::to_string(i) + "]";
    const auto& p = v[i];
    if (!p.IsArray() || p.Size() != 2 || !p[0].IsUint() || !p[1].IsUint() || p[1].GetUint() > kKeyGroups ||
        p[0].GetUint() >= p[1].GetUint()) {
      diag.error(at, "expected [begin, end] with 0 <= begin < end <= " + std::to_string(kKeyGroups));
      return std::nullopt;
    }
    if (p[0].GetUint() != next) {
      diag.error(at, "starts at key group " + std::to_string(p[0].GetUint()) + "; the ranges must follow each "
                     "other from 0, so this one must start at " + std::to_string(next));
      return std::nullopt;
    }
    out.push_back({p[0].GetUint(), p[1].GetUint()});
    next = p[1].GetUint();
  }
  if (next != kKeyGroups) {
    diag.error(path, "the ranges end at key group " + std::to_string(next) + "; they must cover every key group, up to " +
                         std::to_string(kKeyGroups));
    return std::nullopt;
  }
  return out;
}

}  // namespace

std::unique_ptr<Box> make_split(const rapidjson::Value& options, const BoxBuildContext& ctx) {
  detail::OptionReader r(options_of(options), ctx.path + ".options", *ctx.diag);
  Diagnostics& diag = *ctx.diag;
  const bool inputs_ok = check_input_count(ctx, "split", 1, 1);
  bool good = inputs_ok;
  const auto mode = r.choice("mode", detail::Need::required, {"hash", "predicate", "round_robin"});
  if (!mode) {
    // Without a mode the other options cannot be judged; mark them known so
    // that only the mode is reported.
    for (std::string_view k : {"keys", "outputs", "ranges", "predicates", "else_output"})
      r.value(k, detail::Need::optional);
    r.finish();
    return nullptr;
  }
  // Options that belong to another mode are named as such, not as unknown.
  auto refuse = [&](std::string_view key, std::string_view modes) {
    if (r.value(key, detail::Need::optional) == nullptr) return;
    diag.error(r.path_of(key), cat("'", key, "' applies only to mode ", modes));
    good = false;
  };
  std::unique_ptr<Box> box;
  if (*mode == "hash") {
    refuse("predicates", "\"predicate\"");
    refuse("else_output", "\"predicate\"");
    // Either `outputs` (equal parts) or `ranges` (the key groups of each
    // output, as a split fragment's parts own them).
    std::optional<std::vector<KeyGroupRange>> ranges;
    if (r.has("ranges")) {
      ranges = read_key_group_ranges(*r.value("ranges", detail::Need::required), r.path_of("ranges"), diag);
      if (r.has("outputs")) {
        diag.error(r.path_of("outputs"), "give either 'outputs' or 'ranges', not both");
        r.value("outputs", detail::Need::optional);
        good = false;
      }
    } else if (auto outputs = r.int64("outputs", detail::Need::required, 1, kKeyGroups)) {
      ranges.emplace();
      for (uint32_t i = 0; i < *outputs; ++i)
        ranges->push_back(KeyGroupRange::part(i, static_cast<uint32_t>(*outputs)));
    }
    std::optional<std::vector<size_t>> keys;
    if (inputs_ok) keys = read_field_list(r, "keys", detail::Need::required, *ctx.inputs[0], 1);
    else r.value("keys", detail::Need::optional);
    r.finish();
    if (good && r.ok() && ranges && keys) box = std::make_unique<SplitBox>(ctx.inputs[0], std::move(*keys), *ranges);
  } else if (*mode == "predicate") {
    refuse("keys", "\"hash\"");
    refuse("ranges", "\"hash\"");
    refuse("outputs", "\"hash\" and \"round_robin\" (predicate mode has one output per predicate)");
    std::optional<std::vector<Expr>> preds;
    if (inputs_ok) preds = read_predicates(r, "predicates", *ctx.inputs[0]);
    else r.value("predicates", detail::Need::optional);
    auto else_output = r.boolean("else_output", detail::Need::optional);
    r.finish();
    if (good && r.ok() && preds)
      box = std::make_unique<SplitBox>(ctx.inputs[0], std::move(*preds), else_output.value_or(false));
  } else {
    refuse("keys", "\"hash\"");
    refuse("ranges", "\"hash\"");
    refuse("predicates", "\"predicate\"");
    refuse("else_output", "\"predicate\"");
    auto outputs = r.int64("outputs", detail::Need::required, 1, kMaxRoundRobinOutputs);
    r.finish();
    if (good && r.ok() && outputs) box = std::make_unique<SplitBox>(ctx.inputs[0], static_cast<size_t>(*outputs));
  }
  return box;
}

}  // namespace entente::engine::boxes
