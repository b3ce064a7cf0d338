#include "base/units.h"

#include <charconv>
#include <limits>
#include <utility>

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

std::string duration_text(int64_t ms) {
  for (auto [unit, name] : {std::pair{kDayMs, "d"}, {kHourMs, "h"}, {kMinuteMs, "m"}, {kSecondMs, "s"}}) {
    if (ms >= unit && ms % unit == 0) return std::to_string(ms / unit) + name;
  }
  return std::to_string(ms) + "ms";
}

SizeParse parse_size(std::string_view s) {
  SizeParse r;
  uint64_t n = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (end == s.data() || ec == std::errc::invalid_argument) return r;
  const std::string_view unit(end, static_cast<size_t>(s.data() + s.size() - end));
  uint64_t mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KiB") mult = kKiB;
  else if (unit == "MiB") mult = kMiB;
  else if (unit == "GiB") mult = kGiB;
  else if (unit == "TiB") mult = kTiB;
  else if (unit == "KB" || unit == "kB" || unit == "MB" || unit == "GB" || unit == "TB") {
    r.outcome = SizeParse::Outcome::ambiguous;
    return r;
  } else {
    return r;
  }
  if (ec == std::errc::result_out_of_range || n > std::numeric_limits<uint64_t>::max() / mult) {
    r.outcome = SizeParse::Outcome::too_large;
    return r;
  }
  r.outcome = SizeParse::Outcome::ok;
  r.bytes = n * mult;
  return r;
}

std::string size_text(uint64_t n) {
  for (auto [unit, name] : {std::pair{kTiB, "TiB"}, {kGiB, "GiB"}, {kMiB, "MiB"}, {kKiB, "KiB"}}) {
    if (n >= unit && n % unit == 0) return std::to_string(n / unit) + name;
  }
  return std::to_string(n) + (n == 1 ? " byte" : " bytes");
}

}  // namespace entente::base
