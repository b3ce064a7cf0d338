#include "engine/expr.h"

#include <cassert>

#include "engine/detail/expr_node.h"

namespace entente::engine {

Result<Expr> Expr::compile(std::string_view text, const Schema& input) {
  ENTENTE_ASSIGN_OR_RETURN(detail::NodePtr root, detail::parse_expression(text, input));
  Expr e;
  e.text_ = std::string(text);
  e.root_ = std::move(root);
  return e;
}

Type Expr::type() const noexcept { return root_->type; }

ColumnPtr Expr::eval(const Batch& b) const { return detail::eval_node(*root_, b); }

void Expr::select(const Batch& b, std::vector<uint32_t>& out, const std::vector<uint32_t>* candidates) const {
  // A non-bool expression selecting rows is a programming error in the
  // caller, which type-checks predicates when it compiles them.
  assert(root_->type == Type::Bool);
  if (root_->type != Type::Bool) return;
  if (candidates == &out) {
    // Appending to the vector being read would invalidate it: read a copy.
    const std::vector<uint32_t> copy = *candidates;
    detail::select_node(*root_, b, &copy, out);
    return;
  }
  detail::select_node(*root_, b, candidates, out);
}

int Expr::field_index() const noexcept { return root_->op == detail::Op::Field ? root_->field : -1; }

std::vector<size_t> Expr::fields() const {
  std::vector<char> used;
  std::vector<const detail::ExprNode*> pending = {root_.get()};
  while (!pending.empty()) {
    const detail::ExprNode* n = pending.back();
    pending.pop_back();
    if (n->op == detail::Op::Field && n->field >= 0) {
      if (used.size() <= static_cast<size_t>(n->field)) used.resize(static_cast<size_t>(n->field) + 1);
      used[static_cast<size_t>(n->field)] = 1;
    }
    for (const auto& k : n->kids) pending.push_back(k.get());
  }
  std::vector<size_t> out;
  for (size_t i = 0; i < used.size(); ++i)
    if (used[i]) out.push_back(i);
  return out;
}

// The tree is immutable, so copies share it.
Expr::Expr(const Expr&) = default;
Expr& Expr::operator=(const Expr&) = default;
Expr::Expr(Expr&&) noexcept = default;
Expr& Expr::operator=(Expr&&) noexcept = default;
Expr::~Expr() = default;

}  // namespace entente::engine
