// The admin command line (issue 16: `entente streams|queries|nodes|peers|
// contracts|checkpoint`) as a user runs it, against real nodes: where the
// settings come from (flags, then the environment, then a profile), what it
// prints (tables, `key: value` lines, the node's JSON with --json), and each
// exit code with the node's problem detail on stderr.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/cli_run.h"
#include "tests/integration/support/contracts.h"
#include "tests/integration/support/federation.h"
#include "tests/support/eventually.h"
#include "tests/support/temp_dir.h"

namespace entente::testing {
namespace {

rapidjson::Document parse(const std::string& text) {
  rapidjson::Document d;
  d.Parse(text.c_str());
  EXPECT_FALSE(d.HasParseError()) << text;
  return d;
}

// {"profiles": {NAME: {"url": URL, "token": TOKEN}}} for each (NAME, URL, TOKEN).
std::string profiles_json(const std::vector<std::vector<std::string>>& profiles) {
  std::string out = R"({"profiles": {)";
  for (size_t i = 0; i < profiles.size(); ++i) {
    out += (i ? "," : "") + std::string("\"") + profiles[i][0] + "\": {\"url\": \"" + profiles[i][1] + "\"";
    if (profiles[i].size() > 2) out += ", \"token\": \"" + profiles[i][2] + "\"";
    out += "}";
  }
  return out + "}}";
}

constexpr const char* kBidsSchema =
    R"([{"name":"auction","type":"int64"},{"name":"price","type":"int64"},{"name":"ts","type":"timestamp"}])";

constexpr const char* kBigBids = R"({"name":"big-bids","inputs":[{"name":"bids","event_time":"ts","schema":[
    {"name":"auction","type":"int64"},{"name":"price","type":"int64"},{"name":"ts","type":"timestamp"}]}],
  "boxes":[{"id":"f","type":"filter","options":{"predicates":["price > 100"],"drop_unmatched":true}}],
  "arcs":[{"from":"bids","to":"f"}],"outputs":[{"name":"big_bids","from":"f"}]})";

class AdminCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(node_.start()) << node_.last_error();
    home_ = make_temp_dir("cli-admin");
    url_ = "http://127.0.0.1:" + std::to_string(node_.port());
    dead_url_ = "http://127.0.0.1:" + std::to_string(free_loopback_port());
  }
  void TearDown() override {
    if (!HasFailure()) std::filesystem::remove_all(home_);
  }

  CliRun run(const std::string& args, const std::string& env = "") const { return entente(home_, args, env); }
  // As an admin, with flags.
  CliRun admin(const std::string& args) const {
    return run("--url " + url_ + " --token " + kAdminToken + " " + args);
  }
  CliRun reader(const std::string& args) const {
    return run("--url " + url_ + " --token " + kReaderToken + " " + args);
  }

  BrokerProcess node_;
  std::string home_, url_, dead_url_;
};

TEST_F(AdminCli, AProfileAloneIsEnough) {
  const std::string xdg = home_ + "/xdg";
  write_file(xdg + "/entente/profiles.json",
             profiles_json({{"acme", url_, kAdminToken}, {"elsewhere", dead_url_, "x"}}));
  CliRun r = run("--profile acme nodes", "XDG_CONFIG_HOME=" + xdg);
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(value_of(r.out, "domain"), "acme") << r.out;
  EXPECT_EQ(value_of(r.out, "controller"), "n1") << r.out;
  const Cells n1 = row_of(r.out, "n1");
  ASSERT_GE(n1.size(), 4u) << r.out;
  EXPECT_EQ(n1[1], "up");
  EXPECT_EQ(n1[2], "controller");
  EXPECT_EQ(n1[3], url_);

  // The global options may come after the command words, and the profile
  // may be named by the environment.
  r = run("nodes --profile acme", "XDG_CONFIG_HOME=" + xdg);
  EXPECT_EQ(r.code, 0) << what(r);
  r = run("streams list", "XDG_CONFIG_HOME=" + xdg + " ENTENTE_PROFILE=acme");
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, "no streams\n");

  // Without XDG_CONFIG_HOME: $HOME/.config/entente/profiles.json.
  write_file(home_ + "/.config/entente/profiles.json", profiles_json({{"home", url_, kReaderToken}}));
  r = run("--profile home streams list");
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, "no streams\n");

  // A profile file others may read holds a token in the open: a warning,
  // and the command still runs.
  ::chmod((home_ + "/.config/entente/profiles.json").c_str(), 0644);
  r = run("--profile home streams list");
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_TRUE(has(r.err, "others may read it (mode 644); chmod 600 it")) << r.err;
}

