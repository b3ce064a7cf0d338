// Join box: tumbling and interval windows against a brute-force reference,
// deterministic order however batches interleave, predicate, projection and
// renaming, late rows, option errors, snapshots.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/hash.h"
#include "engine/boxes/boxes.h"
#include "rapidjson/document.h"

namespace entente::engine {
namespace {

struct Recorder : Emitter {
  std::vector<Batch> batches;
  EventTime wm = kMinTime;
  bool below_watermark = false;
  void emit(size_t /*port*/, Batch b) override {
    for (EventTime t : b.event_time) below_watermark = below_watermark || t < wm;
    batches.push_back(std::move(b));
  }
  void emit_watermark(EventTime w) override { wm = std::max(wm, w); }
  // (values..., time) per row.
  std::vector<std::vector<Value>> rows() const {
    std::vector<std::vector<Value>> out;
    for (const auto& b : batches)
      for (size_t r = 0; r < b.rows(); ++r) {
        std::vector<Value> v;
        for (size_t c = 0; c < b.columns.size(); ++c) v.push_back(b.column(c).value(r));
        v.push_back(b.event_time[r]);
        out.push_back(std::move(v));
      }
    return out;
  }
};

SchemaPtr persons() { return make_schema({{"id", Type::Int64}, {"name", Type::String}}); }
SchemaPtr auctions() {
  return make_schema({{"id", Type::Int64}, {"seller", Type::Int64}, {"expires", Type::Timestamp}});
}

std::unique_ptr<Box> build(const std::string& json, Diagnostics& diag) {
  rapidjson::Document d;
  d.Parse(json.c_str());
  EXPECT_FALSE(d.HasParseError()) << json;
  BoxBuildContext ctx{"$.boxes[2]", {persons(), auctions()}, &diag};
  return boxes::make_join(d, ctx);
}

std::unique_ptr<Box> build(const std::string& json) {
  Diagnostics diag;
  auto b = build(json, diag);
  EXPECT_TRUE(b != nullptr) << diag.to_string();
  return b;
}

Batch person_rows(const std::vector<std::tuple<int64_t, std::string, EventTime>>& rows) {
  BatchBuilder b(persons());
  for (const auto& [id, name, t] : rows) {
    b.column(0).ints.push_back(id);
    b.column(1).append_str(name);
    b.event_time().push_back(t);
    b.seq().push_back(0);
  }
  return b.finish();
}

Batch auction_rows(const std::vector<std::tuple<int64_t, int64_t, EventTime, EventTime>>& rows) {
  BatchBuilder b(auctions());
  for (const auto& [id, seller, expires, t] : rows) {
    b.column(0).ints.push_back(id);
    b.column(1).ints.push_back(seller);
    b.column(2).ints.push_back(expires);
    b.event_time().push_back(t);
    b.seq().push_back(0);
  }
  return b.finish();
}

TEST(Join, TumblingWindowJoinOnKeys) {
  auto box = build(R"({"left_keys":["id"],"right_keys":["seller"],"window":{"type":"tumbling","size":"10ms"}})");
  EXPECT_EQ(box->output_schema(0)->to_string(),
            "id:int64, name:string, right_id:int64, seller:int64, expires:timestamp");
  Recorder rec;
  box->on_batch(1, auction_rows({{100, 1, 50, 3}, {101, 2, 50, 4}, {102, 1, 50, 12}}), rec);
  box->on_batch(0, person_rows({{1, "ann", 5}, {2, "bo", 9}, {1, "ann2", 15}}), rec);
  box->on_watermark(0, 20, rec);
  EXPECT_TRUE(rec.batches.empty());  // the right input has not advanced yet
  box->on_watermark(1, 20, rec);
  const auto rows = rec.rows();
  using V = std::vector<Value>;
  ASSERT_EQ(rows.size(), 3u);
  // Processing order: right@3, right@4, left@5 (matches 100), left@9
  // (matches 101), right@12 (matches ann2? no: ann2 comes at 15), left@15.
  EXPECT_EQ(rows[0], (V{int64_t{1}, std::string("ann"), int64_t{100}, int64_t{1}, int64_t{50}, int64_t{5}}));
  EXPECT_EQ(rows[1], (V{int64_t{2}, std::string("bo"), int64_t{101}, int64_t{2}, int64_t{50}, int64_t{9}}));
  EXPECT_EQ(rows[2], (V{int64_t{1}, std::string("ann2"), int64_t{102}, int64_t{1}, int64_t{50}, int64_t{15}}));
  EXPECT_EQ(rec.wm, 20);
  EXPECT_FALSE(rec.below_watermark);
}

// q4's shape: bids (here: auctions as the right side) within the left
// row's [time, expires] — an interval join plus a predicate on the field.
TEST(Join, IntervalWithPredicateProjectionAndPrefix) {
  auto box = build(R"({"left_keys":["id"],"right_keys":["seller"],"window":{"type":"interval","lower":0,"upper":"1s"},
                       "predicate":"_time <= expires","fields":["name","a_id","expires"],"right_prefix":"a_"})");
  EXPECT_EQ(box->output_schema(0)->to_string(), "name:string, a_id:int64, expires:timestamp");
  Recorder rec;
  box->on_batch(0, person_rows({{1, "ann", 100}}), rec);
  box->on_batch(1, auction_rows({{7, 1, 500, 99}, {8, 1, 500, 100}, {9, 1, 300, 400}, {10, 1, 2000, 1100},
                                 {11, 1, 2000, 1101}}),
                rec);
  box->on_watermark(0, kMaxWatermark, rec);
  box->on_watermark(1, kMaxWatermark, rec);
  const auto rows = rec.rows();
  using V = std::vector<Value>;
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0], (V{std::string("ann"), int64_t{8}, int64_t{500}, int64_t{100}}));
  EXPECT_EQ(rows[1], (V{std::string("ann"), int64_t{10}, int64_t{2000}, int64_t{1100}}));
}

