#pragma once
// Owner side of a shared stream: one open channel to one importing node
// (docs/federation.md, docs/protocol.md §5.7, §8, §9).
//
// A StreamTap on the exported stream that first catches up from the log,
// then follows live records, sending DATA frames only within the
// importer's byte credit. Under a stream contract it sends only the rows
// the contract's predicate passes, projected on its fields, and no faster
// than its rate cap (a RateLimiter shared by the contract's channels);
// each DATA's range is noted as unbilled before it leaves
// (Metering::note_sent). An ACK records the domain's acknowledged position
// (Acknowledgements, which pins retention) and charges the acknowledged
// ranges (Metering::charge_through).
//
// Positions: next_ is the first tuple not yet dealt with; covered_ the
// first not yet covered by a DATA sent. Tuples covered_ .. next_-1 were all
// filtered out by the predicate: the next DATA starts at covered_ and so
// covers them too, or flush_gap_locked sends an empty DATA for them (every
// kMaxFilteredRun tuples, and on the timer when the stream goes quiet), so
// the importer can acknowledge them and the log be trimmed.
//
// Threading: on_record on the committer thread, CREDIT/ACK on the link io
// thread, tick() on the federation timer; one mutex, held while sending
// (Wire::send never blocks).

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "certs/certs.h"
#include "engine/batch.h"
#include "engine/expr.h"
#include "federation/host.h"
#include "federation/messages.h"

namespace entente::federation {

class Acknowledgements;
class Metering;
class RateLimiter;
class Traffic;
class Wire;

class ExportSender final : public StreamTap, public std::enable_shared_from_this<ExportSender> {
 public:
  // What the channel reaches of the owner's node; outlives the sender.
  struct Context {
    Wire& wire;
    Metering& metering;
    Acknowledgements& acks;
    Traffic& traffic;
  };
  // What the channel may send, under a contract or a configured export.
  struct Terms {
    std::vector<size_t> projection;          // empty: every column
    engine::SchemaPtr schema;                // what the importer sees
    std::optional<engine::Expr> predicate;   // over the stream's own schema
    std::shared_ptr<RateLimiter> limiter;    // null: no rate cap
    std::string contract;                    // empty under a configured export
    // Whom acknowledgements are kept for: the importing domain, or "@NODE"
    // for a node of the owner's own domain (detail::ack_party).
    std::string party;
    // Sends the publishers' names of the batches each DATA completes
    // (DATA_NAMED): only to a node of the owner's own domain on a link of
    // protocol version 3 or more; another domain never learns them.
    bool names = false;
  };

  // The most filtered-out tuples a sender leaves uncovered before it sends
  // an empty DATA for them, so the importer acknowledges and the log can trim.
  static constexpr uint64_t kMaxFilteredRun = 1u << 16;

  ExportSender(Context ctx, certs::Identity peer, uint32_t channel, HostStreamPtr stream, Terms terms,
               uint64_t next, uint64_t credit, size_t max_payload, base::Counter* tuples_out);

  // Taps the stream and sends what the credit allows.
  void start();
  // Unhooks from the stream without a frame (the link or the importer ended it).
  void stop();
  // Ends the channel with RESET (its contract is no longer in force).
  void end(WireError code, const std::string& reason);

  // StreamTap (committer thread).
  void on_record(const RecordView& rec) override;
  void on_stream_closed() override;

  // CREDIT and ACK from the importer.
  void on_credit(uint32_t bytes);
  void on_ack(uint64_t through);
  // The federation timer: covers a run of filtered-out tuples the stream
  // left behind, and sends again once the rate cap has new tokens.
  void tick();

  const certs::Identity& peer() const { return peer_; }
  const HostStreamPtr& stream() const { return stream_; }
  // The stream contract the channel runs under; empty under a configured export.
  const std::string& contract() const { return contract_; }
  // Every DATA sent was acknowledged: nothing of the channel is left to charge.
  bool all_acknowledged();
  // The first sequence number the importer has not acknowledged.
  uint64_t unacknowledged_from();

 private:
  void billing_locked(uint64_t first, uint64_t last, size_t n);
  void sent_locked(size_t n);
  void reset_locked(WireError code, const std::string& reason);
  bool flush_gap_locked();
  bool send_locked(const engine::Batch& b, size_t offset, const std::string* whole = nullptr);
  bool send_whole_locked(size_t rows, const std::string& whole);
  void passing_rows(const engine::Batch& b, size_t offset, std::vector<uint32_t>& pass) const;
  engine::Batch part_of(const engine::Batch& b, const std::vector<uint32_t>& pass, size_t i, size_t n) const;
  void pump();
  // REQUIRES: mu_. The payload of `d`, with the named batches it completes
  // when the channel sends names (then d.frame_type() is DATA_NAMED).
  std::string payload_locked(Data& d) const;

  Context ctx_;
  const certs::Identity peer_;
  const std::string peer_uri_;
  const uint32_t channel_;
  const HostStreamPtr stream_;
  const std::vector<size_t> projection_;          // empty: every column
  const engine::SchemaPtr schema_;                // what the importer sees
  const std::optional<engine::Expr> predicate_;   // null: every row
  const std::shared_ptr<RateLimiter> limiter_;    // null: no rate cap
  std::mutex mu_;
  const uint64_t start_;             // where the channel started
  uint64_t next_;                    // REQUIRES: mu_; first tuple not dealt with
  uint64_t covered_;                 // REQUIRES: mu_; first tuple no DATA covered
  CreditWindow credit_;              // REQUIRES: mu_
  uint64_t acked_ = 0;               // REQUIRES: mu_
  bool live_ = false;                // REQUIRES: mu_
  bool closed_ = false;              // REQUIRES: mu_
  bool waiting_tokens_ = false;      // REQUIRES: mu_; stopped by the rate cap
  size_t chunk_rows_ = 1u << 14;     // REQUIRES: mu_; rows per DATA frame
  std::string empty_body_;           // REQUIRES: mu_; a batch of no row, encoded once
  const size_t max_payload_;
  base::Counter* tuples_out_;
  const std::string contract_;
  const std::string party_;
  const bool names_;
};

}  // namespace entente::federation
