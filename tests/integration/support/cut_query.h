#pragma once
// The query the tests of cut queries run (docs/cluster.md, "Queries cut into
// fragments"): bids → keep (filter) → cents (map) → counts (1 s tumbling
// count per auction), and the batches of bids they publish.

#include <string>

namespace entente::testing {

inline constexpr const char* kCutBidSchema =
    R"([{"name":"auction","type":"int64"},{"name":"price","type":"int64"},{"name":"date_time","type":"timestamp"}])";

// The query named `name` writing `output`, with `placement` as given.
inline std::string cut_count_query(const std::string& name, const std::string& output, const std::string& placement) {
  return R"({"name":")" + name + R"(","inputs":[{"name":"bids","event_time":"date_time","schema":)" +
         std::string(kCutBidSchema) +
         R"(}],"boxes":[)"
         R"({"id":"keep","type":"filter","options":{"predicates":["price >= 0"],"drop_unmatched":true}},)"
         R"({"id":"cents","type":"map","options":{"fields":[{"name":"auction","expr":"auction"},)"
         R"({"name":"cents","expr":"price * 100"}]}},)"
         R"({"id":"counts","type":"aggregate","options":{"group_by":["auction"],)"
         R"("window":{"type":"tumbling","size":"1s"},"aggregates":[{"fn":"count","as":"n"}]}}],)"
         R"("arcs":[{"from":"bids","to":"keep"},{"from":"keep","to":"cents"},{"from":"cents","to":"counts"}],)"
         R"("outputs":[{"name":")" +
         output + R"(","from":"counts"}],"placement":)" + placement + "}";
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

}  // namespace entente::testing
