// Splitting a fragment by key groups (engine/splits.h): the rewrite of the
// network and placement, every refusal with its path and reason, and
// output identity: a fragment run to the middle of a stream, snapshotted,
// split into parts restored from that snapshot by key-group range (behind
// a router that continues the fragment's input clock) and recombined by a
// merge gives, after the rows the fragment had produced, exactly the rows
// the whole query gives (values and event times, in order), through the
// internal-stream encoding the broker logs between fragments.
#include "engine/splits.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "engine/codec.h"
#include "engine/network.h"
#include "tests/engine/fragment_chain.h"

namespace entente::engine {
namespace {

// bids -> keep (filter) -> counts (sliding aggregate per auction) -> shape (map) -> out
const char* kQ5 = R"({
  "name": "q5",
  "inputs": [{"name": "bids", "schema": [{"name": "auction", "type": "int64"}, {"name": "price", "type": "int64"},
                                        {"name": "date_time", "type": "timestamp"}],
              "event_time": "date_time", "watermark_lag": "200ms"}],
  "boxes": [
    {"id": "keep", "type": "filter", "options": {"predicates": ["price > 10"], "drop_unmatched": true}},
    {"id": "counts", "type": "aggregate", "options": {"group_by": ["auction"],
        "window": {"type": "sliding", "size": "2s", "slide": "500ms"},
        "aggregates": [{"fn": "count", "as": "n"}, {"fn": "max", "field": "price", "as": "top"}]}},
    {"id": "shape", "type": "filter", "options": {"predicates": ["n > 1"], "drop_unmatched": true}},
    {"id": "cents", "type": "map", "options": {"fields": [{"name": "auction", "expr": "auction"},
        {"name": "n", "expr": "n"}, {"name": "top_cents", "expr": "top * 100"}]}}
  ],
  "arcs": [{"from": "bids", "to": "keep"}, {"from": "keep", "to": "counts"}, {"from": "counts", "to": "shape"},
           {"from": "shape", "to": "cents"}],
  "outputs": [{"name": "out", "from": "cents"}]
})";

const std::vector<FragmentSpec> kPlacement = {{"pre", "n1", {"keep"}}, {"agg", "n2", {"counts", "shape", "cents"}}};

// NEXMark q5's shape: the aggregate keeps per window only the auctions
// with the most bids (`top`, RANK() <= k: ties stay), a map after it.
std::string top_query(int k) {
  return R"({
  "name": "q5",
  "inputs": [{"name": "bids", "schema": [{"name": "auction", "type": "int64"}, {"name": "price", "type": "int64"},
                                        {"name": "date_time", "type": "timestamp"}],
              "event_time": "date_time", "watermark_lag": "200ms"}],
  "boxes": [
    {"id": "keep", "type": "filter", "options": {"predicates": ["price > 10"], "drop_unmatched": true}},
    {"id": "counts", "type": "aggregate", "options": {"group_by": ["auction"],
        "window": {"type": "sliding", "size": "2s", "slide": "500ms"},
        "aggregates": [{"fn": "count", "as": "n"}, {"fn": "max", "field": "price", "as": "top"}],
        "top": {"by": "n", "k": )" + std::to_string(k) + R"(}}},
    {"id": "cents", "type": "map", "options": {"fields": [{"name": "auction", "expr": "auction"},
        {"name": "n", "expr": "n"}, {"name": "top_cents", "expr": "top * 100"}]}}
  ],
  "arcs": [{"from": "bids", "to": "keep"}, {"from": "keep", "to": "counts"}, {"from": "counts", "to": "cents"}],
  "outputs": [{"name": "out", "from": "cents"}]
})";
}

const std::vector<FragmentSpec> kTopPlacement = {{"pre", "n1", {"keep"}}, {"agg", "n2", {"counts", "cents"}}};

QueryNetwork parse_ok(const std::string& json) {
  Diagnostics diag;
  auto net = QueryNetwork::parse(json, diag);
  EXPECT_TRUE(net.ok()) << (net.ok() ? "" : net.error().message);
  return std::move(net).value();
}

// Bids over 40 auctions, 10 ms of event time apart, up to 200 ms late.
std::vector<Batch> make_bids(size_t batches, size_t rows) {
  auto schema = make_schema({{"auction", Type::Int64}, {"price", Type::Int64}, {"date_time", Type::Timestamp}});
  std::vector<Batch> out;
  uint64_t x = 7;
  auto next = [&x] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  };
  for (size_t k = 0; k < batches; ++k) {
    BatchBuilder bb(schema);
    for (size_t r = 0; r < rows; ++r) {
      const auto i = static_cast<int64_t>(k * rows + r);
      bb.column(0).ints.push_back(static_cast<int64_t>(next() % 40));
      bb.column(1).ints.push_back(static_cast<int64_t>(next() % 100));
      bb.column(2).ints.push_back(1'000'000 + i * 10 - static_cast<int64_t>(next() % 20) * 10);
      bb.event_time().push_back(0);
      bb.seq().push_back(0);
    }
    out.push_back(bb.finish());
  }
  return out;
}

// Rows as the broker's output log shows them: values and event times (its
// sequence numbers are the log's, not the boxes').
std::vector<std::string> rows_of(const std::vector<Batch>& batches) {
  std::vector<std::string> rows;
  for (const Batch& b : batches)
    for (size_t r = 0; r < b.rows(); ++r) {
      std::string line = "t=" + std::to_string(b.event_time[r]) + " ";
      for (size_t c = 0; c < b.columns.size(); ++c) line += std::to_string(b.columns[c]->ints[r]) + ",";
      rows.push_back(std::move(line));
    }
  return rows;
}

// One fragment's executor run as a broker runner runs it: its internal
// inputs fed from logged records (rows after their watermark, marks), its
// internal outputs logged the same way, its query outputs collected.
class Stage {
 public:
  explicit Stage(const FragmentPlan& plan) : plan_(plan) {
    auto made = Executor::create(plan.network, [this](size_t o, const Batch& b) { on_output(o, b); });
    EXPECT_TRUE(made.ok());
    ex_ = std::move(made).value();
  }
  Status restore(const std::string& bytes) {
    ENTENTE_RETURN_IF_ERROR(ex_->restore(bytes));
    // As the runner does after a restore: what its logs hold already ends
    // at the restored watermark.
    for (size_t o = 0; o < plan_.network.outputs().size(); ++o)
      if (internal(o)) stream(o).last = ex_->output_watermark(o);
    return Status::Ok();
  }
  Executor& executor() { return *ex_; }

