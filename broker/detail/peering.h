#pragma once
#if !defined(ENTENTE_IN_BROKER)
#error "broker/detail/ is private to broker/ (docs/architecture.md)"
#endif
// Streams across domains (docs/federation.md): the node's side of the peer
// links. As an owner it answers OPENs for its exported streams and sends
// their tuples within the importer's credit; as an importer it keeps a
// mirror stream of another domain's stream, durable before it acknowledges.
//
// Owner side: one ExportSender per open channel, a Tap on the stream that
// catches up from the log first. Under a stream contract it sends only the
// rows the contract's predicate passes, projected on its fields, and no
// faster than its rate cap (a token bucket per contract, shared by all the
// contract's channels); rows filtered out are covered by the next DATA
// (docs/protocol.md §5.7, §9.2). What an importing domain acknowledged is
// kept in the `meta` family and pins the stream's retention, so nothing it
// has not stored durably is trimmed.
//
// Importer side: one Import per mirror, named DOMAIN/NAME. While every
// tuple arrives the mirror holds the owner's sequence numbers; once the
// owner filtered some out, the mirror numbers its rows contiguously itself
// and the owner's position (the next owner number expected) is kept in
// `meta` under "import-pos/DOMAIN/NAME", written atomically with each
// append. After a link drop or a restart it re-opens from that position
// (else the mirror's next sequence number) and drops anything it already has.
//
// Threading: link callbacks arrive on the LinkManager's io thread; group
// commit callbacks on the committer thread; the API on Asio threads. One
// mutex guards the maps; each sender and import has its own.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "broker/federation_config.h"
#include "broker/metrics.h"
#include "broker/detail/streams.h"
#include "certs/certs.h"
#include "base/result.h"
#include "engine/types.h"
#include "federation/link.h"

namespace entente::contracts {
struct Contract;
}

namespace entente::broker::detail {

class NodeImpl;
class Contracting;
class ExportSender;
class RateLimiter;
class Deferred;
struct Import;

// An import as the API shows it.
struct ImportInfo {
  std::string stream;  // "beta/bids"
  std::string owner;   // identity URI of the node serving it, when known
  std::string state;   // "connecting", "active", "refused"
  std::string reason;  // why refused, or the last problem
  engine::SchemaPtr schema;
  uint64_t next_seq = 0;
  uint64_t acked = 0;
  uint64_t tuples = 0;
};

class Peering final : public federation::LinkHandler {
 public:
  Peering(NodeImpl& node, const FederationConfig& config);
  ~Peering() override;

  // Pins the CAs, starts the links, resumes every import in the catalog.
  // invalid_argument naming the key when a file or the certificate's
  // identity is wrong.
  Status start();
  void stop();
  uint16_t port() const;
  // A configuration reload (SIGHUP): replaces the pinned CAs, the peer
  // links' certificate and key, and the peers, from `next` (parsed and
  // validated). Links to a peer no longer configured, or of a domain whose
  // CA changed, are closed and authenticate again. invalid_argument naming
  // the key when a file or the certificate's identity is wrong; then
  // nothing changed. `changes` gets what changed; `kept` what differs but
  // needs a restart.
  Status reload(const FederationConfig& next, std::vector<std::string>& changes,
                std::vector<std::string>& kept);

  // --- the API
  // Imports DOMAIN/NAME: answers once the owner accepted (the mirror
  // exists) or refused, or after `timeout`. `expected` (a query's declared
  // input schema) must match the owner's schema when given.
  using ImportDone = std::function<void(Result<ImportInfo>)>;
  void create_import(const std::string& stream, engine::SchemaPtr expected, ImportDone done,
                     std::chrono::milliseconds timeout = std::chrono::seconds(10));
  std::vector<ImportInfo> imports() const;
  std::optional<ImportInfo> import_info(const std::string& stream) const;
  // Closes the channel and forgets the import; the caller deletes the mirror.
  Status forget_import(const std::string& stream);
  // GET /v1/peers.
  std::string peers_json() const;
  // Lowest sequence number an importing domain still needs, for retention.
  std::optional<uint64_t> retention_pin(const std::string& stream) const;
  // A name in this node's terms: "acme/bids" on acme is "bids".
  std::string local_name(const std::string& stream) const;
  bool is_remote(const std::string& stream) const;

  // --- federation::LinkHandler (io thread)
  void on_link_up(const certs::Identity& peer) override;
  void on_link_down(const certs::Identity& peer, std::string_view reason) override;
  void on_frame(const certs::Identity& peer, federation::FrameType type, uint32_t channel,
                std::string_view payload) override;

  // Contract negotiation (null before start()).
  Contracting* contracting() { return contracting_.get(); }