TEST_F(AdminCli, FlagsBeatTheEnvironmentWhichBeatsTheProfile) {
  const std::string xdg = "XDG_CONFIG_HOME=" + home_ + "/xdg ";
  write_file(home_ + "/xdg/entente/profiles.json",
             profiles_json({{"p", dead_url_, "not-a-token"}, {"q", url_, kAdminToken}}));

  // The profile alone: its (dead) URL.
  CliRun r = run("--profile p streams list", xdg);
  EXPECT_EQ(r.code, 3) << what(r);
  EXPECT_TRUE(has(r.err, "entente: cannot reach the node at " + dead_url_)) << r.err;
  // ENTENTE_URL beats the profile's URL; the token is still the profile's.
  r = run("--profile p streams list", xdg + "ENTENTE_URL=" + url_);
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(has(r.err, "entente: GET /v1/streams: 401: ")) << r.err;
  EXPECT_TRUE(has(r.err, "the node does not know the token from profile 'p'")) << r.err;
  // ENTENTE_TOKEN beats the profile's token.
  r = run("--profile p streams list", xdg + "ENTENTE_URL=" + url_ + " ENTENTE_TOKEN=" + kReaderToken);
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, "no streams\n");
  // --url beats ENTENTE_URL.
  r = run("--profile p --url " + url_ + " streams list",
          xdg + "ENTENTE_URL=" + dead_url_ + " ENTENTE_TOKEN=" + kReaderToken);
  EXPECT_EQ(r.code, 0) << what(r);
  // --token beats ENTENTE_TOKEN: a reader may not create a stream.
  const std::string create = "streams create bids --schema " + quote(kBidsSchema);
  r = run("--url " + url_ + " --token " + kReaderToken + " " + create,
          "ENTENTE_TOKEN=" + std::string(kAdminToken));
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(has(r.err, "entente: POST /v1/streams: 403: ")) << r.err;
  EXPECT_TRUE(has(r.err, "this needs role admin")) << r.err;
  r = run("--url " + url_ + " " + create, "ENTENTE_TOKEN=" + std::string(kAdminToken));
  EXPECT_EQ(r.code, 0) << what(r);
  // --profile beats ENTENTE_PROFILE.
  r = run("--profile q streams show bids", xdg + "ENTENTE_PROFILE=p");
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "name"), "bids");
  // The environment beats a profile named by the environment too.
  r = run("streams show bids",
          xdg + "ENTENTE_PROFILE=p ENTENTE_URL=" + url_ + " ENTENTE_TOKEN=" + kReaderToken);
  EXPECT_EQ(r.code, 0) << what(r);
}

