#include "broker/detail/peering.h"

#include <rapidjson/document.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>

#include "broker/detail/contracting.h"
#include "contracts/canonical.h"
#include "contracts/contract.h"
#include "contracts/terms.h"
#include "broker/detail/json_out.h"
#include "broker/detail/node_impl.h"
#include "engine/codec.h"
#include "engine/expr.h"
#include "federation/messages.h"
#include "store/stream_log.h"

namespace entente::broker::detail {
namespace {

using federation::FrameType;
using federation::WireError;
using Clock = std::chrono::steady_clock;

constexpr size_t kCatchupRecords = 64;
// DATA payload = first_seq (8) + count (4) + body length (4) + body.
constexpr size_t kDataOverhead = 16;
constexpr const char* kAckPrefix = "export-ack/";
// meta: "import-pos/DOMAIN/NAME" -> the owner's next sequence number an
// import expects (8 bytes big-endian), kept while the mirror's own numbers
// differ from the owner's (a predicate filtered tuples out).
constexpr const char* kImportPosPrefix = "import-pos/";
// The most filtered-out tuples a sender leaves uncovered before it sends an
// empty DATA for them, so the importer acknowledges and the log can trim.
constexpr uint64_t kMaxFilteredRun = 1u << 16;

std::string ack_key(const std::string& stream, const std::string& domain) {
  return std::string(kAckPrefix) + stream + "/" + domain;
}

std::string import_pos_key(const std::string& mirror) { return std::string(kImportPosPrefix) + mirror; }

// meta: "unbilled/DOMAIN/STREAM/<first, 8 bytes big-endian>" -> last (8
// bytes), rows (8 bytes), contract id: a range of tuples sent under a stream
// contract and not yet charged (docs/contracts.md, Metering). Written before
// the DATA leaves, erased in the write that charges it.
constexpr const char* kUnbilledPrefix = "unbilled/";
// Channels ended by this node (a contract no longer in force) whose late
// acknowledgements are still charged, at most this many at once.
constexpr size_t kMaxEndedChannels = 1024;

std::string unbilled_key(const std::string& stream, const std::string& domain, uint64_t first) {
  std::string key = std::string(kUnbilledPrefix) + domain + "/" + stream + "/";
  store::put_key_u64(key, first);
  return key;
}

// Why an import's feed ended, in a few words and first: the close reason of
// the mirror's WebSocket subscribers holds 123 bytes ("revoked c-… by acme").
std::string feed_end_cause(const std::string& domain, const std::string& owner_reason) {
  constexpr std::string_view kContract = "stream contract c-";
  const size_t at = owner_reason.find(kContract);
  if (at != std::string::npos && owner_reason.size() >= at + kContract.size() + 16) {
    const std::string id = owner_reason.substr(at + kContract.size() - 2, 18);
    const std::string_view rest = std::string_view(owner_reason).substr(at + kContract.size() + 16);
    constexpr std::string_view kRevoked = " was revoked by ";
    constexpr std::string_view kExpired = " expired at ";
    if (rest.substr(0, kRevoked.size()) == kRevoked) {
      const std::string_view by = rest.substr(kRevoked.size(), rest.find(':', kRevoked.size()) - kRevoked.size());
      return "revoked " + id + " by " + std::string(by.substr(0, 63));
    }
    if (rest.substr(0, kExpired.size()) == kExpired) {
      return "expired " + id + " at " + std::string(rest.substr(kExpired.size(), 20));
    }
  }
  return "refused by " + domain + ": " + owner_reason;
}

// "beta/bids" -> {"beta", "bids"}; nullopt without a slash.
std::optional<std::pair<std::string, std::string>> split_stream(std::string_view s) {
  const auto slash = s.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == s.size()) return std::nullopt;
  return std::make_pair(std::string(s.substr(0, slash)), std::string(s.substr(slash + 1)));
}

Errc errc_for(WireError code) {
  switch (code) {
    case WireError::not_exported: return Errc::permission_denied;
    case WireError::not_found: return Errc::not_found;
    case WireError::bad_position: return Errc::conflict;
    default: return Errc::unavailable;
  }
}

}  // namespace

// Callbacks collected under a lock and run when this object goes, after the
// lock (declared later) is released: an API callback may come back into the
// peering (a deploy reads import states) and must find no lock held.
class Deferred {
 public:
  Deferred() = default;
  Deferred(const Deferred&) = delete;
  Deferred& operator=(const Deferred&) = delete;
  ~Deferred() {
    for (auto& f : calls_) f();
  }
  void add(std::function<void()> f) { calls_.push_back(std::move(f)); }

 private:
  std::vector<std::function<void()>> calls_;
};

// A stream contract's rate cap (tuples per second, across all its channels):
// a token bucket holding at most one second of tokens, starting empty (a new
// contract has saved nothing up). Senders look at available() before they
// send and consume() what they sent, under their own lock; two channels
// that looked at once may both send, leaving a debt that later refills pay
// back, so the long-run rate never exceeds the cap.
//
// Also keeps how long a sender waited for tokens, for /metrics.
// Threading: any thread; one mutex, never held while calling out.
class RateLimiter final {
 public:
  explicit RateLimiter(uint64_t per_second) : rate_(per_second), last_(Clock::now()) {}

  uint64_t rate() const { return rate_; }

  // Whole tokens there are now (0 while in debt).
  uint64_t available() {
    std::lock_guard lock(mu_);
    refill_locked();
    return tokens_ < 1 ? 0 : static_cast<uint64_t>(tokens_);
  }
  void consume(uint64_t n) {
    std::lock_guard lock(mu_);
    tokens_ -= static_cast<double>(n);
  }
  // A sender stopped with rows to send and no token.
  void throttled() {
    std::lock_guard lock(mu_);
    if (throttled_since_ == Clock::time_point{}) throttled_since_ = Clock::now();
  }
  // A sender caught up with its stream, or its channel ended: it waits for
  // nothing any more. (With several channels waiting, the first to stop
  // ends the period; the next refusal starts another.)
  void waiting_over() {
    std::lock_guard lock(mu_);
    if (throttled_since_ == Clock::time_point{}) return;
    throttled_total_ += Clock::now() - throttled_since_;
    throttled_since_ = {};
  }
  double throttled_seconds() const {
    std::lock_guard lock(mu_);
    auto total = throttled_total_;
    if (throttled_since_ != Clock::time_point{}) total += Clock::now() - throttled_since_;
    return std::chrono::duration<double>(total).count();
  }

 private:
  void refill_locked() {
    const auto now = Clock::now();
    const double add = std::chrono::duration<double>(now - last_).count() * static_cast<double>(rate_);
    last_ = now;
    tokens_ = std::min(static_cast<double>(rate_), tokens_ + add);
  }

  const uint64_t rate_;
  mutable std::mutex mu_;
  double tokens_ = 0;               // REQUIRES: mu_; below 0 is a debt
  Clock::time_point last_;          // REQUIRES: mu_; last refill
  Clock::time_point throttled_since_{};  // REQUIRES: mu_; {} when no one waits
  Clock::duration throttled_total_{};    // REQUIRES: mu_
};

// ---------------------------------------------------------------------------
// Owner side: one open channel of an exported stream.
//
// Positions: next_ is the first tuple not yet dealt with; covered_ the first
// not yet covered by a DATA sent. Tuples covered_ .. next_-1 were all
// filtered out by the predicate: the next DATA starts at covered_ and so
// covers them too, or flush_gap_locked sends an empty DATA for them (every
// kMaxFilteredRun tuples, and on the timer when the stream goes quiet), so
// the importer can acknowledge them and the log be trimmed.

class ExportSender final : public Tap, public std::enable_shared_from_this<ExportSender> {
 public:
  struct Terms {
    std::vector<size_t> projection;          // empty: every column
    engine::SchemaPtr schema;                // what the importer sees
    std::optional<engine::Expr> predicate;   // over the stream's own schema
    std::shared_ptr<RateLimiter> limiter;    // null: no rate cap
    std::string contract;                    // empty under a configured export
  };

  ExportSender(Peering& p, certs::Identity peer, uint32_t channel, StreamPtr stream, Terms terms,
               uint64_t next, uint64_t credit, size_t max_payload, Counter* tuples_out)
      : p_(p),
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
        contract_(std::move(terms.contract)) {}

  void start() {
    stream_->add_tap(shared_from_this());
    pump();
  }

  void stop() {
    {
      std::lock_guard lock(mu_);
      closed_ = true;
      if (waiting_tokens_) limiter_->waiting_over();
    }
    stream_->remove_tap(this);
  }

  void on_record(const RecordPtr& rec) override {
    std::lock_guard lock(mu_);
    if (closed_ || !live_ || rec->last < next_) return;
    if (rec->first > next_ || !send_locked(*rec->batch, next_ - rec->first,
                                           rec->first == next_ ? rec->encoded.get() : nullptr)) {
      // Out of credit or tokens (or a gap, which in-order publication rules
      // out): continue from the log when they come back.
      live_ = false;
    }
  }

  void on_stream_closed() override {
    std::lock_guard lock(mu_);
    reset_locked(WireError::not_found, "stream '" + stream_->meta().name + "' was deleted");
  }

