// The stateless and order-only boxes (filter, map, union, split, merge,
// bsort) and OrderedInputs, driven directly with a recording Emitter.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "engine/box.h"
#include "engine/boxes/boxes.h"
#include "engine/hash.h"
#include "rapidjson/document.h"

namespace entente::engine {
namespace {

constexpr const char* kPath = "$.boxes[0]";
constexpr const char* kOpts = "$.boxes[0].options";

// Records everything a box emits, in order.
struct Recorder final : Emitter {
  struct Row {
    size_t port;
    EventTime time;
    Seq seq;
    std::vector<Value> values;
    bool operator==(const Row&) const = default;
  };
  std::vector<std::pair<size_t, Batch>> batches;
  std::vector<EventTime> watermarks;

  void emit(size_t port, Batch b) override {
    EXPECT_TRUE(b.validate().ok());
    EXPECT_FALSE(b.empty()) << "boxes must not send empty batches";
    batches.emplace_back(port, std::move(b));
  }
  void emit_watermark(EventTime wm) override { watermarks.push_back(wm); }

  std::vector<Row> rows() const {
    std::vector<Row> out;
    for (const auto& [port, b] : batches)
      for (size_t r = 0; r < b.rows(); ++r) {
        Row row{port, b.event_time[r], b.seq[r], {}};
        for (size_t c = 0; c < b.columns.size(); ++c) row.values.push_back(b.column(c).value(r));
        out.push_back(std::move(row));
      }
    return out;
  }
  std::vector<Row> rows(size_t port) const {
    std::vector<Row> out;
    for (auto& r : rows())
      if (r.port == port) out.push_back(r);
    return out;
  }
  void clear() {
    batches.clear();
    watermarks.clear();
  }
};

std::unique_ptr<Box> build(std::string_view type, std::string_view options, std::vector<SchemaPtr> inputs,
                           Diagnostics& diag) {
  rapidjson::Document doc;
  doc.Parse(options.data(), options.size());
  EXPECT_FALSE(doc.HasParseError()) << options;
  BoxFactory f = find_box_factory(type);
  EXPECT_NE(f, nullptr) << type;
  BoxBuildContext ctx{kPath, std::move(inputs), &diag};
  auto box = f(doc, ctx);
  EXPECT_EQ(box == nullptr, !diag.ok()) << diag.to_string();
  return box;
}

std::unique_ptr<Box> build_ok(std::string_view type, std::string_view options, std::vector<SchemaPtr> inputs) {
  Diagnostics diag;
  auto box = build(type, options, std::move(inputs), diag);
  EXPECT_NE(box, nullptr) << diag.to_string();
  return box;
}

Diagnostics build_errors(std::string_view type, std::string_view options, std::vector<SchemaPtr> inputs) {
  Diagnostics diag;
  auto box = build(type, options, std::move(inputs), diag);
  EXPECT_EQ(box, nullptr) << type << " " << options;
  EXPECT_FALSE(diag.ok());
  return diag;
}

// True if some diagnostic is at exactly `path` and mentions `text`.
::testing::AssertionResult has_error(const Diagnostics& diag, std::string_view path, std::string_view text) {
  for (const auto& d : diag.items())
    if (d.path == path && d.message.find(text) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "no error at " << path << " mentioning '" << text << "' in:\n"
                                       << diag.to_string();
}

SchemaPtr bid_schema() {
  return make_schema({{"auction", Type::Int64}, {"price", Type::Int64}, {"channel", Type::String}});
}

struct Bid {
  int64_t auction;
  int64_t price;
  std::string channel;
  EventTime time;
};

Batch bids(const std::vector<Bid>& rows, const SchemaPtr& schema = bid_schema()) {
  BatchBuilder bb(schema);
  for (size_t i = 0; i < rows.size(); ++i) {
    bb.column(0).ints.push_back(rows[i].auction);
    bb.column(1).ints.push_back(rows[i].price);
    bb.column(2).append_str(rows[i].channel);
    bb.event_time().push_back(rows[i].time);
    bb.seq().push_back(i);
  }
  return bb.finish();
}

std::vector<int64_t> ints_of(const std::vector<Recorder::Row>& rows, size_t col) {
  std::vector<int64_t> out;
  for (const auto& r : rows) out.push_back(std::get<int64_t>(r.values[col]));
  return out;
}

std::vector<Seq> seqs_of(const std::vector<Recorder::Row>& rows) {
  std::vector<Seq> out;
  for (const auto& r : rows) out.push_back(r.seq);
  return out;
}

// --------------------------------------------------------------------------
// Filter

TEST(Filter, RoutesEachRowToTheFirstPredicateItSatisfies) {
  auto box = build_ok("filter", R"({"predicates": ["price > 100", "channel = 'a'"]})", {bid_schema()});
  ASSERT_NE(box, nullptr);
  EXPECT_EQ(box->type(), "filter");
  ASSERT_EQ(box->num_inputs(), 1u);
  ASSERT_EQ(box->num_outputs(), 3u);
  for (size_t p = 0; p < 3; ++p) EXPECT_EQ(*box->output_schema(p), *bid_schema());
  Recorder rec;
  box->on_batch(0, bids({{1, 150, "a", 10}, {2, 50, "a", 11}, {3, 50, "b", 12}, {4, 200, "b", 13}}), rec);
  box->on_batch(0, bids({{5, 10, "c", 14}}), rec);
  EXPECT_EQ(ints_of(rec.rows(0), 0), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(ints_of(rec.rows(1), 0), (std::vector<int64_t>{2}));
  EXPECT_EQ(ints_of(rec.rows(2), 0), (std::vector<int64_t>{3, 5}));
  // Sequence numbers count per output port.
  EXPECT_EQ(seqs_of(rec.rows(0)), (std::vector<Seq>{0, 1}));
  EXPECT_EQ(seqs_of(rec.rows(2)), (std::vector<Seq>{0, 1}));
  EXPECT_EQ(rec.rows(0)[1].time, 13);
  EXPECT_EQ(box->stats().tuples_out, 5u);
}

TEST(Filter, DropUnmatchedHasOneOutputPerPredicate) {
  auto box = build_ok("filter", R"({"predicates": ["price > 100"], "drop_unmatched": true})", {bid_schema()});
  ASSERT_NE(box, nullptr);
  ASSERT_EQ(box->num_outputs(), 1u);
  Recorder rec;
  box->on_batch(0, bids({{1, 150, "a", 10}, {2, 50, "a", 11}, {3, 101, "b", 12}}), rec);
  EXPECT_EQ(ints_of(rec.rows(0), 0), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(rec.rows().size(), 2u);
}

TEST(Filter, ForwardsColumnsWhenEveryRowMatchesAndSkipsEmptyBatches) {
  auto box = build_ok("filter", R"({"predicates": ["price >= 0"]})", {bid_schema()});
  ASSERT_NE(box, nullptr);
  Recorder rec;
  Batch in = bids({{1, 1, "a", 1}, {2, 2, "b", 2}});
  box->on_batch(0, in, rec);
  ASSERT_EQ(rec.batches.size(), 1u);
  EXPECT_EQ(rec.batches[0].second.columns[2].get(), in.columns[2].get());
  box->on_batch(0, bids({}), rec);
  EXPECT_EQ(rec.batches.size(), 1u);
}

TEST(Filter, ForwardsWatermarks) {
  auto box = build_ok("filter", R"({"predicates": ["price > 1"]})", {bid_schema()});
  ASSERT_NE(box, nullptr);
  Recorder rec;
  box->on_watermark(0, 100, rec);
  box->on_watermark(0, 50, rec);  // not monotone: ignored
  box->on_watermark(0, kMaxWatermark, rec);
  EXPECT_EQ(rec.watermarks, (std::vector<EventTime>{100, kMaxWatermark}));
}

TEST(Filter, ReportsEveryOptionError) {
  auto s = bid_schema();
  auto d = build_errors("filter", R"({"predicates": ["price > 1"], "bogus": 1})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".bogus", "unknown option 'bogus'"));
  d = build_errors("filter", R"({"predicates": "price > 1"})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".predicates", "expected an array"));
  d = build_errors("filter", R"({})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".predicates", "missing required option"));
  d = build_errors("filter", R"({"predicates": ["price > 1", "prise > 1"]})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".predicates[1]", "unknown field 'prise' at 1:1"));
  d = build_errors("filter", R"({"predicates": ["price + 1"]})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".predicates[0]", "must be bool"));
  d = build_errors("filter", R"({"predicates": []})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".predicates", "1 to 64"));
  std::string many = R"({"predicates": [)";
  for (int i = 0; i < 65; ++i) many += std::string(i ? "," : "") + "\"price > " + std::to_string(i) + "\"";
  many += "]}";
  d = build_errors("filter", many, {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".predicates", "got 65"));
  d = build_errors("filter", R"({"predicates": ["price > 1"], "drop_unmatched": "yes"})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".drop_unmatched", "expected true or false"));
  d = build_errors("filter", R"({"predicates": ["price > 1"]})", {s, s});
  EXPECT_TRUE(has_error(d, kPath, "needs 1 input, got 2"));
  d = build_errors("filter", R"({"predicates": ["price > 1"]})", {});
  EXPECT_TRUE(has_error(d, kPath, "needs 1 input, got 0"));
  d = build_errors("filter", R"([1])", {s});
  EXPECT_TRUE(has_error(d, kOpts, "options must be an object"));
}

// --------------------------------------------------------------------------
// Map

TEST(Map, ComputesFieldsAndForwardsBareReferences) {
  auto box = build_ok("map",
                      R"json({"fields": [{"name": "a", "expr": "auction"},
                                         {"name": "double_price", "expr": "price * 2"},
                                         {"name": "up", "expr": "upper(channel)"},
                                         {"name": "ratio", "expr": "to_double(price) / 4"}]})json",
                      {bid_schema()});
  ASSERT_NE(box, nullptr);
  const Schema& out = *box->output_schema(0);
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out.field(0), (Field{"a", Type::Int64}));
  EXPECT_EQ(out.field(1), (Field{"double_price", Type::Int64}));
  EXPECT_EQ(out.field(2), (Field{"up", Type::String}));
  EXPECT_EQ(out.field(3), (Field{"ratio", Type::Double}));
  Recorder rec;
  Batch in = bids({{7, 10, "web", 5}, {8, 3, "app", 6}});
  box->on_batch(0, in, rec);
  ASSERT_EQ(rec.batches.size(), 1u);
  EXPECT_EQ(rec.batches[0].second.columns[0].get(), in.columns[0].get()) << "bare field must not be copied";
  auto rows = rec.rows();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].values, (std::vector<Value>{int64_t{7}, int64_t{20}, std::string("WEB"), 2.5}));
  EXPECT_EQ(rows[1].values, (std::vector<Value>{int64_t{8}, int64_t{6}, std::string("APP"), 0.75}));
  EXPECT_EQ(rows[1].time, 6);
  EXPECT_EQ(rows[1].seq, 1u);
  box->on_batch(0, bids({}), rec);
  EXPECT_EQ(rec.batches.size(), 1u);
  box->on_watermark(0, 9, rec);
  EXPECT_EQ(rec.watermarks, (std::vector<EventTime>{9}));
}

TEST(Map, EventTimeRestampsAndDropsRowsBelowTheWatermarkAsLate) {
  auto box = build_ok("map", R"({"fields": [{"name": "a", "expr": "auction"}], "event_time": "price"})",
                      {bid_schema()});
  ASSERT_NE(box, nullptr);
  Recorder rec;
  box->on_batch(0, bids({{1, 50, "a", 1000}}), rec);
  box->on_watermark(0, 100, rec);
  box->on_batch(0, bids({{2, 150, "a", 1000}, {3, 99, "a", 1000}, {4, 100, "b", 1000}}), rec);
  auto rows = rec.rows();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].time, 50);
  EXPECT_EQ(rows[1].time, 150);
  EXPECT_EQ(rows[2].time, 100);
  EXPECT_EQ(ints_of(rows, 0), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(seqs_of(rows), (std::vector<Seq>{0, 1, 2}));
  EXPECT_EQ(box->stats().late_dropped, 1u);
}

TEST(Map, ReportsEveryOptionError) {
  auto s = bid_schema();
  auto d = build_errors("map", R"({})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".fields", "missing required option"));
  d = build_errors("map", R"({"fields": []})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".fields", "expected an array of 1 to"));
  d = build_errors("map", R"({"fields": {"name": "a"}})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".fields", "expected an array"));
  d = build_errors("map", R"({"fields": [{"name": "a", "expr": "price"}, {"name": "b", "expr": "price * 'x'"}]})",
                   {s});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".fields[1].expr", "1:"));
  d = build_errors("map", R"({"fields": [{"name": "a", "expr": "price"}, {"name": "a", "expr": "auction"}]})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".fields[1].name", "defined twice"));
  d = build_errors("map", R"({"fields": [{"name": "a", "expr": "price", "type": "int64"}]})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".fields[0].type", "unknown option 'type'"));
  d = build_errors("map", R"({"fields": [{"name": "a"}]})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".fields[0].expr", "missing required option"));
  d = build_errors("map", R"({"fields": [{"name": 3, "expr": "price"}]})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".fields[0].name", "expected a string"));
  d = build_errors("map", R"({"fields": [{"name": "1x", "expr": "price"}]})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".fields", "1x"));
  d = build_errors("map", R"({"fields": [{"name": "a", "expr": "price"}], "event_time": "channel"})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".event_time", "timestamp or int64"));
  d = build_errors("map", R"({"fields": [{"name": "a", "expr": "price"}], "event_time": "nope"})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".event_time", "unknown field 'nope'"));
  d = build_errors("map", R"({"fields": [{"name": "a", "expr": "price"}], "extra": 1})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".extra", "unknown option"));
  d = build_errors("map", R"({"fields": [{"name": "a", "expr": "price"}]})", {s, s});
  EXPECT_TRUE(has_error(d, kPath, "needs 1 input"));
}

// --------------------------------------------------------------------------
// OrderedInputs

TEST(OrderedInputs, ReleasesByEventTimeThenInputThenArrivalInMaximalRuns) {
  auto s = bid_schema();
  boxes::OrderedInputs oi({s, s});
  // Input 0 arrives unsorted; equal times keep arrival order.
  oi.add(0, bids({{1, 0, "", 5}, {2, 0, "", 1}, {3, 0, "", 5}, {4, 0, "", 9}}));
  oi.add(1, bids({{10, 0, "", 1}, {11, 0, "", 2}, {12, 0, "", 5}}));
  oi.add(1, bids({{13, 0, "", 6}, {14, 0, "", 20}}));
  EXPECT_EQ(oi.buffered_rows(), 9u);
  EXPECT_EQ(oi.set_watermark(0, 10), kMinTime);
  std::vector<std::pair<size_t, std::vector<int64_t>>> runs;
  auto collect = [&](size_t input, const Batch& b) {
    std::vector<int64_t> ids(b.column(0).ints.begin(), b.column(0).ints.end());
    runs.emplace_back(input, ids);
  };
  oi.release(collect);
  EXPECT_TRUE(runs.empty()) << "input 1 has no watermark yet";
  EXPECT_EQ(oi.set_watermark(1, 7), 7);
  oi.release(collect);
  // Times: 1(in0:2) 1(in1:10) 2(in1:11) 5(in0:1,3) 5(in1:12) 6(in1:13).
  std::vector<std::pair<size_t, std::vector<int64_t>>> want = {
      {0, {2}}, {1, {10, 11}}, {0, {1, 3}}, {1, {12, 13}}};
  EXPECT_EQ(runs, want);
  EXPECT_EQ(oi.buffered_rows(), 2u);

  // Snapshot, restore into a fresh instance, release the rest from both.
  std::string bytes;
  oi.snapshot(bytes);
  boxes::OrderedInputs copy({s, s});
  std::string_view in = bytes;
  ASSERT_TRUE(copy.restore(in).ok());
  EXPECT_TRUE(in.empty());
  EXPECT_EQ(copy.watermark(), 7);
  for (auto* o : {&oi, &copy}) {
    runs.clear();
    o->set_watermark(0, kMaxWatermark);
    o->set_watermark(1, kMaxWatermark);
    o->release(collect);
    EXPECT_EQ(runs, (std::vector<std::pair<size_t, std::vector<int64_t>>>{{0, {4}}, {1, {14}}}));
    EXPECT_EQ(o->buffered_rows(), 0u);
  }
  // Every truncation is refused.
  for (size_t n = 0; n < bytes.size(); ++n) {
    boxes::OrderedInputs bad({s, s});
    std::string_view part(bytes.data(), n);
    Status st = bad.restore(part);
    ASSERT_FALSE(st.ok()) << n;
    EXPECT_EQ(st.error().code, Errc::corrupt);
  }
  boxes::OrderedInputs three({s, s, s});
  std::string_view all = bytes;
  EXPECT_FALSE(three.restore(all).ok());
}

TEST(OrderedInputs, PassesAWholeSortedBatchWithoutCopying) {
  auto s = bid_schema();
  boxes::OrderedInputs oi({s, s});
  Batch b = bids({{1, 0, "", 1}, {2, 0, "", 2}});
  oi.add(0, b);
  oi.set_watermark(0, 5);
  oi.set_watermark(1, 5);
  int calls = 0;
  oi.release([&](size_t input, const Batch& run) {
    ++calls;
    EXPECT_EQ(input, 0u);
    EXPECT_EQ(run.columns[0].get(), b.columns[0].get());
  });
  EXPECT_EQ(calls, 1);
}

TEST(OrderedInputs, ReleaseRangesGivesTheRowsOfReleaseInTheSameOrder) {
  auto s = bid_schema();
  std::mt19937_64 rng(7);
  for (int round = 0; round < 200; ++round) {
    boxes::OrderedInputs whole({s, s, s}), ranges({s, s, s});
    int64_t id = 0;
    // Three inputs, a few batches each, sorted or not, released in steps.
    EventTime wm = 0;
    std::vector<std::pair<size_t, int64_t>> a, b;  // (input, row id) in release order
    for (int step = 0; step < 6; ++step) {
      for (size_t in = 0; in < 3; ++in) {
        std::vector<Bid> rows;
        const bool sorted = rng() % 3 != 0;
        EventTime t = wm;
        for (size_t r = rng() % 5; r > 0; --r) {
          t = sorted ? t + static_cast<EventTime>(rng() % 3) : wm + static_cast<EventTime>(rng() % 9);
          rows.push_back({0, id++, "x", t});
        }
        if (rows.empty()) continue;
        whole.add(in, bids(rows));
        ranges.add(in, bids(rows));
      }
      wm += static_cast<EventTime>(rng() % 6);
      const EventTime w = step == 5 ? kMaxWatermark : wm;
      for (size_t in = 0; in < 3; ++in) {
        whole.set_watermark(in, w);
        ranges.set_watermark(in, w);
      }
      whole.release([&](size_t input, const Batch& run) {
        for (size_t r = 0; r < run.rows(); ++r) a.emplace_back(input, run.column(1).ints[r]);
      });
      ranges.release_ranges([&](size_t input, const Batch& batch, size_t begin, size_t end) {
        ASSERT_LT(begin, end);
        ASSERT_LE(end, batch.rows());
        for (size_t r = begin; r < end; ++r) b.emplace_back(input, batch.column(1).ints[r]);
      });
      ASSERT_EQ(a, b) << "round " << round << " step " << step;
      ASSERT_EQ(whole.buffered_rows(), ranges.buffered_rows());
    }
    EXPECT_EQ(a.size(), static_cast<size_t>(id));
  }
}

TEST(OrderedInputs, ReleaseRangesPointsIntoTheBufferedBatches) {
  auto s = bid_schema();
  boxes::OrderedInputs oi({s, s});
  Batch b0 = bids({{0, 1, "", 1}, {0, 2, "", 4}});
  Batch b1 = bids({{0, 3, "", 2}, {0, 4, "", 3}});
  oi.add(0, b0);
  oi.add(1, b1);
  oi.set_watermark(0, 9);
  oi.set_watermark(1, 9);
  std::vector<std::tuple<size_t, const Column*, size_t, size_t>> calls;
  oi.release_ranges([&](size_t input, const Batch& b, size_t begin, size_t end) {
    calls.emplace_back(input, b.columns[0].get(), begin, end);
  });
  // Times 1 (in 0), 2 and 3 (in 1), 4 (in 0): three runs, none copied.
  std::vector<std::tuple<size_t, const Column*, size_t, size_t>> want = {
      {0, b0.columns[0].get(), 0, 1}, {1, b1.columns[0].get(), 0, 2}, {0, b0.columns[0].get(), 1, 2}};
  EXPECT_EQ(calls, want);
}

// --------------------------------------------------------------------------
// Union and merge (union mode): determinism over interleavings

// One input's own timeline: batches and watermark advances in the order
// that input produces them.
struct Step {
  bool is_watermark;
  Batch batch;
  EventTime wm;
};

std::vector<std::vector<Step>> random_timelines(std::mt19937_64& rng, size_t inputs) {
  std::vector<std::vector<Step>> out(inputs);
  for (size_t i = 0; i < inputs; ++i) {
    EventTime wm = 0;
    int64_t id = 0;
    const size_t steps = 5 + rng() % 15;
    for (size_t s = 0; s < steps; ++s) {
      if (rng() % 3 == 0) {
        wm += static_cast<EventTime>(rng() % 20);
        out[i].push_back({true, {}, wm});
        continue;
      }
      std::vector<Bid> rows;
      const size_t n = rng() % 6;  // includes empty batches
      const bool sorted = rng() % 2 == 0;
      EventTime t = wm;
      for (size_t r = 0; r < n; ++r) {
        if (sorted) t += static_cast<EventTime>(rng() % 4);
        else t = wm + static_cast<EventTime>(rng() % 30);
        // Now and then a late row: below this input's own watermark.
        const EventTime at = rng() % 10 == 0 ? wm - 1 - static_cast<EventTime>(rng() % 5) : t;
        rows.push_back({static_cast<int64_t>(i), id++, std::string("r") + std::to_string(rng() % 3), at});
      }
      out[i].push_back({false, bids(rows), 0});
    }
    out[i].push_back({true, {}, kMaxWatermark});
  }
  return out;
}

// Feeds the timelines interleaved at random (each input's own order kept).
void feed(Box& box, const std::vector<std::vector<Step>>& timelines, std::mt19937_64& rng, Recorder& rec) {
  std::vector<size_t> pos(timelines.size(), 0);
  for (;;) {
    std::vector<size_t> live;
    for (size_t i = 0; i < timelines.size(); ++i)
      if (pos[i] < timelines[i].size()) live.push_back(i);
    if (live.empty()) break;
    const size_t i = live[rng() % live.size()];
    const Step& s = timelines[i][pos[i]++];
    if (s.is_watermark) box.on_watermark(i, s.wm, rec);
    else box.on_batch(i, s.batch, rec);
  }
}

class OrderedUnion : public ::testing::TestWithParam<std::string> {};

TEST_P(OrderedUnion, SameOutputForEveryInterleavingAndItIsSortedByTimeThenInput) {
  const std::string type = GetParam();
  auto s = bid_schema();
  for (uint64_t seed = 0; seed < 60; ++seed) {
    std::mt19937_64 rng(seed);
    const size_t k = 2 + rng() % 3;
    auto timelines = random_timelines(rng, k);
    // Reference: every non-late row, stably sorted by (time, input).
    std::vector<std::tuple<EventTime, size_t, int64_t>> want;
    uint64_t want_late = 0;
    for (size_t i = 0; i < k; ++i) {
      EventTime wm = kMinTime;
      for (const auto& st : timelines[i]) {
        if (st.is_watermark) {
          wm = std::max(wm, st.wm);
          continue;
        }
        for (size_t r = 0; r < st.batch.rows(); ++r) {
          if (st.batch.event_time[r] < wm) ++want_late;
          else want.emplace_back(st.batch.event_time[r], i, st.batch.column(1).ints[r]);
        }
      }
    }
    std::stable_sort(want.begin(), want.end(), [](const auto& a, const auto& b) {
      return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
    });
    std::vector<Recorder::Row> first;
    for (uint64_t order = 0; order < 4; ++order) {
      auto box = build_ok(type, "{}", std::vector<SchemaPtr>(k, s));
      ASSERT_NE(box, nullptr);
      Recorder rec;
      std::mt19937_64 order_rng(seed * 1000 + order);
      feed(*box, timelines, order_rng, rec);
      auto rows = rec.rows();
      EXPECT_EQ(box->stats().late_dropped, want_late);
      ASSERT_EQ(rows.size(), want.size()) << "seed " << seed;
      for (size_t r = 0; r < rows.size(); ++r) {
        EXPECT_EQ(rows[r].time, std::get<0>(want[r]));
        EXPECT_EQ(std::get<int64_t>(rows[r].values[0]), static_cast<int64_t>(std::get<1>(want[r])));
        EXPECT_EQ(std::get<int64_t>(rows[r].values[1]), std::get<2>(want[r]));
        EXPECT_EQ(rows[r].seq, r);
      }
      ASSERT_FALSE(rec.watermarks.empty());
      EXPECT_EQ(rec.watermarks.back(), kMaxWatermark);
      EXPECT_TRUE(std::is_sorted(rec.watermarks.begin(), rec.watermarks.end()));
      if (order == 0) first = rows;
      else EXPECT_EQ(rows, first) << "seed " << seed << " interleaving " << order;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(UnionAndMerge, OrderedUnion, ::testing::Values("union", "merge"));

TEST(Union, ReleasesOnlyBelowTheMinimumWatermarkAndForwardsIt) {
  auto s = bid_schema();
  auto box = build_ok("union", "{}", {s, s});
  ASSERT_NE(box, nullptr);
  EXPECT_EQ(box->num_outputs(), 1u);
  Recorder rec;
  box->on_batch(0, bids({{0, 1, "", 10}, {0, 2, "", 30}}), rec);
  box->on_batch(1, bids({{1, 3, "", 20}}), rec);
  box->on_watermark(0, 40, rec);
  EXPECT_TRUE(rec.batches.empty());
  EXPECT_TRUE(rec.watermarks.empty());
  box->on_watermark(1, 25, rec);
  EXPECT_EQ(ints_of(rec.rows(), 1), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(rec.watermarks, (std::vector<EventTime>{25}));
  box->on_batch(1, bids({{1, 4, "", 24}}), rec);  // below input 1's watermark: late
  EXPECT_EQ(box->stats().late_dropped, 1u);
  box->on_batch(1, bids({}), rec);
  box->on_watermark(1, kMaxWatermark, rec);
  EXPECT_EQ(ints_of(rec.rows(), 1), (std::vector<int64_t>{1, 3, 2}));
  EXPECT_EQ(rec.watermarks.back(), 40);
  box->on_watermark(0, kMaxWatermark, rec);
  EXPECT_EQ(rec.watermarks.back(), kMaxWatermark);
}

TEST(Union, ReportsInputAndOptionErrors) {
  auto s = bid_schema();
  auto other = make_schema({{"auction", Type::Int64}});
  auto d = build_errors("union", "{}", {s});
  EXPECT_TRUE(has_error(d, kPath, "needs at least 2 inputs, got 1"));
  d = build_errors("union", "{}", {s, s, other});
  EXPECT_TRUE(has_error(d, kPath, "input 2 has schema (auction:int64)"));
  d = build_errors("union", R"({"mode": "union"})", {s, s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".mode", "unknown option"));
  d = build_errors("merge", "{}", {s, other});
  EXPECT_TRUE(has_error(d, kPath, "input 1 has schema"));
  d = build_errors("merge", "{}", {});
  EXPECT_TRUE(has_error(d, kPath, "needs 1 to 1024 inputs"));
}

// --------------------------------------------------------------------------
// Merge: combining partial aggregates

SchemaPtr partial_schema() {
  return make_schema({{"cat", Type::String},
                      {"n", Type::Int64},
                      {"mx", Type::Int64},
                      {"mn", Type::Double},
                      {"f", Type::String},
                      {"l", Type::String},
                      {"extra", Type::Int64}});
}

struct Partial {
  std::string cat;
  int64_t n, mx;
  double mn;
  std::string f, l;
  int64_t extra;
  EventTime time;
};

Batch partials(const std::vector<Partial>& rows) {
  BatchBuilder bb(partial_schema());
  for (const auto& p : rows) {
    bb.column(0).append_str(p.cat);
    bb.column(1).ints.push_back(p.n);
    bb.column(2).ints.push_back(p.mx);
    bb.column(3).doubles.push_back(p.mn);
    bb.column(4).append_str(p.f);
    bb.column(5).append_str(p.l);
    bb.column(6).ints.push_back(p.extra);
    bb.event_time().push_back(p.time);
    bb.seq().push_back(0);
  }
  return bb.finish();
}

constexpr const char* kCombine = R"({"mode": "combine", "group_by": ["cat"],
  "aggregates": [{"field": "n", "fn": "sum"}, {"field": "mx", "fn": "max"}, {"field": "mn", "fn": "min"},
                 {"field": "f", "fn": "first"}, {"field": "l", "fn": "last"}]})";

TEST(Merge, CombinesPartialsOfOneTimeAndGroupOnceEveryInputHasPassedIt) {
  auto s = partial_schema();
  auto box = build_ok("merge", kCombine, {s, s});
  ASSERT_NE(box, nullptr);
  EXPECT_EQ(*box->output_schema(0), *s);
  Recorder rec;
  box->on_batch(1, partials({{"a", 3, 9, 0.5, "x1", "y1", 8, 10}, {"c", 1, 1, 1, "c1", "c1", 0, 10}}), rec);
  box->on_batch(0, partials({{"a", 1, 5, 2.0, "x0", "y0", 7, 10}, {"b", 2, 1, 1.0, "b0", "b0", 1, 10}}), rec);
  box->on_batch(0, partials({{"a", 4, 4, 4.0, "z0", "z0", 9, 20}}), rec);
  box->on_batch(1, partials({{"a", 10, 2, 3.0, "q1", "q1", 5, 10}}), rec);
  box->on_watermark(0, 15, rec);
  EXPECT_TRUE(rec.batches.empty());
  box->on_watermark(1, 15, rec);
  auto rows = rec.rows();
  ASSERT_EQ(rows.size(), 3u);
  // Groups in first-seen order by input index: a and b from input 0, then c.
  EXPECT_EQ(rows[0].values, (std::vector<Value>{std::string("a"), int64_t{14}, int64_t{9}, 0.5, std::string("x0"),
                                                std::string("q1"), int64_t{7}}));
  EXPECT_EQ(rows[1].values, (std::vector<Value>{std::string("b"), int64_t{2}, int64_t{1}, 1.0, std::string("b0"),
                                                std::string("b0"), int64_t{1}}));
  EXPECT_EQ(std::get<std::string>(rows[2].values[0]), "c");
  EXPECT_EQ(rows[0].time, 10);
  EXPECT_EQ(rec.watermarks, (std::vector<EventTime>{15}));
  box->on_watermark(0, kMaxWatermark, rec);
  box->on_watermark(1, kMaxWatermark, rec);
  rows = rec.rows();
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[3].time, 20);
  EXPECT_EQ(rows[3].seq, 3u);
  EXPECT_EQ(std::get<int64_t>(rows[3].values[1]), 4);
}

TEST(Merge, CombineWithoutGroupByCombinesPerEventTimeAndMatchesAReference) {
  auto s = partial_schema();
  for (uint64_t seed = 0; seed < 20; ++seed) {
    std::mt19937_64 rng(seed);
    auto box = build_ok("merge", kCombine, {s, s, s});
    ASSERT_NE(box, nullptr);
    // Reference by (time, cat): sum of n and max of mx.
    std::map<std::pair<EventTime, std::string>, std::pair<int64_t, int64_t>> want;
    Recorder rec;
    for (size_t step = 0; step < 30; ++step) {
      const size_t in = rng() % 3;
      std::vector<Partial> rows;
      for (size_t r = 0; r < 1 + rng() % 5; ++r) {
        Partial p{std::string(1, static_cast<char>('a' + rng() % 4)), static_cast<int64_t>(rng() % 100),
                  static_cast<int64_t>(rng() % 1000), 0.0, "", "", 0, static_cast<EventTime>(100 + rng() % 10)};
        auto& w = want[{p.time, p.cat}];
        w.first += p.n;
        w.second = std::max(w.second, p.mx);
        rows.push_back(p);
      }
      box->on_batch(in, partials(rows), rec);
    }
    for (size_t i = 0; i < 3; ++i) box->on_watermark(i, kMaxWatermark, rec);
    auto rows = rec.rows();
    ASSERT_EQ(rows.size(), want.size());
    std::set<std::pair<EventTime, std::string>> seen;
    for (size_t r = 0; r < rows.size(); ++r) {
      std::pair<EventTime, std::string> key{rows[r].time, std::get<std::string>(rows[r].values[0])};
      EXPECT_TRUE(seen.insert(key).second);
      if (r > 0) {
        EXPECT_LE(rows[r - 1].time, rows[r].time);
      }
      EXPECT_EQ(std::get<int64_t>(rows[r].values[1]), want[key].first);
      EXPECT_EQ(std::get<int64_t>(rows[r].values[2]), want[key].second);
    }
  }
}

TEST(Merge, ReportsEveryOptionError) {
  auto s = partial_schema();
  auto d = build_errors("merge", R"({"mode": "zip"})", {s, s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".mode", "unknown value 'zip'"));
  d = build_errors("merge", R"({"group_by": ["cat"]})", {s, s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".group_by", "only to mode \"combine\""));
  d = build_errors("merge", R"({"mode": "combine", "group_by": ["cat"]})", {s, s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".aggregates", "missing required option"));
  d = build_errors("merge", R"({"mode": "combine", "aggregates": [{"field": "cat", "fn": "sum"}]})", {s, s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".aggregates[0].fn", "sum needs an int64 or double"));
  d = build_errors("merge", R"({"mode": "combine", "aggregates": [{"field": "n", "fn": "avg"}]})", {s, s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".aggregates[0].fn", "unknown value 'avg'"));
  d = build_errors("merge", R"({"mode": "combine", "group_by": ["cat"], "aggregates": [{"field": "cat", "fn": "max"}]})",
                   {s, s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".aggregates[0].field", "already"));
  d = build_errors("merge", R"({"mode": "combine", "group_by": ["kat"], "aggregates": [{"field": "n", "fn": "sum"}]})",
                   {s, s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".group_by[0]", "unknown field 'kat'"));
  d = build_errors("merge", R"({"mode": "combine", "aggregates": [{"field": "nn", "fn": "sum", "x": 1}]})", {s, s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".aggregates[0].x", "unknown option"));
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".aggregates[0].field", "unknown field 'nn'"));
  d = build_errors("merge", R"({"mode": "combine", "aggregates": []})", {s, s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".aggregates", "expected an array of 1 to"));
}

// --------------------------------------------------------------------------
// Split

TEST(Split, HashRoutingAgreesWithKeyGroupRanges) {
  auto s = bid_schema();
  std::mt19937_64 rng(7);
  for (uint32_t n : {1u, 2u, 3u, 5u, 128u}) {
    for (const char* keys : {R"(["auction"])", R"(["channel", "auction"])"}) {
      auto box = build_ok("split", std::string(R"({"mode": "hash", "outputs": )") + std::to_string(n) +
                                       R"(, "keys": )" + keys + "}",
                          {s});
      ASSERT_NE(box, nullptr);
      ASSERT_EQ(box->num_outputs(), n);
      std::vector<Bid> rows;
      for (size_t i = 0; i < 500; ++i)
        rows.push_back({static_cast<int64_t>(rng() % 1000), static_cast<int64_t>(i), std::string("c") + std::to_string(rng() % 7),
                        static_cast<EventTime>(i)});
      Recorder rec;
      box->on_batch(0, bids(rows), rec);
      std::vector<size_t> key_cols = std::string(keys).find("channel") != std::string::npos
                                         ? std::vector<size_t>{2, 0}
                                         : std::vector<size_t>{0};
      size_t total = 0;
      for (const auto& [port, b] : rec.batches) {
        std::vector<uint64_t> h;
        hash_rows(b, key_cols, h);
        const auto range = KeyGroupRange::part(static_cast<uint32_t>(port), n);
        for (size_t r = 0; r < b.rows(); ++r) EXPECT_TRUE(range.contains(key_group_of(h[r])));
        total += b.rows();
      }
      EXPECT_EQ(total, rows.size());
    }
  }
}

TEST(Split, RoundRobinCountsRowsAcrossBatches) {
  auto box = build_ok("split", R"({"mode": "round_robin", "outputs": 3})", {bid_schema()});
  ASSERT_NE(box, nullptr);
  Recorder rec;
  box->on_batch(0, bids({{0, 0, "", 0}, {1, 0, "", 0}}), rec);
  box->on_batch(0, bids({{2, 0, "", 0}, {3, 0, "", 0}, {4, 0, "", 0}, {5, 0, "", 0}, {6, 0, "", 0}}), rec);
  EXPECT_EQ(ints_of(rec.rows(0), 0), (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(ints_of(rec.rows(1), 0), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(ints_of(rec.rows(2), 0), (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(seqs_of(rec.rows(0)), (std::vector<Seq>{0, 1, 2}));
}

TEST(Split, PredicateModeKeepsFilterSemantics) {
  auto s = bid_schema();
  auto box = build_ok("split", R"({"mode": "predicate", "predicates": ["price < 10", "price < 100"]})", {s});
  ASSERT_NE(box, nullptr);
  ASSERT_EQ(box->num_outputs(), 2u);
  Recorder rec;
  box->on_batch(0, bids({{1, 5, "", 0}, {2, 50, "", 0}, {3, 500, "", 0}}), rec);
  EXPECT_EQ(ints_of(rec.rows(0), 0), (std::vector<int64_t>{1}));
  EXPECT_EQ(ints_of(rec.rows(1), 0), (std::vector<int64_t>{2}));
  EXPECT_EQ(rec.rows().size(), 2u);
  box = build_ok("split", R"({"mode": "predicate", "predicates": ["price < 10"], "else_output": true})", {s});
  ASSERT_NE(box, nullptr);
  ASSERT_EQ(box->num_outputs(), 2u);
  rec.clear();
  box->on_batch(0, bids({{1, 5, "", 0}, {2, 50, "", 0}, {3, 500, "", 0}}), rec);
  EXPECT_EQ(ints_of(rec.rows(1), 0), (std::vector<int64_t>{2, 3}));
  box->on_watermark(0, 3, rec);
  EXPECT_EQ(rec.watermarks, (std::vector<EventTime>{3}));
}

TEST(Split, ReportsEveryOptionError) {
  auto s = bid_schema();
  auto d = build_errors("split", R"({"keys": ["auction"], "outputs": 2})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".mode", "missing required option"));
  EXPECT_EQ(d.size(), 1u) << d.to_string();
  d = build_errors("split", R"({"mode": "hash", "keys": ["auction"], "outputs": 0})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".outputs", "out of range [1, 128]"));
  d = build_errors("split", R"({"mode": "hash", "keys": ["auction"], "outputs": 129})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".outputs", "out of range"));
  d = build_errors("split", R"({"mode": "hash", "keys": [], "outputs": 2})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".keys", "at least 1"));
  d = build_errors("split", R"({"mode": "hash", "keys": ["bidder"], "outputs": 2})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".keys[0]", "unknown field 'bidder'"));
  d = build_errors("split", R"({"mode": "hash", "keys": ["auction"], "outputs": "2"})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".outputs", "expected an integer"));
  d = build_errors("split", R"({"mode": "round_robin", "keys": ["auction"], "outputs": 2})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".keys", "only to mode \"hash\""));
  d = build_errors("split", R"({"mode": "predicate", "predicates": ["price"], "outputs": 2})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".predicates[0]", "must be bool"));
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".outputs", "only to mode"));
  d = build_errors("split", R"({"mode": "predicate", "predicates": ["price > 1"], "else_output": 1})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".else_output", "expected true or false"));
  d = build_errors("split", R"({"mode": "broadcast"})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".mode", "unknown value 'broadcast'"));
  d = build_errors("split", R"({"mode": "round_robin", "outputs": 2, "fanout": 1})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".fanout", "unknown option"));
  d = build_errors("split", R"({"mode": "round_robin", "outputs": 2})", {s, s});
  EXPECT_TRUE(has_error(d, kPath, "needs 1 input"));
}

// --------------------------------------------------------------------------
// BSort

std::vector<EventTime> times_of(const std::vector<Recorder::Row>& rows) {
  std::vector<EventTime> out;
  for (const auto& r : rows) out.push_back(r.time);
  return out;
}

Batch at_times(const std::vector<EventTime>& times) {
  std::vector<Bid> rows;
  for (size_t i = 0; i < times.size(); ++i) rows.push_back({static_cast<int64_t>(i), 0, "", times[i]});
  return bids(rows);
}

TEST(BSort, HoldsSlackRowsAndEmitsTheSmallest) {
  auto box = build_ok("bsort", R"({"slack": 2})", {bid_schema()});
  ASSERT_NE(box, nullptr);
  Recorder rec;
  box->on_batch(0, at_times({3, 1, 2, 6}), rec);
  EXPECT_EQ(times_of(rec.rows()), (std::vector<EventTime>{1, 2}));
  box->on_batch(0, at_times({4, 5, 9, 7, 8}), rec);
  EXPECT_EQ(times_of(rec.rows()), (std::vector<EventTime>{1, 2, 3, 4, 5, 6, 7}));
  box->on_watermark(0, kMaxWatermark, rec);
  EXPECT_EQ(times_of(rec.rows()), (std::vector<EventTime>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(seqs_of(rec.rows()), (std::vector<Seq>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(BSort, DisorderBeyondSlackStaysAndZeroSlackPassesThrough) {
  auto box = build_ok("bsort", R"({"slack": 1})", {bid_schema()});
  ASSERT_NE(box, nullptr);
  Recorder rec;
  box->on_batch(0, at_times({5, 6, 7, 1}), rec);
  box->on_watermark(0, kMaxWatermark, rec);
  EXPECT_EQ(times_of(rec.rows()), (std::vector<EventTime>{5, 6, 1, 7}));
  box = build_ok("bsort", R"({"slack": 0})", {bid_schema()});
  rec.clear();
  box->on_batch(0, at_times({5, 2, 7}), rec);
  EXPECT_EQ(times_of(rec.rows()), (std::vector<EventTime>{5, 2, 7}));
}

TEST(BSort, WatermarkFlushesRowsBelowItAndLateRowsAreDropped) {
  auto box = build_ok("bsort", R"({"slack": 10})", {bid_schema()});
  ASSERT_NE(box, nullptr);
  Recorder rec;
  box->on_batch(0, at_times({5, 3, 8, 3}), rec);
  EXPECT_TRUE(rec.batches.empty());
  box->on_watermark(0, 6, rec);
  EXPECT_EQ(times_of(rec.rows()), (std::vector<EventTime>{3, 3, 5}));
  EXPECT_EQ(ints_of(rec.rows(), 0), (std::vector<int64_t>{1, 3, 0})) << "ties keep arrival order";
  EXPECT_EQ(rec.watermarks, (std::vector<EventTime>{6}));
  box->on_batch(0, at_times({4, 7}), rec);
  EXPECT_EQ(box->stats().late_dropped, 1u);
  box->on_watermark(0, kMaxWatermark, rec);
  EXPECT_EQ(times_of(rec.rows()), (std::vector<EventTime>{3, 3, 5, 7, 8}));
}

TEST(BSort, SortsByAField) {
  auto box = build_ok("bsort", R"({"slack": 3, "by": "price"})", {bid_schema()});
  ASSERT_NE(box, nullptr);
  Recorder rec;
  box->on_batch(0, bids({{0, 30, "", 1}, {1, 10, "", 2}, {2, 20, "", 3}, {3, 40, "", 4}, {4, 5, "", 5}}), rec);
  EXPECT_EQ(ints_of(rec.rows(), 1), (std::vector<int64_t>{10, 5}));
  // The watermark flushes rows with event time below it (here times 1, 3),
  // in price order; the rest stay.
  box->on_watermark(0, 4, rec);
  EXPECT_EQ(ints_of(rec.rows(), 1), (std::vector<int64_t>{10, 5, 20, 30}));
  box->on_watermark(0, kMaxWatermark, rec);
  EXPECT_EQ(ints_of(rec.rows(), 1), (std::vector<int64_t>{10, 5, 20, 30, 40}));
}

TEST(BSort, MatchesAPlainReferenceOverRandomInput) {
  // Reference: a std::set ordered by (key, arrival), popped the same way.
  // Wide disorder pins many input batches, exercising the compaction.
  for (uint64_t seed = 0; seed < 6; ++seed) {
    std::mt19937_64 rng(seed);
    const size_t slack = 1 + rng() % 300;
    const bool by_price = seed % 2 == 1;
    auto box = build_ok("bsort", by_price ? "{\"slack\": " + std::to_string(slack) + ", \"by\": \"price\"}"
                                          : "{\"slack\": " + std::to_string(slack) + "}",
                        {bid_schema()});
    ASSERT_NE(box, nullptr);
    std::set<std::tuple<int64_t, uint64_t, EventTime, int64_t>> held;  // key, arrival, time, id
    std::vector<std::pair<EventTime, int64_t>> want;
    auto pop = [&] {
      want.emplace_back(std::get<2>(*held.begin()), std::get<3>(*held.begin()));
      held.erase(held.begin());
    };
    Recorder rec;
    uint64_t arrival = 0;
    int64_t id = 0;
    EventTime wm = 0;
    for (size_t step = 0; step < 40; ++step) {
      if (step % 7 == 6) {
        wm += 200;
        box->on_watermark(0, wm, rec);
        std::vector<std::tuple<int64_t, uint64_t, EventTime, int64_t>> keep;
        for (const auto& h : held) {
          if (std::get<2>(h) < wm) want.emplace_back(std::get<2>(h), std::get<3>(h));
          else keep.push_back(h);
        }
        held = {keep.begin(), keep.end()};
        continue;
      }
      std::vector<Bid> rows;
      for (size_t r = 0; r < 1000; ++r) {
        const EventTime t = wm + static_cast<EventTime>(rng() % 2000);
        const int64_t price = static_cast<int64_t>(rng() % 5000);
        rows.push_back({id, price, "", t});
        held.emplace(by_price ? price : t, arrival++, t, id++);
        if (held.size() > slack) pop();
      }
      box->on_batch(0, bids(rows), rec);
    }
    box->on_watermark(0, kMaxWatermark, rec);
    while (!held.empty()) pop();
    auto rows = rec.rows();
    ASSERT_EQ(rows.size(), want.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      ASSERT_EQ(rows[r].time, want[r].first) << "seed " << seed << " row " << r;
      ASSERT_EQ(std::get<int64_t>(rows[r].values[0]), want[r].second);
    }
  }
}

TEST(BSort, ReportsEveryOptionError) {
  auto s = bid_schema();
  auto d = build_errors("bsort", R"({})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".slack", "missing required option"));
  d = build_errors("bsort", R"({"slack": -1})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".slack", "out of range"));
  d = build_errors("bsort", R"({"slack": 1.5})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".slack", "expected an integer"));
  d = build_errors("bsort", R"({"slack": 1, "by": "channel"})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".by", "is string"));
  d = build_errors("bsort", R"({"slack": 1, "by": "prise"})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".by", "unknown field 'prise'"));
  d = build_errors("bsort", R"({"slack": 1, "order": "asc"})", {s});
  EXPECT_TRUE(has_error(d, std::string(kOpts) + ".order", "unknown option"));
  d = build_errors("bsort", R"({"slack": 1})", {s, s});
  EXPECT_TRUE(has_error(d, kPath, "needs 1 input"));
}

// --------------------------------------------------------------------------
// Snapshot and restore, every box

struct BoxCase {
  std::string type;
  std::string options;
  size_t inputs;
};

std::vector<BoxCase> all_cases() {
  return {
      {"filter", R"({"predicates": ["price > 50", "channel = 'r1'"]})", 1},
      {"map", R"({"fields": [{"name": "p", "expr": "price + 1"}, {"name": "c", "expr": "channel"}],
                  "event_time": "_time + 0"})",
       1},
      {"union", "{}", 3},
      {"split", R"({"mode": "hash", "keys": ["channel"], "outputs": 3})", 1},
      {"split", R"({"mode": "round_robin", "outputs": 3})", 1},
      {"split", R"({"mode": "predicate", "predicates": ["price < 30"], "else_output": true})", 1},
      {"merge", "{}", 2},
      {"merge", R"({"mode": "combine", "group_by": ["channel"], "aggregates": [{"field": "price", "fn": "sum"},
                    {"field": "auction", "fn": "max"}]})",
       2},
      {"bsort", R"({"slack": 5})", 1},
      {"bsort", R"({"slack": 3, "by": "price"})", 1},
  };
}

// A random event sequence for a box with `inputs` inputs: (input, step).
std::vector<std::pair<size_t, Step>> random_events(std::mt19937_64& rng, size_t inputs, size_t count) {
  std::vector<std::pair<size_t, Step>> out;
  std::vector<EventTime> wm(inputs, 0);
  int64_t id = 0;
  for (size_t e = 0; e < count; ++e) {
    const size_t in = rng() % inputs;
    if (rng() % 4 == 0) {
      wm[in] += static_cast<EventTime>(rng() % 10);
      out.push_back({in, {true, {}, wm[in]}});
      continue;
    }
    std::vector<Bid> rows;
    const size_t n = rng() % 7;
    for (size_t r = 0; r < n; ++r)
      rows.push_back({id++, static_cast<int64_t>(rng() % 100), std::string("r") + std::to_string(rng() % 3),
                      wm[in] - 2 + static_cast<EventTime>(rng() % 15)});
    out.push_back({in, {false, bids(rows), 0}});
  }
  for (size_t in = 0; in < inputs; ++in) out.push_back({in, {true, {}, kMaxWatermark}});
  return out;
}

void apply(Box& box, const std::pair<size_t, Step>& ev, Recorder& rec) {
  if (ev.second.is_watermark) box.on_watermark(ev.first, ev.second.wm, rec);
  else box.on_batch(ev.first, ev.second.batch, rec);
}

TEST(Snapshot, RestoredMidStreamContinuesExactlyLikeTheOriginal) {
  auto s = bid_schema();
  for (const auto& c : all_cases()) {
    SCOPED_TRACE(c.type + " " + c.options);
    for (uint64_t seed = 0; seed < 10; ++seed) {
      std::mt19937_64 rng(seed);
      auto events = random_events(rng, c.inputs, 60);
      const size_t cut = rng() % events.size();
      std::vector<SchemaPtr> ins(c.inputs, s);

      auto whole = build_ok(c.type, c.options, ins);
      ASSERT_NE(whole, nullptr);
      Recorder full;
      for (size_t e = 0; e < events.size(); ++e) {
        if (e == cut) full.clear();
        apply(*whole, events[e], full);
      }

      auto first = build_ok(c.type, c.options, ins);
      Recorder ignored;
      for (size_t e = 0; e < cut; ++e) apply(*first, events[e], ignored);
      const std::string bytes = first->snapshot();
      auto second = build_ok(c.type, c.options, ins);
      Status st = second->restore(bytes);
      ASSERT_TRUE(st.ok()) << st.error().message;
      EXPECT_EQ(second->snapshot(), bytes);
      Recorder rest;
      for (size_t e = cut; e < events.size(); ++e) apply(*second, events[e], rest);
      EXPECT_EQ(rest.rows(), full.rows()) << "seed " << seed << " cut " << cut;
      EXPECT_EQ(rest.watermarks, full.watermarks);
      EXPECT_EQ(first->stats().late_dropped + second->stats().late_dropped, whole->stats().late_dropped);
    }
  }
}

TEST(Snapshot, RefusesTruncatedTrailingAndForeignBytesAndStaysUsable) {
  auto s = bid_schema();
  std::vector<std::string> snapshots;
  for (const auto& c : all_cases()) {
    SCOPED_TRACE(c.type + " " + c.options);
    std::mt19937_64 rng(42);
    auto events = random_events(rng, c.inputs, 25);
    std::vector<SchemaPtr> ins(c.inputs, s);
    auto box = build_ok(c.type, c.options, ins);
    ASSERT_NE(box, nullptr);
    Recorder rec;
    for (size_t e = 0; e + c.inputs < events.size(); ++e) apply(*box, events[e], rec);  // not ended
    const std::string bytes = box->snapshot();
    snapshots.push_back(bytes);
    auto fresh = build_ok(c.type, c.options, ins);
    const std::string before = fresh->snapshot();
    for (size_t n = 0; n < bytes.size(); ++n) {
      Status st = fresh->restore(std::string_view(bytes.data(), n));
      ASSERT_FALSE(st.ok()) << "prefix " << n << " of " << bytes.size();
      EXPECT_EQ(st.error().code, Errc::corrupt);
      ASSERT_EQ(fresh->snapshot(), before) << "a refused restore changed the box";
    }
    Status st = fresh->restore(bytes + "x");
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.error().code, Errc::corrupt);
    EXPECT_TRUE(fresh->restore(bytes).ok());
    EXPECT_EQ(fresh->snapshot(), bytes);
  }
  // A snapshot of one box type is refused by another with the same ports.
  auto filter = build_ok("filter", R"({"predicates": ["price > 1"], "drop_unmatched": true})", {s});
  auto map = build_ok("map", R"({"fields": [{"name": "p", "expr": "price"}]})", {s});
  Status st = map->restore(filter->snapshot());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, Errc::corrupt);
}

}  // namespace
}  // namespace entente::engine
