// Batches, their binary and JSON encodings, and key hashing.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "engine/codec.h"
#include "engine/hash.h"
#include "rapidjson/document.h"

namespace entente::engine {
namespace {

SchemaPtr all_types_schema() {
  return make_schema({{"i", Type::Int64},
                      {"d", Type::Double},
                      {"b", Type::Bool},
                      {"s", Type::String},
                      {"t", Type::Timestamp}});
}

Batch random_batch(std::mt19937_64& rng, size_t rows) {
  BatchBuilder bb(all_types_schema());
  const int64_t extremes[] = {0, 1, -1, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()};
  const double dextremes[] = {0.0, -0.0, 1e-308, -1.7976931348623157e308, 0.1, 5e-324,
                              std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()};
  for (size_t r = 0; r < rows; ++r) {
    bb.column(0).ints.push_back(rng() % 3 == 0 ? extremes[rng() % 5] : static_cast<int64_t>(rng()));
    bb.column(1).doubles.push_back(rng() % 3 == 0 ? dextremes[rng() % 8]
                                                  : std::ldexp(double(rng() % 1000000) - 500000, int(rng() % 40) - 20));
    bb.column(2).bools.push_back(rng() & 1);
    std::string s;
    size_t len = rng() % 4 == 0 ? 0 : rng() % 40;
    for (size_t k = 0; k < len; ++k) s.push_back(static_cast<char>(rng() % 2 ? 'a' + rng() % 26 : 1 + rng() % 127));
    if (rng() % 5 == 0) s += "\xc3\xa9\xe2\x82\xac\"\\";  // UTF-8 and characters JSON escapes
    bb.column(3).append_str(s);
    bb.column(4).ints.push_back(rng() % 4 == 0 ? extremes[rng() % 5] : static_cast<int64_t>(rng() % 2000000000000));
    bb.event_time().push_back(rng() % 4 == 0 ? extremes[rng() % 5] : static_cast<int64_t>(rng() % 100000));
    bb.seq().push_back(rng() % 4 == 0 ? std::numeric_limits<uint64_t>::max() - rng() % 3 : rng() % 1000);
  }
  return bb.finish();
}

TEST(Schema, ValidatesNames) {
  EXPECT_TRUE(Schema::make({{"a", Type::Int64}, {"_b2", Type::String}}).ok());
  auto dup = Schema::make({{"a", Type::Int64}, {"a", Type::String}});
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.error().message, "duplicate field name 'a'");
  EXPECT_FALSE(Schema::make({{"", Type::Int64}}).ok());
  EXPECT_FALSE(Schema::make({{"1a", Type::Int64}}).ok());
  EXPECT_FALSE(Schema::make({{"a-b", Type::Int64}}).ok());
}

TEST(Schema, TypeNamesRoundTrip) {
  for (int t = 0; t < kTypeCount; ++t) {
    auto type = static_cast<Type>(t);
    EXPECT_EQ(parse_type(type_name(type)), type);
  }
  EXPECT_FALSE(parse_type("float").has_value());
}

TEST(Batch, BuilderTakeConcatValidate) {
  std::mt19937_64 rng(1);
  Batch b = random_batch(rng, 50);
  ASSERT_TRUE(b.validate().ok());
  std::vector<uint32_t> rows = {3, 0, 49, 7, 7};
  Batch t = b.take(rows);
  ASSERT_TRUE(t.validate().ok());
  ASSERT_EQ(t.rows(), 5u);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (size_t c = 0; c < 5; ++c) EXPECT_EQ(t.column(c).value(i), b.column(c).value(rows[i]));
    EXPECT_EQ(t.event_time[i], b.event_time[rows[i]]);
    EXPECT_EQ(t.seq[i], b.seq[rows[i]]);
  }
  Batch parts[] = {b.take(std::vector<uint32_t>{0, 1}), b.take(std::vector<uint32_t>{}),
                   b.take(std::vector<uint32_t>{2, 3, 4})};
  Batch joined = concat(b.schema, parts);
  EXPECT_EQ(joined, b.take(std::vector<uint32_t>{0, 1, 2, 3, 4}));
}

