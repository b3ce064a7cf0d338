#pragma once
// Runs a real one-member etcd (`etcd` on PATH, Debian's etcd-server; or the
// file ENTENTE_ETCD names) for tests, unit and integration alike: a
// temporary data directory, client and peer ports picked free on 127.0.0.1,
// readiness when /health says so. The ports and the data directory survive
// stop(), kill() and start() again, so a restarted etcd is the same member
// with the same data at the same address. The destructor kills it and
// removes the directory (kept, with etcd's log, when a test failed).
//
// A test that needs etcd skips itself when none is installed:
//   if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
//
// Header-only, POSIX; every wait is bounded.

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "http/client.h"
#include "tests/support/free_port.h"
#include "tests/support/sigstop.h"
#include "tests/support/temp_dir.h"

namespace entente::testing {

class EtcdProcess {
 public:
  static constexpr const char* kNotInstalled =
      "etcd is not installed (no `etcd` on PATH, ENTENTE_ETCD unset): "
      "apt-get install etcd-server (scripts/install-deps.sh)";

  // The etcd executable: $ENTENTE_ETCD, else the first `etcd` on PATH;
  // empty when there is none.
  static std::string binary() {
    if (const char* env = std::getenv("ENTENTE_ETCD"); env != nullptr && *env != '\0') {
      return ::access(env, X_OK) == 0 ? std::string(env) : std::string();
    }
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin");
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
      if (dir.empty()) continue;
      const std::string candidate = dir + "/etcd";
      struct stat st {};
      if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          ::access(candidate.c_str(), X_OK) == 0) {
        return candidate;
      }
    }
    return {};
  }

  // `name`: the member's name, also in the temporary directory's name.
  explicit EtcdProcess(std::string name = "etcd") : name_(std::move(name)) {
    dir_ = make_temp_dir(name_);
    client_port_ = free_port();
    peer_port_ = free_port();
  }
  ~EtcdProcess() {
    kill();
    if (::testing::Test::HasFailure()) {
      std::fprintf(stderr, "--- etcd %s kept in %s; the end of its log:\n%s\n--- end of etcd %s\n",
                   name_.c_str(), dir_.c_str(), log_tail(30).c_str(), name_.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  // More command-line flags for the next start(), e.g.
  // {"--heartbeat-interval=50", "--election-timeout=500"}: etcd then grants
  // leases of 1 s (with its defaults the shortest is 2 s).
  void set_extra_args(std::vector<std::string> args) { extra_args_ = std::move(args); }

  // Starts etcd (again, after stop or kill: same ports, same data) and waits
  // until /health answers {"health":"true"} (a leader is elected).
  // False, with the reason in last_error(), when it does not within
  // `timeout_ms`.
  bool start(int64_t timeout_ms = 30'000) {
    if (pid_ > 0) {
      error_ = "already running";
      return false;
    }
    const std::string exe = binary();
    if (exe.empty()) {
      error_ = kNotInstalled;
      return false;
    }
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    const std::vector<std::string> args = {
        exe,
        "--name=" + name_,
        "--data-dir=" + dir_ + "/data",
        "--listen-client-urls=" + endpoint(),
        "--advertise-client-urls=" + endpoint(),
        "--listen-peer-urls=" + peer,
        "--initial-advertise-peer-urls=" + peer,
        "--initial-cluster=" + name_ + "=" + peer,
        "--initial-cluster-state=new",
    };
    std::vector<std::string> all = args;
    all.insert(all.end(), extra_args_.begin(), extra_args_.end());
    const std::string log = dir_ + "/etcd.log";
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) {
      pid_ = 0;
      error_ = "fork failed";
      return false;
    }
    if (pid_ == 0) {
      // Dies with the test process, even when that one is killed.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) _exit(126);
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (const auto& a : all) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(exe.c_str(), argv.data());
      _exit(127);
    }
    paused_ = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = 0;
        error_ = "etcd exited during start-up; its log:\n" + log_tail(20);
        return false;
      }
      if (healthy()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    error_ = "etcd did not become healthy within " + std::to_string(timeout_ms) + " ms; its log:\n" +
             log_tail(20);
    kill();
    return false;
  }

  // SIGTERM, then waits (SIGKILL after `timeout_ms`).
  void stop(int64_t timeout_ms = 10'000) {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    if (paused_) ::kill(pid_, SIGCONT);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = 0;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill();
  }

  // SIGKILL and wait.
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = 0;
    paused_ = false;
  }

  // SIGSTOP / SIGCONT: a node that hangs, its sockets open and unanswered.
  // pause() returns once every thread of etcd has stopped (kill() returns
  // before that; a request sent in between would still be answered).
  void pause() {
    if (stop_and_wait(pid_)) paused_ = true;
  }
  void resume() {
    if (pid_ > 0 && ::kill(pid_, SIGCONT) == 0) paused_ = false;
  }

  bool restart(int64_t timeout_ms = 30'000) {
    stop();
    return start(timeout_ms);
  }

  // One /health request; true when etcd says it is healthy.
  bool healthy() const {
    http::ClientOptions o;
    o.port = client_port_;
    o.timeout_ms = 1'000;
    auto c = http::Client::connect(o);
    if (!c.ok()) return false;
    auto r = (*c)->request("GET", "/health");
    return r.ok() && r->status == 200 && r->body.find("\"true\"") != std::string::npos;
  }

  // "http://127.0.0.1:PORT", what EtcdOptions::endpoints takes.
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(client_port_); }
  uint16_t client_port() const { return client_port_; }
  uint16_t peer_port() const { return peer_port_; }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }
  const std::string& dir() const { return dir_; }
  const std::string& last_error() const { return error_; }

  // The last `lines` lines etcd wrote.
  std::string log_tail(int lines) const {
    std::ifstream in(dir_ + "/etcd.log");
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    size_t from = text.size();
    for (int n = 0; from > 0 && n <= lines; --from) {
      if (text[from - 1] == '\n') ++n;
    }
    return text.substr(from);
  }

  // True when every thread of the process is in state T (stopped).
  bool all_threads_stopped() const { return testing::all_threads_stopped(pid_); }

  // A TCP port on 127.0.0.1 that was free a moment ago; 0 if none.
  static uint16_t free_port() { return free_loopback_port(); }

 private:
  std::string name_;
  std::string dir_;
  uint16_t client_port_ = 0;
  uint16_t peer_port_ = 0;
  pid_t pid_ = 0;
  bool paused_ = false;
  std::vector<std::string> extra_args_;
  std::string error_;
};

}  // namespace entente::testing