  // Feeds records [from, to) of an internal stream to input `name`.
  void feed(const std::string& name, const std::vector<Batch>& records, size_t from, size_t to) {
    const size_t in = *plan_.network.input_index(name);
    for (size_t i = from; i < to && i < records.size(); ++i) {
      push_internal(*ex_, in, plan_.network.inputs()[in].schema, records[i]);
      write_marks();
    }
  }
  // Query input batches.
  void push(const std::string& name, const Batch& b) {
    ex_->push(*plan_.network.input_index(name), b);
    write_marks();
  }
  void finish() {
    ex_->finish();
    write_marks();
  }
  // What it logged on internal stream `name`, as records of up to three
  // writes each (a runner's flush concatenates).
  std::vector<Batch> records(const std::string& name) {
    auto& s = streams_[name];
    std::vector<Batch> out;
    for (size_t i = 0; i < s.writes.size(); i += 3) {
      const size_t end = std::min(i + 3, s.writes.size());
      out.push_back(concat(s.schema, std::span<const Batch>(s.writes.data() + i, end - i)));
    }
    return out;
  }
  const std::vector<Batch>& output(const std::string& name) { return outputs_[name]; }

 private:
  struct Stream {
    SchemaPtr schema;
    EventTime last = kMinTime;
    std::vector<Batch> writes;
  };
  bool internal(size_t o) const {
    const auto& w = plan_.writes;
    return std::find(w.begin(), w.end(), plan_.network.outputs()[o].name) != w.end();
  }
  Stream& stream(size_t o) {
    Stream& s = streams_[plan_.network.outputs()[o].name];
    if (!s.schema) s.schema = internal_stream_schema(*plan_.network.outputs()[o].schema);
    return s;
  }
  void on_output(size_t o, const Batch& b) {
    if (!internal(o)) {
      outputs_[plan_.network.outputs()[o].name].push_back(b);
      return;
    }
    Stream& s = stream(o);
    s.last = ex_->output_watermark(o);
    s.writes.push_back(internal_rows(s.schema, b, s.last));
  }
  void write_marks() {
    for (size_t o = 0; o < plan_.network.outputs().size(); ++o) {
      if (!internal(o)) continue;
      Stream& s = stream(o);
      if (const EventTime wm = ex_->output_watermark(o); wm > s.last) {
        s.writes.push_back(internal_mark(s.schema, wm));
        s.last = wm;
      }
    }
  }
  const FragmentPlan& plan_;
  std::unique_ptr<Executor> ex_;
  std::map<std::string, Stream> streams_;
  std::map<std::string, std::vector<Batch>> outputs_;
};

const FragmentPlan& plan_of(const QueryCut& cut, const std::string& name) {
  for (const auto& f : cut.fragments)
    if (f.name == name) return f;
  throw std::out_of_range("no fragment " + name);
}

QueryCut cut_ok(const QueryNetwork& net, const std::vector<FragmentSpec>& specs) {
  Diagnostics diag;
  auto cut = cut_query(net, specs, diag, /*connected=*/false);  // a split join's router is not
  EXPECT_TRUE(cut.ok()) << (cut.ok() ? "" : cut.error().message);
  return std::move(cut).value();
}

FragmentSplit split_ok(const std::string& json, const std::vector<FragmentSpec>& placement, const std::string& f,
                       const std::vector<SplitPartSpec>& parts) {
  Diagnostics diag;
  auto s = split_fragment(json, placement, f, parts, diag);
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  return std::move(s).value();
}

// `json` with its first `from` replaced by `to`.
std::string with_box(std::string json, const std::string& from, const std::string& to) {
  const auto at = json.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return json.replace(at, from.size(), to);
}

// The whole query's output; the "pre" fragment's internal stream (the
// split fragment's input); the rows the unsplit "agg" fragment gives before
// record `at` and its snapshot there.
struct Midstream {
  std::vector<std::string> whole;
  std::string input;            // the internal stream "agg" reads
  std::vector<Batch> records;   // what "pre" logged on it
  std::vector<std::string> before;
  std::vector<std::string> unsplit_after;
  std::string snapshot;
};

Midstream run_to_middle(const QueryNetwork& net, const QueryCut& cut, const std::vector<Batch>& bids, size_t at) {
  Midstream m;
  {
    auto ex = Executor::create(net, [&](size_t, const Batch& b) {
      for (auto& r : rows_of({b})) m.whole.push_back(r);
    });
    for (const Batch& b : bids) (*ex)->push(0, b);
    (*ex)->finish();
  }
  Stage pre(plan_of(cut, "pre"));
  for (const Batch& b : bids) pre.push("bids", b);
  pre.finish();
  const FragmentPlan& agg_plan = plan_of(cut, "agg");
  m.input = agg_plan.reads.at(0);
  m.records = pre.records(m.input);
  Stage agg(agg_plan);
  agg.feed(m.input, m.records, 0, at);
  m.before = rows_of(agg.output("out"));
  m.snapshot = agg.executor().snapshot();
  agg.feed(m.input, m.records, at, m.records.size());
  agg.finish();
  const auto all = rows_of(agg.output("out"));
  m.unsplit_after.assign(all.begin() + static_cast<std::ptrdiff_t>(m.before.size()), all.end());
  return m;
}

// Runs the split from the middle: router and parts restored from the
// unsplit fragment's snapshot, fed the rest of its input; the merge's rows.
std::vector<std::string> run_split(const QueryNetwork& net, const FragmentSplit& split, const Midstream& m,
                                   size_t at, const std::vector<FragmentSpec>& placement = kPlacement) {
  const QueryCut cut = cut_ok(split.network, split.placement);
  const QueryCut unsplit = cut_ok(net, placement);
  const QueryNetwork& agg_net = plan_of(unsplit, "agg").network;
  Stage router(plan_of(cut, split.router_fragment));
  auto rs = carry_snapshot(agg_net, m.snapshot, plan_of(cut, split.router_fragment).network, {}, nullptr);
  EXPECT_TRUE(rs.ok()) << (rs.ok() ? "" : rs.error().message);
  EXPECT_TRUE(router.restore(*rs).ok());
  router.feed(m.input, m.records, at, m.records.size());
  router.finish();
  Stage merge(plan_of(cut, split.merge_fragment));
  for (size_t i = 0; i < split.parts.size(); ++i) {
    const FragmentPlan& plan = plan_of(cut, split.part_fragments[i]);
    Stage part(plan);
    auto ps = carry_snapshot(agg_net, m.snapshot, plan.network, split.part_boxes[i], &split.parts[i].range);
    EXPECT_TRUE(ps.ok()) << (ps.ok() ? "" : ps.error().message);
    EXPECT_TRUE(part.restore(*ps).ok());
    const std::string in = plan.reads.at(0);
    auto recs = router.records(in);
    part.feed(in, recs, 0, recs.size());
    part.finish();
    const std::string out = plan.writes.at(0);
    auto outs = part.records(out);
    merge.feed(out, outs, 0, outs.size());
  }
  merge.finish();
  return rows_of(merge.output("out"));
}

