// Machinery shared by the stateless and order-only boxes (filter, map,
// union, split, merge, bsort): input checks at build time, predicate
// routing, late-row filtering and the snapshot envelope. Private to
// engine/boxes/.
#pragma once
#if !defined(ENTENTE_IN_ENGINE)
#error "engine/boxes/ is private to engine/ (docs/architecture.md)"
#endif

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/box.h"
#include "engine/detail/options.h"
#include "engine/expr.h"
#include "engine/serde.h"

namespace entente::engine::boxes {

// Tags written after the base state in every snapshot, so that the bytes of
// one box type are refused by another.
enum class SnapshotTag : uint8_t {
  filter = 0x46,
  map = 0x4d,
  union_ = 0x55,
  split = 0x53,
  merge = 0x47,
  bsort = 0x42,
};

// Most predicates a filter or predicate split accepts: each one costs a pass
// over the rows that are still unrouted.
inline constexpr size_t kMaxPredicates = 64;

// Concatenates strings. Used instead of `"literal" + std::string(x)`, on
// which GCC 12 reports a false -Wrestrict (GCC bug 105329).
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  (s.append(std::string_view(parts)), ...);
  return s;
}

// The options object to read: a JSON null (options left out) reads as an
// empty object.
inline const rapidjson::Value* options_of(const rapidjson::Value& options) {
  return options.IsNull() ? nullptr : &options;
}

// Reports (at ctx.path) unless the box has between `min` and `max` inputs.
bool check_input_count(const BoxBuildContext& ctx, std::string_view type, size_t min,
                       size_t max = std::numeric_limits<size_t>::max());
// Reports (at ctx.path) every input whose schema differs from input 0's.
bool check_same_schemas(const BoxBuildContext& ctx, std::string_view type);

// Reads `key` as an array of 1..kMaxPredicates Bool expressions over
// `input`, reporting each bad one at its own path (`...predicates[2]`).
std::optional<std::vector<Expr>> read_predicates(detail::OptionReader& r, std::string_view key,
                                                 const Schema& input);

// Reads `key` as an array of field names of `input` (at least `min_count`),
// returning their indexes.
std::optional<std::vector<size_t>> read_field_list(detail::OptionReader& r, std::string_view key,
                                                   detail::Need need, const Schema& input,
                                                   size_t min_count);

// Aurora's filter routing: a row goes to the output of the FIRST predicate
// it satisfies; rows that satisfy none go to an extra last output when
// `else_output`, and are dropped otherwise. Keeps its scratch vectors, so
// routing a batch allocates only the output batches.
class PredicateRouter {
 public:
  PredicateRouter(std::vector<Expr> predicates, bool else_output)
      : preds_(std::move(predicates)), else_output_(else_output) {}

  size_t num_outputs() const noexcept { return preds_.size() + (else_output_ ? 1 : 0); }

  // Calls emit(port, Batch) for every output that receives rows, in port
  // order. An output that receives every row gets `b` itself (no copy).
  template <class Emit>
  void route(const Batch& b, Emit&& emit);

 private:
  std::vector<Expr> preds_;
  bool else_output_;
  std::vector<uint32_t> remaining_;
  std::vector<uint32_t> next_;
  std::vector<uint32_t> sel_;
};

template <class Emit>
void PredicateRouter::route(const Batch& b, Emit&& emit) {
  const size_t n = b.rows();
  if (n == 0) return;
  const size_t m = preds_.size();
  // nullptr stands for "every row": the first predicate tests all rows
  // without materialising an index list.
  const std::vector<uint32_t>* candidates = nullptr;
  size_t left = n;
  for (size_t i = 0; i < m && left > 0; ++i) {
    sel_.clear();
    preds_[i].select(b, sel_, candidates);
    if (!sel_.empty()) emit(i, sel_.size() == n ? b : b.take(sel_));
    const bool more = i + 1 < m || else_output_;
    if (!more || sel_.empty()) continue;
    // remaining := candidates \ sel_ (both sorted).
    next_.clear();
    size_t s = 0;
    if (candidates == nullptr) {
      next_.reserve(n - sel_.size());
      for (uint32_t r = 0; r < n; ++r) {
        if (s < sel_.size() && sel_[s] == r) {
          ++s;
          continue;
        }
        next_.push_back(r);
      }
    } else {
      for (uint32_t r : *candidates) {
        if (s < sel_.size() && sel_[s] == r) {
          ++s;
          continue;
        }
        next_.push_back(r);
      }
    }
    remaining_.swap(next_);
    candidates = &remaining_;
    left = remaining_.size();
  }
  if (else_output_ && left > 0) emit(m, candidates == nullptr ? b : b.take(remaining_));
}

