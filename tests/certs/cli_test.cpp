// `entente certs ...` through run_certs: exit codes, what goes to stdout and
// stderr, usage errors versus failed operations.

#include "certs/cli.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "certs/certs.h"

namespace entente::certs {
namespace {

namespace fs = std::filesystem;

class CertsCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() / ("entente-certs-cli-" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // Runs `entente certs ARGS...`; out_ and err_ hold what it printed.
  int run(std::vector<std::string> args) {
    std::ostringstream out, err;
    const int code = run_certs(args, out, err);
    out_ = out.str();
    err_ = err.str();
    return code;
  }
  std::string p(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
  std::string out_, err_;
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(CertsCliTest, HelpAndUsage) {
  EXPECT_EQ(run({}), 2);
  EXPECT_TRUE(contains(err_, "a command is required")) << err_;
  EXPECT_TRUE(contains(err_, "usage: entente certs <command>")) << err_;
  EXPECT_TRUE(out_.empty());

  EXPECT_EQ(run({"--help"}), 0);
  EXPECT_TRUE(contains(out_, "init-domain NAME --out DIR")) << out_;
  EXPECT_TRUE(contains(out_, "issue-node DOMAIN NODE")) << out_;
  EXPECT_TRUE(contains(out_, "show FILE")) << out_;
  EXPECT_TRUE(err_.empty());

  EXPECT_EQ(run({"frobnicate"}), 2);
  EXPECT_TRUE(contains(err_, "entente certs: unknown command 'frobnicate'")) << err_;

  EXPECT_EQ(run({"init-domain", "--help"}), 0);
  EXPECT_TRUE(contains(out_, "usage: entente certs init-domain NAME --out DIR")) << out_;
  EXPECT_EQ(run({"issue-node", "-h"}), 0);
  EXPECT_TRUE(contains(out_, "usage: entente certs issue-node DOMAIN NODE --ca DIR --out DIR")) << out_;
  EXPECT_EQ(run({"show", "--help"}), 0);
  EXPECT_TRUE(contains(out_, "usage: entente certs show FILE")) << out_;
}

TEST_F(CertsCliTest, InitDomainWritesAndReports) {
  ASSERT_EQ(run({"init-domain", "acme", "--out", p("ca")}), 0) << err_;
  EXPECT_TRUE(contains(out_, "created the CA of domain acme")) << out_;
  EXPECT_TRUE(contains(out_, "certificate: " + p("ca") + "/ca.crt")) << out_;
  EXPECT_TRUE(contains(out_, "private key: " + p("ca") + "/ca.key (mode 0600")) << out_;
  EXPECT_TRUE(err_.empty()) << err_;

  // Existing files: the operation fails (1), and says how to proceed.
  EXPECT_EQ(run({"init-domain", "acme", "--out", p("ca")}), 1);
  EXPECT_TRUE(contains(err_, "entente certs init-domain: ")) << err_;
  EXPECT_TRUE(contains(err_, "exists already (use --force to overwrite)")) << err_;
  EXPECT_FALSE(contains(err_, "usage:")) << err_;
  EXPECT_EQ(run({"init-domain", "--force", "acme", "--out=" + p("ca"), "--key", "ed25519", "--days", "30"}),
            0)
      << err_;
  auto info = read_certificate(p("ca") + "/ca.crt");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->key_type, "Ed25519");
  EXPECT_EQ(info->not_after - info->not_before, std::chrono::hours(24 * 30));
}

TEST_F(CertsCliTest, InitDomainUsageErrors) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"init-domain", "--out", p("x")}, "NAME is required"},
      {{"init-domain", "a", "b", "--out", p("x")}, "expected one NAME"},
      {{"init-domain", "acme"}, "--out DIR is required"},
      {{"init-domain", "acme", "--out"}, "--out needs a value"},
      {{"init-domain", "acme", "--out", p("x"), "--key", "rsa"},
       "--key must be ec-p256 or ed25519, not 'rsa'"},
      {{"init-domain", "acme", "--out", p("x"), "--days", "ten"},
       "--days must be a whole number of days, not 'ten'"},
      {{"init-domain", "acme", "--out", p("x"), "--days", "10d"},
       "--days must be a whole number of days, not '10d'"},
      {{"init-domain", "acme", "--out", p("x"), "--verbose"}, "unknown option '--verbose'"},
      {{"init-domain", "acme", "--out", p("x"), "--force=yes"}, "unknown option '--force=yes'"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(run(c.args), 2) << c.message;
    EXPECT_TRUE(contains(err_, "entente certs init-domain: " + c.message)) << err_;
    EXPECT_TRUE(contains(err_, "usage: entente certs init-domain")) << err_;
  }
  EXPECT_FALSE(fs::exists(p("x")));
  // Well-formed but refused by the operation: exit 1, no usage text.
  EXPECT_EQ(run({"init-domain", "Acme", "--out", p("x")}), 1);
  EXPECT_TRUE(contains(err_, "domain name 'Acme' is not [a-z][a-z0-9-]*")) << err_;
  EXPECT_EQ(run({"init-domain", "acme", "--out", p("x"), "--days", "0"}), 1);
  EXPECT_TRUE(contains(err_, "outside 1..36500")) << err_;
}