// RowVector: copies share values, writing copies them first unless they are
// this object's alone, aliased values are never written, moved-from is empty.
TEST(Batch, RowVectorSharesAndCopiesOnWrite) {
  RowVector<EventTime> a = std::vector<EventTime>{1, 2, 3};
  const EventTime* at = a.data();
  a.mut().push_back(4);  // alone: written in place (the pointer may move on growth)
  EXPECT_EQ(a, (RowVector<EventTime>{1, 2, 3, 4}));
  (void)at;

  RowVector<EventTime> b = a;  // shared
  EXPECT_TRUE(b.shares_with(a));
  b.mut()[0] = 9;  // copies first: a is unchanged
  EXPECT_FALSE(b.shares_with(a));
  EXPECT_EQ(a, (RowVector<EventTime>{1, 2, 3, 4}));
  EXPECT_EQ(b, (RowVector<EventTime>{9, 2, 3, 4}));
  const EventTime* bt = b.data();
  b.mut()[1] = 8;  // now b's alone: no further copy
  EXPECT_EQ(b.data(), bt);

  // Aliased values (a column's) are shared, never written in place, and
  // kept alive by their owner.
  auto col = std::make_shared<Column>(Type::Timestamp);
  col->ints = {5, 6};
  RowVector<EventTime> c = RowVector<EventTime>::alias(col, col->ints);
  EXPECT_EQ(c.data(), col->ints.data());
  std::weak_ptr<Column> watch = col;
  col.reset();
  EXPECT_FALSE(watch.expired());
  EXPECT_EQ(c, (RowVector<EventTime>{5, 6}));
  std::shared_ptr<Column> again = watch.lock();
  c.mut()[0] = 7;
  EXPECT_NE(c.data(), again->ints.data());
  EXPECT_EQ(again->ints[0], 5);  // the column is untouched
  again.reset();
  EXPECT_TRUE(watch.expired());  // c now holds its own copy

  // release(): moved out when alone, copied when shared; empty afterwards.
  RowVector<EventTime> d = std::vector<EventTime>{1, 2};
  RowVector<EventTime> e = d;
  EXPECT_EQ(e.release(), (std::vector<EventTime>{1, 2}));
  EXPECT_TRUE(e.empty());
  EXPECT_EQ(d.size(), 2u);
  const EventTime* dt = d.data();
  std::vector<EventTime> out = d.release();
  EXPECT_EQ(out.data(), dt);
  EXPECT_TRUE(d.empty());

  // reset(): empties, keeping the storage only when it is this object's alone.
  RowVector<EventTime> h = std::vector<EventTime>{1, 2, 3};
  const EventTime* ht = h.data();
  h.reset().push_back(4);
  EXPECT_EQ(h.data(), ht);
  RowVector<EventTime> i = h;
  i.reset().push_back(5);
  EXPECT_EQ(h, (RowVector<EventTime>{4}));
  EXPECT_EQ(i, (RowVector<EventTime>{5}));

  RowVector<Seq> f = std::vector<Seq>{1};
  RowVector<Seq> g = std::move(f);
  EXPECT_TRUE(f.empty());  // NOLINT(bugprone-use-after-move): documented state
  EXPECT_EQ(g.size(), 1u);
  EXPECT_EQ(RowVector<Seq>(), RowVector<Seq>(std::vector<Seq>{}));
}

TEST(Batch, ValidateCatchesInconsistency) {
  std::mt19937_64 rng(2);
  Batch b = random_batch(rng, 4);
  Batch bad = b;
  bad.seq.mut().pop_back();
  EXPECT_FALSE(bad.validate().ok());
  bad = b;
  auto col = std::make_shared<Column>(Type::Double);
  bad.columns[0] = col;
  EXPECT_EQ(bad.validate().error().message, "column 'i' has type double, schema says int64");
  bad = b;
  bad.columns.pop_back();
  EXPECT_FALSE(bad.validate().ok());
}

TEST(Codec, BinaryRoundTripsRandomBatches) {
  std::mt19937_64 rng(3);
  for (size_t rows : {0, 1, 2, 17, 1000}) {
    Batch b = random_batch(rng, rows);
    std::string bytes;
    encode_batch(b, bytes);
    encode_batch(b, bytes);  // two in a row: decode must stop at the first's end
    std::string_view in = bytes;
    auto first = decode_batch(in);
    ASSERT_TRUE(first.ok()) << first.error().message;
    EXPECT_EQ(*first, b);
    auto second = decode_batch(in);
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(*second, b);
    EXPECT_TRUE(in.empty());
  }
}

