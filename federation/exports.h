#pragma once
// Owner side of shared streams (docs/federation.md, "The owner shares"):
// answers OPEN for this node's streams, one ExportSender per open channel,
// and keeps what permits each. Deny by default: an in-force stream
// contract covers the stream for the importing domain (its projection,
// predicate and rate cap apply), or else a configured export
// (`federation.exports`). A node of this node's own domain (its
// certificate chains to the domain's own CA) reads any stream whole, with
// no export, contract, projection or metering: the domain's nodes share one
// admin and one CA (docs/federation.md, "Reading a stream of another node of
// the domain"). Ends channels within one timer tick of their
// contract leaving force (recheck_contracts), and gives the stream's
// retention its pin: what importing domains have not acknowledged.
//
// Threading: frames on the link io thread, the timer's calls on the
// federation timer, retention_pin on the maintenance thread; one mutex
// guards the maps, never held while a sender sends.

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"
#include "certs/certs.h"
#include "federation/config.h"
#include "federation/export_sender.h"
#include "federation/frame.h"
#include "federation/host.h"

namespace entente::contracts {
class Ledger;
}

namespace entente::federation {

class Exports final {
 public:
  struct Options {
    certs::Identity self;
    std::vector<ExportConfig> exports;  // the configured exports
    size_t max_frame = 1u << 20;        // largest DATA payload this node sends
  };
  // Borrows everything; `ctx` outlives this object.
  Exports(Host& host, ExportSender::Context ctx, Options options);
  ~Exports();
  Exports(const Exports&) = delete;
  Exports& operator=(const Exports&) = delete;

  // Where stream contracts are looked up; null: configured exports only.
  void set_ledger(const contracts::Ledger* ledger) { ledger_ = ledger; }

  // OPEN from `peer` on `channel`: OPEN_OK and a sender, or RESET saying why.
  void on_open(const certs::Identity& peer, uint32_t channel, std::string_view payload);
  // CREDIT, ACK or RESET on one of this side's channels. false for a RESET
  // of a channel that is not one (it may be an import's).
  bool on_frame(const certs::Identity& peer, FrameType type, uint32_t channel, std::string_view payload);
  // Every channel on the link to `peer` is gone.
  void on_link_down(const certs::Identity& peer);

  // Ends every channel whose stream contract is no longer in force.
  void recheck_contracts();
  // Every 100 ms: senders flush a run of filtered-out tuples, and those
  // waiting for rate-cap tokens send again.
  void tick();
  // Lowest sequence number an importing domain, or a node of this domain
  // reading the stream, still needs, for retention.
  std::optional<uint64_t> retention_pin(const std::string& stream) const;
  // The nodes of this domain reading `stream` (a query fragment's internal
  // stream, or a follower's replica, docs/cluster.md): what each has
  // acknowledged, and whether its channel is open now.
  struct InternalReader {
    std::string node;
    uint64_t acked = 0;
    bool connected = false;
  };
  std::vector<InternalReader> internal_readers(const std::string& stream) const;
  // Node `node` of this domain no longer reads `stream`: what it
  // acknowledged stops pinning the stream's retention.
  Status release_internal_reader(const std::string& stream, const std::string& node);
  // Stops every sender (shutdown).
  void stop();

  // Channels open now.
  size_t open_channels() const;
  // The rate caps in use, by contract (for /metrics).
  std::vector<std::pair<std::string, std::shared_ptr<RateLimiter>>> limiters() const;

 private:
  using ChannelKey = std::pair<std::string, uint32_t>;  // peer URI, channel

  // Why an OPEN is refused: the RESET's code and reason.
  struct Refusal {
    WireError code;
    std::string reason;
    bool logged;  // a refusal the admin should see in the log
  };
  // What permits a flow: a stream contract's terms or a configured export's.
  struct Permit {
    std::string contract;  // empty: a configured export
    std::vector<std::string> fields;
    std::string predicate;
    uint64_t rate_cap = 0;
  };
  struct Position {
    uint64_t from;
    uint64_t first_retained;
    uint64_t head;
  };

  // The steps of on_open; each gives a refusal, or nullopt and its result.
  std::optional<Refusal> permit_for(const certs::Identity& peer, const std::string& stream,
                                    const std::string& name, Permit& out) const;
  std::optional<Refusal> terms_for(const Permit& permit, const HostStream& stream,
                                   const std::string& stream_name, ExportSender::Terms& out);
  std::optional<Refusal> position_for(const HostStream& stream, const std::string& stream_name,
                                      uint64_t from_seq, Position& out) const;
  // A stream this node does not have: RESET moved when another node of the
  // domain leads it (not_found naming that node to a peer speaking version
  // 1), else not_found.
  Refusal not_here(const certs::Identity& peer, const std::string& stream, const std::string& name) const;
  void refuse(const certs::Identity& peer, uint32_t channel, const std::string& stream, const Refusal& r);
  void start_sender(const certs::Identity& peer, uint32_t channel, const std::string& stream_name,
                    HostStreamPtr stream, ExportSender::Terms terms, uint64_t from, uint64_t credit);
  // The token bucket of stream contract `contract` (made on first use).
  std::shared_ptr<RateLimiter> limiter_for(const std::string& contract, uint64_t per_second);
  // Why contract `id` no longer permits its flows, for the RESET.
  std::string end_reason(const std::string& id, int64_t now) const;

  Host& host_;
  ExportSender::Context ctx_;
  const Options options_;
  const contracts::Ledger* ledger_ = nullptr;

  mutable std::mutex mu_;
  std::map<ChannelKey, std::shared_ptr<ExportSender>> senders_;  // REQUIRES: mu_
  // Channels this node ended because their contract stopped being in force,
  // until everything they sent is acknowledged or the link goes.
  std::map<ChannelKey, std::shared_ptr<ExportSender>> ended_;  // REQUIRES: mu_
  // Stream contract id -> its rate cap's token bucket (contracts with a cap).
  std::map<std::string, std::shared_ptr<RateLimiter>> limiters_;  // REQUIRES: mu_
};

}  // namespace entente::federation
