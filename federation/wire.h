#pragma once
// What the stream layer (exports, imports, negotiation) sends frames
// through: the peer links (LinkManager, behind Peering) in a node, or
// frames handed straight to the other side in a unit test.
//
// Threading: thread-safe; send() never blocks.

#include <cstdint>
#include <string>
#include <string_view>

#include "base/result.h"
#include "certs/certs.h"
#include "federation/frame.h"

namespace entente::federation {

class Wire {
 public:
  virtual ~Wire() = default;
  // Queues one frame to `peer`. unavailable when no link to it is up (or
  // its queue is full); limit_exceeded when the payload is over the link's
  // maximum frame.
  virtual Status send(const certs::Identity& peer, FrameType type, uint32_t channel,
                      std::string_view payload) = 0;
  // A channel number for a new subscription on the link to `peer`.
  virtual Result<uint32_t> new_channel(const certs::Identity& peer) = 0;
  virtual bool is_up(const certs::Identity& peer) const = 0;
  // The protocol version of the link to `peer` (docs/protocol.md §6.2):
  // what a version added is sent only to a peer that speaks it.
  virtual uint16_t version(const certs::Identity& peer) const {
    (void)peer;
    return kProtocolVersion;
  }
  // Dials `peer` at host:port from now on (a RESET moved named it); the
  // peer is authenticated as any other (LinkManager::add_dial_target).
  virtual Status add_dial_target(const certs::Identity& peer, const std::string& host, uint16_t port) {
    (void)host;
    (void)port;
    return make_error(Errc::unsupported, "cannot dial " + peer.uri() + " from here");
  }
  // Stops dialing what add_dial_target added, unless its link is up.
  virtual void remove_dial_target(const certs::Identity& peer) { (void)peer; }
};

}  // namespace entente::federation