TEST_F(CertsCliTest, IssueNodeAndShow) {
  ASSERT_EQ(run({"init-domain", "acme", "--out", p("ca")}), 0) << err_;
  ASSERT_EQ(run({"issue-node", "acme", "n1", "--ca", p("ca"), "--san", "127.0.0.1,localhost", "--san", "::1",
                 "--out", p("n1")}),
            0)
      << err_;
  EXPECT_TRUE(contains(out_, "issued entente://acme/n1 (valid until ")) << out_;
  EXPECT_TRUE(contains(out_, "certificate: " + p("n1") + "/node.crt (node certificate, then the CA)"))
      << out_;
  EXPECT_TRUE(contains(out_, "private key: " + p("n1") + "/node.key (mode 0600)")) << out_;
  EXPECT_TRUE(contains(out_, "domain CA:   " + p("n1") + "/ca.crt")) << out_;
  struct stat st {};
  ASSERT_EQ(::stat((p("n1") + "/node.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  ASSERT_EQ(run({"show", p("n1") + "/node.crt"}), 0) << err_;
  EXPECT_TRUE(contains(out_, "identity: entente://acme/n1\n")) << out_;
  EXPECT_TRUE(contains(out_, "issuer: CN=acme Entente CA,O=acme\n")) << out_;
  EXPECT_TRUE(contains(out_, "dns: localhost\n")) << out_;
  EXPECT_TRUE(contains(out_, "ip: 127.0.0.1, ::1\n")) << out_;
  EXPECT_TRUE(contains(out_, "status: valid (expires in 396 days)\n")) << out_;
  EXPECT_TRUE(contains(out_, "key: EC P-256\n")) << out_;
  EXPECT_TRUE(contains(out_, "sha256: ")) << out_;

  ASSERT_EQ(run({"show", p("ca") + "/ca.crt"}), 0);
  EXPECT_TRUE(contains(out_, "ca: yes\n")) << out_;
}

TEST_F(CertsCliTest, IssueNodeErrors) {
  ASSERT_EQ(run({"init-domain", "acme", "--out", p("ca")}), 0) << err_;

  EXPECT_EQ(run({"issue-node", "acme", "--ca", p("ca"), "--out", p("n1")}), 2);
  EXPECT_TRUE(contains(err_, "entente certs issue-node: expected DOMAIN and NODE")) << err_;
  EXPECT_EQ(run({"issue-node", "acme", "n1", "--out", p("n1")}), 2);
  EXPECT_TRUE(contains(err_, "--ca DIR is required")) << err_;
  EXPECT_EQ(run({"issue-node", "acme", "n1", "--ca", p("ca")}), 2);
  EXPECT_TRUE(contains(err_, "--out DIR is required")) << err_;
  EXPECT_EQ(run({"issue-node", "acme", "n1", "--ca", p("ca"), "--out", p("n1"), "--san", "a,,b"}), 2);
  EXPECT_TRUE(contains(err_, "--san 'a,,b' has an empty name")) << err_;
  EXPECT_TRUE(contains(err_, "usage: entente certs issue-node")) << err_;

  EXPECT_EQ(
      run({"issue-node", "acme", "n1", "--ca", p("ca"), "--out", p("n1"), "--san", "localhost,bad_host"}), 1);
  EXPECT_TRUE(contains(err_, "entente certs issue-node: subject alternative name 'bad_host' is neither"))
      << err_;
  EXPECT_FALSE(contains(err_, "usage:")) << err_;

  EXPECT_EQ(run({"issue-node", "globex", "n1", "--ca", p("ca"), "--out", p("n1")}), 1);
  EXPECT_TRUE(contains(err_, "belongs to domain 'acme', not to domain 'globex'")) << err_;

  EXPECT_EQ(run({"issue-node", "acme", "n1", "--ca", p("missing"), "--out", p("n1")}), 1);
  EXPECT_TRUE(contains(err_, p("missing") + "/ca.crt")) << err_;
  EXPECT_FALSE(fs::exists(p("n1")));

  ASSERT_EQ(run({"issue-node", "acme", "n1", "--ca", p("ca"), "--out", p("n1")}), 0) << err_;
  EXPECT_EQ(run({"issue-node", "acme", "n1", "--ca", p("ca"), "--out", p("n1")}), 1);
  EXPECT_TRUE(contains(err_, "exists already")) << err_;
  EXPECT_EQ(
      run({"issue-node", "acme", "n1", "--ca", p("ca"), "--out", p("n1"), "--force", "--key", "ed25519"}), 0)
      << err_;
}

TEST_F(CertsCliTest, ShowErrors) {
  EXPECT_EQ(run({"show"}), 2);
  EXPECT_TRUE(contains(err_, "entente certs show: expected one FILE")) << err_;
  EXPECT_EQ(run({"show", "a", "b"}), 2);
  EXPECT_EQ(run({"show", p("none.crt")}), 1);
  EXPECT_TRUE(contains(err_, "entente certs show: cannot read " + p("none.crt"))) << err_;
  EXPECT_TRUE(out_.empty());
}

}  // namespace
}  // namespace entente::certs
