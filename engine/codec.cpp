#include "engine/codec.h"

#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>

#include "base/json_text.h"
#include "engine/detail/json_kind.h"
#include "engine/serde.h"
#include "rapidjson/document.h"
#include "rapidjson/error/en.h"

namespace entente::engine {

static_assert(std::endian::native == std::endian::little,
              "the binary batch encoding copies numbers in little-endian order");

namespace {

constexpr uint8_t kBatchMagic = 0xEB;
constexpr uint8_t kBatchVersion = 1;

template <class T>
void put_raw(ByteWriter& w, const std::vector<T>& v) {
  if (!v.empty()) w.raw(v.data(), v.size() * sizeof(T));
}

template <class T>
bool get_raw(ByteReader& r, std::vector<T>& v, size_t n) {
  if (r.remaining() / sizeof(T) < n) return false;
  v.resize(n);
  return n == 0 || r.raw(v.data(), n * sizeof(T));
}

Error corrupt(const std::string& what) { return make_error(Errc::corrupt, "corrupt batch encoding: " + what); }

}  // namespace

void encode_batch(const Batch& b, std::string& out) {
  ByteWriter w(out);
  w.u8(kBatchMagic);
  w.u8(kBatchVersion);
  const Schema& s = *b.schema;
  w.varint(s.size());
  for (const auto& f : s.fields()) {
    w.bytes(f.name);
    w.u8(static_cast<uint8_t>(f.type));
  }
  const size_t n = b.rows();
  w.varint(n);
  for (const auto& c : b.columns) {
    switch (c->type) {
      case Type::Int64:
      case Type::Timestamp: put_raw(w, c->ints); break;
      case Type::Double: put_raw(w, c->doubles); break;
      case Type::Bool: put_raw(w, c->bools); break;
      case Type::String:
        for (size_t i = 0; i < n; ++i) w.varint(c->offsets[i + 1] - c->offsets[i]);
        w.raw(c->chars.data(), c->chars.size());
        break;
    }
  }
  // Event times and sequence numbers are nearly sorted: zig-zag deltas.
  EventTime prev_t = 0;
  for (EventTime t : b.event_time) {
    w.svarint(static_cast<int64_t>(static_cast<uint64_t>(t) - static_cast<uint64_t>(prev_t)));
    prev_t = t;
  }
  Seq prev_s = 0;
  for (Seq q : b.seq) {
    w.svarint(static_cast<int64_t>(q - prev_s));
    prev_s = q;
  }
}

Result<Batch> decode_batch(std::string_view& in, size_t max_rows) {
  ByteReader r(in);
  uint8_t magic = 0, version = 0;
  if (!r.u8(magic) || magic != kBatchMagic) return corrupt("bad magic byte");
  if (!r.u8(version)) return corrupt("truncated header");
  if (version != kBatchVersion)
    return make_error(Errc::unsupported, "unsupported batch encoding version " + std::to_string(version));
  uint64_t nf;
  if (!r.varint(nf)) return corrupt("truncated schema");
  if (nf > 1024) return corrupt("schema with " + std::to_string(nf) + " fields");
  std::vector<Field> fields(nf);
  for (auto& f : fields) {
    uint8_t t;
    if (!r.bytes(f.name) || !r.u8(t)) return corrupt("truncated schema");
    if (t >= kTypeCount) return corrupt("unknown type code " + std::to_string(t));
    f.type = static_cast<Type>(t);
  }
  auto schema = Schema::make(std::move(fields));
  if (!schema.ok()) return corrupt(schema.error().message);
  uint64_t n;
  if (!r.varint(n)) return corrupt("truncated row count");
  if (n > max_rows)
    return make_error(Errc::limit_exceeded,
                      "batch of " + std::to_string(n) + " rows exceeds the limit of " + std::to_string(max_rows));
  Batch b(std::make_shared<const Schema>(std::move(schema).value()));
  for (const auto& f : b.schema->fields()) {
    auto c = std::make_shared<Column>(f.type);
    bool good = true;
    switch (f.type) {
      case Type::Int64:
      case Type::Timestamp: good = get_raw(r, c->ints, n); break;
      case Type::Double: good = get_raw(r, c->doubles, n); break;
      case Type::Bool:
        good = get_raw(r, c->bools, n);
        for (uint8_t v : c->bools)
          if (v > 1) return corrupt("bool value " + std::to_string(v) + " in '" + f.name + "'");
        break;
      case Type::String: {
        if (r.remaining() < n) return corrupt("truncated string lengths of '" + f.name + "'");
        c->offsets.reserve(n + 1);
        uint64_t total = 0;
        for (uint64_t i = 0; i < n && good; ++i) {
          uint64_t len;
          good = r.varint(len) && len <= r.remaining() && total + len <= UINT32_MAX;
          total += len;
          c->offsets.push_back(static_cast<uint32_t>(total));
        }
        if (good) {
          good = total <= r.remaining();
          if (good) {
            c->chars.resize(total);
            good = total == 0 || r.raw(c->chars.data(), total);
          }
        }
        break;
      }
    }
    if (!good) return corrupt("truncated column '" + f.name + "'");
    b.columns.push_back(std::move(c));
  }
  if (r.remaining() < 2 * n) return corrupt("truncated event times");
  std::vector<EventTime> times(n);
  uint64_t t = 0;
  for (auto& et : times) {
    int64_t d;
    if (!r.svarint(d)) return corrupt("truncated event times");
    t += static_cast<uint64_t>(d);
    et = static_cast<EventTime>(t);
  }
  std::vector<Seq> seqs(n);
  uint64_t s = 0;
  for (auto& q : seqs) {
    int64_t d;
    if (!r.svarint(d)) return corrupt("truncated sequence numbers");
    s += static_cast<uint64_t>(d);
    q = s;
  }
  b.event_time = std::move(times);
  b.seq = std::move(seqs);
  in = r.rest();
  return b;
}

// ---------------------------------------------------------------- JSON

namespace {

void append_int(std::string& out, int64_t v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

void append_uint(std::string& out, uint64_t v) {
  char buf[24];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, res.ptr);
}

// Shortest text that reads back to the same double. JSON has no NaN or
// infinities: those are written as the strings "NaN", "Infinity",
// "-Infinity", which rows_from_json accepts for double fields.
void append_double(std::string& out, double v) {
  if (std::isnan(v)) { out += "\"NaN\""; return; }
  if (std::isinf(v)) { out += v > 0 ? "\"Infinity\"" : "\"-Infinity\""; return; }
  char buf[32];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string_view text(buf, static_cast<size_t>(res.ptr - buf));
  out += text;
  // Keep the value a double when read back ("1" would read as an integer,
  // which is accepted too, but "1.0" says what it is).
  if (text.find_first_of(".eEn") == std::string_view::npos) out += ".0";
}

void append_value(std::string& out, const Column& c, size_t row) {
  switch (c.type) {
    case Type::Int64:
    case Type::Timestamp: append_int(out, c.ints[row]); break;
    case Type::Double: append_double(out, c.doubles[row]); break;
    case Type::Bool: out += c.bools[row] ? "true" : "false"; break;
    case Type::String: base::append_json_string(out, c.str(row)); break;
  }
}

using detail::json_kind;

}  // namespace

std::string schema_to_json(const Schema& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += "{\"name\":";
    base::append_json_string(out, s.field(i).name);
    out += ",\"type\":\"";
    out += type_name(s.field(i).type);
    out += "\"}";
  }
  out += ']';
  return out;
}