TEST(Codec, BinaryKeepsNaNAndNegativeZeroBits) {
  BatchBuilder bb(make_schema({{"d", Type::Double}}));
  bb.column(0).doubles = {std::nan(""), -0.0};
  bb.event_time() = {0, 0};
  bb.seq() = {0, 1};
  Batch b = bb.finish();
  std::string bytes;
  encode_batch(b, bytes);
  std::string_view in = bytes;
  auto out = decode_batch(in);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(std::isnan(out->column(0).doubles[0]));
  EXPECT_TRUE(std::signbit(out->column(0).doubles[1]));
}

TEST(Codec, BinaryRefusesEveryTruncationAndGarbage) {
  std::mt19937_64 rng(4);
  Batch b = random_batch(rng, 20);
  std::string bytes;
  encode_batch(b, bytes);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    std::string_view in(bytes.data(), cut);
    auto r = decode_batch(in);
    EXPECT_FALSE(r.ok()) << "cut at " << cut;
  }
  for (int trial = 0; trial < 2000; ++trial) {
    std::string mangled = bytes;
    mangled[rng() % mangled.size()] = static_cast<char>(rng());
    std::string_view in = mangled;
    auto r = decode_batch(in);  // must not crash; may decode to other values
    if (r.ok()) {
      EXPECT_TRUE(r->validate().ok());
    }
  }
}

TEST(Codec, BinaryEnforcesRowLimit) {
  std::mt19937_64 rng(5);
  Batch b = random_batch(rng, 10);
  std::string bytes;
  encode_batch(b, bytes);
  std::string_view in = bytes;
  auto r = decode_batch(in, 9);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::limit_exceeded);
}

TEST(Codec, JsonRoundTripsRandomBatches) {
  std::mt19937_64 rng(6);
  for (size_t rows : {0, 1, 5, 300}) {
    Batch b = random_batch(rng, rows);
    std::string text = batch_to_json(b);
    auto back = batch_from_json(text);
    ASSERT_TRUE(back.ok()) << back.error().message << "\n" << text;
    EXPECT_EQ(*back, b) << text;
  }
}

// A string column may hold bytes that are not UTF-8 (the binary format takes
// any bytes); its JSON must still parse, so each such byte becomes U+FFFD
// (base::append_json_string), as in every other JSON the node writes.
TEST(Codec, JsonReplacesInvalidUtf8SoTheTextParses) {
  BatchBuilder bb(make_schema({{"s", Type::String}}));
  bb.column(0).append_str("a\xff" "b\xc3\xa9\xe2\x82");
  bb.event_time().push_back(0);
  bb.seq().push_back(0);
  const std::string text = batch_to_json(bb.finish());
  rapidjson::Document doc;
  doc.Parse<rapidjson::kParseValidateEncodingFlag>(text.data(), text.size());
  ASSERT_FALSE(doc.HasParseError()) << text;
  EXPECT_NE(text.find("\"a\xef\xbf\xbd" "b\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd\""), std::string::npos) << text;
}

TEST(Codec, JsonDoublesReadBackExactly) {
  BatchBuilder bb(make_schema({{"d", Type::Double}}));
  bb.column(0).doubles = {0.1, 1.0 / 3.0, 1e300, 5e-324, std::nan(""), 2.0};
  bb.event_time().assign(6, 0);
  bb.seq().assign(6, 0);
  Batch b = bb.finish();
  std::string nd;
  batch_to_ndjson(b, nd);
  EXPECT_NE(nd.find("\"d\":2.0}"), std::string::npos) << nd;
  EXPECT_NE(nd.find("\"NaN\""), std::string::npos);
  auto back = batch_from_json(batch_to_json(b));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, b);
}

