// Lexer, Pratt parser and type checker of the expression language.
//
// One pass: every node is type-checked the moment it is built, so an error
// names the operator or token that caused it, and literal-only subtrees are
// folded into constants right away. Recursion is bounded by kMaxExprDepth
// (parser nesting) and kMaxTreeHeight (tree height), so no input can
// overflow the stack here or in the evaluator.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>

#include "engine/detail/expr_node.h"

namespace entente::engine::detail {

namespace {

// The evaluator recurses once per tree level; chains of binary operators
// (a + b + c ...) grow the tree without nesting, so they get their own, more
// generous bound.
constexpr uint32_t kMaxTreeHeight = 1024;
constexpr size_t kMaxTokenEcho = 32;  // longest token text quoted in an error

enum class Tok : uint8_t {
  End,
  Error,
  Int,
  Double,
  String,
  Ident,
  QIdent,
  LParen,
  RParen,
  Comma,
  Plus,
  Minus,
  Star,
  Slash,
  Percent,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
};

struct Token {
  Tok kind = Tok::End;
  uint32_t begin = 0;  // byte offsets into the text
  uint32_t end = 0;
  uint32_t line = 1;
  uint32_t col = 1;
  uint64_t ival = 0;  // Int: magnitude (saturated at 2^63 + 1 when larger)
  double dval = 0;    // Double
  std::string sval;   // String, QIdent: decoded text; Error: message
};

struct LexState {
  uint32_t pos = 0;
  uint32_t line = 1;
  uint32_t line_start = 0;
};

constexpr uint64_t kTwo63 = uint64_t{1} << 63;

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alnum(char c) { return is_alpha(c) || is_digit(c); }

char ascii_upper(char c) { return (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (ascii_upper(a[i]) != ascii_upper(b[i])) return false;
  return true;
}

// Concatenation by appending: `"literal" + std::string&&` trips GCC 12's
// -Wrestrict false positive, and CI builds with -Werror.
std::string cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p.data(), p.size());
  return out;
}

std::string pos_suffix(uint32_t line, uint32_t col) {
  return cat({" at ", std::to_string(line), ":", std::to_string(col)});
}

// Quotes a piece of the input for an error message, bounded in length and
// with control bytes escaped.
std::string echo(std::string_view s) {
  std::string out;
  const size_t n = std::min(s.size(), kMaxTokenEcho);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > n) out += "...";
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view text) : text_(text) {}

  Token lex(LexState& s) const {
    skip_space(s);
    Token t;
    t.begin = s.pos;
    t.line = s.line;
    t.col = s.pos - s.line_start + 1;
    if (s.pos >= text_.size()) {
      t.kind = Tok::End;
      t.end = s.pos;
      return t;
    }
    const char c = text_[s.pos];
    if (is_digit(c) || (c == '.' && s.pos + 1 < text_.size() && is_digit(text_[s.pos + 1]))) {
      lex_number(s, t);
    } else if (c == '\'') {
      lex_quoted(s, t, '\'', Tok::String, "unterminated string");
    } else if (c == '"') {
      lex_quoted(s, t, '"', Tok::QIdent, "unterminated quoted identifier");
      if (t.kind == Tok::QIdent && t.sval.empty()) fail(t, "empty quoted identifier");
    } else if (is_alpha(c)) {
      while (s.pos < text_.size() && is_alnum(text_[s.pos])) ++s.pos;
      t.kind = Tok::Ident;
    } else {
      lex_punct(s, t);
    }
    t.end = s.pos;
    return t;
  }

  std::string_view slice(const Token& t) const { return text_.substr(t.begin, t.end - t.begin); }
  std::string_view rest(const Token& t) const { return text_.substr(t.begin); }

 private:
  void skip_space(LexState& s) const {
    while (s.pos < text_.size()) {
      const char c = text_[s.pos];
      if (c == '\n') {
        ++s.pos;
        ++s.line;
        s.line_start = s.pos;
      } else if (c == ' ' || c == '\t' || c == '\r') {
        ++s.pos;
      } else {
        break;
      }
    }
  }

  static void fail(Token& t, std::string msg) {
    t.kind = Tok::Error;
    t.sval = std::move(msg);
    t.sval += pos_suffix(t.line, t.col);
  }

  void lex_number(LexState& s, Token& t) const {
    const uint32_t start = s.pos;
    bool is_double = false;
    while (s.pos < text_.size() && is_digit(text_[s.pos])) ++s.pos;
    if (s.pos < text_.size() && text_[s.pos] == '.') {
      is_double = true;
      ++s.pos;
      while (s.pos < text_.size() && is_digit(text_[s.pos])) ++s.pos;
    }
    if (s.pos < text_.size() && (text_[s.pos] == 'e' || text_[s.pos] == 'E')) {
      is_double = true;
      ++s.pos;
      if (s.pos < text_.size() && (text_[s.pos] == '+' || text_[s.pos] == '-')) ++s.pos;
      const uint32_t digits = s.pos;
      while (s.pos < text_.size() && is_digit(text_[s.pos])) ++s.pos;
      if (s.pos == digits) {
        consume_word(s);
        return fail(t, cat({"bad number '", echo(text_.substr(start, s.pos - start)), "'"}));
      }
    }
    if (s.pos < text_.size() && (is_alpha(text_[s.pos]) || text_[s.pos] == '.')) {
      consume_word(s);
      return fail(t, cat({"bad number '", echo(text_.substr(start, s.pos - start)), "'"}));
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + s.pos;
    if (is_double) {
      double v = 0;
      const auto r = std::from_chars(first, last, v);
      if (r.ec != std::errc() || r.ptr != last || !std::isfinite(v))
        return fail(t, cat({"number out of range '", echo(text_.substr(start, s.pos - start)), "'"}));
      t.kind = Tok::Double;
      t.dval = v;
      return;
    }
    // Accumulate the magnitude; 2^63 is legal only after a unary minus, so
    // the parser, not the lexer, decides whether it is in range.
    uint64_t v = 0;
    for (const char* p = first; p != last; ++p) {
      const uint64_t d = static_cast<uint64_t>(*p - '0');
      if (v > (kTwo63 + 1 - d) / 10) {
        v = kTwo63 + 1;
        break;
      }
      v = v * 10 + d;
    }
    t.kind = Tok::Int;
    t.ival = v;
  }

  void consume_word(LexState& s) const {
    while (s.pos < text_.size() && (is_alnum(text_[s.pos]) || text_[s.pos] == '.')) ++s.pos;
  }

  // '...' with '' for a quote, or "..." with "" for a double quote. Newlines
  // inside are kept and counted.
  void lex_quoted(LexState& s, Token& t, char q, Tok kind, const char* unterminated) const {
    ++s.pos;
    for (;;) {
      if (s.pos >= text_.size()) return fail(t, unterminated);
      const char c = text_[s.pos];
      if (c == q) {
        if (s.pos + 1 < text_.size() && text_[s.pos + 1] == q) {
          t.sval += q;
          s.pos += 2;
          continue;
        }
        ++s.pos;
        t.kind = kind;
        return;
      }
      if (c == '\n') {
        s.line++;
        s.line_start = s.pos + 1;
      }
      t.sval += c;
      ++s.pos;
    }
  }

  void lex_punct(LexState& s, Token& t) const {
    const char c = text_[s.pos];
    const char n = s.pos + 1 < text_.size() ? text_[s.pos + 1] : '\0';
    uint32_t len = 1;
    switch (c) {
      case '(':
        t.kind = Tok::LParen;
        break;
      case ')':
        t.kind = Tok::RParen;
        break;
      case ',':
        t.kind = Tok::Comma;
        break;
      case '+':
        t.kind = Tok::Plus;
        break;
      case '-':
        t.kind = Tok::Minus;
        break;
      case '*':
        t.kind = Tok::Star;
        break;
      case '/':
        t.kind = Tok::Slash;
        break;
      case '%':
        t.kind = Tok::Percent;
        break;
      case '=':
        t.kind = Tok::Eq;
        break;
      case '!':
        if (n != '=') return fail(t, "unexpected character '!'");
        t.kind = Tok::Ne;
        len = 2;
        break;
      case '<':
        if (n == '=') {
          t.kind = Tok::Le;
          len = 2;
        } else if (n == '>') {
          t.kind = Tok::Ne;
          len = 2;
        } else {
          t.kind = Tok::Lt;
        }
        break;
      case '>':
        if (n == '=') {
          t.kind = Tok::Ge;
          len = 2;
        } else {
          t.kind = Tok::Gt;
        }
        break;
      default:
        return fail(t, cat({"unexpected character '", echo(text_.substr(s.pos, 1)), "'"}));
    }
    s.pos += len;
  }

  std::string_view text_;
};