Result<Schema> schema_from_json(const rapidjson::Value& v, std::string_view path) {
  std::string p(path);
  if (!v.IsArray()) return make_error(Errc::invalid_argument, p + ": a schema is an array of {\"name\", \"type\"}");
  if (v.Size() == 0) return make_error(Errc::invalid_argument, p + ": a schema needs at least one field");
  std::vector<Field> fields;
  for (rapidjson::SizeType i = 0; i < v.Size(); ++i) {
    std::string fp = p + "[" + std::to_string(i) + "]";
    const auto& f = v[i];
    if (!f.IsObject()) return make_error(Errc::invalid_argument, fp + ": expected an object, got " + std::string(json_kind(f)));
    Field field;
    bool has_name = false, has_type = false;
    for (auto it = f.MemberBegin(); it != f.MemberEnd(); ++it) {
      std::string_view key(it->name.GetString(), it->name.GetStringLength());
      if (key == "name") {
        if (!it->value.IsString())
          return make_error(Errc::invalid_argument, fp + ".name: expected a string");
        field.name.assign(it->value.GetString(), it->value.GetStringLength());
        has_name = true;
      } else if (key == "type") {
        if (!it->value.IsString())
          return make_error(Errc::invalid_argument, fp + ".type: expected a string");
        auto t = parse_type(std::string_view(it->value.GetString(), it->value.GetStringLength()));
        if (!t)
          return make_error(Errc::invalid_argument,
                            fp + ".type: unknown type '" + std::string(it->value.GetString()) +
                                "'; expected one of: int64 double bool string timestamp");
        field.type = *t;
        has_type = true;
      } else {
        return make_error(Errc::invalid_argument, fp + "." + std::string(key) + ": unknown field; expected name, type");
      }
    }
    if (!has_name) return make_error(Errc::invalid_argument, fp + ": missing 'name'");
    if (!has_type) return make_error(Errc::invalid_argument, fp + ": missing 'type'");
    fields.push_back(std::move(field));
  }
  auto s = Schema::make(std::move(fields));
  if (!s.ok()) return make_error(s.error().code, p + ": " + s.error().message);
  return s;
}

