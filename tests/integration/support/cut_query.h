#pragma once
// The query the tests of cut queries run (docs/cluster.md, "Queries cut into
// fragments"): bids → keep (filter) → cents (map) → counts (1 s tumbling
// count per auction), and the batches of bids they publish.

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "rapidjson/document.h"
#include "tests/integration/support/ws_reader.h"
#include "tests/support/eventually.h"

namespace entente::testing {

inline constexpr const char* kCutBidSchema =
    R"([{"name":"auction","type":"int64"},{"name":"price","type":"int64"},{"name":"date_time","type":"timestamp"}])";

// The options of box `counts`: a 1 s tumbling count per auction.
inline constexpr const char* kCutCountOptions =
    R"({"group_by":["auction"],"window":{"type":"tumbling","size":"1s"},"aggregates":[{"fn":"count","as":"n"}]})";

// NEXMark q5's shape: per sliding window (2 s every 500 ms), only the
// auctions with the most bids (`top`, ties kept).
inline constexpr const char* kCutHotOptions =
    R"({"group_by":["auction"],"window":{"type":"sliding","size":"2s","slide":"500ms"},)"
    R"("aggregates":[{"fn":"count","as":"n"}],"top":{"by":"n"}})";

// The query named `name` writing `output`, with `placement` as given (none
// when empty), its box `counts` with `counts_options`.
inline std::string cut_count_query(const std::string& name, const std::string& output, const std::string& placement,
                                   const std::string& counts_options = kCutCountOptions) {
  return R"({"name":")" + name + R"(","inputs":[{"name":"bids","event_time":"date_time","schema":)" +
         std::string(kCutBidSchema) +
         R"(}],"boxes":[)"
         R"({"id":"keep","type":"filter","options":{"predicates":["price >= 0"],"drop_unmatched":true}},)"
         R"({"id":"cents","type":"map","options":{"fields":[{"name":"auction","expr":"auction"},)"
         R"({"name":"cents","expr":"price * 100"}]}},)"
         R"({"id":"counts","type":"aggregate","options":)" + counts_options + R"(}],)"
         R"("arcs":[{"from":"bids","to":"keep"},{"from":"keep","to":"cents"},{"from":"cents","to":"counts"}],)"
         R"("outputs":[{"name":")" +
         output + R"(","from":"counts"}])" + (placement.empty() ? std::string() : R"(,"placement":)" + placement) +
         "}";
}

// NEXMark q8's shape on the same bids: the bids whose price ends in 0
// (projected to auction, n = price) joined with those whose price ends in
// 5 (seller = auction, p = price) of the same auction in 100 ms tumbling
// windows. Boxes keep (a filter), then lf, rf, left, right, pairs (the
// join) writing `output` (fields auction, n, p).
inline std::string cut_join_query(const std::string& name, const std::string& output, const std::string& placement) {
  return R"({"name":")" + name + R"(","inputs":[{"name":"bids","event_time":"date_time","schema":)" +
         std::string(kCutBidSchema) +
         R"(}],"boxes":[)"
         R"({"id":"keep","type":"filter","options":{"predicates":["price >= 0"],"drop_unmatched":true}},)"
         R"({"id":"lf","type":"filter","options":{"predicates":["price % 10 = 0"],"drop_unmatched":true}},)"
         R"({"id":"rf","type":"filter","options":{"predicates":["price % 10 = 5"],"drop_unmatched":true}},)"
         R"({"id":"left","type":"map","options":{"fields":[{"name":"auction","expr":"auction"},)"
         R"({"name":"n","expr":"price"}]}},)"
         R"({"id":"right","type":"map","options":{"fields":[{"name":"seller","expr":"auction"},)"
         R"({"name":"p","expr":"price"}]}},)"
         R"({"id":"pairs","type":"join","options":{"left_keys":["auction"],"right_keys":["seller"],)"
         R"("window":{"type":"tumbling","size":"100ms"},"fields":["auction","n","p"]}}],)"
         R"("arcs":[{"from":"bids","to":"keep"},{"from":"keep","to":"lf"},{"from":"keep","to":"rf"},)"
         R"({"from":"lf","to":"left"},{"from":"rf","to":"right"},{"from":"left","to":"pairs.0"},)"
         R"({"from":"right","to":"pairs.1"}],)"
         R"("outputs":[{"name":")" +
         output + R"(","from":"pairs"}])" + (placement.empty() ? std::string() : R"(,"placement":)" + placement) +
         "}";
}