TEST_F(AdminCli, ConfigurationAndUsageErrorsExit2) {
  auto expect_2 = [](const CliRun& r, const std::string& message) {
    EXPECT_EQ(r.code, 2) << what(r);
    EXPECT_TRUE(has(r.err, message)) << "expected '" << message << "' in:\n" << r.err;
    EXPECT_EQ(r.out, "");
  };
  const std::string file = home_ + "/xdg/entente/profiles.json";
  const std::string xdg = "XDG_CONFIG_HOME=" + home_ + "/xdg";
  // Nothing says where the node is.
  expect_2(run("streams list"),
           "entente: no node to speak to: give --url http(s)://HOST:PORT, set ENTENTE_URL, or "
           "name a profile (--profile NAME or ENTENTE_PROFILE) of " +
               home_ + "/.config/entente/profiles.json");
  // A profile without its file, in a file without it, without a url.
  expect_2(run("--profile acme streams list", xdg),
           "profile 'acme' (--profile): cannot read " + file + ": No such file or directory");
  write_file(file, profiles_json({{"acme", url_, kAdminToken}}));
  expect_2(run("streams list", xdg + " ENTENTE_PROFILE=beta"),
           "no profile 'beta' (ENTENTE_PROFILE) in " + file + " (it has: acme)");
  write_file(file, R"({"profiles": {"acme": {"token": "t"}}})");
  expect_2(run("--profile acme streams list", xdg),
           "profile 'acme' of " + file + " has no \"url\", and neither --url nor ENTENTE_URL is given");
  write_file(file, R"({"profiles": {"acme": {"url": ")" + url_ + R"(", "tokn": "t"}}})");
  expect_2(run("--profile acme streams list", xdg), file + ": $.profiles.acme.tokn: unknown key 'tokn'");
  write_file(file, R"({"profiles": {"acme": )");
  expect_2(run("--profile acme streams list", xdg), file + ": invalid JSON at offset");
  // Bad settings and bad command lines.
  expect_2(admin("--url ftp://127.0.0.1:1 streams list"), "--url is given twice");
  expect_2(run("--url ftp://127.0.0.1:1 streams list"),
           "--url: 'ftp://127.0.0.1:1' is not a node's URL: expected http://HOST:PORT or https://HOST:PORT");
  expect_2(run("--url http://127.0.0.1:99999 streams list"), "the port must be 1 to 65535");
  expect_2(run("--url https://127.0.0.1:1 --ca " + home_ + "/no-ca.crt streams list"),
           "the CA file " + home_ + "/no-ca.crt (--ca): No such file or directory");
  expect_2(run("--url " + url_ + " --timeout soon streams list"), "--timeout 'soon' is not a duration");
  expect_2(admin("streams list --bogus"), "entente streams list: unknown option '--bogus'");
  expect_2(admin("streams show"), "entente streams show: needs NAME");
  expect_2(admin("streams frobnicate"),
           "entente: streams: expected list, show, create, delete after 'streams', not "
           "'frobnicate'");
  expect_2(admin("streams create bids"), "streams create needs --schema FILE|JSON");
  expect_2(admin("streams create bids --schema " + home_ + "/none.json"),
           "--schema " + home_ + "/none.json: No such file or directory");
  expect_2(admin("streams create bids --schema '[{\"name\": '"), "--schema: invalid JSON at offset");
  expect_2(admin("streams create bids --schema " + quote(kBidsSchema) + " --replication 4"),
           "--replication must be 1, 2 or 3, not '4'");
  expect_2(admin("streams create bids --schema " + quote(kBidsSchema) + " --max-bytes 1GB"),
           "--max-bytes '1GB' is not a size");
  expect_2(admin("streams show 'b ids'"), "a stream name 'b ids' has a character no name has");
  // None of it reached the node.
  EXPECT_EQ(reader("streams list").out, "no streams\n");
}