  // CREDIT from the importer.
  void on_credit(uint32_t bytes) {
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

  void on_ack(uint64_t through) {
    {
      std::lock_guard lock(mu_);
      if (through <= acked_) return;  // acknowledgements never go down
      acked_ = through;
    }
    p_.record_ack(stream_->meta().name, peer_.domain, through);
    if (!contract_.empty()) p_.bill_through(stream_->meta().name, peer_.domain, through, false);
  }

  // The Peering timer: covers a run of filtered-out tuples the stream left
  // behind, and sends again once the rate cap has new tokens.
  void tick() {
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

  const certs::Identity& peer() const { return peer_; }
  const StreamPtr& stream() const { return stream_; }
  // The stream contract the channel runs under; empty under a configured export.
  const std::string& contract() const { return contract_; }
  // Every DATA sent was acknowledged: nothing of the channel is left to charge.
  bool all_acknowledged() {
    std::lock_guard lock(mu_);
    return acked_ + 1 >= covered_;
  }
  // The first sequence number the importer has not acknowledged.
  uint64_t unacknowledged_from() {
    std::lock_guard lock(mu_);
    return acked_ != 0 ? acked_ + 1 : start_;
  }

  // Ends the channel (its contract is no longer in force).
  void end(WireError code, const std::string& reason) {
    {
      std::lock_guard lock(mu_);
      reset_locked(code, reason);
      if (waiting_tokens_) limiter_->waiting_over();
    }
    stream_->remove_tap(this);
  }

 private:
  // REQUIRES: mu_. Notes a DATA covering first..last with n rows under the
  // contract before it leaves (durably: if this node dies right after
  // sending, the range is still charged once the consumer acknowledges it).
  void billing_locked(uint64_t first, uint64_t last, size_t n) {
    if (!contract_.empty()) p_.bill_sent(stream_->meta().name, peer_.domain, contract_, first, last, n);
  }

  // REQUIRES: mu_. Counts the n tuples of a DATA that left for the peer;
  // the contract is charged once they are acknowledged.
  void sent_locked(size_t n) {
    if (tuples_out_) tuples_out_->inc(n);
    p_.count_tuples(peer_uri_, 0, n);
    if (limiter_) limiter_->consume(n);
  }

  // REQUIRES: mu_. Ends the channel with RESET.
  void reset_locked(WireError code, const std::string& reason) {
    if (closed_) return;
    closed_ = true;
    if (auto* links = p_.links()) {
      (void)links->send(peer_, FrameType::reset, channel_,
                        federation::encode(federation::Reset{code, reason}));
    }
  }

  // REQUIRES: mu_. Covers tuples covered_ .. next_-1 (all filtered out)
  // with a DATA holding no row; false when credit or the link is lacking.
  bool flush_gap_locked() {
    if (covered_ >= next_) return true;
    auto* links = p_.links();
    if (links == nullptr) return false;
    if (empty_body_.empty()) engine::encode_batch(engine::BatchBuilder(schema_).finish(), empty_body_);
    federation::Data d;
    d.first_seq = covered_;
    d.count = static_cast<uint32_t>(next_ - covered_);
    d.body = empty_body_;
    const std::string payload = federation::encode(d);
    if (!credit_.can_send(payload.size())) return false;
    if (!links->send(peer_, FrameType::data, channel_, payload).ok()) return false;
    credit_.consume(payload.size());
    covered_ = next_;
    return true;
  }

  // REQUIRES: mu_. Deals with rows offset.. of `b` (tuples next_..): sends
  // the rows the predicate passes, projected, as DATA frames while credit
  // and the rate cap's tokens last; rows filtered out are covered by the
  // next DATA. false when credit, tokens or the link ran out first; next_
  // then names the first tuple not dealt with.
  // `whole`, when given, is the encoding of all of `b` (a committed
  // record's bytes), sent as it is when nothing filters, projects or splits.
  bool send_locked(const engine::Batch& b, size_t offset, const std::string* whole = nullptr) {
    auto* links = p_.links();
    if (links == nullptr) return false;
    const uint64_t base = next_ - offset;  // the sequence number of row 0
    const size_t rows = b.rows();
    if (whole != nullptr && offset == 0 && !predicate_ && projection_.empty() && covered_ == next_ &&
        rows <= chunk_rows_ && whole->size() + kDataOverhead <= max_payload_ &&
        (!limiter_ || limiter_->available() >= rows)) {
      federation::Data d;
      d.first_seq = next_;
      d.count = static_cast<uint32_t>(rows);
      d.body = *whole;
      std::string payload = federation::encode(d);
      if (!credit_.can_send(payload.size())) return false;
      billing_locked(next_, next_ + rows - 1, rows);
      if (links->send(peer_, FrameType::data, channel_, payload).ok()) {
        credit_.consume(payload.size());
        sent_locked(rows);
        next_ += rows;
        covered_ = next_;
        return true;
      }
      // Over the peer's frame limit (or the link is down): the general path
      // below splits, or fails the same way.
    }
    // The rows that may leave, in order.
    std::vector<uint32_t> pass;
    if (predicate_) {
      if (offset == 0) {
        predicate_->select(b, pass);
      } else {
        std::vector<uint32_t> candidates(rows - offset);
        std::iota(candidates.begin(), candidates.end(), static_cast<uint32_t>(offset));
        predicate_->select(b, pass, &candidates);
      }
    } else {
      pass.resize(rows - offset);
      std::iota(pass.begin(), pass.end(), static_cast<uint32_t>(offset));
    }
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
      engine::Batch part;
      if (n == rows) {
        part = b;  // every row of the batch passes
      } else {
        part = b.take(std::span<const uint32_t>(pass).subspan(i, n));
      }
      if (!projection_.empty()) {
        std::vector<engine::ColumnPtr> cols;
        cols.reserve(projection_.size());
        for (size_t c : projection_) cols.push_back(part.columns[c]);
        part = part.project(schema_, std::move(cols));
      }
      federation::Data d;
      d.first_seq = covered_;
      d.count = static_cast<uint32_t>(end - covered_);
      engine::encode_batch(part, d.body);
      std::string payload = federation::encode(d);
      if (payload.size() > max_payload_) {
        if (n == 1) {
          reset_locked(WireError::frame_too_large,
                       "tuple " + std::to_string(next_) + " encodes to " +
                           std::to_string(payload.size()) + " bytes, over the link's maximum frame");
          return false;
        }
        chunk_rows_ = std::max<size_t>(1, n / 2);
        continue;
      }
      if (!credit_.can_send(payload.size())) return false;
      // A range noted but not sent (the link refused the frame) is noted
      // again smaller (it replaces this one), or forgotten by the next OPEN.
      billing_locked(covered_, end - 1, n);
      if (Status sent = links->send(peer_, FrameType::data, channel_, payload); !sent.ok()) {
        if (sent.error().code != Errc::limit_exceeded) return false;  // link down or full
        // Over the peer's maximum frame, which may be below ours.
        if (n == 1) {
          reset_locked(WireError::frame_too_large, "tuple " + std::to_string(next_) +
                                                       " is larger than the peer's maximum frame");
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

  // Catch-up from the log until the live head, bounded by credit and tokens.
  void pump() {
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
      Status s = store::StreamLog::read(p_.node().store(), stream_->meta().id, next_,
                                        kCatchupRecords, credit_.available(), recs);
      if (!s.ok()) {
        reset_locked(WireError::internal, "reading the stream's log failed");
        return;
      }
      if (recs.empty() || recs.front().first > next_) {
        reset_locked(WireError::bad_position,
                     "sequence number " + std::to_string(next_) + " of " + stream_->meta().name +
                         " is no longer retained");
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

  Peering& p_;
  const certs::Identity peer_;
  const std::string peer_uri_;
  const uint32_t channel_;
  const StreamPtr stream_;
  const std::vector<size_t> projection_;  // empty: every column
  const engine::SchemaPtr schema_;        // what the importer sees
  const std::optional<engine::Expr> predicate_;   // null: every row
  const std::shared_ptr<RateLimiter> limiter_;    // null: no rate cap
  std::mutex mu_;
  const uint64_t start_;           // where the channel started
  uint64_t next_;                  // REQUIRES: mu_; first tuple not dealt with
  uint64_t covered_;               // REQUIRES: mu_; first tuple no DATA covered
  federation::CreditWindow credit_;  // REQUIRES: mu_
  uint64_t acked_ = 0;             // REQUIRES: mu_
  bool live_ = false;              // REQUIRES: mu_
  bool closed_ = false;            // REQUIRES: mu_
  bool waiting_tokens_ = false;    // REQUIRES: mu_; stopped by the rate cap
  size_t chunk_rows_ = 1u << 14;   // REQUIRES: mu_; rows per DATA frame
  std::string empty_body_;         // REQUIRES: mu_; a batch of no row, encoded once
  const size_t max_payload_;
  Counter* tuples_out_;
  const std::string contract_;
};

// ---------------------------------------------------------------------------
// Importer side.

struct Import {
  std::string name;    // "beta/bids"
  std::string domain;  // "beta"
  StreamPtr mirror;    // null until the owner first accepted
  engine::SchemaPtr expected;  // a query's declared schema, for a new import
  Counter* tuples_in = nullptr;  // entente_import_tuples_total{stream}, set once

  std::mutex mu;
  std::string state = "connecting";  // REQUIRES: mu
  std::string reason;                // REQUIRES: mu
  std::optional<certs::Identity> owner;  // REQUIRES: mu; the node in use
  uint32_t channel = 0;              // REQUIRES: mu; 0: no channel
  uint64_t generation = 0;           // REQUIRES: mu; bumps per OPEN
  // REQUIRES: mu. The generation of the last channel the owner ended with
  // RESET: what it sent before still gets acknowledged as it becomes
  // durable, so the owner charges it (docs/protocol.md §9.3).
  uint64_t ended_generation = 0;
  bool asked_from_start = false;     // REQUIRES: mu; OPEN had from_seq 0
  size_t node_index = 0;             // REQUIRES: mu; next node of the domain to try
  uint64_t next_expected = 0;        // REQUIRES: mu; next owner seq to accept (incl. in flight)
  // REQUIRES: mu. The owner filtered tuples out: the mirror's numbers are
  // its own, and the owner's position is kept under import-pos/NAME.
  bool diverged = false;
  uint64_t window = 0;               // REQUIRES: mu; credit the owner still has
  uint64_t acked = 0;                // REQUIRES: mu
  uint64_t tuples = 0;               // REQUIRES: mu
  Clock::time_point retry_at{};      // REQUIRES: mu; re-open then, when set
  struct Pending {
    Peering::ImportDone done;
    Clock::time_point deadline;
  };
  std::vector<Pending> pending;  // REQUIRES: mu
};

// ---------------------------------------------------------------------------

Peering::Peering(NodeImpl& node, const FederationConfig& config)
    : node_(node), config_(config), self_{node.config().domain, node.config().node} {}

Peering::~Peering() { stop(); }

void Peering::log(const std::string& line) const {
  std::fprintf(stderr, "entente: %s\n", line.c_str());
}

std::string Peering::local_name(const std::string& stream) const {
  auto parts = split_stream(stream);
  if (parts && parts->first == self_.domain) return parts->second;
  return stream;
}

bool Peering::is_remote(const std::string& stream) const {
  auto parts = split_stream(stream);
  return parts && parts->first != self_.domain;
}

namespace {

// A CA file's text, for comparing pins across a reload; at most 1 MiB (a
// CA file is a few KiB). Empty when unreadable.
std::string read_pem(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string out(1 << 20, '\0');
  in.read(out.data(), static_cast<std::streamsize>(out.size()));
  out.resize(static_cast<size_t>(std::max<std::streamsize>(0, in.gcount())));
  return out;
}

std::map<std::string, std::string> pinned_pems(const FederationConfig& c, const std::string& self_domain) {
  std::map<std::string, std::string> out;
  out[self_domain] = read_pem(c.ca_file);
  for (const PeerDomainConfig& d : c.peers) {
    if (d.domain != self_domain) out[d.domain] = read_pem(d.ca_file);
  }
  return out;
}

// The certificate must be this node's: a misplaced file would otherwise
// only show as every peer refusing the link.
Status check_own_certificate(const std::string& cert_file, const certs::Identity& self) {
  auto info = certs::read_certificate(cert_file);
  if (!info.ok()) return make_error(Errc::invalid_argument, "federation.cert_file: " + info.error().message);
  if (!info->identity || !(*info->identity == self)) {
    return make_error(Errc::invalid_argument,
                      "federation.cert_file: " + cert_file + " is the certificate of " +
                          (info->identity ? info->identity->uri() : std::string("no entente identity")) +
                          ", not of this node " + self.uri());
  }
  return {};
}

}  // namespace

Status Peering::start() {
  auto trust = std::make_shared<certs::TrustStore>();
  if (Status s = trust->pin(self_.domain, config_.ca_file); !s.ok()) {
    return make_error(Errc::invalid_argument, "federation.ca_file: " + s.error().message);
  }
  federation::LinkOptions lo;
  lo.self = self_;
  lo.listen_host = config_.listen_host;
  lo.listen_port = config_.listen_port;
  lo.cert_file = config_.cert_file;
  lo.key_file = config_.key_file;
  lo.heartbeat_interval = std::chrono::milliseconds(config_.heartbeat_interval_ms);
  lo.failure_timeout = std::chrono::milliseconds(config_.failure_timeout_ms);
  lo.max_frame = config_.max_frame;
  lo.max_connections = config_.max_connections;
  lo.max_connections_per_address = config_.max_connections_per_address;
  lo.max_handshaking_connections = config_.max_handshaking_connections;
  lo.handshake_timeout = std::chrono::milliseconds(config_.handshake_timeout_ms);
  lo.log = [](std::string_view line) {
    std::fprintf(stderr, "entente: %.*s\n", static_cast<int>(line.size()), line.data());
  };
  for (size_t i = 0; i < config_.peers.size(); ++i) {
    const PeerDomainConfig& d = config_.peers[i];
    if (d.domain != self_.domain) {
      if (Status s = trust->pin(d.domain, d.ca_file); !s.ok()) {
        return make_error(Errc::invalid_argument, "federation.peers[" + std::to_string(i) +
                                                      "].ca_file: " + s.error().message);
      }
    }
    for (const PeerNodeConfig& n : d.nodes) {
      if (d.domain == self_.domain && n.node == self_.node) continue;
      lo.peers.push_back({{d.domain, n.node}, n.host, n.port});
    }
  }
  ENTENTE_RETURN_IF_ERROR(check_own_certificate(config_.cert_file, self_));
  trust_ = trust;
  lo.trust = std::move(trust);
  pinned_pems_ = pinned_pems(config_, self_.domain);
  {
    std::lock_guard lock(peers_mu_);
    peers_ = std::make_shared<const std::vector<PeerDomainConfig>>(config_.peers);
  }

  // Contracts: this node signs with its own key; the ledger is in the store.
  auto signer = certs::Signer::load(config_.key_file, config_.cert_file);
  if (!signer.ok()) return make_error(Errc::invalid_argument, "federation.key_file: " + signer.error().message);
  std::vector<std::string> peer_domains;
  for (const PeerDomainConfig& d : config_.peers) {
    if (d.domain != self_.domain &&
        std::find(peer_domains.begin(), peer_domains.end(), d.domain) == peer_domains.end()) {
      peer_domains.push_back(d.domain);
    }
  }
  Contracting::Hooks hooks;
  hooks.send_to_domain = [this](const std::string& domain, const std::string& message) {
    return send_to_domain(domain, message);
  };
  hooks.send_to_peer = [this](const certs::Identity& peer, const std::string& message) {
    auto* links = this->links();
    return links != nullptr && links->send(peer, FrameType::control, 0, message).ok();
  };
  hooks.changed = [this](const contracts::Contract& c) {
    recheck_contracts();
    retry_refused_imports(c);
    check_offer(c);
  };
  hooks.log = [this](const std::string& line) { log(line); };
  auto contracting = Contracting::open(node_.store(), std::move(*signer), trust_,
                                       std::move(peer_domains), node_.metrics(), std::move(hooks));
  if (!contracting.ok()) return contracting.error();
  contracting_ = std::move(*contracting);

  // What importing domains acknowledged before the restart.
  Status scanned = node_.store().scan(store::Cf::meta, kAckPrefix, [this](std::string_view key,
                                                                          std::string_view value) {
    if (value.size() < 8) return true;
    const std::string_view rest = key.substr(std::char_traits<char>::length(kAckPrefix));
    const auto slash = rest.rfind('/');
    if (slash == std::string_view::npos) return true;
    acks_[std::string(rest.substr(0, slash))][std::string(rest.substr(slash + 1))] =
        store::get_key_u64(value);
    return true;
  });
  if (!scanned.ok()) return scanned;
  // Ranges sent under a contract before the restart and not charged yet:
  // an acknowledgement or an OPEN from the consumer charges them now.
  scanned = node_.store().scan(store::Cf::meta, kUnbilledPrefix, [this](std::string_view key,
                                                                        std::string_view value) {
    const std::string_view rest = key.substr(std::char_traits<char>::length(kUnbilledPrefix));
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos || rest.size() < slash + 1 + 1 + 9 || rest[rest.size() - 9] != '/' ||
        value.size() <= 16) {
      log("federation: ignoring a malformed unbilled range in the store");
      return true;
    }
    const std::string domain(rest.substr(0, slash));
    const std::string stream(rest.substr(slash + 1, rest.size() - 9 - slash - 1));
    unbilled_[{stream, domain}][store::get_key_u64(rest.substr(rest.size() - 8))] =
        Unbilled{store::get_key_u64(value), store::get_key_u64(value.substr(8)), std::string(value.substr(16))};
    return true;
  });
  if (!scanned.ok()) return scanned;
  // Where imports whose mirror numbers its own rows stand at their owner.
  std::map<std::string, uint64_t> positions;
  scanned = node_.store().scan(store::Cf::meta, kImportPosPrefix, [&positions](std::string_view key,
                                                                                std::string_view value) {
    if (value.size() >= 8) {
      positions[std::string(key.substr(std::char_traits<char>::length(kImportPosPrefix)))] =
          store::get_key_u64(value);
    }
    return true;
  });
  if (!scanned.ok()) return scanned;

  // Imports from the catalog resume when their owner's link comes up.
  for (auto& s : node_.list_streams()) {
    if (s->meta().producer != "import") continue;
    auto parts = split_stream(s->meta().name);
    if (!parts) continue;
    auto imp = std::make_shared<Import>();
    imp->name = s->meta().name;
    imp->tuples_in = &import_counter(imp->name);
    imp->domain = parts->first;
    imp->mirror = s;
    imp->next_expected = s->next_seq();
    if (auto pos = positions.find(imp->name); pos != positions.end()) {
      imp->next_expected = pos->second;
      imp->diverged = true;
    }
    // Everything before it is durable here: acknowledged, as far as the
    // owner is concerned (the next OPEN starts after it).
    imp->acked = imp->next_expected - 1;
    imports_[imp->name] = imp;
  }

  auto links = federation::LinkManager::start(std::move(lo), *this);
  if (!links.ok()) return links.error();
  {
    std::lock_guard lock(mu_);
    links_ = std::move(*links);
  }
  register_collectors();
  timer_ = std::thread([this] { timer_loop(); });
  log("federation listening on " + config_.listen_host + ":" + std::to_string(links_->port()) +
      " as " + self_.uri());
  return {};
}

void Peering::stop() {
  {
    std::lock_guard lock(timer_mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  timer_cv_.notify_all();
  if (timer_.joinable()) timer_.join();
  std::vector<std::shared_ptr<ExportSender>> senders;
  {
    std::lock_guard lock(mu_);
    for (auto& [k, s] : senders_) senders.push_back(s);
    senders_.clear();
  }
  for (auto& s : senders) s->stop();
  if (links_) links_->stop();
  if (contracting_) contracting_->flush_usage();
}

uint16_t Peering::port() const { return links_ ? links_->port() : 0; }

// ---------------------------------------------------------------------------
// Link events.

void Peering::on_link_up(const certs::Identity& peer) {
  if (contracting_) contracting_->on_link_up(peer);
  // Imports of the peer's domain without a channel open one now.
  for (auto& imp : imports_of(peer.domain)) {
    {
      std::lock_guard lock(imp->mu);
      if (imp->channel != 0) continue;
      imp->node_index = 0;
    }
    open_import(imp);
  }
}

void Peering::on_link_down(const certs::Identity& peer, std::string_view reason) {
  const std::string uri = peer.uri();
  std::vector<std::shared_ptr<ExportSender>> senders;
  std::vector<std::shared_ptr<Import>> imports;
  {
    std::lock_guard lock(mu_);
    for (auto it = senders_.begin(); it != senders_.end();) {
      if (it->first.first == uri) {
        senders.push_back(it->second);
        it = senders_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = import_channels_.begin(); it != import_channels_.end();) {
      if (it->first.first == uri) {
        imports.push_back(it->second);
        it = import_channels_.erase(it);
      } else {
        ++it;
      }
    }
    // Channel numbers belong to the link: ended channels go with it. What
    // they left uncharged is charged by the consumer's next OPEN.
    for (auto it = ended_.begin(); it != ended_.end();) {
      it = it->first.first == uri ? ended_.erase(it) : std::next(it);
    }
  }
  for (auto& s : senders) s->stop();
  // A channel the owner ended belonged to this link: a later link may use
  // its number for another stream, so nothing more is acknowledged on it.
  for (auto& imp : imports_of(peer.domain)) {
    std::lock_guard lock(imp->mu);
    if (imp->owner && *imp->owner == peer) imp->ended_generation = 0;
  }
  for (auto& imp : imports) {
    std::lock_guard lock(imp->mu);
    imp->channel = 0;
    ++imp->generation;
    if (imp->state != "refused") {
      imp->state = "connecting";
      imp->reason = "link to " + uri + " down: " + std::string(reason);
    }
  }
}

void Peering::on_frame(const certs::Identity& peer, FrameType type, uint32_t channel,
                       std::string_view payload) {
  const ChannelKey key{peer.uri(), channel};
  if (type == FrameType::control) {
    if (contracting_) contracting_->on_control(peer, payload);
    return;
  }
  if (type == FrameType::open) {
    on_open(peer, channel, payload);
    return;
  }
  if (type == FrameType::credit || type == FrameType::ack || type == FrameType::reset) {
    std::shared_ptr<ExportSender> sender;
    bool ended = false;
    {
      std::lock_guard lock(mu_);
      if (auto it = senders_.find(key); it != senders_.end()) {
        sender = it->second;
        if (type == FrameType::reset) senders_.erase(it);
      } else if (auto e = ended_.find(key); e != ended_.end()) {
        // A channel this node ended (its contract is no longer in force):
        // acknowledgements of what it sent still come, and are charged.
        sender = e->second;
        ended = true;
        if (type == FrameType::reset) ended_.erase(e);
      }
    }
    if (!sender) {
      if (type != FrameType::reset) return;  // a closed channel: discard
    } else if (type == FrameType::reset) {
      if (!ended) sender->stop();
      return;
    } else if (type == FrameType::credit) {
      if (ended) return;
      auto c = federation::decode_credit(payload);
      if (c.ok()) sender->on_credit(c->bytes);
      return;
    } else {
      auto a = federation::decode_ack(payload);
      if (a.ok()) sender->on_ack(a->through);
      if (ended && sender->all_acknowledged()) {
        std::lock_guard lock(mu_);
        if (auto e = ended_.find(key); e != ended_.end() && e->second == sender) ended_.erase(e);
      }
      return;
    }
  }
  auto imp = find_import_by_channel(key);
  if (imp) import_frame(imp, type, payload);
}

// ---------------------------------------------------------------------------
// Owner side.

void Peering::on_open(const certs::Identity& peer, uint32_t channel, std::string_view payload) {
  auto reset = [&](WireError code, const std::string& reason) {
    (void)links_->send(peer, FrameType::reset, channel,
                       federation::encode(federation::Reset{code, reason}));
  };
  auto open = federation::decode_open(payload);
  if (!open.ok()) {
    reset(WireError::protocol, open.error().message);
    return;
  }
  const ChannelKey key{peer.uri(), channel};
  {
    std::lock_guard lock(mu_);
    if (senders_.count(key)) {
      reset(WireError::protocol, "channel " + std::to_string(channel) + " is in use");
      return;
    }
  }
  auto parts = split_stream(open->stream);
  if (!parts || parts->first != self_.domain) {
    reset(WireError::not_found, "this node is " + self_.uri() + "; it serves streams of domain " +
                                    self_.domain + ", not " + open->stream);
    return;
  }
  const std::string& name = parts->second;
  // The consumer holds everything before from_seq, whatever the answer: what
  // it received of that under a contract is charged now, even when this
  // OPEN is refused (the contract ended while tuples were in flight).
  if (open->from_seq > 1) bill_through(name, peer.domain, open->from_seq - 1, false);
  // Deny by default, and before saying whether the stream exists: an
  // in-force stream contract covers it, or else a configured export.
  std::string contract_id;
  std::vector<std::string> fields;
  std::string predicate_text;
  uint64_t rate_cap = 0;
  auto covered = contracting_ ? contracting_->ledger().find_stream_contract(
                                    self_.domain, peer.domain, name, wall_clock_ms())
                              : Result<contracts::Contract>(Error{Errc::not_found, ""});
  const ExportConfig* rule = nullptr;
  if (covered.ok()) {
    contract_id = covered->id;
    const contracts::StreamTerms& terms = covered->current().terms.stream;
    fields = terms.fields;
    predicate_text = terms.predicate;
    rate_cap = terms.rate_cap;
  } else {
    for (const auto& e : config_.exports) {
      if (e.stream == name && std::find(e.to.begin(), e.to.end(), peer.domain) != e.to.end()) {
        rule = &e;
        break;
      }
    }
    if (rule == nullptr) {
      // Say why a contract does not cover it when one exists (expired,
      // revoked, not yet active); else the plain refusal.
      const std::string why = covered.error().code == Errc::permission_denied
                                  ? covered.error().message
                                  : "stream " + open->stream + " is not exported to domain " +
                                        peer.domain + " (no stream contract covers it)";
      reset(WireError::not_exported, why);
      log("federation: refused " + peer.uri() + " opening " + open->stream + ": " + why);
      return;
    }
    fields = rule->fields;
  }
  StreamPtr stream = node_.find_stream(name);
  if (!stream) {
    reset(WireError::not_found, "no stream " + open->stream + " on " + self_.uri());
    return;
  }
  // The predicate reads the stream's own fields, before the projection: it
  // may test a field the consumer does not see.
  std::optional<engine::Expr> predicate;
  if (!predicate_text.empty()) {
    auto compiled = engine::Expr::compile(predicate_text, *stream->meta().schema);
    std::string problem;
    if (!compiled.ok()) {
      problem = compiled.error().message;
    } else if (compiled->type() != engine::Type::Bool) {
      problem = "it is of type " + std::string(engine::type_name(compiled->type())) + ", not bool";
    }
    if (!problem.empty()) {
      const std::string why = "stream contract " + contract_id +
                              " has a predicate that does not apply to " + open->stream + ": " + problem;
      reset(WireError::not_exported, why);
      log("federation: refused " + peer.uri() + " opening " + open->stream + ": " + why);
      return;
    }
    predicate = std::move(*compiled);
  }
  std::vector<size_t> projection;
  engine::SchemaPtr schema = stream->meta().schema;
  if (!fields.empty()) {
    std::vector<engine::Field> kept;
    for (const auto& f : fields) {
      auto idx = schema->index_of(f);
      if (!idx) {
        reset(WireError::not_exported,
              (contract_id.empty() ? "the export of " + open->stream
                                   : "stream contract " + contract_id) +
                  " names field '" + f + "', which the stream does not have (" +
                  schema->to_string() + ")");
        return;
      }
      projection.push_back(*idx);
      kept.push_back(schema->field(*idx));
    }
    schema = engine::make_schema(std::move(kept));
  }
  // Where to start: from_seq 0 is the oldest retained tuple.
  const uint64_t head = stream->committed_next();
  uint64_t first_retained = head;
  auto first = store::StreamLog::first(node_.store(), stream->meta().id);
  if (first.ok() && *first) first_retained = (*first)->first;
  uint64_t from = open->from_seq == 0 ? first_retained : open->from_seq;
  if (from > head) {
    reset(WireError::bad_position, "from_seq " + std::to_string(from) + " is beyond the head " +
                                       std::to_string(head) + " of " + open->stream);
    return;
  }
  if (from < first_retained) {
    reset(WireError::bad_position, "sequence number " + std::to_string(from) + " of " +
                                       open->stream + " is no longer retained; the oldest is " +
                                       std::to_string(first_retained));
    return;
  }
  // The consumer holds everything before `from`: what it received of that
  // on an earlier channel is charged now, what came after is sent again.
  bill_through(name, peer.domain, from - 1, true);
  federation::OpenOk ok;
  ok.schema_json = engine::schema_to_json(*schema);
  ok.first_seq = std::max<uint64_t>(first_retained, 1);
  ok.next_seq = std::max<uint64_t>(head, ok.first_seq);
  if (!links_->send(peer, FrameType::open_ok, channel, federation::encode(ok)).ok()) return;

  // The link refuses a frame over the peer's own limit; the sender then
  // halves its frames (send_locked).
  const size_t max_payload = config_.max_frame;
  ExportSender::Terms terms;
  terms.projection = std::move(projection);
  terms.schema = schema;
  terms.predicate = std::move(predicate);
  if (rate_cap > 0) terms.limiter = limiter_for(contract_id, rate_cap);
  terms.contract = contract_id;
  auto sender = std::make_shared<ExportSender>(
      *this, peer, channel, stream, std::move(terms), from, open->credit, max_payload,
      &node_.metrics().counter("entente_export_tuples_total", "Tuples sent to an importing domain",
                               {{"stream", name}, {"peer", peer.uri()}}));
  {
    std::lock_guard lock(mu_);
    senders_[key] = sender;
  }
  log("federation: " + peer.uri() + " opened " + open->stream + " from " + std::to_string(from) +
      (contract_id.empty() ? " (configured export)" : " under contract " + contract_id));
  sender->start();
}

Counter& Peering::import_counter(const std::string& stream) {
  return node_.metrics().counter("entente_import_tuples_total",
                                 "Tuples received from another domain's stream", {{"stream", stream}});
}

void Peering::count_tuples(const std::string& peer, uint64_t in, uint64_t out) {
  std::lock_guard lock(count_mu_);
  auto& c = tuples_[peer];
  c.first += in;
  c.second += out;
}

void Peering::record_ack(const std::string& stream, const std::string& domain, uint64_t through) {
  {
    std::lock_guard lock(mu_);
    uint64_t& a = acks_[stream][domain];
    if (through <= a) return;
    a = through;
  }
  // Buffered: losing the newest value in a crash only keeps more of the log.
  std::string v;
  store::put_key_u64(v, through);
  (void)node_.store().put(store::Cf::meta, ack_key(stream, domain), v, store::Durability::buffered);
}

std::optional<uint64_t> Peering::retention_pin(const std::string& stream) const {
  // The domains the stream is shared with now: configured exports and
  // in-force stream contracts. A domain no longer shared with pins nothing.
  std::vector<std::string> domains;
  for (const auto& e : config_.exports) {
    if (e.stream == stream) domains.insert(domains.end(), e.to.begin(), e.to.end());
  }
  if (contracting_) {
    contracts::ContractFilter f;
    f.state = contracts::State::active;
    f.kind = contracts::Kind::stream;
    const int64_t now = wall_clock_ms();
    for (const auto& c : contracting_->ledger().list(f, now)) {
      const auto& t = c.current().terms.stream;
      if (t.provider == self_.domain && c.in_force(now) &&
          std::find(t.streams.begin(), t.streams.end(), stream) != t.streams.end()) {
        domains.push_back(t.consumer);
      }
    }
  }
  std::optional<uint64_t> pin;
  auto lower = [&pin](uint64_t need) { pin = pin ? std::min(*pin, need) : need; };
  std::vector<std::shared_ptr<ExportSender>> open;
  {
    std::lock_guard lock(mu_);
    if (auto it = acks_.find(stream); it != acks_.end()) {
      for (const auto& domain : domains) {
        // A domain that never acknowledged was promised only what its open
        // channel was sent (below).
        auto a = it->second.find(domain);
        if (a != it->second.end()) lower(a->second + 1);
      }
    }
    for (const auto& [key, sender] : senders_) {
      if (sender->stream()->meta().name == stream) open.push_back(sender);
    }
  }
  // An open channel keeps what it may still have to send again: everything
  // after its last acknowledgement, or from where it started.
  for (const auto& sender : open) lower(sender->unacknowledged_from());
  return pin;
}

// ---------------------------------------------------------------------------
// Importer side.

void Peering::create_import(const std::string& stream, engine::SchemaPtr expected, ImportDone done,
                            std::chrono::milliseconds timeout) {
  auto parts = split_stream(stream);
  if (!parts) {
    done(make_error(Errc::invalid_argument, "'" + stream + "' is not DOMAIN/NAME"));
    return;
  }
  if (parts->first == self_.domain) {
    done(make_error(Errc::invalid_argument,
                    stream + " is a stream of this node's own domain; use it as '" +
                        parts->second + "'"));
    return;
  }
  const auto peers = peer_domains();
  const bool known = std::any_of(peers->begin(), peers->end(),
                                 [&](const PeerDomainConfig& d) { return d.domain == parts->first; });
  if (!known) {
    done(make_error(Errc::not_found, "domain " + parts->first +
                                         " is not a configured peer (federation.peers)"));
    return;
  }
  std::shared_ptr<Import> imp;
  bool exists = false;
  {
    std::lock_guard lock(mu_);
    exists = imports_.count(stream) > 0;
    if (!exists) {
      imp = std::make_shared<Import>();
      imp->name = stream;
      imp->tuples_in = &import_counter(stream);
      imp->domain = parts->first;
      imp->expected = std::move(expected);
      imports_[stream] = imp;
    }
  }
  if (exists) {
    // Outside the lock: the callback may read import states.
    done(make_error(Errc::already_exists, "stream " + stream + " is imported already"));
    return;
  }
  {
    std::lock_guard lock(imp->mu);
    imp->pending.push_back({std::move(done), Clock::now() + timeout});
  }
  open_import(imp);
}

void Peering::open_import(const std::shared_ptr<Import>& imp) {
  std::lock_guard lock(imp->mu);
  if (imp->channel != 0 || !links_) return;
  const auto peers = peer_domains();
  const PeerDomainConfig* domain = nullptr;
  for (const auto& d : *peers) {
    if (d.domain == imp->domain) domain = &d;
  }
  if (domain == nullptr) return;
  // The first node of the domain, from node_index on, whose link is up.
  std::optional<certs::Identity> owner;
  for (size_t i = imp->node_index; i < domain->nodes.size(); ++i) {
    certs::Identity id{imp->domain, domain->nodes[i].node};
    if (links_->is_up(id)) {
      owner = id;
      imp->node_index = i;
      break;
    }
  }
  if (!owner) {
    if (imp->state != "refused") {
      imp->state = "connecting";
      imp->reason = "no link to a node of domain " + imp->domain + " is up";
    }
    return;
  }
  auto channel = links_->new_channel(*owner);
  if (!channel.ok()) return;
  federation::Open open;
  open.stream = imp->name;
  // Nothing stored and no position kept: from the oldest the owner retains.
  // Appends still in the group commit count: next_seq(), not committed_next().
  // Unless the numbering diverged (a predicate), the mirror's next number is
  // where the owner resumes.
  const uint64_t mirror_next = imp->mirror ? imp->mirror->next_seq() : 1;
  const bool fresh = mirror_next <= 1 && !imp->diverged;
  if (imp->mirror && !imp->diverged) imp->next_expected = mirror_next;
  open.from_seq = fresh ? 0 : imp->next_expected;
  open.credit = config_.import_window;
  imp->window = open.credit;
  imp->asked_from_start = fresh;
  imp->owner = owner;
  imp->channel = *channel;
  ++imp->generation;
  imp->retry_at = {};
  {
    std::lock_guard maps(mu_);
    import_channels_[{owner->uri(), *channel}] = imp;
  }
  if (!links_->send(*owner, FrameType::open, *channel, federation::encode(open)).ok()) {
    std::lock_guard maps(mu_);
    import_channels_.erase({owner->uri(), *channel});
    imp->channel = 0;
  }
}

std::vector<std::shared_ptr<Import>> Peering::imports_of(const std::string& domain) const {
  std::vector<std::shared_ptr<Import>> out;
  std::lock_guard lock(mu_);
  for (const auto& [name, imp] : imports_) {
    if (imp->domain == domain) out.push_back(imp);
  }
  return out;
}

std::shared_ptr<Import> Peering::find_import_by_channel(const ChannelKey& key) const {
  std::lock_guard lock(mu_);
  auto it = import_channels_.find(key);
  return it == import_channels_.end() ? nullptr : it->second;
}

ImportInfo Peering::info_of(const Import& imp) const {
  // REQUIRES: imp.mu held by the caller.
  ImportInfo i;
  i.stream = imp.name;
  i.owner = imp.owner ? imp.owner->uri() : "";
  i.state = imp.state;
  i.reason = imp.reason;
  i.schema = imp.mirror ? imp.mirror->meta().schema : imp.expected;
  i.next_seq = imp.mirror ? imp.mirror->next_seq() : 0;
  i.acked = imp.acked;
  i.tuples = imp.tuples;
  return i;
}

void Peering::finish_pending(const std::shared_ptr<Import>& imp, const Result<ImportInfo>& r,
                             Deferred& later) {
  // REQUIRES: imp->mu held. The callbacks run through `later`, once every
  // lock is released.
  auto pending = std::move(imp->pending);
  imp->pending.clear();
  for (auto& p : pending) later.add([done = std::move(p.done), r] { done(r); });
}

void Peering::import_frame(const std::shared_ptr<Import>& imp, FrameType type,
                           std::string_view payload) {
  Deferred later;  // before the lock: runs after it is released
  std::unique_lock lock(imp->mu);
  const uint64_t generation = imp->generation;
  const certs::Identity owner = imp->owner.value_or(certs::Identity{});
  const uint32_t channel = imp->channel;
  auto drop_channel = [&] {
    {
      std::lock_guard maps(mu_);
      import_channels_.erase({owner.uri(), channel});
    }
    imp->channel = 0;
    ++imp->generation;
  };
  auto reset_and_retry = [&](WireError code, const std::string& reason,
                             std::chrono::milliseconds after) {
    (void)links_->send(owner, FrameType::reset, channel,
                       federation::encode(federation::Reset{code, reason}));
    drop_channel();
    imp->state = "connecting";
    imp->reason = reason;
    imp->retry_at = Clock::now() + after;
  };

  if (type == FrameType::open_ok) {
    auto ok = federation::decode_open_ok(payload);
    if (!ok.ok()) {
      reset_and_retry(WireError::protocol, ok.error().message, std::chrono::seconds(1));
      return;
    }
    rapidjson::Document doc;
    doc.Parse(ok->schema_json.data(), ok->schema_json.size());
    auto schema = doc.HasParseError() ? Result<engine::Schema>(make_error(Errc::parse_error, "schema is not JSON"))
                                      : engine::schema_from_json(doc);
    if (!schema.ok()) {
      reset_and_retry(WireError::protocol, "the owner's schema: " + schema.error().message,
                      std::chrono::seconds(1));
      return;
    }
    auto sp = std::make_shared<const engine::Schema>(std::move(*schema));
    const engine::SchemaPtr want = imp->mirror ? imp->mirror->meta().schema : imp->expected;
    if (want && !(*want == *sp)) {
      const std::string why = imp->name + " has schema " + sp->to_string() + " at its owner, but " +
                              (imp->mirror ? "this node's mirror has " : "the query declares ") +
                              want->to_string();
      (void)links_->send(owner, FrameType::reset, channel,
                         federation::encode(federation::Reset{WireError::none, why}));
      drop_channel();
      imp->state = "refused";
      imp->reason = why;
      finish_pending(imp, make_error(Errc::conflict, why), later);
      if (!imp->mirror) {
        lock.unlock();
        std::lock_guard maps(mu_);
        imports_.erase(imp->name);
      }
      return;
    }
    if (!imp->mirror) {
      StreamMeta meta;
      meta.name = imp->name;
      meta.schema = sp;
      meta.producer = "import";
      const auto& r = node_.config().retention;
      meta.retention = {r.max_tuples, r.max_bytes, r.max_age_ms};
      // A position left by an earlier import of this name (deleted just
      // before a crash) does not belong to the new mirror.
      if (auto stale = node_.store().get(store::Cf::meta, import_pos_key(imp->name)); !stale.ok() || *stale) {
        (void)node_.store().erase(store::Cf::meta, import_pos_key(imp->name), store::Durability::synced);
      }
      auto mirror = node_.create_stream(std::move(meta));
      if (!mirror.ok()) {
        (void)links_->send(owner, FrameType::reset, channel,
                           federation::encode(federation::Reset{WireError::internal, mirror.error().message}));
        drop_channel();
        imp->state = "refused";
        imp->reason = mirror.error().message;
        finish_pending(imp, mirror.error(), later);
        lock.unlock();
        std::lock_guard maps(mu_);
        imports_.erase(imp->name);
        return;
      }
      imp->mirror = *mirror;
    }
    if (imp->asked_from_start) imp->next_expected = ok->first_seq;
    imp->state = "active";
    imp->reason.clear();
    log("federation: importing " + imp->name + " from " + owner.uri() + " at " +
        std::to_string(imp->next_expected));
    finish_pending(imp, info_of(*imp), later);
    return;
  }

  if (type == FrameType::reset) {
    auto r = federation::decode_reset(payload);
    const WireError code = r.ok() ? r->code : WireError::protocol;
    const std::string reason = r.ok() ? r->reason : r.error().message;
    imp->ended_generation = generation;
    drop_channel();
    // Another node of the domain may serve the stream.
    if (code == WireError::not_found) {
      const auto peers = peer_domains();
      const PeerDomainConfig* domain = nullptr;
      for (const auto& d : *peers) {
        if (d.domain == imp->domain) domain = &d;
      }
      if (domain && imp->node_index + 1 < domain->nodes.size()) {
        ++imp->node_index;
        imp->retry_at = Clock::now();
        return;
      }
    }
    const bool final_refusal = code == WireError::not_exported || code == WireError::not_found ||
                               code == WireError::bad_position;
    const std::string why = imp->domain + " refused " + imp->name + ": " + reason;
    imp->reason = why;
    if (final_refusal) {
      imp->state = "refused";
      log("federation: " + why);
      finish_pending(imp, make_error(errc_for(code), why), later);
      // The mirror's live subscribers learn why nothing more comes.
      if (imp->mirror) {
        later.add([mirror = imp->mirror, cause = feed_end_cause(imp->domain, reason), why] {
          mirror->end_feed(cause, why);
        });
      }
      if (!imp->mirror) {
        lock.unlock();
        std::lock_guard maps(mu_);
        imports_.erase(imp->name);
      }
    } else {
      imp->state = "connecting";
      imp->retry_at = Clock::now() + std::chrono::seconds(1);
    }
    return;
  }

  if (type != FrameType::data || imp->state != "active" || !imp->mirror) return;
  // The owner may not send beyond the credit it was given (docs/protocol.md §8).
  if (payload.size() > imp->window) {
    reset_and_retry(WireError::flow_control,
                    "DATA of " + std::to_string(payload.size()) + " bytes with a credit of " +
                        std::to_string(imp->window),
                    std::chrono::seconds(1));
    return;
  }
  imp->window -= payload.size();
  auto d = federation::decode_data(payload);
  if (!d.ok()) {
    reset_and_retry(WireError::protocol, d.error().message, std::chrono::seconds(1));
    return;
  }
  std::string_view body = d->body;
  auto batch = engine::decode_batch(body);
  uint64_t first = d->first_seq;
  const uint64_t last = first + d->count - 1;
  // The body holds the rows of first..last that passed the owner's filter
  // (all of them when nothing filters), each with its own number, ascending.
  bool numbered = batch.ok() && batch->seq.size() == batch->rows();
  if (numbered) {
    uint64_t prev = first - 1;
    for (uint64_t seq : batch->seq) {
      if (seq <= prev || seq > last) {
        numbered = false;
        break;
      }
      prev = seq;
    }
  }
  if (!batch.ok() || !body.empty() || batch->rows() > d->count || !numbered ||
      !batch->validate(engine::Batch::Check::full).ok() ||
      !(*batch->schema == *imp->mirror->meta().schema)) {
    reset_and_retry(WireError::protocol,
                    "DATA " + std::to_string(d->first_seq) + " of " + imp->name + " does not hold tuples of " +
                        std::to_string(d->first_seq) + ".." + std::to_string(last) +
                        " in order, of the stream's schema",
                    std::chrono::seconds(1));
    return;
  }
  const uint32_t credit_back = static_cast<uint32_t>(payload.size());
  if (last < imp->next_expected) {
    // All duplicates (a resend after a reconnect): drop, return the credit.
    if (links_->send(owner, FrameType::credit, channel,
                     federation::encode(federation::Credit{credit_back}))
            .ok()) {
      imp->window += credit_back;
    }
    return;
  }
  engine::Batch rows = std::move(*batch);
  // The tuples the DATA covers, every one of them there, under the owner's
  // numbers: the mirror may take them under those same numbers.
  bool whole = rows.rows() == d->count;
  if (first < imp->next_expected) {
    // Some are duplicates: keep those not stored yet.
    std::vector<uint32_t> keep;
    for (size_t i = 0; i < rows.rows(); ++i) {
      if (rows.seq[i] >= imp->next_expected) keep.push_back(static_cast<uint32_t>(i));
    }
    rows = rows.take(keep);
    first = imp->next_expected;
    whole = whole && rows.rows() == last - first + 1;
  } else if (first > imp->next_expected && !(imp->asked_from_start && imp->tuples == 0 && !imp->diverged &&
                                              imp->mirror->next_seq() <= 1)) {
    reset_and_retry(WireError::protocol,
                    "DATA starts at " + std::to_string(first) + ", expected " +
                        std::to_string(imp->next_expected),
                    std::chrono::milliseconds(100));
    return;
  }
  const size_t n = rows.rows();
  std::weak_ptr<Import> weak = imp;
  // ACK once the tuples (or the position past filtered ones) are durable.
  auto on_durable = [this, weak, generation, owner, channel, last](const Status& st) {
    auto imp = weak.lock();
    if (!imp) return;
    std::lock_guard lock(imp->mu);
    if (!st.ok()) {
      imp->reason = "storing " + imp->name + " failed: " + st.error().message;
      return;
    }
    imp->acked = std::max(imp->acked, last);
    // The channel is gone; unless the owner ended it, nobody waits for this.
    if (imp->generation != generation && imp->ended_generation != generation) return;
    // Durable now: the owner may release everything through `last`.
    (void)links_->send(owner, FrameType::ack, channel, federation::encode(federation::Ack{last}));
  };
  // The owner's position is kept apart from the mirror whenever the two
  // numberings differ, in the same atomic write as the rows.
  store::WriteBatch position;
  auto keep_position = [&] {
    std::string v;
    store::put_key_u64(v, last + 1);
    position.put(store::Cf::meta, import_pos_key(imp->name), v);
  };
  Status s;
  bool diverges = imp->diverged;
  if (n == 0) {
    // Every tuple of the range was filtered out: only the position moves,
    // through the group commit so that ACKs keep the commit order.
    keep_position();
    diverges = true;
    s = node_.gc().submit(std::move(position), std::move(on_durable), store::Admission::reject);
  } else {
    const uint64_t mirror_next = imp->mirror->next_seq();
    // The owner's numbers are kept while they fit: the run continues the
    // mirror (or starts an empty one that never diverged).
    const bool same_numbers = whole && (first == mirror_next || (mirror_next == 1 && !imp->diverged));
    if (whole && !same_numbers && !imp->diverged) {
      // The owner's numbers are the mirror's until a predicate first filters
      // a row out: whole tuples at another number are a bookkeeping fault,
      // never a reason to number them anew (that would store them twice).
      // The next OPEN starts from the mirror's next number (open_import).
      reset_and_retry(WireError::internal,
                      "DATA " + std::to_string(first) + " of " + imp->name + " does not continue the mirror at " +
                          std::to_string(mirror_next),
                      std::chrono::milliseconds(100));
      return;
    }
    const uint64_t at = same_numbers ? first : mirror_next;
    std::shared_ptr<const std::string> as_received;
    // The owner's bytes are stored as they are when they hold exactly the
    // tuples first..last under those numbers (no duplicate prefix cut).
    if (same_numbers && first == d->first_seq) {
      as_received = std::make_shared<const std::string>(std::move(d->body));
    }
    if (at + n != last + 1) {
      keep_position();
      diverges = true;
    }
    s = imp->mirror->append_at(
        at, std::move(rows), node_.gc(), store::Admission::reject, std::move(position),
        [on_durable = std::move(on_durable)](const Status& st, const RecordPtr&) { on_durable(st); },
        std::move(as_received));
  }
  if (!s.ok()) {
    // The group commit is full (or the mirror is going): start over from
    // what is stored, a little later; the owner keeps everything unacked.
    reset_and_retry(WireError::internal, "importer busy: " + s.error().message,
                    std::chrono::milliseconds(200));
    return;
  }
  imp->diverged = diverges;
  // Credit comes back as soon as the group commit holds the batch (its own
  // queue bound caps memory; a full queue resets the channel above), so the
  // owner keeps sending while the sync runs. ACK waits for durability.
  if (links_->send(owner, FrameType::credit, channel, federation::encode(federation::Credit{credit_back}))
          .ok()) {
    imp->window += credit_back;
  }
  imp->tuples += n;
  imp->next_expected = last + 1;
  count_tuples(owner.uri(), n, 0);
  if (imp->tuples_in) imp->tuples_in->inc(n);
}

std::vector<ImportInfo> Peering::imports() const {
  std::vector<std::shared_ptr<Import>> all;
  {
    std::lock_guard lock(mu_);
    for (auto& [n, imp] : imports_) all.push_back(imp);
  }
  std::vector<ImportInfo> out;
  for (auto& imp : all) {
    std::lock_guard lock(imp->mu);
    if (!imp->mirror) continue;  // still being created
    out.push_back(info_of(*imp));
  }
  return out;
}

std::optional<ImportInfo> Peering::import_info(const std::string& stream) const {
  std::shared_ptr<Import> imp;
  {
    std::lock_guard lock(mu_);
    auto it = imports_.find(stream);
    if (it == imports_.end()) return std::nullopt;
    imp = it->second;
  }
  std::lock_guard lock(imp->mu);
  if (!imp->mirror) return std::nullopt;
  return info_of(*imp);
}

Status Peering::forget_import(const std::string& stream) {
  std::shared_ptr<Import> imp;
  {
    std::lock_guard lock(mu_);
    auto it = imports_.find(stream);
    if (it == imports_.end() || !it->second->mirror) {
      return make_error(Errc::not_found, "no import of " + stream);
    }
    imp = it->second;
    imports_.erase(it);
  }
  std::lock_guard lock(imp->mu);
  if (imp->channel != 0 && imp->owner) {
    (void)links_->send(*imp->owner, FrameType::reset, imp->channel,
                       federation::encode(federation::Reset{WireError::none, "import deleted"}));
    std::lock_guard maps(mu_);
    import_channels_.erase({imp->owner->uri(), imp->channel});
  }
  imp->channel = 0;
  ++imp->generation;
  (void)node_.store().erase(store::Cf::meta, import_pos_key(imp->name), store::Durability::synced);
  return {};
}

bool Peering::send_to_domain(const std::string& domain, const std::string& message) {
  auto* links = this->links();
  if (links == nullptr) return false;
  for (const PeerDomainConfig& d : *peer_domains()) {
    if (d.domain != domain) continue;
    for (const PeerNodeConfig& n : d.nodes) {
      const certs::Identity id{d.domain, n.node};
      if (links->send(id, FrameType::control, 0, message).ok()) return true;
    }
  }
  return false;
}

void Peering::retry_refused_imports(const contracts::Contract& c) {
  const int64_t now = wall_clock_ms();
  const auto& t = c.current().terms;
  if (t.kind != contracts::Kind::stream || t.stream.consumer != self_.domain || !c.in_force(now)) return;
  std::vector<std::shared_ptr<Import>> refused;
  {
    std::lock_guard lock(mu_);
    for (auto& [name, imp] : imports_) {
      if (imp->domain != t.stream.provider) continue;
      auto parts = split_stream(name);
      if (parts && std::find(t.stream.streams.begin(), t.stream.streams.end(), parts->second) !=
                       t.stream.streams.end()) {
        refused.push_back(imp);
      }
    }
  }
  // An import the owner refused is tried again under the new contract, from
  // where its mirror stands.
  for (auto& imp : refused) {
    std::lock_guard lock(imp->mu);
    if (imp->state != "refused" || imp->channel != 0) continue;
    imp->state = "connecting";
    imp->reason = "trying again under stream contract " + c.id;
    imp->node_index = 0;
    imp->retry_at = Clock::now();
    log("federation: " + imp->name + ": " + imp->reason);
  }
}

void Peering::bill_sent(const std::string& stream, const std::string& domain, const std::string& contract,
                        uint64_t first, uint64_t last, uint64_t rows) {
  std::lock_guard lock(billing_mu_);
  auto& ranges = unbilled_[{stream, domain}];
  store::WriteBatch batch;
  // A range sent again (a second channel while a duplicate link lives, or
  // a frame split after the link refused it) replaces what it overlaps: a
  // position is charged at most once.
  auto it = ranges.upper_bound(last);
  while (it != ranges.begin()) {
    auto prev = std::prev(it);
    if (prev->second.last < first) break;
    if (prev->first != first) batch.erase(store::Cf::meta, unbilled_key(stream, domain, prev->first));
    it = ranges.erase(prev);
  }
  ranges[first] = Unbilled{last, rows, contract};
  std::string value;
  store::put_key_u64(value, last);
  store::put_key_u64(value, rows);
  value += contract;
  batch.put(store::Cf::meta, unbilled_key(stream, domain, first), value);
  // Durable before the DATA leaves, so that a restart of this node charges
  // it all the same. A failed write is logged; the range is still charged
  // while this node runs.
  if (Status s = node_.store().write(batch, store::Durability::buffered); !s.ok()) {
    log("federation: noting tuples " + std::to_string(first) + ".." + std::to_string(last) + " of " + stream +
        " sent under contract " + contract + " failed: " + s.error().message);
  }
}

void Peering::bill_through(const std::string& stream, const std::string& domain, uint64_t through,
                           bool forget_after) {
  std::lock_guard lock(billing_mu_);
  auto found = unbilled_.find({stream, domain});
  if (found == unbilled_.end()) return;
  auto& ranges = found->second;
  std::map<std::string, uint64_t> charge;  // contract -> rows
  store::WriteBatch batch;
  auto it = ranges.begin();
  for (; it != ranges.end() && it->second.last <= through; ++it) {
    charge[it->second.contract] += it->second.rows;
    batch.erase(store::Cf::meta, unbilled_key(stream, domain, it->first));
  }
  const auto charged_end = it;
  if (forget_after) {
    for (; it != ranges.end(); ++it) batch.erase(store::Cf::meta, unbilled_key(stream, domain, it->first));
  }
  if (batch.empty()) return;
  // The ranges go in the same atomic write that adds them to the usage:
  // each is charged once, whatever stops when.
  Status written = contracting_ ? contracting_->ledger().add_usage_with(charge, std::move(batch))
                                : node_.store().write(batch, store::Durability::buffered);
  if (!written.ok()) {
    // Kept, in memory and in the store: the next acknowledgement tries again.
    log("federation: charging tuples through " + std::to_string(through) + " of " + stream + " to " + domain +
        " failed: " + written.error().message);
    return;
  }
  ranges.erase(ranges.begin(), forget_after ? ranges.end() : charged_end);
  if (ranges.empty()) unbilled_.erase(found);
}

void Peering::check_offer(const contracts::Contract& c) {
  const contracts::Version& v = c.current();
  if (v.by == self_.domain || v.terms.kind != contracts::Kind::stream || v.terms.stream.provider != self_.domain ||
      (v.state != contracts::State::proposed && v.state != contracts::State::countered)) {
    return;
  }
  Diagnostics diag;
  contracts::check_stream_catalog(
      v.terms,
      [this](const std::string& name) -> engine::SchemaPtr {
        auto s = node_.find_stream(name);
        return s ? s->meta().schema : nullptr;
      },
      diag);
  if (diag.ok()) return;
  std::string problems;
  for (const auto& d : diag.items()) problems += (problems.empty() ? "" : "; ") + d.path + ": " + d.message;
  log("contracts: " + v.by + "'s offer " + std::to_string(v.number) + " of " + c.id +
      " cannot be accepted as it stands (counter or reject it): " + problems);
}

std::shared_ptr<RateLimiter> Peering::limiter_for(const std::string& contract, uint64_t per_second) {
  std::lock_guard lock(mu_);
  auto& l = limiters_[contract];
  // A contract's terms do not change once it is in force; the check only
  // guards against a reused id.
  if (!l || l->rate() != per_second) l = std::make_shared<RateLimiter>(per_second);
  return l;
}

void Peering::tick_senders() {
  std::vector<std::shared_ptr<ExportSender>> all;
  {
    std::lock_guard lock(mu_);
    all.reserve(senders_.size());
    for (auto& [k, s] : senders_) all.push_back(s);
  }
  for (auto& s : all) s->tick();
}

void Peering::recheck_contracts() {
  if (!contracting_) return;
  std::vector<std::pair<ChannelKey, std::shared_ptr<ExportSender>>> under_contract;
  {
    std::lock_guard lock(mu_);
    for (auto& [k, s] : senders_) {
      if (!s->contract().empty()) under_contract.emplace_back(k, s);
    }
  }
  const int64_t now = wall_clock_ms();
  for (auto& [key, sender] : under_contract) {
    const std::string& stream = sender->stream()->meta().name;
    auto mine = contracting_->ledger().get(sender->contract());
    if (mine.ok() && mine->in_force(now)) continue;
    // Its contract ended: the channel ends with the reason, which the
    // importing domain shows in its import's (and query's) status.
    std::string why = "stream contract " + sender->contract() + " is no longer in force";
    if (mine.ok() && mine->state_at(now) == contracts::State::revoked) {
      const auto& v = mine->current();
      why = "stream contract " + sender->contract() + " was revoked by " + v.by +
            (v.reason.empty() ? "" : ": " + v.reason);
    } else if (mine.ok() && mine->state_at(now) == contracts::State::expired) {
      why = "stream contract " + sender->contract() + " expired at " +
            contracts::format_time(mine->current().terms.valid_until_ms);
    }
    {
      std::lock_guard lock(mu_);
      auto it = senders_.find(key);
      if (it == senders_.end() || it->second != sender) continue;
      senders_.erase(it);
      // Tuples in flight are stored and acknowledged after the end: their
      // acknowledgements are charged to this contract (on_frame).
      if (ended_.size() >= kMaxEndedChannels) ended_.erase(ended_.begin());
      ended_[key] = sender;
    }
    sender->end(WireError::not_exported, why);
    log("federation: ended " + stream + " to " + sender->peer().uri() + ": " + why);
  }
}

void Peering::timer_loop() {
  std::unique_lock lock(timer_mu_);
  auto next_usage_flush = Clock::now() + std::chrono::seconds(1);
  while (!stopping_) {
    timer_cv_.wait_for(lock, std::chrono::milliseconds(100));
    if (stopping_) break;
    lock.unlock();
    // Contracts end on time: within one timer tick of valid_until.
    recheck_contracts();
    tick_senders();
    if (contracting_ && Clock::now() >= next_usage_flush) {
      contracting_->flush_usage();
      next_usage_flush = Clock::now() + std::chrono::seconds(1);
    }
    std::vector<std::shared_ptr<Import>> all;
    {
      std::lock_guard maps(mu_);
      for (auto& [n, imp] : imports_) all.push_back(imp);
    }
    const auto now = Clock::now();
    for (auto& imp : all) {
      bool reopen = false;
      bool forget = false;
      Deferred later;
      {
        std::lock_guard il(imp->mu);
        std::vector<Import::Pending> expired;
        for (auto it = imp->pending.begin(); it != imp->pending.end();) {
          if (it->deadline <= now) {
            expired.push_back(std::move(*it));
            it = imp->pending.erase(it);
          } else {
            ++it;
          }
        }
        for (auto& p : expired) {
          Error e{Errc::unavailable, "no answer about " + imp->name + " from domain " + imp->domain +
                                         (imp->reason.empty() ? std::string() : " (" + imp->reason + ")")};
          later.add([done = std::move(p.done), e] { done(e); });
        }
        if (!expired.empty() && !imp->mirror) forget = true;
        if (imp->channel == 0 && imp->retry_at != Clock::time_point{} && imp->retry_at <= now) {
          imp->retry_at = {};
          reopen = true;
        }
      }
      if (forget) {
        std::lock_guard maps(mu_);
        for (auto it = import_channels_.begin(); it != import_channels_.end();) {
          it = it->second == imp ? import_channels_.erase(it) : std::next(it);
        }
        imports_.erase(imp->name);
        continue;
      }
      if (reopen) open_import(imp);
    }
    lock.lock();
  }
}

// ---------------------------------------------------------------------------
// Status.

std::string Peering::peers_json() const {
  JsonOut j;
  j.begin_object();
  j.key("self").str(self_.uri());
  j.key("listen").str(config_.listen_host + ":" + std::to_string(port()));
  j.key("refusals").begin_object();
  if (links_) {
    for (const auto& [label, n] : links_->refusals()) j.key(label).u64(n);
  }
  j.end_object();
  j.key("peers").begin_array();
  if (links_) {
    for (const auto& p : links_->peers()) {
      j.begin_object();
      j.key("identity").str(p.identity.uri());
      j.key("domain").str(p.identity.domain);
      j.key("node").str(p.identity.node);
      j.key("state").str(p.state);
      j.key("dialed").boolean(p.dialed);
      j.key("address").str(p.address);
      j.key("rtt_us").i64(p.rtt_us);
      j.key("last_heartbeat_ms").i64(p.last_heartbeat_ms);
      j.key("bytes_in").u64(p.bytes_in);
      j.key("bytes_out").u64(p.bytes_out);
      j.key("frames_in").u64(p.frames_in);
      j.key("frames_out").u64(p.frames_out);
      {
        std::lock_guard lock(count_mu_);
        auto it = tuples_.find(p.identity.uri());
        j.key("tuples_in").u64(it == tuples_.end() ? 0 : it->second.first);
        j.key("tuples_out").u64(it == tuples_.end() ? 0 : it->second.second);
      }
      j.key("connects").u64(p.connects);
      j.key("last_error").str(p.last_error);
      j.key("refusal").str(p.refusal);
      j.end_object();
    }
  }
  j.end_array();
  // Connections this listener refused (or whose client refused this node),
  // by the identity their certificate claimed, or by address.
  j.key("refused").begin_array();
  if (links_) {
    for (const auto& r : links_->refused()) {
      j.begin_object();
      j.key("identity").str(r.identity);
      j.key("address").str(r.address);
      j.key("refusal").str(r.refusal);
      j.key("reason").str(r.reason);
      j.key("by").str(r.by_peer ? "peer" : "this_node");
      j.key("count").u64(r.count);
      j.key("last_ms").i64(r.last_ms);
      j.end_object();
    }
  }
  j.end_array();
  j.end_object();
  return j.take();
}

void Peering::register_collectors() {
  node_.metrics().add_collector([this](MetricsWriter& w) {
    std::vector<std::pair<std::string, std::shared_ptr<RateLimiter>>> limiters;
    {
      std::lock_guard lock(mu_);
      limiters.assign(limiters_.begin(), limiters_.end());
    }
    for (const auto& [contract, l] : limiters) {
      w.gauge("entente_contract_rate_cap", "A stream contract's rate cap, tuples per second",
              {{"contract", contract}}, static_cast<double>(l->rate()));
      w.counter("entente_contract_throttled_seconds_total",
                "Time a stream contract's senders waited for its rate cap", {{"contract", contract}},
                l->throttled_seconds());
    }
    if (!links_) return;
    for (const auto& [label, n] : links_->refusals()) {
      w.counter("entente_federation_refusals_total",
                "Peer connections refused, by reason (see docs/federation.md)", {{"reason", label}},
                static_cast<double>(n));
    }
    for (const auto& p : links_->peers()) {
      const std::string peer = p.identity.uri();
      w.gauge("entente_peer_up", "1 when the link to a peer node is up", {{"peer", peer}},
              p.state == "up" ? 1 : 0);
      if (p.rtt_us >= 0) {
        w.gauge("entente_peer_rtt_seconds", "Round-trip time of a peer link's heartbeats",
                {{"peer", peer}}, static_cast<double>(p.rtt_us) / 1e6);
      }
      w.counter("entente_peer_bytes_total", "Bytes over a peer link", {{"peer", peer}, {"direction", "in"}},
                static_cast<double>(p.bytes_in));
      w.counter("entente_peer_bytes_total", "Bytes over a peer link", {{"peer", peer}, {"direction", "out"}},
                static_cast<double>(p.bytes_out));
    }
  });
}

// ---------------------------------------------------------------------------
// Reload (SIGHUP).

Status Peering::reload(const FederationConfig& next, std::vector<std::string>& changes,
                       std::vector<std::string>& kept) {
  if (!links_) return make_error(Errc::unavailable, "federation is not running");
  // Everything is checked before anything changes, as at start-up.
  auto trust = std::make_shared<certs::TrustStore>();
  std::map<std::string, std::string> pems;
  auto pin = [&](const std::string& domain, const std::string& file, const std::string& key) -> Status {
    pems[domain] = read_pem(file);
    if (Status s = trust->pin(domain, file); !s.ok())
      return make_error(Errc::invalid_argument, key + ": " + s.error().message);
    return {};
  };
  ENTENTE_RETURN_IF_ERROR(pin(self_.domain, next.ca_file, "federation.ca_file"));
  federation::LinkReload lr;
  for (size_t i = 0; i < next.peers.size(); ++i) {
    const PeerDomainConfig& d = next.peers[i];
    if (d.domain != self_.domain) {
      ENTENTE_RETURN_IF_ERROR(
          pin(d.domain, d.ca_file, "federation.peers[" + std::to_string(i) + "].ca_file"));
    }
    for (const PeerNodeConfig& n : d.nodes) {
      if (d.domain == self_.domain && n.node == self_.node) continue;
      lr.peers.push_back({{d.domain, n.node}, n.host, n.port});
    }
  }
  ENTENTE_RETURN_IF_ERROR(check_own_certificate(next.cert_file, self_));
  std::vector<std::string> pin_changes;
  for (const auto& [domain, pem] : pinned_pems_) {
    auto it = pems.find(domain);
    if (it == pems.end()) {
      lr.retrust_domains.push_back(domain);
      pin_changes.push_back("domain " + domain + " unpinned");
    } else if (it->second != pem) {
      lr.retrust_domains.push_back(domain);
      pin_changes.push_back("pinned CA of domain " + domain + " replaced; its links authenticate again");
    }
  }
  for (const auto& [domain, pem] : pems) {
    if (!pinned_pems_.count(domain)) pin_changes.push_back("domain " + domain + " pinned");
  }
  lr.trust = trust;
  lr.cert_file = next.cert_file;
  lr.key_file = next.key_file;
  ENTENTE_RETURN_IF_ERROR(links_->reload(std::move(lr), changes));
  changes.insert(changes.end(), pin_changes.begin(), pin_changes.end());
  {
    std::lock_guard lock(peers_mu_);
    peers_ = std::make_shared<const std::vector<PeerDomainConfig>>(next.peers);
  }
  pinned_pems_ = std::move(pems);
  trust_ = std::move(trust);
  // Contracts keep what they were opened with (Contracting holds them).
  if (!pin_changes.empty()) {
    kept.push_back("contract verification (the pinned CAs and peer domains contracts use)");
  }
  if (next.cert_file != config_.cert_file || next.key_file != config_.key_file) {
    kept.push_back("contract signing (the key and certificate contracts are signed with)");
  }
  auto differs = [&](bool changed, const char* key) {
    if (changed) kept.push_back(std::string("federation.") + key);
  };
  differs(next.listen_host != config_.listen_host || next.listen_port != config_.listen_port, "listen");
  differs(next.heartbeat_interval_ms != config_.heartbeat_interval_ms, "heartbeat_interval");
  differs(next.failure_timeout_ms != config_.failure_timeout_ms, "failure_timeout");
  differs(next.max_frame != config_.max_frame, "max_frame");
  differs(next.import_window != config_.import_window, "import_window");
  auto exports_text = [](const FederationConfig& c) {
    std::string t;
    for (const auto& e : c.exports) {
      t += e.stream + "|";
      for (const auto& d : e.to) t += d + ",";
      t += "|";
      for (const auto& f : e.fields) t += f + ",";
      t += ";";
    }
    return t;
  };
  differs(exports_text(next) != exports_text(config_), "exports");
  return {};
}

std::shared_ptr<const std::vector<PeerDomainConfig>> Peering::peer_domains() const {
  std::lock_guard lock(peers_mu_);
  return peers_ ? peers_ : std::make_shared<const std::vector<PeerDomainConfig>>(config_.peers);
}

}  // namespace entente::broker::detail