struct P {
  int64_t id;
  EventTime t;
};

// All pairs, ordered by (max time, the key's group, then the later row's
// (input, arrival), then the earlier row's arrival): what the box
// promises. Keys are ids, or "key<id>" strings with `string_keys`.
std::vector<std::vector<Value>> reference(const std::vector<P>& left, const std::vector<P>& right, bool interval,
                                          int64_t size, int64_t lower, int64_t upper, bool string_keys = false) {
  auto group_of = [&](int64_t id) {
    return key_group_of(string_keys ? hash_bytes("key" + std::to_string(id)) : hash_int(id));
  };
  auto fdiv = [](int64_t a, int64_t b) { return a / b - ((a % b != 0 && a < 0) ? 1 : 0); };
  struct Pair {
    EventTime later_t;
    uint32_t group;
    int later_input;
    size_t later_idx, earlier_idx;
    std::vector<Value> row;
  };
  std::vector<Pair> pairs;
  for (size_t i = 0; i < left.size(); ++i)
    for (size_t j = 0; j < right.size(); ++j) {
      const P& l = left[i];
      const P& r = right[j];
      if (l.id != r.id) continue;
      const bool ok = interval ? (r.t - l.t >= lower && r.t - l.t <= upper) : fdiv(l.t, size) == fdiv(r.t, size);
      if (!ok) continue;
      // Left precedes right on equal times.
      const bool right_later = r.t >= l.t;
      Pair p{std::max(l.t, r.t), group_of(l.id), right_later ? 1 : 0, right_later ? j : i, right_later ? i : j,
             {l.id, int64_t(i), int64_t(j), std::max(l.t, r.t)}};
      pairs.push_back(p);
    }
  std::stable_sort(pairs.begin(), pairs.end(), [](const Pair& a, const Pair& b) {
    return std::tie(a.later_t, a.group, a.later_input, a.later_idx, a.earlier_idx) <
           std::tie(b.later_t, b.group, b.later_input, b.later_idx, b.earlier_idx);
  });
  std::vector<std::vector<Value>> out;
  for (auto& p : pairs) out.push_back(p.row);
  return out;
}

