// Replacing a query's network (engine/splits.h: compare_boxes, and
// carry_snapshot with an input clock map; docs/query-networks.md,
// "Replacing a query's network"): which boxes keep their definition, and
// that an aggregate carried into a network with another input and another
// box goes on exactly as the one that was never replaced.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/codec.h"
#include "engine/network.h"
#include "engine/splits.h"
#include "rapidjson/document.h"

namespace entente::engine {
namespace {

const char* kBidsInput = R"({"name": "bids", "schema": [{"name": "auction", "type": "int64"},
  {"name": "ts", "type": "timestamp"}], "event_time": "ts"})";

std::string agg_box(const std::string& size) {
  return R"({"id": "agg", "type": "aggregate", "options": {"group_by": ["auction"],
    "window": {"type": "tumbling", "size": ")" + size + R"("}, "aggregates": [{"fn": "count", "as": "n"}]}})";
}

// v1: bids -> agg. v2: asks first (a new input), agg as it was, a new filter.
std::string v1(const std::string& size = "100ms") {
  return std::string(R"({"name": "q", "inputs": [)") + kBidsInput + R"(], "boxes": [)" + agg_box(size) +
         R"(], "arcs": [{"from": "bids", "to": "agg"}], "outputs": [{"name": "out", "from": "agg"}]})";
}
std::string v2(const std::string& size = "100ms") {
  return std::string(R"({"name": "q", "inputs": [{"name": "asks", "schema": [{"name": "x", "type": "int64"}]},)") +
         kBidsInput + R"(], "boxes": [)" + agg_box(size) +
         R"(, {"id": "f", "type": "filter", "options": {"predicates": ["x > 0"]}}],
    "arcs": [{"from": "bids", "to": "agg"}, {"from": "asks", "to": "f"}],
    "outputs": [{"name": "out", "from": "agg"}, {"name": "xs", "from": "f"}]})";
}

QueryNetwork parse(const std::string& json) {
  Diagnostics diag;
  auto net = QueryNetwork::parse(json, diag);
  EXPECT_TRUE(net.ok()) << diag.to_string();
  return std::move(net).value();
}

Batch bids(int first, int last) {
  std::string json = "[";
  for (int i = first; i <= last; ++i)
    json += (i == first ? "" : ",") + ("{\"auction\": " + std::to_string(i % 3) + ", \"ts\": " +
                                       std::to_string(10 * i) + "}");
  json += "]";
  rapidjson::Document d;
  d.Parse(json.c_str());
  auto schema = std::make_shared<const Schema>(Schema({{"auction", Type::Int64}, {"ts", Type::Timestamp}}));
  auto b = rows_from_json(schema, d, "ts");
  EXPECT_TRUE(b.ok()) << b.error().message;
  return std::move(b).value();
}

TEST(Replace, CompareBoxesSaysWhatChanged) {
  auto same = compare_boxes(parse(v1()), parse(v2()));
  ASSERT_EQ(same.size(), 1u);  // f is new: not compared
  EXPECT_EQ(same[0].id, "agg");
  EXPECT_TRUE(same[0].same) << same[0].why;
  auto changed = compare_boxes(parse(v1()), parse(v2("200ms")));
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_FALSE(changed[0].same);
  EXPECT_EQ(changed[0].why, "its options changed");
}

TEST(Replace, CarriedAggregateContinuesAsTheOriginal) {
  const QueryNetwork a = parse(v1()), b = parse(v2());
  std::vector<std::string> want, got;
  auto collect = [](std::vector<std::string>& into) {
    return [&into](size_t output, const Batch& batch) {
      if (output != 0) return;
      for (size_t r = 0; r < batch.rows(); ++r) {
        std::string line;
        row_to_json(batch, r, line);
        into.push_back(line);
      }
    };
  };
  auto original = Executor::create(a, collect(want));
  auto before = Executor::create(a, collect(got));
  ASSERT_TRUE(original.ok() && before.ok());
  (*original)->push(0, bids(1, 25));
  (*before)->push(0, bids(1, 25));
  // Mid-window: agg holds counts for the window that 250 ms is in.
  auto snap = carry_snapshot(a, (*before)->snapshot(), b, {{"agg", "agg"}}, std::vector<std::optional<size_t>>{
                                                                              std::nullopt, 0});
  ASSERT_TRUE(snap.ok()) << snap.error().message;
  auto after = Executor::create(b, collect(got));
  ASSERT_TRUE(after.ok());
  ASSERT_TRUE((*after)->restore(*snap).ok());
  (*original)->push(0, bids(26, 60));
  (*after)->push(1, bids(26, 60));
  (*original)->finish();
  (*after)->finish();
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(got, want);

  // Fresh instead: the window open at the replacement counts less.
  std::vector<std::string> fresh;
  auto empty = carry_snapshot(a, (*before)->snapshot(), b, {}, std::vector<std::optional<size_t>>{std::nullopt, 0});
  ASSERT_TRUE(empty.ok());
  auto restarted = Executor::create(b, collect(fresh));
  ASSERT_TRUE((*restarted)->restore(*empty).ok());
  (*restarted)->push(1, bids(26, 60));
  (*restarted)->finish();
  ASSERT_LE(fresh.size(), want.size());
  EXPECT_NE(fresh, std::vector<std::string>(want.end() - static_cast<long>(fresh.size()), want.end()));
}

}  // namespace
}  // namespace entente::engine
