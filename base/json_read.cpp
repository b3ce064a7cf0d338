#include "base/json_read.h"

#include <algorithm>

#include "base/units.h"
#include "rapidjson/error/en.h"

namespace entente::base {

// ---- documents

namespace {

constexpr unsigned kParseFlags =
    rapidjson::kParseValidateEncodingFlag | rapidjson::kParseFullPrecisionFlag | rapidjson::kParseIterativeFlag;
// Objects with more members than this are checked by sorting their keys;
// smaller ones (every row of a batch, in practice) by comparing pairs.
constexpr size_t kPairwiseMembers = 16;

std::string_view name_of(const rapidjson::Value::Member& m) {
  return {m.name.GetString(), m.name.GetStringLength()};
}

std::string shown(std::string_view key) {
  return std::string(key.substr(0, 64)) + (key.size() > 64 ? "..." : "");
}

// The first key of `obj` given twice (in member order of its second
// occurrence for small objects, in byte order for large ones).
std::optional<std::string_view> duplicate_key(const rapidjson::Value& obj) {
  const size_t n = obj.MemberCount();
  if (n < 2) return std::nullopt;
  if (n <= kPairwiseMembers) {
    for (auto i = obj.MemberBegin(); i != obj.MemberEnd(); ++i)
      for (auto j = obj.MemberBegin(); j != i; ++j)
        if (name_of(*i) == name_of(*j)) return name_of(*i);
    return std::nullopt;
  }
  std::vector<std::string_view> keys;
  keys.reserve(n);
  for (auto i = obj.MemberBegin(); i != obj.MemberEnd(); ++i) keys.push_back(name_of(*i));
  std::sort(keys.begin(), keys.end());
  auto d = std::adjacent_find(keys.begin(), keys.end());
  if (d == keys.end()) return std::nullopt;
  return *d;
}

// REQUIRES: depth <= kMaxJsonDepth + 1 (the recursion is bounded by it).
std::optional<JsonProblem> check(const rapidjson::Value& v, std::string& path, size_t depth,
                                 std::optional<size_t> element) {
  if (!v.IsObject() && !v.IsArray()) return std::nullopt;
  if (depth > kMaxJsonDepth) {
    JsonProblem p;
    p.code = Errc::invalid_argument;
    p.path = path;
    p.element = element;
    p.why = "nested deeper than " + std::to_string(kMaxJsonDepth) + " levels";
    return p;
  }
  const size_t mark = path.size();
  if (v.IsArray()) {
    for (rapidjson::SizeType i = 0; i < v.Size(); ++i) {
      path += "[" + std::to_string(i) + "]";
      auto p = check(v[i], path, depth + 1, depth == 0 ? std::optional<size_t>(i) : element);
      if (p) return p;
      path.resize(mark);
    }
    return std::nullopt;
  }
  if (auto key = duplicate_key(v)) {
    JsonProblem p;
    p.code = Errc::invalid_argument;
    p.path = path + "." + shown(*key);
    p.element = element;
    p.key = std::string(*key);
    p.why = "duplicate key '" + shown(*key) + "'";
    return p;
  }
  for (auto m = v.MemberBegin(); m != v.MemberEnd(); ++m) {
    if (!m->value.IsObject() && !m->value.IsArray()) continue;
    path += "." + shown(name_of(*m));
    auto p = check(m->value, path, depth + 1, element);
    if (p) return p;
    path.resize(mark);
  }
  return std::nullopt;
}

std::optional<JsonProblem> syntax_problem(const rapidjson::Document& doc) {
  JsonProblem p;
  p.code = Errc::parse_error;
  p.why = "invalid JSON at offset " + std::to_string(doc.GetErrorOffset()) + ": " +
          rapidjson::GetParseError_En(doc.GetParseError());
  return p;
}

}  // namespace

std::string JsonProblem::message() const {
  if (code == Errc::parse_error) return why;
  return path + ": " + why;
}

std::optional<JsonProblem> check_json(const rapidjson::Value& v, std::string_view root) {
  std::string path(root);
  return check(v, path, 0, std::nullopt);
}

std::optional<JsonProblem> read_json(std::string_view text, rapidjson::Document& doc) {
  doc.Parse<kParseFlags>(text.data(), text.size());
  if (doc.HasParseError()) return syntax_problem(doc);
  return check_json(doc);
}

std::optional<JsonProblem> read_json_insitu(char* text, rapidjson::Document& doc) {
  doc.ParseInsitu<kParseFlags>(text);
  if (doc.HasParseError()) return syntax_problem(doc);
  return check_json(doc);
}

Status read_json_body(std::string_view text, rapidjson::Document& doc) {
  if (auto p = read_json(text, doc)) return p->error();
  return Status::Ok();
}

// ---- values

std::string_view json_kind(const rapidjson::Value& v) noexcept {
  if (v.IsNull()) return "null";
  if (v.IsBool()) return "boolean";
  if (v.IsNumber()) return "number";
  if (v.IsString()) return "string";
  if (v.IsArray()) return "array";
  return "object";
}

std::optional<int64_t> read_duration_ms(const rapidjson::Value& v, const std::string& path, Diagnostics& diag) {
  if (v.IsInt64()) {
    if (v.GetInt64() < 0) {
      diag.error(path, "duration must not be negative");
      return std::nullopt;
    }
    return v.GetInt64();
  }
  if (!v.IsString()) {
    diag.error(path, "expected a duration: milliseconds as an integer, or a string like \"10s\"");
    return std::nullopt;
  }
  const std::string_view s(v.GetString(), v.GetStringLength());
  const DurationParse d = parse_duration(s);
  if (d.outcome == DurationParse::Outcome::too_large) {
    diag.error(path, "duration '" + std::string(s) + "' is too large");
    return std::nullopt;
  }
  if (!d.ok()) {
    diag.error(path, "bad duration '" + std::string(s) + "': expected a number followed by ms, s, m, min, h or d");
    return std::nullopt;
  }
  return d.ms;
}

std::optional<uint64_t> read_size_bytes(const rapidjson::Value& v, const std::string& path, Diagnostics& diag) {
  if (v.IsUint64()) return v.GetUint64();
  if (v.IsInt64()) {
    diag.error(path, "size must not be negative");
    return std::nullopt;
  }
  if (!v.IsString()) {
    diag.error(path, "expected a size: bytes as an integer, or a string like \"64MiB\"");
    return std::nullopt;
  }
  const std::string_view s(v.GetString(), v.GetStringLength());
  const std::string shown(s.substr(0, 64));
  const SizeParse p = parse_size(s);
  switch (p.outcome) {
    case SizeParse::Outcome::ok:
      return p.bytes;
    case SizeParse::Outcome::ambiguous:
      diag.error(path, "size '" + shown + "' is ambiguous; write binary units (KiB, MiB, GiB, TiB) or a number of bytes");
      return std::nullopt;
    case SizeParse::Outcome::too_large:
      diag.error(path, "size '" + shown + "' is too large");
      return std::nullopt;
    case SizeParse::Outcome::malformed:
      break;
  }
  diag.error(path, "bad size '" + shown + "': expected a number of bytes, or one followed by B, KiB, MiB, GiB or TiB");
  return std::nullopt;
}

// ---- objects

void check_members(const rapidjson::Value& obj, const std::string& path, const std::vector<std::string_view>& known,
                   Diagnostics& diag, MemberWords words) {
  const std::string member(words.member);
  std::vector<std::string_view> seen;
  for (auto it = obj.MemberBegin(); it != obj.MemberEnd(); ++it) {
    const std::string_view k = name_of(*it);
    const std::string key = shown(k);
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      std::string msg = "unknown " + member + " '" + key + "'; known " + member + "s:";
      for (std::string_view kk : known) {
        msg += ' ';
        msg += kk;
      }
      diag.error(path + "." + key, msg);
    } else if (std::find(seen.begin(), seen.end(), k) != seen.end()) {
      diag.error(path + "." + key, "duplicate " + member + " '" + key + "'");
    } else {
      seen.push_back(k);
    }
  }
}