void row_to_json(const Batch& b, size_t row, std::string& out) {
  out += "{\"_seq\":";
  append_uint(out, b.seq[row]);
  out += ",\"_time\":";
  append_int(out, b.event_time[row]);
  for (size_t i = 0; i < b.columns.size(); ++i) {
    out += ',';
    base::append_json_string(out, b.schema->field(i).name);
    out += ':';
    append_value(out, *b.columns[i], row);
  }
  out += '}';
}

void batch_to_ndjson(const Batch& b, std::string& out) {
  for (size_t r = 0; r < b.rows(); ++r) {
    row_to_json(b, r, out);
    out += '\n';
  }
}

std::string batch_to_json(const Batch& b) {
  std::string out = "{\"schema\":" + schema_to_json(*b.schema) + ",\"rows\":[";
  for (size_t r = 0; r < b.rows(); ++r) {
    if (r) out += ',';
    row_to_json(b, r, out);
  }
  out += "]}";
  return out;
}

Result<Batch> batch_from_json(std::string_view text) {
  rapidjson::Document doc;
  doc.Parse<rapidjson::kParseValidateEncodingFlag | rapidjson::kParseFullPrecisionFlag>(text.data(), text.size());
  if (doc.HasParseError())
    return make_error(Errc::parse_error, std::string("invalid JSON at offset ") +
                                             std::to_string(doc.GetErrorOffset()) + ": " +
                                             rapidjson::GetParseError_En(doc.GetParseError()));
  if (!doc.IsObject()) return make_error(Errc::invalid_argument, "expected an object with 'schema' and 'rows'");
  auto s = doc.FindMember("schema");
  auto rows = doc.FindMember("rows");
  if (s == doc.MemberEnd() || rows == doc.MemberEnd())
    return make_error(Errc::invalid_argument, "expected an object with 'schema' and 'rows'");
  auto schema = schema_from_json(s->value, "$.schema");
  if (!schema.ok()) return schema.error();
  return rows_from_json(std::make_shared<const Schema>(std::move(schema).value()), rows->value);
}

