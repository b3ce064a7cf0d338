// Column-at-a-time evaluation of compiled expressions.
//
// Each node evaluates into a whole column for the batch. Operands that are
// constants are never broadcast for the common operators: every binary kernel
// has column-column, column-scalar and scalar-column loops, so `price > 100`
// is one tight loop over the price column. Field references hand out the
// batch's own column without copying. No per-row virtual calls, no per-row
// allocation (string results grow one buffer per batch).
//
// Semantics that SQL leaves to the implementation (docs/expressions.md):
// int64 + - * wrap around (two's complement, computed in uint64 so there is no
// UB); int64 / 0 and % 0 give 0; INT64_MIN / -1 gives INT64_MIN; double
// arithmetic is IEEE 754.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>

#include "engine/detail/expr_node.h"
#include "engine/hash.h"

namespace entente::engine::detail {

namespace {

// ---- integer arithmetic without undefined behaviour ----

inline int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
inline int64_t wrap_sub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
inline int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}
inline int64_t wrap_neg(int64_t a) { return static_cast<int64_t>(uint64_t{0} - static_cast<uint64_t>(a)); }
inline int64_t int_div(int64_t a, int64_t b) {
  if (b == 0) return 0;
  if (b == -1) return wrap_neg(a);  // INT64_MIN / -1 overflows in hardware
  return a / b;
}
inline int64_t int_mod(int64_t a, int64_t b) {
  if (b == 0 || b == -1) return 0;
  return a % b;
}

// Signed division by a divisor that is the same for a whole column, as a
// multiply-high, an add and shifts (Hacker's Delight, 10-1), so `x % 123`
// costs a few cycles per row instead of a hardware divide. div()/mod() give
// exactly int_div()/int_mod(); usable() is false for the divisors the
// method does not cover (|d| < 2, INT64_MIN), which the callers send to the
// plain kernels.
class ConstDivisor {
 public:
  explicit ConstDivisor(int64_t d) : d_(d) {
    if (d == 0 || d == 1 || d == -1 || d == INT64_MIN) return;
    constexpr uint64_t two63 = uint64_t{1} << 63;
    const uint64_t ad = d < 0 ? uint64_t{0} - static_cast<uint64_t>(d) : static_cast<uint64_t>(d);
    const uint64_t t = two63 + (static_cast<uint64_t>(d) >> 63);
    const uint64_t anc = t - 1 - t % ad;  // |nc|
    int p = 63;
    uint64_t q1 = two63 / anc, r1 = two63 - q1 * anc;
    uint64_t q2 = two63 / ad, r2 = two63 - q2 * ad;
    uint64_t delta = 0;
    do {
      ++p;
      q1 *= 2;
      r1 *= 2;
      if (r1 >= anc) {
        ++q1;
        r1 -= anc;
      }
      q2 *= 2;
      r2 *= 2;
      if (r2 >= ad) {
        ++q2;
        r2 -= ad;
      }
      delta = ad - r2;
    } while (q1 < delta || (q1 == delta && r1 == 0));
    uint64_t m = q2 + 1;
    if (d < 0) m = uint64_t{0} - m;
    magic_ = static_cast<int64_t>(m);
    shift_ = p - 64;
    add_mask_ = d > 0 && magic_ < 0 ? -1 : 0;
    sub_mask_ = d < 0 && magic_ > 0 ? -1 : 0;
    usable_ = true;
  }

  bool usable() const noexcept { return usable_; }
  int64_t divisor() const noexcept { return d_; }

  // REQUIRES: usable()
  int64_t div(int64_t n) const noexcept {
    const __int128 prod = static_cast<__int128>(magic_) * n;
    int64_t q = static_cast<int64_t>(prod >> 64);
    q = wrap_add(q, n & add_mask_);  // masks rather than branches: the loop stays straight
    q = wrap_sub(q, n & sub_mask_);
    q >>= shift_;
    return q + static_cast<int64_t>(static_cast<uint64_t>(q) >> 63);
  }
  // REQUIRES: usable()
  int64_t mod(int64_t n) const noexcept { return wrap_sub(n, wrap_mul(div(n), d_)); }

 private:
  int64_t d_;
  int64_t magic_ = 0;
  int shift_ = 0;
  int64_t add_mask_ = 0;
  int64_t sub_mask_ = 0;
  bool usable_ = false;
};

// double -> int64 truncating toward zero, saturating, NaN -> 0.
inline int64_t double_to_int(double v) {
  if (std::isnan(v)) return 0;
  if (v >= 9223372036854775808.0) return INT64_MAX;
  if (v < -9223372036854775808.0) return INT64_MIN;
  return static_cast<int64_t>(v);
}

// ---- operands ----

// One evaluated operand: either a constant (k) or column data. Int-repr data
// may point straight at the batch's event times.
struct Arg {
  const ExprNode* k = nullptr;
  ColumnPtr holder;  // keeps an evaluated column alive
  const Column* col = nullptr;
  const int64_t* ints = nullptr;
  const double* dbls = nullptr;
  const uint8_t* bools = nullptr;

