#include "contracts/canonical.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "base/json_text.h"
#include "rapidjson/document.h"

namespace entente::contracts {

namespace {

// The canonical form refuses what it cannot sign faithfully: a string that is
// not valid UTF-8 is an error, never replaced.
Status write_string(std::string_view s, std::string& out) {
  if (const size_t bad = base::first_invalid_utf8(s); bad != std::string_view::npos) {
    return make_error(Errc::invalid_argument, "string is not valid UTF-8 (byte " + std::to_string(bad) + ")");
  }
  base::append_json_string(out, s);
  return Status::Ok();
}

std::string_view view(const rapidjson::Value& s) { return {s.GetString(), s.GetStringLength()}; }

Status write_value(const rapidjson::Value& v, std::string& out, int depth) {
  if (depth > kMaxCanonicalDepth) {
    return make_error(Errc::limit_exceeded,
                      "nesting deeper than " + std::to_string(kMaxCanonicalDepth) + " levels");
  }
  switch (v.GetType()) {
    case rapidjson::kNullType: out += "null"; return Status::Ok();
    case rapidjson::kFalseType: out += "false"; return Status::Ok();
    case rapidjson::kTrueType: out += "true"; return Status::Ok();
    case rapidjson::kStringType: return write_string(view(v), out);
    case rapidjson::kNumberType:
      if (v.IsUint64()) {
        out += std::to_string(v.GetUint64());
      } else if (v.IsInt64()) {
        out += std::to_string(v.GetInt64());
      } else {
        return make_error(Errc::invalid_argument, "floats have no canonical form; use an integer");
      }
      return Status::Ok();
    case rapidjson::kArrayType: {
      out += '[';
      bool first = true;
      for (const auto& item : v.GetArray()) {
        if (!first) out += ',';
        first = false;
        ENTENTE_RETURN_IF_ERROR(write_value(item, out, depth + 1));
      }
      out += ']';
      return Status::Ok();
    }
    case rapidjson::kObjectType: {
      std::vector<const rapidjson::Value::Member*> members;
      members.reserve(v.MemberCount());
      for (const auto& m : v.GetObject()) members.push_back(&m);
      // Byte order: std::string_view compares as unsigned chars would
      // (char_traits<char>::compare is specified as unsigned comparison).
      std::sort(members.begin(), members.end(),
                [](const auto* a, const auto* b) { return view(a->name) < view(b->name); });
      out += '{';
      for (size_t i = 0; i < members.size(); ++i) {
        if (i > 0) {
          if (view(members[i]->name) == view(members[i - 1]->name)) {
            return make_error(Errc::invalid_argument, "duplicate key '" + std::string(view(members[i]->name)) + "'");
          }
          out += ',';
        }
        ENTENTE_RETURN_IF_ERROR(write_string(view(members[i]->name), out));
        out += ':';
        ENTENTE_RETURN_IF_ERROR(write_value(members[i]->value, out, depth + 1));
      }
      out += '}';
      return Status::Ok();
    }
  }
  return make_error(Errc::invalid_argument, "unknown JSON value type");
}

// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
// days_from_civil).
int64_t days_from_civil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2 ? 1 : 0;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

void civil_from_days(int64_t z, int64_t& y, unsigned& m, unsigned& d) {
  z += 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const unsigned doe = static_cast<unsigned>(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  d = doy - (153 * mp + 2) / 5 + 1;
  m = mp < 10 ? mp + 3 : mp - 9;
  y = static_cast<int64_t>(yoe) + era * 400 + (m <= 2 ? 1 : 0);
}

bool leap(int64_t y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

}  // namespace

Result<std::string> canonical_json(const rapidjson::Value& v) {
  std::string out;
  ENTENTE_RETURN_IF_ERROR(write_value(v, out, 0));
  return out;
}

std::string format_time(int64_t ms) {
  const int64_t secs = (ms < 0 ? 0 : ms > kMaxTimeMs ? kMaxTimeMs : ms) / 1000;
  int64_t y = 0;
  unsigned m = 0, d = 0;
  civil_from_days(secs / 86400, y, m, d);
  const int64_t rem = secs % 86400;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%04lld-%02u-%02uT%02lld:%02lld:%02lldZ", static_cast<long long>(y), m, d,
                static_cast<long long>(rem / 3600), static_cast<long long>(rem / 60 % 60),
                static_cast<long long>(rem % 60));
  return buf;
}

Result<int64_t> parse_time(std::string_view t) {
  auto bad = [&](const std::string& why) {
    return make_error(Errc::invalid_argument,
                      "time '" + std::string(t.substr(0, 40)) + "' " + why);
  };
  constexpr std::string_view kShape = "dddd-dd-ddTdd:dd:ddZ";
  if (t.size() != kShape.size()) {
    if (t.find('.') != std::string_view::npos) return bad("has a fraction of a second; times are whole seconds");
    return bad("is not an RFC 3339 UTC time like 2026-12-01T00:00:00Z");
  }
  for (size_t i = 0; i < kShape.size(); ++i) {
    const bool ok = kShape[i] == 'd' ? (t[i] >= '0' && t[i] <= '9') : t[i] == kShape[i];
    if (!ok) return bad("is not an RFC 3339 UTC time like 2026-12-01T00:00:00Z");
  }
  auto num = [&](size_t at, size_t n) {
    int64_t v = 0;
    for (size_t i = at; i < at + n; ++i) v = v * 10 + (t[i] - '0');
    return v;
  };
  const int64_t y = num(0, 4), mo = num(5, 2), d = num(8, 2), h = num(11, 2), mi = num(14, 2), s = num(17, 2);
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (y < 1970) return bad("is before 1970");
  if (mo < 1 || mo > 12) return bad("has no month " + std::to_string(mo));
  const int64_t month_days = kDays[mo - 1] + (mo == 2 && leap(y) ? 1 : 0);
  if (d < 1 || d > month_days) return bad("has no day " + std::to_string(d) + " in its month");
  if (h > 23 || mi > 59 || s > 59) return bad("has an hour, minute or second out of range");
  const int64_t days = days_from_civil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d));
  return ((days * 86400) + h * 3600 + mi * 60 + s) * 1000;
}

}  // namespace entente::contracts
