#include "contracts/terms.h"

#include <algorithm>

#include "base/json_text.h"
#include "certs/certs.h"
#include "contracts/canonical.h"
#include "contracts/detail/json.h"
#include "engine/box.h"
#include "engine/expr.h"
#include "engine/types.h"

namespace entente::contracts {

namespace {

using detail::read_bool;
using detail::read_string;
using detail::read_strings;
using detail::read_time;
using detail::read_uint;

constexpr size_t kMaxNameBytes = 128;  // read bound; the name rules are tighter

// engine/types.cpp's field name rule: [A-Za-z_][A-Za-z0-9_]*, at most 128.
bool valid_field_name(std::string_view n) {
  if (n.empty() || n.size() > 128) return false;
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!alpha(n[0])) return false;
  return std::all_of(n.begin(), n.end(), [&](char c) { return alpha(c) || (c >= '0' && c <= '9'); });
}

std::string quote_name(std::string_view s) { return "'" + std::string(s.substr(0, 80)) + "'"; }

void check_domain(const std::string& name, const std::string& path, Diagnostics& diag) {
  if (!certs::valid_name(name)) {
    diag.error(path, "invalid domain name " + quote_name(name) + ": expected [a-z][a-z0-9-]*, at most 63 characters");
  }
}

// Items must be unique, and sorted when `sorted` (the canonical form relies
// on one order; API input is sorted after it is checked, so that errors name
// the positions the admin wrote).
void check_unique(const std::vector<std::string>& items, const std::string& path, bool sorted,
                  Diagnostics& diag) {
  for (size_t i = 1; i < items.size(); ++i) {
    const auto end = items.begin() + static_cast<std::ptrdiff_t>(i);
    if (std::find(items.begin(), end, items[i]) != end) {
      diag.error(path + "[" + std::to_string(i) + "]", "duplicate " + quote_name(items[i]));
    } else if (sorted && items[i] < items[i - 1]) {
      diag.error(path, "must be sorted");
      return;
    }
  }
}

void check_stream(const StreamTerms& s, const std::string& p, bool sorted, Diagnostics& diag) {
  check_domain(s.provider, p + ".provider", diag);
  check_domain(s.consumer, p + ".consumer", diag);
  if (s.provider == s.consumer && !s.provider.empty()) {
    diag.error(p + ".consumer", "provider and consumer are the same domain " + quote_name(s.provider));
  }
  if (s.streams.empty() || s.streams.size() > kMaxStreams) {
    diag.error(p + ".streams", "must name 1.." + std::to_string(kMaxStreams) + " streams");
  }
  for (size_t i = 0; i < s.streams.size(); ++i) {
    if (!valid_stream_name(s.streams[i])) {
      diag.error(p + ".streams[" + std::to_string(i) + "]",
                 "invalid stream name " + quote_name(s.streams[i]) + ": expected [a-z][a-z0-9_-]*, at most 63 characters");
    }
  }
  check_unique(s.streams, p + ".streams", sorted, diag);
  if (s.fields.size() > kMaxFields) {
    diag.error(p + ".fields", "names more than " + std::to_string(kMaxFields) + " fields");
  }
  for (size_t i = 0; i < s.fields.size(); ++i) {
    if (!valid_field_name(s.fields[i])) {
      diag.error(p + ".fields[" + std::to_string(i) + "]",
                 "invalid field name " + quote_name(s.fields[i]) + ": expected [A-Za-z_][A-Za-z0-9_]*, at most 128");
    }
  }
  check_unique(s.fields, p + ".fields", /*sorted=*/false, diag);
  if (s.predicate.size() > kMaxPredicateBytes) {
    diag.error(p + ".predicate", "is longer than " + std::to_string(kMaxPredicateBytes) + " bytes");
  } else if (!base::valid_utf8(s.predicate)) {
    diag.error(p + ".predicate", "is not valid UTF-8");
  }
  if (s.rate_cap > kMaxRateCap) {
    diag.error(p + ".rate_cap", "is above " + std::to_string(kMaxRateCap) + " tuples per second");
  }
  if (s.price_per_million > kMaxPrice) {
    diag.error(p + ".price_per_million", "is above " + std::to_string(kMaxPrice) + " credits");
  }
}

void check_hosting(const HostingTerms& h, const std::string& p, bool sorted, Diagnostics& diag) {
  check_domain(h.host, p + ".host", diag);
  check_domain(h.owner, p + ".owner", diag);
  if (h.host == h.owner && !h.host.empty()) {
    diag.error(p + ".owner", "host and owner are the same domain " + quote_name(h.host));
  }
  if (h.box_kinds.empty() || h.box_kinds.size() > kMaxBoxKinds) {
    diag.error(p + ".box_kinds", "must name 1.." + std::to_string(kMaxBoxKinds) + " box kinds");
  }
  for (size_t i = 0; i < h.box_kinds.size(); ++i) {
    if (engine::find_box_factory(h.box_kinds[i]) == nullptr) {
      std::string known;
      for (auto name : engine::box_type_names()) known += (known.empty() ? "" : ", ") + std::string(name);
      diag.error(p + ".box_kinds[" + std::to_string(i) + "]",
                 "unknown box kind " + quote_name(h.box_kinds[i]) + " (known: " + known + ")");
    }
  }
  check_unique(h.box_kinds, p + ".box_kinds", sorted, diag);
  if (h.max_load < 1 || h.max_load > kMaxLoad) {
    diag.error(p + ".max_load", "must be 1.." + std::to_string(kMaxLoad) + " CPU ms per second");
  }
  if (h.price_max > kMaxPrice) {
    diag.error(p + ".price_max", "is above " + std::to_string(kMaxPrice) + " credits");
  }
  if (h.price_min > h.price_max) {
    diag.error(p + ".price_min", "is above price_max (" + std::to_string(h.price_min) + " > " +
                                     std::to_string(h.price_max) + ")");
  }
  if (h.notice_seconds > kMaxNoticeSeconds) {
    diag.error(p + ".notice_seconds", "is above " + std::to_string(kMaxNoticeSeconds) + " seconds");
  }
  if (h.host_may_subscribe) {
    diag.error(p + ".host_may_subscribe", "must be false: a host may not subscribe to hosted boxes' streams");
  }
  if (h.host_may_export) {
    diag.error(p + ".host_may_export", "must be false: a host may not export hosted boxes' streams");
  }
}

void check_terms(const Terms& t, const std::string& p, bool sorted, Diagnostics& diag) {
  if (t.valid_from_ms < 0 || t.valid_from_ms > kMaxTimeMs || t.valid_from_ms % 1000 != 0) {
    diag.error(p + ".valid_from", "must be whole seconds in 1970..9999");
  }
  if (t.valid_until_ms < 0 || t.valid_until_ms > kMaxTimeMs || t.valid_until_ms % 1000 != 0) {
    diag.error(p + ".valid_until", "must be whole seconds in 1970..9999");
  }
  if (t.valid_until_ms <= t.valid_from_ms) {
    diag.error(p + ".valid_until", "must be after valid_from");
  } else if (t.valid_until_ms - t.valid_from_ms > kMaxValiditySpanMs) {
    diag.error(p + ".valid_until", "is more than 10 years after valid_from");
  }
  if (t.kind == Kind::stream) {
    check_stream(t.stream, p, sorted, diag);
    if (!(t.hosting == HostingTerms{})) diag.error(p, "a stream contract carries hosting terms");
  } else {
    check_hosting(t.hosting, p, sorted, diag);
    if (!(t.stream == StreamTerms{})) diag.error(p, "a hosting contract carries stream terms");
  }
}

const std::vector<std::string_view> kStreamMembers = {"kind",      "valid_from", "valid_until", "provider",
                                                      "consumer",  "streams",    "fields",      "predicate",
                                                      "rate_cap",  "price_per_million"};
const std::vector<std::string_view> kHostingMembers = {
    "kind",      "valid_from", "valid_until",    "host",     "owner",           "box_kinds",
    "max_load",  "price_min",  "price_max",      "notice_seconds", "host_may_subscribe", "host_may_export"};

}  // namespace