  bool is_const() const noexcept { return k != nullptr; }
  int64_t kint() const { return std::get<int64_t>(k->value); }
  double kdbl() const { return std::get<double>(k->value); }
  uint8_t kbool() const { return std::get<bool>(k->value) ? 1 : 0; }
  std::string_view kstr() const { return std::get<std::string>(k->value); }
  std::string_view str(size_t i) const { return k ? kstr() : col->str(i); }
};

Arg operand(const ExprNode& n, const Batch& b) {
  Arg a;
  if (n.op == Op::Const) {
    a.k = &n;
    return a;
  }
  if (n.op == Op::Time) {
    a.ints = b.event_time.data();
    return a;
  }
  if (n.op == Op::Field) {
    a.col = b.columns[static_cast<size_t>(n.field)].get();
  } else {
    a.holder = eval_node(n, b);
    a.col = a.holder.get();
  }
  a.ints = a.col->ints.data();
  a.dbls = a.col->doubles.data();
  a.bools = a.col->bools.data();
  return a;
}

// Like operand(), but a constant is broadcast into a column: for kernels
// that only ever see a constant while folding literal-only subtrees.
Arg operand_col(const ExprNode& n, const Batch& b) {
  if (n.op != Op::Const) return operand(n, b);
  Arg a;
  a.holder = eval_node(n, b);
  a.col = a.holder.get();
  a.ints = a.col->ints.data();
  a.dbls = a.col->doubles.data();
  a.bools = a.col->bools.data();
  return a;
}

// Typed access to an Arg, so kernels are written once per element type.
template <class T>
struct Rep;
template <>
struct Rep<int64_t> {
  static const int64_t* data(const Arg& a) { return a.ints; }
  static int64_t scalar(const Arg& a) { return a.kint(); }
};
template <>
struct Rep<double> {
  static const double* data(const Arg& a) { return a.dbls; }
  static double scalar(const Arg& a) { return a.kdbl(); }
};
template <>
struct Rep<uint8_t> {
  static const uint8_t* data(const Arg& a) { return a.bools; }
  static uint8_t scalar(const Arg& a) { return a.kbool(); }
};

template <class T>
inline T at(const Arg& a, size_t i) {
  return a.is_const() ? Rep<T>::scalar(a) : Rep<T>::data(a)[i];
}

std::shared_ptr<Column> new_column(Type t, size_t n) {
  auto c = std::make_shared<Column>(t);
  switch (t) {
    case Type::Int64:
    case Type::Timestamp:
      c->ints.resize(n);
      break;
    case Type::Double:
      c->doubles.resize(n);
      break;
    case Type::Bool:
      c->bools.resize(n);
      break;
    case Type::String:
      c->offsets.reserve(n + 1);
      break;
  }
  return c;
}

std::shared_ptr<Column> broadcast(const ExprNode& k, size_t n) {
  auto c = new_column(k.type, n);
  switch (k.type) {
    case Type::Int64:
    case Type::Timestamp:
      std::fill(c->ints.begin(), c->ints.end(), std::get<int64_t>(k.value));
      break;
    case Type::Double:
      std::fill(c->doubles.begin(), c->doubles.end(), std::get<double>(k.value));
      break;
    case Type::Bool:
      std::fill(c->bools.begin(), c->bools.end(), std::get<bool>(k.value) ? 1 : 0);
      break;
    case Type::String: {
      const std::string& s = std::get<std::string>(k.value);
      c->chars.reserve(s.size() * n);
      for (size_t i = 0; i < n; ++i) c->append_str(s);
      break;
    }
  }
  return c;
}

// ---- kernels ----

// out[i] = f(a[i], b[i]) with the constant side hoisted out of the loop.
template <class T, class R, class F>
void map2(const Arg& a, const Arg& b, size_t n, R* out, F f) {
  if (a.is_const() && b.is_const()) {
    const R v = static_cast<R>(f(Rep<T>::scalar(a), Rep<T>::scalar(b)));
    std::fill(out, out + n, v);
  } else if (b.is_const()) {
    const T y = Rep<T>::scalar(b);
    const T* x = Rep<T>::data(a);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<R>(f(x[i], y));
  } else if (a.is_const()) {
    const T x = Rep<T>::scalar(a);
    const T* y = Rep<T>::data(b);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<R>(f(x, y[i]));
  } else {
    const T* x = Rep<T>::data(a);
    const T* y = Rep<T>::data(b);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<R>(f(x[i], y[i]));
  }
}

template <class R, class F>
void map2_str(const Arg& a, const Arg& b, size_t n, R* out, F f) {
  if (a.is_const() && b.is_const()) {
    std::fill(out, out + n, static_cast<R>(f(a.kstr(), b.kstr())));
  } else if (b.is_const()) {
    const std::string_view y = b.kstr();
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<R>(f(a.col->str(i), y));
  } else if (a.is_const()) {
    const std::string_view x = a.kstr();
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<R>(f(x, b.col->str(i)));
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<R>(f(a.col->str(i), b.col->str(i)));
  }
}

template <class T>
void compare_typed(Op op, const Arg& a, const Arg& b, size_t n, uint8_t* out) {
  switch (op) {
    case Op::Eq:
      map2<T>(a, b, n, out, [](T x, T y) { return x == y; });
      break;
    case Op::Ne:
      map2<T>(a, b, n, out, [](T x, T y) { return x != y; });
      break;
    case Op::Lt:
      map2<T>(a, b, n, out, [](T x, T y) { return x < y; });
      break;
    case Op::Le:
      map2<T>(a, b, n, out, [](T x, T y) { return x <= y; });
      break;
    case Op::Gt:
      map2<T>(a, b, n, out, [](T x, T y) { return x > y; });
      break;
    case Op::Ge:
      map2<T>(a, b, n, out, [](T x, T y) { return x >= y; });
      break;
    default:
      break;
  }
}

void compare_str(Op op, const Arg& a, const Arg& b, size_t n, uint8_t* out) {
  using SV = std::string_view;
  switch (op) {
    case Op::Eq:
      map2_str(a, b, n, out, [](SV x, SV y) { return x == y; });
      break;
    case Op::Ne:
      map2_str(a, b, n, out, [](SV x, SV y) { return x != y; });
      break;
    case Op::Lt:
      map2_str(a, b, n, out, [](SV x, SV y) { return x < y; });
      break;
    case Op::Le:
      map2_str(a, b, n, out, [](SV x, SV y) { return x <= y; });
      break;
    case Op::Gt:
      map2_str(a, b, n, out, [](SV x, SV y) { return x > y; });
      break;
    case Op::Ge:
      map2_str(a, b, n, out, [](SV x, SV y) { return x >= y; });
      break;
    default:
      break;
  }
}

// Compares two operands of the same representation `t`.
void compare(Op op, Type t, const Arg& a, const Arg& b, size_t n, uint8_t* out) {
  switch (t) {
    case Type::Int64:
    case Type::Timestamp:
      compare_typed<int64_t>(op, a, b, n, out);
      break;
    case Type::Double:
      compare_typed<double>(op, a, b, n, out);
      break;
    case Type::Bool:
      compare_typed<uint8_t>(op, a, b, n, out);
      break;
    case Type::String:
      compare_str(op, a, b, n, out);
      break;
  }
}

ColumnPtr eval_arith(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  const Arg x = operand(*n.kids[0], b);
  const Arg y = operand(*n.kids[1], b);
  auto c = new_column(n.type, rows);
  if (n.type == Type::Double) {
    double* o = c->doubles.data();
    switch (n.op) {
      case Op::Add:
        map2<double>(x, y, rows, o, [](double p, double q) { return p + q; });
        break;
      case Op::Sub:
        map2<double>(x, y, rows, o, [](double p, double q) { return p - q; });
        break;
      case Op::Mul:
        map2<double>(x, y, rows, o, [](double p, double q) { return p * q; });
        break;
      case Op::Div:
        map2<double>(x, y, rows, o, [](double p, double q) { return p / q; });
        break;
      case Op::Mod:
        map2<double>(x, y, rows, o, [](double p, double q) { return std::fmod(p, q); });
        break;
      default:
        break;
    }
  } else {
    int64_t* o = c->ints.data();
    switch (n.op) {
      case Op::Add:
        map2<int64_t>(x, y, rows, o, [](int64_t p, int64_t q) { return wrap_add(p, q); });
        break;
      case Op::Sub:
        map2<int64_t>(x, y, rows, o, [](int64_t p, int64_t q) { return wrap_sub(p, q); });
        break;
      case Op::Mul:
        map2<int64_t>(x, y, rows, o, [](int64_t p, int64_t q) { return wrap_mul(p, q); });
        break;
      case Op::Div:
      case Op::Mod: {
        if (y.is_const() && !x.is_const()) {
          const ConstDivisor dv(y.kint());
          if (dv.usable()) {
            const int64_t* xs = x.ints;
            if (n.op == Op::Div)
              for (size_t i = 0; i < rows; ++i) o[i] = dv.div(xs[i]);
            else
              for (size_t i = 0; i < rows; ++i) o[i] = dv.mod(xs[i]);
            break;
          }
        }
        if (n.op == Op::Div)
          map2<int64_t>(x, y, rows, o, [](int64_t p, int64_t q) { return int_div(p, q); });
        else
          map2<int64_t>(x, y, rows, o, [](int64_t p, int64_t q) { return int_mod(p, q); });
        break;
      }
      default:
        break;
    }
  }
  return c;
}

// ---- IN ----

template <class T>
inline bool sorted_member(const std::vector<T>& set, T v) {
  // Short lists: a linear scan beats binary search and vectorises.
  if (set.size() <= 8) {
    bool hit = false;
    for (T s : set) hit |= (s == v);
    return hit;
  }
  return std::binary_search(set.begin(), set.end(), v);
}

inline bool double_member(const std::vector<double>& set, double v) {
  return !std::isnan(v) && sorted_member(set, v);
}

inline bool string_member(const std::vector<std::string>& set, std::string_view v) {
  return std::binary_search(set.begin(), set.end(), v,
                            [](std::string_view p, std::string_view q) { return p < q; });
}

// Membership of row i of `x` in a constant IN list, dispatched once per
// batch by the caller through `visit_in`.
template <class F>
void visit_in(const ExprNode& n, const Arg& x, F&& f) {
  switch (n.kids[0]->type) {
    case Type::Int64:
    case Type::Timestamp: {
      const int64_t* v = x.ints;
      const auto& s = n.in_ints;
      f([v, &s](size_t i) { return sorted_member(s, v[i]); });
      break;
    }
    case Type::Double: {
      const double* v = x.dbls;
      const auto& s = n.in_doubles;
      f([v, &s](size_t i) { return double_member(s, v[i]); });
      break;
    }
    case Type::Bool: {
      const uint8_t* v = x.bools;
      const uint8_t* s = n.in_bools.data();
      f([v, s](size_t i) { return s[v[i]] != 0; });
      break;
    }
    case Type::String: {
      const Column* c = x.col;
      const auto& s = n.in_strings;
      f([c, &s](size_t i) { return string_member(s, c->str(i)); });
      break;
    }
  }
}

ColumnPtr eval_in(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  auto c = new_column(Type::Bool, rows);
  uint8_t* o = c->bools.data();
  const Arg x = operand_col(*n.kids[0], b);
  const uint8_t flip = n.negated ? 1 : 0;
  if (n.in_const) {
    visit_in(n, x, [&](auto member) {
      for (size_t i = 0; i < rows; ++i) o[i] = static_cast<uint8_t>(member(i) ^ flip);
    });
    return c;
  }
  std::vector<uint8_t> hit(rows);
  const Type t = n.kids[0]->type;
  for (size_t k = 1; k < n.kids.size(); ++k) {
    const Arg item = operand(*n.kids[k], b);
    compare(Op::Eq, t, x, item, rows, hit.data());
    for (size_t i = 0; i < rows; ++i) o[i] |= hit[i];
  }
  if (flip)
    for (size_t i = 0; i < rows; ++i) o[i] ^= 1;
  return c;
}

ColumnPtr eval_between(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  auto c = new_column(Type::Bool, rows);
  uint8_t* o = c->bools.data();
  const Type t = n.kids[0]->type;
  const Arg x = operand(*n.kids[0], b);
  const Arg lo = operand(*n.kids[1], b);
  const Arg hi = operand(*n.kids[2], b);
  std::vector<uint8_t> upper(rows);
  compare(Op::Le, t, lo, x, rows, o);
  compare(Op::Le, t, x, hi, rows, upper.data());
  const uint8_t flip = n.negated ? 1 : 0;
  for (size_t i = 0; i < rows; ++i) o[i] = static_cast<uint8_t>((o[i] & upper[i]) ^ flip);
  return c;
}

// ---- CASE ----

ColumnPtr eval_case(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  const size_t whens = n.kids.size() / 2;
  // pick[i]: the branch row i takes; `whens` means ELSE (or the type's zero
  // value without ELSE). Filled front to back so the first true WHEN wins.
  std::vector<uint32_t> pick(rows, static_cast<uint32_t>(whens));
  for (size_t w = 0; w < whens; ++w) {
    const Arg cond = operand(*n.kids[2 * w], b);
    const auto wi = static_cast<uint32_t>(w);
    if (cond.is_const()) {
      if (cond.kbool())
        for (size_t i = 0; i < rows; ++i) pick[i] = pick[i] == whens ? wi : pick[i];
    } else {
      const uint8_t* cv = cond.bools;
      for (size_t i = 0; i < rows; ++i) pick[i] = (pick[i] == whens && cv[i]) ? wi : pick[i];
    }
  }
  std::vector<Arg> vals;
  vals.reserve(whens + 1);
  for (size_t w = 0; w < whens; ++w) vals.push_back(operand(*n.kids[2 * w + 1], b));
  ExprNode zero;  // the value without ELSE
  zero.type = n.type;
  if (n.has_else) {
    vals.push_back(operand(*n.kids.back(), b));
  } else {
    switch (n.type) {
      case Type::Int64:
      case Type::Timestamp:
        zero.value = int64_t{0};
        break;
      case Type::Double:
        zero.value = 0.0;
        break;
      case Type::Bool:
        zero.value = false;
        break;
      case Type::String:
        zero.value = std::string();
        break;
    }
    Arg z;
    z.k = &zero;
    vals.push_back(std::move(z));
  }
  auto c = new_column(n.type, rows);
  switch (n.type) {
    case Type::Int64:
    case Type::Timestamp:
      for (size_t i = 0; i < rows; ++i) c->ints[i] = at<int64_t>(vals[pick[i]], i);
      break;
    case Type::Double:
      for (size_t i = 0; i < rows; ++i) c->doubles[i] = at<double>(vals[pick[i]], i);
      break;
    case Type::Bool:
      for (size_t i = 0; i < rows; ++i) c->bools[i] = at<uint8_t>(vals[pick[i]], i);
      break;
    case Type::String:
      for (size_t i = 0; i < rows; ++i) c->append_str(vals[pick[i]].str(i));
      break;
  }
  return c;
}

// ---- functions ----

char to_lower_ascii(char ch) { return (ch >= 'A' && ch <= 'Z') ? static_cast<char>(ch - 'A' + 'a') : ch; }
char to_upper_ascii(char ch) { return (ch >= 'a' && ch <= 'z') ? static_cast<char>(ch - 'a' + 'A') : ch; }

std::string_view trim_spaces(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  return s;
}

// Whole-string parse; anything that does not parse is 0 (no nulls).
double parse_double(std::string_view s) {
  s = trim_spaces(s);
  double v = 0;
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size()) return 0.0;
  return v;
}

