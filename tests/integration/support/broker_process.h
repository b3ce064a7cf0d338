#pragma once
// Runs a real `entente broker` process for integration tests: a temporary
// data directory, a generated configuration listening on an ephemeral
// loopback port, and the port read back from the broker's start-up line.
// The data directory survives restart() (kill + start again) and is removed
// by the destructor.

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "http/client.h"
#include "tests/support/temp_dir.h"

namespace entente::testing {

inline constexpr const char* kAdminToken = "admin-token-for-tests";
inline constexpr const char* kPublisherToken = "publisher-token-for-tests";
inline constexpr const char* kReaderToken = "reader-token-for-tests";

struct BrokerOptions {
  // The node's identity in its configuration ("domain", "node").
  std::string domain = "acme";
  std::string node = "n1";
  bool tls = false;
  std::string cert_file, key_file;  // when tls
  std::string ca_file;              // what clients verify the node's certificate against
  // Extra members merged into the configuration's top level, as JSON text
  // without braces (e.g. "\"checkpoint_interval\":\"200ms\"").
  std::string extra_config;
  // Extra members of "api" (e.g. "\"limits\":{...}").
  std::string extra_api;
  // Extra entries of "tokens", JSON objects without the brackets.
  std::string extra_tokens;
  // Extra arguments of `entente broker` after --config FILE (e.g. "--log-format", "json").
  std::vector<std::string> extra_args;
};

inline BrokerOptions with_config(std::string extra) {
  BrokerOptions o;
  o.extra_config = std::move(extra);
  return o;
}
inline BrokerOptions with_api(std::string extra) {
  BrokerOptions o;
  o.extra_api = std::move(extra);
  return o;
}

class BrokerProcess {
 public:
  explicit BrokerProcess(BrokerOptions options = {});
  ~BrokerProcess();
  BrokerProcess(const BrokerProcess&) = delete;
  BrokerProcess& operator=(const BrokerProcess&) = delete;

  // Starts the process and waits for its "listening" line (10 s at most).
  // Returns false (and records why in last_error()) when it does not come.
  bool start();
  // SIGKILL and wait.
  void kill();
  // SIGTERM; returns the exit status (or -1 on timeout, after SIGKILL).
  int terminate(int timeout_ms = 20000);
  bool restart_after_kill() { kill(); return start(); }

  uint16_t port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& data_dir() const { return dir_; }
  const std::string& config_path() const { return config_path_; }
  const std::string& last_error() const { return error_; }
  // Everything the process wrote to stderr so far.
  std::string stderr_text() const;

  http::ClientOptions client_options() const;
  std::unique_ptr<http::Client> client() const;  // fails the test on error
  // One request with a bearer token ("" for none).
  http::ClientResponse request(const std::string& method, const std::string& target,
                                       const std::string& body = {}, const std::string& token = kAdminToken,
                                       const std::string& content_type = "application/json") const;
  // The same without failing the test when the node cannot be reached (it
  // may be restarting): io_error then.
  Result<http::ClientResponse> try_request(const std::string& method, const std::string& target,
                                                   const std::string& body = {},
                                                   const std::string& token = kAdminToken,
                                                   const std::string& content_type = "application/json") const;

 private:
  BrokerOptions options_;
  std::string dir_;
  std::string config_path_;
  std::string stderr_path_;
  pid_t pid_ = -1;
  uint16_t port_ = 0;
  std::string error_;
};

// Runs a command, returns its exit status and stdout.
int run_command(const std::string& command, std::string& output);

}  // namespace entente::testing
