#pragma once
// The `cluster` section of a node's configuration (docs/configuration.md,
// docs/cluster.md): the etcd that holds what the nodes of a domain agree on,
// the key prefix the domain's keys live under, and the membership lease.
// Without the section a node is a one-node domain and nothing here is used.

#include <cstdint>
#include <string>
#include <vector>

namespace entente::cluster {

struct ClusterConfig {
  bool enabled = false;  // the section is present
  // "http://host:port" or "https://host:port", 1..16 of them.
  std::vector<std::string> etcd_endpoints;
  std::string etcd_ca_file;  // verifies https endpoints
  // Every key of the domain starts with it: "/entente/<domain>/" unless
  // given. Starts and ends with '/'.
  std::string prefix;
  int64_t lease_ttl_ms = 5'000;   // membership and controller leases (whole seconds)
  int64_t etcd_timeout_ms = 2'000;
  // The host the other nodes of the domain reach this node's API and peer
  // link at: the API's listen host unless given (which then must not be a
  // wildcard address).
  std::string advertise_host;
  // The port the other nodes dial for this node's peer link: the peer
  // listener's own port unless given (0). A node behind a port forward
  // (NAT, a proxy) advertises the forwarded port.
  uint16_t advertise_peer_port = 0;
  // Verifies the other nodes' API certificates when this node forwards a
  // request to them (API over TLS); empty: federation.ca_file, the
  // domain's CA.
  std::string api_ca_file;
};

}  // namespace entente::cluster
