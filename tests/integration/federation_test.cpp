// Streams across domains with real `entente broker` processes on loopback
// (docs/federation-spec, issue 4): certificates made by `entente certs`,
// exports and imports, a WebSocket subscriber and a query in the importing
// domain, refusals, and exact delivery across kill -9 of either node and a
// link cut through a TCP proxy.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <arpa/inet.h>

#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/federation.h"
#include "tests/integration/support/ws_reader.h"
#include "tests/support/tcp_proxy.h"

namespace entente::testing {
namespace {

using namespace std::chrono_literals;

int64_t int_field(const std::string& line, const char* key) {
  rapidjson::Document d;
  d.Parse(line.c_str());
  if (d.HasParseError() || !d.IsObject() || !d.HasMember(key) || !d[key].IsInt64()) return -1;
  return d[key].GetInt64();
}

// The exact check: the importer's mirror holds every tuple of the owner's
// stream 1..head once, in order, with the owner's lines; every sequence
// number `feeder` saw acknowledged is there with the row it sent.
void expect_exact_mirror(const FedNode& owner, const std::string& stream, const FedNode& importer,
                         const Feeder* feeder = nullptr) {
  const std::string mirror = owner.domain() + "/" + stream;
  const uint64_t head = next_seq(owner.process(), stream) - 1;
  ASSERT_GT(head, 0u) << "nothing in " << owner.identity() << " " << stream;
  ASSERT_NO_FATAL_FAILURE(wait_caught_up(importer, mirror, head + 1));
  const ReadResult want = read_stream(owner.process(), stream, 1, head, 60000);
  const ReadResult got = read_stream(importer.process(), url_name(mirror), 1, head, 60000);
  ASSERT_EQ(want.tuples.size(), head) << owner.identity() << " subscribe " << stream << " from=1: " << want.error
                                      << " " << want.close_reason;
  ASSERT_EQ(got.tuples.size(), head) << importer.identity() << " subscribe " << mirror << " from=1: got "
                                     << got.tuples.size() << " tuples, last seq "
                                     << (got.tuples.empty() ? 0 : got.tuples.back().seq) << "; " << got.error << " "
                                     << got.close_reason;
  size_t mismatches = 0;
  for (size_t i = 0; i < head && mismatches < 5; ++i) {
    if (got.tuples[i].seq != i + 1 || got.tuples[i].line != want.tuples[i].line) {
      ++mismatches;
      ADD_FAILURE() << "position " << i << ": " << importer.identity() << " has " << got.tuples[i].line << ", "
                    << owner.identity() << " has " << want.tuples[i].line;
    }
  }
  if (!feeder) return;
  size_t missing = 0;
  for (const auto& [seq, row] : feeder->acked_rows()) {
    if (seq > head || int_field(want.tuples[seq - 1].line, "bidder") != static_cast<int64_t>(row)) {
      if (++missing <= 5)
        ADD_FAILURE() << "acknowledged seq " << seq << " (row " << row << ") is "
                      << (seq > head ? std::string("past the head ") + std::to_string(head)
                                     : want.tuples[seq - 1].line);
    }
  }
  EXPECT_EQ(missing, 0u) << "of " << feeder->acked_rows().size() << " acknowledged tuples";
}

// Waits until `feeder` has had `more` tuples acknowledged beyond now.
void feed_more(const Feeder& feeder, uint64_t more, std::chrono::milliseconds timeout = 60s) {
  const uint64_t target = feeder.acked() + more;
  ASSERT_TRUE(eventually(timeout, [&] { return feeder.acked() >= target; }))
      << "the feeder got " << feeder.acked() << " tuples acknowledged, waited for " << target << "; "
      << feeder.failures() << " failed requests";
}

// ------------------------------------------------------------------ a

TEST(Federation, WebSocketSubscriberInBetaReadsAcmeStream) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  fed.link(acme, beta);
  acme.exports("bids", {"beta"});
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "bids"));
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta));

  auto imported = import_stream(beta, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body;
  EXPECT_EQ(schema_names(imported.body), (std::vector<std::string>{"auction", "bidder", "price", "date_time"}))
      << imported.body;
  EXPECT_NE(imported.body.find("\"acme/bids\""), std::string::npos) << imported.body;
  auto again = post_slow(beta, "/v1/imports", R"({"stream":"acme/bids"})");
  EXPECT_EQ(again.status, 409u) << "a second import of acme/bids: " << again.body;

  // Each side shows the other up, with a measured round trip.
  for (const FedNode* n : {&acme, &beta}) {
    const FedNode& other = n == &acme ? beta : acme;
    PeersView v;
    const bool measured = eventually(10s, [&] {
      v = get_peers(n->process());
      const PeerView* p = v.find(other.identity());
      return p && p->state == "up" && p->rtt_us >= 0 && p->last_heartbeat_ms > 0;
    });
    EXPECT_TRUE(measured) << n->identity() << " GET /v1/peers: " << v.body;
    EXPECT_EQ(v.self, n->identity()) << v.body;
    EXPECT_EQ(v.listen, n->federation_address()) << v.body;
  }

  constexpr uint64_t kN = 2000;
  ASSERT_NO_FATAL_FAILURE(publish(acme, "bids", 0, kN));
  const ReadResult got = read_stream(beta.process(), "acme%2Fbids", 1, kN, 30000);
  ASSERT_EQ(got.tuples.size(), kN) << "beta's subscriber: " << got.error << " " << got.close_reason
                                   << "; import: " << get_import(beta.process(), "acme/bids").body;
  const ReadResult want = read_stream(acme.process(), "bids", 1, kN, 30000);
  ASSERT_EQ(want.tuples.size(), kN) << want.error;
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_EQ(got.tuples[i].seq, i + 1) << got.tuples[i].line;
    ASSERT_EQ(got.tuples[i].line, want.tuples[i].line) << "at seq " << i + 1;
    ASSERT_EQ(int_field(got.tuples[i].line, "bidder"), static_cast<int64_t>(i)) << got.tuples[i].line;
  }

  ImportView v;
  EXPECT_TRUE(eventually(10s, [&] {
    v = get_import(beta.process(), "acme/bids");
    return v.acked == kN;
  })) << "beta never acknowledged all " << kN << " tuples as durable: " << v.body;
  EXPECT_EQ(v.state, "active") << v.body;
  EXPECT_EQ(v.owner, acme.identity()) << v.body;
  EXPECT_EQ(v.next_seq, kN + 1) << v.body;
  EXPECT_EQ(v.tuples, kN) << v.body;
  const PeersView pa = get_peers(acme.process());
  const PeersView pb = get_peers(beta.process());
  ASSERT_TRUE(pa.find(beta.identity()) && pb.find(acme.identity())) << pa.body << "\n" << pb.body;
  EXPECT_GE(pa.find(beta.identity())->tuples_out, kN) << pa.body;
  EXPECT_GE(pb.find(acme.identity())->tuples_in, kN) << pb.body;
  EXPECT_GT(pa.find(beta.identity())->bytes_out, 0u) << pa.body;
}