  // For ExportSender and Import.
  NodeImpl& node() { return node_; }
  federation::LinkManager* links() { return links_.get(); }
  void record_ack(const std::string& stream, const std::string& domain, uint64_t through);
  // Tuples received from / sent to a peer node, for GET /v1/peers.
  void count_tuples(const std::string& peer, uint64_t in, uint64_t out);
  Counter& import_counter(const std::string& stream);
  // Metering of stream contracts. A contract is charged for the rows a
  // consumer acknowledged as durable, each once: DATA is noted with its
  // range and rows before it is sent (bill_sent, durably); an ACK through
  // N (also one arriving after this node ended the channel), or an OPEN
  // from N+1 (the consumer has everything before it, refused or not),
  // charges the noted ranges up to N to the contract each was sent under
  // (bill_through), in one atomic write with the usage. An accepted OPEN
  // also forgets ranges after N: they are sent again and noted again.
  void bill_sent(const std::string& stream, const std::string& domain, const std::string& contract,
                 uint64_t first, uint64_t last, uint64_t rows);
  void bill_through(const std::string& stream, const std::string& domain, uint64_t through,
                    bool forget_after);
  void log(const std::string& line) const;

 private:
  using ChannelKey = std::pair<std::string, uint32_t>;  // peer URI, channel

  void on_open(const certs::Identity& peer, uint32_t channel, std::string_view payload);
  void open_import(const std::shared_ptr<Import>& imp);
  void import_frame(const std::shared_ptr<Import>& imp, federation::FrameType type,
                    std::string_view payload);
  void finish_pending(const std::shared_ptr<Import>& imp, const Result<ImportInfo>& r,
                      Deferred& later);
  std::shared_ptr<Import> find_import_by_channel(const ChannelKey& key) const;
  // The imports of streams owned by `domain`; takes mu_.
  std::vector<std::shared_ptr<Import>> imports_of(const std::string& domain) const;
  ImportInfo info_of(const Import& imp) const;
  void timer_loop();
  // Ends every channel whose stream contract is no longer in force.
  void recheck_contracts();
  // Provider side: an offer the consumer made that this node's catalog
  // cannot serve (a stream or field it lacks, a predicate that does not
  // compile) is logged with every problem; accepting it answers 400.
  void check_offer(const contracts::Contract& c);
  // Consumer side: refused imports that contract `c` (now in force) covers
  // open again.
  void retry_refused_imports(const contracts::Contract& c);
  // Every 100 ms: senders flush a run of filtered-out tuples, and those
  // waiting for rate-cap tokens send again.
  void tick_senders();
  // The token bucket of stream contract `contract` (made on first use).
  std::shared_ptr<RateLimiter> limiter_for(const std::string& contract, uint64_t per_second);
  // Sends a CONTROL message to the first node of `domain` whose link is up.
  bool send_to_domain(const std::string& domain, const std::string& message);
  void register_collectors();

  NodeImpl& node_;
  FederationConfig config_;
  certs::Identity self_;
  std::unique_ptr<federation::LinkManager> links_;
  std::shared_ptr<const certs::TrustStore> trust_;
  // config_.peers as a reload leaves it; read through peer_domains().
  mutable std::mutex peers_mu_;
  std::shared_ptr<const std::vector<PeerDomainConfig>> peers_;  // REQUIRES: peers_mu_
  std::shared_ptr<const std::vector<PeerDomainConfig>> peer_domains() const;
  // The PEM text pinned per domain, to tell which pins a reload changes.
  // Start-up and reload only (the main thread).
  std::map<std::string, std::string> pinned_pems_;
  std::unique_ptr<Contracting> contracting_;

  mutable std::mutex mu_;
  std::map<ChannelKey, std::shared_ptr<ExportSender>> senders_;
  std::map<std::string, std::shared_ptr<Import>> imports_;       // by stream
  std::map<ChannelKey, std::shared_ptr<Import>> import_channels_;
  // Channels this node ended because their contract stopped being in force,
  // until everything they sent is acknowledged or the link goes.
  std::map<ChannelKey, std::shared_ptr<ExportSender>> ended_;
  // stream -> domain -> last acknowledged sequence number (persisted).
  std::map<std::string, std::map<std::string, uint64_t>> acks_;
  // Stream contract id -> its rate cap's token bucket (contracts with a cap).
  std::map<std::string, std::shared_ptr<RateLimiter>> limiters_;

  // Sent, not yet acknowledged DATA under a stream contract, per (stream,
  // consumer domain): first -> {last, rows, contract}, ranges disjoint.
  // Mirrored in the `meta` family (unbilled/DOMAIN/STREAM/FIRST), so a
  // restart of this node charges them all the same.
  struct Unbilled {
    uint64_t last;
    uint64_t rows;
    std::string contract;
  };
  std::mutex billing_mu_;
  std::map<std::pair<std::string, std::string>, std::map<uint64_t, Unbilled>> unbilled_;

  mutable std::mutex count_mu_;
  std::map<std::string, std::pair<uint64_t, uint64_t>> tuples_;  // peer URI -> in, out

  std::mutex timer_mu_;
  std::condition_variable timer_cv_;
  bool stopping_ = false;
  std::thread timer_;
};

}  // namespace entente::broker::detail
