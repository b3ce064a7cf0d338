// A fragment that reads another domain's stream fails over (docs/cluster.md,
// "Failover of a query's fragments", "What survives what"): the node that
// takes it over imports that stream itself and runs the fragment from its
// replicated checkpoint and journal, so the other domain sees nothing but
// a pause.
//
// beta: one node owning `src` (bids with an event time), exporting it to
// acme; beta also runs the query whole on `src`: the fault-free reference.
// acme: three nodes and one etcd (leases of 2 s); the query is cut in two
// fragments: `c` (a filter, a map and a tumbling count per auction: the
// stateful part) on n3 reading the imported beta/src, and `d` (a filter on
// the counts) on n2 writing the output. n3 is killed with SIGKILL
// mid-stream while the test keeps publishing to beta (named batches, each
// sent until acknowledged); at the end (a marker that closes every window)
// the cut query's output, read through a node that lived, must be the whole
// one row for row (values, event times, sequence numbers 1..N: no gap, no
// repeat), its counts adding up to every tuple published. n3 stays down, or
// comes back after the takeover; and with a tight retention on beta, which
// trims what the fragment's checkpoint still needs, the fragment must be
// reported lost (why, in GET /v1/queries/cut and once in the log), not run
// with a gap. Real processes: etcd, four brokers with certificates from
// `entente certs`, real TLS peer links between the domains.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/cluster.h"
#include "tests/integration/support/cut_query.h"
#include "tests/integration/support/federation.h"
#include "tests/integration/support/ws_reader.h"
#include "tests/support/etcd_process.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kBatches = 120;
constexpr int kRowsPerBatch = 20;
constexpr int kAuctions = 7;

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  return d;
}

// Batch b (support/cut_query.h); b = 0: the end marker, which closes every
// window.
std::string batch(int b) { return cut_bid_batch(b, kBatches, kRowsPerBatch, kAuctions); }

// The query, reading `stream`, writing `output`: bids → keep (filter) →
// cents (map) → counts (1 s tumbling count per auction) → some (a filter
// that keeps every count), so that the stateful boxes and the read of the
// input can be one fragment with another after it.
std::string import_count_query(const std::string& name, const std::string& stream, const std::string& output,
                               const std::string& placement) {
  return R"({"name":")" + name + R"(","inputs":[{"name":"bids","stream":")" + stream +
         R"(","event_time":"date_time","schema":)" + std::string(kCutBidSchema) +
         R"(}],"boxes":[)"
         R"({"id":"keep","type":"filter","options":{"predicates":["price >= 0"],"drop_unmatched":true}},)"
         R"({"id":"cents","type":"map","options":{"fields":[{"name":"auction","expr":"auction"},)"
         R"({"name":"cents","expr":"price * 100"}]}},)"
         R"({"id":"counts","type":"aggregate","options":{"group_by":["auction"],)"
         R"("window":{"type":"tumbling","size":"1s"},"aggregates":[{"fn":"count","as":"n"}]}},)"
         R"({"id":"some","type":"filter","options":{"predicates":["n >= 1"],"drop_unmatched":true}}],)"
         R"("arcs":[{"from":"bids","to":"keep"},{"from":"keep","to":"cents"},{"from":"cents","to":"counts"},)"
         R"({"from":"counts","to":"some"}],)"
         R"("outputs":[{"name":")" +
         output + R"(","from":"some"}])" + (placement.empty() ? std::string() : R"(,"placement":)" + placement) +
         "}";
}

class ClusterImportFailover : public ::testing::Test {
 protected:
  // `beta_config`: extra top-level members of beta's configuration, e.g.
  // a tight retention; `checkpoint_interval`: acme's.
  void start(const std::string& beta_config = {}, const std::string& checkpoint_interval = "200ms") {
    if (EtcdProcess::binary().empty()) GTEST_SKIP() << EtcdProcess::kNotInstalled;
    etcd_ = std::make_unique<EtcdProcess>("etcd-import-failover");
    ASSERT_TRUE(etcd_->start()) << etcd_->last_error();
    beta_ = &fed_.add("beta", "n1");
    beta_->exports("src", {"acme"});
    if (!beta_config.empty()) beta_->config_extra(beta_config);
    for (int i = 0; i < 3; ++i) {
      FedNode& n = fed_.add("acme", "n" + std::to_string(i + 1));
      // Every node of acme dials beta (any of them may import src); beta
      // knows them by name and dials none.
      n.pins(*beta_);
      beta_->pins(n, "", n.ca_file());
      n.config_extra(R"("checkpoint_interval": ")" + checkpoint_interval + R"(", )" + cluster_section(*etcd_));
      acme_[i] = &n;
    }
    ASSERT_TRUE(fed_.start_all()) << fed_.last_error();
    ASSERT_TRUE(eventually(30.0, [&] { return domain_up(acme_processes(), 3); }))
        << "acme's nodes do not all see each other up";
    for (FedNode* n : acme_) ASSERT_NO_FATAL_FAILURE(wait_linked(*n, *beta_));
  }