struct FuncInfo {
  std::string_view name;
  Func func;
  int min_args;
  int max_args;  // -1: no upper bound (kMaxListItems)
};

constexpr FuncInfo kFuncs[] = {
    {"abs", Func::Abs, 1, 1},
    {"lower", Func::Lower, 1, 1},
    {"upper", Func::Upper, 1, 1},
    {"length", Func::Length, 1, 1},
    {"hash", Func::Hash, 1, -1},
    {"concat", Func::Concat, 1, -1},
    {"coalesce", Func::Coalesce, 1, -1},
    {"min", Func::Min, 2, -1},
    {"max", Func::Max, 2, -1},
    {"floor", Func::Floor, 1, 1},
    {"ceil", Func::Ceil, 1, 1},
    {"round", Func::Round, 1, 1},
    {"sqrt", Func::Sqrt, 1, 1},
    {"to_double", Func::ToDouble, 1, 1},
    {"to_int", Func::ToInt, 1, 1},
    {"substr", Func::Substr, 2, 3},
    {"starts_with", Func::StartsWith, 2, 2},
    {"ends_with", Func::EndsWith, 2, 2},
    {"contains", Func::Contains, 2, 2},
};

constexpr std::string_view kKeywords[] = {"AND",  "OR",   "NOT",  "IN",  "BETWEEN", "CASE",
                                          "WHEN", "THEN", "ELSE", "END", "TRUE",    "FALSE"};

