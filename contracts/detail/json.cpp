#include "contracts/detail/json.h"

#include <algorithm>
#include <cassert>

#include "base/json_read.h"
#include "base/json_text.h"
#include "contracts/canonical.h"

namespace entente::contracts::detail {

rapidjson::Value string_value(std::string_view s, Alloc& a) {
  return rapidjson::Value(s.data(), static_cast<rapidjson::SizeType>(s.size()), a);
}

namespace {

rapidjson::Value strings_value(const std::vector<std::string>& items, Alloc& a) {
  rapidjson::Value arr(rapidjson::kArrayType);
  for (const auto& s : items) arr.PushBack(string_value(s, a), a);
  return arr;
}

void add(rapidjson::Value& obj, const char* key, rapidjson::Value v, Alloc& a) {
  obj.AddMember(rapidjson::StringRef(key), v, a);
}

std::string_view json_type(const rapidjson::Value& v) {
  if (v.IsNull()) return "null";
  if (v.IsBool()) return "a boolean";
  if (v.IsString()) return "a string";
  if (v.IsNumber()) return "a number";
  if (v.IsArray()) return "an array";
  return "an object";
}

}  // namespace

rapidjson::Value terms_value(const Terms& t, Alloc& a) {
  rapidjson::Value o(rapidjson::kObjectType);
  add(o, "kind", string_value(kind_name(t.kind), a), a);
  add(o, "valid_from", string_value(format_time(t.valid_from_ms), a), a);
  add(o, "valid_until", string_value(format_time(t.valid_until_ms), a), a);
  if (t.kind == Kind::stream) {
    const StreamTerms& s = t.stream;
    add(o, "provider", string_value(s.provider, a), a);
    add(o, "consumer", string_value(s.consumer, a), a);
    add(o, "streams", strings_value(s.streams, a), a);
    add(o, "fields", strings_value(s.fields, a), a);
    add(o, "predicate", string_value(s.predicate, a), a);
    add(o, "rate_cap", rapidjson::Value(s.rate_cap), a);
    add(o, "price_per_million", rapidjson::Value(s.price_per_million), a);
  } else {
    const HostingTerms& h = t.hosting;
    add(o, "host", string_value(h.host, a), a);
    add(o, "owner", string_value(h.owner, a), a);
    add(o, "box_kinds", strings_value(h.box_kinds, a), a);
    add(o, "max_load", rapidjson::Value(h.max_load), a);
    add(o, "price_min", rapidjson::Value(h.price_min), a);
    add(o, "price_max", rapidjson::Value(h.price_max), a);
    add(o, "notice_seconds", rapidjson::Value(h.notice_seconds), a);
    add(o, "host_may_subscribe", rapidjson::Value(h.host_may_subscribe), a);
    add(o, "host_may_export", rapidjson::Value(h.host_may_export), a);
  }
  return o;
}

std::string canonical_of(const rapidjson::Value& v) {
  auto r = canonical_json(v);
  assert(r.ok());
  return r.ok() ? std::move(r).value() : std::string();
}

std::optional<std::string> read_string(const rapidjson::Value& v, const std::string& path, size_t max_bytes,
                                       Diagnostics& diag) {
  if (!v.IsString()) {
    diag.error(path, "must be a string, not " + std::string(json_type(v)));
    return std::nullopt;
  }
  if (v.GetStringLength() > max_bytes) {
    diag.error(path, "is longer than " + std::to_string(max_bytes) + " bytes");
    return std::nullopt;
  }
  std::string s(v.GetString(), v.GetStringLength());
  if (!base::valid_utf8(s)) {
    diag.error(path, "is not valid UTF-8");
    return std::nullopt;
  }
  return s;
}

std::optional<uint64_t> read_uint(const rapidjson::Value& v, const std::string& path, Diagnostics& diag) {
  if (v.IsUint64()) return v.GetUint64();
  if (v.IsInt64()) {
    diag.error(path, "must not be negative");
  } else if (v.IsNumber()) {
    diag.error(path, "must be an integer");
  } else {
    diag.error(path, "must be an integer, not " + std::string(json_type(v)));
  }
  return std::nullopt;
}

std::optional<int64_t> read_int(const rapidjson::Value& v, const std::string& path, Diagnostics& diag) {
  if (v.IsInt64()) return v.GetInt64();
  if (v.IsNumber()) {
    diag.error(path, v.IsUint64() ? "is too large" : "must be an integer");
  } else {
    diag.error(path, "must be an integer, not " + std::string(json_type(v)));
  }
  return std::nullopt;
}

std::optional<bool> read_bool(const rapidjson::Value& v, const std::string& path, Diagnostics& diag) {
  if (v.IsBool()) return v.GetBool();
  diag.error(path, "must be true or false, not " + std::string(json_type(v)));
  return std::nullopt;
}

std::optional<std::vector<std::string>> read_strings(const rapidjson::Value& v, const std::string& path,
                                                     size_t max_items, size_t max_bytes, Diagnostics& diag) {
  if (!v.IsArray()) {
    diag.error(path, "must be an array of strings, not " + std::string(json_type(v)));
    return std::nullopt;
  }
  if (v.Size() > max_items) {
    diag.error(path, "has " + std::to_string(v.Size()) + " items; at most " + std::to_string(max_items));
    return std::nullopt;
  }
  std::vector<std::string> out;
  bool ok = true;
  for (rapidjson::SizeType i = 0; i < v.Size(); ++i) {
    auto s = read_string(v[i], path + "[" + std::to_string(i) + "]", max_bytes, diag);
    if (s) {
      out.push_back(std::move(*s));
    } else {
      ok = false;
    }
  }
  if (!ok) return std::nullopt;
  return out;
}

std::optional<int64_t> read_time(const rapidjson::Value& v, const std::string& path, Diagnostics& diag) {
  if (v.IsString()) {
    auto t = parse_time(std::string_view(v.GetString(), v.GetStringLength()));
    if (!t.ok()) {
      diag.error(path, t.error().message);
      return std::nullopt;
    }
    return *t;
  }
  if (v.IsInt64()) {
    const int64_t ms = v.GetInt64();
    if (ms < 0 || ms > kMaxTimeMs) {
      diag.error(path, "is outside 1970-01-01T00:00:00Z..9999-12-31T23:59:59Z");
      return std::nullopt;
    }
    if (ms % 1000 != 0) {
      diag.error(path, "has a fraction of a second; times are whole seconds");
      return std::nullopt;
    }
    return ms;
  }
  diag.error(path, "must be an RFC 3339 UTC time or Unix milliseconds, not " + std::string(json_type(v)));
  return std::nullopt;
}

void check_members(const rapidjson::Value& obj, const std::string& path,
                   const std::vector<std::string_view>& known, Diagnostics& diag) {
  base::check_members(obj, path, known, diag, base::kFieldWords);
}

Error diagnostics_error(const Diagnostics& diag) {
  return make_error(Errc::invalid_argument, diag.to_string());
}

}  // namespace entente::contracts::detail
