// Columnar batches: the unit that boxes consume and produce.
//
// A Batch is a schema, one column per field, and per-row event time and
// sequence number. Columns, event times and sequence numbers are immutable
// once placed in a batch and shared by shared_ptr, so projecting or
// forwarding a batch copies no data.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/types.h"

namespace entente::engine {

// The values of one field across the rows of a batch. Which vector is used
// depends on type: ints (Int64, Timestamp), doubles (Double), bools (Bool,
// one byte per row, 0 or 1), offsets + chars (String: row i is
// chars[offsets[i], offsets[i+1]); offsets always has size()+1 entries).
struct Column {
  explicit Column(Type t = Type::Int64) : type(t) {}

  Type type;
  std::vector<int64_t> ints;
  std::vector<double> doubles;
  std::vector<uint8_t> bools;
  std::vector<uint32_t> offsets{0};
  std::string chars;

  size_t size() const noexcept {
    switch (type) {
      case Type::Int64:
      case Type::Timestamp: return ints.size();
      case Type::Double: return doubles.size();
      case Type::Bool: return bools.size();
      case Type::String: return offsets.size() - 1;
    }
    return 0;
  }
  std::string_view str(size_t i) const noexcept {
    return std::string_view(chars.data() + offsets[i], offsets[i + 1] - offsets[i]);
  }
  void append_str(std::string_view s) {
    chars.append(s.data(), s.size());
    offsets.push_back(static_cast<uint32_t>(chars.size()));
  }
  void reserve(size_t rows);
  void clear();
  // Appends row `row` of `src` (same type).
  void append_from(const Column& src, size_t row);
  // Appends rows `rows` of `src` (same type), in that order.
  void gather_from(const Column& src, std::span<const uint32_t> rows);
  // Appends every row of `src` (same type).
  void append_all(const Column& src);
  // Appends rows [begin, end) of `src` (same type), in bulk.
  void append_range(const Column& src, size_t begin, size_t end);
  void append_value(const Value& v);  // REQUIRES: v holds type's representation
  Value value(size_t i) const;
  // Bytes of payload (for stats): 8 per number, 1 per bool, length+4 per string.
  size_t byte_size() const noexcept;
  bool operator==(const Column& o) const;
};

using ColumnPtr = std::shared_ptr<const Column>;

// One value per row of a batch (event times, sequence numbers). Like
// columns, the values are immutable once shared: copying a RowVector
// copies a pointer, and writing through mut() first copies the values if
// anyone else holds them (copy on write). The values may also live in
// another object, e.g. a timestamp column's values used as the event times
// of its batch (alias()); those are never written in place.
//
// Threading: as for shared_ptr, distinct RowVector objects may be used
// from distinct threads even when they share values; one object is not
// synchronised.
template <class T>
class RowVector {
 public:
  RowVector() noexcept : v_(empty_values()) {}
  // Takes the values over (implicit, so `b.event_time = std::move(times)`).
  RowVector(std::vector<T> values)  // NOLINT(google-explicit-constructor)
      : v_(std::make_shared<std::vector<T>>(std::move(values))), writable_(true) {}
  RowVector(std::initializer_list<T> values) : RowVector(std::vector<T>(values)) {}
  // The values `values`, kept alive by `owner` (which must own them).
  static RowVector alias(std::shared_ptr<const void> owner, const std::vector<T>& values) noexcept {
    RowVector r;
    r.v_ = std::shared_ptr<const std::vector<T>>(std::move(owner), &values);
    return r;
  }

  RowVector(const RowVector&) = default;
  RowVector& operator=(const RowVector&) = default;
  // A moved-from RowVector is empty, like a moved-from vector.
  RowVector(RowVector&& o) noexcept
      : v_(std::exchange(o.v_, empty_values())), writable_(std::exchange(o.writable_, false)) {}
  RowVector& operator=(RowVector&& o) noexcept {
    v_ = std::exchange(o.v_, empty_values());
    writable_ = std::exchange(o.writable_, false);
    return *this;
  }

  size_t size() const noexcept { return v_->size(); }
  bool empty() const noexcept { return v_->empty(); }
  const T* data() const noexcept { return v_->data(); }
  const T& operator[](size_t i) const noexcept { return (*v_)[i]; }
  const T* begin() const noexcept { return v_->data(); }
  const T* end() const noexcept { return v_->data() + v_->size(); }
  const T& front() const noexcept { return v_->front(); }
  const T& back() const noexcept { return v_->back(); }
  const std::vector<T>& vec() const noexcept { return *v_; }
  operator std::span<const T>() const noexcept { return {v_->data(), v_->size()}; }  // NOLINT

