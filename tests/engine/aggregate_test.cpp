// Aggregate box: window semantics against a brute-force reference, late
// rows and slack, watermarks, count windows, time-outs, emit_empty, option
// errors, snapshots (truncated, foreign, key-group subsets), max_by/min_by,
// and the ungrouped fast path against the grouped path; the full list of
// option errors and of snapshot refusals, pinned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/boxes/boxes.h"
#include "rapidjson/document.h"

namespace entente::engine {
namespace {

struct Recorder : Emitter {
  std::vector<Batch> batches;
  std::vector<EventTime> wms;
  void emit(size_t /*port*/, Batch b) override { batches.push_back(std::move(b)); }
  void emit_watermark(EventTime w) override { wms.push_back(w); }
  size_t rows() const {
    size_t n = 0;
    for (const auto& b : batches) n += b.rows();
    return n;
  }
  // Row `r` (over all batches) as values, then its event time.
  std::vector<Value> row(size_t r, EventTime* t = nullptr) const {
    for (const auto& b : batches) {
      if (r >= b.rows()) {
        r -= b.rows();
        continue;
      }
      std::vector<Value> v;
      for (size_t c = 0; c < b.columns.size(); ++c) v.push_back(b.column(c).value(r));
      if (t) *t = b.event_time[r];
      return v;
    }
    return {};
  }
};

SchemaPtr schema() {
  return make_schema({{"auction", Type::Int64}, {"bidder", Type::String}, {"price", Type::Int64},
                      {"ratio", Type::Double}});
}

std::unique_ptr<Box> build(const std::string& json, Diagnostics& diag, SchemaPtr in = schema()) {
  rapidjson::Document d;
  d.Parse(json.c_str());
  EXPECT_FALSE(d.HasParseError()) << json;
  BoxBuildContext ctx{"$.boxes[1]", {std::move(in)}, &diag};
  return boxes::make_aggregate(d, ctx);
}

std::unique_ptr<Box> build(const std::string& json) {
  Diagnostics diag;
  auto b = build(json, diag);
  EXPECT_TRUE(b != nullptr) << diag.to_string();
  return b;
}

struct In {
  int64_t auction;
  std::string bidder;
  int64_t price;
  double ratio;
  EventTime t;
};

Batch batch_of(const std::vector<In>& rows) {
  BatchBuilder b(schema());
  for (const In& r : rows) {
    b.column(0).ints.push_back(r.auction);
    b.column(1).append_str(r.bidder);
    b.column(2).ints.push_back(r.price);
    b.column(3).doubles.push_back(r.ratio);
    b.event_time().push_back(r.t);
    b.seq().push_back(0);
  }
  return b.finish();
}

uint32_t key_group_int(int64_t v) { return key_group_of(hash_int(v)); }

// Rows with many price ties over keys 0..6, up to time 45, the watermark at 30.
std::string some_state_for_by(Box& box) {
  Recorder rec;
  std::vector<In> rows;
  static const char* const kNames[] = {"s0", "s1", "s2"};
  for (int i = 0; i < 40; ++i) rows.push_back({i % 7, kNames[i % 3], i % 4, i / 3.0, i + 5});
  box.on_batch(0, batch_of(rows), rec);
  box.on_watermark(0, 30, rec);
  return box.snapshot();
}

TEST(Aggregate, TumblingWindowValues) {
  auto box = build(R"({"group_by":["auction"],"window":{"type":"tumbling","size":"10ms"},
      "aggregates":[{"fn":"count"},{"fn":"sum","field":"price"},{"fn":"min","field":"price"},
        {"fn":"max","field":"ratio"},{"fn":"avg","field":"price"},{"fn":"first","field":"bidder"},
        {"fn":"last","field":"price","as":"lp"}]})");
  const auto& out = *box->output_schema(0);
  EXPECT_EQ(out.to_string(),
            "auction:int64, window_start:timestamp, window_end:timestamp, count:int64, sum_price:int64, "
            "min_price:int64, max_ratio:double, avg_price:double, first_bidder:string, lp:int64");
  Recorder rec;
  // Out of order within the window: first/last follow event time.
  box->on_batch(0, batch_of({{1, "x", 10, 0.5, 5}, {1, "y", 4, 2.5, 2}, {1, "z", 7, 1.0, 9}, {1, "w", 1, 0.0, 12}}),
                rec);
  EXPECT_EQ(rec.rows(), 0u);
  box->on_watermark(0, 10, rec);
  ASSERT_EQ(rec.rows(), 1u);
  EventTime t;
  auto row = rec.row(0, &t);
  EXPECT_EQ(t, 9);
  EXPECT_EQ(row, (std::vector<Value>{int64_t{1}, int64_t{0}, int64_t{10}, int64_t{3}, int64_t{21}, int64_t{4},
                                     2.5, 7.0, std::string("y"), int64_t{7}}));
  // Output watermark: the next row can only be [10,20)'s, stamped 19.
  ASSERT_FALSE(rec.wms.empty());
  EXPECT_EQ(rec.wms.back(), 19);
  box->on_watermark(0, kMaxWatermark, rec);
  ASSERT_EQ(rec.rows(), 2u);
  EXPECT_EQ(rec.row(1)[0], Value(int64_t{1}));
  EXPECT_EQ(rec.row(1)[1], Value(int64_t{10}));
  EXPECT_EQ(rec.wms.back(), kMaxWatermark);
  EXPECT_EQ(rec.batches[0].seq[0], 0u);
  EXPECT_EQ(rec.batches[1].seq[0], 1u);
}

TEST(Aggregate, SumOfDoubleAndExprAndBoolMinMax) {
  auto box = build(R"({"window":{"type":"tumbling","size":100},
      "aggregates":[{"fn":"sum","field":"ratio"},{"fn":"max","expr":"price * 2","as":"m"},
                    {"fn":"min","expr":"price > 5","as":"all_big"},{"fn":"max","field":"bidder"}]})");
  EXPECT_EQ(box->output_schema(0)->to_string(),
            "window_start:timestamp, window_end:timestamp, sum_ratio:double, m:int64, all_big:bool, max_bidder:string");
  Recorder rec;
  box->on_batch(0, batch_of({{1, "b", 10, 0.25, 1}, {2, "c", 3, 0.5, 2}, {3, "a", 8, 1.0, 50}}), rec);
  box->on_watermark(0, kMaxWatermark, rec);
  ASSERT_EQ(rec.rows(), 1u);
  EXPECT_EQ(rec.row(0), (std::vector<Value>{int64_t{0}, int64_t{100}, 1.75, int64_t{20}, false, std::string("c")}));
}

