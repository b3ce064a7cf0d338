// Hand-written C++ references of the NEXMark queries: plain loops over the
// pre-generated events with plain hash maps, no engine. Each produces the
// rows the query network must produce, in the same order (docs/nexmark.md
// gives the semantics and the order of each query).
#pragma once

#include <string_view>
#include <vector>

#include "bench/nexmark/generator.h"

namespace entente::nexmark {

// Output of a reference, column by column. Strings are views into the
// events they were taken from (no query computes new strings), so the
// Events must outlive the output.
struct RefColumn {
  engine::Type type = engine::Type::Int64;
  std::vector<int64_t> ints;  // Int64, Timestamp
  std::vector<double> doubles;
  std::vector<std::string_view> strs;
  size_t size() const noexcept;
};

struct RefOutput {
  SchemaPtr schema;
  std::vector<RefColumn> columns;
  std::vector<EventTime> event_time;
  size_t rows() const noexcept { return event_time.size(); }
};

using ReferenceFn = RefOutput (*)(const Events&);

// The reference of query `name` ("q0".."q8", no q6), or nullptr.
ReferenceFn find_reference(std::string_view name) noexcept;

// The queries this benchmark implements, in order.
const std::vector<std::string_view>& query_names();

}  // namespace entente::nexmark
