#include "engine/batch.h"

#include <algorithm>
#include <cstring>

namespace entente::engine {

namespace {

// Makes room for `extra` more elements. Growth is geometric: reserving the
// exact size on every append would reallocate (and copy) the whole vector
// each time a column is built from many small appends.
template <class V>
void reserve_more(V& v, size_t extra) {
  const size_t need = v.size() + extra;
  if (need > v.capacity()) v.reserve(std::max(need, 2 * v.capacity()));
}

}  // namespace

void Column::reserve(size_t rows) {
  switch (type) {
    case Type::Int64:
    case Type::Timestamp: ints.reserve(rows); break;
    case Type::Double: doubles.reserve(rows); break;
    case Type::Bool: bools.reserve(rows); break;
    case Type::String: offsets.reserve(rows + 1); break;
  }
}

void Column::clear() {
  ints.clear();
  doubles.clear();
  bools.clear();
  offsets.assign(1, 0);
  chars.clear();
}

void Column::append_from(const Column& src, size_t row) {
  switch (type) {
    case Type::Int64:
    case Type::Timestamp: ints.push_back(src.ints[row]); break;
    case Type::Double: doubles.push_back(src.doubles[row]); break;
    case Type::Bool: bools.push_back(src.bools[row]); break;
    case Type::String: append_str(src.str(row)); break;
  }
}

void Column::gather_from(const Column& src, std::span<const uint32_t> rows) {
  switch (type) {
    case Type::Int64:
    case Type::Timestamp: {
      size_t base = ints.size();
      ints.resize(base + rows.size());
      int64_t* dst = ints.data() + base;
      const int64_t* s = src.ints.data();
      for (size_t i = 0; i < rows.size(); ++i) dst[i] = s[rows[i]];
      break;
    }
    case Type::Double: {
      size_t base = doubles.size();
      doubles.resize(base + rows.size());
      double* dst = doubles.data() + base;
      const double* s = src.doubles.data();
      for (size_t i = 0; i < rows.size(); ++i) dst[i] = s[rows[i]];
      break;
    }
    case Type::Bool: {
      size_t base = bools.size();
      bools.resize(base + rows.size());
      for (size_t i = 0; i < rows.size(); ++i) bools[base + i] = src.bools[rows[i]];
      break;
    }
    case Type::String: {
      size_t total = 0;
      for (uint32_t r : rows) total += src.offsets[r + 1] - src.offsets[r];
      size_t base = chars.size();
      reserve_more(chars, total);
      chars.resize(base + total);
      reserve_more(offsets, rows.size());
      char* dst = chars.data() + base;
      for (uint32_t r : rows) {
        uint32_t b = src.offsets[r], e = src.offsets[r + 1];
        std::memcpy(dst, src.chars.data() + b, e - b);
        dst += e - b;
        base += e - b;
        offsets.push_back(static_cast<uint32_t>(base));
      }
      break;
    }
  }
}

void Column::append_all(const Column& src) { append_range(src, 0, src.size()); }

void Column::append_range(const Column& src, size_t begin, size_t end) {
  const auto b = static_cast<ptrdiff_t>(begin), e = static_cast<ptrdiff_t>(end);
  switch (type) {
    case Type::Int64:
    case Type::Timestamp: ints.insert(ints.end(), src.ints.begin() + b, src.ints.begin() + e); break;
    case Type::Double: doubles.insert(doubles.end(), src.doubles.begin() + b, src.doubles.begin() + e); break;
    case Type::Bool: bools.insert(bools.end(), src.bools.begin() + b, src.bools.begin() + e); break;
    case Type::String: {
      const uint32_t first = src.offsets[begin];
      const uint32_t base = static_cast<uint32_t>(chars.size());
      reserve_more(chars, src.offsets[end] - first);
      chars.append(src.chars.data() + first, src.offsets[end] - first);
      reserve_more(offsets, end - begin);
      for (size_t r = begin + 1; r <= end; ++r) offsets.push_back(base + (src.offsets[r] - first));
      break;
    }
  }
}

void Column::append_value(const Value& v) {
  switch (type) {
    case Type::Int64:
    case Type::Timestamp: ints.push_back(std::get<int64_t>(v)); break;
    case Type::Double: doubles.push_back(std::get<double>(v)); break;
    case Type::Bool: bools.push_back(std::get<bool>(v) ? 1 : 0); break;
    case Type::String: append_str(std::get<std::string>(v)); break;
  }
}

Value Column::value(size_t i) const {
  switch (type) {
    case Type::Int64:
    case Type::Timestamp: return ints[i];
    case Type::Double: return doubles[i];
    case Type::Bool: return bools[i] != 0;
    case Type::String: return std::string(str(i));
  }
  return int64_t{0};
}

size_t Column::byte_size() const noexcept {
  switch (type) {
    case Type::Int64:
    case Type::Timestamp: return ints.size() * 8;
    case Type::Double: return doubles.size() * 8;
    case Type::Bool: return bools.size();
    case Type::String: return chars.size() + 4 * (offsets.size() - 1);
  }
  return 0;
}

bool Column::operator==(const Column& o) const {
  if (type != o.type || size() != o.size()) return false;
  switch (type) {
    case Type::Int64:
    case Type::Timestamp: return ints == o.ints;
    case Type::Double:
      // Bitwise, so that NaN equals NaN and -0.0 differs from 0.0: encodings
      // must round-trip exactly.
      return doubles.empty() ||
             std::memcmp(doubles.data(), o.doubles.data(), doubles.size() * sizeof(double)) == 0;
    case Type::Bool: return bools == o.bools;
    case Type::String:
      for (size_t i = 0; i < size(); ++i)
        if (str(i) != o.str(i)) return false;
      return true;
  }
  return false;
}

Status Batch::validate(Check check) const {
  if (!schema) return make_error(Errc::invalid_argument, "batch has no schema");
  if (columns.size() != schema->size())
    return make_error(Errc::invalid_argument, "batch has " + std::to_string(columns.size()) +
                                                  " columns, schema has " + std::to_string(schema->size()));
  if (seq.size() != rows())
    return make_error(Errc::invalid_argument, "batch has " + std::to_string(seq.size()) +
                                                  " sequence numbers for " + std::to_string(rows()) + " rows");
  for (size_t i = 0; i < columns.size(); ++i) {
    const auto& f = schema->field(i);
    if (!columns[i]) return make_error(Errc::invalid_argument, "column '" + f.name + "' is missing");
    if (columns[i]->type != f.type)
      return make_error(Errc::invalid_argument, "column '" + f.name + "' has type " +
                                                    std::string(type_name(columns[i]->type)) + ", schema says " +
                                                    std::string(type_name(f.type)));
    if (columns[i]->size() != rows())
      return make_error(Errc::invalid_argument, "column '" + f.name + "' has " +
                                                    std::to_string(columns[i]->size()) + " rows, batch has " +
                                                    std::to_string(rows()));
    if (f.type == Type::String) {
      const auto& c = *columns[i];
      if (c.offsets.empty() || c.offsets.front() != 0 || c.offsets.back() != c.chars.size())
        return make_error(Errc::invalid_argument, "column '" + f.name + "' has inconsistent string offsets");
      if (check == Check::shape) continue;
      for (size_t r = 0; r + 1 < c.offsets.size(); ++r)
        if (c.offsets[r] > c.offsets[r + 1])
          return make_error(Errc::invalid_argument, "column '" + f.name + "' has decreasing string offsets");
    }
  }
  return Status::Ok();
}

Batch Batch::take(std::span<const uint32_t> rows) const {
  Batch out(schema);
  out.columns.reserve(columns.size());
  for (const auto& c : columns) {
    auto col = std::make_shared<Column>(c->type);
    col->reserve(rows.size());
    col->gather_from(*c, rows);
    out.columns.push_back(std::move(col));
  }
  std::vector<EventTime> times(rows.size());
  std::vector<Seq> seqs(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    times[i] = event_time[rows[i]];
    seqs[i] = seq[rows[i]];
  }
  out.event_time = std::move(times);
  out.seq = std::move(seqs);
  return out;
}

Batch Batch::project(SchemaPtr new_schema, std::vector<ColumnPtr> cols) const {
  Batch out(std::move(new_schema));
  out.columns = std::move(cols);
  out.event_time = event_time;
  out.seq = seq;
  return out;
}

bool Batch::operator==(const Batch& o) const {
  if (rows() != o.rows() || event_time != o.event_time || seq != o.seq) return false;
  if ((schema == nullptr) != (o.schema == nullptr)) return false;
  if (schema && !(*schema == *o.schema)) return false;
  if (columns.size() != o.columns.size()) return false;
  for (size_t i = 0; i < columns.size(); ++i)
    if (!(*columns[i] == *o.columns[i])) return false;
  return true;
}

BatchBuilder::BatchBuilder(SchemaPtr schema) : schema_(std::move(schema)) {
  cols_.reserve(schema_->size());
  for (const auto& f : schema_->fields()) cols_.push_back(std::make_shared<Column>(f.type));
}

void BatchBuilder::reserve(size_t rows) {
  for (auto& c : cols_) c->reserve(rows);
  event_time_.reserve(rows);
  seq_.reserve(rows);
}

void BatchBuilder::append_row(const Batch& src, size_t row) {
  for (size_t i = 0; i < cols_.size(); ++i) cols_[i]->append_from(*src.columns[i], row);
  event_time_.push_back(src.event_time[row]);
  seq_.push_back(src.seq[row]);
}

Batch BatchBuilder::finish() {
  Batch out(schema_);
  out.columns.reserve(cols_.size());
  for (auto& c : cols_) {
    out.columns.push_back(std::move(c));
  }
  cols_.clear();
  for (const auto& f : schema_->fields()) cols_.push_back(std::make_shared<Column>(f.type));
  out.event_time = std::move(event_time_);
  out.seq = std::move(seq_);
  event_time_.clear();
  seq_.clear();
  return out;
}

Batch concat(const SchemaPtr& schema, std::span<const Batch> parts) {
  if (parts.size() == 1) return parts[0];
  Batch out(schema);
  size_t rows = 0;
  for (const auto& p : parts) rows += p.rows();
  for (size_t i = 0; i < schema->size(); ++i) {
    auto col = std::make_shared<Column>(schema->field(i).type);
    col->reserve(rows);
    for (const auto& p : parts) col->append_all(*p.columns[i]);
    out.columns.push_back(std::move(col));
  }
  std::vector<EventTime> times;
  std::vector<Seq> seqs;
  times.reserve(rows);
  seqs.reserve(rows);
  for (const auto& p : parts) {
    times.insert(times.end(), p.event_time.begin(), p.event_time.end());
    seqs.insert(seqs.end(), p.seq.begin(), p.seq.end());
  }
  out.event_time = std::move(times);
  out.seq = std::move(seqs);
  return out;
}

}  // namespace entente::engine