JsonObjectReader::JsonObjectReader(const rapidjson::Value* object, std::string path, Diagnostics& diag,
                                   MemberWords words)
    : object_(object), path_(std::move(path)), diag_(diag), words_(words) {
  if (object_ != nullptr && !object_->IsObject()) {
    fail(path_, std::string(words_.whole) + " must be an object, not " + std::string(json_kind(*object_)));
    object_ = nullptr;
  }
}

bool JsonObjectReader::has(std::string_view key) const {
  if (object_ == nullptr) return false;
  for (auto it = object_->MemberBegin(); it != object_->MemberEnd(); ++it)
    if (std::string_view(it->name.GetString(), it->name.GetStringLength()) == key) return true;
  return false;
}

const rapidjson::Value* JsonObjectReader::find(std::string_view key) {
  known_.emplace(key);
  if (object_ == nullptr) return nullptr;
  for (auto it = object_->MemberBegin(); it != object_->MemberEnd(); ++it)
    if (std::string_view(it->name.GetString(), it->name.GetStringLength()) == key) return &it->value;
  return nullptr;
}

const rapidjson::Value* JsonObjectReader::value(std::string_view key, Need need) {
  const auto* v = find(key);
  if (v == nullptr && need == Need::required) {
    fail(path_of(key), "missing required " + std::string(words_.member) + " '" + std::string(key) + "'");
  }
  return v;
}