int64_t parse_int(std::string_view s) {
  const std::string_view t = trim_spaces(s);
  int64_t v = 0;
  const auto r = std::from_chars(t.data(), t.data() + t.size(), v);
  if (!t.empty() && r.ec == std::errc() && r.ptr == t.data() + t.size()) return v;
  if (!t.empty() && r.ec == std::errc::result_out_of_range && r.ptr == t.data() + t.size())
    return t.front() == '-' ? INT64_MIN : INT64_MAX;
  return double_to_int(parse_double(t));
}

// 1-based SQL substring of bytes: [start, start + len) intersected with
// [1, size]. Bounds are clamped first so no arithmetic can overflow (strings
// are shorter than 2^32 bytes).
std::string_view substr_sql(std::string_view s, int64_t start, int64_t len, bool has_len) {
  constexpr int64_t kClamp = int64_t{1} << 40;
  const int64_t size = static_cast<int64_t>(s.size());
  const int64_t st = std::clamp(start, -kClamp, kClamp);
  int64_t end = size + 1;
  if (has_len) {
    if (len < 0) return {};
    end = std::min(end, st + std::min(len, kClamp));
  }
  const int64_t begin = std::max<int64_t>(st, 1);
  if (end <= begin) return {};
  return s.substr(static_cast<size_t>(begin - 1), static_cast<size_t>(end - begin));
}

