#include "engine/hash.h"

#include <cstring>

namespace entente::engine {

namespace {
// splitmix64's finaliser: a bijective mixer with full avalanche.
inline uint64_t mix64(uint64_t x) noexcept {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}
}  // namespace

uint64_t hash_int(int64_t v) noexcept { return mix64(static_cast<uint64_t>(v) + 0x9E3779B97F4A7C15ULL); }

uint64_t hash_double(double v) noexcept {
  if (v == 0.0) v = 0.0;  // -0.0 and 0.0 compare equal, so they must hash equal
  uint64_t u;
  std::memcpy(&u, &v, 8);
  return mix64(u ^ 0xD6E8FEB86659FD93ULL);
}

uint64_t hash_bytes(std::string_view s) noexcept {
  uint64_t h = 0x243F6A8885A308D3ULL ^ (s.size() * 0x9E3779B97F4A7C15ULL);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = mix64(h ^ w);
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = mix64(h ^ w ^ (uint64_t{n} << 56));
  }
  return mix64(h);
}

uint64_t hash_value(const Column& c, size_t row) noexcept {
  switch (c.type) {
    case Type::Int64:
    case Type::Timestamp: return hash_int(c.ints[row]);
    case Type::Double: return hash_double(c.doubles[row]);
    case Type::Bool: return hash_int(c.bools[row]);
    case Type::String: return hash_bytes(c.str(row));
  }
  return 0;
}

void hash_rows(const Batch& b, std::span<const size_t> key_cols, std::vector<uint64_t>& out) {
  const size_t n = b.rows();
  out.assign(n, 0);
  for (size_t k = 0; k < key_cols.size(); ++k) {
    const Column& c = b.column(key_cols[k]);
    uint64_t* h = out.data();
    const bool first = k == 0;
    switch (c.type) {
      case Type::Int64:
      case Type::Timestamp: {
        const int64_t* v = c.ints.data();
        if (first)
          for (size_t i = 0; i < n; ++i) h[i] = hash_int(v[i]);
        else
          for (size_t i = 0; i < n; ++i) h[i] = hash_combine(h[i], hash_int(v[i]));
        break;
      }
      case Type::Double:
        for (size_t i = 0; i < n; ++i)
          h[i] = first ? hash_double(c.doubles[i]) : hash_combine(h[i], hash_double(c.doubles[i]));
        break;
      case Type::Bool:
        for (size_t i = 0; i < n; ++i)
          h[i] = first ? hash_int(c.bools[i]) : hash_combine(h[i], hash_int(c.bools[i]));
        break;
      case Type::String:
        for (size_t i = 0; i < n; ++i)
          h[i] = first ? hash_bytes(c.str(i)) : hash_combine(h[i], hash_bytes(c.str(i)));
        break;
    }
  }
}

}  // namespace entente::engine
