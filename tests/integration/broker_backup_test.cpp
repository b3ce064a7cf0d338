// Backups and restores of a node's data directory with real brokers
// (docs/operations.md, "Backup and restore"; issue 11): an old copy of a
// domain's data_dir put back under a running federation gets back the
// contract versions it lost from the peer without the two nodes resending
// to each other forever; `entente backup` checkpoints a running node under
// ingest; a second node on a data_dir in use says which process holds it.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "tests/http/http_test_certs.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/contracts.h"
#include "tests/integration/support/federation.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// The sum of the samples of `metric` in GET /metrics whose labels contain
// `labels` (e.g. "type=\"sync\""; empty: every sample).
double metric_sum(const BrokerProcess& node, const std::string& metric, const std::string& labels = {}) {
  auto r = node.request("GET", "/metrics", "", kReaderToken);
  std::istringstream lines(r.body);
  double sum = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(metric, 0) != 0) continue;
    const char next = line.size() > metric.size() ? line[metric.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    if (!labels.empty() && line.find(labels) == std::string::npos) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

// Lines of `text` that contain `what`.
size_t count_lines(const std::string& text, const std::string& what) {
  std::istringstream lines(text);
  size_t n = 0;
  for (std::string line; std::getline(lines, line);) n += line.find(what) != std::string::npos;
  return n;
}

// Copies a stopped node's data directory (what an admin's `cp -a` does).
void copy_dir(const std::string& from, const std::string& to) {
  std::error_code ec;
  fs::remove_all(to, ec);
  fs::copy(from, to, fs::copy_options::recursive, ec);
  ASSERT_FALSE(ec) << "copying " << from << " to " << to << ": " << ec.message();
}

TEST(Restore, AnOldDataDirGetsBackTheContractVersionsItLostAndTheLinkStaysQuiet) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  FedNode& acme = *d.acme;
  FedNode& beta = *d.beta;
  constexpr uint64_t kN = 500;
  ASSERT_NO_FATAL_FAILURE(publish(acme, "bids", 0, kN));
  // The second contract's stream (terms are checked against acme's catalog).
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "asks"));

  // The old copy: acme stopped cleanly, its data directory copied aside.
  const std::string data = acme.process().data_dir() + "/data";
  const std::string aside = acme.process().data_dir() + "/data-copy";
  ASSERT_EQ(acme.process().terminate(), 0);
  ASSERT_NO_FATAL_FAILURE(copy_dir(data, aside));
  ASSERT_TRUE(acme.start()) << acme.last_error();
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta));

  // What the copy does not hold: an active contract (acme's proposal, beta's
  // acceptance, acme's countersignature), and a second one on which acme
  // proposed, beta countered, and acme accepted (beta countersigned).
  const int64_t from = seconds_from_now(-60), until = seconds_from_now(3600);
  const std::string id = d.agree(stream_terms(5, from, until));
  // The second covers another stream: two contracts in force on one stream
  // with different fields would make which one an import runs under a
  // matter of chance.
  auto on_asks = [&](int64_t price) {
    std::string t = stream_terms(price, from, until);
    t.replace(t.find(R"(["bids"])"), 8, R"(["asks"])");
    return t;
  };
  const std::string id2 = d.propose(on_asks(7));
  auto countered = act(beta, id2, "counter", "{\"version\":1,\"terms\":" + on_asks(6) + "}");
  ASSERT_EQ(countered.status, 200u) << countered.body;
  ASSERT_EQ(wait_version(acme, id2, 2).version, 2u);
  auto accepted = act(acme, id2, "accept", R"({"version":2})");
  ASSERT_EQ(accepted.status, 200u) << accepted.body;
  const ContractView beta_id = wait_version(beta, id, 3);
  const ContractView beta_id2 = wait_version(beta, id2, 4);
  ASSERT_EQ(beta_id2.state, "active") << beta_id2.body;
  auto imported = import_stream(beta, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body;
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(beta, "acme/bids", kN + 1));

  // The restore: acme stopped, the old copy put back, acme started.
  ASSERT_EQ(acme.process().terminate(), 0);
  ASSERT_NO_FATAL_FAILURE(copy_dir(aside, data));
  ASSERT_TRUE(acme.start()) << acme.last_error();
  const std::string log_before = acme.process().stderr_text();

  // acme gets back every version it lost, its own included, and both
  // ledgers hold the same versions.
  const ContractView got = wait_version(acme, id, 3, 30s);
  ASSERT_EQ(got.version, 3u) << got.body << "\n" << acme.process().stderr_text();
  EXPECT_EQ(got.state, "active");
  EXPECT_TRUE(got.in_force);
  EXPECT_EQ(got.history, beta_id.history);
  const ContractView got2 = wait_version(acme, id2, 4, 30s);
  ASSERT_EQ(got2.version, 4u) << got2.body;
  EXPECT_EQ(got2.history, beta_id2.history);
  EXPECT_EQ(got2.states, (std::vector<std::string>{"proposed", "countered", "accepted", "active"}));

  // ... and then the link is quiet: acme synced on link-up and once caught
  // up, nothing was refused, and no message goes either way any more.
  auto messages = [&](const std::string& type) {
    const std::string label = "type=\"" + type + "\"";
    return metric_sum(acme.process(), "entente_contract_messages_total", label) +
           metric_sum(beta.process(), "entente_contract_messages_total", label);
  };
  auto refusals = [&] {
    return metric_sum(acme.process(), "entente_contract_refusals_total") +
           metric_sum(beta.process(), "entente_contract_refusals_total");
  };
  std::this_thread::sleep_for(2s);
  const double syncs = messages("sync"), versions = messages("version");
  EXPECT_GT(syncs, 0);
  EXPECT_LE(metric_sum(acme.process(), "entente_contract_messages_total", "direction=\"sent\",type=\"sync\""), 4);
  EXPECT_LE(metric_sum(beta.process(), "entente_contract_messages_total", "direction=\"sent\",type=\"version\""),
            30)
      << "beta sent the 7 versions acme lost, and the versions it made itself";
  EXPECT_EQ(refusals(), 0) << acme.process().stderr_text();
  std::this_thread::sleep_for(2s);
  EXPECT_EQ(messages("sync"), syncs);
  EXPECT_EQ(messages("version"), versions);
  EXPECT_EQ(refusals(), 0);
  const std::string log = acme.process().stderr_text().substr(log_before.size());
  EXPECT_LE(count_lines(log, " contracts acme/n1: "), 20u) << log.substr(0, 4000);
  EXPECT_LE(count_lines(beta.process().stderr_text(), " contracts beta/n1: "), 20u);

  // The stream flows again under the contract acme got back.
  ASSERT_NO_FATAL_FAILURE(publish(acme, "bids", kN, kN));
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(beta, "acme/bids", 2 * kN + 1));
}