std::string_view kind_name(Kind k) { return k == Kind::stream ? "stream" : "hosting"; }

bool valid_stream_name(std::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  if (name[0] < 'a' || name[0] > 'z') return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
}

Result<Terms> terms_from_json(const rapidjson::Value& v, std::string_view path_view) {
  const std::string p(path_view);
  Diagnostics diag;
  if (!v.IsObject()) {
    diag.error(p, "must be an object");
    return detail::diagnostics_error(diag);
  }
  Terms t;
  const auto kind_it = v.FindMember("kind");
  if (kind_it == v.MemberEnd()) {
    diag.error(p + ".kind", "missing: \"stream\" or \"hosting\"");
    return detail::diagnostics_error(diag);
  }
  auto kind = read_string(kind_it->value, p + ".kind", 16, diag);
  if (!kind) return detail::diagnostics_error(diag);
  if (*kind == "stream") {
    t.kind = Kind::stream;
  } else if (*kind == "hosting") {
    t.kind = Kind::hosting;
  } else {
    diag.error(p + ".kind", "must be \"stream\" or \"hosting\", not " + quote_name(*kind));
    return detail::diagnostics_error(diag);
  }
  detail::check_members(v, p, t.kind == Kind::stream ? kStreamMembers : kHostingMembers, diag);

  auto member = [&](const char* name, bool required) -> const rapidjson::Value* {
    const auto it = v.FindMember(name);
    if (it == v.MemberEnd()) {
      if (required) diag.error(p + "." + name, "missing");
      return nullptr;
    }
    return &it->value;
  };
  auto str = [&](const char* name, std::string& out) {
    if (const auto* m = member(name, true)) {
      if (auto s = read_string(*m, p + "." + name, kMaxNameBytes, diag)) out = std::move(*s);
    }
  };
  auto uint = [&](const char* name, bool required, uint64_t& out) {
    if (const auto* m = member(name, required)) {
      if (auto n = read_uint(*m, p + "." + name, diag)) out = *n;
    }
  };
  auto flag = [&](const char* name, bool& out) {
    if (const auto* m = member(name, false)) {
      if (auto b = read_bool(*m, p + "." + name, diag)) out = *b;
    }
  };
  auto name_list = [&](const char* name, size_t max, std::vector<std::string>& out) {
    if (const auto* m = member(name, true)) {
      if (auto l = read_strings(*m, p + "." + name, max, kMaxNameBytes, diag)) {
        out = std::move(*l);
      }
    }
  };
  auto time = [&](const char* name, int64_t& out) {
    if (const auto* m = member(name, true)) {
      if (auto ms = read_time(*m, p + "." + name, diag)) out = *ms;
    }
  };

  time("valid_from", t.valid_from_ms);
  time("valid_until", t.valid_until_ms);
  if (t.kind == Kind::stream) {
    StreamTerms& s = t.stream;
    str("provider", s.provider);
    str("consumer", s.consumer);
    name_list("streams", kMaxStreams, s.streams);
    if (const auto* m = member("fields", false)) {
      if (auto l = read_strings(*m, p + ".fields", kMaxFields, kMaxNameBytes, diag)) s.fields = std::move(*l);
    }
    if (const auto* m = member("predicate", false)) {
      if (auto text = read_string(*m, p + ".predicate", kMaxPredicateBytes, diag)) s.predicate = std::move(*text);
    }
    uint("rate_cap", false, s.rate_cap);
    uint("price_per_million", false, s.price_per_million);
  } else {
    HostingTerms& h = t.hosting;
    str("host", h.host);
    str("owner", h.owner);
    name_list("box_kinds", kMaxBoxKinds, h.box_kinds);
    uint("max_load", true, h.max_load);
    uint("price_min", false, h.price_min);
    uint("price_max", false, h.price_max);
    uint("notice_seconds", false, h.notice_seconds);
    flag("host_may_subscribe", h.host_may_subscribe);
    flag("host_may_export", h.host_may_export);
  }
  // The rules only make sense on well-typed input; report type errors first.
  if (!diag.ok()) return detail::diagnostics_error(diag);
  check_terms(t, p, /*sorted=*/false, diag);
  if (!diag.ok()) return detail::diagnostics_error(diag);
  // Sorted once checked: an admin need not care about the order, and the
  // canonical form has one.
  std::sort(t.stream.streams.begin(), t.stream.streams.end());
  std::sort(t.hosting.box_kinds.begin(), t.hosting.box_kinds.end());
  return t;
}

