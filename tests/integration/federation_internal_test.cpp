// A node reading a stream of another node of its own domain over their peer
// link (docs/federation.md, "Reading a stream of another node of the
// domain"), with two real `entente broker` processes of domain acme whose
// certificates `entente certs` made, each listing the other among the
// peers of its own domain; no etcd. acme/n2 reads acme/n1's `bids` into
// "@n1/bids" though n1 exports nothing; kill -9 of n2, then of n1,
// mid-stream; at the end the mirror holds every tuple of n1's stream once,
// under n1's numbers. A node of another domain is refused the stream.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <thread>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/federation.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;

constexpr const char* kMirror = "@n1/bids";
constexpr const char* kMirrorUrl = "%40n1%2Fbids";

int64_t bidder_of(const std::string& line) {
  rapidjson::Document d;
  d.Parse(line.c_str());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember("bidder") || !d["bidder"].IsInt64()) return -1;
  return d["bidder"].GetInt64();
}

// POST /v1/imports {"stream": NAME, "node": NODE}; a 503 (no link up yet)
// is tried again for 20 s.
http::ClientResponse read_of_node(const FedNode& n, const std::string& stream, const std::string& node) {
  const std::string body = R"({"stream":")" + stream + R"(","node":")" + node + R"("})";
  http::ClientResponse r;
  eventually(20s, [&] {
    r = post_slow(n, "/v1/imports", body);
    return r.status != 503 && r.status != 0;
  });
  return r;
}

void feed_more(const Feeder& feeder, uint64_t more, std::chrono::milliseconds timeout = 60s) {
  const uint64_t target = feeder.acked() + more;
  ASSERT_TRUE(eventually(timeout, [&] { return feeder.acked() >= target; }))
      << "the feeder got " << feeder.acked() << " tuples acknowledged, waited for " << target << "; "
      << feeder.failures() << " failed requests";
}

TEST(FederationInternal, ANodeReadsAnotherNodesStreamExactlyAcrossKillNineOfEither) {
  Federation fed;
  FedNode& n1 = fed.add("acme", "n1");
  FedNode& n2 = fed.add("acme", "n2");
  fed.link(n1, n2);  // no export: the nodes of one domain need none
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  ASSERT_NO_FATAL_FAILURE(create_stream(n1, "bids"));
  ASSERT_NO_FATAL_FAILURE(wait_linked(n1, n2));

  auto created = read_of_node(n2, "bids", "n1");
  ASSERT_EQ(created.status, 201u) << created.body;
  ImportView v = get_import(n2.process(), kMirror);
  ASSERT_EQ(v.status, 200u) << v.body;
  EXPECT_EQ(v.stream, kMirror);
  EXPECT_EQ(v.owner, n1.identity());
  EXPECT_NE(v.body.find(R"("node":"n1")"), std::string::npos) << v.body;
  EXPECT_EQ(v.schema, (std::vector<std::string>{"auction", "bidder", "price", "date_time"})) << v.body;

  Feeder feeder(n1.process(), "bids", bid);
  feeder.start();
  ASSERT_NO_FATAL_FAILURE(feed_more(feeder, 2000));

  // The reader dies mid-stream and comes back: it resumes from its mirror.
  n2.process().kill();
  ASSERT_NO_FATAL_FAILURE(feed_more(feeder, 1000));
  ASSERT_TRUE(n2.start()) << n2.last_error();
  v = get_import(n2.process(), kMirror);
  EXPECT_EQ(v.status, 200u) << v.body;
  EXPECT_NE(v.body.find(R"("node":"n1")"), std::string::npos) << v.body;
  const uint64_t before = next_seq(n1.process(), "bids");
  EXPECT_TRUE(eventually(30s, [&] {
    v = get_import(n2.process(), kMirror);
    return v.next_seq > before;
  })) << "n2's read did not resume after its restart: " << v.body;

  // The owner dies mid-stream and comes back.
  ASSERT_NO_FATAL_FAILURE(feed_more(feeder, 1000));
  n1.process().kill();
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(n1.start()) << n1.last_error();
  feeder.retarget(n1.process().port());
  ASSERT_NO_FATAL_FAILURE(feed_more(feeder, 2000));
  feeder.stop();
  ASSERT_GT(feeder.acked_rows().size(), 6000u);

  // The checker: every sequence number of n1's stream once in the mirror,
  // in order, the same tuple; every tuple n1 acknowledged to the feeder is
  // there.
  const uint64_t head = next_seq(n1.process(), "bids") - 1;
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(n2, kMirror, head + 1));
  const ReadResult want = read_stream(n1.process(), "bids", 1, head, 60000);
  const ReadResult got = read_stream(n2.process(), kMirrorUrl, 1, head, 60000);
  ASSERT_EQ(want.tuples.size(), head) << want.error << " " << want.close_reason;
  ASSERT_EQ(got.tuples.size(), head) << "n2 has " << got.tuples.size() << " tuples of " << head << ": " << got.error
                                     << " " << got.close_reason;
  std::set<uint64_t> seen;
  size_t mismatches = 0;
  for (size_t i = 0; i < head; ++i) {
    const bool fresh = seen.insert(got.tuples[i].seq).second;
    if ((!fresh || got.tuples[i].seq != i + 1 || got.tuples[i].line != want.tuples[i].line) && ++mismatches <= 5) {
      ADD_FAILURE() << "position " << i << ": n2 has " << got.tuples[i].line << ", n1 has " << want.tuples[i].line;
    }
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(seen.size(), head);
  size_t missing = 0;
  for (const auto& [seq, row] : feeder.acked_rows()) {
    if ((seq > head || bidder_of(want.tuples[seq - 1].line) != static_cast<int64_t>(row)) && ++missing <= 5) {
      ADD_FAILURE() << "acknowledged seq " << seq << " (row " << row << ") is not in n1's stream as sent";
    }
  }
  EXPECT_EQ(missing, 0u) << "of " << feeder.acked_rows().size() << " acknowledged tuples";
}