Result<Batch> rows_from_json(const SchemaPtr& schema, const rapidjson::Value& array, std::string_view time_field,
                             EventTime default_time) {
  if (!array.IsArray()) return make_error(Errc::invalid_argument, "expected an array of rows");
  const Schema& s = *schema;
  std::optional<size_t> time_idx;
  if (!time_field.empty()) {
    time_idx = s.index_of(time_field);
    if (!time_idx || !is_int_repr(s.field(*time_idx).type))
      return make_error(Errc::invalid_argument,
                        "event-time field '" + std::string(time_field) + "' is not an int64 or timestamp field of the schema");
  }
  BatchBuilder bb(schema);
  bb.reserve(array.Size());
  std::vector<char> seen(s.size());
  for (rapidjson::SizeType r = 0; r < array.Size(); ++r) {
    const auto& row = array[r];
    auto where = [&](std::string_view field) {
      return "row " + std::to_string(r) + ", field '" + std::string(field) + "'";
    };
    if (!row.IsObject())
      return make_error(Errc::invalid_argument, "row " + std::to_string(r) + ": expected an object, got " + std::string(json_kind(row)));
    std::fill(seen.begin(), seen.end(), 0);
    std::optional<EventTime> time;
    Seq seq = 0;
    // Values are staged per row so that a bad row leaves no partial data;
    // the builder's columns are appended field by field once all are good.
    std::vector<const rapidjson::Value*> vals(s.size(), nullptr);
    for (auto it = row.MemberBegin(); it != row.MemberEnd(); ++it) {
      std::string_view key(it->name.GetString(), it->name.GetStringLength());
      const auto& v = it->value;
      if (key == "_time") {
        if (!v.IsInt64()) return make_error(Errc::invalid_argument, where(key) + ": expected an integer (milliseconds)");
        time = v.GetInt64();
        continue;
      }
      if (key == "_seq") {
        if (!v.IsUint64()) return make_error(Errc::invalid_argument, where(key) + ": expected a non-negative integer");
        seq = v.GetUint64();
        continue;
      }
      auto idx = s.index_of(key);
      if (!idx) return make_error(Errc::invalid_argument, where(key) + ": not in the schema (" + s.to_string() + ")");
      if (seen[*idx]) return make_error(Errc::invalid_argument, where(key) + ": given twice");
      seen[*idx] = 1;
      const Type t = s.field(*idx).type;
      bool good = false;
      switch (t) {
        case Type::Int64:
        case Type::Timestamp: good = v.IsInt64(); break;
        case Type::Double:
          good = v.IsNumber() ||
                 (v.IsString() && (std::string_view(v.GetString()) == "NaN" ||
                                   std::string_view(v.GetString()) == "Infinity" ||
                                   std::string_view(v.GetString()) == "-Infinity"));
          break;
        case Type::Bool: good = v.IsBool(); break;
        case Type::String: good = v.IsString(); break;
      }
      if (!good)
        return make_error(Errc::invalid_argument, where(key) + ": expected " + std::string(type_name(t)) + ", got " +
                                                      std::string(json_kind(v)));
      vals[*idx] = &v;
    }
    for (size_t i = 0; i < s.size(); ++i)
      if (!seen[i]) return make_error(Errc::invalid_argument, where(s.field(i).name) + ": missing");
    for (size_t i = 0; i < s.size(); ++i) {
      const auto& v = *vals[i];
      Column& c = bb.column(i);
      switch (c.type) {
        case Type::Int64:
        case Type::Timestamp: c.ints.push_back(v.GetInt64()); break;
        case Type::Double:
          if (v.IsString()) {
            std::string_view sv(v.GetString(), v.GetStringLength());
            c.doubles.push_back(sv == "NaN" ? std::nan("") : sv == "Infinity" ? HUGE_VAL : -HUGE_VAL);
          } else {
            c.doubles.push_back(v.GetDouble());
          }
          break;
        case Type::Bool: c.bools.push_back(v.GetBool() ? 1 : 0); break;
        case Type::String: c.append_str(std::string_view(v.GetString(), v.GetStringLength())); break;
      }
    }
    if (!time) time = time_idx ? bb.column(*time_idx).ints.back() : default_time;
    bb.event_time().push_back(*time);
    bb.seq().push_back(seq);
  }
  return bb.finish();
}

}  // namespace entente::engine
