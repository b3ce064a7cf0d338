#include "federation/export_sender.h"

#include <algorithm>
#include <numeric>
#include <span>

#include "engine/codec.h"
#include "federation/acknowledgements.h"
#include "federation/metering.h"
#include "federation/rate_limiter.h"
#include "federation/traffic.h"
#include "federation/wire.h"

namespace entente::federation {
namespace {

constexpr size_t kCatchupRecords = 64;
// DATA payload = first_seq (8) + count (4) + body length (4) + body.
constexpr size_t kDataOverhead = 16;

}  // namespace

ExportSender::ExportSender(Context ctx, certs::Identity peer, uint32_t channel, HostStreamPtr stream,
                           Terms terms, uint64_t next, uint64_t credit, size_t max_payload,
                           base::Counter* tuples_out)
    : ctx_(ctx),
      peer_(std::move(peer)),
      peer_uri_(peer_.uri()),
      channel_(channel),
      stream_(std::move(stream)),
      projection_(std::move(terms.projection)),
      schema_(std::move(terms.schema)),
      predicate_(std::move(terms.predicate)),
      limiter_(std::move(terms.limiter)),
      start_(next),
      next_(next),
      covered_(next),
      credit_(credit),
      max_payload_(max_payload),
      tuples_out_(tuples_out),
      contract_(std::move(terms.contract)),
      party_(terms.party.empty() ? peer_.domain : std::move(terms.party)),
      names_(terms.names) {}

void ExportSender::start() {
  stream_->add_tap(shared_from_this());
  pump();
}

void ExportSender::stop() {
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    if (waiting_tokens_) limiter_->waiting_over();
  }
  stream_->remove_tap(this);
}

void ExportSender::end(WireError code, const std::string& reason) {
  {
    std::lock_guard lock(mu_);
    reset_locked(code, reason);
    if (waiting_tokens_) limiter_->waiting_over();
  }
  stream_->remove_tap(this);
}

void ExportSender::on_record(const RecordView& rec) {
  std::lock_guard lock(mu_);
  if (closed_ || !live_ || rec.last < next_) return;
  if (rec.first > next_ ||
      !send_locked(rec.batch, next_ - rec.first, rec.first == next_ ? rec.encoded : nullptr)) {
    // Out of credit or tokens (or a gap, which in-order publication rules
    // out): continue from the log when they come back.
    live_ = false;
  }
}

void ExportSender::on_stream_closed() {
  std::lock_guard lock(mu_);
  reset_locked(WireError::not_found, "stream '" + stream_->name() + "' was deleted");
}

void ExportSender::on_credit(uint32_t bytes) {
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    if (Status s = credit_.grant(bytes); !s.ok()) {
      reset_locked(WireError::flow_control, s.error().message);
      return;
    }
  }
  pump();
}

void ExportSender::on_ack(uint64_t through) {
  {
    std::lock_guard lock(mu_);
    if (through <= acked_) return;  // acknowledgements never go down
    acked_ = through;
  }
  ctx_.acks.record(stream_->name(), party_, through);
  if (!contract_.empty()) ctx_.metering.charge_through(stream_->name(), peer_.domain, through, false);
}

void ExportSender::tick() {
  bool resume = false;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    (void)flush_gap_locked();
    resume = waiting_tokens_;
    waiting_tokens_ = false;
  }
  if (resume) pump();
}

bool ExportSender::all_acknowledged() {
  std::lock_guard lock(mu_);
  return acked_ + 1 >= covered_;
}

uint64_t ExportSender::unacknowledged_from() {
  std::lock_guard lock(mu_);
  return acked_ != 0 ? acked_ + 1 : start_;
}

// REQUIRES: mu_. Notes a DATA covering first..last with n rows under the
// contract before it leaves (durably: if this node dies right after
// sending, the range is still charged once the consumer acknowledges it).
void ExportSender::billing_locked(uint64_t first, uint64_t last, size_t n) {
  if (!contract_.empty()) ctx_.metering.note_sent(stream_->name(), peer_.domain, contract_, first, last, n);
}

// REQUIRES: mu_. Counts the n tuples of a DATA that left for the peer;
// the contract is charged once they are acknowledged.
void ExportSender::sent_locked(size_t n) {
  if (tuples_out_) tuples_out_->inc(n);
  ctx_.traffic.count(peer_uri_, 0, n);
  if (limiter_) limiter_->consume(n);
}

