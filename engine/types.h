// Schemas and typed values. Fields are never null: every row has a value for
// every field (see docs/engine.md, "No nulls").
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "base/result.h"

namespace entente::engine {

// Column types. Timestamps are int64 milliseconds since the Unix epoch.
enum class Type : uint8_t { Int64 = 0, Double = 1, Bool = 2, String = 3, Timestamp = 4 };

inline constexpr int kTypeCount = 5;

std::string_view type_name(Type t) noexcept;  // "int64", "double", ...
std::optional<Type> parse_type(std::string_view name) noexcept;
// Int64 and Timestamp share the int64 representation.
inline bool is_int_repr(Type t) noexcept { return t == Type::Int64 || t == Type::Timestamp; }
inline bool is_numeric(Type t) noexcept { return t == Type::Int64 || t == Type::Double; }

// Event time and watermarks: int64 milliseconds. A watermark W on an arc
// promises that every later row on that arc has event_time >= W; rows below
// it are late.
using EventTime = int64_t;
inline constexpr EventTime kMinTime = std::numeric_limits<int64_t>::min();
// The watermark that ends a stream: everything still open may close.
inline constexpr EventTime kMaxWatermark = std::numeric_limits<int64_t>::max();

// Per-stream sequence number, given by the stream's owner (or, for the
// outputs of a box, by the box, one counter per output port).
using Seq = uint64_t;

struct Field {
  std::string name;
  Type type = Type::Int64;
  bool operator==(const Field&) const = default;
};

// An ordered list of uniquely named, typed fields. Immutable once shared.
class Schema {
 public:
  Schema() = default;
  // REQUIRES: names unique and non-empty (use Schema::make to validate).
  explicit Schema(std::vector<Field> fields);
  // Validates names (non-empty, unique, [A-Za-z_][A-Za-z0-9_]*).
  static Result<Schema> make(std::vector<Field> fields);

  size_t size() const noexcept { return fields_.size(); }
  const Field& field(size_t i) const { return fields_[i]; }
  const std::vector<Field>& fields() const noexcept { return fields_; }
  std::optional<size_t> index_of(std::string_view name) const noexcept;
  bool operator==(const Schema& o) const { return fields_ == o.fields_; }
  // "name:type, name:type"
  std::string to_string() const;

 private:
  std::vector<Field> fields_;
};

using SchemaPtr = std::shared_ptr<const Schema>;

inline SchemaPtr make_schema(std::vector<Field> fields) {
  return std::make_shared<const Schema>(std::move(fields));
}

// One typed value: literals, group keys, JSON conversion. Int64 and Timestamp
// both hold int64_t; the Type that goes with a Value says which.
using Value = std::variant<int64_t, double, bool, std::string>;

}  // namespace entente::engine
