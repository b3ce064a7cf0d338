// The log: the exact text and JSON lines, JSON that parses whatever the
// message holds, levels, repeated refusals collapsed with a count, and whole
// lines under concurrent writers.
#include "base/log.h"

#include <gtest/gtest.h>
#include <rapidjson/document.h>

#include <string>
#include <thread>
#include <vector>

namespace entente::base {
namespace {

// 2026-12-03T11:04:22.123Z
constexpr int64_t kT0 = 1796295862123;

struct Captured {
  std::vector<std::string> lines;
  int64_t now = kT0;
  Logger logger{[this](std::string_view l) { lines.emplace_back(l); }, [this] { return now; }};
};

TEST(Log, TimestampIsUtcWithMilliseconds) {
  EXPECT_EQ(utc_timestamp_ms(kT0), "2026-12-03T11:04:22.123Z");
  EXPECT_EQ(utc_timestamp_ms(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(utc_timestamp_ms(-1), "1969-12-31T23:59:59.999Z");
}

TEST(Log, TextLineHasTimestampLevelComponentNodeAndFields) {
  Captured c;
  c.logger.set_node("acme/n1");
  c.logger.log(LogLevel::info, "federation", "link up with entente://beta/n1");
  c.logger.log(LogLevel::warn, "api", "two\nlines");
  c.logger.log(LogLevel::info, "audit", "POST /v1/streams",
               {{"token", "ops"}, {"object", "bids"}, {"detail", "a b"}, {"empty", ""}});
  ASSERT_EQ(c.lines.size(), 3u);
  EXPECT_EQ(c.lines[0],
            "2026-12-03T11:04:22.123Z info  federation acme/n1: link up with entente://beta/n1\n");
  EXPECT_EQ(c.lines[1], "2026-12-03T11:04:22.123Z warn  api acme/n1: two?lines\n");
  EXPECT_EQ(c.lines[2],
            "2026-12-03T11:04:22.123Z info  audit acme/n1: POST /v1/streams token=ops object=bids "
            "detail=\"a b\" empty=\"\"\n");
}

TEST(Log, JsonLineIsOneObjectThatParses) {
  Captured c;
  c.logger.set_format(LogFormat::json);
  c.logger.set_node("acme/n1");
  const std::string nasty = std::string("quote \" backslash \\ newline \n tab \t bad utf8 \xff end");
  c.logger.log(LogLevel::error, "store", nasty, {{"token", "ops"}, {"msg", "not repeated"}});
  ASSERT_EQ(c.lines.size(), 1u);
  const std::string& line = c.lines[0];
  ASSERT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1);  // one line
  rapidjson::Document d;
  d.Parse(line.data(), line.size() - 1);
  ASSERT_FALSE(d.HasParseError()) << line;
  ASSERT_TRUE(d.IsObject());
  EXPECT_STREQ(d["ts"].GetString(), "2026-12-03T11:04:22.123Z");
  EXPECT_STREQ(d["level"].GetString(), "error");
  EXPECT_STREQ(d["component"].GetString(), "store");
  EXPECT_STREQ(d["node"].GetString(), "acme/n1");
  EXPECT_EQ(std::string(d["msg"].GetString()),
            "quote \" backslash \\ newline \n tab \t bad utf8 \xEF\xBF\xBD end");
  EXPECT_STREQ(d["token"].GetString(), "ops");
  EXPECT_EQ(d.MemberCount(), 6u);  // a field named like a fixed member is left out
}

TEST(Log, LevelsBelowTheThresholdAreDropped) {
  Captured c;
  c.logger.log(LogLevel::debug, "query", "hidden");
  c.logger.set_level(LogLevel::warn);
  c.logger.log(LogLevel::info, "query", "hidden too");
  c.logger.log(LogLevel::warn, "query", "shown");
  c.logger.set_level(LogLevel::debug);
  c.logger.log(LogLevel::debug, "query", "shown too");
  ASSERT_EQ(c.lines.size(), 2u);
  EXPECT_NE(c.lines[0].find(" warn  query: shown\n"), std::string::npos) << c.lines[0];
  EXPECT_NE(c.lines[1].find(" debug query: shown too\n"), std::string::npos) << c.lines[1];
  EXPECT_EQ(parse_log_level("warn"), LogLevel::warn);
  EXPECT_EQ(parse_log_level("WARN"), std::nullopt);
  EXPECT_EQ(parse_log_format("json"), LogFormat::json);
  EXPECT_EQ(parse_log_format("yaml"), std::nullopt);
}

TEST(Log, RepeatedRefusalsAreCollapsedUntilTheWindowEnds) {
  Captured c;
  c.logger.set_node("acme/n1");
  for (int i = 0; i < 5; ++i) {
    c.logger.refusal("api", "refused POST /v1/streams: the bearer token is not valid for this node");
    c.now += 100;
  }
  c.logger.refusal("federation", "refused entente://evil/n1: does not chain to the pinned CA");
  c.logger.log(LogLevel::info, "api", "something else");  // within the window: no summary yet
  ASSERT_EQ(c.lines.size(), 3u);
  EXPECT_NE(c.lines[0].find("warn  api acme/n1: refused POST /v1/streams"), std::string::npos) << c.lines[0];
  EXPECT_NE(c.lines[1].find("warn  federation acme/n1: refused entente://evil/n1"), std::string::npos);

  // The window ends: the next line written, of any kind, comes after the summary.
  c.now = kT0 + Logger::kRepeatWindowMs;
  c.logger.log(LogLevel::info, "query", "later");
  ASSERT_EQ(c.lines.size(), 5u);
  EXPECT_EQ(c.lines[3],
            "2026-12-03T11:04:32.123Z warn  api acme/n1: … repeated 4 times in the last 10 s: refused POST "
            "/v1/streams: the bearer token is not valid for this node\n");
  EXPECT_NE(c.lines[4].find("info  query acme/n1: later"), std::string::npos);

  // A refusal seen once has no summary; the same one again starts a new window.
  c.logger.refusal("api", "refused POST /v1/streams: the bearer token is not valid for this node");
  ASSERT_EQ(c.lines.size(), 6u);
  EXPECT_EQ(c.lines[5].find("…"), std::string::npos);
}

TEST(Log, FlushRepeatsWritesTheSummaryWithoutAnotherLine) {
  Captured c;
  c.logger.set_format(LogFormat::json);
  c.logger.refusal("federation", "rate limited");
  c.logger.refusal("federation", "rate limited");
  c.logger.flush_repeats();  // window still open
  ASSERT_EQ(c.lines.size(), 1u);
  c.now += Logger::kRepeatWindowMs + 1;
  c.logger.flush_repeats();
  ASSERT_EQ(c.lines.size(), 2u);
  rapidjson::Document d;
  d.Parse(c.lines[1].data(), c.lines[1].size() - 1);
  ASSERT_FALSE(d.HasParseError()) << c.lines[1];
  EXPECT_STREQ(d["component"].GetString(), "federation");
  EXPECT_STREQ(d["level"].GetString(), "warn");
  EXPECT_EQ(std::string(d["msg"].GetString()), "… repeated 1 times in the last 10 s: rate limited");
}

TEST(Log, DifferentTextsLevelsAndComponentsAreNotCollapsed) {
  Captured c;
  c.logger.refusal("api", "a");
  c.logger.refusal("api", "b");
  c.logger.refusal("federation", "a");
  c.logger.log(LogLevel::warn, "api", "a");  // not a refusal: always written
  c.logger.log(LogLevel::warn, "api", "a");
  EXPECT_EQ(c.lines.size(), 5u);
}

TEST(Log, ConcurrentWritersProduceWholeLines) {
  std::vector<std::string> lines;
  std::mutex mu;
  Logger logger(
      [&](std::string_view l) {
        std::lock_guard lock(mu);
        lines.emplace_back(l);
      },
      [] { return kT0; });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&logger, t] {
      for (int i = 0; i < 500; ++i) {
        logger.log(LogLevel::info, "cluster", "thread " + std::to_string(t) + " line " + std::to_string(i));
        logger.refusal("api", "same refusal");
      }
    });
  }
  for (auto& th : threads) th.join();
  size_t plain = 0, refusals = 0;
  for (const auto& l : lines) {
    ASSERT_EQ(l.find('\n'), l.size() - 1) << l;
    plain += l.find("info  cluster: thread ") != std::string::npos;
    refusals += l.find("warn  api: same refusal") != std::string::npos;
  }
  EXPECT_EQ(plain, 2000u);
  EXPECT_EQ(refusals, 1u);
  logger.flush_repeats();  // the clock stands still: the window has not ended
  EXPECT_EQ(lines.size(), 2001u);
}

}  // namespace
}  // namespace entente::base