// ------------------------------------------------------------------ b

TEST(Federation, QueryInBetaReadsAcmeStream) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  fed.link(acme, beta);
  acme.exports("bids", {"beta"});
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "bids"));
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta));

  // No import first: deploying imports acme/bids itself.
  const std::string query = std::string(R"({"name":"expensive","inputs":[{"name":"bids","stream":"acme/bids",)") +
                            R"("event_time":"date_time","schema":)" + kBidsSchema + R"(}],)" +
                            R"("boxes":[{"id":"f1","type":"filter",)" +
                            R"("options":{"predicates":["price >= 500"],"drop_unmatched":true}},)" +
                            R"({"id":"m1","type":"map","options":{"fields":[{"name":"bidder","expr":"bidder"},)" +
                            R"({"name":"price","expr":"price"}]}}],)" +
                            R"("arcs":[{"from":"bids","to":"f1"},{"from":"f1","to":"m1"}],)" +
                            R"("outputs":[{"name":"expensive_bids","from":"m1"}]})";
  http::ClientResponse deployed;
  eventually(10s, [&] {
    deployed = post_slow(beta, "/v1/queries", query);
    return deployed.status != 503;
  });
  ASSERT_EQ(deployed.status, 201u) << deployed.body << "\nbeta's stderr:\n" << beta.process().stderr_text();
  const ImportView imp = get_import(beta.process(), "acme/bids");
  EXPECT_EQ(imp.status, 200u) << "the deploy made no import: " << imp.body;

  constexpr uint64_t kN = 3000;
  ASSERT_NO_FATAL_FAILURE(publish(acme, "bids", 0, kN));
  std::vector<uint64_t> expected;
  for (uint64_t i = 0; i < kN; ++i)
    if (price_of(i) >= 500) expected.push_back(i);

  const ReadResult out = read_stream(beta.process(), "expensive_bids", 1, expected.size(), 30000);
  ASSERT_EQ(out.tuples.size(), expected.size())
      << "output on beta: " << out.error << " " << out.close_reason
      << "; query: " << beta.process().request("GET", "/v1/queries/expensive", "", kReaderToken).body;
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(out.tuples[i].seq, i + 1) << out.tuples[i].line;
    ASSERT_EQ(int_field(out.tuples[i].line, "bidder"), static_cast<int64_t>(expected[i])) << out.tuples[i].line;
    ASSERT_EQ(int_field(out.tuples[i].line, "price"), price_of(expected[i])) << out.tuples[i].line;
  }
  const auto status = beta.process().request("GET", "/v1/queries/expensive", "", kReaderToken);
  EXPECT_NE(status.body.find("\"active\""), std::string::npos) << "the query's status shows no active import: "
                                                                 << status.body;
}