// The brute-force reference: every window with rows, in end order; within
// one, groups by key group, then by their first arrival in the window.
struct RefRow {
  std::string key;
  int64_t start, end;
  int64_t count, sum, min;
  double max_ratio;
  std::string first_bidder;
  int64_t last_price;
  bool operator==(const RefRow&) const = default;
};

std::vector<RefRow> reference(const std::vector<In>& rows, bool string_key, int64_t size, int64_t slide) {
  auto fdiv = [](int64_t a, int64_t b) { return a / b - ((a % b != 0 && a < 0) ? 1 : 0); };
  int64_t lo = INT64_MAX, hi = INT64_MIN;
  for (const In& r : rows) {
    lo = std::min(lo, r.t);
    hi = std::max(hi, r.t);
  }
  std::vector<RefRow> out;
  for (int64_t e = (fdiv(lo - size, slide) + 1) * slide + size; e - size <= hi; e += slide) {
    struct G {
      uint32_t kg;
      size_t first;
      RefRow row;
      int64_t ft, lt;
    };
    std::map<std::string, G> groups;
    for (size_t i = 0; i < rows.size(); ++i) {
      const In& r = rows[i];
      if (r.t < e - size || r.t >= e) continue;
      const std::string key = string_key ? r.bidder : std::to_string(r.auction);
      auto it = groups.find(key);
      if (it == groups.end()) {
        const uint32_t kg = string_key ? key_group_of(hash_bytes(r.bidder)) : key_group_int(r.auction);
        G g{kg, i, RefRow{key, e - size, e, 0, 0, INT64_MAX, -HUGE_VAL, "", 0}, INT64_MAX, INT64_MIN};
        it = groups.emplace(key, g).first;
      }
      RefRow& x = it->second.row;
      ++x.count;
      x.sum += r.price;
      x.min = std::min(x.min, r.price);
      x.max_ratio = std::max(x.max_ratio, r.ratio);
      if (r.t < it->second.ft) {
        it->second.ft = r.t;
        x.first_bidder = r.bidder;
      }
      if (r.t >= it->second.lt) {
        it->second.lt = r.t;
        x.last_price = r.price;
      }
    }
    std::vector<G> gs;
    for (auto& [k, g] : groups) gs.push_back(g);
    std::sort(gs.begin(), gs.end(), [](const G& a, const G& b) { return a.kg != b.kg ? a.kg < b.kg : a.first < b.first; });
    for (const G& g : gs) out.push_back(g.row);
  }
  return out;
}

TEST(Aggregate, MatchesBruteForceOverRandomInputs) {
  struct Shape {
    int64_t size, slide;
  };
  const Shape shapes[] = {{10, 10}, {30, 12}, {20, 5}, {7, 3}, {1, 1}};
  for (int seed = 0; seed < 40; ++seed) {
    std::mt19937_64 rng(static_cast<uint64_t>(seed) + 99);
    const Shape sh = shapes[seed % std::size(shapes)];
    const bool string_key = seed % 2 == 1;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::vector<In> rows;
    int64_t clock = -50;
    for (int i = 0; i < 300; ++i) {
      clock += static_cast<int64_t>(rng() % 4);
      static const char* const kNames[] = {"ann", "bo", "cy", "dee", ""};
      rows.push_back(In{static_cast<int64_t>(rng() % 9), kNames[rng() % 5], static_cast<int64_t>(rng() % 100) - 20,
                        static_cast<double>(rng() % 50) / 4.0, clock - static_cast<int64_t>(rng() % 25)});
    }
    const std::string window = sh.size == sh.slide
                                   ? R"({"type":"tumbling","size":)" + std::to_string(sh.size) + "}"
                                   : R"({"type":"sliding","size":)" + std::to_string(sh.size) +
                                         R"(,"slide":)" + std::to_string(sh.slide) + "}";
    auto box = build(std::string(R"({"group_by":[")") + (string_key ? "bidder" : "auction") +
                     R"("],"window":)" + window +
                     R"(,"aggregates":[{"fn":"count"},{"fn":"sum","field":"price"},{"fn":"min","field":"price"},
                        {"fn":"max","field":"ratio"},{"fn":"first","field":"bidder"},{"fn":"last","field":"price"}]})");
    Recorder rec;
    for (size_t i = 0; i < rows.size();) {
      const size_t n = std::min(rows.size() - i, size_t{1} + rng() % 17);
      box->on_batch(0, batch_of(std::vector<In>(rows.begin() + static_cast<ptrdiff_t>(i),
                                                rows.begin() + static_cast<ptrdiff_t>(i + n))),
                    rec);
      i += n;
    }
    box->on_watermark(0, kMaxWatermark, rec);
    const auto want = reference(rows, string_key, sh.size, sh.slide);
    ASSERT_EQ(rec.rows(), want.size());
    for (size_t r = 0; r < want.size(); ++r) {
      EventTime t;
      auto v = rec.row(r, &t);
      RefRow got{string_key ? std::get<std::string>(v[0]) : std::to_string(std::get<int64_t>(v[0])),
                 std::get<int64_t>(v[1]), std::get<int64_t>(v[2]), std::get<int64_t>(v[3]), std::get<int64_t>(v[4]),
                 std::get<int64_t>(v[5]), std::get<double>(v[6]), std::get<std::string>(v[7]),
                 std::get<int64_t>(v[8])};
      EXPECT_EQ(got, want[r]) << "row " << r;
      EXPECT_EQ(t, want[r].end - 1);
    }
  }
}

TEST(Aggregate, LateRowsAreCountedAndDroppedAndSlackDelaysClosing) {
  auto box = build(R"({"group_by":["auction"],"window":{"type":"tumbling","size":10},"slack":"5ms",
                       "aggregates":[{"fn":"count"}]})");
  Recorder rec;
  box->on_batch(0, batch_of({{1, "", 0, 0, 3}, {1, "", 0, 0, 11}}), rec);
  box->on_watermark(0, 12, rec);  // 12 < 10 + 5: [0,10) still open
  EXPECT_EQ(rec.rows(), 0u);
  box->on_batch(0, batch_of({{1, "", 0, 0, 4}}), rec);  // in time thanks to the slack
  EXPECT_EQ(box->stats().late_dropped, 0u);
  box->on_watermark(0, 15, rec);
  ASSERT_EQ(rec.rows(), 1u);
  EXPECT_EQ(rec.row(0)[3], Value(int64_t{2}));
  // [0,10) has closed: a row at 9 is late; [10,20) is open: 10 is not.
  box->on_batch(0, batch_of({{1, "", 0, 0, 9}, {1, "", 0, 0, 10}}), rec);
  EXPECT_EQ(box->stats().late_dropped, 1u);
  // Rows outside the supported time range are late too.
  box->on_batch(0, batch_of({{1, "", 0, 0, INT64_MAX - 1}}), rec);
  EXPECT_EQ(box->stats().late_dropped, 2u);
  box->on_watermark(0, kMaxWatermark, rec);
  ASSERT_EQ(rec.rows(), 2u);
  EXPECT_EQ(rec.row(1)[3], Value(int64_t{2}));
  for (size_t i = 1; i < rec.wms.size(); ++i) EXPECT_LT(rec.wms[i - 1], rec.wms[i]);
}

