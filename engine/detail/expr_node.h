// The compiled form of an expression: an immutable, typed tree. Private to
// engine/; the public face is engine/expr.h.
//
// The parser (expr_parse.cpp) builds the tree, type-checks every node as it
// is built, inserts int64 -> double widening casts where the language widens,
// and folds literal-only subtrees into constants. The evaluator
// (expr_eval.cpp) walks the tree once per batch, a column at a time.
#pragma once
#if !defined(ENTENTE_IN_ENGINE)
#error "engine/detail/ is private to engine/ (docs/architecture.md)"
#endif

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/batch.h"

namespace entente::engine::detail {

enum class Op : uint8_t {
  Const,  // value
  Field,  // field (index into the batch's columns)
  Time,   // the row's event time
  Cast,   // kids[0] (int64/timestamp) widened to double
  Neg,    // -kids[0]
  Not,    // NOT kids[0]
  Add,
  Sub,
  Mul,
  Div,
  Mod,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  And,
  Or,       // n-ary: chains are flattened so evaluation does not recurse per operator
  In,       // kids[0] IN (kids[1..]); negated for NOT IN
  Between,  // kids[0] BETWEEN kids[1] AND kids[2]; negated for NOT BETWEEN
  Case,     // kids = cond1, val1, cond2, val2, ... [, else]
  Call,     // func(kids...)
};

enum class Func : uint8_t {
  None,
  Abs,
  Lower,
  Upper,
  Length,
  Hash,
  Concat,
  Coalesce,
  Min,
  Max,
  Floor,
  Ceil,
  Round,
  Sqrt,
  ToDouble,
  ToInt,
  Substr,
  StartsWith,
  EndsWith,
  Contains,
};

struct ExprNode;
using NodePtr = std::shared_ptr<const ExprNode>;

struct ExprNode {
  Op op = Op::Const;
  Type type = Type::Int64;
  Func func = Func::None;
  bool negated = false;   // In, Between
  bool has_else = false;  // Case
  int field = -1;         // Field
  uint32_t line = 1;      // position of the token that made the node (1-based)
  uint32_t col = 1;
  uint32_t height = 1;  // longest path to a leaf; bounded so evaluation cannot overflow the stack
  Value value;          // Const; representation of `type`
  std::vector<NodePtr> kids;
  // In with a list of constants only: the members, sorted and deduplicated,
  // in the representation shared by kids[0] and the list (NaN dropped: it
  // equals nothing).
  bool in_const = false;
  std::vector<int64_t> in_ints;
  std::vector<double> in_doubles;
  std::vector<std::string> in_strings;  // sorted bytewise
  std::vector<uint8_t> in_bools;        // in_bools[v] != 0 when v is a member

  bool is_const() const noexcept { return op == Op::Const; }
};

// Limits on what compile() accepts; each gives a clear error instead of a
// crash or a stack overflow.
inline constexpr size_t kMaxExprBytes = 64 * 1024;
inline constexpr uint32_t kMaxExprDepth = 256;
inline constexpr size_t kMaxListItems = 10000;

// Parses and type-checks `text` against `input`.
Result<NodePtr> parse_expression(std::string_view text, const Schema& input);

// Evaluates `n` over every row of `b` into a column of n.type with b.rows()
// rows. A field reference returns the batch's own column (shared, not
// copied); a constant is broadcast.
ColumnPtr eval_node(const ExprNode& n, const Batch& b);

// For a Bool node: appends to `out` the rows (of `candidates` when given,
// else of all rows) for which `n` is true, in order.
void select_node(const ExprNode& n, const Batch& b, const std::vector<uint32_t>* candidates,
                 std::vector<uint32_t>& out);

// The value of a node whose kids are all constants, computed by the
// evaluator itself so folding and evaluation can never disagree.
Value fold_constant(const ExprNode& n);

}  // namespace entente::engine::detail
