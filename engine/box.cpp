#include "engine/box.h"

#include <algorithm>

#include "engine/serde.h"

namespace entente::engine {

void Box::on_tick(int64_t /*now_ms*/, Emitter& /*out*/) {}

Status Box::restore_joined(const std::vector<std::string_view>& parts, const std::vector<KeyGroupRange>& ranges) {
  if (parts.empty() || parts.size() != ranges.size())
    return make_error(Errc::invalid_argument, "restoring a box from its parts: " + std::to_string(parts.size()) +
                                                  " snapshots for " + std::to_string(ranges.size()) + " ranges");
  if (keyed())
    return make_error(Errc::unsupported, std::string(type()) + " boxes are not restored from the parts of a split");
  return restore(parts[0]);
}

BoxBase::BoxBase(std::vector<SchemaPtr> inputs, std::vector<SchemaPtr> outputs)
    : input_schemas_(std::move(inputs)),
      output_schemas_(std::move(outputs)),
      next_seq_(output_schemas_.size(), 0),
      in_wm_(input_schemas_.size(), kMinTime) {}

void BoxBase::emit(Emitter& out, size_t port, Batch b) {
  const size_t n = b.rows();
  if (n == 0) return;
  Seq s = next_seq_[port];
  // reset(): the batch's old numbers may be shared with its input; they are
  // overwritten in place only if they are the batch's alone.
  std::vector<Seq>& seq = b.seq.reset();
  seq.resize(n);
  for (size_t i = 0; i < n; ++i) seq[i] = s + i;
  next_seq_[port] = s + n;
  stats_.tuples_out += n;
  size_t bytes = 16 * n;  // event time and sequence number
  for (const auto& c : b.columns) bytes += c->byte_size();
  stats_.bytes_out += bytes;
  out.emit(port, std::move(b));
}

void BoxBase::emit_watermark(Emitter& out, EventTime wm) {
  if (wm <= out_wm_) return;
  out_wm_ = wm;
  out.emit_watermark(wm);
}

EventTime BoxBase::update_input_watermark(size_t port, EventTime wm) {
  if (wm > in_wm_[port]) in_wm_[port] = wm;
  return input_watermark();
}

EventTime BoxBase::input_watermark() const noexcept {
  if (in_wm_.empty()) return kMinTime;
  return *std::min_element(in_wm_.begin(), in_wm_.end());
}

void BoxBase::snapshot_base(std::string& out) const {
  ByteWriter w(out);
  w.varint(next_seq_.size());
  for (Seq s : next_seq_) w.varint(s);
  w.varint(in_wm_.size());
  for (EventTime t : in_wm_) w.i64(t);
  w.i64(out_wm_);
}

Status BoxBase::restore_base(std::string_view& in) {
  ByteReader r(in);
  uint64_t n;
  if (!r.varint(n) || n != next_seq_.size())
    return make_error(Errc::corrupt, "snapshot does not match this box's output ports");
  std::vector<Seq> seqs(n);
  for (auto& s : seqs)
    if (!r.varint(s)) return make_error(Errc::corrupt, "snapshot truncated in sequence counters");
  if (!r.varint(n) || n != in_wm_.size())
    return make_error(Errc::corrupt, "snapshot does not match this box's input ports");
  std::vector<EventTime> wms(n);
  for (auto& t : wms)
    if (!r.i64(t)) return make_error(Errc::corrupt, "snapshot truncated in watermarks");
  EventTime out_wm;
  if (!r.i64(out_wm)) return make_error(Errc::corrupt, "snapshot truncated in watermarks");
  next_seq_ = std::move(seqs);
  in_wm_ = std::move(wms);
  out_wm_ = out_wm;
  in = r.rest();
  return Status::Ok();
}

}  // namespace entente::engine
