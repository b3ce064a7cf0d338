// Splitting a fragment of a cut query by key groups (docs/cluster.md,
// "Splitting a fragment"; Aurora*'s box splitting). This is the pure,
// engine-level part: the rewrite of the query network and of its placement
// that replaces one fragment by a router (a split box in hash mode reading
// the fragment's input), one copy of the fragment's boxes per part (each
// owning a contiguous range of key groups) and a deterministic merge (a
// merge box in union mode writing what the fragment wrote), and the
// carrying of the fragment's snapshot to the new fragments. Where they run
// and when the old fragment stops is the broker's business.
//
// Why the output is the same, row for row and in order: the keyed box
// emits, per window end, by key group then first arrival; part i holds the
// contiguous key groups ranges[i] and sees exactly the rows of its groups,
// in their order, with the same watermarks (the router forwards its
// input's); Merge releases by event time, then input index, then arrival,
// so one window's rows come out part 0's first, which are the lowest key
// groups. The boxes after the keyed box are filters and maps keeping the
// event times (row by row), so the order holds through them
// (docs/boxes-windowed.md, "Order").
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/fragments.h"

namespace entente::engine {

// Bounds of a split.
inline constexpr size_t kMinSplitParts = 2;
inline constexpr size_t kMaxSplitParts = 16;

// One part of a split, as the user asked for it.
struct SplitPartSpec {
  std::string node;    // [a-z][a-z0-9-]*, at most 63 (not checked against any node list)
  KeyGroupRange range; // the key groups it owns
};

// The default parts: n equal ranges (KeyGroupRange::part), on `nodes`.
std::vector<SplitPartSpec> equal_split_parts(const std::vector<std::string>& nodes);

// A valid split of one fragment.
struct FragmentSplit {
  std::string fragment;      // the fragment split
  std::string keyed_box;     // its keyed box (an aggregate or a join)
  // The fields the router hashes: the aggregate's group_by, or the join's
  // left_keys (entry_keys[1] its right_keys).
  std::vector<std::string> keys;
  // Per place where rows enter the fragment (one; a join's two sides),
  // the fields its router hashes and the router's box.
  std::vector<std::vector<std::string>> entry_keys;
  std::vector<std::string> router_boxes;  // "<fragment>-router", a join's right side "<fragment>-router1"
  std::vector<SplitPartSpec> parts;
  // The query network with the fragment's boxes replaced (no placement),
  // and the new placement: the other fragments as they were, and in the
  // split fragment's place its router, its parts and its merge.
  std::string network_json;
  QueryNetwork network;
  std::vector<FragmentSpec> placement;
  std::string router_fragment;             // "<fragment>-split", on the fragment's node
  std::vector<std::string> part_fragments; // "<fragment>-0", ... in part order
  std::string merge_fragment;              // "<fragment>-merge", on the fragment's node
  std::string router_box;                  // "<fragment>-router" (router_boxes[0])
  std::string merge_box;                   // "<fragment>-merge"
  // Per part: (box of the fragment, its copy in the part: "<box>-p<i>").
  std::vector<std::vector<std::pair<std::string, std::string>>> part_boxes;
};

// Splits fragment `fragment` of the query network `network_json` (a query
// document; its "placement" member, if any, is ignored) placed by
// `placement` into `parts`. Refuses, each reason to `diag` with a path
// ("$.parts[1].range", "$.boxes[2]") and naming the box:
//   - a fragment whose state is not keyed: no aggregate with a group_by
//     or join, a box that keeps state not partitioned by key (bsort,
//     union, merge, split), an aggregate with a time-out (its output
//     depends on processing time) or count windows (they emit in arrival
//     order);
//   - an aggregate with `top` followed by a filter, or by a map that does
//     not hand the ranked field on as it is: each part keeps its own best
//     groups of a window and the merge (union with the same `top`) ranks
//     them again, which needs the aggregate's rows and ranked field as
//     they were;
//   - a fragment the router cannot feed: more than one keyed box, before
//     the keyed box a box other than a filter or a map handing each key
//     field on as it is ({"name": K, "expr": K}: the router hashes the
//     fragment's input, so the key fields must reach the keyed box as
//     they are), after it a box other than a filter or map, or a map with
//     "event_time" (the merge orders by event time), more than one input
//     port fed from outside the fragment (a join: one per side, each
//     routed by that side's keys), a box before a join feeding both its
//     sides, more than one output port leaving it;
//   - parts: fewer than 2 or more than 16, ranges that overlap, leave a
//     gap, do not start at 0 or end at kKeyGroups, are empty or out of
//     order; a bad node name;
//   - generated names that clash with a box or input id or a fragment, or
//     pass their length limits.
// Deterministic: the same inputs give the same bytes.
Result<FragmentSplit> split_fragment(std::string_view network_json, const std::vector<FragmentSpec>& placement,
                                     std::string_view fragment, const std::vector<SplitPartSpec>& parts,
                                     Diagnostics& diag);

// A snapshot of `to` made from `bytes`, a snapshot of `from` (Executor::
// snapshot): each box named first in `boxes` restored from `from`'s state
// into the box named second in `to` (keyed boxes keeping only `keep`'s key
// groups when given), `to`'s inputs' clocks (max event time seen and
// watermark) taken from `from`'s inputs in order (they must be as many),
// every other box of `to` fresh. A part of a split is made from the
// fragment's snapshot this way (its copies of the boxes, its range), and
// its router (no boxes carried: the router continues the fragment's input
// clock). Errors: a snapshot that does not decode for `from`, an unknown
// box id, boxes of different types, different input counts.
Result<std::string> carry_snapshot(const QueryNetwork& from, std::string_view bytes, const QueryNetwork& to,
                                   const std::vector<std::pair<std::string, std::string>>& boxes,
                                   const KeyGroupRange* keep);

// carry_snapshot for a network that replaces a query's network
// (docs/query-networks.md, "Replacing a running query"): `to`'s input i
// takes its clock from `from`'s input inputs_from[i], or starts fresh
// (nullopt); the inputs may differ in number.
Result<std::string> carry_snapshot(const QueryNetwork& from, std::string_view bytes, const QueryNetwork& to,
                                   const std::vector<std::pair<std::string, std::string>>& boxes,
                                   const std::vector<std::optional<size_t>>& inputs_from);

// A box of `to` whose id `from` has too, compared: the same definition
// means the same type, the same options (as JSON values, member order
// aside) and the same schema on each input port, so that its state in a
// snapshot of `from` means the same in `to`. `why` says what differs.
struct BoxComparison {
  std::string id;
  std::string type;  // in `to`
  bool same = false;
  std::string why;
};
std::vector<BoxComparison> compare_boxes(const QueryNetwork& from, const QueryNetwork& to);

// One part of a split, for join_snapshots: its network, a snapshot of it,
// (box of the fragment, its copy in the part) pairs, its key groups.
struct SnapshotPart {
  const QueryNetwork* network = nullptr;
  std::string_view bytes;
  const std::vector<std::pair<std::string, std::string>>* boxes = nullptr;
  KeyGroupRange range;
};

// The inverse of a split (merging it back): a snapshot of `to`, the
// fragment as it was, from snapshots of its router and its parts taken
// once each part had consumed everything the router sent it. Each box of
// `to` is restored from its copies in the parts (Box::restore_joined: a
// keyed box takes the key groups of each part's range), `to`'s input clocks
// from the router's (as many inputs). Errors: a snapshot that does not
// decode, a box of `to` some part has no copy of, parts whose keyed boxes
// stand at different windows (not drained to one point).
Result<std::string> join_snapshots(const QueryNetwork& to, const QueryNetwork& router, std::string_view router_bytes,
                                   const std::vector<SnapshotPart>& parts);

}  // namespace entente::engine