  // The values, writable: copied first unless this object alone holds
  // values it made itself. Invalidates data() and spans taken before.
  std::vector<T>& mut() {
    if (!writable_ || v_.use_count() != 1) {
      v_ = std::make_shared<std::vector<T>>(*v_);
      writable_ = true;
    }
    // Made by make_shared<std::vector<T>> above or in the constructor: not
    // a const object.
    return const_cast<std::vector<T>&>(*v_);
  }
  // Empties this and returns its values for writing: the same storage,
  // capacity kept, if this object alone holds values it made; else fresh
  // storage (nothing is copied either way).
  std::vector<T>& reset() {
    if (!writable_ || v_.use_count() != 1) {
      v_ = std::make_shared<std::vector<T>>();
      writable_ = true;
    }
    auto& v = const_cast<std::vector<T>&>(*v_);  // made by make_shared<std::vector<T>>: not const
    v.clear();
    return v;
  }
  // The values as a vector of the caller's: moved out when this object
  // alone holds values it made, else copied. Leaves this empty.
  std::vector<T> release() {
    std::vector<T> out;
    if (writable_ && v_.use_count() == 1) out = std::move(mut());
    else out = *v_;
    v_ = empty_values();
    writable_ = false;
    return out;
  }
  // True if both hold the very same values (not a copy of them).
  bool shares_with(const RowVector& o) const noexcept { return v_ == o.v_; }

  friend bool operator==(const RowVector& a, const RowVector& b) { return a.v_ == b.v_ || *a.v_ == *b.v_; }

 private:
  // Non-owning pointer to one empty vector: no allocation for empty rows.
  static std::shared_ptr<const std::vector<T>> empty_values() noexcept {
    static const std::vector<T> kEmpty;
    return std::shared_ptr<const std::vector<T>>(std::shared_ptr<const void>(), &kEmpty);
  }

  std::shared_ptr<const std::vector<T>> v_;  // never null
  bool writable_ = false;                    // v_ was made by this class (not an alias, not the empty one)
};

// A batch of rows. Cheap to copy (shared columns, event times and
// sequence numbers). Construct through BatchBuilder, or assemble columns
// directly and call validate().
struct Batch {
  SchemaPtr schema;
  std::vector<ColumnPtr> columns;  // one per schema field
  RowVector<EventTime> event_time;  // one per row
  RowVector<Seq> seq;               // one per row

  Batch() = default;
  explicit Batch(SchemaPtr s) : schema(std::move(s)) {}

  size_t rows() const noexcept { return event_time.size(); }
  bool empty() const noexcept { return event_time.empty(); }
  const Column& column(size_t i) const { return *columns[i]; }
  // How much validate() looks at. `shape` is O(columns): every column
  // exists, has the schema's type and rows() rows, seq has rows() entries,
  // and each string column's offsets end at its byte count. `full` also
  // walks every string offset (for batches assembled from untrusted parts).
  enum class Check : uint8_t { shape, full };
  Status validate(Check check = Check::full) const;
  // Rows `rows` of this batch, in that order, as a new batch (copies data).
  Batch take(std::span<const uint32_t> rows) const;
  // A batch holding the given columns (shared, not copied) under a new
  // schema, with this batch's event times and sequence numbers.
  Batch project(SchemaPtr new_schema, std::vector<ColumnPtr> cols) const;
  // Row-by-row equality of schema, values, event times and sequence numbers.
  bool operator==(const Batch& o) const;
};

// Builds a Batch row by row or column by column.
class BatchBuilder {
 public:
  explicit BatchBuilder(SchemaPtr schema);
  void reserve(size_t rows);
  Column& column(size_t i) { return *cols_[i]; }
  std::vector<EventTime>& event_time() { return event_time_; }
  std::vector<Seq>& seq() { return seq_; }
  // Appends row `row` of `src`, which must have the same schema.
  void append_row(const Batch& src, size_t row);
  size_t rows() const noexcept { return event_time_.size(); }
  // Hands the data over; the builder is empty afterwards and may be reused.
  Batch finish();

 private:
  SchemaPtr schema_;
  std::vector<std::shared_ptr<Column>> cols_;
  std::vector<EventTime> event_time_;
  std::vector<Seq> seq_;
};

// Concatenates batches of one schema.
Batch concat(const SchemaPtr& schema, std::span<const Batch> parts);

}  // namespace entente::engine