template <class T>
void minmax_fold(bool is_max, const std::vector<Arg>& args, size_t rows, T* o) {
  for (size_t i = 0; i < rows; ++i) o[i] = at<T>(args[0], i);
  for (size_t k = 1; k < args.size(); ++k) {
    const Arg& a = args[k];
    if (is_max) {
      for (size_t i = 0; i < rows; ++i) {
        const T v = at<T>(a, i);
        o[i] = o[i] < v ? v : o[i];
      }
    } else {
      for (size_t i = 0; i < rows; ++i) {
        const T v = at<T>(a, i);
        o[i] = v < o[i] ? v : o[i];
      }
    }
  }
}

// abs, floor, ceil, round (of a double) and sqrt, row by row.
ColumnPtr eval_math(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  const Arg x = operand_col(*n.kids[0], b);
  auto c = new_column(n.type, rows);
  if (n.type == Type::Int64) {
    for (size_t i = 0; i < rows; ++i) {
      const int64_t v = x.ints[i];
      c->ints[i] = v < 0 ? wrap_neg(v) : v;  // abs(INT64_MIN) wraps to INT64_MIN
    }
    return c;
  }
  double* o = c->doubles.data();
  const double* v = x.dbls;
  switch (n.func) {
    case Func::Abs:
      for (size_t i = 0; i < rows; ++i) o[i] = std::fabs(v[i]);
      break;
    case Func::Floor:
      for (size_t i = 0; i < rows; ++i) o[i] = std::floor(v[i]);
      break;
    case Func::Ceil:
      for (size_t i = 0; i < rows; ++i) o[i] = std::ceil(v[i]);
      break;
    case Func::Round:
      for (size_t i = 0; i < rows; ++i) o[i] = std::round(v[i]);
      break;
    case Func::Sqrt:
      for (size_t i = 0; i < rows; ++i) o[i] = std::sqrt(v[i]);
      break;
    default:
      break;
  }
  return c;
}

