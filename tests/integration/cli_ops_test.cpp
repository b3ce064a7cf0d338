// The operator's command line of issue 16 beyond the listings
// (cli_admin_test): `entente publish` (NDJSON in named batches, a retry
// after a lost answer stored once), `entente imports`, the contract actions
// with terms as options between two real domains, and `entente broker
// --check` on good and bad configurations.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "broker/config.h"
#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/cli_run.h"
#include "tests/integration/support/contracts.h"
#include "tests/integration/support/federation.h"
#include "tests/support/free_port.h"
#include "tests/support/temp_dir.h"

namespace entente::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kTicks = R"([{"name":"k","type":"int64"},{"name":"v","type":"int64"}])";

// NDJSON of ticks k = from .. from + count - 1.
std::string ticks(int from, int count) {
  std::string out;
  for (int k = from; k < from + count; ++k)
    out += "{\"k\":" + std::to_string(k) + ",\"v\":" + std::to_string(k * 10) + "}\n";
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The stream's `next_seq` as `entente streams show` prints it.
std::string next_seq(const std::string& home, const std::string& url, const std::string& stream) {
  return value_of(entente(home, "--url " + url + " --token " + kReaderToken + " streams show " + stream).out,
                  "next_seq");
}

class CliPublish : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(node_.start()) << node_.last_error();
    home_ = make_temp_dir("cli-publish");
    url_ = "http://127.0.0.1:" + std::to_string(node_.port());
    CliRun r = publisher("streams create ticks --schema " + quote(kTicks), kAdminToken);
    ASSERT_EQ(r.code, 0) << what(r);
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(home_);
  }
  CliRun publisher(const std::string& args, const std::string& token = kPublisherToken) const {
    return entente(home_, "--url " + url_ + " --token " + token + " " + args);
  }

  BrokerProcess node_;
  std::string home_, url_;
};

TEST_F(CliPublish, AFileOrStdinInNamedBatchesThatASecondRunDoesNotStoreAgain) {
  const std::string file = home_ + "/ticks.ndjson";
  write_file(file, ticks(1, 3) + "\n   \n" + ticks(4, 2));  // blank lines are skipped
  CliRun r = publisher("publish ticks --file " + file + " --batch 2 --producer-id loader-1");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, "published 5 tuples to ticks in 3 batches (sequence numbers 1..5)\n");
  EXPECT_EQ(next_seq(home_, url_, "ticks"), "6");

  // The same run again under the same producer: every batch is known.
  r = publisher("publish ticks --file " + file + " --batch 2 --producer-id loader-1");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_TRUE(has(r.out,
                  "3 of the batches (5 tuples) were stored before, by an earlier send of producer "
                  "loader-1: not stored again"))
      << r.out;
  EXPECT_EQ(next_seq(home_, url_, "ticks"), "6");

  // From stdin, as JSON for a script; a fresh producer id each run.
  write_file(home_ + "/more.ndjson", ticks(6, 4));
  r = publisher("--json publish ticks < " + quote(home_ + "/more.ndjson"));
  ASSERT_EQ(r.code, 0) << what(r);
  rapidjson::Document d;
  d.Parse(r.out.c_str());
  ASSERT_TRUE(!d.HasParseError() && d.IsObject()) << r.out;
  EXPECT_EQ(d["tuples"].GetUint64(), 4u);
  EXPECT_EQ(d["batches"].GetUint64(), 1u);
  EXPECT_EQ(d["duplicate_batches"].GetUint64(), 0u);
  EXPECT_EQ(d["first_seq"].GetUint64(), 6u);
  EXPECT_EQ(d["last_seq"].GetUint64(), 9u);
  EXPECT_EQ(std::string(d["producer_id"].GetString()).rfind("entente-cli-", 0), 0u) << r.out;
  EXPECT_EQ(next_seq(home_, url_, "ticks"), "10");
}

