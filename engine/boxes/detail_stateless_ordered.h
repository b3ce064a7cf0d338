// The box behind union and merge: consumes several same-schema inputs in
// the deterministic order of OrderedInputs and emits what each watermark
// step releases. Private to engine/boxes/.
#pragma once
#if !defined(ENTENTE_IN_ENGINE)
#error "engine/boxes/ is private to engine/ (docs/architecture.md)"
#endif

#include <memory>
#include <string_view>
#include <vector>

#include "engine/boxes/boxes.h"
#include "engine/boxes/detail_stateless_common.h"

namespace entente::engine::boxes {

// Turns the runs of one release step into the batch to emit (merge's
// "combine" mode). A release step hands it every released row in order,
// and every row of one event time within that one step.
class RunCombiner {
 public:
  virtual ~RunCombiner() = default;
  // One run of released rows from `input`, in release order.
  virtual void add(size_t input, const Batch& run) = 0;
  // The output of the step; resets for the next one.
  virtual Batch finish() = 0;
};

// `combiner` null: the released rows themselves are emitted (union).
// REQUIRES: inputs non-empty and all of one schema (checked by factories).
std::unique_ptr<Box> make_ordered_box(std::string_view type, SnapshotTag tag, std::vector<SchemaPtr> inputs,
                                      std::unique_ptr<RunCombiner> combiner);

}  // namespace entente::engine::boxes
