// BSort: Aurora's bounded-disorder sort (docs/boxes.md#bsort).
#include <algorithm>
#include <cstring>

#include "engine/boxes/boxes.h"
#include "engine/boxes/detail_stateless_common.h"
#include "engine/codec.h"

namespace entente::engine::boxes {

namespace {

inline constexpr int64_t kMaxSlack = 1 << 20;

// Maps a double to an int64 with the same order (a total order: -0.0 sorts
// before 0.0, NaNs with the sign bit first, other NaNs last).
int64_t ordered_bits(double d) noexcept {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  constexpr uint64_t kSign = uint64_t{1} << 63;
  u = (u & kSign) ? ~u : (u | kSign);
  return static_cast<int64_t>(u ^ kSign);
}

// Holds at most `slack` rows after each batch: every arriving row is pushed
// into a min-heap by (sort key, arrival number), and while more than `slack`
// rows are held the smallest is emitted. Rows are not copied into the heap:
// entries point into the input batches, which are kept (shared) while any of
// their rows is held, and compacted into one batch when they hold mostly
// rows already emitted.
//
// State: the held rows with their arrival numbers, and the next arrival
// number; (key, arrival) is a total order, so a restored box emits exactly
// what the original would have.
class BSortBox final : public EnvelopeBoxBase {
 public:
  BSortBox(SchemaPtr input, size_t slack, int by)
      : EnvelopeBoxBase(SnapshotTag::bsort, {input}, {input}), slack_(slack), by_(by) {}

  std::string_view type() const override { return "bsort"; }

  void on_batch(size_t /*port*/, const Batch& batch, Emitter& out) override {
    const Batch& b = drop_late(batch, input_watermark(), stats_.late_dropped, scratch_, idx_);
    const size_t n = b.rows();
    if (n == 0) return;
    const uint32_t part = add_part(b);
    scratch_ = Batch();
    const Batch& p = parts_[part];
    heap_.reserve(heap_.size() + n);
    for (uint32_t r = 0; r < n; ++r) {
      heap_.push_back({key_of(p, r), next_arrival_++, p.event_time[r], part, r});
      std::push_heap(heap_.begin(), heap_.end(), after);
      if (heap_.size() > slack_) pop_into_out();
    }
    emit_out(out);
    maybe_compact();
  }

  void on_watermark(size_t port, EventTime wm, Emitter& out) override {
    const EventTime w = update_input_watermark(port, wm);
    if (w <= output_watermark()) return;
    // Rows below the watermark must leave now: the watermark sent
    // downstream promises that nothing earlier follows.
    const bool all = w == kMaxWatermark;
    if (by_ < 0) {
      // Sorted by event time: they are exactly the smallest rows.
      while (!heap_.empty() && (all || heap_.front().time < w)) pop_into_out();
    } else {
      auto keep_end = std::partition(heap_.begin(), heap_.end(),
                                     [&](const Entry& e) { return !(all || e.time < w); });
      out_.assign(keep_end, heap_.end());
      heap_.erase(keep_end, heap_.end());
      std::make_heap(heap_.begin(), heap_.end(), after);
      std::sort(out_.begin(), out_.end(), [](const Entry& a, const Entry& b) { return after(b, a); });
    }
    emit_out(out);
    emit_watermark(out, w);
  }

  // Own state: varint next arrival | varint held rows | per held row (in
  // (key, arrival) order) varint arrival | the held rows as one batch.
  std::string snapshot() const override {
    std::string out;
    snapshot_head(out);
    std::vector<Entry> sorted = heap_;
    std::sort(sorted.begin(), sorted.end(), [](const Entry& a, const Entry& b) { return after(b, a); });
    ByteWriter w(out);
    w.varint(next_arrival_);
    w.varint(sorted.size());
    for (const auto& e : sorted) w.varint(e.arrival);
    encode_batch(gather(sorted), out);
    return out;
  }

  Status restore(std::string_view bytes, const KeyGroupRange* /*keep*/) override {
    uint64_t next_arrival = 0;
    std::vector<Entry> entries;
    Batch held;
    return restore_envelope(
        bytes,
        [&](ByteReader& r) -> Status {
          uint64_t n = 0;
          if (!r.varint(next_arrival) || !r.varint(n) || n > r.remaining())
            return make_error(Errc::corrupt, "bsort snapshot truncated");
          entries.resize(n);
          for (auto& e : entries)
            if (!r.varint(e.arrival) || e.arrival >= next_arrival)
              return make_error(Errc::corrupt, "bsort snapshot has a bad arrival number");
          std::string_view rest = r.rest();
          auto b = decode_batch(rest);
          if (!b.ok()) return make_error(Errc::corrupt, "bsort snapshot: " + b.error().message);
          if (b->schema == nullptr || !(*b->schema == *input_schemas_[0]) || b->rows() != n)
            return make_error(Errc::corrupt, "bsort snapshot rows do not match the box");
          r = ByteReader(rest);
          held = std::move(b).value();
          held.schema = input_schemas_[0];
          for (uint32_t i = 0; i < n; ++i) {
            entries[i].key = key_of(held, i);
            entries[i].time = held.event_time[i];
            entries[i].part = 0;
            entries[i].row = i;
          }
          for (size_t i = 1; i < n; ++i)
            if (!after(entries[i], entries[i - 1]))
              return make_error(Errc::corrupt, "bsort snapshot rows are out of order");
          return Status::Ok();
        },
        [&] {
          parts_.clear();
          live_.clear();
          free_.clear();
          retained_rows_ = 0;
          heap_ = std::move(entries);  // ascending order is a valid min-heap
          if (!heap_.empty()) add_part(held, heap_.size());
          next_arrival_ = next_arrival;
        });
  }