TEST_F(CliPublish, ABadLineIsNamedByItsNumberAndWhatCameBeforeIsKept) {
  // Line 4 is not JSON: refused before it is sent; batch 1 (lines 1-2) went.
  write_file(home_ + "/broken.ndjson", ticks(1, 2) + ticks(3, 1) + "{\"k\": 4,\n" + ticks(5, 1));
  CliRun r = publisher("publish ticks --batch 2 --file " + home_ + "/broken.ndjson");
  EXPECT_EQ(r.code, 2) << what(r);
  EXPECT_TRUE(has(r.err, "entente publish: " + home_ + "/broken.ndjson: line 4: not JSON")) << r.err;
  EXPECT_TRUE(has(r.err, "2 tuples before it were published")) << r.err;
  EXPECT_EQ(next_seq(home_, url_, "ticks"), "3");

  // Line 3 is JSON but not a tick: the node refuses its batch (lines 3-4),
  // with the detail, and the line is named.
  write_file(home_ + "/wrong.ndjson", ticks(1, 2) + "{\"k\":3,\"price\":1}\n" + ticks(4, 1));
  r = publisher("publish ticks --batch 2 --file " + home_ + "/wrong.ndjson");
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(
      has(r.err, "entente: POST /v1/streams/ticks/tuples: 400: the batch was rejected, nothing was stored"))
      << r.err;
  EXPECT_TRUE(has(r.err, "the refused row is line 3 of the input")) << r.err;
  EXPECT_TRUE(
      has(r.err,
          "stopped at batch 2 (lines 3-4); 2 tuples were published before it. Nothing of batch 2 was stored"))
      << r.err;
  EXPECT_EQ(next_seq(home_, url_, "ticks"), "5");

  // A line that is not an object, a stream that is not there, a reader.
  write_file(home_ + "/array.ndjson", "[1,2]\n");
  r = publisher("publish ticks --file " + home_ + "/array.ndjson");
  EXPECT_EQ(r.code, 2) << what(r);
  EXPECT_TRUE(has(r.err, "line 1: expected a JSON object (one tuple), not array")) << r.err;
  r = publisher("publish nothing --file " + home_ + "/ticks-none.ndjson");
  EXPECT_EQ(r.code, 2) << what(r);
  write_file(home_ + "/one.ndjson", ticks(1, 1));
  r = publisher("publish nothing --file " + home_ + "/one.ndjson");
  EXPECT_EQ(r.code, 4) << what(r);
  r = publisher("publish ticks --file " + home_ + "/one.ndjson", kReaderToken);
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(has(r.err, ": 403: ")) << r.err;
  r = publisher("publish ticks --batch 0 --file " + home_ + "/one.ndjson");
  EXPECT_EQ(r.code, 2) << what(r);
  EXPECT_TRUE(has(r.err, "--batch must be a whole number from 1 to 10000")) << r.err;
}

// Waits for the process to end by itself; true when a SIGKILL ended it.
bool died_of_sigkill(const BrokerProcess& b) {
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < deadline) {
    int st = 0;
    if (waitpid(b.pid(), &st, WNOHANG) == b.pid()) return WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// The node stores batch 2 and dies before answering it (the test hook
// ENTENTE_TEST_KILL_AFTER_COMMIT); it comes back on the same port while the
// command retries; the retry is answered as a duplicate and every tick is
// stored once.
TEST(CliPublishRetry, ABatchWhoseAnswerWasLostIsStoredOnce) {
  BrokerProcess b;
  setenv("ENTENTE_TEST_KILL_AFTER_COMMIT", "2", 1);
  const bool started = b.start();
  unsetenv("ENTENTE_TEST_KILL_AFTER_COMMIT");
  ASSERT_TRUE(started) << b.last_error();
  const std::string home = make_temp_dir("cli-publish-retry");
  const std::string url = "http://127.0.0.1:" + std::to_string(b.port());
  ASSERT_EQ(entente(home, "--url " + url + " --token " + kAdminToken + " streams create ticks --schema " +
                              quote(kTicks))
                .code,
            0);
  // The next start listens on this port again.
  const std::string config = b.data_dir() + "/node.json";
  std::string text = read_text(config);
  const size_t at = text.find("127.0.0.1:0\"");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 11, "127.0.0.1:" + std::to_string(b.port()));
  std::ofstream(config) << text;

  write_file(home + "/ticks.ndjson", ticks(1, 6));
  CliRun r;
  std::thread publisher([&] {
    r = entente(home, "--url " + url + " --token " + kPublisherToken +
                          " publish ticks --batch 2 --retries 40 " + "--producer-id loader-7 --file " + home +
                          "/ticks.ndjson");
  });
  const bool killed = died_of_sigkill(b);
  b.kill();  // forgets the pid
  const bool restarted = killed && b.start();
  publisher.join();
  ASSERT_TRUE(killed) << "the fault hook did not kill the node";
  ASSERT_TRUE(restarted) << b.last_error();
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_TRUE(has(r.err, "batch 2 (lines 3-4): ")) << r.err;
  EXPECT_TRUE(has(r.err, "sending it again")) << r.err;
  EXPECT_TRUE(has(r.out, "published 6 tuples to ticks in 3 batches (sequence numbers 1..6)")) << r.out;
  EXPECT_TRUE(
      has(r.out, "1 of the batches (2 tuples) were stored before, by an earlier send of producer loader-7"))
      << r.out;
  EXPECT_EQ(next_seq(home, url, "ticks"), "7");
  // Each tick once, in order.
  CliRun s = entente(home, "subscribe --port " + std::to_string(b.port()) + " --from 1 --count 6 ticks",
                     std::string("ENTENTE_TOKEN=") + kReaderToken);
  ASSERT_EQ(s.code, 0) << what(s);
  std::istringstream lines(s.out);
  int k = 0;
  for (std::string line; std::getline(lines, line);)
    EXPECT_TRUE(has(line, "\"k\":" + std::to_string(++k) + ",")) << line;
  EXPECT_EQ(k, 6) << s.out;
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(home);
}

