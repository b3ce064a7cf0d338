// OrderedInputs: deterministic consumption of several inputs, released by
// watermarks (Borealis' SUnion). See engine/boxes/boxes.h.
#include <algorithm>
#include <numeric>
#include <span>

#include "engine/boxes/boxes.h"
#include "engine/codec.h"
#include "engine/serde.h"

namespace entente::engine::boxes {

namespace {

// Rows [begin, end) of `b` as a new batch (copies data).
Batch slice(const Batch& b, size_t begin, size_t end) {
  Batch out(b.schema);
  out.columns.reserve(b.columns.size());
  for (const auto& c : b.columns) {
    auto col = std::make_shared<Column>(c->type);
    col->reserve(end - begin);
    col->append_range(*c, begin, end);
    out.columns.push_back(std::move(col));
  }
  out.event_time = std::vector<EventTime>(b.event_time.begin() + begin, b.event_time.begin() + end);
  out.seq = std::vector<Seq>(b.seq.begin() + begin, b.seq.begin() + end);
  return out;
}

// The batch handed to release()'s callback for a run that is not a whole
// buffered batch. Runs are often a few rows long (inputs interleave in
// time), so allocating columns per run would dominate: the column buffers
// are reused from run to run unless the callback kept a reference to them
// (use_count), in which case they are left to it and fresh ones are made.
class RunBuffer {
 public:
  // Starts a run of rows of `src`'s schema.
  void begin(const Batch& src) {
    batch_.columns.clear();  // drop our own extra reference before counting
    batch_.schema = src.schema;
    // Reused like the columns, unless the callback kept the previous run's
    // values (then reset() starts fresh ones).
    batch_.event_time.reset();
    batch_.seq.reset();
    cols_.resize(src.columns.size());
    for (size_t c = 0; c < cols_.size(); ++c) {
      const Type t = src.column(c).type;
      if (!cols_[c] || cols_[c].use_count() > 1 || cols_[c]->type != t) cols_[c] = std::make_shared<Column>(t);
      else cols_[c]->clear();
    }
  }
  // Appends rows [begin, end) of `src`.
  void add(const Batch& src, size_t begin, size_t end) {
    for (size_t c = 0; c < cols_.size(); ++c) cols_[c]->append_range(src.column(c), begin, end);
    auto& times = batch_.event_time.mut();
    auto& seqs = batch_.seq.mut();
    times.insert(times.end(), src.event_time.begin() + begin, src.event_time.begin() + end);
    seqs.insert(seqs.end(), src.seq.begin() + begin, src.seq.begin() + end);
  }
  // Appends rows `rows` of `src`, in that order.
  void add(const Batch& src, std::span<const uint32_t> rows) {
    for (size_t c = 0; c < cols_.size(); ++c) cols_[c]->gather_from(src.column(c), rows);
    auto& times = batch_.event_time.mut();
    auto& seqs = batch_.seq.mut();
    for (uint32_t r : rows) {
      times.push_back(src.event_time[r]);
      seqs.push_back(src.seq[r]);
    }
  }
  const Batch& finish() {
    batch_.columns.assign(cols_.begin(), cols_.end());
    return batch_;
  }

 private:
  std::vector<std::shared_ptr<Column>> cols_;
  Batch batch_;
};

}  // namespace

// The rows of one input released by one release() call, with a cursor for
// the k-way merge. Usually `parts` are the released rows in arrival order
// and already sorted by event time across parts (sources emit in order):
// part i contributes rows [0, limits[i]) of parts[i], so a released prefix
// of a buffered batch needs no copy, and neither do several buffered
// batches. Otherwise `parts` holds one batch (the released rows, copied)
// and `order` is its stable sort permutation by event time, which keeps
// arrival order among equal event times.
struct OrderedInputs::Pending {
  std::vector<Batch> parts;
  std::vector<size_t> limits;
  std::vector<size_t> ends;  // cumulative limits
  std::vector<uint32_t> order;
  size_t pos = 0;
  RunBuffer run;