 private:
  struct Entry {
    int64_t key = 0;
    uint64_t arrival = 0;
    EventTime time = 0;
    uint32_t part = 0;
    uint32_t row = 0;
  };
  // The heap's order: true if a comes after b (std heaps are max-heaps).
  static bool after(const Entry& a, const Entry& b) noexcept {
    return a.key != b.key ? a.key > b.key : a.arrival > b.arrival;
  }

  int64_t key_of(const Batch& b, size_t row) const noexcept {
    if (by_ < 0) return b.event_time[row];
    const Column& c = b.column(static_cast<size_t>(by_));
    return c.type == Type::Double ? ordered_bits(c.doubles[row]) : c.ints[row];
  }

  uint32_t add_part(const Batch& b, size_t live = 0) {
    uint32_t id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
      parts_[id] = b;
      live_[id] = live ? live : b.rows();
    } else {
      id = static_cast<uint32_t>(parts_.size());
      parts_.push_back(b);
      live_.push_back(live ? live : b.rows());
    }
    retained_rows_ += b.rows();
    return id;
  }

  void pop_into_out() {
    std::pop_heap(heap_.begin(), heap_.end(), after);
    out_.push_back(heap_.back());
    heap_.pop_back();
  }

  // The rows `entries` point to, in that order, as one batch.
  Batch gather(const std::vector<Entry>& entries) const {
    Batch b(input_schemas_[0]);
    const size_t m = entries.size();
    rows_.resize(m);
    std::vector<EventTime> times(m);
    std::vector<Seq> seqs(m);
    for (size_t i = 0; i < m; ++i) {
      rows_[i] = entries[i].row;
      times[i] = entries[i].time;
      seqs[i] = parts_.empty() ? 0 : parts_[entries[i].part].seq[entries[i].row];
    }
    b.event_time = std::move(times);
    b.seq = std::move(seqs);
    for (size_t c = 0; c < input_schemas_[0]->size(); ++c) {
      auto col = std::make_shared<Column>(input_schemas_[0]->field(c).type);
      col->reserve(m);
      // Consecutive entries from one part are gathered in one call.
      for (size_t s = 0; s < m;) {
        size_t e = s + 1;
        while (e < m && entries[e].part == entries[s].part) ++e;
        col->gather_from(parts_[entries[s].part].column(c), std::span<const uint32_t>(rows_.data() + s, e - s));
        s = e;
      }
      b.columns.push_back(std::move(col));
    }
    return b;
  }

  void emit_out(Emitter& out) {
    if (out_.empty()) return;
    Batch b = gather(out_);
    for (const auto& e : out_) {
      if (--live_[e.part] == 0) {
        retained_rows_ -= parts_[e.part].rows();
        parts_[e.part] = Batch();
        free_.push_back(e.part);
      }
    }
    out_.clear();
    emit(out, 0, std::move(b));
  }

  // Keeps memory proportional to the rows held: once the kept batches hold
  // mostly rows already emitted, copies the held rows into one batch.
  void maybe_compact() {
    if (retained_rows_ <= 2 * heap_.size() + 4096) return;
    Batch held = gather(heap_);
    parts_.clear();
    live_.clear();
    free_.clear();
    retained_rows_ = 0;
    for (uint32_t i = 0; i < heap_.size(); ++i) {
      heap_[i].part = 0;
      heap_[i].row = i;
    }
    if (!heap_.empty()) add_part(held, heap_.size());
  }

  size_t slack_;
  int by_;  // sort field index, or -1 for event time
  std::vector<Entry> heap_;
  std::vector<Entry> out_;  // rows to emit, in order
  std::vector<Batch> parts_;
  std::vector<size_t> live_;  // held rows per part
  std::vector<uint32_t> free_;
  size_t retained_rows_ = 0;
  uint64_t next_arrival_ = 0;
  mutable std::vector<uint32_t> rows_;
  Batch scratch_;
  std::vector<uint32_t> idx_;
};

}  // namespace

std::unique_ptr<Box> make_bsort(const rapidjson::Value& options, const BoxBuildContext& ctx) {
  detail::OptionReader r(options_of(options), ctx.path + ".options", *ctx.diag);
  const bool inputs_ok = check_input_count(ctx, "bsort", 1, 1);
  bool good = inputs_ok;
  auto slack = r.int64("slack", detail::Need::required, 0, kMaxSlack);
  int by = -1;
  if (auto name = r.string("by", detail::Need::optional); name && inputs_ok) {
    auto idx = ctx.inputs[0]->index_of(*name);
    if (!idx) {
      ctx.diag->error(r.path_of("by"), "unknown field '" + *name + "'; input has (" + ctx.inputs[0]->to_string() + ")");
      good = false;
    } else if (const Type t = ctx.inputs[0]->field(*idx).type; !is_int_repr(t) && t != Type::Double) {
      ctx.diag->error(r.path_of("by"), "bsort sorts by an int64, double or timestamp field, but '" + *name +
                                           "' is " + std::string(type_name(t)));
      good = false;
    } else {
      by = static_cast<int>(*idx);
    }
  }
  r.finish();
  if (!good || !r.ok() || !slack) return nullptr;
  return std::make_unique<BSortBox>(ctx.inputs[0], static_cast<size_t>(*slack), by);
}

}  // namespace entente::engine::boxes
