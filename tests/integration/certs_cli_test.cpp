// `entente certs ...` as a user runs it: the real binary creates a domain CA
// and node certificates, shows them, refuses bad input with the documented
// exit codes, and a standard tool (`openssl verify`) accepts the chain.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "http/client.h"
#include "tests/integration/support/broker_process.h"

namespace {

namespace fs = std::filesystem;

struct Outcome {
  int code = -1;  // exit status, or -1 when the process did not exit normally
  std::string out;
  std::string err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `program args...` with stdout and stderr captured in files of `dir`.
Outcome run_program(const std::string& program, const std::vector<std::string>& args, const fs::path& dir) {
  const fs::path out_file = dir / "stdout.txt";
  const fs::path err_file = dir / "stderr.txt";
  Outcome o;
  const pid_t pid = ::fork();
  if (pid < 0) return o;
  if (pid == 0) {
    const int out = ::open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0) ::_exit(126);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(program.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execvp(program.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return o;
  o.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  o.out = slurp(out_file);
  o.err = slurp(err_file);
  return o;
}

class CertsCliProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("entente-certs-it-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(dir_ / "logs");
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  Outcome entente(std::vector<std::string> args) {
    args.insert(args.begin(), "certs");
    return run_program(ENTENTE_BIN, args, dir_ / "logs");
  }
  std::string p(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

unsigned mode_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_mode & 07777 : 0xffff;
}

TEST_F(CertsCliProcessTest, TwoDomainsEndToEnd) {
  Outcome ca = entente({"init-domain", "acme", "--out", p("acme-ca")});
  ASSERT_EQ(ca.code, 0) << ca.err;
  EXPECT_TRUE(contains(ca.out, "created the CA of domain acme")) << ca.out;
  Outcome ca2 = entente({"init-domain", "globex", "--out", p("globex-ca"), "--key", "ed25519"});
  ASSERT_EQ(ca2.code, 0) << ca2.err;
  EXPECT_EQ(mode_of(p("acme-ca/ca.key")), 0600u);
  EXPECT_EQ(mode_of(p("acme-ca/ca.crt")), 0644u);

  Outcome n1 = entente({"issue-node", "acme", "n1", "--ca", p("acme-ca"), "--san", "127.0.0.1,::1,localhost",
                        "--out", p("acme-n1")});
  ASSERT_EQ(n1.code, 0) << n1.err;
  EXPECT_TRUE(contains(n1.out, "issued entente://acme/n1")) << n1.out;
  EXPECT_EQ(mode_of(p("acme-n1/node.key")), 0600u);
  Outcome g1 = entente({"issue-node", "globex", "g1", "--ca", p("globex-ca"), "--san", "localhost", "--out",
                        p("globex-g1"), "--key", "ed25519"});
  ASSERT_EQ(g1.code, 0) << g1.err;

  Outcome show = entente({"show", p("acme-n1/node.crt")});
  ASSERT_EQ(show.code, 0) << show.err;
  EXPECT_TRUE(contains(show.out, "identity: entente://acme/n1\n")) << show.out;
  EXPECT_TRUE(contains(show.out, "issuer: CN=acme Entente CA,O=acme\n")) << show.out;
  EXPECT_TRUE(contains(show.out, "ip: 127.0.0.1, ::1\n")) << show.out;
  EXPECT_TRUE(contains(show.out, "dns: localhost\n")) << show.out;
  EXPECT_TRUE(contains(show.out, "status: valid")) << show.out;
  Outcome show_g1 = entente({"show", p("globex-g1/node.crt")});
  ASSERT_EQ(show_g1.code, 0);
  EXPECT_TRUE(contains(show_g1.out, "identity: entente://globex/g1\n")) << show_g1.out;
  EXPECT_TRUE(contains(show_g1.out, "key: Ed25519\n")) << show_g1.out;

  // A node of one domain cannot be issued with another domain's CA.
  Outcome cross = entente({"issue-node", "globex", "g2", "--ca", p("acme-ca"), "--out", p("g2")});
  EXPECT_EQ(cross.code, 1);
  EXPECT_TRUE(contains(cross.err, "belongs to domain 'acme', not to domain 'globex'")) << cross.err;

  // A standard tool accepts each chain with its own CA, and not with the
  // other domain's.
  Outcome which = run_program("sh", {"-c", "command -v openssl"}, dir_ / "logs");
  if (which.code != 0) GTEST_SKIP() << "the openssl command is not installed";
  Outcome ok = run_program("openssl", {"verify", "-CAfile", p("acme-ca/ca.crt"), p("acme-n1/node.crt")},
                           dir_ / "logs");
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
  EXPECT_TRUE(contains(ok.out, "node.crt: OK")) << ok.out;
  Outcome ok_ed = run_program(
      "openssl",
      {"verify", "-purpose", "sslclient", "-CAfile", p("globex-g1/ca.crt"), p("globex-g1/node.crt")},
      dir_ / "logs");
  EXPECT_EQ(ok_ed.code, 0) << ok_ed.out << ok_ed.err;
  Outcome server = run_program(
      "openssl", {"verify", "-purpose", "sslserver", "-CAfile", p("acme-n1/ca.crt"), p("acme-n1/node.crt")},
      dir_ / "logs");
  EXPECT_EQ(server.code, 0) << server.out << server.err;
  Outcome wrong = run_program("openssl", {"verify", "-CAfile", p("globex-ca/ca.crt"), p("acme-n1/node.crt")},
                              dir_ / "logs");
  EXPECT_NE(wrong.code, 0) << wrong.out;
}

TEST_F(CertsCliProcessTest, ExitCodesAndMessages) {
  Outcome none = entente({});
  EXPECT_EQ(none.code, 2);
  EXPECT_TRUE(contains(none.err, "usage: entente certs <command>")) << none.err;

  Outcome help = entente({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_TRUE(contains(help.out, "init-domain NAME --out DIR")) << help.out;

  Outcome top = run_program(ENTENTE_BIN, {"--help"}, dir_ / "logs");
  EXPECT_EQ(top.code, 0);
  EXPECT_TRUE(contains(top.out, "certs <command>")) << top.out;

  Outcome missing_out = entente({"init-domain", "acme"});
  EXPECT_EQ(missing_out.code, 2);
  EXPECT_TRUE(contains(missing_out.err, "--out DIR is required")) << missing_out.err;

  ASSERT_EQ(entente({"init-domain", "acme", "--out", p("ca")}).code, 0);
  const std::string key_before = slurp(p("ca/ca.key"));
  Outcome again = entente({"init-domain", "acme", "--out", p("ca")});
  EXPECT_EQ(again.code, 1);
  EXPECT_TRUE(contains(again.err, "exists already (use --force to overwrite)")) << again.err;
  EXPECT_EQ(slurp(p("ca/ca.key")), key_before);

  Outcome bad_san =
      entente({"issue-node", "acme", "n1", "--ca", p("ca"), "--san", "not a host", "--out", p("n1")});
  EXPECT_EQ(bad_san.code, 1);
  EXPECT_TRUE(contains(bad_san.err, "'not a host'")) << bad_san.err;

  Outcome show_missing = entente({"show", p("nothing.crt")});
  EXPECT_EQ(show_missing.code, 1);
  EXPECT_TRUE(contains(show_missing.err, p("nothing.crt"))) << show_missing.err;
}

// `certs renew`: the same identity, names, key type and issuer, a new
// validity and key; refused with a CA that did not sign the old one, even
// one of the same name.
TEST_F(CertsCliProcessTest, RenewKeepsTheIdentityAndNamesWithANewValidity) {
  ASSERT_EQ(entente({"init-domain", "acme", "--out", p("acme-ca")}).code, 0);
  ASSERT_EQ(entente({"init-domain", "acme", "--out", p("other-acme-ca")}).code, 0);
  ASSERT_EQ(entente({"init-domain", "globex", "--out", p("globex-ca"), "--key", "ed25519"}).code, 0);
  ASSERT_EQ(entente({"issue-node", "acme", "n1", "--ca", p("acme-ca"), "--san", "127.0.0.1,::1,localhost",
                     "--days", "30", "--out", p("acme-n1")})
                .code,
            0);
  ASSERT_EQ(entente({"issue-node", "globex", "g1", "--ca", p("globex-ca"), "--san", "g1.example", "--out",
                     p("globex-g1"), "--key", "ed25519"})
                .code,
            0);
  const Outcome before = entente({"show", p("acme-n1/node.crt")});
  ASSERT_EQ(before.code, 0) << before.err;
  const std::string key_before = slurp(p("acme-n1/node.key"));

  Outcome renewed = entente({"renew", "--ca", p("acme-ca"), "--dir", p("acme-n1"), "--days", "90"});
  ASSERT_EQ(renewed.code, 0) << renewed.err;
  EXPECT_TRUE(contains(renewed.out, "renewed entente://acme/n1: valid until ")) << renewed.out;
  EXPECT_TRUE(contains(renewed.out, "names:       localhost, 127.0.0.1, ::1\n")) << renewed.out;
  const Outcome after = entente({"show", p("acme-n1/node.crt")});
  ASSERT_EQ(after.code, 0) << after.err;
  // The lines of `show` that must not change, and those that must.
  auto line = [](const std::string& out, const std::string& key) {
    const size_t at = out.find("\n" + key + ": ");
    return at == std::string::npos ? std::string("<absent>")
                                   : out.substr(at + 1, out.find('\n', at + 1) - at - 1);
  };
  for (const char* key : {"subject", "issuer", "dns", "ip", "key"})
    EXPECT_EQ(line(after.out, key), line(before.out, key)) << key;
  EXPECT_TRUE(contains(after.out, "identity: entente://acme/n1\n")) << after.out;
  EXPECT_TRUE(contains(after.out, "status: valid (expires in 89 days)")) << after.out;
  EXPECT_NE(line(after.out, "not after"), line(before.out, "not after"));
  EXPECT_NE(line(after.out, "sha256"), line(before.out, "sha256"));
  EXPECT_NE(slurp(p("acme-n1/node.key")), key_before);
  EXPECT_EQ(mode_of(p("acme-n1/node.key")), 0600u);

  // An Ed25519 node stays Ed25519.
  ASSERT_EQ(entente({"renew", "--ca", p("globex-ca"), "--dir", p("globex-g1")}).code, 0);
  const Outcome g1 = entente({"show", p("globex-g1/node.crt")});
  EXPECT_TRUE(contains(g1.out, "key: Ed25519\n")) << g1.out;
  EXPECT_TRUE(contains(g1.out, "dns: g1.example\n")) << g1.out;

  // Another CA, even one calling itself acme, did not issue it.
  const std::string cert_before = slurp(p("acme-n1/node.crt"));
  Outcome impostor = entente({"renew", "--ca", p("other-acme-ca"), "--dir", p("acme-n1")});
  EXPECT_EQ(impostor.code, 1);
  EXPECT_TRUE(contains(impostor.err, "was not signed by the CA in " + p("other-acme-ca"))) << impostor.err;
  EXPECT_EQ(slurp(p("acme-n1/node.crt")), cert_before);
  Outcome no_dir = entente({"renew", "--ca", p("acme-ca")});
  EXPECT_EQ(no_dir.code, 2);
  EXPECT_TRUE(contains(no_dir.err, "--dir DIR is required")) << no_dir.err;

  Outcome which = run_program("sh", {"-c", "command -v openssl"}, dir_ / "logs");
  if (which.code != 0) GTEST_SKIP() << "the openssl command is not installed";
  Outcome ok = run_program("openssl", {"verify", "-CAfile", p("acme-ca/ca.crt"), p("acme-n1/node.crt")},
                           dir_ / "logs");
  EXPECT_EQ(ok.code, 0) << ok.out << ok.err;
}

// docs/examples/node-tls.json names the files `entente certs issue-node`
// writes (certs/node.crt, certs/node.key, relative to the configuration's
// directory): a node starts from it as written, with only its listen
// address and data_dir changed for the test, and serves HTTPS with that
// certificate.
TEST_F(CertsCliProcessTest, ExampleTlsConfigurationRunsWithTheFilesEntenteCertsWrites) {
  entente::testing::BrokerOptions options;
  options.tls = true;
  entente::testing::BrokerProcess node(options);
  const std::string dir = node.data_dir();
  ASSERT_EQ(entente({"init-domain", "acme", "--out", dir + "/acme-ca"}).code, 0);
  Outcome issued = entente(
      {"issue-node", "acme", "n1", "--ca", dir + "/acme-ca", "--san", "127.0.0.1", "--out", dir + "/certs"});
  ASSERT_EQ(issued.code, 0) << issued.err;

  std::string config = slurp(fs::path(ENTENTE_SOURCE_DIR) / "docs" / "examples" / "node-tls.json");
  ASSERT_FALSE(config.empty());
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"0.0.0.0:8443", "127.0.0.1:0"},
                                 {"/var/lib/entente/acme-n1", dir + "/data"}}) {
    const size_t at = config.find(from);
    ASSERT_NE(at, std::string::npos) << from << " is not in the example any more";
    config.replace(at, from.size(), to);
  }
  std::ofstream(node.config_path(), std::ios::trunc) << config;
  ASSERT_TRUE(node.start()) << node.last_error();

  entente::http::ClientOptions o;
  o.port = node.port();
  o.tls = true;
  o.ca_file = dir + "/certs/ca.crt";
  auto client = entente::http::Client::connect(o);
  ASSERT_TRUE(client.ok()) << client.error().message;
  auto health = (*client)->request("GET", "/v1/health");
  ASSERT_TRUE(health.ok()) << health.error().message;
  EXPECT_EQ(health->status, 200u) << health->body;
}

}  // namespace