  size_t size() const noexcept { return ends.empty() ? 0 : ends.back(); }
  // The part holding position `p` (parts are few: a linear scan).
  size_t part_of(size_t p) const noexcept {
    size_t i = 0;
    while (ends[i] <= p) ++i;
    return i;
  }
  size_t start_of(size_t part) const noexcept { return part == 0 ? 0 : ends[part - 1]; }
  EventTime at(size_t p) const noexcept {
    if (!order.empty()) return parts[0].event_time[order[p]];
    const size_t i = part_of(p);
    return parts[i].event_time[p - start_of(i)];
  }

  // Takes from `bufs` (one input's buffer, arrival order) the rows with
  // event time < w (all rows if `all`) into parts, leaving the others in
  // `bufs`. Returns whether it took any. `rel` and `keep` are scratch.
  // Inlined into release_runs() (its only caller, once per input per
  // release), where it was written before: a call costs q8, whose
  // releases are a few rows each, 1 % more instructions.
  [[gnu::always_inline]] inline bool take_released(std::vector<Batch>& bufs, EventTime w, bool all,
                                                   const SchemaPtr& schema, std::vector<uint32_t>& rel,
                                                   std::vector<uint32_t>& keep);

  // The end of the run starting at pos: the first position from pos whose
  // row is not < strict or not <= incl (size() if none). REQUIRES: the row
  // at pos is.
  size_t run_end(EventTime strict, EventTime incl) const noexcept {
    auto ok = [&](size_t q) {
      const EventTime t = at(q);
      return t < strict && t <= incl;
    };
    // Gallop, then bisect: long runs cost O(log n) comparisons.
    const size_t n = size();
    size_t lo = pos;  // last known ok
    size_t step = 1;
    while (lo + step < n && ok(lo + step)) {
      lo += step;
      step *= 2;
    }
    size_t hi = std::min(lo + step, n);  // first known not ok (or n)
    while (hi - lo > 1) {
      const size_t mid = lo + (hi - lo) / 2;
      if (ok(mid)) lo = mid;
      else hi = mid;
    }
    return hi;
  }

 private:
  // Appends the first `limit` rows of `b` (moved in) as a part; `sorted`
  // stays true while the parts' released rows, in sequence, are sorted.
  void add_part(Batch&& b, size_t limit, bool& sorted) {
    parts.push_back(std::move(b));
    const auto t = std::span<const EventTime>(parts.back().event_time).first(limit);
    if (sorted && limits.size() > 0) {
      const Batch& prev = parts[parts.size() - 2];
      sorted = prev.event_time[limits.back() - 1] <= t.front();
    }
    sorted = sorted && std::is_sorted(t.begin(), t.end());
    limits.push_back(limit);
    ends.push_back((ends.empty() ? 0 : ends.back()) + limit);
  }

  // Parts whose released rows are out of order: copies them into one
  // batch and merges through its stable sort permutation.
  void order_by_permutation(const SchemaPtr& schema) {
    for (size_t j = 0; j < parts.size(); ++j)
      if (limits[j] != parts[j].rows()) parts[j] = slice(parts[j], 0, limits[j]);
    Batch one = parts.size() == 1 ? std::move(parts[0]) : concat(schema, parts);
    parts.clear();
    parts.push_back(std::move(one));
    limits.assign(1, parts[0].rows());
    ends = limits;
    const auto& t = parts[0].event_time;
    order.resize(t.size());
    std::iota(order.begin(), order.end(), 0u);
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return t[a] < t[b]; });
  }
};

// Splits without copying released rows that form a prefix of their batch
// (sorted input) or a whole batch.
bool OrderedInputs::Pending::take_released(std::vector<Batch>& bufs, EventTime w, bool all,
                                           const SchemaPtr& schema, std::vector<uint32_t>& rel,
                                           std::vector<uint32_t>& keep) {
  std::vector<Batch> rest;
  bool sorted = true;
  for (Batch& b : bufs) {
    const size_t n = b.rows();
    size_t n_rel = n;
    size_t first_keep = n;
    if (!all) {
      n_rel = 0;
      for (size_t r = 0; r < n; ++r) n_rel += b.event_time[r] < w ? 1 : 0;
      if (n_rel != 0 && n_rel != n) {
        first_keep = 0;
        while (b.event_time[first_keep] < w) ++first_keep;
      }
    }
    if (n_rel == 0) {
      rest.push_back(std::move(b));
      continue;
    }
    if (n_rel == n) {
      add_part(std::move(b), n_rel, sorted);
    } else if (first_keep == n_rel) {
      // The released rows are a prefix: copy only the rows that stay.
      rest.push_back(slice(b, n_rel, n));
      add_part(std::move(b), n_rel, sorted);
    } else {
      rel.clear();
      keep.clear();
      for (uint32_t r = 0; r < n; ++r) (b.event_time[r] < w ? rel : keep).push_back(r);
      add_part(b.take(rel), n_rel, sorted);
      rest.push_back(b.take(keep));
    }
  }
  bufs = std::move(rest);
  if (parts.empty()) return false;
  if (!sorted) order_by_permutation(schema);
  return true;
}

