// The command line's tasks of a domain of several nodes (docs/cli.md):
// `entente queries move|split|merge|stop|start`, `nodes remove` and
// `checkpoint list` against acme, three real broker processes sharing one
// real etcd, with a query cut in three fragments (cut_query.h). Each
// command's answer is the node's, as a person reads it; each refusal exits
// with the code of its status and shows the node's detail.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/integration/support/cli_run.h"
#include "tests/integration/support/cut_query.h"
#include "tests/integration/support/domain.h"
#include "tests/support/temp_dir.h"

namespace entente::testing {
namespace {

class ClusterCli : public ThreeNodeDomain {
 protected:
  ClusterCli() : ThreeNodeDomain("etcd-cli", R"("checkpoint_interval": "200ms", )") {}

  void TearDown() override {
    if (!home_.empty() && !HasFailure()) std::filesystem::remove_all(home_);
  }

  // `entente ARGS` as an admin through node `via`.
  CliRun admin(int via, const std::string& args) {
    if (home_.empty()) home_ = make_temp_dir("cli-cluster");
    return entente(home_, "--url http://127.0.0.1:" + std::to_string(node(via).port()) + " --token " +
                              kAdminToken + " " + args);
  }

  std::string home_;
};

TEST_F(ClusterCli, MoveSplitMergeAndNodesRemoveFromTheCommandLine) {
  ASSERT_EQ(node(2).request("POST", "/v1/streams",
                            R"({"name":"bids","node":"n1","schema":)" + std::string(kCutBidSchema) + "}")
                .status,
            201u);
  auto cut = node(3).request(
      "POST", "/v1/queries",
      cut_count_query("cut", "counts-cut",
                      R"({"fragments":[{"name":"a","node":"n1","boxes":["keep"]},)"
                      R"({"name":"b","node":"n2","boxes":["cents"]},{"name":"c","node":"n3","boxes":["counts"]}]})"));
  ASSERT_EQ(cut.status, 201u) << cut.body;
  for (int b = 1; b <= 10; ++b) {
    ASSERT_EQ(post_through_any(processes(), 0, "/v1/streams/bids/tuples", cut_bid_batch(b, 10, 20, 7)), "");
  }

  CliRun r = admin(1, "queries move cut c --to n2");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "state"), "moved") << r.out;
  EXPECT_EQ(value_of(r.out, "from"), "n3") << r.out;
  EXPECT_EQ(value_of(r.out, "to"), "n2") << r.out;
  r = admin(1, "queries move cut c --to n9");
  EXPECT_EQ(r.code, 1) << what(r);
  EXPECT_TRUE(has(r.err, "n9 is not a node of domain acme")) << r.err;
  r = admin(1, "queries move cut c --to n2");
  EXPECT_EQ(r.code, 5) << what(r);
  EXPECT_TRUE(has(r.err, "runs on n2 already")) << r.err;
  r = admin(1, "queries move cut c");
  EXPECT_EQ(r.code, 2) << what(r);
  EXPECT_TRUE(has(r.err, "needs --to NODE")) << r.err;
  EXPECT_EQ(admin(1, "queries move cut zz --to n1").code, 4);

  r = admin(3, "queries split cut c --nodes n1");
  EXPECT_EQ(r.code, 2) << what(r);
  EXPECT_TRUE(has(r.err, "2 to 16 nodes")) << r.err;
  r = admin(3, "queries split cut c --nodes n1,n3");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "state"), "split") << r.out;
  EXPECT_EQ(value_of(r.out, "keyed_box"), "counts") << r.out;
  r = admin(3, "queries merge cut b");
  EXPECT_NE(r.code, 0) << what(r);
  r = admin(3, "queries merge cut c");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "state"), "merged") << r.out;

  // Stopped and started through any node; a stopped query's fragments
  // stay where they are.
  r = admin(2, "queries stop cut");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "state"), "stopped") << r.out;
  r = admin(1, "queries move cut c --to n1");
  EXPECT_EQ(r.code, 5) << what(r);
  EXPECT_TRUE(has(r.err, "query 'cut' is stopped: moving fragment c waits until it is started")) << r.err;
  r = admin(3, "queries start cut");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(value_of(r.out, "state"), "running") << r.out;

  r = admin(2, "checkpoint list");
  ASSERT_EQ(r.code, 0) << what(r);
  EXPECT_EQ(row_of(r.out, "QUERY"), (Cells{"QUERY", "ID", "BYTES", "DURATION_MS", "TAKEN_AT"})) << r.out;

  // A node that is up is not removed: 409, and the domain keeps three.
  r = admin(1, "nodes remove n2");
  EXPECT_EQ(r.code, 5) << what(r);
  EXPECT_TRUE(has(r.err, "DELETE /v1/nodes/n2: 409")) << r.err;
  EXPECT_EQ(admin(1, "nodes remove nine").code, 4);
  EXPECT_TRUE(all_up());
}

}  // namespace
}  // namespace entente::testing
