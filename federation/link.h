#pragma once
// Peer links (docs/architecture.md, "The path of a tuple"; docs/protocol.md):
// one mutually authenticated TLS 1.3 connection per pair of nodes, carrying
// frames for every channel.
//
// LinkManager owns a listener, one dialer per configured peer address (and
// per dial target added at run time, add_dial_target), and
// every link that completes the handshake. A connection is refused, before
// any frame is read, when the peer's certificate fails TrustStore::verify
// (for a dialed peer also when its identity is not the one configured); the
// refusal is logged and counted by label. After TLS both sides exchange
// HELLO; the identity in HELLO must be the certificate's.
//
// When two nodes dial each other at once and both connections complete,
// both sides keep the one dialed by the smaller identity URI and close the
// other, so a pair of nodes ends with one link.
//
// Threading: one io thread, owned, started by start() and joined by stop()
// (or the destructor). Every LinkHandler callback runs on that thread and
// must not block. send(), peers(), refusals() are thread-safe.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "certs/certs.h"
#include "certs/trust.h"
#include "base/result.h"
#include "federation/frame.h"

namespace entente::federation {

// A node this node may link with. `port` 0 means no address: this node
// never dials it but accepts it.
struct PeerConfig {
  certs::Identity identity;
  std::string host;
  uint16_t port = 0;
};

struct LinkOptions {
  certs::Identity self;
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: an ephemeral port, see LinkManager::port()
  std::string cert_file;     // PEM chain: node certificate, then its CA
  std::string key_file;
  std::shared_ptr<const certs::TrustStore> trust;  // the pinned CAs; required
  std::vector<PeerConfig> peers;

  std::chrono::milliseconds heartbeat_interval{250};
  std::chrono::milliseconds failure_timeout{1000};  // silence before "failed"
  // TCP connect + TLS + HELLO; an accepted connection that has not
  // finished both by then is closed (and counted as a "handshake" refusal).
  std::chrono::milliseconds handshake_timeout{5000};
  std::chrono::milliseconds reconnect_min{100};       // first backoff, doubling
  std::chrono::milliseconds reconnect_max{5000};
  uint32_t max_frame = kDefaultMaxFrame;  // our receive limit, sent in HELLO
  // Bytes queued for one link beyond which send() answers unavailable.
  std::size_t max_send_queue_bytes = 64u << 20;
  // The listener's budget, checked before a connection costs anything but
  // its socket: accepted connections in all; from one address (an IPv6
  // peer: its /64); and accepted connections whose peer has not yet been
  // verified (in the TLS handshake), so that the rest of max_connections
  // stays for verified peers.
  std::size_t max_connections = 256;
  std::size_t max_connections_per_address = 16;
  std::size_t max_handshaking_connections = 64;
  // Nodes of one peer domain that add_dial_target may add beyond the
  // configured ones (a RESET moved names them).
  std::size_t max_dial_targets_per_domain = 8;

  // Where log lines go (one line each, no trailing newline); stderr when
  // empty.
  std::function<void(std::string_view)> log;
};

// One peer as GET /v1/peers shows it.
struct PeerStatus {
  certs::Identity identity;
  // "up"; "connecting" (dialing); "down" (not linked: never was, closed,
  // or unreachable); "failed" (the last link ended because heartbeats
  // stopped; this node keeps dialing if it has an address); "refused" (the
  // last attempt was refused, by this node or by the peer: see `refusal`
  // and `last_error`; this node keeps dialing if it has an address).
  std::string state;
  bool dialed = false;  // this node opened the current (or last) connection
  std::string address;  // host:port of the current (or last) connection
  int64_t rtt_us = -1;  // last measured round trip; -1 before any
  int64_t last_heartbeat_ms = 0;  // Unix ms of the last frame received; 0 before any
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
  uint64_t frames_in = 0;
  uint64_t frames_out = 0;
  uint64_t connects = 0;  // links established with this peer
  std::string last_error;
  // The label of the last refusal of a connection with this peer (a
  // TrustStore label such as "untrusted_chain", also when the peer refused
  // this node's certificate), empty once a link is up.
  std::string refusal;
};

// A connection this listener refused (or whose client refused this node),
// for GET /v1/peers: the identity the client's certificate claimed, even
// though it was not trusted, or only its address when it presented none.
struct RefusedStatus {
  std::string identity;  // "entente://acme/n1" as claimed; empty when unknown
  std::string address;   // host:port of the last such connection
  std::string refusal;   // label, as in LinkManager::refusals()
  std::string reason;    // one line for the admin
  bool by_peer = false;  // the client refused this node, not the other way
  uint64_t count = 0;
  int64_t last_ms = 0;  // Unix ms of the last one
};

// What LinkManager::reload() replaces on a running manager.
struct LinkReload {
  std::shared_ptr<const certs::TrustStore> trust;  // the pinned CAs; required
  std::string cert_file;
  std::string key_file;
  std::vector<PeerConfig> peers;
  // Domains whose pinned CA changed or was removed: their links are closed
  // so that they authenticate again under the new pin.
  std::vector<std::string> retrust_domains;
};

// What the layer above (stream delivery) implements. Calls arrive on the
// io thread, in order per link.
class LinkHandler {
 public:
  virtual ~LinkHandler() = default;
  // A link to `peer` completed its handshake; frames may be sent.
  virtual void on_link_up(const certs::Identity& peer) = 0;
  // The link to `peer` ended (closed, failed, replaced). Every channel on it
  // is gone; the layer above re-opens what it needs when the link is back.
  virtual void on_link_down(const certs::Identity& peer, std::string_view reason) = 0;
  // A frame on a channel other than 0, or a CONTROL frame (channel 0: a
  // link-wide message such as contract negotiation). The payload is valid
  // during the call.
  virtual void on_frame(const certs::Identity& peer, FrameType type, uint32_t channel,
                        std::string_view payload) = 0;
};

class LinkManager {
 public:
  // Loads the certificate and key, binds the listener and starts the io
  // thread and the dialers. invalid_argument naming the file or option that
  // is wrong; io_error when the address cannot be bound.
  static Result<std::unique_ptr<LinkManager>> start(LinkOptions options, LinkHandler& handler);

