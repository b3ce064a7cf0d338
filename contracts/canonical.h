#pragma once
// The canonical JSON form (docs/contracts.md, "Canonical form"): the exact
// bytes a domain signs when it accepts a contract, so that two brokers (or
// two implementations) produce the same bytes for the same terms.
//
//   - UTF-8; objects with keys sorted by byte order, no duplicate keys;
//   - no white space;
//   - strings escaped minimally: `"` and `\` with a backslash; control
//     characters below 0x20 as \b \f \n \r \t, or \u00xx (lower-case hex);
//     everything else, including non-ASCII, as is;
//   - integers in decimal, no leading zeros, no plus sign; no floats;
//   - true, false, null; arrays in their given order.
//
// Times in canonical documents are RFC 3339 UTC strings with second
// precision ("2026-12-01T00:00:00Z").

#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"
#include "rapidjson/fwd.h"

namespace entente::contracts {

// Nesting deeper than this is refused (limit_exceeded).
inline constexpr int kMaxCanonicalDepth = 32;

// The canonical form of `v`. invalid_argument for a float, a duplicate key,
// or a string that is not valid UTF-8; limit_exceeded for deep nesting.
Result<std::string> canonical_json(const rapidjson::Value& v);

// "2026-12-01T00:00:00Z" for 1796083200000. REQUIRES: ms is a multiple of
// 1000 in [0, kMaxTimeMs] (sub-second digits are dropped otherwise).
std::string format_time(int64_t ms);

// The latest time the canonical form writes: 9999-12-31T23:59:59Z.
inline constexpr int64_t kMaxTimeMs = 253402300799000;

// Parses exactly "YYYY-MM-DDTHH:MM:SSZ" (UTC, no fraction, no offset) into
// Unix milliseconds. invalid_argument saying what is wrong.
Result<int64_t> parse_time(std::string_view text);

}  // namespace entente::contracts