// Split at record `at`, merged back at record `back`: the router fed up to
// there, every part and the merge fed all the router and the parts wrote;
// then the fragment, restored from the parts' joined states and the
// router's input clock, runs the rest. The rows of the merge, then of the
// fragment.
std::vector<std::string> run_split_and_merge(const QueryNetwork& net, const FragmentSplit& split, const Midstream& m,
                                             size_t at, size_t back,
                                             const std::vector<FragmentSpec>& placement = kPlacement) {
  const QueryCut cut = cut_ok(split.network, split.placement);
  const QueryCut unsplit = cut_ok(net, placement);
  const FragmentPlan& agg = plan_of(unsplit, "agg");
  const FragmentPlan& router_plan = plan_of(cut, split.router_fragment);
  Stage router(router_plan);
  auto rs = carry_snapshot(agg.network, m.snapshot, router_plan.network, {}, nullptr);
  EXPECT_TRUE(rs.ok()) << (rs.ok() ? "" : rs.error().message);
  EXPECT_TRUE(router.restore(*rs).ok());
  router.feed(m.input, m.records, at, back);
  Stage merge(plan_of(cut, split.merge_fragment));
  std::vector<std::unique_ptr<Stage>> parts;
  std::vector<std::string> part_snapshots;
  for (size_t i = 0; i < split.parts.size(); ++i) {
    const FragmentPlan& plan = plan_of(cut, split.part_fragments[i]);
    auto& part = *parts.emplace_back(std::make_unique<Stage>(plan));
    auto ps = carry_snapshot(agg.network, m.snapshot, plan.network, split.part_boxes[i], &split.parts[i].range);
    EXPECT_TRUE(ps.ok()) << (ps.ok() ? "" : ps.error().message);
    EXPECT_TRUE(part.restore(*ps).ok());
    auto recs = router.records(plan.reads.at(0));
    part.feed(plan.reads.at(0), recs, 0, recs.size());
    auto outs = part.records(plan.writes.at(0));
    merge.feed(plan.writes.at(0), outs, 0, outs.size());
    part_snapshots.push_back(part.executor().snapshot());
  }
  std::vector<SnapshotPart> sp;
  for (size_t i = 0; i < split.parts.size(); ++i)
    sp.push_back({&plan_of(cut, split.part_fragments[i]).network, part_snapshots[i], &split.part_boxes[i],
                  split.parts[i].range});
  auto joined = join_snapshots(agg.network, router_plan.network, router.executor().snapshot(), sp);
  EXPECT_TRUE(joined.ok()) << (joined.ok() ? "" : joined.error().message);
  std::vector<std::string> rows = rows_of(merge.output("out"));
  Stage again(agg);
  EXPECT_TRUE(again.restore(*joined).ok());
  again.feed(m.input, m.records, back, m.records.size());
  again.finish();
  for (auto& r : rows_of(again.output("out"))) rows.push_back(r);
  return rows;
}

TEST(SplitFragment, RewritesTheNetworkAndPlacement) {
  const auto split = split_ok(kQ5, kPlacement, "agg", equal_split_parts({"n2", "n3"}));
  EXPECT_EQ(split.keyed_box, "counts");
  EXPECT_EQ(split.keys, std::vector<std::string>{"auction"});
  EXPECT_EQ(split.router_fragment, "agg-split");
  EXPECT_EQ(split.merge_fragment, "agg-merge");
  EXPECT_EQ(split.part_fragments, (std::vector<std::string>{"agg-0", "agg-1"}));
  ASSERT_EQ(split.placement.size(), 5u);
  EXPECT_EQ(split.placement[0].name, "pre");
  EXPECT_EQ(split.placement[1].name, "agg-split");
  EXPECT_EQ(split.placement[1].node, "n2");
  EXPECT_EQ(split.placement[2].node, "n2");
  EXPECT_EQ(split.placement[3].node, "n3");
  EXPECT_EQ(split.placement[3].boxes, (std::vector<std::string>{"counts-p1", "shape-p1", "cents-p1"}));
  EXPECT_EQ(split.placement[4].name, "agg-merge");
  EXPECT_EQ(split.placement[4].node, "n2");
  // The router hashes the key into the parts' ranges; the output comes
  // from the merge.
  EXPECT_NE(split.network_json.find(R"({"id":"agg-router","type":"split","options":{"mode":"hash","keys":["auction"],)"
                                    R"("ranges":[[0,64],[64,128]]})"),
            std::string::npos)
      << split.network_json;
  EXPECT_NE(split.network_json.find(R"({"name":"out","from":"agg-merge"})"), std::string::npos);
  EXPECT_EQ(split.network.outputs().size(), 1u);
  // Deterministic.
  EXPECT_EQ(split_ok(kQ5, kPlacement, "agg", equal_split_parts({"n2", "n3"})).network_json, split.network_json);
}