// ------------------------------------------------------------ contracts, imports

// `entente ARGS` against node `n` as its admin.
CliRun on(const std::string& home, const FedNode& n, const std::string& args) {
  return entente(home, "--url http://127.0.0.1:" + std::to_string(n.process().port()) + " --token " +
                           kAdminToken + " " + args);
}

// Polls `entente contracts show ID` on `n` until it shows version `version`
// (10 s); what it printed last.
CliRun wait_shown(const std::string& home, const FedNode& n, const std::string& id, uint64_t version) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  CliRun r;
  while (Clock::now() < deadline) {
    r = on(home, n, "contracts show " + id);
    if (r.code == 0 && value_of(r.out, "version") == std::to_string(version)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return r;
}

// Polls `entente ARGS` on `n` until the `key: value` line says `want`.
CliRun wait_value(const std::string& home, const FedNode& n, const std::string& args, const std::string& key,
                  const std::string& want) {
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  CliRun r;
  while (Clock::now() < deadline) {
    r = on(home, n, args);
    if (r.code == 0 && has(value_of(r.out, key), want)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return r;
}

// A stream contract from its proposal to its revocation, and the import it
// lets beta make, with the command line alone.
TEST(CliContracts, ProposeCounterAcceptImportUsageRevokeBetweenTwoDomains) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  const std::string home = make_temp_dir("cli-contracts");
  const std::string terms = "--consumer beta --streams bids --fields auction,price --price 3 --until 1h";

  CliRun r = on(home, *d.acme, "contracts propose " + terms + " --dry-run");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "dry_run"), "the terms pass every check; nothing was recorded or sent");
  EXPECT_EQ(value_of(r.out, "catalog_checked"), "true");
  EXPECT_EQ(value_of(r.out, "terms.provider"), "acme");
  EXPECT_EQ(on(home, *d.acme, "contracts list").out, "no contracts\n");
  // The catalog check names the field acme's stream lacks.
  r = on(home, *d.acme, "contracts propose --consumer beta --streams bids --fields auction,prise --until 1h");
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(has(r.err, "$.terms.fields[1]: stream acme/bids has no field 'prise'")) << r.err;

  r = on(home, *d.acme, "contracts propose " + terms);
  ASSERT_EQ(r.code, 0) << what(r);
  const std::string id = value_of(r.out, "id");
  EXPECT_EQ(value_of(r.out, "state"), "proposed");
  EXPECT_EQ(value_of(r.out, "terms.fields"), "auction, price");
  EXPECT_EQ(value_of(r.out, "terms.price_per_million"), "3");
  EXPECT_EQ(value_of(wait_shown(home, *d.beta, id, 1).out, "next"),
            "beta may accept, counter or reject version 1");

  // beta counters: a lower price, one more field; the rest as offered.
  r = on(home, *d.beta, "contracts counter " + id + " --price 2 --fields auction,price,bidder");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "state"), "countered");
  EXPECT_EQ(value_of(r.out, "version"), "2");
  EXPECT_EQ(value_of(r.out, "terms.price_per_million"), "2");
  EXPECT_EQ(value_of(r.out, "terms.streams"), "bids");
  ASSERT_EQ(value_of(wait_shown(home, *d.acme, id, 2).out, "state"), "countered");
  EXPECT_EQ(row_of(on(home, *d.acme, "contracts list --awaiting-me").out, id).size(), 9u);

  // acme accepts; beta's node countersigns: active on both.
  r = on(home, *d.acme, "contracts accept " + id);
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "state"), "accepted");
  EXPECT_EQ(value_of(wait_shown(home, *d.acme, id, 4).out, "state"), "active");
  EXPECT_EQ(value_of(wait_shown(home, *d.beta, id, 4).out, "in_force"), "true");

  // beta imports the stream; acme publishes; usage counts what crossed.
  r = on(home, *d.beta, "imports create acme/bids");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "stream"), "acme/bids");
  EXPECT_EQ(value_of(r.out, "schema"), "auction:int64, price:int64, bidder:int64") << r.out;
  std::string rows;
  for (uint64_t i = 0; i < 5; ++i) rows += bid(i) + "\n";
  write_file(home + "/bids.ndjson", rows);
  r = on(home, *d.acme, "publish bids --file " + home + "/bids.ndjson");
  ASSERT_EQ(r.code, 0) << what(r);
  r = wait_value(home, *d.beta, "imports show acme/bids", "next_seq", "6");
  EXPECT_EQ(value_of(r.out, "state"), "active") << what(r);
  EXPECT_EQ(row_of(on(home, *d.beta, "imports list").out, "acme/bids").at(1), "active");
  r = wait_value(home, *d.acme, "contracts usage " + id, "tuples", "5");
  EXPECT_EQ(value_of(r.out, "tuples"), "5") << what(r);
  EXPECT_EQ(value_of(r.out, "cost_credits"), "0.00001");

  // beta revokes, with a reason its import then shows.
  r = on(home, *d.beta, "contracts revoke " + id);
  EXPECT_EQ(r.code, 2) << what(r);
  EXPECT_TRUE(has(r.err, "contracts revoke needs --reason TEXT")) << r.err;
  r = on(home, *d.beta, "contracts revoke " + id + " --reason audit");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "state"), "revoked");
  r = wait_value(home, *d.beta, "imports show acme/bids", "state", "refused");
  EXPECT_TRUE(has(value_of(r.out, "reason"), "revoked by beta: audit")) << r.out;
  r = on(home, *d.beta, "imports delete acme/bids");
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, "deleted import acme/bids and its mirror stream\n");
  EXPECT_EQ(on(home, *d.beta, "imports show acme/bids").code, 4);

  // Another offer, rejected; an action on an old version is a conflict.
  r = on(home, *d.acme, "contracts propose " + terms);
  ASSERT_EQ(r.code, 0) << what(r);
  const std::string id2 = value_of(r.out, "id");
  ASSERT_EQ(value_of(wait_shown(home, *d.beta, id2, 1).out, "state"), "proposed");
  r = on(home, *d.beta, "contracts reject " + id2 + " --reason " + quote("too dear"));
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "state"), "rejected");
  // A contract that is not there: the lookup's 404 is the exit code.
  r = on(home, *d.beta, "contracts accept c-0000000000000000");
  EXPECT_EQ(r.code, 4) << what(r);
  EXPECT_TRUE(has(r.err, "entente: GET /v1/contracts/c-0000000000000000: 404: ")) << r.err;
  EXPECT_EQ(on(home, *d.beta, "contracts usage c-0000000000000000").code, 4);
  r = on(home, *d.beta, "contracts accept " + id2 + " --version 1");
  EXPECT_NE(r.code, 0) << what(r);
  EXPECT_TRUE(has(r.err, "entente: POST /v1/contracts/" + id2 + "/accept: ")) << r.err;
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(home);
}

