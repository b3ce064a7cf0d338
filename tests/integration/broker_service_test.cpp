// The node speaks systemd's Type=notify protocol (packaging/systemd/
// entente.service, docs/operations.md "Installing a node"): a real `entente
// broker` process, started with NOTIFY_SOCKET naming a datagram socket the
// test holds, sends READY=1 once its API answers, RELOADING=1 and READY=1
// around a SIGHUP, and STOPPING=1 on SIGTERM. The test plays the service
// manager; no systemd runs here.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "broker/service_notify.h"
#include "tests/integration/support/broker_process.h"
#include "tests/support/temp_dir.h"

namespace entente::testing {
namespace {

// A datagram socket bound at `path` ('@' first: an abstract name), as a
// service manager holds one for each service it starts.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.data(), path.size());
    if (path[0] == '@') addr.sun_path[0] = '\0';
    const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
    bound_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<const sockaddr*>(&addr), len) == 0;
  }
  ~NotifySocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool bound() const { return bound_; }

  // The next datagram, or "" when none comes within `timeout_ms`.
  std::string next(int timeout_ms = 10000) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) != 1) return {};
    char buf[512];
    const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

// Sets NOTIFY_SOCKET for what this test starts, and unsets it after.
struct NotifyEnv {
  explicit NotifyEnv(const std::string& path) { ::setenv("NOTIFY_SOCKET", path.c_str(), 1); }
  ~NotifyEnv() { ::unsetenv("NOTIFY_SOCKET"); }
};

TEST(BrokerService, ANodeTellsItsServiceManagerWhenItIsReadyReloadingAndStopping) {
  const std::string dir = make_temp_dir("notify");
  const std::string path = dir + "/notify.sock";
  NotifySocket manager(path);
  ASSERT_TRUE(manager.bound()) << std::strerror(errno);
  NotifyEnv env(path);
  BrokerProcess node;
  ASSERT_TRUE(node.start()) << node.last_error();

  EXPECT_EQ(manager.next(), "READY=1\nSTATUS=serving");
  // READY came after the listener: the API answers.
  EXPECT_EQ(node.request("GET", "/v1/health", "", "").status, 200);

  ASSERT_EQ(::kill(node.pid(), SIGHUP), 0);
  EXPECT_EQ(manager.next(), "RELOADING=1");
  EXPECT_EQ(manager.next(), "READY=1\nSTATUS=serving");

  ASSERT_EQ(::kill(node.pid(), SIGTERM), 0);
  EXPECT_EQ(manager.next(), "STOPPING=1");
  EXPECT_EQ(node.terminate(), 0);
  std::filesystem::remove_all(dir);
}

TEST(BrokerService, AnAbstractSocketNameWorksAndABadOneIsAnErrorThatSaysWhy) {
  const std::string name = "@entente-notify-test-" + std::to_string(::getpid());
  NotifySocket manager(name);
  ASSERT_TRUE(manager.bound()) << std::strerror(errno);
  {
    NotifyEnv env(name);
    ASSERT_TRUE(broker::notify_service("READY=1").ok());
    EXPECT_EQ(manager.next(), "READY=1");
  }
  {
    NotifyEnv env("relative/path.sock");
    const Status s = broker::notify_service("READY=1");
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("relative/path.sock"), std::string::npos) << s.error().message;
  }
  {
    NotifyEnv env("/nonexistent-dir/notify.sock");
    const Status s = broker::notify_service("READY=1");
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.error().message.find("/nonexistent-dir/notify.sock"), std::string::npos) << s.error().message;
  }
  // No NOTIFY_SOCKET: nothing to tell, and no error (a node started by hand).
  EXPECT_TRUE(broker::notify_service("READY=1").ok());
}

}  // namespace
}  // namespace entente::testing