TEST(SplitFragment, TheOutputAfterASplitMidstreamIsTheWholeQuerys) {
  const QueryNetwork net = parse_ok(kQ5);
  const QueryCut cut = cut_ok(net, kPlacement);
  const auto bids = make_bids(60, 50);
  for (size_t at : {size_t{0}, size_t{7}, size_t{23}}) {
    const Midstream m = run_to_middle(net, cut, bids, at);
    ASSERT_GT(m.whole.size(), 100u);
    // The unsplit fragment, for reference: before + after = whole.
    std::vector<std::string> unsplit = m.before;
    unsplit.insert(unsplit.end(), m.unsplit_after.begin(), m.unsplit_after.end());
    ASSERT_EQ(unsplit, m.whole);
    if (at > 0) {
      EXPECT_FALSE(m.before.empty()) << at;
    }
    ASSERT_FALSE(m.unsplit_after.empty()) << at;
    for (const auto& parts : std::vector<std::vector<SplitPartSpec>>{
             equal_split_parts({"n2", "n3"}),
             equal_split_parts({"n1", "n2", "n3"}),
             {{"n1", {0, 5}}, {"n2", {5, 100}}, {"n3", {100, 127}}, {"n1", {127, 128}}}}) {
      const FragmentSplit split = split_ok(kQ5, kPlacement, "agg", parts);
      const auto after = run_split(net, split, m, at);
      std::vector<std::string> got = m.before;
      got.insert(got.end(), after.begin(), after.end());
      ASSERT_EQ(got.size(), m.whole.size()) << "split at record " << at << " into " << parts.size();
      for (size_t r = 0; r < got.size(); ++r)
        ASSERT_EQ(got[r], m.whole[r]) << "row " << r << ", split at record " << at << " into " << parts.size();
    }
  }
}

TEST(SplitFragment, MergedBackMidstreamTheOutputIsStillTheWholeQuerys) {
  const QueryNetwork net = parse_ok(kQ5);
  const QueryCut cut = cut_ok(net, kPlacement);
  const auto bids = make_bids(60, 50);
  for (auto [at, back] : std::vector<std::pair<size_t, size_t>>{{0, 10}, {7, 30}, {23, 24}, {23, 40}}) {
    const Midstream m = run_to_middle(net, cut, bids, at);
    ASSERT_LT(back, m.records.size());
    for (const auto& parts : std::vector<std::vector<SplitPartSpec>>{
             equal_split_parts({"n2", "n3"}), {{"n1", {0, 5}}, {"n2", {5, 100}}, {"n3", {100, 128}}}}) {
      const FragmentSplit split = split_ok(kQ5, kPlacement, "agg", parts);
      const auto after = run_split_and_merge(net, split, m, at, back);
      std::vector<std::string> got = m.before;
      got.insert(got.end(), after.begin(), after.end());
      ASSERT_EQ(got.size(), m.whole.size()) << "split at " << at << ", merged at " << back;
      for (size_t r = 0; r < got.size(); ++r)
        ASSERT_EQ(got[r], m.whole[r]) << "row " << r << ", split at " << at << ", merged at " << back;
    }
  }
}

// q5's shape: each part keeps its own best auctions of a window, the
// merge ranks them again; ties (k = 1 keeps every auction tied at the
// most bids) and k > 1 alike.
TEST(SplitFragment, AnAggregateWithTopSplitAndMergedBackMidstreamGivesTheWholeQuerysRows) {
  const auto bids = make_bids(120, 50);
  for (int k : {1, 3}) {
    const std::string json = top_query(k);
    const QueryNetwork net = parse_ok(json);
    const QueryCut cut = cut_ok(net, kTopPlacement);
    for (size_t at : {size_t{0}, size_t{9}, size_t{23}}) {
      const Midstream m = run_to_middle(net, cut, bids, at);
      ASSERT_GT(m.whole.size(), k == 1 ? 150u : 500u);  // 115 windows
      for (const auto& parts : std::vector<std::vector<SplitPartSpec>>{
               equal_split_parts({"n2", "n3"}), {{"n1", {0, 5}}, {"n2", {5, 100}}, {"n3", {100, 128}}}}) {
        const FragmentSplit split = split_ok(json, kTopPlacement, "agg", parts);
        EXPECT_NE(split.network_json.find(R"("type":"merge","options":{"top":{"by":"n","k":)" + std::to_string(k)),
                  std::string::npos)
            << split.network_json;
        std::vector<std::string> got = m.before;
        const auto after = run_split(net, split, m, at, kTopPlacement);
        got.insert(got.end(), after.begin(), after.end());
        ASSERT_EQ(got, m.whole) << "k " << k << ", split at record " << at << " into " << parts.size();
        got = m.before;
        const auto merged = run_split_and_merge(net, split, m, at, at + 11, kTopPlacement);
        got.insert(got.end(), merged.begin(), merged.end());
        ASSERT_EQ(got, m.whole) << "k " << k << ", split at " << at << ", merged at " << at + 11;
      }
    }
  }
}

// The merge's `top` itself: per event time, RANK() <= k over all inputs,
// in release order.
TEST(MergeTop, KeepsPerEventTimeTheRowsRankedAmongTheBestKOfAllInputs) {
  const std::string json = R"({
  "name": "m",
  "inputs": [{"name": "a", "schema": [{"name": "id", "type": "int64"}, {"name": "v", "type": "double"},
                                     {"name": "t", "type": "timestamp"}], "event_time": "t"},
             {"name": "b", "schema": [{"name": "id", "type": "int64"}, {"name": "v", "type": "double"},
                                     {"name": "t", "type": "timestamp"}], "event_time": "t"}],
  "boxes": [{"id": "m", "type": "merge", "options": {"top": {"by": "v", "k": 2}}}],
  "arcs": [{"from": "a", "to": "m.0"}, {"from": "b", "to": "m.1"}],
  "outputs": [{"name": "out", "from": "m"}]
})";
  const QueryNetwork net = parse_ok(json);
  std::vector<std::string> rows;
  auto ex = Executor::create(net, [&](size_t, const Batch& b) {
    for (size_t r = 0; r < b.rows(); ++r)
      rows.push_back(std::to_string(b.event_time[r]) + ":" + std::to_string(b.columns[0]->ints[r]));
  });
  ASSERT_TRUE(ex.ok());
  auto schema = make_schema({{"id", Type::Int64}, {"v", Type::Double}, {"t", Type::Timestamp}});
  auto batch = [&](std::vector<std::tuple<int64_t, double, int64_t>> rs) {
    BatchBuilder bb(schema);
    for (auto [id, v, t] : rs) {
      bb.column(0).ints.push_back(id);
      bb.column(1).doubles.push_back(v);
      bb.column(2).ints.push_back(t);
      bb.event_time().push_back(t);
      bb.seq().push_back(0);
    }
    return bb.finish();
  };
  const double nan = std::nan("");
  // t=10: a has 5, 9, NaN; b has 9, 7: the best two are 9 and 9 (ids 2,
  // 11); 7 has two above it. t=20: a has NaN alone, b has 1: 1 and NaN
  // (fewer than 2 above each).
  (*ex)->push(0, batch({{1, 5, 10}, {2, 9, 10}, {3, nan, 10}, {4, nan, 20}}));
  (*ex)->push(1, batch({{11, 9, 10}, {12, 7, 10}, {13, 1, 20}}));
  (*ex)->finish();
  EXPECT_EQ(rows, (std::vector<std::string>{"10:2", "10:11", "20:4", "20:13"}));
  // Refused: a string field, an unknown one, with combine.
  for (const auto& [from, to, says] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {R"("by": "v")", R"("by": "w")", "$.boxes[0].options.top.by: unknown field 'w'"},
           {R"("top")", R"("mode": "combine", "aggregates": [{"field": "v", "fn": "sum"}], "top")",
            "$.boxes[0].options.top: 'top' applies only to mode \"union\""}}) {
    Diagnostics diag;
    auto bad = QueryNetwork::parse(with_box(json, from, to), diag);
    EXPECT_FALSE(bad.ok());
    EXPECT_NE(diag.to_string().find(says), std::string::npos) << diag.to_string();
  }
}