// The type two operands are compared in, if they can be compared at all.
std::optional<Type> compare_type(Type a, Type b) {
  if (a == b) return a;
  if (is_numeric(a) && is_numeric(b)) return Type::Double;
  if (is_int_repr(a) && is_int_repr(b)) return Type::Timestamp;  // timestamp vs int64
  return std::nullopt;
}

// The type two values unify to (CASE branches, coalesce, min, max): equal
// types, or int64 and double widening to double.
std::optional<Type> unify_type(Type a, Type b) {
  if (a == b) return a;
  if (is_numeric(a) && is_numeric(b)) return Type::Double;
  return std::nullopt;
}

std::string_view op_symbol(Op op) {
  switch (op) {
    case Op::Add:
      return "+";
    case Op::Sub:
      return "-";
    case Op::Mul:
      return "*";
    case Op::Div:
      return "/";
    case Op::Mod:
      return "%";
    default:
      return "?";
  }
}

using MNode = std::shared_ptr<ExprNode>;

class Parser {
 public:
  Parser(std::string_view text, const Schema& schema) : lex_(text), schema_(schema) { advance(); }

  Result<NodePtr> parse() {
    ENTENTE_ASSIGN_OR_RETURN(MNode root, parse_expr(0));
    if (cur_.kind != Tok::End) {
      if (cur_.kind == Tok::Error) return make_error(Errc::parse_error, cur_.sval);
      return fail(Errc::parse_error, cat({"trailing input '", echo(lex_.rest(cur_)), "'"}), cur_);
    }
    return NodePtr(std::move(root));
  }

 private:
  struct Pos {
    uint32_t line;
    uint32_t col;
  };
  static Pos pos_of(const Token& t) { return {t.line, t.col}; }

  void advance() { cur_ = lex_.lex(state_); }
  Token peek2() const {
    LexState s = state_;
    return lex_.lex(s);
  }

  static Error fail(Errc code, std::string msg, Pos p) {
    msg += pos_suffix(p.line, p.col);
    return make_error(code, std::move(msg));
  }
  static Error fail(Errc code, std::string msg, const Token& t) {
    return fail(code, std::move(msg), pos_of(t));
  }

  // The error for a token the grammar does not allow here.
  Error unexpected(const Token& t) const {
    if (t.kind == Tok::Error) return make_error(Errc::parse_error, t.sval);
    if (t.kind == Tok::End) return fail(Errc::parse_error, "unexpected end of input", t);
    return fail(Errc::parse_error, cat({"unexpected '", echo(lex_.slice(t)), "'"}), t);
  }
  Error expected(std::string_view what, const Token& t) const {
    if (t.kind == Tok::Error) return make_error(Errc::parse_error, t.sval);
    return fail(Errc::parse_error, cat({"expected ", what}), t);
  }

  bool is_keyword(const Token& t, std::string_view kw) const {
    return t.kind == Tok::Ident && iequals(lex_.slice(t), kw);
  }
  bool is_any_keyword(const Token& t) const {
    if (t.kind != Tok::Ident) return false;
    for (auto kw : kKeywords)
      if (iequals(lex_.slice(t), kw)) return true;
    return false;
  }

  static MNode make(Op op, Type type, Pos p) {
    auto n = std::make_shared<ExprNode>();
    n->op = op;
    n->type = type;
    n->line = p.line;
    n->col = p.col;
    return n;
  }
  static MNode make_const(Value v, Type type, Pos p) {
    MNode n = make(Op::Const, type, p);
    n->value = std::move(v);
    return n;
  }

  // Widens an int64 node to double. Only int64 widens; timestamps never
  // silently become numbers.
  static NodePtr widen(NodePtr n, Type to) {
    if (n->type == to || to != Type::Double || n->type != Type::Int64) return n;
    Pos p{n->line, n->col};
    if (n->is_const()) return make_const(static_cast<double>(std::get<int64_t>(n->value)), Type::Double, p);
    MNode c = make(Op::Cast, Type::Double, p);
    c->height = n->height + 1;
    c->kids.push_back(std::move(n));
    return c;
  }

