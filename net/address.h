#pragma once
// Which accepted connections count together against a per-address
// connection budget (the API listener's and the peer-link listener's
// max_connections_per_address). Declared without Asio's headers.

#include <string>

namespace boost::asio::ip {
class address;
}

namespace entente::inet {

// An IPv4 address (also when it arrives IPv4-mapped on an IPv6 listener),
// or an IPv6 client's /64, the smallest block one subscriber is usually
// given: a client that owns a /64 cannot escape its budget by rotating
// addresses inside it.
std::string address_key(const boost::asio::ip::address& addr);

}  // namespace entente::inet