// NEXMark q8's shape: persons and auctions, each projected (the key handed
// on), joined on person id = seller in 50 ms tumbling windows.
const char* kNewUsers = R"({
  "name": "q8",
  "inputs": [{"name": "persons", "schema": [{"name": "id", "type": "int64"}, {"name": "name", "type": "int64"},
                                          {"name": "t", "type": "timestamp"}], "event_time": "t", "watermark_lag": 20},
             {"name": "auctions", "schema": [{"name": "seller", "type": "int64"}, {"name": "reserve", "type": "int64"},
                                           {"name": "t", "type": "timestamp"}], "event_time": "t", "watermark_lag": 20}],
  "boxes": [
    {"id": "people", "type": "map", "options": {"fields": [{"name": "id", "expr": "id"}, {"name": "name", "expr": "name"}]}},
    {"id": "sellers", "type": "map", "options": {"fields": [{"name": "seller", "expr": "seller"},
        {"name": "reserve", "expr": "reserve * 10"}]}},
    {"id": "new_users", "type": "join", "options": {"left_keys": ["id"], "right_keys": ["seller"],
        "window": {"type": "tumbling", "size": 50}, "fields": ["id", "name", "reserve"]}}
  ],
  "arcs": [{"from": "persons", "to": "people"}, {"from": "auctions", "to": "sellers"},
           {"from": "people", "to": "new_users.0"}, {"from": "sellers", "to": "new_users.1"}],
  "outputs": [{"name": "out", "from": "new_users"}]
})";

const std::vector<FragmentSpec> kJoinPlacement = {{"all", "n1", {"people", "sellers", "new_users"}}};

// Step k: persons and auctions over 40 ids, several rows per millisecond,
// up to 10 ms late.
std::vector<std::pair<Batch, Batch>> make_people_and_auctions(size_t steps) {
  auto ps = make_schema({{"id", Type::Int64}, {"name", Type::Int64}, {"t", Type::Timestamp}});
  auto as = make_schema({{"seller", Type::Int64}, {"reserve", Type::Int64}, {"t", Type::Timestamp}});
  uint64_t x = 11;
  auto next = [&x] {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x >> 33;
  };
  std::vector<std::pair<Batch, Batch>> out;
  for (size_t k = 0; k < steps; ++k) {
    BatchBuilder p(ps), a(as);
    for (size_t r = 0; r < 12; ++r) {
      const auto t = static_cast<int64_t>(k * 4 + r / 4) - static_cast<int64_t>(next() % 3) * 5;
      BatchBuilder& b = r % 3 == 0 ? p : a;
      b.column(0).ints.push_back(static_cast<int64_t>(next() % 40));
      b.column(1).ints.push_back(static_cast<int64_t>(k * 100 + r));
      b.column(2).ints.push_back(1000 + t);
      b.event_time().push_back(0);
      b.seq().push_back(0);
    }
    out.emplace_back(p.finish(), a.finish());
  }
  return out;
}

// The join fragment split at step `at` (and merged back at step `back`,
// if not 0) against the whole query: the rows of the unsplit fragment up
// to `at`, of the merge, then of the fragment again.
void expect_join_split_gives_the_whole_querys_rows(const std::vector<std::pair<Batch, Batch>>& steps, size_t at,
                                                   size_t back, const std::vector<SplitPartSpec>& parts) {
  const QueryNetwork net = parse_ok(kNewUsers);
  std::vector<std::string> whole;
  {
    auto ex = Executor::create(net, [&](size_t, const Batch& b) {
      for (auto& r : rows_of({b})) whole.push_back(r);
    });
    for (const auto& [p, a] : steps) {
      (*ex)->push(0, p);
      (*ex)->push(1, a);
    }
    (*ex)->finish();
  }
  ASSERT_GT(whole.size(), 200u);
  const QueryCut unsplit = cut_ok(net, kJoinPlacement);
  const FragmentPlan& all = plan_of(unsplit, "all");
  Stage first(all);
  for (size_t k = 0; k < at; ++k) {
    first.push("persons", steps[k].first);
    first.push("auctions", steps[k].second);
  }
  std::vector<std::string> got = rows_of(first.output("out"));
  const std::string snapshot = first.executor().snapshot();

  const FragmentSplit split = split_ok(kNewUsers, kJoinPlacement, "all", parts);
  EXPECT_EQ(split.router_boxes, (std::vector<std::string>{"all-router", "all-router1"}));
  EXPECT_EQ(split.entry_keys, (std::vector<std::vector<std::string>>{{"id"}, {"seller"}}));
  const QueryCut cut = cut_ok(split.network, split.placement);
  const FragmentPlan& router_plan = plan_of(cut, split.router_fragment);
  Stage router(router_plan);
  auto rs = carry_snapshot(all.network, snapshot, router_plan.network, {}, nullptr);
  ASSERT_TRUE(rs.ok()) << rs.error().message;
  ASSERT_TRUE(router.restore(*rs).ok());
  const size_t stop = back == 0 ? steps.size() : back;
  for (size_t k = at; k < stop; ++k) {
    router.push("persons", steps[k].first);
    router.push("auctions", steps[k].second);
  }
  if (back == 0) router.finish();
  Stage merge(plan_of(cut, split.merge_fragment));
  std::vector<std::unique_ptr<Stage>> part_stages;
  std::vector<std::string> part_snapshots;
  for (size_t i = 0; i < split.parts.size(); ++i) {
    const FragmentPlan& plan = plan_of(cut, split.part_fragments[i]);
    EXPECT_EQ(plan.reads.size(), 2u);
    auto& part = *part_stages.emplace_back(std::make_unique<Stage>(plan));
    auto ps = carry_snapshot(all.network, snapshot, plan.network, split.part_boxes[i], &split.parts[i].range);
    ASSERT_TRUE(ps.ok()) << ps.error().message;
    ASSERT_TRUE(part.restore(*ps).ok());
    for (const std::string& in : plan.reads) {
      auto recs = router.records(in);
      part.feed(in, recs, 0, recs.size());
    }
    if (back == 0) part.finish();
    auto outs = part.records(plan.writes.at(0));
    merge.feed(plan.writes.at(0), outs, 0, outs.size());
    part_snapshots.push_back(part.executor().snapshot());
  }
  if (back == 0) merge.finish();
  for (auto& r : rows_of(merge.output("out"))) got.push_back(r);
  if (back != 0) {
    std::vector<SnapshotPart> sp;
    for (size_t i = 0; i < split.parts.size(); ++i)
      sp.push_back({&plan_of(cut, split.part_fragments[i]).network, part_snapshots[i], &split.part_boxes[i],
                    split.parts[i].range});
    auto joined = join_snapshots(all.network, router_plan.network, router.executor().snapshot(), sp);
    ASSERT_TRUE(joined.ok()) << joined.error().message;
    Stage again(all);
    ASSERT_TRUE(again.restore(*joined).ok());
    for (size_t k = back; k < steps.size(); ++k) {
      again.push("persons", steps[k].first);
      again.push("auctions", steps[k].second);
    }
    again.finish();
    for (auto& r : rows_of(again.output("out"))) got.push_back(r);
  }
  ASSERT_EQ(got.size(), whole.size()) << "split at " << at << ", merged at " << back;
  for (size_t r = 0; r < got.size(); ++r)
    ASSERT_EQ(got[r], whole[r]) << "row " << r << ", split at " << at << ", merged at " << back;
}