TEST_F(AdminCli, StreamsCreateListShowDelete) {
  CliRun r = admin("streams create bids --schema " + quote(kBidsSchema) +
                   " --event-time ts --max-tuples 1000 --max-age 1h --durability fsync");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "name"), "bids") << r.out;
  EXPECT_EQ(value_of(r.out, "node"), "n1");
  EXPECT_EQ(value_of(r.out, "producer"), "api");
  EXPECT_EQ(value_of(r.out, "schema"), "auction:int64, price:int64, ts:timestamp");
  EXPECT_EQ(value_of(r.out, "event_time"), "ts");
  EXPECT_EQ(value_of(r.out, "durability"), "fsync");
  EXPECT_TRUE(has(value_of(r.out, "retention"), "max_tuples 1000,")) << r.out;
  EXPECT_TRUE(has(value_of(r.out, "retention"), "max_age 1h")) << r.out;
  // The schema from a file; the other settings the node's defaults.
  write_file(home_ + "/asks.json", R"([{"name": "item", "type": "string"}])");
  r = admin("streams create asks --schema " + home_ + "/asks.json");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "schema"), "item:string");
  EXPECT_EQ(value_of(r.out, "event_time"), "- (the time the node receives a tuple)");

  auto ack =
      node_.request("POST", "/v1/streams/bids/tuples",
                    "{\"auction\":1,\"price\":10,\"ts\":1000}\n{\"auction\":2,\"price\":200,\"ts\":1001}\n",
                    kPublisherToken, "application/x-ndjson");
  ASSERT_EQ(ack.status, 200u) << ack.body;

  r = reader("streams list");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(cells(r.out.substr(0, r.out.find('\n'))),
            (Cells{"NAME", "NODE", "PRODUCER", "FIELDS", "TUPLES", "FIRST_SEQ", "NEXT_SEQ"}));
  EXPECT_EQ(row_of(r.out, "bids"), (Cells{"bids", "n1", "api", "3", "2", "1", "3"})) << r.out;
  EXPECT_EQ(row_of(r.out, "asks"), (Cells{"asks", "n1", "api", "1", "0", "1", "1"})) << r.out;
  // Columns line up: each row's second cell starts where NODE does.
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("NAME", 0) != 0) {
      EXPECT_EQ(line.find("n1"), r.out.find("NODE")) << r.out;
    }
  }

  r = reader("--json streams list");
  ASSERT_EQ(r.code, 0) << what(r);
  auto d = parse(r.out);
  ASSERT_TRUE(d.IsObject() && d.HasMember("streams") && d["streams"].IsArray()) << r.out;
  EXPECT_EQ(d["streams"].Size(), 2u);

  r = reader("streams show bids");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "tuples"), "2");
  EXPECT_EQ(value_of(r.out, "next_seq"), "3");
  EXPECT_EQ(value_of(r.out, "first_seq"), "1");
  // --json: the node's answer as received.
  r = reader("streams show bids --json");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, node_.request("GET", "/v1/streams/bids", "", kReaderToken).body + "\n");

  // 5: it exists already.
  r = admin("streams create bids --schema " + quote(kBidsSchema));
  EXPECT_EQ(r.code, 5) << what(r);
  EXPECT_TRUE(has(r.err, "entente: POST /v1/streams: 409: ")) << r.err;
  EXPECT_TRUE(has(r.err, "exists")) << r.err;
  EXPECT_EQ(r.out, "");
  // 4: no such stream.
  r = reader("streams show nope");
  EXPECT_EQ(r.code, 4) << what(r);
  EXPECT_EQ(r.err, "entente: GET /v1/streams/nope: 404: no stream 'nope'\n");
  // 1: the node refuses the schema, and says where.
  r = admin(R"(streams create bad --schema '[{"name": "x", "type": "float"}]')");
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(has(r.err, "entente: POST /v1/streams: 400: $.schema[0].type: unknown type 'float'")) << r.err;

  r = admin("streams delete asks");
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, "deleted stream asks\n");
  r = admin("streams delete asks");
  EXPECT_EQ(r.code, 4) << what(r);
  EXPECT_EQ(r.err, "entente: DELETE /v1/streams/asks: 404: no stream 'asks'\n");
  r = admin("--json streams delete bids");
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(reader("streams list").out, "no streams\n");
}

