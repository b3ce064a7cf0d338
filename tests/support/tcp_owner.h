#pragma once
// Which local TCP ports a process holds (what `ss -p` shows), from /proc:
// the socket inodes among /proc/PID/fd, looked up in /proc/net/tcp and
// tcp6. A TcpProxy (tests/support/tcp_proxy.h) uses it to tell the
// connections one process dialed from another's, all of them coming from
// 127.0.0.1: the chaos test cuts one node's links in both directions
// this way. Linux only; every read is bounded by what /proc lists.

#include <sys/types.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace entente::testing {

// The local ports of the TCP sockets `pid` has open (listening, connected
// or connecting); with `remote_port`, only of those connected (or
// connecting) to that port: a source port may be reused towards another
// destination by another process. Empty when the process is gone.
inline std::set<uint16_t> local_tcp_ports_of(pid_t pid, uint16_t remote_port = 0) {
  std::set<uint64_t> inodes;
  std::error_code ec;
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  for (const auto& fd : std::filesystem::directory_iterator(fds, ec)) {
    std::error_code lec;
    const std::string target = std::filesystem::read_symlink(fd.path(), lec).string();
    // "socket:[12345]"
    if (lec || target.rfind("socket:[", 0) != 0) continue;
    inodes.insert(std::strtoull(target.c_str() + 8, nullptr, 10));
  }
  std::set<uint16_t> ports;
  if (inodes.empty()) return ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      // "sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ..."
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout;
      uint64_t inode = 0;
      if (!(fields >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode))
        continue;
      if (inodes.count(inode) == 0) continue;
      const size_t colon = local.rfind(':');
      const size_t rcolon = remote.rfind(':');
      if (colon == std::string::npos || rcolon == std::string::npos) continue;
      if (remote_port != 0 && std::stoul(remote.substr(rcolon + 1), nullptr, 16) != remote_port) continue;
      ports.insert(static_cast<uint16_t>(std::stoul(local.substr(colon + 1), nullptr, 16)));
    }
  }
  return ports;
}

}  // namespace entente::testing
