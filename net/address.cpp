#include "net/address.h"

#include <algorithm>

#include <boost/asio/ip/address.hpp>

namespace entente::inet {

std::string address_key(const boost::asio::ip::address& addr) {
  namespace ip = boost::asio::ip;
  if (addr.is_v4()) return addr.to_string();
  const auto v6 = addr.to_v6();
  if (v6.is_v4_mapped()) return ip::make_address_v4(ip::v4_mapped, v6).to_string();
  auto bytes = v6.to_bytes();
  std::fill(bytes.begin() + 8, bytes.end(), 0);
  return ip::address_v6(bytes).to_string() + "/64";
}

}  // namespace entente::inet