TEST(Aggregate, CountWindows) {
  auto box = build(R"({"group_by":["auction"],"window":{"type":"sliding","by":"count","size":3,"slide":2},
                       "aggregates":[{"fn":"sum","field":"price"},{"fn":"first","field":"price"},
                                     {"fn":"last","field":"price"}]})");
  EXPECT_EQ(box->output_schema(0)->to_string(), "auction:int64, sum_price:int64, first_price:int64, last_price:int64");
  Recorder rec;
  std::vector<In> rows;
  for (int i = 1; i <= 8; ++i) rows.push_back({7, "", i, 0, 100 - i});  // event times decrease: arrival decides
  rows.push_back({8, "", 1000, 0, 0});
  box->on_batch(0, batch_of(rows), rec);
  // Windows over tuples [0,3), [2,5), [4,7) of key 7.
  ASSERT_EQ(rec.rows(), 3u);
  EventTime t;
  EXPECT_EQ(rec.row(0, &t), (std::vector<Value>{int64_t{7}, int64_t{6}, int64_t{1}, int64_t{3}}));
  EXPECT_EQ(t, 97);
  EXPECT_EQ(rec.row(1), (std::vector<Value>{int64_t{7}, int64_t{12}, int64_t{3}, int64_t{5}}));
  EXPECT_EQ(rec.row(2), (std::vector<Value>{int64_t{7}, int64_t{18}, int64_t{5}, int64_t{7}}));
  // Partial windows are not emitted at the end of the stream.
  box->on_watermark(0, kMaxWatermark, rec);
  EXPECT_EQ(rec.rows(), 3u);
}

TEST(Aggregate, CountWindowsDropRowsBelowTheWatermark) {
  auto box = build(R"({"window":{"type":"tumbling","by":"count","size":2},"aggregates":[{"fn":"count"}]})");
  Recorder rec;
  box->on_watermark(0, 50, rec);
  box->on_batch(0, batch_of({{1, "", 0, 0, 10}, {1, "", 0, 0, 60}, {1, "", 0, 0, 70}}), rec);
  EXPECT_EQ(box->stats().late_dropped, 1u);
  ASSERT_EQ(rec.rows(), 1u);
  EventTime t;
  rec.row(0, &t);
  EXPECT_EQ(t, 70);
}

TEST(Aggregate, TimeoutClosesAWindowEarly) {
  auto box = build(R"({"group_by":["auction"],"window":{"type":"tumbling","size":"10s"},"timeout":"2s",
                       "aggregates":[{"fn":"count"}]})");
  Recorder rec;
  box->on_tick(1000, rec);
  box->on_batch(0, batch_of({{1, "", 0, 0, 100}, {2, "", 0, 0, 200}}), rec);
  box->on_tick(2500, rec);
  EXPECT_EQ(rec.rows(), 0u);
  box->on_tick(3000, rec);  // open since 1000
  ASSERT_EQ(rec.rows(), 2u);
  // The window was emitted: further rows of it are late, for those groups.
  box->on_batch(0, batch_of({{1, "", 0, 0, 300}, {3, "", 0, 0, 300}}), rec);
  EXPECT_EQ(box->stats().late_dropped, 1u);
  box->on_watermark(0, kMaxWatermark, rec);
  ASSERT_EQ(rec.rows(), 3u);
  EXPECT_EQ(rec.row(2)[0], Value(int64_t{3}));
}

TEST(Aggregate, EmitEmptyFillsGapsBetweenWindows) {
  auto box = build(R"({"window":{"type":"tumbling","size":10},"emit_empty":true,
                       "aggregates":[{"fn":"count"},{"fn":"avg","field":"price"}]})");
  Recorder rec;
  box->on_batch(0, batch_of({{1, "", 4, 0, 5}, {1, "", 6, 0, 38}}), rec);
  box->on_watermark(0, kMaxWatermark, rec);
  ASSERT_EQ(rec.rows(), 4u);
  EXPECT_EQ(rec.row(0), (std::vector<Value>{int64_t{0}, int64_t{10}, int64_t{1}, 4.0}));
  EXPECT_EQ(rec.row(1), (std::vector<Value>{int64_t{10}, int64_t{20}, int64_t{0}, 0.0}));
  EXPECT_EQ(rec.row(2), (std::vector<Value>{int64_t{20}, int64_t{30}, int64_t{0}, 0.0}));
  EXPECT_EQ(rec.row(3), (std::vector<Value>{int64_t{30}, int64_t{40}, int64_t{1}, 6.0}));
}

TEST(Aggregate, ManyKeysAreForgottenOnceTheirWindowsClose) {
  auto box = build(R"({"group_by":["auction"],"window":{"type":"tumbling","size":10},"aggregates":[{"fn":"count"}]})");
  Recorder rec;
  for (int64_t w = 0; w < 50; ++w) {
    std::vector<In> rows;
    for (int64_t k = 0; k < 200; ++k) rows.push_back({w * 1000 + k, "", 0, 0, w * 10 + k % 10});
    box->on_batch(0, batch_of(rows), rec);
    box->on_watermark(0, w * 10 + 10, rec);
  }
  EXPECT_EQ(rec.rows(), 50u * 200u);
  // Only a few windows' worth of state survives in the snapshot.
  EXPECT_LT(box->snapshot().size(), 200u * 50u);
}