  BrokerProcess& acme(int i) { return acme_.at(static_cast<size_t>(i - 1))->process(); }
  BrokerProcess& beta() { return beta_->process(); }
  std::vector<const BrokerProcess*> acme_processes() const {
    std::vector<const BrokerProcess*> out;
    for (const FedNode* n : acme_) out.push_back(&n->process());
    return out;
  }

  // beta's src and the reference query on it; acme's query cut in two, the
  // fragment reading beta/src (c) on n3.
  void deploy() {
    auto created = beta().request("POST", "/v1/streams",
                                  R"({"name":"src","event_time":"date_time","schema":)" + std::string(kCutBidSchema) +
                                      "}");
    ASSERT_EQ(created.status, 201u) << created.body;
    auto whole = beta().request("POST", "/v1/queries", import_count_query("whole", "src", "counts-whole", ""));
    ASSERT_EQ(whole.status, 201u) << whole.body;
    auto cut = post_slow(*acme_[1], "/v1/queries",
                         import_count_query("cut", "beta/src", "counts-cut",
                                            R"({"fragments":[{"name":"c","node":"n3","boxes":["keep","cents","counts"]},)"
                                            R"({"name":"d","node":"n2","boxes":["some"]}]})"));
    ASSERT_EQ(cut.status, 201u) << cut.body;
    // n3 imports beta/src for its fragment.
    ImportView v = get_import(acme(3), "beta/src");
    ASSERT_EQ(v.status, 200u) << v.body;
  }

  // Batch b (0: the end marker) to beta's src, named, until acknowledged.
  void publish(int b) {
    const std::string problem =
        post_through_any({&beta()}, 0,
                         "/v1/streams/src/tuples?producer_id=p&producer_seq=" + std::to_string(b == 0 ? kBatches + 1 : b),
                         batch(b));
    if (!problem.empty()) FAIL() << "batch " << b << ": " << problem;
  }

  // GET /v1/queries/cut through acme node `via`, parsed (not an object
  // when it did not answer 200).
  rapidjson::Document cut_query(int via) {
    auto r = acme(via).try_request("GET", "/v1/queries/cut", {}, kReaderToken);
    if (!r.ok() || r->status != 200) return {};
    return parse(r->body);
  }

  // Where GET /v1/queries/cut through acme node `via` places fragment `name`.
  std::string fragment_node(int via, const std::string& name) {
    auto d = cut_query(via);
    if (!d.IsObject() || !d.HasMember("fragments")) return {};
    for (const auto& f : d["fragments"].GetArray())
      if (name == f["name"].GetString()) return f["node"].GetString();
    return {};
  }

  // Kills n3 once the cut query has written output (state in the windows),
  // keeps publishing, then waits until fragment c runs on n1 or n2, which
  // it returns (its node's number), checking the move in the query's entry
  // and that the new node imports beta/src.
  int kill_n3_and_wait_for_the_takeover(int from_batch, int to_batch) {
    ([&] {
      ASSERT_TRUE(eventually(60s, [&] { return next_seq(acme(2), "counts-cut") > 1; }))
          << "no output from the cut query before the kill\n" << acme(3).stderr_text();
    })();
    if (HasFatalFailure()) return 0;
    out_at_kill_ = next_seq(acme(2), "counts-cut");
    acme_[2]->process().kill();
    killed_ms_ = wall_ms();
    for (int b = from_batch; b <= to_batch; ++b) {
      publish(b);
      if (HasFatalFailure()) return 0;
    }
    std::string moved_to;
    ([&] {
      ASSERT_TRUE(eventually(60s, [&] {
        moved_to = fragment_node(1, "c");
        return moved_to == "n1" || moved_to == "n2";
      })) << "fragment c is still placed on " << moved_to;
    })();
    if (HasFatalFailure()) return 0;
    const int to = moved_to == "n1" ? 1 : 2;
    auto d = cut_query(to);
    EXPECT_TRUE(d.IsObject() && d.HasMember("moves") && d["moves"].IsArray() && d["moves"].Size() >= 1);
    if (d.IsObject() && d.HasMember("moves") && d["moves"].IsArray() && d["moves"].Size() >= 1) {
      EXPECT_STREQ(d["moves"][0]["fragment"].GetString(), "c");
      EXPECT_STREQ(d["moves"][0]["from"].GetString(), "n3");
      EXPECT_EQ(d["moves"][0]["to"].GetString(), moved_to);
      std::printf("fragment c taken over by %s %lld ms after the kill of n3\n", moved_to.c_str(),
                  static_cast<long long>(d["moves"][0]["at_ms"].GetInt64() - killed_ms_));
    }
    // The new node reads beta/src from beta itself.
    ImportView v;
    EXPECT_TRUE(eventually(30s, [&] {
      v = get_import(acme(to), "beta/src");
      return v.status == 200 && v.state == "active";
    })) << "the import of beta/src on " << moved_to << ": " << v.status << " " << v.body;
    return to;
  }