// `entente backup` against a node under ingest: the backup, started as a
// new node's data_dir, holds every tuple acknowledged before it, and the
// node numbers on from there.
TEST(Backup, ABackupOfARunningNodeUnderIngestHoldsEverythingAcknowledgedBeforeIt) {
  BrokerProcess node;
  ASSERT_TRUE(node.start()) << node.last_error();
  auto created = node.request("POST", "/v1/streams",
                              std::string(R"({"name":"bids","event_time":"date_time","schema":)") + kBidsSchema + "}");
  ASSERT_EQ(created.status, 201u) << created.body;
  Feeder feeder(node, "bids", bid);
  feeder.start();
  ASSERT_TRUE(eventually(30s, [&] { return feeder.acked() >= 2000; })) << feeder.failures();

  const uint64_t acked_before = feeder.acked();
  const std::string dir = node.data_dir() + "/backup-1";
  std::string out;
  const std::string cli = "ENTENTE_TOKEN=" + std::string(kAdminToken) + " " + ENTENTE_BIN + " backup --config " +
                          node.config_path() + " --port " + std::to_string(node.port());
  int rc = run_command(cli + " --out " + dir + " 2>&1", out);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("backup of acme/n1 in " + dir), std::string::npos) << out;
  // The ingest went on during the backup.
  const uint64_t acked_at_end = feeder.acked();
  ASSERT_TRUE(eventually(30s, [&] { return feeder.acked() >= acked_at_end + 500; }));
  feeder.stop();
  EXPECT_EQ(feeder.failures(), 0u) << feeder.last_failure();
  EXPECT_TRUE(fs::is_regular_file(dir + "/backup.json"));
  EXPECT_TRUE(fs::is_directory(dir + "/store"));
  // A second backup into the same directory is refused, naming it.
  rc = run_command(cli + " --out " + dir + " 2>&1", out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("409"), std::string::npos) << out;
  EXPECT_NE(out.find("'" + dir + "' exists already"), std::string::npos) << out;
  ASSERT_EQ(node.terminate(), 0);

  // A node started on the backup.
  BrokerProcess restored;
  ASSERT_NO_FATAL_FAILURE(copy_dir(dir, restored.data_dir() + "/data"));
  ASSERT_TRUE(restored.start()) << restored.last_error();
  const uint64_t next = next_seq(restored, "bids");
  EXPECT_GT(next, acked_before) << "everything acknowledged before the backup is in it";
  auto read = read_stream(restored, "bids", 1, acked_before, 30000);
  ASSERT_EQ(read.tuples.size(), acked_before) << read.error;
  const auto& rows = feeder.acked_rows();
  for (const Tuple& t : read.tuples) {
    auto row = rows.find(t.seq);
    ASSERT_NE(row, rows.end()) << t.seq;
    ASSERT_NE(t.line.find("\"bidder\":" + std::to_string(row->second) + ","), std::string::npos)
        << "seq " << t.seq << ": " << t.line;
  }
  // It serves, and numbers on from what the backup holds.
  auto more = restored.request("POST", "/v1/streams/bids/tuples", bid(999999) + "\n", kPublisherToken,
                               "application/x-ndjson");
  ASSERT_EQ(more.status, 200u) << more.body;
  EXPECT_EQ(uint_field(more.body, "first_seq"), next) << more.body;
}