  // Checks the height bound and folds literal-only subtrees. Every non-leaf
  // node goes through here once its kids are final.
  Result<MNode> finish(MNode n) {
    uint32_t h = 0;
    bool all_const = true;
    for (const auto& k : n->kids) {
      h = std::max(h, k->height);
      all_const = all_const && k->is_const();
    }
    n->height = h + 1;
    if (n->height > kMaxTreeHeight)
      return fail(Errc::limit_exceeded,
                  cat({"expression too deep (more than ", std::to_string(kMaxTreeHeight), " levels)"}),
                  Pos{n->line, n->col});
    if (all_const && !n->kids.empty()) {
      Value v = fold_constant(*n);
      return make_const(std::move(v), n->type, Pos{n->line, n->col});
    }
    return n;
  }

  // Tracks parser recursion so that deeply nested input fails cleanly.
  struct DepthGuard {
    explicit DepthGuard(uint32_t& d) : d_(d) { ++d_; }
    ~DepthGuard() { --d_; }
    uint32_t& d_;
  };

  // Binding powers: higher binds tighter.
  static constexpr int kOrBp = 1;
  static constexpr int kAndBp = 2;
  static constexpr int kNotBp = 3;  // prefix NOT: its operand stops at AND/OR
  static constexpr int kCmpBp = 4;
  static constexpr int kAddBp = 5;
  static constexpr int kMulBp = 6;  // prefix '-': its operand is a primary

  Result<MNode> parse_expr(int min_bp) {
    DepthGuard guard(depth_);
    if (depth_ > kMaxExprDepth)
      return fail(
          Errc::limit_exceeded,
          cat({"expression nested too deeply (more than ", std::to_string(kMaxExprDepth), " levels)"}), cur_);
    ENTENTE_ASSIGN_OR_RETURN(MNode lhs, parse_prefix());
    for (;;) {
      const Token t = cur_;
      int bp = 0;
      Op op = Op::Const;
      switch (t.kind) {
        case Tok::Plus:
          bp = kAddBp;
          op = Op::Add;
          break;
        case Tok::Minus:
          bp = kAddBp;
          op = Op::Sub;
          break;
        case Tok::Star:
          bp = kMulBp;
          op = Op::Mul;
          break;
        case Tok::Slash:
          bp = kMulBp;
          op = Op::Div;
          break;
        case Tok::Percent:
          bp = kMulBp;
          op = Op::Mod;
          break;
        case Tok::Eq:
          bp = kCmpBp;
          op = Op::Eq;
          break;
        case Tok::Ne:
          bp = kCmpBp;
          op = Op::Ne;
          break;
        case Tok::Lt:
          bp = kCmpBp;
          op = Op::Lt;
          break;
        case Tok::Le:
          bp = kCmpBp;
          op = Op::Le;
          break;
        case Tok::Gt:
          bp = kCmpBp;
          op = Op::Gt;
          break;
        case Tok::Ge:
          bp = kCmpBp;
          op = Op::Ge;
          break;
        case Tok::Ident:
          if (is_keyword(t, "AND")) {
            bp = kAndBp;
            op = Op::And;
          } else if (is_keyword(t, "OR")) {
            bp = kOrBp;
            op = Op::Or;
          } else if (is_keyword(t, "IN")) {
            bp = kCmpBp;
            op = Op::In;
          } else if (is_keyword(t, "BETWEEN")) {
            bp = kCmpBp;
            op = Op::Between;
          } else if (is_keyword(t, "NOT")) {
            const Token n = peek2();
            if (is_keyword(n, "IN")) {
              bp = kCmpBp;
              op = Op::In;
            } else if (is_keyword(n, "BETWEEN")) {
              bp = kCmpBp;
              op = Op::Between;
            }
          }
          break;
        default:
          break;
      }
      if (bp == 0 || bp <= min_bp) break;
      advance();
      if (op == Op::In || op == Op::Between) {
        bool negated = false;
        if (is_keyword(t, "NOT")) {
          negated = true;
          advance();  // the IN / BETWEEN keyword
        }
        if (op == Op::In) {
          ENTENTE_ASSIGN_OR_RETURN(lhs, parse_in(std::move(lhs), negated, pos_of(t)));
        } else {
          ENTENTE_ASSIGN_OR_RETURN(lhs, parse_between(std::move(lhs), negated, pos_of(t)));
        }
        continue;
      }
      ENTENTE_ASSIGN_OR_RETURN(MNode rhs, parse_expr(bp));
      ENTENTE_ASSIGN_OR_RETURN(lhs, make_binary(op, std::move(lhs), std::move(rhs), pos_of(t)));
    }
    return lhs;
  }