OrderedInputs::OrderedInputs(std::vector<SchemaPtr> inputs)
    : schemas_(std::move(inputs)), wm_(schemas_.size(), kMinTime), buffered_(schemas_.size()) {}

void OrderedInputs::add(size_t input, const Batch& b) {
  if (b.empty()) return;
  // Rows below this input's watermark would be released out of order (an
  // earlier release may already have passed them). Boxes count and drop
  // them before calling add(); this keeps the ordering promise regardless.
  const EventTime w = wm_[input];
  const size_t n = b.rows();
  size_t late = 0;
  if (w != kMinTime)
    for (size_t i = 0; i < n; ++i) late += b.event_time[i] < w ? 1 : 0;
  if (late == 0) {
    buffered_[input].push_back(b);
  } else if (late < n) {
    std::vector<uint32_t> keep;
    keep.reserve(n - late);
    for (uint32_t i = 0; i < n; ++i)
      if (b.event_time[i] >= w) keep.push_back(i);
    buffered_[input].push_back(b.take(keep));
  }
  arrivals_ += n - late;
}

EventTime OrderedInputs::set_watermark(size_t input, EventTime wm) {
  if (wm > wm_[input]) wm_[input] = wm;
  return watermark();
}

EventTime OrderedInputs::watermark() const noexcept {
  if (wm_.empty()) return kMinTime;
  return *std::min_element(wm_.begin(), wm_.end());
}

size_t OrderedInputs::buffered_rows() const noexcept {
  size_t n = 0;
  for (const auto& bufs : buffered_)
    for (const auto& b : bufs) n += b.rows();
  return n;
}

template <class Run>
void OrderedInputs::release_runs(Run&& run) {
  const EventTime w = watermark();
  if (w == kMinTime) return;
  const bool all = w == kMaxWatermark;
  const size_t k = schemas_.size();
  std::vector<Pending> pend(k);
  std::vector<uint32_t> rel;
  std::vector<uint32_t> keep;
  size_t active = 0;
  for (size_t i = 0; i < k; ++i) {
    if (buffered_[i].empty()) continue;
    if (pend[i].take_released(buffered_[i], w, all, schemas_[i], rel, keep)) ++active;
  }
  if (active == 0) return;

  // k-way merge by (event time, input index). Each step finds the input
  // whose head comes first and hands over the longest run of its rows that
  // precedes every other input's head.
  for (;;) {
    size_t best = k;
    for (size_t i = 0; i < k; ++i) {
      if (pend[i].pos >= pend[i].size()) continue;
      if (best == k || pend[i].at(pend[i].pos) < pend[best].at(pend[best].pos)) best = i;
    }
    if (best == k) break;
    Pending& p = pend[best];
    // A row of `best` precedes the head of input j < best only if its time
    // is strictly lower, and the head of input j > best if not higher.
    bool bounded = false;
    EventTime strict = kMaxWatermark;  // rows must be < strict (inputs before best)
    EventTime incl = kMaxWatermark;    // rows must be <= incl (inputs after best)
    for (size_t j = 0; j < k; ++j) {
      if (j == best || pend[j].pos >= pend[j].size()) continue;
      bounded = true;
      const EventTime h = pend[j].at(pend[j].pos);
      if (j < best) strict = std::min(strict, h);
      else incl = std::min(incl, h);
    }
    // p.pos itself precedes them all (it was the minimum).
    const size_t end = bounded ? p.run_end(strict, incl) : p.size();
    run(best, p, end);
    p.pos = end;
  }
}