TEST_F(AdminCli, QueriesDeployListShowDelete) {
  ASSERT_EQ(admin("streams create bids --schema " + quote(kBidsSchema) + " --event-time ts").code, 0);
  const std::string file = home_ + "/big-bids.json";
  write_file(file, kBigBids);

  CliRun r = admin("queries deploy --file " + file);
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "name"), "big-bids") << r.out;
  EXPECT_EQ(value_of(r.out, "state"), "running");
  EXPECT_EQ(value_of(r.out, "inputs"), "bids");
  EXPECT_EQ(value_of(r.out, "outputs"), "big_bids");
  EXPECT_EQ(value_of(r.out, "node"), "n1");
  const Cells box = row_of(r.out, "f");
  ASSERT_GE(box.size(), 2u) << r.out;
  EXPECT_EQ(box[1], "filter");

  r = reader("queries list");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(row_of(r.out, "NAME"), (Cells{"NAME", "STATE", "NODE", "INPUTS", "OUTPUTS", "LAG_TUPLES"}));
  EXPECT_EQ(row_of(r.out, "big-bids"), (Cells{"big-bids", "running", "n1", "bids", "big_bids", "0"}))
      << r.out;
  r = reader("queries show big-bids");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "positions").rfind("bids ", 0), 0u) << r.out;
  r = reader("queries show big-bids --json");
  ASSERT_EQ(r.code, 0) << what(r);
  auto d = parse(r.out);
  ASSERT_TRUE(d.IsObject() && d.HasMember("network")) << r.out;
  EXPECT_STREQ(d["name"].GetString(), "big-bids");
  // The output is a stream of the query's.
  EXPECT_EQ(row_of(reader("streams list").out, "big_bids"),
            (Cells{"big_bids", "n1", "query:big-bids", "3", "0", "1", "1"}));

  r = admin("checkpoint");
  ASSERT_EQ(r.code, 0) << what(r);
  const Cells taken = row_of(r.out, "big-bids");
  ASSERT_EQ(taken.size(), 5u) << r.out;
  EXPECT_TRUE(has(taken[4], "T")) << r.out;  // taken_at
  r = reader("checkpoint");
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(has(r.err, "entente: POST /v1/checkpoints: 403: ")) << r.err;

  // 5: deployed already, with the node's reason.
  r = admin("queries deploy --file " + file);
  EXPECT_EQ(r.code, 5) << what(r);
  EXPECT_TRUE(has(r.err, "entente: POST /v1/queries: 409: ")) << r.err;
  // 1: an invalid network, each problem on a line under the detail.
  std::string bad = kBigBids;
  bad.replace(bad.find("\"filter\""), 8, "\"fliter\"");
  write_file(home_ + "/bad.json", bad);
  r = admin("queries deploy --file " + home_ + "/bad.json");
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(has(r.err, "entente: POST /v1/queries: 400: ")) << r.err;
  EXPECT_TRUE(has(r.err, "\n  $.boxes[0].type: unknown box type 'fliter'")) << r.err;
  // 2, and nothing sent: not JSON, or over the body limit.
  write_file(home_ + "/broken.json", "{\"name\": ");
  r = admin("queries deploy --file " + home_ + "/broken.json");
  EXPECT_EQ(r.code, 2) << what(r);
  EXPECT_TRUE(has(r.err, "--file " + home_ + "/broken.json: invalid JSON at offset")) << r.err;
  write_file(home_ + "/huge.json", "{\"description\": \"" + std::string(17u << 20, 'x') + "\"}");
  r = admin("queries deploy --file " + home_ + "/huge.json");
  EXPECT_EQ(r.code, 2) << what(r);
  EXPECT_TRUE(has(r.err, "huge.json: larger than 16MiB")) << r.err;
  EXPECT_TRUE(has(r.err, "nothing was sent")) << r.err;

  r = admin("queries delete big-bids");
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, "deleted query big-bids and its output streams\n");
  r = reader("queries show big-bids");
  EXPECT_EQ(r.code, 4) << what(r);
  EXPECT_TRUE(has(r.err, "entente: GET /v1/queries/big-bids: 404: ")) << r.err;
  EXPECT_EQ(reader("queries list").out, "no queries\n");
  EXPECT_EQ(admin("checkpoint").out, "no queries: nothing to checkpoint\n");
}

