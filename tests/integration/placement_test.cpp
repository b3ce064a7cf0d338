// A query's "placement" checked by a real broker process before anything is
// deployed (docs/cluster.md, docs/query-networks.md "Cutting a query into
// fragments"): an unknown node or box, a box in two fragments, a fragment
// whose boxes are not connected, a cycle between fragments: 400 with every
// problem and its path, and no query, no output stream afterwards.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"

namespace entente::testing {
namespace {

const char* kSchema = R"([{"name":"auction","type":"int64"},{"name":"price","type":"int64"}])";

// bids → f1 (filter) → m1 (map) → a1 (aggregate) → out.
std::string chain(const std::string& placement) {
  return R"({"name":"chain","inputs":[{"name":"bids","schema":)" + std::string(kSchema) +
         R"(}],"boxes":[)"
         R"({"id":"f1","type":"filter","options":{"predicates":["price > 10"],"drop_unmatched":true}},)"
         R"({"id":"m1","type":"map","options":{"fields":[{"name":"auction","expr":"auction"},)"
         R"({"name":"cents","expr":"price * 100"}]}},)"
         R"({"id":"a1","type":"aggregate","options":{"group_by":["auction"],)"
         R"("window":{"type":"tumbling","size":"10s"},"aggregates":[{"fn":"count"}]}}],)"
         R"("arcs":[{"from":"bids","to":"f1"},{"from":"f1","to":"m1"},{"from":"m1","to":"a1"}],)"
         R"("outputs":[{"name":"out","from":"a1"}],"placement":)" +
         placement + "}";
}

// The paths of a 400's errors.
std::multiset<std::string> error_paths(const http::ClientResponse& r) {
  std::multiset<std::string> out;
  rapidjson::Document d;
  d.Parse(r.body.c_str());
  if (!d.IsObject() || !d.HasMember("errors")) return out;
  for (const auto& e : d["errors"].GetArray()) out.insert(e["path"].GetString());
  return out;
}

class Placement : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(broker_.start()) << broker_.last_error();
    ASSERT_EQ(broker_.request("POST", "/v1/streams", R"({"name":"bids","schema":)" + std::string(kSchema) + "}")
                  .status,
              201u);
  }
  void expect_nothing_deployed() {
    EXPECT_EQ(broker_.request("GET", "/v1/queries", {}, kReaderToken).body, R"({"queries":[]})");
    EXPECT_EQ(broker_.request("GET", "/v1/streams/out", {}, kReaderToken).status, 404u);
  }
  BrokerProcess broker_;
};

TEST_F(Placement, UnknownNodeUnknownBoxAndABoxInTwoFragmentsAreAllReported) {
  auto r = broker_.request(
      "POST", "/v1/queries",
      chain(R"({"fragments":[{"name":"x","node":"n9","boxes":["f1","nope"]},)"
            R"({"name":"y","node":"n1","boxes":["f1","m1","a1"]}]})"));
  ASSERT_EQ(r.status, 400u) << r.body;
  const auto paths = error_paths(r);
  EXPECT_EQ(paths.count("$.placement.fragments[0].node"), 1u) << r.body;
  EXPECT_EQ(paths.count("$.placement.fragments[0].boxes[1]"), 1u) << r.body;
  EXPECT_EQ(paths.count("$.placement.fragments[1].boxes[0]"), 1u) << r.body;
  EXPECT_NE(r.body.find("n9 is not a node of this domain (its nodes: n1)"), std::string::npos) << r.body;
  expect_nothing_deployed();
}

TEST_F(Placement, AFragmentNotConnectedAndACycleBetweenFragmentsAreReported) {
  // a = {f1, a1} is not connected (m1 is between them), and a → b → a.
  auto r = broker_.request("POST", "/v1/queries",
                           chain(R"({"fragments":[{"name":"a","node":"n1","boxes":["f1","a1"]},)"
                                 R"({"name":"b","node":"n1","boxes":["m1"]}]})"));
  ASSERT_EQ(r.status, 400u) << r.body;
  const auto paths = error_paths(r);
  EXPECT_GE(paths.size(), 2u) << r.body;
  EXPECT_NE(r.body.find("connected"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("cycle"), std::string::npos) << r.body;
  expect_nothing_deployed();
}

TEST_F(Placement, ABoxInNoFragmentIsReported) {
  auto r = broker_.request("POST", "/v1/queries",
                           chain(R"({"fragments":[{"name":"a","node":"n1","boxes":["f1","m1"]}]})"));
  ASSERT_EQ(r.status, 400u) << r.body;
  EXPECT_NE(r.body.find("a1"), std::string::npos) << r.body;
  expect_nothing_deployed();
}

TEST_F(Placement, AValidCutOnThisNodeDeploysTheQuery) {
  auto r = broker_.request("POST", "/v1/queries",
                           chain(R"({"fragments":[{"name":"a","node":"n1","boxes":["f1","m1"]},)"
                                 R"({"name":"b","node":"n1","boxes":["a1"]}]})"));
  ASSERT_EQ(r.status, 201u) << r.body;
  EXPECT_EQ(broker_.request("GET", "/v1/streams/out", {}, kReaderToken).status, 200u);
}

TEST_F(Placement, AMalformedPlacementIsRefused) {
  auto r = broker_.request("POST", "/v1/queries", chain(R"({"where":"n1"})"));
  EXPECT_EQ(r.status, 400u) << r.body;
  EXPECT_NE(r.body.find("$.placement: expected"), std::string::npos) << r.body;
  auto other = broker_.request("POST", "/v1/queries", chain(R"({"node":"n2"})"));
  EXPECT_EQ(other.status, 400u) << other.body;
  EXPECT_NE(other.body.find("$.placement.node: domain acme is one node, n1"), std::string::npos) << other.body;
  expect_nothing_deployed();
}

}  // namespace
}  // namespace entente::testing
