// OrderedInputs: deterministic consumption of several inputs, released by
// watermarks (Borealis' SUnion). See engine/boxes/boxes.h.
#include <algorithm>
#include <numeric>

#include "engine/boxes/boxes.h"
#include "engine/codec.h"
#include "engine/serde.h"

namespace entente::engine::boxes {

// The rows of one input released by one release() call, in arrival order,
// with a cursor for the k-way merge. `order` is empty when the rows are
// already sorted by event time (the common case: sources emit in order), and
// otherwise the stable sort permutation, which keeps arrival order among
// equal event times.
struct OrderedInputs::Pending {
  Batch rows;
  std::vector<uint32_t> order;
  size_t pos = 0;

  size_t size() const noexcept { return rows.rows(); }
  EventTime at(size_t p) const noexcept { return rows.event_time[order.empty() ? p : order[p]]; }
};

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

void OrderedInputs::release(const std::function<void(size_t input, const Batch& rows)>& fn) {
  const EventTime w = watermark();
  if (w == kMinTime) return;
  const bool all = w == kMaxWatermark;
  const size_t k = schemas_.size();
  std::vector<Pending> pend(k);
  std::vector<uint32_t> rel;
  std::vector<uint32_t> keep;
  size_t active = 0;

  // Split each input's buffer into released rows (event time < w) and rows
  // that stay, without copying batches that fall wholly on one side.
  for (size_t i = 0; i < k; ++i) {
    auto& bufs = buffered_[i];
    if (bufs.empty()) continue;
    std::vector<Batch> parts;
    std::vector<Batch> rest;
    for (Batch& b : bufs) {
      const size_t n = b.rows();
      size_t n_rel = n;
      if (!all) {
        n_rel = 0;
        for (size_t r = 0; r < n; ++r) n_rel += b.event_time[r] < w ? 1 : 0;
      }
      if (n_rel == n) {
        parts.push_back(std::move(b));
      } else if (n_rel == 0) {
        rest.push_back(std::move(b));
      } else {
        rel.clear();
        keep.clear();
        for (uint32_t r = 0; r < n; ++r) (b.event_time[r] < w ? rel : keep).push_back(r);
        parts.push_back(b.take(rel));
        rest.push_back(b.take(keep));
      }
    }
    bufs = std::move(rest);
    if (parts.empty()) continue;
    Pending& p = pend[i];
    p.rows = parts.size() == 1 ? std::move(parts[0]) : concat(schemas_[i], parts);
    const auto& t = p.rows.event_time;
    if (!std::is_sorted(t.begin(), t.end())) {
      p.order.resize(t.size());
      std::iota(p.order.begin(), p.order.end(), 0u);
      std::stable_sort(p.order.begin(), p.order.end(), [&](uint32_t a, uint32_t b) { return t[a] < t[b]; });
    }
    ++active;
  }
  if (active == 0) return;

  // k-way merge by (event time, input index). Each step finds the input
  // whose head comes first and hands over the longest run of its rows that
  // precedes every other input's head; runs are found by galloping, so
  // long runs cost O(log n) comparisons.
  std::vector<uint32_t> idx;
  for (;;) {
    size_t best = k;
    for (size_t i = 0; i < k; ++i) {
      if (pend[i].pos >= pend[i].size()) continue;
      if (best == k || pend[i].at(pend[i].pos) < pend[best].at(pend[best].pos)) best = i;
    }
    if (best == k) break;
    Pending& p = pend[best];
    const size_t n = p.size();
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
    size_t end = n;
    if (bounded) {
      auto ok = [&](size_t q) {
        const EventTime t = p.at(q);
        return t < strict && t <= incl;
      };
      // p.pos itself is ok (it was the minimum). Gallop, then bisect.
      size_t lo = p.pos;  // last known ok
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
      end = hi;
    }
    if (p.order.empty() && p.pos == 0 && end == n) {
      fn(best, p.rows);
    } else {
      idx.resize(end - p.pos);
      if (p.order.empty())
        std::iota(idx.begin(), idx.end(), static_cast<uint32_t>(p.pos));
      else
        std::copy(p.order.begin() + static_cast<ptrdiff_t>(p.pos), p.order.begin() + static_cast<ptrdiff_t>(end),
                  idx.begin());
      fn(best, p.rows.take(idx));
    }
    p.pos = end;
  }
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