// ------------------------------------------------------------ broker --check

// A node configuration of acme/n1 with TLS and federation, from `a`'s and
// `b`'s certificates (b pinned as a peer); `api_port` and `fed_port` fixed.
std::string node_config(const FedNode& a, const FedNode& b, const std::string& data_dir, uint16_t api_port,
                        uint16_t fed_port, const std::string& api_key, const std::string& fed_cert) {
  return "{\"domain\":\"acme\",\"node\":\"n1\",\"api\":{\"listen\":\"127.0.0.1:" + std::to_string(api_port) +
         "\",\"tls\":{\"cert\":\"" + a.cert_file() + "\",\"key\":\"" + api_key + "\"}},\"data_dir\":\"" +
         data_dir + "\",\"tokens\":[{\"name\":\"ops\",\"role\":\"admin\",\"sha256\":\"" +
         broker::hash_token(kAdminToken) +
         "\"}],\"federation\":{\"listen\":\"127.0.0.1:" + std::to_string(fed_port) + "\",\"cert_file\":\"" +
         fed_cert + "\",\"key_file\":\"" + a.key_file() + "\",\"ca_file\":\"" + a.ca_file() +
         "\",\"peers\":[{\"domain\":\"beta\",\"ca_file\":\"" + b.ca_file() +
         "\",\"nodes\":[{\"node\":\"n1\"," + "\"address\":\"" + b.federation_address() + "\"}]}]}}";
}