TEST(FederationInternal, ANodeOfAnotherDomainIsRefusedAndBadReadsAreExplained) {
  Federation fed;
  FedNode& n1 = fed.add("acme", "n1");
  FedNode& n2 = fed.add("acme", "n2");
  FedNode& beta = fed.add("beta", "n1");
  fed.link(n1, n2);
  fed.link(n1, beta);
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  ASSERT_NO_FATAL_FAILURE(create_stream(n1, "bids"));
  ASSERT_NO_FATAL_FAILURE(wait_linked(n1, beta));

  // beta asks n1 for the stream that n2 may read: no export, no contract.
  auto refused = import_stream(beta, "acme/bids");
  EXPECT_EQ(refused.status, 403u) << refused.body;
  EXPECT_EQ(problem_detail(refused.body),
            "acme refused acme/bids: stream acme/bids is not exported to domain beta (no stream contract covers it)")
      << refused.body;
  // Naming a node of its own domain, beta reaches only its own domain.
  auto own = read_of_node(beta, "bids", "n1");
  EXPECT_EQ(own.status, 400u) << own.body;
  EXPECT_EQ(problem_detail(own.body), "stream bids of node n1 is this node's own; read it as 'bids'") << own.body;

  auto bad = n2.process().request("POST", "/v1/imports", R"({"stream":"bids","node":7})");
  EXPECT_EQ(bad.status, 400u) << bad.body;
  auto domain = n2.process().request("POST", "/v1/imports", R"({"stream":"beta/bids","node":"n1"})");
  EXPECT_EQ(domain.status, 400u) << domain.body;
  EXPECT_EQ(problem_detail(domain.body),
            "'beta/bids' is not the name of a stream of domain acme (NAME, without a domain)")
      << domain.body;

  // n2, of n1's domain, reads it.
  ASSERT_NO_FATAL_FAILURE(wait_linked(n1, n2));
  auto ok = read_of_node(n2, "bids", "n1");
  ASSERT_EQ(ok.status, 201u) << ok.body;
  ASSERT_NO_FATAL_FAILURE(publish(n1, "bids", 0, 500));
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(n2, kMirror, 501));
  auto listed = n2.process().request("GET", "/v1/imports", "", kReaderToken);
  EXPECT_NE(listed.body.find(R"("stream":"@n1/bids")"), std::string::npos) << listed.body;

  // Deleting the read deletes the mirror.
  auto gone = n2.process().request("DELETE", "/v1/imports/@n1/bids");
  EXPECT_EQ(gone.status, 204u) << gone.body;
  EXPECT_EQ(get_import(n2.process(), kMirror).status, 404u);
  EXPECT_EQ(n2.process().request("GET", std::string("/v1/streams/") + kMirrorUrl, "", kReaderToken).status, 404u);
}

}  // namespace
}  // namespace entente::testing