  Result<MNode> parse_prefix() {
    const Token t = cur_;
    switch (t.kind) {
      case Tok::Int:
        if (t.ival > static_cast<uint64_t>(INT64_MAX))
          return fail(Errc::parse_error, cat({"integer literal out of range '", echo(lex_.slice(t)), "'"}),
                      t);
        advance();
        return make_const(static_cast<int64_t>(t.ival), Type::Int64, pos_of(t));
      case Tok::Double:
        advance();
        return make_const(t.dval, Type::Double, pos_of(t));
      case Tok::String:
        advance();
        return make_const(t.sval, Type::String, pos_of(t));
      case Tok::LParen: {
        advance();
        ENTENTE_ASSIGN_OR_RETURN(MNode inner, parse_expr(0));
        if (cur_.kind != Tok::RParen) return expected("')'", cur_);
        advance();
        return inner;
      }
      case Tok::Minus: {
        advance();
        // -9223372036854775808 is the one literal whose magnitude is not
        // an int64 by itself.
        if (cur_.kind == Tok::Int && cur_.ival == kTwo63) {
          advance();
          return make_const(INT64_MIN, Type::Int64, pos_of(t));
        }
        ENTENTE_ASSIGN_OR_RETURN(MNode operand, parse_expr(kMulBp));
        if (!is_numeric(operand->type))
          return fail(Errc::type_error, cat({"cannot negate ", type_name(operand->type)}), t);
        MNode n = make(Op::Neg, operand->type, pos_of(t));
        n->kids.push_back(std::move(operand));
        return finish(std::move(n));
      }
      case Tok::QIdent: {
        advance();
        return field_ref(t.sval, t);
      }
      case Tok::Ident: {
        if (is_keyword(t, "TRUE") || is_keyword(t, "FALSE")) {
          advance();
          return make_const(is_keyword(t, "TRUE"), Type::Bool, pos_of(t));
        }
        if (is_keyword(t, "NOT")) {
          advance();
          ENTENTE_ASSIGN_OR_RETURN(MNode operand, parse_expr(kNotBp));
          if (operand->type != Type::Bool)
            return fail(Errc::type_error, cat({"NOT needs a bool operand, got ", type_name(operand->type)}),
                        t);
          MNode n = make(Op::Not, Type::Bool, pos_of(t));
          n->kids.push_back(std::move(operand));
          return finish(std::move(n));
        }
        if (is_keyword(t, "CASE")) {
          advance();
          return parse_case(pos_of(t));
        }
        if (is_any_keyword(t)) return unexpected(t);
        advance();
        if (cur_.kind == Tok::LParen) return parse_call(t);
        const std::string_view name = lex_.slice(t);
        if (name == "_time") return make(Op::Time, Type::Timestamp, pos_of(t));
        return field_ref(name, t);
      }
      default:
        return unexpected(t);
    }
  }

  Result<MNode> field_ref(std::string_view name, const Token& t) {
    const auto idx = schema_.index_of(name);
    if (!idx) return fail(Errc::not_found, cat({"unknown field '", echo(name), "'"}), t);
    MNode n = make(Op::Field, schema_.field(*idx).type, pos_of(t));
    n->field = static_cast<int>(*idx);
    return n;
  }

  Result<MNode> make_binary(Op op, MNode a, MNode b, Pos p) {
    const Type ta = a->type;
    const Type tb = b->type;
    switch (op) {
      case Op::And:
      case Op::Or: {
        if (ta != Type::Bool || tb != Type::Bool) {
          const Type bad = ta != Type::Bool ? ta : tb;
          return fail(Errc::type_error,
                      cat({op == Op::And ? "AND" : "OR", " needs bool operands, got ", type_name(bad)}), p);
        }
        // Flatten chains into one n-ary node: evaluation then loops instead
        // of recursing, and select() can refine candidates kid by kid.
        MNode n = make(op, Type::Bool, p);
        for (MNode* side : {&a, &b}) {
          if ((*side)->op == op) {
            for (auto& k : (*side)->kids) n->kids.push_back(k);
          } else {
            n->kids.push_back(std::move(*side));
          }
        }
        if (n->kids.size() > kMaxListItems)
          return fail(Errc::limit_exceeded,
                      cat({"too many operands of ", op == Op::And ? "AND" : "OR", " (limit ",
                           std::to_string(kMaxListItems), ")"}),
                      p);
        return finish(std::move(n));
      }
      case Op::Eq:
      case Op::Ne:
      case Op::Lt:
      case Op::Le:
      case Op::Gt:
      case Op::Ge: {
        const auto ct = compare_type(ta, tb);
        if (!ct)
          return fail(Errc::type_error, cat({"cannot compare ", type_name(ta), " with ", type_name(tb)}), p);
        MNode n = make(op, Type::Bool, p);
        n->kids.push_back(widen(std::move(a), *ct));
        n->kids.push_back(widen(std::move(b), *ct));
        return finish(std::move(n));
      }
      default:
        break;
    }
    // Arithmetic.
    std::optional<Type> rt;
    if (is_numeric(ta) && is_numeric(tb)) {
      rt = (ta == Type::Double || tb == Type::Double) ? Type::Double : Type::Int64;
    } else if (op == Op::Add && ((ta == Type::Timestamp && tb == Type::Int64) ||
                                 (ta == Type::Int64 && tb == Type::Timestamp))) {
      rt = Type::Timestamp;
    } else if (op == Op::Sub && ta == Type::Timestamp && tb == Type::Int64) {
      rt = Type::Timestamp;
    } else if (op == Op::Sub && ta == Type::Timestamp && tb == Type::Timestamp) {
      rt = Type::Int64;
    }
    if (!rt) {
      std::string msg =
          cat({"cannot apply '", op_symbol(op), "' to ", type_name(ta), " and ", type_name(tb)});
      if (op == Op::Add && ta == Type::String && tb == Type::String) msg += " (use concat)";
      return fail(Errc::type_error, std::move(msg), p);
    }
    MNode n = make(op, *rt, p);
    n->kids.push_back(widen(std::move(a), *rt));
    n->kids.push_back(widen(std::move(b), *rt));
    return finish(std::move(n));
  }