// Batch b of `batches`: `rows` bids 100 ms of event time after batch b-1's,
// over `auctions` auctions; or the end marker (b = 0): an hour after the
// last batch, auction -1, which closes every window.
inline std::string cut_bid_batch(int b, int batches, int rows, int auctions) {
  if (b == 0) return R"([{"auction":-1,"price":0,"date_time":)" + std::to_string(3'600'000 + batches * 100) + "}]";
  std::string body = "[";
  for (int k = 0; k < rows; ++k) {
    if (k) body += ",";
    body += R"({"auction":)" + std::to_string((b * 31 + k) % auctions) + R"(,"price":)" + std::to_string(k) +
            R"(,"date_time":)" + std::to_string(b * 100 + k) + "}";
  }
  return body + "]";
}

// Waits up to `wait` until the cut query's output "counts-cut" (through
// `cut_via`) holds as many rows as the whole query's "counts-whole"
// (through `whole_via`), at least `min_rows`; then checks that it is the
// whole one row for row (values, event times, sequence numbers 1..N, no
// gap, no repeat) and adds to `counted` the counts of the real auctions
// (the end marker's -1 left out). Call under ASSERT_NO_FATAL_FAILURE.
inline void expect_cut_output_equals_whole(const BrokerProcess& whole_via, const BrokerProcess& cut_via,
                                           uint64_t min_rows, std::chrono::seconds wait, int64_t& counted) {
  uint64_t rows = 0;
  ASSERT_TRUE(eventually(
      [&] {
        rows = next_seq(whole_via, "counts-whole") - 1;
        return rows >= min_rows && rows > 0 && next_seq(cut_via, "counts-cut") - 1 >= rows;
      },
      std::chrono::milliseconds(wait)))
      << "whole " << next_seq(whole_via, "counts-whole") << ", cut " << next_seq(cut_via, "counts-cut");
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // nothing more may come
  // (A node answering without the stream's numbers, during a change of
  // its leader, is asked again.)
  uint64_t whole_next = 0, cut_next = 0;
  ASSERT_TRUE(eventually(
      [&] {
        whole_next = next_seq(whole_via, "counts-whole");
        cut_next = next_seq(cut_via, "counts-cut");
        return whole_next != 0 && cut_next != 0;
      },
      std::chrono::milliseconds(std::chrono::seconds(20))));
  rows = whole_next - 1;
  ASSERT_EQ(cut_next - 1, rows) << "the cut query wrote more rows than the whole one";
  const ReadResult want = read_stream(whole_via, "counts-whole", 1, rows, 60'000);
  const ReadResult got = read_stream(cut_via, "counts-cut", 1, rows, 60'000);
  ASSERT_EQ(want.tuples.size(), rows) << want.error;
  ASSERT_EQ(got.tuples.size(), rows) << got.error;
  for (uint64_t i = 0; i < rows; ++i) {
    ASSERT_EQ(got.tuples[i].seq, i + 1) << "a gap or a repeat in the cut query's numbering";
    ASSERT_EQ(got.tuples[i].line, want.tuples[i].line) << "row " << i;
    rapidjson::Document d;
    d.Parse(got.tuples[i].line.c_str());
    ASSERT_TRUE(d.IsObject() && d.HasMember("n") && d.HasMember("auction")) << got.tuples[i].line;
    if (d["auction"].GetInt64() >= 0) counted += d["n"].GetInt64();
  }
}

}  // namespace entente::testing