// The query lifecycle from the command line: --start-from, stop and start,
// and a replacement network (docs/query-networks.md).
TEST_F(AdminCli, QueriesStartFromStopStartAndReplace) {
  ASSERT_EQ(admin("streams create bids --schema " + quote(kBidsSchema) + " --event-time ts").code, 0);
  const std::string bids = home_ + "/bids.ndjson";
  auto publish = [&](const std::string& prices) {
    std::string lines;
    for (size_t at = 0; at < prices.size();) {
      const size_t comma = std::min(prices.find(',', at), prices.size());
      lines += R"({"auction":1,"price":)" + prices.substr(at, comma - at) + R"(,"ts":1000})" + "\n";
      at = comma + 1;
    }
    write_file(bids, lines);
    const CliRun r = admin("publish bids --file " + bids);
    ASSERT_EQ(r.code, 0) << what(r);
  };
  // The tuples big_bids holds, from `streams show`.
  auto out_tuples = [&] { return value_of(reader("streams show big_bids").out, "tuples"); };
  publish("50,150,200");  // before the query: read only from the earliest

  const std::string file = home_ + "/big-bids.json";
  write_file(file, kBigBids);
  CliRun r = admin("queries deploy --file " + file + " --start-from sometime");
  EXPECT_EQ(r.code, 2) << what(r);
  EXPECT_TRUE(has(r.err, "--start-from: earliest or latest")) << r.err;
  r = admin("queries deploy --file " + file + " --start-from earliest");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_TRUE(eventually([&] { return out_tuples() == "2"; })) << reader("streams show big_bids").out;

  r = admin("queries stop big-bids");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "state"), "stopped") << r.out;
  EXPECT_EQ(row_of(reader("queries list").out, "big-bids").at(1), "stopped");
  publish("300");
  EXPECT_EQ(out_tuples(), "2");  // stopped: read nothing
  r = admin("queries start big-bids");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "state"), "running") << r.out;
  EXPECT_TRUE(eventually([&] { return out_tuples() == "3"; })) << reader("streams show big_bids").out;

  // A new predicate for the (stateless) filter: the query goes on from
  // where it stood, into the same output stream.
  std::string higher = kBigBids;
  higher.replace(higher.find("price > 100"), 11, "price > 250");
  write_file(home_ + "/higher.json", higher);
  r = admin("queries replace big-bids --file " + home_ + "/higher.json");
  ASSERT_EQ(r.code, 0) << what(r);
  publish("220,400");
  EXPECT_TRUE(eventually([&] { return out_tuples() == "4"; })) << reader("streams show big_bids").out;
  r = admin("queries replace big-bids --file " + home_ + "/higher.json --drop-state nobox");
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(has(r.err, "PUT /v1/queries/big-bids: 400: ")) << r.err;

  r = admin("queries stop nope");
  EXPECT_EQ(r.code, 4) << what(r);
  r = reader("queries stop big-bids");
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(has(r.err, "403")) << r.err;
}