TEST(Backup, TheRouteAndTheCommandRefuseWhatTheyCannotDo) {
  BrokerProcess node;
  ASSERT_TRUE(node.start()) << node.last_error();
  const std::string dir = node.data_dir() + "/copy";
  auto relative = node.request("POST", "/v1/admin/backup", R"({"dir":"relative/copy"})");
  EXPECT_EQ(relative.status, 400u) << relative.body;
  EXPECT_NE(relative.body.find("absolute path"), std::string::npos) << relative.body;
  auto orphan = node.request("POST", "/v1/admin/backup", "{\"dir\":\"" + node.data_dir() + "/no/such/copy\"}");
  EXPECT_EQ(orphan.status, 400u) << orphan.body;
  EXPECT_NE(orphan.body.find("is not a directory"), std::string::npos) << orphan.body;
  auto malformed = node.request("POST", "/v1/admin/backup", R"({"to":"/tmp/x"})");
  EXPECT_EQ(malformed.status, 400u) << malformed.body;
  auto publisher = node.request("POST", "/v1/admin/backup", "{\"dir\":\"" + dir + "\"}", kPublisherToken);
  EXPECT_EQ(publisher.status, 403u) << publisher.body;
  EXPECT_FALSE(fs::exists(dir));
  auto made = node.request("POST", "/v1/admin/backup", "{\"dir\":\"" + dir + "\"}");
  EXPECT_EQ(made.status, 201u) << made.body;
  EXPECT_NE(made.body.find("\"store\":\"" + dir + "/store\""), std::string::npos) << made.body;

  std::string out;
  const std::string bin = std::string(ENTENTE_BIN) + " backup --config " + node.config_path();
  EXPECT_EQ(run_command("env -u ENTENTE_TOKEN " + bin + " --port " + std::to_string(node.port()) +
                            " --out " + dir + "2 2>&1",
                        out),
            2);
  EXPECT_NE(out.find("no admin token"), std::string::npos) << out;
  EXPECT_EQ(run_command("ENTENTE_TOKEN=x " + bin + " --out " + dir + "2 2>&1", out), 2);
  EXPECT_NE(out.find("give --port P"), std::string::npos) << out;
  EXPECT_EQ(run_command("ENTENTE_TOKEN=" + std::string(kReaderToken) + " " + bin + " --port " +
                            std::to_string(node.port()) + " --out " + dir + "2 2>&1",
                        out),
            1);
  EXPECT_NE(out.find("403"), std::string::npos) << out;
  EXPECT_EQ(run_command(bin + " 2>&1", out), 2);
  EXPECT_NE(out.find("--out DIR"), std::string::npos) << out;
}