// Rows of `b` with event time >= `wm`. Returns `b` itself when none is late;
// otherwise fills `scratch` with the rest and returns it. Adds the number of
// late rows to `late`.
inline const Batch& drop_late(const Batch& b, EventTime wm, uint64_t& late, Batch& scratch,
                              std::vector<uint32_t>& idx) {
  if (wm == kMinTime) return b;
  const size_t n = b.rows();
  const EventTime* t = b.event_time.data();
  size_t n_late = 0;
  for (size_t i = 0; i < n; ++i) n_late += t[i] < wm ? 1 : 0;
  if (n_late == 0) return b;
  late += n_late;
  idx.clear();
  idx.reserve(n - n_late);
  for (uint32_t i = 0; i < n; ++i)
    if (t[i] >= wm) idx.push_back(i);
  scratch = b.take(idx);
  return scratch;
}

// BoxBase plus the snapshot envelope every box here uses:
//   base state | tag byte | the box's own state
// restore_own() first decodes into temporaries and commits only when all
// bytes were consumed, so a refused snapshot leaves the box as it was.
class EnvelopeBoxBase : public BoxBase {
 protected:
  EnvelopeBoxBase(SnapshotTag tag, std::vector<SchemaPtr> inputs, std::vector<SchemaPtr> outputs)
      : BoxBase(std::move(inputs), std::move(outputs)), tag_(tag) {}

  // Writes base state and tag; the caller appends its own state.
  void snapshot_head(std::string& out) const {
    snapshot_base(out);
    ByteWriter(out).u8(static_cast<uint8_t>(tag_));
  }

  // Restores base state, checks the tag, then lets `decode(ByteReader&)`
  // (returning Status) read the box's own state into temporaries; if it
  // succeeds and no bytes are left, `commit()` installs them. On any failure
  // the base state is put back and Errc::corrupt returned.
  template <class Decode, class Commit>
  Status restore_envelope(std::string_view bytes, Decode&& decode, Commit&& commit) {
    std::string backup;
    snapshot_base(backup);
    auto fail = [&](Error e) -> Status {
      std::string_view b = backup;
      (void)restore_base(b);
      return e;
    };
    std::string_view in = bytes;
    Status base = restore_base(in);
    if (!base.ok()) return base;
    ByteReader r(in);
    uint8_t tag = 0;
    if (!r.u8(tag) || tag != static_cast<uint8_t>(tag_))
      return fail(make_error(Errc::corrupt, cat("snapshot is not a ", type(), " box's")));
    Status own = decode(r);
    if (!own.ok()) return fail(own.error());
    if (!r.empty())
      return fail(make_error(Errc::corrupt, "snapshot has " + std::to_string(r.remaining()) +
                                                " trailing bytes"));
    commit();
    return Status::Ok();
  }

 private:
  SnapshotTag tag_;
};

// A single-input box with no state of its own (filter, map): forwards its
// input's watermark, and its snapshot is the envelope alone.
class StatelessBoxBase : public EnvelopeBoxBase {
 public:
  void on_watermark(size_t port, EventTime wm, Emitter& out) override {
    emit_watermark(out, update_input_watermark(port, wm));
  }

  std::string snapshot() const override {
    std::string out;
    snapshot_head(out);
    return out;
  }

  Status restore(std::string_view bytes, const KeyGroupRange* /*keep*/) override {
    return restore_envelope(
        bytes, [](ByteReader&) { return Status::Ok(); }, [] {});
  }

 protected:
  using EnvelopeBoxBase::EnvelopeBoxBase;
};

}  // namespace entente::engine::boxes
