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

}  // namespace
}  // namespace entente::base