Status validate_terms(const Terms& t, std::string_view path) {
  Diagnostics diag;
  check_terms(t, std::string(path), /*sorted=*/true, diag);
  if (!diag.ok()) return detail::diagnostics_error(diag);
  return Status::Ok();
}

std::string canonical_terms(const Terms& t) {
  rapidjson::Document doc;
  return detail::canonical_of(detail::terms_value(t, doc.GetAllocator()));
}

std::pair<std::string, std::string> parties(const Terms& t) {
  if (t.kind == Kind::stream) return {t.stream.provider, t.stream.consumer};
  return {t.hosting.host, t.hosting.owner};
}

void check_stream_catalog(const Terms& t, const StreamSchemaLookup& schema_of, Diagnostics& diag,
                          const std::vector<std::string>& given_streams, std::string_view path) {
  const StreamTerms& s = t.stream;
  const std::string p(path);
  for (size_t i = 0; i < s.streams.size(); ++i) {
    const std::string& name = s.streams[i];
    size_t at = i;
    if (auto g = std::find(given_streams.begin(), given_streams.end(), name); g != given_streams.end()) {
      at = static_cast<size_t>(g - given_streams.begin());
    }
    const std::string full = s.provider + "/" + name;
    const std::shared_ptr<const engine::Schema> schema = schema_of ? schema_of(name) : nullptr;
    if (!schema) {
      diag.error(p + ".streams[" + std::to_string(at) + "]", s.provider + " has no stream " + quote_name(name));
      continue;
    }
    for (size_t f = 0; f < s.fields.size(); ++f) {
      if (!schema->index_of(s.fields[f])) {
        diag.error(p + ".fields[" + std::to_string(f) + "]",
                   "stream " + full + " has no field " + quote_name(s.fields[f]) + " (it has " + schema->to_string() + ")");
      }
    }
    if (s.predicate.empty()) continue;
    auto compiled = engine::Expr::compile(s.predicate, *schema);
    if (!compiled.ok()) {
      diag.error(p + ".predicate", "does not compile against " + full + ": " + compiled.error().message);
    } else if (compiled->type() != engine::Type::Bool) {
      diag.error(p + ".predicate", "is of type " + std::string(engine::type_name(compiled->type())) + " on " + full +
                                       ", not bool: a predicate is a condition");
    }
  }
}

}  // namespace entente::contracts
