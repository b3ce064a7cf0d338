// A fragment moved to a node of another domain under a hosting contract
// (docs/cluster.md, "Moving a fragment to another domain";
// docs/contracts.md, "The hosting check"). acme is two real broker
// processes sharing one real etcd; beta is one node; the domains are
// linked by mutual TLS and negotiate hosting contracts over REST, each
// signed by both. A query cut in two fragments (the filter on n1 next to
// bids, map + 1 s tumbling count on n2) runs beside the same query whole
// on n1 while a producer publishes.
//
// The fragment's load (CPU ms per second of its runner) shows in GET
// /v1/queries/{q} and in /metrics. A move of the fragment to beta/n1 is
// refused, each time with a 4xx naming the reason, with no contract, with
// an expired one, with one that excludes a box kind of the fragment, with
// one whose maximum load the fragment's measured load exceeds, to an
// unknown node and to a domain that is no peer; with a contract that
// permits it, the fragment's definition is offered to beta/n1 over the
// link, which checks it against its own ledger and admits it, and the
// fragment runs there (cluster_hosted.cpp): beta's admin cannot see any of
// it; the contract revoked, acme takes it back; at the end the cut query's
// output equals the whole one row for row. The same for NEXMark q5's
// shape (a sliding count with `top`); other tests kill the host, kill the
// owner's node, and exceed the contract's maximum load.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "http/client.h"
#include "rapidjson/document.h"
#include "tests/integration/support/cluster.h"
#include "tests/integration/support/contracts.h"
#include "tests/integration/support/cut_query.h"
#include "tests/integration/support/federation.h"
#include "tests/integration/support/ws_reader.h"
#include "tests/support/etcd_process.h"
#include "tests/support/tcp_owner.h"
#include "tests/support/tcp_proxy.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kAuctions = 7;

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  return d;
}

// The last lines of a node's log, for a failure's message.
std::string tail(const std::string& log, size_t bytes = 4000) {
  return log.size() > bytes ? log.substr(log.size() - bytes) : log;
}

// Hosting terms: beta hosts boxes of acme.
std::string hosting_terms(const std::string& box_kinds, uint64_t max_load, uint64_t price, int64_t until_ms) {
  return R"({"kind":"hosting","host":"beta","owner":"acme","box_kinds":)" + box_kinds +
         R"(,"max_load":)" + std::to_string(max_load) + R"(,"price_min":)" + std::to_string(price) +
         R"(,"price_max":)" + std::to_string(price * 2) +
         R"(,"notice_seconds":60,"host_may_subscribe":false,"host_may_export":false,"valid_from":)" +
         std::to_string(seconds_from_now(-60)) + R"(,"valid_until":)" + std::to_string(until_ms) + "}";
}

// Bid i: event time i ms, so that windows close in order.
std::string bid_row(uint64_t i) {
  return R"({"auction":)" + std::to_string(i % kAuctions) + R"(,"price":)" + std::to_string(i % 1000) +
         R"(,"date_time":)" + std::to_string(i) + "}";
}