// q8's shape: a join split by key group (each side routed by its own key)
// and merged back mid-stream gives the whole query's rows in its order.
TEST(SplitFragment, AJoinSplitAndMergedBackMidstreamGivesTheWholeQuerysRows) {
  const auto steps = make_people_and_auctions(300);
  for (const auto& parts : std::vector<std::vector<SplitPartSpec>>{
           equal_split_parts({"n2", "n3"}), {{"n1", {0, 5}}, {"n2", {5, 100}}, {"n3", {100, 128}}}})
    for (auto [at, back] : std::vector<std::pair<size_t, size_t>>{{0, 0}, {37, 0}, {150, 0}, {37, 90}, {150, 151}}) {
      SCOPED_TRACE("split at " + std::to_string(at) + ", back at " + std::to_string(back) + ", parts " +
                   std::to_string(parts.size()));
      ASSERT_NO_FATAL_FAILURE(expect_join_split_gives_the_whole_querys_rows(steps, at, back, parts));
    }
}

TEST(SplitFragment, JoiningRefusesPartsNotDrainedToOnePoint) {
  const QueryNetwork net = parse_ok(kQ5);
  const QueryCut cut = cut_ok(net, kPlacement);
  const auto bids = make_bids(40, 50);
  const Midstream early = run_to_middle(net, cut, bids, 5);
  const Midstream late = run_to_middle(net, cut, bids, 30);
  const FragmentSplit split = split_ok(kQ5, kPlacement, "agg", equal_split_parts({"n2", "n3"}));
  const QueryCut scut = cut_ok(split.network, split.placement);
  const QueryNetwork& agg = plan_of(cut, "agg").network;
  const QueryNetwork& router = plan_of(scut, split.router_fragment).network;
  std::vector<std::string> snaps;
  for (size_t i = 0; i < 2; ++i) {
    auto ps = carry_snapshot(agg, (i == 0 ? early : late).snapshot, plan_of(scut, split.part_fragments[i]).network,
                             split.part_boxes[i], &split.parts[i].range);
    ASSERT_TRUE(ps.ok());
    snaps.push_back(*ps);
  }
  auto rs = carry_snapshot(agg, late.snapshot, router, {}, nullptr);
  ASSERT_TRUE(rs.ok());
  std::vector<SnapshotPart> sp;
  for (size_t i = 0; i < 2; ++i)
    sp.push_back({&plan_of(scut, split.part_fragments[i]).network, snaps[i], &split.part_boxes[i],
                  split.parts[i].range});
  auto joined = join_snapshots(agg, router, *rs, sp);
  ASSERT_FALSE(joined.ok());
  EXPECT_NE(joined.error().message.find("stand at different windows"), std::string::npos) << joined.error().message;
}

// A query deployed whole (one fragment): a map before the aggregate that
// hands the key on, re-stamping event times, splits like a filter.
TEST(SplitFragment, AMapHandingTheKeyOnMaySitBeforeTheKeyedAggregate) {
  const std::string q = with_box(
      kQ5, R"({"id": "keep", "type": "filter", "options": {"predicates": ["price > 10"], "drop_unmatched": true}})",
      R"({"id": "keep", "type": "map", "options": {"fields": [{"name": "auction", "expr": " auction "},
          {"name": "price", "expr": "price + 1"}, {"name": "date_time", "expr": "date_time"}],
          "event_time": "_time + 5"}})");
  const std::vector<FragmentSpec> whole{{"all", "n1", {"keep", "counts", "shape", "cents"}}};
  const FragmentSplit split = split_ok(q, whole, "all", equal_split_parts({"n1", "n2"}));
  EXPECT_EQ(split.placement[1].boxes, (std::vector<std::string>{"keep-p0", "counts-p0", "shape-p0", "cents-p0"}));
  // Its output, split before the first row, is the whole query's.
  const QueryNetwork net = parse_ok(q);
  const auto bids = make_bids(30, 50);
  std::vector<std::string> want;
  {
    auto ex = Executor::create(net, [&](size_t, const Batch& b) {
      for (auto& r : rows_of({b})) want.push_back(r);
    });
    for (const Batch& b : bids) (*ex)->push(0, b);
    (*ex)->finish();
  }
  ASSERT_FALSE(want.empty());
  const QueryCut cut = cut_ok(split.network, split.placement);
  Stage router(plan_of(cut, split.router_fragment));
  for (const Batch& b : bids) router.push("bids", b);
  router.finish();
  Stage merge(plan_of(cut, split.merge_fragment));
  for (size_t i = 0; i < 2; ++i) {
    const FragmentPlan& plan = plan_of(cut, split.part_fragments[i]);
    Stage part(plan);
    auto recs = router.records(plan.reads.at(0));
    part.feed(plan.reads.at(0), recs, 0, recs.size());
    part.finish();
    auto outs = part.records(plan.writes.at(0));
    merge.feed(plan.writes.at(0), outs, 0, outs.size());
  }
  merge.finish();
  EXPECT_EQ(rows_of(merge.output("out")), want);
}