TEST_F(AdminCli, UnreachableNodesAndNodesWithoutFederation) {
  CliRun r = reader("--url " + dead_url_ + " nodes");
  EXPECT_EQ(r.code, 2) << what(r);  // --url twice
  r = run("--url " + dead_url_ + " --token x nodes");
  EXPECT_EQ(r.code, 3) << what(r);
  EXPECT_TRUE(has(r.err, "entente: cannot reach the node at " + dead_url_ + ": ")) << r.err;
  EXPECT_TRUE(has(r.err, "Connection refused")) << r.err;
  EXPECT_EQ(r.out, "");
  // A listener that never answers: the request ends at --timeout.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const auto started = std::chrono::steady_clock::now();
  r = run("--url http://127.0.0.1:" + std::to_string(ntohs(a.sin_port)) + " --token x --timeout 300ms nodes");
  const auto took = std::chrono::steady_clock::now() - started;
  ::close(fd);
  EXPECT_EQ(r.code, 3) << what(r);
  EXPECT_TRUE(has(r.err, "entente: GET /v1/nodes: read the response from 127.0.0.1:")) << r.err;
  EXPECT_TRUE(has(r.err, "timeout")) << r.err;
  EXPECT_LT(took, std::chrono::seconds(5));
  // A node without a federation section has no peers and no contracts.
  r = reader("peers");
  EXPECT_EQ(r.code, 4) << what(r);
  EXPECT_TRUE(has(r.err, "entente: GET /v1/peers: 404: ")) << r.err;
  r = reader("contracts list");
  EXPECT_EQ(r.code, 4) << what(r);
  EXPECT_TRUE(has(r.err, "entente: GET /v1/contracts: 404: ")) << r.err;
  // Without a token the node says so, and so does the command.
  r = run("--url " + url_ + " nodes");
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(has(r.err, "entente: GET /v1/nodes: 401: this resource needs a bearer token")) << r.err;
  EXPECT_TRUE(has(r.err, "no token was sent")) << r.err;
}

// Two linked domains: peers, and contracts from none to one awaiting beta.
TEST(AdminCliFederation, PeersAndContractsAwaitingADomain) {
  TwoDomains d;
  ASSERT_NO_FATAL_FAILURE(d.start());
  const std::string home = make_temp_dir("cli-admin-fed");
  auto on = [&](const FedNode& n, const std::string& args) {
    return entente(home, "--url http://127.0.0.1:" + std::to_string(n.process().port()) + " --token " +
                             kAdminToken + " " + args);
  };

  CliRun r = on(*d.acme, "peers");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "self"), "entente://acme/n1") << r.out;
  EXPECT_EQ(value_of(r.out, "refusals"), "none");
  const Cells beta = row_of(r.out, "entente://beta/n1");
  ASSERT_GE(beta.size(), 2u) << r.out;
  EXPECT_EQ(beta[1], "up");

  r = on(*d.acme, "contracts list");
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, "no contracts\n");
  r = on(*d.acme, "contracts list --json");
  EXPECT_EQ(r.code, 0) << what(r);
  auto none = parse(r.out);
  ASSERT_TRUE(none.IsObject() && none.HasMember("contracts") && none["contracts"].IsArray()) << r.out;
  EXPECT_EQ(none["contracts"].Size(), 0u);

  const std::string id = d.propose(stream_terms(5, seconds_from_now(-60), seconds_from_now(3600)));
  ASSERT_FALSE(id.empty());
  // beta has to answer acme's offer; acme waits.
  r = on(*d.beta, "contracts list --awaiting-me");
  ASSERT_EQ(r.code, 0) << what(r);
  const Cells row = row_of(r.out, id);
  ASSERT_EQ(row.size(), 9u) << r.out;  // PARTIES has two words
  EXPECT_EQ(row[1], "stream");
  EXPECT_EQ(row[4], "proposed");
  EXPECT_EQ(row[5], "1");
  EXPECT_EQ(row[6], "acme");
  r = on(*d.acme, "contracts list --awaiting-me");
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, "no contracts await acme\n");
  r = on(*d.acme, "contracts list --state proposed --peer beta");
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(row_of(r.out, id).size(), 9u) << r.out;
  r = on(*d.beta, "--json contracts list --awaiting-me");
  ASSERT_EQ(r.code, 0) << what(r);
  auto doc = parse(r.out);
  ASSERT_TRUE(doc.IsObject() && doc["contracts"].IsArray()) << r.out;
  ASSERT_EQ(doc["contracts"].Size(), 1u);
  EXPECT_EQ(std::string(doc["contracts"][0]["id"].GetString()), id);

  r = on(*d.beta, "contracts show " + id);
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "state"), "proposed");
  EXPECT_EQ(value_of(r.out, "by"), "acme");
  EXPECT_EQ(value_of(r.out, "next"), "beta may accept, counter or reject version 1");
  EXPECT_EQ(value_of(r.out, "terms.provider"), "acme");
  EXPECT_EQ(value_of(r.out, "terms.price_per_million"), "5");
  const Cells v1 = row_of(r.out, "1");
  ASSERT_GE(v1.size(), 4u) << r.out;
  EXPECT_EQ(v1[1], "proposed");
  EXPECT_EQ(v1[2], "acme");

  // Accepted by beta, countersigned by acme: nobody's turn.
  ASSERT_EQ(act(*d.beta, id, "accept", R"({"version":1})").status, 200u);
  ASSERT_EQ(wait_version(*d.beta, id, 3).state, "active");
  r = on(*d.beta, "contracts list --awaiting-me");
  EXPECT_EQ(r.out, "no contracts await beta\n") << what(r);
  r = on(*d.beta, "contracts show " + id);
  EXPECT_EQ(value_of(r.out, "next"), "either party may revoke it") << r.out;
  EXPECT_EQ(value_of(r.out, "in_force"), "true");

  r = on(*d.beta, "contracts show c-0000000000000000");
  EXPECT_EQ(r.code, 4) << what(r);
  EXPECT_TRUE(has(r.err, "entente: GET /v1/contracts/c-0000000000000000: 404: ")) << r.err;
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(home);
}

