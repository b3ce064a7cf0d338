// The configuration of an Aggregate box: read from its options and checked
// against its input schema in aggregate_options.cpp, run by the box in
// aggregate.cpp (docs/boxes-windowed.md#aggregate). Private to engine/boxes.
#pragma once
#if !defined(ENTENTE_IN_ENGINE)
#error "engine/boxes/ is private to engine/ (docs/architecture.md)"
#endif

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/boxes/boxes.h"
#include "engine/expr.h"

namespace entente::engine::boxes::detail::aggregate {

inline constexpr size_t kMaxAggregates = 64;
inline constexpr size_t kMaxGroupBy = 16;
// `top.k` at most this (documented): k beyond the groups of a window keeps
// them all anyway.
inline constexpr int64_t kMaxTopK = int64_t{1} << 20;

enum class Fn : uint8_t { count, sum, min, max, avg, first, last, max_by, min_by };

struct AggSpec {
  Fn fn = Fn::count;
  std::optional<Expr> expr;  // the aggregated value; absent for count
  int field = -1;            // the input field, when expr is a bare field
  Type in_type = Type::Int64;
  Type out_type = Type::Int64;
  std::string name;
  uint32_t cell = 0;          // first cell in a slot
  uint32_t str = UINT32_MAX;  // string index in a slot (string min/max/first/last/*_by)
  int by_field = -1;          // max_by/min_by: the input field ranked
  Type by_type = Type::Int64;
  bool is_string() const { return in_type == Type::String && fn != Fn::count; }
  bool is_by() const { return fn == Fn::max_by || fn == Fn::min_by; }
};

struct WindowSpec {
  bool by_count = false;
  bool sliding = false;
  int64_t size = 0;   // ms or tuples
  int64_t slide = 0;  // ms or tuples (tumbling: size)
  int64_t pane = 0;   // gcd(size, slide)
};

// `top`: per window, only the groups ranked among the best `k` by
// aggregate `agg` (SQL RANK() <= k: ties at the k-th value all stay).
enum class TopOrder : uint8_t { desc, asc };
struct TopSpec {
  int agg = -1;  // index into Config::aggs; -1: no ranking, every group
  int64_t k = 1;
  TopOrder order = TopOrder::desc;
};

struct Config {
  std::vector<size_t> key_cols;
  WindowSpec window;
  std::vector<AggSpec> aggs;
  int64_t slack = 0;
  int64_t timeout = 0;  // 0: none
  bool emit_empty = false;
  TopSpec top;
  uint32_t cells = 1;  // per slot; cell 0 counts the slot's rows
  uint32_t strings = 0;
};

// The box running `cfg` over rows of `input`, producing rows of `output`
// (aggregate.cpp). REQUIRES: cfg as make_aggregate (aggregate_options.cpp)
// builds it, cell layout included.
std::unique_ptr<Box> make_aggregate_box(SchemaPtr input, SchemaPtr output, Config cfg);

}  // namespace entente::engine::boxes::detail::aggregate
