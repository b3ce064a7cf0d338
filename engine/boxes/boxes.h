// Factories of the built-in box types (registered in engine/box_registry.cpp)
// and machinery shared by several boxes. Private to engine/.
#pragma once
#if !defined(ENTENTE_IN_ENGINE)
#error "engine/boxes/ is private to engine/ (docs/architecture.md)"
#endif

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/box.h"

namespace entente::engine::boxes {

// Stateless or order-only boxes (engine/boxes/{filter,map,union,split,merge,bsort}.cpp).
std::unique_ptr<Box> make_filter(const rapidjson::Value& options, const BoxBuildContext& ctx);
std::unique_ptr<Box> make_map(const rapidjson::Value& options, const BoxBuildContext& ctx);
std::unique_ptr<Box> make_union(const rapidjson::Value& options, const BoxBuildContext& ctx);
std::unique_ptr<Box> make_split(const rapidjson::Value& options, const BoxBuildContext& ctx);
std::unique_ptr<Box> make_merge(const rapidjson::Value& options, const BoxBuildContext& ctx);
std::unique_ptr<Box> make_bsort(const rapidjson::Value& options, const BoxBuildContext& ctx);
// Keyed, windowed boxes (engine/boxes/{aggregate,join}.cpp).
std::unique_ptr<Box> make_aggregate(const rapidjson::Value& options, const BoxBuildContext& ctx);
std::unique_ptr<Box> make_join(const rapidjson::Value& options, const BoxBuildContext& ctx);

// Deterministic consumption of several inputs (Borealis' SUnion): buffers
// the rows of each input and releases them, once every input's watermark
// has passed them, ordered by (event time, input index, arrival order
// within the input). The same inputs therefore always give the same
// sequence, however their batches interleaved in time.
class OrderedInputs {
 public:
  explicit OrderedInputs(std::vector<SchemaPtr> inputs);

  void add(size_t input, const Batch& b);
  // Records input's watermark (monotone); returns the minimum over inputs.
  EventTime set_watermark(size_t input, EventTime wm);
  EventTime watermark() const noexcept;
  // Releases, in order, every buffered row with event_time < watermark()
  // (all rows once watermark() == kMaxWatermark). `fn` is called once per
  // maximal run of consecutive released rows from one input.
  void release(const std::function<void(size_t input, const Batch& rows)>& fn);
  // Like release(), but hands each run over as rows [begin, end) of a batch
  // (a buffered one where the input arrived in time order) instead of
  // copying it into a batch of its own; a run that spans several buffered
  // batches comes as one call per batch, in order.
  void release_ranges(const std::function<void(size_t input, const Batch& b, size_t begin, size_t end)>& fn);
  size_t buffered_rows() const noexcept;
  // Input `input`'s own watermark, and the rows it holds (arrival order):
  // what a split box's parts are joined from.
  EventTime watermark(size_t input) const noexcept { return wm_[input]; }
  const std::vector<Batch>& held(size_t input) const noexcept { return buffered_[input]; }

  void snapshot(std::string& out) const;
  Status restore(std::string_view& in);

 private:
  struct Pending;
  // The k-way merge behind release(): run(input, pending, end) for each
  // maximal run, rows [pending.pos, end) of that input's released rows.
  template <class Run>
  void release_runs(Run&& run);
  std::vector<SchemaPtr> schemas_;
  std::vector<EventTime> wm_;
  std::vector<std::vector<Batch>> buffered_;  // per input, arrival order
  uint64_t arrivals_ = 0;
};

}  // namespace entente::engine::boxes