// max_by/min_by: the value of `field` from the row with the largest
// (smallest) `by`; ties go to the earliest event time, then the earliest
// arrival.
TEST(Aggregate, MaxByAndMinByPickTheRowWithTheExtremeValue) {
  for (const char* group_by : {"", R"("group_by":["auction"],)"}) {
    SCOPED_TRACE(group_by);
    auto box = build(std::string("{") + group_by + R"("window":{"type":"tumbling","size":10},
        "aggregates":[{"fn":"max_by","field":"bidder","by":"price","as":"top"},
                      {"fn":"min_by","field":"ratio","by":"price"},
                      {"fn":"max_by","field":"price","by":"ratio","as":"p"}]})");
    const std::string prefix = *group_by ? "auction:int64, " : "";
    EXPECT_EQ(box->output_schema(0)->to_string(),
              prefix + "window_start:timestamp, window_end:timestamp, top:string, min_by_ratio:double, p:int64");
    Recorder rec;
    // Price 9 three times: "a" and "c" share time 5, but "late", in the
    // second batch, is at time 3, the earliest.
    box->on_batch(0, batch_of({{1, "a", 9, 0.5, 5}, {1, "b", 1, 1.5, 6}, {1, "c", 9, 2.5, 5}}), rec);
    box->on_batch(0, batch_of({{1, "late", 9, 0.25, 3}, {1, "d", 1, 3.5, 2}, {1, "e", 4, 3.5, 8}}), rec);
    box->on_watermark(0, kMaxWatermark, rec);
    ASSERT_EQ(rec.rows(), 1u);
    auto row = rec.row(0);
    const size_t k = *group_by ? 1 : 0;
    EXPECT_EQ(row[k + 2], Value(std::string("late")));
    EXPECT_EQ(row[k + 3], Value(3.5));  // min price 1: rows at 6 and 2, the one at 2
    EXPECT_EQ(row[k + 4], Value(int64_t{1}));  // max ratio 3.5 at times 2 and 8: price 1
  }
}

TEST(Aggregate, MaxByRanksNaNBelowEveryNumber) {
  auto box = build(R"({"window":{"type":"tumbling","size":10},
      "aggregates":[{"fn":"max_by","field":"price","by":"ratio"},{"fn":"min_by","field":"price","by":"ratio"}]})");
  Recorder rec;
  const double nan = std::nan("");
  box->on_batch(0, batch_of({{0, "", 1, nan, 1}, {0, "", 2, 0.5, 2}, {0, "", 3, nan, 3}, {0, "", 4, -1.0, 4}}), rec);
  box->on_batch(0, batch_of({{0, "", 5, nan, 11}}), rec);
  box->on_watermark(0, kMaxWatermark, rec);
  ASSERT_EQ(rec.rows(), 2u);
  EXPECT_EQ(rec.row(0), (std::vector<Value>{int64_t{0}, int64_t{10}, int64_t{2}, int64_t{4}}));
  // Only NaN: the earliest row.
  EXPECT_EQ(rec.row(1), (std::vector<Value>{int64_t{10}, int64_t{20}, int64_t{5}, int64_t{5}}));
}

TEST(Aggregate, MaxByInSlidingAndCountWindows) {
  // Sliding: the pick of a window merges its panes.
  auto box = build(R"({"window":{"type":"sliding","size":20,"slide":10},
      "aggregates":[{"fn":"max_by","field":"bidder","by":"price"}]})");
  Recorder rec;
  box->on_batch(0, batch_of({{0, "x", 5, 0, 3}, {0, "y", 7, 0, 12}, {0, "z", 7, 0, 12}, {0, "w", 7, 0, 25}}), rec);
  box->on_watermark(0, kMaxWatermark, rec);
  ASSERT_EQ(rec.rows(), 4u);
  EXPECT_EQ(rec.row(0)[2], Value(std::string("x")));  // [-10,10)
  EXPECT_EQ(rec.row(1)[2], Value(std::string("y")));  // [0,20)
  EXPECT_EQ(rec.row(2)[2], Value(std::string("y")));  // [10,30): y and z at 12, y first
  EXPECT_EQ(rec.row(3)[2], Value(std::string("w")));  // [20,40)
  // Count windows: arrival decides ties, whatever the event times.
  auto cbox = build(R"({"group_by":["auction"],"window":{"type":"tumbling","by":"count","size":3},
      "aggregates":[{"fn":"min_by","field":"bidder","by":"price"}]})");
  Recorder crec;
  cbox->on_batch(0, batch_of({{1, "p", 4, 0, 9}, {1, "q", 2, 0, 8}}), crec);
  cbox->on_batch(0, batch_of({{1, "r", 2, 0, 1}}), crec);
  ASSERT_EQ(crec.rows(), 1u);
  EXPECT_EQ(crec.row(0), (std::vector<Value>{int64_t{1}, std::string("q")}));
}

// Without group_by, time windows take a fast path (runs of rows per pane,
// accumulators in registers): it must give what the grouped path gives for
// a constant key, for every function, window shape, batching and lateness.
TEST(Aggregate, UngroupedFastPathEqualsGroupedPath) {
  const std::string aggs = R"("aggregates":[{"fn":"count"},{"fn":"sum","field":"price"},{"fn":"sum","field":"ratio"},
      {"fn":"min","field":"price"},{"fn":"max","field":"price"},{"fn":"max","field":"ratio"},
      {"fn":"min","field":"bidder"},{"fn":"avg","field":"price"},{"fn":"first","field":"bidder"},
      {"fn":"last","field":"price"},{"fn":"max_by","field":"bidder","by":"price"},
      {"fn":"min_by","field":"ratio","by":"price"},{"fn":"max_by","field":"price","by":"ratio"},
      {"fn":"max","expr":"price * 3","as":"p3"},{"fn":"min_by","field":"auction","by":"price"}])";
  const char* const windows[] = {R"({"type":"tumbling","size":10})", R"({"type":"sliding","size":30,"slide":12})",
                                 R"({"type":"sliding","size":7,"slide":3})"};
  for (int seed = 0; seed < 30; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(static_cast<uint64_t>(seed) + 7);
    const std::string window = std::string(R"("window":)") + windows[seed % 3] + (seed % 2 ? R"(,"slack":4)" : "");
    auto fast = build("{" + window + "," + aggs + "}");
    auto slow = build(R"({"group_by":["auction"],)" + window + "," + aggs + "}");
    Recorder a, b;
    int64_t clock = -40;
    static const char* const kNames[] = {"ann", "bo", "cy", ""};
    for (int batch = 0; batch < 40; ++batch) {
      std::vector<In> rows;
      const int n = 1 + static_cast<int>(rng() % 30);
      for (int i = 0; i < n; ++i) {
        clock += static_cast<int64_t>(rng() % 3);
        // Mostly in order, some rows late; few distinct prices: many ties.
        const int64_t t = rng() % 5 == 0 ? clock - static_cast<int64_t>(rng() % 40) : clock;
        rows.push_back(In{0, kNames[rng() % 4], static_cast<int64_t>(rng() % 6) - 2,
                          static_cast<double>(rng() % 5) / 2.0, t});
      }
      fast->on_batch(0, batch_of(rows), a);
      slow->on_batch(0, batch_of(rows), b);
      if (rng() % 3 == 0) {
        fast->on_watermark(0, clock - 10, a);
        slow->on_watermark(0, clock - 10, b);
      }
    }
    fast->on_watermark(0, kMaxWatermark, a);
    slow->on_watermark(0, kMaxWatermark, b);
    EXPECT_EQ(fast->stats().late_dropped, slow->stats().late_dropped);
    ASSERT_EQ(a.rows(), b.rows());
    ASSERT_GT(a.rows(), 0u);
    for (size_t r = 0; r < a.rows(); ++r) {
      EventTime ta, tb;
      auto va = a.row(r, &ta), vb = b.row(r, &tb);
      vb.erase(vb.begin());  // the key
      EXPECT_EQ(va, vb) << "row " << r;
      EXPECT_EQ(ta, tb);
    }
    EXPECT_EQ(a.wms, b.wms);
  }
}