TEST(Codec, RowsFromJsonNamesRowAndField) {
  auto schema = make_schema({{"price", Type::Int64}, {"name", Type::String}});
  auto parse = [&](const char* text) {
    rapidjson::Document d;
    d.Parse(text);
    return rows_from_json(schema, d);
  };
  auto ok = parse(R"([{"price":1,"name":"a"},{"name":"b","price":2,"_time":7}])");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->rows(), 2u);
  EXPECT_EQ(ok->event_time[1], 7);
  EXPECT_EQ(parse(R"([{"price":1,"name":"a"},{"price":"x","name":"b"}])").error().message,
            "row 1, field 'price': expected int64, got string");
  EXPECT_EQ(parse(R"([{"price":1}])").error().message, "row 0, field 'name': missing");
  EXPECT_EQ(parse(R"([{"price":1,"name":"a","prise":2}])").error().message,
            "row 0, field 'prise': not in the schema (price:int64, name:string)");
  EXPECT_EQ(parse(R"([{"price":1,"name":"a","price":2}])").error().message, "row 0, field 'price': given twice");
  EXPECT_EQ(parse(R"([1])").error().message, "row 0: expected an object, got number");
  EXPECT_FALSE(parse(R"({"price":1})").ok());
  EXPECT_EQ(parse(R"([{"price":1.5,"name":"a"}])").error().message,
            "row 0, field 'price': expected int64, got number");
}

TEST(Codec, RowsFromJsonTakesTimeFromField) {
  auto schema = make_schema({{"ts", Type::Timestamp}});
  rapidjson::Document d;
  d.Parse(R"([{"ts":100},{"ts":50,"_time":3}])");
  auto r = rows_from_json(schema, d, "ts");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->event_time, (std::vector<EventTime>{100, 3}));
  EXPECT_FALSE(rows_from_json(schema, d, "nope").ok());
}

TEST(Codec, SchemaJson) {
  auto schema = make_schema({{"a", Type::Int64}, {"b", Type::Timestamp}});
  rapidjson::Document d;
  std::string text = schema_to_json(*schema);
  d.Parse(text.c_str());
  auto back = schema_from_json(d);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, *schema);
  d.Parse(R"([{"name":"a","type":"float"}])");
  EXPECT_EQ(schema_from_json(d, "$.inputs[0].schema").error().message,
            "$.inputs[0].schema[0].type: unknown type 'float'; expected one of: int64 double bool string timestamp");
  d.Parse(R"([{"name":"a","type":"int64","extra":1}])");
  EXPECT_FALSE(schema_from_json(d).ok());
  d.Parse(R"([])");
  EXPECT_FALSE(schema_from_json(d).ok());
}

TEST(Hash, StableAndSpreadOverKeyGroups) {
  // Fixed values: key groups decide where state lives, so the hash must
  // never change between builds.
  EXPECT_EQ(hash_int(42), 13679457532755275413ULL);
  EXPECT_EQ(hash_bytes("entente"), 18346788545680256974ULL);
  EXPECT_EQ(hash_double(1.5), 8091750501020023961ULL);
  EXPECT_EQ(key_group_of(hash_int(42)), 21u);
  EXPECT_EQ(hash_double(0.0), hash_double(-0.0));
  EXPECT_NE(hash_bytes("a"), hash_bytes("b"));
  EXPECT_NE(hash_bytes(""), hash_bytes(std::string_view("\0", 1)));
  std::vector<int> counts(kKeyGroups);
  for (int64_t k = 0; k < 128000; ++k) counts[key_group_of(hash_int(k))]++;
  for (int c : counts) {
    EXPECT_GT(c, 800);
    EXPECT_LT(c, 1200);
  }
}

TEST(Hash, RowsMatchesPerValueHash) {
  std::mt19937_64 rng(7);
  Batch b = random_batch(rng, 100);
  std::vector<uint64_t> h;
  std::vector<size_t> keys = {3, 0};
  hash_rows(b, keys, h);
  for (size_t r = 0; r < b.rows(); ++r)
    EXPECT_EQ(h[r], hash_combine(hash_value(b.column(3), r), hash_value(b.column(0), r)));
}

TEST(Hash, KeyGroupRangesPartitionAllGroups) {
  for (uint32_t n = 1; n <= 7; ++n) {
    uint32_t next = 0;
    for (uint32_t i = 0; i < n; ++i) {
      auto r = KeyGroupRange::part(i, n);
      EXPECT_EQ(r.begin, next);
      EXPECT_GT(r.end, r.begin);
      next = r.end;
    }
    EXPECT_EQ(next, kKeyGroups);
  }
}

}  // namespace
}  // namespace entente::engine
