#pragma once
// Plain TCP sockets for tests that must control every byte a client sends,
// or where a connection comes from: request smuggling, malformed upgrades,
// floods of idle connections from one loopback address (127.0.0.2, ...:
// the whole 127.0.0.0/8 reaches the loopback interface, so a test can give
// a flood and a legitimate client different source addresses).
//
// Header-only, POSIX sockets; every call is bounded in time.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace entente::testing {

// An open TCP connection; closes on destruction. fd() < 0: not connected.
class RawTcp {
 public:
  RawTcp() = default;
  // Connects to host:port, first binding to `source` (an IPv4 address of
  // this machine, e.g. "127.0.0.2") when it is not empty.
  RawTcp(const std::string& host, uint16_t port, const std::string& source = {}) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return;
    sockaddr_in from{};
    if (!source.empty()) {
      from.sin_family = AF_INET;
      from.sin_port = 0;
      if (::inet_pton(AF_INET, source.c_str(), &from.sin_addr) != 1 ||
          ::bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0) {
        reset();
        return;
      }
    }
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    if (::inet_pton(AF_INET, host.c_str(), &to.sin_addr) != 1 ||
        ::connect(fd_, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
      reset();
    }
  }
  ~RawTcp() { reset(); }
  RawTcp(RawTcp&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  RawTcp& operator=(RawTcp&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = o.fd_;
      o.fd_ = -1;
    }
    return *this;
  }
  RawTcp(const RawTcp&) = delete;
  RawTcp& operator=(const RawTcp&) = delete;

  int fd() const { return fd_; }
  bool connected() const { return fd_ >= 0; }

  bool send_all(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Reads until the server closes the connection (true) or `timeout`
  // passes (false); what arrived is appended to `out`. A reset counts as
  // closed.
  bool read_until_closed(std::string& out, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    char buf[4096];
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return false;
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return true;
      out.append(buf, static_cast<size_t>(n));
    }
  }

  // True when the server closed the connection within `timeout`, whatever
  // it sent first.
  bool closed_within(std::chrono::milliseconds timeout) {
    std::string ignored;
    return read_until_closed(ignored, timeout);
  }

 private:
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_ = -1;
};

// Sends `bytes` on a fresh connection and returns everything the server
// sent until it closed; `closed` tells whether it did within `timeout`.
struct RawExchange {
  bool connected = false;
  bool closed = false;
  std::string received;
};
inline RawExchange raw_exchange(uint16_t port, std::string_view bytes,
                                std::chrono::milliseconds timeout = std::chrono::seconds(10),
                                const std::string& source = {}) {
  RawExchange out;
  RawTcp c("127.0.0.1", port, source);
  out.connected = c.connected();
  if (!out.connected) return out;
  if (!c.send_all(bytes)) {
    out.closed = true;  // refused or reset while sending
    return out;
  }
  out.closed = c.read_until_closed(out.received, timeout);
  return out;
}

// How many HTTP responses (status lines) `text` holds.
inline int count_responses(std::string_view text) {
  int n = 0;
  for (size_t at = text.find("HTTP/1."); at != std::string_view::npos;
       at = text.find("HTTP/1.", at + 1)) {
    if (at == 0 || text[at - 1] == '\n') ++n;
  }
  return n;
}

}  // namespace entente::testing