// lower and upper: ASCII letters only, the bytes keep their offsets.
ColumnPtr eval_letter_case(const ExprNode& n, const Batch& b) {
  const Arg x = operand_col(*n.kids[0], b);
  auto c = std::make_shared<Column>(Type::String);
  c->offsets = x.col->offsets;
  c->chars = x.col->chars;
  if (n.func == Func::Lower)
    for (char& ch : c->chars) ch = to_lower_ascii(ch);
  else
    for (char& ch : c->chars) ch = to_upper_ascii(ch);
  return c;
}

// length in bytes.
ColumnPtr eval_length(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  const Arg x = operand_col(*n.kids[0], b);
  auto c = new_column(Type::Int64, rows);
  const uint32_t* off = x.col->offsets.data();
  for (size_t i = 0; i < rows; ++i) c->ints[i] = static_cast<int64_t>(off[i + 1] - off[i]);
  return c;
}

// hash(k, ...): the key hash the engine partitions by.
ColumnPtr eval_hash(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  // Same as hash_rows() over these values as key columns, so hash(k) %
  // 128 is the key group the engine gives key k.
  auto c = new_column(Type::Int64, rows);
  std::vector<uint64_t> h(rows);
  for (size_t k = 0; k < n.kids.size(); ++k) {
    const ColumnPtr col = eval_node(*n.kids[k], b);
    if (k == 0)
      for (size_t i = 0; i < rows; ++i) h[i] = hash_value(*col, i);
    else
      for (size_t i = 0; i < rows; ++i) h[i] = hash_combine(h[i], hash_value(*col, i));
  }
  for (size_t i = 0; i < rows; ++i) c->ints[i] = static_cast<int64_t>(h[i]);
  return c;
}

// concat of strings, one pass over the rows.
ColumnPtr eval_concat(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  std::vector<Arg> args;
  args.reserve(n.kids.size());
  size_t bytes = 0;
  for (const auto& k : n.kids) {
    args.push_back(operand(*k, b));
    bytes += args.back().is_const() ? args.back().kstr().size() * rows : args.back().col->chars.size();
  }
  auto c = new_column(Type::String, rows);
  c->chars.reserve(bytes);
  for (size_t i = 0; i < rows; ++i) {
    for (const Arg& a : args) {
      const std::string_view s = a.str(i);
      c->chars.append(s.data(), s.size());
    }
    c->offsets.push_back(static_cast<uint32_t>(c->chars.size()));
  }
  return c;
}

// min and max across arguments (of one type), row by row.
ColumnPtr eval_minmax(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  std::vector<Arg> args;
  args.reserve(n.kids.size());
  for (const auto& k : n.kids) args.push_back(operand(*k, b));
  const bool is_max = n.func == Func::Max;
  auto c = new_column(n.type, rows);
  switch (n.type) {
    case Type::Int64:
    case Type::Timestamp:
      minmax_fold<int64_t>(is_max, args, rows, c->ints.data());
      break;
    case Type::Double:
      minmax_fold<double>(is_max, args, rows, c->doubles.data());
      break;
    case Type::Bool:
      minmax_fold<uint8_t>(is_max, args, rows, c->bools.data());
      break;
    case Type::String:
      for (size_t i = 0; i < rows; ++i) {
        std::string_view best = args[0].str(i);
        for (size_t k = 1; k < args.size(); ++k) {
          const std::string_view v = args[k].str(i);
          if (is_max ? best < v : v < best) best = v;
        }
        c->append_str(best);
      }
      break;
  }
  return c;
}

// to_double of an int64, timestamp, bool or string.
ColumnPtr eval_to_double(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  const ExprNode& kid = *n.kids[0];
  if (kid.type == Type::Double) return eval_node(kid, b);
  const Arg x = operand_col(kid, b);
  auto c = new_column(Type::Double, rows);
  double* o = c->doubles.data();
  switch (kid.type) {
    case Type::Int64:
    case Type::Timestamp:
      for (size_t i = 0; i < rows; ++i) o[i] = static_cast<double>(x.ints[i]);
      break;
    case Type::Bool:
      for (size_t i = 0; i < rows; ++i) o[i] = x.bools[i];
      break;
    case Type::String:
      for (size_t i = 0; i < rows; ++i) o[i] = parse_double(x.col->str(i));
      break;
    case Type::Double:
      break;
  }
  return c;
}

// to_int of a timestamp, double, bool or string.
ColumnPtr eval_to_int(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  const ExprNode& kid = *n.kids[0];
  if (kid.type == Type::Int64) return eval_node(kid, b);
  const Arg x = operand_col(kid, b);
  auto c = new_column(Type::Int64, rows);
  int64_t* o = c->ints.data();
  switch (kid.type) {
    case Type::Timestamp:
      std::copy(x.ints, x.ints + rows, o);
      break;
    case Type::Double:
      for (size_t i = 0; i < rows; ++i) o[i] = double_to_int(x.dbls[i]);
      break;
    case Type::Bool:
      for (size_t i = 0; i < rows; ++i) o[i] = x.bools[i];
      break;
    case Type::String:
      for (size_t i = 0; i < rows; ++i) o[i] = parse_int(x.col->str(i));
      break;
    case Type::Int64:
      break;
  }
  return c;
}

// substr(s, start[, len]), SQL style.
ColumnPtr eval_substr(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  const Arg s = operand(*n.kids[0], b);
  const Arg start = operand(*n.kids[1], b);
  const bool has_len = n.kids.size() > 2;
  Arg len;
  if (has_len) len = operand(*n.kids[2], b);
  auto c = new_column(Type::String, rows);
  for (size_t i = 0; i < rows; ++i)
    c->append_str(
        substr_sql(s.str(i), at<int64_t>(start, i), has_len ? at<int64_t>(len, i) : 0, has_len));
  return c;
}