  // The output grows again after the kill: fragment d, on n2, reads c's
  // output from c's new node. The read is redirected there at once; if
  // that node's copy of the catalog still names n3 for a moment, it is
  // asked again shortly, not after waiting 10 s for the link to n3.
  void expect_output_resumes() {
    ASSERT_TRUE(eventually(60s, [&] { return next_seq(acme(2), "counts-cut") > out_at_kill_; }))
        << "the output did not grow after the kill";
    std::printf("the output grew again %lld ms after the kill of n3\n",
                static_cast<long long>(wall_ms() - killed_ms_));
    const std::string log = acme(2).stderr_text();
    EXPECT_EQ(log.find("was not reached in"), std::string::npos) << log;
  }

  // The cut query's output through acme node `via` is the whole query's
  // on beta row for row, and the counts add up to every tuple published.
  void expect_exact_output(int via) {
    int64_t total = 0;
    ASSERT_NO_FATAL_FAILURE(expect_cut_output_equals_whole(beta(), acme(via), 1, 90s, total));
    EXPECT_EQ(total, int64_t{kBatches} * kRowsPerBatch) << "the counts do not add up to every tuple published";
    auto d = cut_query(via);
    ASSERT_TRUE(d.IsObject());
    EXPECT_STREQ(d["state"].GetString(), "running");
  }

  Federation fed_;
  std::unique_ptr<EtcdProcess> etcd_;
  FedNode* beta_ = nullptr;
  std::array<FedNode*, 3> acme_{};
  uint64_t out_at_kill_ = 0;  // next_seq of counts-cut when n3 was killed
  int64_t killed_ms_ = 0;     // wall clock
};

// n3 dies for good mid-stream: the fragment reading beta/src runs on
// another node of acme, which imports beta/src and recovers the windows
// from the replicated checkpoint and journal.
TEST_F(ClusterImportFailover, AFragmentReadingAnotherDomainsStreamRunsOnAnotherNodeWhenItsNodeDies) {
  ASSERT_NO_FATAL_FAILURE(start());
  ASSERT_NO_FATAL_FAILURE(deploy());
  for (int b = 1; b < 60; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));
  int to = 0;
  ASSERT_NO_FATAL_FAILURE(to = kill_n3_and_wait_for_the_takeover(60, kBatches));
  ASSERT_NO_FATAL_FAILURE(expect_output_resumes());
  ASSERT_NO_FATAL_FAILURE(publish(0));
  ASSERT_NO_FATAL_FAILURE(expect_exact_output(to));
  // And through the other node that lived.
  ASSERT_NO_FATAL_FAILURE(expect_exact_output(to == 1 ? 2 : 1));
}

