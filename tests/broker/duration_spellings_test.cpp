// node.json and a query network sent over REST read durations with one
// grammar (base/units.h): every spelling one accepts the other accepts with
// the same value, and what one refuses the other refuses.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "broker/config.h"
#include "engine/network.h"

namespace entente {
namespace {

constexpr const char* kHash = "0000000000000000000000000000000000000000000000000000000000000000";

// retention.max_age of node.json (10ms .. 3650d), or nullopt when refused.
std::optional<int64_t> from_config(const std::string& duration) {
  const std::string json = R"({"domain": "acme", "node": "n1", "api": {"listen": "127.0.0.1:1", "tls": false},
      "data_dir": "/var/lib/entente/n1",
      "tokens": [{"name": "ops", "role": "admin", "sha256": ")" + std::string(kHash) + R"("}],
      "retention": {"max_age": )" + duration + "}}";
  auto r = broker::parse_config(json, "/etc/entente");
  if (!r.ok()) {
    EXPECT_NE(r.error().message.find("retention.max_age: "), std::string::npos) << r.error().message;
    return std::nullopt;
  }
  return r->retention.max_age_ms;
}

// The watermark lag of a query network's input and the size of an aggregate
// box's window, both given as `duration`; nullopt when the network is refused.
std::optional<int64_t> from_network(const std::string& duration) {
  const std::string json = R"({"name": "q", "inputs": [{"name": "bids",
      "schema": [{"name": "auction", "type": "int64"}, {"name": "date_time", "type": "timestamp"}],
      "event_time": "date_time", "watermark_lag": )" + duration + R"(}],
    "boxes": [{"id": "agg", "type": "aggregate", "options": {
      "window": {"type": "tumbling", "size": )" + duration + R"(}, "aggregates": [{"fn": "count"}]}}],
    "arcs": [{"from": "bids", "to": "agg"}], "outputs": [{"name": "counts", "from": "agg"}]})";
  Diagnostics diag;
  auto net = engine::QueryNetwork::parse(json, diag);
  if (!net.ok()) {
    // Both places must refuse it, each naming its JSON path.
    bool lag = false, size = false;
    for (const auto& d : diag.items()) {
      lag |= d.path == "$.inputs[0].watermark_lag";
      size |= d.path == "$.boxes[0].options.window.size";
    }
    EXPECT_TRUE(lag && size) << duration;
    return std::nullopt;
  }
  return net->inputs()[0].watermark_lag_ms;
}

TEST(DurationSpellings, NodeJsonAndQueryNetworksAcceptTheSameSpellings) {
  const std::pair<const char*, int64_t> accepted[] = {
      {R"("250ms")", 250},          {R"("10s")", 10'000},          {R"("5m")", 300'000},
      {R"("5min")", 300'000},       {R"("2h")", 7'200'000},        {R"("1d")", 86'400'000},
      {"1500", 1500},  // a JSON integer is milliseconds in both
  };
  for (const auto& [spelling, ms] : accepted) {
    EXPECT_EQ(from_config(spelling), ms) << "node.json refused " << spelling;
    EXPECT_EQ(from_network(spelling), ms) << "a query network refused " << spelling;
  }
}

TEST(DurationSpellings, NodeJsonAndQueryNetworksRefuseTheSameSpellings) {
  for (const char* spelling : {R"("10")", R"("1 s")", R"("-1s")", R"("1.5s")", R"("1w")", R"("1sec")", R"("")",
                               "-5", "1.5", "null", "true"}) {
    EXPECT_EQ(from_config(spelling), std::nullopt) << "node.json accepted " << spelling;
    EXPECT_EQ(from_network(spelling), std::nullopt) << "a query network accepted " << spelling;
  }
}

}  // namespace
}  // namespace entente
