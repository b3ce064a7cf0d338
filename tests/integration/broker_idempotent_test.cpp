// Idempotent publishing on a real broker process (docs/api.md, "Publishing
// exactly once"): a publisher names its batches (Entente-Producer-Id /
// Entente-Producer-Seq, or producer_id / producer_seq on the WebSocket
// upgrade), and a batch sent again after its answer was lost is answered
// with the sequence numbers it got the first time and stored once.
//
// The answer is lost for real: the node is started with the test-only
// ENTENTE_TEST_KILL_AFTER_COMMIT=N, which makes it SIGKILL itself once the
// batch numbered N is durable and before it answers; or the publisher's
// WebSocket is cut once the node has stored its batches and before their
// acknowledgements are read.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "rapidjson/document.h"
#include "tests/integration/support/broker_process.h"
#include "tests/integration/support/ws_reader.h"

namespace entente::testing {
namespace {

using Clock = std::chrono::steady_clock;

const char* kFeed = R"({"name":"feed","schema":[{"name":"k","type":"int64"},{"name":"note","type":"string"}]})";

rapidjson::Document parse(const std::string& body) {
  rapidjson::Document d;
  d.Parse(body.c_str());
  EXPECT_FALSE(d.HasParseError()) << body;
  return d;
}

// Rows k = from .. from + n - 1.
std::string rows(int from, int n) {
  std::string s;
  for (int k = from; k < from + n; ++k) s += "{\"k\":" + std::to_string(k) + ",\"note\":\"n\"}\n";
  return s;
}

using Headers = std::vector<std::pair<std::string, std::string>>;

Headers producer_headers(const std::string& id, uint64_t seq) {
  return {{"authorization", std::string("Bearer ") + kPublisherToken},
          {"entente-producer-id", id},
          {"entente-producer-seq", std::to_string(seq)}};
}

Result<http::ClientResponse> publish(const BrokerProcess& b, const std::string& id, uint64_t seq,
                                             const std::string& body, const std::string& stream = "feed") {
  auto c = http::Client::connect(b.client_options());
  if (!c.ok()) return c.error();
  return (*c)->request("POST", "/v1/streams/" + stream + "/tuples", body, "application/x-ndjson",
                       producer_headers(id, seq));
}

struct Answer {
  unsigned status = 0;
  uint64_t first = 0, last = 0, count = 0;
  bool duplicate = false;
  std::string body;
};

Answer answer_of(const http::ClientResponse& r) {
  Answer a;
  a.status = r.status;
  a.body = r.body;
  auto d = parse(r.body);
  if (r.status == 200 && d.IsObject()) {
    a.first = d["first_seq"].GetUint64();
    a.last = d["last_seq"].GetUint64();
    a.count = d["count"].GetUint64();
    a.duplicate = d.HasMember("duplicate") && d["duplicate"].GetBool();
  }
  return a;
}

// How many times each k is in the stream, read over a subscription.
std::map<int64_t, int> copies(const BrokerProcess& b, const std::string& stream, uint64_t until_seq) {
  std::map<int64_t, int> n;
  auto read = read_stream(b, stream, 1, until_seq);
  EXPECT_TRUE(read.error.empty()) << read.error;
  for (const auto& t : read.tuples) {
    auto d = parse(t.line);
    ++n[d["k"].GetInt64()];
  }
  return n;
}

void expect_once_each(const std::map<int64_t, int>& n, int from, int count) {
  EXPECT_EQ(n.size(), static_cast<size_t>(count));
  for (int k = from; k < from + count; ++k) {
    auto it = n.find(k);
    ASSERT_NE(it, n.end()) << "k=" << k << " is missing";
    EXPECT_EQ(it->second, 1) << "k=" << k << " is stored " << it->second << " times";
  }
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

// A broker whose process has ENTENTE_TEST_KILL_AFTER_COMMIT=seq (the child
// inherits the environment at start(); later starts do not get it).
bool start_with_kill_hook(BrokerProcess& b, uint64_t seq) {
  setenv("ENTENTE_TEST_KILL_AFTER_COMMIT", std::to_string(seq).c_str(), 1);
  const bool ok = b.start();
  unsetenv("ENTENTE_TEST_KILL_AFTER_COMMIT");
  return ok;
}

TEST(BrokerIdempotent, HttpRetryAfterTheNodeDiedBetweenCommitAndAnswerStoresOnce) {
  BrokerProcess b;
  ASSERT_TRUE(start_with_kill_hook(b, 2)) << b.last_error();
  ASSERT_EQ(b.request("POST", "/v1/streams", kFeed).status, 201u);

  auto r = publish(b, "loader-1", 1, rows(0, 3));
  ASSERT_TRUE(r.ok()) << r.error().message;
  Answer a1 = answer_of(*r);
  ASSERT_EQ(a1.status, 200u) << a1.body;
  EXPECT_EQ(a1.first, 1u);
  EXPECT_FALSE(a1.duplicate);

  // Batch 2 is stored, then the node dies before answering.
  r = publish(b, "loader-1", 2, rows(3, 4));
  EXPECT_FALSE(r.ok() && r->status == 200) << "the node answered batch 2";
  ASSERT_TRUE(died_of_sigkill(b)) << "the fault hook did not kill the node";
  b.kill();  // reaps nothing more; forgets the pid
  ASSERT_TRUE(b.start()) << b.last_error();
  // It was committed: the lost answer is the only thing missing.
  ASSERT_EQ(next_seq(b, "feed"), 8u);

  // The publisher, not knowing, sends batch 2 again: the first answer.
  r = publish(b, "loader-1", 2, rows(3, 4));
  ASSERT_TRUE(r.ok()) << r.error().message;
  Answer a2 = answer_of(*r);
  ASSERT_EQ(a2.status, 200u) << a2.body;
  EXPECT_EQ(a2.first, 4u);
  EXPECT_EQ(a2.last, 7u);
  EXPECT_EQ(a2.count, 4u);
  EXPECT_TRUE(a2.duplicate) << a2.body;
  EXPECT_EQ(next_seq(b, "feed"), 8u);

  // And goes on.
  r = publish(b, "loader-1", 3, rows(7, 2));
  ASSERT_TRUE(r.ok()) << r.error().message;
  Answer a3 = answer_of(*r);
  EXPECT_EQ(a3.first, 8u);
  EXPECT_FALSE(a3.duplicate);
  expect_once_each(copies(b, "feed", 9), 0, 9);
}

TEST(BrokerIdempotent, ProducerStateSurvivesKillNine) {
  BrokerProcess b;
  ASSERT_TRUE(b.start()) << b.last_error();
  ASSERT_EQ(b.request("POST", "/v1/streams", kFeed).status, 201u);
  std::vector<Answer> first;
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    auto r = publish(b, "p", seq, rows(static_cast<int>(seq) * 10, 2));
    ASSERT_TRUE(r.ok()) << r.error().message;
    first.push_back(answer_of(*r));
    ASSERT_EQ(first.back().status, 200u) << first.back().body;
  }
  ASSERT_TRUE(b.restart_after_kill()) << b.last_error();
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    auto r = publish(b, "p", seq, rows(static_cast<int>(seq) * 10, 2));
    ASSERT_TRUE(r.ok()) << r.error().message;
    Answer again = answer_of(*r);
    EXPECT_EQ(again.status, 200u) << again.body;
    EXPECT_EQ(again.first, first[seq - 1].first);
    EXPECT_EQ(again.last, first[seq - 1].last);
    EXPECT_TRUE(again.duplicate);
  }
  EXPECT_EQ(next_seq(b, "feed"), 7u);
  // Another producer's numbers are its own.
  auto r = publish(b, "q", 1, rows(100, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(answer_of(*r).first, 7u);
  EXPECT_FALSE(answer_of(*r).duplicate);
}

TEST(BrokerIdempotent, WebSocketResendOnANewConnectionAfterTheNodeDied) {
  BrokerProcess b;
  ASSERT_TRUE(start_with_kill_hook(b, 13)) << b.last_error();
  ASSERT_EQ(b.request("POST", "/v1/streams", kFeed).status, 201u);
  const Headers auth = {{"authorization", std::string("Bearer ") + kPublisherToken}};
  // Messages 10, 11, 12, 13 (k = 0..3 etc.); the node dies once 13 is durable.
  {
    auto ws = http::WsClient::connect(b.client_options(),
                                              "/v1/streams/feed/publish?producer_id=ws-1&producer_seq=10", auth);
    ASSERT_TRUE(ws.ok()) << ws.error().message;
    for (int m = 0; m < 4; ++m) ASSERT_TRUE((*ws)->send(rows(m * 2, 2)).ok());
    ASSERT_TRUE(died_of_sigkill(b)) << "the fault hook did not kill the node";
  }
  b.kill();
  ASSERT_TRUE(b.start()) << b.last_error();
  ASSERT_EQ(next_seq(b, "feed"), 9u);  // all four stored, none acknowledged (to the publisher's knowledge)

  // Resend all four, and one more, from message 10 on.
  auto ws = http::WsClient::connect(b.client_options(),
                                            "/v1/streams/feed/publish?producer_id=ws-1&producer_seq=10", auth);
  ASSERT_TRUE(ws.ok()) << ws.error().message;
  for (int m = 0; m < 5; ++m) ASSERT_TRUE((*ws)->send(rows(m * 2, 2)).ok());
  for (int m = 0; m < 5; ++m) {
    auto msg = (*ws)->receive(20000);
    ASSERT_TRUE(msg.ok()) << msg.error().message;
    auto d = parse(msg->data);
    ASSERT_TRUE(d.HasMember("ack")) << msg->data;
    EXPECT_EQ(d["ack"]["producer_seq"].GetUint64(), 10u + m) << msg->data;
    EXPECT_EQ(d["ack"]["first_seq"].GetUint64(), 1u + 2u * m) << msg->data;
    EXPECT_EQ(d["ack"]["duplicate"].GetBool(), m < 4) << msg->data;
  }
  expect_once_each(copies(b, "feed", 10), 0, 10);
}

TEST(BrokerIdempotent, WebSocketCutBeforeTheAcksAreReadThenResent) {
  BrokerProcess b;
  ASSERT_TRUE(b.start()) << b.last_error();
  ASSERT_EQ(b.request("POST", "/v1/streams", kFeed).status, 201u);
  const Headers named = {{"authorization", std::string("Bearer ") + kPublisherToken},
                         {"entente-producer-id", "ws-2"},
                         {"entente-producer-seq", "1"}};
  {
    auto ws = http::WsClient::connect(b.client_options(), "/v1/streams/feed/publish", named);
    ASSERT_TRUE(ws.ok()) << ws.error().message;
    for (int m = 0; m < 6; ++m) ASSERT_TRUE((*ws)->send(rows(m * 3, 3)).ok());
    // Every batch is committed; the acknowledgements are never read: the
    // connection is cut (the client goes away without a close handshake).
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (next_seq(b, "feed") < 19u && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(next_seq(b, "feed"), 19u);
  }
  auto ws = http::WsClient::connect(b.client_options(), "/v1/streams/feed/publish", named);
  ASSERT_TRUE(ws.ok()) << ws.error().message;
  for (int m = 0; m < 6; ++m) ASSERT_TRUE((*ws)->send(rows(m * 3, 3)).ok());
  for (int m = 0; m < 6; ++m) {
    auto msg = (*ws)->receive(20000);
    ASSERT_TRUE(msg.ok()) << msg.error().message;
    auto d = parse(msg->data);
    ASSERT_TRUE(d.HasMember("ack")) << msg->data;
    EXPECT_TRUE(d["ack"]["duplicate"].GetBool()) << msg->data;
    EXPECT_EQ(d["ack"]["first_seq"].GetUint64(), 1u + 3u * m) << msg->data;
  }
  EXPECT_EQ(next_seq(b, "feed"), 19u);
  expect_once_each(copies(b, "feed", 18), 0, 18);
}

TEST(BrokerIdempotent, ConcurrentSendsOfOneBatchStoreItOnce) {
  BrokerProcess b;
  ASSERT_TRUE(b.start()) << b.last_error();
  ASSERT_EQ(b.request("POST", "/v1/streams", kFeed).status, 201u);
  // Each of 8 threads sends batches 1..20 of the same producer, all at
  // once: the same batch is in the group commit several times over, and
  // retries arrive while the first send is still being written.
  constexpr int kThreads = 8, kBatches = 20;
  std::vector<std::vector<Answer>> answers(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto c = http::Client::connect(b.client_options());
      if (!c.ok()) {
        ++failures;
        return;
      }
      for (int seq = 1; seq <= kBatches; ++seq) {
        auto r = (*c)->request("POST", "/v1/streams/feed/tuples", rows(seq * 100, 5), "application/x-ndjson",
                               producer_headers("many", static_cast<uint64_t>(seq)));
        if (!r.ok()) {
          ++failures;
          return;
        }
        answers[t].push_back(answer_of(*r));
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);
  for (int seq = 1; seq <= kBatches; ++seq) {
    int fresh = 0;
    for (int t = 0; t < kThreads; ++t) {
      const Answer& a = answers[t][seq - 1];
      ASSERT_EQ(a.status, 200u) << a.body;
      EXPECT_EQ(a.first, answers[0][seq - 1].first) << "batch " << seq << " answered differently";
      EXPECT_EQ(a.last, a.first + 4);
      fresh += a.duplicate ? 0 : 1;
    }
    EXPECT_EQ(fresh, 1) << "batch " << seq << " was stored " << fresh << " times";
  }
  EXPECT_EQ(next_seq(b, "feed"), 1u + 5u * kBatches);
  std::map<int64_t, int> n = copies(b, "feed", 5u * kBatches);
  EXPECT_EQ(n.size(), 5u * kBatches);
  for (const auto& [k, c] : n) EXPECT_EQ(c, 1) << "k=" << k;
}

TEST(BrokerIdempotent, ARetryAfterRetentionTrimmedTheBatchIsStillAnswered) {
  BrokerProcess b(with_config(R"("retention_check_interval":"100ms")"));
  ASSERT_TRUE(b.start()) << b.last_error();
  ASSERT_EQ(b.request("POST", "/v1/streams",
                      R"({"name":"feed","schema":[{"name":"k","type":"int64"},{"name":"note","type":"string"}],)"
                      R"("retention":{"max_tuples":4}})")
                .status,
            201u);
  for (uint64_t seq = 1; seq <= 4; ++seq) {
    auto r = publish(b, "p", seq, rows(static_cast<int>(seq) * 10, 3));
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->status, 200u) << r->body;
  }
  // Batches 1..3 (tuples 1..9) are trimmed away.
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  uint64_t first_seq = 0;
  while (Clock::now() < deadline) {
    auto d = parse(b.request("GET", "/v1/streams/feed", "", kReaderToken).body);
    first_seq = d["first_seq"].GetUint64();
    if (first_seq >= 10) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(first_seq, 10u);
  auto r = publish(b, "p", 1, rows(10, 3));
  ASSERT_TRUE(r.ok());
  Answer a = answer_of(*r);
  EXPECT_EQ(a.status, 200u) << a.body;
  EXPECT_EQ(a.first, 1u);
  EXPECT_EQ(a.last, 3u);
  EXPECT_TRUE(a.duplicate);
  EXPECT_EQ(next_seq(b, "feed"), 13u);
}

TEST(BrokerIdempotent, WindowGapsAndBadNames) {
  BrokerProcess b;
  ASSERT_TRUE(b.start()) << b.last_error();
  ASSERT_EQ(b.request("POST", "/v1/streams", kFeed).status, 201u);
  // 70 batches, one tuple each: the stream remembers the last 64 (7..70).
  for (uint64_t seq = 1; seq <= 70; ++seq) {
    auto r = publish(b, "w", seq, rows(static_cast<int>(seq), 1));
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->status, 200u) << r->body;
  }
  auto r = publish(b, "w", 7, rows(7, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(answer_of(*r).duplicate) << r->body;
  EXPECT_EQ(answer_of(*r).first, 7u);
  // Forgotten: refused rather than risk storing it twice.
  r = publish(b, "w", 6, rows(6, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 409u) << r->body;
  EXPECT_NE(r->body.find("no longer remembers batch 6"), std::string::npos) << r->body;
  // A gap is allowed (a refused batch leaves one), and the number skipped
  // may come later.
  r = publish(b, "w", 80, rows(80, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(answer_of(*r).first, 71u);
  r = publish(b, "w", 75, rows(75, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(answer_of(*r).first, 72u);
  EXPECT_FALSE(answer_of(*r).duplicate);
  EXPECT_EQ(next_seq(b, "feed"), 73u);

  // A refused batch is not remembered: the same number with good rows is stored.
  r = publish(b, "w", 90, "{\"k\":\"bad\",\"note\":\"n\"}\n");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 400u) << r->body;
  r = publish(b, "w", 90, rows(90, 1));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200u) << r->body;
  EXPECT_FALSE(answer_of(*r).duplicate);

  // Half a name, or a bad one.
  auto c = http::Client::connect(b.client_options());
  ASSERT_TRUE(c.ok());
  const std::string bearer = std::string("Bearer ") + kPublisherToken;
  auto bad = [&](Headers h, const std::string& expect) {
    h.emplace_back("authorization", bearer);
    auto resp = (*c)->request("POST", "/v1/streams/feed/tuples", rows(1, 1), "application/x-ndjson", h);
    ASSERT_TRUE(resp.ok());
    EXPECT_EQ(resp->status, 400u) << resp->body;
    EXPECT_NE(resp->body.find(expect), std::string::npos) << resp->body;
  };
  bad({{"entente-producer-id", "x"}}, "Entente-Producer-Seq is missing");
  bad({{"entente-producer-seq", "1"}}, "Entente-Producer-Id is missing");
  bad({{"entente-producer-id", "x"}, {"entente-producer-seq", "0"}}, "from 1");
  bad({{"entente-producer-id", "x"}, {"entente-producer-seq", "1x"}}, "from 1");
  bad({{"entente-producer-id", "a b"}, {"entente-producer-seq", "1"}}, "may contain only");
  bad({{"entente-producer-id", std::string(65, 'a')}, {"entente-producer-seq", "1"}}, "1 to 64");
  auto ws = http::WsClient::connect(b.client_options(), "/v1/streams/feed/publish?producer_id=x",
                                            {{"authorization", bearer}});
  ASSERT_FALSE(ws.ok());
  EXPECT_NE(ws.error().message.find("400"), std::string::npos) << ws.error().message;
  EXPECT_EQ(next_seq(b, "feed"), 74u);
}

TEST(BrokerIdempotent, DeletingTheStreamForgetsItsProducers) {
  BrokerProcess b;
  ASSERT_TRUE(b.start()) << b.last_error();
  ASSERT_EQ(b.request("POST", "/v1/streams", kFeed).status, 201u);
  auto r = publish(b, "p", 1, rows(0, 2));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->status, 200u);
  ASSERT_EQ(b.request("DELETE", "/v1/streams/feed").status, 204u);
  ASSERT_EQ(b.request("POST", "/v1/streams", kFeed).status, 201u);
  ASSERT_TRUE(b.restart_after_kill()) << b.last_error();
  r = publish(b, "p", 1, rows(0, 2));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 200u) << r->body;
  EXPECT_FALSE(answer_of(*r).duplicate) << "a new stream of the same name knew the old one's producer";
  EXPECT_EQ(next_seq(b, "feed"), 3u);
}

}  // namespace
}  // namespace entente::testing
