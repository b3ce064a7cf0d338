// Tests of the expression language: parsing, type checking, error messages
// and positions, limits, evaluation of every operator and function on every
// type, and agreement of select() with eval().
#include "engine/expr.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <stdexcept>
#include <thread>

#include "engine/hash.h"

// Rows are written with designated initializers naming only the fields a
// test cares about; the rest keep their defaults on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace entente::engine {
namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

SchemaPtr schema() {
  static const SchemaPtr s = make_schema({{"i", Type::Int64},
                                          {"j", Type::Int64},
                                          {"d", Type::Double},
                                          {"e", Type::Double},
                                          {"b", Type::Bool},
                                          {"c", Type::Bool},
                                          {"s", Type::String},
                                          {"u", Type::String},
                                          {"t", Type::Timestamp},
                                          {"auction", Type::String},
                                          {"price", Type::Int64}});
  return s;
}

struct Row {
  int64_t i = 0;
  int64_t j = 0;
  double d = 0;
  double e = 0;
  bool b = false;
  bool c = false;
  std::string s;
  std::string u;
  int64_t t = 0;
  std::string auction;
  int64_t price = 0;
  int64_t time = 0;  // event time
};

Batch make_batch(const std::vector<Row>& rows) {
  BatchBuilder bb(schema());
  for (const Row& r : rows) {
    bb.column(0).ints.push_back(r.i);
    bb.column(1).ints.push_back(r.j);
    bb.column(2).doubles.push_back(r.d);
    bb.column(3).doubles.push_back(r.e);
    bb.column(4).bools.push_back(r.b);
    bb.column(5).bools.push_back(r.c);
    bb.column(6).append_str(r.s);
    bb.column(7).append_str(r.u);
    bb.column(8).ints.push_back(r.t);
    bb.column(9).append_str(r.auction);
    bb.column(10).ints.push_back(r.price);
    bb.event_time().push_back(r.time);
    bb.seq().push_back(bb.seq().size());
  }
  Batch b = bb.finish();
  EXPECT_TRUE(b.validate().ok());
  return b;
}

Expr must(std::string_view text) {
  auto r = Expr::compile(text, *schema());
  if (!r.ok()) throw std::runtime_error(std::string(text) + ": " + r.error().message);
  return std::move(r).value();
}

std::string err(std::string_view text) {
  auto r = Expr::compile(text, *schema());
  if (r.ok()) return "<compiled to " + std::string(type_name(r->type())) + ">";
  return r.error().message;
}

Errc err_code(std::string_view text) {
  auto r = Expr::compile(text, *schema());
  return r.ok() ? Errc::ok : r.error().code;
}

// Evaluates and checks the shape every result must have.
ColumnPtr run(std::string_view text, const Batch& b) {
  const Expr e = must(text);
  ColumnPtr c = e.eval(b);
  EXPECT_EQ(c->type, e.type()) << text;
  EXPECT_EQ(c->size(), b.rows()) << text;
  return c;
}

std::vector<int64_t> ints(std::string_view text, const Batch& b) { return run(text, b)->ints; }
std::vector<double> dbls(std::string_view text, const Batch& b) { return run(text, b)->doubles; }
std::vector<uint8_t> bools(std::string_view text, const Batch& b) { return run(text, b)->bools; }
std::vector<std::string> strs(std::string_view text, const Batch& b) {
  ColumnPtr c = run(text, b);
  std::vector<std::string> out;
  for (size_t i = 0; i < c->size(); ++i) out.emplace_back(c->str(i));
  return out;
}

// Value of an expression on a single default row.
Value one(std::string_view text, const Row& r = Row{}) { return run(text, make_batch({r}))->value(0); }
Type type_of(std::string_view text) { return must(text).type(); }

std::vector<uint32_t> selected(std::string_view text, const Batch& b,
                               const std::vector<uint32_t>* cand = nullptr) {
  std::vector<uint32_t> out;
  must(text).select(b, out, cand);
  return out;
}

// ---- literals, fields, types ----

TEST(ExprLiterals, Numbers) {
  EXPECT_EQ(one("42"), Value(int64_t{42}));
  EXPECT_EQ(type_of("42"), Type::Int64);
  EXPECT_EQ(one("1.5"), Value(1.5));
  EXPECT_EQ(one(".5"), Value(0.5));
  EXPECT_EQ(one("2."), Value(2.0));
  EXPECT_EQ(one("1e3"), Value(1000.0));
  EXPECT_EQ(one("2.5E-1"), Value(0.25));
  EXPECT_EQ(one("1e+2"), Value(100.0));
  EXPECT_EQ(type_of("1e3"), Type::Double);
  EXPECT_EQ(one("9223372036854775807"), Value(kMax));
  EXPECT_EQ(one("-9223372036854775808"), Value(kMin));
  EXPECT_EQ(one("- 9223372036854775808"), Value(kMin));
  EXPECT_EQ(err("9223372036854775808"), "integer literal out of range '9223372036854775808' at 1:1");
  EXPECT_EQ(err("i + 99999999999999999999999"),
            "integer literal out of range '99999999999999999999999' at 1:5");
  EXPECT_EQ(err("1e999"), "number out of range '1e999' at 1:1");
  EXPECT_EQ(err("12abc"), "bad number '12abc' at 1:1");
  EXPECT_EQ(err("1e"), "bad number '1e' at 1:1");
  EXPECT_EQ(err("1.2.3"), "bad number '1.2.3' at 1:1");
}

TEST(ExprLiterals, StringsAndBools) {
  EXPECT_EQ(one("'hello'"), Value(std::string("hello")));
  EXPECT_EQ(one("''"), Value(std::string()));
  EXPECT_EQ(one("'it''s'"), Value(std::string("it's")));
  EXPECT_EQ(one("''''"), Value(std::string("'")));
  EXPECT_EQ(one("'a\nb'"), Value(std::string("a\nb")));
  EXPECT_EQ(one("TRUE"), Value(true));
  EXPECT_EQ(one("false"), Value(false));
  EXPECT_EQ(one("True"), Value(true));
  EXPECT_EQ(type_of("'x'"), Type::String);
  EXPECT_EQ(type_of("tRuE"), Type::Bool);
}