class ClusterHosting : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
    etcd_ = std::make_unique<EtcdProcess>("etcd-hosting");
    ASSERT_TRUE(etcd_->start()) << etcd_->last_error();
    beta_ = &fed_.add("beta", "n1");
    // Cut tests: every link between the domains goes through a proxy, each
    // way: acme dials beta's, beta dials (and is sent to) the ones acme's
    // nodes advertise, which also carry acme's own links between its nodes.
    if (proxied_) beta_proxy_.start(beta_->federation_port());
    for (size_t i = 0; i < 2; ++i) {
      FedNode& n = fed_.add("acme", i == 0 ? "n1" : "n2");
      std::string cluster = cluster_section(*etcd_);
      if (proxied_) {
        n.pins(*beta_, "127.0.0.1:" + std::to_string(beta_proxy_.port()), beta_->ca_file());
        acme_proxies_[i].start(n.federation_port());
        cluster.pop_back();  // its closing brace
        cluster += R"(, "advertise_peer_port": )" + std::to_string(acme_proxies_[i].port()) + "}";
      } else {
        n.pins(*beta_);
      }
      n.config_extra(R"("checkpoint_interval": "200ms", )" + cluster);
      acme_.push_back(&n);
    }
    for (size_t i = 0; i < 2; ++i) {
      if (proxied_)
        beta_->pins(*acme_[i], "127.0.0.1:" + std::to_string(acme_proxies_[i].port()), acme_[i]->ca_file());
      else
        beta_->pins(*acme_[i]);
    }
    ASSERT_TRUE(fed_.start_all()) << fed_.last_error();
    ASSERT_TRUE(eventually(20.0, [&] { return domain_up({&acme(1).process(), &acme(2).process()}, 2); }))
        << "acme's nodes do not see each other up";
    ASSERT_NO_FATAL_FAILURE(wait_linked(acme(1), *beta_));
    ASSERT_NO_FATAL_FAILURE(wait_linked(acme(2), *beta_));
  }

  FedNode& acme(int i) { return *acme_.at(static_cast<size_t>(i - 1)); }

  // With a timeout longer than the move's own bounds (the fragment's stop,
  // up to 10 s under load, then the host's answer, up to 30 s), not a
  // client's default 10 s: a loaded machine made a hosted move outlast it.
  http::ClientResponse move(int via, const std::string& body, const std::string& fragment = "b") {
    http::ClientOptions o = acme(via).process().client_options();
    o.timeout_ms = 120'000;
    auto c = http::Client::connect(o);
    EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.error().message);
    if (!c.ok()) return {};
    auto r = (*c)->request("POST", "/v1/queries/cut/fragments/" + fragment + "/move", body, "application/json",
                           {{"authorization", std::string("Bearer ") + kAdminToken}});
    EXPECT_TRUE(r.ok()) << "the move of " << fragment << ": " << (r.ok() ? "" : r.error().message);
    return r.ok() ? std::move(r).value() : http::ClientResponse{};
  }

  // Negotiated over REST: acme proposes, beta accepts, acme countersigns;
  // returns the id once acme/n2, where the fragment runs, holds it active.
  std::string agree(const std::string& terms) {
    auto proposed = acme(1).process().request("POST", "/v1/contracts", "{\"terms\":" + terms + "}");
    EXPECT_EQ(proposed.status, 201u) << proposed.body;
    const std::string id = parse_contract(proposed.status, proposed.body).id;
    EXPECT_EQ(wait_version(*beta_, id, 1).status, 200u) << "beta never received " << id;
    auto accepted = act(*beta_, id, "accept", R"({"version":1})");
    EXPECT_EQ(accepted.status, 200u) << accepted.body;
    const ContractView on_n2 = wait_version(acme(2), id, 3);
    EXPECT_EQ(on_n2.state, "active") << on_n2.body;
    EXPECT_EQ(on_n2.last_signatures, 2u) << on_n2.body;
    return id;
  }

  // The cut query's fragment `name` as GET /v1/queries/cut shows it.
  struct FragmentView {
    std::string node, state;
    double cpu_ms_per_s = -1, cpu_seconds = -1;
    std::string hosted_by;  // "beta/n1" while hosted
    double load_seconds = -1;
  };
  FragmentView fragment(const std::string& name) {
    FragmentView v;
    auto d = parse(acme(1).process().request("GET", "/v1/queries/cut", {}, kReaderToken).body);
    if (!d.IsObject() || !d.HasMember("fragments")) return v;
    for (const auto& f : d["fragments"].GetArray()) {
      if (f["name"].GetString() != name) continue;
      v.node = f["node"].GetString();
      if (!f.HasMember("runner") || !f["runner"].IsObject()) return v;
      const auto& r = f["runner"];
      v.state = r["state"].GetString();
      if (r.HasMember("hosted") && r["hosted"].IsObject()) {
        v.hosted_by = std::string(r["hosted"]["domain"].GetString()) + "/" + r["hosted"]["node"].GetString();
        v.load_seconds = r["hosted"]["load_seconds"].GetDouble();
      }
      if (r.HasMember("load") && r["load"].IsObject()) {
        v.cpu_ms_per_s = r["load"]["cpu_ms_per_s"].GetDouble();
        v.cpu_seconds = r["load"]["cpu_seconds"].GetDouble();
      }
    }
    return v;
  }

  // Refused with `status`, the detail containing `reason`; the fragment
  // still runs on acme/n2.
  void expect_refused(const http::ClientResponse& r, unsigned status, const std::string& reason) {
    EXPECT_EQ(r.status, status) << r.body;
    EXPECT_NE(r.body.find("\"type\""), std::string::npos) << "not a problem+json: " << r.body;
    EXPECT_NE(problem_detail(r.body).find(reason), std::string::npos) << r.body;
    const FragmentView v = fragment("b");
    EXPECT_EQ(v.node, "n2");
    EXPECT_EQ(v.state, "running");
  }

  // bids on n1; the query whole on n1, and cut: a (the filter) on n1, b
  // (map + count) on n2.
  // `counts_options`: box counts' (the tumbling count, or q5's shape);
  // or, with `join`, q8's shape (cut_join_query) whose fragment b holds
  // every box but keep.
  void deploy(const std::string& counts_options = kCutCountOptions, bool join = false) {
    counts_every_bid_ = !join && counts_options == kCutCountOptions;
    auto query = [&](const std::string& name, const std::string& output, const std::string& placement) {
      return join ? cut_join_query(name, output, placement) : cut_count_query(name, output, placement, counts_options);
    };
    auto created = acme(1).process().request(
        "POST", "/v1/streams", R"({"name":"bids","node":"n1","schema":)" + std::string(kCutBidSchema) + "}");
    ASSERT_EQ(created.status, 201u) << created.body;
    auto whole = acme(1).process().request("POST", "/v1/queries", query("whole", "counts-whole", R"({"node":"n1"})"));
    ASSERT_EQ(whole.status, 201u) << whole.body;
    auto cut = acme(2).process().request(
        "POST", "/v1/queries",
        query("cut", "counts-cut",
              std::string(R"({"fragments":[{"name":"a","node":"n1","boxes":["keep"]},)"
                          R"({"name":"b","node":"n2","boxes":)") +
                  (join ? R"(["lf","rf","left","right","pairs"])" : R"(["cents","counts"])") + "}]}"));
    ASSERT_EQ(cut.status, 201u) << cut.body;
    ASSERT_TRUE(eventually(30.0, [&] { return fragment("b").state == "running"; })) << "fragment b does not run";
  }

  // Moves fragment b to beta/n1 under `contract`: the answer. `warm`: with
  // a standby built on beta first, so that the state goes before the
  // pause; else in it.
  rapidjson::Document move_to_beta(const std::string& contract, bool warm = true) {
    auto moved = move(2, warm ? R"({"node":"beta/n1"})" : R"({"node":"beta/n1","warm":false})");
    EXPECT_EQ(moved.status, 200u) << moved.body;
    std::printf("move of b to beta/n1: %s\n", moved.body.c_str());
    auto d = parse(moved.body);
    EXPECT_TRUE(d.IsObject() && d.HasMember("state") && std::string(d["state"].GetString()) == "hosted") << moved.body;
    EXPECT_TRUE(d.IsObject() && d.HasMember("contract") && d["contract"].GetString() == contract) << moved.body;
    EXPECT_TRUE(d.IsObject() && d.HasMember("pause_ms") && d["pause_ms"].GetDouble() > 0) << moved.body;
    EXPECT_TRUE(d.IsObject() && d.HasMember("warm") && d["warm"].GetBool() == warm) << moved.body;
    return d;
  }

  // deploy(), `feeder` started, a contract agreed, and fragment b moved
  // to beta/n1 once it has worked.
  void host_while_fed(Feeder& feeder, const std::string& counts_options = kCutCountOptions, bool join = false,
                      bool warm = true) {
    ASSERT_NO_FATAL_FAILURE(deploy(counts_options, join));
    feeder.start();
    const std::string id = agree(hosting_terms(join ? R"(["filter","join","map"])" : R"(["aggregate","map"])",
                                               1'000'000, 5, seconds_from_now(3600)));
    ASSERT_TRUE(eventually(30.0, [&] { return fragment("b").cpu_ms_per_s > 0; }));
    ASSERT_NO_FATAL_FAILURE(move_to_beta(id, warm));
  }

  // Fragment b runs in acme again, hosted no more (`when` for the message).
  void expect_back(const std::string& when) {
    FragmentView back;
    ASSERT_TRUE(eventually(60.0, [&] {
      back = fragment("b");
      return back.hosted_by.empty() && back.state == "running";
    })) << "fragment b is not back in acme " << when << ": " << back.hosted_by << " " << back.state
        << "\nacme/n2's log ends:\n" << tail(acme(2).process().stderr_text());
  }

  // After the feeder stops: the end marker, then the cut query's output is
  // the whole one's row for row, and (the tumbling count) counts every bid
  // acknowledged.
  void revoke_while_hosted(Feeder& feeder);

  void expect_output_exact(const Feeder& feeder) {
    ASSERT_GT(feeder.acked(), 0u) << feeder.last_failure();
    const std::string end = R"([{"auction":-1,"price":0,"date_time":1000000000}])";
    // (429 while a query catches up with the feeder: sent again, as a
    // publisher honouring Retry-After would.)
    unsigned status = 0;
    ASSERT_TRUE(eventually(60.0, [&] {
      status = acme(1).process().request("POST", "/v1/streams/bids/tuples", end, kPublisherToken).status;
      return status != 429;
    }));
    ASSERT_EQ(status, 200u);
    if (!counts_every_bid_) {
      // q5's shape: the end marker closed every window of the bids (its
      // own stays open); the whole query has written them all once its
      // output stops growing. Then row for row.
      int64_t ranked = 0;
      uint64_t before = 0, now = 0;
      ASSERT_TRUE(eventually(60.0, [&] {
        before = now;
        std::this_thread::sleep_for(1500ms);
        now = next_seq(acme(1).process(), "counts-whole");
        return now > 1 && now == before;
      })) << "the whole query's output keeps growing: " << before << ", " << now;
      ASSERT_NO_FATAL_FAILURE(expect_cut_output_equals_whole(acme(1).process(), acme(2).process(), 1, 90s, ranked));
      std::printf("%llu rows of %llu bids, the cut query's equal to the whole one's\n",
                  static_cast<unsigned long long>(now - 1), static_cast<unsigned long long>(feeder.acked()));
      return;
    }
    // The whole query has counted every bid (the end marker closed every
    // window), so the comparison below covers them all.
    int64_t whole = 0;
    EXPECT_TRUE(eventually(60.0, [&] {
      whole = 0;
      const ReadResult rows =
          read_stream(acme(1).process(), "counts-whole", 1, next_seq(acme(1).process(), "counts-whole") - 1, 10'000);
      for (const auto& t : rows.tuples) {
        rapidjson::Document d = parse(t.line);
        if (d.IsObject() && d.HasMember("auction") && d["auction"].GetInt64() >= 0) whole += d["n"].GetInt64();
      }
      return whole == static_cast<int64_t>(feeder.acked());
    })) << "the whole query counted " << whole << " of " << feeder.acked() << " bids";
    int64_t counted = 0;
    ASSERT_NO_FATAL_FAILURE(
        expect_cut_output_equals_whole(acme(1).process(), acme(2).process(), 1, 90s, counted));
    EXPECT_EQ(counted, static_cast<int64_t>(feeder.acked())) << "the counts do not add up to every bid acknowledged";
  }

  bool counts_every_bid_ = true;  // deploy()'s query: the tumbling count, not q5's shape
  // The links between acme and beta go through beta_proxy_ and
  // acme_proxies_ (SetUp), which cut_beta() and heal_beta() cut and heal.
  bool proxied_ = false;
  TcpProxy beta_proxy_;
  std::array<TcpProxy, 2> acme_proxies_;

  // Every link between acme and beta closed, and every new one refused
  // (acme's own links between its nodes stay).
  void cut_beta() {
    beta_proxy_.block(true);
    beta_proxy_.cut();
    const pid_t beta = beta_->process().pid();
    for (auto& p : acme_proxies_) {
      const uint16_t port = p.port();
      auto from_beta = [beta, port](uint16_t client) { return local_tcp_ports_of(beta, port).count(client) > 0; };
      p.refuse_clients(from_beta);
      p.cut_clients(from_beta);
    }
  }
  void heal_beta() {
    beta_proxy_.block(false);
    for (auto& p : acme_proxies_) p.refuse_clients({});
  }
  std::unique_ptr<EtcdProcess> etcd_;
  Federation fed_;
  FedNode* beta_ = nullptr;
  std::vector<FedNode*> acme_;
};