TEST(Backup, OverTlsTheCommandTrustsTheCaItIsGiven) {
  http::testing::TestPki pki;
  BrokerOptions o;
  o.tls = true;
  o.cert_file = pki.cert_file;
  o.key_file = pki.key_file;
  o.ca_file = pki.ca_file;
  BrokerProcess node(o);
  ASSERT_TRUE(node.start()) << node.last_error();
  const std::string dir = node.data_dir() + "/copy";
  const std::string cli = "ENTENTE_TOKEN=" + std::string(kAdminToken) + " " + ENTENTE_BIN + " backup --config " +
                          node.config_path() + " --port " + std::to_string(node.port()) + " --out " + dir;
  std::string out;
  EXPECT_EQ(run_command(cli + " 2>&1", out), 2);
  EXPECT_NE(out.find("give --ca FILE"), std::string::npos) << out;
  EXPECT_EQ(run_command(cli + " --ca " + pki.other_ca_file + " 2>&1", out), 1);
  EXPECT_NE(out.find("cannot reach the node"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir));
  ASSERT_EQ(run_command(cli + " --ca " + pki.ca_file + " 2>&1", out), 0) << out;
  EXPECT_TRUE(fs::is_directory(dir + "/store")) << out;
}

// A second broker on a data_dir in use says which process holds it and
// exits; the first keeps serving.
TEST(DataDir, ASecondNodeOnADataDirInUseSaysSoAndExitsWhileTheFirstServes) {
  BrokerProcess first;
  ASSERT_TRUE(first.start()) << first.last_error();
  auto created = first.request("POST", "/v1/streams",
                               std::string(R"({"name":"bids","event_time":"date_time","schema":)") + kBidsSchema + "}");
  ASSERT_EQ(created.status, 201u) << created.body;

  std::string out;
  const int rc =
      run_command("timeout 30 " + std::string(ENTENTE_BIN) + " broker --config " + first.config_path() + " 2>&1", out);
  EXPECT_EQ(rc, 1) << out;
  const std::string data = first.data_dir() + "/data";
  EXPECT_NE(out.find("data_dir '" + data + "' is in use"), std::string::npos) << out;
  EXPECT_NE(out.find("another process (pid " + std::to_string(first.pid()) + ")"), std::string::npos) << out;
  EXPECT_NE(out.find("'" + data + "/store/LOCK'"), std::string::npos) << out;
  EXPECT_NE(out.find("Another entente broker runs on this data_dir"), std::string::npos) << out;

  auto health = first.request("GET", "/v1/health", "", "");
  EXPECT_EQ(health.status, 200u) << health.body;
  auto published = first.request("POST", "/v1/streams/bids/tuples", bid(1) + "\n", kPublisherToken,
                                 "application/x-ndjson");
  EXPECT_EQ(published.status, 200u) << published.body;
  EXPECT_EQ(first.terminate(), 0);
}

}  // namespace
}  // namespace entente::testing