// A snapshot taken mid-window and restored into a fresh box continues as
// the original does, for max_by over keys in every key-group half.
TEST(Aggregate, MaxBySurvivesSnapshotAndSplit) {
  const char* def = R"({"group_by":["auction"],"window":{"type":"sliding","size":30,"slide":10},
      "aggregates":[{"fn":"max_by","field":"bidder","by":"price"},{"fn":"min_by","field":"ratio","by":"price"}]})";
  auto box = build(def);
  const std::string bytes = some_state_for_by(*box);
  std::vector<In> more;
  for (int i = 0; i < 30; ++i) more.push_back({i % 7, i % 2 ? "m" : "n", i % 5, i / 4.0, 50 + i});
  Recorder want;
  box->on_batch(0, batch_of(more), want);
  box->on_watermark(0, kMaxWatermark, want);
  ASSERT_GT(want.rows(), 0u);

  auto whole = build(def);
  ASSERT_TRUE(whole->restore(bytes).ok());
  Recorder got;
  whole->on_batch(0, batch_of(more), got);
  whole->on_watermark(0, kMaxWatermark, got);
  ASSERT_EQ(got.rows(), want.rows());
  for (size_t r = 0; r < want.rows(); ++r) EXPECT_EQ(got.row(r), want.row(r)) << r;

  // Split in two by key group: together the halves give every row.
  size_t rows = 0;
  for (uint32_t part = 0; part < 2; ++part) {
    const KeyGroupRange keep = KeyGroupRange::part(part, 2);
    auto half = build(def);
    ASSERT_TRUE(half->restore(bytes, &keep).ok());
    std::vector<In> mine;
    for (const In& r : more)
      if (keep.contains(key_group_int(r.auction))) mine.push_back(r);
    Recorder rec;
    if (!mine.empty()) half->on_batch(0, batch_of(mine), rec);
    half->on_watermark(0, kMaxWatermark, rec);
    for (size_t r = 0; r < rec.rows(); ++r) {
      auto row = rec.row(r);
      EXPECT_TRUE(keep.contains(key_group_int(std::get<int64_t>(row[0]))));
      bool found = false;
      for (size_t w = 0; w < want.rows() && !found; ++w) found = want.row(w) == row;
      EXPECT_TRUE(found) << "row " << r << " of part " << part;
    }
    rows += rec.rows();
  }
  EXPECT_EQ(rows, want.rows());
}

// `top` against the unranked box: per window (window_end, column 2 of a
// box grouped by auction), the rows of groups with fewer than k groups
// ranked strictly above them, in the unranked box's order.
std::vector<std::vector<Value>> ranked_rows(const Recorder& all, size_t col, int64_t k, bool asc) {
  auto better = [&](const Value& x, const Value& y) {
    if (const double* dx = std::get_if<double>(&x)) {
      const double dy = std::get<double>(y);
      if (std::isnan(*dx) || std::isnan(dy)) return !std::isnan(*dx) && std::isnan(dy);
      return asc ? *dx < dy : *dx > dy;
    }
    return asc ? std::get<int64_t>(x) < std::get<int64_t>(y) : std::get<int64_t>(x) > std::get<int64_t>(y);
  };
  std::vector<std::vector<Value>> rows;
  for (size_t r = 0; r < all.rows(); ++r) rows.push_back(all.row(r));
  std::vector<std::vector<Value>> kept;
  for (const auto& row : rows) {
    int64_t above = 0;
    for (const auto& other : rows)
      if (other[2] == row[2] && better(other[col], row[col])) ++above;
    if (above < k) kept.push_back(row);
  }
  return kept;
}

TEST(Aggregate, TopKeepsTheGroupsTiedAtTheMaximum) {
  auto box = build(R"({"group_by":["auction"],"window":{"type":"tumbling","size":10},
                       "aggregates":[{"fn":"count","as":"num"},{"fn":"sum","field":"price"}],
                       "top":{"by":"num"}})");
  // The output schema is the unranked one.
  EXPECT_EQ(box->output_schema(0)->to_string(),
            "auction:int64, window_start:timestamp, window_end:timestamp, num:int64, sum_price:int64");
  Recorder rec;
  // [0,10): auctions 1 and 3 have 3 bids each, 2 has 1, 4 has 2; [10,20): only 5.
  box->on_batch(0, batch_of({{1, "", 1, 0, 0}, {2, "", 2, 0, 1}, {3, "", 3, 0, 2}, {1, "", 4, 0, 3},
                             {4, "", 5, 0, 4}, {3, "", 6, 0, 5}, {4, "", 7, 0, 6}, {3, "", 8, 0, 7},
                             {1, "", 9, 0, 8}, {5, "", 10, 0, 12}}),
                rec);
  box->on_watermark(0, kMaxWatermark, rec);
  ASSERT_EQ(rec.rows(), 3u);
  std::vector<std::vector<Value>> got{rec.row(0), rec.row(1), rec.row(2)};
  const std::vector<Value> one{int64_t{1}, int64_t{0}, int64_t{10}, int64_t{3}, int64_t{14}};
  const std::vector<Value> three{int64_t{3}, int64_t{0}, int64_t{10}, int64_t{3}, int64_t{17}};
  // Ordered by key group, then first arrival, as without top.
  const bool one_first = key_group_int(1) != key_group_int(3) ? key_group_int(1) < key_group_int(3) : true;
  EXPECT_EQ(got[0], one_first ? one : three);
  EXPECT_EQ(got[1], one_first ? three : one);
  EXPECT_EQ(got[2], (std::vector<Value>{int64_t{5}, int64_t{10}, int64_t{20}, int64_t{1}, int64_t{10}}));
  EXPECT_EQ(rec.batches.back().seq.back(), 2u);
}