// ------------------------------------------------------------------ c

TEST(Federation, ExportsDecideWhatAnotherDomainMayRead) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  FedNode& gamma = fed.add("gamma");
  fed.link(acme, beta);
  fed.link(acme, gamma);
  acme.exports("bids", {"beta"})
      .exports("trades", {"gamma"}, {"auction", "price", "date_time"})
      .exports("later", {"gamma"});
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "bids"));
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "trades"));
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, gamma));

  // bids is exported to beta only.
  auto refused = import_stream(gamma, "acme/bids");
  EXPECT_EQ(refused.status, 403u) << refused.body;
  EXPECT_NE(problem_detail(refused.body).find("not exported"), std::string::npos) << refused.body;

  const std::string query = std::string(R"({"name":"peek","inputs":[{"name":"bids","stream":"acme/bids",)") +
                            R"("event_time":"date_time","schema":)" + kBidsSchema + R"(}],)" +
                            R"("boxes":[{"id":"f1","type":"filter",)" +
                            R"("options":{"predicates":["price > 1"],"drop_unmatched":true}}],)" +
                            R"("arcs":[{"from":"bids","to":"f1"}],"outputs":[{"name":"peeked","from":"f1"}]})";
  auto deploy = post_slow(gamma, "/v1/queries", query);
  EXPECT_EQ(deploy.status, 403u) << deploy.body;
  EXPECT_NE(deploy.body.find("$.inputs[0].stream"), std::string::npos) << deploy.body;
  EXPECT_NE(deploy.body.find("not exported"), std::string::npos) << deploy.body;
  EXPECT_EQ(gamma.process().request("GET", "/v1/queries/peek", "", kReaderToken).status, 404u);
  EXPECT_EQ(gamma.process().request("GET", "/v1/streams/peeked", "", kReaderToken).status, 404u);

  // Exported but not created yet; a domain that is not a peer.
  auto absent = import_stream(gamma, "acme/later");
  EXPECT_EQ(absent.status, 404u) << absent.body;
  auto stranger = import_stream(gamma, "zeta/bids");
  EXPECT_EQ(stranger.status, 404u) << stranger.body;

  // trades goes to gamma without the bidder.
  auto projected = import_stream(gamma, "acme/trades");
  ASSERT_EQ(projected.status, 201u) << projected.body;
  EXPECT_EQ(schema_names(projected.body), (std::vector<std::string>{"auction", "price", "date_time"}))
      << projected.body;
  constexpr uint64_t kN = 300;
  ASSERT_NO_FATAL_FAILURE(publish(acme, "trades", 0, kN));
  const ReadResult got = read_stream(gamma.process(), "acme%2Ftrades", 1, kN, 30000);
  ASSERT_EQ(got.tuples.size(), kN) << got.error << " " << got.close_reason;
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_EQ(got.tuples[i].seq, i + 1) << got.tuples[i].line;
    ASSERT_EQ(got.tuples[i].line.find("bidder"), std::string::npos) << "a field acme does not export: "
                                                                    << got.tuples[i].line;
    ASSERT_EQ(int_field(got.tuples[i].line, "price"), price_of(i)) << got.tuples[i].line;
    ASSERT_EQ(int_field(got.tuples[i].line, "auction"), static_cast<int64_t>(1000 + i % 37)) << got.tuples[i].line;
  }
  const auto mirror = gamma.process().request("GET", "/v1/streams/acme%2Ftrades", "", kReaderToken);
  EXPECT_EQ(schema_names(mirror.body), (std::vector<std::string>{"auction", "price", "date_time"})) << mirror.body;
}