void OrderedInputs::release(const std::function<void(size_t input, const Batch& rows)>& fn) {
  release_runs([&](size_t input, Pending& p, size_t end) {
    if (!p.order.empty()) {
      p.run.begin(p.parts[0]);
      p.run.add(p.parts[0], std::span<const uint32_t>(p.order).subspan(p.pos, end - p.pos));
      fn(input, p.run.finish());
      return;
    }
    const size_t first = p.part_of(p.pos);
    const size_t from = p.pos - p.start_of(first);
    if (from == 0 && end == p.ends[first] && p.limits[first] == p.parts[first].rows()) {
      fn(input, p.parts[first]);  // exactly one whole buffered batch
      return;
    }
    p.run.begin(p.parts[first]);
    for (size_t j = first; j < p.parts.size() && p.start_of(j) < end; ++j) {
      const size_t b = j == first ? from : 0;
      const size_t e = std::min(end, p.ends[j]) - p.start_of(j);
      p.run.add(p.parts[j], b, e);
    }
    fn(input, p.run.finish());
  });
}

void OrderedInputs::release_ranges(
    const std::function<void(size_t input, const Batch& b, size_t begin, size_t end)>& fn) {
  release_runs([&](size_t input, Pending& p, size_t end) {
    if (!p.order.empty()) {
      // Out-of-order input: the run's rows are scattered, gather them.
      p.run.begin(p.parts[0]);
      p.run.add(p.parts[0], std::span<const uint32_t>(p.order).subspan(p.pos, end - p.pos));
      const Batch& rows = p.run.finish();
      fn(input, rows, 0, rows.rows());
      return;
    }
    for (size_t j = p.part_of(p.pos); j < p.parts.size() && p.start_of(j) < end; ++j) {
      const size_t start = p.start_of(j);
      fn(input, p.parts[j], std::max(p.pos, start) - start, std::min(end, p.ends[j]) - start);
    }
  });
}

// Format: varint inputs | per input: i64 watermark, varint batches, each
// batch in the binary batch encoding | varint arrivals.
void OrderedInputs::snapshot(std::string& out) const {
  ByteWriter w(out);
  w.varint(schemas_.size());
  for (size_t i = 0; i < schemas_.size(); ++i) {
    w.i64(wm_[i]);
    w.varint(buffered_[i].size());
    for (const auto& b : buffered_[i]) encode_batch(b, out);
  }
  w.varint(arrivals_);
}

Status OrderedInputs::restore(std::string_view& in) {
  std::string_view cur = in;
  ByteReader r(cur);
  uint64_t k = 0;
  if (!r.varint(k) || k != schemas_.size())
    return make_error(Errc::corrupt, "ordered inputs: snapshot does not match the number of inputs");
  std::vector<EventTime> wm(k);
  std::vector<std::vector<Batch>> bufs(k);
  for (size_t i = 0; i < k; ++i) {
    uint64_t nb = 0;
    if (!r.i64(wm[i]) || !r.varint(nb))
      return make_error(Errc::corrupt, "ordered inputs: snapshot truncated");
    // Each encoded batch takes more than one byte: a count beyond the bytes
    // left is garbage, not a reason to reserve memory.
    if (nb > r.remaining()) return make_error(Errc::corrupt, "ordered inputs: bad batch count");
    for (uint64_t j = 0; j < nb; ++j) {
      std::string_view rest = r.rest();
      auto b = decode_batch(rest);
      if (!b.ok()) return make_error(Errc::corrupt, "ordered inputs: " + b.error().message);
      if (b->schema == nullptr || !(*b->schema == *schemas_[i]))
        return make_error(Errc::corrupt, "ordered inputs: buffered batch of input " + std::to_string(i) +
                                             " has the wrong schema");
      b->schema = schemas_[i];
      if (!b->empty()) bufs[i].push_back(std::move(b).value());
      r = ByteReader(rest);
    }
  }
  uint64_t arrivals = 0;
  if (!r.varint(arrivals)) return make_error(Errc::corrupt, "ordered inputs: snapshot truncated");
  wm_ = std::move(wm);
  buffered_ = std::move(bufs);
  arrivals_ = arrivals;
  in = r.rest();
  return Status::Ok();
}

}  // namespace entente::engine::boxes
