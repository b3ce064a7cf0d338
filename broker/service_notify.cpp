#include "broker/service_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace entente::broker {

Status notify_service(std::string_view state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || *path == '\0') return Status{};
  const std::string where(path);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (where.size() >= sizeof(addr.sun_path) || (where[0] != '/' && where[0] != '@')) {
    return Error{Errc::invalid_argument, "NOTIFY_SOCKET '" + where + "' is not a socket path nor an abstract name"};
  }
  std::memcpy(addr.sun_path, where.data(), where.size());
  if (where[0] == '@') addr.sun_path[0] = '\0';  // the abstract namespace
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + where.size());
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Error{Errc::io_error, std::string("notify socket: ") + std::strerror(errno)};
  const ssize_t sent =
      ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr), len);
  const int err = errno;
  ::close(fd);
  if (sent < 0 || static_cast<size_t>(sent) != state.size()) {
    return Error{Errc::io_error, "notifying the service manager at " + where + ": " + std::strerror(err)};
  }
  return Status{};
}

}  // namespace entente::broker