// REQUIRES: mu_. Ends the channel with RESET.
void ExportSender::reset_locked(WireError code, const std::string& reason) {
  if (closed_) return;
  closed_ = true;
  (void)ctx_.wire.send(peer_, FrameType::reset, channel_, encode(Reset{code, reason}));
}

// REQUIRES: mu_. Covers tuples covered_ .. next_-1 (all filtered out)
// with a DATA holding no row; false when credit or the link is lacking.
bool ExportSender::flush_gap_locked() {
  if (covered_ >= next_) return true;
  if (empty_body_.empty()) engine::encode_batch(engine::BatchBuilder(schema_).finish(), empty_body_);
  Data d;
  d.first_seq = covered_;
  d.count = static_cast<uint32_t>(next_ - covered_);
  d.body = empty_body_;
  const std::string payload = payload_locked(d);
  if (!credit_.can_send(payload.size())) return false;
  if (!ctx_.wire.send(peer_, d.frame_type(), channel_, payload).ok()) return false;
  credit_.consume(payload.size());
  covered_ = next_;
  return true;
}

// REQUIRES: mu_. A committed record's bytes, all of it, sent as they are
// (nothing filters, projects or splits). false when it did not go: the
// general path splits it, or fails the same way.
bool ExportSender::send_whole_locked(size_t rows, const std::string& whole) {
  Data d;
  d.first_seq = next_;
  d.count = static_cast<uint32_t>(rows);
  d.body = whole;
  std::string payload = payload_locked(d);
  if (!credit_.can_send(payload.size())) return false;
  billing_locked(next_, next_ + rows - 1, rows);
  // Over the peer's frame limit (or the link is down): the caller's general
  // path splits, or fails the same way.
  if (!ctx_.wire.send(peer_, d.frame_type(), channel_, payload).ok()) return false;
  credit_.consume(payload.size());
  sent_locked(rows);
  next_ += rows;
  covered_ = next_;
  return true;
}

// The rows of `b` from `offset` on that may leave, in order.
void ExportSender::passing_rows(const engine::Batch& b, size_t offset, std::vector<uint32_t>& pass) const {
  const size_t rows = b.rows();
  if (!predicate_) {
    pass.resize(rows - offset);
    std::iota(pass.begin(), pass.end(), static_cast<uint32_t>(offset));
  } else if (offset == 0) {
    predicate_->select(b, pass);
  } else {
    std::vector<uint32_t> candidates(rows - offset);
    std::iota(candidates.begin(), candidates.end(), static_cast<uint32_t>(offset));
    predicate_->select(b, pass, &candidates);
  }
}

// Rows pass[i .. i+n-1] of `b`, projected on the terms' fields.
engine::Batch ExportSender::part_of(const engine::Batch& b, const std::vector<uint32_t>& pass, size_t i,
                                    size_t n) const {
  engine::Batch part = n == b.rows() ? b : b.take(std::span<const uint32_t>(pass).subspan(i, n));
  if (projection_.empty()) return part;
  std::vector<engine::ColumnPtr> cols;
  cols.reserve(projection_.size());
  for (size_t c : projection_) cols.push_back(part.columns[c]);
  return part.project(schema_, std::move(cols));
}