  // After `x [NOT] IN`.
  Result<MNode> parse_in(MNode x, bool negated, Pos p) {
    if (cur_.kind != Tok::LParen) return expected("'('", cur_);
    advance();
    struct Item {
      NodePtr node;
      Pos pos;
    };
    std::vector<Item> items;
    Type ct = x->type;
    for (;;) {
      if (items.size() >= kMaxListItems)
        return fail(Errc::limit_exceeded,
                    cat({"IN list has more than ", std::to_string(kMaxListItems), " items"}), cur_);
      const Pos ip = pos_of(cur_);
      ENTENTE_ASSIGN_OR_RETURN(MNode item, parse_expr(0));
      const auto t = compare_type(ct, item->type);
      if (!t)
        return fail(Errc::type_error,
                    cat({"cannot compare ", type_name(x->type), " with ", type_name(item->type)}), ip);
      ct = *t;
      items.push_back({std::move(item), ip});
      if (cur_.kind == Tok::Comma) {
        advance();
        continue;
      }
      if (cur_.kind != Tok::RParen) return expected("')'", cur_);
      advance();
      break;
    }
    MNode n = make(Op::In, Type::Bool, p);
    n->negated = negated;
    n->kids.push_back(widen(std::move(x), ct));
    bool all_const = true;
    for (auto& it : items) {
      it.node = widen(std::move(it.node), ct);
      all_const = all_const && it.node->is_const();
    }
    if (all_const) {
      // A constant list becomes a sorted set: the common case, x IN (1, 2, 3).
      n->in_const = true;
      switch (ct) {
        case Type::Int64:
        case Type::Timestamp:
          for (auto& it : items) n->in_ints.push_back(std::get<int64_t>(it.node->value));
          std::sort(n->in_ints.begin(), n->in_ints.end());
          n->in_ints.erase(std::unique(n->in_ints.begin(), n->in_ints.end()), n->in_ints.end());
          break;
        case Type::Double:
          for (auto& it : items) {
            const double v = std::get<double>(it.node->value);
            if (!std::isnan(v)) n->in_doubles.push_back(v == 0.0 ? 0.0 : v);
          }
          std::sort(n->in_doubles.begin(), n->in_doubles.end());
          n->in_doubles.erase(std::unique(n->in_doubles.begin(), n->in_doubles.end()), n->in_doubles.end());
          break;
        case Type::Bool:
          n->in_bools.assign(2, 0);
          for (auto& it : items) n->in_bools[std::get<bool>(it.node->value) ? 1 : 0] = 1;
          break;
        case Type::String:
          for (auto& it : items) n->in_strings.push_back(std::get<std::string>(it.node->value));
          std::sort(n->in_strings.begin(), n->in_strings.end());
          n->in_strings.erase(std::unique(n->in_strings.begin(), n->in_strings.end()), n->in_strings.end());
          break;
      }
    } else {
      for (auto& it : items) n->kids.push_back(std::move(it.node));
    }
    return finish(std::move(n));
  }

  // After `x [NOT] BETWEEN`.
  Result<MNode> parse_between(MNode x, bool negated, Pos p) {
    ENTENTE_ASSIGN_OR_RETURN(MNode lo, parse_expr(kCmpBp));
    if (!is_keyword(cur_, "AND")) return expected("AND", cur_);
    advance();
    ENTENTE_ASSIGN_OR_RETURN(MNode hi, parse_expr(kCmpBp));
    auto ct = compare_type(x->type, lo->type);
    if (!ct)
      return fail(Errc::type_error,
                  cat({"cannot compare ", type_name(x->type), " with ", type_name(lo->type)}), p);
    ct = compare_type(*ct, hi->type);
    if (!ct)
      return fail(Errc::type_error,
                  cat({"cannot compare ", type_name(x->type), " with ", type_name(hi->type)}), p);
    MNode n = make(Op::Between, Type::Bool, p);
    n->negated = negated;
    n->kids.push_back(widen(std::move(x), *ct));
    n->kids.push_back(widen(std::move(lo), *ct));
    n->kids.push_back(widen(std::move(hi), *ct));
    return finish(std::move(n));
  }