// starts_with, ends_with and contains.
ColumnPtr eval_string_test(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  using SV = std::string_view;
  const Arg s = operand(*n.kids[0], b);
  const Arg t = operand(*n.kids[1], b);
  auto c = new_column(Type::Bool, rows);
  uint8_t* o = c->bools.data();
  if (n.func == Func::StartsWith)
    map2_str(s, t, rows, o, [](SV x, SV y) { return x.starts_with(y); });
  else if (n.func == Func::EndsWith)
    map2_str(s, t, rows, o, [](SV x, SV y) { return x.ends_with(y); });
  else
    map2_str(s, t, rows, o, [](SV x, SV y) { return x.find(y) != SV::npos; });
  return c;
}

ColumnPtr eval_call(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  switch (n.func) {
    case Func::Coalesce:  // no nulls: the first argument (see docs)
      return eval_node(*n.kids[0], b);
    case Func::Floor:
    case Func::Ceil:
    case Func::Round:
      if (n.type != Type::Double) return eval_node(*n.kids[0], b);  // int64: already whole
      [[fallthrough]];
    case Func::Sqrt:
    case Func::Abs:
      return eval_math(n, b);
    case Func::Lower:
    case Func::Upper:
      return eval_letter_case(n, b);
    case Func::Length:
      return eval_length(n, b);
    case Func::Hash:
      return eval_hash(n, b);
    case Func::Concat:
      return eval_concat(n, b);
    case Func::Min:
    case Func::Max:
      return eval_minmax(n, b);
    case Func::ToDouble:
      return eval_to_double(n, b);
    case Func::ToInt:
      return eval_to_int(n, b);
    case Func::Substr:
      return eval_substr(n, b);
    case Func::StartsWith:
    case Func::EndsWith:
    case Func::Contains:
      return eval_string_test(n, b);
    case Func::None:
      break;
  }
  return new_column(n.type, rows);
}

// ---- selection ----

// Appends to `out` the rows (candidates, or 0..rows-1) where pred(i) holds.
// Branch-free: every candidate is written, the cursor advances on a hit.
template <class Pred>
void select_loop(size_t rows, const std::vector<uint32_t>* cand, std::vector<uint32_t>& out, Pred pred) {
  const size_t base = out.size();
  const size_t m = cand ? cand->size() : rows;
  out.resize(base + m);
  uint32_t* o = out.data() + base;
  size_t k = 0;
  if (cand) {
    const uint32_t* cs = cand->data();
    for (size_t j = 0; j < m; ++j) {
      const uint32_t i = cs[j];
      o[k] = i;
      k += pred(i) ? 1 : 0;
    }
  } else {
    for (size_t i = 0; i < m; ++i) {
      o[k] = static_cast<uint32_t>(i);
      k += pred(i) ? 1 : 0;
    }
  }
  out.resize(base + k);
}

// A node whose values can be read in place: a field or the event time.
bool is_direct(const ExprNode& n) { return n.op == Op::Field || n.op == Op::Time; }

Op flip_op(Op op) {
  switch (op) {
    case Op::Lt:
      return Op::Gt;
    case Op::Le:
      return Op::Ge;
    case Op::Gt:
      return Op::Lt;
    case Op::Ge:
      return Op::Le;
    default:
      return op;
  }
}

// Appends the rows where get(i) OP k holds; `get` reads or computes the
// row's value, so a comparison never materialises a bool column.
template <class T, class Get>
void select_cmp(Op op, Get get, T k, size_t rows, const std::vector<uint32_t>* cand, std::vector<uint32_t>& out) {
  switch (op) {
    case Op::Eq:
      select_loop(rows, cand, out, [get, k](size_t i) { return get(i) == k; });
      break;
    case Op::Ne:
      select_loop(rows, cand, out, [get, k](size_t i) { return get(i) != k; });
      break;
    case Op::Lt:
      select_loop(rows, cand, out, [get, k](size_t i) { return get(i) < k; });
      break;
    case Op::Le:
      select_loop(rows, cand, out, [get, k](size_t i) { return get(i) <= k; });
      break;
    case Op::Gt:
      select_loop(rows, cand, out, [get, k](size_t i) { return get(i) > k; });
      break;
    case Op::Ge:
      select_loop(rows, cand, out, [get, k](size_t i) { return get(i) >= k; });
      break;
    default:
      break;
  }
}

template <class T>
void select_cmp_scalar(Op op, const T* v, T k, size_t rows, const std::vector<uint32_t>* cand,
                       std::vector<uint32_t>& out) {
  select_cmp<T>(op, [v](size_t i) { return v[i]; }, k, rows, cand, out);
}

// Two columns of one representation: x[i] OP y[i].
template <class T>
void select_cmp_cols(Op op, const T* x, const T* y, size_t rows, const std::vector<uint32_t>* cand,
                     std::vector<uint32_t>& out) {
  switch (op) {
    case Op::Eq:
      select_loop(rows, cand, out, [x, y](size_t i) { return x[i] == y[i]; });
      break;
    case Op::Ne:
      select_loop(rows, cand, out, [x, y](size_t i) { return x[i] != y[i]; });
      break;
    case Op::Lt:
      select_loop(rows, cand, out, [x, y](size_t i) { return x[i] < y[i]; });
      break;
    case Op::Le:
      select_loop(rows, cand, out, [x, y](size_t i) { return x[i] <= y[i]; });
      break;
    case Op::Gt:
      select_loop(rows, cand, out, [x, y](size_t i) { return x[i] > y[i]; });
      break;
    case Op::Ge:
      select_loop(rows, cand, out, [x, y](size_t i) { return x[i] >= y[i]; });
      break;
    default:
      break;
  }
}

