#include "base/units.h"

#include <charconv>

namespace entente::base {

DurationParse parse_duration(std::string_view s) {
  DurationParse r;
  // from_chars would accept a leading '-' for a signed type: read unsigned.
  uint64_t n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (end == s.data() || ec == std::errc::invalid_argument) return r;
  const std::string_view unit(end, static_cast<size_t>(s.data() + s.size() - end));
  int64_t mult = 0;
  if (unit == "ms") mult = 1;
  else if (unit == "s") mult = kSecondMs;
  else if (unit == "m" || unit == "min") mult = kMinuteMs;
  else if (unit == "h") mult = kHourMs;
  else if (unit == "d") mult = kDayMs;
  else return r;
  if (ec == std::errc::result_out_of_range || n > static_cast<uint64_t>(INT64_MAX / mult)) {
    r.outcome = DurationParse::Outcome::too_large;
    return r;
  }
  r.outcome = DurationParse::Outcome::ok;
  r.ms = static_cast<int64_t>(n) * mult;
  return r;
}

}  // namespace entente::base