// Random inputs: top k by count, a sum, or a double sum with NaN, in both
// orders, equals the unranked box's rows filtered by rank.
TEST(Aggregate, TopMatchesTheUnrankedRowsFilteredByRank) {
  struct Case {
    const char* by;
    size_t col;
    int64_t k;
    bool asc;
  };
  const Case cases[] = {{"num", 3, 1, false}, {"num", 3, 2, false}, {"num", 3, 1, true},
                        {"sum_price", 4, 3, false}, {"sum_price", 4, 1, true}, {"sum_ratio", 5, 1, false},
                        {"sum_ratio", 5, 2, true}, {"num", 3, 1000, false}};
  for (int seed = 0; seed < 24; ++seed) {
    const Case& c = cases[static_cast<size_t>(seed) % std::size(cases)];
    SCOPED_TRACE("seed " + std::to_string(seed) + " by " + c.by);
    std::mt19937_64 rng(static_cast<uint64_t>(seed) + 99);
    const std::string def = std::string(R"({"group_by":["auction"],"window":{"type":"sliding","size":20,"slide":5},
        "aggregates":[{"fn":"count","as":"num"},{"fn":"sum","field":"price"},{"fn":"sum","field":"ratio"}])");
    const std::string top = R"(,"top":{"by":")" + std::string(c.by) + R"(","k":)" + std::to_string(c.k) +
                            R"(,"order":")" + (c.asc ? "asc" : "desc") + R"("}})";
    auto ranked = build(def + top);
    auto plain = build(def + "}");
    Recorder a, b;
    int64_t clock = 0;
    for (int batch = 0; batch < 20; ++batch) {
      std::vector<In> rows;
      const int n = 1 + static_cast<int>(rng() % 25);
      for (int i = 0; i < n; ++i) {
        clock += static_cast<int64_t>(rng() % 2);
        const double ratio = rng() % 17 == 0 ? std::nan("") : static_cast<double>(rng() % 4);
        rows.push_back(In{static_cast<int64_t>(rng() % 9), "", static_cast<int64_t>(rng() % 5) - 1, ratio, clock});
      }
      ranked->on_batch(0, batch_of(rows), a);
      plain->on_batch(0, batch_of(rows), b);
      if (rng() % 3 == 0) {
        ranked->on_watermark(0, clock - 3, a);
        plain->on_watermark(0, clock - 3, b);
      }
    }
    ranked->on_watermark(0, kMaxWatermark, a);
    plain->on_watermark(0, kMaxWatermark, b);
    const auto want = ranked_rows(b, c.col, c.k, c.asc);
    ASSERT_EQ(a.rows(), want.size());
    ASSERT_GT(want.size(), 0u);
    if (c.k < 1000) EXPECT_LT(want.size(), b.rows());  // the ranking dropped something
    else EXPECT_EQ(want.size(), b.rows());
    for (size_t r = 0; r < want.size(); ++r) {
      auto row = a.row(r);
      // NaN != NaN: compare the double column by bits.
      ASSERT_EQ(row.size(), want[r].size());
      for (size_t col = 0; col < row.size(); ++col) {
        if (const double* d = std::get_if<double>(&row[col]))
          EXPECT_TRUE(std::isnan(*d) ? std::isnan(std::get<double>(want[r][col])) : row[col] == want[r][col])
              << "row " << r;
        else
          EXPECT_EQ(row[col], want[r][col]) << "row " << r << " column " << col;
      }
    }
    EXPECT_EQ(a.wms, b.wms);
  }
}

// `top` keeps no state of its own: a box restored from a mid-window
// snapshot ranks the same windows as the original.
TEST(Aggregate, TopSurvivesSnapshotAndRestore) {
  const char* def = R"({"group_by":["auction"],"window":{"type":"sliding","size":30,"slide":10},
      "aggregates":[{"fn":"count","as":"num"}],"top":{"by":"num","k":2}})";
  auto box = build(def);
  const std::string bytes = some_state_for_by(*box);
  std::vector<In> more;
  for (int i = 0; i < 30; ++i) more.push_back({i % 5, "", i, 0, 45 + i});
  Recorder want;
  box->on_batch(0, batch_of(more), want);
  box->on_watermark(0, kMaxWatermark, want);
  ASSERT_GT(want.rows(), 0u);
  auto copy = build(def);
  ASSERT_TRUE(copy->restore(bytes).ok());
  Recorder got;
  copy->on_batch(0, batch_of(more), got);
  copy->on_watermark(0, kMaxWatermark, got);
  ASSERT_EQ(got.rows(), want.rows());
  for (size_t r = 0; r < want.rows(); ++r) EXPECT_EQ(got.row(r), want.row(r)) << r;
}

void expect_error(const std::string& json, const std::string& path, const std::string& part) {
  Diagnostics diag;
  auto b = build(json, diag);
  EXPECT_EQ(b, nullptr) << json;
  bool found = false;
  for (const auto& d : diag.items())
    found = found || (d.path == path && d.message.find(part) != std::string::npos);
  EXPECT_TRUE(found) << "wanted " << path << ": ..." << part << "... in\n" << diag.to_string();
}