TEST(SplitFragment, EachPartKeepsOnlyItsKeyGroups) {
  const QueryNetwork net = parse_ok(kQ5);
  const QueryCut cut = cut_ok(net, kPlacement);
  const Midstream m = run_to_middle(net, cut, make_bids(40, 50), 20);
  const FragmentSplit split = split_ok(kQ5, kPlacement, "agg", equal_split_parts({"n2", "n3"}));
  const QueryCut scut = cut_ok(split.network, split.placement);
  const QueryNetwork& agg_net = plan_of(cut, "agg").network;
  // Each part's state is about half the whole's, and the halves together
  // hold it all (the snapshot's box state is what a checkpoint ships).
  auto whole_bytes = m.snapshot.size();
  size_t sum = 0;
  for (size_t i = 0; i < 2; ++i) {
    auto ps = carry_snapshot(agg_net, m.snapshot, plan_of(scut, split.part_fragments[i]).network,
                             split.part_boxes[i], &split.parts[i].range);
    ASSERT_TRUE(ps.ok()) << ps.error().message;
    EXPECT_LT(ps->size(), whole_bytes);
    sum += ps->size();
  }
  EXPECT_GT(sum, whole_bytes / 2);
  // A snapshot of another network, an unknown box, another type.
  const QueryNetwork& part0 = plan_of(scut, split.part_fragments[0]).network;
  EXPECT_FALSE(carry_snapshot(part0, m.snapshot, part0, {}, nullptr).ok());
  auto unknown = carry_snapshot(agg_net, m.snapshot, part0, {{"counts", "nope"}}, nullptr);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.error().message.find("no box 'nope'"), std::string::npos) << unknown.error().message;
  auto other = carry_snapshot(agg_net, m.snapshot, part0, {{"counts", "cents-p0"}}, nullptr);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.error().message.find("is a aggregate"), std::string::npos) << other.error().message;
}

std::string refusal(const std::string& json, const std::vector<FragmentSpec>& placement, const std::string& f,
                    const std::vector<SplitPartSpec>& parts) {
  Diagnostics diag;
  auto s = split_fragment(json, placement, f, parts, diag);
  EXPECT_FALSE(s.ok());
  std::string all;
  for (const auto& d : diag.items()) all += d.path + ": " + d.message + "\n";
  return s.ok() ? std::string() : s.error().message + "\n" + all;
}

TEST(SplitFragment, RefusesWithTheReasonAndTheBox) {
  const auto two = equal_split_parts({"n2", "n3"});
  // Not keyed: a fragment of stateless boxes.
  auto e = refusal(kQ5, kPlacement, "pre", two);
  EXPECT_NE(e.find("the fragment's state is not keyed: none of its boxes ('keep' (filter)) keeps state by key group"),
            std::string::npos)
      << e;
  // An aggregate without a key, with top, with a time-out, with count windows.
  const std::string keyed = R"("group_by": ["auction"],)";
  e = refusal(with_box(with_box(kQ5, keyed, ""), R"({"name": "auction", "expr": "auction"},)", ""), kPlacement, "agg",
              two);
  EXPECT_NE(e.find("$.boxes[1].options.group_by: aggregate 'counts' has no group_by: its state is one global group, "
                   "not keyed"),
            std::string::npos)
      << e;
  // With top, a filter after it (the merge would rank what it left), a map
  // that does not hand the ranked field on.
  e = refusal(with_box(kQ5, keyed, keyed + R"("top": {"by": "n"},)"), kPlacement, "agg", two);
  EXPECT_NE(e.find("$.boxes[2]: box 'shape' (filter) comes after the keyed aggregate 'counts', which has top"),
            std::string::npos)
      << e;
  e = refusal(with_box(top_query(1), R"({"name": "n", "expr": "n"})", R"({"name": "n", "expr": "n + 1"})"),
              kTopPlacement, "agg", two);
  EXPECT_NE(e.find("$.boxes[2]: map 'cents' after the keyed aggregate 'counts' does not hand the field its top "
                   "ranks by, 'n', on as it is"),
            std::string::npos)
      << e;
  e = refusal(with_box(kQ5, keyed, keyed + R"("timeout": "1s",)"), kPlacement, "agg", two);
  EXPECT_NE(e.find("aggregate 'counts' has a time-out"), std::string::npos) << e;
  e = refusal(with_box(kQ5, R"({"type": "sliding", "size": "2s", "slide": "500ms"})",
                       R"({"type": "tumbling", "by": "count", "size": 10})"),
              kPlacement, "agg", two);
  EXPECT_NE(e.find("aggregate 'counts' has count windows"), std::string::npos) << e;
  // A map before the keyed box (it could change the key the router hashes).
  const std::string map_first =
      with_box(kQ5, R"({"id": "keep", "type": "filter", "options": {"predicates": ["price > 10"], "drop_unmatched": true}})",
               R"({"id": "keep", "type": "map", "options": {"fields": [{"name": "auction", "expr": "auction + 1"},
                   {"name": "price", "expr": "price"}]}})");
  e = refusal(map_first, {{"all", "n1", {"keep", "counts", "shape", "cents"}}}, "all", two);
  EXPECT_NE(e.find("$.boxes[0]: box 'keep' (map) comes before the keyed aggregate 'counts' and does not hand its "
                   "key field 'auction' on as it is"),
            std::string::npos)
      << e;
  // A map after it that re-stamps event times.
  e = refusal(with_box(kQ5, R"({"name": "top_cents", "expr": "top * 100"}]})",
                       R"({"name": "top_cents", "expr": "top * 100"}], "event_time": "_time + top"})"),
              kPlacement, "agg", two);
  EXPECT_NE(e.find("$.boxes[3].options.event_time: map 'cents' after the keyed aggregate gives its rows new event "
                   "times"),
            std::string::npos)
      << e;
  // A box with unkeyed state.
  const std::string sorted = with_box(kQ5, R"({"id": "shape", "type": "filter", "options": {"predicates": ["n > 1"], "drop_unmatched": true}})",
                                      R"({"id": "shape", "type": "bsort", "options": {"slack": 4}})");
  e = refusal(sorted, kPlacement, "agg", two);
  EXPECT_NE(e.find("$.boxes[2]: box 'shape' (bsort) keeps state that is not partitioned by key group"),
            std::string::npos)
      << e;
  // Bad parts: one, overlapping, a gap, not covering, a bad node, too many.
  e = refusal(kQ5, kPlacement, "agg", {{"n2", {0, 128}}});
  EXPECT_NE(e.find("$.parts: a split has 2 to 16 parts, not 1"), std::string::npos) << e;
  e = refusal(kQ5, kPlacement, "agg", {{"n2", {0, 70}}, {"n3", {64, 128}}});
  EXPECT_NE(e.find("$.parts[1].range: key-group range [64, 128) overlaps the part before it, which ends at 70"),
            std::string::npos)
      << e;
  e = refusal(kQ5, kPlacement, "agg", {{"n2", {0, 60}}, {"n3", {64, 128}}});
  EXPECT_NE(e.find("$.parts[1].range: key-group range [64, 128) leaves key groups [60, 64) to no part"),
            std::string::npos)
      << e;
  e = refusal(kQ5, kPlacement, "agg", {{"n2", {0, 60}}, {"n3", {60, 100}}});
  EXPECT_NE(e.find("$.parts[1].range: the last range ends at key group 100: key groups [100, 128) are left to no "
                   "part"),
            std::string::npos)
      << e;
  e = refusal(kQ5, kPlacement, "agg", {{"n2", {10, 10}}, {"n3", {10, 128}}});
  EXPECT_NE(e.find("$.parts[0].range: key-group range [10, 10) is empty"), std::string::npos) << e;
  e = refusal(kQ5, kPlacement, "agg", {{"N2", {0, 64}}, {"n3", {64, 128}}});
  EXPECT_NE(e.find("$.parts[0].node: bad node name 'N2'"), std::string::npos) << e;
  std::vector<std::string> many(17, "n1");
  e = refusal(kQ5, kPlacement, "agg", equal_split_parts(many));
  EXPECT_NE(e.find("a split has 2 to 16 parts, not 17"), std::string::npos) << e;
  // An unknown fragment; generated names that are taken.
  e = refusal(kQ5, kPlacement, "zz", two);
  EXPECT_NE(e.find("the placement has no fragment 'zz'"), std::string::npos) << e;
  e = refusal(kQ5, {{"pre", "n1", {"keep"}}, {"agg", "n2", {"counts", "shape"}}, {"agg-split", "n3", {"cents"}}},
              "agg", two);
  EXPECT_NE(e.find("the query has a fragment named 'agg-split' already"), std::string::npos) << e;
}

