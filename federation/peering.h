#pragma once
// Streams across domains (docs/federation.md): the federation layer of one
// node, put together. It owns the peer links (LinkManager) and routes what
// arrives on them: OPEN, CREDIT and ACK to the owner side (Exports),
// OPEN_OK, DATA and RESET to the importer side (Imports), CONTROL to
// contract negotiation (Contracting). It runs the federation timer (every
// 100 ms: contracts ending on time, senders' filtered runs and rate-cap
// waits, imports due for a retry; every second, contract usage flushed),
// and answers the API's questions (imports, peers, retention pins).
//
// It reaches the node only through Host (federation/host.h), which the
// broker implements.
//
// Threading: link callbacks arrive on the LinkManager's io thread; the
// timer on its own thread; the API on the broker's threads. Lifecycle:
// start() once, stop() (or the destructor) joins the timer and the links.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/result.h"
#include "certs/certs.h"
#include "certs/trust.h"
#include "federation/acknowledgements.h"
#include "federation/config.h"
#include "federation/exports.h"
#include "federation/host.h"
#include "federation/imports.h"
#include "federation/link.h"
#include "federation/metering.h"
#include "federation/traffic.h"
#include "federation/wire.h"

namespace entente::contracts {
struct Contract;
}

namespace entente::federation {

class Contracting;
class Hosting;

// What GET /v1/peers shows (the broker renders it).
struct PeersReport {
  std::string self;    // this node's identity URI
  std::string listen;  // host:port of the peer-link listener
  std::map<std::string, uint64_t> refusals;  // by label
  struct Peer {
    PeerStatus link;
    uint64_t tuples_in = 0;
    uint64_t tuples_out = 0;
  };
  std::vector<Peer> peers;
  std::vector<RefusedStatus> refused;
};

class Peering final : public LinkHandler {
 public:
  Peering(Host& host, certs::Identity self, const FederationConfig& config);
  ~Peering() override;
  Peering(const Peering&) = delete;
  Peering& operator=(const Peering&) = delete;