// ------------------------------------------------------------------ d

TEST(Federation, KillEitherSideMidStreamLosesNothingDuplicatesNothing) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  fed.link(acme, beta);
  acme.exports("bids", {"beta"});
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "bids"));
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta));
  auto imported = import_stream(beta, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body;

  Feeder feeder(acme.process(), "bids", bid);
  feeder.start();
  ASSERT_NO_FATAL_FAILURE(feed_more(feeder, 2000));

  // The importer dies mid-stream and comes back.
  beta.process().kill();
  ASSERT_NO_FATAL_FAILURE(feed_more(feeder, 1000));
  ASSERT_TRUE(beta.start()) << beta.last_error();
  // What the mirror held before the crash counts as acknowledged at once.
  ImportView v = get_import(beta.process(), "acme/bids");
  EXPECT_GT(v.acked, 0u) << v.body;
  EXPECT_LT(v.acked, v.next_seq) << v.body;
  const uint64_t before = next_seq(acme.process(), "bids");
  EXPECT_TRUE(eventually(30s, [&] {
    v = get_import(beta.process(), "acme/bids");
    return v.next_seq > before;
  })) << "beta's import did not resume after its restart: " << v.body;

  // The owner dies mid-stream and comes back.
  ASSERT_NO_FATAL_FAILURE(feed_more(feeder, 1000));
  acme.process().kill();
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(acme.start()) << acme.last_error();
  feeder.retarget(acme.process().port());
  ASSERT_NO_FATAL_FAILURE(feed_more(feeder, 2000));
  feeder.stop();

  ASSERT_GT(feeder.acked_rows().size(), 6000u);
  expect_exact_mirror(acme, "bids", beta, &feeder);
}

// ------------------------------------------------------------------ e

TEST(Federation, LinkCutAndRestoredLosesNothingDuplicatesNothing) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  TcpProxy proxy;
  proxy.start(acme.federation_port());
  // Only beta dials, through the proxy: acme knows beta without an address.
  beta.pins(acme, "127.0.0.1:" + std::to_string(proxy.port()), acme.ca_file());
  acme.pins(beta, "", beta.ca_file());
  acme.exports("bids", {"beta"});
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "bids"));
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta));
  auto imported = import_stream(beta, "acme/bids");
  ASSERT_EQ(imported.status, 201u) << imported.body;

  Feeder feeder(acme.process(), "bids", bid);
  feeder.start();
  ASSERT_NO_FATAL_FAILURE(feed_more(feeder, 2000));

  proxy.block(true);
  proxy.cut();
  PeersView seen;
  const bool noticed = eventually(5s, [&] {
    seen = get_peers(beta.process());
    const std::string s = seen.state_of(acme.identity());
    return s == "failed" || s == "down" || s == "connecting";
  });
  EXPECT_TRUE(noticed) << "beta still shows acme up after the cut: " << seen.body;
  std::this_thread::sleep_for(2s);
  seen = get_peers(beta.process());
  EXPECT_NE(seen.state_of(acme.identity()), "up") << "up through a blocked proxy: " << seen.body;
  proxy.block(false);

  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta, 30s));
  ASSERT_NO_FATAL_FAILURE(feed_more(feeder, 1000));
  feeder.stop();
  const PeerView* p = get_peers(beta.process()).find(acme.identity());
  if (p) {
    EXPECT_GE(p->connects, 2u) << "beta's link to acme was never re-established";
  }
  expect_exact_mirror(acme, "bids", beta, &feeder);
}

// ------------------------------------------------------------------ f