// REQUIRES: mu_. Deals with rows offset.. of `b` (tuples next_..): sends
// the rows the predicate passes, projected, as DATA frames while credit
// and the rate cap's tokens last; rows filtered out are covered by the
// next DATA. false when credit, tokens or the link ran out first; next_
// then names the first tuple not dealt with.
// `whole`, when given, is the encoding of all of `b` (a committed
// record's bytes), sent as it is when nothing filters, projects or splits.
bool ExportSender::send_locked(const engine::Batch& b, size_t offset, const std::string* whole) {
  const uint64_t base = next_ - offset;  // the sequence number of row 0
  const size_t rows = b.rows();
  if (whole != nullptr && offset == 0 && !predicate_ && projection_.empty() && covered_ == next_ &&
      rows <= chunk_rows_ && whole->size() + kDataOverhead <= max_payload_ &&
      (!limiter_ || limiter_->available() >= rows)) {
    if (send_whole_locked(rows, *whole)) return true;
    if (!credit_.can_send(whole->size() + kDataOverhead)) return false;
  }
  std::vector<uint32_t> pass;
  passing_rows(b, offset, pass);
  size_t i = 0;
  while (true) {
    if (i == pass.size()) {
      // The rest of the batch is filtered out: a later DATA covers it.
      next_ = base + rows;
      return next_ - covered_ < kMaxFilteredRun || flush_gap_locked();
    }
    // Everything before the next row that passes is filtered out.
    next_ = base + pass[i];
    if (next_ - covered_ >= kMaxFilteredRun && !flush_gap_locked()) return false;
    size_t n = std::min(pass.size() - i, chunk_rows_);
    if (limiter_) {
      const uint64_t tokens = limiter_->available();
      if (tokens == 0) {
        // The timer (tick) resumes once the bucket refilled.
        waiting_tokens_ = true;
        limiter_->throttled();
        return false;
      }
      n = static_cast<size_t>(std::min<uint64_t>(n, tokens));
    }
    // A DATA with the batch's last passing row also covers the filtered
    // rows after it.
    const uint64_t end = i + n == pass.size() ? base + rows : base + pass[i + n - 1] + 1;
    Data d;
    d.first_seq = covered_;
    d.count = static_cast<uint32_t>(end - covered_);
    engine::encode_batch(part_of(b, pass, i, n), d.body);
    std::string payload = payload_locked(d);
    if (payload.size() > max_payload_) {
      if (n == 1) {
        reset_locked(WireError::frame_too_large,
                     "tuple " + std::to_string(next_) + " encodes to " + std::to_string(payload.size()) +
                         " bytes, over the link's maximum frame");
        return false;
      }
      chunk_rows_ = std::max<size_t>(1, n / 2);
      continue;
    }
    if (!credit_.can_send(payload.size())) return false;
    // A range noted but not sent (the link refused the frame) is noted
    // again smaller (it replaces this one), or forgotten by the next OPEN.
    billing_locked(covered_, end - 1, n);
    if (Status sent = ctx_.wire.send(peer_, d.frame_type(), channel_, payload); !sent.ok()) {
      if (sent.error().code != Errc::limit_exceeded) return false;  // link down or full
      // Over the peer's maximum frame, which may be below ours.
      if (n == 1) {
        reset_locked(WireError::frame_too_large,
                     "tuple " + std::to_string(next_) + " is larger than the peer's maximum frame");
        return false;
      }
      chunk_rows_ = std::max<size_t>(1, n / 2);
      continue;
    }
    credit_.consume(payload.size());
    sent_locked(n);
    next_ = covered_ = end;
    i += n;
  }
}

std::string ExportSender::payload_locked(Data& d) const {
  // Live or from the log alike: the stream remembers which batches end in
  // the range (in memory), so nothing more is read from the store.
  if (names_) stream_->named_batches(d.first_seq, d.first_seq + d.count - 1, d.named);
  return encode(d);
}

// Catch-up from the log until the live head, bounded by credit and tokens.
void ExportSender::pump() {
  std::lock_guard lock(mu_);
  while (!closed_ && !live_) {
    if (next_ >= stream_->committed_next()) {
      // Records committed after this point reach on_record, which needs
      // mu_ and runs after the head moved: none is missed.
      live_ = true;
      if (limiter_) limiter_->waiting_over();
      return;
    }
    if (credit_.available() <= kDataOverhead) return;  // CREDIT calls again
    std::vector<store::LogRecord> recs;
    if (!stream_->read_log(next_, kCatchupRecords, credit_.available(), recs).ok()) {
      reset_locked(WireError::internal, "reading the stream's log failed");
      return;
    }
    if (recs.empty() || recs.front().first > next_) {
      reset_locked(WireError::bad_position, "sequence number " + std::to_string(next_) + " of " +
                                                stream_->name() + " is no longer retained");
      return;
    }
    for (auto& rec : recs) {
      if (rec.first > next_ || rec.last >= stream_->committed_next()) break;
      std::string_view in = rec.payload;
      auto b = engine::decode_batch(in);
      if (!b.ok()) {
        reset_locked(WireError::internal, "the stream's log is corrupt");
        return;
      }
      if (!send_locked(*b, next_ - rec.first, rec.first == next_ ? &rec.payload : nullptr)) return;
    }
  }
}

}  // namespace entente::federation