// A socket listening on 127.0.0.1:port until destroyed.
struct Listener {
  int fd = -1;
  explicit Listener(uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 1) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~Listener() {
    if (fd >= 0) ::close(fd);
  }
};

TEST(CliBrokerCheck, AGoodConfigurationAndEveryProblemOfBadOnes) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  const std::string home = make_temp_dir("cli-check");
  const uint16_t api_port = free_loopback_port(), fed_port = free_loopback_port();
  const std::string good = home + "/good.json";
  write_file(good,
             node_config(acme, beta, home + "/data", api_port, fed_port, acme.key_file(), acme.cert_file()));
  CliRun r = entente(home, "broker --check --config " + good);
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, "ok: " + good +
                       " configures node acme/n1: API on https://127.0.0.1:" + std::to_string(api_port) +
                       ", data in " + home + "/data, federation with 1 peer domain(s)\n");
  EXPECT_FALSE(std::filesystem::exists(home + "/data")) << "--check created the data directory";

  // The key of another node, a certificate another CA issued, the API port
  // taken: each named with its key, all in one run.
  const Listener taken(api_port);
  ASSERT_GE(taken.fd, 0);
  const std::string bad = home + "/bad.json";
  write_file(bad,
             node_config(acme, beta, home + "/data", api_port, fed_port, beta.key_file(), beta.cert_file()));
  r = entente(home, "broker --check --config " + bad);
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_EQ(r.out, "");
  const std::string at = "entente broker --check: " + bad + ": ";
  EXPECT_TRUE(has(r.err, at + "api.tls.key: the key in " + beta.key_file() +
                             " is not the key of the certificate in " + acme.cert_file() + " (api.tls.cert)"))
      << r.err;
  EXPECT_TRUE(has(r.err, at + "federation.key_file: the key in " + acme.key_file() +
                             " is not the key of the certificate in " + beta.cert_file()))
      << r.err;
  EXPECT_TRUE(has(r.err, at + "federation.cert_file: the certificate in " + beta.cert_file() +
                             " does not chain to the CA in " + acme.ca_file() + " (federation.ca_file)"))
      << r.err;
  EXPECT_TRUE(has(r.err, at + "api.listen: cannot listen on 127.0.0.1:" + std::to_string(api_port) +
                             ": Address already in use (another process listens there)"))
      << r.err;
  EXPECT_TRUE(has(r.err, at + "4 problem(s)")) << r.err;
  // A running node holds its ports: --running leaves them out.
  write_file(bad,
             node_config(acme, beta, home + "/data", api_port, fed_port, acme.key_file(), acme.cert_file()));
  r = entente(home, "broker --check --config " + bad);
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(has(r.err, at + "api.listen: cannot listen on ")) << r.err;
  r = entente(home, "broker --check --running --config " + bad);
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out.rfind("ok: ", 0), 0u) << r.out;

  // A file that is not a key; a configuration error names its key.
  write_file(home + "/not-a-key.pem", "hello\n");
  write_file(bad,
             node_config(acme, beta, home + "/data", 0, fed_port, home + "/not-a-key.pem", acme.cert_file()));
  r = entente(home, "broker --check --config " + bad);
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(has(r.err, at + "api.tls.key: " + home + "/not-a-key.pem holds no PEM private key")) << r.err;
  // Configuration errors: one per section, each with its key.
  write_file(bad,
             R"({"domain":"Acme","node":"n1","api":{"listen":"127.0.0.1:99999","tls":false},"data_dir":"d",)"
             R"("tokens":[],"bogus":1,"retention":{"max_tuples":"x"}})");
  r = entente(home, "broker --check --config " + bad);
  EXPECT_EQ(r.code, 2) << what(r);
  EXPECT_TRUE(has(r.err, at + "bogus: unknown key")) << r.err;
  EXPECT_TRUE(has(r.err, at + "domain: expected [a-z][a-z0-9-]*")) << r.err;
  EXPECT_TRUE(has(r.err, at + "api.listen: the port must be 0..65535, got 99999")) << r.err;
  EXPECT_TRUE(has(r.err, at + "tokens: at least one token with role admin is required")) << r.err;
  EXPECT_TRUE(has(r.err, at + "retention.max_tuples: ")) << r.err;
  EXPECT_TRUE(has(r.err, at + "5 problem(s) in the configuration")) << r.err;
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(home);
}

}  // namespace
}  // namespace entente::testing