TEST_F(ClusterHosting, AMoveToAnotherDomainIsAdmittedOnlyUnderAContractCoveringItsKindsAndMeasuredLoad) {
  ASSERT_NO_FATAL_FAILURE(deploy());
  // A fragment cannot be placed on another domain's node at deploy: its
  // load is not known yet, and a node name names no domain.
  auto elsewhere = acme(2).process().request(
      "POST", "/v1/queries",
      cut_count_query("cut2", "counts-cut2",
                      R"({"fragments":[{"name":"a","node":"n1","boxes":["keep"]},)"
                      R"({"name":"b","node":"beta/n1","boxes":["cents","counts"]}]})"));
  EXPECT_EQ(elsewhere.status, 400u) << elsewhere.body;
  EXPECT_NE(elsewhere.body.find("$.placement.fragments[1].node"), std::string::npos) << elsewhere.body;

  Feeder feeder(acme(1).process(), "bids", bid_row, 500, 5ms);
  feeder.start();

  // The fragment's load, measured where it runs, in its GET and /metrics.
  FragmentView loaded;
  ASSERT_TRUE(eventually(60.0, [&] {
    loaded = fragment("b");
    return loaded.cpu_ms_per_s > 1.0;
  })) << "fragment b's load stays at " << loaded.cpu_ms_per_s << " CPU ms/s after " << feeder.acked() << " bids";
  EXPECT_GT(loaded.cpu_seconds, 0.0);
  const std::string metrics = acme(2).process().request("GET", "/metrics", {}, kReaderToken).body;
  EXPECT_NE(metrics.find("entente_query_cpu_seconds_total{query=\"cut--b\"}"), std::string::npos);
  EXPECT_NE(metrics.find("entente_query_load_cpu_ms_per_s{query=\"cut--b\"}"), std::string::npos);

  // No contract at all.
  ASSERT_NO_FATAL_FAILURE(
      expect_refused(move(1, R"({"domain":"beta","node":"n1"})"), 403, "no hosting contract from host beta for owner acme"));

  // An expired one (in force for a few seconds only).
  const std::string expired = agree(hosting_terms(R"(["aggregate","filter","map"])", 1'000'000, 1, seconds_from_now(8)));
  ASSERT_TRUE(eventually(20.0, [&] { return get_contract(acme(2), expired).state == "expired"; }));
  ASSERT_NO_FATAL_FAILURE(expect_refused(move(2, R"({"node":"beta/n1"})"), 403,
                                         "contract " + expired + " is not in force (expired at"));

  // One that excludes a box kind of the fragment (map and aggregate).
  const std::string no_aggregate = agree(hosting_terms(R"(["filter","join","map"])", 1'000'000, 2, seconds_from_now(3600)));
  ASSERT_NO_FATAL_FAILURE(expect_refused(move(1, R"({"domain":"beta","node":"n1"})"), 403,
                                         "box kind 'aggregate' is not in contract " + no_aggregate));

  // One whose maximum load (1 CPU ms/s) the fragment's exceeds.
  const std::string small = agree(hosting_terms(R"(["aggregate","map"])", 1, 3, seconds_from_now(3600)));
  ASSERT_NO_FATAL_FAILURE(
      expect_refused(move(2, R"({"domain":"beta","node":"n1"})"), 403, "exceeds contract " + small + "'s maximum 1 CPU ms/s"));

  // An unknown node of beta; a domain that is not a peer; a bad name.
  ASSERT_NO_FATAL_FAILURE(expect_refused(move(1, R"({"domain":"beta","node":"n9"})"), 400,
                                         "n9 is not a node of domain beta known to acme (its nodes: n1)"));
  ASSERT_NO_FATAL_FAILURE(
      expect_refused(move(1, R"({"node":"gamma/n1"})"), 400, "gamma is not a peer domain of acme"));
  ASSERT_NO_FATAL_FAILURE(expect_refused(move(1, R"({"domain":"Beta!","node":"n1"})"), 400, "not a domain name"));
  ASSERT_NO_FATAL_FAILURE(expect_refused(move(2, R"({"node":"beta/n1","warm":"yes"})"), 400, "$.warm: a boolean"));

  std::printf("load of fragment b: %.2f CPU ms/s, %.3f CPU s\n", loaded.cpu_ms_per_s, loaded.cpu_seconds);

  // A move within the domain is untouched by the hosting path.
  auto same = move(1, R"({"domain":"acme","node":"n2"})");
  EXPECT_EQ(same.status, 409u) << same.body;
  EXPECT_NE(same.body.find("runs on n2 already"), std::string::npos) << same.body;

  // A contract that permits it: the fragment moves to beta/n1 while bids
  // flow, and its results come back into acme's streams.
  const std::string ample = agree(hosting_terms(R"(["aggregate","map"])", 1'000'000, 5, seconds_from_now(3600)));
  ASSERT_NO_FATAL_FAILURE(move_to_beta(ample));
  const uint64_t state_at_move = next_seq(acme(2).process(), "cut--b--state");
  FragmentView hosted;
  ASSERT_TRUE(eventually(20.0, [&] {
    hosted = fragment("b");
    return hosted.hosted_by == "beta/n1" && hosted.load_seconds > 0;
  })) << "GET /v1/queries/cut does not show b hosted by beta/n1 with its load-seconds: " << hosted.hosted_by << " "
      << hosted.load_seconds;
  EXPECT_EQ(hosted.state, "running");
  // Both ledgers count the load-seconds, at the contract's price (5).
  for (const FedNode* side : {beta_, &acme(2)}) {
    rapidjson::Document u;
    EXPECT_TRUE(eventually(10.0, [&] {
      u = parse(side->process().request("GET", "/v1/contracts/" + ample + "/usage", {}, kReaderToken).body);
      return u.IsObject() && u.HasMember("load_seconds") && u["load_seconds"].GetDouble() > 0;
    })) << "no load-seconds on " << side->identity();
    if (u.IsObject() && u.HasMember("cost_credits")) {
      EXPECT_DOUBLE_EQ(u["cost_credits"].GetDouble(), 5 * u["load_seconds"].GetDouble());
    }
  }
  // acme's state stream of b, which the relay extends with the host's
  // checkpoints and journal, is trimmed to the last checkpoint it holds
  // whole, past all it held at the move.
  uint64_t first = 0;
  EXPECT_TRUE(eventually(30.0, [&] {
    rapidjson::Document d = parse(acme(2).process().request("GET", "/v1/streams/cut--b--state", {}, kReaderToken).body);
    first = d.IsObject() && d.HasMember("first_seq") ? d["first_seq"].GetUint64() : 0;
    return first > state_at_move;
  })) << "acme's state stream of the hosted fragment is not trimmed: first_seq " << first << ", "
      << state_at_move << " at the move";
  // The host's admin sees none of it: no stream, copy, import or query of
  // the hosted run is listed, read, subscribed to or queried on beta.
  const BrokerProcess& b = beta_->process();
  const std::string streams = b.request("GET", "/v1/streams?internal=true", {}, kAdminToken).body;
  EXPECT_EQ(streams.find("hosted-"), std::string::npos) << streams;
  EXPECT_EQ(streams.find("acme/"), std::string::npos) << streams;
  const std::string imports = b.request("GET", "/v1/imports", {}, kAdminToken).body;
  EXPECT_EQ(imports.find("acme/cut"), std::string::npos) << imports;
  EXPECT_EQ(b.request("GET", "/v1/queries", {}, kAdminToken).body.find("cut"), std::string::npos);
  EXPECT_EQ(b.request("GET", "/v1/imports/acme/cut--keep_0", {}, kAdminToken).status, 404u);
  // The host's stream of the fragment's output, as acme reads it.
  const std::string acme_imports = acme(2).process().request("GET", "/v1/imports", {}, kReaderToken).body;
  const size_t at = acme_imports.find("beta/hosted-");
  ASSERT_NE(at, std::string::npos) << acme_imports;
  const std::string output = acme_imports.substr(at + 5, acme_imports.find('"', at) - at - 5);
  EXPECT_EQ(streams.find(output), std::string::npos) << streams;
  EXPECT_EQ(b.request("GET", "/v1/streams/" + output, {}, kAdminToken).status, 404u) << output;
  EXPECT_EQ(b.request("POST", "/v1/streams/" + output + "/tuples", R"([{"auction":1}])", kAdminToken).status, 404u)
      << output;
  const ReadResult subscribed = read_stream(b, output, 1, 1, 2000);
  EXPECT_TRUE(subscribed.tuples.empty()) << "beta's admin read the hosted output";
  EXPECT_FALSE(subscribed.error.empty()) << "the subscription was not refused";
  EXPECT_EQ(b.request("DELETE", "/v1/streams/" + output, {}, kAdminToken).status, 404u) << output;
  auto spy = b.request("POST", "/v1/queries",
                       R"({"name":"spy","inputs":[{"name":"in","stream":"acme/cut--keep_0","schema":)" +
                           std::string(kCutBidSchema) + R"(}],"boxes":[],"arcs":[],)"
                           R"("outputs":[{"name":"spied","from":"in"}]})",
                       kAdminToken);
  EXPECT_EQ(spy.status, 400u) << spy.body;

  // The contract revoked: acme takes the fragment back, from the host's
  // last results, and it runs on acme/n2 again.
  auto revoked = act(acme(2), ample, "revoke", R"({"version":3,"reason":"audit"})");
  ASSERT_EQ(revoked.status, 200u) << revoked.body;
  // Revoked with the terms' 60 s of notice: both sides show when it ends
  // for the run, and acme takes the fragment back at once all the same.
  const ContractView on_acme = get_contract(acme(2), ample);
  EXPECT_NE(on_acme.body.find(R"("notice_until":")"), std::string::npos) << on_acme.body;
  const ContractView on_beta = wait_version(*beta_, ample, 4);
  EXPECT_FALSE(on_beta.in_force) << on_beta.body;
  EXPECT_NE(on_beta.body.find(R"("notice_until":")"), std::string::npos) << on_beta.body;
  ASSERT_NO_FATAL_FAILURE(expect_back("after the revocation"));
  const std::string m2 = acme(2).process().request("GET", "/metrics", {}, kReaderToken).body;
  EXPECT_NE(m2.find("entente_fragment_hosted_moves_total{direction=\"back\"} 1"), std::string::npos) << m2;
  std::this_thread::sleep_for(1s);  // bids flow through b on acme/n2 again

  feeder.stop();
  ASSERT_NO_FATAL_FAILURE(expect_output_exact(feeder));
}

// kill -9 of the host while it runs the fragment: acme sees the link down,
// takes the fragment back after 3 s from what the host's results it holds,
// and the output is still the whole query's, row for row. (Moved without
// a standby: the state goes in the pause, the path a move falls back to.)
TEST_F(ClusterHosting, AHostKilledWhileRunningAFragmentGivesItBackWithNothingLostOrRepeated) {
  Feeder feeder(acme(1).process(), "bids", bid_row, 500, 5ms);
  ASSERT_NO_FATAL_FAILURE(host_while_fed(feeder, kCutCountOptions, /*join=*/false, /*warm=*/false));
  std::this_thread::sleep_for(1500ms);  // results flow back
  beta_->process().kill();
  ASSERT_NO_FATAL_FAILURE(expect_back("after its host died"));
  std::this_thread::sleep_for(1s);
  feeder.stop();
  ASSERT_NO_FATAL_FAILURE(expect_output_exact(feeder));
}

// kill -9 of the host in the middle of a move: while its standby is being
// built or warms, or as it takes over. The move either fails (503: the
// fragment runs in acme, nothing moved, or again after a stop) or
// completes and acme takes the fragment back once the link is down;
// either way the output is the whole query's, row for row.
TEST_F(ClusterHosting, AHostKilledDuringTheMoveLeavesTheOutputExact) {
  Feeder feeder(acme(1).process(), "bids", bid_row, 500, 5ms);
  ASSERT_NO_FATAL_FAILURE(deploy());
  feeder.start();
  ASSERT_FALSE(agree(hosting_terms(R"(["aggregate","map"])", 1'000'000, 5, seconds_from_now(3600))).empty());
  ASSERT_TRUE(eventually(30.0, [&] { return fragment("b").cpu_ms_per_s > 0; }));
  auto moving = std::async(std::launch::async, [&] { return move(2, R"({"node":"beta/n1"})"); });
  // The standby's copies are being opened or warm by now (the move takes
  // about 100 ms to 1 s here, most of it warming).
  std::this_thread::sleep_for(40ms);
  beta_->process().kill();
  const http::ClientResponse moved = moving.get();
  std::printf("the move with its host killed: %u %s\n", moved.status, moved.body.c_str());
  EXPECT_TRUE(moved.status == 200u || moved.status == 503u || moved.status == 409u) << moved.body;
  ASSERT_NO_FATAL_FAILURE(expect_back("after its host died during the move"));
  std::this_thread::sleep_for(1s);
  feeder.stop();
  ASSERT_NO_FATAL_FAILURE(expect_output_exact(feeder));
}

// The links between acme and beta through a TCP proxy (ClusterHosting
// with proxied_).
class ClusterHostingCut : public ClusterHosting {
 protected:
  ClusterHostingCut() { proxied_ = true; }
};

// The links between acme and beta cut at several points of a move (while
// the host's standby is built, once it is warm, as it takes over, after
// the move) and kept down for 5 s: each move either rolls back (the fragment runs in
// acme, nothing moved) or completes and acme takes the fragment back once
// the link is down for 3 s. The host keeps the runs acme gave up while the
// link was down; the next move ends them there first, so a move after the
// link is back is admitted and warm. The output is the whole query's, row
// for row.
TEST_F(ClusterHostingCut, ALinkCutAtAnyStepOfAMoveToAnotherDomainCompletesOrRollsBackAndTheOutputStaysExact) {
  Feeder feeder(acme(1).process(), "bids", bid_row, 500, 5ms);
  ASSERT_NO_FATAL_FAILURE(deploy());
  feeder.start();
  const std::string id = agree(hosting_terms(R"(["aggregate","map"])", 1'000'000, 5, seconds_from_now(3600)));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(eventually(30.0, [&] { return fragment("b").cpu_ms_per_s > 0; }));
  auto warm_lines = [&] {
    const std::string log = beta_->process().stderr_text();
    size_t n = 0;
    for (size_t at = log.find(" is warm: "); at != std::string::npos; at = log.find(" is warm: ", at + 1)) ++n;
    return n;
  };
  for (const std::string when : {"30 ms in", "as the standby is warm", "25 ms after the standby is warm", "600 ms in"}) {
    const size_t warm_before = warm_lines();
    const auto t0 = std::chrono::steady_clock::now();
    auto moving = std::async(std::launch::async, [&] { return move(2, R"({"node":"beta/n1"})"); });
    if (when == "30 ms in") {
      std::this_thread::sleep_for(30ms);
    } else if (when == "600 ms in") {
      std::this_thread::sleep_for(600ms);
    } else {
      // Between hosting.warm and hosting.run: the owner asks every 20 ms.
      while (warm_lines() == warm_before && std::chrono::steady_clock::now() - t0 < 20s)
        std::this_thread::sleep_for(1ms);
      // Later: the owner has seen it warm, stopped the fragment and asks
      // the host to run it (or has its answer).
      if (when != "as the standby is warm") std::this_thread::sleep_for(25ms);
    }
    cut_beta();
    const auto cut_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::this_thread::sleep_for(5s);
    heal_beta();
    const http::ClientResponse moved = moving.get();
    std::printf("the move with the link cut %s (%.0f ms): %u %s\n", when.c_str(), cut_ms, moved.status,
                moved.body.c_str());
    EXPECT_TRUE(moved.status == 200u || moved.status == 503u || moved.status == 409u) << moved.body;
    ASSERT_NO_FATAL_FAILURE(expect_back("after the link cut " + when));
    ASSERT_NO_FATAL_FAILURE(wait_linked(acme(2), *beta_));
  }
  ASSERT_NO_FATAL_FAILURE(move_to_beta(id));
  ASSERT_NO_FATAL_FAILURE(revoke_while_hosted(feeder));
}

// NEXMark q5's shape (per sliding window, the auctions with the most
// bids), its ranking fragment moved to beta mid-stream and taken back when
// the contract is revoked: the output is the whole query's, row for row.
TEST_F(ClusterHosting, AFragmentRankingHotAuctionsHostedAndTakenBackOnRevocationKeepsTheOutputExact) {
  Feeder feeder(acme(1).process(), "bids", bid_row, 500, 5ms);
  ASSERT_NO_FATAL_FAILURE(host_while_fed(feeder, kCutHotOptions));
  ASSERT_NO_FATAL_FAILURE(revoke_while_hosted(feeder));
}

// NEXMark q8's shape (a tumbling-window join of two projections of the
// bids), its filters, maps and join hosted in beta mid-stream and taken
// back on revocation: the pairs are the whole query's, row for row.
TEST_F(ClusterHosting, AJoinFragmentHostedAndTakenBackOnRevocationKeepsTheOutputExact) {
  Feeder feeder(acme(1).process(), "bids", bid_row, 100, 5ms);
  ASSERT_NO_FATAL_FAILURE(host_while_fed(feeder, kCutCountOptions, /*join=*/true));
  ASSERT_NO_FATAL_FAILURE(revoke_while_hosted(feeder));
}

// (The two above.) Fragment b hosted by beta/n1 works there, then acme
// revokes the contract and takes it back; the output is exact.
void ClusterHosting::revoke_while_hosted(Feeder& feeder) {
  ASSERT_TRUE(eventually(20.0, [&] { return fragment("b").hosted_by == "beta/n1"; }));
  std::this_thread::sleep_for(1500ms);  // it works on beta, its results flow back
  const std::string contracts = acme(2).process().request("GET", "/v1/contracts", {}, kReaderToken).body;
  const size_t at = contracts.find(R"("id":")");
  ASSERT_NE(at, std::string::npos) << contracts;
  const std::string id = contracts.substr(at + 6, contracts.find('"', at + 6) - at - 6);
  auto revoked = act(acme(2), id, "revoke", R"({"version":3,"reason":"audit"})");
  ASSERT_EQ(revoked.status, 200u) << revoked.body;
  ASSERT_NO_FATAL_FAILURE(expect_back("after the revocation"));
  std::this_thread::sleep_for(1s);
  feeder.stop();
  ASSERT_NO_FATAL_FAILURE(expect_output_exact(feeder));
}

// kill -9 of the owner's node that relays the hosted fragment's results
// (acme/n2), restarted at once: acme takes the fragment back (n2 knows it
// was hosted from the query's entry), the host's run ends, and the output
// is still the whole query's, row for row.
TEST_F(ClusterHosting, TheOwnersNodeKilledWhileItsFragmentIsHostedTakesItBackWithNothingLostOrRepeated) {
  Feeder feeder(acme(1).process(), "bids", bid_row, 500, 5ms);
  ASSERT_NO_FATAL_FAILURE(host_while_fed(feeder));
  std::this_thread::sleep_for(1500ms);
  ASSERT_TRUE(acme(2).process().restart_after_kill()) << acme(2).process().last_error();
  ASSERT_NO_FATAL_FAILURE(expect_back("after acme/n2 restarted"));
  // The host's run ended.
  EXPECT_TRUE(eventually(20.0, [&] {
    return beta_->process().stderr_text().find("hosted run acme/cut--b ended") != std::string::npos;
  })) << beta_->process().stderr_text();
  std::this_thread::sleep_for(1s);
  feeder.stop();
  ASSERT_NO_FATAL_FAILURE(expect_output_exact(feeder));
}

// Hosting above the contract's maximum load: admitted while the fragment
// is idle (1 CPU ms/s asked, the maximum), then bids make it work harder
// on the host than the contract allows, and acme takes it back.
TEST_F(ClusterHosting, AFragmentWhoseLoadOnTheHostExceedsTheContractsMaximumIsTakenBack) {
  ASSERT_NO_FATAL_FAILURE(deploy());
  const std::string tight = agree(hosting_terms(R"(["aggregate","map"])", 1, 5, seconds_from_now(3600)));
  ASSERT_NO_FATAL_FAILURE(move_to_beta(tight));
  Feeder feeder(acme(1).process(), "bids", bid_row, 2000, 2ms);
  feeder.start();
  ASSERT_NO_FATAL_FAILURE(expect_back("for its load"));
  EXPECT_NE(acme(2).process().stderr_text().find("exceeds contract " + tight + "'s maximum 1 CPU ms/s"),
            std::string::npos)
      << acme(2).process().stderr_text();
  feeder.stop();
  ASSERT_NO_FATAL_FAILURE(expect_output_exact(feeder));
}

}  // namespace
}  // namespace entente::testing
