#pragma once
// A TCP port on 127.0.0.1 for a process a test starts itself (etcd, a
// federation listener). It is drawn at random from below the kernel's
// ephemeral range (net.ipv4.ip_local_port_range), so that neither an
// outgoing connection's source port nor a listener bound to port 0 can take
// it between this call and the process binding it; it is checked by binding
// it once. Two tests running at once may still, rarely, draw the same one.
// 0 if none could be had.

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <random>

namespace entente::testing {

inline bool loopback_port_binds(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

inline uint16_t free_loopback_port() {
  int ephemeral_low = 32768;
  if (std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range"); in) in >> ephemeral_low;
  const int low = 10000;
  const int high = ephemeral_low - 1;
  if (high > low + 1000) {
    static thread_local std::mt19937 rng{std::random_device{}()};
    std::uniform_int_distribution<int> pick(low, high);
    for (int i = 0; i < 200; ++i) {
      const auto port = static_cast<uint16_t>(pick(rng));
      if (loopback_port_binds(port)) return port;
    }
  }
  // The ephemeral range starts too low to leave room: let the kernel choose.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace entente::testing