  // After CASE.
  Result<MNode> parse_case(Pos p) {
    MNode n = make(Op::Case, Type::Int64, p);
    std::optional<Type> rt;
    auto add_value = [&](MNode v, Pos vp) -> Status {
      if (!rt) {
        rt = v->type;
      } else {
        const auto u = unify_type(*rt, v->type);
        if (!u)
          return fail(
              Errc::type_error,
              cat({"CASE branches have different types: ", type_name(*rt), " and ", type_name(v->type)}), vp);
        rt = *u;
      }
      n->kids.push_back(std::move(v));
      return Status::Ok();
    };
    if (!is_keyword(cur_, "WHEN")) return expected("WHEN", cur_);
    while (is_keyword(cur_, "WHEN")) {
      if (n->kids.size() / 2 >= kMaxListItems)
        return fail(Errc::limit_exceeded,
                    cat({"CASE has more than ", std::to_string(kMaxListItems), " branches"}), cur_);
      advance();
      const Pos cp = pos_of(cur_);
      ENTENTE_ASSIGN_OR_RETURN(MNode cond, parse_expr(0));
      if (cond->type != Type::Bool)
        return fail(Errc::type_error, cat({"CASE condition must be bool, got ", type_name(cond->type)}), cp);
      n->kids.push_back(std::move(cond));
      if (!is_keyword(cur_, "THEN")) return expected("THEN", cur_);
      advance();
      const Pos vp = pos_of(cur_);
      ENTENTE_ASSIGN_OR_RETURN(MNode v, parse_expr(0));
      ENTENTE_RETURN_IF_ERROR(add_value(std::move(v), vp));
    }
    if (is_keyword(cur_, "ELSE")) {
      advance();
      const Pos vp = pos_of(cur_);
      ENTENTE_ASSIGN_OR_RETURN(MNode v, parse_expr(0));
      ENTENTE_RETURN_IF_ERROR(add_value(std::move(v), vp));
      n->has_else = true;
    }
    if (!is_keyword(cur_, "END")) return expected("END", cur_);
    advance();
    n->type = *rt;
    // Values are kids 1, 3, 5, ... and the ELSE (last) when present.
    for (size_t i = 0; i < n->kids.size(); ++i) {
      const bool is_value = (i % 2 == 1) || (n->has_else && i + 1 == n->kids.size());
      if (is_value) n->kids[i] = widen(std::move(n->kids[i]), *rt);
    }
    return finish(std::move(n));
  }

  static std::string arity_text(const FuncInfo& f) {
    auto plural = [](int k) { return std::to_string(k) + (k == 1 ? " argument" : " arguments"); };
    if (f.max_args == f.min_args) return plural(f.min_args);
    if (f.max_args < 0) return cat({"at least ", plural(f.min_args)});
    return cat({std::to_string(f.min_args), " or ", plural(f.max_args)});
  }

  // After the function name; cur_ is '('.
  Result<MNode> parse_call(const Token& name_tok) {
    const std::string_view name = lex_.slice(name_tok);
    const FuncInfo* info = nullptr;
    for (const auto& f : kFuncs)
      if (iequals(f.name, name)) info = &f;
    if (!info) return fail(Errc::not_found, cat({"unknown function '", echo(name), "'"}), name_tok);
    std::vector<NodePtr> args;
    std::vector<Pos> arg_pos;
    ENTENTE_RETURN_IF_ERROR(parse_call_args(info, args, arg_pos));
    const int argc = static_cast<int>(args.size());
    if (argc < info->min_args || (info->max_args >= 0 && argc > info->max_args))
      return fail(
          Errc::type_error,
          cat({"function '", info->name, "' takes ", arity_text(*info), ", got ", std::to_string(argc)}),
          name_tok);
    ENTENTE_ASSIGN_OR_RETURN(const Type rt, type_call(info, args, arg_pos));
    MNode n = make(Op::Call, rt, pos_of(name_tok));
    n->func = info->func;
    if (info->func == Func::Coalesce) {
      // No nulls: coalesce is its first argument. The others were parsed and
      // type-checked so that the expression stays valid SQL-wise, and dropped.
      n->kids.push_back(std::move(args[0]));
    } else {
      for (auto& a : args) n->kids.push_back(std::move(a));
    }
    return finish(std::move(n));
  }