  // Pins the CAs, opens the contracts ledger, reads the positions kept in
  // the store, starts the links and the timer; imports in the catalog
  // resume when their owner's link comes up. invalid_argument naming the
  // key when a file or the certificate's identity is wrong.
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
  using ImportDone = Imports::Done;
  void create_import(const std::string& stream, engine::SchemaPtr expected, ImportDone done,
                     std::chrono::milliseconds timeout = std::chrono::seconds(10), uint64_t from_seq = 0);
  // Reads `stream`, led by node `node` of this node's own domain, into
  // the mirror "@NODE/STREAM" (Imports::create_internal): the transport of
  // an arc between query fragments on two nodes of one domain.
  void create_internal_import(const std::string& stream, const std::string& node, engine::SchemaPtr expected,
                              ImportDone done, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // The nodes of this domain reading `stream` and what each acknowledged.
  std::vector<Exports::InternalReader> internal_readers(const std::string& stream) const {
    return exports_.internal_readers(stream);
  }
  // Dials node `node` of this domain at host:port (where the domain's
  // membership says its peer link listens), unless a link to it is
  // configured already; the node is authenticated as any peer, by the
  // domain's own CA and exactly that identity.
  Status dial_own_node(const std::string& node, const std::string& host, uint16_t port);
  // Owner side: node `node` of this domain no longer reads `stream` (its
  // fragment is gone): what it acknowledged stops pinning retention.
  Status release_internal_reader(const std::string& stream, const std::string& node) {
    return exports_.release_internal_reader(stream, node);
  }
  std::vector<ImportInfo> imports() const { return imports_.list(); }
  std::optional<ImportInfo> import_info(const std::string& stream) const { return imports_.info(stream); }
  // Closes the channel and forgets the import; the caller deletes the mirror.
  Status forget_import(const std::string& stream) { return imports_.forget(stream); }
  // An internal read whose stream `node` leads now (Imports::redirect).
  Status redirect_internal_import(const std::string& mirror, const std::string& node) {
    return imports_.redirect(mirror, node);
  }
  PeersReport peers_report() const;
  // Lowest sequence number an importing domain still needs, for retention.
  std::optional<uint64_t> retention_pin(const std::string& stream) const {
    return exports_.retention_pin(stream);
  }
  // A name in this node's terms: "acme/bids" on acme is "bids".
  std::string local_name(const std::string& stream) const;
  bool is_remote(const std::string& stream) const;
  // Contract negotiation (null before start()).
  Contracting* contracting() { return contracting_.get(); }
  // Hosting offers (null before start()).
  Hosting* hosting() { return hosting_.get(); }
  // What `domain` has acknowledged holding of `stream` (this node's
  // export of it), if anything.
  std::optional<uint64_t> acked(const std::string& stream, const std::string& domain) const {
    return acks_.acked(stream, domain);
  }

  // --- LinkHandler (io thread)
  void on_link_up(const certs::Identity& peer) override;
  void on_link_down(const certs::Identity& peer, std::string_view reason) override;
  void on_frame(const certs::Identity& peer, FrameType type, uint32_t channel,
                std::string_view payload) override;

 private:
  // The links as a Wire: unavailable until they are started.
  class LinkWire final : public Wire {
   public:
    Status send(const certs::Identity& peer, FrameType type, uint32_t channel,
                std::string_view payload) override;
    Result<uint32_t> new_channel(const certs::Identity& peer) override;
    bool is_up(const certs::Identity& peer) const override;
    uint16_t version(const certs::Identity& peer) const override;
    Status add_dial_target(const certs::Identity& peer, const std::string& host, uint16_t port) override;
    void remove_dial_target(const certs::Identity& peer) override;
    std::atomic<LinkManager*> links{nullptr};
  };

  // The steps of start().
  Result<LinkOptions> link_options(std::shared_ptr<certs::TrustStore>& trust);
  Status open_contracting();
  void timer_loop();
  // What Contracting's `changed` hook does: enforcement re-checks the
  // flows, refused imports under the contract try again, and an offer this
  // node cannot serve is logged.
  void contract_changed(const contracts::Contract& c);
  // Provider side: an offer the consumer made that this node's catalog
  // cannot serve (a stream or field it lacks, a predicate that does not
  // compile) is logged with every problem; accepting it answers 400.
  void check_offer(const contracts::Contract& c);
  // Sends a CONTROL message to the first node of `domain` whose link is up.
  bool send_to_domain(const std::string& domain, const std::string& message);
  void register_collectors();
  std::shared_ptr<const std::vector<PeerDomainConfig>> peer_domains() const;

  Host& host_;
  const certs::Identity self_;
  FederationConfig config_;
  LinkWire wire_;
  std::unique_ptr<LinkManager> links_;
  std::shared_ptr<const certs::TrustStore> trust_;
  // config_.peers as a reload leaves it; read through peer_domains().
  mutable std::mutex peers_mu_;
  std::shared_ptr<const std::vector<PeerDomainConfig>> peers_;  // REQUIRES: peers_mu_
  // The PEM text pinned per domain, to tell which pins a reload changes.
  // Start-up and reload only (the main thread).
  std::map<std::string, std::string> pinned_pems_;
  std::unique_ptr<Contracting> contracting_;
  std::unique_ptr<Hosting> hosting_;  // borrows contracting_'s ledger: declared after it

  Traffic traffic_;
  Acknowledgements acks_;
  Metering metering_;
  Exports exports_;
  Imports imports_;
  uint64_t collector_ = 0;  // /metrics: rate caps and links

  std::mutex timer_mu_;
  std::condition_variable timer_cv_;
  bool stopping_ = false;  // REQUIRES: timer_mu_
  std::thread timer_;
};

}  // namespace entente::federation