// For an int-representation `direct ARITH constant` or `constant ARITH
// direct` node: calls f(get), where get(i) computes the node's value on row
// i exactly as eval_arith would, and returns true. False for other shapes.
// Lets `auction % 123 = 0` test only the candidate rows, in one pass, with
// no intermediate column.
template <class F>
bool with_int_arith(const ExprNode& n, const Batch& b, F&& f) {
  if (!is_int_repr(n.type) || n.kids.size() != 2) return false;
  const ExprNode& l = *n.kids[0];
  const ExprNode& r = *n.kids[1];
  if (is_direct(l) && r.is_const()) {
    const int64_t* v = operand(l, b).ints;
    const int64_t k = std::get<int64_t>(r.value);
    switch (n.op) {
      case Op::Add:
        f([v, k](size_t i) { return wrap_add(v[i], k); });
        return true;
      case Op::Sub:
        f([v, k](size_t i) { return wrap_sub(v[i], k); });
        return true;
      case Op::Mul:
        f([v, k](size_t i) { return wrap_mul(v[i], k); });
        return true;
      case Op::Div:
      case Op::Mod: {
        const ConstDivisor dv(k);
        if (!dv.usable()) {
          if (n.op == Op::Div)
            f([v, k](size_t i) { return int_div(v[i], k); });
          else
            f([v, k](size_t i) { return int_mod(v[i], k); });
        } else if (n.op == Op::Div) {
          f([v, dv](size_t i) { return dv.div(v[i]); });
        } else {
          f([v, dv](size_t i) { return dv.mod(v[i]); });
        }
        return true;
      }
      default:
        return false;
    }
  }
  if (l.is_const() && is_direct(r)) {
    const int64_t k = std::get<int64_t>(l.value);
    const int64_t* v = operand(r, b).ints;
    switch (n.op) {
      case Op::Add:
        f([v, k](size_t i) { return wrap_add(k, v[i]); });
        return true;
      case Op::Sub:
        f([v, k](size_t i) { return wrap_sub(k, v[i]); });
        return true;
      case Op::Mul:
        f([v, k](size_t i) { return wrap_mul(k, v[i]); });
        return true;
      case Op::Div:
        f([v, k](size_t i) { return int_div(k, v[i]); });
        return true;
      case Op::Mod:
        f([v, k](size_t i) { return int_mod(k, v[i]); });
        return true;
      default:
        return false;
    }
  }
  return false;
}

void select_cmp_str(Op op, const Column* c, std::string_view k, size_t rows,
                    const std::vector<uint32_t>* cand, std::vector<uint32_t>& out) {
  switch (op) {
    case Op::Eq:
      select_loop(rows, cand, out, [c, k](size_t i) { return c->str(i) == k; });
      break;
    case Op::Ne:
      select_loop(rows, cand, out, [c, k](size_t i) { return c->str(i) != k; });
      break;
    case Op::Lt:
      select_loop(rows, cand, out, [c, k](size_t i) { return c->str(i) < k; });
      break;
    case Op::Le:
      select_loop(rows, cand, out, [c, k](size_t i) { return c->str(i) <= k; });
      break;
    case Op::Gt:
      select_loop(rows, cand, out, [c, k](size_t i) { return c->str(i) > k; });
      break;
    case Op::Ge:
      select_loop(rows, cand, out, [c, k](size_t i) { return c->str(i) >= k; });
      break;
    default:
      break;
  }
}

// A comparison straight into the selection vector, without a bool column:
// `x OP constant` (either order) where x is a field, the event time, a
// fused int `direct ARITH constant`, or any other expression evaluated once
// into a column; and `x OP y` over two numeric or bool operands. False
// (the caller evaluates) for string column-column comparisons.
bool select_compare(const ExprNode& n, const Batch& b, const std::vector<uint32_t>* cand,
                    std::vector<uint32_t>& out) {
  const ExprNode* col = n.kids[0].get();
  const ExprNode* k = n.kids[1].get();
  Op op = n.op;
  const size_t rows = b.rows();
  if (!k->is_const()) {
    if (!col->is_const()) {
      if (col->type == Type::String) return false;
      const Arg x = operand(*col, b);
      const Arg y = operand(*k, b);
      switch (col->type) {
        case Type::Int64:
        case Type::Timestamp:
          select_cmp_cols<int64_t>(op, x.ints, y.ints, rows, cand, out);
          break;
        case Type::Double:
          select_cmp_cols<double>(op, x.dbls, y.dbls, rows, cand, out);
          break;
        case Type::Bool:
          select_cmp_cols<uint8_t>(op, x.bools, y.bools, rows, cand, out);
          break;
        case Type::String:
          break;
      }
      return true;
    }
    std::swap(col, k);
    op = flip_op(op);
  }
  if (col->is_const()) return false;  // literal-only: folded at compile time anyway
  if (is_int_repr(col->type)) {
    const int64_t kv = std::get<int64_t>(k->value);
    if (with_int_arith(*col, b, [&](auto get) { select_cmp<int64_t>(op, get, kv, rows, cand, out); }))
      return true;
  }
  const Arg x = operand(*col, b);
  switch (col->type) {
    case Type::Int64:
    case Type::Timestamp:
      select_cmp_scalar<int64_t>(op, x.ints, std::get<int64_t>(k->value), rows, cand, out);
      break;
    case Type::Double:
      select_cmp_scalar<double>(op, x.dbls, std::get<double>(k->value), rows, cand, out);
      break;
    case Type::Bool:
      select_cmp_scalar<uint8_t>(op, x.bools, std::get<bool>(k->value) ? 1 : 0, rows, cand, out);
      break;
    case Type::String:
      select_cmp_str(op, x.col, std::get<std::string>(k->value), rows, cand, out);
      break;
  }
  return true;
}

template <class T>
void select_range(const T* v, T lo, T hi, bool negated, size_t rows, const std::vector<uint32_t>* cand,
                  std::vector<uint32_t>& out) {
  if (negated)
    select_loop(rows, cand, out, [=](size_t i) { return !(lo <= v[i] && v[i] <= hi); });
  else
    select_loop(rows, cand, out, [=](size_t i) { return lo <= v[i] && v[i] <= hi; });
}