// A node with TLS: the CA from --ca, or from the profile next to its file.
TEST(AdminCliTls, TheCaComesFromAFlagOrTheProfile) {
  Federation certs;
  FedNode& n = certs.add("acme");
  BrokerOptions o;
  o.tls = true;
  o.cert_file = n.cert_file();
  o.key_file = n.key_file();
  o.ca_file = n.ca_file();
  BrokerProcess node(o);
  ASSERT_TRUE(node.start()) << node.last_error();
  const std::string home = make_temp_dir("cli-admin-tls");
  const std::string url = "https://127.0.0.1:" + std::to_string(node.port());

  CliRun r = entente(home, "--url " + url + " --token " + kReaderToken + " streams list");
  EXPECT_EQ(r.code, 3) << what(r);
  EXPECT_TRUE(has(r.err, "certificate verify failed")) << r.err;
  EXPECT_TRUE(has(r.err, "give --ca FILE")) << r.err;
  // publish retries a lost answer, not a certificate it cannot verify.
  write_file(home + "/one.ndjson", "{\"x\": 1}\n");
  r = entente(home, "--url " + url + " --token " + kAdminToken + " publish s --file " + home + "/one.ndjson");
  EXPECT_EQ(r.code, 3) << what(r);
  EXPECT_TRUE(has(r.err, "give --ca FILE")) << r.err;
  EXPECT_FALSE(has(r.err, "sending it again")) << r.err;
  r = entente(home, "--url " + url + " --token " + kReaderToken + " --ca " + n.ca_file() + " streams list");
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, "no streams\n");

  // "ca": "ca.crt" is the profile file's neighbour.
  std::filesystem::create_directories(home + "/.config/entente");
  std::filesystem::copy_file(n.ca_file(), home + "/.config/entente/ca.crt");
  write_file(home + "/.config/entente/profiles.json", R"({"profiles": {"acme": {"url": ")" + url +
                                                          R"(", "token": ")" + kReaderToken +
                                                          R"(", "ca": "ca.crt"}}})");
  r = entente(home, "--profile acme streams list");
  EXPECT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(r.out, "no streams\n");
  // The plain-HTTP URL of a TLS node cannot be read.
  r = entente(home, "--profile acme --url http://127.0.0.1:" + std::to_string(node.port()) + " streams list");
  EXPECT_EQ(r.code, 3) << what(r);
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(home);
}

}  // namespace
}  // namespace entente::testing