// n3 comes back after the takeover: it removes its own run of the
// fragment, the fragment stays where it moved, and the output stays exact
// while the test publishes on.
TEST_F(ClusterImportFailover, TheDeadNodeComingBackAfterTheTakeoverChangesNothingInTheOutput) {
  ASSERT_NO_FATAL_FAILURE(start());
  ASSERT_NO_FATAL_FAILURE(deploy());
  for (int b = 1; b < 50; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));
  int to = 0;
  ASSERT_NO_FATAL_FAILURE(to = kill_n3_and_wait_for_the_takeover(50, 80));
  ASSERT_NO_FATAL_FAILURE(expect_output_resumes());
  ASSERT_TRUE(acme_[2]->start()) << acme_[2]->last_error();
  ASSERT_TRUE(eventually(30s, [&] {
    auto r = acme(3).try_request("GET", "/v1/queries/cut/fragments/c", {}, kReaderToken);
    return r.ok() && r->status == 404;
  })) << "n3 still runs its own fragment c";
  for (int b = 81; b <= kBatches; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));
  ASSERT_NO_FATAL_FAILURE(publish(0));
  EXPECT_EQ(fragment_node(3, "c"), to == 1 ? "n1" : "n2");
  ASSERT_NO_FATAL_FAILURE(expect_exact_output(to));
  ASSERT_NO_FATAL_FAILURE(expect_exact_output(3));
}

// What the fragment needs is gone: beta keeps 200 tuples of src (what
// acme acknowledged no longer pins it: n3 acknowledged everything its
// mirror stored), and acme checkpoints once an hour, so the fragment's
// checkpoint and journal start at tuple 1 of beta/src. The node taking the
// fragment over imports beta/src from the oldest tuple beta keeps: it
// cannot run the fragment from its state. That is a clear error, logged
// and shown by GET /v1/queries/cut, not a silent gap, and the node does
// not try again at every tick.
TEST_F(ClusterImportFailover, AFragmentWhoseInputTheOwnerTrimmedIsReportedLostNotRunWithAGap) {
  ASSERT_NO_FATAL_FAILURE(
      start(R"("retention": {"max_tuples": 200}, "retention_check_interval": "100ms")", "1h"));
  ASSERT_NO_FATAL_FAILURE(deploy());
  for (int b = 1; b < 60; ++b) ASSERT_NO_FATAL_FAILURE(publish(b));
  // beta trimmed src: the fragment's state needs tuple 1, gone.
  uint64_t first = 0;
  ASSERT_TRUE(eventually(30s, [&] {
    auto r = beta().try_request("GET", "/v1/streams/src", {}, kReaderToken);
    if (!r.ok() || r->status != 200) return false;
    auto d = parse(r->body);
    first = d.IsObject() && d.HasMember("first_seq") ? d["first_seq"].GetUint64() : 0;
    return first > 1;
  })) << "beta never trimmed src";
  int to = 0;
  ASSERT_NO_FATAL_FAILURE(to = kill_n3_and_wait_for_the_takeover(60, 70));
  const std::string node = to == 1 ? "n1" : "n2";

  // GET /v1/queries/cut: degraded, fragment c not running, and why: the
  // stream and the tuple it needs.
  std::string error;
  ASSERT_TRUE(eventually(60s, [&] {
    auto d = cut_query(to == 1 ? 2 : 1);
    if (!d.IsObject() || !d.HasMember("fragments")) return false;
    for (const auto& f : d["fragments"].GetArray())
      if (std::string(f["name"].GetString()) == "c" && f.HasMember("error") && f["error"].IsString())
        error = f["error"].GetString();
    return std::string(d["state"].GetString()) == "degraded" &&
           error.find("is no longer in the log") != std::string::npos;
  })) << "fragment c's error: " << error;
  EXPECT_NE(error.find("stream 'beta/src': tuple 1 "), std::string::npos) << error;
  EXPECT_NE(error.find("delete the query and deploy it again"), std::string::npos) << error;
  // Logged once by the node that took it over, which does not try again.
  std::this_thread::sleep_for(3s);  // several ticks
  const std::string log = acme(to).stderr_text();
  const std::string logged = "fragment cut--c cannot run on " + node + ": ";
  const size_t at = log.find(logged);
  EXPECT_NE(log.find("stream 'beta/src': tuple 1 is no longer in the log", at), std::string::npos) << log;
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_EQ(log.find(logged, at + 1), std::string::npos) << "logged twice:\n" << log;
  EXPECT_EQ(log.find("fragment cut--c is placed on " + node + " but does not run: running it", at), std::string::npos)
      << "run again after it was found lost:\n" << log;
  // And nothing was written past the kill as if nothing were missing.
  const uint64_t out = next_seq(acme(to == 1 ? 2 : 1), "counts-cut");
  std::this_thread::sleep_for(1s);
  EXPECT_EQ(next_seq(acme(to == 1 ? 2 : 1), "counts-cut"), out);
}

}  // namespace
}  // namespace entente::testing