bool select_between(const ExprNode& n, const Batch& b, const std::vector<uint32_t>* cand,
                    std::vector<uint32_t>& out) {
  const ExprNode& xn = *n.kids[0];
  const ExprNode& lo = *n.kids[1];
  const ExprNode& hi = *n.kids[2];
  if (!is_direct(xn) || !lo.is_const() || !hi.is_const()) return false;
  const Arg x = operand(xn, b);
  const size_t rows = b.rows();
  switch (xn.type) {
    case Type::Int64:
    case Type::Timestamp:
      select_range<int64_t>(x.ints, std::get<int64_t>(lo.value), std::get<int64_t>(hi.value), n.negated, rows,
                            cand, out);
      return true;
    case Type::Double:
      select_range<double>(x.dbls, std::get<double>(lo.value), std::get<double>(hi.value), n.negated, rows,
                           cand, out);
      return true;
    default:
      return false;
  }
}

bool select_in(const ExprNode& n, const Batch& b, const std::vector<uint32_t>* cand,
               std::vector<uint32_t>& out) {
  if (!n.in_const || !is_direct(*n.kids[0])) return false;
  const Arg x = operand(*n.kids[0], b);
  const bool neg = n.negated;
  visit_in(n, x, [&](auto member) {
    select_loop(b.rows(), cand, out, [&member, neg](size_t i) { return member(i) != neg; });
  });
  return true;
}

}  // namespace

ColumnPtr eval_node(const ExprNode& n, const Batch& b) {
  const size_t rows = b.rows();
  switch (n.op) {
    case Op::Const:
      return broadcast(n, rows);
    case Op::Field:
      return b.columns[static_cast<size_t>(n.field)];
    case Op::Time: {
      auto c = std::make_shared<Column>(Type::Timestamp);
      c->ints = b.event_time.vec();
      return c;
    }
    case Op::Cast: {
      const Arg x = operand_col(*n.kids[0], b);
      auto c = new_column(Type::Double, rows);
      for (size_t i = 0; i < rows; ++i) c->doubles[i] = static_cast<double>(x.ints[i]);
      return c;
    }
    case Op::Neg: {
      const Arg x = operand_col(*n.kids[0], b);
      auto c = new_column(n.type, rows);
      if (n.type == Type::Double)
        for (size_t i = 0; i < rows; ++i) c->doubles[i] = -x.dbls[i];
      else
        for (size_t i = 0; i < rows; ++i) c->ints[i] = wrap_neg(x.ints[i]);
      return c;
    }
    case Op::Not: {
      const Arg x = operand_col(*n.kids[0], b);
      auto c = new_column(Type::Bool, rows);
      for (size_t i = 0; i < rows; ++i) c->bools[i] = x.bools[i] ^ 1;
      return c;
    }
    case Op::Add:
    case Op::Sub:
    case Op::Mul:
    case Op::Div:
    case Op::Mod:
      return eval_arith(n, b);
    case Op::Eq:
    case Op::Ne:
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge: {
      const Arg x = operand(*n.kids[0], b);
      const Arg y = operand(*n.kids[1], b);
      auto c = new_column(Type::Bool, rows);
      compare(n.op, n.kids[0]->type, x, y, rows, c->bools.data());
      return c;
    }
    case Op::And:
    case Op::Or: {
      auto c = new_column(Type::Bool, rows);
      uint8_t* o = c->bools.data();
      const bool is_and = n.op == Op::And;
      std::fill(o, o + rows, is_and ? 1 : 0);
      for (const auto& k : n.kids) {
        const Arg x = operand(*k, b);
        if (x.is_const()) {
          if (x.kbool() != (is_and ? 1 : 0)) std::fill(o, o + rows, is_and ? 0 : 1);
          continue;
        }
        if (is_and)
          for (size_t i = 0; i < rows; ++i) o[i] &= x.bools[i];
        else
          for (size_t i = 0; i < rows; ++i) o[i] |= x.bools[i];
      }
      return c;
    }
    case Op::In:
      return eval_in(n, b);
    case Op::Between:
      return eval_between(n, b);
    case Op::Case:
      return eval_case(n, b);
    case Op::Call:
      return eval_call(n, b);
  }
  return new_column(n.type, rows);
}

void select_node(const ExprNode& n, const Batch& b, const std::vector<uint32_t>* cand,
                 std::vector<uint32_t>& out) {
  const size_t rows = b.rows();
  switch (n.op) {
    case Op::Const:
      if (std::get<bool>(n.value)) select_loop(rows, cand, out, [](size_t) { return true; });
      return;
    case Op::Field: {
      const uint8_t* v = b.column(static_cast<size_t>(n.field)).bools.data();
      select_loop(rows, cand, out, [v](size_t i) { return v[i] != 0; });
      return;
    }
    case Op::And: {
      // Each conjunct tests only the rows that passed the previous ones.
      std::vector<uint32_t> cur;
      std::vector<uint32_t> next;
      select_node(*n.kids[0], b, cand, cur);
      for (size_t k = 1; k < n.kids.size() && !cur.empty(); ++k) {
        next.clear();
        select_node(*n.kids[k], b, &cur, next);
        cur.swap(next);
      }
      out.insert(out.end(), cur.begin(), cur.end());
      return;
    }
    case Op::Eq:
    case Op::Ne:
    case Op::Lt:
    case Op::Le:
    case Op::Gt:
    case Op::Ge:
      if (select_compare(n, b, cand, out)) return;
      break;
    case Op::Between:
      if (select_between(n, b, cand, out)) return;
      break;
    case Op::In:
      if (select_in(n, b, cand, out)) return;
      break;
    default:
      break;
  }
  const ColumnPtr c = eval_node(n, b);
  const uint8_t* v = c->bools.data();
  select_loop(rows, cand, out, [v](size_t i) { return v[i] != 0; });
}

Value fold_constant(const ExprNode& n) {
  Batch one;
  one.event_time = std::vector<EventTime>(1, 0);
  one.seq = std::vector<Seq>(1, 0);
  return eval_node(n, one)->value(0);
}

}  // namespace entente::engine::detail