  ~LinkManager();
  LinkManager(const LinkManager&) = delete;
  LinkManager& operator=(const LinkManager&) = delete;

  uint16_t port() const;

  // Queues one frame to `peer`. unavailable when no link to the peer is up
  // or its send queue is over max_send_queue_bytes; limit_exceeded when the
  // payload is over the link's agreed maximum frame.
  Status send(const certs::Identity& peer, FrameType type, uint32_t channel,
              std::string_view payload);

  // A channel number for a new subscription on the current link to `peer`:
  // odd when this node dialed it, even otherwise (docs/protocol.md).
  // unavailable when no link is up.
  Result<uint32_t> new_channel(const certs::Identity& peer);

  bool is_up(const certs::Identity& peer) const;
  // The protocol version negotiated on the link to `peer`; 0 when none is up.
  uint16_t version(const certs::Identity& peer) const;

  // Dials `peer` at its host:port from now on, as if it were configured
  // (a RESET moved named it: docs/federation.md). It is authenticated as
  // any dialed peer: its certificate must chain to the pinned CA of its
  // domain and name exactly peer.identity; the address alone grants
  // nothing. A peer configured with an address keeps that address. The
  // target lasts until stop(), or a reload after which its domain is no
  // longer pinned. permission_denied when the domain is not pinned;
  // limit_exceeded when the domain has max_dial_targets_per_domain such
  // targets already; invalid_argument without an address.
  Status add_dial_target(const PeerConfig& peer);
  // Stops dialing a target add_dial_target added whose link is not up (it
  // was not reached in time); its status stays in peers(). A configured
  // peer, or one whose link is up, stays as it is.
  void remove_dial_target(const certs::Identity& peer);

  // Every configured peer, and every accepted peer seen since start.
  std::vector<PeerStatus> peers() const;
  // Refused connections by TrustStore refusal label (a client without any
  // certificate counts as "no_identity"), plus "handshake" (TLS failed
  // before verification, e.g. a plaintext client), "hello" (a bad or
  // mismatched HELLO), "identity" (a dialed peer that is not the one
  // configured), "refused_by_peer" (the peer refused this node's
  // certificate: a TLS alert, mapped to a label in the peer's `refusal`).
  // "duplicate" is not a refusal and not counted.
  std::map<std::string, uint64_t> refusals() const;
  // The latest refused accepted connections, by claimed identity (or by
  // client address when none), newest first; at most 32.
  std::vector<RefusedStatus> refused() const;

  // Replaces the pinned CAs, this node's certificate and key (for the
  // connections made from now on; links up keep theirs) and the peers:
  // new peers are dialed, a peer whose address changed is dialed there,
  // a peer no longer configured is not dialed any more and its link is
  // closed, as are links of `retrust_domains`. invalid_argument naming the
  // file when the certificate or key cannot be used; then nothing changed.
  // `changes` gets one line per change. Thread-safe; waits for the io
  // thread.
  Status reload(LinkReload next, std::vector<std::string>& changes);

  // Closes every link with GOAWAY shutdown, stops the io thread. Idempotent.
  void stop();

  struct Impl;  // private to link.cpp

 private:
  explicit LinkManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace entente::federation