TEST(Join, MatchesBruteForceWhateverTheBatchInterleaving) {
  const SchemaPtr ls = make_schema({{"k", Type::Int64}, {"li", Type::Int64}});
  const SchemaPtr rs = make_schema({{"k", Type::Int64}, {"ri", Type::Int64}});
  for (int seed = 0; seed < 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(static_cast<uint64_t>(seed) + 1);
    const bool interval = seed % 2 == 0;
    std::vector<P> side[2];
    // Each input sorted by time (arrival index = position), as sources are.
    for (int s = 0; s < 2; ++s) {
      EventTime t = -40;
      for (int i = 0; i < 120; ++i) {
        t += static_cast<int64_t>(rng() % 3);
        side[s].push_back({static_cast<int64_t>(rng() % 6), t});
      }
    }
    const auto want = reference(side[0], side[1], interval, 10, -7, 12);
    for (int run = 0; run < 3; ++run) {
      Diagnostics diag;
      rapidjson::Document d;
      const std::string json = std::string(R"({"left_keys":["k"],"right_keys":["k"],"fields":["k","li","ri"],"window":)") +
                               (interval ? R"({"type":"interval","lower":"-7ms","upper":12})" : R"({"size":10})") + "}";
      d.Parse(json.c_str());
      BoxBuildContext ctx{"$", {ls, rs}, &diag};
      auto box = boxes::make_join(d, ctx);
      ASSERT_TRUE(box) << diag.to_string();
      Recorder rec;
      size_t pos[2] = {0, 0};
      while (pos[0] < side[0].size() || pos[1] < side[1].size()) {
        const int s = pos[0] >= side[0].size() ? 1 : pos[1] >= side[1].size() ? 0 : static_cast<int>(rng() % 2);
        const size_t n = std::min(side[s].size() - pos[s], size_t{1} + rng() % 15);
        BatchBuilder b(s == 0 ? ls : rs);
        for (size_t i = pos[s]; i < pos[s] + n; ++i) {
          b.column(0).ints.push_back(side[s][i].id);
          b.column(1).ints.push_back(static_cast<int64_t>(i));
          b.event_time().push_back(side[s][i].t);
          b.seq().push_back(i);
        }
        pos[s] += n;
        box->on_batch(static_cast<size_t>(s), b.finish(), rec);
        // Each input's watermark: its latest time (its rows come in order).
        box->on_watermark(static_cast<size_t>(s), side[s][pos[s] - 1].t, rec);
      }
      box->on_watermark(0, kMaxWatermark, rec);
      box->on_watermark(1, kMaxWatermark, rec);
      EXPECT_EQ(rec.rows(), want);
      EXPECT_FALSE(rec.below_watermark);
      EXPECT_EQ(box->stats().late_dropped, 0u);
    }
    EXPECT_FALSE(want.empty());
  }
}

// The general (non-integer key) path, with a predicate that drops some
// pairs and a projection that reorders fields; runs of one row at a time
// alternate with long runs, so both of the release paths are exercised.
TEST(Join, StringKeysWithPredicateAndProjectionMatchBruteForce) {
  const SchemaPtr ls = make_schema({{"k", Type::String}, {"li", Type::Int64}});
  const SchemaPtr rs = make_schema({{"k", Type::String}, {"ri", Type::Int64}});
  for (int seed = 0; seed < 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(static_cast<uint64_t>(seed) + 100);
    const bool interval = seed % 2 == 1;
    std::vector<P> side[2];
    for (int s = 0; s < 2; ++s) {
      EventTime t = -25;
      for (int i = 0; i < 150; ++i) {
        t += static_cast<int64_t>(rng() % 3);
        side[s].push_back({static_cast<int64_t>(rng() % 5), t});
      }
    }
    // Keep the pairs whose arrival indexes have an even sum; output (ri, k, li, time).
    std::vector<std::vector<Value>> want;
    for (auto& row : reference(side[0], side[1], interval, 8, -5, 9, true)) {
      const int64_t li = std::get<int64_t>(row[1]), ri = std::get<int64_t>(row[2]);
      if ((li + ri) % 2 != 0) continue;
      want.push_back({row[2], "key" + std::to_string(std::get<int64_t>(row[0])), row[1], row[3]});
    }
    Diagnostics diag;
    rapidjson::Document d;
    const std::string json =
        std::string(R"({"left_keys":["k"],"right_keys":["k"],"predicate":"(li + ri) % 2 = 0",)"
                    R"("fields":["ri","k","li"],"window":)") +
        (interval ? R"({"type":"interval","lower":-5,"upper":9})" : R"({"size":8})") + "}";
    d.Parse(json.c_str());
    BoxBuildContext ctx{"$", {ls, rs}, &diag};
    auto box = boxes::make_join(d, ctx);
    ASSERT_TRUE(box) << diag.to_string();
    Recorder rec;
    size_t pos[2] = {0, 0};
    while (pos[0] < side[0].size() || pos[1] < side[1].size()) {
      const int s = pos[0] >= side[0].size() ? 1 : pos[1] >= side[1].size() ? 0 : static_cast<int>(rng() % 2);
      const size_t n = std::min(side[s].size() - pos[s], rng() % 4 == 0 ? size_t{40} : size_t{1} + rng() % 3);
      BatchBuilder b(s == 0 ? ls : rs);
      for (size_t i = pos[s]; i < pos[s] + n; ++i) {
        b.column(0).append_str("key" + std::to_string(side[s][i].id));
        b.column(1).ints.push_back(static_cast<int64_t>(i));
        b.event_time().push_back(side[s][i].t);
        b.seq().push_back(i);
      }
      pos[s] += n;
      box->on_batch(static_cast<size_t>(s), b.finish(), rec);
      box->on_watermark(static_cast<size_t>(s), side[s][pos[s] - 1].t, rec);
    }
    box->on_watermark(0, kMaxWatermark, rec);
    box->on_watermark(1, kMaxWatermark, rec);
    EXPECT_EQ(rec.rows(), want);
    EXPECT_FALSE(rec.below_watermark);
    EXPECT_FALSE(want.empty());
  }
}

