// node.json, a REST body and a query network sent over REST read durations
// and sizes with one grammar each (base/units.h, read by base/json_read.h):
// every spelling one accepts the others accept with the same value, and what
// one refuses the others refuse. The REST body is POST /v1/streams's
// (parse_stream_spec: retention.max_age, retention.max_bytes).
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "broker/config.h"
#include "broker/detail/ingest.h"
#include "engine/network.h"

namespace entente {
namespace {

constexpr const char* kHash = "0000000000000000000000000000000000000000000000000000000000000000";

// node.json with `retention` set to `fragment`; the refusal must name `key`.
Result<broker::NodeConfig> config_with_retention(const std::string& fragment) {
  const std::string json = R"({"domain": "acme", "node": "n1", "api": {"listen": "127.0.0.1:1", "tls": false},
      "data_dir": "/var/lib/entente/n1",
      "tokens": [{"name": "ops", "role": "admin", "sha256": ")" + std::string(kHash) + R"("}],
      "retention": {)" + fragment + "}}";
  return broker::parse_config(json, "/etc/entente");
}

// A POST /v1/streams body with `retention` set to `fragment`.
Result<broker::detail::StreamMeta> stream_with_retention(const std::string& fragment) {
  const std::string body = R"({"name": "bids", "schema": [{"name": "price", "type": "int64"}],
      "retention": {)" + fragment + "}}";
  return broker::detail::parse_stream_spec(body, broker::NodeConfig{});
}

// Whether `r` refused with a message naming `path` first.
template <class T>
bool refused_at(const Result<T>& r, const std::string& path) {
  EXPECT_FALSE(r.ok());
  if (r.ok()) return false;
  EXPECT_EQ(r.error().message.rfind(path + ": ", 0), 0u) << r.error().message;
  return true;
}

// retention.max_age of node.json (10ms .. 3650d), or nullopt when refused.
std::optional<int64_t> duration_from_config(const std::string& duration) {
  auto r = config_with_retention(R"("max_age": )" + duration);
  if (!r.ok()) {
    refused_at(r, "retention.max_age");
    return std::nullopt;
  }
  return r->retention.max_age_ms;
}

// retention.max_age of a stream created over REST, or nullopt when refused.
std::optional<int64_t> duration_from_rest(const std::string& duration) {
  auto r = stream_with_retention(R"("max_age": )" + duration);
  if (!r.ok()) {
    refused_at(r, "$.retention.max_age");
    return std::nullopt;
  }
  return r->retention.max_age_ms;
}

// The watermark lag of a query network's input and the size of an aggregate
// box's window, both given as `duration`; nullopt when the network is refused.
std::optional<int64_t> duration_from_network(const std::string& duration) {
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

// retention.max_bytes of node.json (1 byte .. 1024 TiB), or nullopt.
std::optional<uint64_t> size_from_config(const std::string& size) {
  auto r = config_with_retention(R"("max_bytes": )" + size);
  if (!r.ok()) {
    refused_at(r, "retention.max_bytes");
    return std::nullopt;
  }
  return r->retention.max_bytes;
}

// retention.max_bytes of a stream created over REST, or nullopt.
std::optional<uint64_t> size_from_rest(const std::string& size) {
  auto r = stream_with_retention(R"("max_bytes": )" + size);
  if (!r.ok()) {
    refused_at(r, "$.retention.max_bytes");
    return std::nullopt;
  }
  return r->retention.max_bytes;
}

TEST(DurationSpellings, NodeJsonRestBodiesAndQueryNetworksAcceptTheSameSpellings) {
  const std::pair<const char*, int64_t> accepted[] = {
      {R"("250ms")", 250},          {R"("10s")", 10'000},          {R"("5m")", 300'000},
      {R"("5min")", 300'000},       {R"("2h")", 7'200'000},        {R"("1d")", 86'400'000},
      {R"("3650d")", 3650 * 86'400'000LL},
      {"1500", 1500},  // a JSON integer is milliseconds everywhere
  };
  for (const auto& [spelling, ms] : accepted) {
    EXPECT_EQ(duration_from_config(spelling), ms) << "node.json refused " << spelling;
    EXPECT_EQ(duration_from_rest(spelling), ms) << "a REST body refused " << spelling;
    EXPECT_EQ(duration_from_network(spelling), ms) << "a query network refused " << spelling;
  }
}

TEST(DurationSpellings, NodeJsonRestBodiesAndQueryNetworksRefuseTheSameSpellings) {
  for (const char* spelling : {R"("10")", R"("1 s")", R"("-1s")", R"("+1s")", R"("1.5s")", R"("1w")", R"("1sec")",
                               R"("1S")", R"("ms")", R"("")", R"("1GiB")", R"("99999999999999999999d")", "-5",
                               "1.5", "null", "true", "[]", "{}"}) {
    EXPECT_EQ(duration_from_config(spelling), std::nullopt) << "node.json accepted " << spelling;
    EXPECT_EQ(duration_from_rest(spelling), std::nullopt) << "a REST body accepted " << spelling;
    EXPECT_EQ(duration_from_network(spelling), std::nullopt) << "a query network accepted " << spelling;
  }
}

TEST(SizeSpellings, NodeJsonAndRestBodiesAcceptTheSameSpellings) {
  const std::pair<const char*, uint64_t> accepted[] = {
      {"4096", 4096},                       // a JSON integer is bytes in both
      {R"("4096")", 4096},                  // so is a string without a unit
      {R"("4096B")", 4096},
      {R"("512KiB")", 512u << 10},
      {R"("64MiB")", uint64_t{64} << 20},
      {R"("1GiB")", uint64_t{1} << 30},
      {R"("3TiB")", uint64_t{3} << 40},
  };
  for (const auto& [spelling, bytes] : accepted) {
    EXPECT_EQ(size_from_config(spelling), bytes) << "node.json refused " << spelling;
    EXPECT_EQ(size_from_rest(spelling), bytes) << "a REST body refused " << spelling;
  }
}

TEST(SizeSpellings, NodeJsonAndRestBodiesRefuseTheSameSpellings) {
  for (const char* spelling : {R"("1GB")", R"("1KB")", R"("1kB")", R"("1MB")", R"("1TB")", R"("1 KiB")",
                               R"("-1KiB")", R"("+1KiB")", R"("1.5MiB")", R"("1kib")", R"("1k")", R"("1PiB")",
                               R"("KiB")", R"("")", R"("10s")", R"("99999999999999999999")", "-5", "1.5",
                               "null", "true", "[]"}) {
    EXPECT_EQ(size_from_config(spelling), std::nullopt) << "node.json accepted " << spelling;
    EXPECT_EQ(size_from_rest(spelling), std::nullopt) << "a REST body accepted " << spelling;
  }
}

}  // namespace
}  // namespace entente