TEST(Federation, WrongPinnedCaRefusesThePeer) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  // beta pins a CA named acme that did not sign acme's certificate.
  beta.pins(acme, acme.federation_address(), fed.impostor_ca("acme"));
  acme.pins(beta);
  ASSERT_TRUE(fed.start_all()) << fed.last_error();

  PeersView b;
  EXPECT_TRUE(eventually(10s, [&] {
    b = get_peers(beta.process());
    auto it = b.refusals.find("untrusted_chain");
    return it != b.refusals.end() && it->second >= 1;
  })) << "beta GET /v1/peers: " << b.status << " " << b.body;
  // It never comes up, from either side.
  const auto until = std::chrono::steady_clock::now() + 3s;
  while (std::chrono::steady_clock::now() < until) {
    b = get_peers(beta.process());
    const PeersView a = get_peers(acme.process());
    ASSERT_NE(b.state_of(acme.identity()), "up") << b.body;
    ASSERT_NE(a.state_of(beta.identity()), "up") << a.body;
    std::this_thread::sleep_for(100ms);
  }
  auto r = post_slow(beta, "/v1/imports", R"({"stream":"acme/bids"})");
  EXPECT_EQ(r.status, 503u) << "an import over a refused link: " << r.body;
  EXPECT_TRUE(r.header("retry-after").has_value()) << "a 503 without Retry-After: " << r.body;
}

// Connects to 127.0.0.1:port, writes `bytes` and waits until the other side
// closes. Returns what was read back, or "<open>" when still open after
// `timeout`.
std::string send_and_wait_close(uint16_t port, const std::string& bytes, std::chrono::milliseconds timeout) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "<socket failed>";
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "<connect failed>";
  }
  (void)!::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::close(fd);
      return "<open>";
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[512];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;  // closed or reset: refused
    got.append(buf, static_cast<size_t>(n));
    if (got.size() > 65536) break;
  }
  ::close(fd);
  return got;
}

TEST(Federation, PlaintextClientOnTheFederationPortIsRefused) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  fed.link(acme, beta);
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta));

  std::mt19937 rng(42);
  std::string noise(4096, '\0');
  for (char& c : noise) c = static_cast<char>(rng());
  for (const std::string& bytes : {std::string("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), noise, std::string()}) {
    const std::string answer = send_and_wait_close(acme.federation_port(), bytes, 10s);
    EXPECT_NE(answer, "<open>") << "the federation port kept a plaintext client open";
    EXPECT_NE(answer, "<connect failed>");
  }
  auto health = acme.process().try_request("GET", "/v1/health", "", kReaderToken);
  ASSERT_TRUE(health.ok()) << health.error().message << "\nstderr:\n" << acme.process().stderr_text();
  EXPECT_EQ(health->status, 200u) << health->body;
  PeersView v;
  EXPECT_TRUE(eventually(5s, [&] {
    v = get_peers(acme.process());
    return v.refusals["handshake"] >= 2;
  })) << "acme GET /v1/peers: " << v.body;
  EXPECT_EQ(v.state_of(beta.identity()), "up") << v.body;
}

// ------------------------------------------------------------------ g

TEST(Federation, ThreeDomainsSeeTheSameSequence) {
  Federation fed;
  FedNode& acme = fed.add("acme");
  FedNode& beta = fed.add("beta");
  FedNode& gamma = fed.add("gamma");
  fed.link(acme, beta);
  fed.link(acme, gamma);
  acme.exports("bids", {"beta", "gamma"});
  ASSERT_TRUE(fed.start_all()) << fed.last_error();
  ASSERT_NO_FATAL_FAILURE(create_stream(acme, "bids"));
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, beta));
  ASSERT_NO_FATAL_FAILURE(wait_linked(acme, gamma));
  for (const FedNode* n : {&beta, &gamma}) {
    auto r = import_stream(*n, "acme/bids");
    ASSERT_EQ(r.status, 201u) << n->identity() << ": " << r.body;
  }
  ASSERT_NO_FATAL_FAILURE(publish(acme, "bids", 0, 1500));
  expect_exact_mirror(acme, "bids", beta);
  expect_exact_mirror(acme, "bids", gamma);
}

}  // namespace
}  // namespace entente::testing
