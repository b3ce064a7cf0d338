// The expression language: parsed once, type-checked against an input
// schema, evaluated a column at a time over a Batch.
//
// Grammar (docs/expressions.md): literals (123, 1.5, 'text', TRUE, FALSE),
// field names, `_time` (the row's event time, a timestamp), arithmetic
// + - * / %, comparisons = != <> < <= > >=, AND OR NOT, x IN (a, b, ...),
// x BETWEEN a AND b, CASE WHEN c THEN v [WHEN ...] [ELSE v] END, and the
// functions abs, lower, upper, length, hash, concat, coalesce, min, max,
// floor, ceil, round, sqrt, to_double, to_int, substr, starts_with,
// ends_with, contains.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/batch.h"

namespace entente::engine {

namespace detail {
struct ExprNode;
}

// A compiled, type-checked expression. Immutable and thread-compatible:
// several threads may evaluate the same Expr at once.
class Expr {
 public:
  // Parses and type-checks `text` against `input`. Errors name the
  // position as line:column, 1-based: "unknown field 'prise' at 1:1",
  // "cannot compare string with int64 at 1:9".
  static Result<Expr> compile(std::string_view text, const Schema& input);

  Type type() const noexcept;
  const std::string& text() const noexcept { return text_; }

  // Evaluates over every row of `b` into a fresh column of type() with
  // b.rows() rows. Never fails: division by zero yields 0 (int) or
  // IEEE results (double), and is documented.
  ColumnPtr eval(const Batch& b) const;
  // For a Bool expression: appends to `out` the indexes of the rows of `b`
  // for which it is true, in order. If `candidates` is non-null, only those
  // rows (sorted) are tested.
  void select(const Batch& b, std::vector<uint32_t>& out,
              const std::vector<uint32_t>* candidates = nullptr) const;
  // If the expression is a bare field reference, its index; otherwise -1.
  // Lets boxes forward a column without evaluating anything.
  int field_index() const noexcept;
  // The indexes of the input fields the expression reads, ascending, each
  // once (`_time` is not a field). Lets a box gather only those columns.
  std::vector<size_t> fields() const;

  Expr(const Expr&);
  Expr& operator=(const Expr&);
  Expr(Expr&&) noexcept;
  Expr& operator=(Expr&&) noexcept;
  ~Expr();

 private:
  Expr() = default;
  std::string text_;
  std::shared_ptr<const detail::ExprNode> root_;
};

}  // namespace entente::engine