TEST(Aggregate, BadOptionsAreReportedWithTheirPaths) {
  const std::string p = "$.boxes[1].options";
  expect_error(R"({"window":{"type":"tumbling","size":10},"aggregates":[{"fn":"count"}],"colour":1})", p + ".colour",
               "unknown option");
  expect_error(R"({"aggregates":[{"fn":"count"}]})", p + ".window", "missing");
  expect_error(R"({"group_by":["prise"],"window":{"type":"tumbling","size":10},"aggregates":[{"fn":"count"}]})",
               p + ".group_by[0]", "unknown field 'prise'");
  expect_error(R"({"window":{"type":"hopping","size":10},"aggregates":[{"fn":"count"}]})", p + ".window.type",
               "unknown value");
  expect_error(R"({"window":{"type":"sliding","size":10,"slide":20},"aggregates":[{"fn":"count"}]})",
               p + ".window.slide", "must not exceed");
  expect_error(R"({"window":{"type":"tumbling","size":"ten"},"aggregates":[{"fn":"count"}]})", p + ".window.size",
               "bad duration");
  expect_error(R"({"window":{"type":"tumbling","size":10,"slide":5},"aggregates":[{"fn":"count"}]})",
               p + ".window.slide", "only to sliding");
  expect_error(R"({"window":{"type":"tumbling","size":10},"aggregates":[{"fn":"sum","field":"bidder"}]})",
               p + ".aggregates[0]", "int64 or double");
  expect_error(R"({"window":{"type":"tumbling","size":10},"aggregates":[{"fn":"median","field":"price"}]})",
               p + ".aggregates[0].fn", "unknown value");
  expect_error(R"({"window":{"type":"tumbling","size":10},"aggregates":[{"fn":"max","expr":"prise + 1","as":"x"}]})",
               p + ".aggregates[0].expr", "prise");
  expect_error(R"({"window":{"type":"tumbling","size":10},"aggregates":[{"fn":"max","expr":"price + 1"}]})",
               p + ".aggregates[0]", "needs 'as'");
  expect_error(R"({"window":{"type":"tumbling","size":10},"aggregates":[{"fn":"count","field":"price"}]})",
               p + ".aggregates[0]", "count takes neither");
  expect_error(R"({"window":{"type":"tumbling","size":10},"aggregates":[]})", p + ".aggregates", "1 to 64");
  expect_error(R"({"window":{"type":"tumbling","by":"count","size":10},"slack":3,"aggregates":[{"fn":"count"}]})",
               p + ".slack", "only to time windows");
  expect_error(R"({"group_by":["auction"],"window":{"type":"tumbling","size":10},"emit_empty":true,
                   "aggregates":[{"fn":"count"}]})",
               p + ".emit_empty", "empty group_by");
  expect_error(R"({"window":{"type":"tumbling","size":10},
                   "aggregates":[{"fn":"count"},{"fn":"sum","field":"price","as":"count"}]})",
               p + ".aggregates", "output schema");
  expect_error(R"({"window":{"type":"tumbling","size":10},"aggregates":[{"fn":"count"}],"timeout":0})",
               p + ".timeout", "positive");
  expect_error(R"({"window":{"type":"tumbling","size":10},"aggregates":[{"fn":"max_by","field":"bidder"}]})",
               p + ".aggregates[0]", "needs 'by'");
  expect_error(R"({"window":{"type":"tumbling","size":10},
                   "aggregates":[{"fn":"count"},{"fn":"min_by","field":"bidder","by":"prise"}]})",
               p + ".aggregates[1].by", "unknown field 'prise'");
  expect_error(R"({"window":{"type":"tumbling","size":10},"aggregates":[{"fn":"max_by","field":"price","by":"bidder"}]})",
               p + ".aggregates[0].by", "got string");
  expect_error(R"({"window":{"type":"tumbling","size":10},"aggregates":[{"fn":"max","field":"price","by":"ratio"}]})",
               p + ".aggregates[0].by", "only to max_by and min_by");
  expect_error(R"({"window":{"type":"tumbling","size":10},"aggregates":[{"fn":"max_by","by":"ratio"}]})",
               p + ".aggregates[0]", "exactly one of 'field' and 'expr'");
  expect_error(R"({"window":{"type":"tumbling","size":10},"emit_empty":true,
                   "aggregates":[{"fn":"max_by","field":"price","by":"ratio"}]})",
               p + ".emit_empty", "only count, sum and avg");
}

TEST(Aggregate, BadTopOptionsAreReportedWithTheirPaths) {
  const std::string p = "$.boxes[1].options.top";
  const std::string w = R"("group_by":["auction"],"window":{"type":"tumbling","size":10},)";
  const std::string a = R"("aggregates":[{"fn":"count","as":"num"},{"fn":"max","field":"bidder"}])";
  expect_error("{" + w + a + R"(,"top":{}})", p + ".by", "missing");
  expect_error("{" + w + a + R"(,"top":"num"})", p, "must be an object");
  expect_error("{" + w + a + R"(,"top":{"by":"nun"}})", p + ".by", "'nun' is not an aggregate of this box");
  expect_error("{" + w + a + R"(,"top":{"by":"auction"}})", p + ".by", "aggregates: num, max_bidder");
  expect_error("{" + w + a + R"(,"top":{"by":"max_bidder"}})", p + ".by", "is a string");
  expect_error("{" + w + a + R"(,"top":{"by":"num","k":0}})", p + ".k", "out of range");
  expect_error("{" + w + a + R"(,"top":{"by":"num","k":2000000}})", p + ".k", "out of range");
  expect_error("{" + w + a + R"(,"top":{"by":"num","k":"1"}})", p + ".k", "expected an integer");
  expect_error("{" + w + a + R"(,"top":{"by":"num","order":"down"}})", p + ".order", "unknown value");
  expect_error("{" + w + a + R"(,"top":{"by":"num","limit":3}})", p + ".limit", "unknown option");
  expect_error(R"({"group_by":["auction"],"window":{"type":"tumbling","by":"count","size":10},)" + a +
                   R"(,"top":{"by":"num"}})",
               p, "count windows");
  expect_error("{" + w + a + R"(,"timeout":"1s","top":{"by":"num"}})", p, "timeout");
}

// Every problem of a document with many is reported, each once, in the
// order the options are documented (group_by, window, aggregates, slack,
// timeout, top, emit_empty, unknown keys): what a user reads back.
TEST(Aggregate, AllOptionErrorsAreReportedInOptionOrder) {
  Diagnostics diag;
  auto b = build(R"({"group_by":["auction","prise","auction"],"window":{"type":"tumbling","size":10,"slide":5},
      "aggregates":[{"fn":"count","field":"price"},{"fn":"max_by","field":"bidder"},
                    {"fn":"sum","field":"bidder"},{"fn":"max","expr":"price + 1"},
                    {"fn":"min","field":"price","by":"ratio"},
                    {"fn":"avg","field":"ratio"}],
      "slack":"soon","timeout":0,"top":{"by":"avg_ratio","k":0},"emit_empty":true,"colour":"red"})",
                 diag);
  EXPECT_EQ(b, nullptr);
  EXPECT_EQ(diag.to_string(),
            "$.boxes[1].options.group_by[1]: unknown field 'prise'; input has auction:int64, bidder:string, "
            "price:int64, ratio:double\n"
            "$.boxes[1].options.group_by[2]: field 'auction' listed twice\n"
            "$.boxes[1].options.window.slide: 'slide' applies only to sliding windows\n"
            "$.boxes[1].options.aggregates[0]: count takes neither 'field' nor 'expr' (fields are never null)\n"
            "$.boxes[1].options.aggregates[1]: max_by needs 'by' (the field whose largest or smallest value picks "
            "the row)\n"
            "$.boxes[1].options.aggregates[2]: sum needs an int64 or double value, got string\n"
            "$.boxes[1].options.aggregates[3]: an aggregate over an expression needs 'as' (its output name)\n"
            "$.boxes[1].options.aggregates[4].by: 'by' applies only to max_by and min_by\n"
            "$.boxes[1].options.slack: bad duration 'soon': expected a number followed by ms, s, m, min, h or d\n"
            "$.boxes[1].options.timeout: timeout must be positive\n"
            "$.boxes[1].options.top.k: value 0 out of range [1, 1048576]\n"
            "$.boxes[1].options.emit_empty: emit_empty needs an empty group_by (which groups would be empty?)\n"
            "$.boxes[1].options.colour: unknown option 'colour'; known options: aggregates emit_empty group_by "
            "slack timeout top window");
  Diagnostics count_diag;
  b = build(R"({"window":{"type":"sliding","by":"count","size":10,"slide":4},
      "aggregates":[{"fn":"first","field":"price"}],
      "slack":1,"timeout":"1s","top":{"by":"first_price"},"emit_empty":true})",
            count_diag);
  EXPECT_EQ(b, nullptr);
  EXPECT_EQ(count_diag.to_string(),
            "$.boxes[1].options.slack: count windows follow arrival order; slack applies only to time windows\n"
            "$.boxes[1].options.timeout: timeout applies only to time windows\n"
            "$.boxes[1].options.top: top ranks the groups of one time window; count windows close per group\n"
            "$.boxes[1].options.emit_empty: emit_empty applies only to time windows\n"
            "$.boxes[1].options.emit_empty: emit_empty allows only count, sum and avg ('first_price' has no value "
            "in an empty window)");
}

