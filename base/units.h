#pragma once
// The one duration grammar of the tree: `node.json` and the options of a
// query network's boxes accept the same spellings (docs/configuration.md,
// docs/query-networks.md).
//
// A duration is either a JSON integer, read as milliseconds, or a string
// "<digits><unit>" with unit ms, s, m or min (minutes), h or d: "250ms",
// "10s", "5m", "5min", "24h", "7d". No sign, no spaces, no fraction, no
// string without a unit. The JSON side (integer or string) is the caller's;
// this parses the string.

#include <cstdint>
#include <string_view>

namespace entente::base {

inline constexpr int64_t kSecondMs = 1000;
inline constexpr int64_t kMinuteMs = 60 * kSecondMs;
inline constexpr int64_t kHourMs = 60 * kMinuteMs;
inline constexpr int64_t kDayMs = 24 * kHourMs;

struct DurationParse {
  enum class Outcome { ok, malformed, too_large };
  Outcome outcome = Outcome::malformed;
  int64_t ms = 0;  // when ok
  bool ok() const { return outcome == Outcome::ok; }
};

// Parses "<digits><unit>". too_large when the value does not fit in int64_t
// milliseconds.
DurationParse parse_duration(std::string_view s);

}  // namespace entente::base