// OrderedInputs hands out runs that are prefixes of buffered batches and
// reuses its run buffers: a caller that keeps the batches it was given
// (as union does) must still see each run's own rows.
TEST(OrderedInputs, KeptRunsStayIntactAndOrderIsByTimeThenInput) {
  const SchemaPtr s = make_schema({{"v", Type::Int64}, {"tag", Type::String}});
  std::mt19937_64 rng(7);
  std::vector<std::tuple<EventTime, int, int64_t>> sent;  // (time, input, value)
  boxes::OrderedInputs in({s, s});
  std::vector<std::pair<size_t, Batch>> kept;
  EventTime next[2] = {0, 0};
  int64_t value = 0;
  for (int step = 0; step < 200; ++step) {
    const size_t input = rng() % 2;
    const size_t n = 1 + rng() % 5;
    BatchBuilder b(s);
    for (size_t i = 0; i < n; ++i) {
      next[input] += static_cast<int64_t>(rng() % 3);
      b.column(0).ints.push_back(value);
      b.column(1).append_str("v" + std::to_string(value));
      b.event_time().push_back(next[input]);
      b.seq().push_back(0);
      sent.emplace_back(next[input], static_cast<int>(input), value++);
    }
    in.add(input, b.finish());
    in.set_watermark(input, next[input]);
    in.release([&](size_t i, const Batch& run) { kept.emplace_back(i, run); });
  }
  in.set_watermark(0, kMaxWatermark);
  in.set_watermark(1, kMaxWatermark);
  in.release([&](size_t i, const Batch& run) { kept.emplace_back(i, run); });
  EXPECT_EQ(in.buffered_rows(), 0u);
  std::stable_sort(sent.begin(), sent.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
  });
  std::vector<std::tuple<EventTime, int, int64_t>> got;
  for (const auto& [i, run] : kept) {
    ASSERT_TRUE(run.validate().ok());
    for (size_t r = 0; r < run.rows(); ++r) {
      EXPECT_EQ(run.column(1).str(r), "v" + std::to_string(run.column(0).ints[r]));
      got.emplace_back(run.event_time[r], static_cast<int>(i), run.column(0).ints[r]);
    }
  }
  EXPECT_EQ(got, sent);
}

TEST(Join, LateRowsAreCountedAndDropped) {
  auto box = build(R"({"left_keys":["id"],"right_keys":["seller"],"window":{"size":10}})");
  Recorder rec;
  box->on_watermark(0, 50, rec);
  box->on_batch(0, person_rows({{1, "late", 49}, {1, "ok", 50}}), rec);
  EXPECT_EQ(box->stats().late_dropped, 1u);
  box->on_batch(1, auction_rows({{5, 1, 0, 55}}), rec);
  box->on_watermark(0, kMaxWatermark, rec);
  box->on_watermark(1, kMaxWatermark, rec);
  const auto rows = rec.rows();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0][1], Value(std::string("ok")));
}

