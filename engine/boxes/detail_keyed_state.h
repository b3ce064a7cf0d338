// Machinery shared by the keyed, windowed boxes (Aggregate and Join):
// bounded time arithmetic, a hash index from key hash to dense ids, key
// comparison between a batch row and stored key columns, and the snapshot
// encoding of single values. Private to engine/boxes.
#pragma once
#if !defined(ENTENTE_IN_ENGINE)
#error "engine/boxes/ is private to engine/ (docs/architecture.md)"
#endif

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/batch.h"
#include "base/result.h"
#include "engine/serde.h"
#include "rapidjson/fwd.h"

namespace entente::engine::boxes::detail {

// Event times the windowed boxes accept: |t| <= kTimeLimit. Rows outside are
// dropped and counted as late. Window sizes, slides, slacks and interval
// bounds are at most kSpanLimit. Together they keep every window bound
// computation far from int64 overflow.
inline constexpr int64_t kTimeLimit = int64_t{1} << 61;
inline constexpr int64_t kSpanLimit = int64_t{1} << 40;
// A watermark bound meaning "everything has closed".
inline constexpr int64_t kFar = int64_t{1} << 62;

// Floor division for a possibly negative numerator; REQUIRES: b > 0.
inline int64_t floor_div(int64_t a, int64_t b) noexcept {
  int64_t q = a / b;
  if ((a % b != 0) && (a < 0)) --q;
  return q;
}

inline int64_t clamp_time(int64_t t) noexcept { return t < -kFar ? -kFar : (t > kFar ? kFar : t); }

// a - b clamped to [-kFar, kFar]; watermarks may be kMinTime or kMaxWatermark.
inline int64_t sub_clamped(int64_t a, int64_t b) noexcept {
  if (a >= kFar) return kFar;
  if (a <= -kFar) return -kFar;
  return clamp_time(a - b);
}

// True if row `i` of `a` equals row `j` of `b` (same type). Doubles compare
// with ==, except that NaN equals NaN so that NaN keys form one group.
bool cell_equal(const Column& a, size_t i, const Column& b, size_t j) noexcept;

// Open-addressing (linear probing) index from a 64-bit key hash to a dense
// id. Deletion is by rebuilding (clear + insert), which the boxes do when
// they compact their state. Load factor stays at most 1/2.
class HashIndex {
 public:
  static constexpr uint32_t kNone = UINT32_MAX;

  HashIndex() { clear(); }
  void clear(size_t expected = 0);
  size_t size() const noexcept { return size_; }

  // The id stored under `hash` for which `eq(id)` holds, or kNone.
  template <class Eq>
  uint32_t find(uint64_t hash, Eq&& eq) const {
    size_t i = static_cast<size_t>(hash) & mask_;
    while (true) {
      const Slot& s = slots_[i];
      if (s.id == kNone) return kNone;
      if (s.hash == hash && eq(s.id)) return s.id;
      i = (i + 1) & mask_;
    }
  }
  // REQUIRES: no id equal under the caller's notion is stored for `hash`.
  void insert(uint64_t hash, uint32_t id);
  // Replaces the id of the entry (hash, old) by `id`.
  void replace(uint64_t hash, uint32_t old, uint32_t id);

 private:
  struct Slot {
    uint64_t hash;
    uint32_t id;
  };
  void grow();
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

// Snapshot encoding of one value of a column (by the column's type), and
// its decoding appended to a column of the same type.
void write_cell(ByteWriter& w, const Column& c, size_t row);
bool read_cell(ByteReader& r, Column& c);

// Reads a signed duration: an integer of milliseconds (may be negative), or
// a string like "10s" or "-5s". Reports under `path` and returns false on
// error.
bool parse_signed_duration(const rapidjson::Value& v, const std::string& path, Diagnostics& diag,
                           int64_t& out);

// Error for a snapshot that ends early or contradicts itself.
inline Error corrupt(std::string_view what) {
  return make_error(Errc::corrupt, "corrupt snapshot: " + std::string(what));
}

}  // namespace entente::engine::boxes::detail