TEST(ExprFields, FieldsQuotedAndTime) {
  const Batch b =
      make_batch({{.i = 7, .s = "x", .t = 100, .time = 5}, {.i = -1, .s = "", .t = 200, .time = 6}});
  EXPECT_EQ(ints("i", b), (std::vector<int64_t>{7, -1}));
  EXPECT_EQ(ints("\"i\"", b), (std::vector<int64_t>{7, -1}));
  EXPECT_EQ(strs("s", b), (std::vector<std::string>{"x", ""}));
  EXPECT_EQ(ints("_time", b), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(type_of("_time"), Type::Timestamp);
  EXPECT_EQ(type_of("t"), Type::Timestamp);
  EXPECT_EQ(ints("t", b), (std::vector<int64_t>{100, 200}));
  EXPECT_EQ(must("i").field_index(), 0);
  EXPECT_EQ(must("\"price\"").field_index(), 10);
  EXPECT_EQ(must("(s)").field_index(), 6);
  EXPECT_EQ(must("_time").field_index(), -1);
  EXPECT_EQ(must("i + 0").field_index(), -1);
  EXPECT_EQ(must("1").field_index(), -1);
  // A bare field hands out the batch's own column.
  EXPECT_EQ(must("i").eval(b).get(), b.columns[0].get());
  EXPECT_EQ(err("\"I\""), "unknown field 'I' at 1:1");
  EXPECT_EQ(err("\"\""), "empty quoted identifier at 1:1");
  EXPECT_EQ(err("\"abc"), "unterminated quoted identifier at 1:1");
  EXPECT_EQ(must("i + 1").text(), "i + 1");
}

TEST(ExprFields, QuotedIdentifierReachesKeywordNamedField) {
  auto s = make_schema({{"end", Type::Int64}, {"_time", Type::Int64}, {"we\"ird", Type::Int64}});
  auto e = Expr::compile("\"end\" + 1", *s);
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(e->type(), Type::Int64);
  EXPECT_FALSE(Expr::compile("end + 1", *s).ok());
  // Bare _time is always the event time; the quoted name reaches the field.
  EXPECT_EQ(Expr::compile("_time", *s)->type(), Type::Timestamp);
  EXPECT_EQ(Expr::compile("\"_time\"", *s)->type(), Type::Int64);
  EXPECT_EQ(Expr::compile("\"we\"\"ird\"", *s)->field_index(), 2);
}

// ---- arithmetic ----

TEST(ExprArith, Int64) {
  const Batch b = make_batch({{.i = 7, .j = 2}, {.i = -7, .j = 2}, {.i = 7, .j = -2}, {.i = 0, .j = 5}});
  EXPECT_EQ(ints("i + j", b), (std::vector<int64_t>{9, -5, 5, 5}));
  EXPECT_EQ(ints("i - j", b), (std::vector<int64_t>{5, -9, 9, -5}));
  EXPECT_EQ(ints("i * j", b), (std::vector<int64_t>{14, -14, -14, 0}));
  EXPECT_EQ(ints("i / j", b), (std::vector<int64_t>{3, -3, -3, 0}));
  EXPECT_EQ(ints("i % j", b), (std::vector<int64_t>{1, -1, 1, 0}));
  EXPECT_EQ(ints("-i", b), (std::vector<int64_t>{-7, 7, -7, 0}));
  EXPECT_EQ(ints("i + 1", b), (std::vector<int64_t>{8, -6, 8, 1}));
  EXPECT_EQ(ints("10 - i", b), (std::vector<int64_t>{3, 17, 3, 10}));
  EXPECT_EQ(ints("100 / i", b), (std::vector<int64_t>{14, -14, 14, 0}));
  EXPECT_EQ(ints("i % 4", b), (std::vector<int64_t>{3, -3, 3, 0}));
  EXPECT_EQ(type_of("i * j"), Type::Int64);
}

TEST(ExprArith, DivisionByZeroAndOverflow) {
  const Batch b =
      make_batch({{.i = kMax, .j = 0}, {.i = kMin, .j = -1}, {.i = kMin, .j = 0}, {.i = 5, .j = -1}});
  EXPECT_EQ(ints("i / j", b), (std::vector<int64_t>{0, kMin, 0, -5}));
  EXPECT_EQ(ints("i % j", b), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(ints("i / 0", b), (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(ints("i / -1", b), (std::vector<int64_t>{-kMax, kMin, kMin, -5}));
  EXPECT_EQ(ints("i + 1", b), (std::vector<int64_t>{kMin, kMin + 1, kMin + 1, 6}));
  EXPECT_EQ(ints("i - 1", b), (std::vector<int64_t>{kMax - 1, kMax, kMax, 4}));
  EXPECT_EQ(ints("i * 2", b), (std::vector<int64_t>{-2, 0, 0, 10}));
  EXPECT_EQ(ints("-i", b), (std::vector<int64_t>{-kMax, kMin, kMin, -5}));
  EXPECT_EQ(one("9223372036854775807 + 1"), Value(kMin));
  EXPECT_EQ(one("-9223372036854775808 / -1"), Value(kMin));
  EXPECT_EQ(one("-9223372036854775808 % -1"), Value(int64_t{0}));
  EXPECT_EQ(one("7 / 0"), Value(int64_t{0}));
  EXPECT_EQ(one("7 % 0"), Value(int64_t{0}));
}

TEST(ExprArith, DoubleAndWidening) {
  const Batch b = make_batch({{.i = 3, .d = 1.5, .e = 0.5}, {.i = -2, .d = -4.0, .e = 0.0}});
  EXPECT_EQ(dbls("d + e", b), (std::vector<double>{2.0, -4.0}));
  EXPECT_EQ(dbls("d - e", b), (std::vector<double>{1.0, -4.0}));
  EXPECT_EQ(dbls("d * e", b), (std::vector<double>{0.75, -0.0}));
  EXPECT_EQ(dbls("d % 1", b), (std::vector<double>{0.5, -0.0}));
  EXPECT_EQ(dbls("i + d", b), (std::vector<double>{4.5, -6.0}));
  EXPECT_EQ(dbls("i * 0.5", b), (std::vector<double>{1.5, -1.0}));
  EXPECT_EQ(dbls("-d", b), (std::vector<double>{-1.5, 4.0}));
  EXPECT_EQ(type_of("i + d"), Type::Double);
  EXPECT_EQ(type_of("1 + 1.0"), Type::Double);
  const auto q = dbls("d / e", b);
  EXPECT_EQ(q[0], 3.0);
  EXPECT_TRUE(std::isinf(q[1]) && q[1] < 0);
  EXPECT_TRUE(std::isnan(std::get<double>(one("0.0 / 0"))));
  EXPECT_TRUE(std::isnan(std::get<double>(one("1.0 % 0"))));
  EXPECT_EQ(one("1 / 2"), Value(int64_t{0}));
  EXPECT_EQ(one("1 / 2.0"), Value(0.5));
}

TEST(ExprArith, Timestamps) {
  const Batch b = make_batch({{.i = 10, .t = 1000, .time = 400}, {.i = -5, .t = 0, .time = 1}});
  EXPECT_EQ(type_of("t + 5"), Type::Timestamp);
  EXPECT_EQ(type_of("5 + t"), Type::Timestamp);
  EXPECT_EQ(type_of("t - i"), Type::Timestamp);
  EXPECT_EQ(type_of("t - _time"), Type::Int64);
  EXPECT_EQ(ints("t + i", b), (std::vector<int64_t>{1010, -5}));
  EXPECT_EQ(ints("i + t", b), (std::vector<int64_t>{1010, -5}));
  EXPECT_EQ(ints("t - i", b), (std::vector<int64_t>{990, 5}));
  EXPECT_EQ(ints("t - _time", b), (std::vector<int64_t>{600, -1}));
  EXPECT_EQ(ints("_time - 1", b), (std::vector<int64_t>{399, 0}));
  EXPECT_EQ(err("t + t"), "cannot apply '+' to timestamp and timestamp at 1:3");
  EXPECT_EQ(err("i - t"), "cannot apply '-' to int64 and timestamp at 1:3");
  EXPECT_EQ(err("t * 2"), "cannot apply '*' to timestamp and int64 at 1:3");
  EXPECT_EQ(err("t + 1.5"), "cannot apply '+' to timestamp and double at 1:3");
  EXPECT_EQ(err("-t"), "cannot negate timestamp at 1:1");
}

TEST(ExprArith, TypeErrors) {
  EXPECT_EQ(err("s + u"), "cannot apply '+' to string and string (use concat) at 1:3");
  EXPECT_EQ(err("s * 2"), "cannot apply '*' to string and int64 at 1:3");
  EXPECT_EQ(err("b + 1"), "cannot apply '+' to bool and int64 at 1:3");
  EXPECT_EQ(err("-s"), "cannot negate string at 1:1");
  EXPECT_EQ(err("-b"), "cannot negate bool at 1:1");
  EXPECT_EQ(err_code("s + u"), Errc::type_error);
}

TEST(ExprArith, Precedence) {
  EXPECT_EQ(one("1 + 2 * 3"), Value(int64_t{7}));
  EXPECT_EQ(one("(1 + 2) * 3"), Value(int64_t{9}));
  EXPECT_EQ(one("10 - 4 - 3"), Value(int64_t{3}));
  EXPECT_EQ(one("100 / 10 / 5"), Value(int64_t{2}));
  EXPECT_EQ(one("-2 * 3"), Value(int64_t{-6}));
  EXPECT_EQ(one("- - 2"), Value(int64_t{2}));
  EXPECT_EQ(one("2 * -3"), Value(int64_t{-6}));
  EXPECT_EQ(one("7 % 4 * 2"), Value(int64_t{6}));
  EXPECT_EQ(one("1 + 2 > 2 AND NOT 1 = 2 OR FALSE"), Value(true));
  EXPECT_EQ(one("NOT TRUE AND FALSE"), Value(false));  // (NOT TRUE) AND FALSE
  EXPECT_EQ(one("NOT FALSE OR TRUE"), Value(true));
  EXPECT_EQ(one("TRUE OR TRUE AND FALSE"), Value(true));  // AND binds tighter
  EXPECT_EQ(one("NOT 1 > 2"), Value(true));
  EXPECT_EQ(one("1 < 2 = TRUE"), Value(true));
}

// ---- comparisons ----

TEST(ExprCompare, EveryTypeAndShape) {
  const Batch b =
      make_batch({{.i = 1, .j = 2, .d = 1.0, .e = 2.5, .b = true, .c = false, .s = "a", .u = "b", .t = 5},
                  {.i = 2, .j = 2, .d = 2.0, .e = 2.0, .b = false, .c = false, .s = "b", .u = "b", .t = 9},
                  {.i = 3, .j = 2, .d = 3.5, .e = 2.0, .b = true, .c = true, .s = "", .u = "a", .t = 1}});
  using B = std::vector<uint8_t>;
  EXPECT_EQ(bools("i = j", b), (B{0, 1, 0}));
  EXPECT_EQ(bools("i != j", b), (B{1, 0, 1}));
  EXPECT_EQ(bools("i <> j", b), (B{1, 0, 1}));
  EXPECT_EQ(bools("i < j", b), (B{1, 0, 0}));
  EXPECT_EQ(bools("i <= j", b), (B{1, 1, 0}));
  EXPECT_EQ(bools("i > j", b), (B{0, 0, 1}));
  EXPECT_EQ(bools("i >= j", b), (B{0, 1, 1}));
  EXPECT_EQ(bools("i > 1", b), (B{0, 1, 1}));
  EXPECT_EQ(bools("1 < i", b), (B{0, 1, 1}));
  EXPECT_EQ(bools("2 >= i", b), (B{1, 1, 0}));
  EXPECT_EQ(bools("d < e", b), (B{1, 0, 0}));
  EXPECT_EQ(bools("d = 2", b), (B{0, 1, 0}));
  EXPECT_EQ(bools("i < 1.5", b), (B{1, 0, 0}));
  EXPECT_EQ(bools("i >= d", b), (B{1, 1, 0}));
  EXPECT_EQ(bools("s < u", b), (B{1, 0, 1}));
  EXPECT_EQ(bools("s = 'b'", b), (B{0, 1, 0}));
  EXPECT_EQ(bools("'b' > s", b), (B{1, 0, 1}));
  EXPECT_EQ(bools("s = ''", b), (B{0, 0, 1}));
  EXPECT_EQ(bools("s >= ''", b), (B{1, 1, 1}));
  EXPECT_EQ(bools("b = c", b), (B{0, 1, 1}));
  EXPECT_EQ(bools("b > c", b), (B{1, 0, 0}));
  EXPECT_EQ(bools("b = TRUE", b), (B{1, 0, 1}));
  EXPECT_EQ(bools("t > 4", b), (B{1, 1, 0}));
  EXPECT_EQ(bools("t = _time + 5", b), (B{1, 0, 0}));
  EXPECT_EQ(bools("t < i", b), (B{0, 0, 1}));
  EXPECT_EQ(bools("_time = 0", b), (B{1, 1, 1}));
  // Strings compare bytewise, as unsigned bytes.
  EXPECT_EQ(one("'B' < 'a'"), Value(true));
  EXPECT_EQ(one("'\xc3\xa9' > 'z'"), Value(true));
  EXPECT_EQ(one("'ab' < 'abc'"), Value(true));
  EXPECT_EQ(one("'' < 'a'"), Value(true));
  EXPECT_EQ(bools("s > 'z'", make_batch({{.s = "\xc3\xa9"}, {.s = "y"}})), (B{1, 0}));
  EXPECT_EQ(bools("s IN ('\xc3\xa9', 'z', 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h')",
                  make_batch({{.s = "\xc3\xa9"}, {.s = "y"}})),
            (B{1, 0}));
}

TEST(ExprCompare, ExtremesAndNaN) {
  const Batch b = make_batch({{.i = kMin, .j = kMax, .d = NAN}, {.i = kMax, .j = kMin, .d = -0.0}});
  using B = std::vector<uint8_t>;
  EXPECT_EQ(bools("i < j", b), (B{1, 0}));
  EXPECT_EQ(bools("i = -9223372036854775808", b), (B{1, 0}));
  EXPECT_EQ(bools("d = d", b), (B{0, 1}));
  EXPECT_EQ(bools("d != d", b), (B{1, 0}));
  EXPECT_EQ(bools("d = 0", b), (B{0, 1}));
  EXPECT_EQ(bools("d < 1 OR d >= 1", b), (B{0, 1}));
}

TEST(ExprCompare, TypeErrors) {
  EXPECT_EQ(err("auction > 5"), "cannot compare string with int64 at 1:9");
  EXPECT_EQ(err("5 = s"), "cannot compare int64 with string at 1:3");
  EXPECT_EQ(err("b < 1"), "cannot compare bool with int64 at 1:3");
  EXPECT_EQ(err("t = 1.5"), "cannot compare timestamp with double at 1:3");
  EXPECT_EQ(err("s <> TRUE"), "cannot compare string with bool at 1:3");
  EXPECT_EQ(err("i < 2 < 3"), "cannot compare bool with int64 at 1:7");
  EXPECT_EQ(err_code("auction > 5"), Errc::type_error);
}

// ---- boolean logic ----

TEST(ExprLogic, AndOrNot) {
  const Batch b = make_batch(
      {{.b = false, .c = false}, {.b = false, .c = true}, {.b = true, .c = false}, {.b = true, .c = true}});
  using B = std::vector<uint8_t>;
  EXPECT_EQ(bools("b AND c", b), (B{0, 0, 0, 1}));
  EXPECT_EQ(bools("b OR c", b), (B{0, 1, 1, 1}));
  EXPECT_EQ(bools("NOT b", b), (B{1, 1, 0, 0}));
  EXPECT_EQ(bools("not b and c", b), (B{0, 1, 0, 0}));
  EXPECT_EQ(bools("b AND TRUE", b), (B{0, 0, 1, 1}));
  EXPECT_EQ(bools("b AND FALSE", b), (B{0, 0, 0, 0}));
  EXPECT_EQ(bools("b OR TRUE", b), (B{1, 1, 1, 1}));
  EXPECT_EQ(bools("FALSE OR c", b), (B{0, 1, 0, 1}));
  EXPECT_EQ(bools("b AND c AND b AND (c AND b)", b), (B{0, 0, 0, 1}));
  EXPECT_EQ(bools("b OR c OR FALSE OR (b OR c)", b), (B{0, 1, 1, 1}));
  EXPECT_EQ(bools("NOT NOT b", b), (B{0, 0, 1, 1}));
  EXPECT_EQ(err("i AND b"), "AND needs bool operands, got int64 at 1:3");
  EXPECT_EQ(err("b OR 's'"), "OR needs bool operands, got string at 1:3");
  EXPECT_EQ(err("NOT i"), "NOT needs a bool operand, got int64 at 1:1");
}

// ---- IN and BETWEEN ----

TEST(ExprIn, ConstantLists) {
  const Batch b = make_batch({{.i = 1, .d = 1.0, .b = true, .s = "x", .t = 10},
                              {.i = 5, .d = 2.5, .b = false, .s = "", .t = 20},
                              {.i = kMin, .d = NAN, .b = true, .s = "yy", .t = 30}});
  using B = std::vector<uint8_t>;
  EXPECT_EQ(bools("i IN (1, 2, 3)", b), (B{1, 0, 0}));
  EXPECT_EQ(bools("i NOT IN (1, 2, 3)", b), (B{0, 1, 1}));
  EXPECT_EQ(bools("i IN (5, -9223372036854775808, 5)", b), (B{0, 1, 1}));
  EXPECT_EQ(bools("i in (1)", b), (B{1, 0, 0}));
  EXPECT_EQ(bools("i IN (1.0, 5.5)", b), (B{1, 0, 0}));
  EXPECT_EQ(bools("d IN (1, 2.5)", b), (B{1, 1, 0}));
  EXPECT_EQ(bools("d IN (0.0 / 0, 1)", b), (B{1, 0, 0}));  // NaN matches nothing
  EXPECT_EQ(bools("d NOT IN (0.0 / 0)", b), (B{1, 1, 1}));
  EXPECT_EQ(bools("s IN ('x', '')", b), (B{1, 1, 0}));
  EXPECT_EQ(bools("s NOT IN ('yy')", b), (B{1, 1, 0}));
  EXPECT_EQ(bools("b IN (FALSE)", b), (B{0, 1, 0}));
  EXPECT_EQ(bools("b IN (TRUE, FALSE)", b), (B{1, 1, 1}));
  EXPECT_EQ(bools("t IN (20, 30)", b), (B{0, 1, 1}));
  EXPECT_EQ(bools("_time IN (0)", b), (B{1, 1, 1}));
  EXPECT_EQ(bools("i + 1 IN (2, 6)", b), (B{1, 1, 0}));
  EXPECT_EQ(one("3 IN (1, 2, 3)"), Value(true));
  EXPECT_EQ(one("'a' NOT IN ('a')"), Value(false));
  // Long lists take the binary-search path.
  std::string list = "i IN (";
  for (int k = 100; k < 140; ++k) list += std::to_string(k) + ", ";
  list += "5)";
  EXPECT_EQ(bools(list, b), (B{0, 1, 0}));
  std::string slist = "s IN (";
  for (int k = 0; k < 40; ++k) {
    slist += "'s";
    slist += std::to_string(k);
    slist += "', ";
  }
  slist += "'yy')";
  EXPECT_EQ(bools(slist, b), (B{0, 0, 1}));
  std::string dlist = "d IN (";
  for (int k = 0; k < 40; ++k) dlist += std::to_string(k) + ".25, ";
  dlist += "2.5)";
  EXPECT_EQ(bools(dlist, b), (B{0, 1, 0}));
}

TEST(ExprIn, NonConstantItemsAndErrors) {
  const Batch b = make_batch({{.i = 1, .j = 1, .s = "a", .u = "a"}, {.i = 2, .j = 3, .s = "b", .u = "c"}});
  using B = std::vector<uint8_t>;
  EXPECT_EQ(bools("i IN (j, 7)", b), (B{1, 0}));
  EXPECT_EQ(bools("i NOT IN (j, 2)", b), (B{0, 0}));
  EXPECT_EQ(bools("j IN (i + 1, i * 2)", b), (B{0, 1}));
  EXPECT_EQ(bools("s IN (u, 'b')", b), (B{1, 1}));
  EXPECT_EQ(bools("i IN (j, 2.0)", b), (B{1, 1}));
  EXPECT_EQ(err("i IN (1, 'a')"), "cannot compare int64 with string at 1:10");
  EXPECT_EQ(err("s IN ('a', 2)"), "cannot compare string with int64 at 1:12");
  EXPECT_EQ(err("i IN 1"), "expected '(' at 1:6");
  EXPECT_EQ(err("i IN ()"), "unexpected ')' at 1:7");
  EXPECT_EQ(err("i IN (1, 2"), "expected ')' at 1:11");
  EXPECT_EQ(err("i NOT 5"), "trailing input 'NOT 5' at 1:3");
}

TEST(ExprBetween, AllTypes) {
  const Batch b = make_batch({{.i = 1, .d = 0.5, .s = "b", .t = 100},
                              {.i = 5, .d = 5.0, .s = "z", .t = 200},
                              {.i = 10, .d = 10.5, .s = "", .t = 300}});
  using B = std::vector<uint8_t>;
  EXPECT_EQ(bools("i BETWEEN 1 AND 5", b), (B{1, 1, 0}));
  EXPECT_EQ(bools("i NOT BETWEEN 1 AND 5", b), (B{0, 0, 1}));
  EXPECT_EQ(bools("i BETWEEN 5 AND 1", b), (B{0, 0, 0}));
  EXPECT_EQ(bools("d BETWEEN 0.5 AND 5", b), (B{1, 1, 0}));
  EXPECT_EQ(bools("i BETWEEN 0.5 AND 5.5", b), (B{1, 1, 0}));
  EXPECT_EQ(bools("s BETWEEN 'a' AND 'c'", b), (B{1, 0, 0}));
  EXPECT_EQ(bools("s NOT BETWEEN '' AND 'c'", b), (B{0, 1, 0}));
  EXPECT_EQ(bools("t BETWEEN 150 AND 300", b), (B{0, 1, 1}));
  EXPECT_EQ(bools("i BETWEEN i - 1 AND i + 1", b), (B{1, 1, 1}));
  EXPECT_EQ(bools("i + 1 BETWEEN 2 AND 6 AND d > 1", b), (B{0, 1, 0}));
  EXPECT_EQ(bools("i BETWEEN 1 + 1 AND 2 * 5", b), (B{0, 1, 1}));
  EXPECT_EQ(err("s BETWEEN 1 AND 2"), "cannot compare string with int64 at 1:3");
  EXPECT_EQ(err("i BETWEEN 1 AND 's'"), "cannot compare int64 with string at 1:3");
  EXPECT_EQ(err("i BETWEEN 1 OR 2"), "expected AND at 1:13");
}

// ---- CASE ----

TEST(ExprCase, Branches) {
  const Batch b =
      make_batch({{.i = 1, .d = 0.5, .s = "a"}, {.i = 5, .d = 1.5, .s = "b"}, {.i = 10, .s = ""}});
  EXPECT_EQ(ints("CASE WHEN i < 3 THEN 1 WHEN i < 7 THEN 2 ELSE 3 END", b), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(ints("case when i > 0 then i when i > 3 then 100 end", b), (std::vector<int64_t>{1, 5, 10}));
  EXPECT_EQ(ints("CASE WHEN i > 3 THEN i * 2 END", b), (std::vector<int64_t>{0, 10, 20}));  // no ELSE: zero
  EXPECT_EQ(dbls("CASE WHEN i = 1 THEN d ELSE 7 END", b), (std::vector<double>{0.5, 7, 7}));
  EXPECT_EQ(type_of("CASE WHEN b THEN 1 ELSE 2.5 END"), Type::Double);
  EXPECT_EQ(strs("CASE WHEN s = '' THEN 'empty' WHEN i = 5 THEN s ELSE concat(s, '!') END", b),
            (std::vector<std::string>{"a!", "b", "empty"}));
  EXPECT_EQ(strs("CASE WHEN i > 100 THEN 'x' END", b), (std::vector<std::string>{"", "", ""}));
  EXPECT_EQ(bools("CASE WHEN i > 3 THEN TRUE END", b), (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(ints("CASE WHEN TRUE THEN i ELSE 0 END", b), (std::vector<int64_t>{1, 5, 10}));
  EXPECT_EQ(ints("CASE WHEN FALSE THEN i ELSE -1 END", b), (std::vector<int64_t>{-1, -1, -1}));
  EXPECT_EQ(type_of("CASE WHEN b THEN t ELSE _time END"), Type::Timestamp);
  EXPECT_EQ(one("CASE WHEN 1 > 2 THEN 'a' ELSE 'b' END"), Value(std::string("b")));
  EXPECT_EQ(err("CASE WHEN i THEN 1 END"), "CASE condition must be bool, got int64 at 1:11");
  EXPECT_EQ(err("CASE WHEN b THEN 1 ELSE 'x' END"),
            "CASE branches have different types: int64 and string at 1:25");
  EXPECT_EQ(err("CASE WHEN b THEN t ELSE 5 END"),
            "CASE branches have different types: timestamp and int64 at 1:25");
  EXPECT_EQ(err("CASE b THEN 1 END"), "expected WHEN at 1:6");
  EXPECT_EQ(err("CASE WHEN b 1 END"), "expected THEN at 1:13");
  EXPECT_EQ(err("CASE WHEN b THEN 1"), "expected END at 1:19");
  EXPECT_EQ(err("CASE WHEN b THEN 1 ELSE 2 WHEN c THEN 3 END"), "expected END at 1:27");
}

// ---- functions ----

TEST(ExprFunctions, Numeric) {
  const Batch b = make_batch({{.i = -5, .j = 3, .d = -2.5, .e = 9},
                              {.i = kMin, .j = kMax, .d = 2.5, .e = 2},
                              {.i = 0, .j = 0, .d = 0.4, .e = -1}});
  EXPECT_EQ(ints("abs(i)", b), (std::vector<int64_t>{5, kMin, 0}));  // abs(INT64_MIN) wraps
  EXPECT_EQ(dbls("ABS(d)", b), (std::vector<double>{2.5, 2.5, 0.4}));
  EXPECT_EQ(dbls("floor(d)", b), (std::vector<double>{-3, 2, 0}));
  EXPECT_EQ(dbls("ceil(d)", b), (std::vector<double>{-2, 3, 1}));
  EXPECT_EQ(dbls("round(d)", b), (std::vector<double>{-3, 3, 0}));  // half away from zero
  EXPECT_EQ(ints("floor(i)", b), (std::vector<int64_t>{-5, kMin, 0}));
  EXPECT_EQ(ints("ceil(i)", b), (std::vector<int64_t>{-5, kMin, 0}));
  EXPECT_EQ(ints("round(i)", b), (std::vector<int64_t>{-5, kMin, 0}));
  EXPECT_EQ(type_of("round(i)"), Type::Int64);
  const auto r = dbls("sqrt(e)", b);
  EXPECT_EQ(r[0], 3.0);
  EXPECT_DOUBLE_EQ(r[1], std::sqrt(2.0));
  EXPECT_TRUE(std::isnan(r[2]));
  EXPECT_EQ(dbls("sqrt(j)", b)[0], std::sqrt(3.0));
  EXPECT_EQ(ints("min(i, j)", b), (std::vector<int64_t>{-5, kMin, 0}));
  EXPECT_EQ(ints("max(i, j, 1)", b), (std::vector<int64_t>{3, kMax, 1}));
  EXPECT_EQ(dbls("max(i, d)", b), (std::vector<double>{-2.5, 2.5, 0.4}));
  EXPECT_EQ(dbls("min(d, e, 0)", b), (std::vector<double>{-2.5, 0, -1}));
  EXPECT_EQ(one("min(3, 1, 2)"), Value(int64_t{1}));
  EXPECT_EQ(one("max(TRUE, FALSE)"), Value(true));
  EXPECT_EQ(one("min(TRUE, FALSE)"), Value(false));
  EXPECT_EQ(one("abs(-3)"), Value(int64_t{3}));
  EXPECT_EQ(one("sqrt(16)"), Value(4.0));
  EXPECT_EQ(err("abs(s)"), "function 'abs' argument 1 must be numeric, got string at 1:5");
  EXPECT_EQ(err("floor(t)"), "function 'floor' argument 1 must be numeric, got timestamp at 1:7");
  EXPECT_EQ(err("sqrt(b)"), "function 'sqrt' argument 1 must be numeric, got bool at 1:6");
  EXPECT_EQ(err("min(i, s)"), "function 'min' arguments must have one type: int64 and string at 1:8");
  EXPECT_EQ(err("max(t, 1)"), "function 'max' arguments must have one type: timestamp and int64 at 1:8");
  EXPECT_EQ(err("min(i)"), "function 'min' takes at least 2 arguments, got 1 at 1:1");
}

TEST(ExprFunctions, Conversions) {
  const Batch b = make_batch({{.i = 7, .d = 2.9, .b = true, .s = "42", .t = 1000},
                              {.i = kMin, .d = -2.9, .b = false, .s = " -1.5e1 ", .t = -1},
                              {.i = 0, .d = NAN, .s = "abc", .t = 0},
                              {.i = 1, .d = 1e300, .s = "99999999999999999999", .t = 0},
                              {.i = 1, .d = -1e300, .s = "", .t = 0}});
  EXPECT_EQ(dbls("to_double(i)", b), (std::vector<double>{7, -9223372036854775808.0, 0, 1, 1}));
  EXPECT_EQ(dbls("to_double(b)", b), (std::vector<double>{1, 0, 0, 0, 0}));
  EXPECT_EQ(dbls("to_double(t)", b), (std::vector<double>{1000, -1, 0, 0, 0}));
  EXPECT_EQ(dbls("to_double(s)", b), (std::vector<double>{42, -15, 0, 1e20, 0}));
  EXPECT_EQ(dbls("to_double(d)", b)[0], 2.9);
  EXPECT_EQ(ints("to_int(d)", b), (std::vector<int64_t>{2, -2, 0, kMax, kMin}));
  EXPECT_EQ(ints("to_int(b)", b), (std::vector<int64_t>{1, 0, 0, 0, 0}));
  EXPECT_EQ(ints("to_int(t)", b), (std::vector<int64_t>{1000, -1, 0, 0, 0}));
  EXPECT_EQ(ints("to_int(s)", b), (std::vector<int64_t>{42, -15, 0, kMax, 0}));
  EXPECT_EQ(ints("to_int(i)", b), (std::vector<int64_t>{7, kMin, 0, 1, 1}));
  EXPECT_EQ(one("to_int('-9223372036854775808')"), Value(kMin));
  EXPECT_EQ(one("to_int('+12')"), Value(int64_t{12}));
  EXPECT_EQ(one("to_double('1.25')"), Value(1.25));
  EXPECT_EQ(type_of("to_double(i)"), Type::Double);
  EXPECT_EQ(type_of("to_int(t)"), Type::Int64);
}

TEST(ExprFunctions, Strings) {
  const Batch b = make_batch({{.i = 2, .s = "Hello", .u = "lo"},
                              {.i = 0, .s = "", .u = ""},
                              {.i = 10, .s = "ABC-xyz 9", .u = "ABC"}});
  using S = std::vector<std::string>;
  EXPECT_EQ(strs("lower(s)", b), (S{"hello", "", "abc-xyz 9"}));
  EXPECT_EQ(strs("UPPER(s)", b), (S{"HELLO", "", "ABC-XYZ 9"}));
  EXPECT_EQ(ints("length(s)", b), (std::vector<int64_t>{5, 0, 9}));
  EXPECT_EQ(one("length('h\xc3\xa9')"), Value(int64_t{3}));               // bytes
  EXPECT_EQ(one("upper('h\xc3\xa9')"), Value(std::string("H\xc3\xa9")));  // ASCII only
  EXPECT_EQ(strs("concat(s)", b), (S{"Hello", "", "ABC-xyz 9"}));
  EXPECT_EQ(strs("concat(s, '-', u, '')", b), (S{"Hello-lo", "-", "ABC-xyz 9-ABC"}));
  EXPECT_EQ(strs("concat('<', s, '>')", b), (S{"<Hello>", "<>", "<ABC-xyz 9>"}));
  EXPECT_EQ(one("concat('a', 'b', 'c')"), Value(std::string("abc")));
  EXPECT_EQ(strs("substr(s, 2, 3)", b), (S{"ell", "", "BC-"}));
  EXPECT_EQ(strs("substr(s, 2)", b), (S{"ello", "", "BC-xyz 9"}));
  EXPECT_EQ(strs("substr(s, i, 2)", b), (S{"el", "", ""}));
  EXPECT_EQ(strs("substr(s, 0, 2)", b), (S{"H", "", "A"}));  // positions before 1 count but yield nothing
  EXPECT_EQ(strs("substr(s, -5, 100)", b), (S{"Hello", "", "ABC-xyz 9"}));
  EXPECT_EQ(strs("substr(s, 1, -1)", b), (S{"", "", ""}));
  EXPECT_EQ(strs("substr(s, 9223372036854775807, 9223372036854775807)", b), (S{"", "", ""}));
  EXPECT_EQ(strs("substr(s, -9223372036854775808, 9223372036854775807)", b), (S{"", "", ""}));
  EXPECT_EQ(strs("substr(s, 5, 9223372036854775807)", b), (S{"o", "", "xyz 9"}));
  EXPECT_EQ(bools("starts_with(s, 'He')", b), (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(bools("starts_with(s, u)", b), (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(bools("ends_with(s, u)", b), (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(bools("ends_with(s, '')", b), (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_EQ(bools("contains(s, 'l')", b), (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(bools("contains(s, u)", b), (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_EQ(bools("contains('xxHelloxx', s)", b), (std::vector<uint8_t>{1, 1, 0}));
  EXPECT_EQ(err("lower(i)"), "function 'lower' argument 1 must be string, got int64 at 1:7");
  EXPECT_EQ(err("length(b)"), "function 'length' argument 1 must be string, got bool at 1:8");
  EXPECT_EQ(err("concat(s, 1)"), "function 'concat' argument 2 must be string, got int64 at 1:11");
  EXPECT_EQ(err("substr(s, 1.5)"), "function 'substr' argument 2 must be int64, got double at 1:11");
  EXPECT_EQ(err("substr(s)"), "function 'substr' takes 2 or 3 arguments, got 1 at 1:1");
  EXPECT_EQ(err("contains(s, 1)"), "function 'contains' argument 2 must be string, got int64 at 1:13");
  EXPECT_EQ(err("concat()"), "function 'concat' takes at least 1 argument, got 0 at 1:1");
  EXPECT_EQ(err("starts_with(s)"), "function 'starts_with' takes 2 arguments, got 1 at 1:1");
}

TEST(ExprFunctions, HashMatchesEngineKeyHash) {
  const Batch b = make_batch({{.i = 1, .d = -0.0, .b = true, .s = "abc", .t = 5},
                              {.i = kMin, .d = 3.5, .b = false, .s = "", .t = -5}});
  const auto h = ints("hash(i)", b);
  for (size_t r = 0; r < b.rows(); ++r) EXPECT_EQ(static_cast<uint64_t>(h[r]), hash_value(b.column(0), r));
  const auto hs = ints("hash(s)", b);
  for (size_t r = 0; r < b.rows(); ++r) EXPECT_EQ(static_cast<uint64_t>(hs[r]), hash_value(b.column(6), r));
  const auto hm = ints("HASH(i, s, d, b, t)", b);
  std::vector<uint64_t> want;
  const size_t keys[] = {0, 6, 2, 4, 8};
  hash_rows(b, keys, want);
  for (size_t r = 0; r < b.rows(); ++r) EXPECT_EQ(static_cast<uint64_t>(hm[r]), want[r]);
  EXPECT_EQ(one("hash(0.0)"), one("hash(-0.0)"));
  EXPECT_EQ(one("hash('abc')"), Value(static_cast<int64_t>(hash_bytes("abc"))));
  EXPECT_EQ(one("hash(i, 'x')", Row{.i = 3}),
            Value(static_cast<int64_t>(hash_combine(hash_int(3), hash_bytes("x")))));
  EXPECT_EQ(type_of("hash(b)"), Type::Int64);
  // The documented key-group formula.
  const auto g = ints("(hash(i) % 128 + 128) % 128", b);
  for (size_t r = 0; r < b.rows(); ++r)
    EXPECT_EQ(static_cast<uint32_t>(g[r]), key_group_of(hash_value(b.column(0), r)));
}

TEST(ExprFunctions, CoalesceIsItsFirstArgument) {
  const Batch b = make_batch({{.i = 3, .j = 4, .s = "a"}, {.i = -1, .j = 5, .s = ""}});
  EXPECT_EQ(ints("coalesce(i, j)", b), (std::vector<int64_t>{3, -1}));
  EXPECT_EQ(ints("coalesce(i)", b), (std::vector<int64_t>{3, -1}));
  EXPECT_EQ(dbls("coalesce(i, 2.5)", b), (std::vector<double>{3, -1}));
  EXPECT_EQ(strs("coalesce(s, 'x')", b), (std::vector<std::string>{"a", ""}));
  EXPECT_EQ(err("coalesce(i, s)"),
            "function 'coalesce' arguments must have one type: int64 and string at 1:13");
}

TEST(ExprFunctions, NamesAndArity) {
  EXPECT_EQ(err("foo(i)"), "unknown function 'foo' at 1:1");
  EXPECT_EQ(err_code("foo(i)"), Errc::not_found);
  EXPECT_EQ(err("abs(i, 2)"), "function 'abs' takes 1 argument, got 2 at 1:1");
  EXPECT_EQ(err("abs()"), "function 'abs' takes 1 argument, got 0 at 1:1");
  EXPECT_EQ(err("i + Abs(i, j, 1)"), "function 'abs' takes 1 argument, got 3 at 1:5");
  EXPECT_EQ(err("\"abs\"(i)"), "unknown field 'abs' at 1:1");
  EXPECT_EQ(type_of("LoWeR(s)"), Type::String);
}

// ---- errors: shapes and positions ----

TEST(ExprErrors, DocumentedShapes) {
  EXPECT_EQ(err("prise > 100"), "unknown field 'prise' at 1:1");
  EXPECT_EQ(err_code("prise > 100"), Errc::not_found);
  EXPECT_EQ(err("auction > 5"), "cannot compare string with int64 at 1:9");
  EXPECT_EQ(err("abs(i + 1000 2)"), "expected ')' at 1:14");
  EXPECT_EQ(err("foo(1)"), "unknown function 'foo' at 1:1");
  EXPECT_EQ(err("abs(i, 2)"), "function 'abs' takes 1 argument, got 2 at 1:1");
  EXPECT_EQ(err("s = 'abc"), "unterminated string at 1:5");
  EXPECT_EQ(err("i > 100 AND i + 1 >"), "unexpected end of input at 1:20");
  EXPECT_EQ(err("i + 10 xyz"), "trailing input 'xyz' at 1:8");
  EXPECT_EQ(err_code("i + 10 xyz"), Errc::parse_error);
}

TEST(ExprErrors, SyntaxAndPositions) {
  EXPECT_EQ(err(""), "unexpected end of input at 1:1");
  EXPECT_EQ(err("   "), "unexpected end of input at 1:4");
  EXPECT_EQ(err("i > 1 AND\n  prise = 2"), "unknown field 'prise' at 2:3");
  EXPECT_EQ(err("i > 1 AND\n\n s = 'x\nyz"), "unterminated string at 3:6");
  EXPECT_EQ(err("'a\nb' = 1"), "cannot compare string with int64 at 2:4");
  EXPECT_EQ(err("(i + 1"), "expected ')' at 1:7");
  EXPECT_EQ(err("i + )"), "unexpected ')' at 1:5");
  EXPECT_EQ(err("i # 2"), "unexpected character '#' at 1:3");
  EXPECT_EQ(err("i ! 2"), "unexpected character '!' at 1:3");
  EXPECT_EQ(err("i > 1 AND AND"), "unexpected 'AND' at 1:11");
  EXPECT_EQ(err("i = THEN"), "unexpected 'THEN' at 1:5");
  EXPECT_EQ(err("i\x01"), "unexpected character '\\x01' at 1:2");
  EXPECT_EQ(err("i + 1 )"), "trailing input ')' at 1:7");
  EXPECT_EQ(err("i + 1 'abc"), "unterminated string at 1:7");
  EXPECT_EQ(err("i i i i i i i i i i i i i i i i i i i i i i"),
            "trailing input 'i i i i i i i i i i i i i i i i ...' at 1:3");
  EXPECT_EQ(err("abs(i,)"), "unexpected ')' at 1:7");
  EXPECT_EQ(err("\ti\t+\t"), "unexpected end of input at 1:6");
}

// ---- limits ----

TEST(ExprLimits, TextLength) {
  std::string big(64 * 1024 - 1, ' ');
  big += "1";
  EXPECT_EQ(one(big), Value(int64_t{1}));
  big += " ";
  EXPECT_EQ(err(big), "expression too long: 65537 bytes (limit 65536)");
  EXPECT_EQ(err_code(big), Errc::limit_exceeded);
}

TEST(ExprLimits, Nesting) {
  auto parens = [](int n) { return std::string(n, '(') + "i" + std::string(n, ')'); };
  EXPECT_EQ(must(parens(200)).field_index(), 0);
  const std::string deep = parens(5000);
  const std::string e = err(deep);
  EXPECT_EQ(e.rfind("expression nested too deeply (more than 256 levels) at 1:", 0), 0u) << e;
  EXPECT_EQ(err_code(deep), Errc::limit_exceeded);
  std::string minus(30000, '-');
  EXPECT_EQ(err_code(minus + "1"), Errc::limit_exceeded);
  std::string nots;
  for (int k = 0; k < 10000; ++k) nots += "NOT ";
  EXPECT_EQ(err_code(nots + "b"), Errc::limit_exceeded);
  std::string calls;
  for (int k = 0; k < 3000; ++k) calls += "abs(";
  EXPECT_EQ(err_code(calls + "i" + std::string(3000, ')')), Errc::limit_exceeded);
  // Operator chains do not nest the parser but do deepen the tree.
  std::string chain = "i";
  for (int k = 0; k < 1000; ++k) chain += " + i";
  EXPECT_EQ(ints(chain, make_batch({{.i = 2}})), (std::vector<int64_t>{2002}));
  std::string long_chain = "i";
  for (int k = 0; k < 2000; ++k) long_chain += " + i";
  EXPECT_EQ(err(long_chain).rfind("expression too deep (more than 1024 levels) at 1:", 0), 0u)
      << err(long_chain);
  // AND/OR chains are flattened and may be long.
  std::string conj = "b";
  for (int k = 0; k < 3000; ++k) {
    conj += " AND i > ";
    conj += std::to_string(k % 7);
  }
  EXPECT_EQ(bools(conj, make_batch({{.i = 9, .b = true}, {.i = 3, .b = true}})),
            (std::vector<uint8_t>{1, 0}));
  // A literal-only chain folds as it goes.
  std::string lit = "1";
  for (int k = 0; k < 3000; ++k) lit += " + 1";
  EXPECT_EQ(one(lit), Value(int64_t{3001}));
}

TEST(ExprLimits, InListAndArguments) {
  std::string list = "i IN (0";
  for (int k = 1; k < 10000; ++k) {
    list += ',';
    list += std::to_string(k);
  }
  EXPECT_EQ(bools(list + ")", make_batch({{.i = 9999}, {.i = 10000}})), (std::vector<uint8_t>{1, 0}));
  const std::string over = list + ",10000)";
  EXPECT_EQ(err(over).rfind("IN list has more than 10000 items at 1:", 0), 0u) << err(over);
  EXPECT_EQ(err_code(over), Errc::limit_exceeded);
  std::string args = "concat('a'";
  for (int k = 0; k < 10000; ++k) args += ",s";
  EXPECT_EQ(err(args + ")").rfind("function 'concat' has more than 10000 arguments at 1:", 0), 0u);
}

// ---- batches ----

TEST(ExprBatches, EmptyBatch) {
  const Batch empty = make_batch({});
  for (const char* text : {"i + 1",
                           "d * 2",
                           "s",
                           "concat(s, 'x')",
                           "lower(s)",
                           "i > 3",
                           "i IN (1, 2)",
                           "CASE WHEN b THEN 1 ELSE 2 END",
                           "42",
                           "'const'",
                           "hash(i, s)",
                           "substr(s, 1, 2)",
                           "_time",
                           "t - 5",
                           "to_int(s)",
                           "min(i, j)",
                           "b AND c",
                           "NOT b",
                           "i / j",
                           "i BETWEEN 1 AND 2",
                           "contains(s, u)",
                           "to_double(i)",
                           "sqrt(d)",
                           "length(s)"}) {
    ColumnPtr c = run(text, empty);
    EXPECT_EQ(c->size(), 0u) << text;
  }
  EXPECT_TRUE(selected("i > 3", empty).empty());
  EXPECT_TRUE(selected("TRUE", empty).empty());
  EXPECT_TRUE(selected("b AND i > 1", empty).empty());
}

TEST(ExprBatches, ConstantsBroadcast) {
  const Batch b = make_batch({{}, {}, {}});
  EXPECT_EQ(ints("1 + 2 * 3", b), (std::vector<int64_t>{7, 7, 7}));
  EXPECT_EQ(strs("concat('a', 'b')", b), (std::vector<std::string>{"ab", "ab", "ab"}));
  EXPECT_EQ(strs("''", b), (std::vector<std::string>{"", "", ""}));
  EXPECT_EQ(bools("1 IN (1, 2)", b), (std::vector<uint8_t>{1, 1, 1}));
  EXPECT_EQ(dbls("2.5", b), (std::vector<double>{2.5, 2.5, 2.5}));
}

// ---- select ----

TEST(ExprSelect, FastPathsAndCandidates) {
  std::vector<Row> rows;
  for (int k = 0; k < 10; ++k)
    rows.push_back({.i = k,
                    .d = k * 0.5,
                    .b = k % 2 == 0,
                    .s = std::string(1, static_cast<char>('a' + k)),
                    .t = k * 10,
                    .time = 100 - k});
  const Batch b = make_batch(rows);
  using V = std::vector<uint32_t>;
  EXPECT_EQ(selected("i > 6", b), (V{7, 8, 9}));
  EXPECT_EQ(selected("6 < i", b), (V{7, 8, 9}));
  EXPECT_EQ(selected("3 >= i", b), (V{0, 1, 2, 3}));
  EXPECT_EQ(selected("i = 4", b), (V{4}));
  EXPECT_EQ(selected("i != 4 AND i < 6", b), (V{0, 1, 2, 3, 5}));
  EXPECT_EQ(selected("d >= 4", b), (V{8, 9}));
  EXPECT_EQ(selected("s <= 'b'", b), (V{0, 1}));
  EXPECT_EQ(selected("s = 'c'", b), (V{2}));
  EXPECT_EQ(selected("b", b), (V{0, 2, 4, 6, 8}));
  EXPECT_EQ(selected("b = FALSE", b), (V{1, 3, 5, 7, 9}));
  EXPECT_EQ(selected("_time < 93", b), (V{8, 9}));
  EXPECT_EQ(selected("t BETWEEN 20 AND 40", b), (V{2, 3, 4}));
  EXPECT_EQ(selected("d NOT BETWEEN 1 AND 4", b), (V{0, 1, 9}));
  EXPECT_EQ(selected("i IN (1, 3, 11)", b), (V{1, 3}));
  EXPECT_EQ(selected("s NOT IN ('a', 'j')", b), (V{1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(selected("b AND i > 3 AND i < 9", b), (V{4, 6, 8}));
  EXPECT_EQ(selected("i < 2 OR i > 8", b), (V{0, 1, 9}));
  EXPECT_EQ(selected("TRUE", b).size(), 10u);
  EXPECT_TRUE(selected("FALSE", b).empty());
  EXPECT_EQ(selected("i > 1.5 AND d < 2", b), (V{2, 3}));
  const V cand{1, 4, 5, 8};
  EXPECT_EQ(selected("i > 4", b, &cand), (V{5, 8}));
  EXPECT_EQ(selected("b", b, &cand), (V{4, 8}));
  EXPECT_EQ(selected("TRUE", b, &cand), cand);
  EXPECT_EQ(selected("i % 4 = 0", b, &cand), (V{4, 8}));
  EXPECT_EQ(selected("i IN (5, 6)", b, &cand), (V{5}));
  const V none;
  EXPECT_TRUE(selected("i >= 0", b, &none).empty());
  // select appends.
  std::vector<uint32_t> out{99};
  must("i = 0").select(b, out);
  EXPECT_EQ(out, (V{99, 0}));
  // Candidates may be the output vector itself.
  std::vector<uint32_t> same{2, 5, 7};
  must("i > 4").select(b, same, &same);
  EXPECT_EQ(same, (V{2, 5, 7, 5, 7}));
}

TEST(ExprSelect, AgreesWithEvalOnRandomData) {
  std::mt19937_64 rng(7);
  const char* kStrs[] = {"", "a", "ab", "b", "zz", "A"};
  const char* kPreds[] = {
      "i > 0",
      "i >= j",
      "0 > i",
      "i = 3",
      "i != -2",
      "d < 0.5",
      "d >= e",
      "i < d",
      "s = 'ab'",
      "s < u",
      "'b' <= s",
      "b",
      "NOT b",
      "b = c",
      "b > c",
      "t > 3",
      "_time <= t",
      "_time = 2",
      "i BETWEEN -2 AND 2",
      "i NOT BETWEEN j AND 3",
      "d BETWEEN -0.5 AND 0.5",
      "s BETWEEN 'a' AND 'b'",
      "i IN (1, 2, 3)",
      "i NOT IN (0, -1)",
      "s IN ('', 'zz')",
      "d IN (0.5, 1.0)",
      "b IN (TRUE)",
      "i IN (j, 2)",
      "b AND i > 0",
      "b OR i > 0",
      "i > 0 AND j > 0 AND s != ''",
      "(i > 0 OR j > 0) AND NOT c",
      "CASE WHEN i > 0 THEN b ELSE c END",
      "contains(s, 'a')",
      "length(s) > 1",
      "i % 3 = 0",
      "abs(i) < 3 AND d > -1",
      "i > 9223372036854775807 - 1",
      "hash(i) % 2 = 0",
      "TRUE AND b",
      "i > 1.5",
      "t BETWEEN 1 AND 4",
      "i IN (1,2,3,4,5,6,7,8,9,10,11,12) AND d <= 0",
      // Fused `direct ARITH constant OP constant`, both operand orders.
      "i % 4 != 1",
      "i % (-3) = 0",
      "i / 2 >= 1",
      "i / (-2) < 1",
      "i + 2 > 3",
      "2 - i <= 0",
      "i * 3 = -3",
      "1 > i * 2",
      "7 % i = 1",
      "12 / i > 2",
      "i % 0 = 0",
      "i / 1 = 2",
      "t + 2 > 5",
      "_time - 1 <= 2",
      "_time - t > 1",
      // Any other numeric side is evaluated once, then compared in place.
      "d * 2.0 > e",
      "d + 1 < 1.5",
      "abs(i) >= 2",
      "i + j = 0",
      "i * 3 < j",
      "b != c",
      "t <= _time",
  };
  for (int round = 0; round < 20; ++round) {
    std::vector<Row> rows(static_cast<size_t>(rng() % 300));
    for (Row& r : rows) {
      r.i = static_cast<int64_t>(rng() % 11) - 5;
      r.j = static_cast<int64_t>(rng() % 11) - 5;
      r.d = static_cast<double>(static_cast<int64_t>(rng() % 9) - 4) * 0.25;
      r.e = static_cast<double>(static_cast<int64_t>(rng() % 9) - 4) * 0.25;
      r.b = rng() % 2;
      r.c = rng() % 2;
      r.s = kStrs[rng() % 6];
      r.u = kStrs[rng() % 6];
      r.t = static_cast<int64_t>(rng() % 7);
      r.time = static_cast<int64_t>(rng() % 7);
    }
    const Batch b = make_batch(rows);
    std::vector<uint32_t> cand;
    for (uint32_t k = 0; k < rows.size(); ++k)
      if (rng() % 3 == 0) cand.push_back(k);
    for (const char* p : kPreds) {
      const Expr e = must(p);
      const ColumnPtr c = e.eval(b);
      std::vector<uint32_t> want_all;
      std::vector<uint32_t> want_cand;
      for (uint32_t k = 0; k < rows.size(); ++k)
        if (c->bools[k]) want_all.push_back(k);
      for (uint32_t k : cand)
        if (c->bools[k]) want_cand.push_back(k);
      EXPECT_EQ(selected(p, b), want_all) << p;
      EXPECT_EQ(selected(p, b, &cand), want_cand) << p;
    }
  }
}

// Division and remainder by a constant use a multiply instead of a divide;
// they must agree with the hardware (and with the documented 0 and -1
// cases) on every int64, including the extremes.
TEST(ExprSelect, DivisionByConstantMatchesHardware) {
  std::mt19937_64 rng(11);
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  std::vector<Row> rows;
  for (int64_t e : {int64_t{0}, int64_t{1}, int64_t{-1}, int64_t{2}, int64_t{-2}, int64_t{122}, int64_t{123},
                    int64_t{-123}, int64_t{246}, kMax, kMin, kMax - 1, kMin + 1})
    rows.push_back({.i = e});
  for (int k = 0; k < 3000; ++k) rows.push_back({.i = static_cast<int64_t>(rng()) >> (rng() % 64)});
  const Batch b = make_batch(rows);
  const std::vector<int64_t> divisors = {2,  3,     7,          10,          123,         -123,         -5,
                                         64, -64,   1000000007, 1LL << 40,   -(1LL << 40), kMax,         kMin + 1,
                                         0,  1,     -1,         kMin,        1LL << 62,   -(1LL << 62), 641,
                                         -2, 65537, 3074457345618258603LL};
  for (int64_t d : divisors) {
    std::string ds = "(";
    ds += std::to_string(d);
    ds += ")";
    const auto q = ints(std::string("i / ") + ds, b);
    const auto r = ints(std::string("i % ") + ds, b);
    std::vector<uint32_t> zero_rem;
    for (size_t k = 0; k < rows.size(); ++k) {
      const int64_t n = rows[k].i;
      int64_t want_q = 0;
      int64_t want_r = 0;
      if (d == -1) {
        want_q = static_cast<int64_t>(uint64_t{0} - static_cast<uint64_t>(n));
      } else if (d != 0) {
        want_q = n / d;
        want_r = n % d;
      }
      ASSERT_EQ(q[k], want_q) << n << " / " << d;
      ASSERT_EQ(r[k], want_r) << n << " % " << d;
      if (want_r == 0) zero_rem.push_back(static_cast<uint32_t>(k));
    }
    EXPECT_EQ(selected(std::string("i % ") + ds + " = 0", b), zero_rem) << d;
  }
}

// ---- object semantics ----

TEST(ExprObject, CopyableAndThreadCompatible) {
  const Expr a = must("i * 2 + 1");
  Expr b = a;  // NOLINT: testing the copy
  Expr c = must("s");
  c = b;
  EXPECT_EQ(c.text(), "i * 2 + 1");
  EXPECT_EQ(c.type(), Type::Int64);
  Expr moved = std::move(b);
  EXPECT_EQ(moved.text(), "i * 2 + 1");
  std::vector<Row> rows;
  for (int k = 0; k < 1000; ++k) {
    std::string name = "x";
    name += std::to_string(k);
    rows.push_back({.i = k, .s = name});
  }
  const Batch batch = make_batch(rows);
  const Expr pred = must("i % 7 = 3 AND starts_with(s, 'x1')");
  std::vector<std::vector<uint32_t>> results(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        results[t].clear();
        pred.select(batch, results[t]);
        EXPECT_EQ(a.eval(batch)->ints[10], 21);
      }
    });
  for (auto& th : threads) th.join();
  for (const auto& r : results) EXPECT_EQ(r, results[0]);
  EXPECT_FALSE(results[0].empty());
}

TEST(ExprObject, CompileAgainstOtherSchemas) {
  const Schema empty;
  EXPECT_EQ(Expr::compile("1 + 1", empty)->type(), Type::Int64);
  EXPECT_EQ(Expr::compile("_time > 5", empty)->type(), Type::Bool);
  EXPECT_EQ(Expr::compile("x", empty).error().message, "unknown field 'x' at 1:1");
}

}  // namespace
}  // namespace entente::engine

namespace entente::engine {
namespace {

TEST(ExprFields, ListsEachReadFieldOnceInOrder) {
  auto schema = make_schema({{"a", Type::Int64}, {"b", Type::String}, {"c", Type::Double}, {"d", Type::Bool}});
  auto e = Expr::compile("CASE WHEN d THEN c * 2 ELSE to_double(a) + c END > 1 AND _time > 0", *schema);
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(e->fields(), (std::vector<size_t>{0, 2, 3}));
  auto t = Expr::compile("_time > 5", *schema);
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->fields().empty());
  auto s = Expr::compile("length(b)", *schema);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->fields(), (std::vector<size_t>{1}));
}

}  // namespace
}  // namespace entente::engine