void expect_error(const std::string& json, const std::string& path, const std::string& part) {
  Diagnostics diag;
  EXPECT_EQ(build(json, diag), nullptr) << json;
  bool found = false;
  for (const auto& d : diag.items()) found = found || (d.path == path && d.message.find(part) != std::string::npos);
  EXPECT_TRUE(found) << "wanted " << path << ": ..." << part << "... in\n" << diag.to_string();
}

TEST(Join, BadOptionsAreReportedWithTheirPaths) {
  const std::string p = "$.boxes[2].options";
  expect_error(R"({"left_keys":["id"],"right_keys":["sellr"],"window":{"size":10}})", p + ".right_keys[0]",
               "unknown field 'sellr'");
  expect_error(R"({"left_keys":["name"],"right_keys":["seller"],"window":{"size":10}})", p + ".right_keys[0]",
               "key types differ");
  expect_error(R"({"left_keys":["id"],"right_keys":["seller","id"],"window":{"size":10}})", p + ".right_keys",
               "same length");
  expect_error(R"({"left_keys":["id"],"right_keys":["seller"]})", p + ".window", "missing");
  expect_error(R"({"left_keys":["id"],"right_keys":["seller"],"window":{"type":"interval","lower":5,"upper":1}})",
               p + ".window.lower", "must not exceed");
  expect_error(R"({"left_keys":["id"],"right_keys":["seller"],"window":{"type":"interval","lower":"-x","upper":1}})",
               p + ".window.lower", "bad duration");
  expect_error(R"({"left_keys":["id"],"right_keys":["seller"],"window":{"size":10,"upper":3}})", p + ".window.upper",
               "only to interval");
  expect_error(R"({"left_keys":["id"],"right_keys":["seller"],"window":{"size":10},"predicate":"name + 1"})",
               p + ".predicate", "");
  expect_error(R"({"left_keys":["id"],"right_keys":["seller"],"window":{"size":10},"predicate":"id"})", p + ".predicate",
               "must be bool");
  expect_error(R"({"left_keys":["id"],"right_keys":["seller"],"window":{"size":10},"fields":["nope"]})",
               p + ".fields[0]", "unknown field 'nope'");
  expect_error(R"({"left_keys":["id"],"right_keys":["seller"],"window":{"size":10},"right_prefix":""})",
               p + ".right_prefix", "joined schema");
  expect_error(R"({"left_keys":["id"],"right_keys":["seller"],"window":{"size":10},"how":"inner"})", p + ".how",
               "unknown option");
}

TEST(Join, SnapshotsRoundTripAndTruncationIsRefused) {
  const std::string def = R"({"left_keys":["id"],"right_keys":["seller"],"window":{"type":"interval","lower":-5,"upper":5}})";
  auto box = build(def);
  Recorder rec;
  box->on_batch(0, person_rows({{1, "a", 1}, {2, "b", 2}, {1, "c", 8}}), rec);
  box->on_batch(1, auction_rows({{9, 1, 0, 3}, {10, 2, 0, 6}}), rec);
  box->on_watermark(0, 5, rec);
  box->on_watermark(1, 5, rec);
  const std::string bytes = box->snapshot();
  auto copy = build(def);
  ASSERT_TRUE(copy->restore(bytes).ok());
  EXPECT_EQ(copy->snapshot(), bytes);
  Recorder a, b;
  for (auto* x : {box.get(), copy.get()}) {
    Recorder& r = x == box.get() ? a : b;
    x->on_batch(1, auction_rows({{11, 1, 0, 9}}), r);
    x->on_watermark(0, kMaxWatermark, r);
    x->on_watermark(1, kMaxWatermark, r);
  }
  EXPECT_EQ(a.rows(), b.rows());
  EXPECT_FALSE(a.rows().empty());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto fresh = build(def);
    const Status st = fresh->restore(std::string_view(bytes).substr(0, n));
    ASSERT_FALSE(st.ok()) << n;
    EXPECT_EQ(st.error().code, Errc::corrupt);
  }
  std::mt19937_64 rng(3);
  for (int i = 0; i < 300; ++i) {
    std::string x = bytes;
    x[rng() % x.size()] ^= static_cast<char>(1 + rng() % 255);
    auto fresh = build(def);
    if (fresh->restore(x).ok()) {
      Recorder r;
      fresh->on_watermark(0, kMaxWatermark, r);
      fresh->on_watermark(1, kMaxWatermark, r);
    }
  }
}

}  // namespace
}  // namespace entente::engine
