#include "broker/detail/json_in.h"

#include <algorithm>
#include <vector>

#include "rapidjson/error/en.h"

namespace entente::broker::detail {

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

}  // namespace entente::broker::detail
