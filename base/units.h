#pragma once
// The one duration grammar and the one size grammar of the tree: `node.json`,
// REST bodies and the options of a query network's boxes accept the same
// spellings (docs/configuration.md, docs/api.md, docs/query-networks.md).
//
// A duration is either a JSON integer, read as milliseconds, or a string
// "<digits><unit>" with unit ms, s, m or min (minutes), h or d: "250ms",
// "10s", "5m", "5min", "24h", "7d". No sign, no spaces, no fraction, no
// string without a unit. The JSON side (integer or string) is the caller's;
// this parses the string.

#include <cstdint>
#include <string>
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

// "250ms", "10s", "5m", "24h", "7d": the largest unit that divides `ms`
// exactly (for messages).
std::string duration_text(int64_t ms);

// A size is either a JSON integer, read as bytes, or a string
// "<digits><unit>" with unit B, KiB, MiB, GiB or TiB (powers of 1024), or
// no unit (bytes): "512KiB", "64MiB", "1GiB", "4096". The decimal units KB,
// kB, MB, GB and TB are refused as ambiguous rather than guessed at. No
// sign, no spaces, no fraction.
inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = kKiB << 10;
inline constexpr uint64_t kGiB = kMiB << 10;
inline constexpr uint64_t kTiB = kGiB << 10;

struct SizeParse {
  enum class Outcome { ok, malformed, ambiguous, too_large };
  Outcome outcome = Outcome::malformed;
  uint64_t bytes = 0;  // when ok
  bool ok() const { return outcome == Outcome::ok; }
};

// Parses "<digits>[unit]". ambiguous for a decimal unit ("1GB"); too_large
// when the value does not fit in uint64_t bytes.
SizeParse parse_size(std::string_view s);

// "512KiB", "1GiB", "1 byte", "1000 bytes": the largest binary unit that
// divides `n` exactly (for messages).
std::string size_text(uint64_t n);

}  // namespace entente::base