std::optional<std::string> JsonObjectReader::string(std::string_view key, Need need) {
  const auto* v = value(key, need);
  if (v == nullptr) return std::nullopt;
  if (!v->IsString()) {
    fail(path_of(key), "expected a string, got " + std::string(json_kind(*v)));
    return std::nullopt;
  }
  return std::string(v->GetString(), v->GetStringLength());
}

std::optional<int64_t> JsonObjectReader::int64(std::string_view key, Need need, int64_t min, int64_t max) {
  const auto* v = value(key, need);
  if (v == nullptr) return std::nullopt;
  if (!v->IsInt64()) {
    fail(path_of(key), "expected an integer, got " + std::string(json_kind(*v)));
    return std::nullopt;
  }
  int64_t x = v->GetInt64();
  if (x < min || x > max) {
    fail(path_of(key), "value " + std::to_string(x) + " out of range [" + std::to_string(min) + ", " +
                           std::to_string(max) + "]");
    return std::nullopt;
  }
  return x;
}

std::optional<double> JsonObjectReader::number(std::string_view key, Need need) {
  const auto* v = value(key, need);
  if (v == nullptr) return std::nullopt;
  if (!v->IsNumber()) {
    fail(path_of(key), "expected a number, got " + std::string(json_kind(*v)));
    return std::nullopt;
  }
  return v->GetDouble();
}

std::optional<bool> JsonObjectReader::boolean(std::string_view key, Need need) {
  const auto* v = value(key, need);
  if (v == nullptr) return std::nullopt;
  if (!v->IsBool()) {
    fail(path_of(key), "expected true or false, got " + std::string(json_kind(*v)));
    return std::nullopt;
  }
  return v->GetBool();
}

std::optional<std::vector<std::string>> JsonObjectReader::strings(std::string_view key, Need need) {
  const auto* v = value(key, need);
  if (v == nullptr) return std::nullopt;
  if (!v->IsArray()) {
    fail(path_of(key), "expected an array of strings, got " + std::string(json_kind(*v)));
    return std::nullopt;
  }
  std::vector<std::string> out;
  bool good = true;
  for (rapidjson::SizeType i = 0; i < v->Size(); ++i) {
    const auto& e = (*v)[i];
    if (!e.IsString()) {
      fail(path_of(key) + "[" + std::to_string(i) + "]", "expected a string, got " + std::string(json_kind(e)));
      good = false;
      continue;
    }
    out.emplace_back(e.GetString(), e.GetStringLength());
  }
  if (!good) return std::nullopt;
  return out;
}

std::optional<std::string> JsonObjectReader::choice(std::string_view key, Need need,
                                                    std::initializer_list<std::string_view> choices) {
  auto s = string(key, need);
  if (!s) return s;
  for (auto c : choices)
    if (c == *s) return s;
  std::string msg = "unknown value '" + *s + "'; expected one of:";
  for (auto c : choices) msg += " " + std::string(c);
  fail(path_of(key), msg);
  return std::nullopt;
}

std::optional<int64_t> JsonObjectReader::duration_ms(std::string_view key, Need need) {
  const auto* v = value(key, need);
  if (v == nullptr) return std::nullopt;
  auto ms = read_duration_ms(*v, path_of(key), diag_);
  if (!ms) ok_ = false;
  return ms;
}

std::optional<uint64_t> JsonObjectReader::size_bytes(std::string_view key, Need need) {
  const auto* v = value(key, need);
  if (v == nullptr) return std::nullopt;
  auto bytes = read_size_bytes(*v, path_of(key), diag_);
  if (!bytes) ok_ = false;
  return bytes;
}

void JsonObjectReader::finish() {
  if (object_ == nullptr) return;
  const std::string member(words_.member);
  for (auto it = object_->MemberBegin(); it != object_->MemberEnd(); ++it) {
    std::string_view k(it->name.GetString(), it->name.GetStringLength());
    if (known_.find(k) == known_.end()) {
      std::string msg = "unknown " + member + " '" + std::string(k) + "'";
      if (!known_.empty()) {
        msg += "; known " + member + "s:";
        for (const auto& kk : known_) msg += " " + kk;
      }
      fail(path_of(k), msg);
    }
  }
}

}  // namespace entente::base