  // The arguments of a call of `info`, from '(' through ')', each with
  // where it starts.
  Status parse_call_args(const FuncInfo* info, std::vector<NodePtr>& args, std::vector<Pos>& arg_pos) {
    advance();  // '('
    if (cur_.kind != Tok::RParen) {
      for (;;) {
        if (args.size() >= kMaxListItems)
          return fail(Errc::limit_exceeded,
                      cat({"function '", info->name, "' has more than ", std::to_string(kMaxListItems),
                           " arguments"}),
                      cur_);
        arg_pos.push_back(pos_of(cur_));
        ENTENTE_ASSIGN_OR_RETURN(MNode a, parse_expr(0));
        args.push_back(std::move(a));
        if (cur_.kind == Tok::Comma) {
          advance();
          continue;
        }
        if (cur_.kind != Tok::RParen) return expected("')'", cur_);
        break;
      }
    }
    advance();  // ')'
    return Status::Ok();
  }

  // The type of a call of `info` on `args` (of the right count), widening
  // arguments where the function needs one type; a type_error naming the
  // argument otherwise.
  Result<Type> type_call(const FuncInfo* info, std::vector<NodePtr>& args, const std::vector<Pos>& arg_pos) {
    const std::string fname(info->name);
    auto bad_arg = [&](size_t i, std::string_view want) {
      return fail(Errc::type_error,
                  cat({"function '", fname, "' argument ", std::to_string(i + 1), " must be ", want, ", got ",
                       type_name(args[i]->type)}),
                  arg_pos[i]);
    };
    auto want = [&](size_t i, bool ok, std::string_view what) -> Status {
      if (!ok) return bad_arg(i, what);
      return Status::Ok();
    };
    Type rt = Type::Int64;
    switch (info->func) {
      case Func::Abs:
      case Func::Floor:
      case Func::Ceil:
      case Func::Round:
        ENTENTE_RETURN_IF_ERROR(want(0, is_numeric(args[0]->type), "numeric"));
        rt = args[0]->type;
        break;
      case Func::Sqrt:
        ENTENTE_RETURN_IF_ERROR(want(0, is_numeric(args[0]->type), "numeric"));
        rt = Type::Double;
        args[0] = widen(std::move(args[0]), Type::Double);
        break;
      case Func::Lower:
      case Func::Upper:
        ENTENTE_RETURN_IF_ERROR(want(0, args[0]->type == Type::String, "string"));
        rt = Type::String;
        break;
      case Func::Length:
        ENTENTE_RETURN_IF_ERROR(want(0, args[0]->type == Type::String, "string"));
        rt = Type::Int64;
        break;
      case Func::Hash:
        rt = Type::Int64;
        break;
      case Func::Concat:
        for (size_t i = 0; i < args.size(); ++i)
          ENTENTE_RETURN_IF_ERROR(want(i, args[i]->type == Type::String, "string"));
        rt = Type::String;
        break;
      case Func::Coalesce:
      case Func::Min:
      case Func::Max: {
        rt = args[0]->type;
        for (size_t i = 1; i < args.size(); ++i) {
          const auto u = unify_type(rt, args[i]->type);
          if (!u)
            return fail(Errc::type_error,
                        cat({"function '", fname, "' arguments must have one type: ", type_name(rt), " and ",
                             type_name(args[i]->type)}),
                        arg_pos[i]);
          rt = *u;
        }
        for (auto& a : args) a = widen(std::move(a), rt);
        break;
      }
      case Func::ToDouble:
        rt = Type::Double;
        break;
      case Func::ToInt:
        rt = Type::Int64;
        break;
      case Func::Substr:
        ENTENTE_RETURN_IF_ERROR(want(0, args[0]->type == Type::String, "string"));
        for (size_t i = 1; i < args.size(); ++i)
          ENTENTE_RETURN_IF_ERROR(want(i, args[i]->type == Type::Int64, "int64"));
        rt = Type::String;
        break;
      case Func::StartsWith:
      case Func::EndsWith:
      case Func::Contains:
        for (size_t i = 0; i < args.size(); ++i)
          ENTENTE_RETURN_IF_ERROR(want(i, args[i]->type == Type::String, "string"));
        rt = Type::Bool;
        break;
      case Func::None:
        break;
    }
    return rt;
  }

  Lexer lex_;
  const Schema& schema_;
  LexState state_;
  Token cur_;
  uint32_t depth_ = 0;
};

}  // namespace

Result<NodePtr> parse_expression(std::string_view text, const Schema& input) {
  if (text.size() > kMaxExprBytes)
    return make_error(Errc::limit_exceeded, cat({"expression too long: ", std::to_string(text.size()),
                                                 " bytes (limit ", std::to_string(kMaxExprBytes), ")"}));
  Parser p(text, input);
  return p.parse();
}

}  // namespace entente::engine::detail