std::string some_state(Box& box) {
  Recorder rec;
  std::vector<In> rows;
  static const char* const kNames[] = {"s0", "s1", "s2"};
  for (int i = 0; i < 40; ++i) rows.push_back({i % 7, kNames[i % 3], i, i / 3.0, i * 3});
  box.on_batch(0, batch_of(rows), rec);
  box.on_watermark(0, 60, rec);
  return box.snapshot();
}

const char* const kDef = R"({"group_by":["auction"],"window":{"type":"sliding","size":30,"slide":10},
    "aggregates":[{"fn":"count"},{"fn":"max","field":"bidder"},{"fn":"last","field":"ratio"}]})";

TEST(Aggregate, TruncatedOrForeignSnapshotsAreRefused) {
  auto box = build(kDef);
  const std::string bytes = some_state(*box);
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto fresh = build(kDef);
    const Status st = fresh->restore(std::string_view(bytes).substr(0, n));
    ASSERT_FALSE(st.ok()) << n;
    EXPECT_EQ(st.error().code, Errc::corrupt);
  }
  // Flipped bytes never crash: they are refused or decode to some state.
  std::mt19937_64 rng(5);
  for (int i = 0; i < 300; ++i) {
    std::string b = bytes;
    b[rng() % b.size()] ^= static_cast<char>(1 + rng() % 255);
    auto fresh = build(kDef);
    if (fresh->restore(b).ok()) {
      Recorder rec;
      fresh->on_watermark(0, kMaxWatermark, rec);
    }
  }
  // Another definition's snapshot.
  auto other = build(R"({"group_by":["auction"],"window":{"type":"tumbling","size":30},"aggregates":[{"fn":"count"}]})");
  EXPECT_FALSE(other->restore(bytes).ok());
}

// What a restore says about each damaged snapshot (every truncation, a
// fixed set of flipped bytes), and that a restored box snapshots to the
// same bytes: the encoding and its checks, pinned.
TEST(Aggregate, SnapshotRoundTripsAndNamesEachCorruption) {
  auto box = build(kDef);
  const std::string bytes = some_state(*box);
  auto copy = build(kDef);
  ASSERT_TRUE(copy->restore(bytes).ok());
  EXPECT_EQ(copy->snapshot(), bytes);
  // Distinct outcomes in order of first appearance, with their counts.
  std::vector<std::pair<std::string, int>> outcomes;
  auto note = [&](const Status& st) {
    const std::string what = st.ok() ? "ok" : st.error().message;
    for (auto& [w, n] : outcomes)
      if (w == what) return void(++n);
    outcomes.emplace_back(what, 1);
  };
  for (size_t n = 0; n < bytes.size(); ++n) note(build(kDef)->restore(std::string_view(bytes).substr(0, n)));
  std::mt19937_64 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string b = bytes;
    b[rng() % b.size()] ^= static_cast<char>(1 + rng() % 255);
    note(build(kDef)->restore(b));
  }
  std::string got;
  for (const auto& [w, n] : outcomes) got += w + " x" + std::to_string(n) + "\n";
  EXPECT_EQ(got,
            "snapshot does not match this box's output ports x2\n"
            "snapshot truncated in sequence counters x1\n"
            "snapshot does not match this box's input ports x4\n"
            "snapshot truncated in watermarks x16\n"
            "corrupt snapshot: not an aggregate snapshot x2\n"
            "corrupt snapshot: unknown aggregate snapshot version x4\n"
            "corrupt snapshot: truncated header x32\n"
            "corrupt snapshot: truncated group list x184\n"
            "corrupt snapshot: truncated group x242\n"
            "corrupt snapshot: truncated pane x340\n"
            "corrupt snapshot: truncated pane cells x402\n"
            "corrupt snapshot: truncated pane strings x279\n"
            "ok x742\n"
            "corrupt snapshot: empty pane x239\n"
            "corrupt snapshot: group hash does not match its key x90\n"
            "corrupt snapshot: panes out of order x106\n"
            "corrupt snapshot: group stored under the wrong key group x249\n"
            "corrupt snapshot: window bound out of range x69\n"
            "corrupt snapshot: pane stamp out of range x48\n"
            "corrupt snapshot: snapshot of an aggregate with another definition x18\n"
            "corrupt snapshot: pane out of range x1\n");
  EXPECT_EQ(bytes.size(), 1070u);
}

TEST(Aggregate, RestoreKeepsOnlyTheGivenKeyGroups) {
  auto box = build(kDef);
  const std::string bytes = some_state(*box);
  Recorder all;
  box->on_watermark(0, kMaxWatermark, all);
  size_t kept_rows = 0;
  for (uint32_t part = 0; part < 2; ++part) {
    const KeyGroupRange keep = KeyGroupRange::part(part, 2);
    auto half = build(kDef);
    ASSERT_TRUE(half->restore(bytes, &keep).ok());
    Recorder rec;
    half->on_watermark(0, kMaxWatermark, rec);
    for (size_t r = 0; r < rec.rows(); ++r)
      EXPECT_TRUE(keep.contains(key_group_int(std::get<int64_t>(rec.row(r)[0]))));
    kept_rows += rec.rows();
  }
  EXPECT_EQ(kept_rows, all.rows());
  EXPECT_GT(kept_rows, 0u);
}

}  // namespace
}  // namespace entente::engine