TEST(SplitBox, RangesOptionRoutesByTheGivenKeyGroups) {
  auto net = [](const std::string& options) {
    return R"({"name": "r", "inputs": [{"name": "in", "schema": [{"name": "k", "type": "int64"}]}],
      "boxes": [{"id": "s", "type": "split", "options": )" +
           options + R"(}],
      "arcs": [{"from": "in", "to": "s"}], "outputs": [{"name": "a", "from": "s.0"}, {"name": "b", "from": "s.1"}]})";
  };
  Diagnostics diag;
  auto ok = QueryNetwork::parse(net(R"({"mode": "hash", "keys": ["k"], "ranges": [[0, 10], [10, 128]]})"), diag);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  std::vector<std::vector<int64_t>> got(2);
  auto ex = Executor::create(*ok, [&](size_t o, const Batch& b) {
    for (size_t r = 0; r < b.rows(); ++r) got[o].push_back(b.columns[0]->ints[r]);
  });
  BatchBuilder bb(ok->inputs()[0].schema);
  for (int64_t k = 0; k < 500; ++k) {
    bb.column(0).ints.push_back(k);
    bb.event_time().push_back(0);
    bb.seq().push_back(0);
  }
  (*ex)->push(0, bb.finish());
  ASSERT_FALSE(got[0].empty());
  ASSERT_FALSE(got[1].empty());
  for (size_t o = 0; o < 2; ++o)
    for (int64_t k : got[o]) {
      std::vector<uint64_t> h;
      BatchBuilder one(ok->inputs()[0].schema);
      one.column(0).ints.push_back(k);
      one.event_time().push_back(0);
      one.seq().push_back(0);
      const std::vector<size_t> key{0};
      hash_rows(one.finish(), key, h);
      EXPECT_EQ(key_group_of(h[0]) < 10 ? 0u : 1u, o) << k;
    }
  for (const auto& [options, message] : std::vector<std::pair<std::string, std::string>>{
           {R"({"mode": "hash", "keys": ["k"], "ranges": [[0, 10], [12, 128]]})",
            "$.boxes[0].options.ranges[1]: starts at key group 12; the ranges must follow each other from 0, so "
            "this one must start at 10"},
           {R"({"mode": "hash", "keys": ["k"], "ranges": [[0, 10], [10, 100]]})",
            "$.boxes[0].options.ranges: the ranges end at key group 100; they must cover every key group, up to "
            "128"},
           {R"({"mode": "hash", "keys": ["k"], "ranges": [[0, 0], [0, 128]]})",
            "$.boxes[0].options.ranges[0]: expected [begin, end] with 0 <= begin < end <= 128"},
           {R"({"mode": "hash", "keys": ["k"], "outputs": 2, "ranges": [[0, 64], [64, 128]]})",
            "$.boxes[0].options.outputs: give either 'outputs' or 'ranges', not both"},
           {R"({"mode": "round_robin", "outputs": 2, "ranges": [[0, 64], [64, 128]]})",
            "$.boxes[0].options.ranges: 'ranges' applies only to mode \"hash\""}}) {
    Diagnostics d;
    EXPECT_FALSE(QueryNetwork::parse(net(options), d).ok()) << options;
    std::string all;
    for (const auto& i : d.items()) all += i.path + ": " + i.message + "\n";
    EXPECT_NE(all.find(message), std::string::npos) << all;
  }
}

}  // namespace
}  // namespace entente::engine
