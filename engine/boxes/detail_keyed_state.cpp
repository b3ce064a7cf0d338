#include "engine/boxes/detail_keyed_state.h"

#include <cmath>

#include "engine/detail/options.h"
#include "rapidjson/document.h"

namespace entente::engine::boxes::detail {

bool cell_equal(const Column& a, size_t i, const Column& b, size_t j) noexcept {
  switch (a.type) {
    case Type::Int64:
    case Type::Timestamp: return a.ints[i] == b.ints[j];
    case Type::Double: {
      const double x = a.doubles[i], y = b.doubles[j];
      return x == y || (std::isnan(x) && std::isnan(y));
    }
    case Type::Bool: return a.bools[i] == b.bools[j];
    case Type::String: return a.str(i) == b.str(j);
  }
  return false;
}

void HashIndex::clear(size_t expected) {
  size_t cap = 16;
  while (cap < expected * 2) cap <<= 1;
  slots_.assign(cap, Slot{0, kNone});
  mask_ = cap - 1;
  size_ = 0;
}

void HashIndex::grow() {
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(old.size() * 2, Slot{0, kNone});
  mask_ = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.id == kNone) continue;
    size_t i = static_cast<size_t>(s.hash) & mask_;
    while (slots_[i].id != kNone) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

void HashIndex::insert(uint64_t hash, uint32_t id) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  size_t i = static_cast<size_t>(hash) & mask_;
  while (slots_[i].id != kNone) i = (i + 1) & mask_;
  slots_[i] = Slot{hash, id};
  ++size_;
}

void HashIndex::replace(uint64_t hash, uint32_t old, uint32_t id) {
  size_t i = static_cast<size_t>(hash) & mask_;
  while (slots_[i].id != kNone) {
    if (slots_[i].hash == hash && slots_[i].id == old) {
      slots_[i].id = id;
      return;
    }
    i = (i + 1) & mask_;
  }
}

void write_cell(ByteWriter& w, const Column& c, size_t row) {
  switch (c.type) {
    case Type::Int64:
    case Type::Timestamp: w.svarint(c.ints[row]); break;
    case Type::Double: w.f64(c.doubles[row]); break;
    case Type::Bool: w.u8(c.bools[row]); break;
    case Type::String: w.bytes(c.str(row)); break;
  }
}

bool read_cell(ByteReader& r, Column& c) {
  switch (c.type) {
    case Type::Int64:
    case Type::Timestamp: {
      int64_t v;
      if (!r.svarint(v)) return false;
      c.ints.push_back(v);
      return true;
    }
    case Type::Double: {
      double v;
      if (!r.f64(v)) return false;
      c.doubles.push_back(v);
      return true;
    }
    case Type::Bool: {
      uint8_t v;
      if (!r.u8(v) || v > 1) return false;
      c.bools.push_back(v);
      return true;
    }
    case Type::String: {
      std::string_view s;
      if (!r.bytes(s)) return false;
      c.append_str(s);
      return true;
    }
  }
  return false;
}

bool parse_signed_duration(const rapidjson::Value& v, const std::string& path, Diagnostics& diag,
                           int64_t& out) {
  if (v.IsInt64()) {
    out = v.GetInt64();
    return true;
  }
  if (v.IsString() && v.GetStringLength() > 0 && v.GetString()[0] == '-') {
    rapidjson::Value rest(v.GetString() + 1, v.GetStringLength() - 1);  // not owned; outlives the call
    auto d = engine::detail::parse_duration_ms(rest, path, diag);
    if (!d) return false;
    out = -*d;
    return true;
  }
  auto d = engine::detail::parse_duration_ms(v, path, diag);
  if (!d) return false;
  out = *d;
  return true;
}

}  // namespace entente::engine::boxes::detail
