#include "engine/types.h"

#include <unordered_set>

namespace entente::engine {

std::string_view type_name(Type t) noexcept {
  switch (t) {
    case Type::Int64: return "int64";
    case Type::Double: return "double";
    case Type::Bool: return "bool";
    case Type::String: return "string";
    case Type::Timestamp: return "timestamp";
  }
  return "?";
}

std::optional<Type> parse_type(std::string_view name) noexcept {
  if (name == "int64") return Type::Int64;
  if (name == "double") return Type::Double;
  if (name == "bool") return Type::Bool;
  if (name == "string") return Type::String;
  if (name == "timestamp") return Type::Timestamp;
  return std::nullopt;
}

Schema::Schema(std::vector<Field> fields) : fields_(std::move(fields)) {}

namespace {
bool valid_field_name(std::string_view n) {
  if (n.empty() || n.size() > 128) return false;
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!alpha(n[0])) return false;
  for (char c : n)
    if (!alpha(c) && !(c >= '0' && c <= '9')) return false;
  return true;
}
}  // namespace

Result<Schema> Schema::make(std::vector<Field> fields) {
  if (fields.size() > 1024) return make_error(Errc::limit_exceeded, "a schema has at most 1024 fields");
  std::unordered_set<std::string_view> seen;
  for (const auto& f : fields) {
    if (!valid_field_name(f.name))
      return make_error(Errc::invalid_argument,
                        "bad field name '" + f.name + "': expected [A-Za-z_][A-Za-z0-9_]*, at most 128 chars");
    if (!seen.insert(f.name).second)
      return make_error(Errc::invalid_argument, "duplicate field name '" + f.name + "'");
  }
  return Schema(std::move(fields));
}

std::optional<size_t> Schema::index_of(std::string_view name) const noexcept {
  for (size_t i = 0; i < fields_.size(); ++i)
    if (fields_[i].name == name) return i;
  return std::nullopt;
}

std::string Schema::to_string() const {
  std::string out;
  for (const auto& f : fields_) {
    if (!out.empty()) out += ", ";
    out += f.name;
    out += ':';
    out += type_name(f.type);
  }
  return out;
}

}  // namespace entente::engine
