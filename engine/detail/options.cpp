#include "engine/detail/options.h"

#include <cstdlib>

#include "base/units.h"
#include "engine/detail/json_kind.h"

namespace entente::engine::detail {

OptionReader::OptionReader(const rapidjson::Value* options, std::string path, Diagnostics& diag)
    : options_(options), path_(std::move(path)), diag_(diag) {
  if (options_ != nullptr && !options_->IsObject()) {
    fail(path_, "options must be an object, not " + std::string(json_kind(*options_)));
    options_ = nullptr;
  }
}

bool OptionReader::has(std::string_view key) const {
  if (options_ == nullptr) return false;
  for (auto it = options_->MemberBegin(); it != options_->MemberEnd(); ++it)
    if (std::string_view(it->name.GetString(), it->name.GetStringLength()) == key) return true;
  return false;
}

const rapidjson::Value* OptionReader::find(std::string_view key) {
  known_.emplace(key);
  if (options_ == nullptr) return nullptr;
  for (auto it = options_->MemberBegin(); it != options_->MemberEnd(); ++it)
    if (std::string_view(it->name.GetString(), it->name.GetStringLength()) == key) return &it->value;
  return nullptr;
}

const rapidjson::Value* OptionReader::value(std::string_view key, Need need) {
  const auto* v = find(key);
  if (v == nullptr && need == Need::required) fail(path_of(key), "missing required option '" + std::string(key) + "'");
  return v;
}

std::optional<std::string> OptionReader::string(std::string_view key, Need need) {
  const auto* v = value(key, need);
  if (v == nullptr) return std::nullopt;
  if (!v->IsString()) {
    fail(path_of(key), "expected a string, got " + std::string(json_kind(*v)));
    return std::nullopt;
  }
  return std::string(v->GetString(), v->GetStringLength());
}

std::optional<int64_t> OptionReader::int64(std::string_view key, Need need, int64_t min, int64_t max) {
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

std::optional<double> OptionReader::number(std::string_view key, Need need) {
  const auto* v = value(key, need);
  if (v == nullptr) return std::nullopt;
  if (!v->IsNumber()) {
    fail(path_of(key), "expected a number, got " + std::string(json_kind(*v)));
    return std::nullopt;
  }
  return v->GetDouble();
}

std::optional<bool> OptionReader::boolean(std::string_view key, Need need) {
  const auto* v = value(key, need);
  if (v == nullptr) return std::nullopt;
  if (!v->IsBool()) {
    fail(path_of(key), "expected true or false, got " + std::string(json_kind(*v)));
    return std::nullopt;
  }
  return v->GetBool();
}

std::optional<std::vector<std::string>> OptionReader::strings(std::string_view key, Need need) {
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

std::optional<std::string> OptionReader::choice(std::string_view key, Need need,
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

void OptionReader::finish() {
  if (options_ == nullptr) return;
  for (auto it = options_->MemberBegin(); it != options_->MemberEnd(); ++it) {
    std::string_view k(it->name.GetString(), it->name.GetStringLength());
    if (known_.find(k) == known_.end()) {
      std::string msg = "unknown option '" + std::string(k) + "'";
      if (!known_.empty()) {
        msg += "; known options:";
        for (const auto& kk : known_) msg += " " + kk;
      }
      fail(path_of(k), msg);
    }
  }
}

std::optional<int64_t> parse_duration_ms(const rapidjson::Value& v, const std::string& path, Diagnostics& diag) {
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
  const base::DurationParse d = base::parse_duration(s);
  if (d.outcome == base::DurationParse::Outcome::too_large) {
    diag.error(path, "duration '" + std::string(s) + "' is too large");
    return std::nullopt;
  }
  if (!d.ok()) {
    diag.error(path, "bad duration '" + std::string(s) + "': expected a number followed by ms, s, m, min, h or d");
    return std::nullopt;
  }
  return d.ms;
}

}  // namespace entente::engine::detail
