#include "tests/integration/support/broker_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "broker/config.h"

namespace entente::testing {

BrokerProcess::BrokerProcess(BrokerOptions options) : options_(std::move(options)) {
  dir_ = make_temp_dir("itest");
  config_path_ = dir_ + "/node.json";
  stderr_path_ = dir_ + "/stderr.log";
  std::string tls = options_.tls ? "{\"cert\":\"" + options_.cert_file + "\",\"key\":\"" + options_.key_file + "\"}"
                                 : "false";
  std::ostringstream cfg;
  cfg << "{\"domain\":\"" << options_.domain << "\",\"node\":\"" << options_.node << "\",";
  cfg << "\"api\":{\"listen\":\"127.0.0.1:0\",\"tls\":" << tls;
  if (!options_.extra_api.empty()) cfg << "," << options_.extra_api;
  cfg << "},";
  cfg << "\"data_dir\":\"" << dir_ << "/data\",";
  cfg << "\"tokens\":[";
  cfg << "{\"name\":\"ops\",\"role\":\"admin\",\"sha256\":\"" << broker::hash_token(kAdminToken) << "\"},";
  cfg << "{\"name\":\"feed\",\"role\":\"publisher\",\"sha256\":\"" << broker::hash_token(kPublisherToken) << "\"},";
  cfg << "{\"name\":\"dash\",\"role\":\"reader\",\"sha256\":\"" << broker::hash_token(kReaderToken) << "\"}";
  if (!options_.extra_tokens.empty()) cfg << "," << options_.extra_tokens;
  cfg << "]";
  if (!options_.extra_config.empty()) cfg << "," << options_.extra_config;
  cfg << "}";
  std::ofstream(config_path_) << cfg.str();
}

BrokerProcess::~BrokerProcess() {
  if (pid_ > 0) kill();
  // A failed test keeps the node's directory (data, config, log) and shows
  // the end of its log: in CI that is all there is to go on.
  if (::testing::Test::HasFailure()) {
    const std::string log = stderr_text();
    size_t from = log.size();
    for (int lines = 0; from > 0 && lines <= 40; --from)
      if (log[from - 1] == '\n') ++lines;
    std::fprintf(stderr, "--- %s/%s kept in %s; the end of its log:\n%s--- end of %s/%s\n",
                 options_.domain.c_str(), options_.node.c_str(), dir_.c_str(), log.c_str() + from,
                 options_.domain.c_str(), options_.node.c_str());
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

bool BrokerProcess::start() {
  int out[2];
  if (pipe(out) != 0) {
    error_ = "pipe failed";
    return false;
  }
  pid_ = fork();
  if (pid_ == 0) {
    dup2(out[1], 1);
    int err = ::open(stderr_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (err >= 0) dup2(err, 2);
    close(out[0]);
    std::vector<char*> argv{const_cast<char*>(ENTENTE_BIN), const_cast<char*>("broker"),
                            const_cast<char*>("--config"), config_path_.data()};
    for (auto& a : options_.extra_args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(ENTENTE_BIN, argv.data());
    _exit(127);
  }
  close(out[1]);
  // Read the start-up line: "entente: node acme/n1 listening on http://127.0.0.1:PORT".
  // Only that line counts; anything printed before it is skipped.
  std::string text;
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (line.empty() && std::chrono::steady_clock::now() < deadline) {
    pollfd p{out[0], POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buf[256];
    ssize_t n = read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
    size_t begin = 0;
    for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1) {
      std::string candidate = text.substr(begin, end - begin);
      if (candidate.find("listening on http") != std::string::npos) {
        line = std::move(candidate);
        break;
      }
    }
  }
  close(out[0]);
  auto colon = line.rfind(':');
  if (line.empty() || colon == std::string::npos) {
    error_ = "no start-up line; stdout: '" + text + "'; stderr: " + stderr_text();
    kill();
    return false;
  }
  port_ = static_cast<uint16_t>(std::atoi(line.c_str() + colon + 1));
  return port_ != 0;
}

void BrokerProcess::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int st;
  waitpid(pid_, &st, 0);
  pid_ = -1;
}

int BrokerProcess::terminate(int timeout_ms) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    int st;
    pid_t r = waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill();
  return -1;
}

std::string BrokerProcess::stderr_text() const {
  std::ifstream f(stderr_path_);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

http::ClientOptions BrokerProcess::client_options() const {
  http::ClientOptions o;
  o.host = "127.0.0.1";
  o.port = port_;
  o.tls = options_.tls;
  o.ca_file = options_.ca_file;
  return o;
}

std::unique_ptr<http::Client> BrokerProcess::client() const {
  auto c = http::Client::connect(client_options());
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
  return c.ok() ? std::move(c).value() : nullptr;
}

http::ClientResponse BrokerProcess::request(const std::string& method, const std::string& target,
                                                    const std::string& body, const std::string& token,
                                                    const std::string& content_type) const {
  auto c = client();
  if (!c) return {};
  std::vector<std::pair<std::string, std::string>> headers;
  if (!token.empty()) headers.emplace_back("authorization", "Bearer " + token);
  auto r = c->request(method, target, body, content_type, headers);
  EXPECT_TRUE(r.ok()) << method << " " << target << ": " << (r.ok() ? "" : r.error().message);
  return r.ok() ? std::move(r).value() : http::ClientResponse{};
}

Result<http::ClientResponse> BrokerProcess::try_request(const std::string& method,
                                                                const std::string& target, const std::string& body,
                                                                const std::string& token,
                                                                const std::string& content_type) const {
  auto c = http::Client::connect(client_options());
  if (!c.ok()) return c.error();
  std::vector<std::pair<std::string, std::string>> headers;
  if (!token.empty()) headers.emplace_back("authorization", "Bearer " + token);
  return (*c)->request(method, target, body, content_type, headers);
}

int run_command(const std::string& command, std::string& output) {
  output.clear();
  FILE* p = popen(command.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) output.append(buf, n);
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

}  // namespace entente::testing
