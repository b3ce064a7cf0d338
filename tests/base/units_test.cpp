#include "base/units.h"

#include <gtest/gtest.h>

namespace entente::base {
namespace {

int64_t ms_of(std::string_view s) {
  const DurationParse d = parse_duration(s);
  EXPECT_TRUE(d.ok()) << s;
  return d.ms;
}

DurationParse::Outcome outcome_of(std::string_view s) { return parse_duration(s).outcome; }

TEST(Duration, EveryUnit) {
  EXPECT_EQ(ms_of("250ms"), 250);
  EXPECT_EQ(ms_of("0ms"), 0);
  EXPECT_EQ(ms_of("10s"), 10'000);
  EXPECT_EQ(ms_of("5m"), 300'000);
  EXPECT_EQ(ms_of("5min"), 300'000);
  EXPECT_EQ(ms_of("24h"), 86'400'000);
  EXPECT_EQ(ms_of("7d"), 7 * 86'400'000LL);
}

TEST(Duration, RefusesWhatIsNotInTheGrammar) {
  using O = DurationParse::Outcome;
  for (const char* s : {"", "10", "ms", "-1s", "+1s", "1 s", " 1s", "1s ", "1.5s", "1S", "1sec", "1w", "1mins",
                        "1GB", "0x10s"}) {
    EXPECT_EQ(outcome_of(s), O::malformed) << s;
  }
}

TEST(Duration, TooLargeIsNotMalformed) {
  using O = DurationParse::Outcome;
  EXPECT_EQ(outcome_of("99999999999999999999ms"), O::too_large);
  EXPECT_EQ(outcome_of("9223372036854776d"), O::too_large);
  EXPECT_EQ(outcome_of("9223372036854775807ms"), O::ok);
  EXPECT_EQ(outcome_of("106751991167d"), O::ok);
  EXPECT_EQ(outcome_of("106751991168d"), O::too_large);
}

SizeParse::Outcome size_outcome(std::string_view s) { return parse_size(s).outcome; }

uint64_t bytes_of(std::string_view s) {
  const SizeParse p = parse_size(s);
  EXPECT_TRUE(p.ok()) << s;
  return p.bytes;
}

TEST(Size, EveryUnit) {
  EXPECT_EQ(bytes_of("0"), 0u);
  EXPECT_EQ(bytes_of("4096"), 4096u);
  EXPECT_EQ(bytes_of("4096B"), 4096u);
  EXPECT_EQ(bytes_of("512KiB"), 512u * 1024);
  EXPECT_EQ(bytes_of("64MiB"), 64u << 20);
  EXPECT_EQ(bytes_of("1GiB"), uint64_t{1} << 30);
  EXPECT_EQ(bytes_of("2TiB"), uint64_t{2} << 40);
}

TEST(Size, RefusesWhatIsNotInTheGrammar) {
  using O = SizeParse::Outcome;
  for (const char* s : {"", "B", "KiB", "-1", "+1", "-1KiB", "1 KiB", " 1KiB", "1KiB ", "1.5MiB", "1kib", "1KIB",
                        "1k", "1M", "1PiB", "1b", "0x10", "10s"}) {
    EXPECT_EQ(size_outcome(s), O::malformed) << s;
  }
  for (const char* s : {"1KB", "1kB", "1MB", "1GB", "1TB"}) EXPECT_EQ(size_outcome(s), O::ambiguous) << s;
}

TEST(Size, TooLargeIsNotMalformed) {
  using O = SizeParse::Outcome;
  EXPECT_EQ(size_outcome("18446744073709551615"), O::ok);
  EXPECT_EQ(size_outcome("18446744073709551616"), O::too_large);
  EXPECT_EQ(size_outcome("16777215TiB"), O::ok);
  EXPECT_EQ(size_outcome("16777216TiB"), O::too_large);
}

TEST(UnitsText, LargestExactUnit) {
  EXPECT_EQ(size_text(1), "1 byte");
  EXPECT_EQ(size_text(1000), "1000 bytes");
  EXPECT_EQ(size_text(512 * kKiB), "512KiB");
  EXPECT_EQ(size_text(1024 * kTiB), "1024TiB");
  EXPECT_EQ(duration_text(250), "250ms");
  EXPECT_EQ(duration_text(90 * kMinuteMs), "90m");
  EXPECT_EQ(duration_text(3650 * kDayMs), "3650d");
}

}  // namespace
}  // namespace entente::base
